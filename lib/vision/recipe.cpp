// vision/recipe: a composition of torchvision ops, checked once when built and then run by the
// fused core (fused.hpp): geometry in the decode, uint8 ops per resampled row, ToDtype and
// Normalize as one table while writing.

#include "coload/vision/recipe.hpp"
#include "coload/core/error.hpp"

#include "fused.hpp"

#include <ATen/ATen.h>

#include <cstring>
#include <string>
#include <utility>

namespace coload::vision {

// ---- Ops ------------------------------------------------------------------------------------

Image vflip(const ImageView& src) {
  Image out = Image::zeros(src.width, src.height, src.channels);
  const auto row_bytes = static_cast<std::size_t>(src.width) * src.channels;
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, src.height - 1 - y), src.row(y), row_bytes);
  }
  return out;
}

namespace {

// torchvision's tensor rgb_to_grayscale for one pixel: `(0.2989 * r + 0.587 * g + 0.114 * b)`
// in float32 (a uint8 tensor times a Python float is float32), each product and sum rounded to
// float in that order, then `.to(uint8)`, which truncates.
inline std::uint8_t gray_of(std::uint8_t r, std::uint8_t g, std::uint8_t b) noexcept {
  const float pr = static_cast<float>(r) * 0.2989f;
  const float pg = static_cast<float>(g) * 0.587f;
  const float pb = static_cast<float>(b) * 0.114f;
  return static_cast<std::uint8_t>((pr + pg) + pb);
}

// Grays `width` RGB pixels of `in` into `out` (three equal channels), `times` times over, as
// that many Grayscale ops in a row would (each truncates again).
void gray_row(const std::uint8_t* in, std::uint8_t* out, int width, int times) {
  for (int x = 0; x < width; ++x) {
    const std::uint8_t* p = in + 3 * x;
    std::uint8_t l = gray_of(p[0], p[1], p[2]);
    for (int t = 1; t < times; ++t) l = gray_of(l, l, l);
    out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = l;
  }
}

}  // namespace

Image rgb_to_grayscale(const ImageView& src, int num_output_channels) {
  if (num_output_channels != 1 && num_output_channels != 3) {
    throw InvalidArgument("num_output_channels should be either 1 or 3");
  }
  if (src.channels != 1 && src.channels != 3) {
    throw InvalidArgument(std::string("rgb_to_grayscale needs 1 or 3 channels, got ") +
                          std::to_string(src.channels));
  }
  Image out = Image::zeros(src.width, src.height, num_output_channels);
  for (int y = 0; y < src.height; ++y) {
    const std::uint8_t* in = src.row(y);
    for (int x = 0; x < src.width; ++x) {
      const std::uint8_t l =
          src.channels == 3 ? gray_of(in[3 * x], in[3 * x + 1], in[3 * x + 2]) : in[x];
      std::memset(out.pixel(x, y), l, static_cast<std::size_t>(num_output_channels));
    }
  }
  return out;
}

bool RandomVerticalFlip::draw(at::Generator& gen) const {
  return at::rand({1}, gen).item<float>() < static_cast<float>(p);
}

Image RandomVerticalFlip::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return vflip(image.view());
  return image;
}

Image Grayscale::operator()(const Image& image) const {
  return rgb_to_grayscale(image.view(), num_output_channels);
}

bool RandomGrayscale::draw(at::Generator& gen) const {
  return at::rand({1}, gen).item<float>() < static_cast<float>(p);
}

Image RandomGrayscale::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return rgb_to_grayscale(image.view(), image.channels);
  return image;
}

at::Tensor ToDtype::operator()(const at::Tensor& image) const {
  if (image.scalar_type() == dtype) return image;
  if (scale && image.scalar_type() == at::kByte && at::isFloatingType(dtype)) {
    return image.to(dtype).div(255);
  }
  if (scale && !(image.is_floating_point() && at::isFloatingType(dtype))) {
    throw InvalidArgument("ToDtype with scale supports uint8 or floating point to floating "
                          "point only");
  }
  return image.to(dtype);
}

// ---- The recipe's plan ----------------------------------------------------------------------

