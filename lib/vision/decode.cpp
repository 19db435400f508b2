// vision/decode: JPEG through TurboJPEG (one handle per thread), PNG through libspng, both to
// RGB as Pillow 9's convert('RGB') gives it; the other formats ImageFolder admits are in
// decode_formats.cpp.

#include "coload/vision/decode.hpp"
#include "coload/core/error.hpp"
#include "coload/io/errors.hpp"
#include "coload/io/whole_file.hpp"
#include "decode_formats.hpp"
#include "jpeg_region.hpp"
#include "jpeg_restart.hpp"

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace coload::vision {
namespace {

std::atomic<std::int64_t> pixel_limit{default_max_image_pixels};

// The most pixels any decode accepts, whatever max_image_pixels() says (0 included).
constexpr std::int64_t max_decodable_pixels = std::int64_t{1} << 40;

std::string bomb_message(std::int64_t width, std::int64_t height, std::int64_t limit,
                         const std::string& path) {
  return (path.empty() ? std::string() : path + ": ") + "image size " + std::to_string(width) +
         "x" + std::to_string(height) + " (" + std::to_string(width * height) +
         " pixels) exceeds the limit of " + std::to_string(limit) +
         " pixels, could be a decompression bomb; raise the limit with "
         "coload::vision::set_max_image_pixels(n) (0: no limit)";
}

constexpr std::uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

const unsigned char* bytes_of(std::span<const std::byte> data) noexcept {
  return reinterpret_cast<const unsigned char*>(data.data());
}

ImageFormat sniff(std::span<const std::byte> data) {
  if (data.empty()) throw DecodeError("empty data (0 bytes): not an image");
  const unsigned char* p = bytes_of(data);
  if (data.size() >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return ImageFormat::jpeg;
  if (data.size() >= 8 && std::memcmp(p, png_signature, 8) == 0) return ImageFormat::png;
  if (const auto other = detail::sniff_other(data)) return *other;
  throw DecodeError("unknown image format: the data starts with the signature of none of JPEG, "
                    "PNG, WebP, TIFF, Netpbm (P1-P6) or BMP (" + std::to_string(data.size()) +
                    " bytes)");
}

// One TurboJPEG handle of each kind per thread, created on first use, destroyed at thread exit.
struct TjHandles {
  tjhandle decompressor = nullptr;
  tjhandle compressor = nullptr;
  ~TjHandles() {
    if (decompressor != nullptr) tjDestroy(decompressor);
    if (compressor != nullptr) tjDestroy(compressor);
  }
};
thread_local TjHandles tj_handles;

tjhandle decompressor() {
  if (tj_handles.decompressor == nullptr) {
    tj_handles.decompressor = tjInitDecompress();
    if (tj_handles.decompressor == nullptr) {
      throw RuntimeError(std::string("tjInitDecompress failed: ") + tjGetErrorStr2(nullptr));
    }
  }
  return tj_handles.decompressor;
}

// NOTE: after a failed or truncated header read, TurboJPEG 2.1's handle keeps stale libjpeg
// state and misreads the next image ("missing SOS marker", zero sizes), so any failure throws the
// handle away; the next call makes a fresh one.
void reset_decompressor() noexcept {
  if (tj_handles.decompressor != nullptr) tjDestroy(tj_handles.decompressor);
  tj_handles.decompressor = nullptr;
}

tjhandle compressor() {
  if (tj_handles.compressor == nullptr) {
    tj_handles.compressor = tjInitCompress();
    if (tj_handles.compressor == nullptr) {
      throw RuntimeError(std::string("tjInitCompress failed: ") + tjGetErrorStr2(nullptr));
    }
  }
  return tj_handles.compressor;
}

struct JpegHeader {
  int width = 0;
  int height = 0;
  int colorspace = TJCS_RGB;
};

JpegHeader read_jpeg_header(tjhandle h, std::span<const std::byte> data) {
  JpegHeader header;
  int subsampling = 0;
  const int rc = tjDecompressHeader3(h, bytes_of(data), static_cast<unsigned long>(data.size()),
                                     &header.width, &header.height, &subsampling,
                                     &header.colorspace);
  if (rc != 0 || header.width <= 0 || header.height <= 0) {
    // A header cut short reads as success with zero sizes and "Premature end of JPEG file".
    const std::string message = tjGetErrorStr2(h);
    reset_decompressor();
    throw DecodeError("corrupt JPEG header: " + message);
  }
  return header;
}

void check_scale(int denominator) {
  if (denominator != 1 && denominator != 2 && denominator != 4 && denominator != 8) {
    throw InvalidArgument("jpeg_scale_denominator must be 1, 2, 4 or 8, got " +
                          std::to_string(denominator));
  }
}

// Pillow's rounding x*y/255 for 8-bit x, y (its MULDIV255).
constexpr int muldiv255(int x, int y) noexcept {
  const int t = x * y + 128;
  return ((t >> 8) + t) >> 8;
}

// NOTE: Pillow reads every CMYK JPEG as "CMYK;I", inverting all four channels (Adobe's
// convention, which Photoshop writes), then converts CMYK to RGB as R = (255 - K') - C'(255 - K')/255
// rounded (Pillow >= 9). With C' = 255 - c and K' = 255 - k for the stored values c, k this is
// R = k - muldiv255(255 - c, k).
void cmyk_to_rgb(const std::uint8_t* cmyk, std::uint8_t* rgb, std::size_t pixels) noexcept {
  for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int k = cmyk[3];
    rgb[0] = static_cast<std::uint8_t>(k - muldiv255(255 - cmyk[0], k));
    rgb[1] = static_cast<std::uint8_t>(k - muldiv255(255 - cmyk[1], k));
    rgb[2] = static_cast<std::uint8_t>(k - muldiv255(255 - cmyk[2], k));
  }
}

void grow(std::vector<std::uint8_t>& buffer, std::size_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
}

ImageView decode_jpeg(std::span<const std::byte> data, std::vector<std::uint8_t>& out,
                      int denominator) {
  tjhandle h = decompressor();
  const JpegHeader header = read_jpeg_header(h, data);
  // The full size is what the file declares: a scaled decode of a bomb is refused as well.
  check_image_pixels(header.width, header.height);
  const int width = jpeg_scaled_size(header.width, denominator);
  const int height = jpeg_scaled_size(header.height, denominator);
  const std::size_t pixels = static_cast<std::size_t>(width) * height;
  const bool cmyk = header.colorspace == TJCS_CMYK || header.colorspace == TJCS_YCCK;

  // A baseline JPEG: its scan through coload's Huffman decoder, as a crop of the whole image
  // (the same pixels, about 0.7x the entropy decoding's time; with restart markers, where
  // libjpeg-turbo takes its slow path, about 0.6x). Anything it declines, damaged data
  // included, is TurboJPEG's below, which reports it.
  detail::check_jpeg_claims(data);
  const auto frame = detail::parse_jpeg_frame(data);
  if (!cmyk) {
    if (frame) {
      const auto region =
          detail::decode_scan_region(data, *frame, 0, 0, height, width, out, denominator);
      if (region && region->pixels == out.data() && region->x0 == 0 && region->y0 == 0 &&
          region->width == width && region->height == height &&
          region->stride == static_cast<std::ptrdiff_t>(width) * 3) {
        return ImageView{out.data(), width, height, 3, region->stride};
      }
    }
  }
  thread_local std::vector<std::uint8_t> cmyk_scratch;
  std::uint8_t* target = nullptr;
  if (cmyk) {
    grow(cmyk_scratch, pixels * 4);
    target = cmyk_scratch.data();
  } else {
    grow(out, pixels * 3);
    target = out.data();
  }
  // NOTE: flags 0 keep libjpeg's defaults (accurate integer IDCT, fancy upsampling), which are
  // also Pillow's, so a scale-1 decode here equals PIL's pixel for pixel.
  const int rc = tjDecompress2(h, bytes_of(data), static_cast<unsigned long>(data.size()), target,
                               width, 0, height, cmyk ? TJPF_CMYK : TJPF_RGB, 0);
  if (rc != 0) {
    const std::string message = tjGetErrorStr2(h);
    const bool fatal = tjGetErrorCode(h) == TJERR_FATAL;
    reset_decompressor();
    // NOTE: libjpeg reports damaged entropy-coded data as warnings and still fills the image, as
    // Pillow accepts it; running out of data is the one warning Pillow refuses ("image file is
    // truncated"), so it is the one that throws here. TurboJPEG keeps the first warning's text
    // only: a file that warned of something else first is truncated too when it has no EOI.
    if (fatal) throw DecodeError("corrupt JPEG data: " + message);
    if (message.find("Premature end") != std::string::npos) {
      throw DecodeError("truncated JPEG data: " + message);
    }
    if (frame && !detail::eoi_after(data, frame->entropy_at)) {
      throw DecodeError("truncated JPEG data: no end of image after " + message);
    }
  }
  if (cmyk) {
    grow(out, pixels * 3);
    cmyk_to_rgb(cmyk_scratch.data(), out.data(), pixels);
  }
  return ImageView{out.data(), width, height, 3, static_cast<std::ptrdiff_t>(width) * 3};
}

struct SpngDeleter {
  void operator()(spng_ctx* ctx) const noexcept { spng_ctx_free(ctx); }
};

[[noreturn]] void throw_spng(const char* what, int err) {
  throw DecodeError(std::string("corrupt or truncated PNG data (") + what +
                    "): " + spng_strerror(err));
}

std::uint32_t big_endian32(const unsigned char* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// The bytes of the file's compressed image data (its IDAT chunks, as far as they are there).
std::uint64_t png_idat_bytes(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::uint64_t total = 0;
  std::size_t at = 8;  // after the signature
  while (at <= data.size() && data.size() - at >= 8) {
    const std::uint64_t length = big_endian32(p + at);
    const bool idat = std::memcmp(p + at + 4, "IDAT", 4) == 0;
    const std::uint64_t here = std::min<std::uint64_t>(length, data.size() - at - 8);
    if (idat) total += here;
    if (std::memcmp(p + at + 4, "IEND", 4) == 0 || here < length) break;
    if (data.size() - at - 8 - here < 4) break;  // no room for the CRC
    at += static_cast<std::size_t>(8 + length + 4);
  }
  return total;
}

ImageView decode_png(std::span<const std::byte> data, std::vector<std::uint8_t>& out) {
  std::unique_ptr<spng_ctx, SpngDeleter> ctx(spng_ctx_new(0));
  if (!ctx) throw std::bad_alloc();
  // NOTE: bound ancillary chunks so a hostile file cannot make libspng cache megabytes of text.
  spng_set_chunk_limits(ctx.get(), 1u << 26, 1u << 26);
  if (int err = spng_set_png_buffer(ctx.get(), data.data(), data.size())) throw_spng("buffer", err);
  spng_ihdr ihdr{};
  if (int err = spng_get_ihdr(ctx.get(), &ihdr)) throw_spng("header", err);
  check_image_pixels(ihdr.width, ihdr.height);
  const int width = static_cast<int>(ihdr.width);
  const int height = static_cast<int>(ihdr.height);
  const std::size_t pixels = static_cast<std::size_t>(width) * height;
  {
    // Before the pixels are allocated: deflate makes at most 1032 bytes of 1 (a 258-byte match
    // in two 1-bit codes), so image data too short for the rows its header claims is refused
    // here (a 45-byte file claiming 9000x9000 allocated 243 MB before libspng found no data).
    const int channels = ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR          ? 3
                         : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA  ? 4
                         : ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                                                                               : 1;
    const std::uint64_t row_bytes =
        (std::uint64_t{ihdr.width} * channels * ihdr.bit_depth + 7) / 8;
    const std::uint64_t rows = row_bytes * ihdr.height;  // without the filter bytes
    const std::uint64_t compressed = png_idat_bytes(data);
    if (rows > compressed * 1032 + 1024) {
      throw DecodeError("corrupt or truncated PNG data: its " + std::to_string(compressed) +
                        " bytes of image data cannot hold " + std::to_string(ihdr.width) + "x" +
                        std::to_string(ihdr.height) + " pixels");
    }
  }

  if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth == 16) {
    // NOTE: Pillow opens 16-bit grayscale as mode "I" (32-bit integers) and convert('RGB')
    // clamps it to 0..255 instead of scaling; every other 16-bit PNG keeps its high byte.
    thread_local std::vector<std::uint8_t> wide;
    std::size_t size = 0;
    if (int err = spng_decoded_image_size(ctx.get(), SPNG_FMT_PNG, &size)) throw_spng("size", err);
    grow(wide, size);
    if (int err = spng_decode_image(ctx.get(), wide.data(), size, SPNG_FMT_PNG, 0)) {
      throw_spng("pixels", err);
    }
    grow(out, pixels * 3);
    for (std::size_t i = 0; i < pixels; ++i) {
      std::uint16_t v = 0;
      std::memcpy(&v, wide.data() + 2 * i, 2);
      const auto g = static_cast<std::uint8_t>(std::min<std::uint16_t>(v, 255));
      out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = g;
    }
  } else {
    // RGB8 drops alpha and ignores tRNS and gAMA, as convert('RGB') does; palettes are looked up
    // and low bit depths scaled to 0..255 as Pillow unpacks them.
    std::size_t size = 0;
    if (int err = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size)) throw_spng("size", err);
    grow(out, size);
    if (int err = spng_decode_image(ctx.get(), out.data(), size, SPNG_FMT_RGB8, 0)) {
      throw_spng("pixels", err);
    }
  }
  return ImageView{out.data(), width, height, 3, static_cast<std::ptrdiff_t>(width) * 3};
}

}  // namespace

