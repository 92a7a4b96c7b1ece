#include "vitdeploy/variable.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "vitdeploy/resample.hpp"

namespace vitdeploy {
namespace {

std::string hw(long long h, long long w) { return std::to_string(h) + "x" + std::to_string(w); }

}  // namespace

void check_valid_hw(const std::vector<std::int32_t>& valid_hw, const VariableSize& c) {
    if (valid_hw.size() % 2)
        throw std::runtime_error("valid_hw must be [batch, 2] (height, width), got " + std::to_string(valid_hw.size()) + " values");
    for (size_t row = 0; row < valid_hw.size() / 2; ++row) {
        const long long h = valid_hw[2 * row], w = valid_hw[2 * row + 1];
        const std::string at = "valid_hw row " + std::to_string(row) + " is " + hw(h, w);
        if (h <= 0 || w <= 0) throw std::runtime_error(at + ": every image needs at least one " + hw(c.round_h, c.round_w) + " patch");
        if (h > c.canvas_h || w > c.canvas_w)
            throw std::runtime_error(at + ", larger than the " + hw(c.canvas_h, c.canvas_w) + " canvas; resize it to fit (policy fit-within)");
        if (h % c.round_h || w % c.round_w) {
            const long long fix_h = h - h % c.round_h, fix_w = w - w % c.round_w;
            throw std::runtime_error(at + ", not whole " + hw(c.round_h, c.round_w) + " patches; the graph would drop the partial patch (use " +
                                     hw(fix_h ? fix_h : c.round_h, fix_w ? fix_w : c.round_w) + " or the fit-within policy)");
        }
    }
}

std::pair<int, int> fitted_size(int h, int w, const VariableSize& c, const std::string& policy) {
    if (!c.enabled) throw std::runtime_error("this bundle's graph takes one fixed-size input, not (images, valid_hw)");
    if (policy == "none") {
        check_valid_hw({h, w}, c);
        return {h, w};
    }
    check_policy(policy);
    if (h <= 0 || w <= 0) throw std::runtime_error("cannot fit an empty " + hw(h, w) + " image");
    // Python: scale = min(ch / h, cw / w); round() is half-to-even, as std::nearbyint by default.
    double scale = std::min(static_cast<double>(c.canvas_h) / h, static_cast<double>(c.canvas_w) / w);
    if (policy == "shrink-within") scale = std::min(scale, 1.0);
    const long long rh = static_cast<long long>(std::nearbyint(h * scale)), rw = static_cast<long long>(std::nearbyint(w * scale));
    const int nh = static_cast<int>(std::max<long long>(c.round_h, rh / c.round_h * c.round_h));
    const int nw = static_cast<int>(std::max<long long>(c.round_w, rw / c.round_w * c.round_w));
    return {std::min(nh, c.canvas_h / c.round_h * c.round_h), std::min(nw, c.canvas_w / c.round_w * c.round_w)};
}

Image fit_image(const Image& img, const VariableSize& c, const std::string& interpolation, const std::string& policy) {
    const auto [nh, nw] = fitted_size(img.height, img.width, c, policy);
    return resample(img, nh, nw, interpolation);
}

CanvasBatch pad_to_canvas(const std::vector<Image>& images, int canvas_h, int canvas_w, std::uint8_t fill) {
    CanvasBatch b;
    b.batch = static_cast<int>(images.size());
    b.canvas_h = canvas_h;
    b.canvas_w = canvas_w;
    const size_t row_bytes = static_cast<size_t>(canvas_w) * 3, image_bytes = row_bytes * canvas_h;
    b.images.assign(image_bytes * images.size(), fill);
    b.valid_hw.assign(2 * images.size(), 0);
    for (size_t i = 0; i < images.size(); ++i) {
        const Image& img = images[i];
        if (img.height > canvas_h || img.width > canvas_w)
            throw std::runtime_error("image " + std::to_string(i) + " is " + hw(img.height, img.width) + ", larger than the " + hw(canvas_h, canvas_w) +
                                     " canvas; resize it to fit (policy fit-within)");
        for (int y = 0; y < img.height; ++y)
            std::copy_n(img.at(y, 0), static_cast<size_t>(img.width) * 3, b.images.begin() + i * image_bytes + y * row_bytes);
        b.valid_hw[2 * i] = img.height;
        b.valid_hw[2 * i + 1] = img.width;
    }
    return b;
}

Image load_for_canvas(const std::string& path, const Bundle& bundle, const std::string& policy) {
    const VariableSize& c = bundle.preprocessing.variable_size;
    if (!c.enabled)
        throw std::runtime_error(bundle.root + " is not a variable-size bundle (one `images` input); use load_for_model");
    if (bundle.preprocessing.input != "uint8-nhwc")
        throw std::runtime_error("this example feeds uint8-nhwc graphs; the bundle takes " + bundle.preprocessing.input);
    Image img = fit_image(decode_image(path), c, bundle.preprocessing.host_resize.interpolation, policy.empty() ? c.host_policy : policy);
    if (bundle.preprocessing.channel_order == "bgr") to_bgr(img);
    return img;
}

}  // namespace vitdeploy
