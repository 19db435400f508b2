#pragma once
// A training recipe as a composition of torchvision's transforms, run by the fused image
// pipeline: `Recipe{RandomResizedCrop{224}, RandomHorizontalFlip{}, ToDtype{at::kFloat, true},
// Normalize{mean, std}}` names the ops in torchvision's names and order, and runs them from
// encoded bytes straight into a batch row.
//
// How a recipe runs: its leading geometric ops (RandomResizedCrop; or Resize, then optionally
// CenterCrop) fold into the decode, as TrainTransform and EvalTransform do (a JPEG's region, or
// the whole image at a reduced DCT scale, and one antialiased resample); a leading RandomCrop
// or CenterCrop pads and crops the full-size image, resampling nothing. The uint8 ops after them
// run on the crop: flips and grayscale on each resampled row as it is written; when a sample
// draws an op that needs the whole crop (ColorJitter, GaussianBlur, an augmentation policy's
// op, RandomRotation, RandomAffine, RandomPerspective, AugMix, a user's Custom op) the crop is
// kept as uint8 and the ops run on it in order.
// ToDtype/ToTensor and Normalize run as one table look-up while a row is written into the CHW
// float output, and RandomErasing runs on that output. A final MixUp,
// CutMix or RandomChoice of them runs on the collated batch (the pipelines apply it, with a
// generator of the batch's own), making the labels soft. A user's own op (`Custom`: on the
// uint8 crop, or on the float output after Normalize; `CustomBatch`: on the collated batch)
// runs in the same places, on the workers, so it keeps the recipe on the fused path. Per-sample random choices are
// drawn from one generator per sample, in the ops' order, with torchvision's calls, before
// anything is decoded; so the `classic` preset draws and writes exactly what TrainTransform does.
//
// A recipe is checked when it is built: an impossible parameter, an op the fused pipeline does
// not run yet, or ops in an order it cannot fuse is refused there (std::invalid_argument), with
// torchvision's wording where torchvision has one.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "coload/dataset/sample_context.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/image.hpp"
#include "coload/vision/transforms.hpp"

namespace coload::vision {

// ---- Ops beyond transforms.hpp's ------------------------------------------------------------

/// The image mirrored top to bottom (`F.vflip`).
Image vflip(const ImageView& src);

/// `F.rgb_to_grayscale` on a uint8 RGB tensor image: `0.2989 r + 0.587 g + 0.114 b` in float,
/// truncated to uint8 (torchvision's tensor path, not PIL's `convert('L')`), repeated into
/// `num_output_channels` (1 or 3) channels. A one-channel image is copied (and repeated).
Image rgb_to_grayscale(const ImageView& src, int num_output_channels = 1);

/// `transforms.RandomVerticalFlip(p)`.
struct RandomVerticalFlip {
  /// Probability of flipping.
  double p = 0.5;

  /// Draws `torch.rand(1) < p` from `gen`, as torchvision does.
  bool draw(at::Generator& gen) const;
  /// The image, flipped with probability `p`.
  Image operator()(Image image, at::Generator& gen) const;
};

/// `transforms.Grayscale(num_output_channels)`.
struct Grayscale {
  /// 1 or 3; a recipe's batch has three channels, so a recipe takes only 3.
  int num_output_channels = 1;

  /// The image in gray.
  Image operator()(const Image& image) const;
};

/// `transforms.RandomGrayscale(p)`: grayscale with three output channels, with probability p.
struct RandomGrayscale {
  /// Probability of converting.
  double p = 0.1;

  /// Draws `torch.rand(1) < p` from `gen`.
  bool draw(at::Generator& gen) const;
  /// The image, in gray with probability `p`.
  Image operator()(Image image, at::Generator& gen) const;
};

/// `transforms.v2.ToDtype(dtype, scale)` on an image: a cast, and with `scale` from uint8's
/// [0, 255] to a float's [0, 1] (divided by 255). A recipe converts to float32 only.
struct ToDtype {
  /// The target dtype.
  at::ScalarType dtype = at::kFloat;
  /// Whether to rescale the values to the new dtype's range.
  bool scale = false;

