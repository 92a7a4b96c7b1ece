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
#include "vitdeploy/integrity.hpp"
#include "vitdeploy/resample.hpp"
#include "vitdeploy/topk.hpp"
#include "vitdeploy/variable.hpp"

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
    for (const char* interp : {"bilinear", "bicubic", "nearest", "box", "hamming", "lanczos"}) {
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
    CHECK(throws_with([&] { vitdeploy::resize_for_model(half, {"stretch", "spline36", 0.0}, 16, 16); }, "spline36"));
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
    CHECK(b.precision_order == std::vector<std::string>{"fp16"});  // no record: the engines' precisions, manifest order

    // The "best" order is the bundle's (vitdeploy's precision registry writes it), not the example's own copy.
    std::string ordered = manifest(R"({"input": "uint8-nhwc", "input_size": [16, 16]})", R"({"mode": "static", "height": 16, "width": 16})",
                                   R"({"orin-fp16": {"precision": "fp16"}})");
    ordered.insert(ordered.size() - 1, R"(, "precisions": {"best_order": ["fp8", "int8", "fp16", "fp32"]})");
    write_text(b1 + "/manifest.json", ordered);
    CHECK(vitdeploy::read_bundle(b1).precision_order == (std::vector<std::string>{"fp8", "int8", "fp16", "fp32"}));

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

// -- integrity (issue 31: never run a graph or plan the records do not vouch for) ----------------------
void test_integrity(const std::string& dir) {
    const std::string file = dir + "/abc.bin";
    write_text(file, "abc");
    const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";  // FIPS 180-2 example
    CHECK(vitdeploy::sha256_file(file) == abc);
    vitdeploy::verify_sha256(file, abc, "graph");
    CHECK(throws_with([&] { vitdeploy::verify_sha256(file, std::string(64, '0'), "fp32 graph"); }, "is not the fp32 graph"));
    CHECK(throws_with([&] { vitdeploy::verify_sha256(file, "", "engine plan"); }, "no sha256 is recorded"));
    CHECK(throws_with([&] { vitdeploy::sha256_file(dir + "/missing.bin"); }, "cannot open"));

    const std::string b = dir + "/verified";
    std::system(("mkdir -p " + b + "/engines/gpu").c_str());
    std::string m = manifest(R"({"input_size": [16, 16]})", R"({"mode": "static", "height": 16, "width": 16})", R"({"gpu": {}})");
    m.insert(m.size() - 1, R"(, "artifacts": {"fp32": {"file": "model.onnx", "sha256": ")" + abc + R"("}})");
    write_text(b + "/manifest.json", m);
    write_text(b + "/labels.txt", "cat\ndog\nfox\n");
    write_text(b + "/model.onnx", "abc");
    write_text(b + "/engines/gpu/model.plan", "abd");
    write_text(b + "/engines/gpu/engine.json", R"({"tensorrt": "10.3.0", "plan_sha256": ")" + abc + R"(",
        "profiles": [{"batch": [1, 1, 1], "height": [16, 16, 16], "width": [16, 16, 16]}]})");
    auto bundle = vitdeploy::read_bundle(b);
    CHECK(bundle.verified_graph("fp32") == b + "/model.onnx");
    CHECK(throws_with([&] { bundle.verified_graph("int8"); }, "no int8 graph"));
    CHECK(throws_with([&] { bundle.verified_plan(bundle.engines.at(0)); }, "is not the engine plan"));  // swapped plan
    write_text(b + "/model.onnx", "abd");  // a graph copied in from elsewhere
    CHECK(throws_with([&] { bundle.verified_graph("fp32"); }, "is not the fp32 graph"));
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


// -- Pillow's resampling (expected bytes: Pillow 13.0 Image.resize on the same pixels) ---------------
vitdeploy::Image pattern(int h, int w) {
    vitdeploy::Image img{h, w, std::vector<std::uint8_t>(static_cast<size_t>(h) * w * 3)};
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c) img.at(y, x)[c] = static_cast<std::uint8_t>((37 * y * y + 91 * x + 71 * c + 13 * x * y) % 256);
    return img;
}

std::vector<int> channel(const vitdeploy::Image& img, int c) {
    std::vector<int> v;
    for (int y = 0; y < img.height; ++y)
        for (int x = 0; x < img.width; ++x) v.push_back(img.at(y, x)[c]);
    return v;
}

