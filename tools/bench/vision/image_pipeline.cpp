// tools/bench/vision/image_pipeline: the image-folder input pipeline, coload against PyTorch
// and against a bare JPEG decode, on one ImageFolder tree.
//
//   image_pipeline ROOT [--epochs N] [--json] [--skip-pytorch] [--breakdown] [--metrics on|off]
//                  [--workers N|auto] [--skip-decode-only]
//
// Three measurements over the same files, all with the standard ImageNet train transform where
// one applies, batch 64 and 2 workers:
//   coload       coload::vision::ImagePipeline(ROOT, TrainTransform{}) through
//                make_data_loader({.batch_size = 64, .shuffle = true, .num_workers = 2}).
//   pytorch      torch.utils.data.DataLoader over torchvision.datasets.ImageFolder with
//                RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize
//                (image_pipeline_pytorch.py, run with /usr/bin/python3, found through
//                COLOAD_BENCH_DIR).
//   decode_only  every file read and decoded full-size to RGB by TurboJPEG (tjDecompress2, the
//                flags coload and Pillow use) on 2 threads; no resize, no tensor.
// Before any timing every file is read once, so the page cache is equally warm for all three
// (the output says so and how much was read). Each measurement runs one untimed warm-up epoch,
// then N timed ones (default 3); the figure is the median images/s of those epochs (the best is
// shown beside it). CPU milliseconds per image (all threads, or all processes for PyTorch) are
// shown too: on a machine shared with other work they vary less than wall time.
//
// --json prints exactly one JSON object on stdout (progress goes to stderr):
//   {"coload": r, "pytorch": r|null, "decode_only": r, "ratios": {"coload/pytorch": x|null,
//    "coload/decode_only": x}, "ratios_cpu": {the same from CPU ms per image}, ...}
// ("<name>_best" and "<name>_cpu_ms_per_image" sit beside each rate; the load average too).
// --breakdown adds a single-thread cost split per image (read, full decode, decode at the
// transform's DCT scale, crop+resize+normalize) to say where coload's time goes.
// --workers sets coload's num_workers (a count, or auto: coload::auto_workers); PyTorch and
// decode_only keep 2, and --skip-decode-only leaves decode_only out (null).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <turbojpeg.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
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
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "coload/dataset/sample_context.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/sampler/random.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/transforms.hpp"

#ifndef COLOAD_BENCH_DIR
#error "COLOAD_BENCH_DIR (the directory of image_pipeline_pytorch.py) must be defined by the build"
#endif

namespace fs = std::filesystem;

#include "../bench_support.hpp"

namespace bench = coload::bench;
using namespace coload::bench;

