#pragma once
// DataLoader: owns the pipeline from sampler to consumer.

#include <ATen/core/Tensor.h>
#include <asio/async_result.hpp>
#include <asio/associated_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/loader/driver.hpp"
#include "coload/loader/epoch.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sequential.hpp"

namespace coload {
namespace detail {

/// How the loader builds a batch from a dataset D with collate C: here, without get_batch,
/// each sample is fetched with get and the vector of them collated.
template <class D, class C>
struct FetchPlan {
  using sample = sample_t<D>;
  using batch = std::invoke_result_t<C&, std::vector<sample>&&>;
  static constexpr bool whole_batch = false;
  static constexpr bool batch_of_samples = false;
};

/// With get_batch: a vector of samples (PyTorch's __getitems__) goes through collate; any other
/// result is taken as the finished batch when the collate is the default one.
template <class D, class C>
  requires BatchedDataset<D>
struct FetchPlan<D, C> {
  using sample = sample_t<D>;
  using fetched = std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
      std::declval<std::span<const Index>>()))>;
  static constexpr bool batch_of_samples = std::same_as<fetched, std::vector<sample>>;
  static constexpr bool whole_batch = !batch_of_samples && std::same_as<C, DefaultCollate>;
  // NOTE: lazy on purpose: collate need not accept the samples when get_batch builds the batch.
  using batch = typename std::conditional_t<whole_batch, std::type_identity<fetched>,
                                            std::invoke_result<C&, std::vector<sample>&&>>::type;
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

/// One epoch's pipeline state. Fields marked "driver" are touched only on the driver thread.
template <class D, class C>
class EpochRun final : public EpochChannel<typename FetchPlan<D, C>::batch>,
                       public std::enable_shared_from_this<EpochRun<D, C>> {
 public:
  using Batch = typename FetchPlan<D, C>::batch;
  using Core = LoaderCore<D, C>;

  EpochRun(Core& core, std::int64_t epoch, std::uint64_t base_seed)
      : core_(core),
        epoch_(epoch),
        base_seed_(base_seed),
        sample_seed_(core.options.seed.value_or(base_seed)),
        bound_(core.in_flight_bound()),
        timeout_(core.options.timeout),
        reorder_(static_cast<std::size_t>(bound_)) {
    // NOTE: only a loader with a timeout makes a timer: once a timer exists, Asio's driver
    // sleeps in epoll rather than on a condition variable, and every post costs a syscall.
    if (core.options.timeout > 0) timer_.emplace(core.driver.context());
    const int n = core.options.num_workers;
    workers_.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      workers_.push_back(WorkerInfo{i, n, base_seed + static_cast<std::uint64_t>(i),
                                    static_cast<const void*>(&core.dataset)});
    }
  }

