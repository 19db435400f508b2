// The Huffman decoding of restart intervals for the region decoder (see restart_entropy.hpp):
// JPEG's sequential Huffman coding (ITU T.81 F.2.2) over pre-unstuffed intervals, with a
// 64-bit bit buffer refilled eight bytes at a time and a 10-bit lookup that decodes most AC
// coefficients (code and value together) in one step.
//
// NOTE: decode_mcu runs inside libjpeg's frames, between the region decoder's setjmp and its
// longjmp: no C++ object with a destructor lives here, and a failure is libjpeg's error_exit.

#include "restart_entropy.hpp"

#include <cstdio>
#include <cstring>
// jpeglib.h needs FILE and size_t declared first; jpegint.h has the entropy decoder's struct
// (struct jpeg_entropy_decoder: start_pass, decode_mcu, insufficient_data since libjpeg 6).
#include <jpeglib.h>
#define JPEG_INTERNALS
#include <jpegint.h>
#include <jerror.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <new>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace coload::vision::detail {

bool use_avx2() noexcept;  // resample.hpp's (whose header brings ATen's)

std::size_t RestartSegments::append_until_marker(std::span<const std::byte> data,
                                                 std::size_t pos, unsigned& marker) {
  const auto* base = reinterpret_cast<const std::uint8_t*>(data.data());
  const std::uint8_t* p = base + pos;
  const std::uint8_t* const end = base + data.size();
  const std::size_t at = used;
  begin.push_back(static_cast<std::uint32_t>(at));
  // `bytes` only grows (a thread's segments are reused from crop to crop); room for `n` more
  // bytes and the padding.
  auto room = [this](std::size_t n) {
    if (bytes.size() < used + n + padding) bytes.resize(std::max(used + n + padding, 2 * bytes.size()));
  };
  std::size_t found = data.size();
  while (p < end) {
    const std::uint8_t* stop = end;
#if defined(__SSE2__)
    // Copied 16 bytes at a time up to the first FF (one every few hundred bytes of entropy
    // data): a memchr and a memcpy call per FF cost about 2% of a --fast-crop image's CPU.
    room(static_cast<std::size_t>(end - p) + 16);
    std::uint8_t* to = bytes.data() + used;
    const std::uint8_t* const from = p;
    const __m128i ff = _mm_set1_epi8(static_cast<char>(0xff));
    for (; end - p >= 16; p += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + (p - from)), v);
      if (const int mask = _mm_movemask_epi8(_mm_cmpeq_epi8(v, ff))) {
        stop = p + __builtin_ctz(static_cast<unsigned>(mask));
        break;
      }
    }
    if (stop == end) {
      const void* f = std::memchr(p, 0xff, static_cast<std::size_t>(end - p));
      if (f) stop = static_cast<const std::uint8_t*>(f);
      std::memcpy(to + (p - from), p, static_cast<std::size_t>(stop - p));
    }
    used += static_cast<std::size_t>(stop - from);
    p = stop;
#else
    const void* ff = std::memchr(p, 0xff, static_cast<std::size_t>(end - p));
    if (ff) stop = static_cast<const std::uint8_t*>(ff);
    const auto n = static_cast<std::size_t>(stop - p);
    room(n + 1);
    std::memcpy(bytes.data() + used, p, n);
    used += n;
    p = stop;
#endif
    if (p == end) break;
    while (p + 1 < end && p[1] == 0xff) ++p;  // fill bytes before the FF that counts
    if (p + 1 == end) break;                  // an FF at the data's end: no marker
    if (p[1] != 0x00) {
      marker = p[1];
      found = static_cast<std::size_t>(p - base);
      break;
    }
    bytes[used++] = 0xff;  // FF 00: a data byte FF
    p += 2;
  }
  room(0);
  size.push_back(static_cast<std::uint32_t>(used - at));
  std::memset(bytes.data() + used, 0, padding);
  used += padding;
  return found;
}

