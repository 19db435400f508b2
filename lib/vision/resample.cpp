// The resampling kernels and weights of lib/vision/resample.hpp: Pillow's arithmetic, and
// its SSSE3/AVX2 forms, chosen at run time.

#include "resample.hpp"

#ifdef COLOAD_VISION_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace coload::vision {
namespace detail {
namespace {

inline double triangle(double x) noexcept {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}


}  // namespace

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


namespace {

// The first `bytes` bytes of an output row; source rows are `row_bytes` apart.
[[gnu::always_inline]] inline void vertical_body(const std::uint8_t* __restrict base,
                                                std::size_t row_bytes, int n,
                                                const std::int32_t* __restrict w,
                                                std::int32_t* __restrict acc,
                                                std::uint8_t* __restrict out, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) acc[i] = std::int32_t{1} << (precision_bits - 1);
  for (int t = 0; t < n; ++t) {
    const std::uint8_t* __restrict r = base + static_cast<std::size_t>(t) * row_bytes;
    const std::int32_t wt = w[t];
    for (std::size_t i = 0; i < bytes; ++i) acc[i] += r[i] * wt;
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<std::uint8_t>(std::clamp(acc[i] >> precision_bits, 0, 255));
  }
}

void vertical_row_generic(const std::uint8_t* base, std::size_t row_bytes, int n,
                          const std::int32_t* w, std::int32_t* acc, std::uint8_t* out) {
  vertical_body(base, row_bytes, n, w, acc, out, row_bytes);
}

#ifdef COLOAD_VISION_X86
// The vertical pass with AVX2, 32 output bytes at a time with every tap summed in registers
// (the generic loop sweeps the whole row's accumulators once per tap, through memory).
// NOTE: as in the horizontal pass, each 22-bit weight is split as hi * 2^11 + lo so that two
// taps (rows t and t + 1) multiply-add as one pair of 16-bit lanes: the sums are Pillow's,
// exactly. Bytes past the last multiple of 16 take the generic loop.
#define COLOAD_AVX2_INLINE [[gnu::target("avx2"), gnu::always_inline]] inline

// Weights `a` and `b` as 16-bit halves of every 32-bit lane.
COLOAD_AVX2_INLINE __m256i weight_pair(std::int32_t a, std::int32_t b) {
  return _mm256_set1_epi32(
      static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint16_t>(a)) |
                                (static_cast<std::uint32_t>(static_cast<std::uint16_t>(b)) << 16)));
}

// The 16 output bytes at `i` as 16 signed words in order (per lane: values 0-7, then 8-15),
// each clamped as clip8 clamps once packus_epi16 follows. `wh` and `wl`: for each pair of taps,
// weight_pair of their hi and lo halves.
COLOAD_AVX2_INLINE __m256i vertical_words16(const std::uint8_t* base, std::size_t row_bytes,
                                            int n, const __m256i* wh, const __m256i* wl,
                                            std::size_t i) {
  // Values 0-3 and 8-11 (lo) and 4-7 and 12-15 (hi), for the hi and lo halves of the weights.
  __m256i lo_h = _mm256_setzero_si256(), lo_l = lo_h, hi_h = lo_h, hi_l = lo_h;
  for (int t = 0; t < n; t += 2) {
    const std::uint8_t* r0 = base + static_cast<std::size_t>(t) * row_bytes + i;
    const bool two = t + 1 < n;
    const __m256i a =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0)));
    const __m256i b = two ? _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(r0 + row_bytes)))
                          : _mm256_setzero_si256();
    const __m256i lo = _mm256_unpacklo_epi16(a, b);
    const __m256i hi = _mm256_unpackhi_epi16(a, b);
    lo_h = _mm256_add_epi32(lo_h, _mm256_madd_epi16(lo, wh[t / 2]));
    lo_l = _mm256_add_epi32(lo_l, _mm256_madd_epi16(lo, wl[t / 2]));
    hi_h = _mm256_add_epi32(hi_h, _mm256_madd_epi16(hi, wh[t / 2]));
    hi_l = _mm256_add_epi32(hi_l, _mm256_madd_epi16(hi, wl[t / 2]));
  }
  const __m256i half = _mm256_set1_epi32(1 << (precision_bits - 1));
  const __m256i lo = _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(lo_h, 11), lo_l), half), precision_bits);
  const __m256i hi = _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi_h, 11), hi_l), half), precision_bits);
  return _mm256_packs_epi32(lo, hi);
}

