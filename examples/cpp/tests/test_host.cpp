// Unit tests of the engine-independent host library (run by ctest; no TensorRT, no GPU).
// Fixtures (manifests, images) are written into the folder given as argv[1].
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <stb_image_write.h>

#include "vitdeploy/bundle.hpp"
#include "vitdeploy/image.hpp"
#include "vitdeploy/topk.hpp"

namespace {

int failures = 0;
int checks = 0;

// Not assert(): must keep checking in Release builds (NDEBUG) and report every failure.
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        ++checks;                                                                        \
        if (!(cond)) {                                                                   \
            ++failures;                                                                  \
            std::cerr << __FILE__ << ":" << __LINE__ << ": CHECK failed: " #cond "\n"; \
        }                                                                                \
    } while (0)

bool throws_with(const std::function<void()>& fn, const std::string& needle) {
    try {
        fn();
    } catch (const std::runtime_error& e) {
        if (std::string(e.what()).find(needle) != std::string::npos) return true;
        std::cerr << "  threw, but without '" << needle << "': " << e.what() << "\n";
        return false;
    }
    return false;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
}

std::string manifest(const std::string& preprocessing, const std::string& resolution, const std::string& engines = "{}") {
    return R"({"format": "vitdeploy-bundle/1", "name": "t",
      "spec": {"num_classes": 3, "patch_size": [4, 4], "image_size": [16, 16]},
      "labels": ["cat", "dog", "fox"],
      "preprocessing": )" + preprocessing + R"(, "resolution": )" + resolution + R"(, "engines": )" + engines + "}";
}

// -- softmax / top-k ----------------------------------------------------------------------------
void test_softmax_topk() {
    const float logits[] = {1.0f, 3.0f, 2.0f, 3.0f};
    auto p = vitdeploy::softmax(logits, 4);
    double sum = 0;
    for (float v : p) sum += v;
    CHECK(std::fabs(sum - 1.0) < 1e-6);
    CHECK(std::fabs(p[1] - p[3]) < 1e-7);
    // Shift invariance and no overflow for large logits.
    const float big[] = {1001.0f, 1003.0f, 1002.0f, 1003.0f};
    auto q = vitdeploy::softmax(big, 4);
    for (int i = 0; i < 4; ++i) CHECK(std::fabs(p[i] - q[i]) < 1e-6);
    auto top = vitdeploy::top_k(p, 3);
    CHECK(top.size() == 3);
    CHECK(top[0].index == 1 && top[1].index == 3 && top[2].index == 2);  // tie 1 vs 3: lower index first
    CHECK(vitdeploy::top_k(p, 10).size() == 4);
    CHECK(vitdeploy::format_top({{2, 0.5f}}, {"a", "b", "c"}) == "c 0.5000");
}

// -- resize geometry (expected values: vitdeploy.images.resize_geometry, verified bit-exact
//    against timm's eval transform) ------------------------------------------------------------
void test_geometry() {
    struct Case {
        int h, w;
        const char* mode;
        double crop;
        int th, tw, nh, nw, top, left;
    };
    const Case cases[] = {
        {300, 400, "shorter-side-center-crop", 0.875, 224, 224, 256, 341, 16, 58},
        {401, 299, "shorter-side-center-crop", 0.9, 224, 224, 332, 248, 54, 12},
        {500, 181, "shorter-side-center-crop", 1.0, 224, 320, 884, 320, 330, 0},
        {97, 333, "shorter-side-center-crop", 0.875, 320, 224, 365, 1253, 22, 514},  // 22.5 rounds to even
        {300, 400, "stretch", 0.0, 224, 224, 224, 224, 0, 0},
        {300, 400, "stretch", 0.875, 224, 224, 256, 256, 16, 16},
        {224, 224, "shorter-side-center-crop", 0.875, 224, 224, 256, 256, 16, 16},
        {640, 480, "shorter-side-center-crop", 0.95, 384, 384, 538, 404, 77, 10},
    };
    for (const auto& c : cases) {
        vitdeploy::HostResize rule{c.mode, "bilinear", c.crop};
        auto g = vitdeploy::resize_geometry(c.h, c.w, rule, c.th, c.tw);
        const bool ok = g.resized_h == c.nh && g.resized_w == c.nw && g.top == c.top && g.left == c.left;
        if (!ok)
            std::cerr << "  geometry " << c.h << "x" << c.w << " " << c.mode << ": got " << g.resized_h << "x" << g.resized_w << " +" << g.top
                      << "+" << g.left << "\n";
        CHECK(ok);
    }
    CHECK(throws_with([] { vitdeploy::resize_geometry(10, 10, {"squeeze", "bilinear", 0.0}, 4, 4); }, "squeeze"));
}

