// Specification of the loader's metrics, its verdict and its trace: each stage records what it
// spends, the verdict names the stage made slow on purpose, and the trace file holds every
// delivered sample's spans on well-nested tracks, worker processes' under their own pids.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "coload/coload.hpp"

using namespace coload;
using json = nlohmann::json;

namespace {

void pause_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Sample i is the tensor [i]; `slow` is the stage its get spends its time in: the whole get
// (read), or a part it marks itself with a StageTimer (decode, transform).
struct SlowDataset {
  std::int64_t n = 40;
  Stage slow = Stage::read;
  int ms = 2;
  Index fail_at = -1;
  std::int64_t size() const { return n; }
  at::Tensor get(Index i) const {
    if (i == fail_at) throw std::runtime_error("sample " + std::to_string(i) + " is broken");
    if (slow == Stage::read) {
      pause_ms(ms);
    } else if (slow == Stage::decode || slow == Stage::transform) {
      StageTimer t(slow);
      pause_ms(ms);
    }
    return at::full({1}, i, at::kLong);
  }
};

}  // namespace

// So that a fork-server worker can receive it.
template <>
struct coload::wire::Wire<SlowDataset> {
  static void write(Writer& w, const SlowDataset& d) {
    Wire<std::int64_t>::write(w, d.n);
    Wire<std::int64_t>::write(w, static_cast<std::int64_t>(d.slow));
    Wire<std::int64_t>::write(w, d.ms);
    Wire<std::int64_t>::write(w, d.fail_at);
  }
  static SlowDataset read(Reader& r) {
    SlowDataset d;
    d.n = Wire<std::int64_t>::read(r);
    d.slow = static_cast<Stage>(Wire<std::int64_t>::read(r));
    d.ms = static_cast<int>(Wire<std::int64_t>::read(r));
    d.fail_at = Wire<std::int64_t>::read(r);
    return d;
  }
};

