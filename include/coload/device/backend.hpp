#pragma once
// DeviceBackend: what the device stage needs of a device runtime; HostDeviceBackend, which runs
// the stage's logic on the host (tests, machines without a GPU); the CUDA backend's factory.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// NOTE: no cuda_runtime.h here: the public headers compile without the CUDA Toolkit.

namespace coload {

/// An opaque stream handle (CUDA: a cudaStream_t; host backend: one of its FIFO threads).
/// A default-constructed DeviceStream is the device's default stream (CUDA: the legacy default
/// stream, on which libtorch runs unless told otherwise; host backend: a FIFO of its own).
struct DeviceStream {
  void* handle = nullptr;
  friend bool operator==(DeviceStream, DeviceStream) = default;
};

/// An opaque event handle: marks a point in a stream's work (CUDA: a cudaEvent_t; host
/// backend: a stream and the count of its operations the event waits for).
struct DeviceEvent {
  void* handle = nullptr;
  std::uint64_t value = 0;
  friend bool operator==(DeviceEvent, DeviceEvent) = default;
};

/// The device runtime under the device stage: pinned host memory, streams, stream-ordered
/// device memory, asynchronous copies, events and host callbacks. Thread-safe; held by
/// std::shared_ptr (whatever still references its memory keeps it alive).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  /// The device that tensors made by wrap_device() are on.
  virtual at::Device device() const = 0;
  /// A short name for messages ("cuda:0", "host").
  virtual std::string name() const = 0;

  // --- pinned (page-locked) host memory ----------------------------------------------------
  /// `nbytes` bytes of page-locked host memory, 64-byte aligned at least; throws on failure.
  virtual void* alloc_pinned(std::size_t nbytes) = 0;
  /// Frees memory from alloc_pinned(); `nbytes` is the size it was asked for.
  virtual void free_pinned(void* p, std::size_t nbytes) = 0;
  /// Page-locks host memory allocated elsewhere (a shared-memory arena) until
  /// unregister_host(p).
  virtual void register_host(void* p, std::size_t nbytes) = 0;
  virtual void unregister_host(void* p) = 0;
  /// True when `p` lies in page-locked memory known to this backend (alloc_pinned or
  /// register_host).
  virtual bool is_pinned(const void* p) const = 0;

  // --- streams ---------------------------------------------------------------------------------
  /// The backend's own copy stream (non-blocking), used by the device stage.
  virtual DeviceStream copy_stream() = 0;
  /// A new stream (a consumer's, in tests and benchmarks); destroy it with destroy_stream().
  virtual DeviceStream create_stream() = 0;
  /// Destroys a stream from create_stream() once its queued work has run.
  virtual void destroy_stream(DeviceStream stream) = 0;
  /// Blocks the calling thread until all work queued on `stream` has run. For shutdown,
  /// tests and benchmarks: the stage itself never calls it.
  virtual void synchronize(DeviceStream stream) = 0;

  // --- device memory and copies --------------------------------------------------------------
  /// `nbytes` bytes of device memory, usable by work queued on `stream` from now on
  /// (stream-ordered; CUDA: cudaMallocAsync); throws on failure.
  virtual void* alloc_device(std::size_t nbytes, DeviceStream stream) = 0;
  /// Frees device memory once the work queued on `stream` so far has run (stream-ordered).
  virtual void free_device(void* p, DeviceStream stream) = 0;
  /// Queues a copy of `nbytes` bytes from host memory `src` to device memory `dst`.
  virtual void copy_to_device_async(void* dst, const void* src, std::size_t nbytes,
                                    DeviceStream stream) = 0;

  // --- events and callbacks --------------------------------------------------------------------
  /// An event that completes when the work queued on `stream` so far has run. Release it with
  /// destroy_event().
  virtual DeviceEvent record(DeviceStream stream) = 0;
  virtual void destroy_event(DeviceEvent event) = 0;
  /// Makes later work on `stream` wait for `event` (the host does not wait).
  virtual void stream_wait(DeviceStream stream, DeviceEvent event) = 0;
  /// True once `event` has completed. Never blocks.
  virtual bool event_done(DeviceEvent event) const = 0;
  /// Runs `fn` on a thread of the backend's after all work queued on `stream` so far has run.
  /// `fn` may release memory and call this backend's non-blocking functions (CUDA: it does not
  /// run inside the cudaLaunchHostFunc callback, which only hands it on), but it must be short
  /// and must never block on the device (no synchronize()).
  virtual void on_done(DeviceStream stream, std::function<void()> fn) = 0;

  /// A tensor over device memory `p` (contiguous when `strides` is empty) whose storage owns
  /// `context`: `context_deleter(context)` runs when the storage dies. CUDA: a tensor on the
  /// CUDA device; host backend: a CPU tensor.
  virtual at::Tensor wrap_device(void* p, at::IntArrayRef sizes, at::IntArrayRef strides,
                                 at::ScalarType dtype, void* context,
                                 void (*context_deleter)(void*));
};

