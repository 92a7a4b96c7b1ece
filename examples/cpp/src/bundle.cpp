#include "vitdeploy/bundle.hpp"

#include "vitdeploy/integrity.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace vitdeploy {
namespace {

using json = nlohmann::json;

json read_json(const std::string& path, const std::string& what_to_do) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path + "; " + what_to_do);
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw std::runtime_error(path + " is not valid JSON (" + e.what() + "); " + what_to_do);
    }
}

std::string join(const std::string& dir, const std::string& name) {
    if (dir.empty() || dir.back() == '/') return dir + name;
    return dir + "/" + name;
}

std::array<int, 3> triple(const json& j) {
    if (!j.is_array() || j.size() != 3) throw std::runtime_error("profile entry is not [min, opt, max]");
    return {j[0].get<int>(), j[1].get<int>(), j[2].get<int>()};
}

// manifest values may be null; value() throws on null, so read through this.
template <typename T>
T get_or(const json& obj, const char* key, T fallback) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    return it->get<T>();
}

std::array<int, 2> positive_pair(const json& obj, const char* key, const std::string& mpath) {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer() ||
        (*it)[0].get<int>() <= 0 || (*it)[1].get<int>() <= 0)
        throw std::runtime_error(mpath + ": preprocessing.variable_size." + key + " is not two positive integers; re-export the bundle");
    return {(*it)[0].get<int>(), (*it)[1].get<int>()};
}

// preprocessing.variable_size as exporters/variable_export.py writes it. Anything this library would
// have to guess at (another placement, an unknown policy) is refused rather than fed wrongly.
VariableSize read_variable_size(const json& vs, const std::string& mpath) {
    VariableSize v;
    v.enabled = true;
    const auto canvas = positive_pair(vs, "canvas", mpath);
    const auto round_to = positive_pair(vs, "round_to", mpath);
    v.canvas_h = canvas[0], v.canvas_w = canvas[1];
    v.round_h = round_to[0], v.round_w = round_to[1];
    if (v.canvas_h < v.round_h || v.canvas_w < v.round_w)
        throw std::runtime_error(mpath + ": the " + std::to_string(v.canvas_h) + "x" + std::to_string(v.canvas_w) +
                                 " canvas holds no whole " + std::to_string(v.round_h) + "x" + std::to_string(v.round_w) + " patch; re-export the bundle");
    v.valid_input = get_or<std::string>(vs, "valid_input", "valid_hw");
    v.placement = get_or<std::string>(vs, "placement", "top-left");
    if (v.placement != "top-left")
        throw std::runtime_error(mpath + ": variable_size placement '" + v.placement + "' is not supported by this host library (top-left only)");
    v.host_policy = get_or<std::string>(vs, "host_policy", "fit-within");
    try {
        check_policy(v.host_policy);
    } catch (const std::runtime_error& e) {
        throw std::runtime_error(mpath + ": host_policy: " + e.what());
    }
    v.rule = get_or<std::string>(vs, "rule", "");
    return v;
}

}  // namespace

void check_policy(const std::string& policy) {
    if (policy != "fit-within" && policy != "shrink-within" && policy != "none")
        throw std::runtime_error("unknown variable-size policy '" + policy + "'; use one of fit-within, shrink-within, none");
}

std::array<int, 3> parse_version(const std::string& text) {
    std::array<int, 3> v{0, 0, 0};
    std::istringstream in(text);
    std::string part;
    for (int i = 0; i < 3 && std::getline(in, part, '.'); ++i) {
        try {
            v[i] = std::stoi(part);
        } catch (const std::exception&) {
            throw std::runtime_error("TensorRT version '" + text + "' is not MAJOR.MINOR.PATCH");
        }
    }
    return v;
}

std::vector<std::string> read_labels(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open labels file " + path + "; re-export the bundle");
    std::vector<std::string> labels;
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines, as in Python
        labels.push_back(line);
    }
    return labels;
}

EngineInfo read_engine(const std::string& engine_dir, const std::string& target) {
    const std::string path = join(engine_dir, "engine.json");
    json j = read_json(path, "rebuild the engine with `vitdeploy build-engine`");
    EngineInfo e;
    e.target = target;
    e.dir = engine_dir;
    e.plan_path = join(engine_dir, "model.plan");
    e.plan_sha256 = get_or<std::string>(j, "plan_sha256", "");
    e.precision = get_or<std::string>(j, "precision", "fp32");
    e.tensorrt = get_or<std::string>(j, "tensorrt", "");
    e.version_compatible = get_or<bool>(j, "version_compatible", false);
    e.hardware_compatibility = get_or<std::string>(j, "hardware_compatibility", "none");
    if (j.contains("device") && j["device"].is_object()) {
        e.gpu_name = get_or<std::string>(j["device"], "gpu_name", "");
        e.compute_capability = get_or<std::string>(j["device"], "compute_capability", "");
    }
    if (j.contains("input") && j["input"].is_object()) e.input_name = get_or<std::string>(j["input"], "name", "images");
    for (const auto& p : j.value("profiles", json::array())) {
        Profile prof;
        prof.batch = triple(p.at("batch"));
        prof.height = triple(p.at("height"));
        prof.width = triple(p.at("width"));
        e.profiles.push_back(prof);
    }
    if (e.profiles.empty()) throw std::runtime_error(path + " lists no optimisation profile; rebuild the engine");
    return e;
}

