#pragma once
// The uint8 image ops of recipes that need the whole crop (ColorJitter's adjustments, Gaussian
// blur), in place on packed RGB, each as torchvision's tensor functional API computes it.
// Private to lib/vision: recipe.cpp runs them on its per-thread crop, the public functional
// forms (recipe.hpp) on a copy.

#include <cstdint>
#include <string>

#include "coload/vision/recipe.hpp"

namespace coload::vision::detail {

/// torchvision's tensor rgb_to_grayscale for one pixel: `(0.2989 * r + 0.587 * g + 0.114 * b)`
/// in float32 (a uint8 tensor times a Python float is float32), each product and sum rounded to
/// float in that order, then `.to(uint8)`, which truncates.
inline std::uint8_t gray_of(std::uint8_t r, std::uint8_t g, std::uint8_t b) noexcept {
  const float pr = static_cast<float>(r) * 0.2989f;
  const float pg = static_cast<float>(g) * 0.587f;
  const float pb = static_cast<float>(b) * 0.114f;
  return static_cast<std::uint8_t>((pr + pg) + pb);
}

/// A double as Python's repr writes it (the shortest round trip, ".0" when integral), for
/// messages in torchvision's wording.
std::string py_float(double v);

/// Grays `width` RGB pixels of `in` into `out` (three equal channels), `times` times over, as
/// that many Grayscale ops in a row would (each truncates again).
void gray_row(const std::uint8_t* in, std::uint8_t* out, int width, int times);

/// Packed RGB pixels (stride = 3 × width), changed in place.
struct RgbSpan {
  std::uint8_t* data;
  int width;
  int height;
};

/// `F.adjust_brightness`: trunc(clamp(f · v, 0, 255)).
void adjust_brightness(RgbSpan img, double factor);
/// `F.adjust_contrast`: blends with the mean of the (truncated) grayscale image.
void adjust_contrast(RgbSpan img, double factor);
/// `F.adjust_saturation`: blends with the (truncated) grayscale image.
void adjust_saturation(RgbSpan img, double factor);
/// `F.adjust_hue`: to float, HSV, hue shifted modulo 1, back to RGB, to uint8 (× 255.999).
void adjust_hue(RgbSpan img, float hue_factor);
/// `F.gaussian_blur` with an odd kernel of kx × ky and one sigma per axis: reflect padding,
/// the normalised sampled Gaussian, rounded to nearest (half to even) back to uint8.
void gaussian_blur(RgbSpan img, int kx, int ky, float sigma_x, float sigma_y);
/// ColorJitter's adjustments in `params`' order.
void apply_jitter(RgbSpan img, const ColorJitter::Params& params);
/// In-place flips.
void hflip_inplace(RgbSpan img);
void vflip_inplace(RgbSpan img);
/// `F.rgb_to_grayscale(img, 3)` in place.
void grayscale_inplace(RgbSpan img);

}  // namespace coload::vision::detail
