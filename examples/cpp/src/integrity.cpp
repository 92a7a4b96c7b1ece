#include "vitdeploy/integrity.hpp"

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include <openssl/evp.h>

namespace vitdeploy {

std::string sha256_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path + " to verify it");
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw std::runtime_error("OpenSSL could not start a sha256 digest");
    std::vector<char> block(1 << 20);
    while (in) {
        in.read(block.data(), static_cast<std::streamsize>(block.size()));
        if (in.gcount() > 0 && EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(in.gcount())) != 1)
            throw std::runtime_error("OpenSSL could not hash " + path);
    }
    if (in.bad()) throw std::runtime_error("cannot read " + path + " to verify it");
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(ctx.get(), digest.data(), &size) != 1) throw std::runtime_error("OpenSSL could not finish the sha256 of " + path);
    std::string hex;
    char byte[3];
    for (unsigned int i = 0; i < size; ++i) {
        std::snprintf(byte, sizeof byte, "%02x", digest[i]);
        hex += byte;
    }
    return hex;
}

void verify_sha256(const std::string& path, const std::string& expected, const std::string& what) {
    if (expected.empty())
        throw std::runtime_error(path + ": no sha256 is recorded for this " + what + ", so nothing vouches for it; rebuild or re-export it");
    const std::string measured = sha256_file(path);
    if (measured != expected)
        throw std::runtime_error(path + " is not the " + what + " its record vouches for (sha256 " + measured.substr(0, 12) +
                                 "... on disk, " + expected.substr(0, 12) + "... recorded): it was changed or copied in from elsewhere; "
                                 "rebuild or re-export it, or put back the file that came with it");
}

}  // namespace vitdeploy
