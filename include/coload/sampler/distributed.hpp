#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coload/coro/generator.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Where this process stands in a distributed job, as `torchrun` (torch.distributed.run)
/// describes it to each process it starts.
struct DistributedEnv {
  /// This process's global rank, in [0, world_size) (`RANK`).
  int rank = 0;
  /// How many processes share the job (`WORLD_SIZE`).
  int world_size = 1;
  /// This process's rank on its own machine (`LOCAL_RANK`): which GPU it should use.
  int local_rank = 0;
};

/// Reads torchrun's `RANK`, `WORLD_SIZE` and `LOCAL_RANK`. A variable that is unset or empty
/// takes its default (0, 1 and 0: a single, non-distributed process). Throws
/// std::invalid_argument naming the variable and its value when one is not a decimal integer
/// (`RANK=abc is not an integer`) or is out of range: `WORLD_SIZE` must be at least 1, `RANK`
/// and `LOCAL_RANK` in [0, WORLD_SIZE) (`RANK=3 is not in [0, WORLD_SIZE=2)`).
/// The environment is read on every call; nothing is cached.
DistributedEnv distributed_env();

/// This replica's share of a dataset's indices, as torch.utils.data.distributed.DistributedSampler.
///
/// Every replica computes the same order (a `randperm` seeded with `seed + epoch` when
/// shuffling, `0 .. size - 1` otherwise), pads it by repetition to a multiple of
/// `num_replicas` (or, with `drop_last`, cuts its tail), and takes every `num_replicas`-th index
/// starting at `rank`. set_epoch() chooses the epoch, and so the order, that indices() yields.
///
/// `num_replicas` and `rank` default to the environment `torchrun` sets (`WORLD_SIZE`, `RANK`,
/// read by distributed_env()), or 1 and 0 when it is unset: PyTorch would ask an initialised
/// process group instead, which coload does not have.
///
/// A DataLoader calls set_epoch() with its own epoch count (0, 1, ...) as each epoch starts, so
/// the order changes every epoch without the caller's help (PyTorch leaves that call to the
/// training loop). Outside a loader, call it before each epoch.
class DistributedSampler {
 public:
  /// Refuses a rank outside `[0, num_replicas)` with PyTorch's message. When `num_replicas` or
  /// `rank` is left out, distributed_env() supplies it (and refuses a malformed or
  /// inconsistent environment, naming the variable).
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