// -- orientation --------------------------------------------------------------------------------
vitdeploy::Image numbered(int h, int w) {
    vitdeploy::Image img{h, w, std::vector<std::uint8_t>(static_cast<size_t>(h) * w * 3)};
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) img.at(y, x)[0] = static_cast<std::uint8_t>(10 * y + x);
    return img;
}

void test_orientation() {
    // Source 2x3:  0 1 2 / 10 11 12. Displayed forms per EXIF value (Pillow's exif_transpose).
    const auto src = numbered(2, 3);
    struct Expect {
        int o, h, w;
        std::vector<int> v;
    };
    const Expect expects[] = {
        {1, 2, 3, {0, 1, 2, 10, 11, 12}},
        {2, 2, 3, {2, 1, 0, 12, 11, 10}},
        {3, 2, 3, {12, 11, 10, 2, 1, 0}},
        {4, 2, 3, {10, 11, 12, 0, 1, 2}},
        {5, 3, 2, {0, 10, 1, 11, 2, 12}},
        {6, 3, 2, {10, 0, 11, 1, 12, 2}},
        {7, 3, 2, {12, 2, 11, 1, 10, 0}},
        {8, 3, 2, {2, 12, 1, 11, 0, 10}},
    };
    for (const auto& e : expects) {
        auto out = vitdeploy::apply_orientation(src, e.o);
        bool ok = out.height == e.h && out.width == e.w;
        for (int i = 0; ok && i < e.h * e.w; ++i) ok = out.pixels[i * 3] == e.v[i];
        if (!ok) std::cerr << "  orientation " << e.o << " wrong\n";
        CHECK(ok);
    }
}

// -- decode + resize ------------------------------------------------------------------------------
void test_decode_and_resize(const std::string& dir) {
    // Grayscale PNG -> RGB with equal channels.
    std::vector<std::uint8_t> gray(8 * 6);
    for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<std::uint8_t>(i * 5);
    const std::string gpath = dir + "/gray.png";
    CHECK(stbi_write_png(gpath.c_str(), 6, 8, 1, gray.data(), 6));
    auto g = vitdeploy::decode_image(gpath);
    CHECK(g.height == 8 && g.width == 6);
    CHECK(g.at(7, 5)[0] == gray[47] && g.at(7, 5)[1] == gray[47] && g.at(7, 5)[2] == gray[47]);

    // RGBA PNG -> alpha dropped, colour kept (convert("RGB") semantics).
    std::vector<std::uint8_t> rgba(4 * 4 * 4);
    for (size_t i = 0; i < rgba.size(); i += 4) rgba[i] = 200, rgba[i + 1] = 100, rgba[i + 2] = 50, rgba[i + 3] = 0;
    const std::string apath = dir + "/rgba.png";
    CHECK(stbi_write_png(apath.c_str(), 4, 4, 4, rgba.data(), 16));
    auto a = vitdeploy::decode_image(apath);
    CHECK(a.at(2, 2)[0] == 200 && a.at(2, 2)[1] == 100 && a.at(2, 2)[2] == 50);

    // An unreadable file names itself.
    const std::string bad = dir + "/broken.jpg";
    write_text(bad, "this is not a jpeg");
    CHECK(throws_with([&] { vitdeploy::decode_image(bad); }, bad));
    CHECK(throws_with([&] { vitdeploy::decode_image(dir + "/missing.png"); }, "missing.png"));

    // Resize: a uniform image stays uniform at every filter; a half-red image keeps its halves.
    vitdeploy::Image uni{30, 40, std::vector<std::uint8_t>(30 * 40 * 3, 77)};
    for (const char* interp : {"bilinear", "bicubic", "nearest"}) {
        auto r = vitdeploy::resize_for_model(uni, {"shorter-side-center-crop", interp, 0.875}, 16, 16);
        bool flat = r.height == 16 && r.width == 16;
        for (auto v : r.pixels) flat = flat && v == 77;
        CHECK(flat);
    }
    vitdeploy::Image half{64, 48, std::vector<std::uint8_t>(64 * 48 * 3, 0)};
    for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 48; ++x) half.at(y, x)[0] = 255;
    auto r = vitdeploy::resize_for_model(half, {"stretch", "bilinear", 0.0}, 16, 16);
    CHECK(r.at(2, 8)[0] == 255 && r.at(13, 8)[0] == 0);
    CHECK(throws_with([&] { vitdeploy::resize_for_model(half, {"stretch", "lanczos", 0.0}, 16, 16); }, "lanczos"));
    auto bgr = r;
    vitdeploy::to_bgr(bgr);
    CHECK(bgr.at(2, 8)[2] == 255 && bgr.at(2, 8)[0] == 0);
}

