#pragma once
// Internal: the Huffman decoding of a crop's covering restart intervals, in place of libjpeg's
// (lib/vision/restart_entropy.cpp).
//
// libjpeg-turbo (2.1 to 3.x) decodes every MCU of a file with restart markers through its slow
// Huffman path (decode_mcu_slow: a call per refill, per long code), which made the entropy
// decoding of --fast-crop shards about half of a crop's CPU. The region decoder hands libjpeg a
// stream of the headers alone and this decoder the intervals, unstuffed, one after another: it
// decodes each interval's MCUs into the blocks libjpeg's coefficient controller passes, which
// then does the IDCT, upsampling and colour conversion as for any file. Huffman decoding is
// exact by construction (the same codes give the same coefficients); anything the data does
// not support (a bad code, a run past the block's end, an interval shorter or longer than its
// MCUs) fails the decode, and the caller falls back to the plain decode of the whole file.
//
// A JPEG without restart markers is decoded as one interval (restart_decode.cpp's
// decode_scan_region): this decoder is faster than libjpeg-turbo's fast path too. With
// checkpoints (ScanCheckpoints) the MCUs no output needs are not decoded at all, so damage
// there goes unnoticed: it changes no pixel the crop has. And two MCU rows that each have a
// point of their own are decoded together, their table lookups alternating: one stream's
// lookups are a chain, each waiting on the one before, which two streams overlap.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

struct jpeg_decompress_struct;

namespace coload::vision::detail {

/// The entropy-coded data of restart intervals of `mcus` MCUs each, in the order their MCUs are
/// decoded (the region's rows, left to right), each without its byte stuffing.
struct RestartSegments {
  int mcus = 0;                       // MCUs per interval
  std::vector<std::uint8_t> bytes;    // the intervals, each followed by `padding` zero bytes
  std::size_t used = 0;               // of `bytes` (which is kept from crop to crop)
  std::vector<std::uint32_t> begin;   // where each starts in `bytes`
  std::vector<std::uint32_t> size;    // its length without the padding
  static constexpr std::size_t padding = 16;

  void clear() noexcept {
    used = 0;
    begin.clear();
    size.clear();
  }
  /// Clears, and frees `bytes` if it holds more than `keep`: a thread keeps what its usual
  /// files need, not what its largest one needed.
  void trim(std::size_t keep) noexcept {
    clear();
    if (bytes.capacity() > keep) std::vector<std::uint8_t>().swap(bytes);
  }
  /// Appends the entropy-coded bytes of `data` from `pos` to the next marker as one interval:
  /// FF 00 becomes FF, fill bytes (FF before FF) are dropped, as libjpeg reads them. Returns
  /// what next_marker (jpeg_restart.hpp) returns: the offset of the marker's FF (`marker` set
  /// to its code), or data.size() when there is none.
  std::size_t append_until_marker(std::span<const std::byte> data, std::size_t pos,
                                  unsigned& marker);
};

/// Where the Huffman decoder stood at points of a scan without restart markers: the bit of the
/// unstuffed data it had reached and its DC predictions, before MCU `step * j` of each MCU row
/// (point j of the row). Decoding from the scan's start is the only way to reach a crop's MCUs
/// in such a file; a later crop of the same file (each epoch's RandomResizedCrop) starts at the
/// nearest point before the MCUs it needs instead, and skips the MCUs right of its columns
/// (scan_checkpoints.cpp keeps the points between decodes).
struct ScanCheckpoints {
  static constexpr std::uint32_t unknown = 0xffffffff;
  struct Point {
    std::uint32_t bit = unknown;  // of the unstuffed scan
    std::int16_t dc[3] = {};      // each component's DC prediction
  };
  int per_row = 0;  // the scan's MCUs a row
  int rows = 0;     // and its MCU rows
  int step = 1;     // MCUs between a row's points
  int points_per_row = 0;
  std::vector<Point> points;  // rows * points_per_row
  bool added = false;         // the last decode recorded a point not known before

  /// No point known, for a scan of `rows` rows of `per_row` MCUs.
  void reset(int per_row_, int rows_);
};

/// What names a file's checkpoints: the 128-bit XXH3 of its bytes, seeded at random once a
/// process (with a known seed a crafted file could be made to collide with another, whose
/// crops would then start from its points: wrong pixels, though never a read out of bounds),
/// and their count. Empty (false) when checkpoints are off.
struct CheckpointKey {
  std::uint64_t low = 0;
  std::uint64_t high = 0;
  std::size_t size = 0;
  explicit operator bool() const noexcept { return size != 0; }
};

/// The checkpoints kept for the JPEG `data` (scan_checkpoints.cpp), copied into `out`, which is
/// first reset for a scan of `rows` rows of `per_row` MCUs; returns the key that
/// store_checkpoints takes, empty when checkpoints are off (the budget is 0).
CheckpointKey load_checkpoints(std::span<const std::byte> data, int per_row, int rows,
                               ScanCheckpoints& out);
/// Keeps the points a decode of the bytes `key` names recorded, with those kept before.
void store_checkpoints(const CheckpointKey& key, const ScanCheckpoints& checkpoints) noexcept;

/// Replaces the Huffman decoder of a decompressor that jpeg_start_decompress has set up for a
/// stream of at most `segments.begin.size() * segments.mcus` MCUs (a baseline sequential scan;
/// the last interval may hold fewer): its MCUs come from `segments` from now on. `state` (segment_state(): the thread's) must outlive the
/// decode. A failure inside the decode is libjpeg's error_exit (the caller's longjmp).
struct SegmentState;
SegmentState* segment_state() noexcept;  // the calling thread's
/// With `checkpoints` (sized for this scan by reset, its points those of these very bytes or
/// unknown) and one interval (a scan without restart markers): MCUs that libjpeg skips or that
/// lie outside the columns set_segment_columns gives are decoded only where a later MCU needs
/// them, from the nearest point known before it; every point passed is recorded.
void install_segment_decoder(jpeg_decompress_struct* cinfo, const RestartSegments& segments,
                             SegmentState* state, ScanCheckpoints* checkpoints = nullptr);
/// The MCU columns [first, last] whose blocks libjpeg's output needs (the crop's, from
/// jpeg_crop_scanline); the others' blocks may be left zero. All of them until called.
void set_segment_columns(jpeg_decompress_struct* cinfo, int first, int last);
/// The last output row (at the decode's scale) libjpeg will be asked for: the MCU rows below
/// its own (and the context row fancy upsampling reads) are not decoded ahead of the asking.
/// Every row until called.
void set_segment_rows(jpeg_decompress_struct* cinfo, int last);
/// MCUs the calling thread's Huffman decoder has decoded, and of them those decoded two rows
/// at a time (for tests).
std::uint64_t huffman_mcus_decoded() noexcept;
std::uint64_t huffman_mcus_paired() noexcept;
/// Whether decodes started from now on may decode two rows at a time (on unless turned off:
/// for tests and tools/bench/vision/crop_decode, which compare the two).
void set_paired_rows(bool on) noexcept;

}  // namespace coload::vision::detail
