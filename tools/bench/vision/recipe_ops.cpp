// tools/bench/vision/recipe_ops: what a recipe and each of its ops cost per image, against the
// fixed TrainTransform and EvalTransform in the same run, on the same files held in memory.
//
//   recipe_ops ROOT [--limit 400] [--rounds 5]
//
// Every variant transforms every image once per round on this one thread (a sample's Rng is
// (0, 0, index), so each variant draws the same crops); the time is this thread's CPU time,
// the median of the rounds, and the rounds interleave the variants so that a busy machine
// slows them alike. An op's cost is its variant's time minus the variant without it; the
// random ops run with p = 1, so the figure is what the op costs where it applies. A user's op
// (Custom) that does nothing shows what running one in the fused pipeline costs.

#include <ATen/Parallel.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "coload/vision/decode.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/recipe.hpp"

namespace vision = coload::vision;

namespace {

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Variant {
  std::string name;
  std::string baseline;  // the variant whose time this one's op adds to ("" for none)
  vision::FusedTransform transform;
  std::vector<double> ms;
};

vision::Normalize imagenet() {
  return {{vision::imagenet_mean.begin(), vision::imagenet_mean.end()},
          {vision::imagenet_std.begin(), vision::imagenet_std.end()}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string root;
  int limit = 400;
  int rounds = 5;
  CLI::App app{"recipe_ops: CPU per image of recipes and their ops, against TrainTransform and "
               "EvalTransform in the same run"};
  app.add_option("ROOT", root, "an ImageFolder tree")->required();
  app.add_option("--limit", limit, "images used")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a bad flag: exit 2, as every coload tool
  }
  at::set_num_threads(1);

  vision::FolderOptions options;
  options.extensions.emplace(vision::image_extensions.begin(), vision::image_extensions.end());
  const vision::FolderIndex index = vision::index_folder(root, options);
  std::vector<std::vector<std::byte>> files;
  for (const auto& s : index.samples) {
    if (static_cast<int>(files.size()) == limit) break;
    std::ifstream in(s.path, std::ios::binary);
    std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    files.emplace_back(reinterpret_cast<const std::byte*>(bytes.data()),
                       reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
  }
  if (files.empty()) {
    std::fprintf(stderr, "recipe_ops: no images under %s\n", root.c_str());
    return 1;
  }
  using namespace vision;
  std::vector<Variant> variants;
  variants.push_back({"TrainTransform", "", TrainTransform{}, {}});
  variants.push_back({"classic train recipe", "TrainTransform", presets::train("classic"), {}});
  variants.push_back({"RandomResizedCrop+ToTensor+Normalize", "",
                      Recipe{RandomResizedCrop{224}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomHorizontalFlip(1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandomHorizontalFlip{1.0}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomVerticalFlip(1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandomVerticalFlip{1.0}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomGrayscale(1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandomGrayscale{1.0}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ Normalize twice", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, ToTensor{}, imagenet(), imagenet()}, {}});
  variants.push_back({"+ ColorJitter(0.4, 0.4, 0.4)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, ColorJitter{0.4, 0.4, 0.4}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ ColorJitter(0.4, 0.4, 0.4, 0.1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, ColorJitter{0.4, 0.4, 0.4, 0.1}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ GaussianBlur(23)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, GaussianBlur{23}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomErasing(1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, ToTensor{}, imagenet(), RandomErasing{1.0}}, {}});
  variants.push_back({"+ TrivialAugmentWide", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, TrivialAugmentWide{}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandAugment(2, 9)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandAugment{}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ AutoAugment(ImageNet)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, AutoAugment{}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomPerspective(p=1)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandomPerspective{0.5, 1.0}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomPerspective(p=1, nearest)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224},
                             RandomPerspective{0.5, 1.0, Interpolation::nearest}, ToTensor{}, imagenet()}, {}});
  // The warps alone, nearest (torchvision's default): their grid is the linked torch's bmm.
  variants.push_back({"+ RandomRotation(30)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, RandomRotation{{-30.0, 30.0}}, ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ RandomAffine(10, (0.1, 0.1), (0.9, 1.1), 10)",
                      "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224},
                             RandomAffine{{-10.0, 10.0}, {{0.1, 0.1}}, {{0.9, 1.1}}, {-10.0, 10.0}},
                             ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ AugMix", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, AugMix{}, ToTensor{}, imagenet()}, {}});
  // A user's op that does nothing costs what keeping the crop whole costs (the rows are kept
  // as uint8, then written): its own work is the rest.
  variants.push_back({"+ Custom (nothing, on the crop)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, Custom("nothing", [](ImageSpan&, coload::Rng&) {}),
                             ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ Custom (invert, on the crop)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224},
                             Custom("invert",
                                    [](ImageSpan& img, coload::Rng&) {
                                      for (int y = 0; y < img.height; ++y) {
                                        std::uint8_t* row = img.row(y);
                                        for (int x = 0; x < img.width * 3; ++x) row[x] = static_cast<std::uint8_t>(255 - row[x]);
                                      }
                                    }),
                             ToTensor{}, imagenet()}, {}});
  variants.push_back({"+ Custom (nothing, on the floats)", "RandomResizedCrop+ToTensor+Normalize",
                      Recipe{RandomResizedCrop{224}, ToTensor{}, imagenet(),
                             Custom("nothing", [](const at::Tensor&, coload::Rng&) {})}, {}});
  // The resnet50 preset per sample (its batch op is timed below) against the same crop size's
  // RandomResizedCrop-and-flip recipe: the "whole recipe at most 1.25x" figure.
  variants.push_back({"RRC(176)+flip+ToDtype+Normalize", "",
                      Recipe{RandomResizedCrop{176}, RandomHorizontalFlip{}, ToDtype{at::kFloat, true},
                             imagenet()}, {}});
  variants.push_back({"resnet50 train recipe, per sample", "RRC(176)+flip+ToDtype+Normalize",
                      presets::train("resnet50"), {}});
  variants.push_back({"EvalTransform", "", EvalTransform{}, {}});
  variants.push_back({"classic eval recipe", "EvalTransform", presets::eval("classic"), {}});
  std::vector<float> out(3 * 224 * 224);
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) {
      const double t0 = thread_seconds();
      for (std::size_t i = 0; i < files.size(); ++i) {
        coload::Rng rng = coload::Rng::for_sample(0, 0, static_cast<coload::Index>(i));
        fused_apply(v.transform, files[i], rng, out.data());
      }
      v.ms.push_back((thread_seconds() - t0) * 1e3 / static_cast<double>(files.size()));
    }
  }
  std::printf("recipe_ops: %zu images of %s, %d interleaved rounds, median thread CPU ms/image\n\n",
              files.size(), root.c_str(), rounds);
  std::printf("%-40s %9s %9s %s\n", "variant", "ms/image", "ratio", "(ratio and cost against)");
  for (const auto& v : variants) {
    const double ms = median(v.ms);
    if (v.baseline.empty()) {
      std::printf("%-40s %9.3f\n", v.name.c_str(), ms);
      continue;
    }
    const auto base = std::find_if(variants.begin(), variants.end(),
                                   [&](const Variant& b) { return b.name == v.baseline; });
    const double b = median(base->ms);
    std::printf("%-40s %9.3f %9.3f %+.3f ms against %s\n", v.name.c_str(), ms, ms / b, ms - b,
                v.baseline.c_str());
  }
  // Each augmentation op alone on 224 x 224 uint8 crops of the images (the policies' ops cost
  // what they cost wherever they are drawn), and the resnet50 preset's batch op per image.
  std::vector<Image> crops;
  for (const auto& f : files) {
    const Image full = decode(f);
    if (full.width < 224 || full.height < 224) continue;
    Image crop = Image::zeros(224, 224, 3);
    for (int y = 0; y < 224; ++y) {
      std::copy_n(full.pixel(0, y), 224 * 3, crop.pixel(0, y));
    }
    crops.push_back(std::move(crop));
  }
  if (!crops.empty()) {
    std::printf("\naugmentation ops alone, on %zu 224 x 224 uint8 crops (each op copies the crop "
                "once, as the public form does; the copy alone is Identity's row)\n",
                crops.size());
    const std::pair<AugmentOp, double> ops[] = {
        {AugmentOp::Identity, 0.0},   {AugmentOp::ShearX, 0.3},      {AugmentOp::ShearY, 0.3},
        {AugmentOp::TranslateX, 14.0}, {AugmentOp::TranslateY, 14.0}, {AugmentOp::Rotate, 30.0},
        {AugmentOp::Brightness, 0.5}, {AugmentOp::Color, 0.5},       {AugmentOp::Contrast, 0.5},
        {AugmentOp::Sharpness, 0.5},  {AugmentOp::Posterize, 4.0},   {AugmentOp::Solarize, 128.0},
        {AugmentOp::AutoContrast, 0.0}, {AugmentOp::Equalize, 0.0},  {AugmentOp::Invert, 0.0}};
    for (const Interpolation interp : {Interpolation::nearest, Interpolation::bilinear}) {
      for (const auto& [op, m] : ops) {
        const bool geometric = op == AugmentOp::ShearX || op == AugmentOp::ShearY ||
                               op == AugmentOp::TranslateX || op == AugmentOp::TranslateY ||
                               op == AugmentOp::Rotate;
        if (interp == Interpolation::bilinear && !geometric) continue;
        std::vector<double> ms;
        for (int r = 0; r < rounds; ++r) {
          const double t0 = thread_seconds();
          for (const Image& c : crops) (void)apply_augment_op(c.view(), {op, m}, interp);
          ms.push_back((thread_seconds() - t0) * 1e3 / static_cast<double>(crops.size()));
        }
        std::printf("%-40s %9.3f\n",
                    (std::string(augment_op_name(op)) +
                     (interp == Interpolation::bilinear ? " (bilinear)" : "")).c_str(),
                    median(ms));
      }
    }
  }
  {
    const Recipe r50 = presets::train("resnet50");
    at::Tensor images = at::rand({64, 3, 176, 176});
    const at::Tensor labels = at::randint(1000, {64});
    std::vector<double> ms;
    for (int r = 0; r < rounds * 4; ++r) {
      at::Generator gen = Recipe::batch_generator(0, 0, r);
      const double t0 = thread_seconds();
      (void)r50.mix_batch(images, labels, 1000, gen);
      ms.push_back((thread_seconds() - t0) * 1e3 / 64.0);
    }
    std::printf("\n%-40s %9.3f\n", "resnet50 MixUp/CutMix, per image (N=64)", median(ms));
    // A user's batch op that does nothing: what running one costs per image.
    const Recipe custom{RandomResizedCrop{176}, ToTensor{},
                        CustomBatch("nothing", [](at::Tensor&, at::Tensor&, coload::Rng&) {})};
    ms.clear();
    for (int r = 0; r < rounds * 4; ++r) {
      const double t0 = thread_seconds();
      (void)custom.run_batch_ops(images, labels, 1000, 0, 0, r);
      ms.push_back((thread_seconds() - t0) * 1e3 / 64.0);
    }
    std::printf("%-40s %9.3f\n", "CustomBatch (nothing), per image (N=64)", median(ms));
  }
  return 0;
}
