// vision/recipe: a composition of torchvision ops, checked once when built and then run by the
// fused core (fused.hpp): geometry in the decode, uint8 ops per resampled row, ToDtype and
// Normalize as one table while writing.

#include "coload/vision/recipe.hpp"
#include "coload/core/error.hpp"

#include "fused.hpp"
#include "image_ops.hpp"
#include "recipe_plan.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace coload::vision {

namespace {

// Where padded index `i` reads in a source of `n` pixels padded by `before` in front: the
// source index, or -1 for the fill. torchvision's (torch.nn.functional.pad's) modes.
int padded_source(int i, int n, int before, PaddingMode mode) noexcept {
  int j = i - before;
  if (j >= 0 && j < n) return j;
  switch (mode) {
    case PaddingMode::constant: return -1;
    case PaddingMode::edge: return j < 0 ? 0 : n - 1;
    case PaddingMode::reflect: j = j < 0 ? -j : 2 * (n - 1) - j; break;
    case PaddingMode::symmetric: j = j < 0 ? -j - 1 : 2 * n - 1 - j; break;
  }
  return j >= 0 && j < n ? j : -1;
}

// A leading RandomCrop or CenterCrop: decodes the whole image at full size and hands each row
// of the box (in the padded image's coordinates) to `sink`, padding as the op says.
template <typename Sink, typename Finish>
void pad_crop_rows(const Recipe::Plan& plan, std::span<const std::byte> encoded,
                   const ImageInfo& info, const CropBox& box, Sink&& sink, Finish&& finish) {
  thread_local std::vector<std::uint8_t> pixels;
  thread_local std::vector<int> xs;
  thread_local std::vector<std::uint8_t> row;
  StageTimer decode(Stage::decode);
  const ImageView image = decode_into(encoded, pixels, 1);
  decode.stop();
  StageTimer transform(Stage::transform);
  // CenterCrop pads with zeros; its box already counts from the image's origin.
  const std::array<int, 4> pad =
      plan.center_only ? std::array<int, 4>{0, 0, 0, 0} : plan.pad.padding_for(info.height, info.width);
  const PaddingMode mode = plan.center_only ? PaddingMode::constant : plan.pad.padding_mode;
  if (mode == PaddingMode::reflect || mode == PaddingMode::symmetric) {
    const int reach = mode == PaddingMode::reflect ? 1 : 0;
    if (std::max(pad[0], pad[2]) + reach > image.width ||
        std::max(pad[1], pad[3]) + reach > image.height) {
      throw InvalidArgument("RandomCrop: " +
                            std::string(mode == PaddingMode::reflect ? "reflect" : "symmetric") +
                            " padding (" + std::to_string(pad[0]) + ", " + std::to_string(pad[1]) +
                            ", " + std::to_string(pad[2]) + ", " + std::to_string(pad[3]) +
                            ") needs an image larger than the padding, got " +
                            std::to_string(image.width) + "x" + std::to_string(image.height));
    }
  }
  const auto fill = plan.center_only ? std::array<std::uint8_t, 3>{} : plan.fill;
  xs.resize(static_cast<std::size_t>(box.width));
  for (int x = 0; x < box.width; ++x) {
    xs[static_cast<std::size_t>(x)] = padded_source(box.left + x, image.width, pad[0], mode);
  }
  row.resize(static_cast<std::size_t>(box.width) * 3);
  for (int y = 0; y < box.height; ++y) {
    const int sy = padded_source(box.top + y, image.height, pad[1], mode);
    for (int x = 0; x < box.width; ++x) {
      const int sx = xs[static_cast<std::size_t>(x)];
      std::uint8_t* out = row.data() + 3 * x;
      if (sy < 0 || sx < 0) {
        out[0] = fill[0];
        out[1] = fill[1];
        out[2] = fill[2];
      } else {
        std::memcpy(out, image.row(sy) + 3 * static_cast<std::ptrdiff_t>(sx), 3);
      }
    }
    sink(y, static_cast<const std::uint8_t*>(row.data()));
  }
  finish();
}

// 64 bits from the sample's generator: the seed of a Custom op's own Rng.
std::uint64_t draw_seed(at::Generator& gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

// Runs a user's op, turning what it throws into an error naming the op.
template <typename Fn>
void run_user_op(std::size_t k, const Custom& op, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    throw RuntimeError("Recipe: op " + std::to_string(k) + " (Custom '" + op.name +
                       "') failed: " + e.what());
  } catch (...) {
    throw RuntimeError("Recipe: op " + std::to_string(k) + " (Custom '" + op.name +
                       "') failed: it threw something that is not a std::exception");
  }
}

// The uint8 crop that ops needing the whole image work on, one per thread.
std::vector<std::uint8_t>& whole_crop() {
  thread_local std::vector<std::uint8_t> crop;
  return crop;
}

// Whether `step` gives the same pixels on a mirrored crop as the mirror of its result: ops that
// map each pixel alone, or by statistics of the whole crop that ignore order (ColorJitter's
// contrast and AutoContrast's extremes, Equalize's histogram; contrast's mean is an integer
// sum), and the other flips. Not the warps, nor Sharpness and the blur, whose float sums run
// over the neighbours in the other order when mirrored, nor a user's op.
bool commutes_with_hflip(const Recipe::Plan::Step& step, const std::vector<OpDraw>& draws) {
  using Kind = Recipe::Plan::Kind;
  switch (step.kind) {
    case Kind::hflip:
    case Kind::vflip:
    case Kind::gray:
    case Kind::jitter:
    case Kind::erase:
    case Kind::custom_float: return true;
    case Kind::augment:
      for (const AugmentStep& s : draws[step.op].augment) {
        switch (s.op) {
          case AugmentOp::Identity:
          case AugmentOp::Brightness:
          case AugmentOp::Color:
          case AugmentOp::Contrast:
          case AugmentOp::Posterize:
          case AugmentOp::Solarize:
          case AugmentOp::AutoContrast:
          case AugmentOp::Equalize:
          case AugmentOp::Invert: break;
          default: return false;
        }
      }
      return true;
    default: return false;
  }
}

// The leading geometry, handing each output row to `sink`, then calling `finish()` within the
// same transform span (one span per sample, as the fixed transforms record).
template <typename Sink, typename Finish>
void run_geometry(const Recipe::Plan& plan, std::span<const std::byte> encoded,
                  const ImageInfo& info, const RecipeParams& params, Sink&& sink,
                  Finish&& finish) {
  if (plan.random_crop) {
    detail::crop_rows(encoded, params.box, plan.out_height, plan.out_width,
                      params.scale_denominator, sink, finish);
  } else if (plan.pad_crop) {
    pad_crop_rows(plan, encoded, info, params.box, sink, finish);
  } else {
    const auto [rh, rw] = plan.resize.output_size(info.height, info.width);
    detail::resize_crop_rows(encoded, info, rh, rw, params.box, plan.dct_scaling, sink, finish);
  }
}

}  // namespace