// -- bundle reading ---------------------------------------------------------------------------------
void test_bundle(const std::string& dir) {
    const std::string b1 = dir + "/static";
    std::system(("mkdir -p " + b1 + "/engines/orin-fp16").c_str());
    write_text(b1 + "/manifest.json",
               manifest(R"({"input": "uint8-nhwc", "channel_order": "bgr", "input_size": [16, 16], "in_graph_resize": null,
                            "host_resize": {"mode": "shorter-side-center-crop", "interpolation": 3, "crop_pct": 0.875}})",
                        R"({"mode": "static", "height": 16, "width": 16})", R"({"orin-fp16": {"precision": "fp16"}})"));
    write_text(b1 + "/labels.txt", "cat\ndog\r\nfox\n\n");
    write_text(b1 + "/engines/orin-fp16/engine.json",
               R"({"format": "vitdeploy-engine/1", "tensorrt": "10.3.0", "precision": "fp16",
                   "device": {"gpu_name": "Orin", "compute_capability": "8.7"},
                   "input": {"name": "images", "dtype": "uint8", "layout": "NHWC"},
                   "profiles": [{"batch": [1, 4, 8], "height": [16, 16, 16], "width": [16, 16, 16]}]})");
    auto b = vitdeploy::read_bundle(b1);
    CHECK(b.labels.size() == 3 && b.labels[1] == "dog");
    CHECK(b.preprocessing.channel_order == "bgr");
    CHECK(b.preprocessing.host_resize.interpolation == "bicubic");  // PIL enum 3
    CHECK(std::fabs(b.preprocessing.host_resize.crop_pct - 0.875) < 1e-12);
    CHECK(b.input_size() == std::make_pair(16, 16));
    CHECK(throws_with([&] { b.input_size({32, 32}); }, "static resolution"));
    CHECK(b.engines.size() == 1 && b.engines[0].tensorrt == "10.3.0" && b.engines[0].compute_capability == "8.7");
    CHECK(b.engines[0].profiles[0].batch[2] == 8 && b.engines[0].profiles[0].covers(16, 16) && !b.engines[0].profiles[0].covers(32, 16));
    CHECK(vitdeploy::parse_version("10.3.0") == (std::array<int, 3>{10, 3, 0}));

    const std::string b2 = dir + "/dynamic";
    std::system(("mkdir -p " + b2).c_str());
    write_text(b2 + "/manifest.json", manifest(R"({"input_size": null, "in_graph_resize": null})", R"({"mode": "dynamic", "height": 16, "width": 16})"));
    write_text(b2 + "/labels.txt", "cat\ndog\nfox\n");
    auto d = vitdeploy::read_bundle(b2);
    CHECK(d.dynamic_resolution);
    CHECK(d.preprocessing.host_resize.mode == "stretch");  // default when the manifest has no rule
    CHECK(d.input_size() == std::make_pair(16, 16));
    CHECK(d.input_size({24, 32}) == std::make_pair(24, 32));
    CHECK(throws_with([&] { d.input_size({18, 32}); }, "patch size"));

    // A listed engine without engine.json: reported, not fatal for host-side use.
    write_text(b2 + "/manifest.json", manifest(R"({"input_size": [16, 16]})", R"({"mode": "static", "height": 16, "width": 16})", R"({"gone": {}})"));
    auto g = vitdeploy::read_bundle(b2);
    CHECK(g.engines.empty() && g.engine_errors.size() == 1 && g.engine_errors[0].find("gone: cannot open") == 0);

    write_text(b2 + "/labels.txt", "cat\ndog\n");
    CHECK(throws_with([&] { vitdeploy::read_bundle(b2); }, "has 2 labels"));
    write_text(b2 + "/manifest.json", "{not json");
    CHECK(throws_with([&] { vitdeploy::read_bundle(b2); }, "not valid JSON"));
    CHECK(throws_with([&] { vitdeploy::read_bundle(dir + "/nowhere"); }, "manifest.json"));
}

