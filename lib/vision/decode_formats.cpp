// vision/decode_formats: WebP (libwebp's animation decoder, as Pillow uses it), TIFF (libtiff's
// RGBA interface, on the bytes in memory), and Netpbm and BMP read here, all to RGB as Pillow
// 9.4's `Image.open(f).convert('RGB')` gives it.
//
// Why Netpbm and BMP are read by hand: no Debian library reads them from memory with the size
// checked before allocating and Pillow's conversions (maxval rescaling with Python's round,
// 16-bit grayscale clamped rather than scaled, BMP's 5-bit channels by integer division, and
// its set of bitfield layouts). Both formats are a header and rows of samples.

#include "decode_formats.hpp"

#include <tiffio.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>

namespace coload::vision::detail {
namespace {

const unsigned char* bytes_of(std::span<const std::byte> data) noexcept {
  return reinterpret_cast<const unsigned char*>(data.data());
}

void grow(std::vector<std::uint8_t>& buffer, std::size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

ImageView rgb_view(std::vector<std::uint8_t>& out, int width, int height) {
  return ImageView{out.data(), width, height, 3, static_cast<std::ptrdiff_t>(width) * 3};
}

[[noreturn]] void fail(ImageFormat format, const std::string& what) {
  throw DecodeError(std::string("corrupt or truncated ") + format_name(format) + " data: " + what);
}

std::uint16_t le16(const unsigned char* p) noexcept {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t le32(const unsigned char* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) |
         (std::uint32_t{p[3]} << 24);
}

// ---- Netpbm (P1-P6) -------------------------------------------------------------------------

bool pnm_space(unsigned char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Pillow's header tokens: whitespace skipped, '#' to the end of its line dropped (even inside
// a token), at most 10 characters, ended by one whitespace character, which is consumed.
struct PnmHeader {
  char kind = 0;  // '1'..'6'
  int width = 0;
  int height = 0;
  int maxval = 1;
  std::size_t data = 0;  // offset of the first sample
};

PnmHeader read_pnm_header(std::span<const std::byte> bytes) {
  const unsigned char* p = bytes_of(bytes);
  const std::size_t n = bytes.size();
  if (n < 3 || p[0] != 'P' || p[1] < '1' || p[1] > '6' || !pnm_space(p[2])) {
    fail(ImageFormat::pnm, "not a P1-P6 header");
  }
  PnmHeader h;
  h.kind = static_cast<char>(p[1]);
  std::size_t pos = 3;
  auto token = [&](const char* name) {
    std::string t;
    while (t.size() <= 10) {
      if (pos >= n) break;
      const unsigned char c = p[pos++];
      if (pnm_space(c)) {
        if (t.empty()) continue;
        break;
      }
      if (c == '#') {
        while (pos < n && p[pos] != '\r' && p[pos] != '\n') ++pos;
        if (pos < n) ++pos;
        continue;
      }
      t.push_back(static_cast<char>(c));
    }
    if (t.empty()) fail(ImageFormat::pnm, std::string("the header ends before its ") + name);
    if (t.size() > 10) fail(ImageFormat::pnm, "token too long in the header: " + t);
    long v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') fail(ImageFormat::pnm, std::string("bad ") + name + " '" + t + "'");
      v = v * 10 + (c - '0');
    }
    if (v <= 0 || v > 0x7fffffff) fail(ImageFormat::pnm, std::string("bad ") + name + " '" + t + "'");
    return static_cast<int>(v);
  };
  h.width = token("width");
  h.height = token("height");
  if (h.kind != '1' && h.kind != '4') {
    h.maxval = token("maxval");
    if (h.maxval >= 65536) {
      fail(ImageFormat::pnm, "maxval must be greater than 0 and less than 65536, got " +
                                 std::to_string(h.maxval));
    }
  }
  h.data = pos;
  return h;
}

// Python's round(value / maxval * out_max): the quotient in double, ties to even.
std::uint32_t rescale(std::uint32_t value, int maxval, int out_max) noexcept {
  return static_cast<std::uint32_t>(
      std::nearbyint(static_cast<double>(value) / maxval * out_max));
}

// The samples of a plain (ASCII) P2/P3 body, '#' comments dropped, at most `count`.
template <typename Sink>
void plain_samples(const unsigned char* p, std::size_t n, std::size_t count, int maxval, Sink sink) {
  std::size_t got = 0;
  std::size_t pos = 0;
  while (got < count) {
    while (pos < n && (pnm_space(p[pos]) || p[pos] == '#')) {
      if (p[pos] == '#') {
        while (pos < n && p[pos] != '\r' && p[pos] != '\n') ++pos;
      } else {
        ++pos;
      }
    }
    if (pos >= n) break;
    std::uint64_t v = 0;
    std::size_t len = 0;
    while (pos < n && !pnm_space(p[pos]) && p[pos] != '#') {
      if (p[pos] < '0' || p[pos] > '9' || ++len > 10) {
        fail(ImageFormat::pnm, "bad sample at byte " + std::to_string(pos) + " of the body");
      }
      v = v * 10 + (p[pos++] - '0');
    }
    if (v > static_cast<std::uint64_t>(maxval)) {
      fail(ImageFormat::pnm, "sample " + std::to_string(v) + " exceeds maxval " + std::to_string(maxval));
    }
    sink(got++, static_cast<std::uint32_t>(v));
  }
  if (got < count) {
    fail(ImageFormat::pnm, std::to_string(got) + " of " + std::to_string(count) + " samples");
  }
}

ImageView decode_pnm(std::span<const std::byte> bytes, std::vector<std::uint8_t>& out) {
  const PnmHeader h = read_pnm_header(bytes);
  check_image_pixels(h.width, h.height);
  const std::size_t pixels = static_cast<std::size_t>(h.width) * h.height;
  const unsigned char* body = bytes_of(bytes) + h.data;
  const std::size_t n = bytes.size() - h.data;
  // The body's length is checked before the pixels are allocated: a 17-byte header must not
  // cost the 243 MB its 9000x9000 claims. Plain (text) samples take a byte each at least.
  const std::size_t samples = pixels * (h.kind == '3' || h.kind == '6' ? 3 : 1);
  if (h.kind == '4' && n < (static_cast<std::size_t>(h.width) + 7) / 8 * h.height) {
    fail(ImageFormat::pnm, "the body is shorter than its rows");
  }
  if ((h.kind == '5' || h.kind == '6') && n < samples * (h.maxval > 255 ? 2 : 1)) {
    fail(ImageFormat::pnm, "the body is shorter than its samples");
  }
  if ((h.kind == '1' || h.kind == '2' || h.kind == '3') && n < samples) {
    fail(ImageFormat::pnm, "the body's " + std::to_string(n) + " bytes cannot hold its " +
                               std::to_string(samples) + " samples");
  }
  grow(out, pixels * 3);
  std::uint8_t* rgb = out.data();

  if (h.kind == '1' || h.kind == '4') {  // bilevel: 1 is black
    if (h.kind == '4') {
      const std::size_t row = (static_cast<std::size_t>(h.width) + 7) / 8;
      for (int y = 0; y < h.height; ++y) {
        for (int x = 0; x < h.width; ++x) {
          const bool black = (body[y * row + x / 8] >> (7 - x % 8)) & 1;
          std::memset(rgb + 3 * (static_cast<std::size_t>(y) * h.width + x), black ? 0 : 255, 3);
        }
      }
    } else {
      std::size_t got = 0;
      for (std::size_t pos = 0; pos < n && got < pixels; ++pos) {
        const unsigned char c = body[pos];
        if (c == '#') {
          while (pos + 1 < n && body[pos + 1] != '\r' && body[pos + 1] != '\n') ++pos;
        } else if (c == '0' || c == '1') {
          std::memset(rgb + 3 * got++, c == '1' ? 0 : 255, 3);
        } else if (!pnm_space(c)) {
          fail(ImageFormat::pnm, "bad P1 sample at byte " + std::to_string(pos) + " of the body");
        }
      }
      if (got < pixels) fail(ImageFormat::pnm, std::to_string(got) + " of " + std::to_string(pixels) + " pixels");
    }
    return rgb_view(out, h.width, h.height);
  }

  const bool color = h.kind == '3' || h.kind == '6';
  const int channels = color ? 3 : 1;
  // Pillow: gray with maxval > 255 is mode "I" (0..65535), which convert('RGB') clamps to 255;
  // everything else is rescaled to 0..255 (exactly the samples where maxval is 255).
  const bool wide_gray = !color && h.maxval > 255;
  const int out_max = wide_gray ? 65535 : 255;
  const auto put = [&](std::size_t i, std::uint32_t v) {
    const std::uint32_t s = std::min<std::uint32_t>(rescale(v, h.maxval, out_max), out_max);
    const auto b = static_cast<std::uint8_t>(std::min<std::uint32_t>(s, 255));
    if (color) {
      rgb[i] = b;
    } else {
      rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = b;
    }
  };
  const std::size_t count = pixels * channels;
  if (h.kind == '2' || h.kind == '3') {
    plain_samples(body, n, count, h.maxval, put);
  } else {
    const std::size_t width = h.maxval > 255 ? 2 : 1;  // the body's length was checked above
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t v = width == 1 ? body[i] : (std::uint32_t{body[2 * i]} << 8) | body[2 * i + 1];
      put(i, v);
    }
  }
  return rgb_view(out, h.width, h.height);
}

// ---- BMP ------------------------------------------------------------------------------------

struct BmpHeader {
  std::int64_t width = 0;
  std::int64_t height = 0;
  int bits = 0;
  std::uint32_t compression = 0;  // 0 raw, 1 RLE8, 2 RLE4, 3 bitfields
  bool top_down = false;
  std::size_t palette = 0;  // offset of the palette
  int palette_entry = 4;    // bytes per palette entry (3 in the OS/2 core header)
  std::uint64_t colors = 0;
  std::size_t data = 0;     // offset of the pixels
  std::array<int, 3> rgb_byte{2, 1, 0};  // 24/32-bit: which byte of a pixel is R, G, B
  bool rgb565 = false;                   // 16-bit: 5-6-5 (else 5-5-5)
};

BmpHeader read_bmp_header(std::span<const std::byte> bytes) {
  const unsigned char* p = bytes_of(bytes);
  const std::size_t n = bytes.size();
  if (n < 18) fail(ImageFormat::bmp, "no room for the headers");
  BmpHeader h;
  std::uint64_t offset = le32(p + 10);
  const std::uint32_t header_size = le32(p + 14);
  if (header_size != 12 && header_size != 40 && header_size != 64 && header_size != 108 &&
      header_size != 124) {
    throw DecodeError("unsupported BMP header type (" + std::to_string(header_size) + ")");
  }
  if (n < 14 + std::size_t{header_size}) fail(ImageFormat::bmp, "the header is cut short");
  const unsigned char* d = p + 18;
  std::size_t after = 14 + header_size;
  std::array<std::uint32_t, 4> masks{};
  if (header_size == 12) {
    h.width = le16(d);
    h.height = le16(d + 2);
    h.bits = le16(d + 6);
    h.palette_entry = 3;
  } else {
    h.top_down = d[7] == 0xff;
    h.width = le32(d);
    h.height = h.top_down ? (std::int64_t{1} << 32) - le32(d + 4) : le32(d + 4);
    h.bits = le16(d + 10);
    h.compression = le32(d + 12);
    h.colors = le32(d + 28);
    if (h.compression == 3) {
      if (header_size >= 56) {
        for (int i = 0; i < 4; ++i) masks[i] = le32(d + 36 + 4 * i);
      } else {
        if (n < after + 12) fail(ImageFormat::bmp, "the bitfield masks are cut short");
        for (int i = 0; i < 3; ++i) masks[i] = le32(p + after + 4 * i);
        after += 12;
      }
    }
  }
  if (h.width <= 0 || h.height <= 0 || h.width > 0x7fffffff || h.height > 0x7fffffff) {
    fail(ImageFormat::bmp, "invalid size " + std::to_string(h.width) + "x" + std::to_string(h.height));
  }
  if (h.bits != 1 && h.bits != 4 && h.bits != 8 && h.bits != 16 && h.bits != 24 && h.bits != 32) {
    throw DecodeError("unsupported BMP pixel depth (" + std::to_string(h.bits) + ")");
  }
  if (h.colors == 0) h.colors = std::uint64_t{1} << h.bits;
  h.palette = after;
  // As Pillow does: a file whose pixel offset forgot the palette has the palette first.
  if (offset == 14 + header_size && h.bits <= 8) offset += 4 * h.colors;
  if (h.compression == 3) {
    using M = std::array<std::uint32_t, 4>;
    const auto same = [&](const M& m, bool alpha) {
      return masks[0] == m[0] && masks[1] == m[1] && masks[2] == m[2] && (!alpha || masks[3] == m[3]);
    };
    // Pillow's bitfield layouts, nothing else; where a pixel's bytes are R, G and B.
    if (h.bits == 32 && (same({0xff0000, 0xff00, 0xff, 0}, true) || same({0xff0000, 0xff00, 0xff, 0xff000000}, true) ||
                         same({0, 0, 0, 0}, true))) {
      h.rgb_byte = {2, 1, 0};
    } else if (h.bits == 32 && (same({0xff000000, 0xff0000, 0xff00, 0}, true) ||
                                same({0xff000000, 0xff0000, 0xff00, 0xff}, true))) {
      h.rgb_byte = {3, 2, 1};
    } else if (h.bits == 32 && same({0xff, 0xff00, 0xff0000, 0xff000000}, true)) {
      h.rgb_byte = {0, 1, 2};
    } else if (h.bits == 24 && same({0xff0000, 0xff00, 0xff, 0}, false)) {
      h.rgb_byte = {2, 1, 0};
    } else if (h.bits == 16 && (same({0xf800, 0x7e0, 0x1f, 0}, false) || same({0x7c00, 0x3e0, 0x1f, 0}, false))) {
      h.rgb565 = masks[0] == 0xf800;
    } else {
      throw DecodeError("unsupported BMP bitfields layout");
    }
  } else if ((h.compression == 1 && h.bits != 8) || (h.compression == 2 && h.bits != 4) ||
             h.compression > 3) {
    throw DecodeError("unsupported BMP compression (" + std::to_string(h.compression) + ") at " +
                      std::to_string(h.bits) + " bits per pixel");
  }
  if (h.bits <= 8 && h.colors > 65536) {
    throw DecodeError("unsupported BMP palette size (" + std::to_string(h.colors) + ")");
  }
  if (offset > n) fail(ImageFormat::bmp, "the pixel offset " + std::to_string(offset) + " is past the end");
  h.data = static_cast<std::size_t>(offset);
  return h;
}

// The palette as RGB triples for all 256 indices; indices past the file's palette read as
// gray i (Pillow's palette starts as a gray ramp).
std::array<std::uint8_t, 768> bmp_palette(const BmpHeader& h, std::span<const std::byte> bytes) {
  std::array<std::uint8_t, 768> rgb{};
  for (int i = 0; i < 256; ++i) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = static_cast<std::uint8_t>(i);
  const unsigned char* p = bytes_of(bytes);
  const std::uint64_t entries = std::min<std::uint64_t>(h.colors, 256);
  for (std::uint64_t i = 0; i < entries; ++i) {
    const std::size_t at = h.palette + i * h.palette_entry;
    if (at + 3 > bytes.size()) break;
    rgb[3 * i] = p[at + 2];
    rgb[3 * i + 1] = p[at + 1];
    rgb[3 * i + 2] = p[at];
  }
  return rgb;
}

// RLE8/RLE4 to one index per pixel, rows in file order, into `idx` (width × height entries, zeroed
// by the caller); Pillow's decoder's behaviour for runs past a row's end (cut) and its word
// alignment by file position. With `idx` null the stream is only measured, writing nothing: one
// that does not cover the image is refused before anything is allocated for the image.
void bmp_rle(const BmpHeader& h, std::span<const std::byte> bytes, std::uint8_t* idx) {
  const unsigned char* p = bytes_of(bytes);
  const std::size_t n = bytes.size();
  const auto w = static_cast<std::size_t>(h.width);
  const std::size_t total = w * static_cast<std::size_t>(h.height);
  std::size_t out = 0;
  std::size_t x = 0;
  std::size_t pos = h.data;
  const bool rle4 = h.compression == 2;
  while (out < total && pos + 2 <= n) {
    std::size_t count = p[pos];
    const unsigned char value = p[pos + 1];
    pos += 2;
    if (count != 0) {
      count = std::min(count, x < w ? w - x : 0);
      for (std::size_t i = 0; idx && i < count && out + i < total; ++i) {
        idx[out + i] = rle4 ? (i % 2 == 0 ? value >> 4 : value & 15) : value;
      }
      out = std::min(total, out + count);
      x += count;
    } else if (value == 0) {  // end of line
      out = std::min(total, (out + w - 1) / w * w);
      x = 0;
    } else if (value == 1) {  // end of bitmap
      break;
    } else if (value == 2) {  // delta: right, up (rows in file order)
      if (pos + 2 > n) break;
      out = std::min(total, out + p[pos] + std::size_t{p[pos + 1]} * w);
      x = out % w;
      pos += 2;
    } else {  // an absolute run of `value` pixels, padded to a word
      const std::size_t run_bytes = rle4 ? (value + 1) / 2 : value;
      if (pos + run_bytes > n) fail(ImageFormat::bmp, "an RLE run is cut short");
      for (std::size_t i = 0; idx && i < value && out + i < total; ++i) {
        idx[out + i] = rle4 ? (i % 2 == 0 ? p[pos + i / 2] >> 4 : p[pos + i / 2] & 15) : p[pos + i];
      }
      out = std::min(total, out + value);
      x += value;
      pos += run_bytes;
      if (pos % 2 != 0) ++pos;
    }
  }
  // An end of bitmap before the last pixel too: Pillow's "not enough image data".
  if (out < total) fail(ImageFormat::bmp, "the RLE data ends before the image does");
}

ImageView decode_bmp(std::span<const std::byte> bytes, std::vector<std::uint8_t>& out) {
  const BmpHeader h = read_bmp_header(bytes);
  check_image_pixels(h.width, h.height);
  const int width = static_cast<int>(h.width);
  const int height = static_cast<int>(h.height);
  const bool rle = h.compression == 1 || h.compression == 2;
  const std::size_t stride = ((static_cast<std::size_t>(width) * h.bits + 31) >> 3) & ~std::size_t{3};
  const std::size_t row_bytes = (static_cast<std::size_t>(width) * h.bits + 7) / 8;
  // Measured before the pixels are allocated; RLE data by a first pass that writes nothing (a
  // 58-byte header claiming 9459x9459 cost 358 MB before its missing data was noticed).
  if (!rle && bytes.size() - h.data < stride * (height - 1) + row_bytes) {
    fail(ImageFormat::bmp, "the pixel data is shorter than its " + std::to_string(height) + " rows");
  }
  if (rle) bmp_rle(h, bytes, nullptr);
  grow(out, static_cast<std::size_t>(width) * height * 3);
  const unsigned char* p = bytes_of(bytes);
  const auto dst_row = [&](int file_row) {
    const int y = h.top_down ? file_row : height - 1 - file_row;
    return out.data() + static_cast<std::size_t>(y) * width * 3;
  };
  if (rle) {
    const auto palette = bmp_palette(h, bytes);
    thread_local std::vector<std::uint8_t> idx;
    idx.assign(static_cast<std::size_t>(width) * height, 0);
    bmp_rle(h, bytes, idx.data());
    for (int r = 0; r < height; ++r) {
      std::uint8_t* dst = dst_row(r);
      const std::uint8_t* src = idx.data() + static_cast<std::size_t>(r) * width;
      for (int x = 0; x < width; ++x) std::memcpy(dst + 3 * x, &palette[3 * src[x]], 3);
    }
    return rgb_view(out, width, height);
  }
  const auto palette = h.bits <= 8 ? bmp_palette(h, bytes) : std::array<std::uint8_t, 768>{};
  for (int r = 0; r < height; ++r) {
    const unsigned char* src = p + h.data + stride * r;
    std::uint8_t* dst = dst_row(r);
    for (int x = 0; x < width; ++x, dst += 3) {
      switch (h.bits) {
        case 1: std::memcpy(dst, &palette[3 * ((src[x / 8] >> (7 - x % 8)) & 1)], 3); break;
        case 4: std::memcpy(dst, &palette[3 * ((src[x / 2] >> (x % 2 ? 0 : 4)) & 15)], 3); break;
        case 8: std::memcpy(dst, &palette[3 * src[x]], 3); break;
        case 16: {
          // Pillow's BGR;15 and BGR;16 unpackers: each field times 255, divided (truncating).
          const unsigned v = le16(src + 2 * x);
          if (h.rgb565) {
            dst[0] = static_cast<std::uint8_t>(((v >> 11) & 31) * 255 / 31);
            dst[1] = static_cast<std::uint8_t>(((v >> 5) & 63) * 255 / 63);
          } else {
            dst[0] = static_cast<std::uint8_t>(((v >> 10) & 31) * 255 / 31);
            dst[1] = static_cast<std::uint8_t>(((v >> 5) & 31) * 255 / 31);
          }
          dst[2] = static_cast<std::uint8_t>((v & 31) * 255 / 31);
          break;
        }
        default: {
          const unsigned char* px = src + static_cast<std::size_t>(x) * (h.bits / 8);
          dst[0] = px[h.rgb_byte[0]];
          dst[1] = px[h.rgb_byte[1]];
          dst[2] = px[h.rgb_byte[2]];
        }
      }
    }
  }
  return rgb_view(out, width, height);
}

// ---- WebP -----------------------------------------------------------------------------------

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* d) const noexcept { WebPAnimDecoderDelete(d); }
};

