// vision tests: a user's own ops in a recipe (Custom on the uint8 crop or the float output,
// CustomBatch on the collated batch) and RandomPerspective and AugMix: what a user's op does is
// seen exactly in the batch, batches are the same whatever the executor, a throwing op is a
// SampleError naming index and op; RandomPerspective and AugMix against torchvision's forward
// after torch.manual_seed (draws, then outputs), and the refusals.

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "coload/loader/data_loader.hpp"
#include "coload/sampler/random.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/recipe.hpp"
#include "image_test_support.hpp"
#include "reference_arithmetic.hpp"

namespace vision = coload::vision;
namespace fs = std::filesystem;
using vision::AugmentOp;
using vision::Custom;
using vision::CustomBatch;
using vision::ImageSpan;
using vision::Interpolation;
using vision::Recipe;
using vision::test::Reference;
using vision::test::TempDir;

namespace {

vision::Normalize imagenet() { return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}}; }

struct Ran {
  vision::RecipeParams params;
  std::vector<float> out;
};

Ran run_seeded(const Recipe& recipe, std::span<const std::byte> encoded, std::uint64_t seed) {
  at::Generator gen = coload::make_generator(seed);
  const vision::ImageInfo info = vision::peek(encoded);
  Ran ran{recipe.sample(info, gen), {}};
  ran.out.resize(3 * static_cast<std::size_t>(recipe.output_height()) * recipe.output_width());
  recipe.apply(encoded, info, ran.params, ran.out.data());
  return ran;
}

// A folder of 7 JPEGs in two classes, and their bytes by index.
struct Folder {
  TempDir dir;
  std::vector<std::vector<std::byte>> files;
  Folder() {
    for (int i = 0; i < 7; ++i) {
      const fs::path path = dir / (std::string(i < 4 ? "a/" : "b/") + std::to_string(i) + ".jpg");
      fs::create_directories(path.parent_path());
      files.push_back(vision::test::synthetic_jpeg(60 + 7 * i, 50 + 3 * i, 40 + i));
      vision::test::write_bytes(path, files.back());
    }
  }
};

std::string refusal(std::initializer_list<vision::RecipeOp> ops) {
  try {
    Recipe recipe(ops);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(built)";
}

// The uint8 values reference.py wrote for `count` outputs of h x w, as floats (CHW, as a
// recipe with ToDtype(float32, scale=false) writes them).
std::vector<std::vector<float>> read_outputs(const fs::path& path, int count, int h, int w) {
  const auto raw = vision::test::read_bytes(path);
  const std::size_t n = static_cast<std::size_t>(h) * w * 3;
  REQUIRE(raw.size() == n * static_cast<std::size_t>(count));
  std::vector<std::vector<float>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<float> chw(n);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 3; ++c) {
          chw[(static_cast<std::size_t>(c) * h + y) * w + x] =
              raw[n * i + (static_cast<std::size_t>(y) * w + x) * 3 + c];
        }
      }
    }
    out.push_back(std::move(chw));
  }
  return out;
}

float largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float largest = 0;
  for (std::size_t k = 0; k < a.size(); ++k) largest = std::max(largest, std::fabs(a[k] - b[k]));
  return largest;
}

std::string number(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

}  // namespace

