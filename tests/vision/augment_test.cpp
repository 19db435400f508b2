// vision tests: the augmentation policies (TrivialAugmentWide, RandAugment, AutoAugment) and
// their ops. Each op against torchvision's `autoaugment._apply_op` on the same uint8 image, the
// policies' draws against torchvision's own forward after torch.manual_seed, a recipe with
// TrivialAugmentWide against torchvision on coload's draws, and the refusals.

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "coload/sampler/random.hpp"
#include "coload/vision/recipe.hpp"
#include "image_test_support.hpp"
#include "reference_arithmetic.hpp"

namespace vision = coload::vision;
namespace fs = std::filesystem;
using vision::AugmentOp;
using vision::AugmentStep;
using vision::Image;
using vision::Interpolation;
using vision::Recipe;
using vision::test::Reference;
using vision::test::TempDir;

namespace {

std::string number(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

std::string fill_text(const std::vector<double>& fill) {
  if (fill.empty()) return "none";
  std::string out;
  for (double f : fill) out += (out.empty() ? "" : ",") + number(f);
  return out;
}

// The line reference.py's `augment` reads: NAME MAG INTERP FILL.
std::string augment_args(const AugmentStep& s, Interpolation interp, const std::vector<double>& fill) {
  return std::string(vision::augment_op_name(s.op)) + " " + number(s.magnitude) + " " +
         (interp == Interpolation::nearest ? "nearest" : "bilinear") + " " + fill_text(fill);
}

// Whether an op's output is exact in torchvision's arithmetic (integer ops, nearest sampling,
// the blends with one float32 product per term), rather than within 1 of 255 (Sharpness's 3 x 3
// convolution and bilinear sampling, whose sums torch may order differently).
bool exact(AugmentOp op, Interpolation interp) {
  switch (op) {
    case AugmentOp::Sharpness: return false;
    case AugmentOp::ShearX:
    case AugmentOp::ShearY:
    case AugmentOp::TranslateX:
    case AugmentOp::TranslateY:
    case AugmentOp::Rotate: return interp == Interpolation::nearest;
    // transforms.v2 (torchvision 0.16+): AutoContrast divides by (max - min) / 255 and the
    // Color blend adds with alpha (a fused multiply-add in ATen): within 1 of 0.14's.
    case AugmentOp::AutoContrast:
    case AugmentOp::Color: return !vision::test::reference_runs_v2();
    default: return true;
  }
}

// A recipe's draws with the generator of `seed`, and its output.
struct Ran {
  vision::RecipeParams params;
  std::vector<float> out;
};
Ran run_seeded(const Recipe& recipe, std::span<const std::byte> jpeg, std::uint64_t seed) {
  at::Generator gen = coload::make_generator(seed);
  const vision::ImageInfo info = vision::peek(jpeg);
  Ran ran{recipe.sample(info, gen), {}};
  ran.out.resize(3 * static_cast<std::size_t>(recipe.output_height()) * recipe.output_width());
  recipe.apply(jpeg, info, ran.params, ran.out.data());
  return ran;
}

// reference.py's `resized_crop` line for a recipe's leading RandomResizedCrop.
std::string crop_line(const Recipe& recipe, const vision::RecipeParams& params) {
  std::ostringstream line;
  line << "resized_crop " << params.box.top << " " << params.box.left << " " << params.box.height
       << " " << params.box.width << " " << recipe.output_height() << " "
       << recipe.output_width() << "\n";
  return line.str();
}

// A raw float32 output of reference.py, and the largest difference from ours.
float largest_difference(const fs::path& path, const std::vector<float>& ours) {
  const auto raw = vision::test::read_bytes(path);
  std::vector<float> theirs(raw.size() / 4);
  std::memcpy(theirs.data(), raw.data(), raw.size());
  REQUIRE(theirs.size() == ours.size());
  float largest = 0;
  for (std::size_t k = 0; k < theirs.size(); ++k) {
    largest = std::max(largest, std::fabs(theirs[k] - ours[k]));
  }
  return largest;
}

}  // namespace

TEST_SUITE("vision") {

TEST_CASE("augment: every op of the policies equals torchvision's _apply_op on the same image" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const vision::test::FollowReference follow;  // its torch's grid and solve
  TempDir dir;
  // A 48 x 40 image (not square, so that x and y cannot be swapped unnoticed), and the same
  // squeezed into [40, 200] so that AutoContrast has a range to stretch.
  std::vector<Image> images = {vision::test::synthetic_image(48, 40, 7)};
  images.push_back(images[0]);
  for (auto& v : images[1].data) v = static_cast<std::uint8_t>(40 + v * 160 / 255);
  const std::vector<AugmentStep> steps = {
      {AugmentOp::Identity, 0.0},     {AugmentOp::ShearX, 0.3},        {AugmentOp::ShearX, -0.99},
      {AugmentOp::ShearY, 0.231},     {AugmentOp::ShearY, -0.66},      {AugmentOp::TranslateX, 14.5},
      {AugmentOp::TranslateX, -32.0}, {AugmentOp::TranslateY, 9.9},    {AugmentOp::TranslateY, -3.2},
      {AugmentOp::Rotate, 30.0},      {AugmentOp::Rotate, -135.0},     {AugmentOp::Rotate, 7.3},
      {AugmentOp::Rotate, 90.0},      {AugmentOp::Brightness, 0.5},    {AugmentOp::Brightness, -0.99},
      {AugmentOp::Color, 0.9},        {AugmentOp::Color, -0.4},        {AugmentOp::Contrast, 0.66},
      {AugmentOp::Contrast, -0.9},    {AugmentOp::Sharpness, 0.99},    {AugmentOp::Sharpness, -0.5},
      {AugmentOp::Posterize, 8.0},    {AugmentOp::Posterize, 5.0},     {AugmentOp::Posterize, 2.0},
      {AugmentOp::Solarize, 255.0},   {AugmentOp::Solarize, 127.5},    {AugmentOp::Solarize, 0.0},
      {AugmentOp::AutoContrast, 0.0}, {AugmentOp::Equalize, 0.0},      {AugmentOp::Invert, 0.0}};
  struct Run {
    std::size_t image;
    AugmentStep step;
    Interpolation interp;
    std::vector<double> fill;
    std::vector<std::uint8_t> ours;
  };
  std::vector<Run> runs;
  std::string commands;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const fs::path in = dir / ("in" + std::to_string(i));
    vision::test::write_bytes(in, images[i].data.data(), images[i].data.size());
    for (const AugmentStep& step : steps) {
      for (const Interpolation interp : {Interpolation::nearest, Interpolation::bilinear}) {
        for (const std::vector<double>& fill : {std::vector<double>{}, std::vector<double>{10, 200, 30}}) {
          Run run{i, step, interp, fill, {}};
          run.ours = vision::apply_augment_op(images[i].view(), step, interp, fill).data;
          const fs::path out = dir / ("out" + std::to_string(runs.size()));
          commands += "augment_op " + in.string() + " 40 48 " + augment_args(step, interp, fill) +
                      " " + out.string() + "\n";
          runs.push_back(std::move(run));
        }
      }
    }
  }
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  std::map<std::string, std::pair<int, std::size_t>> worst;  // per op: largest difference, count
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    CAPTURE(vision::augment_op_name(run.step.op));
    CAPTURE(run.step.magnitude);
    CAPTURE(run.image);
    CAPTURE(static_cast<int>(run.interp));
    CAPTURE(run.fill.size());
    const auto theirs = vision::test::read_bytes(dir / ("out" + std::to_string(r)));
    REQUIRE(theirs.size() == run.ours.size());
    int largest = 0;
    std::size_t differing = 0;
    for (std::size_t k = 0; k < theirs.size(); ++k) {
      const int d = std::abs(static_cast<int>(theirs[k]) - static_cast<int>(run.ours[k]));
      largest = std::max(largest, d);
      differing += d != 0 ? 1 : 0;
    }
    CHECK(largest <= (exact(run.step.op, run.interp) ? 0 : 1));
    auto& [w, n] = worst[std::string(vision::augment_op_name(run.step.op)) +
                         (run.interp == Interpolation::bilinear ? " (bilinear)" : "")];
    w = std::max(w, largest);
    n += differing;
  }
  for (const auto& [name, wn] : worst) {
    MESSAGE(name << ": largest difference " << wn.first << ", " << wn.second << " values differ");
  }
  // The ops changed something: each op but Identity moves or maps some value of the first image.
  for (const Run& run : runs) {
    if (run.step.op == AugmentOp::Identity || run.image != 0) continue;
    if (run.step.op == AugmentOp::Posterize && run.step.magnitude == 8.0) continue;
    if (run.step.op == AugmentOp::Solarize && run.step.magnitude == 255.0) continue;
    if (run.step.op == AugmentOp::AutoContrast) continue;  // the first image spans 0 to 255
    CAPTURE(vision::augment_op_name(run.step.op));
    CAPTURE(run.step.magnitude);
    CHECK(run.ours != images[0].data);
  }
}

