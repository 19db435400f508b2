// vision/geometry: the affine warp of torchvision's tensor path (F.affine, F.rotate), on packed
// uint8 RGB, for the augmentation policies' ShearX/Y, TranslateX/Y and Rotate, RandomAffine and
// RandomRotation, and the perspective warp (F.perspective) of RandomPerspective.
//
// torchvision builds a float32 grid (`_gen_affine_grid`: the output's pixel centres times the
// inverse matrix rescaled by half the size, one bmm) and samples it with grid_sample
// (align_corners False, zeros padding); a fill goes through a mask channel sampled alike.
// Nearest sampling picks the source pixel by rounding a float32 coordinate, so equality with
// torchvision needs its float32 arithmetic to the bit, and that bmm's arithmetic is the linked
// libtorch's: `(x · a0 + y · a1) + a2` rounded at each step (torch's own loop; Debian's 1.13,
// whose BLAS is generic) or `fma(y, a1, x · a0) + a2` (MKL's sgemm in the torch 2.x wheels, on
// a CPU with FMA), probed once per process (GridForm, augment.hpp). The source coordinate is
// grid_sample's `(g + 1) · (size / 2) - 0.5` in both (its kernel did not change).

#include "augment.hpp"
#include "coload/core/error.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/api/include/torch/version.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace coload::vision {
namespace detail {

std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle,
                                            std::array<double, 2> translate, double scale,
                                            std::array<double, 2> shear) {
  // Python's math.radians multiplies by pi / 180; the same double operations in the same order.
  constexpr double deg_to_rad = 3.14159265358979323846 / 180.0;
  const double rot = angle * deg_to_rad;
  const double sx = shear[0] * deg_to_rad;
  const double sy = shear[1] * deg_to_rad;
  const auto [cx, cy] = center;
  const auto [tx, ty] = translate;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  for (double& v : m) v = v / scale;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

namespace {

std::vector<std::uint8_t>& warp_source() {
  thread_local std::vector<std::uint8_t> src;
  return src;
}

// torchvision rounds a float result back to uint8 (torch.round: half to even), unclamped.
inline std::uint8_t round_u8(float v) noexcept {
  return static_cast<std::uint8_t>(static_cast<int>(round_even(v)));
}

}  // namespace

namespace {

// Samples `img` (in place) at the float32 grid `grid_row(y, gx, gy)` writes for each output row
// (x and y of its `width` pixels), as grid_sample does (align_corners=False, zeros padding;
// normalised coordinates in [-1, 1]), with torchvision's fill through a mask channel. The
// affine and the perspective warps differ only in their grids.
template <typename GridRow>
void warp_grid(RgbSpan img, Interpolation interpolation, const std::vector<float>& fill,
               GridRow&& grid_row) {
  const int w = img.width;
  const int h = img.height;
  const std::size_t bytes = static_cast<std::size_t>(w) * h * 3;
  std::vector<std::uint8_t>& src_buf = warp_source();
  src_buf.assign(img.data, img.data + bytes);
  const std::uint8_t* src = src_buf.data();
  thread_local std::vector<float> grid_buf;
  grid_buf.resize(2 * static_cast<std::size_t>(w));
  float* gxs = grid_buf.data();
  float* gys = gxs + w;
  // grid_sample's unnormalisation for align_corners=False: (g + 1) · (size / 2) - 0.5.
  const float scale_x = static_cast<float>(w) / 2.0f;
  const float scale_y = static_cast<float>(h) / 2.0f;
  const bool has_fill = !fill.empty();
  float fills[3] = {0, 0, 0};
  for (std::size_t c = 0; c < 3 && has_fill; ++c) fills[c] = fill[fill.size() == 1 ? 0 : c];
  std::uint8_t fill_u8[3];
  for (int c = 0; c < 3; ++c) fill_u8[c] = round_u8(fills[c]);
  const auto at = [&](int x, int y) { return src + (static_cast<std::size_t>(y) * w + x) * 3; };
  if (interpolation == Interpolation::nearest && w < (1 << 21) && h < (1 << 21)) {
    // Nearest, a row at a time: the grid, every output's source offset (-1 outside), a loop
    // that vectorises, then the copies. The rounding adds and subtracts 1.5 · 2^23 without
    // round_even's branch: exact below 2^22 in magnitude, and at or above it the result stays
    // at least 2^22 - 1 in magnitude (inf and NaN stay themselves), outside the image as the
    // exact rounding is.
    thread_local std::vector<int> offsets;
    offsets.resize(static_cast<std::size_t>(w));
    int* offset = offsets.data();
    const auto fw = static_cast<float>(w);
    const auto fh = static_cast<float>(h);
    for (int y = 0; y < h; ++y) {
      grid_row(y, gxs, gys);
      for (int x = 0; x < w; ++x) {
        const float ix = (gxs[x] + 1.0f) * scale_x - 0.5f;
        const float iy = (gys[x] + 1.0f) * scale_y - 0.5f;
        const float rx = (ix + 12582912.0f) - 12582912.0f;
        const float ry = (iy + 12582912.0f) - 12582912.0f;
        const bool inside = (rx >= 0.0f) & (rx < fw) & (ry >= 0.0f) & (ry < fh);
        const int sx = static_cast<int>(inside ? rx : 0.0f);
        const int sy = static_cast<int>(inside ? ry : 0.0f);
        offset[x] = inside ? (sy * w + sx) * 3 : -1;
      }
      std::uint8_t* out = img.data + static_cast<std::size_t>(y) * w * 3;
      for (int x = 0; x < w; ++x, out += 3) {
        // Outside: zeros without a fill, else the fill (the mask sampled 0 < 0.5).
        std::memcpy(out, offset[x] < 0 ? fill_u8 : src + offset[x], 3);
      }
    }
    return;
  }
  for (int y = 0; y < h; ++y) {
    grid_row(y, gxs, gys);
    std::uint8_t* out = img.data + static_cast<std::size_t>(y) * w * 3;
    for (int x = 0; x < w; ++x, out += 3) {
      const float ix = (gxs[x] + 1.0f) * scale_x - 0.5f;
      const float iy = (gys[x] + 1.0f) * scale_y - 0.5f;
      if (interpolation == Interpolation::nearest) {
        const float rx = round_even(ix);
        const float ry = round_even(iy);
        if (rx >= 0 && rx < static_cast<float>(w) && ry >= 0 && ry < static_cast<float>(h)) {
          std::memcpy(out, at(static_cast<int>(rx), static_cast<int>(ry)), 3);
        } else {
          // Outside: zeros without a fill, else the fill (the mask sampled 0 < 0.5).
          std::memcpy(out, fill_u8, 3);
        }
        continue;
      }
      // Bilinear: the four neighbours weighted, those outside counting as zero (and as zero in
      // the mask channel, which is the sum of the weights inside).
      const float fx = std::floor(ix);
      const float fy = std::floor(iy);
      const float wx1 = ix - fx, wx0 = 1.0f - wx1;
      const float wy1 = iy - fy, wy0 = 1.0f - wy1;
      float acc[3] = {0, 0, 0};
      float mask = 0;
      const float wts[4] = {wx0 * wy0, wx1 * wy0, wx0 * wy1, wx1 * wy1};
      for (int k = 0; k < 4; ++k) {
        const float px = fx + static_cast<float>(k & 1);
        const float py = fy + static_cast<float>(k >> 1);
        // Written so that a NaN coordinate (an extreme scale or shear makes the matrix
        // overflow; a perspective's denominator reaches 0) counts as outside: every comparison
        // with NaN is false.
        if (!(px >= 0 && px < static_cast<float>(w) && py >= 0 && py < static_cast<float>(h)))
          continue;
        const std::uint8_t* p = at(static_cast<int>(px), static_cast<int>(py));
        for (int c = 0; c < 3; ++c) acc[c] += wts[k] * static_cast<float>(p[c]);
        mask += wts[k];
      }
      for (int c = 0; c < 3; ++c) {
        const float v = has_fill ? acc[c] * mask + (1.0f - mask) * fills[c] : acc[c];
        out[c] = round_u8(std::clamp(v, 0.0f, 255.0f));
      }
    }
  }
}

// ---- The grids' arithmetic (GridForm) -------------------------------------------------------

// torch's bmm runs its own loop below 400 products (3 · 2 · pixels < 400: 66 pixels or fewer),
// in 1.13 as in 2.x; above, its BLAS.
constexpr std::size_t own_loop_pixels = 66;

std::atomic<GridForm> forced_form{GridForm::linked};

// The form a grid of `pixels` takes: the linked torch's, or the one a test forced.
GridForm form_for(std::size_t pixels) {
  const GridForm forced = forced_form.load(std::memory_order_relaxed);
  if (forced == GridForm::linked) return linked_grid_form(pixels);
  return pixels <= own_loop_pixels ? GridForm::plain : forced;
}

// One column of the bmm: x · t0 + y · t1 + t2 (the base grid's third column is 1).
template <bool Fused>
[[gnu::always_inline]] inline float column(float x, float y, float t0, float t1, float t2) {
  if constexpr (Fused) {
    return std::fma(y, t1, x * t0) + t2;
  } else {
    return (x * t0 + y * t1) + t2;
  }
}

// A float32 [1, h · w, 3] base grid of (x0 + x, y0 + y, 1), exact (torch.linspace's values).
at::Tensor base_grid(int w, int h, float x0, float y0) {
  at::Tensor base = at::empty({1, h, w, 3}, at::kFloat);
  float* p = base.data_ptr<float>();
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x, p += 3) {
      p[0] = x0 + static_cast<float>(x);
      p[1] = y0 + static_cast<float>(y);
      p[2] = 1.0f;
    }
  }
  return base.view({1, static_cast<std::int64_t>(h) * w, 3});
}

