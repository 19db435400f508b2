#pragma once
// Transforms with torchvision 0.14's semantics on PIL images (Resize, CenterCrop,
// RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize, Compose), and the fused
// decode → crop → resize → flip → normalise paths for the standard ImageNet train and eval
// transforms, which write straight into a caller's float buffer.
//
// Resizing is Pillow's antialiased bilinear resampling (a triangle filter whose support grows
// with the reduction factor, 8-bit fixed point, horizontal pass first), so outputs equal
// torchvision's on PIL images pixel for pixel. Random draws reproduce torchvision's calls on a
// torch generator, so for the same generator state the crop box and the flip are torchvision's.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/dataset/sample_context.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/image.hpp"

namespace coload::vision {

/// ImageNet's channel means, as torchvision's reference scripts normalise with them.
inline constexpr std::array<float, 3> imagenet_mean = {0.485f, 0.456f, 0.406f};
/// ImageNet's channel standard deviations.
inline constexpr std::array<float, 3> imagenet_std = {0.229f, 0.224f, 0.225f};

// ---- Functional forms -----------------------------------------------------------------------

/// `F.resized_crop(img, top, left, height, width, [out_height, out_width])` on a PIL image:
/// crops `box` (which must lie inside `src`) and resizes it with antialiased bilinear filtering.
Image resized_crop(const ImageView& src, const CropBox& box, int out_height, int out_width);

/// Decodes `encoded`, JPEGs at scale 1/`jpeg_scale_denominator`, and resizes the region `box`
/// (in full-size coordinates) to `out_height × out_width`: the fused paths' pixels before
/// normalisation. At denominator 1 this equals `resized_crop` of the full decode.
Image decode_resized_crop(std::span<const std::byte> encoded, const CropBox& box, int out_height,
                          int out_width, int jpeg_scale_denominator = 1);

/// PIL's `img.resize((out_width, out_height), BILINEAR)`.
Image resize(const ImageView& src, int out_height, int out_width);

/// PIL's `img.crop(...)` with torchvision's box order; parts outside `src` are zero.
Image crop(const ImageView& src, const CropBox& box);

/// The image mirrored left to right.
Image hflip(const ImageView& src);

/// torchvision's output size `{height, width}` of `Resize(size)` (one int: the shorter side
/// becomes `size`, the longer keeps the aspect ratio, truncated).
std::pair<int, int> resize_output_size(int height, int width, int size) noexcept;

/// torchvision's `center_crop` box of `crop_height × crop_width` in a `height × width` image
/// (may reach outside the image when the crop is larger, to be zero-padded).
CropBox center_crop_box(int height, int width, int crop_height, int crop_width) noexcept;

/// Writes `((v / 255) - mean[c]) / std[c]` for every pixel of an RGB image into `dst` as CHW
/// float planes (ToTensor then Normalize, bit for bit as torchvision computes them in float).
void to_normalized_chw(const ImageView& src, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std_dev, float* dst);

// ---- Transform objects ----------------------------------------------------------------------

/// `transforms.Resize(size)` (shorter side) or `Resize((height, width))`, bilinear, antialiased.
struct Resize {
  /// The shorter side's new length (when `width` is 0), or the output height.
  int size = 0;
  /// The output width, or 0 to keep the aspect ratio.
  int width = 0;

  /// The output `{height, width}` for an input of `height × width`.
  std::pair<int, int> output_size(int height, int width) const noexcept;
  /// The resized image.
  Image operator()(const Image& image) const;
};

/// `transforms.CenterCrop((height, width))`, zero-padding an image smaller than the crop.
struct CenterCrop {
  /// Crop height.
  int height = 0;
  /// Crop width, or 0 for a square crop of `height`.
  int width = 0;

  /// The cropped image.
  Image operator()(const Image& image) const;
};

/// `transforms.RandomResizedCrop(size, scale, ratio)`, bilinear, antialiased.
struct RandomResizedCrop {
  /// Output height.
  int height = 224;
  /// Output width, or 0 for a square output.
  int width = 0;
  /// Range of the crop's area as a fraction of the image's.
  std::array<double, 2> scale = {0.08, 1.0};
  /// Range of the crop's aspect ratio (width / height), sampled log-uniformly.
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};