// The header's features (DecodeError where it has none that libwebp reads).
WebPBitstreamFeatures webp_features(std::span<const std::byte> bytes) {
  WebPBitstreamFeatures features{};
  const VP8StatusCode status =
      WebPGetFeatures(bytes_of(bytes), bytes.size(), &features);
  if (status != VP8_STATUS_OK || features.width <= 0 || features.height <= 0) {
    fail(ImageFormat::webp, "no readable header (libwebp status " + std::to_string(status) + ")");
  }
  return features;
}

ImageInfo peek_webp(std::span<const std::byte> bytes) {
  const WebPBitstreamFeatures features = webp_features(bytes);
  return {ImageFormat::webp, features.width, features.height};
}

// Pillow opens every WebP through libwebp's animation decoder in RGBA and takes the first
// frame's canvas: so a transparent pixel's colour is the canvas's (0, 0, 0), not the stored one.
ImageView decode_webp(std::span<const std::byte> bytes, std::vector<std::uint8_t>& out) {
  const WebPBitstreamFeatures features = webp_features(bytes);
  const ImageInfo info{ImageFormat::webp, features.width, features.height};
  check_image_pixels(info.width, info.height);
  if (!features.has_animation) {
    // A still image is the animation decoder's first frame, a key frame decoded straight onto
    // its canvas: the same pixels from WebPDecode, without the two zero-filled canvases (8
    // bytes a pixel the header claims, taken before a byte decodes: a 34-byte file claiming
    // 9000x9000 cost 309 MB). Into `out` where it is large enough; else into memory of this
    // call's, left uninitialised (its pages taken as rows decode), and `out` grown after.
    const std::size_t bytes_out = static_cast<std::size_t>(info.width) * info.height * 3;
    std::unique_ptr<std::uint8_t[]> fresh;
    std::uint8_t* rgb = out.data();
    if (out.size() < bytes_out) {
      fresh.reset(new std::uint8_t[bytes_out]);
      rgb = fresh.get();
    }
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config)) throw DecodeError("libwebp: version mismatch");
    config.output.colorspace = MODE_RGB;
    config.output.is_external_memory = 1;
    config.output.u.RGBA.rgba = rgb;
    config.output.u.RGBA.stride = info.width * 3;
    config.output.u.RGBA.size = bytes_out;
    const VP8StatusCode status = WebPDecode(bytes_of(bytes), bytes.size(), &config);
    WebPFreeDecBuffer(&config.output);  // external memory: frees nothing of ours
    if (status != VP8_STATUS_OK) {
      fail(ImageFormat::webp, "the image does not decode (libwebp status " +
                                  std::to_string(status) + ")");
    }
    if (fresh) {
      grow(out, bytes_out);
      std::memcpy(out.data(), fresh.get(), bytes_out);
    }
    return rgb_view(out, info.width, info.height);
  }
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) throw DecodeError("libwebp: version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  const WebPData data{bytes_of(bytes), bytes.size()};
  std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter> dec(WebPAnimDecoderNew(&data, &options));
  if (!dec) fail(ImageFormat::webp, "libwebp refused the container");
  WebPAnimInfo anim{};
  if (!WebPAnimDecoderGetInfo(dec.get(), &anim)) fail(ImageFormat::webp, "no canvas");
  std::uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp)) fail(ImageFormat::webp, "the first frame does not decode");
  const int width = static_cast<int>(anim.canvas_width);
  const int height = static_cast<int>(anim.canvas_height);
  const std::size_t pixels = static_cast<std::size_t>(width) * height;
  grow(out, pixels * 3);
  for (std::size_t i = 0; i < pixels; ++i) std::memcpy(out.data() + 3 * i, rgba + 4 * i, 3);
  return rgb_view(out, width, height);
}

