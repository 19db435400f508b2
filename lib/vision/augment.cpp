// vision/augment: torchvision's augmentation policies (TrivialAugmentWide, RandAugment,
// AutoAugment with the ImageNet policy) and their ops on packed uint8 RGB, with the arithmetic
// of torchvision's tensor functional API (the path it takes for tensor images; not PIL's).
//
// The draws follow torchvision 0.14's `forward`s call for call, so a sample's ops and signs agree
// with torchvision's given the same generator state; the magnitude bins are computed with ATen
// (torch.linspace, arange/round) as torchvision computes them, so each is the same float32.

#include "augment.hpp"
#include "coload/core/error.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace coload::vision {

const char* augment_op_name(AugmentOp op) noexcept {
  static constexpr const char* names[] = {"Identity",     "ShearX",    "ShearY",     "TranslateX",
                                          "TranslateY",   "Rotate",    "Brightness", "Color",
                                          "Contrast",     "Sharpness", "Posterize",  "Solarize",
                                          "AutoContrast", "Equalize",  "Invert"};
  return names[static_cast<int>(op)];
}

namespace detail {
namespace {

using Entry = AugmentPlan::Entry;

std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

std::vector<double> linspace(double start, double end, int bins) {
  // torch.linspace in the default dtype, float32, as the policies call it.
  return to_doubles(at::linspace(start, end, bins, at::kFloat));
}

// `base - (torch.arange(num_bins) / ((num_bins - 1) / d)).round().int()` (base 8, or AugMix's 4).
std::vector<double> posterize_bins(int bins, double d, int base = 8) {
  return to_doubles(base - (at::arange(bins) / ((bins - 1) / d)).round().to(at::kInt));
}

// AugMix's `_augmentation_space(10, (height, width))`, in its dict order.
std::vector<Entry> augmix_space(bool all_ops, int height, int width) {
  constexpr int bins = 10;
  std::vector<Entry> space;
  space.push_back({AugmentOp::ShearX, linspace(0.0, 0.3, bins), true});
  space.push_back({AugmentOp::ShearY, linspace(0.0, 0.3, bins), true});
  space.push_back({AugmentOp::TranslateX, linspace(0.0, width / 3.0, bins), true});
  space.push_back({AugmentOp::TranslateY, linspace(0.0, height / 3.0, bins), true});
  space.push_back({AugmentOp::Rotate, linspace(0.0, 30.0, bins), true});
  space.push_back({AugmentOp::Posterize, posterize_bins(bins, 4.0, 4), false});
  space.push_back({AugmentOp::Solarize, linspace(255.0, 0.0, bins), false});
  space.push_back({AugmentOp::AutoContrast, {}, false});
  space.push_back({AugmentOp::Equalize, {}, false});
  if (all_ops) {
    for (AugmentOp op :
         {AugmentOp::Brightness, AugmentOp::Color, AugmentOp::Contrast, AugmentOp::Sharpness}) {
      space.push_back({op, linspace(0.0, 0.9, bins), true});
    }
  }
  return space;
}

// The op space of TrivialAugmentWide (wide) or of RandAugment/AutoAugment, for height × width.
std::vector<Entry> augmentation_space(bool wide, bool with_identity, bool with_invert, int bins,
                                      int height, int width) {
  const double shear = wide ? 0.99 : 0.3;
  const double rotate = wide ? 135.0 : 30.0;
  const double colour = wide ? 0.99 : 0.9;
  std::vector<Entry> space;
  if (with_identity) space.push_back({AugmentOp::Identity, {}, false});
  space.push_back({AugmentOp::ShearX, linspace(0.0, shear, bins), true});
  space.push_back({AugmentOp::ShearY, linspace(0.0, shear, bins), true});
  space.push_back(
      {AugmentOp::TranslateX, linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * width, bins), true});
  space.push_back(
      {AugmentOp::TranslateY, linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * height, bins), true});
  space.push_back({AugmentOp::Rotate, linspace(0.0, rotate, bins), true});
  for (AugmentOp op :
       {AugmentOp::Brightness, AugmentOp::Color, AugmentOp::Contrast, AugmentOp::Sharpness}) {
    space.push_back({op, linspace(0.0, colour, bins), true});
  }
  space.push_back({AugmentOp::Posterize, posterize_bins(bins, wide ? 6.0 : 4.0), false});
  space.push_back({AugmentOp::Solarize, linspace(255.0, 0.0, bins), false});
  space.push_back({AugmentOp::AutoContrast, {}, false});
  space.push_back({AugmentOp::Equalize, {}, false});
  if (with_invert) space.push_back({AugmentOp::Invert, {}, false});
  return space;
}