namespace {

constexpr int fast_bits = 11;
constexpr int fast_size = 1 << fast_bits;

// The zigzag order of T.81 figure A.6: position k of the coded sequence is natural index
// natural_order[k], walking the anti-diagonals alternately up and down. Positions 64 to 127 are
// 63: as in libjpeg's jpeg_natural_order, a run past the block's end in damaged data writes the
// last coefficient and ends the block; and an end of block (a step of 64 in HuffTable::ac)
// writes its zero there, where a block that ends early has its zero already.
constexpr std::array<std::uint8_t, 128> make_natural_order() {
  std::array<std::uint8_t, 128> order{};
  for (auto& o : order) o = 63;
  int k = 0;
  for (int s = 0; s < 15; ++s) {
    for (int i = 0; i <= s; ++i) {
      // Even diagonals run from bottom-left to top-right (row falls), odd ones the other way.
      const int row = s % 2 == 0 ? s - i : i;
      const int col = s - row;
      if (row < 8 && col < 8) order[static_cast<std::size_t>(k++)] = static_cast<std::uint8_t>(row * 8 + col);
    }
  }
  return order;
}
constexpr std::array<std::uint8_t, 128> natural_order = make_natural_order();
static_assert(natural_order[1] == 1 && natural_order[2] == 8 && natural_order[3] == 16 &&
              natural_order[5] == 2 && natural_order[63] == 63 && natural_order[61] == 55 &&
              natural_order[62] == 62 && natural_order[79] == 63 && natural_order[127] == 63);
// natural_order one position on: order_before[k] is the coefficient of position k - 1, where
// an AC entry's step (a run plus one) takes k to write the symbol it ends at.
constexpr std::array<std::uint8_t, 128> make_order_before() {
  std::array<std::uint8_t, 128> order{};
  order[0] = 63;
  for (std::size_t k = 1; k < order.size(); ++k) order[k] = natural_order[k - 1];
  return order;
}
constexpr std::array<std::uint8_t, 128> order_before = make_order_before();

// HuffTable::ac's entries: up to two AC symbols, codes and values, that the next fast_bits bits
// hold. A symbol's step is its run of zeros plus one (the coded positions it advances), 64 for
// an end of block; a lone symbol repeats its value and has a second step of 0, so that writing
// "both" writes it twice. 0: the first symbol is not in fast_bits (decoded the slow way).
namespace ac_entry {
constexpr std::uint64_t make(int bits, int step, int first_bits, int step2, int value,
                             int value2) {
  return static_cast<std::uint64_t>(bits) | static_cast<std::uint64_t>(step) << 8 |
         static_cast<std::uint64_t>(first_bits) << 16 | static_cast<std::uint64_t>(step2) << 24 |
         static_cast<std::uint64_t>(static_cast<std::uint16_t>(value)) << 32 |
         static_cast<std::uint64_t>(static_cast<std::uint16_t>(value2)) << 48;
}
inline int bits(std::uint64_t e) { return static_cast<int>(e & 0xff); }         // both
inline int step(std::uint64_t e) { return static_cast<int>((e >> 8) & 0xff); }
inline int first_bits(std::uint64_t e) { return static_cast<int>((e >> 16) & 0xff); }
inline int step2(std::uint64_t e) { return static_cast<int>((e >> 24) & 0xff); }
inline std::int16_t value(std::uint64_t e) { return static_cast<std::int16_t>(e >> 32); }
inline std::int16_t value2(std::uint64_t e) { return static_cast<std::int16_t>(e >> 48); }
}  // namespace ac_entry

struct HuffTable {
  std::uint16_t fast[fast_size];  // codes of up to fast_bits bits: length << 8 | symbol; 0: none
  std::uint64_t ac[fast_size];    // AC symbols with their values in fast_bits (ac_entry)
  std::int32_t maxcode[17];       // the largest code of each length, -1 for none
  std::int32_t offset[17];        // a code of length l is symbol values[offset[l] + code]
  std::uint8_t values[256];
};

inline int extend(std::uint32_t v, int s) {
  return v < (1u << (s - 1)) ? static_cast<int>(v) - (1 << s) + 1 : static_cast<int>(v);
}

// Builds `h` from libjpeg's table; an AC table's single-symbol entries go through `single`
// (fast_size entries of scratch) on their way to the paired ones. Per image (--fast-crop's
// transcode writes each file's own optimal tables), so kept free of unpredictable branches.
void build_table(const JHUFF_TBL& t, bool ac, HuffTable& h, std::uint64_t* single) {
  std::memcpy(h.values, t.huffval, sizeof(h.values));
  // Canonical codes (T.81 annex C): consecutive within a length, then one bit longer. So the
  // lookup entries of the codes up to fast_bits long are [0, filled), in order; the rest are
  // the prefixes of longer codes (or of none), zero.
  std::int32_t code = 0;
  int k = 0;
  int filled = 0;
  for (int l = 1; l <= 16; ++l) {
    const int count = t.bits[l];
    h.offset[l] = k - code;
    for (int i = 0; i < count; ++i, ++code, ++k) {
      if (l > fast_bits || k > 255) continue;
      const int symbol = h.values[k];
      const int spare = fast_bits - l;
      const int first = code << spare;
      const int r = symbol >> 4;
      const int s = symbol & 15;
      std::fill_n(h.fast + first, 1 << spare, static_cast<std::uint16_t>(l << 8 | symbol));
      filled = first + (1 << spare);
      if (!ac) continue;
      std::uint64_t* e = single + first;
      if (s != 0 && l + s <= fast_bits) {
        // The value's s bits follow the code: each value holds a run of 2^(spare - s) entries.
        const int run = 1 << (spare - s);
        for (std::uint32_t v = 0; v < (1u << s); ++v) {
          const int value = extend(v, s);
          std::fill_n(e + v * static_cast<std::uint32_t>(run), run,
                      ac_entry::make(l + s, r + 1, l + s, 0, value, value));
        }
      } else if (symbol == 0x00) {
        std::fill_n(e, 1 << spare, ac_entry::make(l, 64, l, 0, 0, 0));
      } else if (symbol == 0xf0) {
        // Sixteen zeros: the sixteenth written.
        std::fill_n(e, 1 << spare, ac_entry::make(l, 16, l, 0, 0, 0));
      } else {
        std::fill_n(e, 1 << spare, std::uint64_t{0});
      }
    }
    h.maxcode[l] = count > 0 ? code - 1 : -1;
    code <<= 1;
  }
  std::fill(h.fast + filled, h.fast + fast_size, std::uint16_t{0});
  if (!ac) return;
  std::fill(single + filled, single + fast_size, std::uint64_t{0});
  // A second symbol where the bits after the first hold it whole: the entry for those bits
  // followed by zeros is then its own. Not after an end of block: the next block's DC follows.
  // The entries of one first symbol (and value) are a run of 2^(fast_bits - n); within it, the
  // second symbol of entry t is single[t << n], taken if its bits fit the run's.
  constexpr std::uint64_t value2_field = std::uint64_t{0xffff} << 48;
  for (int i = 0; i < fast_size;) {
    const std::uint64_t e = single[i];
    const int n = ac_entry::first_bits(e);
    if (e == 0 || ac_entry::step(e) == 64 || n >= fast_bits) {
      h.ac[i++] = e;
      continue;
    }
    const int room = fast_bits - n;
    const std::uint64_t base = e & ~value2_field;  // a lone symbol's second step is 0
    for (int t = 0; t < (1 << room); ++t) {
      const std::uint64_t e2 = single[t << n];
      // The second's bits add to the first's; its step and value fill the empty fields.
      const std::uint64_t second = static_cast<std::uint64_t>(ac_entry::first_bits(e2)) |
                                   static_cast<std::uint64_t>(ac_entry::step(e2)) << 24 |
                                   (e2 & value2_field >> 16) << 16;
      const bool fits = e2 != 0 && ac_entry::first_bits(e2) <= room;
      h.ac[i + t] = fits ? base + second : e;
    }
    i += 1 << room;
  }
}

}  // namespace

