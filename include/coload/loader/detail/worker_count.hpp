#pragma once
// The loader's worker count and the in-flight bound it gives: fixed, or under auto_workers
// moved by the tuner after measuring the consumer's wait and the workers' idle time.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

#include "coload/loader/auto_workers.hpp"

namespace coload {
class ThreadExecutor;
}

namespace coload::detail {

/// How many workers take work and how many batches may be in flight. Built on the consumer's
/// thread; tune() runs on the driver, the rest on any thread.
class WorkerCount {
 public:
  /// `num_workers` as the options say (coload::auto_workers: tuned, checked here against
  /// `iterable` and `processes`); `prefetch_factor` per worker; `first_alone`: an epoch's first
  /// batch is made while no other is (an asynchronous dataset on worker threads, where every
  /// thread works on one batch's samples).
  WorkerCount(int num_workers, std::optional<int> prefetch_factor, bool iterable, bool processes,
              bool first_alone);

  /// True under auto_workers.
  bool tuned() const noexcept { return tuner_.has_value(); }
  /// The worker threads or processes to start: num_workers, or under auto_workers the most it
  /// may use (all started, most asleep).
  int started() const noexcept { return started_; }
  /// Lets the tuner set how many of `executor`'s threads take work (auto_workers only).
  void attach(ThreadExecutor* executor);

  /// The workers taking work now (num_workers when fixed).
  int in_use() const noexcept;
  /// At most this many batches between dispatch and the consumer now: prefetch_factor per
  /// worker in use.
  std::int64_t bound() const noexcept;
  /// The most bound() can be: prefetch_factor per worker started; two without workers (a
  /// driver with a thread of its own still fetches up to two batches ahead of the consumer;
  /// one that runs inside the consumer's wait fetches one, RunBase::full).
  std::int64_t capacity() const noexcept;
  /// The bound of a map-style epoch until its first batch is done, so that the first batch is
  /// not made alongside the ones after it (time to first batch; each batch's fresh buffer also
  /// costs page faults): one where the first batch goes alone, else one per worker. Where it
  /// goes alone and its bytes took longer than slow_first_bytes() to arrive, the others start
  /// once its CPU work begins on a worker thread (RunBase::cpu_started).
  std::int64_t first_batch_bound() const noexcept;
  /// Where the worker count stands.
  WorkerTuning tuning() const;

  /// Driver, after each completed batch of epoch `epoch`: under auto_workers, once a window of
  /// at least tune_window and tune_batches has passed, measures it (`consumer_wait_ns`, the
  /// consumer's total wait so far; the workers' idle time from the executor) and lets the tuner
  /// add or remove a worker. Returns the change (+1, -1, 0). The first completion of each epoch
  /// only opens a window, so the pipeline's filling and the pause between epochs are not judged.
  int tune(std::int64_t epoch, std::int64_t consumer_wait_ns);

  /// How long an epoch's first batch (where it goes alone) may wait for its bytes and still
  /// hold the others back until it is done. Bytes from a local disk or a server near by come
  /// within it: the first batch then has the cores to itself (letting the others read beside
  /// it cost 4 ms of local shards' first batch, 13 ms of nginx's on loopback). Bytes that took
  /// a remote link's round trip come later: the others start as soon as the first batch's CPU
  /// work begins, or every epoch's start would wait for a second round trip (0.75 -> 0.78 of
  /// local shards' images/s with 20 ms added). 5 ms; tests set it.
  static std::chrono::nanoseconds slow_first_bytes() noexcept;
  static void set_slow_first_bytes(std::chrono::nanoseconds limit) noexcept;

  /// The shortest window auto_workers judges: this long, and this many batches (its rates are
  /// compared, and a window of one or two large batches says little). 3 ms: with 10 ms the
  /// overhead workload's 20 ms epochs held one or two windows each, and climbing from one
  /// worker to four (2 windows a step, see tune_span) took most of a 10-epoch run; with 3 ms it
  /// is done within the warm-up epoch. Slow batches (images: 30 ms) are bounded by the batch
  /// count instead.
  static constexpr std::chrono::milliseconds tune_window{3};
  static constexpr std::int64_t tune_batches = 4;
  /// The windows over which auto_workers compares rates (WorkerTuner's span).
  static constexpr int tune_span = 2;

 private:
  struct WindowStart {
    std::int64_t epoch = -1;
    std::chrono::steady_clock::time_point start{};
    std::int64_t wait_ns = 0;
    std::int64_t idle_ns = 0;
    std::int64_t batches = 0;  // completed since start
  };

  std::optional<WorkerTuner> tuner_;
  const int started_;
  const int prefetch_;
  const bool first_alone_;
  ThreadExecutor* executor_ = nullptr;
  mutable std::mutex tuning_mutex_;  // tuner_'s counts, read by tuning()
  std::atomic<int> active_{0};       // tuner_->workers(), for bound()
  WindowStart window_;               // driver
};

}  // namespace coload::detail
