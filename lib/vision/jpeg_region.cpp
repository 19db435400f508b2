// Decoding part of a JPEG through libjpeg's API: the rows and columns a crop needs, no more.
//
// TurboJPEG 2.1 always decodes a whole image; a RandomResizedCrop keeps about half of it on
// average. libjpeg-turbo's jpeg_skip_scanlines/jpeg_crop_scanline skip the colour conversion,
// upsampling and most of the IDCT outside the region, and decoding stops after its last row.

#include "jpeg_region.hpp"
#include "jpeg_restart.hpp"
#include "restart_entropy.hpp"
#include "coload/core/warning.hpp"
#include "coload/vision/decode.hpp"

#include <csetjmp>
#include <cstddef>
#include <cstdio>
// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <jerror.h>

#include <algorithm>
#include <string>

namespace coload::vision::detail {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool truncated;
  bool warned;  // any warning: libjpeg repaired damaged data
  bool created;  // jpeg_create_decompress returned: libjpeg accepted our headers
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<ErrorManager*>(cinfo->err)->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  // As TurboJPEG and Pillow: damaged data is a warning and still decodes; running out of data
  // is the one warning treated as an error (decided by the caller's fallback).
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    reinterpret_cast<ErrorManager*>(cinfo->err)->truncated = true;
  }
  if (level < 0) reinterpret_cast<ErrorManager*>(cinfo->err)->warned = true;
}

// NOTE: kept free of C++ objects with destructors: longjmp leaves this frame.
bool decode_rows(jpeg_decompress_struct* cinfo, ErrorManager* err, const unsigned char* data,
                 unsigned long size, int top, int left, int height, int width, int denominator,
                 std::uint8_t* (*grow)(void*, std::size_t), void* buffer, JpegRegion* out,
                 const RestartSegments* segments, ScanCheckpoints* checkpoints) {
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  jpeg_create_decompress(cinfo);
  err->created = true;
  jpeg_mem_src(cinfo, data, size);
  jpeg_read_header(cinfo, TRUE);
  // A bomb is refused by the whole-image decode the caller falls back to, before it allocates.
  if (const std::int64_t limit = max_image_pixels();
      limit > 0 && std::int64_t{cinfo->image_width} * cinfo->image_height > limit) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK ||
      cinfo->progressive_mode) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  cinfo->out_color_space = JCS_RGB;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(denominator);
  jpeg_start_decompress(cinfo);
  if (segments) install_segment_decoder(cinfo, *segments, segment_state(), checkpoints);
  const int image_width = static_cast<int>(cinfo->output_width);
  const int image_height = static_cast<int>(cinfo->output_height);
  if (top < 0 || left < 0 || height <= 0 || width <= 0 || height > image_height - top ||
      width > image_width - left) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  // NOTE: a margin around the crop: fancy upsampling treats a partial row's ends as the image's
  // edges, so the crop's own pixels must lie inside the decoded region, not on its border.
  // Across, 2 pixels (what 2:1 fancy upsampling reads; jpeg_crop_scanline widens to whole
  // iMCUs besides); down, 16 (the rows jpeg_skip_scanlines leaves, libjpeg-turbo#915).
  // region_test checks every offset of every subsampling and scale.
  constexpr int margin = 16;
  constexpr int margin_x = 2;
  JDIMENSION x0 = static_cast<JDIMENSION>(std::max(0, left - margin_x));
  JDIMENSION w = static_cast<JDIMENSION>(std::min(image_width, left + width + margin_x)) - x0;
  if (static_cast<int>(w) < image_width) {
    jpeg_crop_scanline(cinfo, &x0, &w);
    if (segments) {
      // The MCU columns whose blocks libjpeg-turbo's coefficient controller turns into pixels
      // (jpeg_crop_scanline's first_iMCU_col to last_iMCU_col, from the same alignment): the
      // Huffman decoder may leave the others' blocks zero. region_test's crops at every column
      // offset of every subsampling and scale fail if these are too few.
#if JPEG_LIB_VERSION >= 70
      const int dct = cinfo->min_DCT_h_scaled_size;
#else
      const int dct = cinfo->min_DCT_scaled_size;
#endif
      const int align = cinfo->comps_in_scan == 1 && cinfo->num_components == 1
                            ? dct
                            : dct * cinfo->max_h_samp_factor;
      const int first = static_cast<int>(x0) / align;
      const int last = static_cast<int>((x0 + w + static_cast<JDIMENSION>(align) - 1) /
                                        static_cast<JDIMENSION>(align)) - 1;
      set_segment_columns(cinfo, first, last);
    }
  }
  if (segments) set_segment_rows(cinfo, top + height - 1);
  const int y0 = std::max(0, top - margin);
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  const int rows = top + height - y0;
  const std::size_t stride = static_cast<std::size_t>(cinfo->output_width) * 3;
  std::uint8_t* pixels = grow(buffer, stride * static_cast<std::size_t>(rows));
  for (int y = 0; y < rows;) {
    JSAMPROW row = pixels + stride * static_cast<std::size_t>(y);
    const JDIMENSION got = jpeg_read_scanlines(cinfo, &row, 1);
    if (got == 0 || err->truncated) {
      jpeg_destroy_decompress(cinfo);
      return false;
    }
    y += static_cast<int>(got);
  }
  jpeg_abort_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  out->pixels = pixels;
  out->x0 = static_cast<int>(x0);
  out->y0 = y0;
  out->width = static_cast<int>(stride / 3);
  out->height = rows;
  out->stride = static_cast<std::ptrdiff_t>(stride);
  return true;
}

