// tools/bench/shards: the same images as an ImageFolder and as tar shards, in one run.
//
//   shards ROOT SHARDS [--workers 2] [--batch-size 64] [--rounds 5] [--json] [--no-pytorch]
//
// ROOT is an ImageFolder (tools/make_image_folder makes one); SHARDS a folder of its shards
// (packed here, 64 MiB each, when it holds none). Prints each figure and the ratios:
//  - disk: O_DIRECT sequential 16 MiB reads of every shard (as `dd iflag=direct bs=16M`);
//  - raw delivery (bytes only, no decode), cold (every file evicted with
//    posix_fadvise(DONTNEED) first; shards in direct mode) and warm: ShardStream, ShardDataset
//    through a DataLoader (2 workers, batch 64, shuffled, one ranged read per sample through
//    io_uring), and the folder's files through the same loader (read_file through io_uring);
//  - the full train pipeline (decode + RandomResizedCrop 224 + flip + normalise, 2 workers,
//    batch 64): ShardImagePipeline against ImagePipeline, cold and warm;
//  - PyTorch's DataLoader over the webdataset package reading the same shards with the same
//    transform (shards_webdataset.py in the venv that setup_venv.sh makes), unless --no-pytorch;
//  - the index build over all shards (headers only) against Python's tarfile listing them.
// The cold figures are taken --rounds times, alternating (disk, stream, map, folder, then the two
// pipelines) so that a virtual disk whose speed drifts from second to second (this machine's
// moved between 560 and 1260 MB/s within a minute) weighs on each side alike; each cold figure is
// the median of its rounds, and stream cold / disk is the median of the per-round ratios.
// With --json, stdout is one JSON object with every figure.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../bench_support.hpp"
#include "coload/coload.hpp"
#include "coload/io/reader.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/shard_pipeline.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void evict(const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Rate {
  double samples_per_s = 0;
  double mb_per_s = 0;
};

// Sequential O_DIRECT reads of 16 MiB, one at a time, over every shard.
Rate disk_bandwidth(const std::vector<std::string>& shards) {
  evict(shards);
  constexpr std::size_t chunk = 16 << 20;
  void* buf = std::aligned_alloc(4096, chunk);
  std::uint64_t bytes = 0;
  const auto t = Clock::now();
  for (const auto& p : shards) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) continue;
    for (off_t off = 0;; off += chunk) {
      const ssize_t n = ::pread(fd, buf, chunk, off);
      if (n <= 0) break;
      bytes += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
  }
  const double s = since(t);
  std::free(buf);
  return {0, static_cast<double>(bytes) / s / 1e6};
}

// Bytes of each sample, collated into a tensor of sizes.
struct FolderBytes {
  std::shared_ptr<const std::vector<std::string>> paths;
  std::int64_t size() const { return static_cast<std::int64_t>(paths->size()); }
  coload::Task<std::int64_t> get_async(coload::Index i, coload::SampleContext& ctx) const {
    const auto buffer = co_await ctx.io->read_file((*paths)[static_cast<std::size_t>(i)]);
    co_return static_cast<std::int64_t>(buffer.size());
  }
};

struct ShardBytes {
  coload::shards::ShardDataset shards;
  std::int64_t size() const { return shards.size(); }
  coload::Task<std::int64_t> get_async(coload::Index i, coload::SampleContext& ctx) const {
    const auto s = co_await shards.get_async(i, ctx);
    std::int64_t n = 0;
    for (const auto& f : s.fields) n += static_cast<std::int64_t>(f.size);
    co_return n;
  }
};

template <class D>
Rate loader_bytes(const D& dataset, int workers, std::int64_t batch) {
  auto loader = coload::make_data_loader(
      dataset, {.batch_size = batch, .shuffle = true, .num_workers = workers, .seed = 1});
  std::int64_t samples = 0, bytes = 0;
  const auto t = Clock::now();
  for (auto& b : loader) {
    samples += b.numel();
    bytes += b.sum().template item<std::int64_t>();
  }
  const double s = since(t);
  return {static_cast<double>(samples) / s, static_cast<double>(bytes) / s / 1e6};
}

