// Decoding a crop from the restart intervals that cover it.
//
// libjpeg decodes entropy-coded data from the start of a scan only, so the region a crop needs
// is handed to it as a JPEG of its own: the file's headers with the covered region's size in
// the SOF, and no entropy data; the covering intervals of each MCU row, in order and unstuffed,
// go to restart_entropy.cpp's Huffman decoder, which libjpeg's coefficient controller calls in
// place of its own (libjpeg-turbo's takes its slow path for every MCU of a file with restart
// markers). Every interval starts with the DC predictions reset, so its blocks decode to the
// same coefficients there as in the file, and the region's pixels are the file's except where
// upsampling reads past the region's edges: a margin on every side that is not the image's own
// edge keeps those out of the crop. The region decoder (jpeg_region.cpp) then decodes the crop
// from that stream as it would from the file.
//
// A JPEG without restart markers is one interval: its whole scan, unstuffed, goes to the same
// decoder, and libjpeg skips and crops as before. So does a marked file's whole scan, interval
// by interval, where a crop needs every interval (a whole image: decode_into, EvalTransform) or
// the intervals fit no layout (they span MCU rows, or an index did not match). That decoder
// takes two AC symbols a table lookup: a crop of a plain file decodes in 0.69x the time it takes with libjpeg-turbo's own
// fast Huffman path (tools/bench/vision/crop_decode's decode_plain against decode_libjpeg,
// 0.57 against 0.82 ms an image, 2026-11-29).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <string>

#include "coload/core/warning.hpp"
#include "coload/vision/decode.hpp"
#include "jpeg_restart.hpp"
#include "restart_entropy.hpp"