  /// The converted tensor.
  at::Tensor operator()(const at::Tensor& image) const;
};

/// `F.adjust_brightness` on a uint8 RGB image (torchvision's tensor path): trunc(clamp(f · v)).
Image adjust_brightness(const ImageView& src, double factor);
/// `F.adjust_contrast`: each value blended with the mean of the image's uint8 grayscale.
Image adjust_contrast(const ImageView& src, double factor);
/// `F.adjust_saturation`: each pixel blended with its uint8 grayscale.
Image adjust_saturation(const ImageView& src, double factor);
/// `F.adjust_hue` (factor in [-0.5, 0.5]): through float32 HSV and back, as torchvision does.
Image adjust_hue(const ImageView& src, double hue_factor);
/// `F.gaussian_blur(img, [kx, ky], [sigma_x, sigma_y])` on a uint8 RGB image: odd kernels,
/// reflect padding, rounded back to uint8.
Image gaussian_blur(const ImageView& src, int kx, int ky, double sigma_x, double sigma_y);

/// `transforms.ColorJitter(brightness, contrast, saturation, hue)` with torchvision's
/// single-number form: brightness b draws its factor from [max(0, 1 - b), 1 + b] (contrast and
/// saturation alike), hue h from [-h, h]; 0 leaves that adjustment out (draws nothing).
struct ColorJitter {
  double brightness = 0;
  double contrast = 0;
  double saturation = 0;
  double hue = 0;

  /// What one call draws: the order of the four adjustments (0 brightness, 1 contrast,
  /// 2 saturation, 3 hue; `torch.randperm(4)`) and each one's factor (NaN where left out).
  struct Params {
    std::array<int, 4> order{};
    std::array<float, 4> factor{};
  };
  /// Draws as torchvision's `get_params`: randperm(4), then a uniform per adjustment in use.
  Params get_params(at::Generator& gen) const;
  /// The image with the adjustments of `params` applied in their order.
  static Image apply(const ImageView& src, const Params& params);
  /// Draws, then applies.
  Image operator()(const Image& image, at::Generator& gen) const;
};

/// `transforms.GaussianBlur(kernel_size, sigma)`.
struct GaussianBlur {
  /// Kernel width, odd and positive.
  int kernel_x = 3;
  /// Kernel height, or 0 for `kernel_x`.
  int kernel_y = 0;
  /// The range sigma is drawn from (a single sigma s: {s, s}).
  std::array<double, 2> sigma = {0.1, 2.0};

  /// `torch.empty(1).uniform_(sigma[0], sigma[1])`.
  float get_params(at::Generator& gen) const;
  /// The image blurred with a drawn sigma.
  Image operator()(const Image& image, at::Generator& gen) const;
};

/// `transforms.RandomErasing(p, scale, ratio, value)` on a float CHW image: a box of the drawn
/// area and aspect ratio set to `value` (one number, or one per channel).
struct RandomErasing {
  double p = 0.5;
  std::array<double, 2> scale = {0.02, 0.33};
  std::array<double, 2> ratio = {0.3, 3.3};
  std::vector<double> value = {0.0};

  /// torchvision's `get_params` for an image of height × width: up to 10 draws of area and
  /// ratio, then the box's position; nullopt where no draw fits (torchvision then erases
  /// nothing). Does not draw the `torch.rand(1) < p` that precedes it.
  std::optional<CropBox> get_params(int height, int width, at::Generator& gen) const;
  /// The [C, H, W] float tensor, erased with probability p (a new tensor).
  at::Tensor operator()(const at::Tensor& image, at::Generator& gen) const;
};

/// How `RandomCrop` pads: torchvision's padding modes.
enum class PaddingMode { constant, edge, reflect, symmetric };

/// `transforms.v2.RandomCrop(size, padding, pad_if_needed, fill, padding_mode)`: pads the image
/// (`padding` as left, top, right, bottom), and where `pad_if_needed` each side of a dimension
/// still shorter than the crop by the shortfall, then crops a random `height` × `width` box.
/// As a recipe's first op it reads the whole image at full size (no resample).
struct RandomCrop {
  int height = 0;
  /// Crop width, or 0 for a square crop.
  int width = 0;
  std::array<int, 4> padding = {0, 0, 0, 0};
  bool pad_if_needed = false;
  /// The constant mode's value: one, or one per channel (uint8 values).
  std::vector<double> fill = {0.0};
  PaddingMode padding_mode = PaddingMode::constant;