struct Recipe::Plan {
  std::vector<RecipeOp> ops;
  // The leading geometry: RandomResizedCrop, or Resize (then CenterCrop).
  bool random_crop = false;
  RandomResizedCrop crop;
  Resize resize;
  bool center = false;
  int crop_height = 0;
  int crop_width = 0;
  int out_height = 0;
  int out_width = 0;
  // The uint8 ops on the crop, in order; flips and grayscale commute (one moves pixels, the
  // other maps each pixel alone), so a sample needs only each kind's count.
  enum class Kind { hflip, vflip, gray };
  struct Step {
    Kind kind;
    double p;     // < 0 for an op that always applies
    std::size_t op;
  };
  std::vector<Step> steps;
  std::uint64_t always = 0;  // the ops that apply to every sample
  detail::NormalizeTable table;
  bool dct_scaling = true;
};

namespace {

const char* op_name(const RecipeOp& op) {
  static constexpr const char* names[] = {
      "RandomResizedCrop", "Resize",    "CenterCrop", "RandomHorizontalFlip",
      "RandomVerticalFlip", "Grayscale", "RandomGrayscale", "ToTensor", "ToDtype", "Normalize"};
  static_assert(std::size(names) == std::variant_size_v<RecipeOp>);
  return names[op.index()];
}

[[noreturn]] void refuse(std::size_t k, const RecipeOp& op, const std::string& why) {
  throw InvalidArgument(std::string("Recipe: op ") + std::to_string(k) + " (" + op_name(op) + "): " + why);
}

void check_p(std::size_t k, const RecipeOp& op, double p) {
  // NOTE: torchvision.transforms.v2's wording (_RandomApplyTransform); a NaN fails it too.
  if (!(p >= 0.0 && p <= 1.0)) {
    refuse(k, op, "`p` should be a floating point value in the interval [0.0, 1.0].");
  }
}

std::array<float, 3> per_channel(std::size_t k, const RecipeOp& op, const std::vector<double>& v,
                                 const char* what) {
  if (v.size() != 1 && v.size() != 3) {
    refuse(k, op, std::string(what) +
                      " needs 1 or 3 values (one per channel of an RGB image), got " +
                      std::to_string(v.size()));
  }
  std::array<float, 3> out{};
  for (std::size_t c = 0; c < 3; ++c) out[c] = static_cast<float>(v[v.size() == 1 ? 0 : c]);
  return out;
}

std::shared_ptr<Recipe::Plan> build(std::vector<RecipeOp> ops) {
  auto plan = std::make_shared<Recipe::Plan>();
  using Kind = Recipe::Plan::Kind;
  if (ops.empty()) {
    throw InvalidArgument("Recipe: no ops; a recipe starts with RandomResizedCrop or Resize");
  }
  std::size_t k = 0;
  const auto bit = [](std::size_t i) { return std::uint64_t{1} << i; };
  if (ops.size() > 64) {
    throw InvalidArgument(std::string("Recipe: ") + std::to_string(ops.size()) + " ops; at most 64");
  }
  // The leading geometry.
  if (const auto* rrc = std::get_if<RandomResizedCrop>(&ops[0])) {
    if (rrc->height <= 0 || rrc->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(rrc->height) + "x" +
                            std::to_string(rrc->width));
    }
    if (rrc->scale[0] > rrc->scale[1] || rrc->ratio[0] > rrc->ratio[1]) {
      refuse(0, ops[0], "Scale and ratio should be of kind (min, max)");
    }
    if (!(rrc->scale[0] >= 0.0) || !(rrc->ratio[0] > 0.0)) {
      refuse(0, ops[0], "scale must be non-negative and ratio positive");
    }
    plan->random_crop = true;
    plan->crop = *rrc;
    plan->out_height = rrc->height;
    plan->out_width = rrc->width > 0 ? rrc->width : rrc->height;
    plan->always |= bit(0);
    k = 1;
  } else if (const auto* resize = std::get_if<Resize>(&ops[0])) {
    if (resize->size <= 0 || resize->width < 0) {
      refuse(0, ops[0], std::string("size must be positive, got ") + std::to_string(resize->size) +
                            (resize->width > 0 ? std::string("x") + std::to_string(resize->width) : ""));
    }
    plan->resize = *resize;
    plan->always |= bit(0);
    k = 1;
    if (k < ops.size()) {
      if (const auto* cc = std::get_if<CenterCrop>(&ops[k])) {
        const int ch = cc->height;
        const int cw = cc->width > 0 ? cc->width : cc->height;
        if (ch <= 0 || cc->width < 0) {
          refuse(k, ops[k], std::string("size must be positive, got ") + std::to_string(ch) + "x" +
                                std::to_string(cw));
        }
        // NOTE: a crop larger than the resized image is zero-padded by torchvision; the fused
        // path computes only pixels inside the resized image, so it refuses such a recipe.
        const bool fits = resize->width > 0 ? ch <= resize->size && cw <= resize->width
                                            : ch <= resize->size && cw <= resize->size;
        if (!fits) {
          refuse(k, ops[k], "a centre crop larger than the resized image (which torchvision "
                            "pads with zeros) is not supported in a recipe yet");
        }
        plan->center = true;
        plan->crop_height = ch;
        plan->crop_width = cw;
        plan->always |= bit(k);
        ++k;
      }
    }
    if (!plan->center && resize->width == 0) {
      refuse(0, ops[0], std::string("Resize(") + std::to_string(resize->size) +
                            ") keeps each image's aspect ratio, so samples would differ in size: "
                            "follow it with CenterCrop, or give Resize a height and a width");
    }
    plan->out_height = plan->center ? plan->crop_height : resize->size;
    plan->out_width = plan->center ? plan->crop_width : resize->width;
  } else {
    refuse(0, ops[0], "a recipe starts with its geometry (RandomResizedCrop, or Resize and "
                      "then CenterCrop), which the fused pipeline folds into the decode");
  }
  // The ops on the crop, then the conversion to float and the normalisations.
  bool is_float = false;
  bool scale = false;
  std::vector<std::pair<std::array<float, 3>, std::array<float, 3>>> norms;
  for (; k < ops.size(); ++k) {
    const RecipeOp& op = ops[k];
    const auto uint8_only = [&] {
      if (is_float) {
        refuse(k, op, "comes after the conversion to float; the fused pipeline runs it on uint8 "
                      "pixels only, so put it before ToDtype/ToTensor");
      }
    };
    if (const auto* f = std::get_if<RandomHorizontalFlip>(&op)) {
      check_p(k, op, f->p);
      plan->steps.push_back({Kind::hflip, f->p, k});
    } else if (const auto* v = std::get_if<RandomVerticalFlip>(&op)) {
      check_p(k, op, v->p);
      plan->steps.push_back({Kind::vflip, v->p, k});
    } else if (const auto* g = std::get_if<Grayscale>(&op)) {
      if (g->num_output_channels != 1 && g->num_output_channels != 3) {
        refuse(k, op, "num_output_channels should be either 1 or 3");
      }
      if (g->num_output_channels == 1) {
        refuse(k, op, "Grayscale(num_output_channels=1) makes one channel, but a recipe's batch "
                      "has three: use Grayscale(num_output_channels=3)");
      }
      uint8_only();
      plan->steps.push_back({Kind::gray, -1.0, k});
      plan->always |= bit(k);
    } else if (const auto* rg = std::get_if<RandomGrayscale>(&op)) {
      check_p(k, op, rg->p);
      uint8_only();
      plan->steps.push_back({Kind::gray, rg->p, k});
    } else if (std::holds_alternative<ToTensor>(op)) {
      if (!is_float) scale = true;
      is_float = true;
      plan->always |= bit(k);
    } else if (const auto* t = std::get_if<ToDtype>(&op)) {
      if (t->dtype != at::kFloat) {
        refuse(k, op, std::string("the fused pipeline writes float32; ToDtype to ") +
                          c10::toString(t->dtype) + " is not supported in a recipe yet");
      }
      // float32 to float32 changes nothing, scaled or not (torchvision rescales only between
      // integer and floating dtypes).
      if (!is_float) scale = t->scale;
      is_float = true;
      plan->always |= bit(k);
    } else if (const auto* n = std::get_if<Normalize>(&op)) {
      if (!is_float) {
        // NOTE: torchvision's F.normalize wording for a uint8 tensor.
        refuse(k, op, "Input tensor should be a float tensor. Got torch.uint8.");
      }
      const auto mean = per_channel(k, op, n->mean, "mean");
      const auto std_dev = per_channel(k, op, n->std_dev, "std");
      for (float s : std_dev) {
        if (s == 0.0f) {
          refuse(k, op, "std evaluated to zero after conversion to torch.float32, leading to "
                        "division by zero.");
        }
      }
      norms.emplace_back(mean, std_dev);
      plan->always |= bit(k);
    } else {
      refuse(k, op, "a geometric op after the recipe's leading geometry is not supported in a "
                    "recipe yet");
    }
  }
  if (!is_float) {
    throw InvalidArgument("Recipe: the fused pipeline writes float32 batches: add "
                          "ToDtype(float32, scale=true) or ToTensor after the uint8 ops");
  }
  // One table maps each channel's uint8 value to its final float, computed with torchvision's
  // float32 operations in its order: the scale, then each Normalize's subtract and divide.
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = scale ? static_cast<float>(v) / 255.0f : static_cast<float>(v);
      for (const auto& [mean, std_dev] : norms) {
        x = (x - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)];
      }
      plan->table.value[c][v] = x;
    }
  }
  plan->ops = std::move(ops);
  return plan;
}

}  // namespace

