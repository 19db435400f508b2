// vision/transforms: torchvision's transforms on images (over Pillow's resampling, in
// resample.cpp), and the fused train/eval paths from encoded bytes to normalised CHW floats.

#include "coload/vision/transforms.hpp"
#include "coload/core/error.hpp"
#include "coload/core/metrics.hpp"

#include "fused.hpp"
#include "image_ops.hpp"
#include "jpeg_region.hpp"
#include "resample.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace coload::vision {
namespace {

using detail::CropSource;
using detail::NormalizeTable;
using detail::crop_axis;
using detail::resample_to_image;
using detail::scaled_crop_axis;

void check_box(const ImageView& src, const CropBox& box) {
  if (box.height <= 0 || box.width <= 0 || box.top < 0 || box.left < 0 ||
      box.height > src.height - box.top || box.width > src.width - box.left) {  // no overflow
    throw InvalidArgument(
        "crop box (top " + std::to_string(box.top) + ", left " + std::to_string(box.left) +
        ", height " + std::to_string(box.height) + ", width " + std::to_string(box.width) +
        ") does not lie inside the " + std::to_string(src.width) + "x" +
        std::to_string(src.height) + " image");
  }
}

void check_output(int out_height, int out_width) {
  if (out_height <= 0 || out_width <= 0) {
    throw InvalidArgument("output size must be positive, got " + std::to_string(out_height) +
                                "x" + std::to_string(out_width));
  }
}

}  // namespace

namespace detail {
namespace {

// The thread's NormalizeTable for the last (mean, std) it was asked for: 768 float divisions
// an image otherwise (about 0.4% of a --fast-crop image's CPU), the same floats either way.
const NormalizeTable& normalize_table(const std::array<float, 3>& mean,
                                      const std::array<float, 3>& std_dev) {
  struct Cached {
    std::array<float, 3> mean{}, std_dev{};
    bool built = false;
    NormalizeTable table;
  };
  thread_local Cached cached;
  // Compared bitwise: a NaN or a -0.0 mean is its own key as well.
  if (!cached.built || std::memcmp(cached.mean.data(), mean.data(), sizeof mean) != 0 ||
      std::memcmp(cached.std_dev.data(), std_dev.data(), sizeof std_dev) != 0) {
    cached.table = NormalizeTable(mean, std_dev);
    cached.mean = mean;
    cached.std_dev = std_dev;
    cached.built = true;
  }
  return cached.table;
}

}  // namespace

CropSource decode_crop_source(std::span<const std::byte> encoded, const CropBox& box,
                              int out_height, int out_width, int denominator,
                              std::vector<std::uint8_t>& pixels) {
  check_output(out_height, out_width);
  const int d = looks_like_jpeg(encoded) ? denominator : 1;
  CropSource s;
  if (d == 1 && looks_like_jpeg(encoded)) {
    // Only the crop's rows and columns (plus a margin) are decoded; anything the region
    // decoder does not handle falls through to the whole-image decode below.
    if (auto region = detail::decode_jpeg_region(encoded, box.top, box.left, box.height,
                                                 box.width, pixels)) {
      s.image = ImageView{region->pixels, region->width, region->height, 3, region->stride};
      const CropBox local{box.top - region->y0, box.left - region->x0, box.height, box.width};
      check_box(s.image, local);
      s.ax = crop_axis(local.left, local.width, out_width);
      s.ay = crop_axis(local.top, local.height, out_height);
      return s;
    }
  } else if (d > 1 && box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0) {
    // At a DCT scale the box's taps are the scaled pixels [lo, hi) of scaled_crop_axis (hi never
    // exceeds the scaled size, ceil(size / d), since the box lies inside the image): only those
    // are decoded, from the restart intervals that cover them where the file has any. The
    // axes are scaled_crop_axis's moved to the region's origin by an integer: box / d is a
    // dyadic fraction, so every double compute_coeffs derives (in0 - lo, in1 - in0) is
    // unchanged, and so are the weights and the outputs.
    const AxisSpec sx = scaled_crop_axis(box.left, box.width, out_width, d, std::numeric_limits<int>::max());
    const AxisSpec sy = scaled_crop_axis(box.top, box.height, out_height, d, std::numeric_limits<int>::max());
    if (auto region = detail::decode_jpeg_region(encoded, sy.lo, sx.lo, sy.hi - sy.lo,
                                                 sx.hi - sx.lo, pixels, d)) {
      s.image = ImageView{region->pixels, region->width, region->height, 3, region->stride};
      s.ax = shifted(sx, region->x0);
      s.ay = shifted(sy, region->y0);
      return s;
    }
  }
  s.image = decode_into(encoded, pixels, d);
  if (d == 1) {
    check_box(s.image, box);
    s.ax = crop_axis(box.left, box.width, out_width);
    s.ay = crop_axis(box.top, box.height, out_height);
  } else {
    // The full size is only known up to rounding here; the box must fit the scaled image.
    check_box(ImageView{nullptr, s.image.width * d, s.image.height * d, 3, 0}, box);
    s.ax = scaled_crop_axis(box.left, box.width, out_width, d, s.image.width);
    s.ay = scaled_crop_axis(box.top, box.height, out_height, d, s.image.height);
  }
  return s;
}

}  // namespace detail

