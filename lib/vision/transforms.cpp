// vision/transforms: Pillow's antialiased bilinear resampling, torchvision's transforms on
// images, and the fused train/eval paths from encoded bytes to normalised CHW floats.

#include "coload/vision/transforms.hpp"
#include "coload/core/error.hpp"

#include "jpeg_region.hpp"

#include <ATen/ATen.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define COLOAD_VISION_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace coload::vision {
namespace {

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

inline double triangle(double x) noexcept {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
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

struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> start;  // first source pixel of each output pixel
  std::vector<int> taps;   // source pixels each output pixel reads
  std::vector<std::int32_t> weights;  // count × ksize fixed-point weights
};

void compute_coeffs(const AxisSpec& a, AxisCoeffs& c) {
  const double scale = (a.in1 - a.in0) / a.out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const double inverse = 1.0 / filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.start.resize(static_cast<std::size_t>(a.count));
  c.taps.resize(static_cast<std::size_t>(a.count));
  c.weights.assign(static_cast<std::size_t>(a.count) * c.ksize, 0);
  thread_local std::vector<double> k;
  k.resize(static_cast<std::size_t>(c.ksize));
  // NOTE: positions are relative to `lo`, so for a crop followed by a resize (lo = in0) every
  // double below is the one Pillow computes on the cropped image.
  const double origin = a.in0 - a.lo;
  const int available = a.hi - a.lo;
  for (int i = 0; i < a.count; ++i) {
    const int xx = a.first + i;
    const double center = origin + (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > available) xmax = available;
    xmax = std::max(xmax - xmin, 0);
    double total = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * inverse);
      k[static_cast<std::size_t>(x)] = w;
      total += w;
    }
    std::int32_t* out = c.weights.data() + static_cast<std::size_t>(i) * c.ksize;
    for (int x = 0; x < xmax; ++x) {
      double w = k[static_cast<std::size_t>(x)];
      if (total != 0.0) w /= total;
      const double fixed = w * (1 << precision_bits);
      out[x] = static_cast<std::int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.start[static_cast<std::size_t>(i)] = a.lo + xmin;
    c.taps[static_cast<std::size_t>(i)] = xmax;
  }
}

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

[[gnu::always_inline]] inline void vertical_body(const std::uint8_t* __restrict base,
                                                std::size_t row_bytes, int n,
                                                const std::int32_t* __restrict w,
                                                std::int32_t* __restrict acc,
                                                std::uint8_t* __restrict out) {
  for (std::size_t i = 0; i < row_bytes; ++i) acc[i] = std::int32_t{1} << (precision_bits - 1);
  for (int t = 0; t < n; ++t) {
    const std::uint8_t* __restrict r = base + static_cast<std::size_t>(t) * row_bytes;
    const std::int32_t wt = w[t];
    for (std::size_t i = 0; i < row_bytes; ++i) acc[i] += r[i] * wt;
  }
  for (std::size_t i = 0; i < row_bytes; ++i) {
    out[i] = static_cast<std::uint8_t>(std::clamp(acc[i] >> precision_bits, 0, 255));
  }
}

void vertical_row_generic(const std::uint8_t* base, std::size_t row_bytes, int n,
                          const std::int32_t* w, std::int32_t* acc, std::uint8_t* out) {
  vertical_body(base, row_bytes, n, w, acc, out);
}

#ifdef COLOAD_VISION_X86
// NOTE: the same loop compiled for AVX2 (chosen at run time): 8 × 32-bit multiplies per
// instruction, where baseline x86-64 has no packed 32-bit multiply at all.
[[gnu::target("avx2")]] void vertical_row_avx2(const std::uint8_t* base, std::size_t row_bytes,
                                               int n, const std::int32_t* w, std::int32_t* acc,
                                               std::uint8_t* out) {
  vertical_body(base, row_bytes, n, w, acc, out);
}

