// vision tests: JPEG, PNG, WebP, TIFF, Netpbm and BMP decoding to RGB as PIL's convert('RGB')
// gives it.

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <malloc.h>

#include <ATen/CPUGeneratorImpl.h>
#include <webp/encode.h>

#include "coload/core/warning.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/recipe.hpp"
#include "coload/vision/transforms.hpp"
#include "image_test_support.hpp"
#include "vision/jpeg_region.hpp"
#include "vision/jpeg_restart.hpp"

namespace vision = coload::vision;
using coload::InvalidArgument;
using vision::CropBox;
using vision::DecodeError;
using vision::DecompressionBombError;
using vision::DefaultImageLoader;
using vision::EvalTransform;
using vision::TrainTransform;
using vision::Image;
using vision::test::TempDir;

namespace {

std::span<const std::byte> bytes(const std::vector<std::uint8_t>& v) {
  return vision::as_bytes_span(v);
}

std::vector<std::uint8_t> rgb_of(const Image& image) { return image.data; }

// Pillow's CMYK -> RGB for the stored (Adobe-inverted) values of a JPEG.
int pil_cmyk_channel(int stored, int stored_k) {
  const int t = (255 - stored) * stored_k + 128;
  return stored_k - (((t >> 8) + t) >> 8);
}

}  // namespace

TEST_SUITE("vision") {

TEST_CASE("peek reads JPEG and PNG sizes without decoding") {
  const auto jpeg = vision::test::synthetic_jpeg(123, 45, 1);
  const auto info = vision::peek(jpeg);
  CHECK(info.format == vision::ImageFormat::jpeg);
  CHECK(info.width == 123);
  CHECK(info.height == 45);

  const auto png = vision::test::make_png(7, 3, 8, 0, std::vector(3, std::vector<std::uint8_t>(7)));
  const auto png_info = vision::peek(bytes(png));
  CHECK(png_info.format == vision::ImageFormat::png);
  CHECK(png_info.width == 7);
  CHECK(png_info.height == 3);
}

TEST_CASE("a JPEG decodes at full size and at 1/2, 1/4 and 1/8 with libjpeg's rounded-up sizes") {
  const auto jpeg = vision::test::synthetic_jpeg(501, 333, 2);
  for (int d : {1, 2, 4, 8}) {
    CAPTURE(d);
    const Image img = vision::decode(jpeg, d);
    CHECK(img.channels == 3);
    CHECK(img.width == vision::jpeg_scaled_size(501, d));
    CHECK(img.height == vision::jpeg_scaled_size(333, d));
    CHECK(img.data.size() == static_cast<std::size_t>(img.width) * img.height * 3);
  }
  CHECK(vision::jpeg_scaled_size(501, 8) == 63);
  CHECK_THROWS_WITH_AS(vision::decode(jpeg, 3), "jpeg_scale_denominator must be 1, 2, 4 or 8, got 3",
                       std::invalid_argument);
}

TEST_CASE("a full-size JPEG decode stays close to the encoded pixels") {
  const Image src = vision::test::synthetic_image(64, 48, 3, 0);
  const auto jpeg = vision::encode_jpeg(src.view(), 100, vision::ChromaSubsampling::s444);
  const Image img = vision::decode(jpeg);
  CHECK(vision::test::psnr(img.data, src.data) > 40.0);
}

TEST_CASE("choose_jpeg_scale picks the largest reduction whose crop still covers the output") {
  CHECK(vision::choose_jpeg_scale(500, 375, 224, 224) == 1);
  CHECK(vision::choose_jpeg_scale(448, 448, 224, 224) == 2);
  CHECK(vision::choose_jpeg_scale(447, 1000, 224, 224) == 1);
  CHECK(vision::choose_jpeg_scale(900, 897, 224, 224) == 4);
  CHECK(vision::choose_jpeg_scale(1792, 1792, 224, 224) == 8);
  CHECK(vision::choose_jpeg_scale(4000, 4000, 224, 224) == 8);
  CHECK(vision::choose_jpeg_scale(100, 100, 224, 224) == 1);
  CHECK(vision::choose_jpeg_scale(683, 512, 341, 256) == 2);
}

TEST_CASE("decode_into reuses a large enough buffer") {
  const auto big = vision::test::synthetic_jpeg(200, 100, 4);
  const auto small = vision::test::synthetic_jpeg(50, 20, 5);
  std::vector<std::uint8_t> buffer;
  const auto v1 = vision::decode_into(big, buffer);
  CHECK(v1.width == 200);
  CHECK(v1.stride == 600);
  const auto* data = buffer.data();
  const auto v2 = vision::decode_into(small, buffer);
  CHECK(v2.width == 50);
  CHECK(v2.height == 20);
  CHECK(buffer.data() == data);
  CHECK(v2.data == data);
}

TEST_CASE("a grayscale JPEG becomes RGB with three equal channels") {
  Image gray = Image::zeros(40, 30, 1);
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 40; ++x) *gray.pixel(x, y) = static_cast<std::uint8_t>(x * 6 + y);
  const auto jpeg = vision::encode_jpeg(gray.view(), 100);
  const Image img = vision::decode(jpeg);
  REQUIRE(img.channels == 3);
  int max_error = 0;
  for (int y = 0; y < 30; ++y) {
    for (int x = 0; x < 40; ++x) {
      const auto* p = img.pixel(x, y);
      CHECK(p[0] == p[1]);
      CHECK(p[1] == p[2]);
      max_error = std::max(max_error, std::abs(p[0] - *gray.pixel(x, y)));
    }
  }
  CHECK(max_error <= 3);
}

TEST_CASE("the region decoder gives a crop's pixels as the full decode does, and declines what "
          "it does not handle") {
  // The pipelines fall back to a whole-image decode wherever the region decoder declines, with
  // the same pixels, so only this test sees it decline what it should handle: built against
  // another libjpeg ABI's jconfig.h than the libjpeg.so.62 it runs with (a GPU machine's
  // system headers), every region decode failed and nothing else noticed.
  std::vector<std::string> warnings;
  struct RestoreHandler {
    ~RestoreHandler() { coload::set_warning_handler({}); }
  } restore;  // also when a REQUIRE below ends the test
  coload::set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  coload::detail::forget_warnings();
  const Image src = vision::test::synthetic_image(301, 203, 9);
  struct Crop {
    int top, left, height, width;
  };
  for (const auto sub : {vision::ChromaSubsampling::s420, vision::ChromaSubsampling::s422,
                         vision::ChromaSubsampling::s444, vision::ChromaSubsampling::gray}) {
    CAPTURE(static_cast<int>(sub));
    const auto jpeg = vision::encode_jpeg(src.view(), 90, sub);
    const Image full = vision::decode(jpeg);
    REQUIRE(full.channels == 3);
    std::vector<std::uint8_t> buffer;
    for (const Crop c : {Crop{0, 0, 203, 301}, Crop{37, 51, 100, 120}, Crop{150, 250, 53, 51},
                         Crop{101, 7, 1, 1}}) {
      CAPTURE(c.top);
      CAPTURE(c.left);
      const auto region = coload::vision::detail::decode_jpeg_region(
          jpeg, c.top, c.left, c.height, c.width, buffer);
      REQUIRE(region.has_value());
      REQUIRE(region->x0 <= c.left);
      REQUIRE(region->y0 <= c.top);
      REQUIRE(region->x0 + region->width >= c.left + c.width);
      REQUIRE(region->y0 + region->height >= c.top + c.height);
      int differing_rows = 0;
      for (int y = c.top; y < c.top + c.height; ++y) {
        const std::uint8_t* got = region->pixels + (y - region->y0) * region->stride +
                                  (c.left - region->x0) * 3;
        differing_rows += std::memcmp(got, full.pixel(c.left, y), std::size_t(c.width) * 3) != 0;
      }
      CHECK(differing_rows == 0);
    }
    // A crop reaching outside the image is declined (the caller's full decode says why).
    std::vector<std::uint8_t> unused;
    CHECK_FALSE(coload::vision::detail::decode_jpeg_region(jpeg, 200, 0, 4, 10, unused));
    CHECK_FALSE(coload::vision::detail::decode_jpeg_region(jpeg, 0, 300, 10, 2, unused));
  }
  // CMYK and progressive JPEGs are declined (the latter decodes whole, as the check below
  // shows, so only the decline itself is asked of the region decoder).
  Image cmyk = Image::zeros(16, 16, 4);
  const auto cmyk_jpeg = vision::encode_jpeg(cmyk.view(), 90, vision::ChromaSubsampling::s444);
  std::vector<std::uint8_t> buffer;
  CHECK_FALSE(coload::vision::detail::decode_jpeg_region(cmyk_jpeg, 0, 0, 8, 8, buffer));
  const auto progressive = vision::test::progressive_jpeg(64, 48, 3);
  CHECK(vision::decode(progressive).width == 64);
  CHECK_FALSE(coload::vision::detail::decode_jpeg_region(progressive, 0, 0, 8, 8, buffer));
  // Declining what it does not handle is silent: the warning is for a libjpeg that refuses to
  // start at all (headers of another libjpeg).
  coload::set_warning_handler({});
  CHECK(warnings.empty());
}