[[gnu::target("avx2")]] void vertical_row_avx2(const std::uint8_t* base, std::size_t row_bytes,
                                               int n, const std::int32_t* w, std::int32_t* acc,
                                               std::uint8_t* out) {
  // The weights of a long filter (a large downscale) take the generic loop.
  constexpr int max_pairs = 16;
  if (n > 2 * max_pairs) return vertical_body(base, row_bytes, n, w, acc, out, row_bytes);
  __m256i wh[max_pairs];
  __m256i wl[max_pairs];
  for (int t = 0; t < n; t += 2) {
    const std::int32_t w1 = t + 1 < n ? w[t + 1] : 0;
    wh[t / 2] = weight_pair(w[t] >> 11, w1 >> 11);
    wl[t / 2] = weight_pair(w[t] & 2047, w1 & 2047);
  }
  std::size_t i = 0;
  for (; i + 32 <= row_bytes; i += 32) {
    const __m256i x = vertical_words16(base, row_bytes, n, wh, wl, i);
    const __m256i y = vertical_words16(base, row_bytes, n, wh, wl, i + 16);
    // packus interleaves the lanes (x 0-7, y 0-7 | x 8-15, y 8-15): put the quarters back.
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(x, y), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
  }
  for (; i + 16 <= row_bytes; i += 16) {
    const __m256i x = vertical_words16(base, row_bytes, n, wh, wl, i);
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(x, x), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(bytes));
  }
  if (i < row_bytes) vertical_body(base + i, row_bytes, n, w, acc, out + i, row_bytes - i);
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

// Rounds, shifts and clamps a pixel pair's sums (one pixel per 128-bit lane, the weights' hi and
// lo halves apart) and stores the two RGB pixels at `out`. Four bytes are stored per pixel, three
// kept: the fourth is overwritten by the next pixel (the output row has slack after its end).
COLOAD_AVX2_INLINE void store_pixel_pair(__m256i sum_hi, __m256i sum_lo, std::uint8_t* out) {
  const __m256i half = _mm256_set1_epi32(1 << (precision_bits - 1));
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(sum_hi, 11), sum_lo), half);
  s = _mm256_srai_epi32(s, precision_bits);
  s = _mm256_packus_epi16(_mm256_packs_epi32(s, s), s);  // per lane, saturating to 0..255
  const std::int32_t v0 = _mm256_extract_epi32(s, 0);
  const std::int32_t v1 = _mm256_extract_epi32(s, 4);
  std::memcpy(out, &v0, 4);
  std::memcpy(out + 3, &v1, 4);
}

