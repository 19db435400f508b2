#pragma once
// The places in this process where a batch's CPU work runs (InlinePlace: the driver itself;
// ThreadPlace: worker threads), and make_place(), the one place that decides between them and
// worker processes (ProcessBridge). All three are a Place (place.hpp).

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "coload/coro/scheduler.hpp"
#include "coload/coro/task.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/outcome.hpp"
#include "coload/loader/detail/place.hpp"
#include "coload/loader/detail/process_bridge.hpp"
#include "coload/loader/detail/worker_count.hpp"
#include "coload/loader/driver.hpp"

namespace coload::detail {

/// The worker threads as one asynchronous batch's `co_await ctx.cpu()` sees them: the pool,
/// in the batch's place in line, and on arrival the loader's records: get_worker_info() names
/// the worker, the board notes who holds which sample (for timeouts and a stuck shutdown), and
/// worker_init_fn runs once per worker per epoch. Lives as long as the batch's fetch.
class BatchScheduler final : public Scheduler {
 public:
  /// `started`, where not nullptr, is told when the batch's CPU work is first queued.
  BatchScheduler(ThreadExecutor& pool, const WorkerInfo* workers,
                 const std::function<void(const WorkerInfo&, std::int64_t)>& on_worker,
                 FetchBoard& board,
                 std::int64_t batch, CpuStarted* started = nullptr) noexcept
      : pool_(pool),
        workers_(workers),
        on_worker_(on_worker),
        board_(board),
        batch_(batch),
        started_(started) {}

  void post(std::coroutine_handle<> h) override {
    tell_started();
    pool_.post(h);
  }
  void post_ordered(std::coroutine_handle<> h, std::uint64_t order) override {
    tell_started();
    pool_.post_ordered(h, order);
  }
  void arrived(std::int64_t sample) override {
    const WorkerInfo& info = workers_[ThreadExecutor::current_worker_id()];
    set_worker_info(&info);
    board_.note(info.id, batch_, sample);
    if (on_worker_) on_worker_(info, batch_);
  }

 private:
  ThreadExecutor& pool_;
  const WorkerInfo* workers_;  // indexed by worker id
  const std::function<void(const WorkerInfo&, std::int64_t)>& on_worker_;
  FetchBoard& board_;
  const std::int64_t batch_;
  // NOTE: told before the work is queued: once it is, the batch may end and this scheduler go.
  // Atomic: a batch's samples may move to the pool from more than one thread.
  std::atomic<CpuStarted*> started_;

  void tell_started() noexcept {
    if (started_.load(std::memory_order_relaxed) == nullptr) return;
    if (CpuStarted* s = started_.exchange(nullptr)) s->cpu_started();
  }
};

/// Worker thread `w` as a Scheduler: where a stream that awaited something comes back to.
class WorkerThread final : public Scheduler {
 public:
  WorkerThread(ThreadExecutor& pool, int w) noexcept : pool_(pool), w_(w) {}
  void post(std::coroutine_handle<> h) override { pool_.post_to(w_, h); }

 private:
  ThreadExecutor& pool_;
  const int w_;
};

/// What the two places of this process share: a synchronous fetch on the calling thread, an
/// asynchronous one (started on the driver, where its reads are submitted, its CPU work sent to
/// a scheduler with `co_await ctx.cpu()`), a stream's batch, and the board of who holds what.
template <class D, class C>
class LocalPlace : public Place<D, C> {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  using Run = RunBase<D, C>;

  FetchHolder holder(std::int64_t batch) const override {
    FetchHolder h;
    if (auto e = fetcher_.board.find(batch)) {
      h.worker = e->worker;
      h.first = std::move(e->first);
      h.count = e->count;
    }
    return h;
  }

 protected:
  LocalPlace(Fetcher<D, C>& fetcher, Driver& driver, Recorder& recorder) noexcept
      : fetcher_(fetcher), driver_(driver), recorder_(recorder) {}

