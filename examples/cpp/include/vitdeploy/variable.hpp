// The host side of a variable-size bundle (two inputs: `images` uint8 [B, H_c, W_c, 3] with each
// image top-left in its canvas, `valid_hw` int32 [B, 2]). The same rules as vitdeploy/variable.py:
//
//   fit-within     keep the aspect ratio, scale (up or down) so the image fits the canvas, round each
//                  side down to whole patches (at least one), resize with the manifest's interpolation
//   shrink-within  the same, but never enlarge
//   none           the caller's pixels as they are: sizes must already be whole patches in the canvas
//
// and Algorithm 39.1's guards: a valid size of zero, larger than the canvas or not whole patches is
// refused in one line before the graph is called (the graph would clamp or floor it silently).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vitdeploy/bundle.hpp"
#include "vitdeploy/image.hpp"

namespace vitdeploy {

// The whole-patch (h, w) an image of h x w is resized to under `policy` (fitted_size in Python).
// Throws for an unknown policy, and under "none" for a size the guards refuse.
std::pair<int, int> fitted_size(int h, int w, const VariableSize& contract, const std::string& policy);

// Throws std::runtime_error naming the first bad row: `valid_hw` holds [rows, 2] = h, w, h, w, ...
// (check_sizes_for_canvas in Python, same messages).
void check_valid_hw(const std::vector<std::int32_t>& valid_hw, const VariableSize& contract);

// `img` resampled to its fitted size with a Pillow filter (fit_image in Python: byte-identical).
Image fit_image(const Image& img, const VariableSize& contract, const std::string& interpolation, const std::string& policy);

// One batch for the two-input graph.
struct CanvasBatch {
    int batch = 0, canvas_h = 0, canvas_w = 0;
    std::vector<std::uint8_t> images;    // [batch, canvas_h, canvas_w, 3], each image top-left, `fill` elsewhere
    std::vector<std::int32_t> valid_hw;  // [batch, 2]: each image's height and width
};

// Images (already fitted) top-left into one canvas batch plus their valid_hw (pad_to_canvas in
// Python). Throws for an image larger than the canvas; the sizes are not otherwise checked here:
// call check_valid_hw on the result before the graph runs.
CanvasBatch pad_to_canvas(const std::vector<Image>& images, int canvas_h, int canvas_w, std::uint8_t fill = 0);

// Decode (EXIF upright), fit by `policy` (empty: the manifest's host_policy) and put the channels in
// the graph's order: one image ready for pad_to_canvas. Throws for a single-input bundle.
Image load_for_canvas(const std::string& path, const Bundle& bundle, const std::string& policy = "");

}  // namespace vitdeploy
