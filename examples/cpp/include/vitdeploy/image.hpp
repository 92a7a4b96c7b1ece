// Host-side image handling for a vitdeploy graph: decode to uint8 RGB HWC, turn photos upright
// (EXIF), apply the manifest's resize rule, and put channels in the graph's order.
//
// Decoding is stb_image, EXIF is libexif, resampling is Pillow's algorithm (resample.hpp). The
// resize *geometry* (crop_pct, shorter side, centre crop) is the same arithmetic as
// vitdeploy.images.resize_geometry (timm's eval transform), so for the same decoded pixels (PNG,
// BMP, ...) the tensor is byte-identical to Python's; JPEG decoders differ by a level or two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vitdeploy/bundle.hpp"

namespace vitdeploy {

struct Image {
    int height = 0, width = 0;
    std::vector<std::uint8_t> pixels;  // H * W * 3, row-major, RGB unless to_bgr() was applied
    const std::uint8_t* at(int y, int x) const { return &pixels[(static_cast<size_t>(y) * width + x) * 3]; }
    std::uint8_t* at(int y, int x) { return &pixels[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Decode a JPEG/PNG/BMP/... file to RGB and apply its EXIF orientation. Grayscale is replicated,
// alpha dropped (as timm/torchvision/HF `convert("RGB")` do). Throws std::runtime_error naming the file.
Image decode_image(const std::string& path);

// EXIF orientation tag of a JPEG (1..8); 1 when there is none or the file has no EXIF.
int read_exif_orientation(const std::string& path);

// Pixels as they should be displayed for an EXIF orientation (same transposes as Pillow's
// ImageOps.exif_transpose).
Image apply_orientation(const Image& img, int orientation);

struct ResizeGeometry {
    int resized_h, resized_w;  // size after resampling
    int top, left;             // centre crop offset into the resized image
};

// Where the host resize rule sends an (h, w) image for an (th, tw) model input.
ResizeGeometry resize_geometry(int h, int w, const HostResize& rule, int th, int tw);

// Apply the rule: resample to the geometry's size, then crop th x tw from the centre.
Image resize_for_model(const Image& img, const HostResize& rule, int th, int tw);

// RGB -> BGR in place (for graphs exported with --channel-order bgr).
void to_bgr(Image& img);

// Everything above for one file: the uint8 HWC tensor the graph's `images` input takes (batch of one).
Image load_for_model(const std::string& path, const Bundle& bundle, int th, int tw);

}  // namespace vitdeploy
