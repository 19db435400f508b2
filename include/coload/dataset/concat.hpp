#pragma once
// ConcatDataset: datasets one after another, as torch.utils.data.ConcatDataset, and `a + b`.

#include <algorithm>
#include <concepts>
#include <type_traits>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/dataset/any_dataset.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Datasets of one type, one after another, as torch.utils.data.ConcatDataset.
///
/// Sample `i` is found by a binary search over the cumulative sizes (taken once, at
/// construction); negative indices count from the end. `get(index, ctx)` passes the loader's
/// context through unchanged.
template <MapDataset D>
class ConcatDataset {
 public:
  /// Refuses an empty list with PyTorch's message ("datasets should not be an empty iterable").
  explicit ConcatDataset(std::vector<D> datasets) : datasets_(std::move(datasets)) {
    if (datasets_.empty()) throw InvalidArgument("datasets should not be an empty iterable");
    std::int64_t total = 0;
    cumulative_sizes_.reserve(datasets_.size());
    for (const D& d : datasets_) {
      total += static_cast<std::int64_t>(d.size());
      cumulative_sizes_.push_back(total);
    }
  }

  /// The total number of samples.
  std::int64_t size() const noexcept { return cumulative_sizes_.back(); }
  /// Sample `index` of the concatenation.
  decltype(auto) get(Index index) requires PlainGet<D> {
    const auto [which, local] = locate(index);
    return datasets_[which].get(local);
  }
  /// Sample `index` of the concatenation, given the context.
  decltype(auto) get(Index index, SampleContext& ctx) requires ContextualGet<D> {
    const auto [which, local] = locate(index);
    return datasets_[which].get(local, ctx);
  }
  /// The owning dataset's get_async at the local index, given the context.
  auto get_async(Index index, SampleContext& ctx) requires AsyncGet<D> {
    const auto [which, local] = locate(index);
    return datasets_[which].get_async(local, ctx);
  }

  /// Which dataset holds sample `index`, and its index there. Throws std::invalid_argument
  /// ("absolute value of index should not exceed dataset length") for a negative index below
  /// -size() and std::out_of_range for an index at or past size().
  std::pair<std::size_t, Index> locate(Index index) const {
    if (index < 0) {
      if (index < -size()) {  // not -index > size(): -INT64_MIN overflows
        throw InvalidArgument("absolute value of index should not exceed dataset length");
      }
      index += size();
    }
    const auto it = std::upper_bound(cumulative_sizes_.begin(), cumulative_sizes_.end(), index);
    if (it == cumulative_sizes_.end()) {
      throw OutOfRange("ConcatDataset index " + std::to_string(index) +
                       " is out of range for a dataset of size " + std::to_string(size()));
    }
    const auto which = static_cast<std::size_t>(std::distance(cumulative_sizes_.begin(), it));
    return {which, which == 0 ? index : index - cumulative_sizes_[which - 1]};
  }

  /// The datasets, in order.
  const std::vector<D>& datasets() const noexcept { return datasets_; }
  /// The datasets, in order.
  std::vector<D>& datasets() noexcept { return datasets_; }
  /// The running totals of the datasets' sizes, as PyTorch's `cumulative_sizes`.
  const std::vector<std::int64_t>& cumulative_sizes() const noexcept { return cumulative_sizes_; }

 private:
  std::vector<D> datasets_;
  std::vector<std::int64_t> cumulative_sizes_;
};

/// `a + b` on two map-style datasets of one type: their ConcatDataset, as Dataset.__add__.
template <MapDataset D>
ConcatDataset<D> operator+(D a, D b) {
  std::vector<D> datasets;
  datasets.reserve(2);
  datasets.push_back(std::move(a));
  datasets.push_back(std::move(b));
  return ConcatDataset<D>(std::move(datasets));
}

/// `(a + b) + c`: the same samples as PyTorch's nested ConcatDataset, kept flat.
template <MapDataset D>
ConcatDataset<D> operator+(ConcatDataset<D> a, D b) {
  std::vector<D> datasets = std::move(a.datasets());
  datasets.push_back(std::move(b));
  return ConcatDataset<D>(std::move(datasets));
}

/// `a + (b + c)`: the same samples as PyTorch's nested ConcatDataset, kept flat.
template <MapDataset D>
ConcatDataset<D> operator+(D a, ConcatDataset<D> b) {
  std::vector<D> datasets;
  datasets.reserve(b.datasets().size() + 1);
  datasets.push_back(std::move(a));
  for (D& d : b.datasets()) datasets.push_back(std::move(d));
  return ConcatDataset<D>(std::move(datasets));
}

/// `(a + b) + (c + d)`: the same samples as PyTorch's nested ConcatDataset, kept flat.
template <MapDataset D>
ConcatDataset<D> operator+(ConcatDataset<D> a, ConcatDataset<D> b) {
  std::vector<D> datasets = std::move(a.datasets());
  for (D& d : b.datasets()) datasets.push_back(std::move(d));
  return ConcatDataset<D>(std::move(datasets));
}

namespace detail {
template <class T>
struct IsConcat : std::false_type {};
template <class D>
struct IsConcat<ConcatDataset<D>> : std::true_type {};
template <class T>
struct IsAnyDataset : std::false_type {};
template <class S>
struct IsAnyDataset<AnyDataset<S>> : std::true_type {};
template <class A, class B>
concept ConcatenableApart = MapDataset<A> && MapDataset<B> && !std::same_as<A, B> &&
                            std::same_as<sample_t<A>, sample_t<B>> && !IsConcat<A>::value &&
                            !IsConcat<B>::value;
}  // namespace detail

/// `a + b` on map-style datasets of different types with one sample type: a ConcatDataset of
/// AnyDataset, as Python concatenates any two datasets.
template <class A, class B>
  requires detail::ConcatenableApart<A, B>
ConcatDataset<AnyDataset<sample_t<A>>> operator+(A a, B b) {
  std::vector<AnyDataset<sample_t<A>>> datasets;
  datasets.reserve(2);
  datasets.emplace_back(std::move(a));
  datasets.emplace_back(std::move(b));
  return ConcatDataset<AnyDataset<sample_t<A>>>(std::move(datasets));
}

/// `(a + b) + c` where c is of yet another type: appended to the mixed concatenation.
template <class S, class B>
  requires(MapDataset<B> && !detail::IsAnyDataset<B>::value && !detail::IsConcat<B>::value &&
           std::same_as<sample_t<B>, S>)
ConcatDataset<AnyDataset<S>> operator+(ConcatDataset<AnyDataset<S>> a, B b) {
  std::vector<AnyDataset<S>> datasets = std::move(a.datasets());
  datasets.emplace_back(std::move(b));
  return ConcatDataset<AnyDataset<S>>(std::move(datasets));
}

}  // namespace coload
