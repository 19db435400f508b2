// vision tests: Recipe, a composition of torchvision ops run by the fused pipeline. The classic
// preset against TrainTransform and EvalTransform, every op against torchvision's functional
// API on coload's own draws, the refusals of bad parameters, and recipes in the loader.

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <array>
#include <climits>
#include <cmath>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "coload/loader/data_loader.hpp"
#include "coload/loader/metrics.hpp"
#include "coload/sampler/random.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/recipe.hpp"
#include "image_test_support.hpp"

namespace vision = coload::vision;
namespace fs = std::filesystem;
using vision::Image;
using vision::Recipe;
using vision::test::Reference;
using vision::test::TempDir;

namespace {

std::vector<float> run_recipe(const Recipe& recipe, std::span<const std::byte> encoded,
                              std::uint64_t seed) {
  at::Generator gen = coload::make_generator(seed);
  std::vector<float> out(3 * static_cast<std::size_t>(recipe.output_height()) *
                         recipe.output_width());
  recipe(encoded, gen, out.data());
  return out;
}

std::vector<float> read_floats(const fs::path& path) {
  const auto raw = vision::test::read_bytes(path);
  std::vector<float> out(raw.size() / 4);
  std::memcpy(out.data(), raw.data(), out.size() * 4);
  return out;
}

std::string name_of(const char* prefix, std::size_t a, std::size_t b) {
  std::string s(prefix);
  s.append(std::to_string(a)).append("_").append(std::to_string(b));
  return s;
}

// The ops of `recipe` that apply under `params`, as reference.py's `recipe` command reads them.
std::string ops_text(const Recipe& recipe, const vision::RecipeParams& params,
                     const vision::ImageInfo& info) {
  std::ostringstream out;
  out.precision(17);
  const auto& ops = recipe.ops();
  for (std::size_t k = 0; k < ops.size(); ++k) {
    if (!params.applies(k)) continue;
    std::visit(
        [&](const auto& op) {
          using T = std::decay_t<decltype(op)>;
          if constexpr (std::is_same_v<T, vision::RandomResizedCrop>) {
            out << "resized_crop " << params.box.top << " " << params.box.left << " "
                << params.box.height << " " << params.box.width << " " << recipe.output_height()
                << " " << recipe.output_width() << "\n";
          } else if constexpr (std::is_same_v<T, vision::Resize>) {
            out << "resize " << op.size << (op.width > 0 ? " " + std::to_string(op.width) : "")
                << "\n";
          } else if constexpr (std::is_same_v<T, vision::RandomCrop>) {
            const auto pad = op.padding_for(info.height, info.width);
            static constexpr const char* modes[] = {"constant", "edge", "reflect", "symmetric"};
            out << "pad_crop " << pad[0] << " " << pad[1] << " " << pad[2] << " " << pad[3] << " "
                << modes[static_cast<int>(op.padding_mode)];
            for (std::size_t c = 0; c < 3; ++c) out << " " << op.fill[op.fill.size() == 1 ? 0 : c];
            out << " " << params.box.top << " " << params.box.left << " " << params.box.height
                << " " << params.box.width << "\n";
          } else if constexpr (std::is_same_v<T, vision::CenterCrop>) {
            out << "center_crop " << op.height << " " << (op.width > 0 ? op.width : op.height)
                << "\n";
          } else if constexpr (std::is_same_v<T, vision::RandomHorizontalFlip>) {
            out << "hflip\n";
          } else if constexpr (std::is_same_v<T, vision::RandomVerticalFlip>) {
            out << "vflip\n";
          } else if constexpr (std::is_same_v<T, vision::Grayscale> ||
                               std::is_same_v<T, vision::RandomGrayscale>) {
            out << "gray3\n";
          } else if constexpr (std::is_same_v<T, vision::ToTensor>) {
            out << "to_float 1\n";
          } else if constexpr (std::is_same_v<T, vision::ToDtype>) {
            out << "to_float " << (op.scale ? "v2" : "0") << "\n";
          } else if constexpr (std::is_same_v<T, vision::ColorJitter>) {
            const auto& j = params.draws[k].jitter;
            out << "jitter";
            for (int o : j.order) out << " " << o;
            out.precision(9);
            for (float f : j.factor) {
              if (std::isnan(f)) {
                out << " nan";
              } else {
                out << " " << f;
              }
            }
            out.precision(17);
            out << "\n";
          } else if constexpr (std::is_same_v<T, vision::GaussianBlur>) {
            out.precision(9);
            out << "blur " << op.kernel_x << " " << (op.kernel_y > 0 ? op.kernel_y : op.kernel_x)
                << " " << params.draws[k].jitter.factor[0] << "\n";
            out.precision(17);
          } else if constexpr (std::is_same_v<T, vision::RandomErasing>) {
            const auto& b = params.draws[k].box;
            out << "erase " << b.top << " " << b.left << " " << b.height << " " << b.width;
            for (std::size_t c = 0; c < 3; ++c) out << " " << op.value[op.value.size() == 1 ? 0 : c];
            out << "\n";
          } else if constexpr (std::is_same_v<T, vision::Normalize>) {
            out << "normalize";
            for (const auto* v : {&op.mean, &op.std_dev}) {
              for (std::size_t c = 0; c < 3; ++c) out << " " << (*v)[v->size() == 1 ? 0 : c];
            }
            out << "\n";
          }
        },
        ops[k]);
  }
  return out.str();
}

vision::Normalize imagenet() {
  return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}};
}

// A recipe's build error's text.
std::string refusal(std::initializer_list<vision::RecipeOp> ops) {
  try {
    Recipe recipe(ops);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(built)";
}

}  // namespace