// ---- TIFF -----------------------------------------------------------------------------------
// The first directory (Pillow's first frame), through libtiff's RGBA interface, which reads
// every photometric interpretation, compression, strip and tile layout libtiff supports.

// The bytes libtiff reads, and the first error it reports (its handlers are per handle, so
// threads do not share them).
struct TiffSource {
  std::span<const std::byte> bytes;
  std::uint64_t pos = 0;
  std::string error;
};

tmsize_t tiff_read(thandle_t h, void* buf, tmsize_t size) {
  auto* s = static_cast<TiffSource*>(h);
  if (size < 0 || s->pos >= s->bytes.size()) return 0;
  const auto n = static_cast<tmsize_t>(std::min<std::uint64_t>(size, s->bytes.size() - s->pos));
  std::memcpy(buf, s->bytes.data() + s->pos, static_cast<std::size_t>(n));
  s->pos += static_cast<std::uint64_t>(n);
  return n;
}
tmsize_t tiff_write(thandle_t, void*, tmsize_t) { return 0; }
toff_t tiff_seek(thandle_t h, toff_t off, int whence) {
  auto* s = static_cast<TiffSource*>(h);
  const std::uint64_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->bytes.size() : 0;
  s->pos = base + off;
  return s->pos;
}
int tiff_close(thandle_t) { return 0; }
toff_t tiff_size(thandle_t h) { return static_cast<TiffSource*>(h)->bytes.size(); }
int tiff_map(thandle_t h, void** base, toff_t* size) {
  auto* s = static_cast<TiffSource*>(h);
  *base = const_cast<std::byte*>(s->bytes.data());
  *size = s->bytes.size();
  return 1;
}
void tiff_unmap(thandle_t, void*, toff_t) {}

