// JPEG restart markers: reading a file's frame and restart layout from its markers, and the
// lossless transcode that adds markers (coload-shard --fast-crop).
//
// A restart marker resets the entropy decoder (the DC predictions and the bit buffer), so the
// bytes between two markers decode alone: with a marker every few MCUs, a crop's decode reads
// only the intervals that cover it (restart_decode.cpp) instead of every row above its bottom.

#include "jpeg_restart.hpp"

#include "coload/vision/decode.hpp"

#include <csetjmp>
#include <cstdio>
#include <cstring>
// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

namespace coload::vision::detail {
namespace {

unsigned at(std::span<const std::byte> b, std::size_t i) { return std::to_integer<unsigned>(b[i]); }
unsigned be16(std::span<const std::byte> b, std::size_t i) { return at(b, i) << 8 | at(b, i + 1); }

}  // namespace

std::optional<JpegFrame> parse_jpeg_frame(std::span<const std::byte> b) {
  if (b.size() < 4 || at(b, 0) != 0xff || at(b, 1) != 0xd8) return std::nullopt;
  JpegFrame f;
  bool have_sof = false;
  int hmax = 1, vmax = 1;
  std::size_t pos = 2;
  for (;;) {
    while (pos + 1 < b.size() && at(b, pos) == 0xff && at(b, pos + 1) == 0xff) ++pos;  // fill
    if (pos + 4 > b.size() || at(b, pos) != 0xff) return std::nullopt;
    const unsigned marker = at(b, pos + 1);
    if (marker == 0xd8 || marker == 0xd9 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {
      return std::nullopt;  // no standalone marker belongs before the first scan
    }
    const std::size_t length = be16(b, pos + 2);
    if (length < 2 || pos + 2 + length > b.size()) return std::nullopt;
    const std::size_t seg = pos + 4;
    const std::size_t seg_len = length - 2;
    const bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 &&
                     marker != 0xcc;
    if (sof) {
      if (have_sof || seg_len < 6) return std::nullopt;
      have_sof = true;
      f.sof_at = pos;
      f.height = static_cast<int>(be16(b, seg + 1));
      f.width = static_cast<int>(be16(b, seg + 3));
      f.components = static_cast<int>(at(b, seg + 5));
      if (f.components < 1 || seg_len < 6 + 3 * static_cast<std::size_t>(f.components)) {
        return std::nullopt;
      }
      for (int c = 0; c < f.components; ++c) {
        const unsigned hv = at(b, seg + 6 + 3 * static_cast<std::size_t>(c) + 1);
        const int h = static_cast<int>(hv >> 4), v = static_cast<int>(hv & 15);
        if (h < 1 || h > 4 || v < 1 || v > 4) return std::nullopt;
        hmax = std::max(hmax, h);
        vmax = std::max(vmax, v);
      }
      // Baseline and extended sequential Huffman; 8-bit only (libjpeg's 12-bit is another build).
      f.huffman_sequential = (marker == 0xc0 || marker == 0xc1) && at(b, seg) == 8;
    } else if (marker == 0xdd) {
      if (seg_len < 2) return std::nullopt;
      f.restart_interval = be16(b, seg);
    } else if (marker == 0xda) {
      if (!have_sof || seg_len < 1 || f.width == 0 || f.height == 0) return std::nullopt;
      // One scan holding every component: a scan of fewer is one of several.
      if (static_cast<int>(at(b, seg)) != f.components) f.huffman_sequential = false;
      f.entropy_at = pos + 2 + length;
      break;
    }
    pos += 2 + length;
  }
  // A one-component scan is not interleaved: its MCU is one 8x8 block, whatever its factors.
  f.mcu_width = f.components == 1 ? 8 : 8 * hmax;
  f.mcu_height = f.components == 1 ? 8 : 8 * vmax;
  f.mcus_per_row = (f.width + f.mcu_width - 1) / f.mcu_width;
  f.mcu_rows = (f.height + f.mcu_height - 1) / f.mcu_height;
  return f;
}

void check_jpeg_claims(std::span<const std::byte> b) {
  if (b.size() < 4 || at(b, 0) != 0xff || at(b, 1) != 0xd8) return;
  const auto* data = reinterpret_cast<const unsigned char*>(b.data());
  std::uint64_t width = 0, height = 0;
  int hmax = 1, vmax = 1;
  // Each component's sampling factors; libjpeg reads 10 components at most (MAX_COMPONENTS).
  std::array<std::pair<int, int>, 10> factors{};
  std::size_t components = 0;
  bool arithmetic = false;
  std::size_t pos = 2;
  for (;;) {
    // As libjpeg's next_marker: anything up to an 0xFF followed by a marker code is skipped
    // (with a warning), fill bytes too.
    while (pos + 1 < b.size() && !(data[pos] == 0xff && data[pos + 1] != 0xff &&
                                   data[pos + 1] != 0x00)) {
      const void* ff = std::memchr(data + pos + 1, 0xff, b.size() - pos - 1);
      if (!ff) return;
      pos = static_cast<std::size_t>(static_cast<const unsigned char*>(ff) - data);
    }
    if (pos + 1 >= b.size()) return;
    const unsigned marker = data[pos + 1];
    if (marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {  // TEM, RSTn: no length
      pos += 2;
      continue;
    }
    if (marker == 0xd8 || marker == 0xd9 || pos + 4 > b.size()) return;  // libjpeg stops too
    const std::size_t length = be16(b, pos + 2);
    if (length < 2) return;
    const std::size_t seg = pos + 4;
    const bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 &&
                     marker != 0xcc;
    if (sof) {
      if (components != 0 || length < 8 || seg + 6 > b.size()) return;
      height = be16(b, seg + 1);
      width = be16(b, seg + 3);
      const std::size_t count = at(b, seg + 5);
      if (count == 0 || count > factors.size() || length < 8 + 3 * count ||
          seg + 6 + 3 * count > b.size()) {
        return;
      }
      for (std::size_t c = 0; c < count; ++c) {
        const unsigned hv = at(b, seg + 6 + 3 * c + 1);
        const int h = static_cast<int>(hv >> 4), v = static_cast<int>(hv & 15);
        if (h < 1 || h > 4 || v < 1 || v > 4) return;
        factors[c] = {h, v};
        hmax = std::max(hmax, h);
        vmax = std::max(vmax, v);
      }
      components = count;
      arithmetic = marker >= 0xc9;
    } else if (marker == 0xda) {
      if (components == 0) return;
      pos += 2 + length;
      break;
    }
    pos += 2 + length;
  }
  check_image_pixels(static_cast<std::int64_t>(width), static_cast<std::int64_t>(height));
  if (arithmetic || pos > b.size()) return;
  // The component with the most blocks: each costs at least a bit.
  std::uint64_t blocks = 0;
  for (std::size_t c = 0; c < components; ++c) {
    const auto [h, v] = factors[c];
    const std::uint64_t w = (width * static_cast<std::uint64_t>(h) + hmax - 1) / hmax;
    const std::uint64_t r = (height * static_cast<std::uint64_t>(v) + vmax - 1) / vmax;
    blocks = std::max(blocks, (w + 7) / 8 * ((r + 7) / 8));
  }
  const std::uint64_t bytes = b.size() - pos;
  if (blocks > bytes * 8) {
    throw DecodeError("corrupt or truncated JPEG data: its " + std::to_string(bytes) +
                      " bytes of entropy-coded data cannot hold " + std::to_string(width) + "x" +
                      std::to_string(height) + " pixels (" + std::to_string(blocks) +
                      " blocks of 8x8, each at least one bit)");
  }
}

std::size_t next_marker(std::span<const std::byte> b, std::size_t pos, unsigned& marker) {
  const auto* data = reinterpret_cast<const unsigned char*>(b.data());
  while (pos + 1 < b.size()) {
    const void* ff = std::memchr(data + pos, 0xff, b.size() - 1 - pos);
    if (!ff) break;
    std::size_t i = static_cast<std::size_t>(static_cast<const unsigned char*>(ff) - data);
    while (i + 1 < b.size() && data[i + 1] == 0xff) ++i;
    if (i + 1 >= b.size()) break;
    if (data[i + 1] != 0x00) {
      marker = data[i + 1];
      return i;
    }
    pos = i + 2;
  }
  return b.size();
}

std::optional<shards::RestartIndex> scan_restart_layout(std::span<const std::byte> b) {
  const auto f = parse_jpeg_frame(b);
  if (!f || !f->huffman_sequential || f->restart_interval == 0 ||
      f->mcus_per_row % static_cast<int>(f->restart_interval) != 0 ||
      b.size() > std::numeric_limits<std::uint32_t>::max()) {
    return std::nullopt;
  }
  const auto per_row = static_cast<std::int64_t>(f->mcus_per_row / static_cast<int>(f->restart_interval));
  const std::int64_t total = per_row * f->mcu_rows;
  shards::RestartIndex layout;
  layout.interval = f->restart_interval;
  layout.rows.reserve(static_cast<std::size_t>(f->mcu_rows));
  std::size_t pos = f->entropy_at;
  layout.rows.push_back(static_cast<std::uint32_t>(pos));
  for (std::int64_t k = 1; k < total; ++k) {
    unsigned marker = 0;
    const std::size_t m = next_marker(b, pos, marker);
    if (m == b.size() || marker != 0xd0 + static_cast<unsigned>((k - 1) % 8)) return std::nullopt;
    pos = m + 2;
    if (k % per_row == 0) layout.rows.push_back(static_cast<std::uint32_t>(pos));
  }
  // After the last interval comes the end of the image, not another interval.
  unsigned marker = 0;
  if (next_marker(b, pos, marker) == b.size() || marker != 0xd9) return std::nullopt;
  return layout;
}

int restart_interval_for(int mcus_per_row, int target) {
  int best = 1;
  for (int n = 1; n <= std::min(mcus_per_row, std::max(target, 1)); ++n) {
    if (mcus_per_row % n == 0) best = n;
  }
  return best;
}

const char* to_string(RestartOutcome outcome) noexcept {
  switch (outcome) {
    case RestartOutcome::marked: return "marked";
    case RestartOutcome::progressive: return "progressive";
    case RestartOutcome::arithmetic: return "arithmetic-coded";
    case RestartOutcome::already_marked: return "already marked";
    case RestartOutcome::other: return "not a baseline YCbCr or grayscale JPEG";
    case RestartOutcome::not_jpeg: return "not a JPEG libjpeg reads without warnings";
  }
  return "?";
}

namespace {

// libjpeg's output into a vector the caller owns: jpeg_mem_dest's buffer is not reachable from
// outside after it grows, so an error midway could neither free nor keep it.
struct VectorDestination {
  jpeg_destination_mgr pub;
  std::vector<std::byte>* out;
  static constexpr std::size_t chunk = 64 << 10;

  static void init(j_compress_ptr cinfo) {
    auto* self = reinterpret_cast<VectorDestination*>(cinfo->dest);
    self->out->resize(chunk);
    self->pub.next_output_byte = reinterpret_cast<JOCTET*>(self->out->data());
    self->pub.free_in_buffer = chunk;
  }
  static boolean empty(j_compress_ptr cinfo) {
    // Called with the whole buffer full (free_in_buffer is stale here, by libjpeg's contract).
    auto* self = reinterpret_cast<VectorDestination*>(cinfo->dest);
    const std::size_t used = self->out->size();
    self->out->resize(used + chunk);
    self->pub.next_output_byte = reinterpret_cast<JOCTET*>(self->out->data() + used);
    self->pub.free_in_buffer = chunk;
    return TRUE;
  }
  static void term(j_compress_ptr cinfo) {
    auto* self = reinterpret_cast<VectorDestination*>(cinfo->dest);
    self->out->resize(self->out->size() - self->pub.free_in_buffer);
  }
};

struct TranscodeErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  int warnings;
};

[[noreturn]] void transcode_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<TranscodeErrors*>(cinfo->err)->jump, 1);
}

void transcode_message(j_common_ptr cinfo, int level) {
  // A warning means libjpeg repaired something (damaged data, a premature end): the file is
  // kept as it is rather than rewritten with the repair baked in.
  if (level < 0) ++reinterpret_cast<TranscodeErrors*>(cinfo->err)->warnings;
}

// NOTE: kept free of C++ objects with destructors: longjmp leaves this frame. On return the
// two structs are destroyed.
RestartOutcome transcode(jpeg_decompress_struct* src, jpeg_compress_struct* dst,
                         TranscodeErrors* err, const unsigned char* data, unsigned long size,
                         int target_mcus, int mcus_per_row, VectorDestination* dest) {
  if (setjmp(err->jump)) {
    jpeg_destroy_compress(dst);
    jpeg_destroy_decompress(src);
    return RestartOutcome::not_jpeg;
  }
  jpeg_create_decompress(src);
  jpeg_create_compress(dst);
  jpeg_mem_src(src, data, size);
  jpeg_save_markers(src, JPEG_COM, 0xffff);
  for (int m = 0; m < 16; ++m) jpeg_save_markers(src, JPEG_APP0 + m, 0xffff);
  jpeg_read_header(src, TRUE);
  RestartOutcome outcome = RestartOutcome::marked;
  if (src->progressive_mode) {
    outcome = RestartOutcome::progressive;
  } else if (src->arith_code) {
    outcome = RestartOutcome::arithmetic;
  } else if (src->restart_interval != 0) {
    outcome = RestartOutcome::already_marked;
  } else if (src->jpeg_color_space != JCS_YCbCr && src->jpeg_color_space != JCS_GRAYSCALE) {
    outcome = RestartOutcome::other;
  }
  if (outcome != RestartOutcome::marked) {
    jpeg_destroy_compress(dst);
    jpeg_destroy_decompress(src);
    return outcome;
  }
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(src);
  dst->dest = &dest->pub;
  jpeg_copy_critical_parameters(src, dst);
  // Optimised tables: lossless like the markers, and they pay for the markers' bytes.
  dst->optimize_coding = TRUE;
  dst->restart_in_rows = 0;
  dst->restart_interval =
      static_cast<unsigned int>(restart_interval_for(mcus_per_row, target_mcus));
  jpeg_write_coefficients(dst, coefficients);
  for (jpeg_saved_marker_ptr m = src->marker_list; m; m = m->next) {
    // libjpeg writes its own JFIF and Adobe markers from the copied parameters (jpegtran's
    // rule): a second copy would contradict them.
    if (dst->write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
        std::memcmp(m->data, "JFIF", 5) == 0) {
      continue;
    }
    if (dst->write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
        std::memcmp(m->data, "Adobe", 5) == 0) {
      continue;
    }
    jpeg_write_marker(dst, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(dst);
  jpeg_finish_decompress(src);
  jpeg_destroy_compress(dst);
  jpeg_destroy_decompress(src);
  return err->warnings > 0 ? RestartOutcome::not_jpeg : RestartOutcome::marked;
}

}  // namespace

RestartOutcome add_restart_markers(std::span<const std::byte> jpeg, int target_mcus,
                                   std::vector<std::byte>& out) {
  out.clear();
  const auto frame = parse_jpeg_frame(jpeg);
  if (!frame) return RestartOutcome::not_jpeg;
  if (frame->restart_interval != 0) return RestartOutcome::already_marked;
  jpeg_decompress_struct src{};
  jpeg_compress_struct dst{};
  TranscodeErrors err{};
  src.err = jpeg_std_error(&err.pub);
  dst.err = src.err;
  err.pub.error_exit = transcode_error;
  err.pub.emit_message = transcode_message;
  VectorDestination dest{};
  dest.pub.init_destination = VectorDestination::init;
  dest.pub.empty_output_buffer = VectorDestination::empty;
  dest.pub.term_destination = VectorDestination::term;
  dest.out = &out;
  const RestartOutcome outcome =
      transcode(&src, &dst, &err, reinterpret_cast<const unsigned char*>(jpeg.data()),
                static_cast<unsigned long>(jpeg.size()), target_mcus, frame->mcus_per_row, &dest);
  if (outcome != RestartOutcome::marked) out.clear();
  return outcome;
}

}  // namespace coload::vision::detail