// Horizontal pass for RGB with SSSE3: each step loads two neighbouring source pixels, spreads
// them into 16-bit (tap, tap + 1) pairs per channel and multiply-adds them with the two weights.
// NOTE: Pillow's weights have 22 fractional bits, too wide for 16-bit lanes, so each weight is
// split as hi * 2^11 + lo and both halves are multiplied: the sums are Pillow's, exactly.
// Reads up to 2 × Pairs + 3 pixels from a tap window's start, past its last tap: callers make
// sure that memory exists (rows below follow; the image's last row is read from a padded copy).
// NOTE: every output pixel runs `Pairs` steps (weights zero-padded), so the loop has no
// data-dependent trip count to mispredict; `Pairs` = 0 takes the count from `max_pairs`.
template <int Pairs>
[[gnu::target("ssse3")]] void horizontal_row_rgb_ssse3(
    const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
    const int* __restrict start, int max_pairs, const std::int32_t* __restrict packed_hi,
    const std::int32_t* __restrict packed_lo) {
  const __m128i spread = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m128i half = _mm_set1_epi32(1 << (precision_bits - 1));
  const int steps = Pairs > 0 ? Pairs : max_pairs;
  for (int x = 0; x < n_out; ++x) {
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(start[x]) * 3;
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x) * max_pairs;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x) * max_pairs;
    __m128i sum_hi = _mm_setzero_si128();
    __m128i sum_lo = _mm_setzero_si128();
    for (int j = 0; j < steps; ++j) {
      const __m128i px = _mm_shuffle_epi8(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 6 * j)), spread);
      sum_hi = _mm_add_epi32(sum_hi, _mm_madd_epi16(px, _mm_set1_epi32(hi[j])));
      sum_lo = _mm_add_epi32(sum_lo, _mm_madd_epi16(px, _mm_set1_epi32(lo[j])));
    }
    __m128i s = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(sum_hi, 11), sum_lo), half);
    s = _mm_srai_epi32(s, precision_bits);
    s = _mm_packus_epi16(_mm_packs_epi32(s, s), s);  // saturates to 0..255, as clip8
    // Four bytes stored, three kept: the fourth is overwritten by the next pixel (the output
    // row has slack after its end).
    const std::int32_t v = _mm_cvtsi128_si32(s);
    std::memcpy(out + 3 * x, &v, 4);
  }
}

// The same pass with AVX2, two output pixels per 256-bit register (one per 128-bit lane).
// `packed_hi`/`packed_lo` hold, for each pair of output pixels and each step, eight words: the
// first pixel's packed weights four times, then the second's.
template <int Pairs>
[[gnu::target("avx2")]] void horizontal_row_rgb_avx2(
    const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
    const int* __restrict start, int max_pairs, const std::int32_t* __restrict packed_hi,
    const std::int32_t* __restrict packed_lo) {
  const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(1 << (precision_bits - 1));
  const int steps = Pairs > 0 ? Pairs : max_pairs;
  int x = 0;
  for (; x + 1 < n_out; x += 2) {
    const std::uint8_t* p0 = in + static_cast<std::ptrdiff_t>(start[x]) * 3;
    const std::uint8_t* p1 = in + static_cast<std::ptrdiff_t>(start[x + 1]) * 3;
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x / 2) * max_pairs * 8;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x / 2) * max_pairs * 8;
    __m256i sum_hi = _mm256_setzero_si256();
    __m256i sum_lo = _mm256_setzero_si256();
    for (int j = 0; j < steps; ++j) {
      const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 6 * j));
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1 + 6 * j));
      const __m256i px = _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), spread);
      sum_hi = _mm256_add_epi32(sum_hi, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + 8 * j))));
      sum_lo = _mm256_add_epi32(sum_lo, _mm256_madd_epi16(px, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + 8 * j))));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(sum_hi, 11), sum_lo), half);
    s = _mm256_srai_epi32(s, precision_bits);
    s = _mm256_packus_epi16(_mm256_packs_epi32(s, s), s);  // per lane, saturating to 0..255
    const std::int32_t v0 = _mm256_extract_epi32(s, 0);
    const std::int32_t v1 = _mm256_extract_epi32(s, 4);
    std::memcpy(out + 3 * x, &v0, 4);
    std::memcpy(out + 3 * x + 3, &v1, 4);
  }
  if (x < n_out) {
    // The odd last pixel: its weights sit in the first half of the last pair's words.
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(start[x]) * 3;
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x / 2) * max_pairs * 8;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x / 2) * max_pairs * 8;
    std::int32_t sum[3] = {1 << (precision_bits - 1), 1 << (precision_bits - 1),
                           1 << (precision_bits - 1)};
    for (int j = 0; j < steps; ++j) {
      const auto h = static_cast<std::uint32_t>(hi[8 * j]);
      const auto l = static_cast<std::uint32_t>(lo[8 * j]);
      const std::int32_t w0 = static_cast<std::int16_t>(h & 0xffff) * 2048 + static_cast<std::int16_t>(l & 0xffff);
      const std::int32_t w1 = static_cast<std::int16_t>(h >> 16) * 2048 + static_cast<std::int16_t>(l >> 16);
      for (int c = 0; c < 3; ++c) sum[c] += p[6 * j + c] * w0 + p[6 * j + 3 + c] * w1;
    }
    for (int c = 0; c < 3; ++c) out[3 * x + c] = clip8(sum[c]);
  }
}