TEST_CASE("a CMYK JPEG is read as Adobe-inverted and converted as Pillow converts CMYK") {
  const int c = 30, m = 100, y = 200, k = 180;
  Image cmyk = Image::zeros(16, 16, 4);
  for (int i = 0; i < 16 * 16; ++i) {
    std::uint8_t* p = cmyk.data.data() + 4 * i;
    p[0] = c; p[1] = m; p[2] = y; p[3] = k;
  }
  const auto jpeg = vision::encode_jpeg(cmyk.view(), 100, vision::ChromaSubsampling::s444);
  const Image img = vision::decode(jpeg);
  REQUIRE(img.channels == 3);
  // k - round((255 - stored) * k / 255): 180 - 159 = 21, 180 - 109 = 71, 180 - 39 = 141.
  CHECK(pil_cmyk_channel(c, k) == 21);
  CHECK(pil_cmyk_channel(m, k) == 71);
  CHECK(pil_cmyk_channel(y, k) == 141);
  const auto* p = img.pixel(8, 8);
  CHECK(std::abs(p[0] - 21) <= 2);
  CHECK(std::abs(p[1] - 71) <= 2);
  CHECK(std::abs(p[2] - 141) <= 2);
}

TEST_CASE("JPEG decodes equal PIL's convert('RGB') byte for byte (RGB, gray, CMYK)" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  struct Case {
    std::string name;
    std::vector<std::byte> jpeg;
  };
  std::vector<Case> cases;
  cases.push_back({"rgb420", vision::test::synthetic_jpeg(173, 131, 6)});
  cases.push_back({"rgb444", vision::encode_jpeg(vision::test::synthetic_image(64, 80, 7).view(), 85,
                                                 vision::ChromaSubsampling::s444)});
  Image gray = Image::zeros(50, 37, 1);
  for (std::size_t i = 0; i < gray.data.size(); ++i) gray.data[i] = static_cast<std::uint8_t>(i * 7);
  cases.push_back({"gray", vision::encode_jpeg(gray.view(), 90)});
  Image cmyk = Image::zeros(33, 21, 4);
  for (std::size_t i = 0; i < cmyk.data.size(); ++i) cmyk.data[i] = static_cast<std::uint8_t>(i * 13 + i / 4);
  cases.push_back({"cmyk", vision::encode_jpeg(cmyk.view(), 90, vision::ChromaSubsampling::s444)});

  std::string commands;
  for (const auto& c : cases) {
    vision::test::write_bytes(dir / (c.name + ".jpg"), c.jpeg);
    commands += "decode " + (dir / (c.name + ".jpg")).string() + " " +
                (dir / (c.name + ".rgb")).string() + "\n";
  }
  const auto result = vision::test::run_reference(dir, commands);
  REQUIRE(result == vision::test::Reference::ok);
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const Image img = vision::decode(c.jpeg);
    CHECK(rgb_of(img) == vision::test::read_bytes(dir / (c.name + ".rgb")));
  }
}

TEST_CASE("PNGs convert to RGB as PIL's convert('RGB') does") {
  using vision::test::make_png;
  auto decode_row = [](const std::vector<std::uint8_t>& png) {
    const Image img = vision::decode(vision::as_bytes_span(png));
    REQUIRE(img.height == 1);
    return img.data;
  };
  using Bytes = std::vector<std::uint8_t>;
  SUBCASE("8-bit RGB is unchanged") {
    CHECK(decode_row(make_png(2, 1, 8, 2, {{1, 2, 3, 250, 251, 252}})) == Bytes{1, 2, 3, 250, 251, 252});
  }
  SUBCASE("8-bit gray repeats into three channels") {
    CHECK(decode_row(make_png(2, 1, 8, 0, {{7, 200}})) == Bytes{7, 7, 7, 200, 200, 200});
  }
  SUBCASE("RGBA drops alpha without compositing") {
    CHECK(decode_row(make_png(2, 1, 8, 6, {{10, 20, 30, 0, 40, 50, 60, 128}})) ==
          Bytes{10, 20, 30, 40, 50, 60});
  }
  SUBCASE("gray with alpha drops alpha") {
    CHECK(decode_row(make_png(2, 1, 8, 4, {{10, 20, 30, 0}})) == Bytes{10, 10, 10, 30, 30, 30});
  }
  SUBCASE("16-bit RGB keeps the high byte") {
    CHECK(decode_row(make_png(2, 1, 16, 2, {{0x12, 0x34, 0x80, 0xff, 0xff, 0xff, 0x00, 0xff, 0x01, 0x00, 0x7f, 0x80}})) ==
          Bytes{0x12, 0x80, 0xff, 0x00, 0x01, 0x7f});
  }
  SUBCASE("16-bit gray is clamped to 255, as Pillow's mode I converts") {
    CHECK(decode_row(make_png(3, 1, 16, 0, {{0x00, 0x80, 0x01, 0x00, 0xff, 0xff}})) ==
          Bytes{128, 128, 128, 255, 255, 255, 255, 255, 255});
  }
  SUBCASE("16-bit gray with alpha keeps the gray's high byte") {
    CHECK(decode_row(make_png(2, 1, 16, 4, {{0x00, 0x80, 0x12, 0x34, 0x12, 0x34, 0, 0}})) ==
          Bytes{0, 0, 0, 0x12, 0x12, 0x12});
  }
  SUBCASE("16-bit RGBA keeps the high byte and drops alpha") {
    CHECK(decode_row(make_png(1, 1, 16, 6, {{0x12, 0x34, 0x80, 0xff, 0xff, 0xff, 0, 1}})) ==
          Bytes{0x12, 0x80, 0xff});
  }
  SUBCASE("2-bit gray scales to 0, 85, 170, 255") {
    CHECK(decode_row(make_png(4, 1, 2, 0, {{0b00011011}})) ==
          Bytes{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255});
  }
  SUBCASE("1-bit gray is black and white") {
    CHECK(decode_row(make_png(4, 1, 1, 0, {{0b10100000}})) ==
          Bytes{255, 255, 255, 0, 0, 0, 255, 255, 255, 0, 0, 0});
  }
  SUBCASE("a palette is looked up") {
    CHECK(decode_row(make_png(2, 1, 8, 3, {{1, 0}}, {1, 2, 3, 4, 5, 6})) == Bytes{4, 5, 6, 1, 2, 3});
  }
}

TEST_CASE("bad data gives a DecodeError that says what went wrong") {
  const auto jpeg = vision::test::synthetic_jpeg(160, 120, 8);
  SUBCASE("zero bytes") {
    CHECK_THROWS_WITH_AS(vision::decode({}), "empty data (0 bytes): not an image", DecodeError);
    CHECK_THROWS_WITH_AS(vision::peek({}), "empty data (0 bytes): not an image", DecodeError);
  }
  SUBCASE("no known signature") {
    const std::vector<std::uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text)),
                         "unknown image format: the data starts with the signature of none of "
                         "JPEG, PNG, WebP, TIFF, Netpbm (P1-P6) or BMP (5 bytes)",
                         DecodeError);
  }
  SUBCASE("a JPEG cut in half") {
    const auto half = std::span(jpeg).first(jpeg.size() / 2);
    CHECK(vision::peek(half).width == 160);
    // The handle is usable again after the failure.
    CHECK(vision::decode(jpeg).width == 160);
    CHECK_THROWS_WITH_AS(vision::decode(half), doctest::Contains("truncated JPEG data"), DecodeError);
    // A crop of the rows before the cut: before, it decoded without a word (libjpeg reads no
    // further than the crop's last row), where the whole image, and Pillow, say truncated.
    for (int d : {1, 2}) {
      CAPTURE(d);
      CHECK_THROWS_WITH_AS(vision::decode_resized_crop(half, CropBox{0, 0, 8, 40}, 8, 8, d),
                           doctest::Contains("truncated JPEG data"), DecodeError);
    }
    CHECK(vision::decode_resized_crop(jpeg, CropBox{0, 0, 8, 40}, 8, 8, 1).width == 8);
  }
  SUBCASE("a damaged JPEG cut in half") {
    // Damage early in the scan is a warning that libjpeg repairs (Pillow loads the file); the
    // cut's warning came second (or never: libjpeg reads no further than the damage), and
    // TurboJPEG keeps the first one's text only: before, the cut file decoded without a word.
    std::vector<std::byte> damaged(jpeg.begin(), jpeg.end());
    std::size_t sos = 0;
    for (std::size_t i = 2; i + 1 < damaged.size(); ++i) {
      if (damaged[i] == std::byte{0xff} && damaged[i + 1] == std::byte{0xda}) {
        sos = i;
        break;
      }
    }
    REQUIRE(sos > 0);
    const auto scan = sos + 2 + (std::to_integer<std::size_t>(damaged[sos + 2]) << 8) +
                      std::to_integer<std::size_t>(damaged[sos + 3]);
    // An RST marker in a scan without restart intervals: libjpeg warns "Corrupt JPEG data:
    // premature end of data segment" and fills the rest of the image.
    damaged[scan + 20] = std::byte{0xff};
    damaged[scan + 21] = std::byte{0xd0};
    CHECK(vision::decode(damaged).width == 160);  // repaired, as Pillow's
    const auto cut = std::span<const std::byte>(damaged).first(damaged.size() / 2);
    CHECK_THROWS_WITH_AS(vision::decode(cut), doctest::Contains("truncated JPEG data"), DecodeError);
  }
  SUBCASE("a JPEG cut inside its header") {
    const auto head = std::span(jpeg).first(40);
    CHECK_THROWS_WITH_AS(vision::decode(head), doctest::Contains("corrupt JPEG header: "), DecodeError);
    CHECK_THROWS_WITH_AS(vision::peek(head), doctest::Contains("corrupt JPEG header: "), DecodeError);
    CHECK(vision::peek(jpeg).height == 120);
    CHECK(vision::decode(jpeg).height == 120);
  }
  SUBCASE("a JPEG signature followed by garbage") {
    std::vector<std::uint8_t> garbage = {0xff, 0xd8, 0xff};
    for (int i = 0; i < 200; ++i) garbage.push_back(static_cast<std::uint8_t>(i * 37 + 11));
    CHECK_THROWS_WITH_AS(vision::decode(bytes(garbage)), doctest::Contains("corrupt JPEG"),
                         DecodeError);
  }
  SUBCASE("a PNG cut short") {
    const auto png = vision::test::make_png(16, 16, 8, 2, std::vector(16, std::vector<std::uint8_t>(48, 9)));
    const auto cut = std::span(png).first(png.size() - 20);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(cut)),
                         doctest::Contains("corrupt or truncated PNG data"), DecodeError);
  }
  SUBCASE("a PNG whose image data cannot hold its pixels is refused before they are allocated") {
    // Before: 243 MB allocated for a file of about 60 bytes, then libspng found no data.
    std::vector<std::uint8_t> kept;
    CHECK_THROWS_WITH_AS(vision::decode_into(bytes(vision::test::bomb_png(9000, 9000)), kept),
                         doctest::Contains("bytes of image data cannot hold 9000x9000 pixels"),
                         DecodeError);
    CHECK(kept.capacity() < 1000);
    // A well compressed image is not: 2000x2000 of one grey compresses about 1000:1.
    const auto flat = vision::test::make_png(
        2000, 2000, 8, 0, std::vector(2000, std::vector<std::uint8_t>(2000, 77)));
    CHECK(flat.size() < 2000 * 2000 / 200);
    const auto image = vision::decode(bytes(flat));
    CHECK(image.width == 2000);
    CHECK(image.data[3 * (2000 * 1999 + 1999)] == 77);
  }
  SUBCASE("a PNG with a damaged checksum") {
    auto png = vision::test::make_png(4, 4, 8, 0, std::vector(4, std::vector<std::uint8_t>(4, 9)));
    png[30] ^= 0xff;  // inside IHDR's CRC
    CHECK_THROWS_WITH_AS(vision::decode(bytes(png)),
                         doctest::Contains("corrupt or truncated PNG data"), DecodeError);
  }
  SUBCASE("a PNG signature without IHDR") {
    const std::vector<std::uint8_t> sig = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0};
    CHECK_THROWS_WITH_AS(vision::peek(bytes(sig)),
                         "corrupt PNG header: no IHDR chunk after the signature", DecodeError);
  }
}

