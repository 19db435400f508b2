#pragma once
// auto_workers: a worker count the loader tunes itself while it runs, and the rule it tunes by.

#include <cstdint>

namespace coload {

/// `num_workers = coload::auto_workers`: the loader picks the number of worker threads itself
/// and keeps adjusting it (map-style datasets with thread workers; iterable datasets and
/// worker processes are refused, naming the option). It starts with one worker and may use as
/// many as this process may run on (sched_getaffinity); all those threads start with the
/// loader, and those not in use sleep. It adds a worker when the consumer waited for batches
/// while the workers were saturated, and removes one when the others could carry the load;
/// the in-flight bound (prefetch_factor x workers) follows the count. The count carries over
/// from one epoch to the next. Batches are the same whatever the count: each sample's
/// randomness depends only on (seed, epoch, index). WorkerInfo::num_workers, and the
/// options' num_workers, say how many threads there are (the most it may use).
inline constexpr int auto_workers = -1;

/// Where a loader's worker count stands (DataLoader::worker_tuning()).
struct WorkerTuning {
  bool automatic = false;        ///< num_workers = auto_workers
  int workers = 0;               ///< the workers taking work now (num_workers when fixed)
  int max_workers = 0;           ///< the most it may use
  std::int64_t windows = 0;      ///< measurement windows judged
  std::int64_t grown = 0;        ///< workers added
  std::int64_t shrunk = 0;       ///< workers removed
  int min_seen = 0;              ///< the fewest workers it has run with
  int max_seen = 0;              ///< the most workers it has run with
};

namespace detail {

/// What one measurement window saw, in seconds.
struct TuningWindow {
  double seconds = 0;        ///< wall time of the window
  double consumer_wait = 0;  ///< time the consumer spent waiting for a batch
  double worker_idle = 0;    ///< time the workers in use spent, together, waiting for work
};

/// The rule behind auto_workers, apart from any clock so that it can be tested on its own.
/// With `w` workers in use, busy = w - worker_idle / seconds workers were busy on average, and
/// the consumer waited wait = consumer_wait / seconds of the window:
///   - grow by one when wait >= grow_wait and busy >= saturated x w (the workers are what the
///     consumer waits for), up to max_workers;
///   - shrink by one when busy <= spare x (w - 1) (one fewer would still be less than
///     `spare` busy), down to one;
///   - else keep. The gap between the two (a worker added at 85% busy is removed only once
///     the load would fit in the others at 75%) keeps the count from oscillating.
class WorkerTuner {
 public:
  static constexpr double grow_wait = 0.05;
  static constexpr double saturated = 0.85;
  static constexpr double spare = 0.75;

  /// Starts with one worker, allowing up to `max_workers` (at least one).
  explicit WorkerTuner(int max_workers) noexcept;

  /// The workers to use now.
  int workers() const noexcept { return workers_; }
  /// Judges a window measured with workers() workers; returns the change made (+1, -1 or 0).
  int decide(const TuningWindow& window) noexcept;
  /// The counts so far.
  WorkerTuning tuning() const noexcept;

 private:
  int max_workers_;
  int workers_ = 1;
  std::int64_t windows_ = 0;
  std::int64_t grown_ = 0;
  std::int64_t shrunk_ = 0;
  int min_seen_ = 1;
  int max_seen_ = 1;
};

/// The CPUs this process may run on (sched_getaffinity; hardware_concurrency where that
/// fails), at least one.
int usable_cpus() noexcept;

/// Refuses auto_workers where it does not apply, naming the option: an iterable dataset (each
/// worker streams its own shard, so the count shapes the data) and worker processes.
void check_auto_workers(bool iterable, bool processes);

}  // namespace detail
}  // namespace coload