// theta [1, 2, 3] transposed and divided in place by (w / 2, h / 2), as v2's `_affine_grid` and
// `_perspective_grid` do (v1's out-of-place division gives the same values and layout).
at::Tensor rescaled_theta(const float* rows, int w, int h) {
  at::Tensor theta = at::empty({1, 2, 3}, at::kFloat);
  std::memcpy(theta.data_ptr<float>(), rows, 6 * sizeof(float));
  const float half[2] = {static_cast<float>(0.5 * w), static_cast<float>(0.5 * h)};
  return theta.transpose(1, 2).div_(at::tensor(at::ArrayRef<float>(half, 2)));
}

// `_gen_affine_grid(theta, w, h, w, h)`: the base grid's x and y run over
// linspace(-size/2 + 0.5, size/2 - 0.5, size); a (x) and b (y) are theta's rows divided by
// (w / 2, h / 2), as the float32 division does.
struct AffineGrid {
  int w, h;
  float theta[6];
  float a[3], b[3];
  AffineGrid(const std::array<double, 6>& matrix, int width, int height) : w(width), h(height) {
    for (int k = 0; k < 6; ++k) theta[k] = static_cast<float>(matrix[static_cast<std::size_t>(k)]);
    const float half_w = static_cast<float>(0.5 * w);
    const float half_h = static_cast<float>(0.5 * h);
    for (int k = 0; k < 3; ++k) a[k] = theta[k] / half_w;
    for (int k = 0; k < 3; ++k) b[k] = theta[3 + k] / half_h;
  }
  static float start(int size) { return static_cast<float>(0.5 - size * 0.5); }
  template <bool Fused>
  [[gnu::always_inline]] void row(int y, float* gx, float* gy) const {
    const float x0 = start(w);
    const float yb = start(h) + static_cast<float>(y);
    for (int x = 0; x < w; ++x) {
      const float xb = x0 + static_cast<float>(x);
      gx[x] = column<Fused>(xb, yb, a[0], a[1], a[2]);
      gy[x] = column<Fused>(xb, yb, b[0], b[1], b[2]);
    }
  }
  at::Tensor aten() const {
    return base_grid(w, h, start(w), start(h)).bmm(rescaled_theta(theta, w, h)).contiguous();
  }
};