  /// The padding of an image of height × width (`padding`, plus what pad_if_needed adds), as
  /// {left, top, right, bottom}.
  std::array<int, 4> padding_for(int image_height, int image_width) const noexcept;
  /// v2's `_get_params`: the box in the padded image; `torch.randint` for the top only where
  /// the padded height exceeds the crop's, then for the left likewise. std::invalid_argument
  /// with torchvision's message where the padded image is smaller than the crop.
  CropBox get_params(int image_height, int image_width, at::Generator& gen) const;
};

/// `transforms.v2.MixUp(alpha, num_classes)`, a batch op: lam ~ Beta(alpha, alpha); the batch
/// becomes lam · batch + (1 - lam) · batch rolled by one, the labels likewise as one-hot
/// (soft labels, float [N, num_classes]).
struct MixUp {
  double alpha = 1.0;
  /// Classes of the one-hot labels; 0 in an ImagePipeline: the folder's class count.
  int num_classes = 0;
};

/// `transforms.v2.CutMix(alpha, num_classes)`, a batch op: lam ~ Beta(alpha, alpha) sizes a
/// box at a random centre; the box is pasted from the batch rolled by one, and the labels mix
/// by the box's share of the image.
struct CutMix {
  double alpha = 1.0;
  int num_classes = 0;
};

/// `transforms.v2.RandomChoice([...], p)` of batch ops: one, drawn by `torch.multinomial(p, 1)`.
struct RandomChoice {
  std::vector<std::variant<MixUp, CutMix>> transforms;
  /// Weights, one per transform; empty: equal.
  std::vector<double> p;
};

/// What a batch op drew: which op (0 MixUp, 1 CutMix), lam (CutMix: its adjusted lam, the
/// share of the image left as it was) and CutMix's box [x1, x2) × [y1, y2).
struct BatchMixParams {
  int op = 0;
  double lam = 1.0;
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

/// Applies drawn `params` to a batch: images float [N, C, H, W] (changed in place) and int64
/// labels [N]; returns the soft labels, float [N, num_classes] (std::invalid_argument naming
/// the label when one lies outside [0, num_classes)).
at::Tensor apply_batch_mix(at::Tensor& images, const at::Tensor& labels, int num_classes,
                           const BatchMixParams& params);

// ---- Augmentation policies (torchvision.transforms.autoaugment) ------------------------------

/// How a warp (an affine op, a rotation) samples: the two modes torchvision's tensor path has.
enum class Interpolation { nearest, bilinear };

/// The ops of torchvision's augmentation policies (`autoaugment._apply_op`'s names).
enum class AugmentOp {
  Identity, ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast,
  Sharpness, Posterize, Solarize, AutoContrast, Equalize, Invert
};

/// torchvision's name of `op` ("ShearX", ...).
const char* augment_op_name(AugmentOp op) noexcept;

/// One op a policy drew for a sample, with its signed magnitude as torchvision passes it to
/// `_apply_op` (a float32 bin value, as a double).
struct AugmentStep {
  AugmentOp op = AugmentOp::Identity;
  double magnitude = 0.0;
};

/// `autoaugment._apply_op(img, op, magnitude, interpolation, fill)` on a uint8 RGB image, with
/// torchvision's tensor arithmetic: the geometric ops through `F.affine`/`F.rotate` (the inverse
/// affine matrix, the float32 grid, grid_sample's nearest or bilinear sampling, `fill` where a
/// pixel maps outside; an empty fill is torchvision's None), the colour ops as
/// `F.adjust_*`, `F.posterize`, `F.solarize`, `F.autocontrast`, `F.equalize`, `F.invert`.
Image apply_augment_op(const ImageView& src, const AugmentStep& step,
                       Interpolation interpolation = Interpolation::nearest,
                       const std::vector<double>& fill = {});

/// `transforms.TrivialAugmentWide(num_magnitude_bins, interpolation, fill)` on the uint8 crop:
/// one op of 14 uniformly, one of its magnitude bins uniformly, a random sign where signed.
struct TrivialAugmentWide {
  int num_magnitude_bins = 31;
  Interpolation interpolation = Interpolation::nearest;
  /// One value, or one per channel (uint8 values); empty: torchvision's None (zeros).
  std::vector<double> fill{};