TEST_SUITE("vision") {

TEST_CASE("recipe: the classic preset equals TrainTransform and EvalTransform bit for bit") {
  const Recipe train = vision::presets::train("classic");
  const Recipe eval = vision::presets::eval("classic");
  CHECK(train.output_height() == 224);
  CHECK(eval.output_width() == 224);
  std::vector<std::vector<std::byte>> inputs = {
      vision::test::synthetic_jpeg(500, 375, 1), vision::test::synthetic_jpeg(333, 500, 2),
      vision::test::synthetic_jpeg(1200, 900, 3), vision::test::progressive_jpeg(640, 480, 4)};
  {
    const Image src = vision::test::synthetic_image(300, 260, 5);
    std::vector<std::vector<std::uint8_t>> rows;
    for (int y = 0; y < src.height; ++y) rows.emplace_back(src.pixel(0, y), src.pixel(0, y) + 900);
    const auto png = vision::test::make_png(300, 260, 8, 2, rows);
    const auto bytes = vision::as_bytes_span(png);
    inputs.emplace_back(bytes.begin(), bytes.end());
  }
  int compared = 0;
  for (const bool dct : {true, false}) {
    const vision::TrainTransform tt{.dct_scaling = dct};
    const vision::EvalTransform et{.dct_scaling = dct};
    const Recipe rt = train.with_dct_scaling(dct);
    const Recipe re = eval.with_dct_scaling(dct);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      for (std::uint64_t seed = 0; seed < 6; ++seed) {
        CAPTURE(dct);
        CAPTURE(i);
        CAPTURE(seed);
        at::Generator gen = coload::make_generator(seed);
        std::vector<float> want(3 * 224 * 224);
        tt(inputs[i], gen, want.data());
        REQUIRE(run_recipe(rt, inputs[i], seed) == want);
        ++compared;
      }
      std::vector<float> want(3 * 224 * 224);
      et(inputs[i], want.data());
      REQUIRE(run_recipe(re, inputs[i], 0) == want);
    }
  }
  CHECK(compared == 60);
}

TEST_CASE("recipe: flips and grayscale as functions and as random ops") {
  const Image img{2, 2, 3, {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120}};
  CHECK(vision::vflip(img.view()).data ==
        std::vector<std::uint8_t>{70, 80, 90, 100, 110, 120, 10, 20, 30, 40, 50, 60});
  // 0.2989 r + 0.587 g + 0.114 b in float, truncated: (10, 20, 30) -> 2.989 + 11.74 + 3.42.
  const Image gray = vision::rgb_to_grayscale(img.view(), 1);
  CHECK(gray.channels == 1);
  CHECK(gray.data == std::vector<std::uint8_t>{18, 48, 78, 108});
  CHECK(vision::rgb_to_grayscale(img.view(), 3).data ==
        std::vector<std::uint8_t>{18, 18, 18, 48, 48, 48, 78, 78, 78, 108, 108, 108});
  const Image white{1, 1, 3, {255, 255, 255}};
  CHECK(vision::rgb_to_grayscale(white.view(), 1).data == std::vector<std::uint8_t>{254});
  CHECK_THROWS_WITH_AS(vision::rgb_to_grayscale(img.view(), 2),
                       "num_output_channels should be either 1 or 3", std::invalid_argument);
  int flips = 0;
  int grays = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    at::Generator gen = coload::make_generator(seed);
    const Image v = vision::RandomVerticalFlip{}(img, gen);
    flips += v.data != img.data ? 1 : 0;
    const Image g = vision::RandomGrayscale{0.5}(img, gen);
    grays += g.data != img.data ? 1 : 0;
  }
  CHECK(flips > 5);
  CHECK(flips < 35);
  CHECK(grays > 5);
  CHECK(grays < 35);
  at::Generator gen = coload::make_generator(0);
  CHECK(vision::RandomVerticalFlip{0.0}(img, gen).data == img.data);
  CHECK(vision::RandomVerticalFlip{1.0}(img, gen).data == vision::vflip(img.view()).data);
  const at::Tensor u8 = at::arange(0, 256, at::kByte).view({1, 16, 16});
  // transforms.v2's arithmetic, times 1/255: not ToTensor's division (they differ in places).
  CHECK(at::equal(vision::ToDtype{at::kFloat, true}(u8), u8.to(at::kFloat).mul(1.0 / 255)));
  CHECK_FALSE(at::equal(u8.to(at::kFloat).mul(1.0 / 255), u8.to(at::kFloat).div(255)));
  CHECK(at::equal(vision::ToDtype{at::kFloat, false}(u8), u8.to(at::kFloat)));
}