Recipe::Recipe(std::initializer_list<RecipeOp> ops) : Recipe(std::vector<RecipeOp>(ops)) {}

Recipe::Recipe(std::vector<RecipeOp> ops) : plan_(build(std::move(ops))) {}

const std::vector<RecipeOp>& Recipe::ops() const noexcept { return plan_->ops; }
int Recipe::output_height() const noexcept { return plan_->out_height; }
int Recipe::output_width() const noexcept { return plan_->out_width; }
bool Recipe::dct_scaling() const noexcept { return plan_->dct_scaling; }

Recipe Recipe::with_dct_scaling(bool on) const {
  Recipe copy = *this;
  auto plan = std::make_shared<Plan>(*plan_);
  plan->dct_scaling = on;
  copy.plan_ = std::move(plan);
  return copy;
}

RecipeParams Recipe::sample(const ImageInfo& info, at::Generator& gen) const {
  const Plan& plan = *plan_;
  RecipeParams params;
  params.applied = plan.always;
  if (plan.random_crop) {
    params.box = plan.crop.get_params(info.height, info.width, gen);
    params.scale_denominator =
        plan.dct_scaling && info.format == ImageFormat::jpeg
            ? choose_jpeg_scale(params.box.width, params.box.height, plan.out_width,
                                plan.out_height)
            : 1;
  } else {
    const auto [rh, rw] = plan.resize.output_size(info.height, info.width);
    params.box = plan.center ? center_crop_box(rh, rw, plan.crop_height, plan.crop_width)
                             : CropBox{0, 0, rh, rw};
  }
  for (const Plan::Step& step : plan.steps) {
    // Each random op draws `torch.rand(1) < p`, whatever p, as torchvision's do.
    if (step.p >= 0.0 && at::rand({1}, gen).item<float>() < static_cast<float>(step.p)) {
      params.applied |= std::uint64_t{1} << step.op;
    }
  }
  return params;
}

