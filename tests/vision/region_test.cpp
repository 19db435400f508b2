// The region decoder (lib/vision/jpeg_region.cpp) against the whole-image decode, pixel for
// pixel, at every crop offset that the MCU grid and libjpeg's skipping make distinct.

#include <doctest/doctest.h>
#include <turbojpeg.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>  // jpeglib.h uses FILE and size_t without declaring them
#include <jpeglib.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "coload/vision/decode.hpp"
#include "image_test_support.hpp"
#include "coload/core/warning.hpp"
#include "vision/fused.hpp"
#include "vision/jpeg_region.hpp"
#include "vision/jpeg_restart.hpp"
#include "vision/resample.hpp"
#include "vision/restart_entropy.hpp"

namespace coload {
namespace {

struct Subsampling {
  const char* name;
  int tj;          // TurboJPEG's TJSAMP_*
  int mcu_width;   // pixels of an MCU at full size
  int mcu_height;  // and of an iMCU row
};

// Every subsampling TurboJPEG writes, 4:4:0 (vertical only) and 4:1:1 (chroma samples 4 pixels
// wide) included: encode_jpeg has neither, so the test encodes through TurboJPEG itself.
constexpr Subsampling subsamplings[] = {
    {"4:4:4", TJSAMP_444, 8, 8},   {"4:2:2", TJSAMP_422, 16, 8}, {"4:2:0", TJSAMP_420, 16, 16},
    {"4:4:0", TJSAMP_440, 8, 16},  {"4:1:1", TJSAMP_411, 32, 8}, {"gray", TJSAMP_GRAY, 8, 8},
};

std::vector<std::byte> encode(const vision::Image& image, int tj_subsampling) {
  return vision::test::turbo_jpeg(image, tj_subsampling);
}

// The reference: the whole image decoded by libjpeg alone (TurboJPEG), coload's Huffman decoder
// off, which decode_into otherwise uses for plain JPEGs too.
vision::ImageView libjpeg_decode(std::span<const std::byte> jpeg, std::vector<std::uint8_t>& whole,
                                 int denominator) {
  const vision::detail::ScopedScanDecoder libjpeg_only(false);
  return vision::decode_into(jpeg, whole, denominator);
}

// decode_into of `jpeg` at 1/d, as it runs (through coload's Huffman decoder: counted), equals
// `want`, libjpeg's decode of it, byte for byte.
void check_decode_into(std::span<const std::byte> jpeg, int d, const vision::ImageView& want) {
  std::vector<std::uint8_t> mine;
  const std::uint64_t before = vision::detail::scan_region_decodes();
  const vision::ImageView got = vision::decode_into(jpeg, mine, d);
  CHECK(vision::detail::scan_region_decodes() == before + 1);
  REQUIRE(got.width == want.width);
  REQUIRE(got.height == want.height);
  REQUIRE(got.stride == want.stride);
  CHECK(std::memcmp(got.data, want.data,
                    static_cast<std::size_t>(want.stride) * static_cast<std::size_t>(want.height)) ==
        0);
}

struct Mismatch {
  int crops = 0;      // crops decoded
  int declined = 0;   // crops the region decoder declined
  int differing = 0;  // crops with any pixel unlike the whole decode's
  std::string first;  // the first of those, for the failure message
};

// Decodes the crop at (top, left) of height × width through the region decoder and compares
// it with the same pixels of `full` (the whole image at the same scale).
// With `layout`, through the restart intervals (decode_restart_region) rather than the file.
void compare(std::span<const std::byte> jpeg, const vision::ImageView& full, int top, int left,
             int height, int width, int denominator, std::vector<std::uint8_t>& buffer,
             Mismatch& m, const shards::RestartIndex* layout = nullptr) {
  ++m.crops;
  const auto region =
      layout ? vision::detail::decode_restart_region(jpeg, *layout, top, left, height, width,
                                                     buffer, denominator)
             : vision::detail::decode_jpeg_region(jpeg, top, left, height, width, buffer,
                                                  denominator);
  const std::string where = "crop " + std::to_string(height) + "x" + std::to_string(width) +
                            " at (" + std::to_string(top) + ", " + std::to_string(left) +
                            ") at 1/" + std::to_string(denominator);
  if (!region || region->x0 > left || region->y0 > top ||
      region->x0 + region->width < left + width || region->y0 + region->height < top + height) {
    if (m.declined++ == 0 && m.first.empty()) m.first = "declined or short: " + where;
    return;
  }
  for (int y = top; y < top + height; ++y) {
    const std::uint8_t* got =
        region->pixels + (y - region->y0) * region->stride + (left - region->x0) * 3;
    const std::uint8_t* want = full.data + y * full.stride + left * 3;
    if (std::memcmp(got, want, static_cast<std::size_t>(width) * 3) != 0) {
      if (m.differing++ == 0 && m.first.empty()) {
        m.first = "row " + std::to_string(y) + " differs: " + where;
      }
      return;
    }
  }
}

}  // namespace

TEST_SUITE("vision") {

TEST_CASE("the region decoder equals the whole decode for crops at every row offset of an iMCU "
          "and every column offset of an MCU, for each subsampling and DCT scale "
          "(libjpeg-turbo#915)") {
  // libjpeg-turbo#915: jpeg_skip_scanlines to a row that is not on an iMCU row boundary left
  // stale rows of context in the upsampler. The region decoder skips to 16 rows above the crop,
  // so a crop's top at every offset from 16 to 16 + two iMCU rows puts the skip at every offset
  // within an iMCU (and, at a DCT scale, every offset of the scaled iMCU); likewise columns
  // for jpeg_crop_scanline. Two crop shapes each: a small one, and one reaching the image's
  // bottom-right corner. 131 × 97 is a whole number of MCUs in neither direction.
  const vision::Image src = vision::test::synthetic_image(131, 97, 5);
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    const std::vector<std::byte> jpeg = encode(src, sub.tj);
    for (const int d : {1, 2, 4, 8}) {
      CAPTURE(d);
      std::vector<std::uint8_t> whole;
      const vision::ImageView full = libjpeg_decode(jpeg, whole, d);
      REQUIRE(full.width == (131 + d - 1) / d);
      REQUIRE(full.height == (97 + d - 1) / d);
      // The whole image through decode_into: coload's Huffman decoder, libjpeg's pixels.
      check_decode_into(jpeg, d, full);
      const int row_span = std::min(full.height, 16 + 2 * std::max(1, sub.mcu_height / d));
      const int col_span = std::min(full.width, 16 + 2 * std::max(1, sub.mcu_width / d));
      std::vector<std::uint8_t> buffer;
      Mismatch m;
      const std::uint64_t through_scan = vision::detail::scan_region_decodes();
      for (int top = 0; top < row_span; ++top) {
        for (int left = 0; left < col_span; ++left) {
          compare(jpeg, full, top, left, std::min(5, full.height - top),
                  std::min(7, full.width - left), d, buffer, m);
          compare(jpeg, full, top, left, full.height - top, full.width - left, d, buffer, m);
        }
      }
      // And crops ending on the last rows and columns from every offset.
      for (int k = 1; k <= std::min(full.height, 2 * sub.mcu_height); ++k) {
        compare(jpeg, full, full.height - k, 0, k, full.width, d, buffer, m);
      }
      for (int k = 1; k <= std::min(full.width, 2 * sub.mcu_width); ++k) {
        compare(jpeg, full, 0, full.width - k, full.height, k, d, buffer, m);
      }
      INFO(m.first);
      CHECK(m.crops == 2 * row_span * col_span + std::min(full.height, 2 * sub.mcu_height) +
                           std::min(full.width, 2 * sub.mcu_width));
      CHECK(m.declined == 0);
      CHECK(m.differing == 0);
      // Every crop's scan went through coload's Huffman decoder, not libjpeg's.
      CHECK(vision::detail::scan_region_decodes() - through_scan ==
            static_cast<std::uint64_t>(m.crops));
    }
  }
}

namespace {

std::vector<std::byte> turbo_jpeg_optimized(const vision::Image& image, int tj_subsampling) {
  ::setenv("TJ_OPTIMIZE", "1", 1);
  std::vector<std::byte> jpeg;
  try {
    jpeg = encode(image, tj_subsampling);
  } catch (...) {
    ::unsetenv("TJ_OPTIMIZE");
    throw;
  }
  ::unsetenv("TJ_OPTIMIZE");
  return jpeg;
}

// The same pixels of both, or the first row that differs.
std::string first_difference(const vision::detail::JpegRegion& region,
                             const vision::ImageView& full, int top, int left, int height,
                             int width) {
  for (int y = top; y < top + height; ++y) {
    const std::uint8_t* got =
        region.pixels + (y - region.y0) * region.stride + (left - region.x0) * 3;
    if (std::memcmp(got, full.data + y * full.stride + left * 3,
                    static_cast<std::size_t>(width) * 3) != 0) {
      return "row " + std::to_string(y) + " differs";
    }
  }
  return {};
}

// Flips one bit in each of `count` bytes of `bytes` in [from, from + span), drawn from a
// linear congruential stream: never an FF or the 00 stuffed after one, and never making an FF,
// so the markers stay where they were and the damage stays inside the entropy-coded data.
struct Damage {
  std::uint32_t state;

