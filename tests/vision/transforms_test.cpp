// vision tests: torchvision-semantics transforms, the fused train/eval paths, and fidelity of
// the DCT-scaled path against torchvision on PIL images.

#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "coload/sampler/random.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/transforms.hpp"
#include "image_test_support.hpp"
#include "vision/image_ops.hpp"

namespace vision = coload::vision;
using vision::CropBox;
using vision::Image;
using vision::test::Reference;
using vision::test::TempDir;

namespace {

Image from_rows(int width, int channels, const std::vector<std::uint8_t>& values) {
  const int height = static_cast<int>(values.size()) / (width * channels);
  return Image{width, height, channels, values};
}

std::vector<float> floats_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

std::vector<float> read_floats(const std::filesystem::path& path) {
  const auto raw = vision::test::read_bytes(path);
  std::vector<float> out(raw.size() / 4);
  std::memcpy(out.data(), raw.data(), out.size() * 4);
  return out;
}

std::vector<CropBox> read_boxes(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<CropBox> boxes;
  CropBox b;
  while (in >> b.top >> b.left >> b.height >> b.width) boxes.push_back(b);
  return boxes;
}

// NOTE: built by appending: GCC 12 at -O3 warns falsely (-Wstringop-overflow) on
// "literal" + std::to_string(...).
std::string numbered(const char* prefix, long long n, const char* suffix = "") {
  std::string s(prefix);
  s.append(std::to_string(n)).append(suffix);
  return s;
}

std::string box_text(const CropBox& b) {
  std::ostringstream s;
  s << b.top << " " << b.left << " " << b.height << " " << b.width;
  return s.str();
}

}  // namespace

namespace doctest {
template <>
struct StringMaker<CropBox> {
  static String convert(const CropBox& b) { return ("CropBox{" + box_text(b) + "}").c_str(); }
};
}  // namespace doctest