Rate stream_bytes(const fs::path& dir, bool direct) {
  coload::shards::ShardStream stream(dir, {.shards = {.direct = direct}, .shuffle_shards = false});
  std::int64_t samples = 0, bytes = 0;
  const auto t = Clock::now();
  for (auto& s : stream.samples(coload::WorkerInfo{.id = 0, .num_workers = 1})) {
    ++samples;
    for (const auto& f : s.fields) bytes += static_cast<std::int64_t>(f.size);
  }
  const double s = since(t);
  return {static_cast<double>(samples) / s, static_cast<double>(bytes) / s / 1e6};
}

template <class D>
double pipeline_rate(D dataset, int workers, std::int64_t batch) {
  auto loader = coload::make_data_loader(
      std::move(dataset), {.batch_size = batch, .shuffle = true, .num_workers = workers, .seed = 1});
  std::int64_t images = 0;
  const auto t = Clock::now();
  for (auto& [x, y] : loader) images += x.size(0);
  return static_cast<double>(images) / since(t);
}

std::string ratio(double a, double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2fx", b > 0 ? a / b : 0.0);
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  // The flags, parsed with CLI11: --help lists them; a bad or unknown flag, or a missing
  // ROOT or SHARDS, is named, exit 2.
  std::string root_arg, dir_arg;
  int workers = 2, rounds = 5;
  std::int64_t batch = 64;
  bool json = false, pytorch = true;
  CLI::App app{"shards: the same images as an ImageFolder and as tar shards, in one run (raw "
               "delivery cold and warm, the train pipeline, PyTorch + webdataset, the index build)"};
  app.add_option("ROOT", root_arg, "an ImageFolder (make_image_folder makes one)")->required();
  app.add_option("SHARDS", dir_arg, "a folder of ROOT's shards (packed here when it holds none)")
      ->required();
  app.add_option("--workers", workers, "loader workers")->capture_default_str();
  app.add_option("--batch-size", batch, "batch size")->capture_default_str();
  app.add_option("--rounds", rounds, "rounds of the cold figures (medians are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--json", json, "print one JSON object with every figure");
  app.add_flag_callback("--no-pytorch", [&pytorch] { pytorch = false; },
                        "skip PyTorch's DataLoader over webdataset");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const fs::path root = root_arg, dir = dir_arg;
  coload::vision::FolderOptions fo;
  fo.extensions.emplace(coload::vision::image_extensions.begin(),
                        coload::vision::image_extensions.end());
  const auto index = coload::vision::index_folder(root, fo);
  std::vector<std::string> files;
  for (const auto& s : index.samples) files.push_back(s.path);
  bool have = false;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) have = have || e.path().extension() == ".tar";
  if (!have) {
    coload::shards::Writer writer(dir);
    coload::shards::pack(static_cast<std::int64_t>(files.size()), 1, writer,
                         [&](std::int64_t k, coload::shards::Writer& w) {
                           std::ifstream in(files[static_cast<std::size_t>(k)], std::ios::binary);
                           const std::string data((std::istreambuf_iterator<char>(in)),
                                                  std::istreambuf_iterator<char>());
                           const std::string cls =
                               std::to_string(index.samples[static_cast<std::size_t>(k)].class_index);
                           char key[32];
                           std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(k));
                           const coload::shards::WriteField f[] = {
                               {"jpg", {reinterpret_cast<const std::byte*>(data.data()), data.size()}},
                               {"cls", {reinterpret_cast<const std::byte*>(cls.data()), cls.size()}}};
                           w.write(key, f);
                         });
  }
  const auto shard_paths = coload::shards::find_shards(dir);
  std::uint64_t shard_bytes = 0;
  for (const auto& p : shard_paths) shard_bytes += fs::file_size(p);
  auto everything = shard_paths;
  everything.insert(everything.end(), files.begin(), files.end());
  if (!json) {
    std::printf("%zu images in %s; %zu shards (%.0f MiB) in %s\n", files.size(), root.c_str(),
                shard_paths.size(), static_cast<double>(shard_bytes) / (1 << 20), dir.c_str());
  }
  std::map<std::string, double> fig;

  // Index build (headers only) against Python's tarfile, both warm (the shards are read once
  // first, so that neither pays for the disk).
  stream_bytes(dir, false);
  {
    const auto t = Clock::now();
    std::size_t members = 0;
    for (const auto& p : shard_paths) members += coload::shards::build_index(p).members.size();
    fig["index_build_s"] = since(t);
    std::string cmd = "/usr/bin/python3 -c 'import sys,tarfile,time\nt=time.perf_counter()\nn=0\n"
                      "for p in sys.argv[1:]:\n  with tarfile.open(p) as f: n+=len(f.getmembers())\n"
                      "print(time.perf_counter()-t)'";
    for (const auto& p : shard_paths) cmd += " " + coload::bench::shell_quote(p);
    const auto out = coload::bench::run_peer(cmd);
    fig["index_tarfile_s"] = out.status == 0 ? std::atof(out.last_line.c_str()) : 0;
    fig["index_members"] = static_cast<double>(members);
  }

  const auto shards_ds = coload::shards::ShardDataset(dir);
  const auto shards_direct = coload::shards::ShardDataset(dir, {.direct = true});
  const FolderBytes folder{std::make_shared<const std::vector<std::string>>(files)};

  // Cold: `rounds` alternating rounds, medians. Warm: once, after a warming pass.
  std::map<std::string, std::vector<double>> cold;
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  for (const char* mode : {"cold", "warm"}) {
    const bool is_cold = std::strcmp(mode, "cold") == 0;
    const auto note = [&](const std::string& key, double v) {
      if (is_cold) cold[key].push_back(v);
      else fig[key] = v;
    };
    for (int round = 0; round < (is_cold ? rounds : 1); ++round) {
      auto run = [&](const std::string& name, auto&& f) {
        if (is_cold) evict(everything);
        const Rate r = f();
        note(name + "_" + mode + "_samples_s", r.samples_per_s);
        note(name + "_" + mode + "_mb_s", r.mb_per_s);
        return r;
      };
      if (is_cold) {
        // Which of the two goes first alternates, so neither always follows the other's load.
        double disk = 0;
        if (round % 2 == 0) disk = disk_bandwidth(shard_paths).mb_per_s;
        const Rate s = run("stream", [&] { return stream_bytes(dir, true); });
        if (round % 2 == 1) disk = disk_bandwidth(shard_paths).mb_per_s;
        cold["disk_mb_s"].push_back(disk);
        cold["stream_cold_vs_disk"].push_back(disk > 0 ? s.mb_per_s / disk : 0);
      } else {
        stream_bytes(dir, false);  // warm the cache
        run("stream", [&] { return stream_bytes(dir, false); });
      }
      run("map", [&] {
        return loader_bytes(ShardBytes{is_cold ? shards_direct : shards_ds}, workers, batch);
      });
      if (!is_cold) loader_bytes(folder, workers, batch);
      run("folder", [&] { return loader_bytes(folder, workers, batch); });
      auto pipe = [&](const std::string& name, auto&& f) {
        if (is_cold) evict(everything);
        note(name + "_" + mode + "_images_s", f());
      };
      pipe("pipeline_shards", [&] {
        return pipeline_rate(coload::vision::ShardImagePipeline(is_cold ? shards_direct : shards_ds,
                                                                coload::vision::TrainTransform{}),
                             workers, batch);
      });
      pipe("pipeline_folder", [&] {
        return pipeline_rate(coload::vision::ImagePipeline(index, coload::vision::TrainTransform{}),
                             workers, batch);
      });
    }
  }
  for (const auto& [k, v] : cold) fig[k] = median(v);

  std::string peer_versions = "not run";
  if (pytorch) {
    // The peers' virtual environment (setup_venv.sh here adds webdataset to it), or the Python
    // named by $COLOAD_WDS_PYTHON.
    const char* env = std::getenv("COLOAD_WDS_PYTHON");
    const char* venv = std::getenv("COLOAD_PEERS_VENV");
    const char* home = std::getenv("HOME");
    const std::string python =
        env ? env
            : (venv ? std::string(venv) : std::string(home ? home : "/root") + "/.cache/coload/venv-peers") +
                  "/bin/python";
    std::string cmd = coload::bench::shell_quote(python) + " " +
                      coload::bench::shell_quote(std::string(COLOAD_BENCH_DIR) + "/shards_webdataset.py") +
                      " " + coload::bench::shell_quote(dir.string()) + " --workers " +
                      std::to_string(workers) + " --batch-size " + std::to_string(batch) + " --json";
    const auto out = coload::bench::run_peer(cmd);
    if (auto v = coload::bench::json_double(out.last_line, "images_per_s")) fig["webdataset_images_s"] = *v;
    if (auto v = coload::bench::json_double(out.last_line, "images")) fig["webdataset_images"] = *v;
    peer_versions = coload::bench::json_field(out.last_line, "versions").value_or(
        "unavailable: " + out.last_line.substr(0, 200));
  }

  const double stream_vs_disk = fig["stream_cold_vs_disk"];
  if (json) {
    std::printf("{");
    bool first = true;
    for (const auto& [k, v] : fig) {
      std::printf("%s\"%s\": %.4f", first ? "" : ", ", k.c_str(), v);
      first = false;
    }
    std::printf(", \"rounds\": %d, \"peer\": \"%s\"}\n", rounds, peer_versions.c_str());
    return 0;
  }
  std::printf("cold figures: medians of %d rounds\n", rounds);
  std::printf("disk (O_DIRECT, 16 MiB reads)      %8.1f MB/s\n", fig["disk_mb_s"]);
  for (const char* k : {"disk_mb_s", "stream_cold_mb_s", "stream_cold_vs_disk"}) {
    std::printf("  rounds of %s:", k);
    for (double v : cold[k]) std::printf(" %.2f", v);
    std::printf("\n");
  }
  for (const char* mode : {"cold", "warm"}) {
    const std::string m = mode;
    std::printf("raw %s: stream %8.0f samples/s %7.1f MB/s | map %8.0f samples/s %7.1f MB/s | "
                "folder %8.0f files/s %7.1f MB/s\n",
                mode, fig["stream_" + m + "_samples_s"], fig["stream_" + m + "_mb_s"],
                fig["map_" + m + "_samples_s"], fig["map_" + m + "_mb_s"],
                fig["folder_" + m + "_samples_s"], fig["folder_" + m + "_mb_s"]);
    std::printf("  stream/folder %s, map/folder %s\n",
                ratio(fig["stream_" + m + "_samples_s"], fig["folder_" + m + "_samples_s"]).c_str(),
                ratio(fig["map_" + m + "_samples_s"], fig["folder_" + m + "_samples_s"]).c_str());
    std::printf("pipeline %s: shards %7.1f images/s, folder %7.1f images/s: %s\n", mode,
                fig["pipeline_shards_" + m + "_images_s"], fig["pipeline_folder_" + m + "_images_s"],
                ratio(fig["pipeline_shards_" + m + "_images_s"],
                      fig["pipeline_folder_" + m + "_images_s"]).c_str());
  }
  std::printf("stream cold / disk bandwidth: %.2f (median of the rounds' ratios; target >= 0.9)\n",
              stream_vs_disk);
  if (fig.count("webdataset_images_s")) {
    std::printf("PyTorch DataLoader + webdataset (%s): %.1f images/s; coload warm shards %s\n",
                peer_versions.c_str(), fig["webdataset_images_s"],
                ratio(fig["pipeline_shards_warm_images_s"], fig["webdataset_images_s"]).c_str());
    std::printf("  webdataset read %.0f of the %lld samples of coload's shards in an epoch\n",
                fig["webdataset_images"], static_cast<long long>(shards_ds.size()));
  } else {
    std::printf("PyTorch + webdataset: %s\n", peer_versions.c_str());
  }
  std::printf("index build: coload %.4f s, Python tarfile %.4f s (%.0f members): %s faster\n",
              fig["index_build_s"], fig["index_tarfile_s"], fig["index_members"],
              ratio(fig["index_tarfile_s"], fig["index_build_s"]).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "shards bench: %s\n", e.what());
  return 1;
}