namespace {

// A dataset counting its gets, for a consumer to wait on (C++20 atomic wait).
struct CountedGets {
  SlowDataset inner;
  std::shared_ptr<std::atomic<std::int64_t>> gets;
  std::int64_t size() const { return inner.size(); }
  at::Tensor get(Index i) const {
    at::Tensor t = inner.get(i);
    gets->fetch_add(1);
    gets->notify_all();
    return t;
  }
};

// The default collate, slowed down.
struct SlowCollate {
  int ms = 0;
  at::Tensor operator()(std::vector<at::Tensor> samples) const {
    pause_ms(ms);
    return at::stack(samples);
  }
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("coload_metrics_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

template <class Loader>
std::int64_t drain(Loader& loader, int consumer_ms = 0) {
  std::int64_t n = 0;
  for (auto& batch : loader) {
    n += batch.size(0);
    if (consumer_ms) pause_ms(consumer_ms);
  }
  return n;
}

// The stage the verdict names first, as "<stage> N% of their time".
std::string first_stage(const std::string& report) {
  const auto end = report.find(" of their time");
  if (end == std::string::npos) return "";
  const auto pct = report.rfind(' ', end - 1);
  const auto start = report.rfind(", ", pct);
  return report.substr(start + 2, pct - start - 2);
}

}  // namespace

TEST_CASE("metrics count every stage's spans, the consumer's batches and each worker") {
  LoaderOptions<> o;
  o.batch_size = 4;
  o.num_workers = 2;
  auto loader = make_data_loader(SlowDataset{40, Stage::read, 1}, o);
  CHECK(drain(loader) == 40);
  const Metrics m = loader.metrics();
  CHECK(m.enabled);
  CHECK(m.batches == 10);
  CHECK(m.samples == 40);
  CHECK(m.stage(Stage::read).count == 40);
  CHECK(m.stage(Stage::collate).count == 10);
  CHECK(m.stage(Stage::sample).count == 10);
  CHECK(m.stage(Stage::wait).count == 10);
  CHECK(m.stage(Stage::decode).count == 0);
  // 40 gets of at least 1 ms each.
  CHECK(m.stage(Stage::read).seconds >= 0.040);
  CHECK(m.stage(Stage::read).p50_ms >= 0.8);
  CHECK(m.stage(Stage::read).p50_ms <= m.stage(Stage::read).p99_ms);
  CHECK(m.seconds > 0);
  CHECK(m.wait_seconds <= m.seconds);
  CHECK(m.wait_fraction == doctest::Approx(m.wait_seconds / m.seconds));
  REQUIRE(m.workers.size() == 2);
  for (const auto& w : m.workers) {
    CHECK(w.pid == ::getpid());
    CHECK(w.busy_fraction > 0);
    CHECK(w.busy_fraction <= 1);
  }
  CHECK(m.occupancy > 0);
  CHECK(m.occupancy <= 1);
  CHECK(m.num_workers == doctest::Approx(2.0));
  CHECK(m.skipped == 0);
  CHECK(m.errors == 0);

  SUBCASE("its JSON has the shared contract's keys") {
    const json j = json::parse(m.to_json());
    for (const char* key : {"seconds", "batches", "samples", "wait_seconds", "wait_fraction",
                            "stages", "bytes_read", "workers", "occupancy", "num_workers",
                            "skipped", "errors"}) {
      CHECK_MESSAGE(j.contains(key), key);
    }
    CHECK(j["batches"] == 10);
    CHECK(j["stages"]["read"]["count"] == 40);
    for (const char* key : {"count", "seconds", "p50_ms", "p95_ms", "p99_ms"}) {
      CHECK(j["stages"]["collate"].contains(key));
    }
    CHECK_FALSE(j["stages"].contains("decode"));  // stages that saw nothing are left out
    CHECK(j["workers"].size() == 2);
    CHECK(j["workers"][0]["pid"] == ::getpid());
  }

  SUBCASE("metrics() covers the last epoch, total_metrics() every epoch") {
    CHECK(drain(loader) == 40);
    CHECK(loader.metrics().batches == 10);
    CHECK(loader.metrics().stage(Stage::read).count == 40);
    const Metrics total = loader.total_metrics();
    CHECK(total.batches == 20);
    CHECK(total.samples == 80);
    CHECK(total.seconds >= loader.metrics().seconds);
  }
}

TEST_CASE("the verdict names the stage made slow on purpose") {
  struct Case {
    Stage slow;
    int collate_ms;
    const char* named;
  };
  for (const Case c : {Case{Stage::read, 0, "read"}, Case{Stage::decode, 0, "decode"},
                       Case{Stage::transform, 0, "transform"}, Case{Stage::wait, 12, "collate"}}) {
    CAPTURE(c.named);
    // 32 batches, so that the workers' start (a thread woken late on a loaded machine) is a
    // small part of their time: with 8, one late start left them 68% busy and the verdict
    // read "idle part of the time".
    auto loader = make_data_loader(SlowDataset{128, c.slow, 3},
                                   {.batch_size = 4, .num_workers = 2},
                                   SlowCollate{c.collate_ms});
    CHECK(drain(loader) == 128);
    const std::string report = loader.metrics().report();
    CAPTURE(report);
    CHECK(report.rfind("input-bound: the trainer waited ", 0) == 0);
    CHECK(report.find("workers ") != std::string::npos);
    CHECK(first_stage(report) == c.named);
    CHECK(report.find("more workers or a cheaper " + std::string(c.named) + " would help") !=
          std::string::npos);
  }
}

TEST_CASE("the verdict names a slow sampler, not the idle workers' stages") {
  struct SlowSampler {
    std::int64_t n;
    AsyncGenerator<Index> indices() const {
      for (Index i = 0; i < n; ++i) {
        pause_ms(1);
        co_yield i;
      }
    }
    std::int64_t size() const { return n; }
  };
  auto loader = make_data_loader(SlowDataset{32, Stage::decode, 0},
                                 LoaderOptions<>{.batch_size = 4, .sampler = SlowSampler{32},
                                                 .num_workers = 2});
  CHECK(drain(loader) == 32);
  const Metrics m = loader.metrics();
  CHECK(m.stage(Stage::sample).count == 8);
  CHECK(m.stage(Stage::sample).seconds >= 0.032);
  const std::string report = m.report();
  CAPTURE(report);
  CHECK(report.rfind("input-bound: the trainer waited ", 0) == 0);
  CHECK(report.find(" of the epoch on the driver, which draws one batch at a time: a cheaper "
                    "sampler would help") != std::string::npos);
}

TEST_CASE("the verdict names pinning and device copies when they take the time") {
  // No GPU here to make them slow on purpose: the snapshots a slow pin or copy would give.
  Metrics m;
  m.seconds = 2.0;
  m.batches = 20;
  m.samples = 640;
  m.wait_fraction = 0.5;
  m.wait_seconds = 1.0;
  auto at = [](Stage s) { return static_cast<std::size_t>(s); };
  SUBCASE("pinning, on the workers") {
    m.workers = {{0, 1, 0.95}, {1, 1, 0.97}};
    m.worker_seconds[at(Stage::decode)] = 0.8;
    m.worker_seconds[at(Stage::pin)] = 2.6;
    m.stages[at(Stage::pin)] = StageMetrics{20, 2.6, 130, 140, 150};
    const std::string report = m.report();
    CAPTURE(report);
    CHECK(report == "input-bound: the trainer waited 50% of the epoch; workers 96% busy, pin 76% "
                    "of their time, decode 24%: more workers or a cheaper pin would help");
  }
  SUBCASE("device copies, on the driver") {
    m.workers = {{0, 1, 0.30}, {1, 1, 0.20}};
    m.worker_seconds[at(Stage::decode)] = 1.0;
    m.stages[at(Stage::copy)] = StageMetrics{20, 1.2, 60, 70, 80};
    const std::string report = m.report();
    CAPTURE(report);
    CHECK(report == "input-bound: the trainer waited 50% of the epoch; workers 25% busy, decode "
                    "100% of their time: copying batches to the device took 60% of the epoch: "
                    "fewer bytes per batch (uint8 images normalised on the device, say) would "
                    "help");
    // Under a quarter of the epoch, the copies are not what holds the workers back.
    m.stages[at(Stage::copy)].seconds = 0.4;
    CHECK(m.report().find("copying") == std::string::npos);
  }
}

TEST_CASE("the verdict blames the model when the consumer is the slow side") {
  // Cheap samples, a consumer that takes 10 ms a batch and asks for the next one only once the
  // workers have fetched its samples: the workers are ahead of it however the machine schedules
  // them (on a loaded machine they could fall behind a consumer that only sleeps).
  auto gets = std::make_shared<std::atomic<std::int64_t>>(0);
  auto loader = make_data_loader(CountedGets{{64, Stage::sample, 0}, gets},
                                 {.batch_size = 4, .num_workers = 2});
  std::int64_t n = 0, taken = 0;
  for (auto& batch : loader) {
    n += batch.size(0);
    ++taken;
    pause_ms(10);  // the model's step
    const std::int64_t next_fetched = std::min<std::int64_t>(64, 4 * (taken + 1));
    for (auto v = gets->load(); v < next_fetched; v = gets->load()) gets->wait(v);
  }
  CHECK(n == 64);
  const Metrics m = loader.metrics();
  CAPTURE(m.report());
  CHECK(m.report().rfind("the model is the bottleneck: the trainer waited ", 0) == 0);
  CHECK(m.wait_fraction < 0.10);
}

TEST_CASE("without workers the verdict says the driver fetches") {
  auto loader = make_data_loader(SlowDataset{16, Stage::read, 2}, {.batch_size = 4});
  CHECK(drain(loader) == 16);
  const Metrics m = loader.metrics();
  CHECK(m.workers.empty());
  CHECK(m.stage(Stage::read).count == 16);
  CHECK(first_stage(m.report()) == "read");
  CHECK(m.report().find("no workers (the driver fetches)") != std::string::npos);
}

TEST_CASE("skips and errors are counted") {
  SUBCASE("skip") {
    LoaderOptions<> o;
    o.batch_size = 4;
    o.num_workers = 2;
    o.on_error = OnError::skip;
    auto loader = make_data_loader(SlowDataset{40, Stage::sample, 0, 5}, o);
    CHECK(drain(loader) == 39);
    const Metrics m = loader.metrics();
    CHECK(m.skipped == 1);
    CHECK(m.samples == 39);
    CHECK(m.errors == 0);
  }
  SUBCASE("raise") {
    auto loader = make_data_loader(SlowDataset{40, Stage::sample, 0, 5},
                                   {.batch_size = 4, .num_workers = 2});
    auto epoch = loader.epoch();
    int errors = 0;
    int batches = 0;
    for (;;) {
      try {
        auto b = sync_wait(epoch.next());
        if (!b) break;
        ++batches;
      } catch (const WorkerError&) {
        ++errors;
      }
    }
    CHECK(errors == 1);
    CHECK(batches == 9);
    CHECK(loader.metrics().errors == 1);
  }
}

TEST_CASE("metrics can be turned off, and then record nothing") {
  LoaderOptions<> o;
  o.batch_size = 4;
  o.num_workers = 2;
  o.metrics = false;
  auto loader = make_data_loader(SlowDataset{16, Stage::read, 0}, o);
  CHECK(drain(loader) == 16);
  const Metrics m = loader.metrics();
  CHECK_FALSE(m.enabled);
  CHECK(m.batches == 0);
  CHECK(m.stage(Stage::read).count == 0);
  CHECK(m.report().find("metrics are off") == 0);
  CHECK(json::parse(m.to_json())["enabled"] == false);
}

#if !defined(__SANITIZE_THREAD__)
namespace {

// Two worker processes recorded a `samples`-sample epoch of SlowDataset(decode), batch 4.
void check_process_metrics(const Metrics& m, std::int64_t samples) {
  CHECK(m.stage(Stage::decode).count == samples);
  CHECK(m.stage(Stage::collate).count == samples / 4);
  CHECK(m.samples == samples);
  REQUIRE(m.workers.size() == 2);
  for (const auto& w : m.workers) {
    CHECK(w.pid != ::getpid());
    CHECK(w.busy_fraction > 0);
  }
  CHECK(m.workers[0].pid != m.workers[1].pid);
}

LoaderOptions<> two_processes() {
  LoaderOptions<> o;
  o.batch_size = 4;
  o.num_workers = 2;
  o.executor = Executor::processes;
  return o;
}

}  // namespace

TEST_CASE("worker processes' figures reach the parent") {
  auto loader = make_data_loader(SlowDataset{40, Stage::decode, 1}, two_processes());
  CHECK(drain(loader) == 40);
  check_process_metrics(loader.metrics(), 40);
}
#endif

namespace {

struct Span {
  double begin;
  double end;
  std::string name;
};

// Every complete span ("X") of the trace, per track (pid, tid).
std::map<std::pair<int, int>, std::vector<Span>> tracks_of(const json& trace) {
  std::map<std::pair<int, int>, std::vector<Span>> tracks;
  for (const auto& e : trace) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>();
    tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
        Span{ts, ts + e["dur"].get<double>(), e["name"].get<std::string>()});
  }
  return tracks;
}

// On one track, two spans are disjoint or one holds the other (up to the file's rounding).
void check_nesting(std::vector<Span> spans) {
  constexpr double eps = 0.002;  // microseconds: ts and dur are each rounded to 1 ns
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  std::vector<Span> open;
  for (const Span& s : spans) {
    while (!open.empty() && open.back().end <= s.begin + eps) open.pop_back();
    if (!open.empty()) {
      CAPTURE(open.back().name);
      CAPTURE(s.name);
      CHECK(s.end <= open.back().end + eps);
    }
    open.push_back(s);
  }
}

// The indices of the "read" spans, and the batches of the "collate" spans.
std::pair<std::multiset<std::int64_t>, std::set<std::int64_t>> reads_and_collates(
    const json& trace, std::set<int>* pids = nullptr) {
  std::multiset<std::int64_t> reads;
  std::set<std::int64_t> collates;
  for (const auto& e : trace) {
    if (e["ph"] != "X") continue;
    if (e["name"] == "read" && e.contains("args")) {
      reads.insert(e["args"]["index"].get<std::int64_t>());
      if (pids) pids->insert(e["pid"].get<int>());
    }
    if (e["name"] == "collate") collates.insert(e["args"]["batch"].get<std::int64_t>());
  }
  return {reads, collates};
}

}  // namespace