using HorizontalKernel = void (*)(const std::uint8_t*, std::uint8_t*, int, const int*, int,
                                  const std::int32_t*, const std::int32_t*);

HorizontalKernel horizontal_kernel_avx2(int max_pairs) {
  switch (max_pairs) {
    case 1: return horizontal_row_rgb_avx2<1>;
    case 2: return horizontal_row_rgb_avx2<2>;
    case 3: return horizontal_row_rgb_avx2<3>;
    case 4: return horizontal_row_rgb_avx2<4>;
    case 5: return horizontal_row_rgb_avx2<5>;
    default: return horizontal_row_rgb_avx2<0>;
  }
}

HorizontalKernel horizontal_kernel(int max_pairs) {
  switch (max_pairs) {
    case 1: return horizontal_row_rgb_ssse3<1>;
    case 2: return horizontal_row_rgb_ssse3<2>;
    case 3: return horizontal_row_rgb_ssse3<3>;
    case 4: return horizontal_row_rgb_ssse3<4>;
    case 5: return horizontal_row_rgb_ssse3<5>;
    default: return horizontal_row_rgb_ssse3<0>;
  }
}

const bool cpu_avx2 = __builtin_cpu_supports("avx2");
const bool cpu_ssse3 = __builtin_cpu_supports("ssse3");
#else
const bool cpu_avx2 = false;
const bool cpu_ssse3 = false;
#endif

std::atomic<detail::SimdLevel> simd_cap{detail::SimdLevel::avx2};

bool use_avx2() noexcept { return cpu_avx2 && simd_cap.load(std::memory_order_relaxed) >= detail::SimdLevel::avx2; }
bool use_ssse3() noexcept { return cpu_ssse3 && simd_cap.load(std::memory_order_relaxed) >= detail::SimdLevel::ssse3; }

void vertical_row(const std::uint8_t* base, std::size_t row_bytes, int n, const std::int32_t* w,
                  std::int32_t* acc, std::uint8_t* out) {
#ifdef COLOAD_VISION_X86
  if (use_avx2()) return vertical_row_avx2(base, row_bytes, n, w, acc, out);
#endif
  vertical_row_generic(base, row_bytes, n, w, acc, out);
}

// Weights of an axis split into 16-bit halves, two taps per 32-bit word, for the SIMD pass.
struct PackedWeights {
  int max_pairs = 0;
  std::vector<std::int32_t> hi;
  std::vector<std::int32_t> lo;
};

