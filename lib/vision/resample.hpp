#pragma once
// Pillow's antialiased bilinear resampling, bit for bit: the axes, the fixed-point weights,
// the separable passes (scalar, SSSE3 and AVX2, chosen at run time) and the crop/resize axes
// that the transforms build on. Private to lib/vision.

#include "coload/core/error.hpp"
#include "coload/vision/image.hpp"
#include "coload/vision/transforms.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define COLOAD_VISION_X86 1
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace coload::vision::detail {

// ---- Pillow's resampling --------------------------------------------------------------------
//
// Pillow resamples 8-bit images in two separable passes (horizontal, then vertical over only
// the rows the vertical pass reads), each a weighted sum with weights from a triangle filter of
// support max(scale, 1), normalised, rounded to fixed point with 22 fractional bits, and each
// pass rounds and clamps to 8 bits. Doing the same arithmetic gives Pillow's bytes exactly.

constexpr int precision_bits = 32 - 8 - 2;

inline std::uint8_t clip8(std::int32_t v) noexcept {
  return static_cast<std::uint8_t>(std::clamp(v >> precision_bits, 0, 255));
}


// One axis of a resampling: the source interval [in0, in1) (in source pixels, maybe
// fractional) maps onto `out_size` output pixels, of which `count` from `first` are wanted;
// filter taps are confined to source pixels [lo, hi).
struct AxisSpec {
  double in0 = 0;
  double in1 = 0;
  int lo = 0;
  int hi = 0;
  int out_size = 0;
  int first = 0;
  int count = 0;
};

/// `a` with positions counted from `origin` (a decoded region's first pixel) instead of 0: the
/// same filter taps, read from the region.
inline AxisSpec shifted(AxisSpec a, int origin) {
  a.in0 -= origin;
  a.in1 -= origin;
  a.lo -= origin;
  a.hi -= origin;
  return a;
}

struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> start;  // first source pixel of each output pixel
  std::vector<int> taps;   // source pixels each output pixel reads
  std::vector<std::int32_t> weights;  // count × ksize fixed-point weights
};


/// Fills `c` with the weights of axis `a`.
void compute_coeffs(const AxisSpec& a, AxisCoeffs& c);

// NOTE: the kernels below work on raw __restrict pointers taken out of the vectors first: a store
// through std::uint8_t* may alias anything, so indexing the vectors inside the loops would reload
// their data pointers on every iteration and keep the compiler from vectorising.
template <int C>
void horizontal_row(const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
                    int ksize, const int* __restrict start, const int* __restrict taps,
                    const std::int32_t* __restrict weights) {
  for (int x = 0; x < n_out; ++x) {
    const std::int32_t* __restrict w = weights + static_cast<std::ptrdiff_t>(x) * ksize;
    const std::uint8_t* __restrict p = in + static_cast<std::ptrdiff_t>(start[x]) * C;
    const int n = taps[x];
    std::int32_t s[C];
    for (int ch = 0; ch < C; ++ch) s[ch] = 1 << (precision_bits - 1);
    for (int t = 0; t < n; ++t) {
      const std::int32_t wt = w[t];
      for (int ch = 0; ch < C; ++ch) s[ch] += p[t * C + ch] * wt;
    }
    for (int ch = 0; ch < C; ++ch) out[x * C + ch] = clip8(s[ch]);
  }
}

/// A horizontal pass over one RGB row with packed weights (SSSE3 or AVX2).
using HorizontalKernel = void (*)(const std::uint8_t*, std::uint8_t*, int, const int*, int,
                                  const std::int32_t*, const std::int32_t*);
#ifdef COLOAD_VISION_X86
/// The AVX2 / SSSE3 kernel for tap windows of up to `max_pairs` pairs.
HorizontalKernel horizontal_kernel_avx2(int max_pairs);
HorizontalKernel horizontal_kernel(int max_pairs);
#endif

/// Whether the kernels may use AVX2 / SSSE3 (the CPU has it and set_simd_level allows it).
bool use_avx2() noexcept;
bool use_ssse3() noexcept;

/// The SIMD cap set_simd_level set (avx512 unless a test lowered it).
SimdLevel simd_level_cap() noexcept;
#ifdef COLOAD_VISION_X86
/// The AVX-512 VNNI vertical pass (resample_avx512.cpp), if the CPU and the cap allow it and the
/// filter is at most 32 taps: false where it did not run.
bool vertical_row_avx512(const std::uint8_t* base, std::size_t row_bytes, int n,
                         const std::int32_t* w, std::uint8_t* out);
#endif

/// The vertical pass over one output row: `n` source rows from `base`, weights `w`.
void vertical_row(const std::uint8_t* base, std::size_t row_bytes, int n, const std::int32_t* w,
                  std::int32_t* acc, std::uint8_t* out);

