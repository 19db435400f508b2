#pragma once
// DataLoader: owns the pipeline from sampler to consumer.

#include <ATen/core/Tensor.h>
#include <c10/util/Type.h>
#include <asio/async_result.hpp>
#include <asio/associated_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"
#include "coload/collate/wire.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/when_all.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/iterable.hpp"
#include "coload/device/device.hpp"
#include "coload/exec/process.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/driver.hpp"
#include "coload/loader/epoch.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"
#include "coload/loader/state.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/distributed.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sequential.hpp"

namespace coload {

/// An iterable dataset that can say where its stream stands (`state()`, any text) and continue
/// from there (`load_state(text)`: the next `stream()` resumes where that state was taken), so
/// a loader resumes it without re-reading what was delivered.
template <class D>
concept ResumableStream = requires(const D& d, D& m, const std::string& s) {
  { d.state() } -> std::convertible_to<std::string>;
  m.load_state(s);
};

/// What a DataLoader loads from: a map-style dataset (`size()` and `get`) or an iterable one
/// (`stream`). A type with both is loaded as iterable, as PyTorch decides by IterableDataset.
template <class D>
concept LoadableDataset = MapDataset<D> || IterableDataset<D>;

namespace detail {

template <class D>
auto loader_sample_probe() {
  if constexpr (IterableDataset<D>) {
    return std::type_identity<stream_sample_t<D>>{};
  } else {
    return std::type_identity<sample_t<D>>{};
  }
}

/// The type of one sample of D, map-style or iterable.
template <LoadableDataset D>
using loader_sample_t = typename decltype(loader_sample_probe<D>())::type;

/// True when collate C takes one sample at a time (automatic batching off): DefaultConvert, or
/// a callable that takes a sample but not a vector of them.
template <class C, class S>
inline constexpr bool per_sample_collate_v =
    std::same_as<C, DefaultConvert> ||
    (!std::invocable<C&, std::vector<S>&&> && std::invocable<C&, S&&>);

/// How the loader fetches one batch, from the richest member the dataset offers.
enum class FetchPath {
  samples,            // get (or the stream), then collate
  samples_async,      // get_async for every index at once, then collate
  batch_of_samples,   // get_batch returns the samples, then collate
  whole_batch,        // get_batch returns the batch itself (default collate)
  whole_batch_async,  // get_batch_async returns the batch itself (default collate)
};

template <class D, class C>
consteval FetchPath choose_fetch_path() {
  if constexpr (IterableDataset<D>) {
    return FetchPath::samples;
  } else {
    using S = sample_t<D>;
    constexpr bool default_collate = std::same_as<C, DefaultCollate>;
    if constexpr (per_sample_collate_v<C, S>) {
      // As PyTorch without automatic batching: one sample at a time, never get_batch.
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    } else if constexpr (AsyncBatchedDataset<D> && default_collate) {
      return FetchPath::whole_batch_async;
    } else if constexpr (BatchedDataset<D>) {
      using Fetched = std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
          std::declval<std::span<const Index>>()))>;
      if constexpr (std::same_as<Fetched, std::vector<S>>) return FetchPath::batch_of_samples;
      if constexpr (default_collate) return FetchPath::whole_batch;
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    } else {
      return AsyncGet<D> ? FetchPath::samples_async : FetchPath::samples;
    }
  }
}

/// How the loader builds a batch from a dataset D with collate C, and what the batch is.
template <class D, class C>
struct FetchPlan {
  using sample = loader_sample_t<D>;
  static constexpr FetchPath path = choose_fetch_path<D, C>();
  static constexpr bool per_sample = per_sample_collate_v<C, sample>;
  static constexpr bool whole_batch = path == FetchPath::whole_batch;
  static constexpr bool batch_of_samples = path == FetchPath::batch_of_samples;
  static constexpr bool is_async =
      path == FetchPath::samples_async || path == FetchPath::whole_batch_async;

 private:
  static auto batch_probe() {
    if constexpr (path == FetchPath::whole_batch) {
      return std::type_identity<std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
          std::declval<std::span<const Index>>()))>>{};
    } else if constexpr (path == FetchPath::whole_batch_async) {
      return std::type_identity<typename TaskValue<std::remove_cvref_t<decltype(
          std::declval<D&>().get_batch_async(std::declval<std::span<const Index>>(),
                                             std::declval<BatchContext&>()))>>::type>{};
    } else if constexpr (per_sample) {
      return std::type_identity<std::invoke_result_t<C&, sample&&>>{};
    } else {
      // NOTE: only here is collate asked to take the samples: it need not accept them when
      // get_batch builds the batch.
      return std::type_identity<std::invoke_result_t<C&, std::vector<sample>&&>>{};
    }
  }

 public:
  using batch = typename decltype(batch_probe())::type;
};

/// A fire-and-forget coroutine: starts at once, frees itself when done. Bodies catch what the
/// dataset, sampler and collate throw; an allocation failure in the loader's own hand-off
/// (posting to a queue) terminates, as it would in any executor.
struct Detached {
  struct promise_type {
    Detached get_return_object() const noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
  };
};

/// Thrown inside a fetch when its epoch was cancelled; never reaches a consumer.
struct Cancelled {};

template <class D, class C>
class LoaderCore;

/// Where an epoch stands for its consumer: what LoaderState records of it.
struct EpochPosition {
  std::int64_t epoch = 0;
  DeliveredSet done;
  StreamMarks marks;
  std::vector<std::uint8_t> generator;
  bool ended = false;  // the consumer has seen the epoch's end
};

/// The position of the epoch its consumer stopped last, kept by the loader and every run, so
/// that state() still knows it once the stopped run is gone.
struct StoppedEpoch {
  std::mutex mutex;
  std::optional<EpochPosition> position;
};

