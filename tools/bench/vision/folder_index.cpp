// tools/bench/vision/folder_index: indexing an ImageNet-sized folder, coload against torchvision.
//
//   folder_index [--dir DIR] [--classes N] [--per-class N] [--repeat N] [--threads N]
//                [--json] [--no-torchvision]
//
// Times coload::vision::index_folder (ImageFolder's indexing) and torchvision's
// ImageFolder(root) constructor (folder_index_torchvision.py, run with /usr/bin/python3) on the
// same tree of empty .jpg files: 1000 classes of 200 files by default. With --dir the tree is
// reused when DIR already holds one and made there otherwise; without it, it is made in a
// temporary folder and removed at the end. Each side builds its index once untimed (so both run
// with the directory cache warm), then --repeat times (default 5; coload's runs half before and
// half after torchvision's); the best time counts. CPU time (all threads) is shown beside it:
// on a machine busy with other work, the CPU-time ratio is the steadier figure.
// --json prints one object: {"coload_s": s, "torchvision_s": s, "ratio": torchvision / coload},
// with null for torchvision (and the ratio) when it is skipped or missing.

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "coload/vision/folder.hpp"

#ifndef COLOAD_BENCH_DIR
#error \
    "COLOAD_BENCH_DIR (the directory of folder_index_torchvision.py) must be defined by the build"
#endif

namespace fs = std::filesystem;

#include "../bench_support.hpp"

namespace bench = coload::bench;
using namespace coload::bench;

