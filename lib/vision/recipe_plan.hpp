#pragma once
// Recipe::Plan, a recipe's built form: private to lib/vision (recipe.cpp builds and runs it,
// batch_mix.cpp reads its batch op).

#include "coload/vision/recipe.hpp"

#include "augment.hpp"
#include "fused.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace coload::vision {

struct Recipe::Plan {
  std::vector<RecipeOp> ops;
  // The leading geometry: RandomResizedCrop, or Resize (then CenterCrop).
  bool random_crop = false;
  RandomResizedCrop crop;
  // A leading RandomCrop, or a CenterCrop alone: the full-size image padded and cropped.
  bool pad_crop = false;
  bool center_only = false;
  RandomCrop pad;
  std::array<std::uint8_t, 3> fill{};
  Resize resize;
  bool center = false;
  int crop_height = 0;
  int crop_width = 0;
  int out_height = 0;
  int out_width = 0;
  // The ops after the geometry, in order: uint8 ops on the crop, then RandomErasing on the
  // float output. Flips and grayscale commute (one moves pixels, the other maps each pixel
  // alone), so without a whole-crop op a sample needs only each kind's count.
  // custom: a user's op on the uint8 crop; custom_float: on the float output (in order with
  // RandomErasing).
  enum class Kind {
    hflip, vflip, gray, jitter, blur, erase, augment, warp, perspective, augmix, custom,
    custom_float
  };
  struct Step {
    Kind kind;
    double p;     // < 0 for an op that always applies
    std::size_t op;
    ColorJitter jitter{};
    GaussianBlur blur{};
    RandomErasing erase{};
    std::array<float, 3> erase_value{};
    // An augmentation policy, with its bins for the recipe's crop size.
    std::shared_ptr<const detail::AugmentPlan> augment{};
    // RandomRotation or RandomAffine.
    std::shared_ptr<const detail::WarpPlan> warp{};
    std::shared_ptr<const detail::PerspectivePlan> perspective{};
    // A user's op (Custom).
    std::shared_ptr<const Custom> custom{};
  };
  std::vector<Step> steps;
  bool draws_values = false;  // an op that draws values (ColorJitter, ...): params.draws
  std::uint64_t always = 0;  // the ops that apply to every sample
  detail::NormalizeTable table;
  bool dct_scaling = true;
  // The batch op (MixUp, CutMix, or a RandomChoice of them), run on the collated batch.
  std::vector<std::variant<MixUp, CutMix>> batch_ops;
  std::vector<double> batch_p;  // RandomChoice's weights; empty without a RandomChoice
  // The recipe's tail of batch ops in order: the MixUp/CutMix op (custom null) or a CustomBatch.
  struct BatchStep {
    std::size_t op;
    std::shared_ptr<const CustomBatch> custom;
  };
  std::vector<BatchStep> batch_steps;
};

namespace detail {
/// Checks `ops` and builds their plan (recipe_build.cpp); std::invalid_argument naming the op
/// and its parameter.
std::shared_ptr<Recipe::Plan> build_plan(std::vector<RecipeOp> ops);
/// An op's name as errors give it: torchvision's name, or `Custom 'name'`.
std::string op_label(const RecipeOp& op);
}  // namespace detail

}  // namespace coload::vision