// Weights of an axis split into 16-bit halves, two taps per 32-bit word, for the SIMD pass.
struct PackedWeights {
  int max_pairs = 0;
  int group = 1;  // pixels per layout group: 1 SSSE3, 2 AVX2, 4 AVX-512 (horizontal_row_quads)
  std::vector<std::int32_t> hi;
  std::vector<std::int32_t> lo;
  // group 4: per (quad, step) the kernel's 64 byte indices into the quad's 64-byte window
  std::vector<std::uint8_t> indices;
};

/// Packs `c`'s weights for the SIMD pass, `group` pixels together (1: SSSE3, 2: AVX2, 4: the
/// AVX-512 window kernel, which falls back to 2 where the axis does not suit it: p.group says).
void pack_weights(const AxisCoeffs& c, PackedWeights& p, int group);

/// Whether the AVX-512 VBMI/VNNI window kernel may run (the CPU has it, set_simd_level allows it).
bool use_avx512_window() noexcept;
/// The horizontal pass of an RGB row with weights packed in quads (p.group == 4); reads 64
/// bytes from each quad's first window start.
void horizontal_row_quads(const std::uint8_t* in, std::uint8_t* out, int n_out, const int* start,
                          const PackedWeights& p);

// Resamples `src` along both axes and hands each output row (count_x × C bytes) to
// `sink(y, row)`, in order. Scratch memory is per thread and reused.
template <int C, typename Sink>
void resample(const ImageView& src, const AxisSpec& ax, const AxisSpec& ay, Sink&& sink) {
  thread_local AxisCoeffs tl_cx;
  thread_local AxisCoeffs tl_cy;
  thread_local std::vector<std::uint8_t> tl_rows;
  thread_local std::vector<std::int32_t> tl_acc;
  thread_local std::vector<std::uint8_t> tl_line;
  AxisCoeffs& cx = tl_cx;
  AxisCoeffs& cy = tl_cy;
  compute_coeffs(ax, cx);
  compute_coeffs(ay, cy);
  const int out_w = ax.count;
  const int out_h = ay.count;
  int y_first = src.height;
  int y_last = 0;
  for (int y = 0; y < out_h; ++y) {
    y_first = std::min(y_first, cy.start[static_cast<std::size_t>(y)]);
    y_last = std::max(y_last, cy.start[static_cast<std::size_t>(y)] + cy.taps[static_cast<std::size_t>(y)]);
  }
  if (y_first > y_last) y_first = y_last;
  const std::size_t row_bytes = static_cast<std::size_t>(out_w) * C;
  tl_rows.resize(static_cast<std::size_t>(y_last - y_first) * row_bytes + 16);
  tl_acc.resize(row_bytes);
  tl_line.resize(row_bytes);
  std::uint8_t* rows = tl_rows.data();
  std::int32_t* acc = tl_acc.data();
  std::uint8_t* line = tl_line.data();
#ifdef COLOAD_VISION_X86
  if (C == 3 && use_ssse3()) {
    const bool avx2 = use_avx2();
    thread_local PackedWeights tl_packed;
    thread_local std::vector<std::uint8_t> tl_padded_row;
    PackedWeights& packed = tl_packed;
    const int pairs = (cx.ksize + 1) / 2;
    pack_weights(cx, packed,
                 !avx2 ? 1 : pairs >= 2 && pairs <= 4 && use_avx512_window() ? 4 : 2);
    const bool quads = packed.group == 4;
    const HorizontalKernel kernel =
        avx2 ? horizontal_kernel_avx2(packed.max_pairs) : horizontal_kernel(packed.max_pairs);
    // The SIMD loads read up to `reach` bytes from a tap window's start (2 × max_pairs + 3
    // pixels, or one 16-byte load), maybe past the image's end: a row with fewer bytes than that
    // after its last window's start is read from a padded copy. That is the last row, and more
    // rows of an image a few pixels wide.
    const std::size_t reach =
        quads ? 64 : std::max<std::size_t>(16, 6 * static_cast<std::size_t>(packed.max_pairs) + 9);
    for (int y = y_first; y < y_last; ++y) {
      const std::uint8_t* in = src.row(y);
      const std::size_t after =
          src.stride > 0 ? static_cast<std::size_t>(src.height - 1 - y) *
                                   static_cast<std::size_t>(src.stride) + 3
                         : 0;
      if (after < reach) {
        const std::size_t bytes = static_cast<std::size_t>(src.width) * 3;
        tl_padded_row.assign(bytes + std::max<std::size_t>(6 * static_cast<std::size_t>(packed.max_pairs) + 16, 64), 0);
        std::memcpy(tl_padded_row.data(), in, bytes);
        in = tl_padded_row.data();
      }
      std::uint8_t* out = rows + static_cast<std::size_t>(y - y_first) * row_bytes;
      if (quads) {
        horizontal_row_quads(in, out, out_w, cx.start.data(), packed);
      } else {
        kernel(in, out, out_w, cx.start.data(), packed.max_pairs, packed.hi.data(),
               packed.lo.data());
      }
    }
  } else
#endif
  {
    for (int y = y_first; y < y_last; ++y) {
      horizontal_row<C>(src.row(y), rows + static_cast<std::size_t>(y - y_first) * row_bytes,
                        out_w, cx.ksize, cx.start.data(), cx.taps.data(), cx.weights.data());
    }
  }
  for (int y = 0; y < out_h; ++y) {
    const auto yi = static_cast<std::size_t>(y);
    vertical_row(rows + static_cast<std::size_t>(cy.start[yi] - y_first) * row_bytes, row_bytes,
                 cy.taps[yi], cy.weights.data() + yi * static_cast<std::size_t>(cy.ksize), acc, line);
    sink(y, static_cast<const std::uint8_t*>(line));
  }
}