/// What every epoch shares, whatever feeds it: the consumer-side entry points, the in-flight
/// bound, the reorder ring, the timeout and the end. Fields marked "driver" are touched only on
/// the driver thread.
///
/// Each dispatched batch number completes exactly once, with a batch, an error, or nothing at
/// all (a skip: an iterable worker that had no more samples); skips keep their place in the
/// order but are never handed to the consumer.
template <class D, class C>
class RunBase : public EpochChannel<typename FetchPlan<D, C>::batch>,
                public std::enable_shared_from_this<RunBase<D, C>> {
 public:
  using Batch = typename FetchPlan<D, C>::batch;
  using Core = LoaderCore<D, C>;

  /// `resumed`: the batches of this epoch that a saved state says were delivered already;
  /// they are not delivered again. `generator`: the loader's generator state that the epoch's
  /// draws started from (what LoaderState records).
  RunBase(Core& core, std::int64_t epoch, std::uint64_t base_seed, DeliveredSet resumed,
          std::vector<std::uint8_t> generator)
      : core_(core),
        epoch_(epoch),
        base_seed_(base_seed),
        sample_seed_(core.options.seed.value_or(base_seed)),
        bound_(core.in_flight_bound()),
        timeout_(core.options.timeout),
        resumed_(std::move(resumed)),
        start_generator_(std::move(generator)),
        stopped_(core.stopped),
        reorder_(static_cast<std::size_t>(bound_)) {
    this->handoff.set_done(resumed_);
    // NOTE: only a loader with a timeout makes a timer: once a timer exists, Asio's driver
    // sleeps in epoll rather than on a condition variable, and every post costs a syscall.
    if (core.options.timeout > 0) timer_.emplace(core.driver.context());
    const int n = core.options.num_workers;
    workers_.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      workers_.push_back(WorkerInfo{i, n, base_seed + static_cast<std::uint64_t>(i),
                                    static_cast<const void*>(&core.dataset), core.rank,
                                    core.world_size});
    }
  }

  std::int64_t epoch() const noexcept { return epoch_; }
  std::uint64_t base_seed() const noexcept { return base_seed_; }
  std::uint64_t sample_seed() const noexcept { return sample_seed_; }
  /// The workers' infos for this epoch, indexed by worker id (empty without workers).
  const WorkerInfo* worker_infos() const noexcept {
    return workers_.empty() ? nullptr : workers_.data();
  }
  /// What an asynchronous fetch's move to a worker runs there: worker_init_fn, once per
  /// worker per epoch (once ever with persistent_workers).
  const std::function<void(const WorkerInfo&)>* on_worker() const noexcept {
    return &on_worker_;
  }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }
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
      asio::post(core_.driver.context(),
                 [self = this->shared_from_this()] { self->on_slot_freed(); });
    }
  }
  void arm_timeout(std::uint64_t generation, std::int64_t batch) override {
    if (timeout_ <= 0 || closed_.load()) return;
    waited_batch_.store(batch, std::memory_order_relaxed);
    asio::post(core_.driver.context(), [self = this->shared_from_this(), generation] {
      self->on_arm(generation);
    });
  }
  std::exception_ptr timeout_error() const override {
    return std::make_exception_ptr(
        TimeoutError(waited_batch_.load(std::memory_order_relaxed), timeout_));
  }
  void cancel() override {
    // The consumer stops here: remember where, for state() after this run is gone.
    // NOTE: Epoch::stop() is noexcept, and the copy allocates: out of memory, the stop goes on
    // without recording its position rather than terminating.
    try {
      EpochPosition at = position();
      std::lock_guard lock(stopped_->mutex);
      // An older epoch's late stop does not hide a newer one's position.
      if (!stopped_->position || stopped_->position->epoch <= epoch_) {
        stopped_->position = std::move(at);
      }
    } catch (...) {
    }
    if (cancelled_.exchange(true) || closed_.load()) return;
    asio::post(core_.driver.context(), [self = this->shared_from_this()] { self->on_cancel(); });
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
    if (cancelled() || dropped) {
      maybe_finish();
      return;
    }
    // Delivered before the state this epoch resumed from: it takes its place as a skip.
    if (resumed_.contains(batch_no)) outcome = Outcome<Batch>{};
    outcome.number = batch_no;
    const std::int64_t skipped_before = skipped_;
    if (!core_.options.in_order) {
      deliver(std::move(outcome));
    } else {
      reorder_[static_cast<std::size_t>(batch_no % bound_)] = std::move(outcome);
      for (;;) {
        auto& slot = reorder_[static_cast<std::size_t>(delivered_ % bound_)];
        if (!slot) break;
        deliver(std::move(*slot));
        slot.reset();
      }
    }
    // A skip frees its place under the bound without the consumer: wake a waiting dispatcher.
    if (skipped_ != skipped_before && !full()) on_slot_freed();
    maybe_finish();
  }

  /// Driver: true when `bound_` batches are between dispatch and the consumer.
  bool full() const noexcept { return dispatched_ - consumed_.load() - skipped_ >= bound_; }

  /// Driver: nothing more will be dispatched (after an error, if any, from the dispatcher).
  void dispatch_done(std::exception_ptr error) {
    dispatch_error_ = std::move(error);
    dispatch_done_ = true;
    maybe_finish();
  }

  Core& core_;
  const std::int64_t epoch_;
  const std::uint64_t base_seed_;
  const std::uint64_t sample_seed_;
  const std::int64_t bound_;
  const double timeout_;
  std::vector<WorkerInfo> workers_;
  const DeliveredSet resumed_;
  const std::vector<std::uint8_t> start_generator_;
  const std::shared_ptr<StoppedEpoch> stopped_;
  const std::function<void(const WorkerInfo&)> on_worker_ = [this](const WorkerInfo& info) {
    core_.init_worker(info, epoch_);
  };
  // driver
  std::int64_t dispatched_ = 0;

 private:
  void deliver(Outcome<Batch> outcome) {
    ++delivered_;
    if (!outcome.batch && !outcome.error) {
      ++skipped_;
      this->handoff.note_done(outcome.number);
      return;
    }
    if (core_.stage) {
      ++staging_;
      to_device(this->shared_from_this(), std::move(outcome));
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
  static Detached to_device(std::shared_ptr<RunBase> self, Outcome<Batch> outcome) {
    Core& core = self->core_;
    ++core.live;
    bool failed = false;
    if (outcome.batch) {
      warn_if_opaque(*outcome.batch);
      try {
        auto copied = co_await core.stage->copy(std::move(*outcome.batch));
        outcome.batch.emplace(std::move(copied.batch));
      } catch (...) {
        outcome.batch.reset();
        outcome.error = std::current_exception();
        failed = true;
      }
    }
    if (!outcome.batch || failed) {
      try {
        co_await core.stage->fence();
      } catch (...) {
        // The device failed: the order behind earlier copies cannot be kept; deliver anyway.
        if (!outcome.error) outcome.error = std::current_exception();
      }
    }
    self->handoff.push(std::move(outcome));
    --self->staging_;
    self->maybe_finish();
    --core.live;
    core.maybe_stop();
  }

  void maybe_finish() {
    if (finished_ || !dispatch_done_ || staging_ > 0) return;
    if (cancelled() ? completed_ != dispatched_ : delivered_ != dispatched_) return;
    finished_ = true;
    // Nothing of the driver is needed any more: drop the timer (it lives on the driver's
    // io_context) and close the consumer-side entry points.
    timer_.reset();
    closed_.store(true);
    if (dispatch_error_ && !cancelled()) {
      Outcome<Batch> end;
      end.error = dispatch_error_;
      this->handoff.push(std::move(end));
    }
    // NOTE: worker processes that end with the epoch are gone before the consumer sees its end.
    core_.run_finished([self = this->shared_from_this()] { self->handoff.finish(); });
  }

  void on_slot_freed() {
    if (slot_waiter_) std::exchange(slot_waiter_, nullptr).resume();
  }
  void on_arm(std::uint64_t generation) {
    if (finished_ || !timer_) return;
    timer_->expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(timeout_)));
    timer_->async_wait([self = this->shared_from_this(), generation](std::error_code ec) {
      if (!ec) self->handoff.expire(generation);
    });
  }
  void on_cancel() {
    if (timer_) timer_->cancel();
    on_slot_freed();
    maybe_finish();
  }

  std::atomic<bool> cancelled_{false};
  std::atomic<bool> closed_{false};
  std::atomic<std::int64_t> waited_batch_{0};
  std::atomic<std::int64_t> consumed_{0};
  std::atomic<bool> slot_wanted_{false};
  // driver
  std::int64_t completed_ = 0;
  std::int64_t delivered_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t staging_ = 0;  // batches on their way to the device
  bool dispatch_done_ = false;
  bool finished_ = false;
  std::exception_ptr dispatch_error_;
  std::vector<std::optional<Outcome<Batch>>> reorder_;
  std::coroutine_handle<> slot_waiter_;
  std::optional<asio::steady_timer> timer_;
};

/// One epoch over a map-style dataset: the batch sampler's index lists, each fetched and
/// collated on whichever worker is free.
template <class D, class C>
class EpochRun final : public RunBase<D, C> {
  using Base = RunBase<D, C>;

 public:
  using typename Base::Batch;
  using typename Base::Core;
  using Base::Base;

