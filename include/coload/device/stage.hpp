#pragma once
// DeviceStage: copies pinned batches to the device on the backend's copy stream and resumes the
// awaiting coroutine on the driver once the copy has completed; DeviceBatch<B>: the result.

#include <ATen/core/Tensor.h>
#include <asio/io_context.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/backend.hpp"
#include "coload/device/tensor_map.hpp"

namespace coload {

namespace detail {

/// One copied batch's device memory (one allocation for all its tensors) and ready event.
/// Owned by the DeviceBatch and by each of its device tensors' storages; when the last dies,
/// the memory is freed stream-ordered on the stream set last (the copy stream by default).
struct DeviceBatchState {
  DeviceBatchState(std::shared_ptr<DeviceBackend> backend, DeviceStream free_stream) noexcept;
  ~DeviceBatchState();
  DeviceBatchState(const DeviceBatchState&) = delete;
  DeviceBatchState& operator=(const DeviceBatchState&) = delete;

  void set_free_stream(DeviceStream stream);

  std::shared_ptr<DeviceBackend> backend;
  void* memory = nullptr;
  DeviceEvent ready{};
  bool has_event = false;

 private:
  std::mutex mutex_;
  DeviceStream free_stream_;
};

/// The DeviceBatchState behind a tensor made by a DeviceStage, or nullptr.
std::shared_ptr<DeviceBatchState> device_state_of(const at::Tensor& t) noexcept;

/// Shared by a stage and its copies in flight: whether the stage still exists.
struct StageShared {
  std::mutex mutex;
  bool open = true;
  asio::io_context* driver = nullptr;
  std::atomic<std::size_t> in_flight{0};
};

/// What one copy (or fence) in flight keeps until the stream has run it: the host tensors it
/// reads, and who to resume.
struct PendingCopy {
  std::shared_ptr<StageShared> stage;
  std::coroutine_handle<> waiter;
  std::vector<at::Tensor> sources;
  std::shared_ptr<DeviceBatchState> device;
};

/// The copies of one batch, queued: the device tensors in visiting order, and what the
/// stream holds until it has run them.
struct SubmittedCopy {
  std::vector<at::Tensor> device_tensors;
  std::shared_ptr<PendingCopy> pending;
};

/// Queues the copies of `sources` (CPU tensors) on the backend's copy stream into one device
/// allocation, then records the ready event.
SubmittedCopy submit_copy(const std::shared_ptr<DeviceBackend>& backend,
                          const std::shared_ptr<StageShared>& stage,
                          std::vector<at::Tensor> sources);

/// Hands a submitted copy that will not be awaited (its batch's map threw) to its stream: the
/// sources stay held until the copies queued have run, and it leaves in_flight as a completed
/// one does.
void abandon_copy(DeviceBackend& backend, std::shared_ptr<PendingCopy> pending);

/// The batch with its CPU tensors replaced by `submitted`'s device tensors, in visiting order.
/// A map that throws (a TensorMap whose map and visit disagree, user code) abandons the copy
/// rather than dropping the sources its queued copies still read.
template <class B>
B map_to_device(B batch, SubmittedCopy& submitted, DeviceBackend& backend) {
  try {
    std::size_t next = 0;
    return map_tensors(std::move(batch), [&submitted, &next](at::Tensor t) {
      if (!t.defined() || !t.device().is_cpu()) return t;
      return submitted.device_tensors.at(next++);
    });
  } catch (...) {
    abandon_copy(backend, std::move(submitted.pending));
    throw;
  }
}

/// Suspends until the copy stream has run what was queued before; resumes on the driver. If
/// the suspended coroutine is destroyed instead, its resumption is cancelled.
struct CopyAwaiter {
  CopyAwaiter(DeviceBackend* b, std::shared_ptr<PendingCopy> p) noexcept
      : backend(b), pending(std::move(p)) {}
  CopyAwaiter(const CopyAwaiter&) = delete;
  CopyAwaiter& operator=(const CopyAwaiter&) = delete;
  ~CopyAwaiter();
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h);
  void await_resume() const noexcept {}

  DeviceBackend* backend;
  std::shared_ptr<PendingCopy> pending;
};

}  // namespace detail

/// A batch whose tensors are on the device, and the event after which they hold the data.
///
/// Hand it to the consumer's stream with wait(stream): the stream waits on the ready event
/// (the host does not) and the batch's device memory is later freed on that stream, after the
/// work the consumer queued there. Use the tensors on that one stream (or synchronise
/// yourself, as with PyTorch's record_stream).
template <class B>
struct DeviceBatch {
  B batch;
  std::shared_ptr<detail::DeviceBatchState> state;

