// classify: run a vitdeploy bundle's TensorRT engine on image files (TensorRT >= 8.5 C++ API).
//
//   classify BUNDLE IMAGE... [--engine TARGET] [--top-k K] [--size HxW] [--policy POLICY]
//
// The engine takes raw uint8 HWC pixels (preprocessing is inside it): this program decodes each
// image, applies the manifest's resize rule, copies the batch to the GPU, runs enqueueV3 and prints
// the top-k labels. Before deserialising it checks the engine's fingerprint (TensorRT version,
// compute capability) against this device and says "rebuild on this device" on a mismatch.
//
// A variable-size bundle's engine takes two inputs: each image is fitted by the policy (default:
// the manifest's host_policy; fit-within, shrink-within or none), padded top-left into the canvas,
// and its (height, width) goes into `valid_hw`; the sizes are checked by the graph's guards before
// enqueueV3, and images of different sizes share one batch.
#include <cuda_runtime_api.h>

#include <NvInfer.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "vitdeploy/bundle.hpp"
#include "vitdeploy/image.hpp"
#include "vitdeploy/topk.hpp"
#include "vitdeploy/variable.hpp"

namespace {

class Logger : public nvinfer1::ILogger {
   public:
    void log(Severity severity, const char* msg) noexcept override {
        if (severity <= Severity::kWARNING) std::cerr << "[TensorRT] " << msg << "\n";
    }
};

void cuda_check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
}

struct DeviceBuffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    explicit DeviceBuffer(size_t n) : bytes(n) { cuda_check(cudaMalloc(&ptr, n), "cudaMalloc"); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// getInferLibVersion(): MAJOR*10000 + MINOR*100 + PATCH from TensorRT 10, MAJOR*1000 + ... before.
std::array<int, 3> runtime_trt_version() {
    const int v = getInferLibVersion();
    if (v >= 100000) return {v / 10000, (v / 100) % 100, v % 100};
    return {v / 1000, (v / 100) % 10, v % 100};
}

std::string version_text(const std::array<int, 3>& v) {
    return std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
}

// Why `e` cannot run here (empty when it can): the same rules as vitdeploy.engine.fingerprint.mismatches.
std::string mismatch(const vitdeploy::EngineInfo& e, const std::array<int, 3>& trt, const std::string& cc, const std::string& gpu) {
    const auto built = vitdeploy::parse_version(e.tensorrt);
    std::string why;
    if (e.version_compatible) {
        if (built[0] != trt[0] || trt < built) why += "built version-compatible with TensorRT " + e.tensorrt + ", this is " + version_text(trt);
    } else if (built != trt) {
        why += "built with TensorRT " + e.tensorrt + ", this is " + version_text(trt);
    }
    const bool cc_ok = e.hardware_compatibility == "ampere+" ? std::stod(cc) >= 8.0 : e.compute_capability == cc;
    if (!cc_ok) why += (why.empty() ? "" : "; ") + ("built for " + e.gpu_name + " (sm " + e.compute_capability + "), this is " + gpu + " (sm " + cc + ")");
    return why;
}

struct Args {
    std::string bundle;
    std::vector<std::string> images;
    std::string engine;
    size_t top_k = 5;
    std::pair<int, int> size{0, 0};
    std::string policy;  // variable-size bundles: empty = the manifest's host_policy
};

Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string s = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error(s + " needs a value");
            return argv[++i];
        };
        if (s == "--engine") a.engine = next();
        else if (s == "--policy") a.policy = next();
        else if (s == "--top-k") a.top_k = std::stoul(next());
        else if (s == "--size") {
            const std::string v = next();
            const auto x = v.find('x');
            a.size = x == std::string::npos ? std::make_pair(std::stoi(v), std::stoi(v)) : std::make_pair(std::stoi(v.substr(0, x)), std::stoi(v.substr(x + 1)));
        } else if (a.bundle.empty()) a.bundle = s;
        else a.images.push_back(s);
    }
    if (a.bundle.empty() || a.images.empty()) throw std::runtime_error("usage: classify BUNDLE IMAGE... [--engine TARGET] [--top-k K] [--size HxW] [--policy POLICY]");
    return a;
}