// The libjpeg table a HuffTable was built from: most files of a dataset share their tables (an
// encoder's standard ones), so a thread builds each once, not once an image.
struct TableSource {
  bool valid = false;
  std::uint8_t bits[17];
  std::uint8_t values[256];
  int count = 0;

  bool same(const JHUFF_TBL& t, int n) const noexcept {
    return valid && count == n && std::memcmp(bits, t.bits, sizeof(bits)) == 0 &&
           std::memcmp(values, t.huffval, static_cast<std::size_t>(n)) == 0;
  }
};

struct SegmentState {
  HuffTable dc[NUM_HUFF_TBLS];
  HuffTable ac[NUM_HUFF_TBLS];
  TableSource dc_source[NUM_HUFF_TBLS];
  TableSource ac_source[NUM_HUFF_TBLS];
  const HuffTable* dc_of[D_MAX_BLOCKS_IN_MCU];
  const HuffTable* ac_of[D_MAX_BLOCKS_IN_MCU];
  int component_of[D_MAX_BLOCKS_IN_MCU];
  int blocks = 0;
  const RestartSegments* segments = nullptr;
  std::size_t next = 0;   // the next interval
  int mcus_left = 0;      // MCUs left in the current one
  const std::uint8_t* first = nullptr;  // its first byte
  const std::uint8_t* limit = nullptr;  // the last position a refill may load 8 bytes from
  std::uint32_t size = 0;
  const std::uint8_t* p = nullptr;
  std::uint64_t buffer = 0;  // bits from the top
  int bits = 0;
  int dc_pred[MAX_COMPS_IN_SCAN] = {};
  // A scan with checkpoints (decode_mcu_indexed): the MCU libjpeg asks for next, the MCU the
  // bit reader stands before, the scan's MCUs, and the columns libjpeg's output needs.
  ScanCheckpoints* checkpoints = nullptr;
  std::int64_t call = 0;
  std::int64_t at = 0;
  std::int64_t total = 0;
  int call_col = 0;  // call's column, and at's row and column (no divisions an MCU)
  int at_row = 0;
  int at_col = 0;
  int next_point_col = 0;  // the column of at's row's next point (per_row when none)
  int first_col = 0;
  int last_col = 0;
  int call_row = 0;  // call's row
  int last_row = 0;  // the last MCU row libjpeg's output may need (set_segment_rows)
  // Two MCU rows' blocks of the crop's columns, decoded together (decode_pair): rows pair_row
  // and pair_row + 1, -1 for none; pair_capacity blocks allocated.
  int pair_row = -1;
  bool pairs = true;  // paired_rows() at install
  std::unique_ptr<JBLOCK[]> pair;
  std::size_t pair_capacity = 0;
  std::uint64_t decoded = 0;  // MCUs decoded by this thread, ever
  std::uint64_t paired = 0;   // of them, in pairs
  JBLOCK scratch;  // the blocks of MCUs libjpeg skips, and of those decoded only to pass them
  JBLOCK scratch2;                  // the second stream's, in a pair
  std::uint64_t single[fast_size];  // build_table's scratch
};

namespace {

[[noreturn]] void fail(j_decompress_ptr cinfo) {
  cinfo->err->msg_code = JERR_BAD_HUFF_TABLE;
  (*cinfo->err->error_exit)(reinterpret_cast<j_common_ptr>(cinfo));
  // error_exit does not return (the region decoder's longjmps).
  __builtin_unreachable();
}

// The bit reader, in locals of decode_mcu.
struct Bits {
  std::uint64_t buffer;
  int bits;
  const std::uint8_t* p;
  const std::uint8_t* limit;