namespace {

constexpr const char* kPython = "/usr/bin/python3";

struct Args {
  std::string dir;
  int classes = 1000;
  int per_class = 200;
  int repeat = 5;
  int threads = 0;
  bool json = false;
  bool torchvision = true;
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse(int argc, char** argv) {
  Args args;
  CLI::App app{"folder_index: coload's index_folder against torchvision's ImageFolder constructor "
               "on one tree of empty .jpg files"};
  const CLI::Validator non_negative =
      CLI::Range(0, std::numeric_limits<int>::max()).description("NON-NEGATIVE");
  app.add_option("--dir", args.dir,
                 "reuse the tree in DIR, or make it there (default: a temporary folder, removed "
                 "at the end)");
  app.add_option("--classes", args.classes, "class folders (0 makes 1)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--per-class", args.per_class, "empty .jpg files per class (0 makes 1)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--repeat", args.repeat, "timed runs per side after one warm-up; the best counts")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--threads", args.threads, "coload's indexing threads (0: up to 8)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_flag("--json", args.json, "print one JSON object");
  app.add_flag_callback("--no-torchvision", [&args] { args.torchvision = false; }, "time coload only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  args.classes = std::max(1, args.classes);
  args.per_class = std::max(1, args.per_class);
  args.repeat = std::max(1, args.repeat);
  return args;
}

// Makes classes × per_class empty files: DIR/class_0000/img_000000.jpg.
void make_tree(const fs::path& root, int classes, int per_class) {
  char name[64];
  for (int c = 0; c < classes; ++c) {
    std::snprintf(name, sizeof name, "class_%04d", c);
    const fs::path dir = root / name;
    fs::create_directories(dir);
    for (int i = 0; i < per_class; ++i) {
      std::snprintf(name, sizeof name, "/img_%06d.jpg", c * per_class + i);
      const std::string path = dir.string() + name;
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) {
        std::fprintf(stderr, "folder_index: cannot create %s: %s\n", path.c_str(),
                     std::strerror(errno));
        std::exit(1);
      }
      ::close(fd);
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct TorchvisionTime {
  double best;
  double median;
  double cpu_best;
  std::size_t samples;
};

std::optional<TorchvisionTime> time_torchvision(const fs::path& root, int repeat) {
  if (::access(kPython, X_OK) != 0) return std::nullopt;
  const std::string command =
      std::string(kPython) + " " +
      shell_quote(std::string(COLOAD_BENCH_DIR) + "/folder_index_torchvision.py") + " " +
      shell_quote(root.string()) + " " + std::to_string(repeat);
  const bench::PeerOutput peer = bench::run_peer(command);
  if (!peer.started || peer.status != 0) return std::nullopt;
  const std::string& out = peer.last_line;
  const auto best = json_double(out, "best");
  const auto median = json_double(out, "median");
  const auto cpu_best = json_double(out, "cpu_best");
  const auto samples = json_double(out, "samples");
  if (!best || !median || !cpu_best || !samples) return std::nullopt;
  return TorchvisionTime{*best, *median, *cpu_best, static_cast<std::size_t>(*samples)};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);

  fs::path root;
  bool remove_root = false;
  if (args.dir.empty()) {
    std::string name = (fs::temp_directory_path() / "coload_folder_index_XXXXXX").string();
    if (!::mkdtemp(name.data())) {
      std::perror("folder_index: mkdtemp");
      return 1;
    }
    root = name;
    remove_root = true;
  } else {
    root = args.dir;
  }
  const bool reuse = fs::is_directory(root) && !fs::is_empty(root);
  if (!reuse) {
    std::fprintf(stderr, "folder_index: making %d x %d empty files in %s\n", args.classes,
                 args.per_class, root.c_str());
    const auto start = std::chrono::steady_clock::now();
    make_tree(root, args.classes, args.per_class);
    std::fprintf(stderr, "folder_index: made in %.1f s\n", seconds_since(start));
  }

  coload::vision::FolderOptions options{
      .extensions = std::vector<std::string>(coload::vision::image_extensions.begin(),
                                             coload::vision::image_extensions.end()),
      .num_threads = args.threads};
  const coload::vision::FolderIndex warm = coload::vision::index_folder(root, options);
  std::vector<double> times;
  double coload_cpu = 1e300;
  auto time_coload = [&](int runs) {
    for (int r = 0; r < runs; ++r) {
      const double cpu_start = cpu_seconds();
      const auto start = std::chrono::steady_clock::now();
      const coload::vision::FolderIndex index = coload::vision::index_folder(root, options);
      times.push_back(seconds_since(start));
      coload_cpu = std::min(coload_cpu, cpu_seconds() - cpu_start);
      if (index.samples.size() != warm.samples.size()) {
        std::fprintf(stderr, "folder_index: the tree changed while timing\n");
        std::exit(1);
      }
    }
  };
  // NOTE: coload's runs are split around torchvision's, so that a burst of load from elsewhere
  // on the machine is less likely to favour one side.
  time_coload((args.repeat + 1) / 2);

  std::optional<TorchvisionTime> tv;
  if (args.torchvision) {
    std::fprintf(stderr, "folder_index: timing torchvision's ImageFolder (%d+1 runs)\n",
                 args.repeat);
    tv = time_torchvision(root, args.repeat);
    if (!tv) std::fprintf(stderr, "folder_index: torchvision could not be timed (skipped)\n");
    if (tv && tv->samples != warm.samples.size()) {
      std::fprintf(stderr, "folder_index: torchvision found %zu samples, coload %zu\n", tv->samples,
                   warm.samples.size());
      return 1;
    }
  }
  time_coload(args.repeat - (args.repeat + 1) / 2);
  std::sort(times.begin(), times.end());
  const double coload_best = times.front();
  const double coload_median = times[times.size() / 2];

  if (args.json) {
    if (tv) {
      std::printf("{\"coload_s\": %.6f, \"torchvision_s\": %.6f, \"ratio\": %.2f}\n", coload_best,
                  tv->best, tv->best / coload_best);
    } else {
      std::printf("{\"coload_s\": %.6f, \"torchvision_s\": null, \"ratio\": null}\n", coload_best);
    }
  } else {
    std::printf("folder_index: %zu files in %zu classes under %s (warm cache, best of %d)\n",
                warm.samples.size(), warm.classes.size(), root.c_str(), args.repeat);
    std::printf(
        "  coload index_folder       %8.4f s  (median %.4f s, %.2f M files/s, cpu %.4f s)\n",
        coload_best, coload_median, warm.samples.size() / coload_best / 1e6, coload_cpu);
    if (tv) {
      std::printf(
          "  torchvision ImageFolder   %8.4f s  (median %.4f s, %.2f M files/s, cpu %.4f s)\n",
          tv->best, tv->median, tv->samples / tv->best / 1e6, tv->cpu_best);
      std::printf("  ratio                     %8.1fx  (target >= 5x; cpu time %.1fx)\n",
                  tv->best / coload_best, tv->cpu_best / coload_cpu);
    } else {
      std::printf("  torchvision ImageFolder   skipped\n");
    }
  }

  if (remove_root) {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  return 0;
}