TEST_SUITE("vision") {

TEST_CASE("resize_output_size and center_crop_box follow torchvision's arithmetic") {
  CHECK(vision::resize_output_size(375, 500, 256) == std::pair{256, 341});
  CHECK(vision::resize_output_size(500, 375, 256) == std::pair{341, 256});
  CHECK(vision::resize_output_size(300, 300, 256) == std::pair{256, 256});
  CHECK(vision::resize_output_size(3, 1000, 256) == std::pair{256, 85333});
  // int(round(33 / 2.0)) == 16 and int(round(1 / 2.0)) == 0: Python rounds halves to even.
  CHECK(vision::center_crop_box(257, 35, 224, 2) == CropBox{16, 16, 224, 2});
  CHECK(vision::center_crop_box(225, 227, 224, 224) == CropBox{0, 2, 224, 224});
  // Larger than the image: padded left/top by the floor of half the excess.
  CHECK(vision::center_crop_box(2, 3, 4, 6) == CropBox{-1, -1, 4, 6});
}

TEST_CASE("Resize filters like PIL's antialiased bilinear on known inputs") {
  const Image row = from_rows(4, 1, {0, 100, 200, 255});
  CHECK(vision::resize(row.view(), 1, 2).data == std::vector<std::uint8_t>{71, 209});
  const Image two = from_rows(2, 1, {0, 100});
  CHECK(vision::resize(two.view(), 1, 4).data == std::vector<std::uint8_t>{0, 25, 75, 100});
  const Image rgb = from_rows(4, 3, {0, 0, 0, 100, 10, 1, 200, 20, 2, 255, 30, 3});
  CHECK(vision::resize(rgb.view(), 1, 2).data == std::vector<std::uint8_t>{71, 7, 1, 209, 23, 2});
  // Same size is the identity.
  const Image img = vision::test::synthetic_image(17, 9, 1);
  CHECK(vision::resize(img.view(), 9, 17).data == img.data);
  // Resize(shorter side) and Resize(h, w) objects.
  const Image big = vision::test::synthetic_image(40, 30, 2);
  const Image shorter = vision::Resize{15}(big);
  CHECK(shorter.width == 20);
  CHECK(shorter.height == 15);
  const Image fixed = vision::Resize{5, 7}(big);
  CHECK(fixed.width == 7);
  CHECK(fixed.height == 5);
  // A column resize equals the row resize transposed.
  const Image column = from_rows(1, 1, {0, 100, 200, 255});
  CHECK(vision::resize(column.view(), 2, 1).data == std::vector<std::uint8_t>{71, 209});
}

TEST_CASE("the scalar, SSSE3, AVX2 and AVX-512 resampling kernels give the same bytes") {
  using vision::detail::SimdLevel;
  // What `resample` gives with the kernels capped at each of `levels`, in order.
  auto at_levels = [](std::initializer_list<SimdLevel> levels, const auto& resample) {
    std::vector<std::vector<std::uint8_t>> outputs;
    for (SimdLevel level : levels) {
      const SimdLevel previous = vision::detail::set_simd_level(level);
      outputs.push_back(resample().data);
      vision::detail::set_simd_level(previous);
    }
    return outputs;
  };
  const Image img = vision::test::synthetic_image(301, 203, 5);
  const std::vector<std::tuple<CropBox, int, int>> cases = {
      {{0, 0, 203, 301}, 224, 224}, {{3, 5, 200, 290}, 57, 31}, {{10, 20, 100, 90}, 223, 301},
      {{0, 0, 203, 301}, 20, 19},   {{1, 2, 11, 13}, 7, 5},     {{0, 0, 203, 301}, 203, 301}};
  for (const auto& [box, h, w] : cases) {
    CAPTURE(box);
    CAPTURE(h);
    CAPTURE(w);
    const auto outputs =
        at_levels({SimdLevel::scalar, SimdLevel::ssse3, SimdLevel::avx2, SimdLevel::avx512},
                  [&] { return vision::resized_crop(img.view(), box, h, w); });
    CHECK(outputs[0] == outputs[1]);
    CHECK(outputs[0] == outputs[2]);
    CHECK(outputs[0] == outputs[3]);
  }
  // Random boxes and output sizes: every filter length from upscales to 6x downscales (the
  // kernels specialised for windows of 3 and 5 taps and the general ones), output rows of
  // every length modulo the vertical pass's 32- and 16-byte steps, and 1- and 4-channel images
  // (the vertical pass serves every channel count).
  std::uint32_t state = 12345u;
  auto next = [&state](int n) {
    state = state * 1664525u + 1013904223u;
    return static_cast<int>((state >> 8) % static_cast<std::uint32_t>(n));
  };
  for (int channels : {3, 1, 4}) {
    Image src = Image::zeros(301, 203, channels);
    for (std::size_t i = 0; i < src.data.size(); ++i) {
      src.data[i] = img.data[i % img.data.size()] ^ static_cast<std::uint8_t>(i * 7);
    }
    for (int k = 0; k < 60; ++k) {
      const int height = 1 + next(203);
      const int width = 1 + next(301);
      const CropBox box{next(203 - height + 1), next(301 - width + 1), height, width};
      const int out_h = 1 + next(std::min(2 * height, 240));
      const int out_w = 1 + next(std::min(2 * width, 240));
      CAPTURE(channels);
      CAPTURE(box);
      CAPTURE(out_h);
      CAPTURE(out_w);
      const auto outputs = at_levels({SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}, [&] {
        return vision::resized_crop(src.view(), box, out_h, out_w);
      });
      CHECK(outputs[0] == outputs[1]);
      CHECK(outputs[0] == outputs[2]);
    }
  }
  // Images a few pixels wide: a SIMD load from a window near a row's end reaches past the rows
  // below it, so those rows are read from a padded copy (under ASan a missed one is an
  // overflow; a 4 x 3 image resized to 6 x 9 was one).
  for (int width = 1; width <= 6; ++width) {
    for (int height : {3, 11, 40}) {
      Image src = Image::zeros(width, height, 3);
      for (std::size_t i = 0; i < src.data.size(); ++i) {
        src.data[i] = static_cast<std::uint8_t>(i * 37 + 11);
      }
      for (const auto& [out_h, out_w] : {std::pair{9, 6}, std::pair{height, 2 * width + 1},
                                          std::pair{2, 1}, std::pair{height / 2 + 1, width}}) {
        CAPTURE(width);
        CAPTURE(height);
        CAPTURE(out_h);
        CAPTURE(out_w);
        const auto outputs =
            at_levels({SimdLevel::scalar, SimdLevel::ssse3, SimdLevel::avx2, SimdLevel::avx512},
                      [&] { return vision::resize(src.view(), out_h, out_w); });
        CHECK(outputs[0] == outputs[1]);
        CHECK(outputs[0] == outputs[2]);
        CHECK(outputs[0] == outputs[3]);
      }
    }
  }
}

TEST_CASE("resized_crop resizes only the box, as crop then resize does") {
  const Image img = vision::test::synthetic_image(50, 40, 3);
  const CropBox box{5, 7, 20, 30};
  const Image cropped = vision::crop(img.view(), box);
  CHECK(vision::resized_crop(img.view(), box, 9, 11).data == vision::resize(cropped.view(), 9, 11).data);
  CHECK_THROWS_WITH_AS(vision::resized_crop(img.view(), CropBox{30, 0, 20, 10}, 5, 5),
                       "crop box (top 30, left 0, height 20, width 10) does not lie inside the "
                       "50x40 image",
                       std::invalid_argument);
  // Before, top + height wrapped negative and the box passed: a read far outside the image.
  const int huge = std::numeric_limits<int>::max() - 1;
  CHECK_THROWS_WITH_AS(vision::resized_crop(img.view(), CropBox{huge, 0, 5, 5}, 8, 8),
                       ("crop box (top " + std::to_string(huge) +
                        ", left 0, height 5, width 5) does not lie inside the 50x40 image")
                           .c_str(),
                       std::invalid_argument);
  CHECK_THROWS_AS(vision::resized_crop(img.view(), CropBox{0, huge, 5, 5}, 8, 8),
                  std::invalid_argument);
  // crop() pads a box outside the image with zeros, as torchvision's: all of it, here.
  const Image outside = vision::crop(img.view(), CropBox{huge, huge, 2, 3});
  CHECK(outside.data == std::vector<std::uint8_t>(2 * 3 * 3, 0));
}

TEST_CASE("CenterCrop picks torchvision's box and zero-pads a small image") {
  const Image img = from_rows(4, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  CHECK(vision::CenterCrop{2}(img).data == std::vector<std::uint8_t>{6, 7, 10, 11});
  // top = int(round(1.5)) = 2 and left = int(round(0.5)) = 0: halves round to even.
  CHECK(vision::CenterCrop{1, 3}(img).data == std::vector<std::uint8_t>{9, 10, 11});
  const Image small = from_rows(2, 1, {1, 2, 3, 4});
  CHECK(vision::CenterCrop{4}(small).data ==
        std::vector<std::uint8_t>{0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0});
}

TEST_CASE("hflip mirrors and RandomHorizontalFlip follows p") {
  const Image img = from_rows(3, 3, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(vision::hflip(img.view()).data == std::vector<std::uint8_t>{7, 8, 9, 4, 5, 6, 1, 2, 3});
  at::Generator gen = coload::make_generator(7);
  for (int i = 0; i < 20; ++i) {
    CHECK(vision::RandomHorizontalFlip{0.0}(img, gen).data == img.data);
    CHECK(vision::RandomHorizontalFlip{1.0}(img, gen).data == vision::hflip(img.view()).data);
  }
  // torch.manual_seed(0); torch.rand(1) == 0.4963 < 0.5.
  at::Generator zero = coload::make_generator(0);
  CHECK(vision::RandomHorizontalFlip{0.5}.draw(zero));
}

TEST_CASE("ToTensor, ConvertImageDtype and Normalize compute torchvision's values") {
  const Image img = from_rows(2, 3, {0, 51, 255, 255, 102, 0});
  const at::Tensor t = vision::ToTensor{}(img);
  CHECK(t.sizes() == at::IntArrayRef{3, 1, 2});
  CHECK((t.scalar_type() == at::kFloat));
  CHECK(floats_of(t) == std::vector<float>{0.f, 1.f, 0.2f, 0.4f, 1.f, 0.f});
  const at::Tensor u8 = vision::PILToTensor{}(img);
  CHECK((u8.scalar_type() == at::kByte));
  CHECK(u8[1][0][1].item<int>() == 102);
  CHECK(at::equal(vision::ConvertImageDtype{at::kFloat}(u8), t));
  const at::Tensor n = vision::Normalize{{0.5, 0.5, 0.5}, {0.5, 0.25, 2.0}}(t);
  CHECK(floats_of(n) == std::vector<float>{-1.f, 1.f, (0.2f - 0.5f) / 0.25f, (0.4f - 0.5f) / 0.25f,
                                           0.25f, -0.25f});
  CHECK_THROWS_WITH_AS(vision::Normalize({{0.5}, {0.0}})(t),
                       "std evaluated to zero after conversion to Float, leading to division by "
                       "zero.",
                       std::invalid_argument);
  // The fused writer gives the same floats.
  std::vector<float> fused(6);
  vision::to_normalized_chw(img.view(), {0.5f, 0.5f, 0.5f}, {0.5f, 0.25f, 2.0f}, fused.data());
  CHECK(fused == floats_of(n));
}

TEST_CASE("Compose chains stages and shares one generator among the random ones") {
  const Image img = vision::test::synthetic_image(60, 40, 4);
  const auto deterministic = vision::Compose{vision::Resize{20}, vision::CenterCrop{10}, vision::ToTensor{}};
  const at::Tensor out = deterministic(img);
  CHECK(out.sizes() == at::IntArrayRef{3, 10, 10});
  const Image manual = vision::CenterCrop{10}(vision::Resize{20}(img));
  CHECK(at::equal(out, vision::ToTensor{}(manual)));

  const auto random = vision::Compose{vision::RandomResizedCrop{16}, vision::RandomHorizontalFlip{}};
  at::Generator g1 = coload::make_generator(11);
  at::Generator g2 = coload::make_generator(11);
  const Image a = random(img, g1);
  const CropBox box = vision::RandomResizedCrop{16}.get_params(40, 60, g2);
  Image b = vision::resized_crop(img.view(), box, 16, 16);
  if (vision::RandomHorizontalFlip{}.draw(g2)) b = vision::hflip(b.view());
  CHECK(a.data == b.data);

  coload::Rng r1(5), r2(5);
  CHECK(random(img, r1).data == random(img, r2).data);
}

TEST_CASE("RandomResizedCrop is deterministic per generator and falls back to a centre crop") {
  const vision::RandomResizedCrop rrc{224};
  std::vector<CropBox> first;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    at::Generator a = coload::make_generator(seed);
    at::Generator b = coload::make_generator(seed);
    const CropBox box = rrc.get_params(375, 500, a);
    CHECK(box == rrc.get_params(375, 500, b));
    CHECK(box.top >= 0);
    CHECK(box.left >= 0);
    CHECK(box.top + box.height <= 375);
    CHECK(box.left + box.width <= 500);
    first.push_back(box);
  }
  CHECK(first[0] != first[1]);
  coload::Rng r1 = coload::Rng::for_sample(3, 0, 17);
  coload::Rng r2 = coload::Rng::for_sample(3, 0, 17);
  at::Generator g1 = r1.torch_generator();
  at::Generator g2 = r2.torch_generator();
  CHECK(rrc.get_params(300, 400, g1) == rrc.get_params(300, 400, g2));

  // An area range above the image's makes all 10 attempts fail.
  const vision::RandomResizedCrop impossible{224, 0, {2.0, 3.0}};
  at::Generator gen = coload::make_generator(0);
  // Wide: h = height, w = round(h * 4/3) = 133, centred.
  CHECK(impossible.get_params(100, 400, gen) == CropBox{0, 133, 100, 133});
  // Tall: w = width, h = round(w / (3/4)) = 133.
  CHECK(impossible.get_params(400, 100, gen) == CropBox{133, 0, 133, 100});
  // In range: the whole image.
  CHECK(impossible.get_params(100, 120, gen) == CropBox{0, 0, 100, 120});
}

namespace {
// RandomResizedCrop.get_params as torchvision writes it, every draw an ATen call: the reference
// for the draws that vision:: computes without a tensor.
CropBox aten_crop_params(const vision::RandomResizedCrop& t, int height, int width,
                         at::Generator& gen) {
  const double area = static_cast<double>(height) * width;
  const at::Tensor logs =
      at::log(at::tensor({static_cast<float>(t.ratio[0]), static_cast<float>(t.ratio[1])}));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * at::empty({1}, at::kFloat).uniform_(t.scale[0], t.scale[1], gen).item<float>();
    const double aspect = at::exp(at::empty({1}, at::kFloat)
                                      .uniform_(logs[0].item<float>(), logs[1].item<float>(), gen))
                              .item<float>();
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto i = at::randint(0, height - h + 1, {1}, gen).item<std::int64_t>();
      const auto j = at::randint(0, width - w + 1, {1}, gen).item<std::int64_t>();
      return CropBox{static_cast<int>(i), static_cast<int>(j), h, w};
    }
  }
  return CropBox{-1, -1, -1, -1};  // the fallback: not reached with these sizes
}
}  // namespace