  /// What `forward` draws for an image of height × width, with torchvision 0.14's calls in its
  /// order (`torch.randint` for the op, the bin, then the sign).
  std::vector<AugmentStep> draw(int height, int width, at::Generator& gen) const;
};

/// `transforms.RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`:
/// `num_ops` ops of 14 drawn uniformly, each at bin `magnitude`, with a random sign where signed.
struct RandAugment {
  int num_ops = 2;
  int magnitude = 9;
  int num_magnitude_bins = 31;
  Interpolation interpolation = Interpolation::nearest;
  std::vector<double> fill{};

  /// What `forward` draws for an image of height × width (torchvision 0.14's calls).
  std::vector<AugmentStep> draw(int height, int width, at::Generator& gen) const;
};

/// AutoAugment's policies; the fused pipeline has ImageNet's.
enum class AutoAugmentPolicy { imagenet };

/// `transforms.AutoAugment(policy, interpolation, fill)`: one of the policy's 25 sub-policies,
/// each of its two ops applied with its probability, at its bin, with a random sign.
struct AutoAugment {
  AutoAugmentPolicy policy = AutoAugmentPolicy::imagenet;
  Interpolation interpolation = Interpolation::nearest;
  std::vector<double> fill{};

  /// What `forward` draws (`get_params`: randint(25), rand(2), randint(2, (2,))): the ops that
  /// apply, in order.
  std::vector<AugmentStep> draw(int height, int width, at::Generator& gen) const;
};

/// `transforms.RandomRotation(degrees, interpolation, expand, center, fill)` on the uint8 crop
/// (torchvision's tensor path): an angle drawn from `degrees` (torchvision's single number d is
/// {-d, d}), the image rotated about `center` (pixel coordinates; none: its centre), `fill`
/// where a pixel maps outside. `expand` changes the output's size, which a recipe's fixed batch
/// cannot take, so a recipe refuses it.
struct RandomRotation {
  std::array<double, 2> degrees = {0.0, 0.0};
  Interpolation interpolation = Interpolation::nearest;
  bool expand = false;
  std::optional<std::array<double, 2>> center{};
  /// One value, or one per channel (torchvision's default 0: the fill goes through the mask).
  std::vector<double> fill = {0.0};

  /// `torch.empty(1).uniform_(degrees[0], degrees[1])`.
  double get_params(at::Generator& gen) const;
};

/// `transforms.RandomAffine(degrees, translate, scale, shear, interpolation, fill, center)` on
/// the uint8 crop (tensor path), with torchvision's draws and `F.affine`.
struct RandomAffine {
  std::array<double, 2> degrees = {0.0, 0.0};
  /// Largest shift as fractions of the width and the height; none: no shift.
  std::optional<std::array<double, 2>> translate{};
  /// The range of the scale factor; none: 1.
  std::optional<std::array<double, 2>> scale{};
  /// Empty (no shear), the x range (2 values), or the x then the y range (4 values).
  std::vector<double> shear{};
  Interpolation interpolation = Interpolation::nearest;
  std::vector<double> fill = {0.0};
  std::optional<std::array<double, 2>> center{};

  /// What `get_params` draws for an image of height × width.
  struct Params {
    double angle = 0.0;
    std::array<int, 2> translate{};
    double scale = 1.0;
    std::array<double, 2> shear{};
  };
  Params get_params(int height, int width, at::Generator& gen) const;
};

/// `transforms.v2.RandomPerspective(distortion_scale, p, interpolation, fill)` on the uint8 crop
/// (tensor path): with probability p, the four corners move inward by up to distortion_scale
/// of half the size each (torchvision's `get_params`, eight `torch.randint`s), and `F.perspective`
/// maps the image through the projective transform they define (the coefficients solved in
/// float32 by `torch.linalg.lstsq(driver="gels")`, its float32 grid, grid_sample's sampling).
struct RandomPerspective {
  double distortion_scale = 0.5;
  double p = 0.5;
  Interpolation interpolation = Interpolation::bilinear;
  /// One value, or one per channel (torchvision's default 0: the fill goes through the mask).
  std::vector<double> fill = {0.0};