TEST_CASE("decode_file names the path in its errors") {
  TempDir dir;
  const auto missing = dir / "missing.jpg";
  CHECK_THROWS_WITH_AS(vision::decode_file(missing),
                       ("cannot open " + missing.string() + ": No such file or directory").c_str(),
                       DecodeError);
  const auto empty = dir / "empty.jpg";
  vision::test::write_bytes(empty, std::string{});
  CHECK_THROWS_WITH_AS(vision::decode_file(empty),
                       (empty.string() + ": empty data (0 bytes): not an image").c_str(), DecodeError);
  const auto good = dir / "good.jpg";
  vision::test::write_bytes(good, vision::test::synthetic_jpeg(30, 20, 9));
  const Image img = vision::decode_file(good, 2);
  CHECK(img.width == 15);
  CHECK(img.height == 10);
}

TEST_CASE("a 1 KB image declaring 60000x60000 pixels is refused by every decode path, by name") {
  namespace vt = vision::test;
  TempDir dir;
  const auto jpeg = vt::bomb_jpeg(60000, 60000);
  const auto png_bytes = vt::bomb_png(60000, 60000);
  const auto png = bytes(png_bytes);
  REQUIRE(jpeg.size() < 1024);
  REQUIRE(png.size() < 1024);
  CHECK(vision::peek(jpeg).width == 60000);
  CHECK(vision::peek(png).height == 60000);
  CHECK(vision::max_image_pixels() == 89'478'485);
  const auto bomb = doctest::Contains(
      "image size 60000x60000 (3600000000 pixels) exceeds the limit of 89478485 pixels, could be "
      "a decompression bomb; raise the limit with coload::vision::set_max_image_pixels(n) (0: no "
      "limit)");
  for (const auto& [name, data] : {std::pair{"jpeg", jpeg}, std::pair{"png", std::vector<std::byte>(
                                                                   png.begin(), png.end())}}) {
    CAPTURE(name);
    for (int d : {1, 2, 4, 8}) {
      CHECK_THROWS_WITH_AS(vision::decode(data, d), bomb, DecompressionBombError);
    }
    std::vector<std::uint8_t> buffer;
    CHECK_THROWS_AS(vision::decode_into(data, buffer, 8), DecompressionBombError);
    CHECK(buffer.empty());
    // The crop helpers: region decode at scale 1, DCT-scaled decode at 1/8.
    for (int d : {1, 8}) {
      CHECK_THROWS_AS(vision::decode_resized_crop(data, CropBox{100, 100, 20000, 20000}, 224, 224, d),
                      DecompressionBombError);
    }
    for (bool dct : {true, false}) {
      at::Generator gen = at::detail::createCPUGenerator(1);
      std::vector<float> out(3 * 224 * 224);
      CHECK_THROWS_WITH_AS((TrainTransform{.dct_scaling = dct}(data, gen, out.data())), bomb,
                           DecompressionBombError);
      CHECK_THROWS_WITH_AS((EvalTransform{.dct_scaling = dct}(data, out.data())), bomb,
                           DecompressionBombError);
    }
    const auto file = dir / (std::string("bomb.") + name);
    vt::write_bytes(file, data);
    try {
      (void)vision::decode_file(file);
      FAIL("decode_file accepted a bomb");
    } catch (const DecompressionBombError& e) {
      CHECK(e.path() == file.string());
      CHECK(std::string(e.what()).starts_with(file.string() + ": image size 60000x60000"));
      CHECK(e.width() == 60000);
      CHECK(e.height() == 60000);
      CHECK(e.limit() == 89'478'485);
    }
    CHECK_THROWS_WITH_AS(DefaultImageLoader{}(file.string()),
                         doctest::Contains((file.string() + ": image size 60000x60000").c_str()),
                         DecompressionBombError);
  }
}

TEST_CASE("max_image_pixels is settable, 0 means no limit, and a negative value is refused") {
  const auto jpeg = vision::test::synthetic_jpeg(16, 16, 3);
  const auto png = vision::test::make_png(16, 16, 8, 0, std::vector(16, std::vector<std::uint8_t>(16, 9)));
  struct Restore {
    ~Restore() { vision::set_max_image_pixels(vision::default_max_image_pixels); }
  } restore;
  vision::set_max_image_pixels(255);
  CHECK_THROWS_WITH_AS(vision::decode(jpeg),
                       doctest::Contains("image size 16x16 (256 pixels) exceeds the limit of 255"),
                       DecompressionBombError);
  CHECK_THROWS_AS(vision::decode(bytes(png)), DecompressionBombError);
  vision::set_max_image_pixels(256);
  CHECK(vision::decode(jpeg).width == 16);
  CHECK(vision::decode(bytes(png)).width == 16);
  vision::set_max_image_pixels(0);
  CHECK(vision::max_image_pixels() == 0);
  CHECK(vision::decode(jpeg, 2).width == 8);
  CHECK_THROWS_WITH_AS(vision::set_max_image_pixels(-1),
                       "max_image_pixels must be >= 0 (0: no limit), got -1", InvalidArgument);
  CHECK(vision::max_image_pixels() == 0);
  // Without a limit, a header declaring more than 2^40 pixels is still refused before any size
  // is computed from it (16-bit P6: 6 bytes a pixel, 32-bit BMP: a 2^33-byte row stride).
  std::string ppm = "P6 2147483647 2147483647 65535\n";
  ppm.append(64, '\0');
  std::vector<std::uint8_t> buffer;
  CHECK_THROWS_WITH_AS(vision::decode_into(std::as_bytes(std::span(ppm)), buffer),
                       "image size 2147483647x2147483647 (4611686014132420609 pixels) exceeds 2^40 "
                       "pixels, the most any decode accepts whatever max_image_pixels() allows",
                       DecodeError);
  CHECK(buffer.empty());
  CHECK_NOTHROW(vision::check_image_pixels(1 << 20, 1 << 20));
  CHECK_THROWS_AS(vision::check_image_pixels((1 << 20) + 1, 1 << 20), DecodeError);
}