Recipe::Recipe(std::initializer_list<RecipeOp> ops) : Recipe(std::vector<RecipeOp>(ops)) {}

Recipe::Recipe(std::vector<RecipeOp> ops) : plan_(detail::build_plan(std::move(ops))) {}

const std::vector<RecipeOp>& Recipe::ops() const noexcept { return plan_->ops; }
int Recipe::output_height() const noexcept { return plan_->out_height; }
int Recipe::output_width() const noexcept { return plan_->out_width; }
bool Recipe::dct_scaling() const noexcept { return plan_->dct_scaling; }

Recipe Recipe::with_dct_scaling(bool on) const {
  Recipe copy = *this;
  auto plan = std::make_shared<Plan>(*plan_);
  plan->dct_scaling = on;
  copy.plan_ = std::move(plan);
  return copy;
}

RecipeParams Recipe::sample(const ImageInfo& info, at::Generator& gen) const {
  const Plan& plan = *plan_;
  RecipeParams params;
  params.applied = plan.always;
  if (plan.random_crop) {
    params.box = plan.crop.get_params(info.height, info.width, gen);
    params.scale_denominator =
        plan.dct_scaling && info.format == ImageFormat::jpeg
            ? choose_jpeg_scale(params.box.width, params.box.height, plan.out_width,
                                plan.out_height)
            : 1;
  } else if (plan.pad_crop) {
    params.box = plan.center_only
                     ? center_crop_box(info.height, info.width, plan.out_height, plan.out_width)
                     : plan.pad.get_params(info.height, info.width, gen);
  } else {
    const auto [rh, rw] = plan.resize.output_size(info.height, info.width);
    params.box = plan.center ? center_crop_box(rh, rw, plan.crop_height, plan.crop_width)
                             : CropBox{0, 0, rh, rw};
  }
  if (plan.draws_values) params.draws.resize(plan.ops.size());
  for (const Plan::Step& step : plan.steps) {
    // Each random op draws `torch.rand(1) < p`, whatever p, as torchvision's do.
    const bool drawn =
        step.p >= 0.0 && detail::draw_unit(gen) < static_cast<float>(step.p);
    if (drawn) params.applied |= std::uint64_t{1} << step.op;
    switch (step.kind) {
      case Plan::Kind::jitter: params.draws[step.op].jitter = step.jitter.get_params(gen); break;
      case Plan::Kind::blur:
        params.draws[step.op].jitter.factor[0] = step.blur.get_params(gen);
        break;
      case Plan::Kind::augment: params.draws[step.op].augment = step.augment->draw(gen); break;
      case Plan::Kind::warp:
        params.draws[step.op].affine =
            detail::draw_warp(*step.warp, plan.out_height, plan.out_width, gen);
        break;
      case Plan::Kind::perspective:
        // torchvision draws the corners only where the op applies.
        if (drawn) {
          params.draws[step.op].corners =
              step.perspective->op.get_params(plan.out_height, plan.out_width, gen);
        }
        break;
      case Plan::Kind::augmix: {
        AugMix::Params drawn_mix = step.augment->draw_augmix(gen);
        OpDraw& d = params.draws[step.op];
        d.augment = std::move(drawn_mix.steps);
        d.weights = std::move(drawn_mix.weights);
        d.depths = std::move(drawn_mix.depths);
        break;
      }
      case Plan::Kind::custom:
      case Plan::Kind::custom_float: params.draws[step.op].seed = draw_seed(gen); break;
      case Plan::Kind::erase:
        if (drawn) {
          // Where no box fits in ten draws torchvision erases nothing.
          const auto box = step.erase.get_params(plan.out_height, plan.out_width, gen);
          if (box) {
            params.draws[step.op].box = *box;
          } else {
            params.applied &= ~(std::uint64_t{1} << step.op);
          }
        }
        break;
      default: break;
    }
  }
  return params;
}

