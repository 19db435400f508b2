#pragma once
// What a map-style dataset is, and how the loader calls the fastest member it has.

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// A dataset with `get(index, SampleContext&)`.
template <class D>
concept ContextualGet = requires(D& d, Index i, SampleContext& ctx) { d.get(i, ctx); };

/// A dataset with `get(index)`.
template <class D>
concept PlainGet = requires(D& d, Index i) { d.get(i); };

/// A map-style dataset: `size()` plus `get(index)` or `get(index, SampleContext&)`.
template <class D>
concept MapDataset = requires(const D& d) {
  { d.size() } -> std::convertible_to<std::int64_t>;
} && (ContextualGet<D> || PlainGet<D>);

/// A dataset that fetches a whole batch at once: `get_batch(std::span<const Index>)`.
template <class D>
concept BatchedDataset = requires(D& d, std::span<const Index> indices) { d.get_batch(indices); };

namespace detail {
template <class D>
auto sample_type_probe() {
  if constexpr (ContextualGet<D>) {
    return std::type_identity<
        std::remove_cvref_t<decltype(std::declval<D&>().get(Index{}, std::declval<SampleContext&>()))>>{};
  } else {
    return std::type_identity<std::remove_cvref_t<decltype(std::declval<D&>().get(Index{}))>>{};
  }
}
}  // namespace detail

/// The type of one sample of dataset D.
template <MapDataset D>
using sample_t = typename decltype(detail::sample_type_probe<D>())::type;

/// Calls the richest `get` the dataset offers.
template <MapDataset D>
sample_t<D> get_sample(D& dataset, Index index, SampleContext& ctx) {
  if constexpr (ContextualGet<D>) {
    return dataset.get(index, ctx);
  } else {
    return dataset.get(index);
  }
}

}  // namespace coload
