// vision/presets: the named recipes, and the transform the image pipelines run (one of the two
// fixed transforms or a recipe).

#include "coload/core/error.hpp"
#include "coload/vision/recipe.hpp"

#include <string>
#include <vector>

namespace coload::vision {

// ---- Presets and the pipelines' transform ---------------------------------------------------

namespace presets {
namespace {
Normalize imagenet_normalize() {
  return Normalize{{imagenet_mean.begin(), imagenet_mean.end()},
                   {imagenet_std.begin(), imagenet_std.end()}};
}
void check_name(const std::string& name) {
  if (name != "classic" && name != "resnet50") {
    throw InvalidArgument("unknown recipe preset '" + name + "'; the presets are: classic, resnet50");
  }
}
}  // namespace

Recipe train(const std::string& name) {
  check_name(name);
  if (name == "resnet50") {
    // torchvision's references/classification recipe for ResNet-50 IMAGENET1K_V2 ("How to train
    // state-of-the-art models"): --train-crop-size 176 --auto-augment ta_wide
    // --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 (train.py picks one of MixUp and
    // CutMix per batch, with equal odds). Its classes are the pipeline's (num_classes 0).
    // TrivialAugmentWide warps bilinearly there (train.py's --interpolation, passed on by
    // presets.py), not with the class's own default, nearest.
    return Recipe{RandomResizedCrop{176},
                  RandomHorizontalFlip{},
                  TrivialAugmentWide{31, Interpolation::bilinear, {}},
                  ToDtype{at::kFloat, true},
                  imagenet_normalize(),
                  RandomErasing{0.1},
                  RandomChoice{{MixUp{0.2}, CutMix{1.0}}, {}}};
  }
  return Recipe{RandomResizedCrop{224}, RandomHorizontalFlip{}, ToTensor{}, imagenet_normalize()};
}

Recipe eval(const std::string& name) {
  check_name(name);
  if (name == "resnet50") {
    // --val-resize-size 232 --val-crop-size 224.
    return Recipe{Resize{232}, CenterCrop{224}, ToDtype{at::kFloat, true}, imagenet_normalize()};
  }
  return Recipe{Resize{256}, CenterCrop{224}, ToTensor{}, imagenet_normalize()};
}

std::vector<std::string> names() { return {"classic", "resnet50"}; }
}  // namespace presets

int fused_output_size(const FusedTransform& t) noexcept {
  if (const auto* train = std::get_if<TrainTransform>(&t)) return train->size;
  if (const auto* eval = std::get_if<EvalTransform>(&t)) return eval->crop_size;
  const Recipe& recipe = std::get<Recipe>(t);
  return recipe.output_height() == recipe.output_width() ? recipe.output_height() : 0;
}

void fused_apply(const FusedTransform& t, std::span<const std::byte> encoded, Rng& rng,
                 float* dst) {
  if (const auto* train = std::get_if<TrainTransform>(&t)) {
    (*train)(encoded, rng, dst);
  } else if (const auto* eval = std::get_if<EvalTransform>(&t)) {
    (*eval)(encoded, dst);
  } else {
    std::get<Recipe>(t)(encoded, rng, dst);
  }
}

namespace detail {
void check_square_output(const FusedTransform& t, const char* who) {
  if (fused_output_size(t) > 0) return;
  const Recipe& recipe = std::get<Recipe>(t);
  std::string what(who);
  what += " writes square images into [N, 3, S, S] batches, but the recipe's output is ";
  what += std::to_string(recipe.output_height()) + "x" + std::to_string(recipe.output_width());
  what += " (height x width)";
  throw InvalidArgument(what);
}
}  // namespace detail

}  // namespace coload::vision
