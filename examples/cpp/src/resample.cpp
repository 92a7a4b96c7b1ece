#include "vitdeploy/resample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

// The arithmetic below follows Pillow's libImaging/Resample.c step by step (double-precision
// coefficients, the same rounding of the kernel bounds, normalisation, then 22-bit fixed point with
// a half added before the shift). Any "simplification" of it changes output bytes.
namespace vitdeploy {
namespace {

constexpr double kPi = 3.14159265358979323846;  // M_PI
constexpr int kPrecisionBits = 32 - 8 - 2;      // Pillow's PRECISION_BITS

struct Filter {
    double (*fn)(double);
    double support;
};

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_filter(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * kPi;
    return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // float constants, as in Pillow
}

double bicubic_filter(double x) {
    constexpr double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

double sinc_filter(double x) {
    if (x == 0.0) return 1.0;
    x = x * kPi;
    return std::sin(x) / x;
}

double lanczos_filter(double x) { return (-3.0 <= x && x < 3.0) ? sinc_filter(x) * sinc_filter(x / 3) : 0.0; }

Filter filter_for(const std::string& name) {
    if (name == "box") return {box_filter, 0.5};
    if (name == "bilinear") return {bilinear_filter, 1.0};
    if (name == "hamming") return {hamming_filter, 1.0};
    if (name == "bicubic") return {bicubic_filter, 2.0};
    if (name == "lanczos") return {lanczos_filter, 3.0};
    throw std::runtime_error("unknown interpolation '" + name + "' (known: nearest, box, bilinear, hamming, bicubic, lanczos)");
}

// One output pixel reads `count` inputs from `first` on, weighted by weights[i * ksize ...].
struct Kernel {
    int ksize = 0;
    std::vector<int> first, count;
    std::vector<std::int32_t> weights;
};

Kernel precompute(int in_size, int out_size, const Filter& f) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;  // widen the kernel when shrinking (antialias)
    const double support = f.support * filterscale;
    Kernel k;
    k.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
    k.first.resize(out_size);
    k.count.resize(out_size);
    k.weights.assign(static_cast<size_t>(out_size) * k.ksize, 0);
    const double inv_filterscale = 1.0 / filterscale;
    std::vector<double> w(k.ksize);
    for (int xx = 0; xx < out_size; ++xx) {
        const double center = (xx + 0.5) * scale;
        int xmin = static_cast<int>(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = static_cast<int>(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; ++x) ww += (w[x] = f.fn((x + xmin - center + 0.5) * inv_filterscale));
        for (int x = 0; x < xmax; ++x) {
            const double v = ww != 0.0 ? w[x] / ww : w[x];
            k.weights[static_cast<size_t>(xx) * k.ksize + x] =
                v < 0 ? static_cast<std::int32_t>(-0.5 + v * (1 << kPrecisionBits)) : static_cast<std::int32_t>(0.5 + v * (1 << kPrecisionBits));
        }
        k.first[xx] = xmin;
        k.count[xx] = xmax;
    }
    return k;
}

inline std::uint8_t clip8(int sum) {
    const int v = sum >> kPrecisionBits;  // arithmetic shift, as Pillow's lookup table index
    return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Rows [row0, row0 + out.height) of `in`, resampled along x with `k`.
void horizontal(const Image& in, int row0, const Kernel& k, Image& out) {
    for (int y = 0; y < out.height; ++y) {
        const std::uint8_t* line = in.at(row0 + y, 0);
        for (int xx = 0; xx < out.width; ++xx) {
            const std::int32_t* w = &k.weights[static_cast<size_t>(xx) * k.ksize];
            const std::uint8_t* src = line + static_cast<size_t>(k.first[xx]) * 3;
            int s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < k.count[xx]; ++x) {
                s0 += src[x * 3 + 0] * w[x];
                s1 += src[x * 3 + 1] * w[x];
                s2 += src[x * 3 + 2] * w[x];
            }
            std::uint8_t* dst = out.at(y, xx);
            dst[0] = clip8(s0), dst[1] = clip8(s1), dst[2] = clip8(s2);
        }
    }
}

// `in` resampled along y with `k`, whose source rows are shifted up by `row0`.
void vertical(const Image& in, int row0, const Kernel& k, Image& out) {
    for (int yy = 0; yy < out.height; ++yy) {
        const std::int32_t* w = &k.weights[static_cast<size_t>(yy) * k.ksize];
        const int first = k.first[yy] - row0;
        for (int xx = 0; xx < out.width; ++xx) {
            int s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
            for (int y = 0; y < k.count[yy]; ++y) {
                const std::uint8_t* src = in.at(first + y, xx);
                s0 += src[0] * w[y];
                s1 += src[1] * w[y];
                s2 += src[2] * w[y];
            }
            std::uint8_t* dst = out.at(yy, xx);
            dst[0] = clip8(s0), dst[1] = clip8(s1), dst[2] = clip8(s2);
        }
    }
}

Image resample_nearest(const Image& img, int nh, int nw) {
    // Pillow's NEAREST resize (ImagingScaleAffine): the source coordinate starts at scale / 2 and is
    // accumulated by adding the scale per output pixel, then truncated. The accumulated sum (not
    // (i + 0.5) * scale) decides ties such as 79.99999 vs 80, so it is reproduced as is.
    auto table = [](int in, int out) {
        std::vector<int> idx(out);
        const double scale = static_cast<double>(in) / out;
        double pos = scale * 0.5;
        for (int i = 0; i < out; ++i, pos += scale) idx[i] = std::min(in - 1, static_cast<int>(pos));
        return idx;
    };
    const std::vector<int> ys = table(img.height, nh), xs = table(img.width, nw);
    Image out{nh, nw, std::vector<std::uint8_t>(static_cast<size_t>(nh) * nw * 3)};
    for (int y = 0; y < nh; ++y)
        for (int x = 0; x < nw; ++x) std::copy_n(img.at(ys[y], xs[x]), 3, out.at(y, x));
    return out;
}

}  // namespace

Image resample(const Image& img, int nh, int nw, const std::string& interpolation) {
    if (nh <= 0 || nw <= 0 || img.height <= 0 || img.width <= 0)
        throw std::runtime_error("cannot resample a " + std::to_string(img.height) + "x" + std::to_string(img.width) + " image to " +
                                 std::to_string(nh) + "x" + std::to_string(nw));
    if (nh == img.height && nw == img.width) return img;
    if (interpolation == "nearest") return resample_nearest(img, nh, nw);
    const Filter f = filter_for(interpolation);
    const Kernel ky = precompute(img.height, nh, f);
    const bool need_horizontal = nw != img.width, need_vertical = nh != img.height;
    auto blank = [](int h, int w) { return Image{h, w, std::vector<std::uint8_t>(static_cast<size_t>(h) * w * 3)}; };
    // Pillow >= 13 runs the vertical pass first when the height shrinks by more than twice as many
    // pixels as the width does (Pillow <= 12: always horizontal first). The intermediate image is
    // rounded to uint8, so the order shows in the last bit of some pixels.
    const int dh = img.height - nh, dw = img.width - nw;
    if (need_horizontal && need_vertical && dh > 0 && dh > dw * 2) {
        Image down = blank(nh, img.width), out = blank(nh, nw);
        vertical(img, 0, ky, down);
        horizontal(down, 0, precompute(img.width, nw, f), out);
        return out;
    }
    // Horizontal first, only over the source rows the vertical pass will read.
    const int row_first = ky.first[0], row_last = ky.first[nh - 1] + ky.count[nh - 1];
    Image across;
    const Image* src = &img;
    int row0 = 0;
    if (need_horizontal) {
        across = blank(row_last - row_first, nw);
        horizontal(img, row_first, precompute(img.width, nw, f), across);
        src = &across;
        row0 = row_first;
    }
    if (!need_vertical) return *src;
    Image out = blank(nh, nw);
    vertical(*src, row0, ky, out);
    return out;
}

}  // namespace vitdeploy
