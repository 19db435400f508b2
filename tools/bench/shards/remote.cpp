// tools/bench/shards remote: the same tar shards streamed from the local folder and by URL, in
// one run: nginx on loopback, and through serve.py's proxy with and without an added delay.
//
//   shards_remote [SHARDS] [--size 1GiB-ish MiB] [--workers 2] [--rounds 3] [--lat 20]
//                 [--bw 0] [--read-ahead 64] [--via loader|threads]
//
// SHARDS is a folder of shards (coload-shard's output); without it, shards of random samples
// (100 KiB each, 64 MiB shards, --size MiB in all) are written to a temporary folder. Each row
// is raw delivery (every sample's bytes handed out, no decode) by ShardStream, the page cache
// warm (nginx serves from it too). `--via loader` (the default): a DataLoader with --workers
// worker threads streams it, its transfers on the loader's driver (what training does);
// `--via threads`: one plain thread per worker loops over its share (the process's own HTTP
// client). Each figure is MB/s and the process's CPU (user + system, not nginx's or the
// proxy's) per 100 KiB of samples:
//  - local: the folder (read_size chunks through pread);
//  - nginx: http://127.0.0.1 straight to nginx (sendfile);
//  - proxy: through serve.py's proxy (Python, so its own ceiling), no delay;
//  - proxy+lat: through the proxy with --lat ms added before each response;
//  - nginx, no index: nginx, the same shards without their .idx files, streamed by their tar
//    headers (lib/shards/unindexed.cpp).
// With --bw, both proxy rows cap each connection at that many MiB/s.
// Rows alternate within each of --rounds rounds; each figure is the median. Ratios: nginx /
// local (target >= 0.95) and proxy+lat / proxy (the cost of the delay, target >= 0.9). The
// peak RSS of each remote row (VmHWM, reset before it) shows the read-ahead bound.

#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../../tests/shards/serve.hpp"
#include "../../../tests/shards/shards_test_support.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The process's peak resident set since the last reset, in MiB.
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Row {
  std::string name;
  std::string where;
  std::vector<double> mb_per_s;
  std::vector<double> cpu_ms;  // per 100 KiB delivered
  double peak_mib = 0;
};

// This process's CPU time so far (every thread, user + system), in seconds.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// A batch's bytes, counted (the loader's collate: no copy of the samples).
struct CountBytes {
  at::Tensor operator()(std::vector<coload::shards::ShardSample> samples) const {
    std::int64_t n = 0;
    for (const auto& s : samples) n += static_cast<std::int64_t>(s.data.size());
    return at::tensor(std::vector<std::int64_t>{n}, at::kLong);
  }
};

struct Run {
  double mb_per_s = 0;
  double cpu_ms_per_100k = 0;
};