TEST_CASE("the trace holds every delivered sample's spans on well-nested tracks") {
  const std::string path = temp_path("threads.json");
  std::set<std::int64_t> delivered;
  {
    LoaderOptions<> o;
    o.batch_size = 4;
    o.num_workers = 2;
    o.trace = path;
    auto loader = make_data_loader(SlowDataset{24, Stage::decode, 1}, o);
    for (auto& batch : loader) {
      for (std::int64_t k = 0; k < batch.size(0); ++k) delivered.insert(batch[k].item<std::int64_t>());
    }
  }
  std::ifstream in(path);
  const json trace = json::parse(in);
  REQUIRE(trace.is_array());
  const auto [reads, collates] = reads_and_collates(trace);
  CHECK(delivered.size() == 24);
  for (std::int64_t i : delivered) CHECK_MESSAGE(reads.count(i) == 1, "sample ", i);
  CHECK(collates == std::set<std::int64_t>{0, 1, 2, 3, 4, 5});
  int decodes = 0, waits = 0, handoffs = 0;
  std::set<std::string> names;
  for (const auto& e : trace) {
    if (e["name"] == "decode") ++decodes;
    if (e["name"] == "wait") {
      ++waits;
      CHECK(e["tid"] == 0);  // the consumer's track
    }
    if (e["name"] == "handoff") ++handoffs;
    if (e["name"] == "thread_name") names.insert(e["args"]["name"].get<std::string>());
    CHECK(e["pid"] == ::getpid());
  }
  CHECK(decodes == 24);
  CHECK(waits == 6);
  CHECK(handoffs == 6);
  CHECK(names.count("worker 0") == 1);
  CHECK(names.count("worker 1") == 1);
  CHECK(names.count("driver") == 1);
  for (const auto& [track, spans] : tracks_of(trace)) {
    CAPTURE(track.second);
    check_nesting(spans);
  }
  std::filesystem::remove(path);
}

