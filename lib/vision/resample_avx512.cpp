// The AVX-512 forms of lib/vision/resample.hpp's passes (AVX-512 VBMI/VNNI horizontal window
// kernel, AVX-512 VNNI vertical pass), chosen at run time where the CPU has them and the SIMD
// cap (set_simd_level) is avx512: the AVX2 kernels' arithmetic, so the same bytes.

#include "resample.hpp"

#ifdef COLOAD_VISION_X86
#include <immintrin.h>
#endif

#include <cstddef>
#include <cstdint>

namespace coload::vision::detail {
namespace {

#ifdef COLOAD_VISION_X86
const bool cpu_avx512vbmi = __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vbmi");
const bool cpu_avx512vnni = __builtin_cpu_supports("avx512vnni");
const bool cpu_avx512bw = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("bmi2");

// The window pass for 3 to 7 taps (Pairs 2 to 4) with AVX-512 VBMI and VNNI:
// four output pixels per register, one per 128-bit lane, from one 64-byte load at the first
// one's window; a byte permute per step takes each lane's pairs of pixels out of it
// (PackedWeights::indices: pack_weights keeps every quad's windows inside those 64 bytes, else
// packs for AVX2), and vpdpwssd multiplies and adds them as vpmaddwd then vpaddd would. The
// same products and sums as the AVX2 kernel's, so the same bytes. Reads 64 bytes from a quad's
// first window start.
// NOTE: GCC 12 warns that its own AVX-512 intrinsics' pass-through (_mm512_undefined_epi32)
// "may be used uninitialized" in this function; it is not: silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int Pairs>
[[gnu::target("avx512f,avx512bw,avx512vbmi,avx512vnni")]] void horizontal_row_rgb_avx512(
    const std::uint8_t* __restrict in, std::uint8_t* __restrict out, int n_out,
    const int* __restrict start, const std::int32_t* __restrict packed_hi,
    const std::int32_t* __restrict packed_lo, const std::uint8_t* __restrict indices) {
  static_assert(Pairs >= 2 && Pairs <= 4);
  constexpr __mmask64 words = 0x0555055505550555ull;  // bytes 0, 2, .., 10 of each lane
  const __m512i half = _mm512_set1_epi32(1 << (precision_bits - 1));
  // The three bytes of each of the four pixels, in order: 12 bytes, then 4 overwritten later.
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  int x = 0;
  for (; x + 4 <= n_out; x += 4) {
    const __m512i window = _mm512_loadu_si512(in + static_cast<std::ptrdiff_t>(start[x]) * 3);
    const std::uint8_t* index = indices + static_cast<std::ptrdiff_t>(x / 4) * Pairs * 64;
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x / 4) * Pairs * 16;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x / 4) * Pairs * 16;
    __m512i sum_hi = _mm512_setzero_si512();
    __m512i sum_lo = _mm512_setzero_si512();
    for (int j = 0; j < Pairs; ++j) {
      const __m512i px =
          _mm512_maskz_permutexvar_epi8(words, _mm512_loadu_si512(index + 64 * j), window);
      sum_hi = _mm512_dpwssd_epi32(sum_hi, px, _mm512_loadu_si512(hi + 16 * j));
      sum_lo = _mm512_dpwssd_epi32(sum_lo, px, _mm512_loadu_si512(lo + 16 * j));
    }
    __m512i v = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(sum_hi, 11), sum_lo), half);
    v = _mm512_max_epi32(_mm512_srai_epi32(v, precision_bits), _mm512_setzero_si512());
    const __m128i bytes = _mm_shuffle_epi8(_mm512_cvtusepi32_epi8(v), compact);  // clamps to 255
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 3 * x), bytes);
  }
  // The last pixels, from the quad layout's words, as the AVX2 kernel's odd last pixel.
  for (; x < n_out; ++x) {
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(start[x]) * 3;
    const std::int32_t* hi = packed_hi + static_cast<std::ptrdiff_t>(x / 4) * Pairs * 16 + (x % 4) * 4;
    const std::int32_t* lo = packed_lo + static_cast<std::ptrdiff_t>(x / 4) * Pairs * 16 + (x % 4) * 4;
    std::int32_t sum[3] = {1 << (precision_bits - 1), 1 << (precision_bits - 1),
                           1 << (precision_bits - 1)};
    for (int j = 0; j < Pairs; ++j) {
      const auto h = static_cast<std::uint32_t>(hi[16 * j]);
      const auto l = static_cast<std::uint32_t>(lo[16 * j]);
      const std::int32_t w0 = static_cast<std::int16_t>(h & 0xffff) * 2048 + static_cast<std::int16_t>(l & 0xffff);
      const std::int32_t w1 = static_cast<std::int16_t>(h >> 16) * 2048 + static_cast<std::int16_t>(l >> 16);
      for (int c = 0; c < 3; ++c) sum[c] += p[6 * j + c] * w0 + p[6 * j + 3 + c] * w1;
    }
    for (int c = 0; c < 3; ++c) out[3 * x + c] = clip8(sum[c]);
  }
}
#endif

}  // namespace

bool use_avx512_window() noexcept {
#ifdef COLOAD_VISION_X86
  return cpu_avx512vbmi && cpu_avx512vnni &&
         simd_level_cap() >= SimdLevel::avx512;
#else
  return false;
#endif
}