// AutoAugment's ImageNet policy: 25 pairs of (op, probability, magnitude bin or -1).
struct PolicyOp {
  AugmentOp op;
  double p;
  int bin;
};
constexpr PolicyOp imagenet_policy[25][2] = {
    {{AugmentOp::Posterize, 0.4, 8}, {AugmentOp::Rotate, 0.6, 9}},
    {{AugmentOp::Solarize, 0.6, 5}, {AugmentOp::AutoContrast, 0.6, -1}},
    {{AugmentOp::Equalize, 0.8, -1}, {AugmentOp::Equalize, 0.6, -1}},
    {{AugmentOp::Posterize, 0.6, 7}, {AugmentOp::Posterize, 0.6, 6}},
    {{AugmentOp::Equalize, 0.4, -1}, {AugmentOp::Solarize, 0.2, 4}},
    {{AugmentOp::Equalize, 0.4, -1}, {AugmentOp::Rotate, 0.8, 8}},
    {{AugmentOp::Solarize, 0.6, 3}, {AugmentOp::Equalize, 0.6, -1}},
    {{AugmentOp::Posterize, 0.8, 5}, {AugmentOp::Equalize, 1.0, -1}},
    {{AugmentOp::Rotate, 0.2, 3}, {AugmentOp::Solarize, 0.6, 8}},
    {{AugmentOp::Equalize, 0.6, -1}, {AugmentOp::Posterize, 0.4, 6}},
    {{AugmentOp::Rotate, 0.8, 8}, {AugmentOp::Color, 0.4, 0}},
    {{AugmentOp::Rotate, 0.4, 9}, {AugmentOp::Equalize, 0.6, -1}},
    {{AugmentOp::Equalize, 0.0, -1}, {AugmentOp::Equalize, 0.8, -1}},
    {{AugmentOp::Invert, 0.6, -1}, {AugmentOp::Equalize, 1.0, -1}},
    {{AugmentOp::Color, 0.6, 4}, {AugmentOp::Contrast, 1.0, 8}},
    {{AugmentOp::Rotate, 0.8, 8}, {AugmentOp::Color, 1.0, 2}},
    {{AugmentOp::Color, 0.8, 8}, {AugmentOp::Solarize, 0.8, 7}},
    {{AugmentOp::Sharpness, 0.4, 7}, {AugmentOp::Invert, 0.6, -1}},
    {{AugmentOp::ShearX, 0.6, 5}, {AugmentOp::Equalize, 1.0, -1}},
    {{AugmentOp::Color, 0.4, 0}, {AugmentOp::Equalize, 0.6, -1}},
    {{AugmentOp::Equalize, 0.4, -1}, {AugmentOp::Solarize, 0.2, 4}},
    {{AugmentOp::Solarize, 0.6, 5}, {AugmentOp::AutoContrast, 0.6, -1}},
    {{AugmentOp::Invert, 0.6, -1}, {AugmentOp::Equalize, 1.0, -1}},
    {{AugmentOp::Color, 0.6, 4}, {AugmentOp::Contrast, 1.0, 8}},
    {{AugmentOp::Equalize, 0.8, -1}, {AugmentOp::Equalize, 0.6, -1}},
};