TEST_CASE("augment: the policies draw torchvision's ops and magnitudes after torch.manual_seed" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  constexpr int seeds = 300;
  const std::string range = " 0 " + std::to_string(seeds) + " 40 48 ";
  const std::string commands = "policy_draws trivial" + range + (dir / "trivial").string() + "\n" +
                               "policy_draws rand" + range + (dir / "rand").string() + " 2 9\n" +
                               "policy_draws rand" + range + (dir / "rand3").string() + " 3 30\n" +
                               "policy_draws auto" + range + (dir / "auto").string() + "\n";
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  struct Policy {
    std::string file;
    std::function<std::vector<AugmentStep>(at::Generator&)> draw;
  };
  const std::vector<Policy> policies = {
      {"trivial", [](at::Generator& g) { return vision::TrivialAugmentWide{}.draw(40, 48, g); }},
      {"rand", [](at::Generator& g) { return vision::RandAugment{}.draw(40, 48, g); }},
      {"rand3", [](at::Generator& g) { return vision::RandAugment{3, 30, 31, Interpolation::nearest, {}}.draw(40, 48, g); }},
      {"auto", [](at::Generator& g) { return vision::AutoAugment{}.draw(40, 48, g); }}};
  for (const Policy& policy : policies) {
    CAPTURE(policy.file);
    std::ifstream in(dir / policy.file);
    std::set<std::string> ops_seen;
    int negative = 0;
    std::size_t steps = 0;
    std::size_t exact_magnitudes = 0;
    for (int seed = 0; seed < seeds; ++seed) {
      CAPTURE(seed);
      std::string line;
      REQUIRE(static_cast<bool>(std::getline(in, line)));
      std::istringstream words(line);
      std::vector<std::pair<std::string, double>> theirs;
      std::string name, magnitude;
      while (words >> name >> magnitude) theirs.emplace_back(name, std::stod(magnitude));
      at::Generator gen = coload::make_generator(static_cast<std::uint64_t>(seed));
      const auto ours = policy.draw(gen);
      REQUIRE(ours.size() == theirs.size());
      for (std::size_t i = 0; i < ours.size(); ++i) {
        CHECK(vision::augment_op_name(ours[i].op) == theirs[i].first);
        // The bins are torch.linspace's float32 values, computed by the libtorch coload links
        // (as torchvision computes them with its torch): equal to the bit against the same
        // torch, but torch 2.11's linspace differs from Debian's 1.13 in the last bit of two
        // of 31 bins (TrivialAugmentWide's translate bin 15 is 15.999999 there), so a run
        // against the other torch allows one float32 ulp.
        const double ulp = std::nextafter(static_cast<float>(std::fabs(theirs[i].second)),
                                          INFINITY) - std::fabs(static_cast<float>(theirs[i].second));
        CHECK(std::fabs(ours[i].magnitude - theirs[i].second) <= ulp);
        exact_magnitudes += ours[i].magnitude == theirs[i].second ? 1 : 0;
        ops_seen.insert(theirs[i].first);
        negative += theirs[i].second < 0 ? 1 : 0;
      }
      steps += ours.size();
    }
    MESSAGE(policy.file << ": " << steps << " ops over " << seeds << " seeds, " << ops_seen.size()
                        << " kinds, " << negative << " negative magnitudes, " << exact_magnitudes
                        << " magnitudes equal to the bit");
    CHECK(ops_seen.size() >= 10);
    CHECK(negative > 0);
  }
}