void horizontal_row_quads(const std::uint8_t* in, std::uint8_t* out, int n_out, const int* start,
                          const PackedWeights& p) {
#ifdef COLOAD_VISION_X86
  switch (p.max_pairs) {
    case 2:
      return horizontal_row_rgb_avx512<2>(in, out, n_out, start, p.hi.data(), p.lo.data(),
                                          p.indices.data());
    case 3:
      return horizontal_row_rgb_avx512<3>(in, out, n_out, start, p.hi.data(), p.lo.data(),
                                          p.indices.data());
    default:
      return horizontal_row_rgb_avx512<4>(in, out, n_out, start, p.hi.data(), p.lo.data(),
                                          p.indices.data());
  }
#else
  (void)in, (void)out, (void)n_out, (void)start, (void)p;
#endif
}

#ifdef COLOAD_VISION_X86
namespace {

// The vertical pass with AVX-512 and VNNI: vertical_row_avx2's arithmetic (each weight as
// hi * 2^11 + lo, two rows' bytes multiply-added per 16-bit pair), 64 output bytes at a time,
// vpdpwssd adding as it multiplies; the last bytes through masked loads and stores.
[[gnu::target("avx512f,avx512bw,avx512vl,avx512vnni")]] inline __m512i vertical_words32(
    const std::uint8_t* base, std::size_t row_bytes, int n, const __m512i* wh, const __m512i* wl,
    std::size_t i, __mmask32 keep) {
  // Per 128-bit lane k: values 8k..8k+3 (lo) and 8k+4..8k+7 (hi).
  __m512i lo_h = _mm512_setzero_si512(), lo_l = lo_h, hi_h = lo_h, hi_l = lo_h;
  for (int t = 0; t < n; t += 2) {
    const std::uint8_t* r0 = base + static_cast<std::size_t>(t) * row_bytes + i;
    const __m512i a = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(keep, r0));
    const __m512i b = t + 1 < n ? _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(keep, r0 + row_bytes))
                                : _mm512_setzero_si512();
    const __m512i lo = _mm512_unpacklo_epi16(a, b);
    const __m512i hi = _mm512_unpackhi_epi16(a, b);
    lo_h = _mm512_dpwssd_epi32(lo_h, lo, wh[t / 2]);
    lo_l = _mm512_dpwssd_epi32(lo_l, lo, wl[t / 2]);
    hi_h = _mm512_dpwssd_epi32(hi_h, hi, wh[t / 2]);
    hi_l = _mm512_dpwssd_epi32(hi_l, hi, wl[t / 2]);
  }
  const __m512i half = _mm512_set1_epi32(1 << (precision_bits - 1));
  const __m512i lo = _mm512_srai_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(lo_h, 11), lo_l), half), precision_bits);
  const __m512i hi = _mm512_srai_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi_h, 11), hi_l), half), precision_bits);
  return _mm512_packs_epi32(lo, hi);  // the 32 values in order, clamped to int16
}

[[gnu::target("avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]] void vertical_row_avx512_body(
    const std::uint8_t* base, std::size_t row_bytes, int n, const __m512i* wh, const __m512i* wl,
    std::uint8_t* out) {
  // packus interleaves per lane (x's 8 bytes, then y's): the quadwords back in order.
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  constexpr __mmask32 all = ~__mmask32{0};
  std::size_t i = 0;
  for (; i + 64 <= row_bytes; i += 64) {
    const __m512i x = vertical_words32(base, row_bytes, n, wh, wl, i, all);
    const __m512i y = vertical_words32(base, row_bytes, n, wh, wl, i + 32, all);
    _mm512_storeu_si512(out + i, _mm512_permutexvar_epi64(order, _mm512_packus_epi16(x, y)));
  }
  if (i < row_bytes) {
    const std::size_t left = row_bytes - i;  // 1..63
    const __mmask32 first = left >= 32 ? all : _bzhi_u32(all, static_cast<unsigned>(left));
    const __mmask32 second = left > 32 ? _bzhi_u32(all, static_cast<unsigned>(left - 32)) : 0;
    const __m512i x = vertical_words32(base, row_bytes, n, wh, wl, i, first);
    const __m512i y = second ? vertical_words32(base, row_bytes, n, wh, wl, i + 32, second)
                             : _mm512_setzero_si512();
    _mm512_mask_storeu_epi8(out + i, _bzhi_u64(~__mmask64{0}, static_cast<unsigned>(left)),
                            _mm512_permutexvar_epi64(order, _mm512_packus_epi16(x, y)));
  }
}

}  // namespace

#pragma GCC diagnostic pop
#endif

#ifdef COLOAD_VISION_X86
[[gnu::target("avx512f,avx512bw,avx512vl,avx512vnni")]] bool vertical_row_avx512(
    const std::uint8_t* base, std::size_t row_bytes, int n, const std::int32_t* w,
    std::uint8_t* out) {
  // As vertical_row_avx2, a long filter (a large downscale) takes the generic loop.
  constexpr int max_pairs = 16;
  if (!cpu_avx512vnni || !cpu_avx512bw || n > 2 * max_pairs ||
      simd_level_cap() < SimdLevel::avx512) {
    return false;
  }
  alignas(64) __m512i wh[max_pairs];
  alignas(64) __m512i wl[max_pairs];
  auto pair = [](std::int32_t a, std::int32_t b) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint16_t>(a)) |
                                     (static_cast<std::uint32_t>(static_cast<std::uint16_t>(b)) << 16));
  };
  for (int t = 0; t < n; t += 2) {
    const std::int32_t w1 = t + 1 < n ? w[t + 1] : 0;
    wh[t / 2] = _mm512_set1_epi32(pair(w[t] >> 11, w1 >> 11));
    wl[t / 2] = _mm512_set1_epi32(pair(w[t] & 2047, w1 & 2047));
  }
  vertical_row_avx512_body(base, row_bytes, n, wh, wl, out);
  return true;
}
#endif


}  // namespace coload::vision::detail