  std::uint32_t next() {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  }
  void apply(std::vector<std::byte>& bytes, std::size_t from, std::size_t span, int count) {
    for (int k = 0; k < count; ++k) {
      const std::size_t at = from + next() % span;
      if (bytes[at] == std::byte{0xff} || bytes[at - 1] == std::byte{0xff}) continue;
      const auto flipped =
          static_cast<std::byte>(std::to_integer<unsigned>(bytes[at]) ^ (1u << (next() % 8)));
      if (flipped != std::byte{0xff}) bytes[at] = flipped;
    }
  }
};

// The checkpoints' budget as a case found it, set again when the case ends.
struct BudgetRestored {
  std::size_t budget = vision::jpeg_checkpoint_budget();
  ~BudgetRestored() { vision::set_jpeg_checkpoint_budget(budget); }
};

}  // namespace

TEST_CASE("a crop of a plain JPEG decoded again starts from the checkpoints its first decode "
          "left: fewer MCUs through the Huffman decoder, the same pixels, within the budget") {
  const BudgetRestored restore;
  const std::size_t budget = restore.budget;
  REQUIRE(budget > 0);  // on by default
  // 320 x 240: 20 x 15 MCUs at 4:2:0, 40 x 30 at 4:4:4; the crop in the lower right. At 1/2
  // (an eighth of the MCUs' pixels each way at 1/8 would leave too few MCUs to tell apart).
  const vision::Image src = vision::test::synthetic_image(320, 240, 11);
  for (const Subsampling& sub : {subsamplings[2], subsamplings[0], subsamplings[5]}) {
    for (const int d : {1, 2}) {
      const std::string subsampling = sub.name;
      CAPTURE(subsampling);
      CAPTURE(d);
      std::vector<std::byte> jpeg = encode(src, sub.tj);
      std::vector<std::uint8_t> whole, buffer;
      const vision::ImageView full = libjpeg_decode(jpeg, whole, d);
      const auto mcus_of = [&](const std::vector<std::byte>& file, int top, int left, int h,
                               int w) {
        const std::uint64_t before = vision::detail::huffman_mcus_decoded();
        const std::uint64_t scans = vision::detail::scan_region_decodes();
        const auto region = vision::detail::decode_jpeg_region(file, top / d, left / d, h / d,
                                                               w / d, buffer, d);
        REQUIRE(region.has_value());
        REQUIRE(vision::detail::scan_region_decodes() == scans + 1);  // coload's decoder's
        CHECK(first_difference(*region, full, top / d, left / d, h / d, w / d) == "");
        return vision::detail::huffman_mcus_decoded() - before;
      };
      vision::set_jpeg_checkpoint_budget(0);
      const std::uint64_t off = mcus_of(jpeg, 150, 200, 60, 100);
      CHECK(mcus_of(jpeg, 150, 200, 60, 100) == off);  // nothing kept with a budget of 0
      CHECK(vision::jpeg_checkpoint_bytes() == 0);
      vision::set_jpeg_checkpoint_budget(budget);
      const std::uint64_t first = mcus_of(jpeg, 150, 200, 60, 100);
      const std::uint64_t again = mcus_of(jpeg, 150, 200, 60, 100);
      // The first decode skips only the MCUs right of the crop in its last rows; the second
      // starts a few rows above the crop, at most a quarter row left of it.
      CHECK(first <= off);
      CHECK(off * 9 / 10 <= first);
      CHECK(again * 2 < first);
      // Another crop further down and left: rows past the first crop's are reached from the
      // last point it left, and every pixel is still libjpeg's.
      mcus_of(jpeg, 200, 10, 40, 90);
      CHECK(mcus_of(jpeg, 200, 10, 40, 90) * 2 < off);
      for (int top = 0; top < 240; top += 37) {
        for (int left = 0; left < 320; left += 53) {
          mcus_of(jpeg, top, left, std::min(45, 240 - top), std::min(70, 320 - left));
        }
      }
      // The same file with one byte of its JFIF header changed (its pixel density) is another
      // file: its scan is decoded from the start, none of the first file's points used.
      REQUIRE(jpeg[2] == std::byte{0xff});
      REQUIRE(jpeg[3] == std::byte{0xe0});
      jpeg[15] = static_cast<std::byte>(std::to_integer<unsigned>(jpeg[15]) ^ 1u);
      CHECK(mcus_of(jpeg, 150, 200, 60, 100) == first);
      CHECK(mcus_of(jpeg, 150, 200, 60, 100) == again);
    }
  }
  // The budget bounds what is kept: the oldest files go first.
  CHECK(vision::jpeg_checkpoint_bytes() > 0);
  CHECK(vision::jpeg_checkpoint_bytes() <= budget);
  vision::set_jpeg_checkpoint_budget(1000);
  CHECK(vision::jpeg_checkpoint_bytes() <= 1000);
  vision::set_jpeg_checkpoint_budget(0);
  CHECK(vision::jpeg_checkpoint_bytes() == 0);
}

TEST_CASE(
    "rows decoded two at a time from their own checkpoints give libjpeg's pixels at every "
    "subsampling and scale, and decode exactly the MCUs that one row at a time does") {
  const BudgetRestored restore;
  REQUIRE(restore.budget > 0);
  struct PairsRestored {
    ~PairsRestored() { vision::detail::set_paired_rows(true); }
  } pairs_restored;
  // Odd sizes: partial MCUs at the right and bottom edges.
  const vision::Image src = vision::test::synthetic_image(331, 263, 5);
  std::vector<std::uint8_t> whole, buffer;
  for (const Subsampling& sub : subsamplings) {
    for (const int d : {1, 2, 4, 8}) {
      const std::string subsampling = sub.name;
      CAPTURE(subsampling);
      CAPTURE(d);
      const std::vector<std::byte> jpeg = encode(src, sub.tj);
      const vision::ImageView full = libjpeg_decode(jpeg, whole, d);
      const int mcu_rows_high = sub.mcu_height / d;  // output rows of an MCU row
      // The first decode of the whole image finds no points: one row at a time, every point
      // recorded.
      vision::set_jpeg_checkpoint_budget(0);
      vision::set_jpeg_checkpoint_budget(restore.budget);
      std::uint64_t paired = vision::detail::huffman_mcus_paired();
      Mismatch m;
      compare(jpeg, full, 0, 0, full.height, full.width, d, buffer, m);
      CHECK(vision::detail::huffman_mcus_paired() == paired);
      std::uint64_t paired_total = 0;
      int tall = 0;  // crops of four MCU rows or more
      for (int top = 0; top < full.height; top += 1 + full.height / 9) {
        for (int left = 0; left < full.width; left += 1 + full.width / 7) {
          for (const int h : {1, 3 * mcu_rows_high + 1, full.height / 2 + 5}) {
            const int height = std::min(h, full.height - top);
            // From the first column, the whole width: no column left out, each pair's second
            // row starting where its first ends.
            const int width =
                left == 0 ? full.width : std::min(full.width / 3 + 7, full.width - left);
            CAPTURE(top);
            CAPTURE(left);
            CAPTURE(height);
            // Decoded once first: the points the crop reaches are known to both decodes after.
            vision::detail::set_paired_rows(false);
            compare(jpeg, full, top, left, height, width, d, buffer, m);
            std::uint64_t mcus[2];
            for (const bool pairs : {false, true}) {
              vision::detail::set_paired_rows(pairs);
              const std::uint64_t before = vision::detail::huffman_mcus_decoded();
              const std::uint64_t scans = vision::detail::scan_region_decodes();
              paired = vision::detail::huffman_mcus_paired();
              compare(jpeg, full, top, left, height, width, d, buffer, m);
              // Through coload's decoder to the end: a failure would have fallen back to
              // libjpeg's, with the same pixels.
              CHECK(vision::detail::scan_region_decodes() == scans + 1);
              mcus[pairs] = vision::detail::huffman_mcus_decoded() - before;
              CHECK(mcus[pairs] > 0);
              const std::uint64_t now_paired = vision::detail::huffman_mcus_paired() - paired;
              if (!pairs) CHECK(now_paired == 0);
              paired_total += now_paired;
              if (pairs && height >= 4 * mcu_rows_high) {
                ++tall;
                CHECK(now_paired > 0);
              }
            }
            // The same points reach the same MCUs; a pair started on a row libjpeg then never
            // asked for would decode more.
            CHECK(mcus[1] == mcus[0]);
          }
        }
      }
      CHECK(m.declined == 0);
      CHECK(m.differing == 0);
      CHECK(m.first == "");
      CHECK(tall > 0);
      CHECK(paired_total > 0);
    }
  }
}

TEST_CASE("JPEG checkpoints shared by threads: crops of the same files decoded on three threads "
          "while a fourth changes the budget keep libjpeg's pixels; children forked mid-decode "
          "decode from the table; a budget of 0 empties it, and the default keeps points again") {
  const BudgetRestored restore;
  const std::size_t budget = restore.budget;
  REQUIRE(budget > 0);
  struct File {
    std::vector<std::byte> jpeg;
    std::vector<std::uint8_t> whole;
    vision::ImageView full;
  };
  // Six files (three subsamplings, two images), each decoded whole by libjpeg first.
  std::vector<File> files(6);
  for (std::size_t i = 0; i < files.size(); ++i) {
    files[i].jpeg = encode(vision::test::synthetic_image(160 + 16 * static_cast<int>(i), 128,
                                                         static_cast<std::uint32_t>(30 + i)),
                           subsamplings[std::array{2, 0, 5}[i % 3]].tj);
    files[i].full = libjpeg_decode(files[i].jpeg, files[i].whole, 1);
  }
  // A crop of file `f` somewhere `r` says, compared with libjpeg's: "" when the same.
  const auto crop = [&](std::size_t f, std::uint32_t r, std::vector<std::uint8_t>& buffer) {
    const vision::ImageView& full = files[f].full;
    const int top = static_cast<int>(r % 97) * (full.height - 24) / 96;
    const int left = static_cast<int>(r / 97 % 89) * (full.width - 32) / 88;
    const auto region = vision::detail::decode_jpeg_region(files[f].jpeg, top, left, 24, 32, buffer);
    if (!region) return std::string("declined");
    return first_difference(*region, full, top, left, 24, 32);
  };
  // Assertions stay on this thread: each decoder keeps its count and its first difference.
  constexpr int decoders = 3, rounds = 150;
  struct Result {
    int done = 0;
    std::string first_bad;
  };
  std::array<Result, decoders> results;
  std::atomic<int> decoded{0};
  std::atomic<bool> decoding{true};
  std::vector<std::thread> threads;
  // Joined however the case ends (a failed REQUIRE below would otherwise leave them joinable).
  struct Joined {
    std::vector<std::thread>& threads;
    std::atomic<bool>& decoding;
    ~Joined() {
      decoding.store(false);
      for (std::thread& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  } joined{threads, decoding};
  for (int t = 0; t < decoders; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uint8_t> buffer;
      std::uint32_t r = 12345u * static_cast<std::uint32_t>(t + 1);
      for (int i = 0; i < rounds; ++i) {
        r = r * 1664525u + 1013904223u;
        const std::string bad = crop(static_cast<std::size_t>(i + t) % files.size(), r >> 8, buffer);
        if (!bad.empty() && results[t].first_bad.empty()) {
          results[t].first_bad = "round " + std::to_string(i) + ": " + bad;
        }
        ++results[t].done;
        decoded.fetch_add(1);
      }
    });
  }
  int budget_changes = 0;
  threads.emplace_back([&] {
    // Off, a budget a file or two fits, the default: evictions under the stores.
    const std::size_t sizes[] = {0, 3000, budget};
    while (decoding.load()) vision::set_jpeg_checkpoint_budget(sizes[budget_changes++ % 3]);
  });
  // Children forked while the decoders store and load: each decodes a crop from the table it
  // was forked with. The table's lock is taken around fork(), so none starts with it held (the
  // test cannot force the moment; it would hang, and alarm() ends such a child).
  std::vector<int> statuses;
  for (int k = 1; k <= 4; ++k) {
    while (decoded.load() < k * decoders * rounds / 5) std::this_thread::yield();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::alarm(30);
      std::vector<std::uint8_t> buffer;
      vision::set_jpeg_checkpoint_budget(budget);
      const bool same = crop(0, 4242, buffer).empty() && crop(0, 4242, buffer).empty();
      ::_exit(same ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    statuses.push_back(status);
  }
  for (int t = 0; t < decoders; ++t) threads[static_cast<std::size_t>(t)].join();
  decoding.store(false);
  threads.back().join();  // the budget's thread
  for (const Result& r : results) {
    CHECK(r.done == rounds);
    CHECK(r.first_bad == "");
  }
  CHECK(budget_changes > 0);
  for (const int status : statuses) {
    // A child that hung on a lock held at fork() dies of alarm()'s SIGALRM (14).
    CHECK_MESSAGE(WIFEXITED(status), "child killed by signal ", WTERMSIG(status));
    CHECK(WEXITSTATUS(status) == 0);  // 1: a crop's pixels were not libjpeg's
  }
  // The table after the storm: emptied by a budget of 0, and keeping points again at the
  // default one (a crop near the bottom decoded twice: the second from the first's points).
  vision::set_jpeg_checkpoint_budget(0);
  CHECK(vision::jpeg_checkpoint_bytes() == 0);
  vision::set_jpeg_checkpoint_budget(budget);
  std::vector<std::uint8_t> buffer;
  std::uint64_t mcus[2];
  for (std::uint64_t& m : mcus) {
    const std::uint64_t before = vision::detail::huffman_mcus_decoded();
    CHECK(crop(4, 90 + 97 * 40, buffer) == "");
    m = vision::detail::huffman_mcus_decoded() - before;
  }
  CHECK(mcus[1] * 2 < mcus[0]);
  CHECK(vision::jpeg_checkpoint_bytes() > 0);
}

TEST_CASE("COLOAD_JPEG_CHECKPOINT_MB sets the checkpoints' budget; a value that is not a number of "
          "MiB keeps the default with a warning naming it (run by meson with the variable set)") {
  const char* mode = std::getenv("COLOAD_TEST_CHECKPOINT_ENV");
  if (!mode) return;  // the variable is read once a process: meson's own runs set it
  std::vector<std::string> warnings;
  set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  const std::size_t budget = vision::jpeg_checkpoint_budget();  // the first use reads it
  set_warning_handler({});
  if (std::string(mode) == "bad") {
    CHECK(budget == (std::size_t{64} << 20));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("COLOAD_JPEG_CHECKPOINT_MB='64M' is not a number of MiB") !=
          std::string::npos);
  } else {
    CHECK(budget == 0);
    CHECK(warnings.empty());
    // Off: a crop decoded twice decodes the same MCUs twice and keeps nothing.
    const std::vector<std::byte> jpeg =
        encode(vision::test::synthetic_image(160, 120, 2), TJSAMP_420);
    std::vector<std::uint8_t> buffer;
    std::uint64_t mcus[2];
    for (std::uint64_t& m : mcus) {
      const std::uint64_t before = vision::detail::huffman_mcus_decoded();
      REQUIRE(vision::detail::decode_jpeg_region(jpeg, 80, 100, 30, 40, buffer).has_value());
      m = vision::detail::huffman_mcus_decoded() - before;
    }
    CHECK(mcus[0] > 0);
    CHECK(mcus[1] == mcus[0]);
    CHECK(vision::jpeg_checkpoint_bytes() == 0);
  }
}

TEST_CASE(
    "a plain JPEG's crop through coload's Huffman decoder: a scan that ends early gives "
    "libjpeg's pixels (zero bits for the MCU that ran out, grey after it), never MCUs "
    "decoded from the padding past the data") {
  // A smooth image with optimised tables: the commonest symbols (DC difference 0, end of block)
  // get the all-zero codes, so zero bits past the data's end would decode as whole blocks.
  vision::Image src = vision::Image::zeros(160, 128, 3);
  for (int y = 0; y < src.height; ++y) {
    for (int x = 0; x < src.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        src.data[static_cast<std::size_t>((y * src.width + x) * 3 + c)] =
            static_cast<std::uint8_t>(60 + c * 40 + (x + y) / 8);
      }
    }
  }
  for (const Subsampling& sub : {subsamplings[0], subsamplings[2]}) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    const std::vector<std::byte> jpeg = turbo_jpeg_optimized(src, sub.tj);
    const auto frame = vision::detail::parse_jpeg_frame(jpeg);
    REQUIRE(frame.has_value());
    REQUIRE(frame->restart_interval == 0u);
    // The scan cut at several places, the EOI right after: libjpeg warns and decodes the rest
    // of the MCU it was in from zero bits, and every MCU after it as zeros.
    int refused = 0, decoded = 0;
    for (const double at : {0.3, 0.5, 0.7}) {
      CAPTURE(at);
      const std::size_t entropy = jpeg.size() - 2 - frame->entropy_at;
      const std::size_t keep =
          frame->entropy_at + static_cast<std::size_t>(at * static_cast<double>(entropy));
      std::vector<std::byte> cut(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(keep));
      if (cut.back() == std::byte{0xff}) cut.pop_back();  // not half a stuffed byte
      cut.push_back(std::byte{0xff});
      cut.push_back(std::byte{0xd9});
      std::vector<std::uint8_t> whole, buffer;
      const vision::ImageView full = libjpeg_decode(cut, whole, 1);
      // Crops whose last row is at every 8th row: those above the cut decode through coload's
      // decoder, those past it are refused there and decoded by libjpeg.
      for (int bottom = 8; bottom <= full.height; bottom += 8) {
        CAPTURE(bottom);
        const std::uint64_t before = vision::detail::scan_region_decodes();
        const auto region =
            vision::detail::decode_jpeg_region(cut, bottom - 8, 3, 8, full.width - 6, buffer);
        REQUIRE(region.has_value());
        CHECK(first_difference(*region, full, bottom - 8, 3, 8, full.width - 6) == "");
        (vision::detail::scan_region_decodes() > before ? decoded : refused) += 1;
      }
    }
    CHECK(decoded > 0);
    CHECK(refused > 0);
  }
}