TEST_CASE("augment: a recipe with TrivialAugmentWide equals torchvision on coload's draws" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const vision::test::FollowReference follow;  // its torch's grid and solve
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(500, 375, 41);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  // DCT scaling off: the crop is PIL's to the bit, so a difference is the policy's.
  const Recipe recipes[] = {
      Recipe{vision::RandomResizedCrop{56, 48}, vision::TrivialAugmentWide{}, vision::ToTensor{}}
          .with_dct_scaling(false),
      Recipe{vision::RandomResizedCrop{40}, vision::RandomHorizontalFlip{},
             vision::TrivialAugmentWide{31, Interpolation::bilinear, {128.0}},
             vision::RandAugment{}, vision::AutoAugment{}, vision::ToTensor{}}
          .with_dct_scaling(false)};
  constexpr std::uint64_t seeds = 60;
  std::string commands;
  std::vector<std::vector<float>> ours;
  std::vector<bool> exact_case;
  for (std::size_t r = 0; r < std::size(recipes); ++r) {
    const Recipe& recipe = recipes[r];
    for (std::uint64_t s = 0; s < seeds; ++s) {
      Ran ran = run_seeded(recipe, jpeg, 500 + s);
      const vision::RecipeParams& params = ran.params;
      ours.push_back(std::move(ran.out));
      std::ostringstream ops;
      ops << crop_line(recipe, params);
      bool all_exact = true;
      for (std::size_t k = 1; k < recipe.ops().size(); ++k) {
        const auto& op = recipe.ops()[k];
        if (std::holds_alternative<vision::RandomHorizontalFlip>(op) && params.applies(k)) ops << "hflip\n";
        Interpolation interp = Interpolation::nearest;
        std::vector<double> fill;
        if (const auto* t = std::get_if<vision::TrivialAugmentWide>(&op)) {
          interp = t->interpolation;
          fill = t->fill;
        }
        for (const AugmentStep& step : params.draws.empty() ? std::vector<AugmentStep>{}
                                                            : params.draws[k].augment) {
          ops << "augment " << augment_args(step, interp, fill) << "\n";
          all_exact = all_exact && exact(step.op, interp);
        }
      }
      ops << "to_float 1\n";
      const fs::path path = dir / ("ops" + std::to_string(ours.size()));
      vision::test::write_bytes(path, ops.str());
      commands += "recipe " + (dir / "a.jpg").string() + " " + path.string() + " " +
                  (dir / ("out" + std::to_string(ours.size()))).string() + "\n";
      exact_case.push_back(all_exact);
    }
  }
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  std::size_t exact_samples = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    CAPTURE(i);
    const auto ops_file = vision::test::read_bytes(dir / ("ops" + std::to_string(i + 1)));
    const std::string ops_text(ops_file.begin(), ops_file.end());
    CAPTURE(ops_text);
    const float largest = largest_difference(dir / ("out" + std::to_string(i + 1)), ours[i]);
    CHECK(largest <= (exact_case[i] ? 0.0f : 1.0f / 255.0f + 1e-6f));
    exact_samples += exact_case[i] ? 1 : 0;
  }
  MESSAGE(exact_samples << " of " << ours.size() << " samples compared exactly");
  CHECK(exact_samples > 10);
}

