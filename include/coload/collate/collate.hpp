#pragma once
// default_collate and the Collate<T> customisation point.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <concepts>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

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
/// first dimension, numbers become a 1-D tensor, tuples, pairs, vectors and string-keyed maps
/// are collated element by element, strings are kept as a vector.
template <Collatable T>
collated_t<T> default_collate(std::vector<T> samples) {
  return Collate<T>::collate(std::move(samples));
}

/// The loader's default collate function object.
struct DefaultCollate {
  template <Collatable T>
  collated_t<T> operator()(std::vector<T> samples) const {
    return Collate<T>::collate(std::move(samples));
  }
};

namespace detail {
/// Stacks equally shaped tensors into a new tensor of shape [n, ...] (one copy per sample).
at::Tensor stack_samples(const std::vector<at::Tensor>& samples);
/// A 1-D tensor of `count` elements of `dtype` copied from `data`.
at::Tensor tensor_from_values(const void* data, std::int64_t count, c10::ScalarType dtype);

template <class T>
constexpr c10::ScalarType scalar_type_of() {
  if constexpr (std::is_same_v<T, bool>) return c10::ScalarType::Bool;
  else if constexpr (std::is_same_v<T, float>) return c10::ScalarType::Float;
  else if constexpr (std::is_same_v<T, double>) return c10::ScalarType::Double;
  else if constexpr (std::is_floating_point_v<T>) return c10::ScalarType::Double;
  else if constexpr (std::is_unsigned_v<T> && sizeof(T) == 1) return c10::ScalarType::Byte;
  else if constexpr (sizeof(T) == 1) return c10::ScalarType::Char;
  else if constexpr (std::is_signed_v<T> && sizeof(T) == 2) return c10::ScalarType::Short;
  else if constexpr (std::is_signed_v<T> && sizeof(T) == 4) return c10::ScalarType::Int;
  else return c10::ScalarType::Long;  // int64 and wider unsigned types (ATen has no uint16+)
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

/// Numbers: a 1-D tensor of the matching dtype (float → float32, double → float64,
/// signed integers → the same width, bool → bool; unsigned wider than 8 bits → int64).
template <class T>
  requires std::is_arithmetic_v<T>
struct Collate<T> {
  static at::Tensor collate(std::vector<T>&& samples) {
    constexpr auto dtype = detail::scalar_type_of<T>();
    using Stored = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t,
                   std::conditional_t<dtype == c10::ScalarType::Long, std::int64_t,
                   std::conditional_t<dtype == c10::ScalarType::Double, double, T>>>;
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
        throw std::runtime_error(
            "each element in list of batch should be of equal size (sample 0 has " +
            std::to_string(width) + " elements, sample " + std::to_string(i) + " has " +
            std::to_string(samples[i].size()) + ")");
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

/// String-keyed maps (dicts): each key collated across the batch; keys come from sample 0.
template <Collatable T>
struct Collate<std::map<std::string, T>> {
  static std::map<std::string, collated_t<T>> collate(
      std::vector<std::map<std::string, T>>&& samples) {
    std::map<std::string, collated_t<T>> out;
    if (samples.empty()) return out;
    for (const auto& [key, unused] : samples.front()) {
      std::vector<T> col;
      col.reserve(samples.size());
      for (std::size_t i = 0; i < samples.size(); ++i) {
        auto it = samples[i].find(key);
        if (it == samples[i].end()) {
          throw std::runtime_error("default_collate: sample " + std::to_string(i) +
                                   " has no key '" + key + "' that sample 0 has");
        }
        col.push_back(std::move(it->second));
      }
      out.emplace(key, Collate<T>::collate(std::move(col)));
    }
    return out;
  }
};

}  // namespace coload