TEST_CASE("recipe: every op equals torchvision's functional API on coload's draws" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  // For each recipe and seed coload draws the parameters (crop box, which random ops apply),
  // writes its output, and reference.py applies the same ops with torchvision's functional API
  // to the same file: geometry on the PIL image, the rest on the uint8 tensor. Without DCT
  // scaling the geometry is PIL's to the bit, so every difference is the ops'.
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(500, 375, 31);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  struct Case {
    std::string what;
    Recipe recipe;
    float tolerance;  // largest difference allowed, in output units
  };
  const std::vector<Case> cases = {
      {"RandomResizedCrop, both flips, ToDtype(scale), Normalize",
       Recipe{vision::RandomResizedCrop{64, 48}, vision::RandomHorizontalFlip{},
              vision::RandomVerticalFlip{}, vision::ToDtype{at::kFloat, true}, imagenet()},
       0.0f},
      {"Resize, CenterCrop, VerticalFlip(1), ToDtype without scale, Normalize twice",
       Recipe{vision::Resize{72}, vision::CenterCrop{64, 56}, vision::RandomVerticalFlip{1.0},
              vision::ToDtype{at::kFloat, false}, vision::Normalize{{127.5}, {64.0}},
              vision::Normalize{{0.1, 0.2, 0.3}, {2.0, 3.0, 4.0}}},
       0.0f},
      // uint8 grayscale: 1 in 255 of ToTensor's scale, divided by the smallest std.
      {"RandomResizedCrop, RandomGrayscale(0.5), flip, ToTensor, Normalize",
       Recipe{vision::RandomResizedCrop{40}, vision::RandomGrayscale{0.5},
              vision::RandomHorizontalFlip{}, vision::ToTensor{}, imagenet()},
       1.0f / 255.0f / 0.224f + 1e-5f},
      {"Resize(h, w), Grayscale(3) twice, ToTensor",
       Recipe{vision::Resize{50, 70}, vision::Grayscale{3}, vision::Grayscale{3},
              vision::ToTensor{}},
       1.0f / 255.0f + 1e-6f},
      {"RandomResizedCrop, flip, ColorJitter(0.4, 0.4, 0.4, 0.1), ToTensor, Normalize",
       Recipe{vision::RandomResizedCrop{48}, vision::RandomHorizontalFlip{},
              vision::ColorJitter{0.4, 0.4, 0.4, 0.1}, vision::ToTensor{}, imagenet()},
       1.0f / 255.0f / 0.224f + 1e-5f},
      {"Resize, CenterCrop, ColorJitter(hue 0.5), GaussianBlur(5, 3), ToTensor",
       Recipe{vision::Resize{60}, vision::CenterCrop{48}, vision::ColorJitter{0, 0, 0, 0.5},
              vision::GaussianBlur{5, 3, {0.1, 2.0}}, vision::ToTensor{}},
       1.0f / 255.0f + 1e-6f},
      {"RandomResizedCrop, GaussianBlur(9), ColorJitter(brightness, saturation), ToTensor",
       Recipe{vision::RandomResizedCrop{40}, vision::GaussianBlur{9},
              vision::ColorJitter{0.8, 0, 0.8, 0}, vision::ToTensor{}},
       1.0f / 255.0f + 1e-6f},
      {"RandomResizedCrop, flip, ToTensor, Normalize, RandomErasing(1), RandomErasing(0.5)",
       Recipe{vision::RandomResizedCrop{64}, vision::RandomHorizontalFlip{}, vision::ToTensor{},
              imagenet(), vision::RandomErasing{1.0},
              vision::RandomErasing{0.5, {0.02, 0.33}, {0.3, 3.3}, {1.5, -2.0, 0.25}}},
       0.0f},
      // Leading crops of the full-size 500 x 375 image that always reach into the padding.
      {"RandomCrop(380, 510, padding (4, 8, 12, 0), fill (10, 200, 30)), flip, ToTensor",
       Recipe{vision::RandomCrop{380, 510, {4, 8, 12, 0}, false, {10, 200, 30}},
              vision::RandomHorizontalFlip{}, vision::ToTensor{}},
       0.0f},
      {"RandomCrop(400, pad_if_needed, reflect), ToTensor",
       Recipe{vision::RandomCrop{400, 0, {0, 0, 0, 0}, true, {0}, vision::PaddingMode::reflect},
              vision::ToTensor{}},
       0.0f},
      {"RandomCrop(390, 520, padding 10, edge), ToTensor",
       Recipe{vision::RandomCrop{390, 520, {10, 10, 10, 10}, false, {0}, vision::PaddingMode::edge},
              vision::ToTensor{}},
       0.0f},
      {"RandomCrop(385, 505, padding (3, 7, 2, 9), symmetric), ToTensor",
       Recipe{vision::RandomCrop{385, 505, {3, 7, 2, 9}, false, {0},
                                 vision::PaddingMode::symmetric},
              vision::ToTensor{}},
       0.0f},
      {"CenterCrop(401, 521) alone, ColorJitter, ToTensor",
       Recipe{vision::CenterCrop{401, 521}, vision::ColorJitter{0.3, 0, 0.3}, vision::ToTensor{}},
       1.0f / 255.0f + 1e-6f},
  };
  constexpr std::size_t seeds = 12;
  std::string commands;
  std::vector<std::vector<std::vector<float>>> ours(cases.size());
  std::vector<std::uint64_t> applied_union(cases.size(), 0);
  std::vector<std::uint64_t> applied_inter(cases.size(), ~std::uint64_t{0});
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Recipe recipe = cases[c].recipe.with_dct_scaling(false);
    for (std::size_t s = 0; s < seeds; ++s) {
      at::Generator gen = coload::make_generator(100 + s);
      const vision::ImageInfo info = vision::peek(jpeg);
      const vision::RecipeParams params = recipe.sample(info, gen);
      applied_union[c] |= params.applied;
      applied_inter[c] &= params.applied;
      std::vector<float> out(3 * static_cast<std::size_t>(recipe.output_height()) *
                             recipe.output_width());
      recipe.apply(jpeg, info, params, out.data());
      ours[c].push_back(std::move(out));
      const fs::path ops = dir / name_of("ops", c, s);
      vision::test::write_bytes(ops, ops_text(recipe, params, info));
      commands += "recipe " + (dir / "a.jpg").string() + " " + ops.string() + " " +
                  (dir / name_of("out", c, s)).string() + "\n";
    }
  }
  // Each random op applied to some samples and not to others.
  CHECK(applied_union[0] != applied_inter[0]);
  CHECK(applied_union[2] != applied_inter[2]);
  CHECK(applied_union[7] != applied_inter[7]);
  CHECK((applied_inter[7] >> 4 & 1u) == 1u);  // RandomErasing(1) found a box every time
  const Reference result = vision::test::run_reference(dir, commands);
  REQUIRE(result == Reference::ok);
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(cases[c].what);
    float worst = 0;
    std::size_t differing = 0;
    std::size_t total = 0;
    for (std::size_t s = 0; s < seeds; ++s) {
      CAPTURE(s);
      const auto theirs = read_floats(dir / name_of("out", c, s));
      REQUIRE(theirs.size() == ours[c][s].size());
      for (std::size_t i = 0; i < theirs.size(); ++i) {
        const float d = std::fabs(theirs[i] - ours[c][s][i]);
        worst = std::max(worst, d);
        differing += d != 0.0f ? 1 : 0;
      }
      total += theirs.size();
    }
    CHECK(worst <= cases[c].tolerance);
    MESSAGE(cases[c].what << ": largest difference " << worst << ", " << differing << " of "
                          << total << " values differ");
  }
}