void pack_weights(const AxisCoeffs& c, PackedWeights& p, bool pixel_pairs) {
  const std::size_t n = c.start.size();
  const auto pairs = static_cast<std::size_t>((c.ksize + 1) / 2);
  p.max_pairs = static_cast<int>(pairs);
  // SSSE3 layout: one word per (pixel, step). AVX2 layout: per (pixel pair, step) eight words,
  // the first pixel's word four times, then the second's.
  const std::size_t words = pixel_pairs ? (n + 1) / 2 * pairs * 8 : n * pairs;
  p.hi.assign(words, 0);
  p.lo.assign(words, 0);
  auto pack = [](std::int32_t a, std::int32_t b) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint16_t>(a)) |
                                     (static_cast<std::uint32_t>(static_cast<std::uint16_t>(b)) << 16));
  };
  for (std::size_t x = 0; x < n; ++x) {
    const std::int32_t* w = c.weights.data() + x * static_cast<std::size_t>(c.ksize);
    for (std::size_t j = 0; j < pairs; ++j) {
      const std::int32_t w0 = w[2 * j];
      const std::int32_t w1 = 2 * j + 1 < static_cast<std::size_t>(c.ksize) ? w[2 * j + 1] : 0;
      const std::int32_t hi = pack(w0 >> 11, w1 >> 11);
      const std::int32_t lo = pack(w0 & 2047, w1 & 2047);
      if (pixel_pairs) {
        const std::size_t base = (x / 2) * pairs * 8 + j * 8 + (x % 2) * 4;
        std::fill_n(p.hi.begin() + static_cast<std::ptrdiff_t>(base), 4, hi);
        std::fill_n(p.lo.begin() + static_cast<std::ptrdiff_t>(base), 4, lo);
      } else {
        p.hi[x * pairs + j] = hi;
        p.lo[x * pairs + j] = lo;
      }
    }
  }
}

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
    thread_local std::vector<std::uint8_t> tl_last_row;
    PackedWeights& packed = tl_packed;
    pack_weights(cx, packed, avx2);
    const HorizontalKernel kernel =
        avx2 ? horizontal_kernel_avx2(packed.max_pairs) : horizontal_kernel(packed.max_pairs);
    for (int y = y_first; y < y_last; ++y) {
      const std::uint8_t* in = src.row(y);
      if (y == src.height - 1) {
        // The SIMD loads reach up to 2 × max_pairs + 3 pixels past a tap window's start, maybe
        // past the image's end: read the last row from a padded copy.
        const std::size_t bytes = static_cast<std::size_t>(src.width) * 3;
        tl_last_row.assign(bytes + 6 * static_cast<std::size_t>(packed.max_pairs) + 16, 0);
        std::memcpy(tl_last_row.data(), in, bytes);
        in = tl_last_row.data();
      }
      kernel(in, rows + static_cast<std::size_t>(y - y_first) * row_bytes, out_w, cx.start.data(),
             packed.max_pairs, packed.hi.data(), packed.lo.data());
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

// The source pixels [first, last) that the outputs of axis `a` read.
std::pair<int, int> source_span(const AxisSpec& a) {
  thread_local AxisCoeffs c;
  compute_coeffs(a, c);
  int first = a.hi;
  int last = a.lo;
  for (int i = 0; i < a.count; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (c.taps[k] == 0) continue;
    first = std::min(first, c.start[k]);
    last = std::max(last, c.start[k] + c.taps[k]);
  }
  if (first >= last) return {a.lo, a.hi};
  return {first, last};
}

// An axis that crops [begin, begin + length) of the source, then resizes it to `out`.
AxisSpec crop_axis(int begin, int length, int out) {
  return AxisSpec{static_cast<double>(begin), static_cast<double>(begin) + length, begin,
                  begin + length, out, 0, out};
}

// The same crop, in a source decoded at 1/`d` of the full size (`scaled` pixels long).
AxisSpec scaled_crop_axis(int begin, int length, int out, int d, int scaled) {
  const double in0 = static_cast<double>(begin) / d;
  const double in1 = static_cast<double>(begin + length) / d;
  const int lo = static_cast<int>(std::floor(in0));
  const int hi = std::min(static_cast<int>(std::ceil(in1)), scaled);
  return AxisSpec{in0, in1, lo, hi, out, 0, out};
}

void check_box(const ImageView& src, const CropBox& box) {
  if (box.height <= 0 || box.width <= 0 || box.top < 0 || box.left < 0 ||
      box.top + box.height > src.height || box.left + box.width > src.width) {
    throw InvalidArgument("crop box (top " + std::to_string(box.top) + ", left " +
                          std::to_string(box.left) + ", height " + std::to_string(box.height) +
                          ", width " + std::to_string(box.width) + ") does not lie inside the " +
                          std::to_string(src.width) + "x" + std::to_string(src.height) + " image");
  }
}

void check_output(int out_height, int out_width) {
  if (out_height <= 0 || out_width <= 0) {
    throw InvalidArgument("output size must be positive, got " + std::to_string(out_height) + "x" +
                          std::to_string(out_width));
  }
}

Image resample_to_image(const ImageView& src, const AxisSpec& ax, const AxisSpec& ay) {
  Image out = Image::zeros(ax.count, ay.count, src.channels);
  const std::size_t row_bytes = static_cast<std::size_t>(ax.count) * src.channels;
  resample_any(src, ax, ay, [&](int y, const std::uint8_t* row) {
    std::memcpy(out.data.data() + static_cast<std::size_t>(y) * row_bytes, row, row_bytes);
  });
  return out;
}

// ToTensor then Normalize for one 8-bit value, as torchvision computes it in float:
// v / 255, minus the mean, divided by the standard deviation.
struct NormalizeTable {
  float value[3][256];
  NormalizeTable(const std::array<float, 3>& mean, const std::array<float, 3>& std_dev) {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 256; ++v) {
        const float unit = static_cast<float>(v) / 255.0f;
        value[c][v] = (unit - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)];
      }
    }
  }
};

