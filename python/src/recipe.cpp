// coload._C.Recipe: a vision::Recipe built from coload.vision.transforms' ops. The Python classes
// spell torchvision's parameters and convert their forms (an int size, a single degrees value,
// None fills) into plain values; here each becomes the C++ op of its name, and vision::Recipe's
// builder checks them all (std::invalid_argument -> ValueError, with its wording). A Python
// callable (Custom, CustomBatch) runs with the GIL on the worker that runs its sample or batch.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "binding.hpp"
#include "coload/core/error.hpp"
#include "coload/vision/recipe.hpp"

namespace coload::python {

namespace {

using namespace coload::vision;

/// One op's parameters, as coload.vision.transforms hands them over.
struct Params {
  const std::string& op;
  py::dict d;

  py::object at(const char* key) const {
    if (!d.contains(key)) {
      throw InvalidArgument("Recipe: " + op + " has no parameter '" + key + "' (internal)");
    }
    return d[key];
  }
  template <class T>
  T get(const char* key) const {
    try {
      return at(key).cast<T>();
    } catch (const py::cast_error&) {
      throw py::type_error(op + ": parameter '" + key + "' has the wrong type: " +
                           py::repr(at(key)).cast<std::string>());
    }
  }
  double num(const char* key) const { return get<double>(key); }
  int integer(const char* key) const { return get<int>(key); }
  std::array<double, 2> pair(const char* key) const {
    const auto v = get<std::vector<double>>(key);
    if (v.size() != 2) throw py::type_error(op + ": " + key + " needs two values");
    return {v[0], v[1]};
  }
  std::optional<std::array<double, 2>> optional_pair(const char* key) const {
    if (at(key).is_none()) return std::nullopt;
    return pair(key);
  }
  Interpolation interpolation() const {
    return get<std::string>("interpolation") == "nearest" ? Interpolation::nearest
                                                          : Interpolation::bilinear;
  }
};

at::ScalarType dtype_of(const std::string& name) {
  static const std::pair<const char*, at::ScalarType> known[] = {
      {"float32", at::kFloat},   {"float64", at::kDouble}, {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"uint8", at::kByte},   {"int8", at::kChar},
      {"int16", at::kShort},     {"int32", at::kInt},      {"int64", at::kLong}};
  for (const auto& [n, t] : known) {
    if (name == n) return t;
  }
  throw InvalidArgument("ToDtype: dtype torch." + name + " is not supported in a recipe");
}

/// A copy of a crop or float row as a tensor Python may keep: [C, H, W].
at::Tensor pixels_tensor(const ImageSpan& image) {
  return at::from_blob(image.data, {image.height, image.width, image.channels},
                       {image.stride, image.channels, 1}, at::kByte)
      .permute({2, 0, 1})
      .contiguous();
}

/// What a user op returned: None (the image changed in place), or a tensor like it.
at::Tensor result_of(const std::string& name, py::object out, const at::Tensor& given) {
  if (out.is_none()) return given;
  if (!py::isinstance(out, py::module_::import("torch").attr("Tensor"))) {
    throw InvalidArgument("Custom '" + name + "' returned " +
                          py::str(py::type::of(out).attr("__name__")).cast<std::string>() +
                          "; it returns None (the image changed in place) or a tensor");
  }
  at::Tensor t = out.cast<at::Tensor>();
  if (t.sizes() != given.sizes() || t.scalar_type() != given.scalar_type()) {
    throw InvalidArgument("Custom '" + name + "' returned a tensor of shape " +
                          c10::str(t.sizes()) + " and dtype " + c10::toString(t.scalar_type()) +
                          "; it must keep the image's " + c10::str(given.sizes()) + " and " +
                          c10::toString(given.scalar_type()));
  }
  return t;
}

/// Runs `fn` with the GIL on a worker thread (or a worker process's thread).
template <class F>
decltype(auto) with_python(F&& f) {
  enter_python();
  py::gil_scoped_acquire gil;
  return call_python(std::forward<F>(f));
}

Custom custom_op(const Params& p) {
  const auto name = p.get<std::string>("name");
  auto fn = std::make_shared<PyRef>(p.at("fn"));
  if (p.get<std::string>("on") == "pixels") {
    return Custom(name, Custom::PixelFn([fn, name](ImageSpan& image, Rng& rng) {
      at::Tensor given = pixels_tensor(image);
      at::Generator gen = rng.torch_generator();
      at::Tensor out = with_python([&] { return result_of(name, fn->get()(given, gen), given); });
      at::from_blob(image.data, {image.height, image.width, image.channels},
                    {image.stride, image.channels, 1}, at::kByte)
          .copy_(out.permute({1, 2, 0}));
    }));
  }
  return Custom(name, Custom::FloatFn([fn, name](const at::Tensor& image, Rng& rng) {
    at::Tensor given = image.clone();  // Python may keep it; the row is the batch's
    at::Generator gen = rng.torch_generator();
    at::Tensor out = with_python([&] { return result_of(name, fn->get()(given, gen), given); });
    image.copy_(out);
  }));
}

CustomBatch custom_batch_op(const Params& p) {
  const auto name = p.get<std::string>("name");
  auto fn = std::make_shared<PyRef>(p.at("fn"));
  return CustomBatch(name, [fn, name](at::Tensor& images, at::Tensor& labels, Rng& rng) {
    at::Generator gen = rng.torch_generator();
    with_python([&] {
      py::object out = fn->get()(images, labels, gen);
      if (out.is_none()) return;
      if (!py::isinstance<py::tuple>(out) || py::len(out) != 2) {
        throw InvalidArgument("CustomBatch '" + name + "' returned " +
                              py::repr(out).cast<std::string>().substr(0, 80) +
                              "; it returns None (the batch changed in place) or (images, labels)");
      }
      auto pair = out.cast<py::tuple>();
      images = pair[0].cast<at::Tensor>();
      labels = pair[1].cast<at::Tensor>();
    });
  });
}

std::variant<MixUp, CutMix> mix_op(const std::string& op, const Params& p) {
  const double alpha = p.num("alpha");
  const int classes = p.integer("num_classes");
  if (op == "MixUp") return MixUp{alpha, classes};
  return CutMix{alpha, classes};
}

RecipeOp make_op(const std::string& op, const py::dict& d) {
  const Params p{op, d};
  if (op == "RandomResizedCrop") {
    return RandomResizedCrop{p.integer("height"), p.integer("width"), p.pair("scale"),
                             p.pair("ratio")};
  }
  if (op == "Resize") return Resize{p.integer("size"), p.integer("width")};
  if (op == "CenterCrop") return CenterCrop{p.integer("height"), p.integer("width")};
  if (op == "RandomCrop") {
    RandomCrop c;
    c.height = p.integer("height");
    c.width = p.integer("width");
    const auto padding = p.get<std::vector<int>>("padding");
    if (padding.size() != 4) throw py::type_error("RandomCrop: padding needs four values");
    std::copy(padding.begin(), padding.end(), c.padding.begin());
    c.pad_if_needed = p.get<bool>("pad_if_needed");
    c.fill = p.get<std::vector<double>>("fill");
    const auto mode = p.get<std::string>("padding_mode");
    c.padding_mode = mode == "edge"      ? PaddingMode::edge
                     : mode == "reflect" ? PaddingMode::reflect
                     : mode == "symmetric" ? PaddingMode::symmetric
                                           : PaddingMode::constant;
    return c;
  }
  if (op == "RandomHorizontalFlip") return RandomHorizontalFlip{p.num("p")};
  if (op == "RandomVerticalFlip") return RandomVerticalFlip{p.num("p")};
  if (op == "Grayscale") return Grayscale{p.integer("num_output_channels")};
  if (op == "RandomGrayscale") return RandomGrayscale{p.num("p")};
  if (op == "ToTensor") return ToTensor{};
  if (op == "ToDtype") return ToDtype{dtype_of(p.get<std::string>("dtype")), p.get<bool>("scale")};
  if (op == "Normalize") {
    return Normalize{p.get<std::vector<double>>("mean"), p.get<std::vector<double>>("std")};
  }
  if (op == "ColorJitter") {
    return ColorJitter{p.num("brightness"), p.num("contrast"), p.num("saturation"), p.num("hue")};
  }
  if (op == "GaussianBlur") {
    return GaussianBlur{p.integer("kernel_x"), p.integer("kernel_y"), p.pair("sigma")};
  }
  if (op == "RandomErasing") {
    return RandomErasing{p.num("p"), p.pair("scale"), p.pair("ratio"),
                         p.get<std::vector<double>>("value")};
  }
  if (op == "MixUp" || op == "CutMix") {
    const auto m = mix_op(op, p);
    if (const auto* mix = std::get_if<MixUp>(&m)) return *mix;
    return std::get<CutMix>(m);
  }
  if (op == "RandomChoice") {
    RandomChoice c;
    for (auto item : p.at("transforms")) {
      auto spec = item.cast<py::tuple>();
      const auto name = spec[0].cast<std::string>();
      c.transforms.push_back(mix_op(name, Params{name, spec[1].cast<py::dict>()}));
    }
    c.p = p.get<std::vector<double>>("p");
    return c;
  }
  if (op == "TrivialAugmentWide") {
    return TrivialAugmentWide{p.integer("num_magnitude_bins"), p.interpolation(),
                              p.get<std::vector<double>>("fill")};
  }
  if (op == "RandAugment") {
    return RandAugment{p.integer("num_ops"), p.integer("magnitude"),
                       p.integer("num_magnitude_bins"), p.interpolation(),
                       p.get<std::vector<double>>("fill")};
  }
  if (op == "AutoAugment") {
    return AutoAugment{AutoAugmentPolicy::imagenet, p.interpolation(),
                       p.get<std::vector<double>>("fill")};
  }
  if (op == "RandomRotation") {
    return RandomRotation{p.pair("degrees"), p.interpolation(), p.get<bool>("expand"),
                          p.optional_pair("center"), p.get<std::vector<double>>("fill")};
  }
  if (op == "RandomAffine") {
    return RandomAffine{p.pair("degrees"),
                        p.optional_pair("translate"),
                        p.optional_pair("scale"),
                        p.get<std::vector<double>>("shear"),
                        p.interpolation(),
                        p.get<std::vector<double>>("fill"),
                        p.optional_pair("center")};
  }
  if (op == "RandomPerspective") {
    return RandomPerspective{p.num("distortion_scale"), p.num("p"), p.interpolation(),
                             p.get<std::vector<double>>("fill")};
  }
  if (op == "AugMix") {
    return AugMix{p.integer("severity"), p.integer("mixture_width"), p.integer("chain_depth"),
                  p.num("alpha"),        p.get<bool>("all_ops"),      p.interpolation(),
                  p.get<std::vector<double>>("fill")};
  }
  if (op == "Custom") return custom_op(p);
  if (op == "CustomBatch") return custom_batch_op(p);
  throw InvalidArgument("Recipe: unknown op '" + op + "'");
}

}  // namespace

void register_recipe(py::module_& m) {
  py::class_<vision::Recipe>(m, "Recipe")
      .def(py::init([](const py::list& specs, bool dct_scaling) {
             std::vector<vision::RecipeOp> ops;
             ops.reserve(specs.size());
             for (auto item : specs) {
               auto spec = item.cast<py::tuple>();
               ops.push_back(make_op(spec[0].cast<std::string>(), spec[1].cast<py::dict>()));
             }
             vision::Recipe recipe(std::move(ops));
             return dct_scaling ? recipe : recipe.with_dct_scaling(false);
           }),
           py::arg("ops"), py::arg("dct_scaling") = true)
      .def_property_readonly("output_height", &vision::Recipe::output_height)
      .def_property_readonly("output_width", &vision::Recipe::output_width)
      .def_property_readonly("dct_scaling", &vision::Recipe::dct_scaling)
      .def_property_readonly("has_batch_op", &vision::Recipe::has_batch_op);
}

}  // namespace coload::python