Run stream_all(const std::string& where, int workers, std::size_t read_ahead, bool loader) {
  coload::shards::ShardStream stream(
      where, {.shuffle_shards = false, .read_ahead = read_ahead});
  std::vector<std::uint64_t> bytes(static_cast<std::size_t>(workers));
  const double cpu0 = cpu_seconds();
  const auto t = Clock::now();
  if (loader) {
    auto l = coload::make_data_loader(
        stream, coload::LoaderOptions<CountBytes>{.batch_size = 16, .num_workers = workers});
    for (auto& b : l) bytes[0] += static_cast<std::uint64_t>(b.item<std::int64_t>());
  } else {
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        coload::shards::ShardStream mine = stream;  // a replica per worker, as the loader makes
        for (auto& s : mine.samples(coload::WorkerInfo{.id = w, .num_workers = workers})) {
          bytes[static_cast<std::size_t>(w)] += s.data.size();
        }
      });
    }
    for (auto& t2 : threads) t2.join();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t).count();
  const double cpu = cpu_seconds() - cpu0;
  std::uint64_t total = 0;
  for (auto b : bytes) total += b;
  return {static_cast<double>(total) / s / 1e6,
          total ? cpu * 1e3 / (static_cast<double>(total) / (100 << 10)) : 0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Shards streamed from the local folder and by URL (nginx, a delaying proxy)."};
  std::string shards;
  int size_mib = 1024, workers = 2, rounds = 3, lat = 20, bw = 0, read_ahead_mib = 64;
  std::string via = "loader";
  app.add_option("SHARDS", shards, "a folder of shards (default: written here, random)");
  app.add_option("--size", size_mib, "MiB of random shards to write when SHARDS is not given");
  app.add_option("--workers", workers, "streams at once (threads)");
  app.add_option("--rounds", rounds, "rounds of all rows; each figure is the median");
  app.add_option("--lat", lat, "ms the proxy waits before each response");
  app.add_option("--bw", bw, "MiB/s cap of each proxied connection (0: none)");
  app.add_option("--read-ahead", read_ahead_mib, "ShardStreamOptions::read_ahead, MiB");
  app.add_option("--via", via, "loader (a DataLoader's worker threads) or threads (plain loops)")
      ->check(CLI::IsMember({"loader", "threads"}));
  CLI11_PARSE(app, argc, argv);

  shards_test::TempDir tmp;  // the served root: shards/ in it
  const fs::path served = tmp.path;
  if (shards.empty()) {
    coload::shards::Writer writer(served / "shards");
    std::mt19937_64 rng(1);
    std::string payload(100 << 10, '\0');
    const std::int64_t n = static_cast<std::int64_t>(size_mib) * 10;
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < payload.size(); k += 8) {
        const auto r = rng();
        std::memcpy(payload.data() + k, &r, std::min<std::size_t>(8, payload.size() - k));
      }
      char key[16];
      std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(i));
      const coload::shards::WriteField f[] = {
          {"bin", {reinterpret_cast<const std::byte*>(payload.data()), payload.size()}}};
      writer.write(key, f);
    }
    writer.finish();
  } else {
    fs::create_directory_symlink(fs::absolute(shards), served / "shards");
  }
  // The shards again, without their indices (links to the same files, so the same page cache).
  fs::create_directory(served / "noindex");
  for (const auto& e : fs::directory_iterator(served / "shards")) {
    if (e.path().extension() != ".idx") {
      fs::create_symlink(fs::canonical(e.path()), served / "noindex" / e.path().filename());
    }
  }
  shards_test::Server server;
  server.start(COLOAD_SERVE_SCRIPT, served);
  if (!server.skip.empty()) {
    std::fprintf(stderr, "shards_remote: %s", server.skip.c_str());
    return 77;
  }
  const std::string host = "http://127.0.0.1:";
  // The two proxy rows differ by the delay alone: the bandwidth cap, if any, is on both.
  const std::string cap = bw > 0 ? ",bw" + std::to_string(bw * 1024) : "";
  const std::string delay = "lat" + std::to_string(lat) + cap;
  std::vector<Row> rows{
      {"local", (served / "shards").string(), {}, {}},
      {"nginx", host + std::to_string(server.nginx) + "/shards/", {}, {}},
      {"proxy" + cap, host + std::to_string(server.proxy) + "/ok" + cap + "/shards/", {}, {}},
      {"proxy+" + delay, host + std::to_string(server.proxy) + "/" + delay + "/shards/", {}, {}},
      {"nginx, no index", host + std::to_string(server.nginx) + "/noindex/", {}, {}}};
  const std::size_t read_ahead = static_cast<std::size_t>(read_ahead_mib) << 20;
  const bool loader = via == "loader";
  stream_all(rows[0].where, workers, read_ahead, loader);  // warms the page cache
  reset_peak_rss();
  const double base_mib = peak_rss_mib();  // libtorch's pages and the heap kept: every row has them
  for (int r = 0; r < rounds; ++r) {
    for (Row& row : rows) {
      reset_peak_rss();
      const Run run = stream_all(row.where, workers, read_ahead, loader);
      row.mb_per_s.push_back(run.mb_per_s);
      row.cpu_ms.push_back(run.cpu_ms_per_100k);
      row.peak_mib = std::max(row.peak_mib, peak_rss_mib());
    }
  }
  std::printf("raw delivery via %s, %d workers, read_ahead %d MiB, median of %d rounds:\n",
              via.c_str(), workers, read_ahead_mib, rounds);
  for (const Row& row : rows) {
    std::printf("  %-22s %8.0f MB/s   CPU %6.3f ms/100KiB   peak RSS %6.0f MiB\n",
                row.name.c_str(), median(row.mb_per_s), median(row.cpu_ms), row.peak_mib);
  }
  // Each worker holds at most read_ahead: half for its shard, half for the next.
  std::printf("  (resident before any row: %.0f MiB; read-ahead budget %d x %d MiB)\n", base_mib,
              workers, read_ahead_mib);
  std::printf("nginx / local: %.2f    proxy+delay / proxy: %.2f    no index / nginx: %.2f\n",
              median(rows[1].mb_per_s) / median(rows[0].mb_per_s),
              median(rows[3].mb_per_s) / median(rows[2].mb_per_s),
              median(rows[4].mb_per_s) / median(rows[1].mb_per_s));
  return 0;
}
