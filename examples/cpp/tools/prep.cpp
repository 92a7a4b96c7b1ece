// vitdeploy-prep: the host library as a command, no TensorRT needed.
//
//   vitdeploy-prep preprocess BUNDLE IMAGE OUT.bin [HxW]
//       Write the uint8 HWC tensor the graph's `images` input takes (batch of one), e.g. for
//       `trtexec --loadEngine=... --loadInputs=images:OUT.bin`; prints {"height", "width", ...}.
//   vitdeploy-prep canvas BUNDLE OUT_DIR IMAGE... [--policy fit-within|shrink-within|none]
//       For a variable-size bundle: fit each image by the policy (default: the manifest's), pad
//       them top-left into one canvas batch and write OUT_DIR/images.bin (uint8 [B, H_c, W_c, 3])
//       and OUT_DIR/valid_hw.bin (int32 [B, 2]), checked by the graph's guards; prints the sizes
//       and the trtexec --loadInputs/--shapes arguments that feed them.
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
#include "vitdeploy/variable.hpp"

namespace {

int usage() {
    std::cerr << "usage: vitdeploy-prep preprocess BUNDLE IMAGE OUT.bin [HxW]\n"
                 "       vitdeploy-prep canvas BUNDLE OUT_DIR IMAGE... [--policy fit-within|shrink-within|none]\n"
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

// Temp file then rename: a failed run never leaves a half-written tensor under the final name.
void write_file(const std::string& path, const void* data, size_t bytes) {
    const std::string tmp = path + ".part";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
        if (!out) {
            std::remove(tmp.c_str());
            throw std::runtime_error("cannot write " + path);
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw std::runtime_error("cannot write " + path);
    }
}

int preprocess(const std::vector<std::string>& args) {
    if (args.size() < 3 || args.size() > 4) return usage();
    const vitdeploy::Bundle bundle = vitdeploy::read_bundle(args[0]);
    if (bundle.variable_size())
        throw std::runtime_error(args[0] + " is a variable-size bundle (inputs images and " + bundle.preprocessing.variable_size.valid_input +
                                 "); use: vitdeploy-prep canvas " + args[0] + " OUT_DIR IMAGE...");
    const auto [h, w] = bundle.input_size(args.size() == 4 ? parse_size(args[3]) : std::make_pair(0, 0));
    const vitdeploy::Image img = vitdeploy::load_for_model(args[1], bundle, h, w);
    write_file(args[2], img.pixels.data(), img.pixels.size());
    nlohmann::json info = {{"height", img.height},
                           {"width", img.width},
                           {"channels", 3},
                           {"channel_order", bundle.preprocessing.channel_order},
                           {"orientation", vitdeploy::read_exif_orientation(args[1])}};
    std::cout << info.dump() << "\n";
    return 0;
}

int canvas(const std::vector<std::string>& all) {
    std::vector<std::string> args;
    std::string policy;
    for (size_t i = 0; i < all.size(); ++i) {
        if (all[i] == "--policy") {
            if (i + 1 >= all.size()) throw std::runtime_error("--policy needs a value: fit-within, shrink-within or none");
            policy = all[++i];
        } else {
            args.push_back(all[i]);
        }
    }
    if (args.size() < 3) return usage();
    const vitdeploy::Bundle bundle = vitdeploy::read_bundle(args[0]);
    const vitdeploy::VariableSize& contract = bundle.preprocessing.variable_size;
    if (!contract.enabled)
        throw std::runtime_error(args[0] + " takes one fixed-size `images` input, not (images, valid_hw); use: vitdeploy-prep preprocess " + args[0] +
                                 " IMAGE OUT.bin");
    if (policy.empty()) policy = contract.host_policy;
    vitdeploy::check_policy(policy);
    const std::string& out_dir = args[1];
    std::vector<vitdeploy::Image> fitted;
    nlohmann::json sources = nlohmann::json::array();
    for (size_t i = 2; i < args.size(); ++i) {
        try {
            const vitdeploy::Image img = vitdeploy::load_for_canvas(args[i], bundle, policy);
            fitted.push_back(img);
        } catch (const std::exception& e) {
            const std::string what = e.what();
            // decode errors already name the file
            throw std::runtime_error(what.find(args[i]) != std::string::npos ? what : args[i] + ": " + what);
        }
        sources.push_back(args[i]);
    }
    const vitdeploy::CanvasBatch batch = vitdeploy::pad_to_canvas(fitted, contract.canvas_h, contract.canvas_w);
    vitdeploy::check_valid_hw(batch.valid_hw, contract);  // the guard the runtime applies before the call
    const std::string images_path = out_dir + "/images.bin", valid_path = out_dir + "/" + contract.valid_input + ".bin";
    write_file(images_path, batch.images.data(), batch.images.size());
    write_file(valid_path, batch.valid_hw.data(), batch.valid_hw.size() * sizeof(std::int32_t));
    nlohmann::json valid = nlohmann::json::array();
    for (int i = 0; i < batch.batch; ++i) valid.push_back({batch.valid_hw[2 * i], batch.valid_hw[2 * i + 1]});
    const std::string b = std::to_string(batch.batch);
    nlohmann::json info = {{"batch", batch.batch},
                           {"canvas", {batch.canvas_h, batch.canvas_w}},
                           {"valid_hw", valid},
                           {"policy", policy},
                           {"channel_order", bundle.preprocessing.channel_order},
                           {"images", sources},
                           {"files", {{"images", images_path}, {contract.valid_input, valid_path}}},
                           {"trtexec", "--loadInputs=images:" + images_path + "," + contract.valid_input + ":" + valid_path + " --shapes=images:" + b +
                                           "x" + std::to_string(batch.canvas_h) + "x" + std::to_string(batch.canvas_w) + "x3," + contract.valid_input +
                                           ":" + b + "x2"}};
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
        if (cmd == "canvas") return canvas(args);
        if (cmd == "topk") return topk(args);
        return usage();
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
}