  // At least 57 bits in the buffer (the bytes past an interval's end read as zeros).
  [[gnu::always_inline]] inline bool refill() {
    if (p > limit) return false;
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v = __builtin_bswap64(v);
    buffer |= v >> bits;
    const int take = (63 - bits) >> 3;
    p += take;
    bits += take * 8;
    return true;
  }
  [[gnu::always_inline]] inline std::uint32_t take(int n) {  // 1 <= n <= 16
    const auto v = static_cast<std::uint32_t>(buffer >> (64 - n));
    buffer <<= n;
    bits -= n;
    return v;
  }
};

// A symbol whose code is longer than fast_bits at the top of `buffer`: its length << 8 | the
// symbol, or -1 for no code. By value: the bit reader stays in the caller's registers.
[[gnu::noinline]] int decode_long(const HuffTable& h, std::uint64_t buffer) {
  const auto peek = static_cast<std::int32_t>(buffer >> 48);
  for (int l = fast_bits + 1; l <= 16; ++l) {
    const std::int32_t code = peek >> (16 - l);
    if (code <= h.maxcode[l]) return l << 8 | h.values[(h.offset[l] + code) & 0xff];
  }
  return -1;
}

[[gnu::always_inline]] inline int decode_symbol(const HuffTable& h, Bits& b) {
  int e = h.fast[b.buffer >> (64 - fast_bits)];
  if (e == 0) {
    e = decode_long(h, b.buffer);
    if (e < 0) return -1;
  }
  b.buffer <<= e >> 8;
  b.bits -= e >> 8;
  return e & 0xff;
}

// A block's DC coefficient into out[0], from the prediction `pred` of its component.
[[gnu::always_inline]] inline void decode_dc(j_decompress_ptr cinfo, const HuffTable& dc, Bits& b,
                                             int& pred, JCOEF* out) {
  if (b.bits < 32 && !b.refill()) fail(cinfo);
  const int s = decode_symbol(dc, b);
  if (s < 0 || s > 15) fail(cinfo);
  const int diff = s != 0 ? extend(b.take(s), s) : 0;
  pred = static_cast<int>(static_cast<unsigned>(pred) + static_cast<unsigned>(diff));
  out[0] = static_cast<JCOEF>(pred);
}

// One lookup's worth of a block's AC coefficients from coded position `k`: the one or two
// symbols the paired table holds, or one the slow way. Returns the next position; 64 or more
// ends the block. A run past coefficient 63 (damaged data) writes at natural_order's 63 and
// ends the block, as libjpeg's decoder does: positions stay below 128.
// NOTE: positions are unsigned, and the table's entries written through order_before: no sign
// extension or subtraction on the way to each store.
[[gnu::always_inline]] inline unsigned decode_ac(j_decompress_ptr cinfo, const HuffTable& ac,
                                                 Bits& b, JCOEF* out, unsigned k) {
  if (b.bits < 32 && !b.refill()) fail(cinfo);
  const std::uint64_t e = ac.ac[b.buffer >> (64 - fast_bits)];
  if (e != 0) [[likely]] {
    const unsigned k1 = k + static_cast<unsigned>(ac_entry::step(e));
    out[order_before[k1]] = ac_entry::value(e);
    if (k1 < 64) [[likely]] {
      // The second symbol is this block's too (a lone one writes its value again).
      const int n = ac_entry::bits(e);
      b.buffer <<= n;
      b.bits -= n;
      const unsigned k2 = k1 + static_cast<unsigned>(ac_entry::step2(e));
      out[order_before[k2]] = ac_entry::value2(e);
      return k2;
    }
    // The block ended with the first: what follows is the next block's DC.
    const int n = ac_entry::first_bits(e);
    b.buffer <<= n;
    b.bits -= n;
    return k1;
  }
  const int rs = decode_symbol(ac, b);
  if (rs < 0) fail(cinfo);
  const int r = rs >> 4;
  const int size = rs & 15;
  if (size == 0) return r == 15 ? k + 16 : 64;  // 16 zeros, or the end of the block
  k += static_cast<unsigned>(r);
  out[natural_order[k]] = static_cast<JCOEF>(extend(b.take(size), size));
  return k + 1;
}

// One MCU's blocks: block `blk` into out(blk).
// NOTE: the readers are copied into locals here and back at the end: held by reference in
// the loops, GCC kept their bit counts and buffers in memory, a store and a load more on the
// chain of every lookup.
template <class Out>
[[gnu::always_inline]] inline void decode_blocks(j_decompress_ptr cinfo, SegmentState* st,
                                                 Bits& reader, int* dc_pred, Out out) {
  Bits b = reader;
  for (int blk = 0; blk < st->blocks; ++blk) {
    JCOEF* o = out(blk);
    const HuffTable& ac = *st->ac_of[blk];
    decode_dc(cinfo, *st->dc_of[blk], b, dc_pred[st->component_of[blk]], o);
    for (unsigned k = 1; k < 64;) k = decode_ac(cinfo, ac, b, o, k);
  }
  reader = b;
  ++st->decoded;
}

// The same MCU position of two streams (a and b): each block's lookups alternate between them,
// so that the two chains of dependent table loads overlap, and the longer block finishes alone.
// The coefficients are those decode_blocks gives each stream.
[[gnu::always_inline]] inline void decode_blocks_pair(j_decompress_ptr cinfo, SegmentState* st,
                                                      Bits& a_reader, int* a_pred, JCOEF* a_out,
                                                      Bits& b_reader, int* b_pred, JCOEF* b_out) {
  Bits a = a_reader;
  Bits b = b_reader;
  for (int blk = 0; blk < st->blocks; ++blk) {
    JCOEF* x = a_out ? a_out + blk * DCTSIZE2 : st->scratch;
    JCOEF* y = b_out ? b_out + blk * DCTSIZE2 : st->scratch2;
    const HuffTable& dc = *st->dc_of[blk];
    const HuffTable& ac = *st->ac_of[blk];
    const int c = st->component_of[blk];
    decode_dc(cinfo, dc, a, a_pred[c], x);
    decode_dc(cinfo, dc, b, b_pred[c], y);
    unsigned ka = 1;
    unsigned kb = 1;
    while (ka < 64 && kb < 64) {
      ka = decode_ac(cinfo, ac, a, x, ka);
      kb = decode_ac(cinfo, ac, b, y, kb);
    }
    while (ka < 64) ka = decode_ac(cinfo, ac, a, x, ka);
    while (kb < 64) kb = decode_ac(cinfo, ac, b, y, kb);
  }
  a_reader = a;
  b_reader = b;
  st->decoded += 2;
  st->paired += 2;
}

// Where libjpeg's blocks of an MCU are (nullptr: the scratch block, discarded), and where a
// pair's are (contiguous in st->pair, or nullptr).
[[gnu::always_inline]] inline auto into_mcu(SegmentState* st, JBLOCKROW* mcu) {
  return [st, mcu](int blk) { return mcu ? mcu[blk][0] : st->scratch; };
}
[[gnu::always_inline]] inline auto into_blocks(SegmentState* st, JCOEF* out) {
  return [st, out](int blk) { return out ? out + blk * DCTSIZE2 : st->scratch; };
}

// The body of decode_mcu, compiled twice: for any x86-64, and with BMI2 (whose shifts by a
// register, shlx/shrx, are one cycle on the chain of dependent table lookups every coefficient
// waits on; `shl %cl` is two to three). The same source, so the same coefficients.
[[gnu::always_inline]] inline boolean decode_mcu_body(j_decompress_ptr cinfo, JBLOCKROW* mcu) {
  auto* st = static_cast<SegmentState*>(cinfo->client_data);
  if (st->mcus_left == 0) {
    // The next interval: its own bytes, the DC predictions reset (T.81 F.2.1.3.1).
    const RestartSegments& s = *st->segments;
    if (st->next >= s.begin.size()) fail(cinfo);
    st->first = s.bytes.data() + s.begin[st->next];
    st->size = s.size[st->next];
    st->limit = st->first + st->size + RestartSegments::padding - 8;
    st->p = st->first;
    st->buffer = 0;
    st->bits = 0;
    for (int& pred : st->dc_pred) pred = 0;
    st->mcus_left = s.mcus;
    ++st->next;
  }
  Bits b{st->buffer, st->bits, st->p, st->limit};
  decode_blocks(cinfo, st, b, st->dc_pred, into_mcu(st, mcu));
  st->buffer = b.buffer;
  st->bits = b.bits;
  st->p = b.p;
  // Bits past the interval's end read as zeros: an MCU that took any is damaged data (libjpeg
  // would warn and leave it zero), and fails here, before libjpeg can output it (a crop may
  // stop short of the interval's last MCU). The interval's last MCU must end in its last byte:
  // a whole byte left over before an RST is data libjpeg warns about (extraneous bytes). Before
  // the EOI of a plain file's scan libjpeg would not look, so there the rule only sends such
  // files (junk before the EOI) to libjpeg's decoder for crops that reach the last MCU.
  const std::int64_t used = (b.p - st->first) * std::int64_t{8} - b.bits;
  const std::int64_t have = std::int64_t{st->size} * 8;
  if (used > have) fail(cinfo);
  if (--st->mcus_left == 0 && have - used >= 8) fail(cinfo);
  return TRUE;
}

// A reader of a scan with checkpoints: its bits, DC predictions, and the MCU it stands before
// (at; its row and column, and the column of the row's next point).
struct Cursor {
  Bits b;
  int dc_pred[3];
  std::int64_t at;
  int row;
  int col;
  int next_point_col;
};

[[gnu::always_inline]] inline Cursor load_reader(const SegmentState* st) {
  return Cursor{Bits{st->buffer, st->bits, st->p, st->limit},
                {st->dc_pred[0], st->dc_pred[1], st->dc_pred[2]},
                st->at,
                st->at_row,
                st->at_col,
                st->next_point_col};
}

[[gnu::always_inline]] inline void store_reader(SegmentState* st, const Cursor& c) {
  st->buffer = c.b.buffer;
  st->bits = c.b.bits;
  st->p = c.b.p;
  for (int i = 0; i < 3; ++i) st->dc_pred[i] = c.dc_pred[i];
  st->at = c.at;
  st->at_row = c.row;
  st->at_col = c.col;
  st->next_point_col = c.next_point_col;
}

// The bits of the unstuffed scan the reader has taken.
[[gnu::always_inline]] inline std::int64_t bits_used(const SegmentState* st, const Bits& b) {
  return (b.p - st->first) * std::int64_t{8} - b.bits;
}

// Puts the cursor at MCU (row, col) of a scan with checkpoints, without decoding.
[[gnu::always_inline]] inline void stand_at(const SegmentState* st, Cursor& c, int row, int col) {
  const ScanCheckpoints& cp = *st->checkpoints;
  c.at = std::int64_t{row} * cp.per_row + col;
  c.row = row;
  c.col = col;
  c.next_point_col = (col + cp.step - 1) / cp.step * cp.step;
}

// Moves the cursor to the nearest known point at or before MCU k that lies past MCU `after`;
// false (the cursor as it was) where there is none.
[[gnu::always_inline]] inline bool jump(j_decompress_ptr cinfo, SegmentState* st, Cursor& c,
                                        std::int64_t k, std::int64_t after) {
  const ScanCheckpoints& cp = *st->checkpoints;
  const auto row = static_cast<int>(k / cp.per_row);
  const auto col = static_cast<int>(k % cp.per_row);
  for (int j = row * cp.points_per_row + col / cp.step; j >= 0; --j) {
    const int point_row = j / cp.points_per_row;
    const int point_col = j % cp.points_per_row * cp.step;
    if (std::int64_t{point_row} * cp.per_row + point_col <= after) return false;
    const ScanCheckpoints::Point& point = cp.points[static_cast<std::size_t>(j)];
    if (point.bit == ScanCheckpoints::unknown) continue;
    if (point.bit / 8 > st->size) fail(cinfo);
    c.b.p = st->first + point.bit / 8;
    c.b.limit = st->limit;
    c.b.buffer = 0;
    c.b.bits = 0;
    if (!c.b.refill()) fail(cinfo);
    if (point.bit % 8 != 0) c.b.take(static_cast<int>(point.bit % 8));
    for (int i = 0; i < 3; ++i) c.dc_pred[i] = point.dc[i];
    stand_at(st, c, point_row, point_col);
    return true;
  }
  return false;
}

// Before the cursor's MCU: its point recorded, where it has one not known yet.
[[gnu::always_inline]] inline void record_point(SegmentState* st, Cursor& c) {
  if (c.col != c.next_point_col) return;
  ScanCheckpoints& cp = *st->checkpoints;
  c.next_point_col += cp.step;
  ScanCheckpoints::Point& point =
      cp.points[static_cast<std::size_t>(c.row * cp.points_per_row + c.col / cp.step)];
  if (point.bit != ScanCheckpoints::unknown) return;
  // A prediction beyond 16 bits (damaged data) is not kept: the point stays unknown.
  bool fits = true;
  for (int i = 0; i < 3; ++i) fits &= c.dc_pred[i] == static_cast<std::int16_t>(c.dc_pred[i]);
  if (!fits) return;
  point.bit = static_cast<std::uint32_t>(bits_used(st, c.b));
  for (int i = 0; i < 3; ++i) point.dc[i] = static_cast<std::int16_t>(c.dc_pred[i]);
  cp.added = true;
}

// After the cursor's MCU: the checks decode_mcu_body makes, and the cursor moved past it.
[[gnu::always_inline]] inline void passed(j_decompress_ptr cinfo, SegmentState* st, Cursor& c) {
  const std::int64_t used = bits_used(st, c.b);
  const std::int64_t have = std::int64_t{st->size} * 8;
  if (used > have) fail(cinfo);
  if (++c.at == st->total && have - used >= 8) fail(cinfo);
  if (++c.col == st->checkpoints->per_row) {
    c.col = 0;
    c.next_point_col = 0;
    ++c.row;
  }
}

// The MCU the cursor stands before, block `blk` decoded into out(blk).
template <class Out>
[[gnu::always_inline]] inline void decode_indexed(j_decompress_ptr cinfo, SegmentState* st,
                                                  Cursor& c, Out out) {
  record_point(st, c);
  decode_blocks(cinfo, st, c.b, c.dc_pred, out);
  passed(cinfo, st, c);
}

// Where MCU (c.row, c.col) goes in st->pair, for the pair from `row`: nullptr outside the
// crop's columns (decoded only to pass it).
[[gnu::always_inline]] inline JCOEF* pair_blocks(const SegmentState* st, const Cursor& c, int row) {
  if (c.row < row || c.col < st->first_col || c.col > st->last_col) return nullptr;
  const int width = st->last_col - st->first_col + 1;
  return st->pair[static_cast<std::size_t>(((c.row - row) * width + c.col - st->first_col) *
                                           st->blocks)];
}

// The most blocks a thread's pair buffer holds (128 bytes each): rows wider than that are
// decoded one stream at a time.
constexpr std::size_t max_pair_blocks = std::size_t{1} << 14;

// Rows `row` and `row + 1` of the crop's columns into st->pair, decoded together: the first by
// the reader (from where it stands or a point past it), the second from a point of its own row
// at or left of the crop; their MCUs alternate block by block and their blocks lookup by
// lookup (decode_blocks_pair). The reader then stands where the second stopped. False, with
// nothing decoded, where row + 1 has no such point (its MCUs are then reached through row's).
[[gnu::always_inline]] inline bool decode_pair(j_decompress_ptr cinfo, SegmentState* st, int row) {
  const ScanCheckpoints& cp = *st->checkpoints;
  const int width = st->last_col - st->first_col + 1;
  if (width <= 0) return false;
  const std::size_t need = std::size_t{2} * static_cast<std::size_t>(width * st->blocks);
  if (need > max_pair_blocks) return false;
  const std::int64_t a_start = std::int64_t{row} * cp.per_row + st->first_col;
  Cursor a = load_reader(st);
  if (a.at > a_start) return false;
  Cursor b = a;
  if (!jump(cinfo, st, b, a_start + cp.per_row, a_start + cp.per_row - st->first_col - 1)) {
    return false;
  }
  if (st->pair_capacity < need) {
    st->pair_capacity = 0;
    st->pair.reset(new (std::nothrow) JBLOCK[need]);
    if (!st->pair) return false;
    st->pair_capacity = need;
  }
  if (a.at < a_start) jump(cinfo, st, a, a_start, a.at);
  std::memset(st->pair.get(), 0, need * sizeof(JBLOCK));
  const std::int64_t a_end = std::int64_t{row} * cp.per_row + st->last_col + 1;
  std::int64_t a_left = a_end - a.at;
  std::int64_t b_left = a_end + cp.per_row - b.at;
  for (; a_left > b_left; --a_left) {
    decode_indexed(cinfo, st, a, into_blocks(st, pair_blocks(st, a, row)));
  }
  for (; b_left > a_left; --b_left) {
    decode_indexed(cinfo, st, b, into_blocks(st, pair_blocks(st, b, row)));
  }
  for (; a_left > 0; --a_left) {
    record_point(st, a);
    record_point(st, b);
    decode_blocks_pair(cinfo, st, a.b, a.dc_pred, pair_blocks(st, a, row), b.b, b.dc_pred,
                       pair_blocks(st, b, row));
    passed(cinfo, st, a);
    passed(cinfo, st, b);
  }
  store_reader(st, b);
  st->pair_row = row;
  return true;
}

// decode_mcu for a scan without restart markers, with checkpoints (install_segment_decoder).
// An MCU whose blocks libjpeg does not need (a row it skips: no blocks; a column outside its
// crop) is not decoded when asked for; the next MCU it needs is reached from the nearest known
// point before it that is past the reader, or from where the reader stands, decoding the MCUs
// between (and recording their points) on the way. Where the next row is needed too and has a
// point of its own, the two rows are decoded together (decode_pair) and then handed out.
[[gnu::always_inline]] inline boolean decode_mcu_indexed_body(j_decompress_ptr cinfo,
                                                              JBLOCKROW* mcu) {
  auto* st = static_cast<SegmentState*>(cinfo->client_data);
  const ScanCheckpoints& cp = *st->checkpoints;
  const std::int64_t k = st->call++;
  const int col = st->call_col;
  const int row = st->call_row;
  if (++st->call_col == cp.per_row) {
    st->call_col = 0;
    ++st->call_row;
  }
  if (k >= st->total) fail(cinfo);
  if (!mcu || col < st->first_col || col > st->last_col) return TRUE;
  if (st->pair_row < 0 || row - st->pair_row > 1) {
    st->pair_row = -1;
    if (col != st->first_col || row >= st->last_row || !st->pairs || !decode_pair(cinfo, st, row)) {
      Cursor c = load_reader(st);
      if (c.at != k) {
        jump(cinfo, st, c, k, c.at);
        while (c.at < k) decode_indexed(cinfo, st, c, into_mcu(st, nullptr));
      }
      decode_indexed(cinfo, st, c, into_mcu(st, mcu));
      store_reader(st, c);
      return TRUE;
    }
  }
  const JBLOCK* from = &st->pair[static_cast<std::size_t>(
      ((row - st->pair_row) * (st->last_col - st->first_col + 1) + col - st->first_col) *
      st->blocks)];
  for (int blk = 0; blk < st->blocks; ++blk) std::memcpy(mcu[blk], from[blk], sizeof(JBLOCK));
  return TRUE;
}

boolean decode_mcu_indexed(j_decompress_ptr cinfo, JBLOCKROW* mcu) {
  return decode_mcu_indexed_body(cinfo, mcu);
}

boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* mcu) { return decode_mcu_body(cinfo, mcu); }