int tiff_error(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* s = static_cast<TiffSource*>(user);
  if (s->error.empty()) {
    char buf[512];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    s->error = (module ? std::string(module) + ": " : std::string()) + buf;
  }
  return 1;
}
int tiff_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffCloser {
  void operator()(TIFF* t) const noexcept { TIFFClose(t); }
};
struct TiffOptionsDeleter {
  void operator()(TIFFOpenOptions* o) const noexcept { TIFFOpenOptionsFree(o); }
};

// The most libtiff may allocate at once (0: no bound): what the pixel limit allows for a 16-bit
// RGBA image, at least 64 MiB (for its tables).
std::int64_t tiff_alloc_bound() noexcept {
  const std::int64_t limit = max_image_pixels();
  return limit > 0 ? std::max<std::int64_t>(limit * 8, 64 << 20) : 0;
}

// Opens the first directory of the TIFF in `source` (DecodeError with libtiff's message).
std::unique_ptr<TIFF, TiffCloser> open_tiff(TiffSource& source) {
  std::unique_ptr<TIFFOpenOptions, TiffOptionsDeleter> options(TIFFOpenOptionsAlloc());
  if (!options) throw std::bad_alloc();
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), tiff_error, &source);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), tiff_warning, &source);
  // No single allocation of libtiff's above tiff_alloc_bound(): a strip or tile that claims
  // more is refused.
  if (const std::int64_t bound = tiff_alloc_bound(); bound > 0) {
    TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(), static_cast<tmsize_t>(bound));
  }
  const auto open = [&](const char* mode) {
    source.pos = 0;
    std::unique_ptr<TIFF, TiffCloser> tif(TIFFClientOpenExt("memory", mode, &source, tiff_read,
                                                            tiff_write, tiff_seek, tiff_close,
                                                            tiff_size, tiff_map, tiff_unmap,
                                                            options.get()));
    if (!tif) fail(ImageFormat::tiff, source.error.empty() ? "libtiff cannot open it" : source.error);
    return tif;
  };
  // NOTE: strips unmapped ("rm"): there libtiff reads an uncompressed strip by its rows, as
  // Pillow does, where a mapped read holds it to its byte count (check_tiff_striles relies on
  // this). Tiles mapped ("r"): libtiff 4.5's unmapped read of an uncompressed tile refuses any
  // tile under 1024 bytes ("Invalid tile byte count"), so 16x16 RGB tiles did not decode.
  auto tif = open("rm");
  if (!TIFFIsTiled(tif.get())) return tif;
  tif.reset();
  return open("r");
}

