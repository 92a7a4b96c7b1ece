// vitdeploy-prep: the host library as a command, no TensorRT needed.
//
//   vitdeploy-prep preprocess BUNDLE IMAGE OUT.bin [HxW]
//       Write the uint8 HWC tensor the graph's `images` input takes (batch of one), e.g. for
//       `trtexec --loadEngine=... --loadInputs=images:OUT.bin`; prints {"height", "width", ...}.
//   vitdeploy-prep topk BUNDLE LOGITS.bin [K]
//       Read raw float32 logits [N, classes] and print the top-K labels of each row as JSON.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vitdeploy/bundle.hpp"
#include "vitdeploy/image.hpp"
#include "vitdeploy/topk.hpp"

namespace {

int usage() {
    std::cerr << "usage: vitdeploy-prep preprocess BUNDLE IMAGE OUT.bin [HxW]\n"
                 "       vitdeploy-prep topk BUNDLE LOGITS.bin [K]\n";
    return 2;
}

std::pair<int, int> parse_size(const std::string& text) {
    const auto x = text.find('x');
    try {
        if (x == std::string::npos) return {std::stoi(text), std::stoi(text)};
        return {std::stoi(text.substr(0, x)), std::stoi(text.substr(x + 1))};
    } catch (const std::exception&) {
        throw std::runtime_error("size '" + text + "' is not N or HxW");
    }
}

int preprocess(const std::vector<std::string>& args) {
    if (args.size() < 3 || args.size() > 4) return usage();
    const vitdeploy::Bundle bundle = vitdeploy::read_bundle(args[0]);
    const auto [h, w] = bundle.input_size(args.size() == 4 ? parse_size(args[3]) : std::make_pair(0, 0));
    const vitdeploy::Image img = vitdeploy::load_for_model(args[1], bundle, h, w);
    std::ofstream out(args[2], std::ios::binary);
    out.write(reinterpret_cast<const char*>(img.pixels.data()), static_cast<std::streamsize>(img.pixels.size()));
    if (!out) throw std::runtime_error("cannot write " + args[2]);
    nlohmann::json info = {{"height", img.height},
                           {"width", img.width},
                           {"channels", 3},
                           {"channel_order", bundle.preprocessing.channel_order},
                           {"orientation", vitdeploy::read_exif_orientation(args[1])}};
    std::cout << info.dump() << "\n";
    return 0;
}

int topk(const std::vector<std::string>& args) {
    if (args.size() < 2 || args.size() > 3) return usage();
    const vitdeploy::Bundle bundle = vitdeploy::read_bundle(args[0]);
    const std::size_t k = args.size() == 3 ? std::stoul(args[2]) : 5;
    std::ifstream in(args[1], std::ios::binary | std::ios::ate);
    if (!in) throw std::runtime_error("cannot open " + args[1]);
    const auto bytes = static_cast<std::size_t>(in.tellg());
    const std::size_t row = static_cast<std::size_t>(bundle.num_classes);
    if (bytes % (row * sizeof(float)))
        throw std::runtime_error(args[1] + " holds " + std::to_string(bytes) + " bytes, not float32 rows of " + std::to_string(row) + " classes");
    std::vector<float> logits(bytes / sizeof(float));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(logits.data()), static_cast<std::streamsize>(bytes));
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t r = 0; r < logits.size() / row; ++r) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& s : vitdeploy::top_k(vitdeploy::softmax(&logits[r * row], row), k))
            top.push_back({{"index", s.index}, {"label", bundle.labels[s.index]}, {"prob", s.prob}});
        rows.push_back(top);
    }
    std::cout << rows.dump() << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage();
    const std::string cmd = argv[1];
    const std::vector<std::string> args(argv + 2, argv + argc);
    try {
        if (cmd == "preprocess") return preprocess(args);
        if (cmd == "topk") return topk(args);
        return usage();
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
}
