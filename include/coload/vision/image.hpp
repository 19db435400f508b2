#pragma once
// Image and ImageView: 8-bit interleaved (HWC) pixels, the currency between decoding and the
// PIL-semantics transforms. CropBox: a region in torchvision's (top, left, height, width) order.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace coload::vision {

/// A read-only view of 8-bit interleaved pixels; rows are `stride` bytes apart.
struct ImageView {
  /// The first byte of the top-left pixel.
  const std::uint8_t* data = nullptr;
  /// Width in pixels.
  int width = 0;
  /// Height in pixels.
  int height = 0;
  /// Bytes per pixel: 1 (gray), 3 (RGB) or 4.
  int channels = 3;
  /// Bytes from one row to the next.
  std::ptrdiff_t stride = 0;

  /// The first byte of row `y`.
  const std::uint8_t* row(int y) const noexcept { return data + y * stride; }
};

/// An owned 8-bit image in HWC layout, rows packed (stride = width × channels), like a PIL image
/// after `convert('RGB')` when `channels` is 3.
struct Image {
  /// Width in pixels.
  int width = 0;
  /// Height in pixels.
  int height = 0;
  /// Bytes per pixel: 1 (gray), 3 (RGB) or 4.
  int channels = 3;
  /// `height × width × channels` bytes, row after row.
  std::vector<std::uint8_t> data;

  /// An image of the given shape, every byte zero.
  static Image zeros(int width, int height, int channels = 3) {
    return Image{width, height, channels,
                 std::vector<std::uint8_t>(static_cast<std::size_t>(width) * height * channels)};
  }
  /// A view of all of this image's pixels.
  ImageView view() const noexcept {
    return {data.data(), width, height, channels, static_cast<std::ptrdiff_t>(width) * channels};
  }
  /// The bytes of pixel (x, y).
  std::uint8_t* pixel(int x, int y) noexcept {
    return data.data() + (static_cast<std::size_t>(y) * width + x) * channels;
  }
  /// The bytes of pixel (x, y).
  const std::uint8_t* pixel(int x, int y) const noexcept {
    return data.data() + (static_cast<std::size_t>(y) * width + x) * channels;
  }
};

/// A crop region in torchvision's order: `F.crop(img, top, left, height, width)`.
struct CropBox {
  /// Row of the box's top edge.
  int top = 0;
  /// Column of the box's left edge.
  int left = 0;
  /// Rows in the box.
  int height = 0;
  /// Columns in the box.
  int width = 0;

  friend bool operator==(const CropBox&, const CropBox&) = default;
};

}  // namespace coload::vision
