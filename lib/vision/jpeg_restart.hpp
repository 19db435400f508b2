#pragma once
// Internal: JPEG restart markers, which let a crop's decode start in the middle of the entropy
// data (lib/vision/jpeg_restart.cpp: the layout and the lossless transcode that adds them;
// lib/vision/restart_decode.cpp: the decode of a crop from its covering intervals).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coload/shards/index.hpp"
#include "jpeg_region.hpp"

namespace coload::vision::detail {

/// What a JPEG's headers say about its frame, as far as restart decoding needs it.
struct JpegFrame {
  int width = 0;
  int height = 0;
  int mcu_width = 0;   // pixels, full size
  int mcu_height = 0;
  int mcus_per_row = 0;
  int mcu_rows = 0;
  int components = 0;
  bool huffman_sequential = false;  // SOF0 or SOF1 with one scan: what the region decoder reads
  std::uint32_t restart_interval = 0;  // the DRI before the scan, 0 for none
  std::size_t sof_at = 0;      // offset of the SOF marker
  std::size_t entropy_at = 0;  // offset of the first byte after the SOS segment
};

/// Parses the markers up to the first scan. Nothing for data that is not a JPEG, or whose
/// headers are damaged or truncated.
std::optional<JpegFrame> parse_jpeg_frame(std::span<const std::byte> jpeg);

/// Checks what a JPEG's frame claims before anything is allocated for its pixels: the pixel
/// limit (check_image_pixels), then that its Huffman-coded data (from its first scan to the
/// end of `jpeg`) can hold them: each 8x8 block of a component costs a code of at least one
/// bit (its DC difference, in a sequential scan and in a progressive file's DC scan), so a byte
/// holds at most 8 of the largest component's blocks (a DecodeError else), as the PNG decoder
/// bounds its image by its compressed bytes. The markers are walked as libjpeg reads them
/// (standalone markers and stray bytes passed over), so that no file libjpeg decodes escapes
/// the check; one it cannot read, or arithmetic-coded, is not bounded here.
void check_jpeg_claims(std::span<const std::byte> jpeg);

/// The next marker in entropy-coded data at or after `pos`: the offset of its 0xFF, with
/// `marker` set; stuffed bytes (FF 00) and fill bytes are skipped. b.size() when there is none.
std::size_t next_marker(std::span<const std::byte> b, std::size_t pos, unsigned& marker);

/// The layout coload records of a JPEG with restart markers: nothing unless it is a baseline
/// (or extended) sequential Huffman JPEG with one scan, a DRI that divides its MCU rows into
/// whole intervals, and RST markers in sequence exactly where the DRI says (counted per row).
std::optional<shards::RestartIndex> scan_restart_layout(std::span<const std::byte> jpeg);

/// The MCUs per interval that add_restart_markers uses for an image `mcus_per_row` MCUs wide:
/// the largest divisor of it not above `target` (so that intervals never span two rows).
int restart_interval_for(int mcus_per_row, int target);

/// What add_restart_markers did.
enum class RestartOutcome { marked, progressive, arithmetic, already_marked, other, not_jpeg };
const char* to_string(RestartOutcome outcome) noexcept;

/// Transcodes a baseline JPEG at the coefficient level (libjpeg's jpeg_read_coefficients and
/// jpeg_write_coefficients, as `jpegtran -restart` does) into `out`, with a restart marker every
/// restart_interval_for(mcus_per_row, target_mcus) MCUs and optimised Huffman tables; the DCT
/// coefficients, and so every decoded pixel, are unchanged. Other markers (APPn, COM) are
/// copied. Progressive, arithmetic-coded, already-marked, CMYK/YCCK or multi-scan files are
/// not transcoded (`out` is left empty, the outcome says why); so are files libjpeg warns on.
RestartOutcome add_restart_markers(std::span<const std::byte> jpeg, int target_mcus,
                                   std::vector<std::byte>& out);

/// Decodes the crop through the intervals that cover it (plus a margin for chroma upsampling and
/// the region decoder's own) at 1/`denominator`, as decode_jpeg_region does on the whole file,
/// with the same pixels. Nothing when it does not apply (no layout, a crop covering most of the
/// image); throws RestartMismatch when the file does not match `layout`.
std::optional<JpegRegion> decode_restart_region(std::span<const std::byte> jpeg,
                                                const shards::RestartIndex& layout, int top,
                                                int left, int height, int width,
                                                std::vector<std::uint8_t>& buffer,
                                                int denominator = 1);

/// Decodes the crop of a JPEG as decode_jpeg_region does, with the same pixels, its whole scan
/// decoded by restart_entropy.cpp's Huffman decoder in place of libjpeg's: as one interval, or
/// the DRI's intervals where the file has restart markers. Nothing when it does not apply (not
/// a baseline single-scan Huffman JPEG, an RST missing or out of order, a scan that does not end
/// in the EOI) or the decode fails or warns (damaged data): the caller then decodes through
/// libjpeg alone.
std::optional<JpegRegion> decode_scan_region(std::span<const std::byte> jpeg,
                                             const JpegFrame& frame, int top, int left, int height,
                                             int width, std::vector<std::uint8_t>& buffer,
                                             int denominator = 1);

/// Turns decode_scan_region on or off for the whole process (on by default; off, it declines
/// every file and libjpeg decodes them): for benches that time both. Returns the previous state.
bool set_scan_decoder(bool on) noexcept;

/// set_scan_decoder for a scope, the previous state restored after it (exceptions included).
class ScopedScanDecoder {
 public:
  explicit ScopedScanDecoder(bool on) noexcept : previous_(set_scan_decoder(on)) {}
  ~ScopedScanDecoder() { set_scan_decoder(previous_); }
  ScopedScanDecoder(const ScopedScanDecoder&) = delete;
  ScopedScanDecoder& operator=(const ScopedScanDecoder&) = delete;

