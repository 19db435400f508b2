// The CUDA backend of the device stage: a thin layer over the CUDA runtime (no kernels).
// Built only when Meson finds the CUDA Toolkit, as the plugin libcoload_cuda.so (cuda_plugin.hpp).

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "coload/config.hpp"
#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/device/backend.hpp"
#include "cuda_plugin.hpp"

namespace coload::detail {

int cuda_device_count(std::string* error) noexcept {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (error) *error = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return -1;
  }
  return n;
}

int cuda_current_device() noexcept {
  int d = 0;
  return cudaGetDevice(&d) == cudaSuccess ? d : 0;
}

namespace {

/// Sets the calling thread's current device for a scope, and restores the one it had.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaSetDevice(index);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// Runs on_done() functions on a thread of its own: a cudaLaunchHostFunc callback may not call
/// CUDA, so it only hands the function on. Held by the thread and by each queued item, so it
/// outlives a backend destroyed from one of its own functions.
struct Dispatcher : std::enable_shared_from_this<Dispatcher> {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::thread thread;

  struct Item {
    std::shared_ptr<Dispatcher> dispatcher;
    std::function<void()> fn;
  };

  static void CUDART_CB trampoline(void* arg) {
    std::unique_ptr<Item> item(static_cast<Item*>(arg));
    std::lock_guard lock(item->dispatcher->mutex);
    item->dispatcher->queue.push_back(std::move(item->fn));
    item->dispatcher->changed.notify_one();
  }