TEST_CASE("draws without a tensor equal ATen's rand, randint and uniform_ on the same generator") {
  using vision::detail::DrawForm;
  const DrawForm form = vision::detail::draw_form();
  const std::string named = form == DrawForm::fused   ? "fused (FMA)"
                           : form == DrawForm::plain ? "plain"
                                                     : "unknown: ATen's calls kept";
  MESSAGE("this ATen's float32 uniform_ is " << named);
  // Debian's 1.13 and torch 2.x both compute one of the two forms on x86-64.
  CHECK(form != DrawForm::aten);
  const std::vector<std::pair<double, double>> ranges = {
      {0.08, 1.0}, {0.02, 0.33}, {-0.2876820724517809, 0.28768207245178085}, {-1.2039728, 1.2039728},
      {-30.0, 30.0}, {0.1, 2.0}, {0.0, 0.0}, {-180.0, 180.0}, {1e-30, 3e38}};
  const std::vector<std::pair<std::int64_t, std::int64_t>> int_ranges = {
      {0, 1}, {0, 2}, {0, 14}, {0, 31}, {3, 1000}, {-50, 50}, {0, 500}, {0, 1LL << 31},
      {0, (1LL << 32) - 1}, {0, 1LL << 32}, {-7, 5LL << 40}};
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    CAPTURE(seed);
    at::Generator a = coload::make_generator(seed);
    at::Generator b = coload::make_generator(seed);
    for (int k = 0; k < 8; ++k) {
      for (const auto& [lo, hi] : ranges) {
        const float want = at::empty({1}, at::kFloat).uniform_(lo, hi, a).item<float>();
        REQUIRE(vision::detail::draw_uniform(lo, hi, b) == want);
      }
      for (const auto& [lo, hi] : int_ranges) {
        REQUIRE(vision::detail::draw_int(lo, hi, b) == at::randint(lo, hi, {1}, a).item<std::int64_t>());
      }
      REQUIRE(vision::detail::draw_unit(b) == at::rand({1}, a).item<float>());
    }
    // The generators are in the same state after: the next ATen draw of each agrees.
    CHECK(at::randint(0, 1LL << 40, {1}, a).item<std::int64_t>() ==
          at::randint(0, 1LL << 40, {1}, b).item<std::int64_t>());
  }
  // The draws above tell the two forms apart: with FMA and without, x · (to − from) + from
  // differs on about a quarter of them, and ATen's value is the form draw_form found.
  int apart = 0;
  int as_found = 0;
  int drawn = 0;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    at::Generator a = coload::make_generator(seed);
    at::Generator c = coload::make_generator(seed);
    auto* words = at::check_generator<at::CPUGeneratorImpl>(c);
    for (const auto& [lo, hi] : ranges) {
      const float want = at::empty({1}, at::kFloat).uniform_(lo, hi, a).item<float>();
      const float x = static_cast<float>(words->random() & 0xFFFFFFu) / 16777216.0f;
      const auto from = static_cast<float>(lo);
      const auto to = static_cast<float>(hi);
      volatile float product = x * (to - from);
      const float plain = product + from;
      const float fused = std::fma(x, to - from, from);
      apart += plain != fused;
      as_found += want == (form == DrawForm::fused ? fused : plain);
      ++drawn;
    }
  }
  CHECK(apart > drawn / 10);
  CHECK(as_found == drawn);
  // aten_exp (in place on the thread's tensor) is at::exp of a fresh one.
  int exp_differ = 0;
  for (int i = 0; i < 20000; ++i) {
    const float v = -3.0f + 6.0f * static_cast<float>(i) / 20000.0f;
    exp_differ += vision::detail::aten_exp(v) != at::exp(at::empty({1}, at::kFloat).fill_(v)).item<float>();
  }
  CHECK(exp_differ == 0);
  // A range ATen refuses keeps ATen's error.
  at::Generator g = coload::make_generator(1);
  CHECK_THROWS_WITH_AS(vision::detail::draw_uniform(2.0, 1.0, g),
                       doctest::Contains("uniform_ expects to return a [from, to) range"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(vision::detail::draw_int(5, 5, g),
                       doctest::Contains("random_ expects 'from' to be less than 'to'"), c10::Error);
  // RandomResizedCrop's boxes (its log ratio remembered per thread, the exp ATen's) against
  // every draw made by ATen, over many seeds, image sizes and ranges.
  const std::vector<vision::RandomResizedCrop> crops = {
      vision::RandomResizedCrop{224}, vision::RandomResizedCrop{176},
      vision::RandomResizedCrop{64, 0, {0.25, 0.9}, {0.5, 2.0}},
      vision::RandomResizedCrop{224, 0, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}}};
  const std::vector<std::pair<int, int>> sizes = {{375, 500}, {500, 333}, {224, 224}, {1200, 1600}, {31, 400}, {7, 5}};
  int compared = 0;
  for (std::uint64_t seed = 0; seed < 1500; ++seed) {
    CAPTURE(seed);
    const auto& t = crops[seed % crops.size()];
    const auto [h, w] = sizes[seed % sizes.size()];
    at::Generator a = coload::make_generator(seed);
    at::Generator b = coload::make_generator(seed);
    const CropBox want = aten_crop_params(t, h, w, a);
    if (want.top < 0) continue;
    REQUIRE(t.get_params(h, w, b) == want);
    ++compared;
  }
  CHECK(compared > 1200);  // the rest fell back to the centre crop (7 x 5 mostly)
}

