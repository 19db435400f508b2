// tools/bench/vision/transforms: one thread's rate of the fused train and eval transforms
// against a full decode of the same JPEGs, the peer: what any decode-then-transform pipeline
// pays before its first transform. (This was a case of the vision test, which could only
// assert a rate above zero.)
//
//   transforms [--images N] [--width W] [--height H] [--rounds N] [--repeat N] [--json]
//
// Makes --images synthetic JPEGs (quality 90, 4:2:0) of W x H, then times, --repeat times in
// turn, --rounds passes over them of: vision::decode_into (the whole image, at full scale), the
// ImageNet train transform (TrainTransform: RandomResizedCrop 224 + flip + normalize, decoded at
// the DCT scale the crop allows) and the eval transform (EvalTransform: Resize 256, CenterCrop
// 224, normalize). The best pass of each counts. Prints images/s and each transform's rate over
// the decode's; --json prints one object:
// {"decode_per_s": r, "train_per_s": r, "eval_per_s": r, "train_over_decode": x,
//  "eval_over_decode": x}.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "coload/dataset/sample_context.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/image.hpp"
#include "coload/vision/transforms.hpp"

namespace vision = coload::vision;

namespace {

struct Args {
  int images = 8;
  int width = 500;
  int height = 400;
  int rounds = 12;
  int repeat = 3;
  bool json = false;
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse(int argc, char** argv) {
  Args args;
  CLI::App app{"transforms: the fused train and eval transforms against a full decode of the "
               "same JPEGs, on one thread"};
  const CLI::Validator positive =
      CLI::Range(1, std::numeric_limits<int>::max()).description("POSITIVE");
  const CLI::Validator side = CLI::Range(16, 8192).description("16..8192");
  app.add_option("--images", args.images, "distinct JPEGs")->check(positive)->capture_default_str();
  app.add_option("--width", args.width, "their width")->check(side)->capture_default_str();
  app.add_option("--height", args.height, "their height")->check(side)->capture_default_str();
  app.add_option("--rounds", args.rounds, "passes over the images per timing")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--repeat", args.repeat, "timings of each, in turn; the best counts")
      ->check(positive)
      ->capture_default_str();
  app.add_flag("--json", args.json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return args;
}

/// Smooth gradients under a little noise, different for each `seed`: JPEG content that costs
/// what a photograph's does to decode, neither a flat field nor pure noise.
vision::Image synthetic(int width, int height, std::uint32_t seed) {
  vision::Image img = vision::Image::zeros(width, height, 3);
  std::uint32_t state = seed * 2654435761u + 12345u;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      state = state * 1664525u + 1013904223u;
      const int noise = static_cast<int>(state >> 28) - 8;
      std::uint8_t* p = img.data.data() + (static_cast<std::size_t>(y) * width + x) * 3;
      p[0] = static_cast<std::uint8_t>(std::clamp(255 * x / width + noise, 0, 255));
      p[1] = static_cast<std::uint8_t>(std::clamp(255 * y / height + noise, 0, 255));
      p[2] = static_cast<std::uint8_t>(std::clamp(static_cast<int>((x + y + seed * 37) % 256) + noise, 0, 255));
    }
  }
  return img;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::vector<std::vector<std::byte>> jpegs;
  for (int i = 0; i < args.images; ++i) {
    jpegs.push_back(vision::encode_jpeg(
        synthetic(args.width, args.height, static_cast<std::uint32_t>(50 + i)).view(), 90));
  }
  // Images per second of `body(i)` over --rounds passes.
  auto rate = [&](auto&& body) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < args.rounds; ++r) {
      for (std::size_t i = 0; i < jpegs.size(); ++i) body(i);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(args.rounds) * static_cast<double>(jpegs.size()) / s;
  };
  std::vector<std::uint8_t> buffer;
  std::vector<float> out(3 * 224 * 224);
  const vision::TrainTransform train;
  const vision::EvalTransform eval;
  std::int64_t index = 0;
  double decode_best = 0, train_best = 0, eval_best = 0;
  for (int k = 0; k < args.repeat; ++k) {
    decode_best = std::max(decode_best, rate([&](std::size_t i) { vision::decode_into(jpegs[i], buffer); }));
    train_best = std::max(train_best, rate([&](std::size_t i) {
      coload::Rng rng = coload::Rng::for_sample(0, 0, index++);
      train(jpegs[i], rng, out.data());
    }));
    eval_best = std::max(eval_best, rate([&](std::size_t i) { eval(jpegs[i], out.data()); }));
  }
  if (args.json) {
    std::printf("{\"decode_per_s\": %.1f, \"train_per_s\": %.1f, \"eval_per_s\": %.1f, "
                "\"train_over_decode\": %.3f, \"eval_over_decode\": %.3f}\n",
                decode_best, train_best, eval_best, train_best / decode_best,
                eval_best / decode_best);
  } else {
    std::printf("%d JPEGs of %dx%d, one thread, best of %d x %d passes:\n", args.images,
                args.width, args.height, args.repeat, args.rounds);
    std::printf("  full decode (the peer)  %8.1f images/s\n", decode_best);
    std::printf("  fused train transform   %8.1f images/s  %.2fx the decode\n", train_best,
                train_best / decode_best);
    std::printf("  fused eval transform    %8.1f images/s  %.2fx the decode\n", eval_best,
                eval_best / decode_best);
  }
  return 0;
}
