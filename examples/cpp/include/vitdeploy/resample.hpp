// Resampling uint8 RGB images exactly as Pillow's Image.resize does (the Python side of vitdeploy
// resizes with Pillow), so the C++ host feeds the graph the same bytes for the same decoded pixels.
//
// nearest: Pillow's affine NEAREST (ImagingTransform); box, bilinear, hamming, bicubic (a = -0.5),
// lanczos: Pillow's separable convolution (libImaging/Resample.c) with its coefficient rounding to
// 22-bit fixed point and a uint8 image between the two passes. Pass order follows Pillow 13: the
// vertical pass first when the height shrinks by more than twice as many pixels as the width, else
// horizontal first (Pillow <= 12 always goes horizontal first, so against an older Pillow such
// images differ in the last bit of some pixels). Byte-exact against Pillow 13 on x86-64
// (tests/test_cpp_example.py); the library is compiled without FMA contraction so that the
// coefficients round the same way on other CPUs too.
#pragma once

#include <string>

#include "vitdeploy/image.hpp"

namespace vitdeploy {

// `img` resampled to nh x nw with a Pillow filter name ("nearest", "box", "bilinear", "hamming",
// "bicubic", "lanczos"); the image itself when the size is unchanged. Throws for other names.
Image resample(const Image& img, int nh, int nw, const std::string& interpolation);

}  // namespace vitdeploy