  /// True once the copies have completed (never blocks).
  bool ready() const { return !state || !state->has_event || state->backend->event_done(state->ready); }
  /// Makes `consumer` wait for the copies, and moves the free of the device memory onto it.
  void wait(DeviceStream consumer) const {
    if (!state) return;
    if (state->has_event) state->backend->stream_wait(consumer, state->ready);
    state->set_free_stream(consumer);
  }
  /// The ready event (valid while this batch or one of its tensors lives).
  DeviceEvent event() const { return state ? state->ready : DeviceEvent{}; }
};

namespace detail {
template <class B>
DeviceBatch<B> make_device_batch(B batch, std::shared_ptr<DeviceBatchState> state) {
  return DeviceBatch<B>{std::move(batch), std::move(state)};
}
}  // namespace detail

/// The DeviceBatch of a batch whose device tensors came from a DeviceStage (the loader hands
/// consumers plain B). Throws std::invalid_argument when a defined tensor was not made by a
/// stage, when tensors come from more than one copy, or when the batch holds no tensor.
template <class B>
DeviceBatch<B> device_batch(B batch) {
  std::shared_ptr<detail::DeviceBatchState> state;
  std::size_t index = 0;
  std::string problem;
  visit_tensors(batch, [&](const at::Tensor& t) {
    const std::size_t i = index++;
    if (!t.defined() || !problem.empty()) return;
    auto s = detail::device_state_of(t);
    if (!s) {
      problem = "device_batch: tensor " + std::to_string(i) + " of the batch (on " +
                t.device().str() + ") was not made by a DeviceStage";
    } else if (state && s != state) {
      problem = "device_batch: tensor " + std::to_string(i) +
                " of the batch comes from another DeviceStage copy than the first tensor's";
    } else {
      state = std::move(s);
    }
  });
  if (!problem.empty()) throw InvalidArgument(problem);
  if (!state)
    throw InvalidArgument("device_batch: the batch holds no tensor made by a DeviceStage");
  return DeviceBatch<B>{std::move(batch), std::move(state)};
}

/// The host-to-device stage. copy() queues a pinned batch's copies on the backend's copy
/// stream into stream-ordered device memory, records the ready event, and suspends; a host
/// callback after the copies only posts the resumption to `driver`, so the awaiting coroutine
/// continues on the driver thread once the copy has completed — nothing on the host waits on
/// the device. Completions resume in submission order. The source batch (its pinned slab) is
/// released only when the copy has completed.
///
/// Call copy() and fence() on the driver thread. `driver` must outlive the stage.
///
/// Destruction does not wait for the device: copies still in flight are never resumed, and
/// their awaiting coroutines are never referenced again by the stage (their owners destroy
/// them; a suspended copy holds nothing the stream needs). What the stream still reads or
/// writes (source tensors, device memory) is held by the queued work itself and released when
/// the stream has run it, so nothing leaks and nothing freed is touched. Destroy the stage on
/// the driver thread (or once the driver has stopped).
class DeviceStage {
 public:
  DeviceStage(std::shared_ptr<DeviceBackend> backend, asio::io_context& driver);
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  /// Copies the CPU tensors of `batch` (reached through TensorMap<B>; ideally in pinned memory,
  /// see pin_batch) to the device; resumes on the driver once the copy has completed. Tensors
  /// not on the CPU and undefined ones pass through.
  template <class B>
  Task<DeviceBatch<B>> copy(B batch);

  /// Resumes on the driver once all work queued before it has completed (after the
  /// resumptions of the copies submitted before it).
  Task<void> fence();

  /// Copies and fences submitted and not yet resumed.
  std::size_t in_flight() const noexcept { return shared_->in_flight.load(std::memory_order_relaxed); }
  DeviceBackend& backend() const noexcept { return *backend_; }
  const std::shared_ptr<DeviceBackend>& backend_ptr() const noexcept { return backend_; }

 private:
  std::shared_ptr<DeviceBackend> backend_;
  std::shared_ptr<detail::StageShared> shared_;
};

template <class B>
Task<DeviceBatch<B>> DeviceStage::copy(B batch) {
  std::vector<at::Tensor> sources;
  visit_tensors(batch, [&sources](const at::Tensor& t) {
    if (t.defined() && t.device().is_cpu()) sources.push_back(t);
  });
  detail::SubmittedCopy submitted = detail::submit_copy(backend_, shared_, std::move(sources));
  B out = detail::map_to_device(std::move(batch), submitted, *backend_);
  std::shared_ptr<detail::DeviceBatchState> state = submitted.pending->device;
  submitted.device_tensors.clear();
  // NOTE: no braced initialisers in this body (GCC 12 miscompiles some in coroutines).
  co_await detail::CopyAwaiter(backend_.get(), std::move(submitted.pending));
  co_return detail::make_device_batch(std::move(out), std::move(state));
}

}  // namespace coload