// Width and height as stored (before the Orientation tag turns them).
std::pair<int, int> tiff_stored_size(TIFF* tif, const TiffSource& source) {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  if (!TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width) || !TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &height) ||
      width == 0 || height == 0 || width > 0x7fffffff || height > 0x7fffffff) {
    fail(ImageFormat::tiff, source.error.empty() ? "no valid image width and length" : source.error);
  }
  return {static_cast<int>(width), static_cast<int>(height)};
}

int tiff_orientation(TIFF* tif) {
  std::uint16_t orientation = ORIENTATION_TOPLEFT;
  TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &orientation);
  return orientation >= 1 && orientation <= 8 ? orientation : ORIENTATION_TOPLEFT;
}

struct RgbaImageEnd {
  void operator()(TIFFRGBAImage* img) const noexcept { TIFFRGBAImageEnd(img); }
};

// Pillow turns a TIFF as its Orientation tag says (TiffImagePlugin's load_end): 2 mirrors, 3
// rotates 180 degrees, 4 flips, 5 transposes, 6 and 8 rotate a quarter turn (clockwise,
// counter-clockwise), 7 transverses. Where output pixel (x, y) comes from in the stored image.
std::pair<int, int> oriented_source(int orientation, int x, int y, int sw, int sh) noexcept {
  switch (orientation) {
    case 2: return {sw - 1 - x, y};
    case 3: return {sw - 1 - x, sh - 1 - y};
    case 4: return {x, sh - 1 - y};
    case 5: return {y, x};
    case 6: return {y, sh - 1 - x};
    case 7: return {sw - 1 - y, sh - 1 - x};
    case 8: return {sw - 1 - y, x};
    default: return {x, y};
  }
}