TEST_CASE("augment: a flip before any policy op equals flipping the crop, then the op, to the bit") {
  // The recipe defers a horizontal flip to its float write past the ops that commute with it
  // (colour ops, Equalize, AutoContrast, ...) and flips in place before the others (warps,
  // Sharpness): either way the pixels of flip-then-op, by the public functions.
  const auto jpeg = vision::test::synthetic_jpeg(320, 240, 17);
  const vision::ImageInfo info = vision::peek(jpeg);
  const Recipe crop_only = Recipe{vision::RandomResizedCrop{48, 40}, vision::ToTensor{}}.with_dct_scaling(false);
  const AugmentStep steps[] = {
      {AugmentOp::Identity, 0.0},     {AugmentOp::ShearX, 0.3},      {AugmentOp::ShearY, -0.2},
      {AugmentOp::TranslateX, 7.0},   {AugmentOp::TranslateY, -5.0}, {AugmentOp::Rotate, 23.0},
      {AugmentOp::Brightness, 0.4},   {AugmentOp::Color, -0.6},      {AugmentOp::Contrast, 0.7},
      {AugmentOp::Sharpness, 0.9},    {AugmentOp::Posterize, 3.0},   {AugmentOp::Solarize, 100.0},
      {AugmentOp::AutoContrast, 0.0}, {AugmentOp::Equalize, 0.0},    {AugmentOp::Invert, 0.0}};
  int checked = 0;
  for (const bool flip : {false, true}) {
    const Recipe recipe = Recipe{vision::RandomResizedCrop{48, 40},
                                 vision::RandomHorizontalFlip{flip ? 1.0 : 0.0},
                                 vision::TrivialAugmentWide{}, vision::ToTensor{}}
                              .with_dct_scaling(false);
    for (const AugmentStep& step : steps) {
      CAPTURE(flip);
      const std::string op = vision::augment_op_name(step.op);
      CAPTURE(op);
      at::Generator gen = coload::make_generator(7);
      vision::RecipeParams params = recipe.sample(info, gen);
      REQUIRE(params.draws.size() == 4);
      params.draws[2].augment = {step};
      std::vector<float> out(3 * 48 * 40);
      recipe.apply(jpeg, info, params, out.data());
      // The same box, by the crop alone, back to uint8 (ToTensor's v / 255 undone exactly).
      at::Generator same = coload::make_generator(7);
      const vision::RecipeParams crop_params = crop_only.sample(info, same);
      REQUIRE(crop_params.box == params.box);
      std::vector<float> crop(3 * 48 * 40);
      crop_only.apply(jpeg, info, crop_params, crop.data());
      Image image = Image::zeros(40, 48, 3);
      for (int c = 0; c < 3; ++c) {
        for (int i = 0; i < 48 * 40; ++i) {
          image.data[static_cast<std::size_t>(3 * i + c)] = static_cast<std::uint8_t>(
              std::lround(crop[static_cast<std::size_t>(c * 48 * 40 + i)] * 255.0f));
        }
      }
      if (flip) image = vision::hflip(image.view());
      const Image want = vision::apply_augment_op(image.view(), step);
      int differ = 0;
      for (int c = 0; c < 3; ++c) {
        for (int i = 0; i < 48 * 40; ++i) {
          const float v = static_cast<float>(want.data[static_cast<std::size_t>(3 * i + c)]) / 255.0f;
          differ += out[static_cast<std::size_t>(c * 48 * 40 + i)] != v;
        }
      }
      CHECK(differ == 0);
      ++checked;
    }
  }
  CHECK(checked == 30);
}