namespace {

constexpr std::int64_t kBatch = 64;
constexpr int kWorkers = 2;
constexpr std::uint64_t kSeed = 0;
constexpr const char* kPython = "/usr/bin/python3";
constexpr double kTargetPytorch = 3.0;  // the floor; 4x is the aim
constexpr double kAimPytorch = 4.0;
constexpr double kTargetDecode = 0.8;

struct Args {
  std::string root;
  int epochs = 3;
  bool json = false;
  bool pytorch = true;
  bool breakdown = false;
  bool processes = false;  // --executor processes: also measure process workers
  bool metrics = true;     // --metrics off: coload's metrics off, to measure what they cost
  int workers = kWorkers;  // coload's num_workers (or coload::auto_workers)
  bool decode_only = true;
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag, or a missing ROOT,
/// is named, exit 2.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"image_pipeline: coload's ImagePipeline through the DataLoader against PyTorch's "
               "DataLoader over torchvision's ImageFolder and a bare 2-thread JPEG decode, on "
               "one ImageFolder tree"};
  app.add_option("ROOT", a.root, "an ImageFolder tree (ROOT/class/image.jpg)")->required();
  app.add_option("--epochs", a.epochs, "timed epochs per measurement, after one warm-up")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag_callback("--skip-pytorch", [&a] { a.pytorch = false; },
                        "do not run the PyTorch side (reported as null)");
  app.add_flag("--breakdown", a.breakdown,
               "also time read, decode and transform per image on 1 thread");
  std::string executor = "threads";
  app.add_option("--executor", executor,
                 "processes: also measure 2 worker processes (against threads and PyTorch's 2 "
                 "worker processes)")
      ->check(CLI::IsMember({"threads", "processes"}))
      ->capture_default_str();
  std::string metrics = "on";
  app.add_option("--metrics", metrics,
                 "coload's metrics (LoaderOptions::metrics); off measures what they cost")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string workers = std::to_string(kWorkers);
  app.add_option("--workers", workers,
                 "coload's num_workers (threads): a count, or auto (coload::auto_workers); "
                 "PyTorch and decode_only keep 2")
      ->check(workers_error)
      ->capture_default_str();
  app.add_flag_callback("--skip-decode-only", [&a] { a.decode_only = false; },
                        "do not run the decode_only floor (reported as null)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  a.processes = executor == "processes";
  a.metrics = metrics == "on";
  a.workers = *parse_workers(workers);
  return a;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The result of one measurement: images/s per timed epoch, and CPU seconds per epoch.
struct Rate {
  double median = 0;
  double best = 0;
  double cpu_ms_per_image = 0;
  std::vector<double> epochs;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One untimed warm-up, then `epochs` timed ones; `epoch()` returns the images it delivered,
// which must be all of them, or the figure would flatter a loader that drops samples.
Rate measure(const char* name, int epochs, std::int64_t images,
             const std::function<std::int64_t()>& epoch) {
  auto check = [&](std::int64_t got) {
    if (got != images) {
      std::fprintf(stderr, "\nimage_pipeline: %s delivered %lld images in an epoch, expected %lld\n",
                   name, static_cast<long long>(got), static_cast<long long>(images));
      std::exit(1);
    }
  };
  std::fprintf(stderr, "image_pipeline: %-11s warm-up...", name);
  std::fflush(stderr);
  check(epoch());
  std::fprintf(stderr, " timing %d epochs:", epochs);
  std::fflush(stderr);
  Rate r;
  std::vector<double> cpu;
  for (int e = 0; e < epochs; ++e) {
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    check(epoch());
    const double s = seconds_since(t0);
    cpu.push_back(cpu_seconds() - c0);
    r.epochs.push_back(static_cast<double>(images) / s);
    std::fprintf(stderr, " %.1f", r.epochs.back());
    std::fflush(stderr);
  }
  r.median = median_of(r.epochs);
  r.best = *std::max_element(r.epochs.begin(), r.epochs.end());
  r.cpu_ms_per_image = 1e3 * median_of(cpu) / static_cast<double>(images);
  std::fprintf(stderr, " images/s (median %.1f)\n", r.median);
  return r;
}

// Reads the whole file at `path` into `buf` (resized to fit); throws naming the path.
void read_file(const std::string& path, std::vector<unsigned char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": fstat: " + std::strerror(err));
  }
  buf.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw std::runtime_error(path + ": read: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

// A TurboJPEG decompressor per thread, freed when the thread ends.
struct TjDecompressor {
  tjhandle h = tjInitDecompress();
  TjDecompressor() {
    if (!h) throw std::runtime_error(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
  }
  ~TjDecompressor() { tjDestroy(h); }
  TjDecompressor(const TjDecompressor&) = delete;
  TjDecompressor& operator=(const TjDecompressor&) = delete;
};

// Decodes `jpeg` full-size to RGB into `rgb`, with flags 0 (accurate IDCT, fancy upsampling:
// the settings coload's decode and Pillow use, so the floor is the same work they do).
void decode_full(TjDecompressor& d, const std::vector<unsigned char>& jpeg,
                 std::vector<unsigned char>& rgb, const std::string& path) {
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(d.h, jpeg.data(), static_cast<unsigned long>(jpeg.size()), &w, &h,
                          &subsamp, &colorspace) != 0) {
    throw std::runtime_error(path + ": " + tjGetErrorStr2(d.h));
  }
  rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  if (tjDecompress2(d.h, jpeg.data(), static_cast<unsigned long>(jpeg.size()), rgb.data(), w, 0,
                    h, TJPF_RGB, 0) != 0 &&
      tjGetErrorCode(d.h) == TJERR_FATAL) {
    throw std::runtime_error(path + ": " + tjGetErrorStr2(d.h));
  }
}

// One pass of the decode-only floor: `threads` threads take files from a shared counter, read
// and decode each. An error in a thread is kept and rethrown here, so the run stops with the
// path instead of a std::terminate.
std::int64_t decode_pass(const std::vector<std::string>& files, int threads) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::vector<std::string> errors(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        TjDecompressor d;
        std::vector<unsigned char> jpeg, rgb;
        for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < files.size();) {
          read_file(files[i], jpeg);
          decode_full(d, jpeg, rgb, files[i]);
          done.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
        next.store(files.size());  // stop the other threads too
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw std::runtime_error("decode_only: " + e);
  }
  return done.load();
}

// CPU seconds (user + system) of each live thread of this process whose name starts with
// `prefix`, summed: from /proc/self/task/*/stat, so in clock ticks (10 ms), fine over epochs.
// Used to split coload's CPU between its driver, its workers and the consumer.
double threads_cpu_seconds(std::string_view prefix) {
  double total = 0;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::FILE* f = std::fopen((task.path() / "stat").c_str(), "r");
    if (!f) continue;
    char line[1024] = {};
    const std::size_t n = std::fread(line, 1, sizeof line - 1, f);
    std::fclose(f);
    const std::string_view st(line, n);
    // "tid (name) S ppid ...": the name may hold spaces, so split at the last ')'.
    const auto open = st.find('('), close = st.rfind(')');
    if (open == std::string_view::npos || close == std::string_view::npos) continue;
    if (st.substr(open + 1, close - open - 1).substr(0, prefix.size()) != prefix) continue;
    unsigned long long utime = 0, stime = 0;
    // After ") " come fields 3..: state, ppid, pgrp, session, tty, tpgid, flags, minflt,
    // cminflt, majflt, cmajflt, utime (14), stime (15).
    if (std::sscanf(line + close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                    &utime, &stime) == 2) {
      total += static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    }
  }
  return total;
}

// --- PyTorch, through image_pipeline_pytorch.py -----------------------------------------------
struct PyResult {
  std::optional<Rate> rate;
  std::string note;  // why rate is null, or the versions
};


PyResult run_pytorch(const Args& args) {
  if (!args.pytorch) return {std::nullopt, "skipped (--skip-pytorch)"};
  if (::access(kPython, X_OK) != 0) return {std::nullopt, std::string(kPython) + " not found"};
  const std::string script = std::string(COLOAD_BENCH_DIR) + "/image_pipeline_pytorch.py";
  if (::access(script.c_str(), R_OK) != 0) return {std::nullopt, script + " not found"};
  const std::string cmd = std::string(kPython) + " " + shell_quote(script) + " " +
                          shell_quote(args.root) + " --json --epochs " +
                          std::to_string(args.epochs) + " --batch-size " +
                          std::to_string(kBatch) + " --workers " + std::to_string(kWorkers) +
                          " --seed " + std::to_string(kSeed);
  std::fprintf(stderr, "image_pipeline: %-11s running %s\n", "pytorch", cmd.c_str());
  std::fflush(stderr);
  const bench::PeerOutput peer = bench::run_peer(cmd);
  if (!peer.started) return {std::nullopt, peer.error};
  const int status = peer.status;
  const std::string& line = peer.last_line;
  if (status != 0) {
    return {std::nullopt,
            "image_pipeline_pytorch.py failed (status " + std::to_string(status) + ")"};
  }
  const auto median = json_double(line, "pytorch");
  if (!median || *median <= 0) {
    return {std::nullopt,
            json_field(line, "error").value_or("no result from image_pipeline_pytorch.py")};
  }
  Rate r;
  r.median = *median;
  r.best = json_double(line, "best").value_or(*median);
  r.cpu_ms_per_image = json_double(line, "cpu_ms_per_image").value_or(NAN);
  const std::string note = "torch " + json_field(line, "torch_version").value_or("?") +
                           ", torchvision " +
                           json_field(line, "torchvision_version").value_or("?");
  std::fprintf(stderr, "image_pipeline: %-11s median %.1f images/s (%s)\n", "pytorch", r.median,
               note.c_str());
  return {r, note};
}

// --- the single-thread breakdown ---------------------------------------------------------------
struct Breakdown {
  double read_ms = 0;          // open + pread + close
  double full_decode_ms = 0;   // tjDecompress2 at scale 1
  double scaled_decode_ms = 0; // decode at the DCT scale the train transform picks
  double transform_ms = 0;     // TrainTransform::apply: scaled decode + crop/resize/normalize
  double mean_scale = 0;       // mean DCT scale denominator picked
  double fresh_batch_ms = 0;   // a new [64, 3, S, S] float tensor, first touched, then freed
};

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Times each stage over every file on this thread alone, with the random crops of one
// seeded generator, so the split shows what one worker spends per image on each step. The
// clock is this thread's CPU time, not wall time: on a shared machine wall time would count
// the slices other processes took.
Breakdown breakdown(const std::vector<std::string>& files) {
  const coload::vision::TrainTransform tt{};
  at::Generator gen = coload::make_generator(kSeed);
  TjDecompressor d;
  std::vector<unsigned char> jpeg, rgb;
  std::vector<std::uint8_t> scaled;
  std::vector<float> out(static_cast<std::size_t>(3 * tt.size * tt.size));
  Breakdown b;
  for (const auto& f : files) {
    double t0 = thread_cpu_seconds();
    read_file(f, jpeg);
    b.read_ms += thread_cpu_seconds() - t0;
    t0 = thread_cpu_seconds();
    decode_full(d, jpeg, rgb, f);
    b.full_decode_ms += thread_cpu_seconds() - t0;
    const auto bytes = std::as_bytes(std::span<const unsigned char>(jpeg));
    const auto params = tt.sample(coload::vision::peek(bytes), gen);
    b.mean_scale += params.scale_denominator;
    t0 = thread_cpu_seconds();
    (void)coload::vision::decode_into(bytes, scaled, params.scale_denominator);
    b.scaled_decode_ms += thread_cpu_seconds() - t0;
    t0 = thread_cpu_seconds();
    tt.apply(bytes, params, out.data());
    b.transform_ms += thread_cpu_seconds() - t0;
  }
  // A loader hands out a new batch tensor each time (the consumer owns it), 38.5 MB at 224:
  // more than glibc's mmap threshold, so each one is fresh pages faulted in on first write and
  // unmapped on free. Time that alone, per image, to see how much of the loader's share it is.
  constexpr int kFreshBatches = 8;
  for (int i = 0; i < kFreshBatches; ++i) {
    const double t0 = thread_cpu_seconds();
    {
      at::Tensor batch = at::empty({kBatch, 3, tt.size, tt.size}, at::kFloat);
      std::memset(batch.data_ptr<float>(), 0, static_cast<std::size_t>(batch.nbytes()));
    }
    b.fresh_batch_ms += thread_cpu_seconds() - t0;
  }
  b.fresh_batch_ms *= 1e3 / (kFreshBatches * static_cast<double>(kBatch));
  const double n = static_cast<double>(files.size());
  b.read_ms *= 1e3 / n;
  b.full_decode_ms *= 1e3 / n;
  b.scaled_decode_ms *= 1e3 / n;
  b.transform_ms *= 1e3 / n;
  b.mean_scale /= n;
  return b;
}

// --- reporting ---------------------------------------------------------------------------------
std::optional<double> ratio(const std::optional<Rate>& a, const std::optional<Rate>& b) {
  if (!a || !b || b->median <= 0) return std::nullopt;
  return a->median / b->median;
}

std::string load_average() {
  double l[3] = {NAN, NAN, NAN};
  if (::getloadavg(l, 3) != 3) return "unknown";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", l[0], l[1], l[2]);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  std::error_code ec;
  if (!fs::is_directory(args.root, ec)) {
    std::fprintf(stderr, "image_pipeline: ROOT '%s' %s\n", args.root.c_str(),
                 fs::exists(args.root, ec) ? "is not a directory" : "does not exist");
    return 2;
  }
  // The consumer only counts batches; ATen's intra-op pool would just add threads competing
  // with the 2 workers.
  at::set_num_threads(1);
  const std::string load_before = load_average();

  std::optional<coload::vision::ImagePipeline> pipeline;
  try {
    pipeline.emplace(args.root, coload::vision::TrainTransform{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "image_pipeline: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> files;
  for (const auto& s : pipeline->index().samples) files.push_back(s.path);
  const auto images = static_cast<std::int64_t>(files.size());
  if (images == 0) {
    std::fprintf(stderr, "image_pipeline: ROOT '%s' holds no images\n", args.root.c_str());
    return 2;
  }

  // Warm the page cache: every file read once, so no measurement pays for the disk and the
  // first one is not penalised for going first.
  std::uint64_t cached_bytes = 0;
  double warm_s = 0;
  try {
    const auto t0 = Clock::now();
    std::vector<unsigned char> buf;
    for (const auto& f : files) {
      read_file(f, buf);
      cached_bytes += buf.size();
    }
    warm_s = seconds_since(t0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "image_pipeline: warming the file cache: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "image_pipeline: file cache warmed: read all %lld files (%.1f MiB) once "
               "in %.2f s before timing\n",
               static_cast<long long>(images), static_cast<double>(cached_bytes) / (1 << 20),
               warm_s);

  std::optional<Rate> decode_only, coload_rate, processes_rate, fresh_rate;
  coload::WorkerTuning tuning;  // coload's worker count at the end (--workers auto: how it moved)
  struct {
    double total_ms = 0, driver_ms = 0, consumer_ms = 0;
  } threads_split;
  try {
    if (args.decode_only) {
      decode_only = measure("decode_only", args.epochs, images,
                            [&] { return decode_pass(files, kWorkers); });
    }

    // One epoch of `loader`, checked: a malformed batch would make the rate meaningless.
    auto epoch_of = [](auto& loader) {
      std::int64_t delivered = 0;
      for (auto&& [x, y] : loader) {
        if (x.dim() != 4 || x.size(1) != 3 || x.size(2) != 224 || x.size(3) != 224 ||
            y.size(0) != x.size(0)) {
          throw std::runtime_error("coload: unexpected batch shape " +
                                   std::to_string(x.dim()) + "-d");
        }
        delivered += x.size(0);
      }
      return delivered;
    };
    if (args.processes) {
      // Against threads (kept for the loader's life): processes kept as well.
      auto kept = coload::make_data_loader(
          *pipeline, {.batch_size = kBatch, .shuffle = true, .num_workers = kWorkers,
                      .persistent_workers = true, .seed = kSeed,
                      .executor = coload::Executor::processes, .metrics = args.metrics});
      processes_rate = measure("coload_processes", args.epochs, images,
                               [&] { return epoch_of(kept); });
      // Against PyTorch's side: worker processes forked anew each epoch, as its default.
      auto fresh = coload::make_data_loader(
          *pipeline, {.batch_size = kBatch, .shuffle = true, .num_workers = kWorkers,
                      .seed = kSeed, .executor = coload::Executor::processes});
      fresh_rate = measure("coload_processes_fresh", args.epochs, images,
                           [&] { return epoch_of(fresh); });
    }
    auto loader = coload::make_data_loader(
        *pipeline, {.batch_size = kBatch, .shuffle = true, .num_workers = args.workers,
                    .seed = kSeed, .metrics = args.metrics});
    // For --breakdown: CPU of the whole process, of the driver thread and of this (consumer)
    // thread across all coload epochs, warm-up included; the workers get what is left.
    const double proc0 = cpu_seconds(), main0 = thread_cpu_seconds();
    coload_rate = measure("coload", args.epochs, images, [&] { return epoch_of(loader); });
    const double all_images = static_cast<double>(images) * (args.epochs + 1);
    threads_split.consumer_ms = 1e3 * (thread_cpu_seconds() - main0) / all_images;
    // The driver lives as long as the loader, so its whole life is these epochs (plus setup).
    threads_split.driver_ms = 1e3 * threads_cpu_seconds("coload-driver") / all_images;
    threads_split.total_ms = 1e3 * (cpu_seconds() - proc0) / all_images;
    tuning = loader.worker_tuning();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nimage_pipeline: %s\n", e.what());
    return 1;
  }

  const PyResult pytorch = run_pytorch(args);
  if (!pytorch.rate) std::fprintf(stderr, "image_pipeline: pytorch is null: %s\n",
                                  pytorch.note.c_str());

  std::optional<Breakdown> split;
  if (args.breakdown) {
    try {
      std::fprintf(stderr, "image_pipeline: breakdown on 1 thread...\n");
      split = breakdown(files);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "image_pipeline: breakdown: %s\n", e.what());
      return 1;
    }
  }
  const std::string load_after = load_average();
  const auto r_pytorch = ratio(coload_rate, pytorch.rate);
  const auto r_decode = ratio(coload_rate, decode_only);
  // The same ratios from CPU time per image (other's CPU / coload's): wall-clock rates on a
  // machine shared with other work swing with the load between one measurement and the next,
  // CPU time far less, so these say whether a miss is coload's or the machine's.
  auto cpu_ratio = [&](const std::optional<Rate>& other) -> std::optional<double> {
    if (!coload_rate || !other || !(coload_rate->cpu_ms_per_image > 0) ||
        !std::isfinite(other->cpu_ms_per_image)) {
      return std::nullopt;
    }
    return other->cpu_ms_per_image / coload_rate->cpu_ms_per_image;
  };
  const auto c_pytorch = cpu_ratio(pytorch.rate), c_decode = cpu_ratio(decode_only);
  const auto p_threads = ratio(processes_rate, coload_rate);
  const auto p_pytorch = ratio(fresh_rate, pytorch.rate);

  if (args.json) {
    using nlohmann::ordered_json;
    auto number = [](std::optional<double> v) -> ordered_json {
      if (!v || !std::isfinite(*v)) return nullptr;
      return *v;
    };
    ordered_json j;
    auto rate_fields = [&](const std::string& name, const std::optional<Rate>& r) {
      j[name] = number(r ? std::optional(r->median) : std::nullopt);
      j[name + "_best"] = number(r ? std::optional(r->best) : std::nullopt);
      j[name + "_cpu_ms_per_image"] = number(r ? std::optional(r->cpu_ms_per_image) : std::nullopt);
    };
    rate_fields("coload", coload_rate);
    rate_fields("pytorch", pytorch.rate);
    rate_fields("decode_only", decode_only);
    j["ratios"] = {{"coload/pytorch", number(r_pytorch)}, {"coload/decode_only", number(r_decode)}};
    if (args.processes) {
      rate_fields("coload_processes", processes_rate);
      rate_fields("coload_processes_fresh", fresh_rate);
      j["ratios_processes"] = {{"processes/threads", number(p_threads)},
                               {"processes_fresh/pytorch", number(p_pytorch)}};
    }
    j["ratios_cpu"] = {{"coload/pytorch", number(c_pytorch)}, {"coload/decode_only", number(c_decode)}};
    j["images"] = images;
    j["epochs"] = args.epochs;
    j["batch_size"] = kBatch;
    // A number as before; "auto" under --workers auto.
    j["num_workers"] = args.workers == coload::auto_workers ? ordered_json("auto") : ordered_json(args.workers);
    if (tuning.automatic) {
      j["auto_workers"] = {{"workers", tuning.workers}, {"max_workers", tuning.max_workers},
                           {"grown", tuning.grown}, {"shrunk", tuning.shrunk},
                           {"windows", tuning.windows}, {"min_seen", tuning.min_seen},
                           {"max_seen", tuning.max_seen}};
    }
    j["file_cache_warm"] = true;
    j["loadavg_before"] = load_before;
    j["loadavg_after"] = load_after;
    if (split) {
      j["breakdown_ms_per_image"] = {{"read", number(split->read_ms)},
                                     {"full_decode", number(split->full_decode_ms)},
                                     {"scaled_decode", number(split->scaled_decode_ms)},
                                     {"transform", number(split->transform_ms)},
                                     {"fresh_batch", number(split->fresh_batch_ms)}};
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  std::printf("image_pipeline: %lld images under %s, train transform (RandomResizedCrop 224, "
              "flip, ToTensor, Normalize),\nbatch %lld, %d workers; file cache warm (every file "
              "read once before timing: %.1f MiB);\n1 warm-up + %d timed epochs each, median "
              "images/s; load average %s before, %s after\n\n",
              static_cast<long long>(images), args.root.c_str(), static_cast<long long>(kBatch),
              kWorkers, static_cast<double>(cached_bytes) / (1 << 20), args.epochs,
              load_before.c_str(), load_after.c_str());
  std::printf("%-12s %10s %10s %12s\n", "pipeline", "images/s", "best", "CPU ms/img");
  auto row = [](const char* name, const std::optional<Rate>& r, const std::string& note) {
    if (!r) {
      std::printf("%-12s %10s %10s %12s   %s\n", name, "null", "-", "-", note.c_str());
      return;
    }
    std::printf("%-12s %10.1f %10.1f %12.2f   %s\n", name, r->median, r->best,
                r->cpu_ms_per_image, note.c_str());
  };
  row("coload", coload_rate,
      "vision::ImagePipeline + DataLoader, num_workers " + workers_name(args.workers) +
          (tuning.automatic ? " (ended at " + std::to_string(tuning.workers) + " of " +
                                  std::to_string(tuning.max_workers) + ": " +
                                  std::to_string(tuning.grown) + " added, " +
                                  std::to_string(tuning.shrunk) + " removed)"
                            : std::string()));
  row("pytorch", pytorch.rate,
      pytorch.rate ? "DataLoader + ImageFolder, " + pytorch.note : pytorch.note);
  row("decode_only", decode_only, "read + tjDecompress2 full-size RGB, 2 threads");
  if (args.processes) {
    // NOTE: its CPU column counts the parent process only, not the worker processes.
    row("processes", processes_rate, "the same, executor = processes, persistent_workers");
    row("proc_fresh", fresh_rate, "executor = processes, forked anew each epoch (as PyTorch)");
  }

  auto status = [](std::optional<double> v, double target) {
    return !v ? "unknown" : *v >= target ? "met" : "MISSED";
  };
  std::printf("\n%-22s %8s %8s  %s\n", "ratio", "value", "target", "status");
  char v1[32] = "null", v2[32] = "null";
  if (r_pytorch) std::snprintf(v1, sizeof v1, "%.2f", *r_pytorch);
  if (r_decode) std::snprintf(v2, sizeof v2, "%.2f", *r_decode);
  std::printf("%-22s %8s %8s  %s%s\n", "coload / pytorch", v1, ">= 3", status(r_pytorch, kTargetPytorch),
              r_pytorch && *r_pytorch >= kTargetPytorch && *r_pytorch < kAimPytorch
                  ? " (aim: 4)"
                  : "");
  std::printf("%-22s %8s %8s  %s\n", "coload / decode_only", v2, ">= 0.8",
              status(r_decode, kTargetDecode));
  if (args.processes) {
    char v3[32] = "null", v4[32] = "null";
    if (p_threads) std::snprintf(v3, sizeof v3, "%.2f", *p_threads);
    if (p_pytorch) std::snprintf(v4, sizeof v4, "%.2f", *p_pytorch);
    std::printf("%-22s %8s %8s  %s\n", "processes / threads", v3, ">= 0.9",
                status(p_threads, 0.9));
    std::printf("%-22s %8s %8s  %s\n", "proc_fresh / pytorch", v4, ">= 3",
                status(p_pytorch, 3.0));
  }
  char c1[32] = "null", c2[32] = "null";
  if (c_pytorch) std::snprintf(c1, sizeof c1, "%.2f", *c_pytorch);
  if (c_decode) std::snprintf(c2, sizeof c2, "%.2f", *c_decode);
  std::printf("by CPU time per image (steadier under load): coload / pytorch %s, "
              "coload / decode_only %s\n",
              c1, c2);

  if (split) {
    // All figures here are CPU time, so they hold whatever the machine's load.
    const double work = split->read_ms + split->transform_ms;
    std::printf("\nper image, CPU ms on 1 thread: read %.3f, full decode %.3f, decode at the "
                "transform's DCT scale %.3f\n(mean denominator %.2f), whole transform %.3f, so "
                "crop+resize+flip+normalize %.3f\n",
                split->read_ms, split->full_decode_ms, split->scaled_decode_ms,
                split->mean_scale, split->transform_ms,
                split->transform_ms - split->scaled_decode_ms);
    if (coload_rate) {
      std::printf("coload spends %.3f CPU ms per image: read + transform %.3f, the rest %.3f "
                  "(loader: driver, io, batching, threads)\n",
                  coload_rate->cpu_ms_per_image, work, coload_rate->cpu_ms_per_image - work);
      std::printf("coload's CPU per image by thread, all epochs: driver %.3f, consumer %.3f, "
                  "workers and the rest %.3f (total %.3f)\n",
                  threads_split.driver_ms, threads_split.consumer_ms,
                  threads_split.total_ms - threads_split.driver_ms - threads_split.consumer_ms,
                  threads_split.total_ms);
      std::printf("of which a fresh batch tensor's page faults (alloc + first touch + free) "
                  "account for about %.3f\n",
                  split->fresh_batch_ms);
    }
    if (decode_only) {
      std::printf("bound on coload / decode_only from CPU work alone: %.2f (full decode + read "
                  "%.3f vs read + transform %.3f)\n",
                  (split->full_decode_ms + split->read_ms) / work,
                  split->full_decode_ms + split->read_ms, work);
    }
  }
  return 0;
}