TEST_CASE("recipe: ColorJitter, GaussianBlur and RandomErasing draw torchvision's values after "
          "torch.manual_seed" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  const vision::ColorJitter jitter{0.4, 0.3, 0, 0.1};
  const Reference result = vision::test::run_reference(
      dir, "draws 0 200 0.4 0.3 0 0.1 " + (dir / "draws").string() + "\n");
  REQUIRE(result == Reference::ok);
  std::ifstream in(dir / "draws");
  int erased = 0;
  int rows = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    std::array<int, 4> order{};
    std::array<std::string, 4> factor;
    std::string sigma;
    std::string box;
    const bool read = static_cast<bool>(in >> order[0] >> order[1] >> order[2] >> order[3] >>
                                        factor[0] >> factor[1] >> factor[2] >> factor[3] >>
                                        sigma >> box);
    REQUIRE(read);
    at::Generator gen = coload::make_generator(seed);
    const auto params = jitter.get_params(gen);
    CHECK(params.order == order);
    for (std::size_t i = 0; i < 4; ++i) {
      if (factor[i] == "nan") {
        CHECK(std::isnan(params.factor[i]));
      } else {
        CHECK(params.factor[i] == static_cast<float>(std::stod(factor[i])));
      }
    }
    CHECK(vision::GaussianBlur{3}.get_params(gen) == static_cast<float>(std::stod(sigma)));
    const auto ours = vision::RandomErasing{}.get_params(64, 48, gen);
    if (box == "none") {
      CHECK(!ours.has_value());
    } else {
      vision::CropBox theirs;
      theirs.top = std::stoi(box);
      const bool read_box = static_cast<bool>(in >> theirs.left >> theirs.height >> theirs.width);
      REQUIRE(read_box);
      REQUIRE(ours.has_value());
      CHECK((*ours == theirs));
      ++erased;
    }
    ++rows;
  }
  CHECK(rows == 200);
  CHECK(erased > 150);
}

TEST_CASE("recipe: MixUp and CutMix draw as transforms.v2 does and mix the batch and labels" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const Recipe recipe{vision::RandomResizedCrop{32}, vision::ToTensor{},
                      vision::RandomChoice{{vision::MixUp{0.2}, vision::CutMix{1.0}}, {}}};
  CHECK(recipe.has_batch_op());
  TempDir dir;
  const Reference result =
      vision::test::run_reference(dir, "batch_draws 0 200 32 40 " + (dir / "batch").string() + "\n");
  REQUIRE(result == Reference::ok);
  {
    std::ifstream in(dir / "batch");
    int cutmix = 0;
    for (std::uint64_t seed = 0; seed < 200; ++seed) {
      CAPTURE(seed);
      vision::BatchMixParams theirs;
      const bool read = static_cast<bool>(in >> theirs.op >> theirs.lam >> theirs.x1 >> theirs.y1 >>
                                          theirs.x2 >> theirs.y2);
      REQUIRE(read);
      at::Generator gen = coload::make_generator(seed);
      const vision::BatchMixParams ours = recipe.sample_batch(32, 40, gen);
      CHECK(ours.op == theirs.op);
      CHECK(ours.lam == theirs.lam);
      CHECK(ours.x1 == theirs.x1);
      CHECK(ours.y1 == theirs.y1);
      CHECK(ours.x2 == theirs.x2);
      CHECK(ours.y2 == theirs.y2);
      cutmix += ours.op;
    }
    CHECK(cutmix > 60);
    CHECK(cutmix < 140);
  }
  // The mix itself: each row against transforms.v2's expressions, written out per element.
  const at::Tensor images = at::rand({3, 2, 4, 5});
  const at::Tensor labels = at::tensor({2, 0, 1}, at::kLong);
  at::Tensor mixed = images.clone();
  const at::Tensor soft =
      vision::apply_batch_mix(mixed, labels, 4, vision::BatchMixParams{0, 0.75});
  CHECK(soft.sizes() == at::IntArrayRef{3, 4});
  for (int n = 0; n < 3; ++n) {
    const int prev = (n + 2) % 3;
    for (int c = 0; c < 2; ++c) {
      for (int y = 0; y < 4; ++y) {
        for (int x = 0; x < 5; ++x) {
          const float want = images[prev][c][y][x].item<float>() * static_cast<float>(1.0 - 0.75) +
                             images[n][c][y][x].item<float>() * 0.75f;
          CHECK(mixed[n][c][y][x].item<float>() == want);
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      const float want = (labels[prev].item<std::int64_t>() == k ? 0.25f : 0.0f) +
                         (labels[n].item<std::int64_t>() == k ? 0.75f : 0.0f);
      CHECK(soft[n][k].item<float>() == want);
    }
  }
  // The in-place mix of a contiguous batch gives ATen's roll, mul_, add_ floats bit for bit (an
  // awkward lam, so each product rounds), and so does a batch that is not contiguous.
  {
    const double lam = 0.3137;
    const at::Tensor big = at::randn({5, 3, 7, 9});
    const at::Tensor want = big.mul(lam).add_(big.roll(1, 0).mul(1.0 - lam));
    const at::Tensor five = at::tensor({0, 1, 2, 3, 4}, at::kLong);
    at::Tensor in_place = big.clone();
    vision::apply_batch_mix(in_place, five, 5, vision::BatchMixParams{0, lam});
    CHECK(at::equal(in_place, want));
    at::Tensor strided = at::empty({5, 3, 9, 7}).transpose(2, 3);
    strided.copy_(big);
    REQUIRE_FALSE(strided.is_contiguous());
    vision::apply_batch_mix(strided, five, 5, vision::BatchMixParams{0, lam});
    CHECK(at::equal(strided, want));
  }
  at::Tensor cut = images.clone();
  const at::Tensor cut_soft =
      vision::apply_batch_mix(cut, labels, 4, vision::BatchMixParams{1, 0.7, 1, 0, 3, 2});
  for (int n = 0; n < 3; ++n) {
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 5; ++x) {
        const bool inside = x >= 1 && x < 3 && y >= 0 && y < 2;
        CHECK(at::equal(cut[n].select(1, y).select(1, x),
                        images[inside ? (n + 2) % 3 : n].select(1, y).select(1, x)));
      }
    }
  }
  CHECK(cut_soft[0][2].item<float>() == 0.7f);
  CHECK(cut_soft[0][1].item<float>() == static_cast<float>(1.0 - 0.7));
  at::Tensor again = images.clone();
  CHECK_THROWS_WITH_AS(vision::apply_batch_mix(again, at::tensor({2, 7, 1}, at::kLong), 4,
                                               vision::BatchMixParams{}),
                       "MixUp/CutMix: label 7 of batch row 1 is not in [0, 4) (num_classes)",
                       std::invalid_argument);
}

