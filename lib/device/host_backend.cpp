// HostDeviceBackend: the device stage's backend on the host (FIFO threads for streams).

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <thread>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/device/backend.hpp"

namespace coload {

// --- DeviceBackend -------------------------------------------------------------------------------

at::Tensor DeviceBackend::wrap_device(void* p, at::IntArrayRef sizes, at::IntArrayRef strides,
                                      at::ScalarType dtype, void* context,
                                      void (*context_deleter)(void*)) {
  auto maker = at::for_blob(p, sizes);
  maker.context(context, context_deleter)
      .options(at::TensorOptions().dtype(dtype).device(device()));
  if (!strides.empty()) maker.strides(strides);
  return maker.make_tensor();
}

// --- HostDeviceBackend ---------------------------------------------------------------------------

struct HostDeviceBackend::Counters {
  std::atomic<std::size_t> copies{0}, bytes_copied{0}, pinned_allocs{0};
  std::atomic<std::int64_t> live_device{0}, live_pinned_bytes{0};
};

/// A stream: a thread running queued operations in order. The thread holds the Stream alive,
/// so a stream whose own operation drops the last reference to the backend finishes safely.
struct HostDeviceBackend::Stream : std::enable_shared_from_this<Stream> {
  std::mutex mutex;
  std::condition_variable changed;  // work queued, pause lifted, progress, stop
  std::deque<std::function<void()>> queue;
  std::uint64_t enqueued = 0;   // operations ever queued
  std::uint64_t completed = 0;  // operations that have run
  bool paused = false;
  bool stop = false;
  std::thread thread;

  void start() {
    thread = std::thread([self = shared_from_this()] { self->run(); });
  }

  /// Queues `op`; returns its sequence number (1-based).
  std::uint64_t push(std::function<void()> op) {
    std::lock_guard lock(mutex);
    if (stop) throw LogicError("HostDeviceBackend: work queued on a destroyed stream");
    queue.push_back(std::move(op));
    changed.notify_all();
    return ++enqueued;
  }

  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return (!paused && !queue.empty()) || (stop && queue.empty()); });
      if (queue.empty()) return;
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      try {
        op();
      } catch (const std::exception& e) {
        detail::warn(std::string("HostDeviceBackend: a queued operation threw: ") + e.what(),
                     "coload: ");
      } catch (...) {
        detail::warn("HostDeviceBackend: a queued operation threw", "coload: ");
      }
      op = nullptr;  // its captures die outside the lock
      lock.lock();
      ++completed;
      changed.notify_all();
    }
  }

  /// Makes the thread finish the queue (even if paused) and end; joins it unless called from
  /// the thread itself, which then ends on its own.
  void finish() {
    {
      std::lock_guard lock(mutex);
      stop = true;
      paused = false;
      changed.notify_all();
    }
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }
};

HostDeviceBackend::HostDeviceBackend() : counters_(std::make_shared<Counters>()) {
  for (Stream** which : {&copy_stream_, &default_stream_}) {
    auto s = std::make_shared<Stream>();
    s->start();
    *which = s.get();
    streams_.push_back(std::move(s));
  }
}

HostDeviceBackend::~HostDeviceBackend() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard lock(mutex_);
    streams.swap(streams_);
  }
  // Every stream drains before any is joined: one may wait on another's event.
  for (auto& s : streams) {
    std::lock_guard lock(s->mutex);
    s->stop = true;
    s->paused = false;
    s->changed.notify_all();
  }
  for (auto& s : streams) s->finish();
  // NOTE: pinned memory still allocated here was leaked by its user (the pool and its slabs
  // hold the backend alive); it is left alone rather than freed under a live pointer.
}

std::shared_ptr<HostDeviceBackend::Stream> HostDeviceBackend::stream_of(DeviceStream s) const {
  const void* handle = s.handle ? s.handle : default_stream_;
  std::lock_guard lock(mutex_);
  for (const auto& p : streams_) {
    if (p.get() == handle) return p;
  }
  throw InvalidArgument("HostDeviceBackend: unknown stream handle");
}

at::Device HostDeviceBackend::device() const { return at::Device(at::kCPU); }
std::string HostDeviceBackend::name() const { return "host"; }

void* HostDeviceBackend::alloc_pinned(std::size_t nbytes) {
  const std::size_t size = std::max<std::size_t>((nbytes + 4095) / 4096 * 4096, 4096);
  void* p = std::aligned_alloc(4096, size);
  if (!p)
    throw RuntimeError("HostDeviceBackend: alloc_pinned(" + std::to_string(nbytes) + ") failed");
  {
    std::lock_guard lock(mutex_);
    pinned_.push_back({static_cast<const char*>(p), nbytes});
  }
  counters_->pinned_allocs.fetch_add(1);
  counters_->live_pinned_bytes.fetch_add(static_cast<std::int64_t>(nbytes));
  return p;
}

void HostDeviceBackend::free_pinned(void* p, std::size_t nbytes) {
  if (!p) return;
  {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(pinned_.begin(), pinned_.end(), [p](const Range& r) { return r.begin == p; });
    if (it == pinned_.end())
      throw InvalidArgument("HostDeviceBackend: free_pinned of memory it did not allocate");
    pinned_.erase(it);
  }
  counters_->live_pinned_bytes.fetch_sub(static_cast<std::int64_t>(nbytes));
  std::free(p);
}

