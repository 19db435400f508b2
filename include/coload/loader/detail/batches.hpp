#pragma once
// Where a loader's batches come from: the batch sampler its options make, how many batches an
// epoch has (len(DataLoader)), and what a saved state must match.

#include <ATen/core/Generator.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "coload/dataset/iterable.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/state.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sequential.hpp"

namespace coload::detail {

/// A map-style loader's batch sampler and what the error of an index it gives calls it.
struct BatchSource {
  AnyBatchSampler sampler;
  const char* name = "";

  /// Driver: the indices of batch `batch` that a dataset of `size` samples can take: from
  /// -size to size - 1 (coload's datasets read a negative index from the end, as Python
  /// does). An index outside them would fail deep inside the dataset (ATen's "index out of
  /// range in self" and its backtrace), so it is refused here, naming the index, the batch,
  /// the dataset's size and the sampler: with `on_error = raise` the batch's error is returned
  /// (the epoch goes on after it, as after any batch's error); with `skip` each such index is
  /// left out and counted as a skipped sample.
  std::exception_ptr admit(std::vector<Index>& indices, std::int64_t batch, std::int64_t size,
                           OnError on_error, SkipLog& skips) const {
    const auto outside = [size](Index i) { return i < -size || i >= size; };
    if (std::none_of(indices.begin(), indices.end(), outside)) return nullptr;
    for (const Index i : indices) {
      if (!outside(i)) continue;
      std::string what = "DataLoader: the " + std::string(name) + " gave index " +
                         std::to_string(i) + " in batch " + std::to_string(batch) +
                         ", outside the dataset's " + std::to_string(size) + " samples";
      what += size > 0 ? " (indices " + std::to_string(-size) + " to " +
                             std::to_string(size - 1) + ")"
                       : "";
      if (on_error != OnError::skip) return std::make_exception_ptr(OutOfRange(what));
      skips.skip(i, what);
    }
    std::erase_if(indices, outside);
    return nullptr;
  }
};

/// The batch source of a map-style loader: the options' batch_sampler, else their sampler,
/// shuffle (a RandomSampler drawing from `generator`) or a sequential order, in batches of
/// batch_size (one index each without automatic batching). Takes the options' samplers.
template <class D, class C>
BatchSource make_batch_source(Fetcher<D, C>& fetcher,
                              const std::optional<at::Generator>& generator) {
  auto& o = fetcher.options;
  if (o.batch_sampler) return {std::move(o.batch_sampler), "batch_sampler"};
  const std::int64_t b = o.batch_size.value_or(1);
  if (o.sampler) return {BatchSampler<AnySampler>(std::move(o.sampler), b, o.drop_last), "sampler"};
  const auto n = static_cast<std::int64_t>(fetcher.dataset.size());
  if (o.shuffle) {
    return {BatchSampler<RandomSampler>(RandomSampler(n, false, std::nullopt, generator), b,
                                        o.drop_last),
            "RandomSampler (shuffle = true)"};
  }
  return {BatchSampler<SequentialSampler>(SequentialSampler(n), b, o.drop_last),
          "SequentialSampler"};
}

/// Batches in an epoch, as len(DataLoader): the batch sampler's size, or for an iterable
/// dataset its own length in batches.
template <class D, class C>
std::int64_t epoch_size(const Fetcher<D, C>& fetcher, const BatchSource& batches) {
  if constexpr (IterableDataset<D>) {
    if constexpr (requires(const D& d) { d.size(); }) {
      const auto n = static_cast<std::int64_t>(fetcher.dataset.size());
      const auto& o = fetcher.options;
      if (!o.batch_size) return n;
      const std::int64_t b = *o.batch_size;
      return n / b + (!o.drop_last && n % b != 0 ? 1 : 0);  // (n + b - 1) / b could overflow
    } else {
      throw LogicError("DataLoader: the iterable dataset has no size()");
    }
  } else {
    auto n = batches.sampler.size();
    if (!n) throw LogicError("DataLoader: the sampler has no size()");
    return *n;
  }
}

/// What must match between a saved state and the loader that loads it.
template <class D, class C>
LoaderState loader_identity(const Fetcher<D, C>& fetcher) {
  LoaderState s;
  if constexpr (requires(const D& d) { d.size(); }) {
    s.dataset_size = static_cast<std::int64_t>(fetcher.dataset.size());
  }
  s.batch_size = fetcher.options.batch_size.value_or(-1);
  s.seed = fetcher.options.seed;
  if constexpr (IterableDataset<D>) s.stream_workers = fetcher.options.num_workers;
  s.rank = fetcher.rank;
  s.world_size = fetcher.world_size;
  return s;
}

}  // namespace coload::detail