  /// Driver: walks the batch sampler, keeping at most `bound_` batches between dispatch and
  /// consumer.
  static Detached run(std::shared_ptr<EpochRun> self) {
    Core& core = self->core_;
    ++core.live;
    std::exception_ptr error;
    try {
      core.start_workers();
      // On the driver: a stopped epoch's dispatcher may still be reading the sampler here.
      core.batch_sampler.set_epoch(self->epoch_);
      auto batches = core.batch_sampler.batches();
      for (;;) {
        while (self->full() && !self->cancelled()) co_await self->slot();
        if (self->cancelled()) break;
        // A worker process died and was not restarted: the epoch ends after its error.
        if (core.pool && core.pool->broken()) break;
        std::vector<Index>* indices = co_await batches.next();
        if (!indices) break;
        if (self->resumed_.contains(self->dispatched_)) {
          // Delivered before the state this epoch resumed from: not fetched again.
          self->complete(self->dispatched_++, Outcome<Batch>(), false);
          continue;
        }
        if (core.pool) {
          fetch_in_process(self, self->dispatched_++, std::move(*indices));
        } else {
          fetch(self, self->dispatched_++, std::move(*indices));
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    self->dispatch_done(std::move(error));
    --core.live;
    core.maybe_stop();
  }

 private:
  /// Fetches and collates one batch, on a worker when there are workers. An asynchronous
  /// fetch starts on the driver (where its reads are submitted) and moves onto a worker
  /// itself, with `co_await ctx.cpu()`.
  static Detached fetch(std::shared_ptr<EpochRun> self, std::int64_t batch_no,
                        std::vector<Index> indices) {
    Core& core = self->core_;
    ++core.live;
    if constexpr (Core::Plan::is_async) {
      Outcome<Batch> outcome;
      bool dropped = self->cancelled();
      if (!dropped) {
        try {
          outcome.batch.emplace(co_await core.fetch_batch_async(*self, indices, batch_no));
        } catch (const Cancelled&) {
          dropped = true;
        } catch (const EmptyBatch&) {
          // Every sample was skipped: the batch number completes as a skip.
        } catch (...) {
          outcome.error = std::current_exception();
        }
        set_worker_info(nullptr);
        if (!core.driver.on_driver_thread()) co_await core.driver.schedule();
      }
      self->complete(batch_no, std::move(outcome), dropped);
    } else {
      const bool hop = core.executor != nullptr;
      if (hop) co_await core.executor->schedule();
      Outcome<Batch> outcome;
      bool dropped = self->cancelled();
      if (!dropped) {
        const int worker = hop ? ThreadExecutor::current_worker_id() : -1;
        const WorkerInfo* info =
            hop ? &self->workers_[static_cast<std::size_t>(worker)] : nullptr;
        set_worker_info(info);
        try {
          if (info) core.init_worker(*info, self->epoch_);
          outcome.batch.emplace(
              core.place_batch([&] { return core.fetch_batch(*self, indices, info, batch_no); }));
        } catch (const Cancelled&) {
          dropped = true;
        } catch (const EmptyBatch&) {
          // Every sample was skipped: the batch number completes as a skip.
        } catch (...) {
          outcome.error = std::current_exception();
        }
        set_worker_info(nullptr);
      }
      if (hop) co_await core.driver.schedule();
      self->complete(batch_no, std::move(outcome), dropped);
    }
    --core.live;
    core.maybe_stop();
  }

  /// Fetches one batch in a worker process: the indices go out over its socket, the batch
  /// comes back in a shared-memory slot. Runs on the driver throughout.
  static Detached fetch_in_process(std::shared_ptr<EpochRun> self, std::int64_t batch_no,
                                   std::vector<Index> indices) {
    Core& core = self->core_;
    ++core.live;
    Outcome<Batch> outcome;
    bool dropped = self->cancelled();
    if (!dropped) {
      try {
        ProcessTask task;
        task.kind = ProcessTask::Kind::fetch;
        task.batch = batch_no;
        task.epoch = self->epoch_;
        task.worker_seed = self->base_seed_;
        task.sample_seed = self->sample_seed_;
        task.indices = std::move(indices);
        auto result = co_await core.pool->submit(-1, std::move(task));
        if (auto batch = core.take_result(std::move(result))) {
          // NOTE: a batch in the (registered) arena is pinned already; pin_batch passes it on.
          outcome.batch.emplace(core.pinned ? pin_batch(std::move(*batch), *core.pinned)
                                            : std::move(*batch));
        }
      } catch (const Cancelled&) {
        dropped = true;
      } catch (const EmptyBatch&) {
        // Every sample was skipped.
      } catch (const BatchLost&) {
        // The batch was queued on a worker that died (its WorkerDied reports the death).
      } catch (...) {
        outcome.error = std::current_exception();
      }
    }
    self->complete(batch_no, std::move(outcome), dropped);
    --core.live;
    core.maybe_stop();
  }
};

/// Pulls samples from a Generator or an AsyncGenerator, one at a time.
template <class G>
class StreamCursor {
 public:
  using pointer = typename G::pointer;
  explicit StreamCursor(G generator) : generator_(std::move(generator)) {}
  /// The next sample, or nullptr at the end.
  pointer next_sync() {
    if (!it_) {
      it_.emplace(generator_.begin());
    } else {
      ++*it_;
    }
    return *it_ == std::default_sentinel ? nullptr : std::addressof(**it_);
  }

 private:
  G generator_;
  std::optional<decltype(std::declval<G&>().begin())> it_;
};
template <class T>
class StreamCursor<AsyncGenerator<T>> {
 public:
  explicit StreamCursor(AsyncGenerator<T> generator) : generator_(std::move(generator)) {}
  /// Awaitable of the next sample, or nullptr at the end.
  auto next_async() { return generator_.next(); }

 private:
  AsyncGenerator<T> generator_;
};

/// One epoch over an iterable dataset, as PyTorch's loader runs an IterableDataset: each
/// worker streams from its own replica; batch n is asked of the n-th worker in round-robin
/// order, so with `in_order` the batches interleave worker by worker; a worker whose stream
/// ends leaves the rotation, and its last partial batch is kept or dropped (drop_last) on its
/// own. A worker whose stream throws delivers the error and, its stream being over, leaves.
template <class D, class C>
class StreamRun final : public RunBase<D, C> {
  using Base = RunBase<D, C>;
  using Plan = FetchPlan<D, C>;
  using Sample = typename Plan::sample;

 public:
  using typename Base::Batch;
  using typename Base::Core;

  StreamRun(Core& core, std::int64_t epoch, std::uint64_t base_seed, DeliveredSet resumed,
            std::vector<std::uint8_t> generator)
      : Base(core, epoch, base_seed, std::move(resumed), std::move(generator)),
        skip_counts_(static_cast<std::size_t>(std::max(1, core.options.num_workers)), 0),
        queues_(static_cast<std::size_t>(std::max(1, core.options.num_workers))) {}

  /// Driver: hands batch numbers to the active workers in turn, under the in-flight bound.
  static Detached run(std::shared_ptr<StreamRun> self) {
    Core& core = self->core_;
    ++core.live;
    try {
      core.start_workers();
    } catch (...) {
      self->queues_closed_ = true;
      self->dispatch_done(std::current_exception());
      --core.live;
      core.maybe_stop();
      co_return;
    }
    for (int w = 0; w < static_cast<int>(self->queues_.size()); ++w) {
      if (core.pool) {
        stream_in_process(self, w);
      } else {
        stream_worker(self, w);
      }
    }
    for (;;) {
      while (self->full() && !self->cancelled()) co_await self->slot();
      if (self->cancelled()) break;
      const int w = self->next_active_worker();
      if (w < 0) break;
      auto& queue = self->queues_[static_cast<std::size_t>(w)];
      queue.tasks.push_back(self->dispatched_++);
      if (queue.waiter) std::exchange(queue.waiter, nullptr).resume();
    }
    // No more batch numbers: idle workers end, busy ones end after their queued tasks.
    self->queues_closed_ = true;
    for (auto& queue : self->queues_) {
      if (queue.waiter) std::exchange(queue.waiter, nullptr).resume();
    }
    self->dispatch_done(nullptr);
    --core.live;
    core.maybe_stop();
  }

 private:
  struct WorkerQueue {
    std::deque<std::int64_t> tasks;
    std::coroutine_handle<> waiter;
    bool active = true;
  };

  /// Driver: the next batch number for worker `w`, or nothing once the queues are closed.
  struct TaskAwaiter {
    StreamRun* run;
    int w;
    WorkerQueue& queue() const { return run->queues_[static_cast<std::size_t>(w)]; }
    bool await_ready() const noexcept { return !queue().tasks.empty() || run->queues_closed_; }
    void await_suspend(std::coroutine_handle<> h) noexcept { queue().waiter = h; }
    std::optional<std::int64_t> await_resume() const {
      auto& tasks = queue().tasks;
      if (tasks.empty()) return std::nullopt;
      const std::int64_t n = tasks.front();
      tasks.pop_front();
      return n;
    }
  };

  // Each worker's saved stream state, for an epoch resumed from a LoaderState (read-only once
  // the epoch runs).
  std::map<int, std::string> resume_states_;
  // Batches (or errors) of each worker's stream to drop, delivered before the state this epoch
  // resumed from (a stream without a saved state is fast-forwarded).
  std::vector<std::int64_t> skip_counts_;  // element w: worker w only, once the epoch runs

  /// Worker `w` (its thread, or the driver): true when `outcome` was delivered before the
  /// state this epoch resumed from; it is then emptied, and the worker fetches again.
  bool drop_delivered(int w, Outcome<Batch>& outcome, bool dropped) {
    auto& skip = skip_counts_[static_cast<std::size_t>(w)];
    if (dropped || skip == 0 || (!outcome.batch && !outcome.error)) return false;
    --skip;
    outcome = Outcome<Batch>{};
    return true;
  }

  /// Driver: worker `w`'s outcome for batch number `n`, marked with its worker.
  void hand_on(int w, std::int64_t n, Outcome<Batch> outcome, bool dropped) {
    if (outcome.batch || outcome.error) outcome.stream_worker = w;
    this->complete(n, std::move(outcome), dropped);
  }

 public:
  /// Before the epoch runs: resume each worker's stream from `marks` (its saved state, or by
  /// dropping as many of its batches as were delivered), the rotation after the worker of the
  /// last delivered batch.
  void resume_streams(StreamMarks marks) {
    resume_states_ = marks.states;
    std::int64_t dropped = 0;
    for (const auto& [w, count] : marks.counts) {
      if (w < 0 || w >= static_cast<int>(skip_counts_.size())) continue;
      if (!resume_states_.count(w)) {
        skip_counts_[static_cast<std::size_t>(w)] = count;
        dropped += count;
      }
    }
    if (dropped > 0) warn_fast_forward(dropped);
    const int n = static_cast<int>(queues_.size());
    if (marks.last_worker >= 0 && n > 0) next_worker_ = (marks.last_worker + 1) % n;
    this->handoff.set_marks(std::move(marks));
  }

 private:
  /// Driver: the next worker in the rotation still streaming, or -1 when none is.
  int next_active_worker() {
    const int n = static_cast<int>(queues_.size());
    for (int i = 0; i < n; ++i) {
      const int w = next_worker_;
      next_worker_ = (next_worker_ + 1) % n;
      if (queues_[static_cast<std::size_t>(w)].active) return w;
    }
    return -1;
  }

  /// Worker `w` for this epoch: takes batch numbers from its queue and fills each from its
  /// stream, on its own worker thread (on the driver when there are no workers).
  static Detached stream_worker(std::shared_ptr<StreamRun> self, int w) {
    Core& core = self->core_;
    ++core.live;
    const bool hop = core.executor != nullptr;
    const std::size_t want = Plan::per_sample ? 1 : static_cast<std::size_t>(*core.options.batch_size);
    // Without workers the stream still gets a WorkerInfo, though get_worker_info() stays empty.
    WorkerInfo solo{0, 1, self->base_seed_, static_cast<const void*>(&core.dataset), core.rank,
                    core.world_size};
    WorkerInfo& info = hop ? self->workers_[static_cast<std::size_t>(w)] : solo;
    std::shared_ptr<D> replica;
    std::optional<StreamCursor<stream_t<D>>> cursor;
    bool over = false;
    for (;;) {
      std::optional<std::int64_t> task = co_await TaskAwaiter{self.get(), w};
      if (!task) break;
      if (over || self->cancelled()) {
        self->complete(*task, {}, self->cancelled());
        continue;
      }
      if (hop) co_await core.executor->schedule_on(w);
      Outcome<Batch> outcome;
      bool dropped = false;
      bool ended = false;
      std::vector<Sample> samples;
      if (hop) set_worker_info(&info);
      // NOTE: a resumed epoch drops the batches this worker had delivered before, without
      // giving up this batch number: the rotation stays that of the interrupted run.
      for (;;) {
        try {
          if (!cursor) {
            if (hop) {
              core.init_worker(info, self->epoch_);
              replica = core.replica(w);
              info.dataset = static_cast<const void*>(replica.get());
            }
            D& dataset = replica ? *replica : core.dataset;
            try {
              if constexpr (ResumableStream<D>) {
                if (auto it = self->resume_states_.find(w); it != self->resume_states_.end()) {
                  dataset.load_state(it->second);
                }
              }
              cursor.emplace(dataset.stream(std::as_const(info)));
            } catch (...) {
              throw wrap_current_exception(hop ? w : -1, *task, -1, "starting the stream for");
            }
          }
          samples.reserve(want);
          while (samples.size() < want) {
            if (self->cancelled()) throw Cancelled{};
            typename stream_t<D>::pointer sample = nullptr;
            try {
              if constexpr (async_stream_v<D>) {
                const auto thread = std::this_thread::get_id();
                sample = co_await cursor->next_async();
                // A stream that awaited something may resume elsewhere: come back to this
                // worker's thread (or the driver) before going on.
                if (std::this_thread::get_id() != thread) {
                  if (hop) {
                    co_await core.executor->schedule_on(w);
                  } else {
                    co_await core.driver.schedule();
                  }
                }
              } else {
                sample = cursor->next_sync();
              }
            } catch (...) {
              ended = true;
              throw wrap_current_exception(hop ? w : -1, *task, -1, "fetching");
            }
            if (!sample) {
              ended = true;
              break;
            }
            samples.push_back(std::move(*sample));
          }
          const bool partial = samples.size() < want;
          if constexpr (ResumableStream<D>) {
            if (core.stream_states_usable()) {
              const D& streamed = replica ? *replica : core.dataset;
              outcome.stream_state = std::make_shared<const std::string>(streamed.state());
            }
          }
          if (!samples.empty() && !(partial && core.options.drop_last)) {
            outcome.batch.emplace(core.place_batch([&] {
              return core.collate_samples(std::move(samples), hop ? w : -1, *task);
            }));
          }
        } catch (const Cancelled&) {
          dropped = true;
        } catch (...) {
          outcome.error = std::current_exception();
          ended = true;
        }
        if (!self->drop_delivered(w, outcome, dropped) || ended) break;
        samples.clear();
      }
      if (hop) set_worker_info(nullptr);
      if (hop) co_await core.driver.schedule();
      if (ended) {
        over = true;
        self->queues_[static_cast<std::size_t>(w)].active = false;
      }
      self->hand_on(w, *task, std::move(outcome), dropped);
    }
    // NOTE: the stream (and with it the replica's generator frame) ends here, on the driver.
    cursor.reset();
    replica.reset();
    --core.live;
    core.maybe_stop();
  }

  /// Worker process `w` for this epoch: asks its process for one batch of its stream per
  /// batch number (the process keeps the stream between them).
  static Detached stream_in_process(std::shared_ptr<StreamRun> self, int w) {
    Core& core = self->core_;
    ++core.live;
    bool over = false;
    for (;;) {
      std::optional<std::int64_t> task = co_await TaskAwaiter{self.get(), w};
      if (!task) break;
      if (over || self->cancelled()) {
        self->complete(*task, {}, self->cancelled());
        continue;
      }
      Outcome<Batch> outcome;
      bool dropped = false;
      for (;;) {
        try {
          ProcessTask t;
          t.kind = ProcessTask::Kind::stream;
          t.batch = *task;
          t.epoch = self->epoch_;
          t.worker_seed = self->base_seed_;
          t.sample_seed = self->sample_seed_;
          t.want = Plan::per_sample ? 1 : *core.options.batch_size;
          auto result = co_await core.pool->submit(w, std::move(t));
          over = result.reply.stream_over;
          if (auto batch = core.take_result(std::move(result))) outcome.batch.emplace(std::move(*batch));
        } catch (const Cancelled&) {
          dropped = true;
        } catch (const EmptyBatch&) {
          over = true;
        } catch (const BatchLost&) {
          over = true;
        } catch (...) {
          outcome.error = std::current_exception();
          over = true;
        }
        if (!self->drop_delivered(w, outcome, dropped) || over) break;
      }
      if (over) self->queues_[static_cast<std::size_t>(w)].active = false;
      self->hand_on(w, *task, std::move(outcome), dropped);
    }
    --core.live;
    core.maybe_stop();
  }

  std::vector<WorkerQueue> queues_;  // driver
  int next_worker_ = 0;              // driver
  bool queues_closed_ = false;       // driver
};

/// What a DataLoader owns, at a stable address that its coroutines can refer to.
template <class D, class C>
class LoaderCore {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  static constexpr bool iterable = IterableDataset<D>;
  using Run = std::conditional_t<iterable, StreamRun<D, C>, EpochRun<D, C>>;

  /// The copy of a loader that a fork-server worker builds from its payload: no driver thread,
  /// no workers, nothing to validate; it only serves child_main.
  struct ChildOnly {};
  LoaderCore(ChildOnly, D ds, LoaderOptions<C> opts)
      : dataset(std::move(ds)), options(std::move(opts)), driver(Driver::Idle{}) {
    rank = options.rank.value_or(0);
    world_size = options.world_size.value_or(1);
    worker_init_epoch.assign(static_cast<std::size_t>(options.num_workers), -1);
  }

  LoaderCore(D ds, LoaderOptions<C> opts) : dataset(std::move(ds)), options(std::move(opts)) {
    validate_options(options, LoaderKind{iterable, Plan::per_sample});
    check_worker_number(options.num_workers);
    if (options.seed) generator = make_generator(*options.seed);
    if (!options.rank || !options.world_size) {
      const DistributedEnv env = distributed_env();
      rank = options.rank.value_or(env.rank);
      world_size = options.world_size.value_or(env.world_size);
    } else {
      rank = *options.rank;
      world_size = *options.world_size;
    }
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      throw std::invalid_argument("Invalid rank " + std::to_string(rank) +
                                  ", rank should be in the interval [0, " +
                                  std::to_string(world_size - 1) + "]");
    }
    if constexpr (!iterable) batch_sampler = make_batch_sampler();
    worker_init_epoch.assign(static_cast<std::size_t>(options.num_workers), -1);
    replicas.resize(static_cast<std::size_t>(options.num_workers));
    setup_device();
    if (options.executor == Executor::processes) {
      make_pool();
    } else if (options.num_workers > 0) {
      executor = std::make_unique<ThreadExecutor>(options.num_workers);
    }
    if constexpr (Plan::is_async) reader = std::make_unique<io::Reader>(driver.context());
  }

  ~LoaderCore() {
    if (auto run = current.lock()) run->cancel();
    asio::post(driver.context(), [this] {
      stopping = true;
      // Fetches waiting on worker processes end now (dropped), and the processes are told to go.
      if (pool) pool->shutdown(std::make_exception_ptr(Cancelled{}));
      maybe_stop();
    });
    driver.join();
    pool.reset();  // waits for the processes, SIGKILL after a grace period
    executor.reset();
    // NOTE: the driver ran until every copy in flight had completed: nothing reads the slabs.
    stage.reset();
    pinned.reset();
  }

  /// Driver: forks the worker processes that are not running (at each epoch's start).
  void start_workers() {
    if (pool) pool->start();
  }
  /// Driver: an epoch has ended; without persistent_workers its processes go with it.
  template <class F>
  void run_finished(F done) {
    if (pool && !options.persistent_workers) {
      pool->retire(std::move(done));
    } else {
      done();
    }
  }

  /// A worker process's answer as a batch: decoded over its slot without a copy; nothing when
  /// every sample was skipped; its error as a WorkerError.
  std::optional<Batch> take_result(ProcessResult result) {
    const auto& r = result.reply;
    if (r.skipped) skips.add(r.skipped);
    if (r.status == ProcessReply::Status::error) {
      throw WorkerError(r.error_what, result.worker, r.batch, r.error_index, r.error_type,
                        r.error_message, nullptr);
    }
    if (!result.lease) {
      if (r.status == ProcessReply::Status::empty && !r.stream_over) throw EmptyBatch{};
      return std::nullopt;
    }
    if constexpr (wire::Wireable<Batch>) {
      return wire::decode<Batch>(result.bytes, static_cast<std::size_t>(r.offset),
                                 std::move(result.lease));
    } else {
      throw std::logic_error("unreachable: a batch type without a wire format");
    }
  }

  std::int64_t in_flight_bound() const noexcept {
    // NOTE: with no workers the driver still fetches up to two batches ahead of the consumer.
    return options.num_workers > 0
               ? static_cast<std::int64_t>(options.prefetch_factor.value_or(2)) *
                     options.num_workers
               : 2;
  }

  std::shared_ptr<Run> start_epoch() {
    if (auto run = current.lock(); run && !run->cancelled() && !run->handoff.ended()) {
      throw std::logic_error("DataLoader: epoch " + std::to_string(run->epoch()) +
                             " is still in progress; finish or destroy it before starting "
                             "another");
    }
    // As PyTorch's iterator: the base seed is drawn before the sampler's first draw, from the
    // loader's generator (`seed`) or ATen's default one.
    auto start_state = generator_state(generator);
    const std::uint64_t base_seed = draw_seed(generator);
    DeliveredSet resumed;
    if (resume_from) {
      resumed = std::move(*resume_from);
      resume_from.reset();
    }
    auto run = std::make_shared<Run>(*this, epochs_started++, base_seed, std::move(resumed),
                                     std::move(start_state));
    if constexpr (iterable) {
      if (resume_marks) {
        run->resume_streams(std::move(*resume_marks));
        resume_marks.reset();
      }
    }
    current = run;
    asio::post(driver.context(), [run] { Run::run(run); });
    return run;
  }

  /// What must match between a saved state and the loader that loads it.
  LoaderState identity() const {
    LoaderState s;
    if constexpr (requires(const D& d) { d.size(); }) {
      s.dataset_size = static_cast<std::int64_t>(dataset.size());
    }
    s.batch_size = options.batch_size.value_or(-1);
    s.seed = options.seed;
    if constexpr (iterable) s.stream_workers = options.num_workers;
    s.rank = rank;
    s.world_size = world_size;
    return s;
  }

  /// True when each stream's state() describes that worker's stream alone: the dataset has
  /// state()/load_state(), each worker streams its own copy, and in this process.
  bool stream_states_usable() const {
    if constexpr (ResumableStream<D>) {
      return options.executor != Executor::processes &&
             (std::is_copy_constructible_v<D> || options.num_workers <= 1);
    } else {
      return false;
    }
  }

  static std::vector<LoaderState::Stream> streams_of(const StreamMarks& marks) {
    std::vector<LoaderState::Stream> out;
    for (const auto& [w, count] : marks.counts) {
      LoaderState::Stream st;
      st.worker = w;
      st.delivered = count;
      if (auto it = marks.states.find(w); it != marks.states.end()) st.state = it->second;
      out.push_back(std::move(st));
    }
    return out;
  }

  /// Where the loader stands: mid-epoch while the current epoch's consumer has not seen its
  /// end (even if the epoch was abandoned), else at the start of the next epoch.
  LoaderState state() const {
    LoaderState s = identity();
    std::optional<EpochPosition> at;
    auto run = current.lock();
    if (resume_from) {
      // Loaded and not started yet: the loaded state, whatever an old run still drains.
    } else if (run) {
      if (!run->handoff.ended()) at = run->position();
    } else {
      // The run is gone: its consumer stopped it, or saw its end.
      std::lock_guard lock(stopped->mutex);
      if (stopped->position && stopped->position->epoch == epochs_started - 1 &&
          !stopped->position->ended) {
        at = stopped->position;
      }
    }
    if (at) {
      s.epoch = at->epoch;
      s.delivered = at->done.prefix();
      s.beyond = at->done.beyond();
      s.generator = std::move(at->generator);
      s.streams = streams_of(at->marks);
      s.last_stream = at->marks.last_worker;
    } else if (resume_from) {
      // Loaded but not started yet: the loaded state, unchanged.
      s.epoch = epochs_started;
      s.delivered = resume_from->prefix();
      s.beyond = resume_from->beyond();
      s.generator = generator_state(generator);
      if (resume_marks) {
        s.streams = streams_of(*resume_marks);
        s.last_stream = resume_marks->last_worker;
      }
    } else {
      s.epoch = epochs_started;
      s.generator = generator_state(generator);
    }
    return s;
  }

  /// Makes the next epoch the one `saved` was taken in, minus the batches it had delivered.
  void load_state(const LoaderState& saved) {
    if (auto run = current.lock(); run && !run->handoff.ended() && !run->cancelled()) {
      throw std::logic_error("DataLoader: load_state while epoch " +
                             std::to_string(run->epoch()) + " is in progress");
    }
    check_compatible(saved, identity());
    set_generator_state(generator, saved.generator);
    epochs_started = saved.epoch;
    resume_marks.reset();
    if constexpr (iterable) {
      // Per worker: its stream continues from its saved state where it has one (and states can
      // be used here), else from its start, dropping the batches it had delivered.
      StreamMarks marks;
      marks.last_worker = saved.last_stream;
      for (const auto& st : saved.streams) {
        marks.counts[st.worker] = st.delivered;
        if (st.state && stream_states_usable()) marks.states[st.worker] = *st.state;
      }
      resume_marks.emplace(std::move(marks));
      resume_from.emplace();
      return;
    }
    resume_from.emplace(saved.delivered, saved.beyond);
  }

  std::int64_t size() const {
    if constexpr (iterable) {
      // As len(DataLoader) over an IterableDataset: from the dataset's own length.
      if constexpr (requires(const D& d) { d.size(); }) {
        const auto n = static_cast<std::int64_t>(dataset.size());
        if (!options.batch_size) return n;
        const std::int64_t b = *options.batch_size;
        return options.drop_last ? n / b : (n + b - 1) / b;
      } else {
        throw std::logic_error("DataLoader: the iterable dataset has no size()");
      }
    } else {
      auto n = batch_sampler.size();
      if (!n) throw std::logic_error("DataLoader: the batch sampler has no size()");
      return *n;
    }
  }

  void init_worker(const WorkerInfo& info, std::int64_t epoch) {
    auto& last = worker_init_epoch[static_cast<std::size_t>(info.id)];
    if (last >= 0 && (options.persistent_workers || last == epoch)) return;
    last = epoch;
    if (!options.worker_init_fn) return;
    try {
      options.worker_init_fn(info);
    } catch (...) {
      throw wrap_current_exception(info.id, -1, -1, "running worker_init_fn before");
    }
  }

  /// Worker `w`'s own copy of the dataset (as each PyTorch worker process has one), made on
  /// its first stream and, with persistent_workers, kept across epochs. A dataset that cannot
  /// be copied is shared. Called on worker `w`'s thread only.
  std::shared_ptr<D> replica(int w) {
    auto& slot = replicas[static_cast<std::size_t>(w)];
    if constexpr (std::is_copy_constructible_v<D>) {
      if (!slot || !options.persistent_workers) slot = std::make_shared<D>(std::as_const(dataset));
      return slot;
    } else {
      return std::shared_ptr<D>(std::shared_ptr<D>{}, &dataset);
    }
  }

  template <class Scope>
  Batch fetch_batch(Scope& run, std::span<const Index> indices, const WorkerInfo* info,
                    std::int64_t batch_no)
    requires(!iterable && !Plan::is_async)
  {
    const int worker = info ? info->id : -1;
    if constexpr (Plan::whole_batch) {
      try {
        return dataset.get_batch(indices);
      } catch (const EmptyBatch&) {
        throw;
      } catch (const SampleError& e) {
        throw wrap_current_exception(worker, batch_no, e.index(), "fetching");
      } catch (...) {
        throw wrap_current_exception(worker, batch_no, -1, "fetching");
      }
    } else {
      std::vector<typename Plan::sample> samples;
      if constexpr (Plan::batch_of_samples) {
        try {
          samples = dataset.get_batch(indices);
        } catch (const EmptyBatch&) {
          throw;
        } catch (const SampleError& e) {
          throw wrap_current_exception(worker, batch_no, e.index(), "fetching");
        } catch (...) {
          throw wrap_current_exception(worker, batch_no, -1, "fetching");
        }
      } else {
        samples.reserve(indices.size());
        for (Index i : indices) {
          if (run.cancelled()) throw Cancelled{};
          SampleContext ctx{i, run.epoch(), Rng::for_sample(run.sample_seed(), run.epoch(), i),
                            info};
          try {
            samples.push_back(get_sample(dataset, i, ctx));
          } catch (...) {
            auto error = wrap_current_exception(worker, batch_no, i, "fetching");
            if (options.on_error != OnError::skip) throw error;
            skips.skip(i, error.what());
          }
        }
        if (samples.empty()) throw EmptyBatch{};
      }
      return collate_samples(std::move(samples), worker, batch_no);
    }
  }

  /// The loader's place for CPU work, as a fetch's context carries it.
  template <class Scope>
  CpuPlace cpu_place(Scope& run) noexcept {
    if constexpr (requires { run.on_worker(); }) {
      if (executor) return CpuPlace{executor.get(), run.worker_infos(), run.on_worker()};
    }
    return CpuPlace{};
  }

  /// An asynchronous fetch of batch `batch_no`: get_batch_async, or get_async for every index
  /// at once and then collate (on a worker). Starts on the driver.
  template <class Scope>
  Task<Batch> fetch_batch_async(Scope& run, std::span<const Index> indices, std::int64_t batch_no)
    requires(Plan::is_async)
  {
    const CpuPlace place = cpu_place(run);
    if constexpr (Plan::path == FetchPath::whole_batch_async) {
      BatchContext ctx{indices, batch_no, run.epoch(), run.sample_seed(), reader.get(), place,
                       options.on_error, &skips};
      // The batch's memory: a pinned lease, or (in a worker process) the task's slot.
      std::unique_ptr<BatchLease> lease = pinned ? pinned->begin_batch() : nullptr;
      ctx.allocator = lease ? lease.get() : detail::current_batch_allocator();
      try {
        Batch batch = co_await dataset.get_batch_async(indices, ctx);
        co_return pinned ? pin_batch(std::move(batch), *pinned) : std::move(batch);
      } catch (const EmptyBatch&) {
        throw;
      } catch (const SampleError& e) {
        throw wrap_current_exception(current_worker_id_or_driver(), batch_no, e.index(),
                                     "fetching");
      } catch (...) {
        throw wrap_current_exception(current_worker_id_or_driver(), batch_no, -1, "fetching");
      }
    } else {
      std::vector<Task<std::optional<typename Plan::sample>>> tasks;
      tasks.reserve(indices.size());
      for (Index i : indices) {
        tasks.push_back(sample_async(
            SampleContext{i, run.epoch(), Rng::for_sample(run.sample_seed(), run.epoch(), i),
                          nullptr, reader.get(), place},
            batch_no));
      }
      auto fetched = co_await when_all(std::move(tasks));
      if (run.cancelled()) throw Cancelled{};
      std::vector<typename Plan::sample> samples;
      samples.reserve(fetched.size());
      for (auto& s : fetched) {
        if (s) samples.push_back(std::move(*s));
      }
      if (samples.empty()) throw EmptyBatch{};
      // Collating is CPU work: a fetch whose samples did none of theirs on a worker moves now.
      if (executor && !detail::current_worker_info()) co_await CpuAwaiter{place};
      co_return place_batch(
          [&] { return collate_samples(std::move(samples), current_worker_id_or_driver(), batch_no); });
    }
  }

  /// `make()`'s batch in pinned memory when the loader pins: collate writes into a lease of
  /// the pool, and tensors made elsewhere are copied in once (pin_batch).
  template <class F>
  Batch place_batch(F&& make) {
    if (!pinned) return make();
    auto lease = pinned->begin_batch();
    std::optional<Batch> batch;
    {
      BatchAllocatorScope scope(lease.get());
      batch.emplace(make());
    }
    return pin_batch(std::move(*batch), *pinned);
  }

  /// The id of the worker running the caller, or -1 (the driver).
  static int current_worker_id_or_driver() noexcept {
    const WorkerInfo* info = detail::current_worker_info();
    return info ? info->id : -1;
  }

  /// Collate's batch from `samples` (a per-sample collate gets the one sample alone).
  Batch collate_samples(std::vector<typename Plan::sample>&& samples, int worker,
                        std::int64_t batch_no) {
    try {
      if constexpr (Plan::per_sample) {
        return std::invoke(options.collate, std::move(samples.front()));
      } else {
        return std::invoke(options.collate, std::move(samples));
      }
    } catch (...) {
      throw wrap_current_exception(worker, batch_no, -1, "collating");
    }
  }

  /// Driver: lets the driver thread end once stopping and no coroutine is left (the reader,
  /// idle by then, goes first, on the thread that runs its io_context).
  void maybe_stop() {
    if (stopping && live == 0) {
      reader.reset();
      driver.release();
    }
  }

  D dataset;
  LoaderOptions<C> options;
  AnyBatchSampler batch_sampler;
  std::optional<at::Generator> generator;
  std::vector<std::int64_t> worker_init_epoch;  // element i: worker i's thread only
  std::vector<std::shared_ptr<D>> replicas;     // element i: worker i's thread only
  std::int64_t epochs_started = 0;
  std::optional<DeliveredSet> resume_from;  // set by load_state, taken by the next epoch
  std::optional<StreamMarks> resume_marks;  // the same, for a ResumableStream
  std::shared_ptr<StoppedEpoch> stopped = std::make_shared<StoppedEpoch>();
  int rank = 0;
  int world_size = 1;
  std::weak_ptr<Run> current;
  int live = 0;           // driver
  bool stopping = false;  // driver
  Driver driver;
  std::unique_ptr<ThreadExecutor> executor;
  std::unique_ptr<ProcessPool> pool;   // executor = processes
  std::unique_ptr<io::Reader> reader;  // asynchronous datasets only; driver after construction
  std::shared_ptr<DeviceBackend> device_backend;  // pin_memory or device
  std::unique_ptr<PinnedPool> pinned;             // pin_memory or device, with a backend
  std::unique_ptr<DeviceStage> stage;             // device
  SkipLog skips;

 private:
  /// What a fork-server worker receives: the dataset and the options it fetches with.
  using Payload = std::tuple<D, std::int64_t /*batch_size, -1: none*/, bool /*drop_last*/,
                             std::int32_t /*on_error*/, std::int32_t /*num_workers*/,
                             bool /*persistent_workers*/, std::uint64_t /*worker_init_fn*/,
                             std::int32_t /*rank*/, std::int32_t /*world_size*/>;

  /// A fork-server worker's entry: rebuilds the loader's fetching side from the payload and
  /// serves the parent. Runs in the worker, never returns.
  static void forkserver_entry(int socket, int id, int payload_fd) {
    if constexpr (wire::Wireable<D>) {
      auto bytes = map_payload(payload_fd);
      ::close(payload_fd);
      auto [ds, batch_size, drop_last, on_error, workers, persistent, init, rank_, world] =
          wire::decode<Payload>(bytes, 0, nullptr);
      LoaderOptions<C> o;
      o.batch_size = batch_size < 0 ? std::nullopt : std::optional<std::int64_t>(batch_size);
      o.drop_last = drop_last;
      o.on_error = static_cast<OnError>(on_error);
      o.num_workers = workers;
      o.persistent_workers = persistent;
      if (init) o.worker_init_fn = reinterpret_cast<void (*)(const WorkerInfo&)>(init);
      o.executor = Executor::processes;
      o.process_start = ProcessStart::forkserver;
      o.rank = rank_;
      o.world_size = world;
      auto core = std::make_unique<LoaderCore>(ChildOnly{}, std::move(ds), std::move(o));
      ChildLink link(socket);
      core->child_main(link, id);
      std::fflush(stderr);
      ::_exit(0);
    } else {
      (void)socket, (void)id, (void)payload_fd;
      ::_exit(70);
    }
  }

  /// The fork server's part of the pool's options, after checking that the loader's dataset,
  /// collate and worker_init_fn can travel to a worker that does not share this memory.
  void forkserver_options(ProcessPool::Options& o) {
    if (!forkserver_running()) {
      throw std::logic_error(
          "process_start = forkserver needs coload::start_forkserver() called first thing in "
          "main, before the program starts threads");
    }
    if constexpr (!wire::Wireable<D> || !std::is_copy_constructible_v<D>) {
      throw std::invalid_argument(
          "process_start = forkserver sends the dataset to each worker through the wire "
          "format: specialise coload::wire::Wire for the dataset type (and make it copyable)");
    } else if constexpr (!std::is_empty_v<C> || !std::default_initializable<C>) {
      throw std::invalid_argument(
          "process_start = forkserver needs a collate function of an empty type (a worker "
          "makes its own); use executor = processes with process_start = fork");
    } else {
      std::uint64_t init = 0;
      if (options.worker_init_fn) {
        auto* fn = options.worker_init_fn.template target<void (*)(const WorkerInfo&)>();
        if (!fn) {
          throw std::invalid_argument(
              "process_start = forkserver needs worker_init_fn to be a plain function (a "
              "lambda that captures nothing, converted with +[](const WorkerInfo&) {...}): a "
              "worker cannot receive anything else");
        }
        init = reinterpret_cast<std::uint64_t>(*fn);
      }
      Payload payload{dataset,
                      options.batch_size.value_or(-1),
                      options.drop_last,
                      static_cast<std::int32_t>(options.on_error),
                      options.num_workers,
                      options.persistent_workers,
                      init,
                      rank,
                      world_size};
      const std::size_t size = wire::encoded_size(payload);
      o.payload = payload_memfd(size, [&](std::span<std::byte> region) {
        wire::encode(payload, region, 0);
      });
      o.entry = &LoaderCore::forkserver_entry;
    }
  }

  /// pin_memory and device: the device runtime, the pinned pool and the device stage.
  void setup_device() {
    const bool with_stage = options.device.has_value();
    if (!options.pin_memory && !with_stage) return;
    device_backend = options.device_backend;
    if (!device_backend) {
      if (with_stage) {
        const at::Device d = *options.device;
        if (d.is_cuda()) {
          try {
            // No index: the thread's current device, as at::Device("cuda") means in libtorch.
            device_backend = make_cuda_backend(d.has_index() ? d.index() : -1);
          } catch (const std::exception& e) {
            throw std::invalid_argument("device = " + d.str() + ": " + e.what());
          }
        } else if (d.is_cpu()) {
          device_backend = std::make_shared<HostDeviceBackend>();
        } else {
          throw std::invalid_argument("device = " + d.str() +
                                      ": coload's device stage copies to CUDA devices (or, "
                                      "through its host backend, to the CPU)");
        }
      } else if (cuda_available()) {
        device_backend = make_cuda_backend(-1);
      } else {
        // As PyTorch: without an accelerator, pin_memory leaves batches where they are.
        warn_once("pin_memory without CUDA",
                  "'pin_memory' argument is set as true but no accelerator is found, then "
                  "device pinned memory won't be used (" + cuda_unavailable_reason() + ")");
        return;
      }
    }
    if (with_stage && device_backend->device().type() != options.device->type()) {
      throw std::invalid_argument("device = " + options.device->str() +
                                  ", but device_backend copies to " +
                                  device_backend->device().str());
    }
    // Batches between dispatch and consumer, one the consumer holds, one being collated.
    pinned = std::make_unique<PinnedPool>(device_backend,
                                          static_cast<std::size_t>(in_flight_bound()) + 2);
    if (with_stage) stage = std::make_unique<DeviceStage>(device_backend, driver.context());
  }

  void make_pool() {
    if constexpr (wire::Wireable<Batch>) {
      ProcessPool::Options o;
      if (options.process_start == ProcessStart::forkserver) forkserver_options(o);
      o.num_workers = options.num_workers;
      // NOTE: a restarted stream would start over and repeat its samples.
      o.on_death = iterable ? OnWorkerDeath::raise : options.on_worker_death;
      o.max_restarts = options.max_worker_restarts;
      if (pinned) {
        // The arena itself is pinned in the parent: batches decoded over it need no copy.
        o.pin_range = [backend = device_backend](void* p, std::size_t n) {
          backend->register_host(p, n);
        };
        o.unpin_range = [backend = device_backend](void* p) { backend->unregister_host(p); };
      }
      pool = std::make_unique<ProcessPool>(
          driver.context(), o, [this](ChildLink& link, int id) { child_main(link, id); });
    } else {
      throw std::invalid_argument(
          "executor = processes needs a batch type that the wire format knows: specialise "
          "coload::wire::Wire for it");
    }
  }

  /// What a fetch in a worker process sees of its epoch.
  struct ChildScope {
    std::int64_t epoch_no;
    std::uint64_t seed;
    bool cancelled() const noexcept { return false; }
    std::int64_t epoch() const noexcept { return epoch_no; }
    std::uint64_t sample_seed() const noexcept { return seed; }
    const WorkerInfo* worker_infos() const noexcept { return nullptr; }
  };

  /// Runs an asynchronous fetch to its end on the child's own io_context.
  static Detached child_fetch_async(LoaderCore& core, ChildScope& scope,
                                    std::span<const Index> indices, std::int64_t batch_no,
                                    std::optional<Batch>& out, std::exception_ptr& error,
                                    bool& done)
    requires(Plan::is_async)
  {
    try {
      out.emplace(co_await core.fetch_batch_async(scope, indices, batch_no));
    } catch (...) {
      error = std::current_exception();
    }
    done = true;
  }

  /// The body of worker process `id`: this object is the child's forked copy of the loader,
  /// whose driver, executor and reader belong to the parent and are never touched here.
  void child_main(ChildLink& link, int id) {
    std::optional<asio::io_context> child_io;
    if constexpr (Plan::is_async) {
      // NOTE: the parent's reader shares its ring with the parent: destroying it here would
      // cancel the parent's reads. It is left alone, and the child reads through its own.
      (void)reader.release();
      child_io.emplace();
      reader = std::make_unique<io::Reader>(*child_io);
    }
    // The parent's pinned pool and device stage are the parent's: the child writes into its
    // slot, which the parent has registered as pinned.
    (void)pinned.release();
    (void)stage.release();
    WorkerInfo info{id, options.num_workers, 0, static_cast<const void*>(&dataset), rank,
                    world_size};
    bool initialised = false;
    std::optional<StreamCursor<stream_probe_t>> cursor;
    bool stream_over = false;
    while (auto task = link.next()) {
      info.seed = task->worker_seed + static_cast<std::uint64_t>(id);
      set_worker_info(&info);
      ProcessReply reply;
      reply.batch = task->batch;
      const std::int64_t skipped_before = skips.count();
      try {
        if (!initialised) {
          initialised = true;
          init_worker(info, task->epoch);
        }
        std::optional<Batch> batch;
        // Collate's output is carved from the task's slot: the batch is encoded where it lies.
        BatchAllocatorScope in_slot(&link);
        if constexpr (iterable) {
          batch = child_stream(cursor, stream_over, info, task->want, id, task->batch);
          reply.stream_over = stream_over;
        } else {
          ChildScope scope{task->epoch, task->sample_seed};
          if constexpr (Plan::is_async) {
            std::exception_ptr error;
            bool done = false;
            child_fetch_async(*this, scope, task->indices, task->batch, batch, error, done);
            child_io->restart();
            while (!done && child_io->run_one() > 0) {
            }
            if (!done) throw std::logic_error("coload: an asynchronous fetch stalled in a worker process");
            if (error) std::rethrow_exception(error);
          } else {
            batch.emplace(fetch_batch(scope, task->indices, &info, task->batch));
          }
        }
        if (batch) {
          if constexpr (wire::Wireable<Batch>) {
            const std::size_t at = link.allocated();
            const std::size_t need = wire::encoded_size(
                *batch, std::span<const std::byte>(link.slot(at)));
            reply.bytes = wire::encode(*batch, link.slot(at + need), at);
            reply.offset = at;
            reply.status = ProcessReply::Status::batch;
          }
        } else {
          reply.status = ProcessReply::Status::empty;
        }
      } catch (const EmptyBatch&) {
        reply.status = ProcessReply::Status::empty;
      } catch (const WorkerError& e) {
        fill_error(reply, e);
      } catch (...) {
        fill_error(reply, wrap_current_exception(id, task->batch, -1, "fetching"));
      }
      if constexpr (iterable) {
        if (reply.status == ProcessReply::Status::error) reply.stream_over = stream_over = true;
      }
      set_worker_info(nullptr);
      reply.skipped = skips.count() - skipped_before;
      link.reply(std::move(reply));
    }
    cursor.reset();
    // NOTE: the child exits next: its ring goes with the process, without the cancel-and-reap
    // walk of an orderly shutdown, so the parent sees the worker gone sooner.
    (void)reader.release();
  }

  static void fill_error(ProcessReply& reply, const WorkerError& e) {
    reply.status = ProcessReply::Status::error;
    reply.error_what = e.what();
    reply.error_type = e.original_type();
    reply.error_message = e.original_message();
    reply.error_index = e.index();
  }

  static auto stream_probe() {
    if constexpr (iterable) {
      return std::type_identity<stream_t<D>>{};
    } else {
      return std::type_identity<Generator<int>>{};
    }
  }
  using stream_probe_t = typename decltype(stream_probe())::type;

  /// A worker process's next batch of its stream: up to `want` samples, collated; nothing
  /// once the stream is over (or a last partial batch under drop_last).
  std::optional<Batch> child_stream(std::optional<StreamCursor<stream_probe_t>>& cursor,
                                    bool& over, const WorkerInfo& info, std::int64_t want,
                                    int id, std::int64_t batch_no) {
    if constexpr (iterable) {
      if (over) return std::nullopt;
      if (!cursor) {
        try {
          cursor.emplace(dataset.stream(info));
        } catch (...) {
          over = true;
          throw wrap_current_exception(id, batch_no, -1, "starting the stream for");
        }
      }
      std::vector<typename Plan::sample> samples;
      samples.reserve(static_cast<std::size_t>(want));
      while (static_cast<std::int64_t>(samples.size()) < want) {
        typename stream_t<D>::pointer sample = nullptr;
        try {
          if constexpr (async_stream_v<D>) {
            sample = sync_wait(cursor->next_async());
          } else {
            sample = cursor->next_sync();
          }
        } catch (...) {
          over = true;
          throw wrap_current_exception(id, batch_no, -1, "fetching");
        }
        if (!sample) {
          over = true;
          break;
        }
        samples.push_back(std::move(*sample));
      }
      const bool partial = static_cast<std::int64_t>(samples.size()) < want;
      if (samples.empty() || (partial && options.drop_last)) return std::nullopt;
      return collate_samples(std::move(samples), id, batch_no);
    } else {
      (void)cursor, (void)over, (void)info, (void)want, (void)id, (void)batch_no;
      return std::nullopt;
    }
  }

  /// One sample of an asynchronous fetch; its failure names the sample, and with
  /// `on_error = skip` leaves it out (an empty result).
  Task<std::optional<typename Plan::sample>> sample_async(SampleContext ctx,
                                                          std::int64_t batch_no) {
    std::optional<WorkerError> error;
    try {
      co_return co_await dataset.get_async(ctx.index, ctx);
    } catch (...) {
      error.emplace(wrap_current_exception(current_worker_id_or_driver(), batch_no, ctx.index,
                                           "fetching"));
    }
    if (options.on_error != OnError::skip) throw *error;
    skips.skip(ctx.index, error->what());
    co_return std::nullopt;
  }

  AnyBatchSampler make_batch_sampler() {
    if (options.batch_sampler) return std::move(options.batch_sampler);
    const auto n = static_cast<std::int64_t>(dataset.size());
    // Without automatic batching each "batch" is one index.
    const std::int64_t b = options.batch_size.value_or(1);
    if (options.sampler) {
      return BatchSampler<AnySampler>(std::move(options.sampler), b, options.drop_last);
    }
    if (options.shuffle) {
      return BatchSampler<RandomSampler>(RandomSampler(n, false, std::nullopt, generator), b,
                                         options.drop_last);
    }
    return BatchSampler<SequentialSampler>(SequentialSampler(n), b, options.drop_last);
  }
};

}  // namespace detail

/// Loads batches from a map-style or an iterable dataset, as torch.utils.data.DataLoader.
///
/// An iterable dataset (`stream(const WorkerInfo&)`) is streamed by every worker from its own
/// copy of the dataset (shared when the type cannot be copied), with that worker's info; the
/// batches interleave worker by worker, and `drop_last` drops each worker's last partial batch.
/// `shuffle`, `sampler` and `batch_sampler` are refused for it, as PyTorch refuses them.
///
/// Three ways to consume an epoch: `for (auto& batch : loader)` (each range-for is one epoch),
/// `auto epoch = loader.epoch(); while (auto b = co_await epoch.next())`, and
/// `co_await loader.async_next(token)` with any Asio completion token. One epoch at a time.
///
/// The dataset's `get`/`get_batch` and the collate function are called from several worker
/// threads at once when `num_workers > 1`: they must be safe to call concurrently.
template <LoadableDataset D, class C = DefaultCollate>
class DataLoader {
  using Core = detail::LoaderCore<D, C>;