// `_perspective_grid`: theta1's rows [c0 c1 c2] and [c3 c4 c5] divided by (w / 2, h / 2) (a, b),
// theta2's row [c6 c7 1] (g), the base grid (x + 0.5, y + 0.5, 1), then grid1 / grid2 - 1.
struct PerspectiveGrid {
  int w, h;
  std::array<float, 8> c;
  float a[3], b[3];
  PerspectiveGrid(const std::array<float, 8>& coeffs, int width, int height)
      : w(width), h(height), c(coeffs) {
    const float half_w = static_cast<float>(0.5 * w);
    const float half_h = static_cast<float>(0.5 * h);
    for (int k = 0; k < 3; ++k) a[k] = c[static_cast<std::size_t>(k)] / half_w;
    for (int k = 0; k < 3; ++k) b[k] = c[static_cast<std::size_t>(3 + k)] / half_h;
  }
  template <bool Fused>
  [[gnu::always_inline]] void row(int y, float* gx, float* gy) const {
    const float yb = static_cast<float>(y) + 0.5f;
    for (int x = 0; x < w; ++x) {
      const float xb = static_cast<float>(x) + 0.5f;
      const float den = column<Fused>(xb, yb, c[6], c[7], 1.0f);
      gx[x] = column<Fused>(xb, yb, a[0], a[1], a[2]) / den - 1.0f;
      gy[x] = column<Fused>(xb, yb, b[0], b[1], b[2]) / den - 1.0f;
    }
  }
  at::Tensor aten() const {
    const at::Tensor base = base_grid(w, h, 0.5f, 0.5f);
    at::Tensor theta2 = at::empty({1, 2, 3}, at::kFloat);
    const float rows2[6] = {c[6], c[7], 1.0f, c[6], c[7], 1.0f};
    std::memcpy(theta2.data_ptr<float>(), rows2, sizeof rows2);
    at::Tensor grid1 = base.bmm(rescaled_theta(c.data(), w, h));
    return grid1.div_(base.bmm(theta2.transpose(1, 2))).sub_(1.0).contiguous();
  }
};

