#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coload/coro/generator.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// This replica's share of a dataset's indices, as torch.utils.data.distributed.DistributedSampler.
///
/// Every replica computes the same order (a `randperm` seeded with `seed + epoch` when
/// shuffling, `0 .. size - 1` otherwise), pads it by repetition to a multiple of
/// `num_replicas` (or, with `drop_last`, cuts its tail), and takes every `num_replicas`-th index
/// starting at `rank`. Call set_epoch() before each epoch to get a new order.
///
/// `num_replicas` and `rank` default to the environment `torchrun` sets (`WORLD_SIZE`, `RANK`),
/// or 1 and 0 when it is unset: PyTorch would ask an initialised process group instead, which
/// coload does not have.
class DistributedSampler {
 public:
  /// Refuses a rank outside `[0, num_replicas)` with PyTorch's message, and a malformed
  /// `WORLD_SIZE` or `RANK` naming the variable.
  explicit DistributedSampler(std::int64_t dataset_size,
                              std::optional<std::int64_t> num_replicas = std::nullopt,
                              std::optional<std::int64_t> rank = std::nullopt, bool shuffle = true,
                              std::uint64_t seed = 0, bool drop_last = false);

  /// The indices of one epoch, for this rank.
  Generator<Index> indices();
  /// The same indices, as one block.
  Generator<std::span<const Index>> index_blocks();
  /// The number of indices per epoch on each replica (`num_samples` in PyTorch).
  std::int64_t size() const noexcept { return num_samples_; }
  /// Sets the epoch, which seeds the next shuffle as `seed + epoch`.
  void set_epoch(std::int64_t epoch) noexcept { epoch_ = epoch; }
  /// The epoch set last (0 initially).
  std::int64_t epoch() const noexcept { return epoch_; }
  /// The number of replicas sharing the dataset.
  std::int64_t num_replicas() const noexcept { return num_replicas_; }
  /// This replica's rank.
  std::int64_t rank() const noexcept { return rank_; }
  /// The size of the padded (or cut) index list that the replicas share.
  std::int64_t total_size() const noexcept { return num_samples_ * num_replicas_; }

 private:
  std::vector<Index> epoch_indices() const;

  std::int64_t dataset_size_;
  std::int64_t num_replicas_;
  std::int64_t rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t epoch_ = 0;
  std::int64_t num_samples_;
};

}  // namespace coload