TEST_CASE("RandomResizedCrop draws torchvision's boxes after torch.manual_seed" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  const std::vector<std::pair<int, int>> sizes = {{375, 500}, {500, 333}, {224, 224}, {1200, 1600}, {31, 400}};
  std::string commands;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    commands += "params 0 300 " + std::to_string(sizes[i].first) + " " +
                std::to_string(sizes[i].second) + " " + (dir / numbered("p", i)).string() + "\n";
  }
  commands += "params_fallback 0 100 400 " + (dir / "fallback").string() + "\n";
  const Reference result = vision::test::run_reference(dir, commands);
  REQUIRE(result == Reference::ok);
  const vision::RandomResizedCrop rrc{224};
  int compared = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto golden = read_boxes(dir / numbered("p", i));
    REQUIRE(golden.size() == 300);
    for (std::uint64_t seed = 0; seed < 300; ++seed) {
      CAPTURE(seed);
      at::Generator gen = coload::make_generator(seed);
      CHECK(rrc.get_params(sizes[i].first, sizes[i].second, gen) == golden[seed]);
      ++compared;
    }
  }
  at::Generator gen = coload::make_generator(0);
  CHECK(vision::RandomResizedCrop{224, 0, {2.0, 3.0}}.get_params(100, 400, gen) ==
        read_boxes(dir / "fallback").at(0));
  MESSAGE("crop boxes equal torchvision's for " << compared << " (seed, size) pairs");
}