TEST_CASE(
    "a plain JPEG whose scan is larger than a thread keeps decodes through coload's "
    "decoder, and the thread keeps no more than 8 MiB after it") {
  // Noise at quality 100, 4:4:4: about 2.3 bytes a pixel of entropy-coded data.
  vision::Image src = vision::Image::zeros(2400, 1800, 3);
  std::uint32_t state = 3;
  for (auto& v : src.data) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<std::uint8_t>(state >> 24);
  }
  const std::vector<std::byte> jpeg = vision::test::turbo_jpeg(src, TJSAMP_444, 0, 100);
  const auto frame = vision::detail::parse_jpeg_frame(jpeg);
  REQUIRE(frame.has_value());
  REQUIRE(jpeg.size() - frame->entropy_at > (std::size_t{8} << 20));
  std::vector<std::uint8_t> buffer, whole;
  const std::uint64_t before = vision::detail::scan_region_decodes();
  const auto region = vision::detail::decode_jpeg_region(jpeg, 1500, 2000, 300, 400, buffer);
  REQUIRE(region.has_value());
  CHECK(vision::detail::scan_region_decodes() == before + 1);
  CHECK(vision::detail::scratch_capacity() <= (std::size_t{8} << 20));
  const vision::ImageView full = libjpeg_decode(jpeg, whole, 1);
  CHECK(first_difference(*region, full, 1500, 2000, 300, 400) == "");
}