std::int64_t randint(std::int64_t high, at::Generator& gen) {
  return draw_int(0, high, gen);
}

void check_bins(int bins, std::string& error) {
  // NOTE: torchvision does not check; with fewer than 2 bins Posterize's bins divide by zero.
  if (bins < 2 && error.empty()) {
    error = "num_magnitude_bins must be at least 2, got " + std::to_string(bins);
  }
}

}  // namespace

// The fill as torchvision's tensor path checks it (`_assert_grid_transform_inputs`), and
// within a uint8 image's values. Every plan with a warp checks its fill here, so this is also
// where the warps' grid arithmetic is probed (once per process, with at::bmm): when the recipe
// is built, before any worker process forks.
std::vector<float> checked_fill(const std::vector<double>& fill, std::string& error) {
  (void)linked_grid_form(0);
  if (fill.size() > 1 && fill.size() != 3) {
    error =
        "The number of elements in 'fill' cannot broadcast to match the number of channels "
        "of the image (" +
        std::to_string(fill.size()) + " != 3)";
    return {};
  }
  for (double f : fill) {
    if (!(f >= 0 && f <= 255)) {
      error = "fill values of a uint8 image lie in [0, 255], got " + py_float(f);
      return {};
    }
  }
  return {fill.begin(), fill.end()};
}

AugmentPlan make_augment_plan(const TrivialAugmentWide& t, int height, int width,
                              std::string& error) {
  AugmentPlan plan;
  plan.policy = AugmentPlan::Policy::trivial_wide;
  plan.interpolation = t.interpolation;
  plan.fill = checked_fill(t.fill, error);
  check_bins(t.num_magnitude_bins, error);
  if (!error.empty()) return plan;
  plan.bins = t.num_magnitude_bins;
  plan.space = augmentation_space(true, true, false, plan.bins, height, width);
  return plan;
}

AugmentPlan make_augment_plan(const RandAugment& t, int height, int width, std::string& error) {
  AugmentPlan plan;
  plan.policy = AugmentPlan::Policy::rand;
  plan.interpolation = t.interpolation;
  plan.fill = checked_fill(t.fill, error);
  check_bins(t.num_magnitude_bins, error);
  if (error.empty() && (t.magnitude < 0 || t.magnitude >= t.num_magnitude_bins)) {
    // NOTE: torchvision fails later, indexing the bins; refused here with the range.
    error = "magnitude must lie in [0, num_magnitude_bins) = [0, " +
            std::to_string(t.num_magnitude_bins) + "), got " + std::to_string(t.magnitude);
  }
  if (error.empty() && (t.num_ops < 0 || t.num_ops > 64)) {
    error = "num_ops must lie in [0, 64], got " + std::to_string(t.num_ops);
  }
  if (!error.empty()) return plan;
  plan.num_ops = t.num_ops;
  plan.magnitude = t.magnitude;
  plan.bins = t.num_magnitude_bins;
  plan.space = augmentation_space(false, true, false, plan.bins, height, width);
  return plan;
}

AugmentPlan make_augment_plan(const AutoAugment& t, int height, int width, std::string& error) {
  AugmentPlan plan;
  plan.policy = AugmentPlan::Policy::autoaugment;
  plan.interpolation = t.interpolation;
  plan.fill = checked_fill(t.fill, error);
  if (t.policy != AutoAugmentPolicy::imagenet && error.empty()) {
    error = "The provided policy is not recognized.";
  }
  if (!error.empty()) return plan;
  plan.bins = 10;
  plan.space = augmentation_space(false, false, true, plan.bins, height, width);
  return plan;
}