 public:
  using dataset_type = D;
  using sample_type = detail::loader_sample_t<D>;
  /// What one batch is: get_batch's result, or the collate function's.
  using batch_type = typename detail::FetchPlan<D, C>::batch;
  using executor_type = asio::io_context::executor_type;

  /// Validates the options (std::invalid_argument, with PyTorch's wording) and starts the
  /// driver and the worker threads.
  DataLoader(D dataset, LoaderOptions<C> options)
      : core_(std::make_unique<Core>(std::move(dataset), std::move(options))) {}
  DataLoader(DataLoader&&) noexcept = default;
  DataLoader& operator=(DataLoader&&) noexcept = default;
  /// Stops the current epoch and joins every thread; returns once running fetches finish
  /// their current sample. Destroyed on its own driver thread (from a handler or a coroutine
  /// resumed there), it hands the joining to a detached thread instead.
  ~DataLoader() {
    implicit_.reset();
    if (core_ && core_->driver.on_driver_thread()) {
      std::thread([core = std::move(core_)]() mutable { core.reset(); }).detach();
    }
    core_.reset();
  }

  /// The number of batches in an epoch, as `len(DataLoader)` (honours drop_last).
  std::int64_t size() const { return core_->size(); }
  /// How many samples `on_error = skip` has left out so far, over all epochs.
  std::int64_t skipped() const noexcept { return core_->skips.count(); }
  /// The dataset.
  D& dataset() noexcept { return core_->dataset; }
  /// The options, as given (except `sampler` and `batch_sampler`, moved into the pipeline).
  const LoaderOptions<C>& options() const noexcept { return core_->options; }
  /// The driver's executor: where completions without an associated executor run.
  executor_type get_executor() noexcept { return core_->driver.context().get_executor(); }