 private:
  bool previous_;
};

/// The bytes the calling thread keeps for the unstuffed entropy-coded data between decodes (for
/// tests): at most 8 MiB after any decode, whatever the largest file it decoded.
std::size_t scratch_capacity() noexcept;

/// Crops this process decoded by decode_scan_region (for tests and profiles).
std::uint64_t scan_region_decodes() noexcept;

/// Crops this process decoded from their restart intervals (for tests and profiles).
std::uint64_t restart_region_decodes() noexcept;

/// A marked member whose bytes do not match its recorded layout.
struct RestartMismatch {
  std::string what;
};

/// The restart layout of the JPEG that the calling thread is about to decode (set by the shard
/// pipeline from the shard's index around a sample's transform): the region decoder uses it for
/// that data only. A thread-local rather than a parameter: the fused transforms between the
/// pipeline and the decoder take the encoded bytes alone.
struct RestartHint {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  const shards::RestartIndex* layout = nullptr;
  const std::string* shard = nullptr;
  const std::string* member = nullptr;
};

/// Sets the calling thread's hint for its lifetime (restoring the previous one after).
class ScopedRestartHint {
 public:
  explicit ScopedRestartHint(const RestartHint& hint) noexcept;
  ~ScopedRestartHint();
  ScopedRestartHint(const ScopedRestartHint&) = delete;
  ScopedRestartHint& operator=(const ScopedRestartHint&) = delete;

 private:
  RestartHint previous_;
};

/// The hint for `data`, or nullptr when the thread's hint is for other bytes.
const RestartHint* restart_hint_for(std::span<const std::byte> data) noexcept;

/// decode_restart_region on the hint's data and layout; a RestartMismatch becomes one warning
/// naming the hint's shard and member, and nothing (the caller then decodes as without a hint).
std::optional<JpegRegion> decode_hinted_region(const RestartHint& hint, int top, int left,
                                               int height, int width,
                                               std::vector<std::uint8_t>& buffer,
                                               int denominator);

}  // namespace coload::vision::detail