TEST_CASE("the fused train transform equals the composed one, and draws from the Rng") {
  const auto jpeg = vision::test::synthetic_jpeg(500, 375, 12);
  const Image full = vision::decode(jpeg);
  const vision::TrainTransform train{.dct_scaling = false};
  const auto composed = vision::Compose{vision::RandomResizedCrop{224}, vision::RandomHorizontalFlip{},
                                        vision::ToTensor{},
                                        vision::Normalize{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}};
  int flips = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    CAPTURE(seed);
    at::Generator g1 = coload::make_generator(seed);
    at::Generator g2 = coload::make_generator(seed);
    at::Generator g3 = coload::make_generator(seed);
    std::vector<float> fused(3 * 224 * 224);
    train(jpeg, g1, fused.data());
    CHECK(fused == floats_of(composed(full, g2)));
    flips += train.sample(vision::peek(jpeg), g3).flip ? 1 : 0;
  }
  CHECK(flips > 0);
  CHECK(flips < 12);
  coload::Rng r1 = coload::Rng::for_sample(1, 2, 3);
  coload::Rng r2 = coload::Rng::for_sample(1, 2, 3);
  const at::Tensor a = train(jpeg, r1);
  CHECK(a.sizes() == at::IntArrayRef{3, 224, 224});
  CHECK(at::equal(a, train(jpeg, r2)));
}