// ---- Functional forms -----------------------------------------------------------------------

Image resized_crop(const ImageView& src, const CropBox& box, int out_height, int out_width) {
  check_box(src, box);
  check_output(out_height, out_width);
  return resample_to_image(src, crop_axis(box.left, box.width, out_width),
                           crop_axis(box.top, box.height, out_height));
}

Image resize(const ImageView& src, int out_height, int out_width) {
  return resized_crop(src, CropBox{0, 0, src.height, src.width}, out_height, out_width);
}

Image crop(const ImageView& src, const CropBox& box) {
  if (box.height <= 0 || box.width <= 0) {
    throw InvalidArgument("crop size must be positive, got " + std::to_string(box.height) +
                                "x" + std::to_string(box.width));
  }
  Image out = Image::zeros(box.width, box.height, src.channels);
  // NOTE: the box's ends in 64 bits: a box far outside the image must not overflow into it.
  const int x0 = std::max(box.left, 0);
  const auto x1 = static_cast<int>(
      std::min<std::int64_t>(std::int64_t{box.left} + box.width, src.width));
  if (x0 >= x1) return out;
  const auto y1 = static_cast<int>(
      std::min<std::int64_t>(std::int64_t{box.top} + box.height, src.height));
  for (int y = std::max(box.top, 0); y < y1; ++y) {
    std::memcpy(out.pixel(x0 - box.left, y - box.top), src.row(y) + static_cast<std::ptrdiff_t>(x0) * src.channels,
                static_cast<std::size_t>(x1 - x0) * src.channels);
  }
  return out;
}

Image hflip(const ImageView& src) {
  Image out = Image::zeros(src.width, src.height, src.channels);
  const int c = src.channels;
  for (int y = 0; y < src.height; ++y) {
    const std::uint8_t* in = src.row(y);
    for (int x = 0; x < src.width; ++x) {
      std::memcpy(out.pixel(src.width - 1 - x, y), in + static_cast<std::ptrdiff_t>(x) * c,
                  static_cast<std::size_t>(c));
    }
  }
  return out;
}

std::pair<int, int> resize_output_size(int height, int width, int size) noexcept {
  const bool width_shorter = width <= height;
  const int short_side = width_shorter ? width : height;
  const int long_side = width_shorter ? height : width;
  // NOTE: torchvision computes int(size * long / short) in Python floats: true division, then
  // truncation; the double product below is the same value.
  const int new_long = static_cast<int>(static_cast<double>(size) * long_side / short_side);
  return width_shorter ? std::pair{new_long, size} : std::pair{size, new_long};
}

CropBox center_crop_box(int height, int width, int crop_height, int crop_width) noexcept {
  // torchvision pads first (left/top get the floor of half the excess), then crops at
  // int(round((padded - crop) / 2.0)); Python rounds halves to even, as nearbyint does.
  const int pad_left = crop_width > width ? (crop_width - width) / 2 : 0;
  const int pad_top = crop_height > height ? (crop_height - height) / 2 : 0;
  const int padded_w = crop_width > width ? crop_width : width;
  const int padded_h = crop_height > height ? crop_height : height;
  const int left = static_cast<int>(std::nearbyint((padded_w - crop_width) / 2.0)) - pad_left;
  const int top = static_cast<int>(std::nearbyint((padded_h - crop_height) / 2.0)) - pad_top;
  return CropBox{top, left, crop_height, crop_width};
}