TEST_CASE(
    "damaged entropy data in a plain JPEG gives libjpeg's pixels: decoded as libjpeg "
    "decodes it, or refused by coload's decoder (libjpeg then decodes it)") {
  const vision::Image src = vision::test::synthetic_image(259, 203, 9, 30);
  const std::vector<std::byte> jpeg = encode(src, TJSAMP_420);
  const auto frame = vision::detail::parse_jpeg_frame(jpeg);
  REQUIRE(frame.has_value());
  const int top = 5 * 16 + 4, left = 37, height = 50, width = 150;
  Damage damage{11};
  int decoded = 0, refused = 0, differing = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::vector<std::byte> bad = jpeg;
    // One or three bytes of the scan's first 60%: above and inside the crop.
    damage.apply(bad, frame->entropy_at + 1, (jpeg.size() - frame->entropy_at) * 6 / 10,
                 1 + 2 * (trial % 2));
    std::vector<std::uint8_t> buffer, whole;
    const std::uint64_t before = vision::detail::scan_region_decodes();
    const auto region = vision::detail::decode_jpeg_region(bad, top, left, height, width, buffer);
    if (!region) continue;  // libjpeg gave up too: the whole decode then says why
    (vision::detail::scan_region_decodes() > before ? decoded : refused) += 1;
    const vision::ImageView full = libjpeg_decode(bad, whole, 1);
    differing += !first_difference(*region, full, top, left, height, width).empty();
  }
  CHECK(differing == 0);
  CHECK(refused > 0);
  CHECK(decoded > 0);
  MESSAGE("damaged: " << decoded << " decoded by coload's decoder, " << refused << " by libjpeg");
}

// A JPEG written by libjpeg itself, with a restart marker every `interval` MCUs: TurboJPEG 2.1
// has no such option, and add_restart_markers takes divisors of an MCU row, so only this gives
// a scan whose last interval is short. Luma sampled `samp` x `samp` (1: 4:4:4, 2: 4:2:0).
std::vector<std::byte> libjpeg_restart_jpeg(const vision::Image& image, int samp,
                                            unsigned interval) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  cinfo.comp_info[0].h_samp_factor = cinfo.comp_info[0].v_samp_factor = samp;
  cinfo.restart_interval = interval;
  jpeg_start_compress(&cinfo, TRUE);
  const std::size_t row_bytes = static_cast<std::size_t>(image.width) * 3;
  while (cinfo.next_scanline < cinfo.image_height) {
    auto* row = const_cast<JSAMPROW>(image.data.data() + cinfo.next_scanline * row_bytes);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<std::byte> jpeg(size);
  std::memcpy(jpeg.data(), out, size);
  std::free(out);
  return jpeg;
}