DecompressionBombError::DecompressionBombError(std::int64_t width, std::int64_t height,
                                               std::int64_t limit, std::string path)
    : DecodeError(bomb_message(width, height, limit, path)),
      width_(width),
      height_(height),
      limit_(limit),
      path_(std::move(path)) {}

std::int64_t max_image_pixels() noexcept { return pixel_limit.load(std::memory_order_relaxed); }

void set_max_image_pixels(std::int64_t limit) {
  if (limit < 0) {
    throw InvalidArgument("max_image_pixels must be >= 0 (0: no limit), got " +
                          std::to_string(limit));
  }
  pixel_limit.store(limit, std::memory_order_relaxed);
}

void check_image_pixels(std::int64_t width, std::int64_t height) {
  const std::int64_t limit = max_image_pixels();
  // Both sides are below 2^31 (JPEG: 2^16), so the product cannot overflow.
  const std::int64_t pixels = width * height;
  if (limit > 0 && pixels > limit) throw DecompressionBombError(width, height, limit);
  // Whatever the limit says (0 included), the decoders' size arithmetic (samples × bytes per
  // sample, stride × rows) is done in size_t on the declared size: above 2^40 pixels it could
  // wrap, so such a header is refused as the corrupt size it is.
  if (pixels > max_decodable_pixels) {
    throw DecodeError("image size " + std::to_string(width) + "x" + std::to_string(height) + " (" +
                      std::to_string(pixels) + " pixels) exceeds 2^40 pixels, the most any decode "
                      "accepts whatever max_image_pixels() allows");
  }
}