TEST_SUITE("vision") {

TEST_CASE("recipe: a Custom op on the uint8 crop changes exactly what it does, with its own Rng") {
  const auto jpeg = vision::test::synthetic_jpeg(120, 90, 3);
  const Recipe plain{vision::RandomResizedCrop{32}, vision::RandomHorizontalFlip{},
                     vision::ToDtype{at::kFloat, true}};
  // Inverts every value, then writes a value drawn from its Rng at (0, 0) of the red plane;
  // records the view it was given and what it drew.
  struct Seen {
    int width = 0, height = 0, channels = 0;
    std::ptrdiff_t stride = 0;
    std::int64_t drawn = -1;
  };
  auto seen = std::make_shared<Seen>();
  const Recipe custom{
      vision::RandomResizedCrop{32}, vision::RandomHorizontalFlip{},
      Custom("invert+mark",
             [seen](ImageSpan& img, coload::Rng& rng) {
               *seen = {img.width, img.height, img.channels, img.stride, rng.randint(0, 256)};
               for (int y = 0; y < img.height; ++y) {
                 for (int x = 0; x < img.width * 3; ++x) {
                   img.row(y)[x] = static_cast<std::uint8_t>(255 - img.row(y)[x]);
                 }
               }
               img.row(0)[0] = static_cast<std::uint8_t>(seen->drawn);
             }),
      vision::ToDtype{at::kFloat, true}};
  std::vector<std::int64_t> draws;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    CAPTURE(seed);
    const Ran want = run_seeded(plain, jpeg, seed);
    const Ran got = run_seeded(custom, jpeg, seed);
    CHECK(seen->width == 32);
    CHECK(seen->height == 32);
    CHECK(seen->channels == 3);
    CHECK(seen->stride == 96);
    // The op's seed is drawn after the ops before it: their draws are the plain recipe's.
    CHECK((got.params.box == want.params.box));
    CHECK(got.params.applies(1) == want.params.applies(1));
    REQUIRE(got.out.size() == want.out.size());
    // ToDtype(float32, scale=True): v2's float32 v · (1 / 255).
    const float unit = static_cast<float>(1.0 / 255.0);
    for (std::size_t k = 1; k < want.out.size(); ++k) {
      const int v = static_cast<int>(std::lround(want.out[k] * 255.0f));
      if (got.out[k] != static_cast<float>(255 - v) * unit) {
        FAIL_CHECK("value " << k << ": " << got.out[k] << " for " << v);
        break;
      }
    }
    CHECK(got.out[0] == static_cast<float>(seen->drawn) * unit);
    // The op's Rng is a function of the sample's generator: the same seed draws the same.
    const std::int64_t first = seen->drawn;
    (void)run_seeded(custom, jpeg, seed);
    CHECK(seen->drawn == first);
    draws.push_back(first);
  }
  std::sort(draws.begin(), draws.end());
  CHECK(std::unique(draws.begin(), draws.end()) - draws.begin() >= 8);
}

TEST_CASE("recipe: a Custom op on the float output runs after Normalize, in order with "
          "RandomErasing") {
  const auto jpeg = vision::test::synthetic_jpeg(100, 80, 5);
  const vision::RandomErasing erase{1.0, {0.1, 0.2}, {0.5, 2.0}, {0.75}};
  const Recipe plain{vision::RandomResizedCrop{24}, vision::ToTensor{}, imagenet(), erase};
  const Recipe custom{vision::RandomResizedCrop{24}, vision::ToTensor{}, imagenet(), erase,
                      Custom("double", [](const at::Tensor& t, coload::Rng&) {
                        CHECK(t.sizes() == at::IntArrayRef{3, 24, 24});
                        t.mul_(2.0);
                      })};
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    CAPTURE(seed);
    const Ran want = run_seeded(plain, jpeg, seed);
    const Ran got = run_seeded(custom, jpeg, seed);
    std::size_t erased = 0;
    for (std::size_t k = 0; k < want.out.size(); ++k) {
      CHECK(got.out[k] == 2.0f * want.out[k]);
      erased += want.out[k] == 0.75f ? 1 : 0;
    }
    CHECK(erased > 0);  // the doubled values include the erased box's (1.5)
  }
}