  /// Where the loader stands, between two batches: the epoch in progress (until its consumer
  /// has seen its end, even if the epoch was stopped early) and which of its batches the
  /// consumer has had, or the next epoch. Call it from the consumer, between batches.
  LoaderState state() const { return core_->state(); }
  /// Writes state() to `path` atomically (a temporary file renamed over it).
  void save_state(const std::filesystem::path& path) const { state().save(path); }
  /// Makes the next epoch resume from `saved`: it is the epoch `saved` was taken in, with the
  /// same shuffle and sample seeds, and delivers exactly the batches that had not been
  /// delivered (batches that were prefetched but not delivered are fetched again); the
  /// epochs after it are those of the uninterrupted run. Refuses, with std::invalid_argument
  /// naming the mismatch, a state from a loader with another dataset size, batch size, seed,
  /// rank, world size or state version; std::logic_error while an epoch is in progress.
  ///
  /// A loader without `seed` draws from ATen's default generator: loading sets that generator
  /// back to where it was when the saved epoch began. An iterable dataset with `state()` and
  /// `load_state()` members (ResumableStream) continues each worker's stream from the state
  /// taken after its last delivered batch (thread workers and none; with process workers, and
  /// for other iterable datasets, the loader fast-forwards: it loads the delivered batches
  /// again and drops them, and says so once).
  void load_state(const LoaderState& saved) { core_->load_state(saved); }
  /// Loads a state written by save_state().
  void load_state(const std::filesystem::path& path) { load_state(LoaderState::load(path)); }