TEST_CASE("recipe: bad parameters and unsupported orders are refused when it is built") {
  using namespace vision;
  CHECK(refusal({RandomResizedCrop{224}, RandomHorizontalFlip{1.5}, ToTensor{}}) ==
        "Recipe: op 1 (RandomHorizontalFlip): `p` should be a floating point value in the "
        "interval [0.0, 1.0].");
  CHECK(refusal({RandomResizedCrop{224}, RandomGrayscale{-0.1}, ToTensor{}}) ==
        "Recipe: op 1 (RandomGrayscale): `p` should be a floating point value in the interval "
        "[0.0, 1.0].");
  CHECK(refusal({RandomResizedCrop{224}, RandomVerticalFlip{NAN}, ToTensor{}}) ==
        "Recipe: op 1 (RandomVerticalFlip): `p` should be a floating point value in the "
        "interval [0.0, 1.0].");
  CHECK(refusal({RandomResizedCrop{224, 0, {0.9, 0.1}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): Scale and ratio should be of kind (min, max)");
  CHECK(refusal({RandomResizedCrop{0}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): size must be positive, got 0x0");
  CHECK(refusal({Resize{256}, ToTensor{}}) ==
        "Recipe: op 0 (Resize): Resize(256) keeps each image's aspect ratio, so samples would "
        "differ in size: follow it with CenterCrop, or give Resize a height and a width");
  CHECK(refusal({Resize{200}, CenterCrop{224}, ToTensor{}}) ==
        "Recipe: op 1 (CenterCrop): a centre crop larger than the resized image (which "
        "torchvision pads with zeros) is not supported in a recipe yet");
  CHECK(refusal({RandomHorizontalFlip{}, RandomResizedCrop{224}, ToTensor{}}) ==
        "Recipe: op 0 (RandomHorizontalFlip): a recipe starts with its geometry "
        "(RandomResizedCrop, RandomCrop, CenterCrop, or Resize and then CenterCrop), which the "
        "fused pipeline folds into the decode");
  CHECK(refusal({RandomResizedCrop{224}, RandomHorizontalFlip{}, CenterCrop{200}, ToTensor{}}) ==
        "Recipe: op 2 (CenterCrop): a geometric op after the recipe's leading geometry is not "
        "supported in a recipe yet");
  CHECK(refusal({RandomResizedCrop{224}, Grayscale{2}, ToTensor{}}) ==
        "Recipe: op 1 (Grayscale): num_output_channels should be either 1 or 3");
  CHECK(refusal({RandomResizedCrop{224}, Grayscale{1}, ToTensor{}}) ==
        "Recipe: op 1 (Grayscale): Grayscale(num_output_channels=1) makes one channel, but a "
        "recipe's batch has three: use Grayscale(num_output_channels=3)");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomGrayscale{}}) ==
        "Recipe: op 2 (RandomGrayscale): comes after the conversion to float; the fused "
        "pipeline runs it on uint8 pixels only, so put it before ToDtype/ToTensor");
  CHECK(refusal({RandomResizedCrop{224}, imagenet()}) ==
        "Recipe: op 1 (Normalize): Input tensor should be a float tensor. Got torch.uint8.");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, Normalize{{0.5, 0.5}, {0.5, 0.5}}}) ==
        "Recipe: op 2 (Normalize): mean needs 1 or 3 values (one per channel of an RGB image), "
        "got 2");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, Normalize{{0.5}, {0.5, 0.0, 0.5}}}) ==
        "Recipe: op 2 (Normalize): std evaluated to zero after conversion to torch.float32, "
        "leading to division by zero.");
  CHECK(refusal({RandomResizedCrop{224}, ToDtype{at::kHalf, true}}) ==
        "Recipe: op 1 (ToDtype): the fused pipeline writes float32; ToDtype to Half is not "
        "supported in a recipe yet");
  CHECK(refusal({RandomResizedCrop{224}, RandomHorizontalFlip{}}) ==
        "Recipe: the fused pipeline writes float32 batches: add ToDtype(float32, scale=true) or "
        "ToTensor after the uint8 ops");
  CHECK(refusal({}) == "Recipe: no ops; a recipe starts with RandomResizedCrop or Resize");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, MixUp{0.0}}) ==
        "Recipe: op 2 (MixUp): alpha must be greater than 0, got 0.0");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, CutMix{1.0, -3}}) ==
        "Recipe: op 2 (CutMix): num_classes must be positive (or 0 for the pipeline's class "
        "count), got -3");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, MixUp{}, imagenet()}) ==
        "Recipe: op 2 (MixUp): a batch op (MixUp, CutMix, RandomChoice of them, CustomBatch) "
        "runs on the collated batch, so only batch ops may follow it (op 3 is Normalize)");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, RandomChoice{{MixUp{}, CutMix{}}, {1.0}}}) ==
        "Recipe: op 2 (RandomChoice): Length of p doesn't match the number of transforms: 1 != 2");
  CHECK(refusal({RandomResizedCrop{32}, CutMix{}}) ==
        "Recipe: op 1 (CutMix): mixes float batches: put ToDtype/ToTensor before it");
  CHECK(refusal({RandomCrop{32, 0, {0, -1, 0, 0}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomCrop): padding must be non-negative, got -1");
  CHECK(refusal({RandomCrop{32, 0, {4, 4, 4, 4}, false, {1.0, 2.0}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomCrop): fill needs 1 or 3 values (one per channel of an RGB image), "
        "got 2");
  CHECK(refusal({RandomCrop{32, 0, {4, 4, 4, 4}, false, {300.0}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomCrop): fill values of a uint8 image lie in [0, 255], got 300.0");
  {
    const auto jpeg = vision::test::synthetic_jpeg(50, 40, 3);
    coload::Rng rng = coload::Rng::for_sample(0, 0, 0);
    CHECK_THROWS_WITH_AS(Recipe({RandomCrop{48}, ToTensor{}})(jpeg, rng),
                         "Required crop size (48, 48) is larger than input image size (40, 50).",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Recipe({RandomCrop{48, 0, {1, 1, 1, 1}}, ToTensor{}})(jpeg, rng),
                         "Required crop size (48, 48) is larger than padded input image size "
                         "(42, 52).",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        Recipe({RandomCrop{48, 0, {0, 45, 0, 0}, false, {0}, PaddingMode::reflect}, ToTensor{}})(
            jpeg, rng),
        "RandomCrop: reflect padding (0, 45, 0, 0) needs an image larger than the padding, got "
        "50x40",
        std::invalid_argument);
  }
  CHECK(refusal({RandomResizedCrop{224}, ColorJitter{-0.1}, ToTensor{}}) ==
        "Recipe: op 1 (ColorJitter): If brightness is a single number, it must be non negative.");
  CHECK(refusal({RandomResizedCrop{224}, ColorJitter{0, 0, -1}, ToTensor{}}) ==
        "Recipe: op 1 (ColorJitter): If saturation is a single number, it must be non negative.");
  CHECK(refusal({RandomResizedCrop{224}, ColorJitter{0, 0, 0, 0.6}, ToTensor{}}) ==
        "Recipe: op 1 (ColorJitter): hue values should be between (-0.5, 0.5), but got [-0.6, "
        "0.6].");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, ColorJitter{0.4}}) ==
        "Recipe: op 2 (ColorJitter): comes after the conversion to float; the fused pipeline "
        "runs it on uint8 pixels only, so put it before ToDtype/ToTensor");
  CHECK(refusal({RandomResizedCrop{224}, GaussianBlur{4}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): Kernel size value should be an odd and positive number.");
  CHECK(refusal({RandomResizedCrop{224}, GaussianBlur{0}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): Kernel size value should be an odd and positive number.");
  CHECK(refusal({RandomResizedCrop{224}, GaussianBlur{3, 0, {2.0, 1.0}}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): sigma values should be positive and of the form (min, "
        "max).");
  CHECK(refusal({RandomResizedCrop{224}, GaussianBlur{3, 0, {0.0, 1.0}}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): sigma values should be positive and of the form (min, "
        "max).");
  CHECK(refusal({RandomResizedCrop{8}, GaussianBlur{17}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): the kernel's half (8x8, torchvision's reflect padding) "
        "must be smaller than the image it blurs (8x8)");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomErasing{1.5}}) ==
        "Recipe: op 2 (RandomErasing): Random erasing probability should be between 0 and 1");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomErasing{0.5, {0.3, 0.1}}}) ==
        "Recipe: op 2 (RandomErasing): Scale and ratio should be of kind (min, max)");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomErasing{0.5, {0.1, 1.3}}}) ==
        "Recipe: op 2 (RandomErasing): Scale should be between 0 and 1");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{},
                 RandomErasing{0.5, {0.02, 0.33}, {0.3, 3.3}, {1.0, 2.0}}}) ==
        "Recipe: op 2 (RandomErasing): If value is a sequence, it should have either a single "
        "value or 3 (number of input channels)");
  CHECK(refusal({RandomResizedCrop{224}, RandomErasing{}, ToTensor{}}) ==
        "Recipe: op 1 (RandomErasing): erasing uint8 pixels is not supported in a recipe yet: "
        "put it after ToDtype/ToTensor");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomErasing{}, imagenet()}) ==
        "Recipe: op 3 (Normalize): Normalize after RandomErasing is not supported in a recipe "
        "yet: erase after normalising, as torchvision's reference recipes do");
  // Not finite, or past float32 (ATen draws in float32): every sample's draw failed, each
  // blamed on its image; MixUp's alpha = inf gave lam = 0, every batch swapped unseen.
  CHECK(refusal({RandomResizedCrop{224, 0, {0.08, NAN}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): scale must be finite float32 numbers, got (0.08, nan)");
  CHECK(refusal({RandomResizedCrop{224, 0, {0.08, 1.0}, {0.75, INFINITY}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): ratio must be finite float32 numbers, got (0.75, inf)");
  CHECK(refusal({RandomResizedCrop{224, 0, {0.08, 1.0}, {1e-50, 1.0}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): ratio must be at least float32's smallest normal "
        "number, got 1e-50");
  CHECK(refusal({RandomResizedCrop{224}, ColorJitter{1e39}, ToTensor{}}) ==
        "Recipe: op 1 (ColorJitter): brightness must be a finite float32 number, got 1e+39");
  CHECK(refusal({RandomResizedCrop{224}, GaussianBlur{3, 0, {0.1, INFINITY}}, ToTensor{}}) ==
        "Recipe: op 1 (GaussianBlur): sigma must be finite float32 numbers, got (0.1, inf)");
  CHECK(refusal({RandomResizedCrop{224}, ToTensor{}, RandomErasing{0.5, {0.02, NAN}}}) ==
        "Recipe: op 2 (RandomErasing): Scale should be between 0 and 1");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, MixUp{INFINITY}}) ==
        "Recipe: op 2 (MixUp): alpha must be finite, got inf");
  CHECK(refusal({RandomResizedCrop{32}, ToTensor{}, RandomChoice{{MixUp{}, CutMix{}}, {0.0, 0.0}}}) ==
        "Recipe: op 2 (RandomChoice): p's weights must have a positive, finite sum, got 0.0");
  CHECK(refusal({RandomResizedCrop{32}, RandomRotation{{-INFINITY, 10.0}}, ToTensor{}})
            .ends_with("degrees must be finite float32 numbers, got (-inf, 10.0)"));
  // Sizes whose int arithmetic overflowed (padded sizes, the warps' offsets).
  CHECK(refusal({RandomCrop{32, 0, {0, INT_MAX, 0, 0}}, ToTensor{}}) ==
        "Recipe: op 0 (RandomCrop): padding must be at most 16384, got 2147483647");
  CHECK(refusal({RandomResizedCrop{100000}, ToTensor{}}) ==
        "Recipe: op 0 (RandomResizedCrop): the output size 100000x100000 is over 16384 pixels a "
        "side");
  CHECK(refusal({RandomResizedCrop{16384, 8}, ToTensor{}}) == "(built)");
  // A flip after the float ops ran before them (the erased box not mirrored).
  CHECK(refusal({RandomResizedCrop{64}, ToTensor{}, RandomErasing{1.0}, RandomHorizontalFlip{1.0}}) ==
        "Recipe: op 3 (RandomHorizontalFlip): a flip after RandomErasing is not supported in a "
        "recipe yet: the fused pipeline flips before the ops on the float output, so put it "
        "before them");
  CHECK(refusal({RandomResizedCrop{64}, ToTensor{}, RandomErasing{1.0}, RandomVerticalFlip{}}) ==
        "Recipe: op 3 (RandomVerticalFlip): a flip after RandomErasing is not supported in a "
        "recipe yet: the fused pipeline flips before the ops on the float output, so put it "
        "before them");
  CHECK_THROWS_WITH_AS(vision::presets::train("resnet9"),
                       "unknown recipe preset 'resnet9'; the presets are: classic, resnet50",
                       std::invalid_argument);
  // p = 0 and p = 1 are torchvision's bounds, and accepted.
  CHECK(refusal({RandomResizedCrop{8}, RandomHorizontalFlip{0.0}, RandomGrayscale{1.0},
                 ToDtype{at::kFloat, true}}) == "(built)");
}

TEST_CASE("recipe: in the loader, each row is the recipe on its file with the sample's Rng, "
          "whatever the workers or executor") {
  TempDir dir;
  std::vector<std::vector<std::byte>> files;
  for (int i = 0; i < 7; ++i) {
    const fs::path path = dir / (std::string(i < 4 ? "a/" : "b/") + std::to_string(i) + ".jpg");
    fs::create_directories(path.parent_path());
    files.push_back(vision::test::synthetic_jpeg(60 + 7 * i, 50 + 3 * i, 40 + i));
    vision::test::write_bytes(path, files.back());
  }
  const Recipe recipe{vision::RandomResizedCrop{24}, vision::RandomHorizontalFlip{},
                      vision::RandomVerticalFlip{}, vision::RandomGrayscale{0.5},
                      vision::ColorJitter{0.4, 0.4, 0.4, 0.1}, vision::GaussianBlur{3},
                      vision::ToTensor{}, imagenet(), vision::RandomErasing{0.5}};
  CHECK_THROWS_WITH_AS(
      vision::ImagePipeline(dir.path(), Recipe{vision::Resize{20, 30}, vision::ToTensor{}}),
      "ImagePipeline writes square images into [N, 3, S, S] batches, but the recipe's output is "
      "20x30 (height x width)",
      std::invalid_argument);
  auto batches = [&](int workers, coload::Executor executor) {
    auto loader = coload::make_data_loader(
        vision::ImagePipeline(dir.path(), recipe),
        {.batch_size = 3, .num_workers = workers, .seed = 11, .executor = executor});
    std::vector<at::Tensor> out;
    for (auto& [images, labels] : loader) out.push_back(images);
    return out;
  };
  const auto reference = batches(0, coload::Executor::threads);
  REQUIRE(reference.size() == 3);
  {
    // One decode and one transform span per image, whether a sample's ops ran on the rows or
    // on the whole crop (this recipe's ColorJitter and blur), as the fixed transforms record.
    auto loader = coload::make_data_loader(vision::ImagePipeline(dir.path(), recipe),
                                           {.batch_size = 3, .num_workers = 2, .seed = 11});
    std::int64_t images = 0;
    for (auto& [batch, labels] : loader) images += batch.size(0);
    const coload::Metrics m = loader.metrics();
    CHECK(images == 7);
    CHECK(m.stage(coload::Stage::decode).count == 7);
    CHECK(m.stage(coload::Stage::transform).count == 7);
  }
  // With MixUp or CutMix the labels turn soft ([N, 2], rows summing to 1) and each batch is
  // the recipe's rows mixed by the batch's own draw, whatever the workers.
  const Recipe mixing{vision::RandomResizedCrop{24}, vision::RandomHorizontalFlip{},
                      vision::ToTensor{},
                      vision::RandomChoice{{vision::MixUp{0.2}, vision::CutMix{1.0}}, {}}};
  const Recipe unmixed{vision::RandomResizedCrop{24}, vision::RandomHorizontalFlip{},
                       vision::ToTensor{}};
  auto mixed_batches = [&](int workers, coload::Executor executor) {
    auto loader = coload::make_data_loader(
        vision::ImagePipeline(dir.path(), mixing),
        {.batch_size = 3, .num_workers = workers, .seed = 5, .executor = executor});
    std::vector<std::pair<at::Tensor, at::Tensor>> out;
    for (auto& [images, labels] : loader) out.emplace_back(images, labels);
    return out;
  };
  const auto mixed = mixed_batches(0, coload::Executor::threads);
  REQUIRE(mixed.size() == 3);
  for (std::size_t b = 0; b < mixed.size(); ++b) {
    CAPTURE(b);
    const auto& [images, soft] = mixed[b];
    const std::int64_t n = images.size(0);
    CHECK(soft.sizes() == at::IntArrayRef{n, 2});
    CHECK(at::allclose(soft.sum(1), at::ones({n})));
    at::Tensor want = at::empty({n, 3, 24, 24});
    std::vector<std::int64_t> hard;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t i = static_cast<std::int64_t>(b) * 3 + r;
      coload::Rng rng = coload::Rng::for_sample(5, 0, i);
      want[r].copy_(unmixed(files[static_cast<std::size_t>(i)], rng));
      hard.push_back(i < 4 ? 0 : 1);
    }
    at::Generator gen = Recipe::batch_generator(5, 0, static_cast<std::int64_t>(b));
    const at::Tensor want_soft = mixing.mix_batch(want, at::tensor(hard, at::kLong), 2, gen);
    CHECK(at::equal(images, want));
    CHECK(at::equal(soft, want_soft));
  }
  for (const auto& [workers, executor] :
       {std::pair{2, coload::Executor::threads}, std::pair{2, coload::Executor::processes}}) {
    const auto got = mixed_batches(workers, executor);
    REQUIRE(got.size() == mixed.size());
    for (std::size_t b = 0; b < got.size(); ++b) {
      CHECK(at::equal(got[b].first, mixed[b].first));
      CHECK(at::equal(got[b].second, mixed[b].second));
    }
  }
  for (std::int64_t i = 0; i < 7; ++i) {
    CAPTURE(i);
    coload::Rng rng = coload::Rng::for_sample(11, 0, i);
    const at::Tensor want = recipe(files[static_cast<std::size_t>(i)], rng);
    CHECK(at::equal(reference[static_cast<std::size_t>(i / 3)][i % 3], want));
  }
  for (const auto& [workers, executor] :
       {std::pair{2, coload::Executor::threads}, std::pair{2, coload::Executor::processes}}) {
    CAPTURE(workers);
    const auto got = batches(workers, executor);
    REQUIRE(got.size() == reference.size());
    for (std::size_t b = 0; b < got.size(); ++b) CHECK(at::equal(got[b], reference[b]));
  }
}

}  // TEST_SUITE

TEST_CASE("recipe: MixUp or CutMix alone, or listed CutMix first, takes the drawn op's num_classes") {
  // mix_batch looked the drawn op up by its kind (0 MixUp, 1 CutMix) rather than its place in
  // the recipe's list: CutMix alone read past a one-op vector, and RandomChoice{CutMix, MixUp}
  // took the other op's class count.
  const at::Tensor labels = at::tensor({0, 1, 2, 3}, at::kLong);
  const Recipe cutmix_alone{vision::RandomResizedCrop{8}, vision::ToTensor{}, vision::CutMix{1.0, 7}};
  const Recipe mixup_alone{vision::RandomResizedCrop{8}, vision::ToTensor{}, vision::MixUp{0.2, 6}};
  const Recipe both{vision::RandomResizedCrop{8}, vision::ToTensor{},
                    vision::RandomChoice{{vision::CutMix{1.0, 5}, vision::MixUp{0.2, 9}}, {}}};
  int widths[2] = {0, 0};
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    CAPTURE(seed);
    at::Tensor images = at::rand({4, 3, 8, 8});
    at::Generator gen = coload::make_generator(seed);
    CHECK(cutmix_alone.mix_batch(images, labels, 0, gen).size(1) == 7);
    gen = coload::make_generator(seed);
    CHECK(mixup_alone.mix_batch(images, labels, 0, gen).size(1) == 6);
    gen = coload::make_generator(seed);
    const int op = both.sample_batch(8, 8, gen).op;
    gen = coload::make_generator(seed);
    const auto width = both.mix_batch(images, labels, 0, gen).size(1);
    CHECK(width == (op == 1 ? 5 : 9));
    ++widths[op == 1 ? 0 : 1];
  }
  CHECK(widths[0] > 0);  // both ops were drawn
  CHECK(widths[1] > 0);
}