#if !defined(__SANITIZE_THREAD__)
namespace {

// The trace at `path` holds a read span for each of `samples` samples and a collate per batch
// of 4, from two worker processes, well nested; the file is removed.
void check_process_trace(const std::string& path, std::int64_t samples) {
  std::ifstream in(path);
  const json trace = json::parse(in);
  std::set<int> pids;
  const auto [reads, collates] = reads_and_collates(trace, &pids);
  for (std::int64_t i = 0; i < samples; ++i) CHECK_MESSAGE(reads.count(i) == 1, "sample ", i);
  CHECK(static_cast<std::int64_t>(collates.size()) == samples / 4);
  CHECK(pids.size() == 2);
  CHECK(pids.count(::getpid()) == 0);
  for (const auto& [track, spans] : tracks_of(trace)) check_nesting(spans);
  std::filesystem::remove(path);
}

}  // namespace

TEST_CASE("worker processes' spans appear in the trace with their pids") {
  const std::string path = temp_path("processes.json");
  {
    LoaderOptions<> o = two_processes();
    o.trace = path;
    auto loader = make_data_loader(SlowDataset{24, Stage::transform, 1}, o);
    CHECK(drain(loader) == 24);
  }
  check_process_trace(path, 24);
}
#endif

#if !defined(__SANITIZE_THREAD__)
TEST_CASE("fork-server workers' figures and spans reach the parent") {
  REQUIRE(forkserver_running());
  const std::string path = temp_path("forkserver.json");
  {
    LoaderOptions<> o = two_processes();
    o.process_start = ProcessStart::forkserver;
    o.trace = path;
    auto loader = make_data_loader(SlowDataset{24, Stage::decode, 1}, o);
    CHECK(drain(loader) == 24);
    check_process_metrics(loader.metrics(), 24);
  }
  check_process_trace(path, 24);
}
#endif