TEST_CASE("recipe: Custom and CustomBatch in the loader: the same batches with 0 or 2 thread "
          "workers and 2 processes, and what they throw names the sample or batch and the op") {
  Folder folder;
  const Recipe recipe{
      vision::RandomResizedCrop{24}, vision::RandomHorizontalFlip{},
      Custom("noise",
             [](ImageSpan& img, coload::Rng& rng) {
               for (int y = 0; y < img.height; ++y) {
                 for (int x = 0; x < img.width * 3; ++x) {
                   const auto v = static_cast<int>(img.row(y)[x]) + rng.randint(0, 8);
                   img.row(y)[x] = static_cast<std::uint8_t>(std::min<std::int64_t>(v, 255));
                 }
               }
             }),
      vision::ToTensor{}, imagenet(),
      Custom("scale", [](const at::Tensor& t, coload::Rng& rng) { t.mul_(0.5 + rng.uniform()); }),
      CustomBatch("shift", [](at::Tensor& images, at::Tensor& labels, coload::Rng& rng) {
        images.add_(static_cast<double>(rng.randint(0, 100)));
        labels = labels + 100 * rng.randint(1, 5);
      })};
  constexpr std::uint64_t seed = 17;
  auto batches = [&](int workers, coload::Executor executor) {
    auto loader = coload::make_data_loader(
        vision::ImagePipeline(folder.dir.path(), recipe),
        {.batch_size = 3, .num_workers = workers, .seed = seed, .executor = executor});
    std::vector<std::pair<at::Tensor, at::Tensor>> out;
    for (auto& [images, labels] : loader) out.emplace_back(images, labels);
    return out;
  };
  const auto reference = batches(0, coload::Executor::threads);
  REQUIRE(reference.size() == 3);
  // Each batch is the recipe on each file with the sample's Rng, then the batch op with the
  // batch's: computed here without a loader.
  for (std::size_t b = 0; b < reference.size(); ++b) {
    CAPTURE(b);
    const std::int64_t n = reference[b].first.size(0);
    at::Tensor want = at::empty({n, 3, 24, 24});
    std::vector<std::int64_t> labels;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t i = static_cast<std::int64_t>(b) * 3 + r;
      coload::Rng rng = coload::Rng::for_sample(seed, 0, i);
      want[r].copy_(recipe(folder.files[static_cast<std::size_t>(i)], rng));
      labels.push_back(i < 4 ? 0 : 1);
    }
    const at::Tensor want_labels = recipe.run_batch_ops(
        want, at::tensor(labels, at::kLong), 2, seed, 0, static_cast<std::int64_t>(b));
    CHECK(at::equal(reference[b].first, want));
    CHECK(at::equal(reference[b].second, want_labels));
    CHECK(reference[b].second.min().item<std::int64_t>() >= 100);
  }
  for (const auto executor : {coload::Executor::threads, coload::Executor::processes}) {
    CAPTURE(static_cast<int>(executor));
    const auto got = batches(2, executor);
    REQUIRE(got.size() == reference.size());
    for (std::size_t b = 0; b < got.size(); ++b) {
      CHECK(at::equal(got[b].first, reference[b].first));
      CHECK(at::equal(got[b].second, reference[b].second));
    }
  }

  // A throwing per-sample op: the usual error, naming the sample's index, the op and its
  // message; a throwing batch op names the batch and the op. One sample a batch, so that the
  // first error is sample 0's whatever the workers.
  const Recipe throwing{vision::RandomResizedCrop{24},
                        Custom("boom",
                               [](ImageSpan&, coload::Rng&) { throw std::runtime_error("kaboom"); }),
                        vision::ToTensor{}};
  const Recipe throwing_batch{vision::RandomResizedCrop{24}, vision::ToTensor{},
                              CustomBatch("bad", [](at::Tensor&, at::Tensor&, coload::Rng&) {
                                throw std::out_of_range("nope");
                              })};
  const Recipe misshaping{vision::RandomResizedCrop{24}, vision::ToTensor{},
                          CustomBatch("shrink", [](at::Tensor& images, at::Tensor&, coload::Rng&) {
                            images = images[0];
                          })};
  struct Failure {
    const Recipe* recipe;
    std::int64_t index;
    std::vector<std::string> says;
  };
  const Failure failures[] = {
      {&throwing, 0, {"sample 0 of batch 0", "Recipe: op 1 (Custom 'boom') failed: kaboom", "0.jpg"}},
      {&throwing_batch, -1, {"Recipe: op 2 (CustomBatch 'bad') on batch 0 failed: nope"}},
      {&misshaping, -1, {"Recipe: op 2 (CustomBatch 'shrink') on batch 0: left images or labels "
                         "of the wrong shape (images must stay float32 [1, C, H, W], labels [1, ...])"}},
  };
  for (const Failure& f : failures) {
    for (const auto& [workers, executor] :
         {std::pair{0, coload::Executor::threads}, std::pair{2, coload::Executor::threads},
          std::pair{2, coload::Executor::processes}}) {
      CAPTURE(f.says[0]);
      CAPTURE(workers);
      CAPTURE(static_cast<int>(executor));
      auto loader = coload::make_data_loader(
          vision::ImagePipeline(folder.dir.path(), *f.recipe),
          {.batch_size = 1, .num_workers = workers, .seed = 1, .executor = executor});
      bool failed = false;
      try {
        for (auto& batch : loader) (void)batch;
      } catch (const coload::WorkerError& e) {
        failed = true;
        const std::string what = e.what();
        CAPTURE(what);
        CHECK(e.batch() == 0);
        CHECK(e.index() == f.index);
        for (const std::string& s : f.says) CHECK(what.find(s) != std::string::npos);
      }
      CHECK(failed);
    }
  }
}

