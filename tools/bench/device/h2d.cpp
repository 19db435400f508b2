// h2d: the device stage's host-to-device throughput, and the consumer's waiting time.
//
//   h2d [--batches N] [--batch-size B] [--compute-ms MS] [--device I] [--json] [--no-pytorch]
//
// Needs a CUDA device (and coload built with the CUDA Toolkit against a CUDA libtorch); without
// one it says why and exits 0 (with --json: {"skipped": true, "reason": "..."}).
//
// 1. Throughput: N batches of B x 3 x 224 x 224 float32 (38.5 MB at B = 64) from pinned slabs
//    to the device through DeviceStage (3 copies in flight, each resumed on the driver), against
//    a bare loop of N asynchronous copies from one pinned buffer on the backend's copy stream
//    (cudaMemcpyAsync, then one synchronise). Ratio = stage / bare; target >= 0.9. Also printed,
//    not judged: the same bare loop turning over 4 pinned and 4 device buffers, as the stage does.
// 2. Waiting time: a producer thread collates each batch into a pinned slab (a memcpy from a
//    source tensor, as default_collate does) and sends it through the stage; the consumer takes
//    batches from a queue of 2, makes its stream wait, and "computes" for --compute-ms (a host
//    sleep standing in for a step the host waits on). Reported: the consumer's mean wait per
//    step, against PyTorch's DataLoader(pin_memory=True, num_workers=2) +
//    .to(device, non_blocking=True) on the same step (h2d_pytorch.py, via /usr/bin/python3).

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../bench_support.hpp"
#include "coload/collate/batch_allocator.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/device.hpp"

#ifndef COLOAD_BENCH_DIR
#error "COLOAD_BENCH_DIR (the directory of h2d_pytorch.py) must be defined by the build"
#endif