// The offsets of the FF bytes of the RST markers at or after `from`.
std::vector<std::size_t> rst_offsets(const std::vector<std::byte>& jpeg, std::size_t from) {
  std::vector<std::size_t> at;
  for (std::size_t i = from; i + 1 < jpeg.size(); ++i) {
    const auto b = std::to_integer<unsigned>(jpeg[i + 1]);
    if (jpeg[i] == std::byte{0xff} && b >= 0xd0 && b <= 0xd7) at.push_back(i);
  }
  return at;
}

TEST_CASE("a JPEG with restart markers decodes whole through coload's Huffman decoder, interval "
          "by interval, with libjpeg's pixels (every subsampling, interval, scale, a short last "
          "interval); one whose RSTs are out of order or missing goes to libjpeg") {
  // 288 pixels wide: every subsampling's MCU row (9 to 36 MCUs) divides into intervals of 3.
  const vision::Image src = vision::test::synthetic_image(288, 203, 4, 20);
  int decoded = 0;
  // decode_into (a --fast-crop member decoded whole, a camera's file) against libjpeg's.
  auto check_whole = [&](const std::vector<std::byte>& jpeg, int d) {
    CAPTURE(d);
    std::vector<std::uint8_t> want_buffer;
    check_decode_into(jpeg, d, libjpeg_decode(jpeg, want_buffer, d));
    ++decoded;
  };
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    for (const int mcus : {1, 3}) {
      CAPTURE(mcus);
      std::vector<std::byte> marked;
      REQUIRE(vision::detail::add_restart_markers(encode(src, sub.tj), mcus, marked) ==
              vision::detail::RestartOutcome::marked);
      const auto frame = vision::detail::parse_jpeg_frame(marked);
      REQUIRE(frame.has_value());
      REQUIRE(frame->restart_interval == static_cast<unsigned>(mcus));
      for (const int d : {1, 2, 4, 8}) check_whole(marked, d);
    }
  }
  REQUIRE(decoded == 6 * 2 * 4);
  // A short last interval: 7 MCUs divide neither an MCU row nor the image.
  for (const int samp : {1, 2}) {
    CAPTURE(samp);
    const std::vector<std::byte> jpeg = libjpeg_restart_jpeg(src, samp, 7);
    const auto frame = vision::detail::parse_jpeg_frame(jpeg);
    REQUIRE(frame.has_value());
    REQUIRE(frame->restart_interval == 7u);
    REQUIRE(frame->mcus_per_row * frame->mcu_rows % 7 != 0);
    REQUIRE(rst_offsets(jpeg, frame->entropy_at).size() ==
            static_cast<std::size_t>(frame->mcus_per_row * frame->mcu_rows / 7));
    for (const int d : {1, 2, 4, 8}) check_whole(jpeg, d);
    // A crop through decode_jpeg_region: no layout fits intervals that span rows, so the whole
    // scan goes through the decoder, libjpeg skipping and cropping as for a plain file.
    std::vector<std::uint8_t> whole, buffer;
    const vision::ImageView full = libjpeg_decode(jpeg, whole, 1);
    const std::uint64_t before = vision::detail::scan_region_decodes();
    const auto region = vision::detail::decode_jpeg_region(jpeg, 150, 200, 53, 59, buffer);
    REQUIRE(region.has_value());
    CHECK(vision::detail::scan_region_decodes() == before + 1);
    CHECK(first_difference(*region, full, 150, 200, 53, 59) == "");
  }
  // RSTs out of order, one missing, or a byte of junk before one: refused by coload's decoder
  // (the first two before anything is decoded, the last when its interval ends a byte early);
  // libjpeg resynchronises or skips (with a warning), and decode_into gives its pixels.
  std::vector<std::byte> marked;
  REQUIRE(vision::detail::add_restart_markers(encode(src, TJSAMP_420), 2, marked) ==
          vision::detail::RestartOutcome::marked);
  const auto frame = vision::detail::parse_jpeg_frame(marked);
  REQUIRE(frame.has_value());
  const std::vector<std::size_t> rsts = rst_offsets(marked, frame->entropy_at);
  REQUIRE(rsts.size() > 10);
  std::vector<std::byte> swapped = marked;  // the 4th and 5th RSTs' numbers exchanged
  std::swap(swapped[rsts[3] + 1], swapped[rsts[4] + 1]);
  std::vector<std::byte> missing = marked;  // the 6th RST gone: its interval runs into the 7th
  missing.erase(missing.begin() + static_cast<std::ptrdiff_t>(rsts[5]),
                missing.begin() + static_cast<std::ptrdiff_t>(rsts[5]) + 2);
  std::vector<std::byte> junk = marked;  // a byte before the 8th RST: its interval ends early
  junk.insert(junk.begin() + static_cast<std::ptrdiff_t>(rsts[7]), std::byte{0x5a});
  for (const auto* bad : {&swapped, &missing, &junk}) {
    const auto bad_frame = vision::detail::parse_jpeg_frame(*bad);
    REQUIRE(bad_frame.has_value());
    std::vector<std::uint8_t> buffer, want_buffer, got_buffer;
    const std::uint64_t before = vision::detail::scan_region_decodes();
    CHECK_FALSE(vision::detail::decode_scan_region(*bad, *bad_frame, 0, 0, 203, 288, buffer, 1)
                    .has_value());
    const vision::ImageView want = libjpeg_decode(*bad, want_buffer, 1);
    const vision::ImageView got = vision::decode_into(*bad, got_buffer, 1);
    CHECK(vision::detail::scan_region_decodes() == before);
    REQUIRE(got.stride * got.height == want.stride * want.height);
    CHECK(std::memcmp(got.data, want.data, static_cast<std::size_t>(want.stride) * want.height) ==
          0);
  }
}

TEST_CASE("--fast-crop's transcode adds restart markers losslessly, every few MCUs of a row, "
          "and keeps progressive, arithmetic-coded and marked files as they are") {
  const vision::Image src = vision::test::synthetic_image(203, 157, 2);
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    const std::vector<std::byte> plain = encode(src, sub.tj);
    const auto frame = vision::detail::parse_jpeg_frame(plain);
    REQUIRE(frame.has_value());
    CHECK(frame->mcu_width == sub.mcu_width);
    CHECK(frame->mcu_height == sub.mcu_height);
    CHECK(frame->restart_interval == 0u);
    CHECK_FALSE(vision::detail::scan_restart_layout(plain).has_value());
    const vision::Image want = vision::decode(plain);
    for (const int target : {1, 2, 4, 5}) {
      CAPTURE(target);
      std::vector<std::byte> marked;
      REQUIRE(vision::detail::add_restart_markers(plain, target, marked) ==
              vision::detail::RestartOutcome::marked);
      const auto layout = vision::detail::scan_restart_layout(marked);
      REQUIRE(layout.has_value());
      // 203 pixels: 13 MCUs of 16 (a prime: intervals of 1 or the row) or 26 of 8.
      const int expected = vision::detail::restart_interval_for(frame->mcus_per_row, target);
      CHECK(layout->interval == static_cast<std::uint32_t>(expected));
      CHECK(frame->mcus_per_row % expected == 0);
      CHECK(expected <= target);
      CHECK(layout->rows.size() == static_cast<std::size_t>(frame->mcu_rows));
      const vision::Image got = vision::decode(marked);
      CHECK(got.data == want.data);
      // A second pass keeps the file as it is.
      std::vector<std::byte> again;
      CHECK(vision::detail::add_restart_markers(marked, target, again) ==
            vision::detail::RestartOutcome::already_marked);
      CHECK(again.empty());
    }
  }
  CHECK(vision::detail::restart_interval_for(26, 4) == 2);
  CHECK(vision::detail::restart_interval_for(32, 4) == 4);
  CHECK(vision::detail::restart_interval_for(13, 4) == 1);
  CHECK(vision::detail::restart_interval_for(3, 8) == 3);
  std::vector<std::byte> out;
  CHECK(vision::detail::add_restart_markers(vision::test::progressive_jpeg(64, 48, 1), 4, out) ==
        vision::detail::RestartOutcome::progressive);
  // TurboJPEG writes no arithmetic coding: a baseline file whose SOF says SOF9 (sequential,
  // arithmetic) is one as far as the decision is concerned, which reads the headers only.
  std::vector<std::byte> arithmetic = encode(src, TJSAMP_420);
  arithmetic[vision::detail::parse_jpeg_frame(arithmetic)->sof_at + 1] = std::byte{0xc9};
  CHECK(vision::detail::add_restart_markers(arithmetic, 4, out) ==
        vision::detail::RestartOutcome::arithmetic);
  vision::Image cmyk = vision::Image::zeros(16, 16, 4);
  CHECK(vision::detail::add_restart_markers(
            vision::encode_jpeg(cmyk.view(), 90, vision::ChromaSubsampling::s444), 4, out) ==
        vision::detail::RestartOutcome::other);
  const std::vector<std::byte> junk(100, std::byte{0x42});
  CHECK(vision::detail::add_restart_markers(junk, 4, out) ==
        vision::detail::RestartOutcome::not_jpeg);
  CHECK(out.empty());
}