AugmentPlan make_augment_plan(const AugMix& t, int height, int width, std::string& error) {
  AugmentPlan plan;
  plan.policy = AugmentPlan::Policy::augmix;
  plan.interpolation = t.interpolation;
  if (!(t.severity >= 1 && t.severity <= 10)) {
    // NOTE: torchvision's wording.
    error = "The severity must be between [1, 10]. Got " + std::to_string(t.severity) + " instead.";
  }
  // NOTE: torchvision checks neither; _sample_dirichlet fails on an empty or non-positive
  // concentration, and a chain of thousands of ops is a mistake: refused here.
  if (error.empty() && (t.mixture_width < 1 || t.mixture_width > 64)) {
    error = "mixture_width must lie in [1, 64], got " + std::to_string(t.mixture_width);
  }
  if (error.empty() && t.chain_depth > 64) {
    error = "chain_depth must be at most 64 (or <= 0 for 1 to 3 ops per chain), got " +
            std::to_string(t.chain_depth);
  }
  if (error.empty() && !(t.alpha > 0.0 && std::isfinite(t.alpha))) {
    error = "alpha must be a positive number (the Dirichlet's concentration), got " +
            py_float(t.alpha);
  }
  std::vector<float> fill = checked_fill(t.fill, error);
  if (!error.empty()) return plan;
  plan.fill = std::move(fill);
  plan.severity = t.severity;
  plan.mixture_width = t.mixture_width;
  plan.chain_depth = t.chain_depth;
  plan.alpha = static_cast<float>(t.alpha);
  plan.bins = 10;
  plan.space = augmix_space(t.all_ops, height, width);
  return plan;
}

AugMix::Params AugmentPlan::draw_augmix(at::Generator& gen) const {
  AugMix::Params p;
  // m = Dirichlet([alpha, alpha]); the chains' weights Dirichlet([alpha] * width) * m[1]: the
  // same `torch._sample_dirichlet` calls on the sample's generator, in forward's order.
  const at::Tensor m = at::_sample_dirichlet(at::full({1, 2}, alpha, at::kFloat), gen).contiguous();
  const at::Tensor d =
      at::_sample_dirichlet(at::full({1, mixture_width}, alpha, at::kFloat), gen).contiguous();
  const float* pm = m.data_ptr<float>();
  const float* pd = d.data_ptr<float>();
  p.weights.push_back(pm[0]);
  for (int i = 0; i < mixture_width; ++i) p.weights.push_back(pd[i] * pm[1]);
  for (int i = 0; i < mixture_width; ++i) {
    const int depth = chain_depth > 0 ? chain_depth
                                      : static_cast<int>(draw_int(1, 4, gen));
    p.depths.push_back(depth);
    for (int k = 0; k < depth; ++k) {
      const Entry& e =
          space[static_cast<std::size_t>(randint(static_cast<std::int64_t>(space.size()), gen))];
      double magnitude = 0.0;
      if (!e.magnitudes.empty()) {
        magnitude = e.magnitudes[static_cast<std::size_t>(randint(severity, gen))];
      }
      if (e.is_signed && randint(2, gen) != 0) magnitude *= -1.0;
      p.steps.push_back({e.op, magnitude});
    }
  }
  return p;
}