// The same pass with AVX2, two output pixels per 256-bit register (one per 128-bit lane).
// `packed_hi`/`packed_lo` hold, for each pair of output pixels and each step, eight words: the
// first pixel's packed weights four times, then the second's.
// `from`: the first output pixel (even) to compute; the ones before are left as they are.
template <int Pairs>
[[gnu::target("avx2")]] void horizontal_row_rgb_avx2(
    const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
    const int* __restrict start, int max_pairs, const std::int32_t* __restrict packed_hi,
    const std::int32_t* __restrict packed_lo, int from) {
  const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const int steps = Pairs > 0 ? Pairs : max_pairs;
  int x = from;
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
    store_pixel_pair(sum_hi, sum_lo, out + 3 * x);
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

// The shuffles of the window kernel below: step j spreads pixels 2j and 2j + 1 (bytes 6j.. and
// 6j + 3..) of a 16-byte window into 16-bit (tap, tap + 1) pairs per channel, in both lanes;
// bytes past the load (the zero-weight sixth tap) read as zero. Built once, at compile time.
struct alignas(32) WindowMask {
  std::int8_t bytes[32];
};
constexpr WindowMask window_mask(int j) {
  constexpr int order[6] = {0, 3, 1, 4, 2, 5};  // (tap, tap + 1) for R, then G, then B
  WindowMask m{};
  for (int k = 0; k < 32; ++k) {
    const int i = k % 16;
    const int byte = i < 12 && i % 2 == 0 ? 6 * j + order[i / 2] : -1;
    m.bytes[k] = static_cast<std::int8_t>(byte < 16 ? byte : -1);
  }
  return m;
}
constexpr WindowMask window_masks[3] = {window_mask(0), window_mask(1), window_mask(2)};

// The AVX2 pass for windows of at most 5 taps (Pairs 2 or 3: the window's 15 bytes fit one
// 16-byte load; ksize is odd, so a sixth tap's weight is always zero). Each output pixel's window
// is loaded once and every step takes its pair of pixels from it with one shuffle, where the
// general kernel above loads and inserts again for each step. Reads 16 bytes from a window's
// start (the caller pads rows with less after them: resample in resample.hpp).
template <int Pairs>
[[gnu::target("avx2")]] void horizontal_row_rgb_avx2_window(
    const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
    const int* __restrict start, int max_pairs, const std::int32_t* __restrict packed_hi,
    const std::int32_t* __restrict packed_lo) {
  static_assert(Pairs == 2 || Pairs == 3);
  __m256i masks[Pairs];
  for (int j = 0; j < Pairs; ++j) {
    masks[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(window_masks[j].bytes));
  }
  int x = 0;
  for (; x + 1 < n_out; x += 2) {
    const std::uint8_t* p0 = in + static_cast<std::ptrdiff_t>(start[x]) * 3;
    const std::uint8_t* p1 = in + static_cast<std::ptrdiff_t>(start[x + 1]) * 3;
    const __m256i window = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x / 2) * Pairs * 8;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x / 2) * Pairs * 8;
    __m256i sum_hi = _mm256_setzero_si256();
    __m256i sum_lo = _mm256_setzero_si256();
    for (int j = 0; j < Pairs; ++j) {
      const __m256i px = _mm256_shuffle_epi8(window, masks[j]);
      const __m256i wh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + 8 * j));
      const __m256i wl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + 8 * j));
      sum_hi = _mm256_add_epi32(sum_hi, _mm256_madd_epi16(px, wh));
      sum_lo = _mm256_add_epi32(sum_lo, _mm256_madd_epi16(px, wl));
    }
    store_pixel_pair(sum_hi, sum_lo, out + 3 * x);
  }
  // The odd last pixel, as the general kernel does it.
  if (x < n_out) {
    horizontal_row_rgb_avx2<Pairs>(in, out, n_out, start, max_pairs, packed_hi, packed_lo, x);
  }
}

// The general AVX2 kernel as a HorizontalKernel.
template <int Pairs>
[[gnu::target("avx2")]] void horizontal_row_rgb_avx2_all(
    const std::uint8_t* in, std::uint8_t* out, int n_out, const int* start, int max_pairs,
    const std::int32_t* packed_hi, const std::int32_t* packed_lo) {
  horizontal_row_rgb_avx2<Pairs>(in, out, n_out, start, max_pairs, packed_hi, packed_lo, 0);
}
#undef COLOAD_AVX2_INLINE

#endif
}  // namespace

#ifdef COLOAD_VISION_X86