TEST_CASE("a crop decoded from its restart intervals equals the whole decode at every offset "
          "within an MCU, for each subsampling and DCT scale, edges included") {
  // 259 × 203: 17 (4:2:0, 4:2:2), 9 (4:1:1) or 33 MCUs a row, not whole in either direction. The crops
  // start at every row and column offset over two MCUs and the region decoder's margin, and
  // end on every offset of the last two MCUs; decode_restart_region must take every one (it
  // declines only a crop whose margin covers the whole image).
  const vision::Image src = vision::test::synthetic_image(259, 203, 8);
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    std::vector<std::byte> marked;
    REQUIRE(vision::detail::add_restart_markers(encode(src, sub.tj), 1, marked) ==
            vision::detail::RestartOutcome::marked);
    const auto layout = vision::detail::scan_restart_layout(marked);
    REQUIRE(layout.has_value());
    for (const int d : {1, 2, 4, 8}) {
      CAPTURE(d);
      std::vector<std::uint8_t> whole;
      const vision::ImageView full = libjpeg_decode(marked, whole, d);
      const int row_span = std::min(full.height - 5, 16 + 2 * std::max(1, sub.mcu_height / d));
      const int col_span = std::min(full.width - 7, 16 + 2 * std::max(1, sub.mcu_width / d));
      std::vector<std::uint8_t> buffer;
      Mismatch m;
      for (int top = 0; top < row_span; ++top) {
        for (int left = 0; left < col_span; ++left) {
          compare(marked, full, top, left, 5, 7, d, buffer, m, &*layout);
          // And the mirror: ending on every offset of the last MCUs.
          compare(marked, full, full.height - 5 - top, full.width - 7 - left, 5, 7, d, buffer, m,
                  &*layout);
        }
      }
      INFO(m.first);
      CHECK(m.crops == 2 * row_span * col_span);
      CHECK(m.declined == 0);
      CHECK(m.differing == 0);
    }
  }
}

// TurboJPEG's own encoder with restart markers every MCU (its TJ_RESTART variable) and the
// standard (Annex K) Huffman tables, whose rare AC codes are up to 16 bits long:
// add_restart_markers always optimises them.
std::vector<std::byte> turbo_jpeg_restarts(const vision::Image& image, int tj_subsampling,
                                           int quality) {
  ::setenv("TJ_RESTART", "1B", 1);
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, image.data.data(), image.width, image.width * 3,
                             image.height, TJPF_RGB, &out, &size, tj_subsampling, quality, 0);
  ::unsetenv("TJ_RESTART");
  std::vector<std::byte> jpeg;
  if (rc == 0) jpeg.assign(reinterpret_cast<std::byte*>(out), reinterpret_cast<std::byte*>(out) + size);
  tjFree(out);
  tjDestroy(handle);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return jpeg;
}

TEST_CASE("the intervals' Huffman decoder (restart_entropy.cpp) gives libjpeg's coefficients: "
          "standard tables with codes to 16 bits, quality 100 (DC categories to 11), runs of "
          "sixteen zeros, every subsampling and scale") {
  // Two contents: noise over gradients (large values, long codes), and a cosine of the highest
  // horizontal frequency in every 8x8 block with a faint one vertically (long zero runs, ZRL).
  const vision::Image noisy = vision::test::synthetic_image(203, 157, 5, 60);
  vision::Image pattern = vision::Image::zeros(203, 157, 3);
  for (int y = 0; y < pattern.height; ++y) {
    for (int x = 0; x < pattern.width; ++x) {
      const double v = 128 + 90 * std::cos(3.14159265358979 * (2 * (x % 8) + 1) * 7 / 16) +
                       6 * std::cos(3.14159265358979 * (2 * (y % 8) + 1) * 3 / 16);
      for (int c = 0; c < 3; ++c) {
        pattern.data[static_cast<std::size_t>((y * pattern.width + x) * 3 + c)] =
            static_cast<std::uint8_t>(std::clamp(v + 20 * c, 0.0, 255.0));
      }
    }
  }
  int crops = 0;
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    for (const vision::Image* src : {&noisy, static_cast<const vision::Image*>(&pattern)}) {
      for (const int quality : {100, 75}) {
        CAPTURE(quality);
        const std::vector<std::byte> jpeg = turbo_jpeg_restarts(*src, sub.tj, quality);
        const auto layout = vision::detail::scan_restart_layout(jpeg);
        REQUIRE(layout.has_value());
        REQUIRE(layout->interval == 1u);
        for (const int d : {1, 2, 8}) {
          CAPTURE(d);
          std::vector<std::uint8_t> whole, buffer;
          const vision::ImageView full = libjpeg_decode(jpeg, whole, d);
          // Both forms of the decoder: the generic one (the SIMD cap at scalar) and, where the
          // CPU has BMI2, the BMI2 one (at AVX2 and above).
          using vision::detail::SimdLevel;
          for (const auto simd : {SimdLevel::scalar, SimdLevel::avx512}) {
            const auto previous = vision::detail::set_simd_level(simd);
            Mismatch m;
            // Crops over a grid of positions and sizes, edges included: every interval of the
            // image is decoded by some of them.
            for (int top = 0; top + 3 <= full.height; top += std::max(1, full.height / 7)) {
              for (int left = 0; left + 3 <= full.width; left += std::max(1, full.width / 9)) {
                const int h = std::min(full.height - top, 3 + (top * 7 + left) % 41);
                const int w = std::min(full.width - left, 3 + (left * 5 + top) % 53);
                compare(jpeg, full, top, left, h, w, d, buffer, m, &*layout);
              }
            }
            vision::detail::set_simd_level(previous);
            INFO(m.first);
            CHECK(m.declined == 0);
            CHECK(m.differing == 0);
            crops += m.crops;
          }
        }
      }
    }
  }
  CHECK(crops > 2000);
}

TEST_CASE("damaged entropy data inside the covering intervals gives the plain decode's pixels: "
          "decoded as libjpeg decodes it, or refused (the plain decode then runs)") {
  const vision::Image src = vision::test::synthetic_image(259, 203, 9, 30);
  std::vector<std::byte> marked;
  REQUIRE(vision::detail::add_restart_markers(encode(src, TJSAMP_420), 2, marked) ==
          vision::detail::RestartOutcome::marked);
  const auto layout = vision::detail::scan_restart_layout(marked);
  REQUIRE(layout.has_value());
  // A crop over MCU rows 5 to 9; bytes of rows 6 to 8 are damaged, one or three at a time.
  const int top = 5 * 16 + 4, left = 37, height = 50, width = 150;
  Damage damage{7};
  int decoded = 0, refused = 0, differing = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::vector<std::byte> bad = marked;
    // The markers stay as the index records them (that damage is the test above's).
    damage.apply(bad, layout->rows[6], layout->rows[9] - layout->rows[6], 1 + 2 * (trial % 2));
    std::vector<std::uint8_t> buffer, whole;
    std::optional<vision::detail::JpegRegion> region;
    try {
      region = vision::detail::decode_restart_region(bad, *layout, top, left, height, width,
                                                     buffer);
    } catch (const vision::detail::RestartMismatch&) {
      ++refused;
      continue;
    }
    REQUIRE(region.has_value());
    ++decoded;
    const vision::ImageView full = libjpeg_decode(bad, whole, 1);
    differing += !first_difference(*region, full, top, left, height, width).empty();
  }
  CHECK(differing == 0);
  // Both outcomes occur (here about 3 in 4 decode: a flipped bit in a value, or damage outside
  // the covering intervals; the rest end an interval off its end, or read a code no table has).
  CHECK(refused > 0);
  CHECK(decoded > 0);
  MESSAGE("damaged: " << decoded << " decoded, " << refused << " refused");
}

