#pragma once
// The fetch plan: how the loader builds a batch from a dataset and a collate, decided at
// compile time from the members the dataset offers.

#include <concepts>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"
#include "coload/coro/task.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/iterable.hpp"

namespace coload::detail {

template <class D>
auto loader_sample_probe() {
  if constexpr (IterableDataset<D>) {
    return std::type_identity<stream_sample_t<D>>{};
  } else {
    return std::type_identity<sample_t<D>>{};
  }
}

/// The type of one sample of D, map-style or iterable.
template <class D>
using loader_sample_t = typename decltype(loader_sample_probe<D>())::type;

/// True when collate C takes one sample at a time (automatic batching off): DefaultConvert, or
/// a callable that takes a sample but not a vector of them.
template <class C, class S>
inline constexpr bool per_sample_collate_v =
    std::same_as<C, DefaultConvert> ||
    (!std::invocable<C&, std::vector<S>&&> && std::invocable<C&, S&&>);

/// How the loader fetches one batch, from the richest member the dataset offers.
enum class FetchPath {
  samples,            // get (or the stream), then collate
  samples_async,      // get_async for every index at once, then collate
  batch_of_samples,   // get_batch returns the samples, then collate
  whole_batch,        // get_batch returns the batch itself (default collate)
  whole_batch_async,  // get_batch_async returns the batch itself (default collate)
};

template <class D, class C>
consteval FetchPath choose_fetch_path() {
  if constexpr (IterableDataset<D>) {
    return FetchPath::samples;
  } else {
    using S = sample_t<D>;
    constexpr bool default_collate = std::same_as<C, DefaultCollate>;
    if constexpr (per_sample_collate_v<C, S>) {
      // As PyTorch without automatic batching: one sample at a time, never get_batch.
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    } else if constexpr (AsyncBatchedDataset<D> && default_collate) {
      return FetchPath::whole_batch_async;
    } else if constexpr (BatchedDataset<D>) {
      using Fetched = std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
          std::declval<std::span<const Index>>()))>;
      if constexpr (std::same_as<Fetched, std::vector<S>>) return FetchPath::batch_of_samples;
      if constexpr (default_collate) return FetchPath::whole_batch;
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    } else {
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    }
  }
}

/// How the loader builds a batch from a dataset D with collate C, and what the batch is.
template <class D, class C>
struct FetchPlan {
  using sample = loader_sample_t<D>;
  static constexpr FetchPath path = choose_fetch_path<D, C>();
  static constexpr bool per_sample = per_sample_collate_v<C, sample>;
  static constexpr bool whole_batch = path == FetchPath::whole_batch;
  static constexpr bool batch_of_samples = path == FetchPath::batch_of_samples;
  static constexpr bool is_async =
      path == FetchPath::samples_async || path == FetchPath::whole_batch_async;

 private:
  static auto batch_probe() {
    if constexpr (path == FetchPath::whole_batch) {
      return std::type_identity<std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
          std::declval<std::span<const Index>>()))>>{};
    } else if constexpr (path == FetchPath::whole_batch_async) {
      return std::type_identity<typename TaskValue<std::remove_cvref_t<decltype(
          std::declval<D&>().get_batch_async(std::declval<std::span<const Index>>(),
                                             std::declval<BatchContext&>()))>>::type>{};
    } else if constexpr (per_sample) {
      return std::type_identity<std::invoke_result_t<C&, sample&&>>{};
    } else {
      // NOTE: only here is collate asked to take the samples: it need not accept them when
      // get_batch builds the batch.
      return std::type_identity<std::invoke_result_t<C&, std::vector<sample>&&>>{};
    }
  }

 public:
  using batch = typename decltype(batch_probe())::type;
};

}  // namespace coload::detail