  /// `RandomResizedCrop.get_params`: up to 10 draws of area and aspect ratio, then the
  /// centre-crop fallback. Draws from `gen` exactly as torchvision draws from its generator,
  /// so with the same generator state the box equals torchvision's.
  CropBox get_params(int image_height, int image_width, at::Generator& gen) const;
  /// The cropped and resized image.
  Image operator()(const Image& image, at::Generator& gen) const;
};

/// `transforms.RandomHorizontalFlip(p)`.
struct RandomHorizontalFlip {
  /// Probability of flipping.
  double p = 0.5;

  /// Draws `torch.rand(1) < p` from `gen`, as torchvision does.
  bool draw(at::Generator& gen) const;
  /// The image, flipped with probability `p`.
  Image operator()(Image image, at::Generator& gen) const;
};

/// `transforms.ToTensor()` for an 8-bit image: a CHW float tensor of values in [0, 1].
struct ToTensor {
  /// The image as a [channels, height, width] float tensor, divided by 255.
  at::Tensor operator()(const Image& image) const;
};

/// `transforms.PILToTensor()`: a CHW uint8 tensor, values unchanged.
struct PILToTensor {
  /// The image as a [channels, height, width] uint8 tensor.
  at::Tensor operator()(const Image& image) const;
};

/// `transforms.ConvertImageDtype(dtype)`: uint8 to floating point divides by 255; floating to
/// floating only casts.
struct ConvertImageDtype {
  /// The target dtype.
  at::ScalarType dtype = at::kFloat;
  /// The converted tensor.
  at::Tensor operator()(const at::Tensor& image) const;
};

/// `transforms.Normalize(mean, std)` on a CHW floating-point tensor.
struct Normalize {
  /// Per-channel means.
  std::vector<double> mean;
  /// Per-channel standard deviations; none may be zero.
  std::vector<double> std_dev;

  /// `(image - mean) / std`, broadcast over channels, as a new tensor.
  at::Tensor operator()(const at::Tensor& image) const;
};

/// Chains transforms, like `transforms.Compose`. Random stages (those callable with an
/// at::Generator&) share one generator per call, in order, as torchvision's share the global
/// generator: `Compose{RandomResizedCrop{224}, RandomHorizontalFlip{}, ToTensor{},
/// Normalize{...}}(image, rng)` draws the same values as torchvision's pipeline after
/// `torch.manual_seed`.
template <typename... Ts>
class Compose {
 public:
  /// Holds copies of `stages`, applied left to right.
  explicit Compose(Ts... stages) : stages_(std::move(stages)...) {}

  /// Applies every stage, the random ones drawing from `gen`.
  template <typename In>
  auto operator()(In&& input, at::Generator& gen) const {
    return apply<0>(std::forward<In>(input), &gen);
  }
  /// Applies every stage, the random ones drawing from one generator made from `rng`.
  template <typename In>
  auto operator()(In&& input, Rng& rng) const {
    at::Generator gen = rng.torch_generator();
    return apply<0>(std::forward<In>(input), &gen);
  }
  /// Applies every stage; only for chains without random stages.
  template <typename In>
  auto operator()(In&& input) const {
    return apply<0>(std::forward<In>(input), static_cast<at::Generator*>(nullptr));
  }

 private:
  template <std::size_t I, typename In>
  auto apply(In&& input, at::Generator* gen) const {
    if constexpr (I == sizeof...(Ts)) {
      return std::decay_t<In>(std::forward<In>(input));
    } else {
      const auto& stage = std::get<I>(stages_);
      using Stage = std::decay_t<decltype(stage)>;
      if constexpr (std::is_invocable_v<const Stage&, In&&, at::Generator&>) {
        TORCH_CHECK(gen != nullptr, "Compose: a random transform needs a generator or an Rng");
        return apply<I + 1>(stage(std::forward<In>(input), *gen), gen);
      } else {
        return apply<I + 1>(stage(std::forward<In>(input)), gen);
      }
    }
  }