TEST_CASE("decoding only a crop's region gives the pixels of a full decode, at every position") {
  // The fused train path decodes the crop's rows and columns only (libjpeg's skip and crop
  // scanlines); fancy upsampling at a partial row's ends must not change the crop's pixels.
  const vision::Image src = vision::test::synthetic_image(333, 257, 5);
  for (const auto subsampling : {vision::ChromaSubsampling::s420, vision::ChromaSubsampling::s422,
                                 vision::ChromaSubsampling::s444, vision::ChromaSubsampling::gray}) {
    CAPTURE(static_cast<int>(subsampling));
    const auto jpeg = vision::encode_jpeg(src.view(), 90, subsampling);
    const vision::Image full = vision::decode(jpeg);
    int checked = 0;
    for (int top : {0, 1, 7, 8, 15, 16, 17, 100, 200}) {
      for (int left : {0, 1, 15, 16, 17, 31, 150, 300}) {
        for (const auto& [h, w] : {std::pair{1, 1}, std::pair{13, 9}, std::pair{57, 33},
                                  std::pair{257 - top, 333 - left}}) {
          if (top + h > 257 || left + w > 333) continue;
          const CropBox box{top, left, h, w};
          CAPTURE(top);
          CAPTURE(left);
          CAPTURE(h);
          CAPTURE(w);
          const vision::Image region = vision::decode_resized_crop(jpeg, box, 24, 24, 1);
          const vision::Image whole = vision::resized_crop(full.view(), box, 24, 24);
          REQUIRE(region.data == whole.data);
          ++checked;
        }
      }
    }
    CHECK(checked > 200);
  }
}