  std::int64_t epoch() const noexcept { return epoch_; }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

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
    if (cancelled_.exchange(true) || closed_.load()) return;
    asio::post(core_.driver.context(), [self = this->shared_from_this()] { self->on_cancel(); });
  }

  // --- driver side ---
  /// Walks the batch sampler, keeping at most `bound_` batches between dispatch and consumer.
  static Detached run(std::shared_ptr<EpochRun> self) {
    Core& core = self->core_;
    ++core.live;
    try {
      auto batches = core.batch_sampler.batches();
      for (;;) {
        while (self->full() && !self->cancelled()) {
          self->slot_wanted_.store(true);
          // Re-check after announcing: a consumer that took a batch in between either is
          // seen here or sees the announcement and posts on_slot_freed.
          if (self->full() && !self->cancelled()) co_await SlotAwaiter{self.get()};
        }
        if (self->cancelled()) break;
        std::vector<Index>* indices = co_await batches.next();
        if (!indices) break;
        fetch(self, self->dispatched_++, std::move(*indices));
      }
    } catch (...) {
      self->sampler_error_ = std::current_exception();
    }
    self->sampler_done_ = true;
    self->maybe_finish();
    --core.live;
    core.maybe_stop();
  }

 private:
  struct SlotAwaiter {
    EpochRun* run;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) noexcept { run->slot_waiter_ = h; }
    void await_resume() const noexcept {}
  };

  /// Fetches and collates one batch, on a worker when there are workers.
  static Detached fetch(std::shared_ptr<EpochRun> self, std::int64_t batch_no,
                        std::vector<Index> indices) {
    Core& core = self->core_;
    ++core.live;
    const bool hop = core.executor != nullptr;
    if (hop) co_await core.executor->schedule();
    Outcome<Batch> outcome;
    bool dropped = self->cancelled();
    if (!dropped) {
      const int worker = hop ? ThreadExecutor::current_worker_id() : -1;
      const WorkerInfo* info = hop ? &self->workers_[static_cast<std::size_t>(worker)] : nullptr;
      set_worker_info(info);
      try {
        if (info) core.init_worker(*info, self->epoch_);
        outcome.batch.emplace(core.fetch_batch(*self, indices, info, batch_no));
      } catch (const Cancelled&) {
        dropped = true;
      } catch (...) {
        outcome.error = std::current_exception();
      }
      set_worker_info(nullptr);
    }
    if (hop) co_await core.driver.schedule();
    self->complete(batch_no, std::move(outcome), dropped);
    --core.live;
    core.maybe_stop();
  }

  void complete(std::int64_t batch_no, Outcome<Batch> outcome, bool dropped) {
    ++completed_;
    if (cancelled() || dropped) {
      maybe_finish();
      return;
    }
    if (!core_.options.in_order) {
      this->handoff.push(std::move(outcome));
      ++delivered_;
    } else {
      reorder_[static_cast<std::size_t>(batch_no % bound_)] = std::move(outcome);
      for (;;) {
        auto& slot = reorder_[static_cast<std::size_t>(delivered_ % bound_)];
        if (!slot) break;
        this->handoff.push(std::move(*slot));
        slot.reset();
        ++delivered_;
      }
    }
    maybe_finish();
  }

  /// Driver: true when `bound_` batches are between dispatch and the consumer.
  bool full() const noexcept { return dispatched_ - consumed_.load() >= bound_; }

  void maybe_finish() {
    if (finished_ || !sampler_done_) return;
    if (cancelled() ? completed_ != dispatched_ : delivered_ != dispatched_) return;
    finished_ = true;
    // Nothing of the driver is needed any more: drop the timer (it lives on the driver's
    // io_context) and close the consumer-side entry points.
    timer_.reset();
    closed_.store(true);
    if (sampler_error_ && !cancelled()) {
      this->handoff.push(Outcome<Batch>{std::nullopt, sampler_error_});
    }
    this->handoff.finish();
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
    if (slot_waiter_) std::exchange(slot_waiter_, nullptr).resume();
    maybe_finish();
  }

  friend class LoaderCore<D, C>;
  Core& core_;
  const std::int64_t epoch_;
  const std::uint64_t base_seed_;
  const std::uint64_t sample_seed_;
  const std::int64_t bound_;
  const double timeout_;
  std::vector<WorkerInfo> workers_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> closed_{false};
  std::atomic<std::int64_t> waited_batch_{0};
  std::atomic<std::int64_t> consumed_{0};
  std::atomic<bool> slot_wanted_{false};
  // driver
  std::int64_t dispatched_ = 0;
  std::int64_t completed_ = 0;
  std::int64_t delivered_ = 0;
  bool sampler_done_ = false;
  bool finished_ = false;
  std::exception_ptr sampler_error_;
  std::vector<std::optional<Outcome<Batch>>> reorder_;
  std::coroutine_handle<> slot_waiter_;
  std::optional<asio::steady_timer> timer_;
};

/// What a DataLoader owns, at a stable address that its coroutines can refer to.
template <class D, class C>
class LoaderCore {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  using Run = EpochRun<D, C>;

  LoaderCore(D ds, LoaderOptions<C> opts) : dataset(std::move(ds)), options(std::move(opts)) {
    validate_options(options);
    check_worker_number(options.num_workers);
    if (options.seed) generator = make_generator(*options.seed);
    batch_sampler = make_batch_sampler();
    worker_init_epoch.assign(static_cast<std::size_t>(options.num_workers), -1);
    if (options.num_workers > 0) executor = std::make_unique<ThreadExecutor>(options.num_workers);
  }

  ~LoaderCore() {
    if (auto run = current.lock()) run->cancel();
    asio::post(driver.context(), [this] {
      stopping = true;
      maybe_stop();
    });
    driver.join();
    executor.reset();
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
    const std::uint64_t base_seed = draw_seed(generator);
    auto run = std::make_shared<Run>(*this, epochs_started++, base_seed);
    current = run;
    asio::post(driver.context(), [run] { Run::run(run); });
    return run;
  }

