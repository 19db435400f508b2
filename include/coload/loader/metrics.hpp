#pragma once
// Metrics: where an epoch's time went, stage by stage, per worker, and the verdict on it.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "coload/core/metrics.hpp"

namespace coload {

/// One stage's spans: how many, their total, and quantiles of one span (of the mean per item
/// when a span covers several items, e.g. the `get`s of a whole batch timed at once).
struct StageMetrics {
  std::int64_t count = 0;
  double seconds = 0;
  double p50_ms = 0;
  double p95_ms = 0;
  double p99_ms = 0;
};

/// Quantiles of one operation's latency where operations overlap, so that their sum is no one's
/// time: reads, from a read's start to its data in the reader's hands (which, where the thread
/// that reaps them is busy decoding, includes the wait for that thread).
struct LatencyMetrics {
  std::int64_t count = 0;
  double p50_ms = 0;
  double p95_ms = 0;
  double p99_ms = 0;
};

/// One worker: its id, its process (the loader's own for thread workers), and the fraction of
/// the window it spent working (every stage it recorded).
struct WorkerMetrics {
  int id = 0;
  int pid = 0;
  double busy_fraction = 0;
};

/// A snapshot of a loader's measurements over one window: the current or last epoch
/// (DataLoader::metrics()), or every epoch so far (DataLoader::total_metrics()).
struct Metrics {
  bool enabled = true;    ///< false when LoaderOptions::metrics (or COLOAD_METRICS=0) is off
  double seconds = 0;     ///< the window's wall time (an epoch: from epoch() to its end)
  std::int64_t batches = 0;  ///< batches the consumer took
  std::int64_t samples = 0;  ///< samples in those batches' fetches (skips left out)
  double wait_seconds = 0;   ///< the consumer's time in next(), waiting for a batch
  double wait_fraction = 0;  ///< wait_seconds / seconds
  /// Indexed by Stage. A stage's seconds are time threads spent on it; for asynchronous reads,
  /// the time a thread had reads in flight and recorded nothing else, counted once however many
  /// were in flight: so no stage exceeds the window's seconds times the threads recording it.
  std::array<StageMetrics, stage_count> stages{};
  /// Each read's latency (their sum would count overlapping reads many times over).
  LatencyMetrics read_latency;
  /// Seconds of each stage spent on the workers (on the driver without workers): what the
  /// verdict shares out. Asynchronous reads count only where a worker waited on them (a worker
  /// process reaps its own batch's reads); with worker threads they are the driver's.
  std::array<double, stage_count> worker_seconds{};
  std::uint64_t bytes_read = 0;
  std::vector<WorkerMetrics> workers;
  double occupancy = 0;    ///< batches in flight / the in-flight bound then, at each dispatch
  double num_workers = 0;  ///< mean worker count at each dispatch
  std::int64_t skipped = 0;
  std::int64_t errors = 0;

  const StageMetrics& stage(Stage s) const noexcept { return stages[static_cast<std::size_t>(s)]; }
  /// The verdict in one or two lines: which side is the bottleneck and why, e.g. "input-bound:
  /// the trainer waited 52% of the epoch; workers 98% busy, decode 61% of their time, transform
  /// 30%: more workers or a cheaper decode would help", or "the model is the bottleneck: the
  /// trainer waited 1% of the epoch".
  std::string report() const;
  /// The snapshot as one JSON object (the keys of the image_folder example's "metrics").
  std::string to_json() const;
};

namespace detail {
/// Where a window starts: the recorder's figures at that moment.
struct MetricsBase {
  std::vector<ShardTotals> shards;  ///< empty: from zero
  std::uint64_t errors = 0, occupancy_sum = 0, occupancy_n = 0, workers_sum = 0, bound_sum = 0;
  std::int64_t skipped = 0;
};
MetricsBase metrics_base(const Recorder& recorder, std::int64_t skipped);
/// The window from `base` to now, lasting `seconds`.
Metrics make_metrics(const Recorder& recorder, const MetricsBase& base, double seconds,
                     std::int64_t skipped);
}  // namespace detail

}  // namespace coload
