#pragma once
// The loader's recorder and the window of it that DataLoader::metrics() reports: the current
// (or last) epoch, or every epoch so far.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "coload/core/metrics.hpp"
#include "coload/loader/metrics.hpp"

namespace coload::detail {

/// Owns the recorder every stage records into (made before any worker is forked: its shards
/// are shared with them) and the epoch window over it. Any thread.
class MetricsWindow {
 public:
  /// `metrics` on unless COLOAD_METRICS=0; `trace`: a trace file, else COLOAD_TRACE's (each
  /// later loader of the process to PATH.1, .2, ...); shards for `num_workers` workers and at
  /// least the CPUs.
  MetricsWindow(bool metrics, std::string trace, int num_workers);

  Recorder& recorder() noexcept { return *recorder_; }
  const Recorder& recorder() const noexcept { return *recorder_; }
  /// The recorder, shared: an epoch kept after its loader has gone still records its waits.
  const std::shared_ptr<Recorder>& shared_recorder() const noexcept { return recorder_; }

  /// A new epoch starts now; `ended` says when it ended (0 while it runs). The last epoch's
  /// time joins the total.
  void start_epoch(std::int64_t skipped, std::shared_ptr<const std::atomic<std::uint64_t>> ended);
  /// The current or last epoch's measurements (all zero before the first epoch).
  Metrics epoch(std::int64_t skipped) const;
  /// Every epoch's measurements so far, as one window.
  Metrics total(std::int64_t skipped) const;

 private:
  std::uint64_t epoch_ns_locked() const noexcept;

  std::shared_ptr<Recorder> recorder_;
  mutable std::mutex mutex_;  // the window, below
  MetricsBase epoch_base_;
  std::uint64_t epoch_start_ns_ = 0;
  std::uint64_t finished_ns_ = 0;  // the finished epochs' time
  std::shared_ptr<const std::atomic<std::uint64_t>> epoch_end_;
};

}  // namespace coload::detail