TEST_CASE("the fused eval transform equals Resize, CenterCrop, ToTensor and Normalize") {
  const auto norm = vision::Normalize{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}};
  const auto composed =
      vision::Compose{vision::Resize{256}, vision::CenterCrop{224}, vision::ToTensor{}, norm};
  // Decoded as the region the centre crop reads (its rows and columns plus filter support),
  // which must give the whole-image pipeline's values at every size.
  for (auto [w, h] : {std::pair{500, 375}, std::pair{333, 500}, std::pair{256, 256},
                      std::pair{640, 480}, std::pair{257, 300}, std::pair{1000, 260},
                      std::pair{301, 999}}) {
    CAPTURE(w);
    CAPTURE(h);
    const auto jpeg = vision::test::synthetic_jpeg(w, h, 13);
    const at::Tensor fused = vision::EvalTransform{.dct_scaling = false}(jpeg);
    CHECK(fused.sizes() == at::IntArrayRef{3, 224, 224});
    CHECK(at::equal(fused, composed(vision::decode(jpeg))));
  }
  const vision::EvalTransform bad{.resize_size = 200, .crop_size = 224};
  CHECK_THROWS_WITH_AS(bad(vision::test::synthetic_jpeg(300, 300, 1)),
                       "EvalTransform needs 0 < crop_size <= resize_size, got crop 224 and resize 200",
                       std::invalid_argument);
}

TEST_CASE("fused train and eval outputs equal torchvision's bit for bit without DCT scaling" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(500, 375, 21);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  std::string commands;
  for (int seed = 0; seed < 4; ++seed) {
    commands += "train " + (dir / "a.jpg").string() + " " + std::to_string(seed) + " 224 " +
                (dir / numbered("train", seed)).string() + "\n";
  }
  commands += "eval " + (dir / "a.jpg").string() + " " + (dir / "eval").string() + "\n";
  const Reference result = vision::test::run_reference(dir, commands);
  REQUIRE(result == Reference::ok);
  const vision::TrainTransform train{.dct_scaling = false};
  for (int seed = 0; seed < 4; ++seed) {
    CAPTURE(seed);
    at::Generator gen = coload::make_generator(static_cast<std::uint64_t>(seed));
    std::vector<float> out(3 * 224 * 224);
    train(jpeg, gen, out.data());
    CHECK(out == read_floats(dir / numbered("train", seed)));
  }
  CHECK(floats_of(vision::EvalTransform{.dct_scaling = false}(jpeg)) == read_floats(dir / "eval"));
}