void test_resample_matches_pillow() {
    const auto src = pattern(6, 5);
    struct Case {
        const char* filter;
        int nh, nw, c;
        std::vector<int> expect;
    };
    const Case cases[] = {
        {"bicubic", 4, 3, 0, {54, 153, 96, 86, 150, 163, 132, 151, 161, 123, 165, 104}},
        {"lanczos", 9, 5, 1, {71, 154, 255, 78, 199, 75, 196, 151, 132, 87, 130, 202, 59, 160, 16, 212, 104, 176, 78, 150, 197, 35, 188, 26, 179, 137, 19, 155, 26, 163, 139, 24, 191, 49, 216, 195, 90, 101, 137, 147, 235, 136, 13, 193, 71}},
        {"hamming", 6, 8, 2, {142, 175, 232, 91, 81, 158, 217, 250, 179, 125, 28, 116, 146, 234, 137, 83, 34, 76, 150, 31, 28, 128, 204, 246, 219, 174, 94, 205, 205, 98, 181, 227, 222, 182, 110, 232, 236, 140, 66, 26, 43, 99, 198, 113, 121, 254, 191, 155}},
        {"box", 3, 2, 0, {116, 104, 108, 161, 140, 130}},
        {"bilinear", 10, 7, 2, {142, 194, 186, 68, 133, 198, 250, 157, 153, 134, 93, 162, 187, 183, 179, 92, 57, 131, 205, 170, 83, 92, 97, 89, 60, 140, 175, 181, 71, 110, 115, 54, 103, 174, 242, 182, 138, 126, 181, 126, 158, 231, 220, 151, 138, 235, 148, 128, 147, 222, 157, 150, 252, 171, 91, 26, 115, 142, 162, 160, 194, 164, 103, 43, 132, 170, 99, 210, 212, 155}},
        // the height shrinks by more than twice the width: Pillow >= 13 runs the vertical pass first
        {"bilinear", 2, 8, 0, {61, 80, 109, 156, 162, 129, 133, 138, 107, 126, 150, 137, 154, 201, 141, 90}},
        {"bicubic", 3, 4, 1, {118, 179, 137, 103, 147, 104, 98, 131, 162, 83, 113, 143}},
    };
    for (const auto& k : cases) {
        const auto got = channel(vitdeploy::resample(src, k.nh, k.nw, k.filter), k.c);
        if (got != k.expect) std::cerr << "  resample " << k.filter << " to " << k.nh << "x" << k.nw << " differs from Pillow\n";
        CHECK(got == k.expect);
    }
    CHECK(vitdeploy::resample(src, 6, 5, "bicubic").pixels == src.pixels);  // same size: untouched
    CHECK(throws_with([&] { vitdeploy::resample(src, 0, 5, "bilinear"); }, "cannot resample"));
}

// -- variable-size bundles (issue 13): policy, guards, canvas --------------------------------------
bool no_throw(const std::function<void()>& fn) {
    try {
        fn();
        return true;
    } catch (const std::exception& e) {
        std::cerr << "  unexpected: " << e.what() << "\n";
        return false;
    }
}

vitdeploy::VariableSize contract(int canvas, int patch) {
    vitdeploy::VariableSize v;
    v.enabled = true;
    v.canvas_h = v.canvas_w = canvas;
    v.round_h = v.round_w = patch;
    return v;
}

