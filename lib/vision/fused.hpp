#pragma once
// The fused paths' shared core, private to lib/vision: the decode-and-resample of the leading
// geometric ops (RandomResizedCrop; Resize then CenterCrop) handing out one output row at a
// time, and the write of a row into normalised CHW floats. TrainTransform, EvalTransform and
// Recipe all run through these, so a recipe's geometry costs what the two transforms cost.

#include "coload/core/metrics.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/transforms.hpp"

#include "jpeg_region.hpp"
#include "resample.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace coload::vision::detail {

// NormalizeTable (ToDtype, or ToTensor, then Normalize as one table) is resample.hpp's.

// Writes one RGB row into row `y` of the CHW planes of `dst` (`width` × `height` each),
// mirrored if asked.
inline void write_normalized_row(const NormalizeTable& table, const std::uint8_t* __restrict row,
                                 int width, int height, int y, bool flip, float* dst) {
  const std::size_t plane = static_cast<std::size_t>(width) * height;
  float* __restrict r = dst + static_cast<std::size_t>(y) * width;
  float* __restrict g = r + plane;
  float* __restrict b = g + plane;
  if (flip) {
    for (int x = 0; x < width; ++x) {
      const std::uint8_t* p = row + 3 * (width - 1 - x);
      r[x] = table.value[0][p[0]];
      g[x] = table.value[1][p[1]];
      b[x] = table.value[2][p[2]];
    }
  } else {
    for (int x = 0; x < width; ++x) {
      const std::uint8_t* p = row + 3 * x;
      r[x] = table.value[0][p[0]];
      g[x] = table.value[1][p[1]];
      b[x] = table.value[2][p[2]];
    }
  }
}

inline bool looks_like_jpeg(std::span<const std::byte> data) noexcept {
  return !data.empty() && data[0] == std::byte{0xff};
}

// A decoded image and the axes that crop a box (full-size coordinates) out of it and resize it.
struct CropSource {
  ImageView image;
  AxisSpec ax;
  AxisSpec ay;
};

// Decodes what `box` needs of `encoded` (its region at full scale, or the whole image at
// 1/`denominator`) into `pixels`, with the axes that resize the box to out_height × out_width.
CropSource decode_crop_source(std::span<const std::byte> encoded, const CropBox& box,
                              int out_height, int out_width, int denominator,
                              std::vector<std::uint8_t>& pixels);

// Nothing to do after the rows.
struct NoFinish {
  void operator()() const noexcept {}
};

// RandomResizedCrop's geometry: decodes `encoded` for `box` at 1/`denominator` and hands each of
// the out_height rows (out_width RGB pixels) to `sink(y, row)`, in order, then calls `finish()`
// (the rest of the sample's transform, inside the same transform span).
template <typename Sink, typename Finish = NoFinish>
void crop_rows(std::span<const std::byte> encoded, const CropBox& box, int out_height,
               int out_width, int denominator, Sink&& sink, Finish&& finish = {}) {
  thread_local std::vector<std::uint8_t> pixels;
  StageTimer decode(Stage::decode);
  const CropSource source =
      decode_crop_source(encoded, box, out_height, out_width, denominator, pixels);
  decode.stop();
  StageTimer transform(Stage::transform);
  resample<3>(source.image, source.ax, source.ay, sink);
  finish();
}

// Resize to rh × rw (of an `info`-sized image), then the crop `box` of the resized image (which
// must lie inside it): only the crop's outputs are computed, and of a JPEG at full scale only the
// rows and columns they read are decoded. Hands each of the box's rows to `sink(y, row)`, then
// calls `finish()`.
template <typename Sink, typename Finish = NoFinish>
void resize_crop_rows(std::span<const std::byte> encoded, const ImageInfo& info, int rh, int rw,
                      const CropBox& box, bool dct_scaling, Sink&& sink, Finish&& finish = {}) {
  const int d = dct_scaling && info.format == ImageFormat::jpeg
                    ? choose_jpeg_scale(info.width, info.height, rw, rh)
                    : 1;
  thread_local std::vector<std::uint8_t> pixels;
  // One decode span per image, whether the region decoder or the whole-image one made it.
  StageTimer decode(Stage::decode);
  if (info.format == ImageFormat::jpeg) {
    // Only the source rows and columns that the crop's outputs read (their filter support) are
    // decoded, at 1/d; anything the region decoder does not handle falls through to the whole
    // image. The axes are the whole-image ones below, moved to the region's origin by an
    // integer: info / d is a dyadic fraction, so compute_coeffs derives the same doubles
    // (in0 - lo, in1 - in0) and the same weights, and every tap lies inside the region.
    const int sw = jpeg_scaled_size(info.width, d);
    const int sh = jpeg_scaled_size(info.height, d);
    const AxisSpec full_x{0.0, static_cast<double>(info.width) / d, 0, sw, rw, box.left,
                          box.width};
    const AxisSpec full_y{0.0, static_cast<double>(info.height) / d, 0, sh, rh, box.top,
                          box.height};
    const auto [x0, x1] = source_span(full_x);
    const auto [y0, y1] = source_span(full_y);
    auto region = decode_jpeg_region(encoded, y0, x0, y1 - y0, x1 - x0, pixels, d);
    if (region) {
      decode.stop();
      StageTimer transform(Stage::transform);
      const ImageView image{region->pixels, region->width, region->height, 3, region->stride};
      resample<3>(image, shifted(full_x, region->x0), shifted(full_y, region->y0), sink);
      finish();
      return;
    }
  }
  const ImageView image = decode_into(encoded, pixels, d);
  decode.stop();
  StageTimer transform(Stage::transform);
  // Resize the whole (possibly scaled) image to rh × rw, computing only the crop's outputs.
  const AxisSpec ax{0.0, static_cast<double>(info.width) / d, 0, image.width, rw, box.left,
                    box.width};
  const AxisSpec ay{0.0, static_cast<double>(info.height) / d, 0, image.height, rh, box.top,
                    box.height};
  resample<3>(image, ax, ay, sink);
  finish();
}

}  // namespace coload::vision::detail