ImageInfo peek(std::span<const std::byte> data) {
  const ImageFormat format = sniff(data);
  if (format == ImageFormat::jpeg) {
    const JpegHeader header = read_jpeg_header(decompressor(), data);
    return {format, header.width, header.height};
  }
  if (format != ImageFormat::png) return detail::peek_other(data, format);
  const unsigned char* p = bytes_of(data);
  if (data.size() < 24 || std::memcmp(p + 12, "IHDR", 4) != 0) {
    throw DecodeError("corrupt PNG header: no IHDR chunk after the signature");
  }
  const std::uint32_t width = big_endian32(p + 16);
  const std::uint32_t height = big_endian32(p + 20);
  if (width == 0 || height == 0 || width > 0x7fffffffu || height > 0x7fffffffu) {
    throw DecodeError("corrupt PNG header: invalid size " + std::to_string(width) + "x" +
                      std::to_string(height));
  }
  return {format, static_cast<int>(width), static_cast<int>(height)};
}

int choose_jpeg_scale(int crop_width, int crop_height, int out_width, int out_height) noexcept {
  for (int d : {8, 4, 2}) {
    if (static_cast<long>(crop_width) >= static_cast<long>(out_width) * d &&
        static_cast<long>(crop_height) >= static_cast<long>(out_height) * d) {
      return d;
    }
  }
  return 1;
}