// ---- The other formats ImageFolder admits ---------------------------------------------------

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes text_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void put16(Bytes& b, unsigned v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}
void put32(Bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

struct BmpSpec {
  int width = 0;
  int height = 0;
  int bits = 24;
  std::uint32_t compression = 0;
  int header_size = 40;  // 12: the OS/2 core header, whose palette entries have 3 bytes
  bool top_down = false;
  std::vector<std::uint32_t> palette{};  // 0xRRGGBB
  std::vector<std::uint32_t> masks{};    // bitfields: after a 40-byte header, or inside a larger one
  Bytes pixels{};                        // the rows as stored
};

// A BMP file as a writer lays it out: file header, info header, masks, palette, pixels.
Bytes make_bmp(const BmpSpec& s) {
  Bytes info;
  if (s.header_size == 12) {
    put32(info, 12);
    put16(info, s.width);
    put16(info, s.height);
    put16(info, 1);
    put16(info, s.bits);
  } else {
    put32(info, s.header_size);
    put32(info, s.width);
    put32(info, s.top_down ? static_cast<std::uint32_t>(-s.height) : s.height);
    put16(info, 1);
    put16(info, s.bits);
    put32(info, s.compression);
    put32(info, static_cast<std::uint32_t>(s.pixels.size()));
    put32(info, 2835);
    put32(info, 2835);
    put32(info, static_cast<std::uint32_t>(s.palette.size()));
    put32(info, 0);
    if (s.header_size > 40) {
      for (std::size_t i = 0; i < 4; ++i) put32(info, i < s.masks.size() ? s.masks[i] : 0);
      info.resize(s.header_size, 0);
    } else {
      for (std::uint32_t m : s.masks) put32(info, m);
    }
  }
  for (std::uint32_t c : s.palette) {
    info.push_back(static_cast<std::uint8_t>(c));
    info.push_back(static_cast<std::uint8_t>(c >> 8));
    info.push_back(static_cast<std::uint8_t>(c >> 16));
    if (s.header_size != 12) info.push_back(0);
  }
  Bytes file = {'B', 'M'};
  put32(file, static_cast<std::uint32_t>(14 + info.size() + s.pixels.size()));
  put32(file, 0);
  put32(file, static_cast<std::uint32_t>(14 + info.size()));
  return concat(concat(file, info), s.pixels);
}

// A little-endian TIFF directory entry.
void tiff_entry(Bytes& b, unsigned tag, unsigned type, std::uint32_t count, std::uint32_t value) {
  put16(b, tag);
  put16(b, type);
  put32(b, count);
  put32(b, value);
}

// An uncompressed, one-strip RGB TIFF, little-endian.
Bytes make_tiff(const Image& rgb) {
  Bytes b = {'I', 'I', 42, 0};
  put32(b, 8);
  const std::uint32_t entries = 9;
  const std::uint32_t bits_at = 8 + 2 + entries * 12 + 4;
  const std::uint32_t data_at = bits_at + 6;
  put16(b, entries);
  const std::uint32_t size = static_cast<std::uint32_t>(rgb.data.size());
  tiff_entry(b, 256, 4, 1, rgb.width);
  tiff_entry(b, 257, 4, 1, rgb.height);
  tiff_entry(b, 258, 3, 3, bits_at);
  tiff_entry(b, 259, 3, 1, 1);
  tiff_entry(b, 262, 3, 1, 2);
  tiff_entry(b, 273, 4, 1, data_at);
  tiff_entry(b, 277, 3, 1, 3);
  tiff_entry(b, 278, 4, 1, rgb.height);
  tiff_entry(b, 279, 4, 1, size);
  put32(b, 0);
  for (int i = 0; i < 3; ++i) put16(b, 8);
  return concat(b, rgb.data);
}

// An uncompressed RGB TIFF of `tile` x `tile` tiles, little-endian; the tiles past the image's
// edge padded with zeros, as libtiff's TIFFWriteTile writes them.
Bytes make_tiled_tiff(const Image& rgb, int tile) {
  const int across = (rgb.width + tile - 1) / tile, down = (rgb.height + tile - 1) / tile;
  const auto tiles = static_cast<std::uint32_t>(across * down);
  const auto tile_bytes = static_cast<std::uint32_t>(tile * tile * 3);
  Bytes b = {'I', 'I', 42, 0};
  put32(b, 8);
  const std::uint32_t entries = 10;
  const std::uint32_t bits_at = 8 + 2 + entries * 12 + 4;
  // One tile's offset and byte count lie in their entries themselves, as TIFF says of a value
  // of 4 bytes or fewer; more go in arrays after the bits per sample.
  const std::uint32_t arrays = tiles > 1 ? tiles : 0;
  const std::uint32_t offsets_at = bits_at + 6, counts_at = offsets_at + 4 * arrays;
  const std::uint32_t data_at = counts_at + 4 * arrays;
  put16(b, entries);
  tiff_entry(b, 256, 4, 1, static_cast<std::uint32_t>(rgb.width));
  tiff_entry(b, 257, 4, 1, static_cast<std::uint32_t>(rgb.height));
  tiff_entry(b, 258, 3, 3, bits_at);
  tiff_entry(b, 259, 3, 1, 1);
  tiff_entry(b, 262, 3, 1, 2);
  tiff_entry(b, 277, 3, 1, 3);
  tiff_entry(b, 322, 4, 1, static_cast<std::uint32_t>(tile));
  tiff_entry(b, 323, 4, 1, static_cast<std::uint32_t>(tile));
  tiff_entry(b, 324, 4, tiles, tiles > 1 ? offsets_at : data_at);
  tiff_entry(b, 325, 4, tiles, tiles > 1 ? counts_at : tile_bytes);
  put32(b, 0);
  for (int i = 0; i < 3; ++i) put16(b, 8);
  for (std::uint32_t t = 0; t < arrays; ++t) put32(b, data_at + t * tile_bytes);
  for (std::uint32_t t = 0; t < arrays; ++t) put32(b, tile_bytes);
  for (int ty = 0; ty < down; ++ty) {
    for (int tx = 0; tx < across; ++tx) {
      for (int y = ty * tile; y < (ty + 1) * tile; ++y) {
        for (int x = tx * tile; x < (tx + 1) * tile; ++x) {
          for (int c = 0; c < 3; ++c) {
            const bool inside = x < rgb.width && y < rgb.height;
            b.push_back(inside ? rgb.data[static_cast<std::size_t>((y * rgb.width + x) * 3 + c)] : 0);
          }
        }
      }
    }
  }
  return b;
}

// A 64x64 grey TIFF of 8 deflate strips of 8 rows (row r is grey 4r); strip `bad`'s bytes, if
// any, replaced by as many bytes of garbage.
Bytes make_deflate_tiff(int bad = -1) {
  const int width = 64, rows = 8, strips = 8;
  std::vector<Bytes> data;
  for (int s = 0; s < strips; ++s) {
    Bytes raw;
    for (int i = 0; i < width * rows; ++i) raw.push_back(static_cast<std::uint8_t>((s * rows + i / width) * 4));
    uLongf n = compressBound(static_cast<uLong>(raw.size()));
    Bytes z(n);
    REQUIRE(compress(z.data(), &n, raw.data(), static_cast<uLong>(raw.size())) == Z_OK);
    z.resize(n);
    if (s == bad) std::fill(z.begin(), z.end(), std::uint8_t{0x5a});
    data.push_back(std::move(z));
  }
  Bytes b = {'I', 'I', 42, 0};
  put32(b, 8);
  const std::uint32_t entries = 8;
  const std::uint32_t offsets_at = 8 + 2 + entries * 12 + 4, counts_at = offsets_at + 4 * strips;
  put16(b, entries);
  tiff_entry(b, 256, 4, 1, width);
  tiff_entry(b, 257, 4, 1, rows * strips);
  tiff_entry(b, 258, 3, 1, 8);
  tiff_entry(b, 259, 3, 1, 8);  // deflate
  tiff_entry(b, 262, 3, 1, 1);  // black is zero
  tiff_entry(b, 273, 4, strips, offsets_at);
  tiff_entry(b, 278, 4, 1, rows);
  tiff_entry(b, 279, 4, strips, counts_at);
  put32(b, 0);
  std::uint32_t at = counts_at + 4 * strips;
  for (const Bytes& z : data) {
    put32(b, at);
    at += static_cast<std::uint32_t>(z.size());
  }
  for (const Bytes& z : data) put32(b, static_cast<std::uint32_t>(z.size()));
  for (const Bytes& z : data) b.insert(b.end(), z.begin(), z.end());
  return b;
}

// A 5x2 one-sample 16-bit TIFF, a strip a row, little-endian: 0, 1, 255, 256, 65535; 128,
// 300, 32767, 32768 (-32768 signed), 65280 (-256 signed).
Bytes make_gray16_tiff(unsigned photometric, unsigned sample_format) {
  const std::vector<std::uint16_t> samples = {0, 1, 255, 256, 65535, 128, 300, 32767, 32768, 65280};
  Bytes b = {'I', 'I', 42, 0};
  put32(b, 8);
  const std::uint32_t entries = 10;
  const std::uint32_t offsets_at = 8 + 2 + entries * 12 + 4, counts_at = offsets_at + 8;
  const std::uint32_t data_at = counts_at + 8;
  put16(b, entries);
  tiff_entry(b, 256, 4, 1, 5);
  tiff_entry(b, 257, 4, 1, 2);
  tiff_entry(b, 258, 3, 1, 16);
  tiff_entry(b, 259, 3, 1, 1);
  tiff_entry(b, 262, 3, 1, photometric);
  tiff_entry(b, 273, 4, 2, offsets_at);
  tiff_entry(b, 277, 3, 1, 1);
  tiff_entry(b, 278, 4, 1, 1);
  tiff_entry(b, 279, 4, 2, counts_at);
  tiff_entry(b, 339, 3, 1, sample_format);
  put32(b, 0);
  put32(b, data_at);
  put32(b, data_at + 10);
  put32(b, 10);
  put32(b, 10);
  for (std::uint16_t v : samples) put16(b, v);
  return b;
}

Bytes make_webp_lossless(const Image& rgb) {
  std::uint8_t* out = nullptr;
  const std::size_t n = WebPEncodeLosslessRGB(rgb.data.data(), rgb.width, rgb.height, rgb.width * 3, &out);
  REQUIRE(n > 0);
  Bytes b(out, out + n);
  WebPFree(out);
  return b;
}

Bytes make_ppm(const Image& rgb) {
  return concat(text_bytes("P6\n" + std::to_string(rgb.width) + " " + std::to_string(rgb.height) + "\n255\n"),
                rgb.data);
}

// The same pixels as a bottom-up 24-bit BMP (BGR rows padded to 4 bytes).
Bytes make_bmp24(const Image& rgb) {
  BmpSpec s{.width = rgb.width, .height = rgb.height};
  const std::size_t stride = (static_cast<std::size_t>(rgb.width) * 3 + 3) / 4 * 4;
  for (int y = rgb.height - 1; y >= 0; --y) {
    const std::uint8_t* row = rgb.data.data() + static_cast<std::size_t>(y) * rgb.width * 3;
    for (int x = 0; x < rgb.width; ++x) {
      s.pixels.insert(s.pixels.end(), {row[3 * x + 2], row[3 * x + 1], row[3 * x]});
    }
    s.pixels.resize(s.pixels.size() + stride - rgb.width * 3, 0);
  }
  return make_bmp(s);
}

Bytes decoded(const Bytes& file) {
  const Image img = vision::decode(bytes(file));
  REQUIRE(img.channels == 3);
  return img.data;
}

Bytes gray3(std::initializer_list<int> values) {
  Bytes out;
  for (int v : values) out.insert(out.end(), 3, static_cast<std::uint8_t>(v));
  return out;
}

}  // namespace