TEST_CASE("augment: bad policy parameters are refused when the recipe is built") {
  using vision::RandomResizedCrop;
  using vision::ToTensor;
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::TrivialAugmentWide{31, Interpolation::nearest, {1, 2}},
              ToTensor{}}),
      "Recipe: op 1 (TrivialAugmentWide): The number of elements in 'fill' cannot broadcast to "
      "match the number of channels of the image (2 != 3)",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{
          RandomResizedCrop{32},
          vision::AutoAugment{vision::AutoAugmentPolicy::imagenet, Interpolation::nearest, {300}},
          ToTensor{}}),
      "Recipe: op 1 (AutoAugment): fill values of a uint8 image lie in [0, 255], got 300.0",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::TrivialAugmentWide{1, Interpolation::nearest, {}},
              ToTensor{}}),
      "Recipe: op 1 (TrivialAugmentWide): num_magnitude_bins must be at least 2, got 1",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandAugment{2, 31, 31, Interpolation::nearest, {}},
              ToTensor{}}),
      "Recipe: op 1 (RandAugment): magnitude must lie in [0, num_magnitude_bins) = [0, 31), "
      "got 31",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandAugment{-1, 9, 31, Interpolation::nearest, {}},
              ToTensor{}}),
      "Recipe: op 1 (RandAugment): num_ops must lie in [0, 64], got -1", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, ToTensor{}, vision::TrivialAugmentWide{}}),
      "Recipe: op 2 (TrivialAugmentWide): comes after the conversion to float; the fused "
      "pipeline runs it on uint8 pixels only, so put it before ToDtype/ToTensor",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      vision::apply_augment_op(Image::zeros(4, 4, 1).view(), {AugmentOp::Rotate, 3}),
      "Rotate needs an RGB image, got 1 channels", std::invalid_argument);
  // RandAugment with no ops draws nothing and leaves the crop as it is.
  at::Generator gen = coload::make_generator(3);
  CHECK(vision::RandAugment{0, 9, 31, Interpolation::nearest, {}}.draw(32, 32, gen).empty());
}


