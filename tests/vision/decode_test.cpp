// vision tests: JPEG/PNG decoding to RGB as PIL's convert('RGB') gives it.

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "coload/core/warning.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/transforms.hpp"
#include "image_test_support.hpp"
#include "vision/jpeg_region.hpp"

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
  SUBCASE("neither JPEG nor PNG") {
    const std::vector<std::uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
    CHECK_THROWS_WITH_AS(vision::decode(bytes(text)),
                         "unknown image format: the data starts with neither the JPEG nor the PNG "
                         "signature (5 bytes)",
                         DecodeError);
  }
  SUBCASE("a JPEG cut in half") {
    const auto half = std::span(jpeg).first(jpeg.size() / 2);
    CHECK(vision::peek(half).width == 160);
    // The handle is usable again after the failure.
    CHECK(vision::decode(jpeg).width == 160);
    CHECK_THROWS_WITH_AS(vision::decode(half), doctest::Contains("truncated JPEG data"), DecodeError);
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
}

}  // TEST_SUITE
