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
//  - link: through link_proxy (C++, beside this program: a link's delay and bandwidth cap at
//    little CPU), no delay;
//  - link+rtt: through link_proxy with --lat ms of round trip (half each way);
//  - nginx, no index: nginx, the same shards without their .idx files, streamed by their tar
//    headers (lib/shards/unindexed.cpp).
// With --bw, both link rows cap each connection at that many MiB/s. --python-proxy puts
// serve.py's Python proxy (the fault tests' one: --lat ms before each response) in the link's
// place, as before: its own CPU on the same cores is then most of those rows' cost.
// Rows alternate within each of --rounds rounds; each figure is the median. Ratios: nginx /
// local (target >= 0.95) and link+rtt / link (the cost of the delay, target >= 0.9). The
// peak RSS of each remote row (VmHWM, reset before it) shows the read-ahead bound.
//
// With --images DIR (coload-shard's shards of an ImageFolder: a jpg and a cls field a sample,
// e.g. ~/.cache/coload/peers-shards/<folder>-plain), the train pipeline rows follow, what
// training reads: ShardImagePipeline (map-style: a batch's samples of one shard up to 8 to a
// multi-range GET, on the loader's driver) with the classic recipe (TrainTransform:
// RandomResizedCrop 224, flip, normalise), --workers worker threads, --batch-size, shuffled,
// --epochs epochs a row, over DIR's shards (--prefetch-factor and --persistent-workers set the
// loader's, default 2 and off)
//  - train local: the folder;
//  - train nginx: nginx on loopback;
//  - train link: link_proxy, the link (all its connections together) capped at --train-bw
//    MiB/s;
//  - train link+rtt: the same with --lat ms of round trip;
//  - train link+rtt cached: the same with ShardOptions::cache_dir (an empty folder each run):
//    an untimed epoch whose map-style reads fill the cache, then the timed epochs (later
//    epochs: from local disk).
//  - train nginx https (with --https): nginx over TLS (the tests' certificate, trusted through
//    CURL_CA_BUNDLE), what TLS costs beside plain HTTP.
// Each: images/s, this process's CPU ms per image, the servers' (nginx + the proxies, which
// share the cores) CPU ms per image, peak RSS, and an epoch's first batch (from the epoch's
// start: what a round trip adds to each epoch's fill); ratios against train local. --no-raw
// leaves out the raw rows.

#include <fcntl.h>
#include <spawn.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../../tests/shards/serve.hpp"
#include "../../../tests/shards/shards_test_support.hpp"
#include "coload/io/http.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"
#include "coload/vision/shard_pipeline.hpp"
#include "coload/vision/transforms.hpp"

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

// What glibc's heap holds (every arena, MiB): in use by the program, and free but kept (not
// given back to the kernel, so still resident once touched), and how many arenas.
struct Heap {
  double used = 0, kept = 0;
  int arenas = 0;
};
Heap heap_now() {
  const struct mallinfo2 m = ::mallinfo2();
  Heap h;
  h.used = static_cast<double>(m.uordblks + m.hblkhd) / (1 << 20);
  h.kept = static_cast<double>(m.fordblks) / (1 << 20);
  // malloc_info's XML: one <heap nr="..."> a arena.
  char* text = nullptr;
  std::size_t size = 0;
  if (FILE* f = ::open_memstream(&text, &size)) {
    ::malloc_info(0, f);
    std::fclose(f);
    for (const char* p = text; (p = std::strstr(p, "<heap nr=")) != nullptr; ++p) ++h.arenas;
    std::free(text);
  }
  return h;
}

// Where a row's memory is, at its start and at its end: the resident set, and the heap.
struct MemoryTrace {
  double start_rss = 0, peak_rss = 0;
  Heap end{};
};
double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}