// The most a strip or tile of `size` compressed bytes can decode to, for the codecs whose
// output per input byte is bounded (the largest value for the others): Deflate makes at most
// 1032 bytes of one (a 258-byte match in two 1-bit codes); PackBits 128 of two (a run's header
// and its byte); LZW codes are at least 9 bits, and the j-th code of a table's fill stands for
// at most j bytes (each entry is an earlier one and a byte), libtiff's table holding 5119
// entries at most (4096 and a margin for encoders late to widen their codes).
std::uint64_t tiff_most_decoded(std::uint16_t compression, std::uint64_t size) noexcept {
  constexpr std::uint64_t unbounded = std::numeric_limits<std::uint64_t>::max();
  if (size > (std::uint64_t{1} << 40)) return unbounded;  // no product below can wrap
  switch (compression) {
    case COMPRESSION_ADOBE_DEFLATE:
    case COMPRESSION_DEFLATE:
      return size * 1032 + 1024;
    case COMPRESSION_PACKBITS:
      return (size + 1) / 2 * 128;
    case COMPRESSION_LZW: {
      const std::uint64_t codes = size * 8 / 9 + 1;
      const std::uint64_t rising = std::min<std::uint64_t>(codes, 5120);
      return rising * (rising + 1) / 2 + (codes - rising) * 5120;
    }
    default:
      return unbounded;
  }
}

// Every strip or tile TIFFRGBAImageGet reads is checked to be in the file before the raster is
// allocated: libtiff notices a missing one only when it reads it (a 110-byte file claiming
// 9459x9459 cost 358 MB first). A compressed one is its byte count at its offset; an uncompressed
// strip is read whole from its offset whatever its byte count says (as Pillow reads it), so that
// much must be there (an uncompressed tile, read mapped, is held to its byte count as well). Old-style JPEG may find its data through JPEGInterchangeFormat instead.
void check_tiff_striles(TIFF* tif, std::size_t file_size) {
  std::uint16_t compression = COMPRESSION_NONE;
  TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &compression);
  if (compression == COMPRESSION_OJPEG) return;
  const bool tiled = TIFFIsTiled(tif) != 0;
  const std::uint32_t count = tiled ? TIFFNumberOfTiles(tif) : TIFFNumberOfStrips(tif);
  std::uint32_t length = 0;
  std::uint32_t rows_per_strip = 0;
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &length);
  TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &rows_per_strip);
  rows_per_strip = std::clamp<std::uint32_t>(rows_per_strip, 1, length);  // length < 2^31
  const std::uint32_t per_plane = (length + rows_per_strip - 1) / rows_per_strip;
  for (std::uint32_t i = 0; i < count; ++i) {
    int err = 0;
    const std::uint64_t offset = TIFFGetStrileOffsetWithErr(tif, i, &err);
    const std::uint64_t size = err ? 0 : TIFFGetStrileByteCountWithErr(tif, i, &err);
    std::uint64_t need = size;
    if (compression == COMPRESSION_NONE) {
      need = tiled ? TIFFTileSize64(tif)
                   : TIFFVStripSize64(tif, std::min(rows_per_strip,
                                                    length - i % per_plane * rows_per_strip));
    }
    const std::string which =
        (tiled ? "tile " : "strip ") + std::to_string(i) + " of " + std::to_string(count);
    // An uncompressed one is read by its rows whatever its byte count says (0 included).
    if (err || (size == 0 && compression != COMPRESSION_NONE)) {
      fail(ImageFormat::tiff, which + " has no data (its byte count is 0)");
    }
    if (offset > file_size || need > file_size - offset) {
      fail(ImageFormat::tiff, which + " (" + std::to_string(need) + " bytes at offset " +
                                  std::to_string(offset) + ") is not inside the file's " +
                                  std::to_string(file_size) + " bytes");
    }
    if (compression != COMPRESSION_NONE) {
      // libtiff allocates a strip's or tile's decoded size before decoding it: a byte of
      // Deflate data claiming a 9000x9000 strip cost 81 MB. Codecs whose output per input byte
      // is bounded are held to it, as the PNG decoder is.
      const std::uint64_t decoded =
          tiled ? TIFFTileSize64(tif)
                : TIFFVStripSize64(tif, std::min(rows_per_strip,
                                                 length - i % per_plane * rows_per_strip));
      if (const auto most = tiff_most_decoded(compression, size); decoded > most) {
        fail(ImageFormat::tiff, which + "'s " + std::to_string(size) + " bytes of compressed " +
                                    "data cannot hold its " + std::to_string(decoded) + " bytes");
      }
    }
  }
}