TEST_CASE("augment: the resnet50 preset is torchvision's ResNet-50 recipe, and runs") {
  const Recipe train = vision::presets::train("resnet50");
  const Recipe eval = vision::presets::eval("resnet50");
  CHECK(vision::presets::names() == std::vector<std::string>{"classic", "resnet50"});
  CHECK(train.output_height() == 176);
  CHECK(train.output_width() == 176);
  CHECK(eval.output_height() == 224);
  CHECK(train.has_batch_op());
  CHECK_FALSE(eval.has_batch_op());
  const auto& ops = train.ops();
  REQUIRE(ops.size() == 7);
  CHECK(std::get<vision::RandomResizedCrop>(ops[0]).height == 176);
  CHECK(std::holds_alternative<vision::RandomHorizontalFlip>(ops[1]));
  CHECK(std::get<vision::TrivialAugmentWide>(ops[2]).num_magnitude_bins == 31);
  // train.py's --interpolation (bilinear), which presets.py passes to TrivialAugmentWide.
  CHECK(std::get<vision::TrivialAugmentWide>(ops[2]).interpolation ==
        vision::Interpolation::bilinear);
  CHECK(std::get<vision::ToDtype>(ops[3]).scale);
  CHECK(std::get<vision::RandomErasing>(ops[5]).p == 0.1);
  const auto& choice = std::get<vision::RandomChoice>(ops[6]);
  REQUIRE(choice.transforms.size() == 2);
  CHECK(std::get<vision::MixUp>(choice.transforms[0]).alpha == 0.2);
  CHECK(std::get<vision::CutMix>(choice.transforms[1]).alpha == 1.0);
  CHECK(std::get<vision::Resize>(eval.ops()[0]).size == 232);
  CHECK(std::get<vision::CenterCrop>(eval.ops()[1]).height == 224);
  // Per sample: the policy drew one op, and the output differs from the same recipe without it
  // on some seeds (where the op is not Identity) and equals it on others.
  const auto jpeg = vision::test::synthetic_jpeg(400, 300, 5);
  const Recipe plain{vision::RandomResizedCrop{176}, vision::RandomHorizontalFlip{},
                     vision::ToDtype{at::kFloat, true},
                     vision::Normalize{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}},
                     vision::RandomErasing{0.1}};
  int changed = 0;
  int same = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    at::Generator g1 = coload::make_generator(seed);
    const vision::RecipeParams params = train.sample(vision::peek(jpeg), g1);
    REQUIRE(params.draws.size() == 7);
    REQUIRE(params.draws[2].augment.size() == 1);
    std::vector<float> a(3 * 176 * 176);
    std::vector<float> b(3 * 176 * 176);
    train.apply(jpeg, vision::peek(jpeg), params, a.data());
    // The plain recipe draws the same crop and flip, then no policy: it matches where the
    // policy's op was Identity and RandomErasing did not apply (its draws then shift).
    at::Generator g2 = coload::make_generator(seed);
    const vision::RecipeParams plain_params = plain.sample(vision::peek(jpeg), g2);
    plain.apply(jpeg, vision::peek(jpeg), plain_params, b.data());
    CHECK((plain_params.box == params.box));
    if (params.draws[2].augment[0].op == AugmentOp::Identity && !params.applies(5) &&
        !plain_params.applies(4)) {
      CHECK(a == b);
      ++same;
    } else if (a != b) {
      ++changed;
    }
  }
  CHECK(same > 0);
  CHECK(changed > 30);
}