void to_normalized_chw(const ImageView& src, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std_dev, float* dst) {
  if (src.channels != 3) throw InvalidArgument("to_normalized_chw needs an RGB image");
  const NormalizeTable& table = detail::normalize_table(mean, std_dev);
  for (int y = 0; y < src.height; ++y) {
    detail::normalize_row(table, src.row(y), src.width, src.height, y, false, dst);
  }
}

Image decode_resized_crop(std::span<const std::byte> encoded, const CropBox& box, int out_height,
                          int out_width, int jpeg_scale_denominator) {
  thread_local std::vector<std::uint8_t> pixels;
  const CropSource source =
      detail::decode_crop_source(encoded, box, out_height, out_width, jpeg_scale_denominator, pixels);
  return resample_to_image(source.image, source.ax, source.ay);
}

// ---- Transform objects ----------------------------------------------------------------------

std::pair<int, int> Resize::output_size(int height, int width) const noexcept {
  if (this->width > 0) return {size, this->width};
  return resize_output_size(height, width, size);
}

Image Resize::operator()(const Image& image) const {
  const auto [h, w] = output_size(image.height, image.width);
  return resize(image.view(), h, w);
}

Image CenterCrop::operator()(const Image& image) const {
  const int w = width > 0 ? width : height;
  return crop(image.view(), center_crop_box(image.height, image.width, height, w));
}

CropBox RandomResizedCrop::get_params(int image_height, int image_width, at::Generator& gen) const {
  // NOTE: torchvision's draws on the same generator (float32 uniform_, exp, int64 randint).
  // uniform_ and randint are computed without a tensor as ATen's kernels compute them (its FMA
  // or not checked once per process: image_ops.hpp's draw_form); log and exp stay ATen's calls,
  // whose kernels differ between builds (the log once per thread for the same ratio).
  const double area = static_cast<double>(image_height) * image_width;
  const auto [log_lo, log_hi] = detail::log_ratio(ratio);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * detail::draw_uniform(scale[0], scale[1], gen);
    const double aspect_ratio = detail::aten_exp(detail::draw_uniform(log_lo, log_hi, gen));
    // Python's round() rounds halves to even, as nearbyint does in the default mode.
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect_ratio)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect_ratio)));
    if (0 < w && w <= image_width && 0 < h && h <= image_height) {
      const auto i = detail::draw_int(0, image_height - h + 1, gen);
      const auto j = detail::draw_int(0, image_width - w + 1, gen);
      return CropBox{static_cast<int>(i), static_cast<int>(j), h, w};
    }
  }
  const double in_ratio = static_cast<double>(image_width) / static_cast<double>(image_height);
  const double min_ratio = std::min(ratio[0], ratio[1]);
  const double max_ratio = std::max(ratio[0], ratio[1]);
  int w = image_width;
  int h = image_height;
  if (in_ratio < min_ratio) {
    h = static_cast<int>(std::nearbyint(w / min_ratio));
  } else if (in_ratio > max_ratio) {
    w = static_cast<int>(std::nearbyint(h * max_ratio));
  }
  return CropBox{(image_height - h) / 2, (image_width - w) / 2, h, w};
}

Image RandomResizedCrop::operator()(const Image& image, at::Generator& gen) const {
  const CropBox box = get_params(image.height, image.width, gen);
  return resized_crop(image.view(), box, height, width > 0 ? width : height);
}

bool RandomHorizontalFlip::draw(at::Generator& gen) const {
  return detail::draw_unit(gen) < static_cast<float>(p);
}

Image RandomHorizontalFlip::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return hflip(image.view());
  return image;
}

at::Tensor PILToTensor::operator()(const Image& image) const {
  at::Tensor hwc = at::empty({image.height, image.width, image.channels}, at::kByte);
  std::memcpy(hwc.data_ptr<std::uint8_t>(), image.data.data(), image.data.size());
  return hwc.permute({2, 0, 1}).contiguous();
}

at::Tensor ToTensor::operator()(const Image& image) const {
  return PILToTensor{}(image).to(at::kFloat).div(255);
}

