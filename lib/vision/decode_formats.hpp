#pragma once
// vision/decode_formats: the formats ImageFolder admits besides JPEG and PNG (WebP through
// libwebp, TIFF through libtiff, Netpbm and BMP read here), each to RGB as Pillow 9.4's
// `Image.open(f).convert('RGB')` gives it, and each bounded by max_image_pixels() before it
// allocates. decode.cpp tells the formats apart and calls these.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coload/vision/decode.hpp"
#include "coload/vision/image.hpp"

namespace coload::vision::detail {

/// The format among WebP, TIFF, Netpbm and BMP whose signature `data` starts with, if any.
std::optional<ImageFormat> sniff_other(std::span<const std::byte> data) noexcept;

/// Width and height from the header of a WebP, TIFF, Netpbm or BMP image (DecodeError when the
/// header is missing or malformed).
ImageInfo peek_other(std::span<const std::byte> data, ImageFormat format);

/// Decodes a WebP, TIFF, Netpbm or BMP image into `out` (grown when too small, never shrunk) as
/// packed RGB, returning a view of it.
ImageView decode_other(std::span<const std::byte> data, ImageFormat format,
                       std::vector<std::uint8_t>& out);

/// The format's name in messages: "WebP", "TIFF", "Netpbm", "BMP".
const char* format_name(ImageFormat format) noexcept;

}  // namespace coload::vision::detail
