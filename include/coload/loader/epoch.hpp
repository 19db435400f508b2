#pragma once
// Epoch<Batch>: one pass over the data, consumed with `while (auto b = co_await epoch.next())`.

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "coload/core/metrics.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/loader/detail/handoff.hpp"

namespace coload {
namespace detail {

/// The consumer's view of a running epoch; implemented by the loader.
template <class Batch>
class EpochChannel {
 public:
  virtual ~EpochChannel() = default;
  Handoff<Batch> handoff;
  /// The loader's metrics, where the consumer's waits go (set before the epoch is handed out);
  /// shared, as an epoch may outlive its loader and still be asked for its next batch.
  std::shared_ptr<Recorder> recorder;
  /// When the consumer saw the epoch's end or stopped it (steady-clock ns; 0 before); shared
  /// with the loader, which keeps the figure after the epoch is gone.
  std::shared_ptr<std::atomic<std::uint64_t>> ended_ns =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  /// Marks the epoch's end now, once.
  void mark_end() noexcept {
    std::uint64_t zero = 0;
    ended_ns->compare_exchange_strong(zero, now_ns());
  }
  /// Posts to the driver: the consumer took an item, a slot is free.
  virtual void consumed() = 0;
  /// Posts to the driver: arm the timeout for wait `generation` (called under the lock).
  virtual void arm_timeout(std::uint64_t generation, std::int64_t batch) = 0;
  /// The timeout error for the batch awaited in the current wait.
  virtual std::exception_ptr timeout_error() const = 0;
  /// Stops fetching for this epoch; safe from any thread, idempotent.
  virtual void cancel() = 0;
  /// The consumer is about to wait outside the loader's own range-for: a driver that runs
  /// inline (on the consumer's thread, while it waits there) starts its thread.
  virtual void before_wait() {}
};

/// Turns a slot the consumer received into the value `next()` returns.
template <class Batch>
std::optional<Batch> take_outcome(EpochChannel<Batch>& channel, ConsumerSlot<Batch>& slot) {
  // The consumer's wait: from its call to now, one clock read at each end.
  if (slot.asked_ns && channel.recorder && slot.result != Poll::wait) {
    Recorder& r = *channel.recorder;
    const std::uint64_t now = now_ns();
    if (slot.result == Poll::item) {
      if (r.enabled()) r.shard(Recorder::consumer).add(Stage::wait, now - slot.asked_ns);
      if (Tracer* t = r.tracer()) {
        try {
          t->span("wait", 0, slot.asked_ns, now, "batch", slot.outcome.number);
        } catch (...) {
        }
      }
    } else if (slot.result == Poll::end) {
      channel.mark_end();
    }
  }
  switch (slot.result) {
    case Poll::item: {
      channel.consumed();
      if (slot.outcome.error) std::rethrow_exception(slot.outcome.error);
      return std::move(slot.outcome.batch);
    }
    case Poll::timeout:
      std::rethrow_exception(channel.timeout_error());
    default:
      return std::nullopt;
  }
}

}  // namespace detail

/// One epoch of a DataLoader. Move-only; destroying it before the end stops the epoch's
/// fetching (work already running finishes in the background and is dropped).
template <class Batch>
class Epoch {
 public:
  explicit Epoch(std::shared_ptr<detail::EpochChannel<Batch>> channel) noexcept
      : channel_(std::move(channel)) {}
  Epoch(Epoch&&) noexcept = default;
  Epoch& operator=(Epoch&& other) noexcept {
    if (this != &other) {
      stop();
      channel_ = std::move(other.channel_);
    }
    return *this;
  }
  ~Epoch() { stop(); }

  /// Awaitable yielding the next batch, or an empty optional at the end of the epoch.
  ///
  /// Rethrows the batch's error (a WorkerError) in its place; the epoch goes on after it.
  /// Throws TimeoutError when `timeout` is set and no batch came in time; the batch stays in
  /// flight. A consumer waiting inside sync_wait resumes on its own thread; any other awaiting
  /// coroutine resumes on the loader's driver thread, where it must not block on the loader
  /// (no range-for or sync_wait there: the driver would wait on itself). One `next()` at a time.
  auto next() {
    struct Awaiter {
      detail::EpochChannel<Batch>* channel;
      detail::ConsumerSlot<Batch> slot;
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) {
        detail::ResumeQueue* queue = detail::current_resume_queue;
        detail::EpochChannel<Batch>* ch = channel;
        if (ch->recorder && ch->recorder->shard_count() > 0) slot.asked_ns = detail::now_ns();
        ch->before_wait();
        // NOTE: once registered, the driver may resume `h` at any moment (even before this
        // function returns), so nothing of the awaiter is touched after poll_or_wait.
        return ch->handoff.poll_or_wait(
            slot, [queue, h] { detail::resume_on(queue, h); },
            [ch](std::uint64_t generation, std::int64_t batch) {
              ch->arm_timeout(generation, batch);
            });
      }
      std::optional<Batch> await_resume() { return detail::take_outcome(*channel, slot); }
    };
    return Awaiter{channel_.get(), {}};
  }

  /// True unless moved from.
  explicit operator bool() const noexcept { return static_cast<bool>(channel_); }
  /// The shared state behind the epoch (for adapters such as DataLoader::async_next).
  const std::shared_ptr<detail::EpochChannel<Batch>>& channel() const noexcept { return channel_; }

 private:
  void stop() noexcept {
    if (channel_) channel_->cancel();
    channel_.reset();
  }
  std::shared_ptr<detail::EpochChannel<Batch>> channel_;
};

}  // namespace coload