void HostDeviceBackend::register_host(void* p, std::size_t nbytes) {
  std::lock_guard lock(mutex_);
  registered_.push_back({static_cast<const char*>(p), nbytes});
}

void HostDeviceBackend::unregister_host(void* p) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(registered_.begin(), registered_.end(), [p](const Range& r) { return r.begin == p; });
  if (it == registered_.end())
    throw InvalidArgument("HostDeviceBackend: unregister_host of a range never registered");
  registered_.erase(it);
}

bool HostDeviceBackend::is_pinned(const void* p) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(mutex_);
  auto in = [c](const Range& r) { return c >= r.begin && c < r.begin + r.size; };
  return std::any_of(pinned_.begin(), pinned_.end(), in) ||
         std::any_of(registered_.begin(), registered_.end(), in);
}

std::size_t HostDeviceBackend::registered_ranges() const {
  std::lock_guard lock(mutex_);
  return registered_.size();
}

DeviceStream HostDeviceBackend::copy_stream() { return DeviceStream{copy_stream_}; }

DeviceStream HostDeviceBackend::create_stream() {
  auto s = std::make_shared<Stream>();
  s->start();
  std::lock_guard lock(mutex_);
  streams_.push_back(s);
  return DeviceStream{s.get()};
}

void HostDeviceBackend::destroy_stream(DeviceStream stream) {
  if (stream.handle == copy_stream_ || stream.handle == default_stream_ || !stream.handle) {
    throw InvalidArgument(
        "HostDeviceBackend: the copy stream and the default stream cannot be destroyed");
  }
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(streams_.begin(), streams_.end(), [&](const auto& p) { return p.get() == stream.handle; });
    if (it == streams_.end())
      throw InvalidArgument("HostDeviceBackend: destroy_stream of an unknown stream");
    s = std::move(*it);
    streams_.erase(it);
  }
  s->finish();
}

void HostDeviceBackend::synchronize(DeviceStream stream) {
  auto s = stream_of(stream);
  std::unique_lock lock(s->mutex);
  if (s->paused && s->completed < s->enqueued) {
    throw LogicError("HostDeviceBackend: synchronize on a paused stream would never return");
  }
  // NOTE: until idle, not only up to what was queued at the call: an operation may queue more
  // on its own stream (a completion releasing a batch frees its memory there).
  s->changed.wait(lock, [&] { return s->completed == s->enqueued; });
}

void* HostDeviceBackend::alloc_device(std::size_t nbytes, DeviceStream stream) {
  (void)stream_of(stream);
  void* p = std::malloc(std::max<std::size_t>(nbytes, 1));
  if (!p)
    throw RuntimeError("HostDeviceBackend: alloc_device(" + std::to_string(nbytes) + ") failed");
  counters_->live_device.fetch_add(1);
  return p;
}

void HostDeviceBackend::free_device(void* p, DeviceStream stream) {
  if (!p) return;
  stream_of(stream)->push([c = counters_, p] {
    std::free(p);
    c->live_device.fetch_sub(1);
  });
}

void HostDeviceBackend::copy_to_device_async(void* dst, const void* src, std::size_t nbytes,
                                             DeviceStream stream) {
  stream_of(stream)->push([c = counters_, dst, src, nbytes] {
    if (nbytes) std::memcpy(dst, src, nbytes);
    c->copies.fetch_add(1);
    c->bytes_copied.fetch_add(nbytes);
  });
}

DeviceEvent HostDeviceBackend::record(DeviceStream stream) {
  auto s = stream_of(stream);
  std::lock_guard lock(s->mutex);
  return DeviceEvent{s.get(), s->enqueued};
}

void HostDeviceBackend::destroy_event(DeviceEvent) {}

void HostDeviceBackend::stream_wait(DeviceStream stream, DeviceEvent event) {
  auto producer = stream_of(DeviceStream{event.handle});
  stream_of(stream)->push([producer, value = event.value] {
    std::unique_lock lock(producer->mutex);
    producer->changed.wait(lock, [&] { return producer->completed >= value; });
  });
}

bool HostDeviceBackend::event_done(DeviceEvent event) const {
  auto s = stream_of(DeviceStream{event.handle});
  std::lock_guard lock(s->mutex);
  return s->completed >= event.value;
}

void HostDeviceBackend::on_done(DeviceStream stream, std::function<void()> fn) {
  stream_of(stream)->push(std::move(fn));
}

void HostDeviceBackend::pause(DeviceStream stream) {
  auto s = stream_of(stream);
  std::lock_guard lock(s->mutex);
  s->paused = true;
}

void HostDeviceBackend::resume(DeviceStream stream) {
  auto s = stream_of(stream);
  std::lock_guard lock(s->mutex);
  s->paused = false;
  s->changed.notify_all();
}

std::size_t HostDeviceBackend::queued(DeviceStream stream) const {
  auto s = stream_of(stream);
  std::lock_guard lock(s->mutex);
  return s->queue.size();
}

std::size_t HostDeviceBackend::copies_executed() const noexcept { return counters_->copies.load(); }
std::size_t HostDeviceBackend::bytes_copied() const noexcept { return counters_->bytes_copied.load(); }
std::int64_t HostDeviceBackend::live_device_allocations() const noexcept { return counters_->live_device.load(); }
std::int64_t HostDeviceBackend::live_pinned_bytes() const noexcept { return counters_->live_pinned_bytes.load(); }
std::size_t HostDeviceBackend::pinned_allocations() const noexcept { return counters_->pinned_allocs.load(); }

}  // namespace coload
