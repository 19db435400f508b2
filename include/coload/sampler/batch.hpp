#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/coro/async_generator.hpp"
#include "coload/coro/generator.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Groups a sampler's indices into lists of `batch_size`, as torch.utils.data.BatchSampler.
///
/// `batches()` is synchronous when the inner sampler is, asynchronous otherwise. Each yielded
/// list is a fresh vector: the consumer may move from it.
template <IndexSampler S>
class BatchSampler {
 public:
  /// Refuses a non-positive batch size with PyTorch's message.
  BatchSampler(S sampler, std::int64_t batch_size, bool drop_last)
      : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
    if (batch_size <= 0) {
      throw InvalidArgument("batch_size should be a positive integer value, but got batch_size=" +
                            std::to_string(batch_size));
    }
  }

  /// The index lists of one epoch.
  auto batches() {
    if constexpr (detail::is_async_generator<decltype(sampler_.indices())>) {
      return async_batches();
    } else {
      return sync_batches();
    }
  }

  /// The number of batches per epoch, honouring drop_last.
  std::int64_t size() const
    requires SizedSampler<S>
  {
    return batches_of(static_cast<std::int64_t>(sampler_.size()));
  }
  /// The number of batches per epoch when the inner sampler's length may be unknown (an
  /// AnySampler): empty when it is.
  std::optional<std::int64_t> size() const
    requires MaybeSizedSampler<S>
  {
    const std::optional<std::int64_t> n = sampler_.size();
    if (!n) return std::nullopt;
    return batches_of(*n);
  }

  S& sampler() noexcept { return sampler_; }
  /// Passes the epoch on to a sampler that has set_epoch (a DistributedSampler).
  void set_epoch(std::int64_t epoch)
    requires requires(S& s) { s.set_epoch(epoch); }
  {
    sampler_.set_epoch(epoch);
  }
  std::int64_t batch_size() const noexcept { return batch_size_; }
  bool drop_last() const noexcept { return drop_last_; }

 private:
  std::int64_t batches_of(std::int64_t n) const {
    // NOTE: not (n + b - 1) / b, which overflows for a batch size near INT64_MAX.
    return n / batch_size_ + (!drop_last_ && n % batch_size_ != 0 ? 1 : 0);
  }
  Generator<std::vector<Index>> sync_batches() {
    auto batch = fresh();
    if constexpr (BlockSampler<S>) {
      // Slice whole blocks: a memcpy per batch instead of a resume per index.
      for (std::span<const Index> block : sampler_.index_blocks()) {
        while (!block.empty()) {
          const auto room = static_cast<std::size_t>(batch_size_) - batch.size();
          const auto take = std::min(room, block.size());
          batch.insert(batch.end(), block.begin(), block.begin() + static_cast<std::ptrdiff_t>(take));
          block = block.subspan(take);
          if (static_cast<std::int64_t>(batch.size()) == batch_size_) {
            co_yield batch;
            batch = fresh();
          }
        }
      }
      if (!batch.empty() && !drop_last_) co_yield batch;
      co_return;
    }
    for (Index i : sampler_.indices()) {
      batch.push_back(i);
      if (static_cast<std::int64_t>(batch.size()) == batch_size_) {
        co_yield batch;
        batch = fresh();
      }
    }
    if (!batch.empty() && !drop_last_) co_yield batch;
  }
  AsyncGenerator<std::vector<Index>> async_batches() {
    auto batch = fresh();
    auto indices = sampler_.indices();
    while (const Index* i = co_await indices.next()) {
      batch.push_back(*i);
      if (static_cast<std::int64_t>(batch.size()) == batch_size_) {
        co_yield batch;
        batch = fresh();
      }
    }
    if (!batch.empty() && !drop_last_) co_yield batch;
  }
  std::vector<Index> fresh() const {
    std::vector<Index> v;
    // At most a page's worth up front: a batch size larger than the epoch is allowed (one batch
    // of everything, as torch's), and must not be allocated as given.
    v.reserve(static_cast<std::size_t>(std::min<std::int64_t>(batch_size_, 512)));
    return v;
  }

  S sampler_;
  std::int64_t batch_size_;
  bool drop_last_;
};

}  // namespace coload