int run(const Args& args) {
    const vitdeploy::Bundle bundle = vitdeploy::read_bundle(args.bundle);
    const auto [h, w] = bundle.input_size(args.size);  // the canvas, for a variable-size bundle
    const vitdeploy::VariableSize& variable = bundle.preprocessing.variable_size;
    const std::string policy = args.policy.empty() ? variable.host_policy : args.policy;
    if (!variable.enabled && !args.policy.empty())
        throw std::runtime_error("--policy applies to variable-size bundles; " + args.bundle + " takes one fixed-size input");
    vitdeploy::check_policy(policy);

    // This device
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    const std::string cc = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    const auto trt = runtime_trt_version();

    // Pick the engine: the named one, else the lowest precision that fits this device and size.
    const vitdeploy::EngineInfo* chosen = nullptr;
    int profile = -1;
    std::string reasons;
    for (const auto& error : bundle.engine_errors) reasons += "\n  " + error;
    for (const std::string& precision : bundle.precision_order) {  // best first, as the bundle records it
        for (const auto& e : bundle.engines) {
            if (chosen || (!args.engine.empty() ? e.target != args.engine : e.precision != precision)) continue;
            std::string why = mismatch(e, trt, cc, prop.name);
            int p = -1;
            for (size_t i = 0; i < e.profiles.size() && p < 0; ++i)
                if (e.profiles[i].covers(h, w)) p = static_cast<int>(i);
            if (p < 0) why += (why.empty() ? "" : "; ") + std::string("no profile covers ") + std::to_string(h) + "x" + std::to_string(w);
            if (why.empty()) chosen = &e, profile = p;
            else reasons += "\n  " + e.target + ": " + why;
        }
    }
    if (!chosen) {
        std::cerr << "error: no engine of " << args.bundle << " runs here (TensorRT " << version_text(trt) << ", " << prop.name << ", sm " << cc << ")"
                  << (reasons.empty() ? "; the bundle has no engine" + std::string(args.engine.empty() ? "" : " " + args.engine) : reasons)
                  << "\nrebuild on this device: vitdeploy build-engine " << args.bundle << "\n";
        return 1;
    }
    std::cerr << "engine " << chosen->target << " (" << chosen->precision << ", TensorRT " << chosen->tensorrt << "), input " << h << "x" << w << "\n";

    // the plan is what engine.json vouches for (its plan_sha256), or it is not deserialised
    std::ifstream in(bundle.verified_plan(*chosen), std::ios::binary | std::ios::ate);
    if (!in) throw std::runtime_error("cannot open " + chosen->plan_path);
    std::vector<char> plan(static_cast<size_t>(in.tellg()));
    in.seekg(0);
    in.read(plan.data(), static_cast<std::streamsize>(plan.size()));

    Logger logger;
    std::unique_ptr<nvinfer1::IRuntime> runtime(nvinfer1::createInferRuntime(logger));
    std::unique_ptr<nvinfer1::ICudaEngine> engine(runtime->deserializeCudaEngine(plan.data(), plan.size()));
    if (!engine) throw std::runtime_error("TensorRT could not deserialise " + chosen->plan_path + "; rebuild on this device");
    std::unique_ptr<nvinfer1::IExecutionContext> context(engine->createExecutionContext());
    if (!context) throw std::runtime_error("createExecutionContext failed");

    // The engine's inputs must be the bundle graph's: (images) or (images, valid_hw).
    const std::string input = chosen->input_name;
    std::vector<std::string> inputs, expected{input};
    if (variable.enabled) expected.push_back(variable.valid_input);
    for (int i = 0; i < engine->getNbIOTensors(); ++i) {
        const char* name = engine->getIOTensorName(i);
        if (engine->getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT) inputs.push_back(name);
    }
    if (!std::is_permutation(inputs.begin(), inputs.end(), expected.begin(), expected.end())) {
        auto list = [](const std::vector<std::string>& v) {
            std::string s;
            for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
            return "(" + s + ")";
        };
        throw std::runtime_error("engine " + chosen->target + " takes inputs " + list(inputs) + " but the bundle's graph takes " + list(expected) +
                                 "; rebuild it: vitdeploy build-engine " + args.bundle);
    }
    const char* valid_name = variable.enabled ? variable.valid_input.c_str() : nullptr;
    if (valid_name && engine->getTensorDataType(valid_name) != nvinfer1::DataType::kINT32)
        throw std::runtime_error("engine input " + variable.valid_input + " is not int32; rebuild the engine from this bundle");
    // A shape tensor (should the builder have made valid_hw one) is read from host memory.
    const bool valid_on_host = valid_name && engine->isShapeInferenceIO(valid_name);

    cudaStream_t stream;
    cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    if (profile > 0 && !context->setOptimizationProfileAsync(profile, stream)) throw std::runtime_error("cannot select optimisation profile");

    const auto& prof = chosen->profiles[profile];
    const int max_batch = prof.batch[2], min_batch = prof.batch[0];
    const size_t image_bytes = static_cast<size_t>(h) * w * 3;
    DeviceBuffer d_input(image_bytes * max_batch);
    std::vector<std::int32_t> host_valid(2 * static_cast<size_t>(max_batch));
    std::unique_ptr<DeviceBuffer> d_valid;
    if (valid_name && !valid_on_host) d_valid = std::make_unique<DeviceBuffer>(sizeof(std::int32_t) * host_valid.size());

    // Output buffers at the largest batch; names from the engine itself, sizes from the manifest
    // (logits/probs K, embedding d, patch_grid d * G_h * G_w at this input size).
    const int classes = bundle.num_classes;
    std::map<std::string, std::unique_ptr<DeviceBuffer>> outputs;
    for (int i = 0; i < engine->getNbIOTensors(); ++i) {
        const char* name = engine->getIOTensorName(i);
        if (engine->getTensorIOMode(name) != nvinfer1::TensorIOMode::kOUTPUT) continue;
        if (engine->getTensorDataType(name) != nvinfer1::DataType::kFLOAT) throw std::runtime_error(std::string("output ") + name + " is not float32");
        outputs[name] = std::make_unique<DeviceBuffer>(sizeof(float) * bundle.output_elements(name, h, w) * max_batch);
    }
    const std::string answer = outputs.count("probs") ? "probs" : "logits";
    if (!outputs.count(answer))
        throw std::runtime_error("the engine has no probs or logits output (a backbone bundle: embedding/patch_grid); classify needs class scores");

    std::vector<std::uint8_t> host_in(image_bytes * max_batch);
    std::vector<float> host_out(static_cast<size_t>(classes) * max_batch);
    for (size_t start = 0; start < args.images.size(); start += max_batch) {
        const int n = static_cast<int>(std::min<size_t>(max_batch, args.images.size() - start));
        const int fed = std::max(n, min_batch);  // pad up to the profile's minimum with the last image
        if (variable.enabled) {
            // Each image at its own whole-patch size, top-left in the canvas; mixed sizes share the batch.
            std::vector<vitdeploy::Image> fitted;
            for (int i = 0; i < n; ++i) fitted.push_back(vitdeploy::load_for_canvas(args.images[start + i], bundle, policy));
            while (static_cast<int>(fitted.size()) < fed) fitted.push_back(fitted.back());
            const vitdeploy::CanvasBatch batch = vitdeploy::pad_to_canvas(fitted, h, w);
            vitdeploy::check_valid_hw(batch.valid_hw, variable);  // refused in one line before the call, never clamped
            std::memcpy(host_in.data(), batch.images.data(), batch.images.size());
            std::copy(batch.valid_hw.begin(), batch.valid_hw.end(), host_valid.begin());
        } else {
            for (int i = 0; i < fed; ++i) {
                const auto img = vitdeploy::load_for_model(args.images[start + std::min(i, n - 1)], bundle, h, w);
                std::memcpy(host_in.data() + i * image_bytes, img.pixels.data(), image_bytes);
            }
        }
        cuda_check(cudaMemcpyAsync(d_input.ptr, host_in.data(), image_bytes * fed, cudaMemcpyHostToDevice, stream), "copy to GPU");
        if (!context->setInputShape(input.c_str(), nvinfer1::Dims4{fed, h, w, 3})) throw std::runtime_error("setInputShape rejected the batch");
        context->setTensorAddress(input.c_str(), d_input.ptr);
        if (valid_name) {
            if (!context->setInputShape(valid_name, nvinfer1::Dims2{fed, 2}))
                throw std::runtime_error(variable.valid_input + ": setInputShape rejected [" + std::to_string(fed) + ", 2]");
            if (valid_on_host) {
                context->setTensorAddress(valid_name, host_valid.data());
            } else {
                cuda_check(cudaMemcpyAsync(d_valid->ptr, host_valid.data(), sizeof(std::int32_t) * 2 * fed, cudaMemcpyHostToDevice, stream),
                           "copy valid_hw to GPU");
                context->setTensorAddress(valid_name, d_valid->ptr);
            }
        }
        for (auto& [name, buf] : outputs) context->setTensorAddress(name.c_str(), buf->ptr);
        if (!context->enqueueV3(stream)) throw std::runtime_error("enqueueV3 failed");
        cuda_check(cudaMemcpyAsync(host_out.data(), outputs[answer]->ptr, sizeof(float) * classes * n, cudaMemcpyDeviceToHost, stream), "copy from GPU");
        cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        for (int i = 0; i < n; ++i) {
            const float* row = host_out.data() + static_cast<size_t>(i) * classes;
            const auto probs = answer == "probs" ? std::vector<float>(row, row + classes) : vitdeploy::softmax(row, classes);
            std::cout << args.images[start + i] << ": " << vitdeploy::format_top(vitdeploy::top_k(probs, args.top_k), bundle.labels) << "\n";
        }
    }
    cudaStreamDestroy(stream);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse_args(argc, argv));
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
}
