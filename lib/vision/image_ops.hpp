#pragma once
// The uint8 image ops of recipes that need the whole crop (ColorJitter's adjustments, Gaussian
// blur), in place on packed RGB, each as torchvision's tensor functional API computes it.
// Private to lib/vision: recipe.cpp runs them on its per-thread crop, the public functional
// forms (recipe.hpp) on a copy.

#include <array>
#include <cmath>
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

// ---- One value drawn as ATen draws it, without a tensor -------------------------------------
// A sample's draws (`torch.rand(1) < p`, randint, uniform_) each cost an ATen call through the
// dispatcher with a tensor allocated and read back: about 3% of the resnet50 recipe's CPU. These
// compute the same values from the same generator's words, as ATen's CPU kernels do
// (ATen/core/TransformationHelper.h, the same in torch 1.13 and 2.x): randint takes 32 bits
// modulo a range below 2^28, 64 from 2^32 on (between, 1.13 takes 32 and 2.x 64: ATen's call
// there); a float32 uniform_ takes the low 24 bits
// of 32 as x in [0, 1) and returns x · (to − from) + from. That last expression is compiled
// per CPU capability, and the AVX2/AVX-512 kernels contract it to one FMA while the default one
// rounds twice (both torch versions, measured): so the first draw of a process asks ATen's own
// kernel which it computes (draw_form), on draws where the two differ, and where neither
// matches every draw (a build we have not seen) every draw stays ATen's call.

/// Which expression this process's ATen computes for a float32 uniform_ (and whether its
/// integer and unit draws are the ones above): checked once, on fixed seeds.
enum class DrawForm { plain, fused, aten };
DrawForm draw_form();

/// `torch.rand(1, generator=gen).item()`.
float draw_unit(at::Generator& gen);
/// `torch.randint(low, high, (1,), generator=gen).item()` (ATen's error if low >= high).
std::int64_t draw_int(std::int64_t low, std::int64_t high, at::Generator& gen);
/// `torch.empty(1).uniform_(lo, hi, generator=gen).item()` (ATen's error for a bad range).
float draw_uniform(double lo, double hi, at::Generator& gen);
/// `torch.log(torch.tensor(ratio))` (float32), remembered per thread for the last `ratio`:
/// RandomResizedCrop and RandomErasing compute it for every sample.
std::array<double, 2> log_ratio(const std::array<double, 2>& ratio);
/// `torch.exp` of a one-element float32 tensor: ATen's call (its kernel is the build's own:
/// SLEEF, MKL or the C library).
float aten_exp(float v);

/// std::nearbyint in the default rounding mode (halves to even), inline: below 2^22 in
/// magnitude, adding 1.5 · 2^23 leaves the nearest integer as the float's last unit, and
/// subtracting it again is exact (-0.0 may come out as 0.0). Larger values and NaN go to the
/// library.
inline float round_even(float v) noexcept {
  constexpr float magic = 12582912.0f;  // 1.5 · 2^23
  if (!(std::fabs(v) < 4194304.0f)) return std::nearbyint(v);
  const float shifted = v + magic;
  return shifted - magic;
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