template <typename Sink>
void resample_any(const ImageView& src, const AxisSpec& ax, const AxisSpec& ay, Sink&& sink) {
  switch (src.channels) {
    case 1: resample<1>(src, ax, ay, sink); break;
    case 3: resample<3>(src, ax, ay, sink); break;
    case 4: resample<4>(src, ax, ay, sink); break;
    default:
      throw InvalidArgument("resampling needs 1, 3 or 4 channels, got " +
                                  std::to_string(src.channels));
  }
}

/// The source pixels [first, last) that the outputs of axis `a` read.
std::pair<int, int> source_span(const AxisSpec& a);

// An axis that crops [begin, begin + length) of the source, then resizes it to `out`.
inline AxisSpec crop_axis(int begin, int length, int out) {
  return AxisSpec{static_cast<double>(begin), static_cast<double>(begin) + length, begin,
                  begin + length, out, 0, out};
}

// The same crop, in a source decoded at 1/`d` of the full size (`scaled` pixels long).
inline AxisSpec scaled_crop_axis(int begin, int length, int out, int d, int scaled) {
  const double in0 = static_cast<double>(begin) / d;
  const double in1 = static_cast<double>(begin + length) / d;
  const int lo = static_cast<int>(std::floor(in0));
  const int hi = std::min(static_cast<int>(std::ceil(in1)), scaled);
  return AxisSpec{in0, in1, lo, hi, out, 0, out};
}
// ToDtype (or ToTensor) then Normalize for one 8-bit value, as torchvision computes it in
// float: v / 255 (when scaling), minus the mean, divided by the standard deviation. A table
// rather than arithmetic per pixel: 768 floats replace a division per value.
struct NormalizeTable {
  float value[3][256];
  // The same floats by byte: planes[c][j][v] is byte j of value[c][v] (little-endian), for
  // normalize_row's AVX-512 form, which looks up 64 values' bytes a permute at a time. Kept
  // in step with `value` by update_planes (the constructor calls it).
  alignas(64) std::uint8_t planes[3][4][256];
  NormalizeTable() = default;
  NormalizeTable(const std::array<float, 3>& mean, const std::array<float, 3>& std_dev,
                 bool scale = true) {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 256; ++v) {
        const float unit = scale ? static_cast<float>(v) / 255.0f : static_cast<float>(v);
        value[c][v] = (unit - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)];
      }
    }
    update_planes();
  }
  void update_planes() noexcept {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 256; ++v) {
        std::uint8_t bytes[4];
        std::memcpy(bytes, &value[c][v], 4);
        for (int j = 0; j < 4; ++j) planes[c][j][v] = bytes[j];
      }
    }
  }
};

/// Writes the RGB row `row` (`width` pixels, mirrored if `flip`) into row `y` of the three
/// `width` × `height` float planes at `dst`, each value looked up in its channel's 256-entry
/// table (`table.value[c][v]`): fused.hpp's write_normalized_row, with the same floats. With
/// AVX-512 VBMI (and the SIMD cap at avx512) 64 pixels at a time where the row has 64: byte
/// permutes split them into channels and look up each value's four bytes in `table.planes`;
/// rows under 64 pixels 16 at a time through a gather; below that cap, the scalar loop.
void normalize_row(const NormalizeTable& table, const std::uint8_t* row, int width, int height,
                   int y, bool flip, float* dst);

/// `src` resampled along `ax` and `ay` into a new image.
Image resample_to_image(const ImageView& src, const AxisSpec& ax, const AxisSpec& ay);

}  // namespace coload::vision::detail