// Runs one row's `run()` with its memory traced into `m` (after malloc_trim with --trim).
template <typename Run>
auto traced(bool trim, MemoryTrace& m, Run&& run) {
  if (trim) ::malloc_trim(0);
  reset_peak_rss();
  m.start_rss = rss_mib();
  auto result = run();
  m.peak_rss = peak_rss_mib();
  m.end = heap_now();
  return result;
}

struct Row {
  std::string name;
  std::string where;
  std::vector<double> mb_per_s;
  std::vector<double> cpu_ms;  // per 100 KiB delivered
  std::vector<double> server_ms{};  // nginx's and the proxy's, per 100 KiB
  double peak_mib = 0;
  double held_mib = 0;
  MemoryTrace memory{};  // the last round's
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
  double held_mib = 0;  // --via threads: the most the process's HTTP client held for readers
  double server_ms_per_100k = 0;  // nginx + the proxy
};

// CPU seconds (user + system) of process `pid` and of its children (one level: serve.py's
// proxy and the nginx it started), from /proc; 0 for what cannot be read.
// The link proxies' pids: their CPU counts with the servers'.
std::vector<pid_t> link_pids;

double process_tree_cpu(pid_t pid) {
  const auto one = [](long p) {
    std::ifstream in("/proc/" + std::to_string(p) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    if (close == std::string::npos) return 0.0;
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int k = 3; k <= 15 && rest >> field; ++k) {
      if (k == 14 || k == 15) ticks += std::stod(field);  // utime, stime
    }
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  };
  double total = one(pid);
  std::ifstream kids("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (long child = 0; kids >> child;) total += one(child);
  for (pid_t p : link_pids) total += one(p);
  return total;
}

Run stream_all(const std::string& where, int workers, std::size_t read_ahead, bool loader,
               pid_t server) {
  coload::shards::ShardStream stream(
      where, {.shuffle_shards = false, .read_ahead = read_ahead});
  std::vector<std::uint64_t> bytes(static_cast<std::size_t>(workers));
  const double cpu0 = cpu_seconds(), server0 = process_tree_cpu(server);
  const auto t = Clock::now();
  const auto client = coload::io::HttpClient::shared();
  client->read_ahead_peak(true);
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
  const double cpu = cpu_seconds() - cpu0, server_cpu = process_tree_cpu(server) - server0;
  std::uint64_t total = 0;
  for (auto b : bytes) total += b;
  return {static_cast<double>(total) / s / 1e6,
          total ? cpu * 1e3 / (static_cast<double>(total) / (100 << 10)) : 0,
          loader ? 0 : static_cast<double>(client->read_ahead_peak()) / (1 << 20),
          total ? server_cpu * 1e3 / (static_cast<double>(total) / (100 << 10)) : 0};
}

struct TrainRun {
  double images_per_s = 0;
  double cpu_ms = 0;         // this process, per image
  double server_cpu_ms = 0;  // nginx + the proxy, per image
  double first_batch_ms = 0;  // an epoch's start to its first batch, the mean of the epochs
  std::int64_t images = 0;
};

// `epochs` epochs of the classic train pipeline over the shards at `where`.
// The train rows' loader settings beyond the batch and the workers (--prefetch-factor,
// --persistent-workers): the same for every row.
struct TrainLoader {
  std::optional<int> prefetch_factor;
  bool persistent_workers = false;
};

// A cache folder for the cached row: made empty, removed with this.
struct CacheDir {
  fs::path path = fs::temp_directory_path() / ("coload-bench-cache-" + std::to_string(::getpid()));
  CacheDir() { fs::remove_all(path); }
  ~CacheDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TrainRun train(const std::string& where, int workers, std::int64_t batch, int epochs, pid_t server,
               const TrainLoader& settings = {}, const std::string& cache_dir = {}) {
  // The index is fetched before the clock starts: a row times the epochs.
  coload::shards::ShardOptions options;
  options.cache_dir = cache_dir;
  options.cache_bytes = cache_dir.empty() ? 0 : std::uint64_t{1} << 40;
  const coload::shards::ShardDataset shards(where, options);
  coload::vision::ShardImagePipeline pipeline(shards, coload::vision::TrainTransform{});
  auto loader = coload::make_data_loader(std::move(pipeline),
                                         {.batch_size = batch,
                                          .shuffle = true,
                                          .num_workers = workers,
                                          .prefetch_factor = settings.prefetch_factor,
                                          .persistent_workers = settings.persistent_workers,
                                          .seed = 1});
  if (!cache_dir.empty()) {
    // Later epochs: one epoch first, untimed, and the whole shards its reads queued for the
    // cache fetched.
    for (auto& batch_ : loader) (void)batch_;
    shards.cache_wait();
  }
  TrainRun r;
  const double cpu0 = cpu_seconds(), server0 = process_tree_cpu(server);
  const auto t = Clock::now();
  for (int e = 0; e < epochs; ++e) {
    const auto start = Clock::now();
    bool first = true;
    for (auto& [x, y] : loader) {
      if (first) {
        const std::chrono::duration<double, std::milli> waited = Clock::now() - start;
        r.first_batch_ms += waited.count() / epochs;
        first = false;
      }
      r.images += x.size(0);
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - t).count();
  const double n = static_cast<double>(std::max<std::int64_t>(r.images, 1));
  r.images_per_s = static_cast<double>(r.images) / s;
  r.cpu_ms = (cpu_seconds() - cpu0) * 1e3 / n;
  r.server_cpu_ms = (process_tree_cpu(server) - server0) * 1e3 / n;
  return r;
}

// link_proxy (built beside this program) in front of nginx, until this object goes.
struct LinkProxy {
  pid_t pid = -1;
  int to_child = -1;
  int port = 0;
  LinkProxy(int upstream, int rtt_ms, int link_mib, int conn_mib, int splice) {
    const fs::path exe = fs::read_symlink("/proc/self/exe").parent_path() / "link_proxy";
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe failed");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<std::string> args{exe.string(), "--upstream", std::to_string(upstream),
                                  "--rtt-ms", std::to_string(rtt_ms), "--link-mib",
                                  std::to_string(link_mib), "--conn-mib", std::to_string(conn_mib),
                                  "--splice", std::to_string(splice)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ) != 0) {
      throw std::runtime_error("cannot start " + exe.string());
    }
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    FILE* f = ::fdopen(out[0], "r");
    if (!f || std::fscanf(f, "PORT %d", &port) != 1) {
      throw std::runtime_error(exe.string() + " did not say its port");
    }
    std::fclose(f);
  }
  LinkProxy(const LinkProxy&) = delete;
  ~LinkProxy() {
    ::close(to_child);  // its standard input closes: it exits
    ::waitpid(pid, nullptr, 0);
  }
};

// Each row's last round: resident at its start and at most, and glibc's heap at its end.
template <class Rows>
void print_memory(const char* what, const Rows& rows) {
  std::printf("  memory of the %s rows' last round (MiB): resident at the start -> peak; glibc's "
              "heap at the end: in use, free but kept, arenas\n", what);
  for (const auto& row : rows) {
    const MemoryTrace& m = row.memory;
    std::printf("    %-30s %6.0f -> %6.0f   heap in use %6.1f   kept %6.1f   arenas %d\n",
                row.name.c_str(), m.start_rss, m.peak_rss, m.end.used, m.end.kept, m.end.arenas);
  }
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
  std::string via = "loader", images, only;
  int epochs = 2, train_bw = 200;
  std::int64_t batch = 64;
  bool raw = true, python_proxy = false, trim = false;
  int splice = 1;
  app.add_option("SHARDS", shards, "a folder of shards (default: written here, random)");
  app.add_option("--size", size_mib, "MiB of random shards to write when SHARDS is not given");
  app.add_option("--workers", workers, "streams at once (threads)");
  app.add_option("--rounds", rounds, "rounds of all rows; each figure is the median");
  app.add_option("--lat", lat, "ms of round trip the delayed rows add (link_proxy: half each "
                 "way; --python-proxy: before each response)");
  app.add_option("--bw", bw, "MiB/s cap of each proxied connection (0: none)");
  app.add_option("--read-ahead", read_ahead_mib, "ShardStreamOptions::read_ahead, MiB");
  app.add_option("--via", via, "loader (a DataLoader's worker threads) or threads (plain loops)")
      ->check(CLI::IsMember({"loader", "threads"}));
  app.add_option("--images", images,
                 "a folder of image shards (jpg + cls): adds the train pipeline rows");
  app.add_option("--epochs", epochs, "epochs of each train row");
  app.add_option("--batch-size", batch, "the train rows' batch size");
  app.add_option("--train-bw", train_bw,
                 "MiB/s cap of the proxy's link (all connections) in the train rows (0: none)");
  TrainLoader settings;
  app.add_option("--prefetch-factor", settings.prefetch_factor,
                 "the train rows' prefetch_factor (default: the loader's, 2)");
  app.add_flag("--persistent-workers", settings.persistent_workers,
               "the train rows' loaders keep their workers from epoch to epoch");
  app.add_option("--only", only, "the rows whose name holds this text, alone (for a profile)");
  app.add_flag_callback("--no-raw", [&raw] { raw = false; }, "leave out the raw delivery rows");
  app.add_flag("--trim", trim,
               "malloc_trim(0) before each row: what glibc keeps from the rows before is let go");
  app.add_option("--splice", splice, "link_proxy forwards with splice(2) (1) or read/send (0)");
  bool https = false;
  app.add_flag("--https", https,
               "a train row from nginx over HTTPS too (the tests' certificate, trusted through "
               "CURL_CA_BUNDLE)");
  app.add_flag("--python-proxy", python_proxy,
               "the proxy rows through serve.py's Python proxy (as before link_proxy)");
  CLI11_PARSE(app, argc, argv);

  shards_test::TempDir tmp;  // the served root: shards/ in it
  const fs::path served = tmp.path;
  if (shards.empty() && !raw) {
    fs::create_directory(served / "shards");  // the raw rows' shards are not needed
  } else if (shards.empty()) {
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
  if (!images.empty()) fs::create_directory_symlink(fs::absolute(images), served / "images");
  shards_test::Server server;
  // nginx as a shard server is set up: its files kept open between requests (open_file_cache).
  ::setenv("COLOAD_SERVE_FILE_CACHE", "1", 1);
  server.start(COLOAD_SERVE_SCRIPT, served);
  if (!server.skip.empty()) {
    std::fprintf(stderr, "shards_remote: %s", server.skip.c_str());
    return 77;
  }
  const std::string host = "http://127.0.0.1:";
  // The two proxy rows differ by the delay alone: the bandwidth cap, if any, is on both.
  // link_proxy: one a row (raw: --bw each connection; train: --train-bw the link).
  std::vector<std::unique_ptr<LinkProxy>> links;
  const auto link_url = [&](int rtt, int link_mib, int conn_mib, const std::string& path) {
    links.push_back(std::make_unique<LinkProxy>(server.nginx, rtt, link_mib, conn_mib, splice));
    link_pids.push_back(links.back()->pid);
    return host + std::to_string(links.back()->port) + path;
  };
  const std::string cap = bw > 0 ? ",bw" + std::to_string(bw * 1024) : "";
  const std::string delay = "lat" + std::to_string(lat) + cap;
  const std::string mib = bw > 0 ? ",bw" + std::to_string(bw) : "";
  std::vector<Row> rows{
      {"local", (served / "shards").string(), {}, {}},
      {"nginx", host + std::to_string(server.nginx) + "/shards/", {}, {}},
      python_proxy
          ? Row{"proxy" + cap, host + std::to_string(server.proxy) + "/ok" + cap + "/shards/", {}, {}}
          : Row{"link" + mib, link_url(0, 0, bw, "/shards/"), {}, {}},
      python_proxy
          ? Row{"proxy+" + delay, host + std::to_string(server.proxy) + "/" + delay + "/shards/", {}, {}}
          : Row{"link+rtt" + std::to_string(lat) + mib, link_url(lat, 0, bw, "/shards/"), {}, {}},
      {"nginx, no index", host + std::to_string(server.nginx) + "/noindex/", {}, {}}};
  const bool all_rows = only.empty();
  if (!all_rows) std::erase_if(rows, [&](const Row& r) { return r.name.find(only) == std::string::npos; });
  const std::size_t read_ahead = static_cast<std::size_t>(read_ahead_mib) << 20;
  const bool loader = via == "loader";
  // Warms the page cache.
  if (raw) stream_all((served / "shards").string(), workers, read_ahead, loader, server.pid);
  reset_peak_rss();
  const double base_mib = peak_rss_mib();  // libtorch's pages and the heap kept: every row has them
  for (int r = 0; r < (raw ? rounds : 0); ++r) {
    for (Row& row : rows) {
      const Run run = traced(trim, row.memory, [&] {
        return stream_all(row.where, workers, read_ahead, loader, server.pid);
      });
      row.server_ms.push_back(run.server_ms_per_100k);
      row.mb_per_s.push_back(run.mb_per_s);
      row.cpu_ms.push_back(run.cpu_ms_per_100k);
      row.peak_mib = std::max(row.peak_mib, row.memory.peak_rss);
      row.held_mib = std::max(row.held_mib, run.held_mib);
    }
  }
  if (raw) {
    std::printf("raw delivery via %s, %d workers, read_ahead %d MiB, median of %d rounds:\n",
                via.c_str(), workers, read_ahead_mib, rounds);
    for (const Row& row : rows) {
      std::printf("  %-22s %8.0f MB/s   CPU %6.3f ms/100KiB (servers' %6.3f)   peak RSS %6.0f MiB",
                  row.name.c_str(), median(row.mb_per_s), median(row.cpu_ms),
                  median(row.server_ms), row.peak_mib);
      // What the HTTP client held for the readers at most (the read-ahead), --via threads.
      if (!loader) std::printf("   held %5.1f MiB", row.held_mib);
      std::printf("\n");
    }
    // Each worker holds at most read_ahead: half for its shard, half for the next.
    std::printf("  (resident before any row: %.0f MiB; read-ahead budget %d x %d MiB)\n",
                base_mib, workers, read_ahead_mib);
    print_memory("raw", rows);
    if (all_rows) std::printf("nginx / local: %.2f    delay / no delay: %.2f    no index / nginx: %.2f\n",
                median(rows[1].mb_per_s) / median(rows[0].mb_per_s),
                median(rows[3].mb_per_s) / median(rows[2].mb_per_s),
                median(rows[4].mb_per_s) / median(rows[1].mb_per_s));
  }
  if (images.empty()) return 0;

  // The train pipeline over the image shards: the same rows, alternating within rounds.
  struct TrainRow {
    TrainRow(std::string n, std::string w) : name(std::move(n)), where(std::move(w)) {}
    std::string name, where, cache_dir;
    std::vector<double> images_per_s, cpu_ms, server_ms, first_ms;
    double peak_mib = 0;
    MemoryTrace memory{};
  };
  const std::string link = train_bw > 0 ? ",link" + std::to_string(train_bw * 1024) : "";
  const std::string proxy = host + std::to_string(server.proxy) + "/";
  const std::string link_mib = train_bw > 0 ? ",link" + std::to_string(train_bw) : "";
  std::vector<TrainRow> train_rows{
      {"train local", (served / "images").string()},
      {"train nginx", host + std::to_string(server.nginx) + "/images/"}};
  if (python_proxy) {
    train_rows.push_back({"train proxy" + link, proxy + "t" + link + "/images/"});
    train_rows.push_back({"train proxy+lat" + std::to_string(lat) + link,
                          proxy + "t,lat" + std::to_string(lat) + link + "/images/"});
  } else {
    train_rows.push_back({"train link" + link_mib, link_url(0, train_bw, 0, "/images/")});
    train_rows.push_back({"train link+rtt" + std::to_string(lat) + link_mib,
                          link_url(lat, train_bw, 0, "/images/")});
  }
  // The delayed link's later epochs with the cache: each row's run fills an empty cache in an
  // untimed epoch, then times epochs read from it.
  const CacheDir cache;
  train_rows.push_back({train_rows.back().name + " cached", train_rows.back().where});
  train_rows.back().cache_dir = cache.path.string();
  if (https) {
    // TLS's cost beside plain HTTP's: nginx over HTTPS, the tests' self-signed certificate.
    ::setenv("CURL_CA_BUNDLE",
             (fs::path(COLOAD_SERVE_SCRIPT).parent_path() / "data" / "tls" / "cert.pem").c_str(), 1);
    train_rows.push_back(
        {"train nginx https", "https://127.0.0.1:" + std::to_string(server.nginx_https) + "/images/"});
  }
  train(train_rows[0].where, workers, batch, 1, server.pid);  // warms the page cache
  if (!all_rows) {
    std::erase_if(train_rows, [&](const TrainRow& r) { return r.name.find(only) == std::string::npos; });
  }
  std::int64_t per_row = 0;
  for (int r = 0; r < rounds; ++r) {
    for (TrainRow& row : train_rows) {
      const TrainRun run = traced(trim, row.memory, [&] {
        if (!row.cache_dir.empty()) fs::remove_all(row.cache_dir);
        return train(row.where, workers, batch, epochs, server.pid, settings, row.cache_dir);
      });
      row.images_per_s.push_back(run.images_per_s);
      row.cpu_ms.push_back(run.cpu_ms);
      row.server_ms.push_back(run.server_cpu_ms);
      row.first_ms.push_back(run.first_batch_ms);
      row.peak_mib = std::max(row.peak_mib, row.memory.peak_rss);
      per_row = run.images;
    }
  }
  std::printf("train pipeline (ShardImagePipeline, classic recipe), %d workers, batch %lld, "
              "%lld images a row (%d epochs), median of %d rounds:\n",
              workers, static_cast<long long>(batch), static_cast<long long>(per_row), epochs,
              rounds);
  const double local = all_rows ? median(train_rows[0].images_per_s) : 0;
  for (const TrainRow& row : train_rows) {
    const double v = median(row.images_per_s);
    std::printf("  %-30s %8.1f images/s (%.3fx local)   CPU %6.3f ms/img   servers' CPU "
                "%6.3f ms/img   peak RSS %6.0f MiB\n",
                row.name.c_str(), v, local > 0 ? v / local : 0.0, median(row.cpu_ms),
                median(row.server_ms), row.peak_mib);
    std::printf("    rounds:");
    for (double x : row.images_per_s) std::printf(" %.1f", x);
    std::printf("   an epoch's first batch: %.1f ms\n", median(row.first_ms));
  }
  std::printf("  (resident before any row: %.0f MiB)\n", base_mib);
  print_memory("train", train_rows);
  if (all_rows) std::printf("train nginx / local: %.3f (target >= 0.95)   train with the delay / local: "
              "%.3f (target >= 0.9)   delay / no delay: %.3f\n",
              median(train_rows[1].images_per_s) / local,
              median(train_rows[3].images_per_s) / local,
              median(train_rows[3].images_per_s) / median(train_rows[2].images_per_s));
  if (all_rows) std::printf("train with the delay, later epochs from the cache / local: %.3f\n",
                            median(train_rows[4].images_per_s) / local);
  if (all_rows && https) {
    std::printf("train nginx over https / local: %.3f   / nginx over http: %.3f\n",
                median(train_rows[5].images_per_s) / local,
                median(train_rows[5].images_per_s) / median(train_rows[1].images_per_s));
  }
  return 0;
}