at::Tensor ConvertImageDtype::operator()(const at::Tensor& image) const {
  if (image.scalar_type() == dtype) return image;
  if (image.scalar_type() == at::kByte && at::isFloatingType(dtype)) {
    return image.to(dtype).div(255);
  }
  if (image.is_floating_point() && at::isFloatingType(dtype)) return image.to(dtype);
  throw InvalidArgument("ConvertImageDtype supports uint8 or floating point to floating "
                              "point only");
}

at::Tensor Normalize::operator()(const at::Tensor& image) const {
  if (!image.is_floating_point()) {
    throw InvalidArgument("Normalize: input tensor should be a float tensor");
  }
  if (image.dim() < 3) {
    throw InvalidArgument("Normalize: expected a tensor image of size (..., C, H, W)");
  }
  const auto options = image.options();
  at::Tensor m = at::tensor(mean, options.dtype(at::kDouble)).to(image.scalar_type());
  at::Tensor s = at::tensor(std_dev, options.dtype(at::kDouble)).to(image.scalar_type());
  if ((s == 0).any().item<bool>()) {
    throw InvalidArgument("std evaluated to zero after conversion to " +
                                std::string(c10::toString(image.scalar_type())) +
                                ", leading to division by zero.");
  }
  return image.sub(m.view({-1, 1, 1})).div(s.view({-1, 1, 1}));
}

// ---- Fused paths ----------------------------------------------------------------------------

TrainParams TrainTransform::sample(const ImageInfo& info, at::Generator& gen) const {
  TrainParams params;
  params.box = RandomResizedCrop{size, size, scale, ratio}.get_params(info.height, info.width, gen);
  params.flip = RandomHorizontalFlip{flip_p}.draw(gen);
  params.scale_denominator =
      dct_scaling && info.format == ImageFormat::jpeg
          ? choose_jpeg_scale(params.box.width, params.box.height, size, size)
          : 1;
  return params;
}

void TrainTransform::apply(std::span<const std::byte> encoded, const TrainParams& params,
                           float* dst) const {
  const NormalizeTable& table = detail::normalize_table(mean, std_dev);
  // detail::normalize_row: write_normalized_row's floats, 64 pixels at a time where it can.
  detail::crop_rows(encoded, params.box, size, size, params.scale_denominator,
                    [&](int y, const std::uint8_t* row) {
                      detail::normalize_row(table, row, size, size, y, params.flip, dst);
                    });
}

void TrainTransform::operator()(std::span<const std::byte> encoded, at::Generator& gen,
                                float* dst) const {
  const ImageInfo info = peek(encoded);
  check_image_pixels(info.width, info.height);  // before the crop is drawn or anything decoded
  apply(encoded, sample(info, gen), dst);
}

void TrainTransform::operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const {
  at::Generator gen = rng.torch_generator();
  (*this)(encoded, gen, dst);
}

at::Tensor TrainTransform::operator()(std::span<const std::byte> encoded, Rng& rng) const {
  at::Tensor out = at::empty({3, size, size}, at::kFloat);
  (*this)(encoded, rng, out.data_ptr<float>());
  return out;
}

void EvalTransform::operator()(std::span<const std::byte> encoded, float* dst) const {
  if (crop_size <= 0 || crop_size > resize_size) {
    throw InvalidArgument("EvalTransform needs 0 < crop_size <= resize_size, got crop " +
                                std::to_string(crop_size) + " and resize " +
                                std::to_string(resize_size));
  }
  const ImageInfo info = peek(encoded);
  check_image_pixels(info.width, info.height);
  const auto [rh, rw] = resize_output_size(info.height, info.width, resize_size);
  const CropBox box = center_crop_box(rh, rw, crop_size, crop_size);
  const NormalizeTable& table = detail::normalize_table(mean, std_dev);
  // detail::normalize_row: write_normalized_row's floats, 64 pixels at a time where it can.
  detail::resize_crop_rows(encoded, info, rh, rw, box, dct_scaling,
                           [&](int y, const std::uint8_t* row) {
                             detail::normalize_row(table, row, crop_size, crop_size, y,
                                                   false, dst);
                           });
}

at::Tensor EvalTransform::operator()(std::span<const std::byte> encoded) const {
  at::Tensor out = at::empty({3, crop_size, crop_size}, at::kFloat);
  (*this)(encoded, out.data_ptr<float>());
  return out;
}

}  // namespace coload::vision
