#pragma once
// The augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment) as a recipe runs
// them, and their ops on the uint8 crop. Private to lib/vision: recipe_build.cpp checks a
// policy and keeps its AugmentPlan, recipe.cpp draws from it per sample and applies the drawn
// steps to the crop it keeps whole (augment.cpp, geometry.cpp).

#include <array>
#include <string>
#include <vector>

#include "coload/vision/recipe.hpp"

#include "image_ops.hpp"

namespace coload::vision::detail {

/// A policy, checked and with its magnitude bins computed for one image size (a recipe's
/// crop), so that a sample's draw only indexes them.
struct AugmentPlan {
  enum class Policy { trivial_wide, rand, autoaugment };
  Policy policy = Policy::trivial_wide;
  int num_ops = 1;
  int magnitude = 0;  // RandAugment's bin
  int bins = 31;
  Interpolation interpolation = Interpolation::nearest;
  std::vector<float> fill;  // empty: torchvision's None
  /// The op space in torchvision's dict order: each op's magnitudes (float32 values of
  /// torch.linspace and friends, computed with ATen as torchvision does; empty for an op
  /// without magnitude) and whether its sign is drawn.
  struct Entry {
    AugmentOp op;
    std::vector<double> magnitudes;
    bool is_signed;
  };
  std::vector<Entry> space;

  /// The steps `forward` draws, in torchvision's calls and order.
  std::vector<AugmentStep> draw(at::Generator& gen) const;
};

/// The plan of a policy for images of height × width; an empty `error` when its parameters are
/// good, else what is wrong (torchvision's wording where it has one).
AugmentPlan make_augment_plan(const TrivialAugmentWide& t, int height, int width,
                              std::string& error);
AugmentPlan make_augment_plan(const RandAugment& t, int height, int width, std::string& error);
AugmentPlan make_augment_plan(const AutoAugment& t, int height, int width, std::string& error);

/// A warp's fill as floats, checked as torchvision's tensor path checks it (one value or one
/// per channel) and within a uint8 image's values; `error` says what is wrong.
std::vector<float> checked_fill(const std::vector<double>& fill, std::string& error);

/// RandomRotation or RandomAffine, checked, as a recipe's step keeps it.
struct WarpPlan {
  bool rotation = true;
  RandomRotation rotate;
  RandomAffine affine;
  std::vector<float> fill;
};
/// The plan of a RandomRotation or RandomAffine; `error` says what is wrong with it (torchvision's
/// wording where it has one).
WarpPlan make_warp_plan(const RandomRotation& t, std::string& error);
WarpPlan make_warp_plan(const RandomAffine& t, std::string& error);
/// The op's draw as {angle, translate x, translate y, scale, shear x, shear y}.
std::array<double, 6> draw_warp(const WarpPlan& plan, int height, int width, at::Generator& gen);
/// The drawn warp applied in place (F.rotate or F.affine on the tensor).
void apply_warp(RgbSpan img, const WarpPlan& plan, const std::array<double, 6>& drawn);

/// `_apply_op` in place on packed RGB.
void apply_augment(RgbSpan img, const AugmentStep& step, Interpolation interpolation,
                   const std::vector<float>& fill);

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)` in double,
/// with center and translate relative to the image's centre (the tensor path's convention).
std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle,
                                            std::array<double, 2> translate, double scale,
                                            std::array<double, 2> shear);

/// `F_t.affine(img, matrix, interpolation, fill)` in place (the output has the input's size):
/// the float32 grid of `_gen_affine_grid`, sampled as grid_sample does (align_corners=False,
/// zeros padding), `fill` where the mask says outside, rounded back to uint8.
void warp_affine(RgbSpan img, const std::array<double, 6>& matrix, Interpolation interpolation,
                 const std::vector<float>& fill);

}  // namespace coload::vision::detail