void Recipe::apply(std::span<const std::byte> encoded, const ImageInfo& info,
                   const RecipeParams& params, float* dst) const {
  const Plan& plan = *plan_;
  bool hflip = false;
  bool vflip = false;
  int grays = 0;
  bool whole = false;  // an op that needs the whole crop applies
  bool erase = false;
  for (const Plan::Step& step : plan.steps) {
    if (!params.applies(step.op)) continue;
    switch (step.kind) {
      case Plan::Kind::hflip: hflip = !hflip; break;
      case Plan::Kind::vflip: vflip = !vflip; break;
      case Plan::Kind::gray: ++grays; break;
      case Plan::Kind::jitter:
      case Plan::Kind::blur:
      case Plan::Kind::warp:
      case Plan::Kind::perspective:
      case Plan::Kind::augmix:
      case Plan::Kind::custom: whole = true; break;
      // On the float output, after it is written.
      case Plan::Kind::erase:
      case Plan::Kind::custom_float: erase = true; break;
      case Plan::Kind::augment:
        // Only an op that changes pixels needs the crop whole.
        for (const AugmentStep& s : params.draws[step.op].augment) {
          whole = whole || s.op != AugmentOp::Identity;
        }
        break;
    }
  }
  if (whole) {
    apply_whole(encoded, info, params, erase, dst);
  } else {
    apply_rows(encoded, info, params, hflip, vflip, grays, erase, dst);
  }
}

void Recipe::apply_rows(std::span<const std::byte> encoded, const ImageInfo& info,
                        const RecipeParams& params, bool hflip, bool vflip, int grays,
                        bool erase, float* dst) const {
  const Plan& plan = *plan_;
  const int w = plan.out_width;
  const int h = plan.out_height;
  thread_local std::vector<std::uint8_t> gray;
  if (grays > 0) gray.resize(static_cast<std::size_t>(w) * 3);
  const auto sink = [&](int y, const std::uint8_t* row) {
    if (grays > 0) {
      detail::gray_row(row, gray.data(), w, grays);
      row = gray.data();
    }
    detail::normalize_row(plan.table, row, w, h, vflip ? h - 1 - y : y, hflip, dst);
  };
  run_geometry(plan, encoded, info, params, sink, [&] {
    if (erase) float_ops(params, dst);
  });
}

void Recipe::apply_whole(std::span<const std::byte> encoded, const ImageInfo& info,
                         const RecipeParams& params, bool erase, float* dst) const {
  const Plan& plan = *plan_;
  const int w = plan.out_width;
  const int h = plan.out_height;
  const std::size_t row_bytes = static_cast<std::size_t>(w) * 3;
  std::vector<std::uint8_t>& crop = whole_crop();
  crop.resize(row_bytes * static_cast<std::size_t>(h));
  const auto keep = [&](int y, const std::uint8_t* row) {
    std::memcpy(crop.data() + static_cast<std::size_t>(y) * row_bytes, row, row_bytes);
  };
  run_geometry(plan, encoded, info, params, keep, [&] { finish_whole(params, erase, dst); });
}

