#pragma once
// default_collate and the Collate<T> customisation point.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <concepts>
#include <cstdint>
#include <array>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"

namespace coload {

/// How a batch of T is built from samples of T. Specialise it for your own sample types:
///
///     template <> struct coload::Collate<MySample> {
///       static MyBatch collate(std::vector<MySample>&& samples);
///     };
///
/// The primary template is left undefined: a type without a specialisation is not collatable.
template <class T>
struct Collate;

/// A type that default_collate knows how to batch.
template <class T>
concept Collatable = requires(std::vector<T>&& v) { Collate<T>::collate(std::move(v)); };

/// The batch type default_collate makes from samples of type T.
template <Collatable T>
using collated_t = decltype(Collate<T>::collate(std::declval<std::vector<T>&&>()));

/// Batches samples as torch.utils.data.default_collate does: tensors are stacked along a new
/// first dimension, numbers become a 1-D tensor, tuples, pairs, arrays, vectors, optionals and
/// string-keyed maps are collated element by element, strings are kept as a vector.
template <Collatable T>
collated_t<T> default_collate(std::vector<T> samples) {
  return Collate<T>::collate(std::move(samples));
}

/// The loader's default collate function object.
struct DefaultCollate {
  DefaultCollate() = default;
  /// Only to fail with a message that says "collate": `{.collate = f}` in braces passed to
  /// make_data_loader keeps the default options type, which cannot hold `f`.
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, DefaultCollate>)
  DefaultCollate(F&&) {  // NOLINT: implicit, so that braced options reach this message
    static_assert(sizeof(F) == 0,
                  "coload: a custom `.collate` cannot go into braced options of the default "
                  "type LoaderOptions<>: pass it as make_data_loader(dataset, {...}, collate), "
                  "or write coload::LoaderOptions{..., .collate = collate}");
  }
  template <Collatable T>
  collated_t<T> operator()(std::vector<T> samples) const {
    return Collate<T>::collate(std::move(samples));
  }
};

/// What `batch_size = std::nullopt` uses by default, as torch.utils.data.default_convert: each
/// sample on its own, unchanged. (PyTorch's version turns NumPy arrays into tensors; samples in
/// C++ are already tensors and numbers, so nothing is left to convert.)
struct DefaultConvert {
  template <class T>
  std::remove_cvref_t<T> operator()(T&& sample) const {
    return std::forward<T>(sample);
  }
};

/// Converts one sample as torch.utils.data.default_convert does (here: returns it unchanged).
template <class T>
std::remove_cvref_t<T> default_convert(T&& sample) {
  return DefaultConvert{}(std::forward<T>(sample));
}

namespace detail {
/// Stacks equally shaped tensors into a new tensor of shape [n, ...] (one copy per sample).
at::Tensor stack_samples(const std::vector<at::Tensor>& samples);
/// A 1-D tensor of `count` elements of `dtype` copied from `data`.
at::Tensor tensor_from_values(const void* data, std::int64_t count, c10::ScalarType dtype);

template <class T>
constexpr c10::ScalarType scalar_type_of() {
  if constexpr (std::is_same_v<T, bool>) return c10::ScalarType::Bool;
  else if constexpr (std::is_same_v<T, float>) return c10::ScalarType::Float;
  else if constexpr (std::is_floating_point_v<T>) return c10::ScalarType::Double;
  else return c10::ScalarType::Long;  // every integer, as Python ints become int64
}

template <class Column, class Samples, class Get>
std::vector<Column> column(Samples& samples, Get get) {
  std::vector<Column> out;
  out.reserve(samples.size());
  for (auto& s : samples) out.push_back(std::move(get(s)));
  return out;
}
}  // namespace detail

/// Tensors: stacked along a new first dimension.
template <>
struct Collate<at::Tensor> {
  static at::Tensor collate(std::vector<at::Tensor>&& samples) {
    return detail::stack_samples(samples);
  }
};

/// Numbers: a 1-D tensor, with PyTorch's dtypes: double → float64, every integer → int64,
/// bool → bool; float stays float32 (as a NumPy float32 does).
template <class T>
  requires std::is_arithmetic_v<T>
struct Collate<T> {
  static at::Tensor collate(std::vector<T>&& samples) {
    constexpr auto dtype = detail::scalar_type_of<T>();
    using Stored = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t,
                   std::conditional_t<dtype == c10::ScalarType::Long, std::int64_t,
                   std::conditional_t<dtype == c10::ScalarType::Double, double, float>>>;
    std::vector<Stored> values(samples.begin(), samples.end());
    return detail::tensor_from_values(values.data(), static_cast<std::int64_t>(values.size()),
                                      dtype);
  }
};