TEST_CASE("augment: RandomRotation and RandomAffine draw as torchvision's get_params" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  TempDir dir;
  REQUIRE(vision::test::run_reference(dir, "warp_draws 0 200 40 48 " + (dir / "w").string() + "\n") ==
          Reference::ok);
  std::ifstream in(dir / "w");
  const vision::RandomRotation rotation{.degrees = {-30.0, 45.0}};
  const vision::RandomAffine affine{.degrees = {-20.0, 10.0}, .translate = {{0.1, 0.2}},
                                    .scale = {{0.8, 1.2}}, .shear = {-5.0, 5.0, -3.0, 8.0}};
  std::set<int> shifts;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    double angle = 0, a = 0, sc = 0, shx = 0, shy = 0;
    int tx = 0, ty = 0;
    REQUIRE(static_cast<bool>(in >> angle >> a >> tx >> ty >> sc >> shx >> shy));
    at::Generator gen = coload::make_generator(seed);
    CHECK(rotation.get_params(gen) == angle);
    const auto p = affine.get_params(40, 48, gen);
    CHECK(p.angle == a);
    CHECK(p.translate[0] == tx);
    CHECK(p.translate[1] == ty);
    CHECK(p.scale == sc);
    CHECK(p.shear[0] == shx);
    CHECK(p.shear[1] == shy);
    shifts.insert(tx);
  }
  CHECK(shifts.size() >= 5);  // -5 .. 5 for 0.1 of 48
}

TEST_CASE("augment: recipes with RandomRotation and RandomAffine equal F.rotate and F.affine" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const vision::test::FollowReference follow;  // its torch's grid and solve
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(500, 375, 43);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  struct Case {
    Recipe recipe;
    Interpolation interp;
  };
  const Case cases[] = {
      {Recipe{vision::RandomResizedCrop{56, 48}, vision::RandomRotation{.degrees = {-45.0, 45.0}},
              vision::ToTensor{}},
       Interpolation::nearest},
      {Recipe{vision::RandomResizedCrop{40}, vision::RandomRotation{{-90.0, 90.0}, Interpolation::nearest,
                                                                    false, {{10.0, 5.0}}, {10, 200, 30}},
              vision::ToTensor{}},
       Interpolation::nearest},
      {Recipe{vision::RandomResizedCrop{48, 56},
              vision::RandomAffine{.degrees = {-20.0, 20.0}, .translate = {{0.1, 0.2}},
                                   .scale = {{0.7, 1.3}}, .shear = {-10.0, 10.0, -5.0, 5.0}},
              vision::ToTensor{}},
       Interpolation::nearest},
      {Recipe{vision::RandomResizedCrop{48},
              vision::RandomAffine{{-20.0, 20.0}, {{0.2, 0.1}}, {{0.9, 1.1}}, {-15.0, 15.0},
                                   Interpolation::bilinear, {128}, {{5.0, 40.0}}},
              vision::ToTensor{}},
       Interpolation::bilinear},
  };
  std::string commands;
  std::vector<std::vector<float>> ours;
  std::vector<Interpolation> interps;
  for (const Case& c : cases) {
    const Recipe recipe = c.recipe.with_dct_scaling(false);
    for (std::uint64_t s = 0; s < 12; ++s) {
      Ran ran = run_seeded(recipe, jpeg, 700 + s);
      const vision::RecipeParams& params = ran.params;
      ours.push_back(std::move(ran.out));
      interps.push_back(c.interp);
      const auto& op = recipe.ops()[1];
      const bool rotate = std::holds_alternative<vision::RandomRotation>(op);
      const auto& fill = rotate ? std::get<vision::RandomRotation>(op).fill
                                : std::get<vision::RandomAffine>(op).fill;
      const auto& center = rotate ? std::get<vision::RandomRotation>(op).center
                                  : std::get<vision::RandomAffine>(op).center;
      std::ostringstream ops;
      ops << crop_line(recipe, params) << "warp " << (rotate ? "rotate" : "affine");
      for (double d : params.draws[1].affine) ops << " " << number(d);
      ops << " " << (c.interp == Interpolation::nearest ? "nearest" : "bilinear") << " ";
      for (std::size_t k = 0; k < 3; ++k) ops << (k ? "," : "") << fill[fill.size() == 1 ? 0 : k];
      ops << " " << (center ? number((*center)[0]) + "," + number((*center)[1]) : "none")
          << "\nto_float 1\n";
      const fs::path path = dir / ("ops" + std::to_string(ours.size()));
      vision::test::write_bytes(path, ops.str());
      commands += "recipe " + (dir / "a.jpg").string() + " " + path.string() + " " +
                  (dir / ("out" + std::to_string(ours.size()))).string() + "\n";
    }
  }
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  float worst_bilinear = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    CAPTURE(i);
    const float largest = largest_difference(dir / ("out" + std::to_string(i + 1)), ours[i]);
    CHECK(largest <= (interps[i] == Interpolation::nearest ? 0.0f : 1.0f / 255.0f + 1e-6f));
    if (interps[i] == Interpolation::bilinear) worst_bilinear = std::max(worst_bilinear, largest);
  }
  MESSAGE("RandomRotation/RandomAffine: nearest exact, bilinear within " << worst_bilinear);
}

