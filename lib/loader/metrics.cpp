// Metrics: snapshots of a loader's recorder, the verdict, and their JSON.

#include "coload/loader/metrics.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace coload {

namespace {
std::string percent(double f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * f);
  return buf;
}
}  // namespace

std::string Metrics::report() const {
  if (!enabled) return "metrics are off (LoaderOptions::metrics or COLOAD_METRICS=0)";
  if (batches == 0 || seconds <= 0) return "no batches taken yet";
  // The threshold: under a tenth of the epoch waiting, the input keeps up with the model.
  constexpr double input_bound = 0.10;
  if (wait_fraction < input_bound) {
    return "the model is the bottleneck: the trainer waited " + percent(wait_fraction) +
           " of the epoch";
  }
  std::string out = "input-bound: the trainer waited " + percent(wait_fraction) + " of the epoch";
  // Where the workers' time went (the driver's, without workers).
  double work = 0;
  for (std::size_t i = 0; i < stage_count; ++i) {
    if (static_cast<Stage>(i) != Stage::wait) work += worker_seconds[i];
  }
  std::vector<std::pair<double, Stage>> shares;
  for (std::size_t i = 0; i < stage_count; ++i) {
    const auto s = static_cast<Stage>(i);
    if (s != Stage::wait && work > 0 && worker_seconds[i] > 0) {
      shares.emplace_back(worker_seconds[i] / work, s);
    }
  }
  std::sort(shares.begin(), shares.end(), [](auto& a, auto& b) { return a.first > b.first; });
  double busy = 0;
  for (const auto& w : workers) busy += w.busy_fraction;
  if (!workers.empty()) busy /= static_cast<double>(workers.size());
  out += workers.empty() ? std::string("; no workers (the driver fetches)")
                         : "; workers " + percent(busy) + " busy";
  for (std::size_t k = 0; k < shares.size() && k < 2; ++k) {
    if (k > 0 && shares[k].first < 0.10) break;
    out += ", ";
    out += stage_name(shares[k].second);
    // NOTE: appended piece by piece: `" " + percent(...)` trips GCC 12's -Wstringop-overflow
    // (a false positive in the inlined operator+).
    out += ' ';
    out += percent(shares[k].first);
    if (k == 0) out += " of their time";
  }
  const std::string top = shares.empty() ? std::string("fetch")
                                         : std::string(stage_name(shares.front().second));
  out += ": ";
  // The driver walks the sampler one batch at a time: a slow sampler leaves the workers idle
  // whatever they are given, and more of them would not help.
  const double sampling = stages[static_cast<std::size_t>(Stage::sample)].seconds / seconds;
  if (!workers.empty() && busy < 0.75 && sampling >= 0.25) {
    return out + "the sampler took " + percent(sampling) +
           " of the epoch on the driver, which draws one batch at a time: a cheaper sampler "
           "would help";
  }
  // Copies to the device run on the driver, off the workers: when they take the epoch, the
  // workers idle behind them and neither more workers nor more prefetching would help.
  const double copying = stages[static_cast<std::size_t>(Stage::copy)].seconds / seconds;
  if (!workers.empty() && busy < 0.75 && copying >= 0.25) {
    return out + "copying batches to the device took " + percent(copying) +
           " of the epoch: fewer bytes per batch (uint8 images normalised on the device, say) "
           "would help";
  }
  if (workers.empty()) {
    out += "num_workers > 0 or a cheaper " + top + " would help";
  } else if (busy >= 0.75) {
    out += "more workers or a cheaper " + top + " would help";
  } else {
    out += "the workers are idle part of the time: a larger prefetch_factor or faster " + top +
           " would help";
  }
  return out;
}

std::string Metrics::to_json() const {
  nlohmann::json j;
  j["seconds"] = seconds;
  j["batches"] = batches;
  j["samples"] = samples;
  j["wait_seconds"] = wait_seconds;
  j["wait_fraction"] = wait_fraction;
  nlohmann::json st = nlohmann::json::object();
  for (std::size_t i = 0; i < stage_count; ++i) {
    const StageMetrics& s = stages[i];
    if (s.count == 0 && s.seconds == 0) continue;
    st[std::string(stage_name(static_cast<Stage>(i)))] = {
        {"count", s.count}, {"seconds", s.seconds}, {"p50_ms", s.p50_ms},
        {"p95_ms", s.p95_ms}, {"p99_ms", s.p99_ms}};
  }
  j["stages"] = std::move(st);
  if (read_latency.count > 0) {
    j["read_latency"] = {{"count", read_latency.count},
                         {"p50_ms", read_latency.p50_ms},
                         {"p95_ms", read_latency.p95_ms},
                         {"p99_ms", read_latency.p99_ms}};
  }
  j["bytes_read"] = bytes_read;
  nlohmann::json ws = nlohmann::json::array();
  for (const auto& w : workers) {
    ws.push_back({{"id", w.id}, {"pid", w.pid}, {"busy_fraction", w.busy_fraction}});
  }
  j["workers"] = std::move(ws);
  j["occupancy"] = occupancy;
  j["num_workers"] = num_workers;
  j["skipped"] = skipped;
  j["errors"] = errors;
  if (!enabled) j["enabled"] = false;
  return j.dump();
}