namespace {

using namespace coload;
using Clock = std::chrono::steady_clock;
constexpr const char* kPython = "/usr/bin/python3";

struct Args {
  int batches = 200;
  int batch_size = 64;
  double compute_ms = 20.0;
  int device = 0;
  bool json = false;
  bool pytorch = true;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Continues the awaiting coroutine on `ctx`'s thread.
struct OnDriver {
  asio::io_context& ctx;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) const { asio::post(ctx, [h] { h.resume(); }); }
  void await_resume() const noexcept {}
};

/// stage.copy(batch), called on the driver thread as the stage asks.
Task<DeviceBatch<at::Tensor>> copy_on_driver(asio::io_context& ctx, DeviceStage& stage, at::Tensor batch) {
  co_await OnDriver{ctx};
  co_return co_await stage.copy(std::move(batch));
}

/// A driver thread running an io_context until destroyed.
struct Driver {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard = asio::make_work_guard(ctx);
  std::thread thread{[this] { ctx.run(); }};
  ~Driver() {
    guard.reset();
    thread.join();
  }
};

at::Tensor pinned_batch(PinnedPool& pool, const std::vector<std::int64_t>& shape, const at::Tensor* source) {
  auto lease = pool.begin_batch();
  BatchAllocatorScope scope(lease.get());
  at::Tensor t = empty_batch_tensor(shape, at::TensorOptions().dtype(at::kFloat));
  if (source) t.copy_(*source);
  return t;
}

struct Throughput {
  double stage_gbps = 0, bare_gbps = 0;
  double bare_rotating_gbps = 0;  // informational: the bare loop over as many buffers as the stage
  int rotating_buffers = 0;
};

Throughput measure_throughput(const std::shared_ptr<DeviceBackend>& backend, const Args& a,
                              const std::vector<std::int64_t>& shape, std::size_t bytes) {
  Throughput r;
  const DeviceStream stream = backend->copy_stream();
  {  // bare: one pinned buffer, one device buffer, N asynchronous copies, one synchronise
    void* host = backend->alloc_pinned(bytes);
    std::memset(host, 1, bytes);
    void* dev = backend->alloc_device(bytes, stream);
    backend->copy_to_device_async(dev, host, bytes, stream);  // warm-up
    backend->synchronize(stream);
    const auto t0 = Clock::now();
    for (int i = 0; i < a.batches; ++i) backend->copy_to_device_async(dev, host, bytes, stream);
    backend->synchronize(stream);
    r.bare_gbps = static_cast<double>(bytes) * a.batches / seconds_since(t0) / 1e9;
    backend->free_device(dev, stream);
    backend->synchronize(stream);
    backend->free_pinned(host, bytes);
  }
  constexpr int kInFlight = 3;
  {  // the stage: 3 producers, each copying its share serially: 3 copies in flight
    PinnedPool pool(backend, kInFlight + 1);
    Driver driver;
    DeviceStage stage(backend, driver.ctx);
    for (int i = 0; i < kInFlight + 1; ++i) {  // warm-up: slabs allocated and touched once
      at::Tensor src = at::ones(shape, at::kFloat);
      sync_wait(copy_on_driver(driver.ctx, stage, pinned_batch(pool, shape, &src)));
    }
    const auto t0 = Clock::now();
    std::vector<std::thread> producers;
    for (int p = 0; p < kInFlight; ++p) {
      producers.emplace_back([&, p] {
        for (int i = p; i < a.batches; i += kInFlight) {
          DeviceBatch<at::Tensor> d = sync_wait(copy_on_driver(driver.ctx, stage, pinned_batch(pool, shape, nullptr)));
        }
      });
    }
    for (auto& t : producers) t.join();
    r.stage_gbps = static_cast<double>(bytes) * a.batches / seconds_since(t0) / 1e9;
    backend->synchronize(stream);
  }
  {  // informational: the bare loop, but over kInFlight + 1 pinned and device buffers in turn, as
     // the stage's batches come from that many pinned slabs into as many device blocks (after
     // the stage, whose start this leaves as it was)
    std::vector<void*> hosts, devs;
    for (int k = 0; k < kInFlight + 1; ++k) {
      hosts.push_back(backend->alloc_pinned(bytes));
      std::memset(hosts.back(), 1, bytes);
      devs.push_back(backend->alloc_device(bytes, stream));
      backend->copy_to_device_async(devs.back(), hosts.back(), bytes, stream);  // warm-up
    }
    backend->synchronize(stream);
    const auto t0 = Clock::now();
    for (int i = 0; i < a.batches; ++i) {
      const auto k = static_cast<std::size_t>(i % (kInFlight + 1));
      backend->copy_to_device_async(devs[k], hosts[k], bytes, stream);
    }
    backend->synchronize(stream);
    r.bare_rotating_gbps = static_cast<double>(bytes) * a.batches / seconds_since(t0) / 1e9;
    r.rotating_buffers = kInFlight + 1;
    for (std::size_t k = 0; k < hosts.size(); ++k) {
      backend->free_device(devs[k], stream);
      backend->synchronize(stream);
      backend->free_pinned(hosts[k], bytes);
    }
  }
  return r;
}

/// The consumer's mean wait per step (ms) with a synthetic compute step.
double measure_wait(const std::shared_ptr<DeviceBackend>& backend, const Args& a,
                    const std::vector<std::int64_t>& shape) {
  constexpr std::size_t kQueue = 2;
  PinnedPool pool(backend, kQueue + 3);
  Driver driver;
  DeviceStage stage(backend, driver.ctx);
  const at::Tensor source = at::rand(shape, at::kFloat);
  std::mutex m;
  std::condition_variable cv;
  std::deque<DeviceBatch<at::Tensor>> queue;
  std::thread producer([&] {
    for (int i = 0; i < a.batches; ++i) {
      DeviceBatch<at::Tensor> d = sync_wait(copy_on_driver(driver.ctx, stage, pinned_batch(pool, shape, &source)));
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return queue.size() < kQueue; });
      queue.push_back(std::move(d));
      cv.notify_all();
    }
  });
  const DeviceStream consumer = backend->create_stream();
  double waited = 0;
  for (int i = 0; i < a.batches; ++i) {
    const auto t0 = Clock::now();
    std::optional<DeviceBatch<at::Tensor>> d;
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return !queue.empty(); });
      d.emplace(std::move(queue.front()));
      queue.pop_front();
      cv.notify_all();
    }
    d->wait(consumer);
    if (i > 0) waited += seconds_since(t0);  // the first step includes the pipeline's start
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.compute_ms));
  }
  producer.join();
  backend->synchronize(consumer);
  backend->destroy_stream(consumer);
  return waited * 1e3 / std::max(1, a.batches - 1);
}

struct PyWait {
  std::optional<double> wait_ms;
  std::string note;
};