std::vector<AugmentStep> AugmentPlan::draw(at::Generator& gen) const {
  std::vector<AugmentStep> steps;
  const auto entry_of = [&](AugmentOp op) -> const Entry& {
    return *std::find_if(space.begin(), space.end(), [&](const Entry& e) { return e.op == op; });
  };
  switch (policy) {
    case Policy::trivial_wide: {
      const Entry& e =
          space[static_cast<std::size_t>(randint(static_cast<std::int64_t>(space.size()), gen))];
      double magnitude = 0.0;
      if (!e.magnitudes.empty()) {
        magnitude = e.magnitudes[static_cast<std::size_t>(
            randint(static_cast<std::int64_t>(e.magnitudes.size()), gen))];
      }
      if (e.is_signed && randint(2, gen) != 0) magnitude *= -1.0;
      steps.push_back({e.op, magnitude});
      break;
    }
    case Policy::rand:
      for (int i = 0; i < num_ops; ++i) {
        const Entry& e =
            space[static_cast<std::size_t>(randint(static_cast<std::int64_t>(space.size()), gen))];
        double m = e.magnitudes.empty() ? 0.0 : e.magnitudes[static_cast<std::size_t>(magnitude)];
        if (e.is_signed && randint(2, gen) != 0) m *= -1.0;
        steps.push_back({e.op, m});
      }
      break;
    case Policy::autoaugment: {
      // get_params: the sub-policy, two probabilities, two signs, in that order.
      const auto id = static_cast<std::size_t>(randint(25, gen));
      const at::Tensor probs = at::rand({2}, gen);
      const at::Tensor signs = at::randint(2, {2}, gen);
      for (std::size_t i = 0; i < 2; ++i) {
        const PolicyOp& po = imagenet_policy[id][i];
        // `probs[i] <= p`: a float32 element against a Python float, compared in float32.
        if (!(probs[static_cast<std::int64_t>(i)].item<float>() <= static_cast<float>(po.p)))
          continue;
        const Entry& e = entry_of(po.op);
        double magnitude = po.bin >= 0 ? e.magnitudes[static_cast<std::size_t>(po.bin)] : 0.0;
        if (e.is_signed && signs[static_cast<std::int64_t>(i)].item<std::int64_t>() == 0) {
          magnitude *= -1.0;
        }
        steps.push_back({po.op, magnitude});
      }
      break;
    }
    case Policy::augmix:
      break;  // draw_augmix
  }
  return steps;
}

// ---- The ops on uint8 -------------------------------------------------------------------------