TEST_CASE("Netpbm images decode to their samples, rescaled as Pillow rescales them") {
  SUBCASE("P6 and P5 at maxval 255 are the bytes; gray repeats into three channels") {
    CHECK(decoded(concat(text_bytes("P6\n2 1\n255\n"), Bytes{1, 2, 3, 250, 251, 252})) ==
          Bytes{1, 2, 3, 250, 251, 252});
    CHECK(decoded(concat(text_bytes("P5 3 1 255 "), Bytes{0, 7, 255})) == gray3({0, 7, 255}));
  }
  SUBCASE("header comments are dropped, even inside a token") {
    CHECK(decoded(concat(text_bytes("P5\n# made by hand\n2# width\n 1\n2#five\n55\n"), Bytes{9, 10})) ==
          gray3({9, 10}));
  }
  SUBCASE("plain P3 and P2, comments between samples") {
    CHECK(decoded(text_bytes("P3\n# c\n2 1\n255\n1 2 3 # x\n 250 251\n252\n")) ==
          Bytes{1, 2, 3, 250, 251, 252});
    CHECK(decoded(text_bytes("P2 4 1 4 0 1 2 4")) == gray3({0, 64, 128, 255}));
  }
  SUBCASE("maxval below 255 rescales with round(v / maxval * 255)") {
    CHECK(decoded(concat(text_bytes("P5 4 1 4\n"), Bytes{0, 1, 3, 4})) == gray3({0, 64, 191, 255}));
    CHECK(decoded(concat(text_bytes("P6 1 1 2\n"), Bytes{0, 1, 2})) == Bytes{0, 128, 255});
  }
  SUBCASE("16-bit RGB rescales to 0..255; 16-bit gray is Pillow's mode I, clamped at 255") {
    CHECK(decoded(concat(text_bytes("P6 1 1 1000\n"), Bytes{0, 1, 0x01, 0xf4, 0x03, 0xe8})) ==
          Bytes{0, 128, 255});
    CHECK(decoded(concat(text_bytes("P5 4 1 65535\n"), Bytes{0, 100, 0, 255, 1, 0, 255, 255})) ==
          gray3({100, 255, 255, 255}));
    // maxval 1000: 1 -> round(65.535) = 66 in 0..65535, 4 -> 262, clamped.
    CHECK(decoded(concat(text_bytes("P5 2 1 1000\n"), Bytes{0, 1, 0, 4})) == gray3({66, 255}));
  }
  SUBCASE("P4 and P1 are bitmaps whose 1 is black") {
    CHECK(decoded(concat(text_bytes("P4\n10 2\n"), Bytes{0b10100000, 0b01000000, 0xff, 0xc0})) ==
          gray3({0, 255, 0, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
    CHECK(decoded(text_bytes("P1\n3 2\n1 0 1\n010")) == gray3({0, 255, 0, 255, 0, 255}));
  }
  CHECK(vision::peek(bytes(text_bytes("P6 640 480 255\n"))).format == vision::ImageFormat::pnm);
  CHECK(vision::peek(bytes(text_bytes("P6 640 480 255\n"))).width == 640);
}

TEST_CASE("BMPs decode at every depth Pillow reads, bottom-up or top-down, raw or RLE") {
  SUBCASE("24-bit rows are bottom-up BGR, padded to 4 bytes") {
    BmpSpec s{.width = 1, .height = 2};
    s.pixels = {3, 2, 1, 0, 6, 5, 4, 0};
    CHECK(decoded(make_bmp(s)) == Bytes{4, 5, 6, 1, 2, 3});
    s.top_down = true;
    CHECK(decoded(make_bmp(s)) == Bytes{1, 2, 3, 4, 5, 6});
  }
  SUBCASE("8-, 4- and 1-bit palettes; indices past the palette read as gray") {
    BmpSpec s{.width = 3, .height = 1, .bits = 8, .palette = {0x102030, 0x405060}};
    s.pixels = {1, 0, 200, 0};
    CHECK(decoded(make_bmp(s)) == Bytes{0x40, 0x50, 0x60, 0x10, 0x20, 0x30, 200, 200, 200});
    s.bits = 4;
    s.pixels = {0x10, 0x10, 0, 0};
    CHECK(decoded(make_bmp(s)) == Bytes{0x40, 0x50, 0x60, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60});
    s.bits = 1;
    s.pixels = {0b10100000, 0, 0, 0};
    CHECK(decoded(make_bmp(s)) == Bytes{0x40, 0x50, 0x60, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60});
  }
  SUBCASE("the OS/2 core header has 3-byte palette entries") {
    BmpSpec s{.width = 2, .height = 1, .bits = 8, .header_size = 12, .palette = {0x0a0b0c, 0x0d0e0f}};
    s.pixels = {1, 0, 0, 0};
    CHECK(decoded(make_bmp(s)) == Bytes{0x0d, 0x0e, 0x0f, 0x0a, 0x0b, 0x0c});
  }
  SUBCASE("16-bit 5-5-5 (the default) and 5-6-5 bitfields scale as Pillow's unpackers do") {
    BmpSpec s{.width = 2, .height = 1, .bits = 16};
    s.pixels = {0xff, 0x7f, 0x21, 0x04};  // 0x7fff; 0x0421: r 1, g 1, b 1
    CHECK(decoded(make_bmp(s)) == Bytes{255, 255, 255, 8, 8, 8});
    s.compression = 3;
    s.masks = {0xf800, 0x7e0, 0x1f};
    s.pixels = {0xff, 0xff, 0x41, 0x08};  // 0xffff; 0x0841: r 1, g 2, b 1
    CHECK(decoded(make_bmp(s)) == Bytes{255, 255, 255, 8, 8, 8});
  }
  SUBCASE("32-bit: BGRX raw, and an RGBA bitfield layout in a V5 header; alpha dropped") {
    BmpSpec s{.width = 1, .height = 1, .bits = 32};
    s.pixels = {3, 2, 1, 9};
    CHECK(decoded(make_bmp(s)) == Bytes{1, 2, 3});
    s.header_size = 124;
    s.compression = 3;
    s.masks = {0xff, 0xff00, 0xff0000, 0xff000000};
    CHECK(decoded(make_bmp(s)) == Bytes{3, 2, 1});
    s.masks = {0xff00, 0xff, 0xff0000, 0};
    CHECK_THROWS_WITH_AS(vision::decode(bytes(make_bmp(s))), "unsupported BMP bitfields layout",
                         DecodeError);
  }
  SUBCASE("RLE8: runs, an absolute run padded to a word, end of line, end of bitmap") {
    BmpSpec s{.width = 4, .height = 2, .bits = 8, .compression = 1, .palette = {0, 0x111111, 0x222222, 0x333333}};
    // Bottom row: 1 x index 1, then an absolute run (3, 2, 1) and its pad byte, end of line (a
    // full row: nothing to fill); top row: 1 x index 3, end of line (the rest is index 0), end.
    s.pixels = {1, 1, 0, 3, 3, 2, 1, 0, 0, 0, 1, 3, 0, 0, 0, 1};
    CHECK(decoded(make_bmp(s)) == gray3({0x33, 0, 0, 0, 0x11, 0x33, 0x22, 0x11}));
  }
  SUBCASE("RLE4 alternates the two nibbles of a run") {
    BmpSpec s{.width = 3, .height = 1, .bits = 4, .compression = 2, .palette = {0, 0x111111, 0x222222}};
    s.pixels = {3, 0x12, 0, 1};
    CHECK(decoded(make_bmp(s)) == gray3({0x11, 0x22, 0x11}));
  }
}

TEST_CASE("bad Netpbm, BMP, TIFF and WebP data gives a DecodeError naming the format and the fault") {
  const Image img = vision::test::synthetic_image(8, 6, 3);
  SUBCASE("Netpbm") {
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P6 4 4 255\n\x01\x02"))),
                         "corrupt or truncated Netpbm data: the body is shorter than its samples", DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P6 4 3 "))),
                         "corrupt or truncated Netpbm data: the header ends before its maxval", DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P5 4 x 255 "))),
                         "corrupt or truncated Netpbm data: bad height 'x'", DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P5 1 1 70000 \x01"))),
                         "corrupt or truncated Netpbm data: maxval must be greater than 0 and less than 65536, got 70000",
                         DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P2 2 1 9 3 10"))),
                         "corrupt or truncated Netpbm data: sample 10 exceeds maxval 9", DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text_bytes("P2 2 1 9 3 "))),
                         "corrupt or truncated Netpbm data: 1 of 2 samples", DecodeError);
    // Before, a header's pixels were allocated before its body was measured: 243 MB here, for
    // a file of 21 bytes.
    std::vector<std::uint8_t> kept;
    CHECK_THROWS_WITH_AS(vision::decode_into(bytes(text_bytes("P6 9000 9000 255\n\x01\x02")), kept),
                         "corrupt or truncated Netpbm data: the body is shorter than its samples",
                         DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode_into(bytes(text_bytes("P3 9000 9000 255\n1 2 3")), kept),
                         "corrupt or truncated Netpbm data: the body's 5 bytes cannot hold its "
                         "243000000 samples",
                         DecodeError);
    CHECK(kept.capacity() < 1000);
  }
  SUBCASE("BMP") {
    const Bytes bmp = make_bmp24(img);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(std::span(bmp).first(bmp.size() - 10))),
                         "corrupt or truncated BMP data: the pixel data is shorter than its 6 rows", DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(std::span(bmp).first(30))),
                         "corrupt or truncated BMP data: the header is cut short", DecodeError);
    Bytes odd = bmp;
    odd[28] = 7;  // bits per pixel
    CHECK_THROWS_WITH_AS(vision::decode(bytes(odd)), "unsupported BMP pixel depth (7)", DecodeError);
    Bytes v2 = bmp;
    v2[14] = 52;  // header size
    CHECK_THROWS_WITH_AS(vision::decode(bytes(v2)), "unsupported BMP header type (52)", DecodeError);
    BmpSpec rle{.width = 4, .height = 2, .bits = 8, .compression = 1, .palette = {0}};
    rle.pixels = {2, 0, 0, 5, 1};  // an absolute run of 5 with one byte left
    CHECK_THROWS_WITH_AS(vision::decode(bytes(make_bmp(rle))),
                         "corrupt or truncated BMP data: an RLE run is cut short", DecodeError);
    // An RLE header's raster is allocated only once its data covers it (before: 243 MB of
    // `kept`, and 81 MB of indices, for a file of 58 bytes).
    std::vector<std::uint8_t> kept;
    BmpSpec huge{.width = 9000, .height = 9000, .bits = 8, .compression = 1, .palette = {0}};
    for (const Bytes& data : {Bytes{}, Bytes{0, 0, 0, 0}, Bytes{0, 1, 0, 0}}) {
      // no data; two ends of line; an end of bitmap, then two bytes
      huge.pixels = data;
      CHECK_THROWS_WITH_AS(vision::decode_into(bytes(make_bmp(huge)), kept),
                           "corrupt or truncated BMP data: the RLE data ends before the image does",
                           DecodeError);
    }
    huge.bits = 4;
    huge.compression = 2;
    huge.pixels = {};
    CHECK_THROWS_WITH_AS(vision::decode_into(bytes(make_bmp(huge)), kept),
                         "corrupt or truncated BMP data: the RLE data ends before the image does",
                         DecodeError);
    CHECK(kept.capacity() < 1000);
    // An end of bitmap before the last pixel is refused, as Pillow 9.4 refuses it ("not enough
    // image data"); it decoded before, the rest of the image black.
    BmpSpec early{.width = 4, .height = 2, .bits = 8, .compression = 1, .palette = {0}};
    early.pixels = {1, 5, 0, 1, 0, 0};
    CHECK_THROWS_WITH_AS(vision::decode(bytes(make_bmp(early))),
                         "corrupt or truncated BMP data: the RLE data ends before the image does",
                         DecodeError);
  }
  SUBCASE("TIFF and WebP cut short") {
    const Bytes tiff = make_tiff(img);
    // make_tiff: 8x6 RGB, one strip; directory entry k's value at byte 10 + 12k + 8.
    const auto set32 = [](Bytes& b, std::size_t at, std::uint32_t v) {
      for (int i = 0; i < 4; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
    };
    // A strip outside the file is named before the raster is allocated (before: libtiff's
    // "Read error at scanline 4294967295", after 4 bytes a pixel of raster).
    Bytes past = tiff;
    set32(past, 10 + 5 * 12 + 8, 100000);  // StripOffsets
    CHECK_THROWS_WITH_AS(vision::decode(bytes(past)),
                         ("corrupt or truncated TIFF data: strip 0 of 1 (144 bytes at offset "
                          "100000) is not inside the file's " +
                          std::to_string(past.size()) + " bytes")
                             .c_str(),
                         DecodeError);
    // 9000x9000 claimed over the 8x6 image's one strip: refused, nothing allocated for it.
    Bytes big = tiff;
    set32(big, 18, 9000);
    set32(big, 30, 9000);
    set32(big, 10 + 7 * 12 + 8, 9000);  // RowsPerStrip
    std::vector<std::uint8_t> kept;
    CHECK_THROWS_WITH_AS(vision::decode_into(bytes(big), kept),
                         doctest::Contains("corrupt or truncated TIFF data: strip 0 of "),
                         DecodeError);
    CHECK(kept.capacity() < 1000);
    // A strip that does not decode stops the decode, as in Pillow; before, libtiff went on and
    // the image came back with the strip before's rows in its place.
    const auto good = vision::decode(bytes(make_deflate_tiff()));
    CHECK(good.data[3 * 64 * 40] == 160);
    CHECK_THROWS_WITH_AS(vision::decode(bytes(make_deflate_tiff(5))),
                         doctest::Contains("corrupt or truncated TIFF data: "), DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(std::span(tiff).first(tiff.size() / 2))),
                         doctest::Contains("corrupt or truncated TIFF data: "), DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(std::span(tiff).first(20))),
                         doctest::Contains("corrupt or truncated TIFF data: "), DecodeError);
    const Bytes webp = make_webp_lossless(img);
    CHECK_THROWS_WITH_AS(vision::decode(std::as_bytes(std::span(webp).first(webp.size() - 8))),
                         doctest::Contains("corrupt or truncated WebP data: "), DecodeError);
    // The thread's decoders are usable again after a failure.
    CHECK(decoded(tiff) == img.data);
    CHECK(decoded(webp) == img.data);
  }
  SUBCASE("every format checks the pixel limit before it allocates") {
    struct Restore {
      ~Restore() { vision::set_max_image_pixels(vision::default_max_image_pixels); }
    } restore;
    vision::set_max_image_pixels(47);
    for (const auto& [name, file] : {std::pair{"ppm", make_ppm(img)}, std::pair{"bmp", make_bmp24(img)},
                                     std::pair{"tiff", make_tiff(img)}, std::pair{"webp", make_webp_lossless(img)}}) {
      CAPTURE(name);
      CHECK(vision::peek(bytes(file)).width == 8);
      std::vector<std::uint8_t> buffer;
      CHECK_THROWS_WITH_AS(vision::decode_into(bytes(file), buffer),
                           doctest::Contains("image size 8x6 (48 pixels) exceeds the limit of 47"),
                           DecompressionBombError);
      CHECK(buffer.empty());
    }
  }
}