  /// The corners torchvision's `get_params(width, height, distortion_scale)` draws:
  /// {x, y} of top-left, top-right, bottom-right, bottom-left. The start points are the
  /// image's corners, {0, 0}, {width - 1, 0}, {width - 1, height - 1}, {0, height - 1}.
  using Corners = std::array<std::array<int, 2>, 4>;
  Corners get_params(int height, int width, at::Generator& gen) const;
};

/// `F.perspective(img, startpoints, endpoints, interpolation, fill)` on a uint8 RGB image, the
/// tensor path's arithmetic (an empty fill is torchvision's None).
Image perspective(const ImageView& src, const RandomPerspective::Corners& startpoints,
                  const RandomPerspective::Corners& endpoints,
                  Interpolation interpolation = Interpolation::bilinear,
                  const std::vector<double>& fill = {});

/// `transforms.AugMix(severity, mixture_width, chain_depth, alpha, all_ops, interpolation,
/// fill)` on the uint8 crop: `mixture_width` chains of 1 to 3 (or `chain_depth`) ops drawn from
/// AugMix's space (severity bins of 10), each applied to the crop; the chains' outputs and the
/// crop mixed in float32 with Dirichlet weights, truncated back to uint8, as torchvision does.
struct AugMix {
  int severity = 3;
  int mixture_width = 3;
  /// Ops per chain; 0 or less: 1 to 3, drawn per chain.
  int chain_depth = -1;
  double alpha = 1.0;
  bool all_ops = true;
  Interpolation interpolation = Interpolation::bilinear;
  /// Empty: torchvision's None (zeros, no mask); else one value or one per channel.
  std::vector<double> fill{};

  /// What `forward` draws, with torchvision's calls in its order: the Beta weights m (a
  /// Dirichlet of [alpha, alpha]), the chains' Dirichlet weights times m[1], then each chain's
  /// depth (where drawn) and its ops (op, bin, sign).
  struct Params {
    /// m[0], the original's weight, then each chain's combined weight (float32 values).
    std::vector<float> weights;
    /// Each chain's number of ops; `steps` holds the chains' ops one after another.
    std::vector<int> depths;
    std::vector<AugmentStep> steps;
  };
  Params draw(int height, int width, at::Generator& gen) const;
  /// The crop mixed for `params` (AugMix's arithmetic: m0 · x + Σ w_i · chain_i(x) in float32,
  /// truncated to uint8).
  Image operator()(const ImageView& src, const Params& params) const;
};

// ---- A user's own ops -----------------------------------------------------------------------

/// A writable view of a sample's uint8 crop, as a user's op receives it: RGB, HWC, rows
/// `stride` bytes apart, the recipe's output size (an op changes pixels, never the size).
struct ImageSpan {
  std::uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  std::ptrdiff_t stride = 0;

  std::uint8_t* row(int y) const noexcept { return data + y * stride; }
  ImageView view() const noexcept { return {data, width, height, channels, stride}; }
};

/// A user's own per-sample op, run by the fused pipeline on the workers like the built-in
/// ones. Where it stands in the recipe decides what it receives: before ToDtype/ToTensor the
/// uint8 crop (`ImageSpan`), after ToDtype and every Normalize the float output ([3, H, W]
/// float32, a tensor over the batch row: change it in place, do not keep it). `rng` is the op's
/// own stream, seeded from the sample's generator when the sample's draws are made (in the
/// op's order, before decoding): a function of (seed, epoch, index) only, so batches are the
/// same whatever the executor and the number of workers. An exception it throws fails the
/// sample (a SampleError naming the index, the op's position and name). The callable is copied
/// into each worker (forked with a process executor); it must be safe to call from several
/// threads at once.
struct Custom {
  using PixelFn = std::function<void(ImageSpan& image, Rng& rng)>;
  using FloatFn = std::function<void(const at::Tensor& image, Rng& rng)>;

  /// The name errors and the recipe's checks use.
  std::string name;
  /// The op on the uint8 crop, or
  PixelFn on_pixels;
  /// the op on the float output (exactly one of the two is set).
  FloatFn on_float;

  Custom(std::string op_name, PixelFn fn) : name(std::move(op_name)), on_pixels(std::move(fn)) {}
  Custom(std::string op_name, FloatFn fn) : name(std::move(op_name)), on_float(std::move(fn)) {}
};

/// A user's own batch op, run like MixUp/CutMix on the collated batch in the worker that made
/// it: `images` float [N, 3, H, W] (change it in place or replace it with a tensor of that
/// shape), `labels` int64 [N], or a previous batch op's soft labels [N, C] (replace it to
/// change the labels; its first dimension must stay N). `rng` is a function of (seed, epoch,
/// batch, the op's position) only. Batch ops form the recipe's tail, in any order; an exception
/// fails the batch, naming the op.
struct CustomBatch {
  using Fn = std::function<void(at::Tensor& images, at::Tensor& labels, Rng& rng)>;
  std::string name;
  Fn fn;