#if defined(__x86_64__) || defined(__i386__)
[[gnu::target("bmi2")]] boolean decode_mcu_bmi2(j_decompress_ptr cinfo, JBLOCKROW* mcu) {
  return decode_mcu_body(cinfo, mcu);
}
[[gnu::target("bmi2")]] boolean decode_mcu_indexed_bmi2(j_decompress_ptr cinfo, JBLOCKROW* mcu) {
  return decode_mcu_indexed_body(cinfo, mcu);
}
const bool cpu_bmi2 = __builtin_cpu_supports("bmi2");
#endif

}  // namespace

namespace {

void build_cached(const JHUFF_TBL& t, bool ac, HuffTable& h, TableSource& source,
                  std::uint64_t* single) {
  int n = 0;
  for (int l = 1; l <= 16; ++l) n += t.bits[l];
  n = std::min(n, 256);
  if (source.same(t, n)) return;
  source.valid = false;  // until `h` holds the new table
  build_table(t, ac, h, single);
  std::memcpy(source.bits, t.bits, sizeof(source.bits));
  std::memcpy(source.values, t.huffval, static_cast<std::size_t>(n));
  source.count = n;
  source.valid = true;
}

}  // namespace

namespace {
std::atomic<bool> pairs_on{true};
}  // namespace

