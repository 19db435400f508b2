#pragma once
// auto_workers: a worker count the loader tunes itself while it runs, and the rule it tunes by.

#include <cstdint>
#include <limits>

namespace coload {

/// `num_workers = coload::auto_workers`: the loader picks the number of worker threads itself
/// and keeps adjusting it (map-style datasets with thread workers; iterable datasets and
/// worker processes are refused, naming the option). It starts with one worker and may use up
/// to twice the CPUs this process may run on (usable_cpus(); more threads than CPUs help
/// when workers wait on reads or the batches in flight are what limits, see max_auto_workers);
/// all those threads start with the loader, and those not in use sleep. While the consumer
/// waits for batches it tries one more worker and keeps it only if batches arrive faster;
/// when the consumer does not wait it removes workers the others can spare. The in-flight
/// bound (prefetch_factor x workers) follows the count. The count carries over
/// from one epoch to the next. Batches are the same whatever the count: each sample's
/// randomness depends only on (seed, epoch, index). WorkerInfo::num_workers, and the
/// options' num_workers, say how many threads there are (the most it may use).
/// A spelling of its own, not a count: every negative num_workers is refused, as PyTorch
/// refuses it, and no count a machine could start means this.
inline constexpr int auto_workers = std::numeric_limits<int>::max();

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
  double batches = 0;        ///< batches completed in the window
};

/// The rule behind auto_workers, apart from any clock so that it can be tested on its own: a
/// hill climb on the batches delivered per second. With `w` workers in use, the consumer
/// waited wait = consumer_wait / seconds of the window, and busy = w - worker_idle / seconds
/// workers were busy on average. Rates are compared over spans of `span` windows (the last
/// ones at the current count): a probe is judged once it has run that many, against the rate
/// of the span before it. (The loader uses 2: on short epochs a window's rate depends on
/// where in the epoch it falls, by about 8% between an epoch's first and second 10 ms window
/// on the overhead workload, more than the gains judged; a span of one window let a probe
/// made at an epoch's end be judged on the next epoch's slow start.)
///   - after a span that tried one more worker (a probe): keep it if batches/s rose by more
///     than min_gain over the span before, else go back to w - 1 and try again only after
///     a hold of 2, 4, 8, ... windows (up to max_hold; a kept worker resets it);
///   - after a span that tried one fewer at the maximum (a probe down): stay at w - 1 if
///     batches/s did not fall, and hold the next probe as above; else go back to w and hold
///     the next probe max_hold windows (the maximum is confirmed: a probe down costs a span
///     at one fewer, which on a short run is rate lost). The hold before a probe down, once
///     back at the maximum, doubles with each probe down (2, 4, 8, ... windows);
///   - else, when wait >= grow_wait and w < max_workers: probe w + 1. Waiting says only that
///     the input side is behind, not why (busy workers, or idle ones whose batches are in
///     flight, or reads): the rate measured with one more is what decides. At max_workers
///     (after a hold of 2 windows once the last worker was kept) probe w - 1 instead: a worker
///     kept on a noisy window's gain is tested again;
///   - else, when wait < grow_wait and busy <= spare x (w - 1) (the consumer is the
///     bottleneck and one fewer would still be less than `spare` busy) in each of the last
///     `span` windows at this count: remove one, down to one (a single window where the
///     consumer happened not to wait took workers the run needed);
///   - else keep.
class WorkerTuner {
 public:
  static constexpr double grow_wait = 0.05;
  static constexpr double min_gain = 0.02;
  static constexpr double spare = 0.75;
  static constexpr int max_hold = 64;

  /// The longest span (windows per comparison).
  static constexpr int max_span = 4;

  /// Starts with one worker, allowing up to `max_workers` (at least one), comparing rates
  /// over `span` windows (clamped to 1..max_span).
  explicit WorkerTuner(int max_workers, int span = 1) noexcept;

  /// The workers to use now.
  int workers() const noexcept { return workers_; }
  /// Judges a window measured with workers() workers; returns the change made (+1, -1 or 0).
  int decide(const TuningWindow& window) noexcept;
  /// The counts so far.
  WorkerTuning tuning() const noexcept;

 private:
  int change(int by) noexcept;
  /// Batches per second over the span's windows at the current count.
  double span_rate() const noexcept;

  int max_workers_;
  int span_;
  // The last span_ windows at the current count (a ring; emptied by every change).
  double span_seconds_[max_span] = {};
  double span_batches_[max_span] = {};
  int span_windows_ = 0;  // windows at the current count so far
  int idle_windows_ = 0;  // consecutive windows, at the current count, with a worker to spare
  int workers_ = 1;
  enum class Probe { none, up, down };
  Probe probing_ = Probe::none;  // the last change was a probe, judged by the next span
  double base_rate_ = 0;   // batches/s of the span before the probe
  int hold_ = 0;           // windows to wait before the next probe
  int next_hold_ = 2;      // the hold after the next probe that does not pay
  int down_hold_ = 2;      // the hold before a probe down, once at the maximum
  int down_wait_ = 0;      // windows at the maximum to wait before the next probe down
  std::int64_t windows_ = 0;
  std::int64_t grown_ = 0;
  std::int64_t shrunk_ = 0;
  int min_seen_ = 1;
  int max_seen_ = 1;
};

/// The most workers auto_workers may use: twice the CPUs this process may use. Measured on a
/// 2-CPU machine, 4 threads beat 2 and 3 both on JPEG decoding (+14% over 3) and on tiny
/// in-memory samples (+15%), where the batches in flight, not the CPUs, limit.
int max_auto_workers() noexcept;

/// The CPUs this process may run on: its affinity mask (sched_getaffinity; hardware_concurrency
/// where that fails), lowered to its cgroup's CPU quota rounded up (cgroup v2 cpu.max or v1
/// cfs_quota_us / cfs_period_us, the least along its cgroup path), at least one.
int usable_cpus() noexcept;

/// Refuses auto_workers where it does not apply, naming the option: an iterable dataset (each
/// worker streams its own shard, so the count shapes the data) and worker processes.
void check_auto_workers(bool iterable, bool processes);

}  // namespace detail
}  // namespace coload