HorizontalKernel horizontal_kernel_avx2(int max_pairs) {
  switch (max_pairs) {
    case 1: return horizontal_row_rgb_avx2_all<1>;
    case 2: return horizontal_row_rgb_avx2_window<2>;
    case 3: return horizontal_row_rgb_avx2_window<3>;
    case 4: return horizontal_row_rgb_avx2_all<4>;
    case 5: return horizontal_row_rgb_avx2_all<5>;
    default: return horizontal_row_rgb_avx2_all<0>;
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

#endif

namespace {

#ifdef COLOAD_VISION_X86
const bool cpu_avx2 = __builtin_cpu_supports("avx2");
const bool cpu_ssse3 = __builtin_cpu_supports("ssse3");
#else
const bool cpu_avx2 = false;
const bool cpu_ssse3 = false;
#endif

std::atomic<detail::SimdLevel> simd_cap{detail::SimdLevel::avx512};

}  // namespace

bool use_avx2() noexcept { return cpu_avx2 && simd_cap.load(std::memory_order_relaxed) >= detail::SimdLevel::avx2; }
bool use_ssse3() noexcept { return cpu_ssse3 && simd_cap.load(std::memory_order_relaxed) >= detail::SimdLevel::ssse3; }

void vertical_row(const std::uint8_t* base, std::size_t row_bytes, int n, const std::int32_t* w,
                  std::int32_t* acc, std::uint8_t* out) {
#ifdef COLOAD_VISION_X86
  if (vertical_row_avx512(base, row_bytes, n, w, out)) return;
  if (use_avx2()) return vertical_row_avx2(base, row_bytes, n, w, acc, out);
#endif
  vertical_row_generic(base, row_bytes, n, w, acc, out);
}

namespace {

void normalize_row_scalar(const float (*table)[256], const std::uint8_t* __restrict row, int from,
                          int width, bool flip, float* __restrict r, float* __restrict g,
                          float* __restrict b) {
  for (int x = from; x < width; ++x) {
    const std::uint8_t* p = row + 3 * (flip ? width - 1 - x : x);
    r[x] = table[0][p[0]];
    g[x] = table[1][p[1]];
    b[x] = table[2][p[2]];
  }
}

#ifdef COLOAD_VISION_X86
const bool cpu_avx512vbmi = __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vbmi");

// The byte indices that pick channel c of 16 RGB pixels out of 48 bytes, in order or mirrored,
// into the low byte of each dword (the others are masked to zero).
struct alignas(64) ChannelPick {
  std::uint8_t bytes[64];
};
constexpr ChannelPick channel_pick(int c, bool mirrored) {
  ChannelPick p{};
  for (int k = 0; k < 16; ++k) {
    p.bytes[4 * k] = static_cast<std::uint8_t>(3 * (mirrored ? 15 - k : k) + c);
  }
  return p;
}
constexpr ChannelPick channel_picks[2][3] = {
    {channel_pick(0, false), channel_pick(1, false), channel_pick(2, false)},
    {channel_pick(0, true), channel_pick(1, true), channel_pick(2, true)}};

// NOTE: GCC 12 warns that its own AVX-512 intrinsics' pass-through (_mm512_undefined_*) in the
// gathers and byte permutes below "may be" or "is" used uninitialized; it is not (the masks
// zero or overwrite every lane): silenced for these two functions only, as resample_avx512.cpp
// does for its window kernel.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Rows of fewer than 64 pixels, 16 at a time: returns the first pixel it left to the scalar
// loop.
[[gnu::target("avx512f,avx512bw,avx512vbmi")]] int normalize_row_avx512(
    const float (*table)[256], const std::uint8_t* row, int width, bool flip, float* r, float* g,
    float* b) {
  const ChannelPick* picks = channel_picks[flip ? 1 : 0];
  const __m512i pick_r = _mm512_load_si512(picks[0].bytes);
  const __m512i pick_g = _mm512_load_si512(picks[1].bytes);
  const __m512i pick_b = _mm512_load_si512(picks[2].bytes);
  constexpr __mmask64 bytes48 = (__mmask64{1} << 48) - 1;
  // The channel's byte of pixel k into the low byte of dword k, the other bytes zero.
  constexpr __mmask64 low_bytes = 0x1111111111111111ull;
  int x = 0;
  for (; x + 16 <= width; x += 16) {
    // Outputs x..x+15 read source pixels x..x+15, or width-16-x..width-1-x mirrored.
    const std::uint8_t* p = row + 3 * (flip ? width - 16 - x : x);
    const __m512i v = _mm512_maskz_loadu_epi8(bytes48, p);
    const __m512i ir = _mm512_maskz_permutexvar_epi8(low_bytes, pick_r, v);
    const __m512i ig = _mm512_maskz_permutexvar_epi8(low_bytes, pick_g, v);
    const __m512i ib = _mm512_maskz_permutexvar_epi8(low_bytes, pick_b, v);
    const __m512 fr = _mm512_i32gather_ps(ir, table[0], 4);
    const __m512 fg = _mm512_i32gather_ps(ig, table[1], 4);
    const __m512 fb = _mm512_i32gather_ps(ib, table[2], 4);
    _mm512_storeu_ps(r + x, fr);
    _mm512_storeu_ps(g + x, fg);
    _mm512_storeu_ps(b + x, fb);
  }
  return x;
}

// For 64 pixels of one channel: which of the block's 192 source bytes goes to each byte of the
// index vector. Not in pixel order: the byte unpacks that join a value's four bytes work within
// 16-byte lanes, so byte 16 l + 4 m + i holds pixel 16 m + 4 l + i, and the unpacks' m-th
// result is then pixels 16 m to 16 m + 15 in order (lane l: 16 m + 4 l to 16 m + 4 l + 3).
struct alignas(64) BlockPick {
  std::uint8_t bytes[64];
};
constexpr BlockPick block_pick(int c, bool mirrored) {
  BlockPick p{};
  for (int l = 0; l < 4; ++l) {
    for (int m = 0; m < 4; ++m) {
      for (int i = 0; i < 4; ++i) {
        const int k = 16 * m + 4 * l + i;  // the output pixel
        p.bytes[16 * l + 4 * m + i] = static_cast<std::uint8_t>(3 * (mirrored ? 63 - k : k) + c);
      }
    }
  }
  return p;
}
constexpr BlockPick block_picks[2][3] = {
    {block_pick(0, false), block_pick(1, false), block_pick(2, false)},
    {block_pick(0, true), block_pick(1, true), block_pick(2, true)}};

// Rows of at least 64 pixels, 64 at a time, the last block overlapping the one before where
// the width is not a multiple of 64 (it writes the same floats again). Per channel: the 64
// source bytes picked out of the block's 192 (two permutes and a blend), then each of a
// float's four bytes looked up in its 256-byte plane (two permutes of 128 bytes and a blend
// on the index's top bit), then the four bytes joined by unpacks: 24 byte operations for 64
// values, where a gather takes about as long for 16.
[[gnu::target("avx512f,avx512bw,avx512vbmi")]] void normalize_row_avx512_64(
    const NormalizeTable& t, const std::uint8_t* row, int width, bool flip, float* r, float* g,
    float* b) {
  float* const out[3] = {r, g, b};
  for (int c = 0; c < 3; ++c) {
    const __m512i pick = _mm512_load_si512(block_picks[flip ? 1 : 0][c].bytes);
    const __mmask64 from_third = _mm512_movepi8_mask(pick);  // bytes 128-191 of the block
    __m512i plane[4][4];
    for (int j = 0; j < 4; ++j) {
      for (int q = 0; q < 4; ++q) plane[j][q] = _mm512_loadu_si512(t.planes[c][j] + 64 * q);
    }
    float* const dst = out[c];
    for (int x = 0;;) {
      // Outputs x..x+63 read source pixels x..x+63, or width-64-x..width-1-x mirrored.
      const std::uint8_t* p = row + 3 * (flip ? width - 64 - x : x);
      const __m512i s0 = _mm512_loadu_si512(p);
      const __m512i s1 = _mm512_loadu_si512(p + 64);
      const __m512i s2 = _mm512_loadu_si512(p + 128);
      const __m512i u = _mm512_mask_blend_epi8(from_third, _mm512_permutex2var_epi8(s0, pick, s1),
                                               _mm512_permutexvar_epi8(pick, s2));
      const __mmask64 high = _mm512_movepi8_mask(u);  // values 128-255
      __m512i byte[4];
      for (int j = 0; j < 4; ++j) {
        byte[j] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(plane[j][0], u, plane[j][1]),
                                         _mm512_permutex2var_epi8(plane[j][2], u, plane[j][3]));
      }
      const __m512i lo01 = _mm512_unpacklo_epi8(byte[0], byte[1]);
      const __m512i hi01 = _mm512_unpackhi_epi8(byte[0], byte[1]);
      const __m512i lo23 = _mm512_unpacklo_epi8(byte[2], byte[3]);
      const __m512i hi23 = _mm512_unpackhi_epi8(byte[2], byte[3]);
      _mm512_storeu_si512(dst + x, _mm512_unpacklo_epi16(lo01, lo23));
      _mm512_storeu_si512(dst + x + 16, _mm512_unpackhi_epi16(lo01, lo23));
      _mm512_storeu_si512(dst + x + 32, _mm512_unpacklo_epi16(hi01, hi23));
      _mm512_storeu_si512(dst + x + 48, _mm512_unpackhi_epi16(hi01, hi23));
      if (x + 64 == width) break;
      x = std::min(x + 64, width - 64);
    }
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void normalize_row(const NormalizeTable& table, const std::uint8_t* row, int width, int height,
                   int y, bool flip, float* dst) {
  const std::size_t plane = static_cast<std::size_t>(width) * height;
  float* r = dst + static_cast<std::size_t>(y) * width;
  float* g = r + plane;
  float* b = g + plane;
  int from = 0;
#ifdef COLOAD_VISION_X86
  if (cpu_avx512vbmi && simd_cap.load(std::memory_order_relaxed) >= SimdLevel::avx512) {
    if (width >= 64) return normalize_row_avx512_64(table, row, width, flip, r, g, b);
    from = normalize_row_avx512(table.value, row, width, flip, r, g, b);
  }
#endif
  normalize_row_scalar(table.value, row, from, width, flip, r, g, b);
}

void pack_weights(const AxisCoeffs& c, PackedWeights& p, int group) {
  const std::size_t n = c.start.size();
  const auto pairs = static_cast<std::size_t>((c.ksize + 1) / 2);
  p.max_pairs = static_cast<int>(pairs);
  p.indices.clear();
  if (group == 4) {
    // Quads for the AVX-512 window kernel where every quad's four windows (their start, plus
    // the 6 x pairs bytes a window's steps read) lie within 64 bytes of its first: else pairs.
    // Per (quad, step) the permute's 64 byte indices: lane i's (tap, tap + 1) pairs of R, G, B
    // (bytes 6 step + 0, 3, 1, 4, 2, 5 of its window) in its even bytes 0-10, the rest zeroed
    // by the kernel's mask (index 0 there).
    constexpr int order[6] = {0, 3, 1, 4, 2, 5};
    if (pairs < 2 || pairs > 4) group = 2;
    p.indices.assign((n + 3) / 4 * pairs * 64, 0);
    for (std::size_t x = 0; group == 4 && x < n; ++x) {
      const int offset = 3 * (c.start[x] - c.start[x / 4 * 4]);
      if (offset < 0 || offset + 6 * static_cast<int>(pairs) > 64) {
        group = 2;
        break;
      }
      for (std::size_t j = 0; j < pairs; ++j) {
        std::uint8_t* lane = p.indices.data() + ((x / 4) * pairs + j) * 64 + (x % 4) * 16;
        for (int b = 0; b < 12; b += 2) {
          lane[b] = static_cast<std::uint8_t>(offset + 6 * static_cast<int>(j) + order[b / 2]);
        }
      }
    }
    if (group != 4) p.indices.clear();
  }
  p.group = group;
  // SSSE3 layout (group 1): one word per (pixel, step). AVX2 (2) and AVX-512 (4) layouts: per
  // (group of pixels, step) 4 x group words, each pixel's word four times, in order.
  const auto g = static_cast<std::size_t>(group);
  const std::size_t words = group > 1 ? (n + g - 1) / g * pairs * 4 * g : n * pairs;
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
      if (group > 1) {
        const std::size_t base = (x / g) * pairs * 4 * g + j * 4 * g + (x % g) * 4;
        std::fill_n(p.hi.begin() + static_cast<std::ptrdiff_t>(base), 4, hi);
        std::fill_n(p.lo.begin() + static_cast<std::ptrdiff_t>(base), 4, lo);
      } else {
        p.hi[x * pairs + j] = hi;
        p.lo[x * pairs + j] = lo;
      }
    }
  }
}

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


Image resample_to_image(const ImageView& src, const AxisSpec& ax, const AxisSpec& ay) {
  Image out = Image::zeros(ax.count, ay.count, src.channels);
  const std::size_t row_bytes = static_cast<std::size_t>(ax.count) * src.channels;
  resample_any(src, ax, ay, [&](int y, const std::uint8_t* row) {
    std::memcpy(out.data.data() + static_cast<std::size_t>(y) * row_bytes, row, row_bytes);
  });
  return out;
}

}  // namespace detail

detail::SimdLevel detail::simd_level_cap() noexcept {
  return simd_cap.load(std::memory_order_relaxed);
}

detail::SimdLevel detail::set_simd_level(SimdLevel level) noexcept {
  return simd_cap.exchange(level);
}

}  // namespace coload::vision
