#pragma once
// vision tests: the float arithmetic of the reference's torch and torchvision, for the
// comparisons with warps. coload's warps follow the torch it links: the affine and perspective
// grids round as that torch's bmm does (GridForm: Debian's 1.13 plain, the 2.x wheels' MKL
// fused), and the perspective coefficients are solved in that torch's torchvision's precision
// (PerspectiveSolve: float32 before torchvision 0.18, float64 since). A comparison whose
// reference runs that same torch (tools/test against Debian's, CI's libtorch-2 stage against
// the venv's) checks that the reference's arithmetic is the one coload found, and changes
// nothing; one against another torch (the libtorch-2 build against Debian's python3) makes
// coload's warps follow the reference's arithmetic while it runs, so that nearest warps still
// compare exactly.

#include <array>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <torch/csrc/api/include/torch/version.h>

#include "image_test_support.hpp"
#include "vision/augment.hpp"

namespace coload::vision::test {

struct ReferenceArithmetic {
  bool known = false;  // the reference ran and its grid is one of coload's forms
  detail::GridForm grid = detail::GridForm::linked;  // grids above 66 pixels
  detail::PerspectiveSolve solve = detail::PerspectiveSolve::linked;
  std::string torch, torchvision;
  bool linked_torch = false;  // its torch is the version coload links
};

// "2.11.0+cu130" and "1.13.0a0" as {major, minor, patch}.
inline std::array<int, 3> version_numbers(const std::string& v) {
  std::array<int, 3> n{-1, -1, -1};
  std::sscanf(v.c_str(), "%d.%d.%d", &n[0], &n[1], &n[2]);
  return n;
}

inline const ReferenceArithmetic& reference_arithmetic() {
  static const ReferenceArithmetic arithmetic = [] {
    ReferenceArithmetic r;
    TempDir dir;
    // A shear of about 0.2 with a rotation: plain and fused differ on 763 of its 3840 values.
    const std::array<double, 6> m = {1.261f, 0.331f, -0.444f, 0.334f, 1.2f, 0.35f};
    constexpr int w = 48, h = 40;
    std::ostringstream command;
    command.precision(17);
    command << "arithmetic " << w << " " << h;
    for (double v : m) command << " " << v;
    command << " " << (dir / "grid").string() << " " << (dir / "info").string() << "\n";
    if (run_reference(dir, command.str()) != Reference::ok) return r;
    const auto raw = read_bytes(dir / "grid");
    std::vector<float> theirs(raw.size() / sizeof(float));
    std::memcpy(theirs.data(), raw.data(), theirs.size() * sizeof(float));
    const auto info = read_bytes(dir / "info");
    std::istringstream words(std::string(info.begin(), info.end()));
    words >> r.torch >> r.torchvision;
    std::vector<float> ours(2 * w * h);
    for (const auto form : {detail::GridForm::plain, detail::GridForm::fused}) {
      detail::affine_grid(m, w, h, form, ours.data());
      if (ours == theirs) {
        r.grid = form;
        r.known = true;
      }
    }
    const auto tv = version_numbers(r.torchvision);
    r.solve = tv[0] > 0 || tv[1] >= 18 ? detail::PerspectiveSolve::float64
                                       : detail::PerspectiveSolve::float32;
    r.linked_torch = version_numbers(r.torch) == version_numbers(TORCH_VERSION);
    return r;
  }();
  return arithmetic;
}

inline std::string grid_form_name(detail::GridForm f) {
  switch (f) {
    case detail::GridForm::plain: return "plain";
    case detail::GridForm::fused: return "fused";
    case detail::GridForm::aten: return "aten";
    default: return "linked";
  }
}

/// Within a comparing test case: coload's warps take the reference's arithmetic until the end
/// of the scope (nothing changes where the reference runs the linked torch, which it checks).
class FollowReference {
 public:
  FollowReference() {
    const ReferenceArithmetic& r = reference_arithmetic();
    REQUIRE_MESSAGE(r.known, "the reference's affine grid is neither plain nor fused");
    MESSAGE("reference torch " << r.torch << ", torchvision " << r.torchvision << ": grid "
                               << grid_form_name(r.grid) << "; coload links torch "
                               << TORCH_VERSION << ": grid "
                               << grid_form_name(detail::linked_grid_form(1 << 20)));
    if (r.linked_torch) {
      CHECK(r.grid == detail::linked_grid_form(1 << 20));
      CHECK(r.solve == detail::linked_perspective_solve());
    }
    grid_ = detail::set_grid_form(r.grid);
    solve_ = detail::set_perspective_solve(r.solve);
  }
  ~FollowReference() {
    detail::set_grid_form(grid_);
    detail::set_perspective_solve(solve_);
  }
  FollowReference(const FollowReference&) = delete;
  FollowReference& operator=(const FollowReference&) = delete;

 private:
  detail::GridForm grid_;
  detail::PerspectiveSolve solve_;
};

}  // namespace coload::vision::test
