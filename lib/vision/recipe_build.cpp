// vision/recipe_build: a recipe's ops checked and turned into its plan (recipe_plan.hpp) once,
// when it is built, so that running it per sample decides nothing again. Kept apart from
// recipe.cpp, which runs the plan, so that each file stays one role.

#include "coload/vision/recipe.hpp"
#include "coload/core/error.hpp"

#include "image_ops.hpp"
#include "recipe_plan.hpp"

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace coload::vision {
// ---- Building a recipe --------------------------------------------------------------------


namespace {

const char* op_name(const RecipeOp& op) {
  static constexpr const char* names[] = {
      "RandomResizedCrop", "Resize",    "CenterCrop", "RandomHorizontalFlip",
      "RandomVerticalFlip", "Grayscale", "RandomGrayscale", "ToTensor", "ToDtype", "Normalize",
      "ColorJitter", "GaussianBlur", "RandomErasing", "RandomCrop", "MixUp", "CutMix",
      "RandomChoice", "TrivialAugmentWide", "RandAugment", "AutoAugment", "RandomRotation",
      "RandomAffine", "RandomPerspective", "AugMix", "Custom", "CustomBatch"};
  static_assert(std::size(names) == std::variant_size_v<RecipeOp>);
  return names[op.index()];
}

[[noreturn]] void refuse(std::size_t k, const RecipeOp& op, const std::string& why) {
  throw InvalidArgument("Recipe: op " + std::to_string(k) + " (" + detail::op_label(op) + "): " + why);
}

bool is_batch_op(const RecipeOp& op) noexcept {
  return std::holds_alternative<MixUp>(op) || std::holds_alternative<CutMix>(op) ||
         std::holds_alternative<RandomChoice>(op) || std::holds_alternative<CustomBatch>(op);
}

// A batch op runs on the collated batch, after every sample's ops: only batch ops may follow.
void check_batch_tail(std::size_t k, const std::vector<RecipeOp>& ops, bool is_float) {
  for (std::size_t j = k + 1; j < ops.size(); ++j) {
    if (!is_batch_op(ops[j])) {
      refuse(k, ops[k], "a batch op (MixUp, CutMix, RandomChoice of them, CustomBatch) runs on "
                        "the collated batch, so only batch ops may follow it (op " +
                            std::to_string(j) + " is " + detail::op_label(ops[j]) + ")");
    }
  }
  if (!is_float) refuse(k, ops[k], "mixes float batches: put ToDtype/ToTensor before it");
}

void check_p(std::size_t k, const RecipeOp& op, double p) {
  // NOTE: torchvision.transforms.v2's wording (_RandomApplyTransform); a NaN fails it too.
  if (!(p >= 0.0 && p <= 1.0)) {
    refuse(k, op, "`p` should be a floating point value in the interval [0.0, 1.0].");
  }
}

/// Whether `v` is a finite number float32 holds (ATen draws the recipe's ranges in float32).
bool finite_float(double v) noexcept {
  return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
}

/// Refuses a range with an end that is not a finite float32 number: the draws of every sample
/// would fail (ATen's "to is out of bounds for float"), each blamed on its image.
void check_finite(std::size_t k, const RecipeOp& op, const char* name,
                  const std::array<double, 2>& r) {
  if (!finite_float(r[0]) || !finite_float(r[1])) {
    refuse(k, op, std::string(name) + " must be finite float32 numbers, got (" +
                      detail::py_float(r[0]) + ", " + detail::py_float(r[1]) + ")");
  }
}

void check_jitter(std::size_t k, const RecipeOp& op, const ColorJitter& j) {
  const std::pair<const char*, double> values[] = {
      {"brightness", j.brightness}, {"contrast", j.contrast}, {"saturation", j.saturation},
      {"hue", j.hue}};
  for (const auto& [name, v] : values) {
    // NOTE: torchvision's _check_input wording, for its single-number form.
    if (!(v >= 0)) refuse(k, op, std::string("If ") + name + " is a single number, it must be non negative.");
    // Drawn as float32 by ATen's uniform_, which refuses bounds past float's range at every
    // sample (blamed on the image file, or skipped, every one).
    if (!finite_float(v)) {
      refuse(k, op, std::string(name) + " must be a finite float32 number, got " + detail::py_float(v));
    }
  }
  if (j.hue > 0.5) {
    refuse(k, op, "hue values should be between (-0.5, 0.5), but got [" + detail::py_float(-j.hue) + ", " +
                      detail::py_float(j.hue) + "].");
  }
}

std::array<float, 3> per_channel(std::size_t k, const RecipeOp& op, const std::vector<double>& v,
                                 const char* what) {
  if (v.size() != 1 && v.size() != 3) {
    refuse(k, op, std::string(what) +
                      " needs 1 or 3 values (one per channel of an RGB image), got " +
                      std::to_string(v.size()));
  }
  std::array<float, 3> out{};
  for (std::size_t c = 0; c < 3; ++c) out[c] = static_cast<float>(v[v.size() == 1 ? 0 : c]);
  return out;
}

}  // namespace

std::string detail::op_label(const RecipeOp& op) {
  if (const auto* c = std::get_if<Custom>(&op)) return "Custom '" + c->name + "'";
  if (const auto* c = std::get_if<CustomBatch>(&op)) return "CustomBatch '" + c->name + "'";
  return op_name(op);
}

std::shared_ptr<Recipe::Plan> detail::build_plan(std::vector<RecipeOp> ops) {
  auto plan = std::make_shared<Recipe::Plan>();
  using Kind = Recipe::Plan::Kind;
  if (ops.empty()) {
    throw InvalidArgument("Recipe: no ops; a recipe starts with RandomResizedCrop or Resize");
  }
  std::size_t k = 0;
  const auto bit = [](std::size_t i) { return std::uint64_t{1} << i; };
  if (ops.size() > 64) {
    throw InvalidArgument(std::string("Recipe: ") + std::to_string(ops.size()) + " ops; at most 64");
  }
  // The leading geometry.
  if (const auto* rrc = std::get_if<RandomResizedCrop>(&ops[0])) {
    if (rrc->height <= 0 || rrc->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(rrc->height) + "x" +
                            std::to_string(rrc->width));
    }
    if (rrc->scale[0] > rrc->scale[1] || rrc->ratio[0] > rrc->ratio[1]) {
      refuse(0, ops[0], "Scale and ratio should be of kind (min, max)");
    }
    if (!(rrc->scale[0] >= 0.0) || !(rrc->ratio[0] > 0.0)) {
      refuse(0, ops[0], "scale must be non-negative and ratio positive");
    }
    check_finite(0, ops[0], "scale", rrc->scale);
    check_finite(0, ops[0], "ratio", rrc->ratio);
    // Its log is drawn from: a ratio that rounds to float32's 0 (1e-50) gives -inf.
    if (rrc->ratio[0] < std::numeric_limits<float>::min()) {
      refuse(0, ops[0], "ratio must be at least float32's smallest normal number, got " +
                            detail::py_float(rrc->ratio[0]));
    }
    plan->random_crop = true;
    plan->crop = *rrc;
    plan->out_height = rrc->height;
    plan->out_width = rrc->width > 0 ? rrc->width : rrc->height;
    plan->always |= bit(0);
    k = 1;
  } else if (const auto* resize = std::get_if<Resize>(&ops[0])) {
    if (resize->size <= 0 || resize->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(resize->size) +
                            (resize->width > 0 ? std::string("x") + std::to_string(resize->width) : ""));
    }
    plan->resize = *resize;
    plan->always |= bit(0);
    k = 1;
    if (k < ops.size()) {
      if (const auto* cc = std::get_if<CenterCrop>(&ops[k])) {
        const int ch = cc->height;
        const int cw = cc->width > 0 ? cc->width : cc->height;
        if (ch <= 0 || cc->width < 0) {
          refuse(k, ops[k], std::string("size must be positive, got ") + std::to_string(ch) + "x" +
                                std::to_string(cw));
        }
        // NOTE: a crop larger than the resized image is zero-padded by torchvision; the fused
        // path computes only pixels inside the resized image, so it refuses such a recipe.
        const bool fits = resize->width > 0 ? ch <= resize->size && cw <= resize->width
                                            : ch <= resize->size && cw <= resize->size;
        if (!fits) {
          refuse(k, ops[k], "a centre crop larger than the resized image (which torchvision "
                            "pads with zeros) is not supported in a recipe yet");
        }
        plan->center = true;
        plan->crop_height = ch;
        plan->crop_width = cw;
        plan->always |= bit(k);
        ++k;
      }
    }
    if (!plan->center && resize->width == 0) {
      refuse(0, ops[0], std::string("Resize(") + std::to_string(resize->size) +
                            ") keeps each image's aspect ratio, so samples would differ in size: "
                            "follow it with CenterCrop, or give Resize a height and a width");
    }
    plan->out_height = plan->center ? plan->crop_height : resize->size;
    plan->out_width = plan->center ? plan->crop_width : resize->width;
  } else if (const auto* rc = std::get_if<RandomCrop>(&ops[0])) {
    if (rc->height <= 0 || rc->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(rc->height) +
                            "x" + std::to_string(rc->width));
    }
    for (const int p : rc->padding) {
      if (p < 0) refuse(0, ops[0], "padding must be non-negative, got " + std::to_string(p));
    }
    if (rc->fill.size() != 1 && rc->fill.size() != 3) {
      refuse(0, ops[0], "fill needs 1 or 3 values (one per channel of an RGB image), got " +
                            std::to_string(rc->fill.size()));
    }
    for (std::size_t c = 0; c < 3; ++c) {
      const double f = rc->fill[rc->fill.size() == 1 ? 0 : c];
      if (!(f >= 0 && f <= 255)) {
        refuse(0, ops[0], "fill values of a uint8 image lie in [0, 255], got " + detail::py_float(f));
      }
      plan->fill[c] = static_cast<std::uint8_t>(f);
    }
    plan->pad_crop = true;
    plan->pad = *rc;
    plan->out_height = rc->height;
    plan->out_width = rc->width > 0 ? rc->width : rc->height;
    plan->always |= bit(0);
    k = 1;
  } else if (const auto* cc = std::get_if<CenterCrop>(&ops[0])) {
    if (cc->height <= 0 || cc->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(cc->height) +
                            "x" + std::to_string(cc->width));
    }
    plan->pad_crop = true;
    plan->center_only = true;
    plan->out_height = cc->height;
    plan->out_width = cc->width > 0 ? cc->width : cc->height;
    plan->always |= bit(0);
    k = 1;
  } else {
    refuse(0, ops[0], "a recipe starts with its geometry (RandomResizedCrop, RandomCrop, "
                      "CenterCrop, or Resize and then CenterCrop), which the fused pipeline folds "
                      "into the decode");
  }
  // A side past 16384 pixels: the warps' offsets (row x width x 3, in int) and the padded
  // sizes would overflow, and a sample would take gigabytes.
  constexpr int max_side = 16384;
  if (plan->out_height > max_side || plan->out_width > max_side) {
    refuse(0, ops[0], "the output size " + std::to_string(plan->out_height) + "x" +
                          std::to_string(plan->out_width) + " is over " + std::to_string(max_side) +
                          " pixels a side");
  }
  if (plan->pad_crop && !plan->center_only) {
    for (const int p : plan->pad.padding) {
      if (p > max_side) {
        refuse(0, ops[0], "padding must be at most " + std::to_string(max_side) + ", got " +
                              std::to_string(p));
      }
    }
  }
  // The ops on the crop, then the conversion to float and the normalisations.
  bool is_float = false;
  // ToTensor divides by 255 (torchvision's, every version); transforms.v2's ToDtype(float32,
  // scale=True) multiplies by 1/255 in float32 instead (`to(dtype).mul_(1.0 / 255)`), one step
  // apart in about 40% of values.
  enum class Scale { none, divide, multiply } scale = Scale::none;
  bool erased = false;
  const Custom* float_custom = nullptr;  // the first user op on the float output
  std::vector<std::pair<std::array<float, 3>, std::array<float, 3>>> norms;
  for (; k < ops.size(); ++k) {
    const RecipeOp& op = ops[k];
    // An op that always applies and draws values of its own (a policy, a warp).
    const auto add_drawing_step = [&](Recipe::Plan::Step step) {
      plan->steps.push_back(std::move(step));
      plan->always |= bit(k);
      plan->draws_values = true;
    };
    const auto uint8_only = [&] {
      if (is_float) {
        refuse(k, op, "comes after the conversion to float; the fused pipeline runs it on uint8 "
                      "pixels only, so put it before ToDtype/ToTensor");
      }
    };
    // The flips are done on the uint8 crop, or as the float output is written: before the ops
    // on the float output, wherever they stand. After one of those, torchvision's flip would
    // mirror what it did (the erased box), this one would not.
    const auto before_float_ops = [&] {
      if (erased || float_custom) {
        refuse(k, op, std::string("a flip after ") +
                          (erased ? "RandomErasing" : "a Custom op on the float output") +
                          " is not supported in a recipe yet: the fused pipeline flips before "
                          "the ops on the float output, so put it before them");
      }
    };
    if (const auto* f = std::get_if<RandomHorizontalFlip>(&op)) {
      check_p(k, op, f->p);
      before_float_ops();
      plan->steps.push_back({Kind::hflip, f->p, k});
    } else if (const auto* v = std::get_if<RandomVerticalFlip>(&op)) {
      check_p(k, op, v->p);
      before_float_ops();
      plan->steps.push_back({Kind::vflip, v->p, k});
    } else if (const auto* g = std::get_if<Grayscale>(&op)) {
      if (g->num_output_channels != 1 && g->num_output_channels != 3) {
        refuse(k, op, "num_output_channels should be either 1 or 3");
      }
      if (g->num_output_channels == 1) {
        refuse(k, op, "Grayscale(num_output_channels=1) makes one channel, but a recipe's batch "
                      "has three: use Grayscale(num_output_channels=3)");
      }
      uint8_only();
      plan->steps.push_back({Kind::gray, -1.0, k});
      plan->always |= bit(k);
    } else if (const auto* rg = std::get_if<RandomGrayscale>(&op)) {
      check_p(k, op, rg->p);
      uint8_only();
      plan->steps.push_back({Kind::gray, rg->p, k});
    } else if (std::holds_alternative<ToTensor>(op)) {
      if (!is_float) scale = Scale::divide;
      is_float = true;
      plan->always |= bit(k);
    } else if (const auto* t = std::get_if<ToDtype>(&op)) {
      if (t->dtype != at::kFloat) {
        refuse(k, op, std::string("the fused pipeline writes float32; ToDtype to ") +
                          c10::toString(t->dtype) + " is not supported in a recipe yet");
      }
      // float32 to float32 changes nothing, scaled or not (torchvision rescales only between
      // integer and floating dtypes).
      if (!is_float) scale = t->scale ? Scale::multiply : Scale::none;
      is_float = true;
      plan->always |= bit(k);
    } else if (const auto* n = std::get_if<Normalize>(&op)) {
      if (!is_float) {
        // NOTE: torchvision's F.normalize wording for a uint8 tensor.
        refuse(k, op, "Input tensor should be a float tensor. Got torch.uint8.");
      }
      if (erased) {
        refuse(k, op, "Normalize after RandomErasing is not supported in a recipe yet: erase "
                      "after normalising, as torchvision's reference recipes do");
      }
      if (float_custom) {
        refuse(k, op, "Normalize after Custom '" + float_custom->name + "' (an op on the float "
                      "output) is not supported in a recipe: Normalize runs as the float "
                      "conversion's table, so put the op after every Normalize");
      }
      const auto mean = per_channel(k, op, n->mean, "mean");
      const auto std_dev = per_channel(k, op, n->std_dev, "std");
      for (float s : std_dev) {
        if (s == 0.0f) {
          refuse(k, op, "std evaluated to zero after conversion to torch.float32, leading to "
                        "division by zero.");
        }
      }
      norms.emplace_back(mean, std_dev);
      plan->always |= bit(k);
    } else if (const auto* j = std::get_if<ColorJitter>(&op)) {
      check_jitter(k, op, *j);
      uint8_only();
      plan->steps.push_back({Kind::jitter, -1.0, k, *j});
      plan->always |= bit(k);
      plan->draws_values = true;
    } else if (const auto* b = std::get_if<GaussianBlur>(&op)) {
      const int ky = b->kernel_y > 0 ? b->kernel_y : b->kernel_x;
      if (b->kernel_x <= 0 || b->kernel_x % 2 == 0 || b->kernel_y < 0 ||
          (b->kernel_y > 0 && b->kernel_y % 2 == 0)) {
        refuse(k, op, "Kernel size value should be an odd and positive number.");
      }
      if (!(0.0 < b->sigma[0] && b->sigma[0] <= b->sigma[1])) {
        refuse(k, op, "sigma values should be positive and of the form (min, max).");
      }
      check_finite(k, op, "sigma", b->sigma);
      if (b->kernel_x / 2 >= plan->out_width || ky / 2 >= plan->out_height) {
        refuse(k, op, "the kernel's half (" + std::to_string(b->kernel_x / 2) + "x" +
                          std::to_string(ky / 2) + ", torchvision's reflect padding) must be "
                          "smaller than the image it blurs (" + std::to_string(plan->out_width) +
                          "x" + std::to_string(plan->out_height) + ")");
      }
      uint8_only();
      Recipe::Plan::Step step{Kind::blur, -1.0, k};
      step.blur = *b;
      step.blur.kernel_y = ky;
      plan->steps.push_back(step);
      plan->always |= bit(k);
      plan->draws_values = true;
    } else if (const auto* e = std::get_if<RandomErasing>(&op)) {
      // NOTE: torchvision's RandomErasing wording; it only warns for a reversed range.
      if (!(e->p >= 0.0 && e->p <= 1.0)) {
        refuse(k, op, "Random erasing probability should be between 0 and 1");
      }
      if (e->scale[0] > e->scale[1] || e->ratio[0] > e->ratio[1]) {
        refuse(k, op, "Scale and ratio should be of kind (min, max)");
      }
      if (!(e->scale[0] >= 0.0) || !(e->scale[1] <= 1.0)) {  // NaN too
        refuse(k, op, "Scale should be between 0 and 1");
      }
      if (!(e->ratio[0] > 0.0)) refuse(k, op, "ratio must be positive");
      check_finite(k, op, "ratio", e->ratio);
      if (e->ratio[0] < std::numeric_limits<float>::min()) {
        refuse(k, op, "ratio must be at least float32's smallest normal number, got " +
                          detail::py_float(e->ratio[0]));
      }
      if (e->value.size() != 1 && e->value.size() != 3) {
        refuse(k, op, "If value is a sequence, it should have either a single value or 3 (number "
                      "of input channels)");
      }
      if (!is_float) {
        refuse(k, op, "erasing uint8 pixels is not supported in a recipe yet: put it after "
                      "ToDtype/ToTensor");
      }
      Recipe::Plan::Step step{Kind::erase, e->p, k};
      step.erase = *e;
      for (std::size_t c = 0; c < 3; ++c) {
        step.erase_value[c] = static_cast<float>(e->value[e->value.size() == 1 ? 0 : c]);
      }
      plan->steps.push_back(step);
      plan->draws_values = true;
      erased = true;
    } else if (std::holds_alternative<TrivialAugmentWide>(op) ||
               std::holds_alternative<RandAugment>(op) || std::holds_alternative<AutoAugment>(op)) {
      uint8_only();
      if (erased) refuse(k, op, "runs on the uint8 crop, so it comes before RandomErasing");
      std::string error;
      auto augment = std::make_shared<detail::AugmentPlan>(std::visit(
          [&](const auto& t) -> detail::AugmentPlan {
            using T = std::decay_t<decltype(t)>;
            if constexpr (std::is_same_v<T, TrivialAugmentWide> || std::is_same_v<T, RandAugment> ||
                          std::is_same_v<T, AutoAugment>) {
              return detail::make_augment_plan(t, plan->out_height, plan->out_width, error);
            } else {
              return {};
            }
          },
          op));
      if (!error.empty()) refuse(k, op, error);
      Recipe::Plan::Step step{Kind::augment, -1.0, k};
      step.augment = std::move(augment);
      add_drawing_step(std::move(step));
    } else if (std::holds_alternative<RandomRotation>(op) ||
               std::holds_alternative<RandomAffine>(op)) {
      uint8_only();
      std::string error;
      auto warp = std::make_shared<detail::WarpPlan>(
          std::holds_alternative<RandomRotation>(op)
              ? detail::make_warp_plan(std::get<RandomRotation>(op), error)
              : detail::make_warp_plan(std::get<RandomAffine>(op), error));
      if (!error.empty()) refuse(k, op, error);
      Recipe::Plan::Step step{Kind::warp, -1.0, k};
      step.warp = std::move(warp);
      add_drawing_step(std::move(step));
    } else if (const auto* rp = std::get_if<RandomPerspective>(&op)) {
      check_p(k, op, rp->p);
      uint8_only();
      std::string error;
      auto perspective = std::make_shared<detail::PerspectivePlan>(detail::make_perspective_plan(*rp, error));
      if (!error.empty()) refuse(k, op, error);
      Recipe::Plan::Step step{Kind::perspective, rp->p, k};
      step.perspective = std::move(perspective);
      plan->steps.push_back(std::move(step));
      plan->draws_values = true;
    } else if (const auto* am = std::get_if<AugMix>(&op)) {
      uint8_only();
      std::string error;
      auto augment = std::make_shared<detail::AugmentPlan>(
          detail::make_augment_plan(*am, plan->out_height, plan->out_width, error));
      if (!error.empty()) refuse(k, op, error);
      Recipe::Plan::Step step{Kind::augmix, -1.0, k};
      step.augment = std::move(augment);
      add_drawing_step(std::move(step));
    } else if (const auto* c = std::get_if<Custom>(&op)) {
      if (c->name.empty()) refuse(k, op, "a Custom op needs a name (its errors are named by it)");
      if (!c->on_pixels && !c->on_float) refuse(k, op, "the callable is empty (null)");
      if (c->on_pixels && c->on_float) {
        refuse(k, op, "give it one callable: on the uint8 crop or on the float output");
      }
      if (c->on_pixels && is_float) {
        refuse(k, op, "its callable takes the uint8 crop (ImageSpan), but it comes after the "
                      "conversion to float: put it before ToDtype/ToTensor, or give it a "
                      "callable on the float output (const at::Tensor&)");
      }
      if (c->on_float && !is_float) {
        refuse(k, op, "its callable takes the float output (const at::Tensor&), but it comes "
                      "before the conversion to float: put it after ToDtype/ToTensor and every "
                      "Normalize, or give it a callable on the uint8 crop (ImageSpan&)");
      }
      Recipe::Plan::Step step{c->on_pixels ? Kind::custom : Kind::custom_float, -1.0, k};
      step.custom = std::make_shared<const Custom>(*c);
      if (c->on_float && !float_custom) float_custom = step.custom.get();
      add_drawing_step(std::move(step));
    } else if (const auto* cb = std::get_if<CustomBatch>(&op)) {
      if (cb->name.empty()) refuse(k, op, "a CustomBatch op needs a name (its errors are named by it)");
      if (!cb->fn) refuse(k, op, "the callable is empty (null)");
      check_batch_tail(k, ops, is_float);
      plan->batch_steps.push_back({k, std::make_shared<const CustomBatch>(*cb)});
    } else if (std::holds_alternative<MixUp>(op) || std::holds_alternative<CutMix>(op) ||
               std::holds_alternative<RandomChoice>(op)) {
      check_batch_tail(k, ops, is_float);
      if (!plan->batch_ops.empty()) {
        refuse(k, op, "a recipe has at most one MixUp/CutMix op: use RandomChoice to pick one "
                      "per batch");
      }
      std::vector<std::variant<MixUp, CutMix>> choices;
      if (const auto* m = std::get_if<MixUp>(&op)) choices.emplace_back(*m);
      if (const auto* c = std::get_if<CutMix>(&op)) choices.emplace_back(*c);
      if (const auto* rc = std::get_if<RandomChoice>(&op)) {
        if (rc->transforms.empty()) refuse(k, op, "no transforms to choose from");
        if (!rc->p.empty() && rc->p.size() != rc->transforms.size()) {
          refuse(k, op, "Length of p doesn't match the number of transforms: " +
                            std::to_string(rc->p.size()) + " != " +
                            std::to_string(rc->transforms.size()));
        }
        double sum = 0;
        for (double w : rc->p) {
          if (!(w >= 0)) refuse(k, op, "p's weights must be non-negative");
          if (!std::isfinite(w)) refuse(k, op, "p's weights must be finite, got " + detail::py_float(w));
          sum += w;
        }
        // Normalised by their sum for each batch's draw: a sum of 0 (or inf) made every
        // batch's multinomial fail. torchvision's RandomChoice divides by it when made.
        if (!rc->p.empty() && !(sum > 0 && std::isfinite(sum))) {
          refuse(k, op, "p's weights must have a positive, finite sum, got " + detail::py_float(sum));
        }
        choices = rc->transforms;
        plan->batch_p = rc->p.empty() ? std::vector<double>(choices.size(), 1.0) : rc->p;
      }
      for (const auto& choice : choices) {
        const double alpha = std::visit([](const auto& m) { return m.alpha; }, choice);
        const int classes = std::visit([](const auto& m) { return m.num_classes; }, choice);
        if (!(alpha > 0)) refuse(k, op, "alpha must be greater than 0, got " + detail::py_float(alpha));
        // Beta(inf, inf) drew lam = 0 for every batch: each silently swapped for its neighbour.
        if (!std::isfinite(alpha)) refuse(k, op, "alpha must be finite, got " + detail::py_float(alpha));
        if (classes < 0) {
          refuse(k, op, "num_classes must be positive (or 0 for the pipeline's class count), "
                        "got " + std::to_string(classes));
        }
      }
      plan->batch_ops = std::move(choices);
      plan->batch_steps.push_back({k, nullptr});
    } else {
      refuse(k, op, "a geometric op after the recipe's leading geometry is not supported in a "
                    "recipe yet");
    }
  }
  if (!is_float) {
    throw InvalidArgument("Recipe: the fused pipeline writes float32 batches: add "
                          "ToDtype(float32, scale=true) or ToTensor after the uint8 ops");
  }
  // One table maps each channel's uint8 value to its final float, computed with torchvision's
  // float32 operations in its order: the scale, then each Normalize's subtract and divide.
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v);
      if (scale == Scale::divide) x = x / 255.0f;
      if (scale == Scale::multiply) x = x * static_cast<float>(1.0 / 255.0);
      for (const auto& [mean, std_dev] : norms) {
        x = (x - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)];
      }
      plan->table.value[c][v] = x;
    }
  }
  plan->table.update_planes();
  plan->ops = std::move(ops);
  return plan;
}

}  // namespace coload::vision