  std::tuple<Ts...> stages_;
};

// ---- Fused paths ----------------------------------------------------------------------------

/// What a fused train transform drew for one sample.
struct TrainParams {
  /// The crop in full-size pixel coordinates.
  CropBox box;
  /// Whether the output is mirrored.
  bool flip = false;
  /// The JPEG DCT scale denominator the image is decoded at (1 for PNG or without scaling).
  int scale_denominator = 1;
};

/// The standard ImageNet train transform, fused: `RandomResizedCrop(size)`,
/// `RandomHorizontalFlip(flip_p)`, `ToTensor()`, `Normalize(mean, std_dev)` applied to encoded
/// bytes, written into `dst` as [3, size, size] floats with no intermediate tensors.
///
/// The crop box and flip come from the generator exactly as torchvision's would; JPEGs are
/// decoded at the smallest DCT scale that still covers the crop at the output size
/// (`choose_jpeg_scale`) unless `dct_scaling` is false, in which case the output equals
/// torchvision's on a PIL image bit for bit. Thread-safe: scratch buffers are per thread.
struct TrainTransform {
  /// Output side.
  int size = 224;
  /// RandomResizedCrop's area range.
  std::array<double, 2> scale = {0.08, 1.0};
  /// RandomResizedCrop's aspect-ratio range.
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  /// Probability of a horizontal flip.
  double flip_p = 0.5;
  /// Normalize's means.
  std::array<float, 3> mean = imagenet_mean;
  /// Normalize's standard deviations.
  std::array<float, 3> std_dev = imagenet_std;
  /// Decode JPEGs at a reduced DCT scale where it covers the crop.
  bool dct_scaling = true;

  /// Draws the crop and flip for an image of `info`'s size, and picks the decode scale.
  TrainParams sample(const ImageInfo& info, at::Generator& gen) const;
  /// Decodes `encoded` and writes the transformed sample for `params` into `dst`
  /// (3 × size × size floats).
  void apply(std::span<const std::byte> encoded, const TrainParams& params, float* dst) const;
  /// Samples with `gen`, then applies; writes 3 × size × size floats into `dst`.
  void operator()(std::span<const std::byte> encoded, at::Generator& gen, float* dst) const;
  /// Samples with a generator made from `rng`, then applies.
  void operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const;
  /// The sample as a new [3, size, size] float tensor.
  at::Tensor operator()(std::span<const std::byte> encoded, Rng& rng) const;
};

/// The standard ImageNet eval transform, fused: `Resize(resize_size)`, `CenterCrop(crop_size)`,
/// `ToTensor()`, `Normalize(mean, std_dev)`, written into `dst` as [3, crop_size, crop_size]
/// floats. Only the output pixels inside the centre crop are computed. Requires
/// `crop_size <= resize_size` (std::invalid_argument otherwise).
struct EvalTransform {
  /// The shorter side after resizing.
  int resize_size = 256;
  /// The centre crop's side.
  int crop_size = 224;
  /// Normalize's means.
  std::array<float, 3> mean = imagenet_mean;
  /// Normalize's standard deviations.
  std::array<float, 3> std_dev = imagenet_std;
  /// Decode JPEGs at a reduced DCT scale where it covers the resized image.
  bool dct_scaling = true;

  /// Writes 3 × crop_size × crop_size floats into `dst`.
  void operator()(std::span<const std::byte> encoded, float* dst) const;
  /// The sample as a new [3, crop_size, crop_size] float tensor.
  at::Tensor operator()(std::span<const std::byte> encoded) const;
};

namespace detail {
/// The instruction sets the resampling kernels may use (avx512: the normalise's AVX-512 VBMI
/// form too).
enum class SimdLevel { scalar, ssse3, avx2, avx512 };
/// Caps the kernels at `level` (they never go above what the CPU has) and returns the previous
/// cap; for tests, which check that every level gives the same bytes. Not for use while other
/// threads resample.
SimdLevel set_simd_level(SimdLevel level) noexcept;
}  // namespace detail

}  // namespace coload::vision