ImageView decode_into(std::span<const std::byte> data, std::vector<std::uint8_t>& buffer,
                      int jpeg_scale_denominator) {
  check_scale(jpeg_scale_denominator);
  const ImageFormat format = sniff(data);
  if (format == ImageFormat::jpeg) return decode_jpeg(data, buffer, jpeg_scale_denominator);
  if (format == ImageFormat::png) return decode_png(data, buffer);
  return detail::decode_other(data, format, buffer);
}

Image decode(std::span<const std::byte> data, int jpeg_scale_denominator) {
  Image image;
  const ImageView view = decode_into(data, image.data, jpeg_scale_denominator);
  image.width = view.width;
  image.height = view.height;
  image.channels = 3;
  image.data.resize(static_cast<std::size_t>(view.width) * view.height * 3);
  return image;
}

Image decode_file(const std::filesystem::path& path, int jpeg_scale_denominator) {
  // Only a regular file is read: a FIFO must not block the caller, nor a device such as
  // /dev/zero be read without end. Its size is its own (not merely told): no further limit.
  const io::WholeFile file = io::read_whole_file(path, UINT64_MAX);
  using Status = io::WholeFile::Status;
  const auto failed = [&](const char* step) {
    return DecodeError(std::string(step) + path.string() + ": " + std::strerror(file.error));
  };
  switch (file.status) {
    case Status::read: break;
    case Status::cannot_open: throw failed("cannot open ");
    case Status::cannot_stat: throw failed("cannot stat ");
    case Status::cannot_read: throw failed("cannot read ");
    case Status::not_regular: throw DecodeError("cannot read " + path.string() + ": " + file.what);
    case Status::too_big:
    case Status::grew: throw DecodeError("cannot read " + path.string() + ": too large");
  }
  try {
    return decode(std::as_bytes(std::span(file.bytes)), jpeg_scale_denominator);
  } catch (const DecompressionBombError& e) {
    throw e.with_path(path.string());
  } catch (const DecodeError& e) {
    throw DecodeError(path.string() + ": " + e.what());
  }
}