void test_variable_policy_and_guards() {
    using vitdeploy::fitted_size;
    using hw = std::pair<int, int>;
    const auto c = contract(48, 4);
    // the cases of tests/test_variable_size.py (vitdeploy.variable.fitted_size)
    CHECK(fitted_size(100, 50, c, "fit-within") == hw(48, 24));
    CHECK(fitted_size(10, 30, c, "fit-within") == hw(16, 48));     // enlarged to the canvas width
    CHECK(fitted_size(10, 30, c, "shrink-within") == hw(8, 28));   // never enlarged; floored to patches
    CHECK(fitted_size(1, 300, contract(384, 16), "fit-within") == hw(16, 384));  // at least one patch
    const auto [h, w] = fitted_size(480, 640, contract(384, 16), "fit-within");
    CHECK(h % 16 == 0 && w == 384 && std::fabs(static_cast<double>(h) / w - 480.0 / 640) < 16.0 / 384);
    CHECK(fitted_size(60, 90, c, "shrink-within") == hw(32, 48));  // larger than the canvas: shrunk either way
    // Python's round() is half-to-even: 5 * 0.5 = 2.5 -> 2, 7 * 0.5 = 3.5 -> 4
    CHECK(fitted_size(5, 96, contract(48, 1), "fit-within") == hw(2, 48));
    CHECK(fitted_size(7, 96, contract(48, 1), "fit-within") == hw(4, 48));
    // "none": whole patches pass as they are, anything else is refused with Python's line
    CHECK(fitted_size(28, 44, c, "none") == hw(28, 44));
    CHECK(throws_with([&] { fitted_size(30, 45, c, "none"); },
                      "valid_hw row 0 is 30x45, not whole 4x4 patches; the graph would drop the partial patch (use 28x44 or the fit-within policy)"));
    CHECK(throws_with([&] { fitted_size(3, 3, c, "none"); }, "(use 4x4 or"));
    CHECK(throws_with([&] { fitted_size(10, 10, c, "stretch"); }, "unknown variable-size policy 'stretch'"));
    CHECK(throws_with([&] { fitted_size(10, 10, vitdeploy::VariableSize{}, "fit-within"); }, "one fixed-size input"));

    // Algorithm 39.1's guards, one line each, naming the row
    using vitdeploy::check_valid_hw;
    CHECK(no_throw([&] { check_valid_hw({4, 4, 48, 48, 12, 44}, c); }));
    CHECK(throws_with([&] { check_valid_hw({8, 8, 0, 8}, c); }, "valid_hw row 1 is 0x8: every image needs at least one 4x4 patch"));
    CHECK(throws_with([&] { check_valid_hw({-4, 8}, c); }, "at least one"));
    CHECK(throws_with([&] { check_valid_hw({52, 8}, c); }, "valid_hw row 0 is 52x8, larger than the 48x48 canvas; resize it to fit"));
    CHECK(throws_with([&] { check_valid_hw({48, 49}, c); }, "larger than the 48x48 canvas"));
    CHECK(throws_with([&] { check_valid_hw({10, 8}, c); }, "not whole 4x4 patches"));
    CHECK(throws_with([&] { check_valid_hw({2147483647, -2147483647 - 1}, c); }, "at least one"));
    CHECK(throws_with([&] { check_valid_hw({8, 8, 8}, c); }, "[batch, 2]"));
}

