// Integrity: a bundle's files are what its manifest and engine.json recorded, or they are not run.
//
// vitdeploy records the sha256 of every graph (manifest artifacts.<precision>.sha256) and of every
// engine plan (engine.json plan_sha256); the Python side refuses a file whose digest differs (a graph
// swapped in from another bundle, a plan copied from another build). This is the same rule for C++.
#pragma once

#include <string>

namespace vitdeploy {

// Lower-case hex sha256 of a file's bytes (OpenSSL's EVP digest). Throws std::runtime_error when the
// file cannot be read.
std::string sha256_file(const std::string& path);

// Throws std::runtime_error, one line naming the file and both digests, unless the file's sha256 is
// `expected` (an empty `expected` means nothing was recorded: refused too, since nothing vouches for it).
void verify_sha256(const std::string& path, const std::string& expected, const std::string& what);

}  // namespace vitdeploy