std::vector<std::byte> encode_jpeg(const ImageView& image, int quality,
                                   ChromaSubsampling subsampling) {
  int format = TJPF_RGB;
  switch (image.channels) {
    case 1: format = TJPF_GRAY; break;
    case 3: format = TJPF_RGB; break;
    case 4: format = TJPF_CMYK; break;
    default:
      throw InvalidArgument("encode_jpeg: channels must be 1, 3 or 4, got " +
                            std::to_string(image.channels));
  }
  int tj_subsampling = TJSAMP_420;
  switch (subsampling) {
    case ChromaSubsampling::s444: tj_subsampling = TJSAMP_444; break;
    case ChromaSubsampling::s422: tj_subsampling = TJSAMP_422; break;
    case ChromaSubsampling::s420: tj_subsampling = TJSAMP_420; break;
    case ChromaSubsampling::gray: tj_subsampling = TJSAMP_GRAY; break;
  }
  if (image.channels == 1) tj_subsampling = TJSAMP_GRAY;
  tjhandle h = compressor();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(h, image.data, image.width, static_cast<int>(image.stride), image.height, format,
                  &jpeg, &size, tj_subsampling, quality, 0) != 0) {
    if (jpeg != nullptr) tjFree(jpeg);
    throw RuntimeError(std::string("encode_jpeg: ") + tjGetErrorStr2(h));
  }
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  return out;
}

}  // namespace coload::vision