namespace {

std::size_t values(RgbSpan img) {
  return static_cast<std::size_t>(img.width) * img.height * 3;
}

// `F.adjust_sharpness`: blended with `_blurred_degenerate_image` (a 3 × 3 kernel of ones with 5
// at the centre, over 13, on the interior, rounded back to uint8; the border kept).
void adjust_sharpness(RgbSpan img, double factor) {
  const int w = img.width;
  const int h = img.height;
  if (w <= 2 || h <= 2) return;
  thread_local std::vector<std::uint8_t> blurred;
  blurred.assign(img.data, img.data + values(img));
  const float k = 1.0f / 13.0f;
  const float centre = 5.0f / 13.0f;
  const std::size_t stride = static_cast<std::size_t>(w) * 3;
  for (int y = 1; y < h - 1; ++y) {
    const std::uint8_t* up = img.data + (y - 1) * stride;
    const std::uint8_t* mid = up + stride;
    const std::uint8_t* down = mid + stride;
    std::uint8_t* out = blurred.data() + y * stride;
    for (std::size_t i = 3; i < stride - 3; ++i) {
      const float sum = k * up[i - 3] + k * up[i] + k * up[i + 3] + k * mid[i - 3] +
                        centre * mid[i] + k * mid[i + 3] + k * down[i - 3] + k * down[i] +
                        k * down[i + 3];
      // Rounded half to even (torch.round): sum lies in [0, 255], so adding and subtracting
      // 1.5 · 2^23 rounds it exactly (round_even without its branch, which kept this loop
      // from vectorising: 1.03 ms a 224^2 crop before).
      out[i] = static_cast<std::uint8_t>(static_cast<int>((sum + 12582912.0f) - 12582912.0f));
    }
  }
  // `_blend(img, blurred, factor)` on uint8: ratio · a + (1 - ratio) · b in float32, clamped,
  // truncated; (1 - ratio) computed in double from the double ratio, as Python does. Written
  // so that it vectorises.
  const std::size_t n = values(img);
  const auto ratio = static_cast<float>(factor);
  const auto rest = static_cast<float>(1.0 - factor);
  const std::uint8_t* b = blurred.data();
  std::uint8_t* a = img.data;
  for (std::size_t i = 0; i < n; ++i) {
    float v = ratio * static_cast<float>(a[i]) + rest * static_cast<float>(b[i]);
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    a[i] = static_cast<std::uint8_t>(static_cast<int>(v));
  }
}

void map_values(RgbSpan img, const std::uint8_t (&table)[3][256]) {
  const std::size_t n = values(img);
  for (std::size_t i = 0; i < n; i += 3) {
    for (std::size_t c = 0; c < 3; ++c) img.data[i + c] = table[c][img.data[i + c]];
  }
}

// `F.autocontrast`: each channel stretched from its [min, max] to [0, 255] in float32 (a flat
// channel left as it is), truncated.
void autocontrast(RgbSpan img) {
  std::uint8_t lo[3] = {255, 255, 255};
  std::uint8_t hi[3] = {0, 0, 0};
  const std::size_t n = values(img);
  for (std::size_t i = 0; i < n; i += 3) {
    for (std::size_t c = 0; c < 3; ++c) {
      lo[c] = std::min(lo[c], img.data[i + c]);
      hi[c] = std::max(hi[c], img.data[i + c]);
    }
  }
  std::uint8_t table[3][256];
  for (int c = 0; c < 3; ++c) {
    float minimum = lo[c];
    // `bound / (maximum - minimum)` with a Python float on the left is Tensor.__rtruediv__,
    // which computes `reciprocal() * bound`: two roundings, not one division.
    float scale = (1.0f / (static_cast<float>(hi[c]) - minimum)) * 255.0f;
    if (!std::isfinite(scale)) {
      minimum = 0.0f;
      scale = 1.0f;
    }
    for (int v = 0; v < 256; ++v) {
      const float r = (static_cast<float>(v) - minimum) * scale;
      table[c][v] = static_cast<std::uint8_t>(std::clamp(r, 0.0f, 255.0f));
    }
  }
  map_values(img, table);
}

// `F.equalize` (`_scale_channel` per channel): the histogram's cumulative sum, in integers.
void equalize(RgbSpan img) {
  std::int64_t hist[3][256] = {};
  const std::size_t n = values(img);
  for (std::size_t i = 0; i < n; i += 3) {
    for (std::size_t c = 0; c < 3; ++c) ++hist[c][img.data[i + c]];
  }
  std::uint8_t table[3][256];
  for (int c = 0; c < 3; ++c) {
    // step: the count of all but the last non-empty bin, over 255.
    int last = 255;
    while (last > 0 && hist[c][last] == 0) --last;
    const std::int64_t total = static_cast<std::int64_t>(n / 3);
    const std::int64_t step = (total - hist[c][last]) / 255;
    std::int64_t cum = 0;
    for (int v = 0; v < 256; ++v) {
      if (step == 0) {
        table[c][v] = static_cast<std::uint8_t>(v);
        continue;
      }
      // lut = (cumsum + step // 2) // step, shifted by one (lut[0] = 0), clamped to 255.
      table[c][v] = static_cast<std::uint8_t>(std::min<std::int64_t>((cum + step / 2) / step, 255));
      cum += hist[c][v];
    }
  }
  map_values(img, table);
}

template <typename Fn>
void map_all(RgbSpan img, Fn&& fn) {
  std::uint8_t table[3][256];
  for (int v = 0; v < 256; ++v) {
    table[0][v] = table[1][v] = table[2][v] = fn(static_cast<std::uint8_t>(v));
  }
  map_values(img, table);
}

}  // namespace