PyWait run_pytorch(const Args& a) {
  if (!a.pytorch) return {std::nullopt, "skipped (--no-pytorch)"};
  if (::access(kPython, X_OK) != 0) return {std::nullopt, std::string(kPython) + " not found"};
  const std::string script = std::string(COLOAD_BENCH_DIR) + "/h2d_pytorch.py";
  const std::string cmd = std::string(kPython) + " " + bench::shell_quote(script) + " --json --batches " +
                          std::to_string(a.batches) + " --batch-size " + std::to_string(a.batch_size) +
                          " --compute-ms " + std::to_string(a.compute_ms) + " --device " + std::to_string(a.device);
  std::fprintf(stderr, "h2d: running %s\n", cmd.c_str());
  const bench::PeerOutput peer = bench::run_peer(cmd);
  if (!peer.started) return {std::nullopt, peer.error};
  if (peer.status != 0) return {std::nullopt, "h2d_pytorch.py failed (status " + std::to_string(peer.status) + ")"};
  const auto v = bench::json_double(peer.last_line, "wait_ms");
  if (!v) return {std::nullopt, bench::json_field(peer.last_line, "error").value_or("no result: " + peer.last_line)};
  return {v, "torch " + bench::json_field(peer.last_line, "torch_version").value_or("?")};
}

std::string json_string(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"h2d: the device stage's host-to-device throughput against bare copies, and the "
               "consumer's waiting time against PyTorch's pinned DataLoader (needs CUDA)"};
  app.add_option("--batches", a.batches, "batches per measurement (below 1 runs 1)")
      ->capture_default_str();
  app.add_option("--batch-size", a.batch_size, "images of 3 x 224 x 224 float32 per batch (below 1 is 1)")
      ->capture_default_str();
  app.add_option("--compute-ms", a.compute_ms, "the consumer's simulated step, in milliseconds")
      ->capture_default_str();
  app.add_option("--device", a.device, "CUDA device index")->capture_default_str();
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag_callback("--no-pytorch", [&a] { a.pytorch = false; }, "skip the PyTorch measurement");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  a.batches = std::max(1, a.batches);
  a.batch_size = std::max(1, a.batch_size);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);

  if (!cuda_available()) {
    const std::string why = cuda_unavailable_reason();
    if (a.json) {
      std::printf("{\"skipped\": true, \"reason\": %s}\n", json_string(why).c_str());
    } else {
      std::printf("h2d: skipped: needs a CUDA device: %s\n", why.c_str());
    }
    return 0;
  }

  std::shared_ptr<DeviceBackend> backend;
  try {
    backend = make_cuda_backend(a.device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h2d: %s\n", e.what());
    return 1;
  }
  const std::vector<std::int64_t> shape{a.batch_size, 3, 224, 224};
  const std::size_t bytes = static_cast<std::size_t>(a.batch_size) * 3 * 224 * 224 * sizeof(float);
  const Throughput t = measure_throughput(backend, a, shape, bytes);
  const double ratio = t.stage_gbps / t.bare_gbps;
  const double wait_ms = measure_wait(backend, a, shape);
  const PyWait py = run_pytorch(a);

  if (a.json) {
    std::printf(
        "{\"device\": %s, \"batches\": %d, \"batch_bytes\": %zu, \"stage_gbps\": %s, \"bare_gbps\": %s, "
        "\"ratio\": %s, \"bare_rotating_gbps\": %s, \"rotating_buffers\": %d, \"compute_ms\": %s, \"wait_ms\": %s, \"pytorch_wait_ms\": %s, \"pytorch_note\": %s}\n",
        json_string(backend->name()).c_str(), a.batches, bytes, bench::json_number(t.stage_gbps).c_str(),
        bench::json_number(t.bare_gbps).c_str(), bench::json_number(ratio).c_str(),
        bench::json_number(t.bare_rotating_gbps).c_str(), t.rotating_buffers,
        bench::json_number(a.compute_ms).c_str(), bench::json_number(wait_ms).c_str(),
        bench::json_number(py.wait_ms).c_str(), json_string(py.note).c_str());
  } else {
    std::printf("h2d on %s, %d batches of %zu bytes\n", backend->name().c_str(), a.batches, bytes);
    std::printf("  stage           %8.2f GB/s\n", t.stage_gbps);
    std::printf("  bare memcpy     %8.2f GB/s\n", t.bare_gbps);
    std::printf("  ratio           %8.3f   (target >= 0.9)\n", ratio);
    std::printf("  bare, %d buffers %7.2f GB/s (informational: the buffers the stage turns over)\n",
                t.rotating_buffers, t.bare_rotating_gbps);
    std::printf("  consumer wait   %8.3f ms/step with a %.1f ms compute step\n", wait_ms, a.compute_ms);
    if (py.wait_ms) {
      std::printf("  pytorch wait    %8.3f ms/step (%s)\n", *py.wait_ms, py.note.c_str());
    } else {
      std::printf("  pytorch wait         n/a  (%s)\n", py.note.c_str());
    }
  }
  return 0;
}
