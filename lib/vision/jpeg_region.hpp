#pragma once
// Internal: decoding the part of a JPEG that a crop needs (lib/vision/jpeg_region.cpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace coload::vision::detail {

/// Decoded RGB rows of a JPEG covering a crop, with the region's origin in the image.
struct JpegRegion {
  const std::uint8_t* pixels = nullptr;
  int x0 = 0;
  int y0 = 0;
  int width = 0;
  int height = 0;
  std::ptrdiff_t stride = 0;
};

/// Decodes at least the crop `[top, top + height) × [left, left + width)` of a baseline RGB or
/// grayscale JPEG into `buffer`, identical to the same pixels of a whole-image decode at the
/// same scale. At a `denominator` of 2, 4 or 8 the JPEG is decoded at that DCT scale (libjpeg's
/// rounded-up size, as decode_into's) and the crop is in the scaled image's coordinates.
/// Returns nothing for anything it does not handle (CMYK, progressive, damaged or truncated
/// data, a crop outside the image): the caller then decodes the whole image, which reports the
/// error properly.
std::optional<JpegRegion> decode_jpeg_region(std::span<const std::byte> data, int top, int left,
                                             int height, int width,
                                             std::vector<std::uint8_t>& buffer,
                                             int denominator = 1);

/// True when an EOI marker follows `from`, the first scan's first byte: within a scan each
/// 0xFF is followed by 0x00 or an RST marker, so the first 0xFF 0xD9 is the end (bytes after
/// the EOI, which some cameras append, are not read). False for data cut off before its end.
bool eoi_after(std::span<const std::byte> data, std::size_t from);

struct RestartSegments;
struct ScanCheckpoints;

/// decode_jpeg_region without the restart intervals of the thread's RestartHint, which sets
/// `*warned` when libjpeg warned (damaged data it repaired): for streams built from intervals,
/// where any repair means the intervals are not what their index says. With `segments`, `data`
/// is the headers alone and the MCUs' entropy-coded data are `segments`' intervals, decoded by
/// restart_entropy.cpp in place of libjpeg's Huffman decoder; with `checkpoints` too, a scan
/// of one interval starts its MCUs from them (install_segment_decoder) and records them.
std::optional<JpegRegion> decode_jpeg_region_checked(std::span<const std::byte> data, int top,
                                                     int left, int height, int width,
                                                     std::vector<std::uint8_t>& buffer,
                                                     int denominator, bool* warned,
                                                     const RestartSegments* segments = nullptr,
                                                     ScanCheckpoints* checkpoints = nullptr);

}  // namespace coload::vision::detail