namespace detail {

MetricsBase metrics_base(const Recorder& recorder, std::int64_t skipped) {
  MetricsBase b;
  b.shards.resize(static_cast<std::size_t>(recorder.shard_count()));
  for (int i = 0; i < recorder.shard_count(); ++i) b.shards[static_cast<std::size_t>(i)].add(recorder.at(i));
  b.errors = recorder.errors.load(std::memory_order_relaxed);
  b.occupancy_sum = recorder.occupancy_sum.load(std::memory_order_relaxed);
  b.occupancy_n = recorder.occupancy_n.load(std::memory_order_relaxed);
  b.workers_sum = recorder.workers_sum.load(std::memory_order_relaxed);
  b.bound_sum = recorder.bound_sum.load(std::memory_order_relaxed);
  b.skipped = skipped;
  return b;
}

Metrics make_metrics(const Recorder& recorder, const MetricsBase& base, double seconds,
                     std::int64_t skipped) {
  Metrics m;
  m.enabled = recorder.enabled();
  m.seconds = seconds;
  if (!m.enabled) return m;
  const MetricsBase now = metrics_base(recorder, skipped);
  ShardTotals all;
  std::array<double, stage_count> driver_seconds{};
  bool worker_work = false;
  for (std::size_t i = 0; i < now.shards.size(); ++i) {
    ShardTotals t = now.shards[i];
    if (!base.shards.empty()) t.subtract(base.shards[i]);
    const int role = recorder.role_of(static_cast<int>(i));
    // A worker's shard that recorded anything in the window (or one of the loader's count).
    if (role >= 0 && t.pid != 0) {
      WorkerMetrics w;
      w.id = role;
      w.pid = t.pid;
      w.busy_fraction = seconds > 0 ? std::min(1.0, static_cast<double>(t.busy_ns()) / 1e9 / seconds) : 0;
      m.workers.push_back(w);
    }
    for (std::size_t s = 0; s < stage_count; ++s) {
      const double sec = static_cast<double>(t.stages[s].ns) / 1e9;
      if (role >= 0) {
        m.worker_seconds[s] += sec;
        if (sec > 0) worker_work = true;
      } else if (role == Recorder::driver) {
        driver_seconds[s] = sec;
      }
    }
    for (std::size_t s = 0; s < stage_count; ++s) {
      all.stages[s].count += t.stages[s].count;
      all.stages[s].ns += t.stages[s].ns;
      for (std::size_t k = 0; k < histogram_buckets; ++k) {
        all.stages[s].buckets[k] += t.stages[s].buckets[k];
      }
    }
    all.read_latency.count += t.read_latency.count;
    for (std::size_t k = 0; k < histogram_buckets; ++k) {
      all.read_latency.buckets[k] += t.read_latency.buckets[k];
    }
    all.bytes_read += t.bytes_read;
    all.samples += t.samples;
  }
  for (std::size_t s = 0; s < stage_count; ++s) {
    const StageTotals& t = all.stages[s];
    m.stages[s] = StageMetrics{static_cast<std::int64_t>(t.count), static_cast<double>(t.ns) / 1e9,
                               t.quantile_ms(0.50), t.quantile_ms(0.95), t.quantile_ms(0.99)};
  }
  m.read_latency = LatencyMetrics{static_cast<std::int64_t>(all.read_latency.count),
                                  all.read_latency.quantile_ms(0.50),
                                  all.read_latency.quantile_ms(0.95),
                                  all.read_latency.quantile_ms(0.99)};
  if (!worker_work) m.worker_seconds = driver_seconds;
  const StageMetrics& wait = m.stage(Stage::wait);
  m.batches = wait.count;
  m.wait_seconds = wait.seconds;
  m.wait_fraction = seconds > 0 ? std::min(1.0, wait.seconds / seconds) : 0;
  m.bytes_read = all.bytes_read;
  m.skipped = skipped - base.skipped;
  m.samples = static_cast<std::int64_t>(all.samples) - m.skipped;
  if (m.samples < 0) m.samples = 0;
  m.errors = static_cast<std::int64_t>(now.errors - base.errors);
  const std::uint64_t n = now.occupancy_n - base.occupancy_n;
  if (n > 0) {
    // Against the bound at each dispatch (summed with the occupancy there), which auto_workers
    // moves with the worker count.
    const std::uint64_t bounds = now.bound_sum - base.bound_sum;
    if (bounds > 0) {
      m.occupancy = static_cast<double>(now.occupancy_sum - base.occupancy_sum) /
                    static_cast<double>(bounds);
    }
    m.num_workers = static_cast<double>(now.workers_sum - base.workers_sum) / static_cast<double>(n);
  }
  return m;
}

}  // namespace detail
}  // namespace coload