SegmentState* segment_state() noexcept {
  thread_local SegmentState state;
  return &state;
}

void ScanCheckpoints::reset(int per_row_, int rows_) {
  per_row = per_row_;
  rows = rows_;
  // Four points a row: a crop's first column is then at most a quarter row past one.
  points_per_row = std::min(per_row, 4);
  step = (per_row + points_per_row - 1) / points_per_row;
  points_per_row = (per_row + step - 1) / step;
  points.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(points_per_row), Point{});
  added = false;
}

std::uint64_t huffman_mcus_decoded() noexcept { return segment_state()->decoded; }
std::uint64_t huffman_mcus_paired() noexcept {
  return segment_state()->paired;
}
void set_paired_rows(bool on) noexcept {
  pairs_on.store(on, std::memory_order_relaxed);
}

void set_segment_rows(jpeg_decompress_struct* cinfo, int last) {
  auto* st = static_cast<SegmentState*>(cinfo->client_data);
  // An MCU row's output rows: as the columns' alignment in jpeg_region.cpp, down. A scan of one
  // component has an MCU a block, and libjpeg decodes whole iMCU rows of v_samp_factor blocks.
#if JPEG_LIB_VERSION >= 70
  const int dct = cinfo->min_DCT_v_scaled_size;
#else
  const int dct = cinfo->min_DCT_scaled_size;
#endif
  const bool one = cinfo->comps_in_scan == 1 && cinfo->num_components == 1;
  const int per_imcu = one ? std::max(cinfo->cur_comp_info[0]->v_samp_factor, 1) : 1;
  const int height = one ? dct * per_imcu : dct * cinfo->max_v_samp_factor;
  if (last < 0 || height <= 0) return;
  // Upsampling that reads the row below (fancy upsampling of vertically subsampled chroma)
  // makes libjpeg decode the next MCU row before it outputs the last row group (max_v_samp
  // rows) of this one, and only then (jdmainct.c's context rows).
  const bool context = cinfo->upsample && cinfo->upsample->need_context_rows &&
                       last % height >= height - cinfo->max_v_samp_factor;
  st->last_row = std::min((last / height + (context ? 1 : 0)) * per_imcu + per_imcu - 1,
                          static_cast<int>(cinfo->MCU_rows_in_scan) - 1);
}