// Writes one RGB row into the CHW planes of `dst` (`width` × `height` each), mirrored if asked.
inline void write_normalized_row(const NormalizeTable& table, const std::uint8_t* __restrict row,
                                 int width, int height, int y, bool flip, float* dst) {
  const std::size_t plane = static_cast<std::size_t>(width) * height;
  float* __restrict r = dst + static_cast<std::size_t>(y) * width;
  float* __restrict g = r + plane;
  float* __restrict b = g + plane;
  if (flip) {
    for (int x = 0; x < width; ++x) {
      const std::uint8_t* p = row + 3 * (width - 1 - x);
      r[x] = table.value[0][p[0]];
      g[x] = table.value[1][p[1]];
      b[x] = table.value[2][p[2]];
    }
  } else {
    for (int x = 0; x < width; ++x) {
      const std::uint8_t* p = row + 3 * x;
      r[x] = table.value[0][p[0]];
      g[x] = table.value[1][p[1]];
      b[x] = table.value[2][p[2]];
    }
  }
}

bool looks_like_jpeg(std::span<const std::byte> data) noexcept {
  return !data.empty() && data[0] == std::byte{0xff};
}

// A decoded image and the axes that crop `box` (full-size coordinates) out of it and resize it.
struct CropSource {
  ImageView image;
  AxisSpec ax;
  AxisSpec ay;
};

CropSource decode_crop_source(std::span<const std::byte> encoded, const CropBox& box,
                              int out_height, int out_width, int denominator,
                              std::vector<std::uint8_t>& pixels) {
  check_output(out_height, out_width);
  const int d = looks_like_jpeg(encoded) ? denominator : 1;
  CropSource s;
  if (d == 1 && looks_like_jpeg(encoded)) {
    // Only the crop's rows and columns (plus a margin) are decoded; anything the region
    // decoder does not handle falls through to the whole-image decode below.
    if (auto region = detail::decode_jpeg_region(encoded, box.top, box.left, box.height,
                                                 box.width, pixels)) {
      s.image = ImageView{region->pixels, region->width, region->height, 3, region->stride};
      const CropBox local{box.top - region->y0, box.left - region->x0, box.height, box.width};
      check_box(s.image, local);
      s.ax = crop_axis(local.left, local.width, out_width);
      s.ay = crop_axis(local.top, local.height, out_height);
      return s;
    }
  }
  s.image = decode_into(encoded, pixels, d);
  if (d == 1) {
    check_box(s.image, box);
    s.ax = crop_axis(box.left, box.width, out_width);
    s.ay = crop_axis(box.top, box.height, out_height);
  } else {
    // The full size is only known up to rounding here; the box must fit the scaled image.
    check_box(ImageView{nullptr, s.image.width * d, s.image.height * d, 3, 0}, box);
    s.ax = scaled_crop_axis(box.left, box.width, out_width, d, s.image.width);
    s.ay = scaled_crop_axis(box.top, box.height, out_height, d, s.image.height);
  }
  return s;
}

}  // namespace

detail::SimdLevel detail::set_simd_level(SimdLevel level) noexcept {
  return simd_cap.exchange(level);
}

// ---- Functional forms -----------------------------------------------------------------------

Image resized_crop(const ImageView& src, const CropBox& box, int out_height, int out_width) {
  check_box(src, box);
  check_output(out_height, out_width);
  return resample_to_image(src, crop_axis(box.left, box.width, out_width),
                           crop_axis(box.top, box.height, out_height));
}

Image resize(const ImageView& src, int out_height, int out_width) {
  return resized_crop(src, CropBox{0, 0, src.height, src.width}, out_height, out_width);
}