Bundle read_bundle(const std::string& dir) {
    const std::string mpath = join(dir, "manifest.json");
    json m = read_json(mpath, "give a bundle folder written by `vitdeploy export`");
    if (get_or<std::string>(m, "format", "") != "vitdeploy-bundle/1")
        throw std::runtime_error(mpath + " is not a vitdeploy-bundle/1 manifest; re-export the bundle");
    Bundle b;
    b.root = dir;
    b.name = get_or<std::string>(m, "name", "");
    const json& spec = m.at("spec");
    b.num_classes = spec.at("num_classes").get<int>();
    b.embed_dim = get_or<int>(spec, "embed_dim", 0);
    b.patch_size = {spec.at("patch_size")[0].get<int>(), spec.at("patch_size")[1].get<int>()};

    const json& pre = m.at("preprocessing");
    Preprocessing& p = b.preprocessing;
    p.input = get_or<std::string>(pre, "input", "uint8-nhwc");
    p.channel_order = get_or<std::string>(pre, "channel_order", "rgb");
    if (pre.contains("input_size") && pre["input_size"].is_array()) {
        p.has_input_size = true;
        p.input_h = pre["input_size"][0].get<int>();
        p.input_w = pre["input_size"][1].get<int>();
    }
    if (pre.contains("in_graph_resize") && pre["in_graph_resize"].is_object()) {
        p.in_graph_resize = true;
        const json& to = pre["in_graph_resize"].at("to");
        p.resize_to_h = to[0].get<int>();
        p.resize_to_w = to[1].get<int>();
    }
    if (pre.contains("host_resize") && pre["host_resize"].is_object()) {
        const json& hr = pre["host_resize"];
        p.host_resize.mode = get_or<std::string>(hr, "mode", "stretch");
        const auto interp = hr.find("interpolation");
        if (interp != hr.end() && interp->is_number_integer()) {
            // Hugging Face configs keep PIL's enum.
            static const char* names[] = {"nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"};
            int k = interp->get<int>();
            if (k < 0 || k > 5) throw std::runtime_error(mpath + ": unknown interpolation " + std::to_string(k));
            p.host_resize.interpolation = names[k];
        } else {
            p.host_resize.interpolation = get_or<std::string>(hr, "interpolation", "bilinear");
        }
        p.host_resize.crop_pct = get_or<double>(hr, "crop_pct", 0.0);
    }
    if (pre.contains("variable_size") && pre["variable_size"].is_object()) p.variable_size = read_variable_size(pre["variable_size"], mpath);

    const json& res = m.at("resolution");
    b.dynamic_resolution = get_or<std::string>(res, "mode", "static") == "dynamic";
    b.default_h = get_or<int>(res, "height", 0);
    b.default_w = get_or<int>(res, "width", 0);

    // graph outputs and what each holds (bundles written before outputs were selectable: logits, probs)
    const json graph = m.contains("graph") && m["graph"].is_object() ? m["graph"] : json::object();
    const json names = graph.contains("outputs") && graph["outputs"].is_array() ? graph["outputs"] : json::array({"logits", "probs"});
    const json details = graph.contains("output_details") && graph["output_details"].is_object() ? graph["output_details"] : json::object();
    for (const auto& n : names) {
        OutputInfo o;
        o.name = n.get<std::string>();
        if (details.contains(o.name) && details[o.name].is_object()) {
            const json& d = details[o.name];
            for (const auto& dim : d.value("shape", json::array())) o.shape.push_back(dim.is_string() ? dim.get<std::string>() : std::to_string(dim.get<long long>()));
            o.meaning = get_or<std::string>(d, "meaning", "");
            o.readout = get_or<std::string>(d, "readout", "");
            o.l2_normalized = get_or<bool>(d, "l2_normalized", false);
            o.final_norm = get_or<std::string>(d, "final_norm", "");
            if (d.contains("dropped_tokens") && d["dropped_tokens"].is_object())
                for (const auto& [kind, count] : d["dropped_tokens"].items()) o.dropped_prefix_tokens += count.get<int>();
        }
        b.outputs.push_back(o);
    }

    b.labels = read_labels(join(dir, "labels.txt"));
    // class scores need one label per class; a backbone or a projection head (CLIP-style embedding) has none
    const bool class_outputs = b.has_output("logits") || b.has_output("probs");
    if (class_outputs && static_cast<int>(b.labels.size()) != b.num_classes)
        throw std::runtime_error(join(dir, "labels.txt") + " has " + std::to_string(b.labels.size()) + " labels but the model has " +
                                 std::to_string(b.num_classes) + " classes; re-export the bundle");

    if (m.contains("artifacts") && m["artifacts"].is_object()) {
        for (const auto& [precision, record] : m["artifacts"].items()) {  // the precisions' graphs and the backend variants
            const json* it = &record;
            if (!it->is_object()) continue;
            const auto file = get_or<std::string>(*it, "file", "");
            if (file.empty() || file.find('/') != std::string::npos || file[0] == '.')
                throw std::runtime_error(mpath + ": artifacts." + precision + ".file is not a file name inside the bundle; re-export the bundle");
            b.artifacts.push_back({precision, join(dir, file), get_or<std::string>(*it, "sha256", "")});
        }
    }

    if (m.contains("engines") && m["engines"].is_object()) {
        for (const auto& [target, record] : m["engines"].items()) {
            std::string rel = "engines/" + target;
            if (record.is_object()) rel = get_or<std::string>(record, "dir", rel);
            // An unreadable engine must not stop the host-side tools (they need no engine); classify
            // reports it among the reasons no engine fits.
            try {
                b.engines.push_back(read_engine(join(dir, rel), target));
            } catch (const std::exception& e) {
                b.engine_errors.push_back(target + ": " + e.what());
            }
        }
    }
    if (m.contains("precisions") && m["precisions"].is_object() && m["precisions"].contains("best_order")) {
        const json& order = m["precisions"]["best_order"];
        if (!order.is_array())
            throw std::runtime_error(mpath + ": precisions.best_order is not a list; rebuild the engine with vitdeploy build-engine");
        for (const auto& p : order) b.precision_order.push_back(p.get<std::string>());
    } else {
        for (const auto& e : b.engines)
            if (std::find(b.precision_order.begin(), b.precision_order.end(), e.precision) == b.precision_order.end())
                b.precision_order.push_back(e.precision);
    }
    return b;
}