void test_variable_canvas(const std::string& dir) {
    const auto c = contract(48, 4);
    // pad_to_canvas: each image top-left, `fill` elsewhere, (h, w) per row
    const auto a = numbered(8, 12);
    const vitdeploy::Image b{44, 4, std::vector<std::uint8_t>(44 * 4 * 3, 200)};
    const auto batch = vitdeploy::pad_to_canvas({a, b}, 48, 48, 7);
    auto px = [&](int i, int y, int x) { return &batch.images[((static_cast<size_t>(i) * 48 + y) * 48 + x) * 3]; };
    CHECK(batch.batch == 2 && batch.canvas_h == 48 && batch.images.size() == 2u * 48 * 48 * 3);
    CHECK((batch.valid_hw == std::vector<std::int32_t>{8, 12, 44, 4}));
    CHECK(px(0, 0, 0)[0] == 0 && px(0, 7, 11)[0] == 81 && px(0, 7, 11)[1] == 0);
    CHECK(px(0, 7, 12)[0] == 7 && px(0, 8, 0)[0] == 7 && px(0, 47, 47)[2] == 7);
    CHECK(px(1, 43, 3)[1] == 200 && px(1, 43, 4)[0] == 7 && px(1, 44, 0)[0] == 7);
    CHECK(no_throw([&] { vitdeploy::check_valid_hw(batch.valid_hw, c); }));
    CHECK(throws_with([&] { vitdeploy::pad_to_canvas({b, numbered(52, 8)}, 48, 48); }, "image 1 is 52x8, larger than the 48x48 canvas"));

    // fit_image: the fitted size, resampled; "none" hands the pixels over untouched
    const auto wide = pattern(10, 30);
    const auto fitted = vitdeploy::fit_image(wide, c, "bilinear", "fit-within");
    CHECK(fitted.height == 16 && fitted.width == 48);
    CHECK(fitted.pixels == vitdeploy::resample(wide, 16, 48, "bilinear").pixels);
    const auto exact = pattern(28, 44);
    CHECK(vitdeploy::fit_image(exact, c, "bicubic", "none").pixels == exact.pixels);

    // the manifest's contract (as exporters/variable_export.py writes it)
    const std::string root = dir + "/variable";
    std::system(("mkdir -p " + root).c_str());
    const std::string vs = R"("variable_size": {"canvas": [48, 48], "canvas_grid": [12, 12], "valid_input": "valid_hw", "round_to": [4, 4],
                              "placement": "top-left", "host_policy": "shrink-within", "rule": "valid sizes are whole patches", "mask_bias": -30000.0})";
    auto write_manifest = [&](const std::string& variable_size) {
        write_text(root + "/manifest.json",
                   manifest(R"({"input": "uint8-nhwc", "channel_order": "bgr", "input_size": [48, 48], "in_graph_resize": null,
                                "host_resize": {"mode": "stretch", "interpolation": "bicubic"}, )" + variable_size + "}",
                            R"({"mode": "variable", "height": 48, "width": 48})"));
    };
    write_manifest(vs);
    write_text(root + "/labels.txt", "cat\ndog\nfox\n");
    const auto bundle = vitdeploy::read_bundle(root);
    const auto& v = bundle.preprocessing.variable_size;
    CHECK(bundle.variable_size() && v.canvas_h == 48 && v.canvas_w == 48 && v.round_h == 4 && v.round_w == 4);
    CHECK(v.valid_input == "valid_hw" && v.placement == "top-left" && v.host_policy == "shrink-within" && v.rule == "valid sizes are whole patches");
    CHECK(!bundle.dynamic_resolution && bundle.input_size() == std::make_pair(48, 48));
    CHECK(throws_with([&] { bundle.input_size({32, 32}); }, "any size in its 48x48 canvas (policy shrink-within)"));

    // load_for_canvas: decode, fit by the manifest's policy (or the one asked for), channel order
    std::vector<std::uint8_t> rgb(10 * 30 * 3);
    for (size_t i = 0; i < rgb.size(); i += 3) rgb[i] = 220, rgb[i + 1] = 20, rgb[i + 2] = 90;
    const std::string png = dir + "/wide.png";
    CHECK(stbi_write_png(png.c_str(), 30, 10, 3, rgb.data(), 30 * 3));
    const auto shrunk = vitdeploy::load_for_canvas(png, bundle);
    CHECK(shrunk.height == 8 && shrunk.width == 28);
    CHECK(shrunk.at(3, 3)[0] == 90 && shrunk.at(3, 3)[2] == 220);  // BGR graph
    const auto grown = vitdeploy::load_for_canvas(png, bundle, "fit-within");
    CHECK(grown.height == 16 && grown.width == 48);
    CHECK(throws_with([&] { vitdeploy::load_for_canvas(png, bundle, "none"); }, "10x30, not whole 4x4 patches"));

    // contracts this library cannot honour are refused at read time, naming the file
    write_manifest(R"("variable_size": {"canvas": [48, 48], "round_to": [4, 4], "placement": "center"})");
    CHECK(throws_with([&] { vitdeploy::read_bundle(root); }, "placement 'center'"));
    write_manifest(R"("variable_size": {"canvas": [48, 48], "round_to": [4, 4], "host_policy": "stretch"})");
    CHECK(throws_with([&] { vitdeploy::read_bundle(root); }, "unknown variable-size policy 'stretch'"));
    write_manifest(R"("variable_size": {"canvas": [0, 48], "round_to": [4, 4]})");
    CHECK(throws_with([&] { vitdeploy::read_bundle(root); }, "variable_size.canvas is not two positive integers"));
    write_manifest(R"("variable_size": {"canvas": [48, 48]})");
    CHECK(throws_with([&] { vitdeploy::read_bundle(root); }, "variable_size.round_to"));
    write_manifest(R"("variable_size": {"canvas": [2, 48], "round_to": [4, 4]})");
    CHECK(throws_with([&] { vitdeploy::read_bundle(root); }, "no whole 4x4 patch"));

    // a single-input bundle is not fed through the canvas path
    write_manifest(R"("variable_size": null)");
    const auto fixed = vitdeploy::read_bundle(root);
    CHECK(!fixed.variable_size());
    CHECK(throws_with([&] { vitdeploy::load_for_canvas(png, fixed); }, "not a variable-size bundle"));
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
    test_integrity(dir);
    test_outputs(dir);
    test_resample_matches_pillow();
    test_variable_policy_and_guards();
    test_variable_canvas(dir);
    std::cout << checks - failures << "/" << checks << " checks passed\n";
    return failures ? 1 : 0;
}
