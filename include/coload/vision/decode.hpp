#pragma once
// Image decoding from bytes in memory, to RGB as PIL's `Image.open(f).convert('RGB')` gives it:
// JPEG (TurboJPEG; optionally at a reduced DCT scale), PNG (libspng), WebP (libwebp), TIFF
// (libtiff), Netpbm and BMP: every extension ImageFolder admits.
//
// Decoding never opens files (the bytes come from the io stage), except `decode_file`, a
// convenience for tools and tests. Every function is thread-safe: each thread keeps its own
// TurboJPEG handles.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"

#include "coload/vision/image.hpp"

namespace coload::vision {

/// Raised for data that cannot be decoded: empty, of an unknown format, corrupt or truncated.
/// `what()` says what went wrong; callers add the path.
class DecodeError : public std::runtime_error, public Error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// Raised before anything is allocated for an image whose header declares more pixels than
/// `max_image_pixels()` (PIL's DecompressionBombError). Decoding functions that know the file
/// name it in `what()`; `path()` is empty where they do not.
class DecompressionBombError : public DecodeError {
 public:
  DecompressionBombError(std::int64_t width, std::int64_t height, std::int64_t limit,
                         std::string path = {});
  /// The same error, naming `path` (a caller that knows the file adds it).
  DecompressionBombError with_path(std::string path) const {
    return DecompressionBombError(width_, height_, limit_, std::move(path));
  }
  /// The declared size.
  std::int64_t width() const noexcept { return width_; }
  std::int64_t height() const noexcept { return height_; }
  /// The limit in force when it was raised.
  std::int64_t limit() const noexcept { return limit_; }
  /// The file, or empty.
  const std::string& path() const noexcept { return path_; }