TEST_CASE("a marked member that does not match its index falls back to the plain decode with one "
          "warning naming shard and member: truncated, an RST missing or out of sequence, a "
          "lying DRI, a misplaced row") {
  const vision::Image src = vision::test::synthetic_image(259, 203, 4);
  std::vector<std::byte> marked;
  REQUIRE(vision::detail::add_restart_markers(encode(src, TJSAMP_420), 1, marked) ==
          vision::detail::RestartOutcome::marked);
  const auto layout = vision::detail::scan_restart_layout(marked);
  REQUIRE(layout.has_value());
  const auto frame = vision::detail::parse_jpeg_frame(marked);
  // The offset of the n-th RST marker's 0xFF in the entropy data.
  auto rst = [&](const std::vector<std::byte>& b, int n) {
    for (std::size_t i = frame->entropy_at; i + 1 < b.size(); ++i) {
      const auto m = std::to_integer<unsigned>(b[i + 1]);
      if (b[i] == std::byte{0xff} && m >= 0xd0 && m <= 0xd7 && n-- == 0) return i;
    }
    FAIL("no such RST");
    return std::size_t{0};
  };
  struct Case {
    const char* name;
    std::vector<std::byte> data;
    shards::RestartIndex layout;
  };
  std::vector<Case> cases;
  // Cut inside MCU row 8: the crop below needs rows 7 to 10.
  cases.push_back({"truncated", {marked.begin(), marked.begin() + layout->rows[8] + 40}, *layout});
  {
    auto b = marked;  // the RST ending interval 17 x 7 + 3 removed
    const std::size_t at = rst(b, 17 * 7 + 3);
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at) + 2);
    cases.push_back({"an RST missing", std::move(b), *layout});
  }
  {
    auto b = marked;  // two RSTs of row 7 swapped
    std::swap(b[rst(b, 17 * 7 + 2) + 1], b[rst(b, 17 * 7 + 3) + 1]);
    cases.push_back({"RSTs out of sequence", std::move(b), *layout});
  }
  {
    auto b = marked;  // a DRI that says 17 MCUs (a row) where they are 1, and an index that agrees
    std::size_t dri = 2;
    while (!(b[dri] == std::byte{0xff} && b[dri + 1] == std::byte{0xdd})) ++dri;
    b[dri + 5] = std::byte{17};
    auto lying = *layout;
    lying.interval = 17;
    cases.push_back({"a lying DRI", b, lying});
    cases.push_back({"a DRI unlike the index's", std::move(b), *layout});
  }
  {
    auto misplaced = *layout;  // row 8 said to start 8 intervals on (the same RST number)
    std::size_t at = misplaced.rows[8];
    for (int k = 0; k < 8; ++k) {
      unsigned m = 0;
      while (!(marked[at] == std::byte{0xff} &&
               (m = std::to_integer<unsigned>(marked[at + 1])) >= 0xd0 && m <= 0xd7)) {
        ++at;
      }
      at += 2;
    }
    misplaced.rows[8] = static_cast<std::uint32_t>(at);
    cases.push_back({"a misplaced row", marked, misplaced});
  }
  const std::string shard = "train-000003.tar", member = "n01440764_10026.jpg";
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> warnings;
    coload::set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    coload::detail::forget_warnings();
    std::vector<std::uint8_t> plain_buffer, buffer;
    // What the member's bytes give without their index: the answer the fallback must give.
    const auto plain = vision::detail::decode_jpeg_region(c.data, 120, 100, 30, 40, plain_buffer);
    const std::uint64_t before = vision::detail::restart_region_decodes();
    for (int repeat = 0; repeat < 3; ++repeat) {
      const vision::detail::ScopedRestartHint hint(
          {c.data.data(), c.data.size(), &c.layout, &shard, &member});
      const auto got = vision::detail::decode_jpeg_region(c.data, 120, 100, 30, 40, buffer);
      REQUIRE(got.has_value() == plain.has_value());
      if (!plain) continue;  // declined (the truncated file): the whole decode reports it
      for (int y = 120; y < 150; ++y) {
        CHECK(std::memcmp(got->pixels + (y - got->y0) * got->stride + (100 - got->x0) * 3,
                          plain->pixels + (y - plain->y0) * plain->stride + (100 - plain->x0) * 3,
                          40 * 3) == 0);
      }
    }
    coload::set_warning_handler({});
    CHECK(vision::detail::restart_region_decodes() == before);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("'" + member + "'") != std::string::npos);
    CHECK(warnings[0].find("'" + shard + "'") != std::string::npos);
  }
  // The unchanged member through the same call takes the intervals, silently.
  std::vector<std::string> warnings;
  coload::set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  std::vector<std::uint8_t> buffer;
  const std::uint64_t before = vision::detail::restart_region_decodes();
  {
    const vision::detail::ScopedRestartHint hint(
        {marked.data(), marked.size(), &*layout, &shard, &member});
    CHECK(vision::detail::decode_jpeg_region(marked, 120, 100, 30, 40, buffer).has_value());
  }
  CHECK(vision::detail::restart_region_decodes() == before + 1);
  // The hint is for its bytes only: a copy of them is found to carry markers by a scan (as a
  // folder's file is), and a plain JPEG decodes as before.
  const std::vector<std::byte> copy = marked;
  CHECK(vision::detail::decode_jpeg_region(copy, 120, 100, 30, 40, buffer).has_value());
  CHECK(vision::detail::restart_region_decodes() == before + 2);
  CHECK(vision::detail::decode_jpeg_region(encode(src, TJSAMP_420), 120, 100, 30, 40, buffer)
            .has_value());
  CHECK(vision::detail::restart_region_decodes() == before + 2);
  coload::set_warning_handler({});
  CHECK(warnings.empty());
}

TEST_CASE("a JPEG with restart markers outside a shard (a folder's file) decodes its crops from "
          "its intervals, found by a scan, with the whole decode's pixels") {
  const vision::Image src = vision::test::synthetic_image(259, 203, 6);
  std::vector<std::byte> marked;
  REQUIRE(vision::detail::add_restart_markers(encode(src, TJSAMP_422), 2, marked) ==
          vision::detail::RestartOutcome::marked);
  std::vector<std::uint8_t> whole;
  const vision::ImageView full = libjpeg_decode(marked, whole, 1);
  std::vector<std::uint8_t> buffer;
  Mismatch m;
  const std::uint64_t before = vision::detail::restart_region_decodes();
  for (int top = 0; top < 40; top += 3) {
    for (int left = 0; left < 60; left += 5) {
      compare(marked, full, top * 4, left * 3, 17, 23, 1, buffer, m);
    }
  }
  INFO(m.first);
  CHECK(m.differing == 0);
  CHECK(m.declined == 0);
  CHECK(vision::detail::restart_region_decodes() - before == static_cast<std::uint64_t>(m.crops));
}