std::uint8_t* grow_vector(void* v, std::size_t bytes) {
  auto& buffer = *static_cast<std::vector<std::uint8_t>*>(v);
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace

bool eoi_after(std::span<const std::byte> data, std::size_t from) {
  unsigned marker = 0;
  for (std::size_t at = next_marker(data, from, marker); at < data.size();
       at = next_marker(data, at + 2, marker)) {
    if (marker == 0xd9) return true;
  }
  return false;
}

std::optional<JpegRegion> decode_jpeg_region(std::span<const std::byte> data, int top, int left,
                                             int height, int width,
                                             std::vector<std::uint8_t>& buffer, int denominator) {
  check_jpeg_claims(data);
  const auto frame = parse_jpeg_frame(data);
  // A shard member with restart intervals: only those covering the crop are decoded.
  const RestartHint* hint = restart_hint_for(data);
  if (hint) {
    if (auto region = decode_hinted_region(*hint, top, left, height, width, buffer, denominator)) {
      return region;
    }
  }
  if (!hint && frame && frame->restart_interval != 0) {
    // Any other JPEG with restart markers (a folder's, a shard's without an index that says
    // so): telling costs a header parse (0.2 us a file here), finding the rows a scan of the
    // data (27 us for 85 KB, against 2.4 ms for its whole decode), and a crop then decodes
    // about 0.6x of the whole. A file whose markers do not fit decodes as before, silently:
    // the layout came from these same bytes, so only damage the plain decode also meets
    // can make them disagree.
    if (const auto layout = scan_restart_layout(data)) {
      try {
        if (auto region = decode_restart_region(data, *layout, top, left, height, width, buffer,
                                                denominator)) {
          return region;
        }
      } catch (const RestartMismatch&) {
      }
    }
  }
  // The whole scan through coload's Huffman decoder (restart_decode.cpp): a plain JPEG, and a
  // marked one whose crop needs every interval (or whose index did not fit it).
  if (frame) {
    if (auto region =
            decode_scan_region(data, *frame, top, left, height, width, buffer, denominator)) {
      return region;
    }
    // libjpeg reads a crop's data only as far as its last row: a file cut off below the crop
    // would decode without a word, where the whole image's decode (and Pillow's) says it is
    // truncated. Without the scan's EOI the whole image is decoded, and says so.
    if (!eoi_after(data, frame->entropy_at)) return std::nullopt;
  }
  return decode_jpeg_region_checked(data, top, left, height, width, buffer, denominator, nullptr);
}

std::optional<JpegRegion> decode_jpeg_region_checked(std::span<const std::byte> data, int top,
                                                     int left, int height, int width,
                                                     std::vector<std::uint8_t>& buffer,
                                                     int denominator, bool* warned,
                                                     const RestartSegments* segments,
                                                     ScanCheckpoints* checkpoints) {
  if (denominator != 1 && denominator != 2 && denominator != 4 && denominator != 8) {
    return std::nullopt;
  }
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  JpegRegion region;
  if (!decode_rows(&cinfo, &err, reinterpret_cast<const unsigned char*>(data.data()),
                   static_cast<unsigned long>(data.size()), top, left, height, width,
                   denominator, grow_vector, &buffer, &region, segments, checkpoints)) {
    if (warned) *warned = err.warned;
    // NOTE: jpeg_create_decompress fails when the jpeglib.h/jconfig.h coload was compiled
    // with are not those of the libjpeg it runs with (its version or struct size check; the
    // error codes themselves differ between such headers, so libjpeg's message says which),
    // or when memory runs out. With mismatched headers every region decode declines, and the
    // whole-image decode gives the same pixels more slowly: say so, once.
    if (!err.created) {
      char what[JMSG_LENGTH_MAX];
      err.pub.format_message(reinterpret_cast<j_common_ptr>(&cinfo), what);
      coload::detail::warn_once(
          "jpeg_region_create",
          std::string("libjpeg could not start a region decode (") + what +
              "), so crops are decoded from whole images: the same pixels, more slowly. A "
              "library version or struct size mismatch means coload was built against another "
              "libjpeg's jpeglib.h and jconfig.h than the libjpeg it loads");
    }
    return std::nullopt;
  }
  if (warned) *warned = err.warned;
  return region;
}

}  // namespace coload::vision::detail