// The peak resident memory `f` adds, in KiB: the kernel's high-water mark reset first
// (/proc/self/clear_refs, 5), then VmHWM less the resident size before. Nothing where the mark
// cannot be reset.
std::optional<long> peak_added_kib(const std::function<void()>& f) {
  const auto status = [](const char* field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.starts_with(field)) return std::stol(line.substr(std::strlen(field)));
    }
    return -1L;
  };
  {
    std::ofstream clear("/proc/self/clear_refs");
    if (!(clear << "5" << std::flush)) return std::nullopt;
  }
  // meson test sets MALLOC_PERTURB_, with which glibc fills every allocation at once: the
  // pages a decoder has only allocated would count as used. Off while `f` runs.
  const char* perturb = std::getenv("MALLOC_PERTURB_");
  ::mallopt(M_PERTURB, 0);
  const long before = status("VmRSS:");
  f();
  const long peak = status("VmHWM:");
  if (perturb) ::mallopt(M_PERTURB, std::atoi(perturb));
  if (before < 0 || peak < 0) return std::nullopt;
  return peak - before;
}

TEST_CASE("a small file claiming 9000x9000 pixels, under the limit, takes no memory for them") {
  namespace vt = vision::test;
  // A JPEG: its entropy-coded data cannot hold the blocks the frame claims (at least a bit for
  // each 8x8 block), so every JPEG path refuses it before the pixels are allocated. It decoded
  // as a grey 9000x9000 image before, after taking 243 MB.
  const auto jpeg = vt::bomb_jpeg(9000, 9000);
  REQUIRE(jpeg.size() < 1024);
  const auto holds = doctest::Contains("corrupt or truncated JPEG data: its ");
  const auto pixels = doctest::Contains("cannot hold 9000x9000 pixels (1265625 blocks of 8x8");
  for (int d : {1, 2, 4, 8}) {
    CHECK_THROWS_WITH_AS(vision::decode(jpeg, d), holds, DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode(jpeg, d), pixels, DecodeError);
    CHECK_THROWS_WITH_AS(vision::decode_resized_crop(jpeg, CropBox{100, 100, 2000, 2000}, 224,
                                                     224, d),
                         pixels, DecodeError);
  }
  std::vector<std::uint8_t> buffer;
  CHECK_THROWS_AS(vision::decode_into(jpeg, buffer, 1), DecodeError);
  CHECK(buffer.empty());
  // libjpeg passes over a standalone marker (RSTn, TEM) before the scan, and so does the check
  // (it skipped such files, which libjpeg decoded: review). (Stray bytes there TurboJPEG's
  // header read refuses, but the check passes over them too, as libjpeg's crop decoder does.)
  for (const std::vector<std::byte>& before_scan :
       {std::vector{std::byte{0xff}, std::byte{0xd0}}, std::vector{std::byte{0xff}, std::byte{0x01}},
        std::vector{std::byte{0x12}, std::byte{0x00}, std::byte{0xff}, std::byte{0xff}}}) {
    auto odd = jpeg;
    for (std::size_t i = 2; i + 1 < odd.size(); ++i) {
      if (odd[i] == std::byte{0xff} && odd[i + 1] == std::byte{0xda}) {
        odd.insert(odd.begin() + static_cast<std::ptrdiff_t>(i), before_scan.begin(),
                   before_scan.end());
        break;
      }
    }
    REQUIRE(odd.size() == jpeg.size() + before_scan.size());
    CHECK_THROWS_WITH_AS(vision::detail::check_jpeg_claims(odd), pixels, DecodeError);
    if (before_scan[0] == std::byte{0xff}) {
      CHECK_THROWS_WITH_AS(vision::decode(odd), pixels, DecodeError);
      CHECK_THROWS_WITH_AS(
          vision::decode_resized_crop(odd, CropBox{100, 100, 2000, 2000}, 224, 224, 1), pixels,
          DecodeError);
    }
  }
  for (bool dct : {true, false}) {
    at::Generator gen = at::detail::createCPUGenerator(1);
    std::vector<float> out(3 * 224 * 224);
    CHECK_THROWS_WITH_AS((TrainTransform{.dct_scaling = dct}(jpeg, gen, out.data())), pixels,
                         DecodeError);
    CHECK_THROWS_WITH_AS((EvalTransform{.dct_scaling = dct}(jpeg, out.data())), pixels,
                         DecodeError);
  }
  // The same frame with the data it needs is no bomb: 16x16 decodes as before.
  CHECK(vision::decode(vt::synthetic_jpeg(16, 16, 1)).width == 16);

  // A TIFF whose one Deflate strip is a byte, and a lossless WebP whose header is followed by
  // junk: no data size bounds what they decode to, so they fail as they decode, and take memory
  // only for what decoded. Before, 324 MB (libtiff's raster, zero-filled and kept by the thread)
  // and 309 MB (libwebp's two zero-filled canvases).
  Bytes tiff = {'I', 'I', 42, 0};
  put32(tiff, 8);
  put16(tiff, 8);
  tiff_entry(tiff, 256, 4, 1, 9000);
  tiff_entry(tiff, 257, 4, 1, 9000);
  tiff_entry(tiff, 258, 3, 1, 8);
  tiff_entry(tiff, 259, 3, 1, 8);  // deflate
  tiff_entry(tiff, 262, 3, 1, 1);
  tiff_entry(tiff, 273, 4, 1, 8 + 2 + 8 * 12 + 4);
  tiff_entry(tiff, 278, 4, 1, 9000);
  tiff_entry(tiff, 279, 4, 1, 1);
  put32(tiff, 0);
  tiff.push_back(0x78);
  // RIFF, WEBP, then a VP8L chunk: its signature, 14 bits of width - 1 and of height - 1.
  const std::uint32_t sides = (9000 - 1) | (9000 - 1) << 14;
  Bytes webp = text_bytes("RIFF");
  put32(webp, 4 + 8 + 14);
  for (char c : std::string("WEBPVP8L")) webp.push_back(static_cast<std::uint8_t>(c));
  put32(webp, 14);
  webp.push_back(0x2f);
  put32(webp, sides);
  webp.insert(webp.end(), 9, 0xff);
  for (const auto& [name, file] : {std::pair{"TIFF", tiff}, std::pair{"WebP", webp}}) {
    const std::string format = name;
    CAPTURE(format);
    REQUIRE(file.size() < 128);
    CHECK(vision::peek(bytes(file)).width == 9000);
    const auto added = peak_added_kib([&] {
      CHECK_THROWS_WITH_AS(vision::decode(bytes(file)),
                           doctest::Contains(("corrupt or truncated " + std::string(name) + " data: ").c_str()),
                           DecodeError);
    });
    if (format == "TIFF") {
      // Deflate's bound (1032 bytes of one) refuses it before libtiff allocates the strip.
      CHECK_THROWS_WITH_AS(vision::decode(bytes(file)),
                           "corrupt or truncated TIFF data: strip 0 of 1's 1 bytes of compressed "
                           "data cannot hold its 81000000 bytes",
                           DecodeError);
    }
    if (!added) {
      MESSAGE("/proc/self/clear_refs cannot reset the peak: memory not checked");
      continue;
    }
    CHECK(*added < 32 * 1024);
  }
}