// -- graph outputs (issue 12: embedding and patch grid) ---------------------------------------------
void test_outputs(const std::string& dir) {
    const std::string b = dir + "/features";
    std::system(("mkdir -p " + b).c_str());
    write_text(b + "/manifest.json", R"({"format": "vitdeploy-bundle/1", "name": "f",
      "spec": {"num_classes": 0, "patch_size": [14, 14], "image_size": [56, 56], "embed_dim": 384},
      "labels": [], "preprocessing": {"input_size": null}, "resolution": {"mode": "dynamic", "height": 56, "width": 56},
      "graph": {"outputs": ["embedding", "patch_grid"], "output_details": {
        "embedding": {"shape": ["batch", 384], "meaning": "pooled pre-head feature", "readout": "cls", "l2_normalized": true, "final_norm": "norm"},
        "patch_grid": {"shape": ["batch", 384, "grid_h", "grid_w"], "final_norm": "norm",
                       "dropped_tokens": {"cls": 1, "distillation": 0, "registers": 4}}}}})");
    write_text(b + "/labels.txt", "");
    auto f = vitdeploy::read_bundle(b);
    CHECK(f.num_classes == 0 && f.embed_dim == 384 && f.labels.empty());
    CHECK(f.outputs.size() == 2 && f.outputs[0].name == "embedding" && f.outputs[1].name == "patch_grid");
    CHECK(f.outputs[0].readout == "cls" && f.outputs[0].l2_normalized && f.outputs[0].shape.size() == 2 && f.outputs[0].shape[1] == "384");
    CHECK(f.outputs[1].dropped_prefix_tokens == 5 && f.outputs[1].shape[2] == "grid_h");
    CHECK(f.has_output("patch_grid") && !f.has_output("probs"));
    CHECK(f.output_elements("embedding", 56, 56) == 384);
    CHECK(f.output_elements("patch_grid", 56, 84) == 384u * 4 * 6);  // G_h x G_w follows the input size
    CHECK(throws_with([&] { f.output_elements("probs", 56, 56); }, "no probs output"));
    CHECK(throws_with([&] { f.output_elements("patch_grid", 50, 56); }, "multiple of the patch size"));

    // A manifest from before outputs were selectable: logits and probs, K floats per image.
    write_text(b + "/manifest.json", manifest(R"({"input_size": [16, 16]})", R"({"mode": "static", "height": 16, "width": 16})"));
    write_text(b + "/labels.txt", "cat\ndog\nfox\n");
    auto old = vitdeploy::read_bundle(b);
    CHECK(old.outputs.size() == 2 && old.has_output("logits") && old.has_output("probs"));
    CHECK(old.output_elements("probs", 16, 16) == 3);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: test_host SCRATCH_DIR\n";
        return 2;
    }
    const std::string dir = argv[1];
    std::system(("mkdir -p " + dir).c_str());
    test_softmax_topk();
    test_geometry();
    test_orientation();
    test_decode_and_resize(dir);
    test_bundle(dir);
    test_outputs(dir);
    std::cout << checks - failures << "/" << checks << " checks passed\n";
    return failures ? 1 : 0;
}
