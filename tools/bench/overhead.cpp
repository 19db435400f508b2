// tools/bench/overhead: per-batch overhead of coload's DataLoader against libtorch's torch::data
// loader, PyTorch's DataLoader and a bare index_select loop, on one in-memory workload:
// 200,000 samples of 64 float32 plus an int64 label, batch 256, shuffled, one thread.
//
//   overhead [--epochs N] [--samples N] [--json] [--no-pytorch] [--only LIST]
//            [--background-load] [--metrics on|off] [--workers N|auto]
//
// Each measurement runs one warm-up epoch, then times N epochs (default 3); samples/s is the
// number of samples delivered divided by the seconds the timed epochs took. Without --json it
// prints a table with the rates and the target ratios; with --json exactly one JSON object on
// stdout (progress goes to stderr). The PyTorch figure comes from overhead_pytorch.py, run with
// /usr/bin/python3; it is null when that or torch is missing. --only runs a subset (handy under
// perf); the others are null. --metrics off turns coload's metrics off (LoaderOptions::metrics),
// to measure what recording costs: run it on and off, interleaved, and compare.
//
// Measurements: coload_batch (TensorDataset::get_batch), coload_sample (get per sample +
// default_collate), libtorch (torch::data + Stack<>), pytorch (torch.utils.data.DataLoader),
// index_select (a bare randperm + index_select loop: the floor for a shuffled batch).
//
// --background-load runs every measurement (PyTorch's too) beside one thread of this process
// that keeps a core busy (a spin loop), as a training step or a neighbour's job would: a
// hand-off that spins while its peer thread needs the same core shows there.

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <torch/data.h>  // libtorch's own loader: heavy, only here

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "coload/dataset/tensor_dataset.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/sampler/random.hpp"

#ifndef COLOAD_BENCH_DIR
#error "COLOAD_BENCH_DIR (the directory of overhead_pytorch.py) must be defined by the build"
#endif

#include "bench_support.hpp"

namespace bench = coload::bench;
using namespace coload::bench;

namespace {

constexpr std::int64_t kFeatures = 64;
constexpr std::int64_t kBatch = 256;
constexpr std::uint64_t kSeed = 0;
constexpr const char* kPython = "/usr/bin/python3";

struct Args {
  int epochs = 3;
  std::int64_t samples = 200'000;
  bool json = false;
  bool pytorch = true;
  std::string only;  // comma-separated measurement names; empty runs all
  bool background_load = false;
  bool metrics = true;  // --metrics on|off
  int workers = 0;   // coload's num_workers (or coload::auto_workers)