std::string Bundle::verified_graph(const std::string& precision) const {
    for (const auto& a : artifacts)
        if (a.precision == precision) {
            verify_sha256(a.path, a.sha256, precision + " graph");
            return a.path;
        }
    throw std::runtime_error("bundle " + root + " has no " + precision + " graph in its manifest; make it with vitdeploy (export, convert, calibrate)");
}

std::string Bundle::verified_plan(const EngineInfo& engine) const {
    verify_sha256(engine.plan_path, engine.plan_sha256, "engine plan");
    return engine.plan_path;
}

bool Bundle::has_output(const std::string& name) const {
    for (const auto& o : outputs)
        if (o.name == name) return true;
    return false;
}

size_t Bundle::output_elements(const std::string& name, int h, int w) const {
    if (!has_output(name)) {
        std::string have;
        for (const auto& o : outputs) have += (have.empty() ? "" : ",") + o.name;
        throw std::runtime_error("the graph has no " + name + " output (outputs: " + have + "); re-export with vitdeploy export --outputs " +
                                 have + "," + name);
    }
    if (name == "logits" || name == "probs") return static_cast<size_t>(num_classes);
    if (embed_dim <= 0) throw std::runtime_error("the manifest's spec has no embed_dim; re-export the bundle");
    if (name == "embedding") return static_cast<size_t>(embed_dim);
    if (name == "patch_grid") {
        if (h % patch_size[0] || w % patch_size[1])
            throw std::runtime_error(std::to_string(h) + "x" + std::to_string(w) + " is not a multiple of the patch size");
        return static_cast<size_t>(embed_dim) * (h / patch_size[0]) * (w / patch_size[1]);
    }
    throw std::runtime_error("unknown output " + name);
}

std::pair<int, int> Bundle::input_size(std::pair<int, int> requested) const {
    const Preprocessing& p = preprocessing;
    const bool asked = requested.first > 0 && requested.second > 0;
    if (p.variable_size.enabled) {
        const VariableSize& v = p.variable_size;
        if (asked && requested != std::make_pair(v.canvas_h, v.canvas_w))
            throw std::runtime_error("this variable-size graph takes images of any size in its " + std::to_string(v.canvas_h) + "x" +
                                     std::to_string(v.canvas_w) + " canvas (policy " + v.host_policy + "); give no size");
        return {v.canvas_h, v.canvas_w};
    }
    if (p.has_input_size && !p.in_graph_resize) {
        if (asked && requested != std::make_pair(p.input_h, p.input_w))
            throw std::runtime_error("this graph takes " + std::to_string(p.input_h) + "x" + std::to_string(p.input_w) +
                                     " images only (static resolution)");
        return {p.input_h, p.input_w};
    }
    if (p.in_graph_resize) return asked ? requested : std::make_pair(p.resize_to_h, p.resize_to_w);
    std::pair<int, int> size = asked ? requested : std::make_pair(default_h, default_w);
    if (size.first <= 0 || size.second <= 0)
        throw std::runtime_error("dynamic-resolution bundle without a default size; pass one");
    if (size.first % patch_size[0] || size.second % patch_size[1])
        throw std::runtime_error(std::to_string(size.first) + "x" + std::to_string(size.second) + " is not a multiple of the patch size " +
                                 std::to_string(patch_size[0]) + "x" + std::to_string(patch_size[1]));
    return size;
}

}  // namespace vitdeploy