TEST_CASE("COLOAD_TRACE names the trace file when the option does not") {
  const std::string path = temp_path("env.json");
  ::setenv("COLOAD_TRACE", path.c_str(), 1);
  {
    auto loader = make_data_loader(SlowDataset{8, Stage::read, 0}, {.batch_size = 4});
    CHECK(drain(loader) == 8);
  }
  ::unsetenv("COLOAD_TRACE");
  std::ifstream in(path);
  REQUIRE(in.good());
  const auto [reads, collates] = reads_and_collates(json::parse(in));
  CHECK(reads.size() == 8);
  CHECK(collates.size() == 2);
  std::filesystem::remove(path);
}

namespace {
// Worker w streams w, w + num_workers, ...; each pull takes a millisecond.
struct SlowStream {
  std::int64_t n = 24;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    for (std::int64_t i = info.id; i < n; i += std::max(info.num_workers, 1)) {
      pause_ms(1);
      co_yield i;
    }
  }
};
}  // namespace

// Drains a loader over SlowStream and checks what its metrics counted: every pull a read, a
// collate per batch, both workers. Returns the metrics for the caller's own checks.
template <class Loader>
Metrics check_slow_stream_metrics(Loader& loader) {
  std::int64_t n = 0;
  for (auto& batch : loader) n += batch.size(0);
  CHECK(n == 24);
  Metrics m = loader.metrics();
  CHECK(m.batches == 6);
  CHECK(m.samples == 24);
  CHECK(m.stage(Stage::read).count == 24);
  CHECK(m.stage(Stage::collate).count == 6);
  REQUIRE(m.workers.size() == 2);
  return m;
}