// The fused rows with AVX2 and FMA instructions. Nothing else in them is a product followed by
// a sum that the compiler could contract (the plain rows compile for the baseline, without FMA).
bool cpu_has_fma() {
  static const bool has = __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  return has;
}
template <typename Grid>
[[gnu::target("avx2,fma")]] void fused_row_fma(const Grid& g, int y, float* gx, float* gy) {
  g.template row<true>(y, gx, gy);
}

// Calls `use` with a function writing row y's x and y coordinates of `grid` in `form` (linked:
// the linked torch's). A fused form on a CPU without FMA (a test forced it) goes through libm's
// exact fma.
template <typename Grid, typename Use>
void with_rows(const Grid& grid, GridForm form, Use&& use) {
  if (form == GridForm::linked) form = form_for(static_cast<std::size_t>(grid.w) * grid.h);
  if (form == GridForm::aten) {
    const at::Tensor g = grid.aten();
    use([p = g.data_ptr<float>(), w = grid.w](int y, float* gx, float* gy) {
      const float* row = p + static_cast<std::size_t>(y) * w * 2;
      for (int x = 0; x < w; ++x) {
        gx[x] = row[2 * x];
        gy[x] = row[2 * x + 1];
      }
    });
  } else if (form == GridForm::fused && cpu_has_fma()) {
    use([&](int y, float* gx, float* gy) { fused_row_fma(grid, y, gx, gy); });
  } else if (form == GridForm::fused) {
    use([&](int y, float* gx, float* gy) { grid.template row<true>(y, gx, gy); });
  } else {
    use([&](int y, float* gx, float* gy) { grid.template row<false>(y, gx, gy); });
  }
}

// Which form at::bmm takes on a grid of w × h, told apart on a matrix where plain and fused
// differ: aten where neither is its arithmetic (or the probe cannot tell them apart).
GridForm probe_form(int w, int h) {
  const std::array<double, 6> m = {1.261f, 0.331f, -0.444f, 0.334f, 1.2f, 0.35f};
  const std::size_t n = 2 * static_cast<std::size_t>(w) * h;
  std::vector<float> aten(n), plain(n), fused(n);
  affine_grid(m, w, h, GridForm::aten, aten.data());
  affine_grid(m, w, h, GridForm::plain, plain.data());
  affine_grid(m, w, h, GridForm::fused, fused.data());
  if (plain == fused) return GridForm::aten;
  if (aten == plain) return GridForm::plain;
  if (aten == fused) return GridForm::fused;
  return GridForm::aten;
}

}  // namespace