TEST_CASE("an uncompressed tiled TIFF decodes, whatever its tiles' size") {
  // Before, libtiff was told not to map the bytes ("rm"), and its unmapped read of an
  // uncompressed tile refused every tile under 1024 bytes ("Invalid tile byte count for tile
  // 0. Expected 768, got 1024."): libtiff's own 16x16 RGB tiles did not decode. A tiled TIFF
  // is now read mapped (a striped one still is not: see open_tiff).
  const Image img = vision::test::synthetic_image(20, 18, 5);
  for (const int tile : {16, 32}) {
    CAPTURE(tile);
    const Bytes file = make_tiled_tiff(img, tile);
    const auto size = vision::peek(bytes(file));
    CHECK(size.width == 20);
    CHECK(size.height == 18);
    CHECK(decoded(file) == img.data);
  }
}

TEST_CASE("every prefix and every one-byte change of a Netpbm, BMP, TIFF or WebP file decodes or "
          "throws DecodeError") {
  // Run under ASan by CI's sanitizer stage: the hand-written readers must stay in bounds.
  const Image img = vision::test::synthetic_image(9, 5, 4);
  BmpSpec rle{.width = 4, .height = 2, .bits = 8, .compression = 1, .palette = {0, 0x111111}};
  rle.pixels = {1, 1, 0, 3, 1, 0, 1, 0, 0, 0, 2, 1, 0, 2, 1, 0, 0, 1};
  BmpSpec pal{.width = 5, .height = 3, .bits = 4, .palette = {0xff0000, 0x00ff00}};
  pal.pixels.assign(12, 0x10);
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"ppm", make_ppm(img)},
      {"p3", text_bytes("P3 2 2 1000 0 1 2 500 499 501 999 1000 3 7 998 253")},
      {"p1", text_bytes("P1 3 2 # c\n101 0 1 1")},
      {"bmp", make_bmp24(img)},
      {"rle", make_bmp(rle)},
      {"palette", make_bmp(pal)},
      {"tiff", make_tiff(img)},
      {"tiled tiff", make_tiled_tiff(img, 16)},
      {"webp", make_webp_lossless(img)}};
  std::vector<std::uint8_t> buffer;
  for (const auto& [name, file] : files) {
    CAPTURE(name);
    int decodes = 0;
    int errors = 0;
    const auto attempt = [&](std::span<const std::uint8_t> data) {
      try {
        (void)vision::decode_into(std::as_bytes(data), buffer);
        ++decodes;
      } catch (const DecodeError&) {
        ++errors;
      }
    };
    for (std::size_t n = 0; n < file.size(); ++n) attempt(std::span(file).first(n));
    Bytes changed = file;
    for (std::size_t i = 0; i < file.size(); ++i) {
      for (std::uint8_t v : {std::uint8_t{0}, std::uint8_t{0xff}, static_cast<std::uint8_t>(file[i] ^ 0x21)}) {
        changed[i] = v;
        attempt(changed);
      }
      changed[i] = file[i];
    }
    CHECK(decodes + errors == static_cast<int>(4 * file.size()));
    CHECK(errors >= static_cast<int>(file.size() / 2));  // most prefixes are cut short
  }
}

