// DeviceStage: queueing a batch's copies, and resuming its coroutine on the driver when done.

#include <asio/post.hpp>

#include <stdexcept>

#include "coload/core/error.hpp"
#include "coload/device/stage.hpp"

namespace coload {
namespace detail {

namespace {
constexpr std::size_t kDeviceAlign = 256;  // what cudaMalloc guarantees; enough for any dtype

// The storage context of a device tensor: a reference to its batch's state.
void release_device_context(void* ctx) { delete static_cast<std::shared_ptr<DeviceBatchState>*>(ctx); }

// Runs on the backend's thread once the stream has run the copy: hands the resumption to the
// driver, or drops the copy (its sources and memory) when the stage is gone.
void complete(std::shared_ptr<PendingCopy> p) {
  std::shared_ptr<StageShared> stage = p->stage;
  std::unique_lock lock(stage->mutex);
  if (!stage->open) {
    lock.unlock();
    p.reset();  // the stage is gone: release what the copy held, resume nobody
    return;
  }
  // NOTE: posted under the mutex: the stage's destructor (which closes it) cannot run in
  // between, so the io_context is still alive here.
  asio::post(*stage->driver, [p = std::move(p)]() mutable {
    std::shared_ptr<StageShared> st = p->stage;
    std::coroutine_handle<> h;
    {
      std::lock_guard l(st->mutex);
      if (st->open) h = p->waiter;  // cleared when the waiting coroutine was destroyed
    }
    st->in_flight.fetch_sub(1, std::memory_order_relaxed);
    // The copy has completed: the pinned sources may go back to their pool now.
    p->sources.clear();
    p.reset();
    if (h) h.resume();
  });
}
}  // namespace

DeviceBatchState::DeviceBatchState(std::shared_ptr<DeviceBackend> b, DeviceStream free_stream) noexcept
    : backend(std::move(b)), free_stream_(free_stream) {}

DeviceBatchState::~DeviceBatchState() {
  DeviceStream stream;
  {
    std::lock_guard lock(mutex_);
    stream = free_stream_;
  }
  try {
    if (memory) backend->free_device(memory, stream);
    if (has_event) backend->destroy_event(ready);
  } catch (...) {
    // NOTE: a destructor cannot report; the backend's own failure is what would be lost here.
  }
}

void DeviceBatchState::set_free_stream(DeviceStream stream) {
  std::lock_guard lock(mutex_);
  free_stream_ = stream;
}

std::shared_ptr<DeviceBatchState> device_state_of(const at::Tensor& t) noexcept {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &release_device_context) return nullptr;
  return *static_cast<std::shared_ptr<DeviceBatchState>*>(dp.get_context());
}

SubmittedCopy submit_copy(const std::shared_ptr<DeviceBackend>& backend,
                          const std::shared_ptr<StageShared>& stage,
                          std::vector<at::Tensor> sources) {
  const DeviceStream stream = backend->copy_stream();
  std::vector<std::size_t> offsets;
  offsets.reserve(sources.size());
  std::size_t total = 0;
  for (at::Tensor& t : sources) {
    if (!t.is_contiguous()) t = t.contiguous();  // pageable, kept alive with the others
    offsets.push_back(total);
    total += (t.nbytes() + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
  }
  auto state = std::make_shared<DeviceBatchState>(backend, stream);
  if (total > 0) state->memory = backend->alloc_device(total, stream);

  auto pending = std::make_shared<PendingCopy>();
  pending->stage = stage;
  pending->device = state;
  SubmittedCopy out;
  out.device_tensors.reserve(sources.size());
  try {
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const at::Tensor& t = sources[i];
      char* dst = static_cast<char*>(state->memory) + offsets[i];
      if (t.nbytes() > 0) backend->copy_to_device_async(dst, t.data_ptr(), t.nbytes(), stream);
      auto* ctx = new std::shared_ptr<DeviceBatchState>(state);
      out.device_tensors.push_back(
          backend->wrap_device(dst, t.sizes(), {}, t.scalar_type(), ctx, &release_device_context));
    }
    state->ready = backend->record(stream);
    state->has_event = true;
  } catch (...) {
    // Copies already queued still read the sources: the stream holds them until it has run.
    out.device_tensors.clear();
    backend->on_done(stream, [held = std::move(sources), state]() {});
    throw;
  }
  pending->sources = std::move(sources);
  out.pending = std::move(pending);
  stage->in_flight.fetch_add(1, std::memory_order_relaxed);
  return out;
}

void abandon_copy(DeviceBackend& backend, std::shared_ptr<PendingCopy> pending) {
  try {
    backend.on_done(backend.copy_stream(), [p = pending]() mutable { complete(std::move(p)); });
  } catch (...) {
    // The stream cannot hold them: the copies are waited for here, so that the sources are
    // let go of only once nothing reads them (the map's own error is the one thrown on).
    try {
      backend.synchronize(backend.copy_stream());
    } catch (...) {
    }
    pending->stage->in_flight.fetch_sub(1, std::memory_order_relaxed);
  }
}

CopyAwaiter::~CopyAwaiter() {
  if (!pending) return;
  // NOTE: runs after the resumption too (harmless), or when the suspended coroutine is
  // destroyed: then the completion must not resume it.
  std::lock_guard lock(pending->stage->mutex);
  pending->waiter = {};
}

void CopyAwaiter::await_suspend(std::coroutine_handle<> h) {
  {
    std::lock_guard lock(pending->stage->mutex);
    pending->waiter = h;
  }
  backend->on_done(backend->copy_stream(), [p = pending]() mutable { complete(std::move(p)); });
}

}  // namespace detail

DeviceStage::DeviceStage(std::shared_ptr<DeviceBackend> backend, asio::io_context& driver)
    : backend_(std::move(backend)), shared_(std::make_shared<detail::StageShared>()) {
  if (!backend_) throw InvalidArgument("DeviceStage: the backend is null");
  shared_->driver = &driver;
}

DeviceStage::~DeviceStage() {
  std::lock_guard lock(shared_->mutex);
  shared_->open = false;
}

Task<void> DeviceStage::fence() {
  auto pending = std::make_shared<detail::PendingCopy>();
  pending->stage = shared_;
  shared_->in_flight.fetch_add(1, std::memory_order_relaxed);
  co_await detail::CopyAwaiter(backend_.get(), std::move(pending));
}

}  // namespace coload