namespace coload::vision::detail {
namespace {

unsigned at(std::span<const std::byte> b, std::size_t i) { return std::to_integer<unsigned>(b[i]); }

[[noreturn]] void mismatch(const std::string& what) { throw RestartMismatch{what}; }

thread_local RestartHint current_hint;
std::atomic<std::uint64_t> restart_decodes{0};
std::atomic<std::uint64_t> scan_decodes{0};
std::atomic<bool> scan_decoder_on{true};

// The stream libjpeg reads (the headers, the SOF's size edited, and an EOI) and the entropy-coded
// data for restart_entropy's decoder: a thread's, kept from crop to crop.
struct Scratch {
  std::vector<std::byte> stream;
  RestartSegments segments;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The unstuffed data a thread keeps between decodes: a few large photos' worth (ImageNet's
// average file is 110 KB); a larger scan's copy is freed once its decode is over.
constexpr std::size_t kept_bytes = std::size_t{8} << 20;

struct TrimAfter {
  RestartSegments& segments;
  ~TrimAfter() { segments.trim(kept_bytes); }
};

void start_stream(std::vector<std::byte>& stream, std::span<const std::byte> data,
                  std::size_t entropy_at) {
  stream.assign(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(entropy_at));
}

}  // namespace

std::optional<JpegRegion> decode_restart_region(std::span<const std::byte> data,
                                                const shards::RestartIndex& layout, int top,
                                                int left, int height, int width,
                                                std::vector<std::uint8_t>& buffer,
                                                int denominator) {
  if (!layout.marked() || (denominator != 1 && denominator != 2 && denominator != 4 &&
                           denominator != 8)) {
    return std::nullopt;
  }
  const auto f = parse_jpeg_frame(data);
  if (!f || !f->huffman_sequential) mismatch("its headers are not those of a baseline JPEG");
  // A bomb is refused by the whole-image decode the caller falls back to, as decode_scan_region
  // and the region decoder refuse it: the SOF edited below would show that decoder only the
  // region's size, and a crop of an image over the limit would decode.
  if (const std::int64_t limit = max_image_pixels();
      limit > 0 && std::int64_t{f->width} * f->height > limit) {
    return std::nullopt;
  }
  if (f->restart_interval != layout.interval) {
    mismatch("its DRI says " + std::to_string(f->restart_interval) +
             " MCUs a restart interval, the index " + std::to_string(layout.interval));
  }
  const int n = static_cast<int>(layout.interval);
  if (f->mcus_per_row % n != 0 || layout.rows.size() != static_cast<std::size_t>(f->mcu_rows) ||
      layout.rows[0] != f->entropy_at) {
    mismatch("its MCU rows are not those the index records");
  }
  const int d = denominator;
  const int scaled_w = (f->width + d - 1) / d;
  const int scaled_h = (f->height + d - 1) / d;
  if (top < 0 || left < 0 || height <= 0 || width <= 0 || height > scaled_h - top ||
      width > scaled_w - left) {
    return std::nullopt;  // the region decoder declines it too, and the full decode says why
  }
  // The crop at full size with a margin, in MCUs widened to whole intervals. The margin: the
  // region's edges inside the image are upsampled as edges, which changes the pixels whose
  // fancy upsampling reads the chroma sample beyond: libjpeg-turbo interpolates only 2:1 (a
  // sample of 2 pixels; other ratios replicate), so the pixel next to the edge. 2 pixels keep
  // the crop clear of it (region_test checks every offset of every subsampling; 0 fails there).
  constexpr int margin = 2;
  const int per_row = f->mcus_per_row / n;
  const int c0 = std::max(0, left * d - margin) / f->mcu_width;
  const int c1 = std::min(f->mcus_per_row,
                          ((left + width) * d + margin + f->mcu_width - 1) / f->mcu_width);
  const int i0 = c0 / n;
  const int i1 = (c1 + n - 1) / n;
  const int r0 = std::max(0, top * d - margin) / f->mcu_height;
  const int r1 = std::min(f->mcu_rows,
                          ((top + height) * d + margin + f->mcu_height - 1) / f->mcu_height);
  // The whole image: the file itself is that stream.
  if (i0 == 0 && i1 == per_row && r0 == 0 && r1 == f->mcu_rows) return std::nullopt;
  const int x0 = i0 * n * f->mcu_width;
  const int y0 = r0 * f->mcu_height;
  const int region_w = std::min(f->width, i1 * n * f->mcu_width) - x0;
  const int region_h = std::min(f->height, r1 * f->mcu_height) - y0;

  auto& [stream, segments] = scratch();
  const TrimAfter trim{segments};
  start_stream(stream, data, f->entropy_at);
  auto put16 = [&](std::size_t i, int v) {
    stream[i] = static_cast<std::byte>(v >> 8);
    stream[i + 1] = static_cast<std::byte>(v & 0xff);
  };
  put16(f->sof_at + 5, region_h);
  put16(f->sof_at + 7, region_w);
  segments.clear();
  segments.mcus = n;
  for (int r = r0; r < r1; ++r) {
    std::size_t pos = layout.rows[static_cast<std::size_t>(r)];
    // The row's intervals: each ends at the RST numbered by its count from the image's start;
    // the row's last ends at the marker before the next row's start (or at the image's end).
    // The whole row is walked, not only the covering intervals: a row start that the index
    // misplaces by whole intervals then ends the row elsewhere than the next row's start.
    const std::int64_t before = std::int64_t{r} * per_row - 1;  // the interval ending before
    // A row start inside the headers (a stray FF Dn in APP data) is refused too: only rows
    // from r0 on are chained to each other, not back to the entropy data's start.
    if (r > 0 && (pos < f->entropy_at + 2 || pos > data.size() || at(data, pos - 2) != 0xff ||
                  at(data, pos - 1) != 0xd0u + static_cast<unsigned>(before % 8))) {
      mismatch("MCU row " + std::to_string(r) + " does not start where the index says");
    }
    for (int k = 0; k < per_row; ++k) {
      const std::int64_t g = std::int64_t{r} * per_row + k;
      const bool last_of_image = r + 1 == f->mcu_rows && k + 1 == per_row;
      unsigned marker = 0;
      // A covering interval is unstuffed for the Huffman decoder on the way to its end.
      const std::size_t end = k >= i0 && k < i1 ? segments.append_until_marker(data, pos, marker)
                                                : next_marker(data, pos, marker);
      const unsigned expected = last_of_image ? 0xd9u : 0xd0u + static_cast<unsigned>(g % 8);
      if (end == data.size() || marker != expected) {
        mismatch("restart interval " + std::to_string(g) + " does not end in the marker its " +
                 "place calls for (the data is truncated, or an RST is missing or out of order)");
      }
      if (k + 1 == per_row && !last_of_image &&
          end + 2 != layout.rows[static_cast<std::size_t>(r) + 1]) {
        mismatch("MCU row " + std::to_string(r + 1) + " does not start where the index says");
      }
      pos = end + 2;
    }
  }
  stream.push_back(std::byte{0xff});
  stream.push_back(std::byte{0xd9});
  bool warned = false;
  auto region = decode_jpeg_region_checked(stream, top - y0 / d, left - x0 / d, height, width,
                                           buffer, d, &warned, &segments);
  if (!region || warned) {
    mismatch(warned ? "its intervals decode with libjpeg warnings (a DRI that does not match "
                      "the intervals' MCUs, or damaged data)"
                    : "its covering intervals do not decode");
  }
  region->x0 += x0 / d;
  region->y0 += y0 / d;
  restart_decodes.fetch_add(1, std::memory_order_relaxed);
  return region;
}

std::optional<JpegRegion> decode_scan_region(std::span<const std::byte> data,
                                             const JpegFrame& frame, int top, int left, int height,
                                             int width, std::vector<std::uint8_t>& buffer,
                                             int denominator) {
  if (!scan_decoder_on.load(std::memory_order_relaxed) || !frame.huffman_sequential ||
      frame.mcus_per_row <= 0 || frame.mcu_rows <= 0) {
    return std::nullopt;
  }
  // Refused before the copy below: what the region decoder would decline after it (a bomb,
  // CMYK or YCCK, a scale libjpeg has no IDCT for), and scans past the segments' 32-bit offsets.
  if (const std::int64_t limit = max_image_pixels();
      (limit > 0 && std::int64_t{frame.width} * frame.height > limit) || frame.components == 4 ||
      (denominator != 1 && denominator != 2 && denominator != 4 && denominator != 8) ||
      data.size() - frame.entropy_at > std::size_t{std::numeric_limits<std::uint32_t>::max() / 2}) {
    return std::nullopt;
  }
  auto& [stream, segments] = scratch();
  const TrimAfter trim{segments};
  segments.clear();
  // Without restart markers the scan is one interval. With them (a camera's file, or a
  // --fast-crop member decoded whole) each interval ends in the RST its place calls for,
  // RST0 to RST7 in turn, and the last (which may hold fewer MCUs) in the EOI; the decoder
  // resets the DC predictions at each, as libjpeg does at an RST.
  const std::int64_t mcus = std::int64_t{frame.mcus_per_row} * frame.mcu_rows;
  const std::int64_t interval = frame.restart_interval != 0 ? frame.restart_interval : mcus;
  const std::int64_t intervals = (mcus + interval - 1) / interval;
  // Every interval but the last takes at least three bytes of the data (its MCUs' bits, at
  // least a DC code and an end of block a block, padded to a byte, then its RST), and
  // `padding` bytes of the copy, whose offsets are 32-bit: a DRI whose intervals the data
  // cannot hold is refused here, before anything is copied.
  const auto scan_bytes = static_cast<std::uint64_t>(data.size() - frame.entropy_at);
  if (static_cast<std::uint64_t>(intervals - 1) > scan_bytes / 3 ||
      scan_bytes + static_cast<std::uint64_t>(intervals) * RestartSegments::padding >
          std::numeric_limits<std::uint32_t>::max()) {
    return std::nullopt;
  }
  segments.mcus = static_cast<int>(interval);
  // The scan must end in the image's EOI, after every RST in order: a truncated file, an RST
  // without a DRI, one missing or out of order, or a DNL is left to libjpeg, which says what it
  // makes of it.
  std::size_t pos = frame.entropy_at;
  for (std::int64_t g = 0; g < intervals; ++g) {
    unsigned marker = 0;
    const std::size_t end = segments.append_until_marker(data, pos, marker);
    const unsigned expected = g + 1 == intervals ? 0xd9u : 0xd0u + static_cast<unsigned>(g % 8);
    if (end == data.size() || marker != expected) return std::nullopt;
    pos = end + 2;
  }
  start_stream(stream, data, frame.entropy_at);
  stream.push_back(std::byte{0xff});
  stream.push_back(std::byte{0xd9});
  // A crop of a file without restart markers starts from the checkpoints an earlier crop of the
  // same bytes left (scan_checkpoints.cpp); a whole image needs every MCU and keeps none.
  ScanCheckpoints* checkpoints = nullptr;
  CheckpointKey key;
  const bool whole = top == 0 && left == 0 &&
                     height == (frame.height + denominator - 1) / denominator &&
                     width == (frame.width + denominator - 1) / denominator;
  if (frame.restart_interval == 0 && !whole) {
    thread_local ScanCheckpoints points;
    key = load_checkpoints(data, frame.mcus_per_row, frame.mcu_rows, points);
    if (key) checkpoints = &points;
  }
  bool warned = false;
  auto region = decode_jpeg_region_checked(stream, top, left, height, width, buffer, denominator,
                                           &warned, &segments, checkpoints);
  if (!region || warned) return std::nullopt;
  if (checkpoints) store_checkpoints(key, *checkpoints);
  scan_decodes.fetch_add(1, std::memory_order_relaxed);
  return region;
}

bool set_scan_decoder(bool on) noexcept {
  return scan_decoder_on.exchange(on);
}

std::size_t scratch_capacity() noexcept {
  return scratch().segments.bytes.capacity();
}

std::uint64_t scan_region_decodes() noexcept {
  return scan_decodes.load(std::memory_order_relaxed);
}

std::uint64_t restart_region_decodes() noexcept {
  return restart_decodes.load(std::memory_order_relaxed);
}

ScopedRestartHint::ScopedRestartHint(const RestartHint& hint) noexcept : previous_(current_hint) {
  current_hint = hint;
}

ScopedRestartHint::~ScopedRestartHint() { current_hint = previous_; }

const RestartHint* restart_hint_for(std::span<const std::byte> data) noexcept {
  const RestartHint& h = current_hint;
  return h.layout && h.data == data.data() && h.size == data.size() ? &h : nullptr;
}

std::optional<JpegRegion> decode_hinted_region(const RestartHint& hint, int top, int left,
                                               int height, int width,
                                               std::vector<std::uint8_t>& buffer,
                                               int denominator) {
  try {
    return decode_restart_region({hint.data, hint.size}, *hint.layout, top, left, height, width,
                                 buffer, denominator);
  } catch (const RestartMismatch& e) {
    // One warning per member: an edited or damaged shard is read through the plain decode,
    // which gives the member's own pixels (or its own error), never the intervals' guess.
    const std::string shard = hint.shard ? *hint.shard : std::string("?");
    const std::string member = hint.member ? *hint.member : std::string("?");
    coload::detail::warn_once("restart:" + shard + "\n" + member,
                              "member '" + member + "' of shard '" + shard +
                                  "' does not match its index's restart intervals (" + e.what +
                                  "): decoded without them");
    return std::nullopt;
  }
}

}  // namespace coload::vision::detail