Image crop(const ImageView& src, const CropBox& box) {
  if (box.height <= 0 || box.width <= 0) {
    throw InvalidArgument("crop size must be positive, got " + std::to_string(box.height) + "x" +
                          std::to_string(box.width));
  }
  Image out = Image::zeros(box.width, box.height, src.channels);
  const int x0 = std::max(box.left, 0);
  const int x1 = std::min(box.left + box.width, src.width);
  if (x0 >= x1) return out;
  for (int y = std::max(box.top, 0); y < std::min(box.top + box.height, src.height); ++y) {
    std::memcpy(out.pixel(x0 - box.left, y - box.top), src.row(y) + static_cast<std::ptrdiff_t>(x0) * src.channels,
                static_cast<std::size_t>(x1 - x0) * src.channels);
  }
  return out;
}

Image hflip(const ImageView& src) {
  Image out = Image::zeros(src.width, src.height, src.channels);
  const int c = src.channels;
  for (int y = 0; y < src.height; ++y) {
    const std::uint8_t* in = src.row(y);
    for (int x = 0; x < src.width; ++x) {
      std::memcpy(out.pixel(src.width - 1 - x, y), in + static_cast<std::ptrdiff_t>(x) * c,
                  static_cast<std::size_t>(c));
    }
  }
  return out;
}

std::pair<int, int> resize_output_size(int height, int width, int size) noexcept {
  const bool width_shorter = width <= height;
  const int short_side = width_shorter ? width : height;
  const int long_side = width_shorter ? height : width;
  // NOTE: torchvision computes int(size * long / short) in Python floats: true division, then
  // truncation; the double product below is the same value.
  const int new_long = static_cast<int>(static_cast<double>(size) * long_side / short_side);
  return width_shorter ? std::pair{new_long, size} : std::pair{size, new_long};
}

CropBox center_crop_box(int height, int width, int crop_height, int crop_width) noexcept {
  // torchvision pads first (left/top get the floor of half the excess), then crops at
  // int(round((padded - crop) / 2.0)); Python rounds halves to even, as nearbyint does.
  const int pad_left = crop_width > width ? (crop_width - width) / 2 : 0;
  const int pad_top = crop_height > height ? (crop_height - height) / 2 : 0;
  const int padded_w = crop_width > width ? crop_width : width;
  const int padded_h = crop_height > height ? crop_height : height;
  const int left = static_cast<int>(std::nearbyint((padded_w - crop_width) / 2.0)) - pad_left;
  const int top = static_cast<int>(std::nearbyint((padded_h - crop_height) / 2.0)) - pad_top;
  return CropBox{top, left, crop_height, crop_width};
}

void to_normalized_chw(const ImageView& src, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std_dev, float* dst) {
  if (src.channels != 3) throw InvalidArgument("to_normalized_chw needs an RGB image");
  const NormalizeTable table(mean, std_dev);
  for (int y = 0; y < src.height; ++y) {
    write_normalized_row(table, src.row(y), src.width, src.height, y, false, dst);
  }
}

Image decode_resized_crop(std::span<const std::byte> encoded, const CropBox& box, int out_height,
                          int out_width, int jpeg_scale_denominator) {
  thread_local std::vector<std::uint8_t> pixels;
  const CropSource source =
      decode_crop_source(encoded, box, out_height, out_width, jpeg_scale_denominator, pixels);
  return resample_to_image(source.image, source.ax, source.ay);
}

// ---- Transform objects ----------------------------------------------------------------------

std::pair<int, int> Resize::output_size(int height, int width) const noexcept {
  if (this->width > 0) return {size, this->width};
  return resize_output_size(height, width, size);
}

Image Resize::operator()(const Image& image) const {
  const auto [h, w] = output_size(image.height, image.width);
  return resize(image.view(), h, w);
}

Image CenterCrop::operator()(const Image& image) const {
  const int w = width > 0 ? width : height;
  return crop(image.view(), center_crop_box(image.height, image.width, height, w));
}