TEST_CASE("a crop at a DCT scale decodes only its region (from its restart intervals where the "
          "file has them) with the pixels of the whole decode at 1/d, for each subsampling, scale "
          "and offset, edges included; EvalTransform's too") {
  // The path before: the whole image at 1/d, then the box (full-size coordinates, so a
  // fraction of a scaled pixel) resized out of it. The crops start at every full-size offset
  // over the region decoder's margin and two MCUs (so at every scaled offset within an MCU and
  // every fraction), and end on the same offsets of the image's last rows and columns.
  const vision::Image src = vision::test::synthetic_image(259, 203, 9);
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    const std::vector<std::byte> plain = encode(src, sub.tj);
    std::vector<std::byte> marked;
    REQUIRE(vision::detail::add_restart_markers(plain, 1, marked) ==
            vision::detail::RestartOutcome::marked);
    for (const int d : {2, 4, 8}) {
      CAPTURE(d);
      std::vector<std::uint8_t> whole;
      const vision::ImageView full = libjpeg_decode(plain, whole, d);
      const int bh = 5 * d + 3, bw = 7 * d + 5;  // boxes ending inside a scaled pixel
      const int row_span = std::min(203 - bh, (16 + 2 * sub.mcu_height / d + 1) * d);
      const int col_span = std::min(259 - bw, (16 + 2 * sub.mcu_width / d + 1) * d);
      int crops = 0, differing = 0;
      std::string first;
      auto check = [&](int top, int left) {
        const vision::CropBox box{top, left, bh, bw};
        const vision::Image want = vision::detail::resample_to_image(
            full, vision::detail::scaled_crop_axis(left, bw, 6, d, full.width),
            vision::detail::scaled_crop_axis(top, bh, 5, d, full.height));
        for (const auto* jpeg : std::array<const std::vector<std::byte>*, 2>{&plain, &marked}) {
          ++crops;
          if (vision::decode_resized_crop(*jpeg, box, 5, 6, d).data != want.data &&
              differing++ == 0) {
            first = std::string(jpeg == &plain ? "plain" : "marked") + " crop at (" +
                    std::to_string(top) + ", " + std::to_string(left) + ")";
          }
        }
      };
      const std::uint64_t before = vision::detail::restart_region_decodes();
      for (int k = 0; k < std::max(row_span, col_span); ++k) {
        const int top = k % row_span, left = k % col_span;
        check(top, left);
        check(top, (k * 7) % col_span);
        check(203 - bh - top, 259 - bw - left);
        check(203 - bh - (k * 5) % row_span, 259 - bw - left);
      }
      INFO(first);
      CHECK(differing == 0);
      // Every marked crop went through its intervals (none covers the whole image).
      CHECK(vision::detail::restart_region_decodes() - before ==
            static_cast<std::uint64_t>(crops / 2));
    }
  }
  // EvalTransform: the resized image's centre, from a region at 1/8, 1/4 and 1/2.
  const vision::Image big = vision::test::synthetic_image(517, 389, 3);
  for (const Subsampling& sub : subsamplings) {
    const std::string subsampling = sub.name;
    CAPTURE(subsampling);
    const std::vector<std::byte> plain = encode(big, sub.tj);
    std::vector<std::byte> marked;
    REQUIRE(vision::detail::add_restart_markers(plain, 2, marked) ==
            vision::detail::RestartOutcome::marked);
    for (const auto& [resize, crop, d] : {std::tuple{40, 24, 8}, std::tuple{60, 47, 4}, std::tuple{120, 100, 2}}) {
      CAPTURE(d);
      const auto [rh, rw] = vision::resize_output_size(389, 517, resize);
      REQUIRE(vision::choose_jpeg_scale(517, 389, rw, rh) == d);
      const vision::CropBox box = vision::center_crop_box(rh, rw, crop, crop);
      std::vector<std::uint8_t> whole;
      const vision::ImageView full = libjpeg_decode(plain, whole, d);
      const vision::Image want = vision::detail::resample_to_image(
          full, {0.0, 517.0 / d, 0, full.width, rw, box.left, box.width},
          {0.0, 389.0 / d, 0, full.height, rh, box.top, box.height});
      const vision::EvalTransform eval{.resize_size = resize, .crop_size = crop};
      at::Tensor expected = at::empty({3, crop, crop}, at::kFloat);
      vision::to_normalized_chw(want.view(), eval.mean, eval.std_dev,
                                expected.data_ptr<float>());
      CHECK(at::equal(eval(plain), expected));
      CHECK(at::equal(eval(marked), expected));
    }
  }
}

TEST_CASE("normalize_row writes write_normalized_row's floats, mirrored or not, at every width "
          "and SIMD level") {
  // Widths around the 16- and 64-pixel steps, a table with a distinct value per (channel, byte),
  // rows whose every byte value occurs; the source row ends where its buffer ends.
  vision::detail::NormalizeTable table({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  table.value[1][7] = -1e30f;  // not what arithmetic would give: the lookup must be a lookup
  table.value[2][200] = 3.5e-42f;  // a denormal, and a value over 127
  table.update_planes();
  // Every level is forced: avx512 takes the VBMI form where the CPU has it, the levels below
  // the scalar loop (normalize_row has no SSSE3 or AVX2 form), so both are checked on such a CPU.
  using vision::detail::SimdLevel;
  const auto level = vision::detail::set_simd_level(SimdLevel::avx512);
  for (const auto simd :
       {SimdLevel::scalar, SimdLevel::ssse3, SimdLevel::avx2, SimdLevel::avx512}) {
    vision::detail::set_simd_level(simd);
    // 1 to 200: under 64 (16 at a time), 64 at a time, and the overlapping last block.
    for (int width = 1; width <= 200; ++width) {
      CAPTURE(width);
      const int height = 3;
      for (const bool flip : {false, true}) {
        CAPTURE(flip);
        std::vector<float> want(static_cast<std::size_t>(3 * width * height), 0.5f);
        std::vector<float> got = want;
        for (int y = 0; y < height; ++y) {
          std::vector<std::uint8_t> row(static_cast<std::size_t>(3 * width));
          for (std::size_t i = 0; i < row.size(); ++i) {
            row[i] = static_cast<std::uint8_t>((i * 97 + static_cast<std::size_t>(y) * 31 + 7) % 256);
          }
          vision::detail::write_normalized_row(table, row.data(), width, height, y, flip,
                                               want.data());
          vision::detail::normalize_row(table, row.data(), width, height, y, flip,
                                        got.data());
        }
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
  vision::detail::set_simd_level(level);
}

TEST_CASE("a crop of a JPEG with restart markers over the pixel limit is refused as a bomb") {
  // The restart-interval path rewrote the frame's size to the region's before the region
  // decoder checked it: a crop of an image over the limit decoded (decode_resized_crop,
  // TrainTransform::apply and Recipe::apply on a --fast-crop member).
  const vision::Image src = vision::test::synthetic_image(259, 203, 8);
  std::vector<std::byte> marked;
  REQUIRE(vision::detail::add_restart_markers(encode(src, TJSAMP_420), 1, marked) ==
          vision::detail::RestartOutcome::marked);
  const auto layout = vision::detail::scan_restart_layout(marked);
  REQUIRE(layout.has_value());
  struct Restore {
    ~Restore() { vision::set_max_image_pixels(vision::default_max_image_pixels); }
  } restore;
  vision::set_max_image_pixels(259 * 203 - 1);
  const auto bomb =
      doctest::Contains("image size 259x203 (52577 pixels) exceeds the limit of 52576 pixels");
  const std::uint64_t before = vision::detail::restart_region_decodes();
  for (const int d : {1, 8}) {
    CAPTURE(d);
    CHECK_THROWS_WITH_AS(
        (void)vision::decode_resized_crop(marked, vision::CropBox{0, 0, 40, 40}, 10, 10, d), bomb,
        vision::DecompressionBombError);
  }
  std::vector<std::uint8_t> buffer;
  CHECK_FALSE(
      vision::detail::decode_restart_region(marked, *layout, 0, 0, 40, 40, buffer, 1).has_value());
  CHECK(buffer.empty());
  CHECK(vision::detail::restart_region_decodes() == before);
  // At the limit, the crop decodes through the intervals.
  vision::set_max_image_pixels(259 * 203);
  CHECK(vision::detail::decode_restart_region(marked, *layout, 0, 0, 40, 40, buffer, 1)
            .has_value());
}

}  // TEST_SUITE

}  // namespace coload