  std::int64_t size() const {
    auto n = batch_sampler.size();
    if (!n) throw std::logic_error("DataLoader: the batch sampler has no size()");
    return *n;
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

  Batch fetch_batch(Run& run, std::span<const Index> indices, const WorkerInfo* info,
                    std::int64_t batch_no) {
    const int worker = info ? info->id : -1;
    if constexpr (Plan::whole_batch) {
      try {
        return dataset.get_batch(indices);
      } catch (...) {
        throw wrap_current_exception(worker, batch_no, -1, "fetching");
      }
    } else {
      std::vector<typename Plan::sample> samples;
      if constexpr (Plan::batch_of_samples) {
        try {
          samples = dataset.get_batch(indices);
        } catch (...) {
          throw wrap_current_exception(worker, batch_no, -1, "fetching");
        }
      } else {
        samples.reserve(indices.size());
        for (Index i : indices) {
          if (run.cancelled()) throw Cancelled{};
          SampleContext ctx{i, run.epoch(), Rng::for_sample(run.sample_seed_, run.epoch(), i),
                            info};
          try {
            samples.push_back(get_sample(dataset, i, ctx));
          } catch (...) {
            throw wrap_current_exception(worker, batch_no, i, "fetching");
          }
        }
      }
      try {
        return std::invoke(options.collate, std::move(samples));
      } catch (...) {
        throw wrap_current_exception(worker, batch_no, -1, "collating");
      }
    }
  }

  /// Driver: lets the driver thread end once stopping and no coroutine is left.
  void maybe_stop() {
    if (stopping && live == 0) driver.release();
  }

  D dataset;
  LoaderOptions<C> options;
  AnyBatchSampler batch_sampler;
  std::optional<at::Generator> generator;
  std::vector<std::int64_t> worker_init_epoch;  // element i: worker i's thread only
  std::int64_t epochs_started = 0;
  std::weak_ptr<Run> current;
  int live = 0;           // driver
  bool stopping = false;  // driver
  Driver driver;
  std::unique_ptr<ThreadExecutor> executor;

 private:
  AnyBatchSampler make_batch_sampler() {
    if (options.batch_sampler) return std::move(options.batch_sampler);
    const auto n = static_cast<std::int64_t>(dataset.size());
    if (options.sampler) {
      return BatchSampler<AnySampler>(std::move(options.sampler), options.batch_size,
                                      options.drop_last);
    }
    if (options.shuffle) {
      return BatchSampler<RandomSampler>(RandomSampler(n, false, std::nullopt, generator),
                                         options.batch_size, options.drop_last);
    }
    return BatchSampler<SequentialSampler>(SequentialSampler(n), options.batch_size,
                                           options.drop_last);
  }
};

}  // namespace detail

/// Loads batches from a map-style dataset, as torch.utils.data.DataLoader.
///
/// Three ways to consume an epoch: `for (auto& batch : loader)` (each range-for is one epoch),
/// `auto epoch = loader.epoch(); while (auto b = co_await epoch.next())`, and
/// `co_await loader.async_next(token)` with any Asio completion token. One epoch at a time.
///
/// The dataset's `get`/`get_batch` and the collate function are called from several worker
/// threads at once when `num_workers > 1`: they must be safe to call concurrently.
template <MapDataset D, class C = DefaultCollate>
class DataLoader {
  using Core = detail::LoaderCore<D, C>;

 public:
  using dataset_type = D;
  using sample_type = sample_t<D>;
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
  /// The dataset.
  D& dataset() noexcept { return core_->dataset; }
  /// The options, as given (except `sampler` and `batch_sampler`, moved into the pipeline).
  const LoaderOptions<C>& options() const noexcept { return core_->options; }
  /// The driver's executor: where completions without an associated executor run.
  executor_type get_executor() noexcept { return core_->driver.context().get_executor(); }

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
  requires MapDataset<std::remove_cvref_t<D>>
DataLoader<std::remove_cvref_t<D>, C> make_data_loader(D&& dataset,
                                                       LoaderOptions<C> options = {}) {
  return DataLoader<std::remove_cvref_t<D>, C>(std::forward<D>(dataset), std::move(options));
}

}  // namespace coload
