#pragma once
// WorkerInfo and get_worker_info(): which worker is fetching, as torch.utils.data tells it.

#include <cstdint>
#include <optional>

namespace coload {

/// Who is fetching: as torch.utils.data.get_worker_info() describes a worker.
struct WorkerInfo {
  /// This worker's id, in [0, num_workers).
  int id = 0;
  /// How many workers the loader runs.
  int num_workers = 0;
  /// This worker's seed for the current epoch: the epoch's base seed plus the id.
  std::uint64_t seed = 0;
  /// The dataset this worker fetches from (shared by all thread workers).
  const void* dataset = nullptr;
  /// This process's rank among the distributed replicas, and how many there are (from the
  /// loader's options or torchrun's `RANK` and `WORLD_SIZE`; 0 and 1 when not distributed).
  int rank = 0;
  int world_size = 1;

  /// The shard an iterable dataset streams in this worker, in [0, num_shards()): each rank's
  /// workers take consecutive shards, `rank * num_workers + id`.
  int shard_id() const noexcept { return rank * (num_workers > 0 ? num_workers : 1) + id; }
  /// How many shards the iterable dataset is cut into: `world_size * num_workers`.
  int num_shards() const noexcept { return world_size * (num_workers > 0 ? num_workers : 1); }

  /// The dataset, as the type the loader was built with.
  template <class D>
  const D* dataset_as() const noexcept {
    return static_cast<const D*>(dataset);
  }
};

/// Inside a worker, that worker's WorkerInfo; outside any worker (including the driver when
/// `num_workers = 0`), empty.
std::optional<WorkerInfo> get_worker_info();

namespace detail {
/// Installs `info` as the calling thread's worker info (nullptr clears it).
void set_worker_info(const WorkerInfo* info) noexcept;
/// The calling thread's worker info, or nullptr.
const WorkerInfo* current_worker_info() noexcept;

/// Marks the calling thread as thread `id` of its worker pool (exec's ThreadExecutor does so
/// once per thread it starts).
void set_current_worker_id(int id) noexcept;
/// The calling thread's id in its worker pool, or -1 on any other thread.
int current_worker_id() noexcept;
}  // namespace detail

}  // namespace coload
