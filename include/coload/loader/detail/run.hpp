#pragma once
// The run of one epoch, whatever feeds it: the consumer's entry points, the in-flight bound,
// the reorder ring, the timeout, the device stage's hand-on and the end. MapRun and StreamRun
// add what feeds it.

#include <ATen/core/Tensor.h>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "coload/core/metrics.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/device.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/loader/detail/fetch_plan.hpp"
#include "coload/loader/detail/place.hpp"
#include "coload/loader/detail/reorder_ring.hpp"
#include "coload/loader/detail/resume.hpp"
#include "coload/loader/detail/run_services.hpp"
#include "coload/loader/epoch.hpp"
#include "coload/loader/errors.hpp"

namespace coload::detail {

/// What every epoch shares, whatever feeds it: the consumer-side entry points, the in-flight
/// bound, the reorder ring, the timeout and the end. Fields marked "driver" are touched only on
/// the driver thread.
///
/// Each dispatched batch number completes exactly once, with a batch, an error, or nothing at
/// all (a skip: an iterable worker that had no more samples); skips keep their place in the
/// order but are never handed to the consumer.
/// A number for each iteration begun in this process (RunBase::serial).
inline std::uint64_t next_run_serial() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <class D, class C>
class RunBase : public EpochChannel<typename FetchPlan<D, C>::batch>,
                public CpuStarted,
                public std::enable_shared_from_this<RunBase<D, C>> {
 public:
  using Batch = typename FetchPlan<D, C>::batch;
  using Services = RunServices<D, C>;

  /// `resumed`: the batches of this epoch that a saved state says were delivered already;
  /// they are not delivered again. `generator`: the loader's generator state that the epoch's
  /// draws started from (what LoaderState records).
  RunBase(Services& svc, std::int64_t epoch, std::uint64_t base_seed, DeliveredSet resumed,
          std::vector<std::uint8_t> generator)
      : svc_(svc),
        epoch_(epoch),
        base_seed_(base_seed),
        sample_seed_(svc.options().seed.value_or(base_seed)),
        timeout_(svc.options().timeout),
        resumed_(std::move(resumed)),
        start_generator_(std::move(generator)),
        stopped_(svc.stopped),
        reorder_(svc.workers.capacity()) {
    this->handoff.set_done(resumed_);
    // NOTE: only a loader with a timeout makes a timer: once a timer exists, Asio's driver
    // sleeps in epoll rather than on a condition variable, and every post costs a syscall.
    if (timeout_ > 0) timer_.emplace(svc.context());
    const int n = svc.options().num_workers;
    workers_.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      workers_.push_back(svc.fetcher.worker_info(i, n, base_seed + static_cast<std::uint64_t>(i)));
    }
  }