void Recipe::apply(std::span<const std::byte> encoded, const ImageInfo& info,
                   const RecipeParams& params, float* dst) const {
  const Plan& plan = *plan_;
  bool hflip = false;
  bool vflip = false;
  int grays = 0;
  for (const Plan::Step& step : plan.steps) {
    if (!params.applies(step.op)) continue;
    switch (step.kind) {
      case Plan::Kind::hflip: hflip = !hflip; break;
      case Plan::Kind::vflip: vflip = !vflip; break;
      case Plan::Kind::gray: ++grays; break;
    }
  }
  const int w = plan.out_width;
  const int h = plan.out_height;
  thread_local std::vector<std::uint8_t> gray;
  if (grays > 0) gray.resize(static_cast<std::size_t>(w) * 3);
  const auto sink = [&](int y, const std::uint8_t* row) {
    if (grays > 0) {
      gray_row(row, gray.data(), w, grays);
      row = gray.data();
    }
    detail::write_normalized_row(plan.table, row, w, h, vflip ? h - 1 - y : y, hflip, dst);
  };
  if (plan.random_crop) {
    detail::crop_rows(encoded, params.box, h, w, params.scale_denominator, sink);
  } else {
    const auto [rh, rw] = plan.resize.output_size(info.height, info.width);
    detail::resize_crop_rows(encoded, info, rh, rw, params.box, plan.dct_scaling, sink);
  }
}

void Recipe::operator()(std::span<const std::byte> encoded, at::Generator& gen, float* dst) const {
  const ImageInfo info = peek(encoded);
  check_image_pixels(info.width, info.height);  // before anything is drawn or decoded
  apply(encoded, info, sample(info, gen), dst);
}

void Recipe::operator()(std::span<const std::byte> encoded, Rng& rng, float* dst) const {
  at::Generator gen = rng.torch_generator();
  (*this)(encoded, gen, dst);
}

at::Tensor Recipe::operator()(std::span<const std::byte> encoded, Rng& rng) const {
  at::Tensor out = at::empty({3, output_height(), output_width()}, at::kFloat);
  (*this)(encoded, rng, out.data_ptr<float>());
  return out;
}

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