void apply_augment(RgbSpan img, const AugmentStep& step, Interpolation interpolation,
                   const std::vector<float>& fill) {
  const double m = step.magnitude;
  const double w = img.width;
  const double h = img.height;
  switch (step.op) {
    case AugmentOp::Identity:
      break;
    case AugmentOp::ShearX:
    case AugmentOp::ShearY: {
      // shear = degrees(atan(m)) about the top-left corner (center=[0, 0], which the tensor path
      // turns into (-w/2, -h/2) from the image's centre).
      constexpr double rad_to_deg = 180.0 / 3.14159265358979323846;
      const double s = std::atan(m) * rad_to_deg;
      const std::array<double, 2> shear = step.op == AugmentOp::ShearX
                                              ? std::array<double, 2>{s, 0.0}
                                              : std::array<double, 2>{0.0, s};
      warp_affine(img, inverse_affine_matrix({-w * 0.5, -h * 0.5}, 0.0, {0.0, 0.0}, 1.0, shear),
                  interpolation, fill);
      break;
    }
    case AugmentOp::TranslateX:
    case AugmentOp::TranslateY: {
      // translate = [int(m), 0]: truncated toward zero.
      const double t = std::trunc(m);
      const std::array<double, 2> translate = step.op == AugmentOp::TranslateX
                                                  ? std::array<double, 2>{t, 0.0}
                                                  : std::array<double, 2>{0.0, t};
      warp_affine(img, inverse_affine_matrix({0.0, 0.0}, 0.0, translate, 1.0, {0.0, 0.0}),
                  interpolation, fill);
      break;
    }
    case AugmentOp::Rotate:
      // F.rotate: the inverse matrix of -angle about the centre.
      warp_affine(img, inverse_affine_matrix({0.0, 0.0}, -m, {0.0, 0.0}, 1.0, {0.0, 0.0}),
                  interpolation, fill);
      break;
    case AugmentOp::Brightness:
      adjust_brightness(img, 1.0 + m);
      break;
    case AugmentOp::Color:
      adjust_saturation(img, 1.0 + m);
      break;
    case AugmentOp::Contrast:
      adjust_contrast(img, 1.0 + m);
      break;
    case AugmentOp::Sharpness:
      adjust_sharpness(img, 1.0 + m);
      break;
    case AugmentOp::Posterize: {
      const int bits = static_cast<int>(m);
      // The policies draw 2..8; a caller's own step outside 0..8 would shift out of range.
      if (!(m >= 0 && m <= 8)) {
        throw InvalidArgument("Posterize needs between 0 and 8 bits, got " + std::to_string(m));
      }
      const auto mask = static_cast<std::uint8_t>(-(1 << (8 - bits)) & 0xff);
      map_all(img, [&](std::uint8_t v) { return static_cast<std::uint8_t>(v & mask); });
      break;
    }
    case AugmentOp::Solarize: {
      // `img >= threshold` compares in float32.
      const auto threshold = static_cast<float>(m);
      map_all(img, [&](std::uint8_t v) {
        return static_cast<float>(v) >= threshold ? static_cast<std::uint8_t>(255 - v) : v;
      });
      break;
    }
    case AugmentOp::AutoContrast:
      autocontrast(img);
      break;
    case AugmentOp::Equalize:
      equalize(img);
      break;
    case AugmentOp::Invert:
      map_all(img, [](std::uint8_t v) { return static_cast<std::uint8_t>(255 - v); });
      break;
  }
}

void apply_augmix(RgbSpan img, const AugmentPlan& plan, const std::vector<float>& weights,
                  const std::vector<int>& depths, const std::vector<AugmentStep>& steps) {
  const std::size_t n = values(img);
  thread_local std::vector<std::uint8_t> original;
  thread_local std::vector<std::uint8_t> chain;
  thread_local std::vector<float> mix;
  original.assign(img.data, img.data + n);
  chain.resize(n);
  mix.resize(n);
  // mix = m0 · x, then mix += w_i · chain_i(x): each product rounded to float32, then the sum,
  // as torchvision's `mul` and `add_` on float32 tensors.
  const float m0 = weights[0];
  for (std::size_t k = 0; k < n; ++k) mix[k] = m0 * static_cast<float>(original[k]);
  std::size_t next = 0;
  for (std::size_t i = 0; i < depths.size(); ++i) {
    std::memcpy(chain.data(), original.data(), n);
    const RgbSpan aug{chain.data(), img.width, img.height};
    for (int d = 0; d < depths[i]; ++d) {
      apply_augment(aug, steps[next++], plan.interpolation, plan.fill);
    }
    const float w = weights[i + 1];
    for (std::size_t k = 0; k < n; ++k) mix[k] = mix[k] + w * static_cast<float>(chain[k]);
  }
  // `.to(torch.uint8)` truncates; the weights sum to 1 within float32's rounding, so a value
  // may pass 255 by a hair (clamped rather than left to the conversion's undefined behaviour).
  for (std::size_t k = 0; k < n; ++k) {
    img.data[k] = static_cast<std::uint8_t>(std::min(mix[k], 255.0f));
  }
}

}  // namespace detail