/// Strings stay strings: the batch is the vector of them.
template <>
struct Collate<std::string> {
  static std::vector<std::string> collate(std::vector<std::string>&& samples) {
    return std::move(samples);
  }
};

/// Tuples: each position is collated across the batch.
template <Collatable... Ts>
struct Collate<std::tuple<Ts...>> {
  static std::tuple<collated_t<Ts>...> collate(std::vector<std::tuple<Ts...>>&& samples) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<collated_t<Ts>...>{Collate<Ts>::collate(
          detail::column<Ts>(samples, [](auto& s) -> auto& { return std::get<I>(s); }))...};
    }(std::index_sequence_for<Ts...>{});
  }
};

/// Pairs: first and second are collated separately.
template <Collatable A, Collatable B>
struct Collate<std::pair<A, B>> {
  static std::pair<collated_t<A>, collated_t<B>> collate(std::vector<std::pair<A, B>>&& samples) {
    auto firsts = detail::column<A>(samples, [](auto& s) -> auto& { return s.first; });
    auto seconds = detail::column<B>(samples, [](auto& s) -> auto& { return s.second; });
    return {Collate<A>::collate(std::move(firsts)), Collate<B>::collate(std::move(seconds))};
  }
};

/// Vectors (sequences): transposed, then each position collated; all samples must have the
/// same length ("each element in list of batch should be of equal size", as PyTorch).
template <Collatable T>
struct Collate<std::vector<T>> {
  static std::vector<collated_t<T>> collate(std::vector<std::vector<T>>&& samples) {
    if (samples.empty()) return {};
    const std::size_t width = samples.front().size();
    for (std::size_t i = 1; i < samples.size(); ++i) {
      if (samples[i].size() != width) {
        throw RuntimeError("each element in list of batch should be of equal size (sample 0 has " +
                           std::to_string(width) + " elements, sample " + std::to_string(i) +
                           " has " + std::to_string(samples[i].size()) + ")");
      }
    }
    std::vector<collated_t<T>> out;
    out.reserve(width);
    for (std::size_t k = 0; k < width; ++k) {
      out.push_back(Collate<T>::collate(
          detail::column<T>(samples, [k](auto& s) -> auto& { return s[k]; })));
    }
    return out;
  }
};

/// Fixed-size arrays: each position collated across the batch.
template <Collatable T, std::size_t N>
struct Collate<std::array<T, N>> {
  static std::array<collated_t<T>, N> collate(std::vector<std::array<T, N>>&& samples) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::array<collated_t<T>, N>{Collate<T>::collate(
          detail::column<T>(samples, [](auto& s) -> auto& { return s[I]; }))...};
    }(std::make_index_sequence<N>{});
  }
};

/// Optionals: collated as their values when every sample holds one; an empty one is an error
/// naming its position (PyTorch cannot collate None either).
template <Collatable T>
struct Collate<std::optional<T>> {
  static collated_t<T> collate(std::vector<std::optional<T>>&& samples) {
    std::vector<T> values;
    values.reserve(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (!samples[i]) {
        throw RuntimeError("default_collate: sample " + std::to_string(i) +
                           " is an empty std::optional; every sample must hold a value");
      }
      values.push_back(std::move(*samples[i]));
    }
    return Collate<T>::collate(std::move(values));
  }
};

namespace detail {
/// Collates a batch of string-keyed maps key by key; keys come from sample 0.
template <class OutMap, class InMap>
OutMap collate_by_key(std::vector<InMap>&& samples) {
  using T = typename InMap::mapped_type;
  OutMap out;
  if (samples.empty()) return out;
  for (const auto& [key, unused] : samples.front()) {
    std::vector<T> col;
    col.reserve(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      auto it = samples[i].find(key);
      if (it == samples[i].end()) {
        throw RuntimeError("default_collate: sample " + std::to_string(i) + " has no key '" + key +
                           "' that sample 0 has");
      }
      col.push_back(std::move(it->second));
    }
    out.emplace(key, Collate<T>::collate(std::move(col)));
  }
  return out;
}
}  // namespace detail

/// String-keyed hash maps (dicts): each key collated across the batch.
template <Collatable T>
struct Collate<std::unordered_map<std::string, T>> {
  static std::unordered_map<std::string, collated_t<T>> collate(
      std::vector<std::unordered_map<std::string, T>>&& samples) {
    return detail::collate_by_key<std::unordered_map<std::string, collated_t<T>>>(
        std::move(samples));
  }
};

/// String-keyed maps (dicts): each key collated across the batch; keys come from sample 0.
template <Collatable T>
struct Collate<std::map<std::string, T>> {
  static std::map<std::string, collated_t<T>> collate(
      std::vector<std::map<std::string, T>>&& samples) {
    return detail::collate_by_key<std::map<std::string, collated_t<T>>>(std::move(samples));
  }
};

}  // namespace coload