  /// A synchronous fetch on this thread, as worker thread `worker` (-1: the driver).
  Fetched<Batch> fetch_here(Run& run, std::int64_t batch_no, const std::vector<Index>& indices,
                            int worker) {
    Fetched<Batch> out;
    out.dropped = run.cancelled();
    if (out.dropped) return out;
    const WorkerInfo* info = worker >= 0 ? &run.worker_infos()[worker] : nullptr;
    if (info) recorder_.bind_thread(worker);
    set_worker_info(info);
    fetcher_.board.begin(worker, batch_no, indices);
    try {
      if (info) fetcher_.init_worker(*info, run.epoch(), batch_no);
      out.outcome.batch.emplace(fetcher_.place_batch(
          [&] { return fetcher_.fetch_batch(run, indices, info, batch_no); }));
    } catch (...) {
      out = fetch_outcome<Batch>(std::current_exception());
    }
    fetcher_.board.end(worker);
    set_worker_info(nullptr);
    return out;
  }

  /// An asynchronous fetch: starts and ends on the driver; `co_await ctx.cpu()` goes to `cpu`
  /// (nullptr: stays on the driver).
  Task<Fetched<Batch>> fetch_async(Run& run, std::int64_t batch_no, std::vector<Index> indices,
                                   Scheduler* cpu) {
    Fetched<Batch> out;
    out.dropped = run.cancelled();
    if (out.dropped) co_return out;
    fetcher_.board.begin_async(batch_no, indices);
    try {
      out.outcome.batch.emplace(co_await fetcher_.fetch_batch_async(run, indices, batch_no, cpu));
    } catch (...) {
      out = fetch_outcome<Batch>(std::current_exception());
    }
    fetcher_.board.end_async(batch_no);
    set_worker_info(nullptr);
    if (!driver_.on_driver_thread()) co_await driver_.schedule();
    co_return out;
  }

  /// A stream's batch from `source` on this thread, as worker thread `w` (`worker` resumes
  /// there) or the driver (`worker` is nullptr).
  Task<Fetched<Batch>> stream_here(Run& run, StreamSource<Batch>& source, int w,
                                   std::int64_t batch_no, Scheduler* worker) {
    const int at = worker ? w : -1;
    if (worker) {
      set_worker_info(&run.worker_infos()[w]);
      recorder_.bind_thread(w);
    }
    fetcher_.board.begin(at, batch_no, {});
    Fetched<Batch> out = co_await source.next(w, batch_no, worker);
    fetcher_.board.end(at);
    set_worker_info(nullptr);
    co_return out;
  }

  /// What a map-style fetch of an iterable dataset gives: never asked (a StreamRun streams).
  static Task<Fetched<Batch>> not_map_style() {
    throw LogicError("coload: a map-style fetch was asked of an iterable dataset's loader");
    co_return Fetched<Batch>{};
  }

  Fetcher<D, C>& fetcher_;
  Driver& driver_;
  Recorder& recorder_;
};

/// No workers (num_workers = 0): the driver fetches, and an asynchronous batch's CPU work stays
/// on it.
template <class D, class C>
class InlinePlace final : public LocalPlace<D, C> {
  using Base = LocalPlace<D, C>;

 public:
  using typename Base::Batch;
  using typename Base::Run;

  InlinePlace(Fetcher<D, C>& fetcher, Driver& driver, Recorder& recorder) noexcept
      : Base(fetcher, driver, recorder) {}

  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no,
                             std::vector<Index> indices) override {
    if constexpr (IterableDataset<D>) {
      return this->not_map_style();
    } else if constexpr (Base::Plan::is_async) {
      return this->fetch_async(run, batch_no, std::move(indices), nullptr);
    } else {
      return fetch_sync(run, batch_no, std::move(indices));
    }
  }
  Task<Fetched<Batch>> stream(Run& run, StreamSource<Batch>& source, int w,
                              std::int64_t batch_no) override {
    return this->stream_here(run, source, w, batch_no, nullptr);
  }

 private:
  Task<Fetched<Batch>> fetch_sync(Run& run, std::int64_t batch_no, std::vector<Index> indices) {
    co_return this->fetch_here(run, batch_no, indices, -1);
  }
};

/// Worker threads of this process. A synchronous fetch moves to a worker and back; an
/// asynchronous one starts on the driver and moves itself with `co_await ctx.cpu()`, through
/// the BatchScheduler it is given; worker `w`'s stream runs on worker thread `w`.
template <class D, class C>
class ThreadPlace final : public LocalPlace<D, C> {
  using Base = LocalPlace<D, C>;