  /// Starts the next epoch. Throws std::logic_error while another epoch is in progress.
  Epoch<batch_type> epoch() { return Epoch<batch_type>(core_->start_epoch()); }

  /// The range-for adapter: each range-for over the loader is one epoch.
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    explicit iterator(Epoch<batch_type> epoch) : epoch_(std::move(epoch)) { ++*this; }
    batch_type& operator*() noexcept { return *current_; }
    batch_type* operator->() noexcept { return &*current_; }
    iterator& operator++() {
      current_ = sync_wait(epoch_.next());
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.current_;
    }

   private:
    Epoch<batch_type> epoch_{nullptr};
    std::optional<batch_type> current_;
  };
  /// Starts an epoch and waits for its first batch.
  iterator begin() { return iterator(epoch()); }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// Asynchronously takes the next batch of the loader's current epoch, starting an epoch
  /// when none is running; completes with an empty optional at the end of each epoch.
  ///
  /// Completion signature: `void(std::exception_ptr, std::optional<batch_type>)`, so
  /// `asio::use_awaitable` returns the optional and throws the error. The handler is never
  /// invoked from within this function; it runs on its associated executor, or on the
  /// loader's driver thread if it has none. One operation at a time per loader.
  template <class CompletionToken>
  auto async_next(CompletionToken&& token) {
    using Signature = void(std::exception_ptr, std::optional<batch_type>);
    return asio::async_initiate<CompletionToken, Signature>(
        [this](auto handler) { initiate_next(std::move(handler)); }, token);
  }