CropBox RandomResizedCrop::get_params(int image_height, int image_width, at::Generator& gen) const {
  // NOTE: every draw below is the ATen call torchvision makes (float32 uniform_, exp, int64
  // randint) on the same generator, rather than a reimplementation: the kernels are compiled
  // per CPU capability and may contract to FMA, so only the calls themselves are bit-exact.
  const double area = static_cast<double>(image_height) * image_width;
  const at::Tensor log_ratio =
      at::log(at::tensor({static_cast<float>(ratio[0]), static_cast<float>(ratio[1])}));
  const double log_lo = log_ratio[0].item<float>();
  const double log_hi = log_ratio[1].item<float>();
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area =
        area * at::empty({1}, at::kFloat).uniform_(scale[0], scale[1], gen).item<float>();
    const double aspect_ratio =
        at::exp(at::empty({1}, at::kFloat).uniform_(log_lo, log_hi, gen)).item<float>();
    // Python's round() rounds halves to even, as nearbyint does in the default mode.
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect_ratio)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect_ratio)));
    if (0 < w && w <= image_width && 0 < h && h <= image_height) {
      const auto i = at::randint(0, image_height - h + 1, {1}, gen).item<std::int64_t>();
      const auto j = at::randint(0, image_width - w + 1, {1}, gen).item<std::int64_t>();
      return CropBox{static_cast<int>(i), static_cast<int>(j), h, w};
    }
  }
  const double in_ratio = static_cast<double>(image_width) / static_cast<double>(image_height);
  const double min_ratio = std::min(ratio[0], ratio[1]);
  const double max_ratio = std::max(ratio[0], ratio[1]);
  int w = image_width;
  int h = image_height;
  if (in_ratio < min_ratio) {
    h = static_cast<int>(std::nearbyint(w / min_ratio));
  } else if (in_ratio > max_ratio) {
    w = static_cast<int>(std::nearbyint(h * max_ratio));
  }
  return CropBox{(image_height - h) / 2, (image_width - w) / 2, h, w};
}

Image RandomResizedCrop::operator()(const Image& image, at::Generator& gen) const {
  const CropBox box = get_params(image.height, image.width, gen);
  return resized_crop(image.view(), box, height, width > 0 ? width : height);
}

bool RandomHorizontalFlip::draw(at::Generator& gen) const {
  return at::rand({1}, gen).item<float>() < static_cast<float>(p);
}

Image RandomHorizontalFlip::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return hflip(image.view());
  return image;
}

at::Tensor PILToTensor::operator()(const Image& image) const {
  at::Tensor hwc = at::empty({image.height, image.width, image.channels}, at::kByte);
  std::memcpy(hwc.data_ptr<std::uint8_t>(), image.data.data(), image.data.size());
  return hwc.permute({2, 0, 1}).contiguous();
}

at::Tensor ToTensor::operator()(const Image& image) const {
  return PILToTensor{}(image).to(at::kFloat).div(255);
}

at::Tensor ConvertImageDtype::operator()(const at::Tensor& image) const {
  if (image.scalar_type() == dtype) return image;
  if (image.scalar_type() == at::kByte && at::isFloatingType(dtype)) {
    return image.to(dtype).div(255);
  }
  if (image.is_floating_point() && at::isFloatingType(dtype)) return image.to(dtype);
  throw InvalidArgument(
      "ConvertImageDtype supports uint8 or floating point to floating "
      "point only");
}

at::Tensor Normalize::operator()(const at::Tensor& image) const {
  if (!image.is_floating_point()) {
    throw InvalidArgument("Normalize: input tensor should be a float tensor");
  }
  if (image.dim() < 3) {
    throw InvalidArgument("Normalize: expected a tensor image of size (..., C, H, W)");
  }
  const auto options = image.options();
  at::Tensor m = at::tensor(mean, options.dtype(at::kDouble)).to(image.scalar_type());
  at::Tensor s = at::tensor(std_dev, options.dtype(at::kDouble)).to(image.scalar_type());
  if ((s == 0).any().item<bool>()) {
    throw InvalidArgument("std evaluated to zero after conversion to " +
                          std::string(c10::toString(image.scalar_type())) +
                          ", leading to division by zero.");
  }
  return image.sub(m.view({-1, 1, 1})).div(s.view({-1, 1, 1}));
}

// ---- Fused paths ----------------------------------------------------------------------------

TrainParams TrainTransform::sample(const ImageInfo& info, at::Generator& gen) const {
  TrainParams params;
  params.box = RandomResizedCrop{size, size, scale, ratio}.get_params(info.height, info.width, gen);
  params.flip = RandomHorizontalFlip{flip_p}.draw(gen);
  params.scale_denominator =
      dct_scaling && info.format == ImageFormat::jpeg
          ? choose_jpeg_scale(params.box.width, params.box.height, size, size)
          : 1;
  return params;
}