TEST_CASE("the fused paths take PNGs too, decoding them at full size") {
  const Image src = vision::test::synthetic_image(300, 260, 22);
  std::vector<std::vector<std::uint8_t>> rows;
  for (int y = 0; y < src.height; ++y) rows.emplace_back(src.pixel(0, y), src.pixel(0, y) + 900);
  const auto png = vision::test::make_png(300, 260, 8, 2, rows);
  const auto composed = vision::Compose{vision::RandomResizedCrop{224}, vision::RandomHorizontalFlip{},
                                        vision::ToTensor{},
                                        vision::Normalize{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}};
  at::Generator g1 = coload::make_generator(3);
  at::Generator g2 = coload::make_generator(3);
  std::vector<float> fused(3 * 224 * 224);
  vision::TrainTransform{}(vision::as_bytes_span(png), g1, fused.data());
  CHECK(fused == floats_of(composed(src, g2)));
  // Another mean and std on the same thread, then the first again: the thread's cached
  // normalise table follows them (transforms.cpp's normalize_table).
  const auto unit = vision::Compose{vision::RandomResizedCrop{224}, vision::RandomHorizontalFlip{},
                                    vision::ToTensor{}, vision::Normalize{{0.5, 0, 0}, {1, 2, 1}}};
  at::Generator g3 = coload::make_generator(4);
  at::Generator g4 = coload::make_generator(4);
  std::vector<float> other(3 * 224 * 224);
  vision::TrainTransform{.mean = {0.5f, 0, 0}, .std_dev = {1, 2, 1}}(vision::as_bytes_span(png),
                                                                     g3, other.data());
  CHECK(other == floats_of(unit(src, g4)));
  at::Generator g5 = coload::make_generator(3);
  std::vector<float> again(3 * 224 * 224);
  vision::TrainTransform{}(vision::as_bytes_span(png), g5, again.data());
  CHECK(again == fused);
}

TEST_CASE("fidelity: resized crops reach 35 dB PSNR against torchvision, full and DCT-scaled" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  struct Case {
    int width, height;
    CropBox box;
    int size;
  };
  // Boxes chosen so that choose_jpeg_scale picks 1, 2, 4 and 8.
  const std::vector<Case> cases = {
      {500, 375, {40, 60, 300, 380}, 224},     {500, 375, {0, 0, 375, 500}, 160},
      {640, 480, {10, 20, 460, 600}, 224},     {1024, 768, {30, 50, 700, 900}, 224},
      {1600, 1200, {100, 60, 1000, 1400}, 224}, {1600, 1200, {0, 0, 1200, 1600}, 128},
      {900, 1200, {200, 100, 500, 460}, 224},
  };
  std::string commands;
  std::vector<std::vector<std::byte>> jpegs;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    jpegs.push_back(vision::test::synthetic_jpeg(c.width, c.height, static_cast<std::uint32_t>(30 + i)));
    const auto file = dir / numbered("f", i, ".jpg");
    vision::test::write_bytes(file, jpegs.back());
    commands += "resized_crop " + file.string() + " " + box_text(c.box) + " " +
                std::to_string(c.size) + " " + (dir / numbered("f", i, ".rgb")).string() + "\n";
  }
  const Reference result = vision::test::run_reference(dir, commands);
  REQUIRE(result == Reference::ok);
  std::vector<int> scales_seen;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    CAPTURE(i);
    const auto golden = vision::test::read_bytes(dir / numbered("f", i, ".rgb"));
    const int d = vision::choose_jpeg_scale(c.box.width, c.box.height, c.size, c.size);
    scales_seen.push_back(d);
    const Image full = vision::decode_resized_crop(jpegs[i], c.box, c.size, c.size, 1);
    const Image scaled = vision::decode_resized_crop(jpegs[i], c.box, c.size, c.size, d);
    const double psnr_full = vision::test::psnr(full.data, golden);
    const double psnr_scaled = vision::test::psnr(scaled.data, golden);
    MESSAGE(c.width << "x" << c.height << " crop " << c.box.width << "x" << c.box.height << " -> "
                    << c.size << ": full decode " << psnr_full << " dB, DCT scale 1/" << d << " "
                    << psnr_scaled << " dB");
    CHECK(psnr_full >= 35.0);
    CHECK(psnr_scaled >= 35.0);
  }
  for (int d : {1, 2, 4, 8}) {
    CHECK(std::find(scales_seen.begin(), scales_seen.end(), d) != scales_seen.end());
  }
}

}  // TEST_SUITE