// ---- The public forms ---------------------------------------------------------------------------

namespace {

template <typename T>
std::vector<AugmentStep> draw_policy(const T& t, int height, int width, at::Generator& gen) {
  std::string error;
  const detail::AugmentPlan plan = detail::make_augment_plan(t, height, width, error);
  if (!error.empty()) throw InvalidArgument(error);
  return plan.draw(gen);
}

}  // namespace

std::vector<AugmentStep> TrivialAugmentWide::draw(int height, int width, at::Generator& gen) const {
  return draw_policy(*this, height, width, gen);
}
std::vector<AugmentStep> RandAugment::draw(int height, int width, at::Generator& gen) const {
  return draw_policy(*this, height, width, gen);
}
std::vector<AugmentStep> AutoAugment::draw(int height, int width, at::Generator& gen) const {
  return draw_policy(*this, height, width, gen);
}

AugMix::Params AugMix::draw(int height, int width, at::Generator& gen) const {
  std::string error;
  const detail::AugmentPlan plan = detail::make_augment_plan(*this, height, width, error);
  if (!error.empty()) throw InvalidArgument(error);
  return plan.draw_augmix(gen);
}

Image AugMix::operator()(const ImageView& src, const Params& params) const {
  std::string error;
  const detail::AugmentPlan plan = detail::make_augment_plan(*this, src.height, src.width, error);
  if (!error.empty()) throw InvalidArgument(error);
  if (src.channels != 3) {
    throw InvalidArgument("AugMix needs an RGB image, got " + std::to_string(src.channels) +
                          " channels");
  }
  std::size_t total = 0;
  for (int d : params.depths) total += static_cast<std::size_t>(std::max(d, 0));
  if (params.weights.size() != params.depths.size() + 1 || total != params.steps.size()) {
    throw InvalidArgument("AugMix: params hold " + std::to_string(params.weights.size()) +
                          " weights, " + std::to_string(params.depths.size()) + " chains and " +
                          std::to_string(params.steps.size()) +
                          " ops: expected one weight more than chains, and the chains' ops");
  }
  Image out = Image::zeros(src.width, src.height, 3);
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, y), src.row(y), static_cast<std::size_t>(src.width) * 3);
  }
  detail::apply_augmix({out.data.data(), out.width, out.height}, plan, params.weights,
                       params.depths, params.steps);
  return out;
}

Image apply_augment_op(const ImageView& src, const AugmentStep& step, Interpolation interpolation,
                       const std::vector<double>& fill) {
  if (src.channels != 3) {
    throw InvalidArgument(std::string(augment_op_name(step.op)) + " needs an RGB image, got " +
                          std::to_string(src.channels) + " channels");
  }
  std::string error;
  const std::vector<float> f = detail::checked_fill(fill, error);
  if (!error.empty()) throw InvalidArgument(error);
  Image out = Image::zeros(src.width, src.height, 3);
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, y), src.row(y), static_cast<std::size_t>(src.width) * 3);
  }
  detail::apply_augment({out.data.data(), out.width, out.height}, step, interpolation, f);
  return out;
}

}  // namespace coload::vision