 private:
  std::int64_t width_;
  std::int64_t height_;
  std::int64_t limit_;
  std::string path_;
};

/// PIL's `Image.MAX_IMAGE_PIXELS`: 1024 × 1024 × 1024 // 4 // 3.
inline constexpr std::int64_t default_max_image_pixels = 89'478'485;

/// The most pixels (width × height, at full size) an image may declare: every decode path
/// (`decode`, `decode_into`, `decode_file`, the default ImageFolder loader, the fused train and
/// eval transforms, DCT-scaled and region decodes, every format) checks the header against it
/// before allocating and raises DecompressionBombError above it. 0 means no limit.
///
/// NOTE: PIL only warns between the limit and twice the limit and raises above that; here the
/// limit itself is the bound, so that what is allocated stays under it. The setting is
/// process-wide (as PIL's): worker processes started after it is set inherit it; set it before
/// building a loader with `executor = processes`.
std::int64_t max_image_pixels() noexcept;
/// Sets max_image_pixels(); 0 removes the limit; a negative value throws InvalidArgument.
void set_max_image_pixels(std::int64_t limit);
/// Raises DecompressionBombError when `width × height` exceeds max_image_pixels(), and
/// DecodeError above 2^40 pixels whatever the limit says (0 included): no decode's size
/// arithmetic may wrap on a declared size.
void check_image_pixels(std::int64_t width, std::int64_t height);

/// The bytes this process may keep for JPEG checkpoints (default 64 MiB; the environment
/// variable COLOAD_JPEG_CHECKPOINT_MB, read when coload is loaded, sets another; 0 turns them
/// off). A crop of a baseline JPEG without restart markers must have the file's Huffman data
/// decoded from the start of its scan up to the crop's last row; coload keeps, for each file it
/// cropped, where that decoding stood at four points of every MCU row (about 1.3 KB for a
/// 430 × 400 photo, keyed by a hash of the file's bytes), so that a later crop of the same bytes
/// (the next epoch's) starts at the point before its first MCU and skips the MCUs right of it:
/// about a third less Huffman decoding for a RandomResizedCrop, 14% less CPU for the classic
/// recipe's pipeline (docs/performance.md, session 24). The same coefficients, so the same
/// pixels. The oldest files' points go first beyond the budget, so a dataset whose points do not
/// fit gains in proportion (64 MiB holds about 50,000 such photos; ImageNet's 1.28 million need
/// about 1.7 GB); whole-image decodes keep none. Each worker process keeps its own.
std::size_t jpeg_checkpoint_budget() noexcept;
/// Sets jpeg_checkpoint_budget(), dropping the oldest points beyond it; returns the previous.
std::size_t set_jpeg_checkpoint_budget(std::size_t bytes) noexcept;
/// The bytes of JPEG checkpoints kept now (at most the budget).
std::size_t jpeg_checkpoint_bytes() noexcept;

/// The formats `decode` understands, told apart by their signature bytes (never by a file's
/// extension, as PIL does): `pnm` is Netpbm's P1-P6 (.pbm .pgm .ppm .pnm).
enum class ImageFormat { jpeg, png, webp, tiff, pnm, bmp };

/// What `peek` learns from an image's header.
struct ImageInfo {
  /// The format, from the signature.
  ImageFormat format = ImageFormat::jpeg;
  /// Full-size width in pixels.
  int width = 0;
  /// Full-size height in pixels.
  int height = 0;
};

/// Reads format, width and height from the header without decoding pixels.
/// Throws DecodeError when the header is missing or malformed. It does not check the size
/// against max_image_pixels() (check_image_pixels does).
ImageInfo peek(std::span<const std::byte> data);

/// The DCT scale denominators a JPEG can be decoded at here: 1, 2, 4 and 8 (libjpeg-turbo's
/// SIMD-accelerated reduced IDCTs).
inline constexpr int jpeg_scale_denominators[] = {1, 2, 4, 8};

/// The largest denominator d in {1, 2, 4, 8} such that a `crop_width × crop_height` region of
/// the full-size image, decoded at scale 1/d, still has at least `out_width × out_height`
/// pixels; so resizing the scaled region to the output never upsamples where resizing the
/// full-size region would not. Returns 1 when no reduction qualifies.
int choose_jpeg_scale(int crop_width, int crop_height, int out_width, int out_height) noexcept;

/// Width or height of a JPEG decoded at scale 1/`denominator` (libjpeg rounds up).
constexpr int jpeg_scaled_size(int full_size, int denominator) noexcept {
  return (full_size + denominator - 1) / denominator;
}

/// Decodes `data` (JPEG, PNG, WebP, TIFF, Netpbm or BMP) to a 3-channel RGB image.
///
/// NOTE: JPEGs are always decoded whole (at the chosen DCT scale) and cropped afterwards:
/// TurboJPEG 2.1 has no region decode, and libjpeg's jpeg_crop_scanline/jpeg_skip_scanlines
/// would still entropy-decode every block, so they would save only the IDCT and colour
/// conversion of the rows and columns outside a crop.
///
/// JPEGs are decoded at scale 1/`jpeg_scale_denominator` (1, 2, 4 or 8; other values throw
/// std::invalid_argument); other formats ignore it. Grayscale becomes RGB by repetition; CMYK and YCCK
/// JPEGs are taken as Adobe-inverted and converted as Pillow 9 converts CMYK to RGB; PNG alpha is
/// dropped, 16-bit samples keep their high byte, except 16-bit grayscale, which Pillow opens as
/// 32-bit integers and clamps to 255.
///
/// The other formats, as Pillow 9.4 reads them: WebP's first frame through libwebp's animation
/// decoder, alpha dropped (a fully transparent pixel is black, as Pillow's canvas has it). TIFF's
/// first directory through libtiff (any compression, strips or tiles, palette, bilevel, gray,
/// YCbCr, CMYK: within 1 of Pillow, which rounds where libtiff truncates), turned as its
/// Orientation tag says, as Pillow turns it; alpha dropped as stored. Netpbm P1-P6, maxval other
/// than 255 rescaled with Python's round, 16-bit gray clamped to 255 (Pillow's mode "I"). BMP
/// at 1, 4, 8, 16, 24 and 32 bits, RLE4/RLE8, bottom-up or top-down, Pillow's bitfield layouts
/// (others, and JPEG or PNG inside a BMP, are refused as Pillow refuses them).
Image decode(std::span<const std::byte> data, int jpeg_scale_denominator = 1);

/// Like `decode`, but writes the pixels into `buffer` (grown when too small, never shrunk) and
/// returns a view of them, so a thread decoding many images allocates only for the largest.
ImageView decode_into(std::span<const std::byte> data, std::vector<std::uint8_t>& buffer,
                      int jpeg_scale_denominator = 1);

/// Reads the file at `path` and decodes it; errors name the path.
Image decode_file(const std::filesystem::path& path, int jpeg_scale_denominator = 1);

/// Chroma subsampling of an encoded JPEG.
enum class ChromaSubsampling { s444, s422, s420, gray };

/// Encodes 8-bit pixels (`channels` 1 = gray, 3 = RGB, 4 = CMYK, stored as given, no inversion)
/// as a baseline JPEG through TurboJPEG: for tests, tools and data generators.
std::vector<std::byte> encode_jpeg(const ImageView& image, int quality = 90,
                                   ChromaSubsampling subsampling = ChromaSubsampling::s420);

/// Views a byte container as `std::span<const std::byte>`.
inline std::span<const std::byte> as_bytes_span(const std::vector<std::uint8_t>& v) noexcept {
  return std::as_bytes(std::span<const std::uint8_t>(v));
}

}  // namespace coload::vision