GridForm linked_grid_form(std::size_t pixels) {
  // Once per process, at the first plan with a warp (before any worker forks): 66 pixels (torch's
  // own loop) and 48 × 40.
  static const std::array<GridForm, 2> probed = {probe_form(11, 6), probe_form(48, 40)};
  return probed[pixels <= own_loop_pixels ? 0 : 1];
}

GridForm set_grid_form(GridForm form) noexcept { return forced_form.exchange(form); }

void affine_grid(const std::array<double, 6>& matrix, int width, int height, GridForm form,
                 float* out) {
  with_rows(AffineGrid(matrix, width, height), form, [&](auto&& row) {
    std::vector<float> gx(static_cast<std::size_t>(width)), gy(static_cast<std::size_t>(width));
    for (int y = 0; y < height; ++y) {
      row(y, gx.data(), gy.data());
      for (int x = 0; x < width; ++x, out += 2) {
        out[0] = gx[static_cast<std::size_t>(x)];
        out[1] = gy[static_cast<std::size_t>(x)];
      }
    }
  });
}

void warp_affine(RgbSpan img, const std::array<double, 6>& matrix, Interpolation interpolation,
                 const std::vector<float>& fill) {
  with_rows(AffineGrid(matrix, img.width, img.height), GridForm::linked,
            [&](auto&& row) { warp_grid(img, interpolation, fill, row); });
}

namespace {

std::atomic<PerspectiveSolve> forced_solve{PerspectiveSolve::linked};

// `_get_perspective_coeffs`' system of the end points (p1) onto the start points (p2), solved
// by torch.linalg.lstsq with the "gels" driver (QR) in `T`, as float32.
template <typename T>
std::array<float, 8> solve_perspective(const RandomPerspective::Corners& startpoints,
                                       const RandomPerspective::Corners& endpoints) {
  const auto dtype = std::is_same_v<T, double> ? at::kDouble : at::kFloat;
  at::Tensor a = at::zeros({8, 8}, dtype);
  at::Tensor b = at::empty({8}, dtype);
  T* pa = a.data_ptr<T>();
  T* pb = b.data_ptr<T>();
  for (std::size_t i = 0; i < 4; ++i) {
    const auto p1 = endpoints[i];
    const auto p2 = startpoints[i];
    const T r0[8] = {static_cast<T>(p1[0]), static_cast<T>(p1[1]), 1, 0, 0, 0,
                     static_cast<T>(-p2[0] * p1[0]), static_cast<T>(-p2[0] * p1[1])};
    const T r1[8] = {0, 0, 0, static_cast<T>(p1[0]), static_cast<T>(p1[1]), 1,
                     static_cast<T>(-p2[1] * p1[0]), static_cast<T>(-p2[1] * p1[1])};
    std::memcpy(pa + 16 * i, r0, sizeof r0);
    std::memcpy(pa + 16 * i + 8, r1, sizeof r1);
    pb[2 * i] = static_cast<T>(p2[0]);
    pb[2 * i + 1] = static_cast<T>(p2[1]);
  }
  const at::Tensor x = std::get<0>(at::linalg_lstsq(a, b, c10::nullopt, "gels"))
                           .to(at::kFloat)
                           .contiguous();
  std::array<float, 8> out{};
  std::memcpy(out.data(), x.data_ptr<float>(), sizeof out);
  return out;
}

}  // namespace

PerspectiveSolve linked_perspective_solve() noexcept {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return PerspectiveSolve::float64;
#else
  return PerspectiveSolve::float32;
#endif
}

PerspectiveSolve set_perspective_solve(PerspectiveSolve solve) noexcept {
  return forced_solve.exchange(solve);
}