 public:
  using typename Base::Batch;
  using typename Base::Run;

  /// Starts `threads` worker threads (consumer's thread).
  ThreadPlace(Fetcher<D, C>& fetcher, Driver& driver, Recorder& recorder, int threads)
      : Base(fetcher, driver, recorder), pool_(threads) {}

  /// The worker threads (auto_workers sets how many take work).
  ThreadExecutor& pool() noexcept { return pool_; }

  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no,
                             std::vector<Index> indices) override {
    if constexpr (IterableDataset<D>) {
      return this->not_map_style();
    } else if constexpr (Base::Plan::is_async) {
      return fetch_async(run, batch_no, std::move(indices));
    } else {
      return fetch_on_worker(run, batch_no, std::move(indices));
    }
  }
  Task<Fetched<Batch>> stream(Run& run, StreamSource<Batch>& source, int w,
                              std::int64_t batch_no) override {
    co_await pool_.schedule_on(w);
    WorkerThread here(pool_, w);
    Fetched<Batch> out = co_await this->stream_here(run, source, w, batch_no, &here);
    co_await this->driver_.schedule();
    co_return out;
  }

 private:
  /// An asynchronous fetch whose `co_await ctx.cpu()` goes to the pool.
  Task<Fetched<Batch>> fetch_async(Run& run, std::int64_t batch_no, std::vector<Index> indices) {
    // The epoch's first batch, made while the others wait (WorkerCount::first_batch_bound),
    // lets them start once its bytes have arrived rather than once its CPU work is done: their
    // reads then overlap its CPU work, which the pool's order still puts first.
    BatchScheduler cpu(pool_, run.worker_infos(), *run.on_worker(), this->fetcher_.board,
                       batch_no, run.holding() ? &run : nullptr);
    co_return co_await this->Base::fetch_async(run, batch_no, std::move(indices), &cpu);
  }
  /// A synchronous fetch on the first free worker.
  Task<Fetched<Batch>> fetch_on_worker(Run& run, std::int64_t batch_no,
                                       std::vector<Index> indices) {
    co_await pool_.schedule();
    Fetched<Batch> out =
        this->fetch_here(run, batch_no, indices, ThreadExecutor::current_worker_id());
    co_await this->driver_.schedule();
    co_return out;
  }

  // NOTE: joined when the place is destroyed (consumer's thread, after the driver has ended).
  ThreadExecutor pool_;
};

/// The place a loader's options choose: worker processes (executor = processes), worker
/// threads, or the driver (num_workers = 0). Consumer's thread; nothing is forked yet.
template <class D, class C>
std::unique_ptr<Place<D, C>> make_place(Fetcher<D, C>& fetcher, Driver& driver,
                                        Recorder& recorder, WorkerCount& workers,
                                        const std::shared_ptr<DeviceBackend>& pin_backend) {
  const LoaderOptions<C>& o = fetcher.options;
  if (o.executor == Executor::processes) {
    return std::make_unique<ProcessBridge<D, C>>(fetcher, driver.context(), pin_backend);
  }
  if (o.num_workers == 0) return std::make_unique<InlinePlace<D, C>>(fetcher, driver, recorder);
  auto threads = std::make_unique<ThreadPlace<D, C>>(fetcher, driver, recorder, o.num_workers);
  workers.attach(&threads->pool());
  return threads;
}

/// With no workers (threads, no timeout, no pinning or device stage, a synchronous map-style
/// dataset), the consumer fetches on its own thread while it waits, as PyTorch's loader does
/// with num_workers = 0: the driver's work runs inside the consumer's wait, and a thread of its
/// own starts only when something else needs it (Epoch::next() awaited outside it, async_next,
/// the executor). A hand-off between two threads for every batch costs more than the fetch
/// itself on small batches, and far more when another thread holds a core.
template <class D, class C>
bool drives_inline(const LoaderOptions<C>& o) noexcept {
  // NOTE: not iterable datasets: an asynchronous stream waits on other threads, and a stuck
  // one must leave the destructor its grace period (stop_within), not block it.
  return o.num_workers == 0 && o.executor == Executor::threads && !(o.timeout > 0) &&
         !o.pin_memory && !o.device && !FetchPlan<D, C>::is_async && !IterableDataset<D>;
}

}  // namespace coload::detail
