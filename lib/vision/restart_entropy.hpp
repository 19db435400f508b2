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
// decode_scan_region): this decoder is faster than libjpeg-turbo's fast path too.

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

/// Replaces the Huffman decoder of a decompressor that jpeg_start_decompress has set up for a
/// stream of at most `segments.begin.size() * segments.mcus` MCUs (a baseline sequential scan;
/// the last interval may hold fewer): its MCUs come from `segments` from now on. `state` (segment_state(): the thread's) must outlive the
/// decode. A failure inside the decode is libjpeg's error_exit (the caller's longjmp).
struct SegmentState;
SegmentState* segment_state() noexcept;  // the calling thread's
void install_segment_decoder(jpeg_decompress_struct* cinfo, const RestartSegments& segments,
                             SegmentState* state);

}  // namespace coload::vision::detail
