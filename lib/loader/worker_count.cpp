#include "coload/loader/detail/worker_count.hpp"

#include <algorithm>

#include "coload/exec/thread_executor.hpp"

namespace coload::detail {

namespace {
std::atomic<std::int64_t> slow_first_bytes_ns{5'000'000};

std::optional<WorkerTuner> make_tuner(int num_workers, bool iterable, bool processes) {
  if (num_workers != auto_workers) return std::nullopt;
  check_auto_workers(iterable, processes);
  return WorkerTuner(max_auto_workers(), WorkerCount::tune_span);
}
}  // namespace

WorkerCount::WorkerCount(int num_workers, std::optional<int> prefetch_factor, bool iterable,
                         bool processes, bool first_alone)
    : tuner_(make_tuner(num_workers, iterable, processes)),
      started_(tuner_ ? max_auto_workers() : num_workers),
      prefetch_(prefetch_factor.value_or(2)),
      first_alone_(first_alone) {}

void WorkerCount::attach(ThreadExecutor* executor) {
  executor_ = executor;
  if (!tuner_ || !executor_) return;
  executor_->set_active(tuner_->workers());
  active_.store(tuner_->workers(), std::memory_order_relaxed);
}

int WorkerCount::in_use() const noexcept {
  return tuner_ ? active_.load(std::memory_order_relaxed) : started_;
}

std::int64_t WorkerCount::capacity() const noexcept {
  return started_ > 0 ? static_cast<std::int64_t>(prefetch_) * started_ : 2;
}

std::int64_t WorkerCount::bound() const noexcept {
  if (!tuner_) return capacity();
  return static_cast<std::int64_t>(prefetch_) * active_.load(std::memory_order_relaxed);
}

std::int64_t WorkerCount::first_batch_bound() const noexcept {
  if (first_alone_) return 1;
  return std::min<std::int64_t>(bound(), std::max(in_use(), 1));
}

std::chrono::nanoseconds WorkerCount::slow_first_bytes() noexcept {
  return std::chrono::nanoseconds(slow_first_bytes_ns.load(std::memory_order_relaxed));
}

void WorkerCount::set_slow_first_bytes(std::chrono::nanoseconds limit) noexcept {
  slow_first_bytes_ns.store(limit.count(), std::memory_order_relaxed);
}

WorkerTuning WorkerCount::tuning() const {
  if (tuner_) {
    std::lock_guard lock(tuning_mutex_);
    return tuner_->tuning();
  }
  return WorkerTuning{.workers = started_, .max_workers = started_, .min_seen = started_,
                      .max_seen = started_};
}

int WorkerCount::tune(std::int64_t epoch, std::int64_t consumer_wait_ns) {
  if (!tuner_ || !executor_) return 0;
  const auto now = std::chrono::steady_clock::now();
  ++window_.batches;
  if (epoch == window_.epoch &&
      (now - window_.start < tune_window || window_.batches < tune_batches)) {
    return 0;
  }
  const int active = tuner_->workers();
  const std::int64_t idle = executor_->idle_nanoseconds(active);
  int change = 0;
  if (epoch == window_.epoch) {
    TuningWindow w;
    w.seconds = std::chrono::duration<double>(now - window_.start).count();
    w.consumer_wait = 1e-9 * static_cast<double>(consumer_wait_ns - window_.wait_ns);
    w.worker_idle = 1e-9 * static_cast<double>(idle - window_.idle_ns);
    w.batches = static_cast<double>(window_.batches);
    {
      std::lock_guard lock(tuning_mutex_);
      change = tuner_->decide(w);
    }
    if (change != 0) {
      executor_->set_active(tuner_->workers());
      active_.store(tuner_->workers(), std::memory_order_relaxed);
    }
  }
  // The next window starts now, with the workers in use from now on.
  window_ = WindowStart{epoch, now, consumer_wait_ns,
                        change != 0 ? executor_->idle_nanoseconds(tuner_->workers()) : idle};
  return change;
}

}  // namespace coload::detail