std::array<float, 8> perspective_coefficients(const RandomPerspective::Corners& startpoints,
                                              const RandomPerspective::Corners& endpoints) {
  PerspectiveSolve solve = forced_solve.load(std::memory_order_relaxed);
  if (solve == PerspectiveSolve::linked) solve = linked_perspective_solve();
  return solve == PerspectiveSolve::float64 ? solve_perspective<double>(startpoints, endpoints)
                                            : solve_perspective<float>(startpoints, endpoints);
}

void warp_perspective(RgbSpan img, const std::array<float, 8>& coeffs,
                      Interpolation interpolation, const std::vector<float>& fill) {
  with_rows(PerspectiveGrid(coeffs, img.width, img.height), GridForm::linked,
            [&](auto&& row) { warp_grid(img, interpolation, fill, row); });
}

// ---- RandomRotation and RandomAffine ---------------------------------------------------------

namespace {

float uniform(at::Generator& gen, double lo, double hi) { return draw_uniform(lo, hi, gen); }

void check_range(const std::array<double, 2>& r, const char* name, std::string& error) {
  // NOTE: torchvision's _setup_angle turns a single number d into (-d, d) ("If degrees is a
  // single number, it must be positive."); a pair reaches uniform_, which refuses from > to.
  if (error.empty() && !(r[0] <= r[1])) {
    error = std::string(name) + " should be a range (min, max), got (" + py_float(r[0]) + ", " +
            py_float(r[1]) + ")";
  }
  // Drawn in float32 by ATen: an infinite end failed every sample's draw.
  const auto finite = [](double v) {
    return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
  };
  if (error.empty() && !(finite(r[0]) && finite(r[1]))) {
    error = std::string(name) + " must be finite float32 numbers, got (" + py_float(r[0]) +
            ", " + py_float(r[1]) + ")";
  }
}

}  // namespace

WarpPlan make_warp_plan(const RandomRotation& t, std::string& error) {
  WarpPlan plan;
  plan.rotation = true;
  plan.rotate = t;
  check_range(t.degrees, "degrees", error);
  if (error.empty() && t.expand) {
    error =
        "expand=True makes each sample's size depend on its angle, but a recipe's batch has "
        "one size: not supported in a recipe";
  }
  plan.fill = checked_fill(t.fill, error);
  return plan;
}

WarpPlan make_warp_plan(const RandomAffine& t, std::string& error) {
  WarpPlan plan;
  plan.rotation = false;
  plan.affine = t;
  check_range(t.degrees, "degrees", error);
  if (error.empty() && t.translate) {
    for (double v : *t.translate) {
      if (!(v >= 0.0 && v <= 1.0)) error = "translation values should be between 0 and 1";
    }
  }
  if (error.empty() && t.scale) {
    for (double v : *t.scale) {
      if (!(v > 0)) error = "scale values should be positive";
    }
    check_range(*t.scale, "scale", error);
  }
  if (error.empty() && !t.shear.empty()) {
    if (t.shear.size() != 2 && t.shear.size() != 4) {
      error = "shear should be a sequence of length 2 or 4.";
    } else {
      check_range({t.shear[0], t.shear[1]}, "shear", error);
      if (t.shear.size() == 4) check_range({t.shear[2], t.shear[3]}, "shear", error);
    }
  }
  plan.fill = checked_fill(t.fill, error);
  return plan;
}

std::array<double, 6> draw_warp(const WarpPlan& plan, int height, int width, at::Generator& gen) {
  if (plan.rotation) return {plan.rotate.get_params(gen), 0, 0, 1.0, 0, 0};
  const RandomAffine::Params p = plan.affine.get_params(height, width, gen);
  return {p.angle,
          static_cast<double>(p.translate[0]),
          static_cast<double>(p.translate[1]),
          p.scale,
          p.shear[0],
          p.shear[1]};
}

void apply_warp(RgbSpan img, const WarpPlan& plan, const std::array<double, 6>& d) {
  const auto& center = plan.rotation ? plan.rotate.center : plan.affine.center;
  const Interpolation interp =
      plan.rotation ? plan.rotate.interpolation : plan.affine.interpolation;
  // The tensor path's centre: pixel coordinates made relative to the image's centre.
  std::array<double, 2> c = {0.0, 0.0};
  if (center) c = {(*center)[0] - img.width * 0.5, (*center)[1] - img.height * 0.5};
  // F.rotate negates the angle; F.affine passes it as drawn.
  const std::array<double, 6> m =
      plan.rotation ? inverse_affine_matrix(c, -d[0], {0.0, 0.0}, 1.0, {0.0, 0.0})
                    : inverse_affine_matrix(c, d[0], {d[1], d[2]}, d[3], {d[4], d[5]});
  warp_affine(img, m, interp, plan.fill);
}

