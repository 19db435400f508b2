#pragma once
// StackDataset: several datasets of equal size side by side, as torch.utils.data.StackDataset
// (PyTorch 2.1+): a sample is the tuple, or the name-keyed map, of the datasets' samples.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Datasets of equal size side by side, as `StackDataset(a, b, ...)`: sample `i` is the
/// std::tuple of each dataset's sample `i`.
///
/// Offers `get(index, ctx)` when any dataset wants the context (each then gets the same
/// context, in order, and those without one get(index)), and `get(index)` when all offer it.
template <MapDataset... Ds>
requires(sizeof...(Ds) > 0) class StackDataset {
 public:
  /// Refuses datasets of different sizes with PyTorch's message ("Size mismatch between
  /// datasets").
  explicit StackDataset(Ds... datasets) : datasets_(std::move(datasets)...) {
    size_ = static_cast<std::int64_t>(std::get<0>(datasets_).size());
    std::apply(
        [this](const auto&... d) {
          if (((static_cast<std::int64_t>(d.size()) != size_) || ...)) {
            throw InvalidArgument("Size mismatch between datasets");
          }
        },
        datasets_);
  }

  /// The number of samples (that of each dataset).
  std::int64_t size() const noexcept { return size_; }
  /// The tuple of each dataset's sample `index`.
  auto get(Index index) requires(PlainGet<Ds>&&...) {
    return std::apply(
        [index](auto&... d) {
          return std::tuple<std::remove_cvref_t<decltype(d.get(index))>...>{d.get(index)...};
        },
        datasets_);
  }
  /// The tuple of each dataset's sample `index`, each given the context if it takes one.
  auto get(Index index, SampleContext& ctx) requires(ContextualGet<Ds> || ...) {
    // A braced list evaluates left to right: the datasets draw from ctx.rng in order.
    return std::apply(
        [index, &ctx](auto&... d) {
          return std::tuple<sample_t<Ds>...>{get_sample(d, index, ctx)...};
        },
        datasets_);
  }

  /// The datasets.
  std::tuple<Ds...>& datasets() noexcept { return datasets_; }
  /// The datasets.
  const std::tuple<Ds...>& datasets() const noexcept { return datasets_; }

 private:
  std::tuple<Ds...> datasets_;
  std::int64_t size_ = 0;
};

/// Named datasets of one type and equal size side by side, as `StackDataset(x=a, y=b)`:
/// sample `i` is the std::map from each name to that dataset's sample `i`.
template <MapDataset D>
class NamedStackDataset {
 public:
  /// Refuses an empty map ("At least one dataset should be passed") and datasets of different
  /// sizes ("Size mismatch between datasets"), with PyTorch's messages.
  explicit NamedStackDataset(std::map<std::string, D> datasets) : datasets_(std::move(datasets)) {
    if (datasets_.empty()) throw InvalidArgument("At least one dataset should be passed");
    size_ = static_cast<std::int64_t>(datasets_.begin()->second.size());
    for (const auto& [name, d] : datasets_) {
      if (static_cast<std::int64_t>(d.size()) != size_) {
        throw InvalidArgument("Size mismatch between datasets");
      }
    }
  }

  /// The number of samples (that of each dataset).
  std::int64_t size() const noexcept { return size_; }
  /// Each name mapped to its dataset's sample `index`.
  auto get(Index index) requires PlainGet<D> {
    using S = std::remove_cvref_t<decltype(std::declval<D&>().get(index))>;
    std::map<std::string, S> sample;
    for (auto& [name, d] : datasets_) sample.emplace(name, d.get(index));
    return sample;
  }
  /// Each name mapped to its dataset's sample `index`, given the context (in name order).
  std::map<std::string, sample_t<D>> get(Index index,
                                         SampleContext& ctx) requires ContextualGet<D> {
    std::map<std::string, sample_t<D>> sample;
    for (auto& [name, d] : datasets_) sample.emplace(name, d.get(index, ctx));
    return sample;
  }

  /// The datasets, by name.
  std::map<std::string, D>& datasets() noexcept { return datasets_; }
  /// The datasets, by name.
  const std::map<std::string, D>& datasets() const noexcept { return datasets_; }

 private:
  std::map<std::string, D> datasets_;
  std::int64_t size_ = 0;
};

}  // namespace coload
