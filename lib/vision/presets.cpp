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
  if (name != "classic") {
    throw InvalidArgument("unknown recipe preset '" + name + "'; the presets are: classic");
  }
}
}  // namespace

Recipe train(const std::string& name) {
  check_name(name);
  return Recipe{RandomResizedCrop{224}, RandomHorizontalFlip{}, ToTensor{}, imagenet_normalize()};
}

Recipe eval(const std::string& name) {
  check_name(name);
  return Recipe{Resize{256}, CenterCrop{224}, ToTensor{}, imagenet_normalize()};
}

std::vector<std::string> names() { return {"classic"}; }
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