void set_segment_columns(jpeg_decompress_struct* cinfo, int first, int last) {
  auto* st = static_cast<SegmentState*>(cinfo->client_data);
  st->first_col = first;
  st->last_col = last;
}

void install_segment_decoder(jpeg_decompress_struct* cinfo, const RestartSegments& segments,
                             SegmentState* st, ScanCheckpoints* checkpoints) {
  st->blocks = cinfo->blocks_in_MCU;
  if (st->blocks < 1 || st->blocks > D_MAX_BLOCKS_IN_MCU || segments.mcus < 1) fail(cinfo);
  bool dc_built[NUM_HUFF_TBLS] = {};
  bool ac_built[NUM_HUFF_TBLS] = {};
  for (int blk = 0; blk < st->blocks; ++blk) {
    const int ci = cinfo->MCU_membership[blk];
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    const int d = comp->dc_tbl_no;
    const int a = comp->ac_tbl_no;
    if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS ||
        !cinfo->dc_huff_tbl_ptrs[d] || !cinfo->ac_huff_tbl_ptrs[a]) {
      fail(cinfo);
    }
    if (!dc_built[d]) {
      build_cached(*cinfo->dc_huff_tbl_ptrs[d], false, st->dc[d], st->dc_source[d], st->single);
    }
    if (!ac_built[a]) {
      build_cached(*cinfo->ac_huff_tbl_ptrs[a], true, st->ac[a], st->ac_source[a], st->single);
    }
    dc_built[d] = ac_built[a] = true;
    st->dc_of[blk] = &st->dc[d];
    st->ac_of[blk] = &st->ac[a];
    st->component_of[blk] = ci;
  }
  st->segments = &segments;
  st->next = 0;
  st->mcus_left = 0;
  st->checkpoints = nullptr;
  cinfo->client_data = st;
  // Checkpoints: one interval holding the whole scan, the points' grid that of this scan, and
  // its bit offsets within 32 bits.
  const std::int64_t total = std::int64_t{cinfo->MCUs_per_row} * cinfo->MCU_rows_in_scan;
  const bool indexed = checkpoints && segments.begin.size() == 1 && cinfo->comps_in_scan <= 3 &&
                       segments.mcus == total &&
                       checkpoints->per_row == static_cast<int>(cinfo->MCUs_per_row) &&
                       checkpoints->rows == static_cast<int>(cinfo->MCU_rows_in_scan) &&
                       std::uint64_t{segments.size[0]} * 8 < ScanCheckpoints::unknown;
  if (indexed) {
    st->checkpoints = checkpoints;
    checkpoints->added = false;
    st->first = segments.bytes.data() + segments.begin[0];
    st->size = segments.size[0];
    st->limit = st->first + st->size + RestartSegments::padding - 8;
    st->p = st->first;
    st->buffer = 0;
    st->bits = 0;
    for (int& pred : st->dc_pred) pred = 0;
    st->call = 0;
    st->call_col = 0;
    st->call_row = 0;
    st->pair_row = -1;
    st->pairs = pairs_on.load(std::memory_order_relaxed);
    st->last_row = static_cast<int>(cinfo->MCU_rows_in_scan) - 1;
    Cursor c = load_reader(st);
    stand_at(st, c, 0, 0);
    store_reader(st, c);
    st->total = total;
    st->first_col = 0;
    st->last_col = checkpoints->per_row - 1;
  }
  cinfo->entropy->decode_mcu = indexed ? decode_mcu_indexed : decode_mcu;
#if defined(__x86_64__) || defined(__i386__)
  // The BMI2 form where the CPU has it and the SIMD cap (set_simd_level, for tests) allows AVX2.
  if (cpu_bmi2 && use_avx2()) {
    cinfo->entropy->decode_mcu = indexed ? decode_mcu_indexed_bmi2 : decode_mcu_bmi2;
  }
#endif
}

}  // namespace coload::vision::detail