// Pillow opens a one-sample 16-bit TIFF as mode I;16 (unsigned, white-is-zero alike: it does
// not invert) or I (signed), and convert('RGB') clamps each sample to 0..255, as for a 16-bit
// grey PNG; libtiff's RGBA interface keeps the high byte (and inverts white-is-zero). Whether
// the file is one (then whether its samples are signed), else nothing.
std::optional<bool> tiff_gray16(TIFF* tif) {
  std::uint16_t bits = 0, samples = 0, photometric = 0, format = SAMPLEFORMAT_UINT;
  TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &bits);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &samples);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &format);
  if (bits != 16 || samples != 1 || !TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric) ||
      (photometric != PHOTOMETRIC_MINISBLACK && photometric != PHOTOMETRIC_MINISWHITE) ||
      (format != SAMPLEFORMAT_UINT && format != SAMPLEFORMAT_INT)) {
    return std::nullopt;
  }
  return format == SAMPLEFORMAT_INT;
}

// The stored rows of a one-sample 16-bit TIFF (tiff_gray16), clamped, as TIFFRGBAImageGet
// lays out its pixels (R, G, B, A from the low byte up).
void tiff_gray16_raster(TIFF* tif, const TiffSource& source, bool is_signed,
                        std::uint32_t* raster, int sw, int sh) {
  const auto put = [&](const std::uint16_t* samples, int y, int x0, int n) {
    std::uint32_t* dst = raster + static_cast<std::size_t>(y) * sw + x0;
    for (int i = 0; i < n; ++i) {
      const int v = is_signed ? static_cast<std::int16_t>(samples[i]) : samples[i];
      const auto g = static_cast<std::uint32_t>(std::clamp(v, 0, 255));
      dst[i] = g | g << 8 | g << 16 | 0xff000000u;
    }
  };
  const auto failed = [&](const std::string& which) {
    fail(ImageFormat::tiff, source.error.empty() ? which + " does not decode" : source.error);
  };
  if (TIFFIsTiled(tif)) {
    std::uint32_t tw = 0, th = 0;
    TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw);
    TIFFGetField(tif, TIFFTAG_TILELENGTH, &th);
    const tmsize_t size = TIFFTileSize(tif);
    if (tw == 0 || th == 0 || size != static_cast<tmsize_t>(std::uint64_t{tw} * th * 2)) {
      fail(ImageFormat::tiff, "no valid tile size");
    }
    // Held to what libtiff may allocate at once here (open_tiff): the tile's size is told.
    if (const std::int64_t bound = tiff_alloc_bound(); bound > 0 && size > bound) {
      fail(ImageFormat::tiff, "a tile of " + std::to_string(tw) + "x" + std::to_string(th) +
                                  " samples is larger than the pixel limit allows");
    }
    const std::unique_ptr<std::uint16_t[]> tile(new std::uint16_t[std::size_t{tw} * th]);
    for (std::uint32_t ty = 0; ty < static_cast<std::uint32_t>(sh); ty += th) {
      for (std::uint32_t tx = 0; tx < static_cast<std::uint32_t>(sw); tx += tw) {
        const std::uint32_t t = TIFFComputeTile(tif, tx, ty, 0, 0);
        if (TIFFReadEncodedTile(tif, t, tile.get(), size) != size) {
          failed("tile " + std::to_string(t));
        }
        const int n = static_cast<int>(std::min<std::uint32_t>(tw, sw - tx));
        for (std::uint32_t r = 0; r < th && ty + r < static_cast<std::uint32_t>(sh); ++r) {
          put(tile.get() + std::size_t{r} * tw, static_cast<int>(ty + r), static_cast<int>(tx), n);
        }
      }
    }
    return;
  }
  std::uint32_t rows_per_strip = 0;
  TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &rows_per_strip);
  rows_per_strip = std::clamp<std::uint32_t>(rows_per_strip, 1, static_cast<std::uint32_t>(sh));
  const std::unique_ptr<std::uint16_t[]> strip(
      new std::uint16_t[std::size_t{rows_per_strip} * static_cast<std::size_t>(sw)]);
  for (std::uint32_t y = 0, s = 0; y < static_cast<std::uint32_t>(sh); y += rows_per_strip, ++s) {
    const std::uint32_t rows = std::min<std::uint32_t>(rows_per_strip, sh - y);
    const auto size = static_cast<tmsize_t>(std::size_t{rows} * sw * 2);
    if (TIFFReadEncodedStrip(tif, s, strip.get(), size) != size) failed("strip " + std::to_string(s));
    for (std::uint32_t r = 0; r < rows; ++r) {
      put(strip.get() + std::size_t{r} * sw, static_cast<int>(y + r), 0, sw);
    }
  }
}