void Recipe::finish_whole(const RecipeParams& params, bool erase, float* dst) const {
  const Plan& plan = *plan_;
  const int w = plan.out_width;
  const int h = plan.out_height;
  const std::size_t row_bytes = static_cast<std::size_t>(w) * 3;
  std::vector<std::uint8_t>& crop = whole_crop();
  const detail::RgbSpan span{crop.data(), w, h};
  // A horizontal flip waits for the write (which mirrors each row as it goes) while the ops
  // after it commute with it to the bit, and is done in place before the first that does not.
  bool mirror = false;
  for (const Plan::Step& step : plan.steps) {
    if (!params.applies(step.op)) continue;
    if (step.kind == Plan::Kind::hflip) {
      mirror = !mirror;
      continue;
    }
    if (mirror && !commutes_with_hflip(step, params.draws)) {
      detail::hflip_inplace(span);
      mirror = false;
    }
    switch (step.kind) {
      case Plan::Kind::hflip: break;
      case Plan::Kind::vflip: detail::vflip_inplace(span); break;
      case Plan::Kind::gray: detail::grayscale_inplace(span); break;
      case Plan::Kind::jitter: detail::apply_jitter(span, params.draws[step.op].jitter); break;
      case Plan::Kind::blur: {
        const float sigma = params.draws[step.op].jitter.factor[0];
        detail::gaussian_blur(span, step.blur.kernel_x, step.blur.kernel_y, sigma, sigma);
        break;
      }
      case Plan::Kind::augment:
        for (const AugmentStep& s : params.draws[step.op].augment) {
          detail::apply_augment(span, s, step.augment->interpolation, step.augment->fill);
        }
        break;
      case Plan::Kind::warp: detail::apply_warp(span, *step.warp, params.draws[step.op].affine); break;
      case Plan::Kind::perspective:
        detail::warp_perspective(
            span,
            detail::perspective_coefficients(detail::perspective_startpoints(h, w),
                                             params.draws[step.op].corners),
            step.perspective->op.interpolation, step.perspective->fill);
        break;
      case Plan::Kind::augmix: {
        const OpDraw& d = params.draws[step.op];
        detail::apply_augmix(span, *step.augment, d.weights, d.depths, d.augment);
        break;
      }
      case Plan::Kind::custom: {
        ImageSpan image{crop.data(), w, h, 3, static_cast<std::ptrdiff_t>(row_bytes)};
        Rng rng(params.draws[step.op].seed);
        run_user_op(step.op, *step.custom, [&] { step.custom->on_pixels(image, rng); });
        break;
      }
      case Plan::Kind::erase:
      case Plan::Kind::custom_float: break;  // on the float output, after
    }
  }
  for (int y = 0; y < h; ++y) {
    detail::normalize_row(plan.table, crop.data() + static_cast<std::size_t>(y) * row_bytes,
                          w, h, y, mirror, dst);
  }
  if (erase) float_ops(params, dst);
}

void Recipe::float_ops(const RecipeParams& params, float* dst) const {
  const Plan& plan = *plan_;
  const std::size_t plane = static_cast<std::size_t>(plan.out_width) * plan.out_height;
  for (const Plan::Step& step : plan.steps) {
    if (!params.applies(step.op)) continue;
    if (step.kind == Plan::Kind::custom_float) {
      const at::Tensor image = at::from_blob(dst, {3, plan.out_height, plan.out_width}, at::kFloat);
      Rng rng(params.draws[step.op].seed);
      run_user_op(step.op, *step.custom, [&] { step.custom->on_float(image, rng); });
      continue;
    }
    if (step.kind != Plan::Kind::erase) continue;
    const CropBox& box = params.draws[step.op].box;
    for (std::size_t c = 0; c < 3; ++c) {
      for (int y = box.top; y < box.top + box.height; ++y) {
        float* row = dst + c * plane + static_cast<std::size_t>(y) * plan.out_width + box.left;
        std::fill(row, row + box.width, step.erase_value[c]);
      }
    }
  }
}

void Recipe::operator()(std::span<const std::byte> encoded, at::Generator& gen, float* dst) const {
  const ImageInfo info = peek(encoded);
  check_image_pixels(info.width, info.height);  // before anything is drawn or decoded
  apply(encoded, info, sample(info, gen), dst);
}

void Recipe::operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const {
  at::Generator gen = rng.torch_generator();
  (*this)(encoded, gen, dst);
}

at::Tensor Recipe::operator()(std::span<const std::byte> encoded, Rng& rng) const {
  at::Tensor out = at::empty({3, output_height(), output_width()}, at::kFloat);
  (*this)(encoded, rng, out.data_ptr<float>());
  return out;
}

}  // namespace coload::vision