TEST_CASE("recipe: user ops, RandomPerspective and AugMix with bad parameters are refused at "
          "build") {
  using vision::RandomResizedCrop;
  using vision::ToTensor;
  const auto pixels = [](ImageSpan&, coload::Rng&) {};
  const auto floats = [](const at::Tensor&, coload::Rng&) {};
  const auto batch = [](at::Tensor&, at::Tensor&, coload::Rng&) {};
  CHECK(refusal({RandomResizedCrop{8}, Custom("x", Custom::PixelFn{}), ToTensor{}}) ==
        "Recipe: op 1 (Custom 'x'): the callable is empty (null)");
  CHECK(refusal({RandomResizedCrop{8}, Custom("", pixels), ToTensor{}}) ==
        "Recipe: op 1 (Custom ''): a Custom op needs a name (its errors are named by it)");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, Custom("late", pixels)}) ==
        "Recipe: op 2 (Custom 'late'): its callable takes the uint8 crop (ImageSpan), but it "
        "comes after the conversion to float: put it before ToDtype/ToTensor, or give it a "
        "callable on the float output (const at::Tensor&)");
  CHECK(refusal({RandomResizedCrop{8}, Custom("early", floats), ToTensor{}}) ==
        "Recipe: op 1 (Custom 'early'): its callable takes the float output (const "
        "at::Tensor&), but it comes before the conversion to float: put it after "
        "ToDtype/ToTensor and every Normalize, or give it a callable on the uint8 crop "
        "(ImageSpan&)");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, Custom("f", floats), imagenet()}) ==
        "Recipe: op 3 (Normalize): Normalize after Custom 'f' (an op on the float output) is "
        "not supported in a recipe: Normalize runs as the float conversion's table, so put the "
        "op after every Normalize");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, CustomBatch("b", CustomBatch::Fn{})}) ==
        "Recipe: op 2 (CustomBatch 'b'): the callable is empty (null)");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, CustomBatch("b", batch), Custom("f", floats)}) ==
        "Recipe: op 2 (CustomBatch 'b'): a batch op (MixUp, CutMix, RandomChoice of them, "
        "CustomBatch) runs on the collated batch, so only batch ops may follow it (op 3 is "
        "Custom 'f')");
  CHECK(refusal({RandomResizedCrop{8}, CustomBatch("b", batch), ToTensor{}}) ==
        "Recipe: op 1 (CustomBatch 'b'): a batch op (MixUp, CutMix, RandomChoice of them, "
        "CustomBatch) runs on the collated batch, so only batch ops may follow it (op 2 is "
        "ToTensor)");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, vision::MixUp{}, vision::CutMix{}}) ==
        "Recipe: op 3 (CutMix): a recipe has at most one MixUp/CutMix op: use RandomChoice to "
        "pick one per batch");
  // Batch ops in any order at the tail.
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, CustomBatch("a", batch), vision::MixUp{},
                 CustomBatch("b", batch)}) == "(built)");
  CHECK(refusal({RandomResizedCrop{8}, vision::RandomPerspective{1.5}, ToTensor{}}) ==
        "Recipe: op 1 (RandomPerspective): Argument distortion_scale value should be between 0 "
        "and 1");
  CHECK(refusal({RandomResizedCrop{8}, vision::RandomPerspective{0.5, -0.1}, ToTensor{}}) ==
        "Recipe: op 1 (RandomPerspective): `p` should be a floating point value in the interval "
        "[0.0, 1.0].");
  CHECK(refusal({RandomResizedCrop{8},
                 vision::RandomPerspective{0.5, 0.5, Interpolation::bilinear, {1, 2}}, ToTensor{}}) ==
        "Recipe: op 1 (RandomPerspective): The number of elements in 'fill' cannot broadcast to "
        "match the number of channels of the image (2 != 3)");
  CHECK(refusal({RandomResizedCrop{8}, ToTensor{}, vision::RandomPerspective{}}) ==
        "Recipe: op 2 (RandomPerspective): comes after the conversion to float; the fused "
        "pipeline runs it on uint8 pixels only, so put it before ToDtype/ToTensor");
  CHECK(refusal({RandomResizedCrop{8}, vision::AugMix{0}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): The severity must be between [1, 10]. Got 0 instead.");
  CHECK(refusal({RandomResizedCrop{8}, vision::AugMix{11}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): The severity must be between [1, 10]. Got 11 instead.");
  CHECK(refusal({RandomResizedCrop{8}, vision::AugMix{3, 0}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): mixture_width must lie in [1, 64], got 0");
  CHECK(refusal({RandomResizedCrop{8}, vision::AugMix{3, 3, 65}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): chain_depth must be at most 64 (or <= 0 for 1 to 3 ops per "
        "chain), got 65");
  CHECK(refusal({RandomResizedCrop{8}, vision::AugMix{3, 3, -1, 0.0}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): alpha must be a positive number (the Dirichlet's "
        "concentration), got 0.0");
  CHECK(refusal({RandomResizedCrop{8},
                 vision::AugMix{3, 3, -1, 1.0, true, Interpolation::bilinear, {256}}, ToTensor{}}) ==
        "Recipe: op 1 (AugMix): fill values of a uint8 image lie in [0, 255], got 256.0");
  CHECK(refusal({RandomResizedCrop{8}, vision::RandomPerspective{0.0, 1.0}, vision::AugMix{10},
                 ToTensor{}}) == "(built)");
}

TEST_CASE("recipe: perspective and AugMix as functions: identity corners, sizes, bad params") {
  const vision::Image img = vision::test::synthetic_image(9, 7, 2);
  const auto start = vision::RandomPerspective::Corners{{{0, 0}, {8, 0}, {8, 6}, {0, 6}}};
  // The corners mapped onto themselves: coefficients of the identity (within float32's
  // rounding), so nearest sampling returns every pixel where it was.
  CHECK(vision::perspective(img.view(), start, start, Interpolation::nearest).data == img.data);
  const auto moved = vision::RandomPerspective::Corners{{{2, 1}, {7, 0}, {8, 5}, {1, 6}}};
  const vision::Image warped = vision::perspective(img.view(), start, moved);
  CHECK(warped.width == 9);
  CHECK(warped.height == 7);
  CHECK(warped.data != img.data);
  CHECK_THROWS_WITH_AS(vision::perspective(vision::Image::zeros(4, 4, 1).view(), start, moved),
                       "perspective needs an RGB image, got 1 channels", std::invalid_argument);
  // AugMix's public form draws and applies; Params that do not fit are refused.
  at::Generator gen = coload::make_generator(4);
  const vision::AugMix augmix{};
  const vision::AugMix::Params params = augmix.draw(7, 9, gen);
  CHECK(params.weights.size() == 4);
  CHECK(params.depths.size() == 3);
  float total = 0;
  for (float w : params.weights) total += w;
  CHECK(std::fabs(total - 1.0f) < 1e-5f);
  CHECK(augmix(img.view(), params).data.size() == img.data.size());
  vision::AugMix::Params bad = params;
  bad.weights.pop_back();
  CHECK_THROWS_AS(augmix(img.view(), bad), std::invalid_argument);
  CHECK_THROWS_WITH_AS(vision::AugMix{0}.draw(7, 9, gen),
                       "The severity must be between [1, 10]. Got 0 instead.", std::invalid_argument);
}

TEST_CASE("recipe: RandomPerspective draws torchvision's corners and equals its forward" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const vision::test::FollowReference follow;  // its torch's grid and solve
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(160, 120, 9);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  struct Case {
    int h, w;
    vision::RandomPerspective op;
    const char* fill;
  };
  const Case cases[] = {
      {48, 48, vision::RandomPerspective{}, "0"},
      {40, 56, vision::RandomPerspective{0.5, 0.8, Interpolation::nearest, {10, 200, 30}}, "10,200,30"},
      {56, 40, vision::RandomPerspective{1.0, 1.0, Interpolation::nearest, {0}}, "0"},
      {44, 52, vision::RandomPerspective{0.7, 1.0, Interpolation::bilinear, {128}}, "128"},
  };
  constexpr int seeds = 40;
  std::string commands;
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    const Case& k = cases[c];
    commands += "perspective_forward " + (dir / "a.jpg").string() + " " + std::to_string(k.h) +
                " " + std::to_string(k.w) + " 0 " + std::to_string(seeds) + " " +
                number(k.op.distortion_scale) + " " + number(k.op.p) + " " +
                (k.op.interpolation == Interpolation::nearest ? "nearest " : "bilinear ") +
                k.fill + " " + (dir / ("p" + std::to_string(c))).string() + " " +
                (dir / ("d" + std::to_string(c))).string() + "\n";
  }
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    const Case& k = cases[c];
    CAPTURE(c);
    const Recipe recipe{vision::CenterCrop{k.h, k.w}, k.op, vision::ToDtype{at::kFloat, false}};
    const auto theirs = read_outputs(dir / ("p" + std::to_string(c)), seeds, k.h, k.w);
    std::ifstream draws(dir / ("d" + std::to_string(c)));
    int applied = 0;
    int exact = 0;
    float worst = 0;
    for (int seed = 0; seed < seeds; ++seed) {
      CAPTURE(seed);
      const Ran ours = run_seeded(recipe, jpeg, static_cast<std::uint64_t>(seed));
      std::string line;
      REQUIRE(static_cast<bool>(std::getline(draws, line)));
      std::istringstream words(line);
      int their_applied = 0;
      words >> their_applied;
      REQUIRE(ours.params.applies(1) == (their_applied == 1));
      if (their_applied == 1) {
        ++applied;
        for (const auto& point : ours.params.draws[1].corners) {
          int x = -1, y = -1;
          words >> x >> y;
          CHECK(point[0] == x);
          CHECK(point[1] == y);
        }
      }
      const auto& want = theirs[static_cast<std::size_t>(seed)];
      const float d = largest_difference(ours.out, want);
      if (k.op.interpolation == Interpolation::nearest) {
        // The coefficients come from lstsq through the LAPACK of the linked libtorch: against a
        // reference running that torch every value is equal; against another (the libtorch-2
        // build against Debian's 1.13) a coordinate within rounding of a pixel boundary may
        // take its neighbour, so a few values (under 1%) may differ, none other.
        std::size_t differ = 0;
        for (std::size_t v = 0; v < want.size(); ++v) differ += ours.out[v] != want[v] ? 1 : 0;
        if (vision::test::reference_arithmetic().linked_torch) {
          CHECK(differ == 0);
        } else {
          CHECK(differ * 100 <= want.size());
        }
      } else {
        CHECK(d <= 1.0f);
      }
      exact += d == 0 ? 1 : 0;
      worst = std::max(worst, d);
    }
    MESSAGE("RandomPerspective case " << c << ": " << applied << " of " << seeds
                                      << " applied, " << exact << " exact, largest difference "
                                      << worst << " (of 255)");
    CHECK(applied > 0);
  }
}

TEST_CASE("recipe: AugMix draws torchvision's weights and ops and equals its forward" *
          coload::testing::needs(vision::test::torchvision_reference())) {
  coload::testing::require(vision::test::torchvision_reference());
  const vision::test::FollowReference follow;  // its torch's grid and solve
  TempDir dir;
  const auto jpeg = vision::test::synthetic_jpeg(160, 120, 11);
  vision::test::write_bytes(dir / "a.jpg", jpeg);
  struct Case {
    int h, w;
    vision::AugMix op;
    const char* fill;
  };
  const Case cases[] = {
      {40, 48, vision::AugMix{}, "none"},
      {48, 40, vision::AugMix{10, 2, 2, 0.5, false, Interpolation::nearest, {128}}, "128"},
      {36, 36, vision::AugMix{1, 4, 3, 2.0, true, Interpolation::nearest, {}}, "none"},
  };
  constexpr int seeds = 40;
  std::string commands;
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    const Case& k = cases[c];
    commands += "augmix_forward " + (dir / "a.jpg").string() + " " + std::to_string(k.h) + " " +
                std::to_string(k.w) + " 0 " + std::to_string(seeds) + " " +
                std::to_string(k.op.severity) + " " + std::to_string(k.op.mixture_width) + " " +
                std::to_string(k.op.chain_depth) + " " + number(k.op.alpha) + " " +
                (k.op.all_ops ? "1 " : "0 ") +
                (k.op.interpolation == Interpolation::nearest ? "nearest " : "bilinear ") + k.fill +
                " " + (dir / ("m" + std::to_string(c))).string() + " " +
                (dir / ("d" + std::to_string(c))).string() + "\n";
  }
  REQUIRE(vision::test::run_reference(dir, commands) == Reference::ok);
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    const Case& k = cases[c];
    CAPTURE(c);
    const Recipe recipe{vision::CenterCrop{k.h, k.w}, k.op, vision::ToDtype{at::kFloat, false}};
    const auto theirs = read_outputs(dir / ("m" + std::to_string(c)), seeds, k.h, k.w);
    std::ifstream draws(dir / ("d" + std::to_string(c)));
    int exact = 0;
    float worst = 0;
    std::size_t ops = 0;
    for (int seed = 0; seed < seeds; ++seed) {
      CAPTURE(seed);
      const Ran ours = run_seeded(recipe, jpeg, static_cast<std::uint64_t>(seed));
      const vision::OpDraw& d = ours.params.draws[1];
      std::string line;
      REQUIRE(static_cast<bool>(std::getline(draws, line)));
      CAPTURE(line);
      std::istringstream words(line);
      for (const float w : d.weights) {
        double theirs_w = 0;
        words >> theirs_w;
        CHECK(static_cast<double>(w) == theirs_w);
      }
      std::string bar;
      words >> bar;
      CHECK(bar == "|");
      REQUIRE(d.depths.size() == static_cast<std::size_t>(k.op.mixture_width));
      bool all_exact = k.op.interpolation == Interpolation::nearest;
      for (const vision::AugmentStep& s : d.augment) {
        std::string name, magnitude;
        words >> name >> magnitude;
        CHECK(vision::augment_op_name(s.op) == name);
        CHECK(s.magnitude == std::stod(magnitude));
        all_exact = all_exact && s.op != AugmentOp::Sharpness;
        ++ops;
      }
      std::string rest;
      CHECK_FALSE(static_cast<bool>(words >> rest));  // no op of theirs left over
      for (const int depth : d.depths) {
        CHECK(depth >= 1);
        CHECK(depth <= (k.op.chain_depth > 0 ? k.op.chain_depth : 3));
      }
      const float diff = largest_difference(ours.out, theirs[static_cast<std::size_t>(seed)]);
      // Exact where every op is (nearest sampling, no Sharpness); else each chain's value is
      // within 1, and so is the weighted mix after truncation.
      CHECK(diff <= (all_exact ? 0.0f : 1.0f));
      exact += diff == 0 ? 1 : 0;
      worst = std::max(worst, diff);
    }
    MESSAGE("AugMix case " << c << ": " << ops << " ops over " << seeds << " seeds, " << exact
                           << " outputs exact, largest difference " << worst << " (of 255)");
  }
}

TEST_CASE("recipe: the warps' grids round as the linked torch's bmm does, to the bit") {
  namespace d = vision::detail;
  // torch's own loop (below 400 products: 66 pixels or fewer) is plain in every version.
  CHECK(d::linked_grid_form(66) == d::GridForm::plain);
  const d::GridForm large = d::linked_grid_form(67);
  CHECK(large != d::GridForm::linked);
  MESSAGE("linked torch " << TORCH_VERSION << ": grids above 66 pixels are "
                          << vision::test::grid_form_name(large));
  // Sizes about the 66-pixel threshold, tall, wide, odd; the policies' shears, rotations,
  // translations and RandomAffine's scales; perspective corners anywhere in the distortion.
  const std::pair<int, int> sizes[] = {{1, 1}, {11, 6}, {67, 1}, {1, 67}, {9, 8}, {48, 40},
                                       {33, 17}, {5, 300}, {176, 176}};
  std::mt19937 rng(31);
  const auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  std::size_t told_apart = 0;
  std::size_t warps = 0;
  for (const auto& [w, h] : sizes) {
    CAPTURE(w);
    CAPTURE(h);
    const std::size_t n = 2 * static_cast<std::size_t>(w) * h;
    for (int k = 0; k < 6; ++k) {
      CAPTURE(k);
      const auto m = d::inverse_affine_matrix(
          {0.0, 0.0}, uniform(-30, 30), {std::round(uniform(-5, 5)), 0.0}, uniform(0.8, 1.2),
          {std::atan(uniform(-0.3, 0.3)) * 180 / M_PI, k % 2 ? 0.0 : uniform(-10, 10)});
      std::vector<float> linked(n), aten(n), plain(n), fused(n);
      d::affine_grid(m, w, h, d::GridForm::linked, linked.data());
      d::affine_grid(m, w, h, d::GridForm::aten, aten.data());
      d::affine_grid(m, w, h, d::GridForm::plain, plain.data());
      d::affine_grid(m, w, h, d::GridForm::fused, fused.data());
      CHECK(linked == aten);
      told_apart += plain != fused ? 1 : 0;
      // The warps on the grids: as the linked torch computes them, and through at::bmm.
      const vision::Image img = vision::test::synthetic_image(w, h, static_cast<std::uint32_t>(k));
      // (Corners of an image under 2 pixels a side make lstsq's system singular.)
      at::Generator gen = coload::make_generator(static_cast<std::uint64_t>(k));
      const auto end = vision::RandomPerspective{0.6, 1.0}.get_params(h, w, gen);
      const auto coeffs = w > 1 && h > 1
                              ? d::perspective_coefficients(d::perspective_startpoints(h, w), end)
                              : std::array<float, 8>{1, 0, 0, 0, 1, 0, 0, 0};
      for (const Interpolation interp : {Interpolation::nearest, Interpolation::bilinear}) {
        std::vector<std::uint8_t> out[2][2];
        for (int forced = 0; forced < 2; ++forced) {
          const d::GridForm previous =
              d::set_grid_form(forced ? d::GridForm::aten : d::GridForm::linked);
          CHECK(previous == d::GridForm::linked);
          for (int warp = 0; warp < 2; ++warp) {
            out[forced][warp] = img.data;
            const d::RgbSpan span{out[forced][warp].data(), w, h};
            if (warp == 0) d::warp_affine(span, m, interp, {7, 8, 9});
            if (warp == 1) d::warp_perspective(span, coeffs, interp, {});
          }
          d::set_grid_form(previous);
        }
        CHECK(out[0][0] == out[1][0]);
        CHECK(out[0][1] == out[1][1]);
        warps += 4;
      }
    }
  }
  MESSAGE(warps << " warps equal to at::bmm's; plain and fused grids differ in " << told_apart
                << " of " << std::size(sizes) * 6);
  CHECK(told_apart > 20);
  // A forced form holds above 66 pixels only, and set_grid_form hands back the previous one.
  const auto m = d::inverse_affine_matrix({0.0, 0.0}, 7.0, {0.0, 0.0}, 1.0, {11.3, 3.0});
  std::vector<float> got(2 * 48 * 40), plain(got.size()), fused(got.size());
  d::affine_grid(m, 48, 40, d::GridForm::plain, plain.data());
  d::affine_grid(m, 48, 40, d::GridForm::fused, fused.data());
  REQUIRE(plain != fused);
  for (const auto form : {d::GridForm::plain, d::GridForm::fused}) {
    const d::GridForm previous = d::set_grid_form(form);
    d::affine_grid(m, 48, 40, d::GridForm::linked, got.data());
    CHECK(got == (form == d::GridForm::plain ? plain : fused));
    std::vector<float> small(2 * 11 * 6), small_plain(small.size());
    d::affine_grid(m, 11, 6, d::GridForm::linked, small.data());
    d::affine_grid(m, 11, 6, d::GridForm::plain, small_plain.data());
    CHECK(small == small_plain);
    CHECK(d::set_grid_form(previous) == form);
  }
}

}  // TEST_SUITE