// The stored rows through libtiff's RGBA interface, which reads every photometric
// interpretation, compression, strip and tile layout libtiff supports.
void tiff_rgba_raster(TIFF* tif, const TiffSource& source, int orientation,
                      std::uint32_t* raster, int sw, int sh) {
  // Pillow's convert('RGB') drops alpha as stored, where libtiff's RGBA interface would
  // premultiply unassociated alpha into the colours: call every extra sample unspecified.
  std::uint16_t extra_count = 0;
  std::uint16_t* extra = nullptr;
  if (TIFFGetField(tif, TIFFTAG_EXTRASAMPLES, &extra_count, &extra) && extra_count > 0) {
    std::vector<std::uint16_t> unspecified(extra_count, EXTRASAMPLE_UNSPECIFIED);
    TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, extra_count, unspecified.data());
  }
  char message[1024] = {};
  if (!TIFFRGBAImageOK(tif, message)) throw DecodeError(std::string("unsupported TIFF: ") + message);
  TIFFRGBAImage img{};
  // Stop at the first strip or tile that does not read: with 0, libtiff goes on with the
  // previous one's pixels in its buffer and the decode succeeds (Pillow's decoder raises for a
  // compressed strip that fails; a file whose byte counts libtiff must estimate may now be
  // refused where Pillow's raw reader decodes it, where before it decoded with wrong rows).
  if (!TIFFRGBAImageBegin(&img, tif, 1, message)) {
    throw DecodeError(std::string("unsupported TIFF: ") + message);
  }
  const std::unique_ptr<TIFFRGBAImage, RgbaImageEnd> end(&img);
  img.req_orientation = static_cast<std::uint16_t>(orientation);
  if (!TIFFRGBAImageGet(&img, raster, static_cast<std::uint32_t>(sw), static_cast<std::uint32_t>(sh))) {
    fail(ImageFormat::tiff, source.error.empty() ? "the pixels do not decode" : source.error);
  }
}

ImageView decode_tiff(std::span<const std::byte> bytes, std::vector<std::uint8_t>& out) {
  TiffSource source{bytes, 0, {}};
  const auto tif = open_tiff(source);
  const auto [sw, sh] = tiff_stored_size(tif.get(), source);
  check_image_pixels(sw, sh);
  check_tiff_striles(tif.get(), bytes.size());
  // Asking for the file's own orientation makes libtiff flip nothing: rows come as stored,
  // and the turn is Pillow's, below.
  const int orientation = tiff_orientation(tif.get());
  // Left uninitialised, and this call's alone: its pages are taken as the strips and tiles
  // decode (a strip of a codec tiff_most_decoded cannot bound may claim any size up to the
  // pixel limit in a few bytes), and given back after. A zero-filled raster kept
  // per thread took the whole claimed size at once, and kept it: a 124-byte file claiming
  // 9000x9000 whose one Deflate strip does not decode held 324 MB.
  const std::size_t pixels = static_cast<std::size_t>(sw) * sh;
  const std::unique_ptr<std::uint32_t[]> raster(new std::uint32_t[pixels]);
  if (const auto gray = tiff_gray16(tif.get())) {
    tiff_gray16_raster(tif.get(), source, *gray, raster.get(), sw, sh);
  } else {
    tiff_rgba_raster(tif.get(), source, orientation, raster.get(), sw, sh);
  }
  const bool turned = orientation >= 5;
  const int width = turned ? sh : sw;
  const int height = turned ? sw : sh;
  grow(out, pixels * 3);
  std::uint8_t* dst = out.data();
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x, dst += 3) {
      const auto [sx, sy] = oriented_source(orientation, x, y, sw, sh);
      const std::uint32_t v = raster[static_cast<std::size_t>(sy) * sw + sx];
      dst[0] = static_cast<std::uint8_t>(TIFFGetR(v));
      dst[1] = static_cast<std::uint8_t>(TIFFGetG(v));
      dst[2] = static_cast<std::uint8_t>(TIFFGetB(v));
    }
  }
  return rgb_view(out, width, height);
}

}  // namespace

const char* format_name(ImageFormat format) noexcept {
  switch (format) {
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::png: return "PNG";
    case ImageFormat::webp: return "WebP";
    case ImageFormat::tiff: return "TIFF";
    case ImageFormat::pnm: return "Netpbm";
    case ImageFormat::bmp: return "BMP";
  }
  return "image";
}

std::optional<ImageFormat> sniff_other(std::span<const std::byte> data) noexcept {
  const unsigned char* p = bytes_of(data);
  const std::size_t n = data.size();
  if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) return ImageFormat::webp;
  if (n >= 4 && (std::memcmp(p, "II*\0", 4) == 0 || std::memcmp(p, "MM\0*", 4) == 0 ||
                 std::memcmp(p, "II+\0", 4) == 0 || std::memcmp(p, "MM\0+", 4) == 0)) {
    return ImageFormat::tiff;
  }
  if (n >= 3 && p[0] == 'P' && p[1] >= '1' && p[1] <= '6' && pnm_space(p[2])) return ImageFormat::pnm;
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') return ImageFormat::bmp;
  return std::nullopt;
}

ImageInfo peek_other(std::span<const std::byte> data, ImageFormat format) {
  switch (format) {
    case ImageFormat::webp: return peek_webp(data);
    case ImageFormat::tiff: {
      TiffSource source{data, 0, {}};
      const auto tif = open_tiff(source);
      const auto [w, h] = tiff_stored_size(tif.get(), source);
      if (tiff_orientation(tif.get()) >= 5) return {format, h, w};
      return {format, w, h};
    }
    case ImageFormat::pnm: {
      const PnmHeader h = read_pnm_header(data);
      return {format, h.width, h.height};
    }
    case ImageFormat::bmp: {
      const BmpHeader h = read_bmp_header(data);
      return {format, static_cast<int>(h.width), static_cast<int>(h.height)};
    }
    default: break;
  }
  throw DecodeError(std::string("not a WebP, TIFF, Netpbm or BMP image: ") + format_name(format));
}

ImageView decode_other(std::span<const std::byte> data, ImageFormat format,
                       std::vector<std::uint8_t>& out) {
  switch (format) {
    case ImageFormat::webp: return decode_webp(data, out);
    case ImageFormat::tiff: return decode_tiff(data, out);
    case ImageFormat::pnm: return decode_pnm(data, out);
    case ImageFormat::bmp: return decode_bmp(data, out);
    default: break;
  }
  throw DecodeError(std::string("not a WebP, TIFF, Netpbm or BMP image: ") + format_name(format));
}

}  // namespace coload::vision::detail