void TrainTransform::apply(std::span<const std::byte> encoded, const TrainParams& params,
                           float* dst) const {
  thread_local std::vector<std::uint8_t> pixels;
  const CropSource source =
      decode_crop_source(encoded, params.box, size, size, params.scale_denominator, pixels);
  const NormalizeTable table(mean, std_dev);
  resample<3>(source.image, source.ax, source.ay, [&](int y, const std::uint8_t* row) {
    write_normalized_row(table, row, size, size, y, params.flip, dst);
  });
}

void TrainTransform::operator()(std::span<const std::byte> encoded, at::Generator& gen,
                                float* dst) const {
  apply(encoded, sample(peek(encoded), gen), dst);
}

void TrainTransform::operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const {
  at::Generator gen = rng.torch_generator();
  (*this)(encoded, gen, dst);
}

at::Tensor TrainTransform::operator()(std::span<const std::byte> encoded, Rng& rng) const {
  at::Tensor out = at::empty({3, size, size}, at::kFloat);
  (*this)(encoded, rng, out.data_ptr<float>());
  return out;
}

void EvalTransform::operator()(std::span<const std::byte> encoded, float* dst) const {
  if (crop_size <= 0 || crop_size > resize_size) {
    throw InvalidArgument("EvalTransform needs 0 < crop_size <= resize_size, got crop " +
                          std::to_string(crop_size) + " and resize " + std::to_string(resize_size));
  }
  const ImageInfo info = peek(encoded);
  const auto [rh, rw] = resize_output_size(info.height, info.width, resize_size);
  const CropBox box = center_crop_box(rh, rw, crop_size, crop_size);
  const int d = dct_scaling && info.format == ImageFormat::jpeg
                    ? choose_jpeg_scale(info.width, info.height, rw, rh)
                    : 1;
  thread_local std::vector<std::uint8_t> pixels;
  const NormalizeTable table(mean, std_dev);
  auto write = [&](int y, const std::uint8_t* row) {
    write_normalized_row(table, row, crop_size, crop_size, y, false, dst);
  };
  if (d == 1 && info.format == ImageFormat::jpeg) {
    // Only the source rows and columns that the crop's outputs read (their filter support) are
    // decoded; anything the region decoder does not handle falls through to the whole image.
    const AxisSpec full_x{0.0, static_cast<double>(info.width), 0, info.width, rw, box.left,
                          crop_size};
    const AxisSpec full_y{0.0, static_cast<double>(info.height), 0, info.height, rh, box.top,
                          crop_size};
    const auto [x0, x1] = source_span(full_x);
    const auto [y0, y1] = source_span(full_y);
    if (auto region = detail::decode_jpeg_region(encoded, y0, x0, y1 - y0, x1 - x0, pixels)) {
      const ImageView image{region->pixels, region->width, region->height, 3, region->stride};
      // The same axes, with positions counted from the region's origin: every filter tap
      // lies inside the region, so the outputs are those of the whole-image resize.
      const AxisSpec ax{-static_cast<double>(region->x0),
                        static_cast<double>(info.width - region->x0), 0, region->width, rw,
                        box.left, crop_size};
      const AxisSpec ay{-static_cast<double>(region->y0),
                        static_cast<double>(info.height - region->y0), 0, region->height, rh,
                        box.top, crop_size};
      resample<3>(image, ax, ay, write);
      return;
    }
  }
  const ImageView image = decode_into(encoded, pixels, d);
  // Resize the whole (possibly scaled) image to rh × rw, computing only the crop's outputs.
  const AxisSpec ax{0.0, static_cast<double>(info.width) / d, 0, image.width, rw, box.left,
                    crop_size};
  const AxisSpec ay{0.0, static_cast<double>(info.height) / d, 0, image.height, rh, box.top,
                    crop_size};
  resample<3>(image, ax, ay, write);
}

at::Tensor EvalTransform::operator()(std::span<const std::byte> encoded) const {
  at::Tensor out = at::empty({3, crop_size, crop_size}, at::kFloat);
  (*this)(encoded, out.data_ptr<float>());
  return out;
}

}  // namespace coload::vision
