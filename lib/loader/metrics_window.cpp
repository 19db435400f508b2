#include "coload/loader/detail/metrics_window.hpp"

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace coload::detail {

namespace {
std::string trace_path(std::string trace) {
  if (!trace.empty()) return trace;
  // Every loader of the process traces: the first to PATH, each later one to PATH.1, .2...
  static std::atomic<int> traced{0};
  if (const char* env = std::getenv("COLOAD_TRACE"); env && *env) {
    trace = env;
    if (const int n = traced.fetch_add(1)) trace += "." + std::to_string(n);
  }
  return trace;
}
}  // namespace

MetricsWindow::MetricsWindow(bool metrics, std::string trace, int num_workers) {
  if (const char* env = std::getenv("COLOAD_METRICS"); env && std::string(env) == "0") {
    metrics = false;
  }
  const int shards =
      std::max({num_workers, 1, static_cast<int>(std::thread::hardware_concurrency())});
  recorder_ = std::make_shared<Recorder>(shards, metrics, trace_path(std::move(trace)));
}

void MetricsWindow::start_epoch(std::int64_t skipped,
                                std::shared_ptr<const std::atomic<std::uint64_t>> ended) {
  std::lock_guard lock(mutex_);
  finished_ns_ += epoch_ns_locked();
  epoch_base_ = metrics_base(*recorder_, skipped);
  epoch_start_ns_ = now_ns();
  epoch_end_ = std::move(ended);
}

Metrics MetricsWindow::epoch(std::int64_t skipped) const {
  std::lock_guard lock(mutex_);
  const double seconds = static_cast<double>(epoch_ns_locked()) / 1e9;
  return make_metrics(*recorder_, epoch_base_, seconds, skipped);
}

Metrics MetricsWindow::total(std::int64_t skipped) const {
  std::lock_guard lock(mutex_);
  const double seconds = static_cast<double>(finished_ns_ + epoch_ns_locked()) / 1e9;
  return make_metrics(*recorder_, MetricsBase{}, seconds, skipped);
}

std::uint64_t MetricsWindow::epoch_ns_locked() const noexcept {
  if (!epoch_start_ns_ || !epoch_end_) return 0;
  const std::uint64_t end = epoch_end_->load() ? epoch_end_->load() : now_ns();
  return end > epoch_start_ns_ ? end - epoch_start_ns_ : 0;
}

}  // namespace coload::detail