TEST_CASE("an iterable dataset's pulls are its read, per worker") {
  auto loader = make_data_loader(SlowStream{}, {.batch_size = 4, .num_workers = 2});
  const Metrics m = check_slow_stream_metrics(loader);
  CHECK(m.stage(Stage::read).seconds >= 0.024);
  CHECK(first_stage(m.report()) == "read");
}

#if !defined(__SANITIZE_THREAD__)
TEST_CASE("an iterable dataset's pulls in worker processes reach the parent") {
  auto loader = make_data_loader(SlowStream{}, two_processes());
  const Metrics m = check_slow_stream_metrics(loader);
  for (const auto& w : m.workers) CHECK(w.pid != ::getpid());
}
#endif

namespace {

// Keeps the clock running for at least `ns` nanoseconds (the reads' time in flight, or a
// stage's), without giving up the thread.
void spin_ns(std::uint64_t ns) {
  const std::uint64_t until = coload::detail::now_ns() + ns;
  while (coload::detail::now_ns() < until) {
  }
}

// The calling thread records into worker 0's shard of `recorder` while it lives.
struct BoundToWorker {
  explicit BoundToWorker(coload::detail::Recorder& recorder) : saved(coload::detail::thread_recording()) {
    recorder.bind_thread(0);
  }
  ~BoundToWorker() { coload::detail::thread_recording() = saved; }
  coload::detail::ThreadRecording saved;
};

}  // namespace

// (Issue 30: at 9b003d1 record_read added each read's latency to `read`; a worker process,
// which reaps its own batch's reads, was counted busy for their sum, 50 times its wall time.)
TEST_CASE("reads in flight together count once in `read`, never a stage's time, and each "
          "one's latency apart") {
  coload::detail::Recorder recorder(1, true, "");
  constexpr int reads = 32;
  constexpr std::uint64_t ms = 1'000'000;
  std::uint64_t wall = 0;
  std::uint64_t decode = 0;
  {
    BoundToWorker bound(recorder);
    const std::uint64_t start = coload::detail::now_ns();
    std::vector<std::uint64_t> begins;
    for (int i = 0; i < reads; ++i) begins.push_back(read_begin());
    spin_ns(2 * ms);  // waiting on them
    for (int i = 0; i < reads / 2; ++i) record_read(begins[static_cast<std::size_t>(i)], 10, i);
    {
      StageTimer t(Stage::decode);  // a stage of its own while the other half is in flight
      spin_ns(2 * ms);
    }
    for (int i = reads / 2; i < reads; ++i) {
      record_read(begins[static_cast<std::size_t>(i)], 10, i);
    }
    wall = coload::detail::now_ns() - start;
    coload::detail::ShardTotals t;
    t.add(recorder.shard(0));
    decode = t.stages[static_cast<std::size_t>(Stage::decode)].ns;
  }
  coload::detail::ShardTotals t;
  t.add(recorder.shard(0));
  const auto& read = t.stages[static_cast<std::size_t>(Stage::read)];
  CHECK(read.count == reads);
  CHECK(t.bytes_read == 10 * reads);
  // Waited on: the first 2 ms at least; no more than the wall time outside the decode.
  CHECK(read.ns >= 2 * ms);
  CHECK(decode >= 2 * ms);
  CHECK(read.ns <= wall - decode);
  // Every read was in flight for 2 ms at least (4 for the second half).
  CHECK(t.read_latency.count == reads);
  CHECK(t.read_latency.ns >= (reads / 2) * 2 * ms + (reads / 2) * 4 * ms);
  CHECK(t.read_latency.quantile_ms(0.5) >= 1.5);
}
