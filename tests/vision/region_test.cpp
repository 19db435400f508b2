// The region decoder (lib/vision/jpeg_region.cpp) against the whole-image decode, pixel for
// pixel, at every crop offset that the MCU grid and libjpeg's skipping make distinct.

#include <doctest/doctest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/vision/decode.hpp"
#include "image_test_support.hpp"
#include "vision/jpeg_region.hpp"

namespace coload {
namespace {

struct Subsampling {
  const char* name;
  int tj;          // TurboJPEG's TJSAMP_*
  int mcu_width;   // pixels of an MCU at full size
  int mcu_height;  // and of an iMCU row
};

// Every subsampling TurboJPEG writes that libjpeg decodes into RGB, 4:4:0 (vertical only)
// included: encode_jpeg has no 4:4:0, so the test encodes through TurboJPEG itself.
constexpr Subsampling subsamplings[] = {
    {"4:4:4", TJSAMP_444, 8, 8},   {"4:2:2", TJSAMP_422, 16, 8}, {"4:2:0", TJSAMP_420, 16, 16},
    {"4:4:0", TJSAMP_440, 8, 16},  {"gray", TJSAMP_GRAY, 8, 8},
};

std::vector<std::byte> encode(const vision::Image& image, int tj_subsampling) {
  tjhandle handle = tjInitCompress();
  if (!handle) throw std::runtime_error("tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, image.data.data(), image.width, image.width * 3,
                             image.height, TJPF_RGB, &out, &size, tj_subsampling, 90, 0);
  std::vector<std::byte> jpeg;
  if (rc == 0) {
    const auto* first = reinterpret_cast<const std::byte*>(out);
    jpeg.assign(first, first + size);
  }
  tjFree(out);
  tjDestroy(handle);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return jpeg;
}

struct Mismatch {
  int crops = 0;      // crops decoded
  int declined = 0;   // crops the region decoder declined
  int differing = 0;  // crops with any pixel unlike the whole decode's
  std::string first;  // the first of those, for the failure message
};

// Decodes the crop at (top, left) of height × width through the region decoder and compares
// it with the same pixels of `full` (the whole image at the same scale).
void compare(std::span<const std::byte> jpeg, const vision::ImageView& full, int top, int left,
             int height, int width, int denominator, std::vector<std::uint8_t>& buffer,
             Mismatch& m) {
  ++m.crops;
  const auto region = vision::detail::decode_jpeg_region(jpeg, top, left, height, width, buffer,
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
    CAPTURE(sub.name);
    const std::vector<std::byte> jpeg = encode(src, sub.tj);
    for (const int d : {1, 2, 4, 8}) {
      CAPTURE(d);
      std::vector<std::uint8_t> whole;
      const vision::ImageView full = vision::decode_into(jpeg, whole, d);
      REQUIRE(full.width == (131 + d - 1) / d);
      REQUIRE(full.height == (97 + d - 1) / d);
      const int row_span = std::min(full.height, 16 + 2 * std::max(1, sub.mcu_height / d));
      const int col_span = std::min(full.width, 16 + 2 * std::max(1, sub.mcu_width / d));
      std::vector<std::uint8_t> buffer;
      Mismatch m;
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
    }
  }
}

}  // TEST_SUITE

}  // namespace coload