  bool wants(std::string_view name) const {
    if (only.empty()) return true;
    std::string_view rest = only;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      if (rest.substr(0, comma) == name) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return false;
  }
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"overhead: coload's DataLoader against libtorch's torch::data, PyTorch's "
               "DataLoader and a bare index_select loop, on the same in-memory data"};
  app.add_option("--epochs", a.epochs, "timed epochs per measurement, after one warm-up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--samples", a.samples, "dataset size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag("!--no-pytorch", a.pytorch, "skip the PyTorch measurement (reported as null)");
  app.add_option("--only", a.only,
                 "run only these comma-separated measurements (coload_batch, coload_sample, "
                 "libtorch, pytorch, index_select); others are null");
  app.add_flag("--background-load", a.background_load,
               "measure beside one thread that keeps a core busy");
  std::string metrics = "on";
  app.add_option("--metrics", metrics, "coload's metrics (LoaderOptions::metrics)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string workers = "0";
  app.add_option("--workers", workers,
                 "coload's num_workers: a count, or auto (coload::auto_workers); the other "
                 "loaders keep theirs")
      ->check(workers_error)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  a.metrics = metrics == "on";
  a.workers = *parse_workers(workers);
  return a;
}

/// One thread keeping a core busy until destroyed: a loop of relaxed loads and adds.
class BackgroundLoad {
 public:
  BackgroundLoad() : thread_([this] {
    std::uint64_t x = 0;
    while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ULL + 1;
    sink_.store(x, std::memory_order_relaxed);
  }) {}
  ~BackgroundLoad() {
    stop_.store(true);
    thread_.join();
  }
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> sink_{0};
  std::thread thread_;
};

using Clock = std::chrono::steady_clock;

// Under --workers auto: where the count stands after each epoch (stderr).
void report_tuning(const coload::WorkerTuning& t) {
  if (!t.automatic) return;
  std::fprintf(stderr, " [workers %d of %d, +%lld -%lld in %lld windows]", t.workers,
               t.max_workers, static_cast<long long>(t.grown), static_cast<long long>(t.shrunk),
               static_cast<long long>(t.windows));
}

// One warm-up epoch, then `epochs` timed ones; returns samples/s, or nothing when `name` is
// not selected (--only). `setup()` builds the loader (untimed) and returns the epoch function,
// which returns the samples it delivered; each epoch must deliver the whole dataset.
template <class Setup>
std::optional<double> measure(const char* name, const Args& args, Setup&& setup) {
  if (!args.wants(name)) return std::nullopt;
  auto epoch = setup();
  std::fprintf(stderr, "overhead: %-14s warm-up...", name);
  std::fflush(stderr);
  auto check = [&](std::int64_t got) {
    if (got != args.samples) {
      std::fprintf(stderr, "\noverhead: %s delivered %lld samples in an epoch, expected %lld\n",
                   name, static_cast<long long>(got), static_cast<long long>(args.samples));
      std::exit(1);
    }
    return got;
  };
  check(epoch());
  std::fprintf(stderr, " timing %d epochs...", args.epochs);
  std::fflush(stderr);
  std::int64_t samples = 0;
  const auto t0 = Clock::now();
  for (int e = 0; e < args.epochs; ++e) samples += check(epoch());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = static_cast<double>(samples) / seconds;
  std::fprintf(stderr, " %.0f samples/s\n", rate);
  return rate;
}

// --- 2. coload, per-sample path: a dataset with only size() and get() ----------------------
struct PerSampleDataset {
  coload::TensorDataset inner;
  std::int64_t size() const noexcept { return inner.size(); }
  std::vector<at::Tensor> get(coload::Index i) const { return inner.get(i); }
};
static_assert(coload::MapDataset<PerSampleDataset>);
static_assert(!coload::BatchedDataset<PerSampleDataset>);
static_assert(coload::BatchedDataset<coload::TensorDataset>);
// Both coload loaders deliver {data [B, 64], labels [B]}: get_batch's result, or default_collate's.
static_assert(
    std::is_same_v<coload::DataLoader<coload::TensorDataset>::batch_type, std::vector<at::Tensor>>);
static_assert(
    std::is_same_v<coload::DataLoader<PerSampleDataset>::batch_type, std::vector<at::Tensor>>);

// --- 3. libtorch's torch::data ----------------------------------------------------------------
struct TorchDataset : torch::data::datasets::Dataset<TorchDataset> {
  TorchDataset(at::Tensor d, at::Tensor l) : data(std::move(d)), labels(std::move(l)) {}
  torch::data::Example<> get(size_t i) override {
    const auto index = static_cast<std::int64_t>(i);
    return {data[index], labels[index]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data.size(0)); }
  at::Tensor data, labels;
};

// --- 4. PyTorch, through overhead_pytorch.py ------------------------------------------------
struct PyResult {
  std::optional<double> rate;
  std::string note;  // why rate is null, or the torch version
};

PyResult run_pytorch(const Args& args) {
  if (!args.pytorch) return {std::nullopt, "skipped (--no-pytorch)"};
  if (::access(kPython, X_OK) != 0) return {std::nullopt, std::string(kPython) + " not found"};
  const std::string script = std::string(COLOAD_BENCH_DIR) + "/overhead_pytorch.py";
  if (::access(script.c_str(), R_OK) != 0) return {std::nullopt, script + " not found"};
  const std::string cmd =
      std::string(kPython) + " '" + script + "' --json --epochs " + std::to_string(args.epochs) +
      " --samples " + std::to_string(args.samples) + " --features " + std::to_string(kFeatures) +
      " --batch-size " + std::to_string(kBatch) + " --seed " + std::to_string(kSeed);
  std::fprintf(stderr, "overhead: %-14s running %s\n", "pytorch", cmd.c_str());
  std::fflush(stderr);
  const bench::PeerOutput peer = bench::run_peer(cmd);
  if (!peer.started) return {std::nullopt, peer.error};
  const int status = peer.status;
  const std::string& line = peer.last_line;
  if (status != 0) {
    return {std::nullopt, "overhead_pytorch.py failed (status " + std::to_string(status) + ")"};
  }
  const auto rate = json_field(line, "pytorch");
  if (!rate || *rate == "null") {
    return {std::nullopt, json_field(line, "error").value_or("no result from overhead_pytorch.py")};
  }
  char* end = nullptr;
  const double v = std::strtod(rate->c_str(), &end);
  if (end == rate->c_str() || !std::isfinite(v) || v <= 0) {
    return {std::nullopt, "unparsable output from overhead_pytorch.py: " + line};
  }
  const std::string version = json_field(line, "torch_version").value_or("?");
  std::fprintf(stderr, "overhead: %-14s %.0f samples/s (torch %s)\n", "pytorch", v,
               version.c_str());
  return {v, "torch " + version};
}

// --- reporting ---------------------------------------------------------------------------------
struct Ratio {
  const char* name;
  std::optional<double> value;
  std::optional<double> target;  // value >= target
};

std::string with_commas(double v) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[static_cast<std::size_t>(i)];
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  at::set_num_threads(1);
  std::optional<BackgroundLoad> load;
  if (args.background_load) load.emplace();

  // Fixed-seed data: 64 standard-normal floats and a label in [0, 10) per sample.
  auto data_gen = coload::make_generator(kSeed);
  const at::Tensor data = at::randn({args.samples, kFeatures}, data_gen, at::kFloat);
  const at::Tensor labels = at::randint(0, 10, {args.samples}, data_gen, at::kLong);

  // --- 5. index_select: the floor, a bare loop over a seeded permutation ---------------------
  const auto index_select = measure("index_select", args, [&] {
    return [&, gen = coload::make_generator(kSeed)]() mutable {
      std::int64_t delivered = 0;
      const at::Tensor perm = at::randperm(args.samples, gen, at::kLong);
      for (std::int64_t b = 0; b < args.samples; b += kBatch) {
        const at::Tensor idx = perm.slice(0, b, std::min(b + kBatch, args.samples));
        const at::Tensor x = data.index_select(0, idx);
        const at::Tensor y = labels.index_select(0, idx);
        delivered += x.size(0);
        (void)y;
      }
      return delivered;
    };
  });

  // --- 1. coload, whole-batch path: TensorDataset::get_batch (one index_select per tensor) ---
  const auto coload_batch = measure("coload_batch", args, [&] {
    auto loader = std::make_shared<coload::DataLoader<coload::TensorDataset>>(
        coload::make_data_loader(coload::TensorDataset{data, labels},
                                 {.batch_size = kBatch, .shuffle = true,
                                  .num_workers = args.workers, .seed = kSeed,
                                  .metrics = args.metrics}));
    return [loader] {
      std::int64_t delivered = 0;
      for (auto& batch : *loader) delivered += batch[0].size(0);
      report_tuning(loader->worker_tuning());
      return delivered;
    };
  });

  // --- 2. coload, per-sample path: get() per index, then default_collate stacks ------------
  const auto coload_sample = measure("coload_sample", args, [&] {
    auto loader = std::make_shared<coload::DataLoader<PerSampleDataset>>(
        coload::make_data_loader(PerSampleDataset{coload::TensorDataset{data, labels}},
                                 {.batch_size = kBatch, .shuffle = true,
                                  .num_workers = args.workers, .seed = kSeed,
                                  .metrics = args.metrics}));
    return [loader] {
      std::int64_t delivered = 0;
      for (auto& batch : *loader) delivered += batch[0].size(0);
      report_tuning(loader->worker_tuning());
      return delivered;
    };
  });

  // --- 3. libtorch's torch::data loader ------------------------------------------------------
  const auto libtorch = measure("libtorch", args, [&] {
    at::manual_seed(kSeed);  // torch::data's RandomSampler draws from the default generator
    std::shared_ptr loader = torch::data::make_data_loader(
        TorchDataset(data, labels).map(torch::data::transforms::Stack<>()),
        torch::data::samplers::RandomSampler(args.samples),
        torch::data::DataLoaderOptions().batch_size(kBatch).workers(0));
    return [loader] {
      std::int64_t delivered = 0;
      for (auto& batch : *loader) delivered += batch.data.size(0);
      return delivered;
    };
  });

  // --- 4. PyTorch's DataLoader, in a child process ------------------------------------------
  PyResult pytorch{std::nullopt, "not selected (--only)"};
  if (args.wants("pytorch")) pytorch = run_pytorch(args);
  if (!pytorch.rate) std::fprintf(stderr, "overhead: pytorch is null: %s\n", pytorch.note.c_str());

  auto ratio = [](std::optional<double> a, std::optional<double> b) -> std::optional<double> {
    if (!a || !b) return std::nullopt;
    return *a / *b;
  };
  const std::vector<Ratio> ratios = {
      {"coload_batch/libtorch", ratio(coload_batch, libtorch), 10.0},
      {"coload_batch/index_select", ratio(coload_batch, index_select), 0.5},
      {"coload_sample/libtorch", ratio(coload_sample, libtorch), 1.5},
      {"coload_batch/pytorch", ratio(coload_batch, pytorch.rate), std::nullopt},
      {"coload_sample/pytorch", ratio(coload_sample, pytorch.rate), std::nullopt},
  };

  if (args.json) {
    std::string j = "{";
    j += "\"coload_batch\": " + json_number(coload_batch);
    j += ", \"coload_sample\": " + json_number(coload_sample);
    j += ", \"libtorch\": " + json_number(libtorch);
    j += ", \"pytorch\": " + json_number(pytorch.rate);
    j += ", \"index_select\": " + json_number(index_select);
    j += std::string(", \"background_load\": ") + (args.background_load ? "true" : "false");
    j += ", \"num_workers\": \"" + workers_name(args.workers) + "\"";
    j += ", \"ratios\": {";
    for (std::size_t i = 0; i < ratios.size(); ++i) {
      if (i) j += ", ";
      j += "\"" + std::string(ratios[i].name) + "\": " + json_number(ratios[i].value);
    }
    j += "}}";
    std::printf("%s\n", j.c_str());
    return 0;
  }

  std::printf(
      "coload overhead: %lld samples x (%lld float32 + int64 label), batch %lld, shuffled, "
      "1 thread\n(at::set_num_threads(1), coload's num_workers = %s); 1 warm-up + %d timed "
      "epochs each%s\n\n",
      static_cast<long long>(args.samples), static_cast<long long>(kFeatures),
      static_cast<long long>(kBatch), workers_name(args.workers).c_str(), args.epochs,
      args.background_load ? ";\nbeside one background thread keeping a core busy" : "");
  std::printf("%-14s %14s %10s\n", "loader", "samples/s", "ms/epoch");
  auto row = [&](const char* name, std::optional<double> rate, const std::string& note) {
    if (!rate) {
      std::printf("%-14s %14s %10s   %s\n", name, "null", "-",
                  args.wants(name) ? note.c_str() : "not selected (--only)");
      return;
    }
    const double ms = 1e3 * static_cast<double>(args.samples) / *rate;
    std::printf("%-14s %14s %10.2f%s%s\n", name, with_commas(*rate).c_str(), ms,
                note.empty() ? "" : "   ", note.c_str());
  };
  row("coload_batch", coload_batch, "get_batch (index_select)");
  row("coload_sample", coload_sample, "get per sample + default_collate");
  row("libtorch", libtorch, "torch::data, Stack<>, RandomSampler");
  row("pytorch", pytorch.rate,
      pytorch.rate ? "torch.utils.data.DataLoader, " + pytorch.note : pytorch.note);
  row("index_select", index_select, "bare randperm + index_select loop");

  std::printf("\n%-28s %9s %8s  %s\n", "ratio", "value", "target", "status");
  int met = 0, missed = 0, unknown = 0;
  for (const auto& r : ratios) {
    char value[32] = "null";
    if (r.value) std::snprintf(value, sizeof value, "%.2f", *r.value);
    char target[32] = "-";
    if (r.target) std::snprintf(target, sizeof target, ">= %g", *r.target);
    const char* status = "(no target)";
    if (r.target) {
      if (!r.value) {
        status = "unknown";
        ++unknown;
      } else if (*r.value >= *r.target) {
        status = "met";
        ++met;
      } else {
        status = "MISSED";
        ++missed;
      }
    }
    std::string name = r.name;
    const auto slash = name.find('/');
    name = name.substr(0, slash) + " / " + name.substr(slash + 1);
    std::printf("%-28s %9s %8s  %s\n", name.c_str(), value, target, status);
  }
  std::printf("\ntargets: %d met, %d missed, %d unknown\n", met, missed, unknown);
  return 0;
}
