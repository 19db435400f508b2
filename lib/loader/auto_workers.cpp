// auto_workers: the tuning rule, the usable CPUs and the options check.

#include "coload/loader/auto_workers.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "coload/core/error.hpp"
#include "cpu_quota.hpp"

namespace coload::detail {

WorkerTuner::WorkerTuner(int max_workers, int span) noexcept
    : max_workers_(std::max(1, max_workers)), span_(std::clamp(span, 1, max_span)) {}

double WorkerTuner::span_rate() const noexcept {
  double seconds = 0;
  double batches = 0;
  for (int i = 0; i < std::min(span_windows_, span_); ++i) {
    seconds += span_seconds_[i];
    batches += span_batches_[i];
  }
  return seconds > 0 ? batches / seconds : 0;
}

int WorkerTuner::change(int by) noexcept {
  span_windows_ = 0;
  idle_windows_ = 0;
  workers_ += by;
  if (by > 0) ++grown_;
  if (by < 0) ++shrunk_;
  min_seen_ = std::min(min_seen_, workers_);
  max_seen_ = std::max(max_seen_, workers_);
  return by;
}

int WorkerTuner::decide(const TuningWindow& window) noexcept {
  if (!(window.seconds > 0)) return 0;
  ++windows_;
  const double w = workers_;
  const double busy = std::clamp(w - window.worker_idle / window.seconds, 0.0, w);
  const double wait = window.consumer_wait / window.seconds;
  // The consumer did not wait and one fewer worker would still have been less than `spare`
  // busy: a worker to spare, if that holds over a whole span.
  const bool idle = workers_ > 1 && wait < grow_wait && busy <= spare * (w - 1);
  idle_windows_ = idle ? idle_windows_ + 1 : 0;
  span_seconds_[span_windows_ % span_] = window.seconds;
  span_batches_[span_windows_ % span_] = window.batches;
  ++span_windows_;
  // A probe is judged, and a base rate taken, over a whole span at one count.
  const bool span_full = span_windows_ >= span_;
  if (probing_ != Probe::none && !span_full) return 0;
  const double rate = span_rate();
  if (probing_ == Probe::up) {
    probing_ = Probe::none;
    if (rate > base_rate_ * (1 + min_gain)) {
      next_hold_ = 2;  // it paid: the next probe may follow at once (below)
      // At the maximum the next probe would be one fewer, just measured worse: not at once,
      // and later after each probe down (a kept probe up does not reset this hold, or a
      // probe down kept on noise and the probe up that undoes it would cycle every few
      // windows).
      if (workers_ >= max_workers_) down_wait_ = down_hold_;
    } else {
      hold_ = next_hold_;
      next_hold_ = std::min(2 * next_hold_, max_hold);
      return change(-1);
    }
  } else if (probing_ == Probe::down) {
    probing_ = Probe::none;
    if (rate < base_rate_) {
      // Slower with one fewer: the maximum is confirmed, and the next probe down waits the
      // longest hold. Each probe down costs its span at one fewer plus the refill around two
      // changes; held only 2, 4, 8, ... windows they took 1-3% of a short run's rate. (Its
      // own hold: should a worker be removed meanwhile, adding it back is not held.)
      down_wait_ = down_hold_ = max_hold;
      return change(1);
    }
    down_hold_ = std::min(2 * down_hold_, max_hold);
    // One fewer did as well: it stays (the same rate with less CPU), and the next probe waits
    // as after an added worker that did not pay.
    hold_ = next_hold_;
    next_hold_ = std::min(2 * next_hold_, max_hold);
  }
  if (wait >= grow_wait) {
    if (hold_ > 0) {
      --hold_;
      return 0;
    }
    if (workers_ >= max_workers_ && down_wait_ > 0) {
      --down_wait_;
      return 0;
    }
    if (!span_full) return 0;
    base_rate_ = rate;
    if (workers_ >= max_workers_) {
      // At the maximum: try one fewer. Each added worker was kept on a gain of min_gain, which
      // a noisy window can fake; past the CPUs the last ones may cost more than they give.
      if (workers_ == 1) return 0;
      probing_ = Probe::down;
      return change(-1);
    }
    probing_ = Probe::up;
    return change(1);
  }
  if (idle && idle_windows_ >= span_) return change(-1);
  return 0;
}

WorkerTuning WorkerTuner::tuning() const noexcept {
  return WorkerTuning{.automatic = true,
                      .workers = workers_,
                      .max_workers = max_workers_,
                      .windows = windows_,
                      .grown = grown_,
                      .shrunk = shrunk_,
                      .min_seen = min_seen_,
                      .max_seen = max_seen_};
}

int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0
                          ? CPU_COUNT(&set)
                          : static_cast<int>(std::thread::hardware_concurrency());
  // A CPU quota (a container's --cpus) gives less time than the CPUs the process may run on:
  // twice those CPUs' threads would take turns on the quota's share.
  const int quota = cgroup_cpu_limit();
  return std::max(1, quota > 0 && (allowed <= 0 || quota < allowed) ? quota : allowed);
}

int max_auto_workers() noexcept { return 2 * usable_cpus(); }

void check_auto_workers(bool iterable, bool processes) {
  if (iterable) {
    throw InvalidArgument(
        "num_workers = auto_workers needs a map-style dataset: an iterable dataset's workers "
        "each stream their own share, so their number shapes the data; give num_workers a "
        "number");
  }
  if (processes) {
    throw InvalidArgument(
        "num_workers = auto_workers tunes worker threads; with executor = processes give "
        "num_workers a number");
  }
}

}  // namespace coload::detail