  CustomBatch(std::string op_name, Fn f) : name(std::move(op_name)), fn(std::move(f)) {}
};

// ---- The recipe -----------------------------------------------------------------------------

/// One op of a recipe, in torchvision's names.
using RecipeOp = std::variant<RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip,
                              RandomVerticalFlip, Grayscale, RandomGrayscale, ToTensor, ToDtype,
                              Normalize, ColorJitter, GaussianBlur, RandomErasing, RandomCrop,
                              MixUp, CutMix, RandomChoice, TrivialAugmentWide, RandAugment,
                              AutoAugment, RandomRotation, RandomAffine, RandomPerspective,
                              AugMix, Custom, CustomBatch>;

/// The values one op drew for a sample, where it draws more than whether it applies.
struct OpDraw {
  /// ColorJitter's order and factors (GaussianBlur's sigma is factor[0]).
  ColorJitter::Params jitter;
  /// RandomErasing's box, in the output's coordinates.
  CropBox box;
  /// An augmentation policy's ops, in order.
  std::vector<AugmentStep> augment;
  /// RandomRotation's or RandomAffine's draw: angle, translate x and y, scale, shear x and y.
  std::array<double, 6> affine{};
  /// RandomPerspective's end points.
  RandomPerspective::Corners corners{};
  /// AugMix's weights and chain depths (its ops are in `augment`).
  std::vector<float> weights;
  std::vector<int> depths;
  /// A Custom op's stream's seed.
  std::uint64_t seed = 0;
};

/// What a recipe drew for one sample.
struct RecipeParams {
  /// The crop in full-size pixel coordinates (RandomResizedCrop's box), or the centre crop in
  /// the resized image's coordinates (Resize then CenterCrop).
  CropBox box;
  /// The JPEG DCT scale denominator of a RandomResizedCrop's decode (1 for PNG, or without
  /// scaling); Resize chooses its own.
  int scale_denominator = 1;
  /// Bit k is set when op k applies to this sample (always for a deterministic op; for a
  /// random one, when its draw said so).
  std::uint64_t applied = 0;
  /// Per op, what it drew (empty unless the recipe has ColorJitter, GaussianBlur,
  /// RandomErasing or an augmentation policy).
  std::vector<OpDraw> draws;

  /// Whether op `k` applies.
  bool applies(std::size_t k) const noexcept { return (applied >> k) & 1u; }
};

/// A composition of torchvision ops run by the fused pipeline; see the file comment. Copies
/// share the built plan. Thread-safe: scratch memory is per thread.
class Recipe {
 public:
  /// Builds and checks the recipe (std::invalid_argument naming the op and its parameter).
  Recipe(std::initializer_list<RecipeOp> ops);
  /// The same, from a vector.
  explicit Recipe(std::vector<RecipeOp> ops);

  /// The ops, as given.
  const std::vector<RecipeOp>& ops() const noexcept;
  /// Output height and width of every sample.
  int output_height() const noexcept;
  int output_width() const noexcept;
  /// Whether JPEGs decode at a reduced DCT scale where it covers the output (on by default;
  /// off, outputs equal torchvision's on PIL images bit for bit).
  bool dct_scaling() const noexcept;
  /// A copy with DCT scaling on or off.
  Recipe with_dct_scaling(bool on) const;

  /// Draws every random op's choice for an image of `info`'s size, in the ops' order.
  RecipeParams sample(const ImageInfo& info, at::Generator& gen) const;
  /// Decodes `encoded` and writes the sample for `params` into `dst`
  /// (3 × output_height × output_width floats, CHW).
  void apply(std::span<const std::byte> encoded, const ImageInfo& info,
             const RecipeParams& params, float* dst) const;
  /// Samples with `gen`, then applies.
  void operator()(std::span<const std::byte> encoded, at::Generator& gen, float* dst) const;
  /// Samples with a generator made from `rng`, then applies.
  void operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const;
  /// The sample as a new [3, H, W] float tensor.
  at::Tensor operator()(std::span<const std::byte> encoded, Rng& rng) const;

