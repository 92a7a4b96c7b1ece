// Reading a vitdeploy bundle from C++: manifest.json, labels.txt and engines/<target>/engine.json.
//
// Only what an application needs to feed the graph and read its answer: the input size rule,
// channel order, host resize rule, labels, and each engine's TensorRT version, GPU and profiles.
// The pixel preprocessing (scale, mean/std, layout) is inside the graph and is not repeated here.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace vitdeploy {

// How the host turns an arbitrary image into the model's input size (manifest preprocessing.host_resize).
struct HostResize {
    std::string mode = "stretch";          // "stretch" | "shorter-side-center-crop"
    std::string interpolation = "bilinear";  // a Pillow filter: nearest, box, bilinear, hamming, bicubic, lanczos
    double crop_pct = 0.0;                 // 0: none (a crop_pct of 1)
};

// The two-input contract of a variable-size bundle (`vitdeploy export --variable-size --canvas HxW`,
// manifest preprocessing.variable_size): the graph takes `images` uint8 [B, canvas_h, canvas_w, 3]
// with each image top-left in its canvas and `valid_input` int32 [B, 2] = (valid height, width).
// Valid sizes are whole patches (round_to) within the canvas; the host fits each image by a policy.
struct VariableSize {
    bool enabled = false;                    // false: a single-input graph
    int canvas_h = 0, canvas_w = 0;
    int round_h = 0, round_w = 0;            // valid sizes are multiples of these (the patch size)
    std::string valid_input = "valid_hw";
    std::string placement = "top-left";
    std::string host_policy = "fit-within";  // "fit-within" | "shrink-within" | "none"
    std::string rule;                        // the declared rule, as the manifest words it
};

struct Preprocessing {
    std::string input = "uint8-nhwc";  // or "float-nchw" (the caller normalises; not handled here)
    std::string channel_order = "rgb";  // "bgr" graphs take BGR pixels
    bool has_input_size = false;        // static graph: input_h x input_w only
    int input_h = 0, input_w = 0;
    bool in_graph_resize = false;  // the graph resizes any input to resize_to_h x resize_to_w
    int resize_to_h = 0, resize_to_w = 0;
    HostResize host_resize;
    VariableSize variable_size;  // enabled for two-input (images, valid_hw) graphs
};

// One optimisation profile of an engine: {min, opt, max} per axis.
struct Profile {
    std::array<int, 3> batch{1, 1, 1}, height{0, 0, 0}, width{0, 0, 0};
    bool covers(int h, int w) const { return height[0] <= h && h <= height[2] && width[0] <= w && w <= width[2]; }
};

struct EngineInfo {
    std::string target;      // engines/<target>
    std::string dir;         // absolute-or-relative path of that folder
    std::string plan_path;   // dir/model.plan
    std::string plan_sha256;  // engine.json plan_sha256: checked before the plan is deserialised (integrity.hpp)
    std::string precision;   // fp32 | fp16 | int8
    std::string tensorrt;    // TensorRT version that built it, e.g. "10.3.0"
    std::string gpu_name;
    std::string compute_capability;  // "8.7"
    bool version_compatible = false;
    std::string hardware_compatibility = "none";
    std::string input_name = "images";
    std::vector<Profile> profiles;
};

// One output of the graph (manifest graph.outputs + graph.output_details): logits [B, K], probs [B, K],
// embedding [B, d] (pooled pre-head feature) or patch_grid [B, d, G_h, G_w] (final patch tokens,
// row-major grid: token n = r*G_w + s at [:, :, r, s]; prefix and register tokens dropped).
struct OutputInfo {
    std::string name;
    std::vector<std::string> shape;  // as the manifest writes it: "batch", "64", "grid_h", ...
    std::string meaning;
    std::string readout;             // embedding: "cls" | "gap" | "cls+dist"
    bool l2_normalized = false;      // embedding: L2-normalised inside the graph
    std::string final_norm;          // "norm", "fc_norm", "layernorm" or "" (none)
    int dropped_prefix_tokens = 0;   // patch_grid: CLS + distillation + register tokens left out
};

// A graph the manifest records (artifacts.<precision>): its file inside the bundle and its sha256.
struct Artifact {
    std::string precision;  // fp32 | fp16 | int8 | cpu
    std::string path;       // root/file
    std::string sha256;
};

struct Bundle {
    std::string root;
    std::string name;
    Preprocessing preprocessing;
    std::vector<std::string> labels;
    int num_classes = 0;   // 0: a backbone without a classification head
    int embed_dim = 0;     // d
    std::vector<OutputInfo> outputs;  // in graph order; {logits, probs} for bundles older than the field
    std::array<int, 2> patch_size{0, 0};
    bool dynamic_resolution = false;
    int default_h = 0, default_w = 0;  // manifest resolution height/width
    std::vector<Artifact> artifacts;  // manifest artifacts, in the manifest's order
    std::vector<EngineInfo> engines;
    // "best" order of the precisions, best first, as vitdeploy's precision registry wrote it into the
    // manifest ("precisions": {"best_order": [...]}, recorded with every engine build). A manifest without
    // it (engines built before the record existed): the precisions of the engines in the manifest's order.
    std::vector<std::string> precision_order;
    std::vector<std::string> engine_errors;  // listed engines whose engine.json could not be read

    bool variable_size() const { return preprocessing.variable_size.enabled; }

    // (H, W) the host feeds: fixed by a static graph (the canvas of a variable-size graph), the
    // resize target of a graph that resizes inside, else `requested` (or the manifest's default)
    // checked against the patch size. Mirrors vitdeploy.images.model_input_size. Pass {0, 0} for
    // "no request".
    std::pair<int, int> input_size(std::pair<int, int> requested = {0, 0}) const;

    bool has_output(const std::string& name) const;
    // The path of the `precision` graph after checking its sha256 against the manifest (one-line
    // std::runtime_error when it is absent or differs): what an ONNX Runtime host opens.
    std::string verified_graph(const std::string& precision) const;
    // The engine's plan path after checking it against engine.json's plan_sha256.
    std::string verified_plan(const EngineInfo& engine) const;
    // Floats one image contributes to output `name` at input h x w (K, d, or d * G_h * G_w): the
    // size of a host/device buffer per batch row. Throws for an output the graph does not have.
    size_t output_elements(const std::string& name, int h, int w) const;
};

// Throws std::runtime_error with one line naming the file and what to do.
Bundle read_bundle(const std::string& dir);
std::vector<std::string> read_labels(const std::string& path);
EngineInfo read_engine(const std::string& engine_dir, const std::string& target);

// TensorRT versions as engine.json writes them ("10.3.0") -> {major, minor, patch}.
std::array<int, 3> parse_version(const std::string& text);

// Throws (one line) unless `policy` is fit-within, shrink-within or none.
void check_policy(const std::string& policy);

}  // namespace vitdeploy