PerspectivePlan make_perspective_plan(const RandomPerspective& t, std::string& error) {
  PerspectivePlan plan;
  plan.op = t;
  // NOTE: transforms.v2's wording (the classic class does not check).
  if (!(t.distortion_scale >= 0.0 && t.distortion_scale <= 1.0)) {
    error = "Argument distortion_scale value should be between 0 and 1";
  }
  plan.fill = checked_fill(t.fill, error);
  return plan;
}

RandomPerspective::Corners perspective_startpoints(int height, int width) noexcept {
  return {{{0, 0}, {width - 1, 0}, {width - 1, height - 1}, {0, height - 1}}};
}

}  // namespace detail

double RandomRotation::get_params(at::Generator& gen) const {
  return detail::uniform(gen, degrees[0], degrees[1]);
}

RandomAffine::Params RandomAffine::get_params(int height, int width, at::Generator& gen) const {
  // torchvision's get_params(degrees, translate, scale, shear, [width, height]), draw for draw.
  Params p;
  p.angle = detail::uniform(gen, degrees[0], degrees[1]);
  if (translate) {
    const double max_dx = (*translate)[0] * width;
    const double max_dy = (*translate)[1] * height;
    // int(round(x)): Python rounds half to even.
    p.translate[0] = static_cast<int>(
        std::nearbyint(static_cast<double>(detail::uniform(gen, -max_dx, max_dx))));
    p.translate[1] = static_cast<int>(
        std::nearbyint(static_cast<double>(detail::uniform(gen, -max_dy, max_dy))));
  }
  if (scale) p.scale = detail::uniform(gen, (*scale)[0], (*scale)[1]);
  if (!shear.empty()) {
    p.shear[0] = detail::uniform(gen, shear[0], shear[1]);
    if (shear.size() == 4) p.shear[1] = detail::uniform(gen, shear[2], shear[3]);
  }
  return p;
}

}  // namespace coload::vision

namespace coload::vision {

RandomPerspective::Corners RandomPerspective::get_params(int height, int width,
                                                         at::Generator& gen) const {
  // get_params(width, height, distortion_scale): x then y of each corner, in torchvision's
  // order, each `torch.randint(low, high)`.
  const auto randint = [&](std::int64_t low, std::int64_t high) {
    return static_cast<int>(detail::draw_int(low, high, gen));
  };
  const int dw = static_cast<int>(distortion_scale * (width / 2));
  const int dh = static_cast<int>(distortion_scale * (height / 2));
  Corners end{};
  end[0] = {randint(0, dw + 1), randint(0, dh + 1)};
  end[1] = {randint(width - dw - 1, width), randint(0, dh + 1)};
  end[2] = {randint(width - dw - 1, width), randint(height - dh - 1, height)};
  end[3] = {randint(0, dw + 1), randint(height - dh - 1, height)};
  return end;
}

Image perspective(const ImageView& src, const RandomPerspective::Corners& startpoints,
                  const RandomPerspective::Corners& endpoints, Interpolation interpolation,
                  const std::vector<double>& fill) {
  if (src.channels != 3) {
    throw InvalidArgument("perspective needs an RGB image, got " + std::to_string(src.channels) +
                          " channels");
  }
  std::string error;
  const std::vector<float> f = detail::checked_fill(fill, error);
  if (!error.empty()) throw InvalidArgument(error);
  Image out = Image::zeros(src.width, src.height, 3);
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, y), src.row(y), static_cast<std::size_t>(src.width) * 3);
  }
  detail::warp_perspective({out.data.data(), out.width, out.height},
                           detail::perspective_coefficients(startpoints, endpoints), interpolation,
                           f);
  return out;
}

}  // namespace coload::vision