  /// Whether the recipe ends with batch ops (MixUp, CutMix, a RandomChoice of them, CustomBatch).
  bool has_batch_op() const noexcept;
  /// Draws the batch op's choice for a batch of `height` × `width` images, as torchvision's
  /// transforms draw (multinomial, Beta through _sample_dirichlet, CutMix's randint centre).
  BatchMixParams sample_batch(int height, int width, at::Generator& gen) const;
  /// The MixUp/CutMix op on a collated batch: images changed in place, the soft labels
  /// returned; `num_classes` stands in for an op's num_classes of 0. Without one, `labels`.
  at::Tensor mix_batch(at::Tensor& images, const at::Tensor& labels, int num_classes,
                       at::Generator& gen) const;
  /// Every batch op in the recipe's order on batch `batch` of `epoch` of a loader seeded with
  /// `seed` (what the image pipelines run): MixUp/CutMix as mix_batch with
  /// batch_generator(seed, epoch, batch), each CustomBatch with its own Rng. Returns the labels.
  at::Tensor run_batch_ops(at::Tensor& images, at::Tensor labels, int num_classes,
                           std::uint64_t seed, std::int64_t epoch, std::int64_t batch) const;
  /// The generator a loader's batch op draws from: a function of (seed, epoch, batch) only,
  /// so batches mix alike whatever the workers.
  static at::Generator batch_generator(std::uint64_t seed, std::int64_t epoch,
                                       std::int64_t batch);

  struct Plan;  // the built form (lib/vision/recipe.cpp)

 private:
  void apply_rows(std::span<const std::byte> encoded, const ImageInfo& info,
                  const RecipeParams& params, bool hflip, bool vflip, int grays, bool erase,
                  float* dst) const;
  void apply_whole(std::span<const std::byte> encoded, const ImageInfo& info,
                   const RecipeParams& params, bool erase, float* dst) const;
  void finish_whole(const RecipeParams& params, bool erase, float* dst) const;
  void float_ops(const RecipeParams& params, float* dst) const;

  std::shared_ptr<const Plan> plan_;
};

/// Named recipes: `classic` is RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
/// Normalize(ImageNet) for training and Resize(256), CenterCrop(224), ToTensor(), Normalize for
/// evaluation (TrainTransform's and EvalTransform's outputs, bit for bit). `resnet50` is
/// torchvision's ResNet-50 IMAGENET1K_V2 recipe: RandomResizedCrop(176), RandomHorizontalFlip(),
/// TrivialAugmentWide(), ToDtype(float32, scale), Normalize(ImageNet), RandomErasing(0.1),
/// RandomChoice(MixUp(0.2), CutMix(1.0)) for training; Resize(232), CenterCrop(224), ToDtype,
/// Normalize for evaluation.
namespace presets {
/// The named preset's training recipe (std::invalid_argument for an unknown name, listing the
/// known ones).
Recipe train(const std::string& name);
/// The named preset's evaluation recipe.
Recipe eval(const std::string& name);
/// The presets' names.
std::vector<std::string> names();
}  // namespace presets

/// The transforms the image pipelines run: the two fixed ones or a recipe.
using FusedTransform = std::variant<TrainTransform, EvalTransform, Recipe>;

/// The side of `t`'s square output, or 0 when its output is not square.
int fused_output_size(const FusedTransform& t) noexcept;
/// Runs `t` on `encoded`, drawing from `rng`, into `dst` (3 × S × S floats).
void fused_apply(const FusedTransform& t, std::span<const std::byte> encoded, Rng& rng,
                 float* dst);

namespace detail {
/// The image pipelines' last step of a batch: keeps the rows in `keep` (when fewer than all
/// `n` loaded) and runs a recipe's batch op with the batch's own generator;
/// `num_classes` stands in for an op's num_classes of 0.
std::pair<at::Tensor, at::Tensor> finish_batch(const FusedTransform& t, const BatchContext& ctx,
                                               at::Tensor images, at::Tensor labels,
                                               const std::vector<std::int64_t>& keep,
                                               std::int64_t n, int num_classes);
/// Throws std::invalid_argument naming `who` when `t`'s output is not square (the pipelines'
/// batches are [N, 3, S, S]).
void check_square_output(const FusedTransform& t, const char* who);
}  // namespace detail

}  // namespace coload::vision
