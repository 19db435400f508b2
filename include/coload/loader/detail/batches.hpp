#pragma once
// Where a loader's batches come from: the batch sampler its options make, how many batches an
// epoch has (len(DataLoader)), and what a saved state must match.

#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "coload/dataset/iterable.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/state.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sequential.hpp"

namespace coload::detail {

/// A map-style loader's batch sampler, what the error of an index it gives calls it, and the
/// dataset's size its indices are checked against.
struct BatchSource {
  AnyBatchSampler sampler;
  const char* name = "";
  std::int64_t dataset_size = 0;

  /// Driver: refuses an index of batch `batch` outside the dataset before anything fetches
  /// it, naming the index, the batch, the dataset's size and the sampler (a dataset would
  /// otherwise fail deep inside, e.g. with ATen's "index out of range in self").
  void check(std::span<const Index> indices, std::int64_t batch) const {
    for (const Index i : indices) {
      if (i >= 0 && i < dataset_size) continue;
      throw OutOfRange("DataLoader: the " + std::string(name) + " gave index " +
                       std::to_string(i) + " in batch " + std::to_string(batch) +
                       ", outside the dataset's " + std::to_string(dataset_size) +
                       " samples (indices 0 to " + std::to_string(dataset_size - 1) + ")");
    }
  }
};

/// The batch source of a map-style loader: the options' batch_sampler, else their sampler,
/// shuffle (a RandomSampler drawing from `generator`) or a sequential order, in batches of
/// batch_size (one index each without automatic batching). Takes the options' samplers.
template <class D, class C>
BatchSource make_batch_source(Fetcher<D, C>& fetcher,
                              const std::optional<at::Generator>& generator) {
  auto& o = fetcher.options;
  const auto n = static_cast<std::int64_t>(fetcher.dataset.size());
  const std::int64_t b = o.batch_size.value_or(1);
  if (o.batch_sampler) return {std::move(o.batch_sampler), "batch_sampler", n};
  if (o.sampler) {
    return {BatchSampler<AnySampler>(std::move(o.sampler), b, o.drop_last), "sampler", n};
  }
  if (o.shuffle) {
    return {BatchSampler<RandomSampler>(RandomSampler(n, false, std::nullopt, generator), b,
                                        o.drop_last),
            "RandomSampler (shuffle = true)", n};
  }
  return {BatchSampler<SequentialSampler>(SequentialSampler(n), b, o.drop_last),
          "SequentialSampler", n};
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
      return o.drop_last ? n / b : (n + b - 1) / b;
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