 private:
  template <class Handler>
  void initiate_next(Handler handler) {
    // The previous implicit epoch is over once its end has been delivered: start the next.
    if (implicit_ && implicit_->channel()->handoff.ended()) implicit_.reset();
    if (!implicit_) implicit_.emplace(epoch());
    auto channel = implicit_->channel();
    struct Op {
      Handler handler;
      asio::executor_work_guard<asio::associated_executor_t<Handler, executor_type>> work;
      detail::ConsumerSlot<batch_type> slot;
      std::shared_ptr<detail::EpochChannel<batch_type>> channel;
    };
    auto ex = asio::get_associated_executor(handler, get_executor());
    auto op = std::make_shared<Op>(Op{std::move(handler), asio::make_work_guard(ex), {}, channel});
    auto complete = [op] {
      auto ex2 = op->work.get_executor();
      asio::post(ex2, [op] {
        std::exception_ptr error;
        std::optional<batch_type> batch;
        try {
          batch = detail::take_outcome(*op->channel, op->slot);
        } catch (...) {
          error = std::current_exception();
        }
        op->work.reset();
        auto h = std::move(op->handler);
        std::move(h)(error, std::move(batch));
      });
    };
    const bool waiting = channel->handoff.poll_or_wait(
        op->slot, complete, [c = channel.get()](std::uint64_t generation, std::int64_t batch) {
          c->arm_timeout(generation, batch);
        });
    if (!waiting) complete();
  }

  // NOTE: implicit_ comes first so that move assignment ends the old implicit epoch while
  // its loader still exists.
  std::optional<Epoch<batch_type>> implicit_;
  std::unique_ptr<Core> core_;
};

/// Makes a DataLoader over `dataset` (moved in) with `options`.
template <class D, class C = DefaultCollate>
  requires LoadableDataset<std::remove_cvref_t<D>>
DataLoader<std::remove_cvref_t<D>, C> make_data_loader(D&& dataset,
                                                       LoaderOptions<C> options = {}) {
  return DataLoader<std::remove_cvref_t<D>, C>(std::forward<D>(dataset), std::move(options));
}

}  // namespace coload
