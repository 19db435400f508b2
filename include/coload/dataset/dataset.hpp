#pragma once
// What a map-style dataset is, and how the loader calls the fastest member it has.

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "coload/coro/task.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// A dataset with `get(index, SampleContext&)`.
template <class D>
concept ContextualGet = requires(D& d, Index i, SampleContext& ctx) { d.get(i, ctx); };

/// A dataset with `get(index)`.
template <class D>
concept PlainGet = requires(D& d, Index i) { d.get(i); };

namespace detail {
template <class T>
struct TaskValue {
  static constexpr bool is_task = false;
};
template <class T>
struct TaskValue<Task<T>> {
  static constexpr bool is_task = true;
  using type = T;
};
}  // namespace detail

/// A dataset with `get_async(index, SampleContext&)` returning a Task of the sample: it reads
/// through `ctx.io` and moves its CPU work onto a worker with `co_await ctx.cpu()`.
template <class D>
concept AsyncGet = requires(D& d, Index i, SampleContext& ctx) {
  { d.get_async(i, ctx) };
} && detail::TaskValue<std::remove_cvref_t<decltype(std::declval<D&>().get_async(
         Index{}, std::declval<SampleContext&>()))>>::is_task;

/// A map-style dataset: `size()` plus `get(index)`, `get(index, SampleContext&)` or
/// `get_async(index, SampleContext&)`.
template <class D>
concept MapDataset = requires(const D& d) {
  { d.size() } -> std::convertible_to<std::int64_t>;
} && (ContextualGet<D> || PlainGet<D> || AsyncGet<D>);

/// A dataset that fetches a whole batch at once: `get_batch(std::span<const Index>)`.
template <class D>
concept BatchedDataset = requires(D& d, std::span<const Index> indices) { d.get_batch(indices); };

/// A dataset that fetches a whole batch asynchronously:
/// `get_batch_async(std::span<const Index>, BatchContext&)` returning a Task of the batch.
template <class D>
concept AsyncBatchedDataset = requires(D& d, std::span<const Index> indices, BatchContext& ctx) {
  { d.get_batch_async(indices, ctx) };
} && detail::TaskValue<std::remove_cvref_t<decltype(std::declval<D&>().get_batch_async(
         std::declval<std::span<const Index>>(), std::declval<BatchContext&>()))>>::is_task;

namespace detail {
template <class D>
auto sample_type_probe() {
  if constexpr (AsyncGet<D> && !ContextualGet<D> && !PlainGet<D>) {
    return std::type_identity<typename TaskValue<std::remove_cvref_t<decltype(
        std::declval<D&>().get_async(Index{}, std::declval<SampleContext&>()))>>::type>{};
  } else if constexpr (ContextualGet<D>) {
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

/// Calls the richest synchronous `get` the dataset offers.
template <MapDataset D>
  requires(ContextualGet<D> || PlainGet<D>)
sample_t<D> get_sample(D& dataset, Index index, SampleContext& ctx) {
  if constexpr (ContextualGet<D>) {
    return dataset.get(index, ctx);
  } else {
    return dataset.get(index);
  }
}

}  // namespace coload