TEST_CASE("the same pixels as PNG, PPM, BMP, TIFF and WebP give the same sample through a recipe") {
  const Image img = vision::test::synthetic_image(61, 47, 21);
  std::vector<std::vector<std::uint8_t>> rows(img.height);
  for (int y = 0; y < img.height; ++y) {
    rows[y].assign(img.data.begin() + y * img.width * 3, img.data.begin() + (y + 1) * img.width * 3);
  }
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"png", vision::test::make_png(img.width, img.height, 8, 2, rows)},
      {"ppm", make_ppm(img)},
      {"bmp", make_bmp24(img)},
      {"tiff", make_tiff(img)},
      {"webp", make_webp_lossless(img)}};
  const vision::Recipe train = vision::presets::train("classic");
  const vision::Recipe eval = vision::presets::eval("classic");
  coload::Rng png_rng = coload::Rng::for_sample(3, 0, 7);
  const at::Tensor want_train = train(bytes(files[0].second), png_rng);
  coload::Rng unused;
  const at::Tensor want_eval = eval(bytes(files[0].second), unused);
  for (const auto& [name, file] : files) {
    CAPTURE(name);
    CHECK(decoded(file) == img.data);
    const vision::ImageInfo info = vision::peek(bytes(file));
    CHECK(info.width == 61);
    CHECK(info.height == 47);
    coload::Rng rng = coload::Rng::for_sample(3, 0, 7);
    CHECK(at::equal(train(bytes(file), rng), want_train));
    CHECK(at::equal(eval(bytes(file), unused), want_eval));
  }
}

TEST_CASE("WebP, TIFF, Netpbm and BMP decodes equal PIL's convert('RGB')" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  const Image img = vision::test::synthetic_image(45, 29, 5);
  vision::test::write_bytes(dir / "rgb.raw", img.data);
  Bytes rgba;
  for (std::size_t i = 0; i < img.data.size() / 3; ++i) {
    rgba.insert(rgba.end(), img.data.begin() + 3 * i, img.data.begin() + 3 * i + 3);
    rgba.push_back(static_cast<std::uint8_t>(i % 3 == 0 ? 0 : i * 7));  // some fully transparent
  }
  vision::test::write_bytes(dir / "rgba.raw", rgba);
  Bytes cmyk;
  for (std::size_t i = 0; i < img.data.size() / 3; ++i) {
    cmyk.insert(cmyk.end(), img.data.begin() + 3 * i, img.data.begin() + 3 * i + 3);
    cmyk.push_back(static_cast<std::uint8_t>(i * 5));
  }
  vision::test::write_bytes(dir / "cmyk.raw", cmyk);
  // 16-bit samples, little-endian (read big-endian as well): below 256, above, and the top.
  Bytes gray16;
  for (std::size_t i = 0; i < img.data.size() / 3; ++i) {
    const auto v = static_cast<std::uint16_t>(i % 5 == 0 ? 65535 - i : i * 37 % 600);
    put16(gray16, v);
  }
  vision::test::write_bytes(dir / "g16.raw", gray16);
  const std::string size = " 45 29 ";
  // Files PIL writes: name, then the encode command's MODE FORMAT [options] from rgb/rgba/cmyk.
  const std::vector<std::pair<std::string, std::string>> by_pil = {
      {"lossy.webp", "rgb RGB WEBP quality=80"},
      {"lossless.webp", "rgb RGB WEBP lossless=1"},
      {"alpha.webp", "rgba RGBA WEBP lossless=1 exact=1"},
      {"alpha_lossy.webp", "rgba RGBA WEBP quality=90"},
      {"raw.tif", "rgb RGB TIFF"},
      {"lzw.tif", "rgb RGB TIFF compression=tiff_lzw"},
      {"deflate.tif", "rgb RGB TIFF compression=tiff_adobe_deflate"},
      {"packbits.tif", "rgb RGB TIFF compression=packbits"},
      {"jpeg.tif", "rgb RGB TIFF compression=jpeg"},
      {"rgba.tif", "rgba RGBA TIFF compression=tiff_lzw"},
      {"bottom_left.tif", "rgb RGB TIFF orientation=4"},
      {"right_top.tif", "rgb RGB TIFF orientation=6"},
      {"left_bottom.tif", "rgb RGB TIFF compression=tiff_lzw orientation=8"},
      {"cmyk.tif", "cmyk CMYK TIFF"},
      {"gray16.tif", "g16 I;16 TIFF"},
      {"gray16_lzw.tif", "g16 I;16 TIFF compression=tiff_lzw"},
      {"gray16_big.tif", "g16 I;16B TIFF"},
      {"pil.ppm", "rgb RGB PPM"},
      {"pil.bmp", "rgb RGB BMP"},
      {"pil_rgba.bmp", "rgba RGBA BMP"}};
  std::string commands;
  for (const auto& [name, spec] : by_pil) {
    const auto src = spec.substr(0, spec.find(' '));
    auto rest = spec.substr(spec.find(' ') + 1);
    const auto mode = rest.substr(0, rest.find(' '));
    rest = rest.substr(rest.find(' ') + 1);
    const auto format = rest.substr(0, rest.find(' '));
    const auto options = rest.find(' ') == std::string::npos ? std::string() : rest.substr(rest.find(' '));
    commands += "encode " + (dir / (src + ".raw")).string() + size + mode + " " + format + " " +
                (dir / name).string() + options + "\n";
  }
  // Files written here, in layouts PIL does not write.
  std::vector<std::pair<std::string, Bytes>> by_hand = {
      {"p3.ppm", text_bytes("P3 2 2 1000 0 1 2 500 499 501 999 1000 3 7 998 253")},
      {"p5_510.pgm", concat(text_bytes("P5 5 1 510\n"), Bytes{0, 1, 0, 253, 0, 255, 1, 1, 1, 254})},
      {"p5_7.pgm", concat(text_bytes("P5 8 1 7\n"), Bytes{0, 1, 2, 3, 4, 5, 6, 7})},
      {"p2_300.pgm", text_bytes("P2 4 1 300 0 1 150 300")},
      {"p4.pbm", concat(text_bytes("P4 9 2\n"), Bytes{0xa5, 0x80, 0x3c, 0x00})},
      {"p1.pbm", text_bytes("P1 3 2 101 0 1 1")},
      {"gray16_white.tif", make_gray16_tiff(0, 1)},
      {"gray16_signed.tif", make_gray16_tiff(1, 2)}};
  {
    BmpSpec s{.width = 3, .height = 2, .bits = 16};
    s.pixels = {0x00, 0x7c, 0xe0, 0x03, 0x1f, 0x00, 0, 0, 0x55, 0x55, 0xaa, 0x2a, 0x11, 0x11, 0, 0};
    by_hand.push_back({"bgr15.bmp", make_bmp(s)});
    s.compression = 3;
    s.masks = {0xf800, 0x7e0, 0x1f};
    by_hand.push_back({"bgr16.bmp", make_bmp(s)});
    BmpSpec p{.width = 5, .height = 2, .bits = 4, .palette = {0xff0000, 0x00ff00, 0x0000ff}};
    p.pixels = {0x01, 0x23, 0x40, 0, 0x21, 0x00, 0x10, 0};
    by_hand.push_back({"p4.bmp", make_bmp(p)});
    BmpSpec r{.width = 4, .height = 2, .bits = 8, .compression = 1, .palette = {0x010203, 0x405060, 0x708090}};
    r.pixels = {4, 1, 0, 4, 2, 1, 2, 1, 0, 1};
    by_hand.push_back({"rle8.bmp", make_bmp(r)});
    BmpSpec t{.width = 2, .height = 2, .top_down = true};
    t.pixels = {1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0};
    by_hand.push_back({"top_down.bmp", make_bmp(t)});
  }
  for (const auto& [name, file] : by_hand) vision::test::write_bytes(dir / name, file);
  std::vector<std::string> names;
  for (const auto& [name, spec] : by_pil) names.push_back(name);
  for (const auto& [name, file] : by_hand) names.push_back(name);
  for (const auto& name : names) {
    commands += "decode " + (dir / name).string() + " " + (dir / (name + ".rgb")).string() + "\n";
  }
  REQUIRE(vision::test::run_reference(dir, commands) == vision::test::Reference::ok);
  for (const auto& name : names) {
    CAPTURE(name);
    const Image ours = vision::decode_file(dir / name);
    const Bytes want = vision::test::read_bytes(dir / (name + ".rgb"));
    const Bytes file = vision::test::read_bytes(dir / name);
    // peek gives the size the decode gives (a quarter-turned TIFF's, turned).
    CHECK(vision::peek(bytes(file)).width == ours.width);
    CHECK(vision::peek(bytes(file)).height == ours.height);
    // Byte for byte, but for CMYK TIFFs: libtiff's RGBA interface converts them with a
    // truncating division, (255 - c)(255 - k) / 255, where Pillow rounds; so within 1 there.
    REQUIRE(ours.data.size() == want.size());
    int worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(ours.data[i] - want[i]));
    CHECK(worst == (name == "cmyk.tif" ? 1 : 0));
  }
}

}  // TEST_SUITE