TEST_CASE("augment: bad RandomRotation and RandomAffine parameters are refused at build") {
  using vision::RandomResizedCrop;
  using vision::ToTensor;
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandomRotation{.degrees = {10.0, -10.0}}, ToTensor{}}),
      "Recipe: op 1 (RandomRotation): degrees should be a range (min, max), got (10.0, -10.0)",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32},
              vision::RandomRotation{.degrees = {-10.0, 10.0}, .expand = true}, ToTensor{}}),
      "Recipe: op 1 (RandomRotation): expand=True makes each sample's size depend on its angle, "
      "but a recipe's batch has one size: not supported in a recipe",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandomAffine{.translate = {{1.5, 0.0}}}, ToTensor{}}),
      "Recipe: op 1 (RandomAffine): translation values should be between 0 and 1",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandomAffine{.scale = {{0.0, 1.0}}}, ToTensor{}}),
      "Recipe: op 1 (RandomAffine): scale values should be positive", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandomAffine{.shear = {1.0, 2.0, 3.0}}, ToTensor{}}),
      "Recipe: op 1 (RandomAffine): shear should be a sequence of length 2 or 4.",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      (Recipe{RandomResizedCrop{32}, vision::RandomAffine{.fill = {1, 2}}, ToTensor{}}),
      "Recipe: op 1 (RandomAffine): The number of elements in 'fill' cannot broadcast to match "
      "the number of channels of the image (2 != 3)",
      std::invalid_argument);
}

}  // TEST_SUITE

TEST_CASE("augment: every op runs on the smallest images and keeps their size") {
  // Sharpness leaves images of 2 pixels or less on a side as they are (torchvision does); the
  // warps sample a one-pixel source; Equalize's step is 0 on so few pixels (unchanged).
  for (const auto& [w, h] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{3, 2}, std::pair{3, 3}}) {
    CAPTURE(w);
    CAPTURE(h);
    const Image img = vision::test::synthetic_image(w, h, 3);
    for (int op = 0; op <= static_cast<int>(AugmentOp::Invert); ++op) {
      CAPTURE(op);
      for (const Interpolation interp : {Interpolation::nearest, Interpolation::bilinear}) {
        const Image out =
            vision::apply_augment_op(img.view(), {static_cast<AugmentOp>(op), 0.5}, interp, {7});
        CHECK(out.width == w);
        CHECK(out.height == h);
        const auto o = static_cast<AugmentOp>(op);
        if (o == AugmentOp::Identity || o == AugmentOp::Equalize ||
            (o == AugmentOp::Sharpness && (w <= 2 || h <= 2))) {
          CHECK(out.data == img.data);
        }
        if (o == AugmentOp::Invert) {
          for (std::size_t i = 0; i < img.data.size(); ++i) CHECK(out.data[i] == 255 - img.data[i]);
        }
      }
    }
  }
}