  std::int64_t epoch() const noexcept { return epoch_; }
  /// This iteration's number, unique in the process (epoch() repeats after load_state).
  std::uint64_t serial() const noexcept { return serial_; }
  std::uint64_t base_seed() const noexcept { return base_seed_; }
  std::uint64_t sample_seed() const noexcept { return sample_seed_; }
  /// The workers' infos for this epoch, indexed by worker id (empty without workers).
  const WorkerInfo* worker_infos() const noexcept {
    return workers_.empty() ? nullptr : workers_.data();
  }
  /// What an asynchronous fetch's move to a worker runs there: worker_init_fn, once per
  /// worker per epoch (once ever with persistent_workers).
  const std::function<void(const WorkerInfo&, std::int64_t)>* on_worker() const noexcept {
    return &on_worker_;
  }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }
  /// Any thread: the dispatcher has ended, and reads the sampler (and through it the loader's
  /// generator) no more.
  bool dispatch_ended() const noexcept { return dispatch_ended_.load(std::memory_order_acquire); }
  /// Waits for dispatch_ended() (never on the driver, which ends it).
  void wait_dispatch_ended() const noexcept {
    dispatch_ended_.wait(false, std::memory_order_acquire);
  }
  /// Driver: the epoch's later batches wait for its first (see WorkerCount::first_batch_bound).
  bool holding() const noexcept { return hold_first_; }
  /// Any thread: the first batch's CPU work has begun, so its bytes have arrived. Where they
  /// were slow to come (WorkerCount::slow_first_bytes), the batches held back behind it start
  /// their reads now, beside its CPU work; else, as where no worker thread takes its CPU work,
  /// the hold ends when it completes.
  void cpu_started() noexcept override {
    try {
      post_unless_closed([self = this->shared_from_this()] { self->release_hold(); });
    } catch (...) {
      // Out of memory: the hold ends when the first batch completes, as without workers.
    }
  }
  /// Where the epoch stands for its consumer (any thread).
  EpochPosition position() const {
    return EpochPosition{epoch_, this->handoff.done(), this->handoff.marks(), start_generator_,
                         this->handoff.ended()};
  }

  // --- consumer side (any thread) ---
  // NOTE: consumer calls after the run has finished do nothing, so an Epoch (or an async_next
  // completion) that outlives its loader never touches the freed driver.
  void consumed() override {
    if (closed_.load()) return;
    consumed_.fetch_add(1);
    // Only a driver that stopped at the in-flight bound needs telling.
    if (slot_wanted_.exchange(false)) {
      post_unless_closed([self = this->shared_from_this()] { self->on_slot_freed(); });
    }
  }
  void before_wait() override {
    if (closed_.load()) return;
    std::lock_guard lock(entry_mutex_);
    if (!closed_.load() && !svc_.driver.on_driver_thread()) svc_.start_driver();
  }
  // NOTE: the batch named is the one waited for when the timer fires (handoff.awaited()), not
  // when it was armed: a batch done as a skip meanwhile is not waited for any more.
  void arm_timeout(std::uint64_t generation, std::int64_t /*batch*/) override {
    if (timeout_ <= 0 || closed_.load()) return;
    post_unless_closed([self = this->shared_from_this(), generation] {
      self->on_arm(generation);
    });
  }
  std::exception_ptr timeout_error() const override {
    {
      std::lock_guard lock(timeout_mutex_);
      if (timeout_error_) return timeout_error_;
    }
    return std::make_exception_ptr(
        TimeoutError(this->handoff.awaited(), timeout_));
  }
  void cancel() override {
    // The consumer stops here: remember where, for state() after this run is gone. The first
    // stop says where: a later one (the stopped Epoch destroyed after its consumer saw the
    // end the stop made) would say the epoch ended.
    // NOTE: Epoch::stop() is noexcept, and the copy allocates: out of memory, the stop goes on
    // without recording its position rather than terminating.
    if (!cancelled_.load()) {
      try {
        EpochPosition at = position();
        std::lock_guard lock(stopped_->mutex);
        // An older epoch's late stop does not hide a newer one's position.
        if (!stopped_->position || stopped_->position->epoch <= epoch_) {
          stopped_->position = std::move(at);
        }
      } catch (...) {
      }
    }
    this->mark_end();
    if (cancelled_.exchange(true)) return;
    post_unless_closed([self = this->shared_from_this()] { self->on_cancel(); });
  }

 protected:
  /// Driver: `while (full() && !cancelled()) co_await slot();` waits for room under the bound.
  struct SlotAwaiter {
    RunBase* run;
    bool await_ready() const noexcept {
      run->slot_wanted_.store(true);
      // Re-check after announcing: a consumer that took a batch in between either is seen
      // here or sees the announcement and posts on_slot_freed.
      return !run->full() || run->cancelled();
    }
    void await_suspend(std::coroutine_handle<> h) noexcept { run->slot_waiter_ = h; }
    void await_resume() const noexcept {}
  };
  SlotAwaiter slot() noexcept { return SlotAwaiter{this}; }

  /// Driver: batch `batch_no` is done. An outcome with neither batch nor error is a skip.
  void complete(std::int64_t batch_no, Outcome<Batch> outcome, bool dropped) {
    ++completed_;
    // auto_workers: the tuner judges its measurements now and then; a worker added raises the
    // in-flight bound, so a dispatcher waiting at it may go on.
    // NOTE: the consumer's wait is read (under the hand-off's lock) only under auto_workers.
    const bool grew = !dispatch_ended() && svc_.workers.tuned() &&
                      svc_.workers.tune(epoch_, this->handoff.wait_nanoseconds()) > 0;
    if (cancelled() || dropped) {
      maybe_finish();
      return;
    }
    // Delivered before the state this epoch resumed from: it takes its place as a skip.
    if (resumed_.contains(batch_no)) outcome = Outcome<Batch>{};
    outcome.number = batch_no;
    const std::int64_t skipped_before = skipped_;
    if (!svc_.options().in_order) {
      deliver(std::move(outcome));
    } else {
      reorder_.put(batch_no, std::move(outcome));
      reorder_.release([this](Outcome<Batch> next) { deliver(std::move(next)); });
    }
    // A skip frees its place under the bound without the consumer: wake a waiting dispatcher.
    // So does the epoch's first batch where the bound still held the others back.
    const bool released = std::exchange(hold_first_, false);
    if ((grew || released || skipped_ != skipped_before) && !full()) on_slot_freed();
    maybe_finish();
  }

  /// Driver: a batch was dispatched; the metrics' occupancy and worker count sample it.
  void note_dispatch() noexcept {
    Recorder& r = svc_.recorder;
    if (!r.enabled()) return;
    const std::int64_t in_flight = dispatched_ - consumed_.load() - skipped_;
    r.occupancy_sum.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(in_flight, 0)),
                              std::memory_order_relaxed);
    r.occupancy_n.fetch_add(1, std::memory_order_relaxed);
    r.bound_sum.fetch_add(static_cast<std::uint64_t>(svc_.workers.bound()),
                          std::memory_order_relaxed);
    r.workers_sum.fetch_add(static_cast<std::uint64_t>(svc_.workers.in_use()),
                            std::memory_order_relaxed);
  }

  /// Driver: true when the in-flight bound's batches are between dispatch and the consumer (the
  /// bound follows the worker count under auto_workers; the reorder ring's size is the most it
  /// can be).
  bool full() const noexcept {
    // A driver that runs inside the consumer's wait fetches the batch waited for and none
    // ahead of it, as PyTorch's loader without workers fetches in next(): the dataset's calls
    // then keep their turn with the consumer's (a draw from a global generator, say).
    const std::int64_t bound = svc_.driver.runs_inline() ? 1
                               : hold_first_            ? svc_.workers.first_batch_bound()
                                                        : svc_.workers.bound();
    return dispatched_ - consumed_.load() - skipped_ >= bound;
  }

  /// Driver: nothing more will be dispatched (after an error, if any, from the dispatcher).
  void dispatch_done(std::exception_ptr error) {
    dispatch_error_ = std::move(error);
    dispatch_ended_.store(true, std::memory_order_release);
    dispatch_ended_.notify_all();
    maybe_finish();
  }

  Services& svc_;
  const std::int64_t epoch_;
  const std::uint64_t serial_ = next_run_serial();
  const std::uint64_t base_seed_;
  const std::uint64_t sample_seed_;
  const double timeout_;
  std::vector<WorkerInfo> workers_;
  const DeliveredSet resumed_;
  const std::vector<std::uint8_t> start_generator_;
  const std::shared_ptr<StoppedEpoch> stopped_;
  const std::function<void(const WorkerInfo&, std::int64_t)> on_worker_ =
      [this](const WorkerInfo& info, std::int64_t batch) {
        svc_.recorder.bind_thread(info.id);
        svc_.fetcher.init_worker(info, epoch_, batch);
      };
  // driver
  std::int64_t dispatched_ = 0;
  // The map-style dispatcher holds the epoch's later batches back until its first has begun
  // its CPU work on a worker thread, or else is done (see WorkerCount::first_batch_bound).
  bool hold_first_ = false;
  std::uint64_t hold_start_ns_ = 0;  // when the held batch was dispatched (now_ns)
  // What placement.start() returned: the generation of the workers this epoch runs on, which
  // placement.run_finished retires (-1: it never started them).
  std::int64_t placement_generation_ = -1;

 private:
  void deliver(Outcome<Batch> outcome) {
    ++delivered_;
    if (!outcome.batch && !outcome.error) {
      ++skipped_;
      if (outcome.lost) {
        this->handoff.note_lost(outcome.number);
      } else {
        this->handoff.note_done(outcome.number);
      }
      return;
    }
    if (outcome.error) svc_.recorder.errors.fetch_add(1, std::memory_order_relaxed);
    if (Tracer* t = svc_.recorder.tracer()) {
      t->instant("handoff", thread_recording().track, now_ns(), "batch", outcome.number);
    }
    if (svc_.stage) {
      ++staging_;
      svc_.spawn(to_device(this->shared_from_this(), std::move(outcome)));
      return;
    }
    this->handoff.push(std::move(outcome));
  }

  /// Driver: says once per batch type when the device stage reaches no tensor in a batch, so
  /// that a struct without a TensorMap does not stay on the CPU unnoticed.
  static void warn_if_opaque(const Batch& batch) {
    bool any = false;
    visit_tensors(batch, [&any](const at::Tensor&) { any = true; });
    if (any) return;
    const std::string type = demangle(typeid(Batch).name());
    warn_once("device stage: no tensor in " + type,
              "the device stage found no tensor in a batch of type " + type +
                  ", so it stays where it is: specialise coload::TensorMap for it "
                  "(coload/device/tensor_map.hpp) to reach its tensors");
  }

  /// Driver: copies a batch to the device and hands it on once the copy has completed. An
  /// error waits for the copies before it, so the consumer gets everything in order.
  static Task<void> to_device(std::shared_ptr<RunBase> self, Outcome<Batch> outcome) {
    DeviceStage& stage = *self->svc_.stage;
    bool failed = false;
    if (outcome.batch) {
      warn_if_opaque(*outcome.batch);
      try {
        const std::uint64_t begin = now_ns();
        auto copied = co_await stage.copy(std::move(*outcome.batch));
        outcome.batch.emplace(std::move(copied.batch));
        const std::uint64_t end = now_ns();
        Recorder& r = self->svc_.recorder;
        if (r.enabled()) r.shard(Recorder::driver).add(Stage::copy, end - begin);
        if (Tracer* t = r.tracer()) {
          t->async_span("copy", static_cast<std::uint64_t>(outcome.number), begin, end, "batch",
                        outcome.number);
        }
      } catch (...) {
        outcome.batch.reset();
        outcome.error = std::current_exception();
        failed = true;
      }
    }
    if (!outcome.batch || failed) {
      try {
        co_await stage.fence();
      } catch (...) {
        // The device failed: the order behind earlier copies cannot be kept; deliver anyway.
        if (!outcome.error) outcome.error = std::current_exception();
      }
    }
    self->handoff.push(std::move(outcome));
    --self->staging_;
    self->maybe_finish();
  }

  void maybe_finish() {
    if (finished_ || !dispatch_ended() || staging_ > 0) return;
    if (cancelled() ? completed_ != dispatched_ : delivered_ != dispatched_) return;
    finished_ = true;
    // Nothing of the driver is needed any more: drop the timer (it lives on the driver's
    // io_context) and close the consumer-side entry points.
    timer_.reset();
    close();
    if (dispatch_error_ && !cancelled()) {
      Outcome<Batch> end;
      end.error = dispatch_error_;
      this->handoff.push(std::move(end));
    }
    // NOTE: worker processes that end with the epoch are gone before the consumer sees its end.
    svc_.placement.run_finished(placement_generation_,
                                [self = this->shared_from_this()] { self->handoff.finish(); });
  }

 public:
  /// The consumer-side entry points do nothing from now on (a post begun on another thread
  /// ends first): the run has finished, or its loader is going (close_after_join).
  void close() noexcept {
    std::lock_guard lock(entry_mutex_);
    closed_.store(true);
  }
  /// LoaderCore's destructor, its driver joined (so nothing runs on the driver any more):
  /// closed, and the timer let go of while the io_context it lives on still exists.
  void close_after_join() noexcept {
    close();
    timer_.reset();
  }

 protected:
  /// Any thread: posts `handler` to the driver unless the run has finished. Checked and posted
  /// under the lock maybe_finish() closes under: once the run is closed, which it is before a
  /// loader being destroyed lets its driver go, no thread is still posting to it.
  template <class Handler>
  void post_unless_closed(Handler&& handler) {
    std::lock_guard lock(entry_mutex_);
    if (!closed_.load()) asio::post(svc_.context(), std::forward<Handler>(handler));
  }

  void release_hold() {
    if (!hold_first_ || now_ns() - hold_start_ns_ <
                            static_cast<std::uint64_t>(WorkerCount::slow_first_bytes().count())) {
      return;
    }
    hold_first_ = false;
    if (!full()) on_slot_freed();
  }
  void on_slot_freed() {
    if (slot_waiter_) std::exchange(slot_waiter_, nullptr).resume();
  }
  void on_arm(std::uint64_t generation) {
    if (finished_ || !timer_) return;
    timer_->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(timeout_)));
    timer_->async_wait([self = this->shared_from_this(), generation](std::error_code ec) {
      if (ec) return;
      // On the driver, which knows who is fetching the awaited batch: the error names them.
      const std::int64_t batch = self->handoff.awaited();
      const FetchHolder who = self->svc_.placement.holder(batch);
      {
        std::lock_guard lock(self->timeout_mutex_);
        self->timeout_error_ = std::make_exception_ptr(
            TimeoutError(batch, self->timeout_, who.worker, who.pid, who.first, who.count));
      }
      self->handoff.expire(generation);
    });
  }
  void on_cancel() {
    if (timer_) timer_->cancel();
    on_slot_freed();
    maybe_finish();
  }

  std::atomic<bool> cancelled_{false};
  std::atomic<bool> dispatch_ended_{false};  // set on the driver, read on any thread
  std::atomic<bool> closed_{false};  // consumer-side entry points do nothing (entry_mutex_)
  std::mutex entry_mutex_;
  mutable std::mutex timeout_mutex_;
  std::exception_ptr timeout_error_;  // the last timeout's, made on the driver
  std::atomic<std::int64_t> consumed_{0};
  std::atomic<bool> slot_wanted_{false};
  // driver
  std::int64_t completed_ = 0;
  std::int64_t delivered_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t staging_ = 0;  // batches on their way to the device
  bool finished_ = false;
  std::exception_ptr dispatch_error_;
  ReorderRing<Outcome<Batch>> reorder_;
  std::coroutine_handle<> slot_waiter_;
  std::optional<asio::steady_timer> timer_;
};

}  // namespace coload::detail
