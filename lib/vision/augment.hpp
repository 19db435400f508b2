#pragma once
// The augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment) as a recipe runs
// them, and their ops on the uint8 crop. Private to lib/vision: recipe_build.cpp checks a
// policy and keeps its AugmentPlan, recipe.cpp draws from it per sample and applies the drawn
// steps to the crop it keeps whole (augment.cpp, geometry.cpp).

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "coload/vision/recipe.hpp"

#include "image_ops.hpp"

namespace coload::vision::detail {

/// A policy, checked and with its magnitude bins computed for one image size (a recipe's
/// crop), so that a sample's draw only indexes them.
struct AugmentPlan {
  enum class Policy { trivial_wide, rand, autoaugment, augmix };
  Policy policy = Policy::trivial_wide;
  int num_ops = 1;
  int magnitude = 0;  // RandAugment's bin
  // AugMix's: bins 0 .. severity - 1 of 10, the chains, the Dirichlet's concentration.
  int severity = 3;
  int mixture_width = 3;
  int chain_depth = -1;
  float alpha = 1.0f;
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

  /// The steps `forward` draws, in torchvision's calls and order (not for AugMix).
  std::vector<AugmentStep> draw(at::Generator& gen) const;
  /// AugMix's draws, in torchvision's calls and order.
  AugMix::Params draw_augmix(at::Generator& gen) const;
};

/// The plan of a policy for images of height × width; an empty `error` when its parameters are
/// good, else what is wrong (torchvision's wording where it has one).
AugmentPlan make_augment_plan(const TrivialAugmentWide& t, int height, int width,
                              std::string& error);
AugmentPlan make_augment_plan(const RandAugment& t, int height, int width, std::string& error);
AugmentPlan make_augment_plan(const AutoAugment& t, int height, int width, std::string& error);
AugmentPlan make_augment_plan(const AugMix& t, int height, int width, std::string& error);

/// AugMix on the crop in place: `weights` (m0, then one per chain), `depths` (ops per chain),
/// `steps` (the chains' ops one after another), as AugMix::Params holds them.
void apply_augmix(RgbSpan img, const AugmentPlan& plan, const std::vector<float>& weights,
                  const std::vector<int>& depths, const std::vector<AugmentStep>& steps);

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

/// RandomPerspective, checked, as a recipe's step keeps it.
struct PerspectivePlan {
  RandomPerspective op;
  std::vector<float> fill;
};
/// The plan of a RandomPerspective; `error` says what is wrong with it (torchvision's wording).
PerspectivePlan make_perspective_plan(const RandomPerspective& t, std::string& error);
/// The start points of an image of height × width: its corners.
RandomPerspective::Corners perspective_startpoints(int height, int width) noexcept;
/// The precision `_get_perspective_coeffs` solves its system in: float32 up to torchvision
/// 0.17, float64 (then float32) from 0.18 on (pytorch/vision#8249). coload follows the
/// torchvision of the linked torch (0.18 came with torch 2.3): linked_perspective_solve.
enum class PerspectiveSolve { linked, float32, float64 };
PerspectiveSolve linked_perspective_solve() noexcept;
/// For tests, which compare with another torchvision: the precision perspective_coefficients
/// solves in (linked: the linked torch's torchvision's again); returns the previous one.
PerspectiveSolve set_perspective_solve(PerspectiveSolve solve) noexcept;
/// `_get_perspective_coeffs(startpoints, endpoints)` through torch.linalg.lstsq ("gels") in the
/// precision above, as float32.
std::array<float, 8> perspective_coefficients(const RandomPerspective::Corners& startpoints,
                                              const RandomPerspective::Corners& endpoints);
/// `F_t.perspective(img, coeffs, interpolation, fill)` in place.
void warp_perspective(RgbSpan img, const std::array<float, 8>& coeffs,
                      Interpolation interpolation, const std::vector<float>& fill);

/// `_apply_op` in place on packed RGB.
void apply_augment(RgbSpan img, const AugmentStep& step, Interpolation interpolation,
                   const std::vector<float>& fill);

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)` in double,
/// with center and translate relative to the image's centre (the tensor path's convention).
std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle,
                                            std::array<double, 2> translate, double scale,
                                            std::array<double, 2> shear);

/// How a warp's float32 grid is rounded. torchvision makes it with one bmm of the base grid
/// [pixels, 3] by theta [3, 2], and the linked libtorch decides that bmm's arithmetic: torch's
/// own loop, `(x · t0 + y · t1) + t2` rounded at each step (below 400 products, and wherever
/// the BLAS is generic, as in Debian's torch 1.13), or MKL's sgemm on a CPU with FMA (the torch
/// 2.x wheels), `fma(y, t1, x · t0) + t2`. Measured over 8.9 million grid values and 4.4 million
/// nearest samples; ATEN_CPU_CAPABILITY does not change it, MKL_CBWR=COMPATIBLE or an MKL
/// without FMA gives the plain form.
enum class GridForm {
  linked,  // what the linked libtorch computes (linked_grid_form); the default
  plain,   // (x · t0 + y · t1) + t2
  fused,   // fma(y, t1, x · t0) + t2
  aten,    // at::bmm itself, as torchvision calls it, per image
};
/// The form the linked libtorch's bmm takes for a grid of `pixels` output pixels: probed once
/// per process against at::bmm (plain or fused where one of them is its arithmetic, else aten).
GridForm linked_grid_form(std::size_t pixels);
/// For tests, which compare with a torch other than the linked one: grids above torch's 400
/// products take `form` (linked: the linked torch's again), smaller ones stay plain (torch's own
/// loop in every version). Returns the previous form. Not while other threads warp.
GridForm set_grid_form(GridForm form) noexcept;
/// `_gen_affine_grid(theta, w, h, w, h)` of `matrix` in `form`: 2 · width · height floats, x and
/// y of each output pixel, row by row (what the warps sample).
void affine_grid(const std::array<double, 6>& matrix, int width, int height, GridForm form,
                 float* out);

/// `F_t.affine(img, matrix, interpolation, fill)` in place (the output has the input's size):
/// the float32 grid of `_gen_affine_grid`, sampled as grid_sample does (align_corners=False,
/// zeros padding), `fill` where the mask says outside, rounded back to uint8.
void warp_affine(RgbSpan img, const std::array<double, 6>& matrix, Interpolation interpolation,
                 const std::vector<float>& fill);

}  // namespace coload::vision::detail