  void start() {
    thread = std::thread([self = shared_from_this()] { self->run(); });
  }

  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> fn = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      try {
        fn();
      } catch (const std::exception& e) {
        detail::warn(std::string("CUDA backend: an on_done function threw: ") + e.what(),
                     "coload: ");
      } catch (...) {
        detail::warn("CUDA backend: an on_done function threw", "coload: ");
      }
      fn = nullptr;
      lock.lock();
    }
  }

  void finish() {
    {
      std::lock_guard lock(mutex);
      stop = true;
      changed.notify_all();
    }
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // destroyed from one of its own functions: it ends after the queue
    } else {
      thread.join();
    }
  }
};

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    // NOTE: the loader's user chose the thread's current device (a rank's own GPU): keep it.
    DeviceGuard guard(index_);
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, index_), "cudaDeviceGetDefaultMemPool");
    // Keep freed blocks in the pool: batches of the same size reuse them instead of going
    // back to the driver every time.
    std::uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    // The copy stream's completion callbacks wait on a stream of their own (see on_done);
    // without it (or its event) they run on the copy stream as before.
    if (cudaStreamCreateWithFlags(&callbacks_, cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      callbacks_ = nullptr;
    } else if (cudaEventCreateWithFlags(&callback_event_, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      callback_event_ = nullptr;
    }
    dispatcher_ = std::make_shared<Dispatcher>();
    dispatcher_->start();
  }

  ~CudaBackend() override {
    DeviceGuard guard(index_);
    // Every queued callback has handed its function on once the streams have run.
    cudaStreamSynchronize(copy_);
    if (callbacks_) cudaStreamSynchronize(callbacks_);
    std::vector<cudaStream_t> streams;
    {
      std::lock_guard lock(mutex_);
      streams.swap(streams_);
    }
    for (cudaStream_t s : streams) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    dispatcher_->finish();
    if (callback_event_) cudaEventDestroy(callback_event_);
    if (callbacks_) cudaStreamDestroy(callbacks_);
    cudaStreamDestroy(copy_);
  }

  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index_)); }
  std::string name() const override { return "cuda:" + std::to_string(index_); }

  void* alloc_pinned(std::size_t nbytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, nbytes, cudaHostAllocPortable), "cudaHostAlloc(" + std::to_string(nbytes) + " bytes)");
    return p;
  }
  void free_pinned(void* p, std::size_t) override { check(cudaFreeHost(p), "cudaFreeHost"); }
  void register_host(void* p, std::size_t nbytes) override {
    check(cudaHostRegister(p, nbytes, cudaHostRegisterPortable), "cudaHostRegister(" + std::to_string(nbytes) + " bytes)");
  }
  void unregister_host(void* p) override { check(cudaHostUnregister(p), "cudaHostUnregister"); }
  bool is_pinned(const void* p) const override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // clears the error a pageable pointer may leave
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  }

  DeviceStream copy_stream() override { return DeviceStream{copy_}; }
  DeviceStream create_stream() override {
    DeviceGuard guard(index_);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    std::lock_guard lock(mutex_);
    streams_.push_back(s);
    return DeviceStream{s};
  }
  void destroy_stream(DeviceStream stream) override {
    auto s = static_cast<cudaStream_t>(stream.handle);
    {
      std::lock_guard lock(mutex_);
      std::erase(streams_, s);
    }
    check(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  void synchronize(DeviceStream stream) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)), "cudaStreamSynchronize");
  }

  void* alloc_device(std::size_t nbytes, DeviceStream stream) override {
    DeviceGuard guard(index_);
    void* p = nullptr;
    check(cudaMallocAsync(&p, nbytes, static_cast<cudaStream_t>(stream.handle)),
          "cudaMallocAsync(" + std::to_string(nbytes) + " bytes)");
    return p;
  }
  void free_device(void* p, DeviceStream stream) override {
    check(cudaFreeAsync(p, static_cast<cudaStream_t>(stream.handle)), "cudaFreeAsync");
  }
  void copy_to_device_async(void* dst, const void* src, std::size_t nbytes, DeviceStream stream) override {
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream.handle)),
          "cudaMemcpyAsync(" + std::to_string(nbytes) + " bytes, host to device)");
  }

  DeviceEvent record(DeviceStream stream) override {
    DeviceGuard guard(index_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t r = cudaEventRecord(e, static_cast<cudaStream_t>(stream.handle));
    if (r != cudaSuccess) {
      cudaEventDestroy(e);
      check(r, "cudaEventRecord");
    }
    return DeviceEvent{e, 0};
  }
  void destroy_event(DeviceEvent event) override {
    check(cudaEventDestroy(static_cast<cudaEvent_t>(event.handle)), "cudaEventDestroy");
  }
  void stream_wait(DeviceStream stream, DeviceEvent event) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), static_cast<cudaEvent_t>(event.handle), 0),
          "cudaStreamWaitEvent");
  }
  bool event_done(DeviceEvent event) const override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event.handle));
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return false;
  }
  void on_done(DeviceStream stream, std::function<void()> fn) override {
    const auto target = static_cast<cudaStream_t>(stream.handle);
    if (target == copy_ && callback_event_) {
      // NOTE: a host function holds its stream until it has returned, which is the CUDA
      // driver's callback thread's latency after the work before it: on the copy stream every
      // batch's copy waited that long behind the previous batch's completion. The callback
      // waits on a stream of its own instead, for an event of the copy stream. One event
      // serves every callback (a wait takes the record made before it); the lock keeps record,
      // wait and launch together, so callbacks keep the copy stream's order.
      DeviceGuard guard(index_);
      std::lock_guard lock(callback_mutex_);
      if (cudaEventRecord(callback_event_, copy_) == cudaSuccess &&
          cudaStreamWaitEvent(callbacks_, callback_event_, 0) == cudaSuccess) {
        launch(callbacks_, std::move(fn));
        return;
      }
      cudaGetLastError();  // then on the copy stream itself, as before: slower, never lost
    }
    launch(target, std::move(fn));
  }

 private:
  void launch(cudaStream_t stream, std::function<void()> fn) {
    auto* item = new Dispatcher::Item{dispatcher_, std::move(fn)};
    const cudaError_t r = cudaLaunchHostFunc(stream, &Dispatcher::trampoline, item);
    if (r != cudaSuccess) {
      delete item;
      check(r, "cudaLaunchHostFunc");
    }
  }

  void check(cudaError_t e, const std::string& what) const {
    if (e == cudaSuccess) return;
    throw RuntimeError("coload CUDA backend (cuda:" + std::to_string(index_) + "): " + what +
                       " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }

  const int index_;
  cudaStream_t copy_ = nullptr;
  cudaStream_t callbacks_ = nullptr;        // where the copy stream's on_done() callbacks wait
  cudaEvent_t callback_event_ = nullptr;    // recorded on copy_ for each of them
  std::mutex callback_mutex_;               // record, wait and launch as one
  std::shared_ptr<Dispatcher> dispatcher_;
  std::mutex mutex_;
  std::vector<cudaStream_t> streams_;  // from create_stream()
};

}  // namespace

std::shared_ptr<DeviceBackend> make_cuda_backend_unchecked(int device_index) {
  return std::make_shared<CudaBackend>(device_index);
}

}  // namespace coload::detail

extern "C" __attribute__((visibility("default"))) const coload::detail::CudaPlugin* coload_cuda_plugin() {
  static const coload::detail::CudaPlugin plugin{COLOAD_VERSION, &coload::detail::cuda_device_count,
                                                 &coload::detail::cuda_current_device,
                                                 &coload::detail::make_cuda_backend_unchecked};
  return &plugin;
}