/// A device backend that runs on the host. Each stream is a FIFO thread executing its
/// queued operations in order; "device memory" is malloc'd host memory; an event completes
/// when its stream's FIFO has reached it; pinned memory is malloc'd and tracked.
///
/// Tests use its hooks to make the device slow deterministically (pause()/resume() a stream:
/// operations queue but do not run) and its counters to check for leaks. Destruction resumes
/// every stream, runs what is queued, and joins the threads.
class HostDeviceBackend final : public DeviceBackend {
 public:
  HostDeviceBackend();
  ~HostDeviceBackend() override;
  HostDeviceBackend(const HostDeviceBackend&) = delete;
  HostDeviceBackend& operator=(const HostDeviceBackend&) = delete;

  at::Device device() const override;
  std::string name() const override;
  void* alloc_pinned(std::size_t nbytes) override;
  void free_pinned(void* p, std::size_t nbytes) override;
  void register_host(void* p, std::size_t nbytes) override;
  void unregister_host(void* p) override;
  bool is_pinned(const void* p) const override;
  DeviceStream copy_stream() override;
  DeviceStream create_stream() override;
  void destroy_stream(DeviceStream stream) override;
  /// Waits until `stream` is idle: its queue is empty, including what its own operations
  /// queued on it meanwhile. Throws std::logic_error when `stream` is paused with work queued
  /// (it would never return).
  void synchronize(DeviceStream stream) override;
  void* alloc_device(std::size_t nbytes, DeviceStream stream) override;
  void free_device(void* p, DeviceStream stream) override;
  void copy_to_device_async(void* dst, const void* src, std::size_t nbytes,
                            DeviceStream stream) override;
  DeviceEvent record(DeviceStream stream) override;
  void destroy_event(DeviceEvent event) override;
  void stream_wait(DeviceStream stream, DeviceEvent event) override;
  bool event_done(DeviceEvent event) const override;
  void on_done(DeviceStream stream, std::function<void()> fn) override;

  // --- test hooks ------------------------------------------------------------------------------
  /// Stops `stream` from running its queued operations (the one running finishes) until
  /// resume(). Operations still queue.
  void pause(DeviceStream stream);
  void resume(DeviceStream stream);
  /// Operations queued on `stream` that have not run yet.
  std::size_t queued(DeviceStream stream) const;
  /// Copies executed so far (all streams), and their bytes.
  std::size_t copies_executed() const noexcept;
  std::size_t bytes_copied() const noexcept;
  /// Device allocations not yet freed (a free counts once its stream ran it).
  std::int64_t live_device_allocations() const noexcept;
  /// Bytes from alloc_pinned() not yet freed.
  std::int64_t live_pinned_bytes() const noexcept;
  /// Pinned allocations made so far (alloc_pinned calls).
  std::size_t pinned_allocations() const noexcept;
  /// Ranges registered with register_host() and not yet unregistered.
  std::size_t registered_ranges() const;

 private:
  struct Stream;
  std::shared_ptr<Stream> stream_of(DeviceStream s) const;

  mutable std::mutex mutex_;  // guards streams_, pinned_ and registered_
  std::vector<std::shared_ptr<Stream>> streams_;
  Stream* copy_stream_ = nullptr;
  Stream* default_stream_ = nullptr;  // what DeviceStream{} names
  struct Range {
    const char* begin;
    std::size_t size;
  };
  std::vector<Range> pinned_;
  std::vector<Range> registered_;
  struct Counters;
  // NOTE: shared with the queued operations, which may outlive the backend on a stream thread
  // that dropped the last reference to it.
  std::shared_ptr<Counters> counters_;
};

/// The CUDA backend for device `device_index` (a non-blocking copy stream, stream-ordered
/// device memory from the device's default pool with a raised release threshold).
///
/// Throws std::runtime_error saying which is missing, checked in this order: coload was built
/// without the CUDA Toolkit; libtorch was built without CUDA; the machine has no CUDA device
/// (with the runtime's error) or `device_index` is out of range.
/// `device_index = -1` takes the calling thread's current device (under torchrun, the one the
/// rank selected). The backend never changes the calling thread's current device.
std::shared_ptr<DeviceBackend> make_cuda_backend(int device_index = -1);

/// True when make_cuda_backend(0) can succeed: coload was built with the CUDA Toolkit,
/// libtorch has CUDA, and a CUDA device exists. Never throws.
bool cuda_available() noexcept;

/// Why cuda_available() is false (the message make_cuda_backend(0) would throw), or empty.
std::string cuda_unavailable_reason();

}  // namespace coload
