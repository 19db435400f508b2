#pragma once
// Where a batch's CPU work runs: the one place that decides. Inline on the driver, on worker
// threads, or in worker processes; each takes a fetch job (a batch's indices, or a worker's
// next stream batch in a process) and returns its outcome, made by fetch_outcome().

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
#include "coload/loader/detail/process_bridge.hpp"
#include "coload/loader/detail/worker_count.hpp"
#include "coload/loader/driver.hpp"

namespace coload::detail {

/// Who has a batch in hand: the worker (-1: none known), its pid (worker processes) and the
/// batch's first indices with their count.
struct FetchHolder {
  int worker = -1;
  int pid = -1;
  std::vector<std::int64_t> first;
  std::int64_t count = 0;
};

/// The worker threads as one asynchronous batch's `co_await ctx.cpu()` sees them: the pool,
/// in the batch's place in line, and on arrival the loader's records: get_worker_info() names
/// the worker, the board notes who holds which sample (for timeouts and a stuck shutdown), and
/// worker_init_fn runs once per worker per epoch. Lives as long as the batch's fetch.
class BatchScheduler final : public Scheduler {
 public:
  BatchScheduler(ThreadExecutor& pool, const WorkerInfo* workers,
                 const std::function<void(const WorkerInfo&)>& on_worker, FetchBoard& board,
                 std::int64_t batch) noexcept
      : pool_(pool), workers_(workers), on_worker_(on_worker), board_(board), batch_(batch) {}

  void post(std::coroutine_handle<> h) override { pool_.post(h); }
  void post_ordered(std::coroutine_handle<> h, std::uint64_t order) override {
    pool_.post_ordered(h, order);
  }
  void arrived(std::int64_t sample) override {
    const WorkerInfo& info = workers_[ThreadExecutor::current_worker_id()];
    set_worker_info(&info);
    board_.note(info.id, batch_, sample);
    if (on_worker_) on_worker_(info);
  }

 private:
  ThreadExecutor& pool_;
  const WorkerInfo* workers_;  // indexed by worker id
  const std::function<void(const WorkerInfo&)>& on_worker_;
  FetchBoard& board_;
  const std::int64_t batch_;
};

/// CPU work in this process: on the driver itself (no executor: num_workers = 0) or on a pool
/// of worker threads. An asynchronous fetch starts on the driver, where its reads are
/// submitted, and moves onto a worker itself with `co_await ctx.cpu()`, through the
/// BatchScheduler this place gives it.
template <class D, class C>
class LocalPlace {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;

  /// Starts `threads` worker threads (none: the driver fetches) (consumer's thread).
  LocalPlace(Fetcher<D, C>& fetcher, Driver& driver, Recorder& recorder, int threads)
      : fetcher_(fetcher), driver_(driver), recorder_(recorder) {
    if (threads > 0) executor_ = std::make_unique<ThreadExecutor>(threads);
  }
  LocalPlace(const LocalPlace&) = delete;
  LocalPlace& operator=(const LocalPlace&) = delete;
  ~LocalPlace() { close(); }

  /// Joins the worker threads (consumer's thread, after the driver has ended).
  void close() { executor_.reset(); }

  ThreadExecutor* executor() noexcept { return executor_.get(); }

  /// Batch `batch_no` of `run`: starts and ends on the driver.
  template <class Run>
  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no, std::vector<Index> indices) {
    if constexpr (Plan::is_async) {
      Fetched<Batch> out;
      out.dropped = run.cancelled();
      if (out.dropped) co_return out;
      fetcher_.board.begin_async(batch_no, indices);
      std::optional<BatchScheduler> cpu;
      if (executor_) {
        cpu.emplace(*executor_, run.worker_infos(), *run.on_worker(), fetcher_.board, batch_no);
      }
      try {
        out.outcome.batch.emplace(co_await fetcher_.fetch_batch_async(
            run, indices, batch_no, cpu ? &*cpu : nullptr));
      } catch (...) {
        out = fetch_outcome<Batch>(std::current_exception());
      }
      fetcher_.board.end_async(batch_no);
      set_worker_info(nullptr);
      if (!driver_.on_driver_thread()) co_await driver_.schedule();
      co_return out;
    } else {
      const bool hop = executor_ != nullptr;
      if (hop) co_await executor_->schedule();
      Fetched<Batch> out = fetch_here(run, batch_no, indices, hop);
      if (hop) co_await driver_.schedule();
      co_return out;
    }
  }

  /// Who holds batch `batch`: a worker thread, the driver, or an asynchronous fetch awaiting
  /// its reads.
  FetchHolder holder(std::int64_t batch) const {
    FetchHolder h;
    if (auto e = fetcher_.board.find(batch)) {
      h.worker = e->worker;
      h.first = std::move(e->first);
      h.count = e->count;
    }
    return h;
  }

 private:
  /// A synchronous fetch on this thread: worker thread `hop`, else the driver.
  template <class Run>
  Fetched<Batch> fetch_here(Run& run, std::int64_t batch_no, const std::vector<Index>& indices,
                            bool hop) {
    Fetched<Batch> out;
    out.dropped = run.cancelled();
    if (out.dropped) return out;
    const int worker = hop ? ThreadExecutor::current_worker_id() : -1;
    const WorkerInfo* info = hop ? &run.worker_infos()[worker] : nullptr;
    if (hop) recorder_.bind_thread(worker);
    set_worker_info(info);
    fetcher_.board.begin(worker, batch_no, indices);
    try {
      if (info) fetcher_.init_worker(*info, run.epoch());
      out.outcome.batch.emplace(fetcher_.place_batch(
          [&] { return fetcher_.fetch_batch(run, indices, info, batch_no); }));
    } catch (...) {
      out = fetch_outcome<Batch>(std::current_exception());
    }
    fetcher_.board.end(worker);
    set_worker_info(nullptr);
    return out;
  }

  Fetcher<D, C>& fetcher_;
  Driver& driver_;
  Recorder& recorder_;
  std::unique_ptr<ThreadExecutor> executor_;
};

/// A loader's placement: worker processes (executor = processes), else this process's
/// LocalPlace. Built on the consumer's thread; driver only after, but where said.
template <class D, class C>
class Placement {
 public:
  using Batch = typename FetchPlan<D, C>::batch;

  Placement(Fetcher<D, C>& fetcher, Driver& driver, Recorder& recorder, WorkerCount& workers,
            const std::shared_ptr<DeviceBackend>& pin_backend)
      : fetcher_(fetcher),
        driver_(driver),
        local_(fetcher, driver, recorder,
               fetcher.options.executor == Executor::processes ? 0 : fetcher.options.num_workers) {
    if (fetcher.options.executor == Executor::processes) {
      processes_ = std::make_unique<ProcessBridge<D, C>>(fetcher, driver.context(), pin_backend);
    }
    workers.attach(local_.executor());
  }

  /// Batch `batch_no` of a map-style `run`, where its CPU work runs. Starts and ends on the
  /// driver.
  template <class Run>
  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no, std::vector<Index> indices) {
    if (processes_) return processes_->fetch(run, batch_no, std::move(indices));
    return local_.fetch(run, batch_no, std::move(indices));
  }
  /// The next batch of worker process `w`'s stream, as batch `batch_no` (in_processes()).
  template <class Run>
  Task<Fetched<Batch>> stream_in_process(Run& run, int w, std::int64_t batch_no) {
    return processes_->stream(run, w, batch_no);
  }

  /// True when the workers are processes; then a stream runs in them (stream_in_process).
  bool in_processes() const noexcept { return processes_ != nullptr; }
  /// True when the workers are threads of this process; then a stream runs on them (to_worker).
  bool worker_threads() noexcept { return local_.executor() != nullptr; }
  /// Awaitable: continue on worker thread `w` (worker_threads() only).
  auto to_worker(int w) noexcept { return local_.executor()->schedule_on(w); }
  /// Awaitable: continue on the driver (any thread).
  auto to_driver() noexcept { return driver_.schedule(); }

  /// Forks the worker processes that are not running (at each epoch's start).
  void start() {
    if (processes_) processes_->start();
  }
  /// True once a worker process died unrecovered: dispatch stops.
  bool broken() const noexcept { return processes_ && processes_->broken(); }
  /// Who has batch `batch` of the current epoch in hand.
  FetchHolder holder(std::int64_t batch) const {
    if (!processes_) return local_.holder(batch);
    FetchHolder h;
    const auto [worker, pid] = processes_->holder(batch, h.first, h.count);
    h.worker = worker;
    h.pid = pid;
    return h;
  }
  /// An epoch has ended; without persistent_workers its processes go with it, and `done`
  /// runs once they are gone.
  template <class F>
  void run_finished(F done) {
    if (processes_ && !fetcher_.options.persistent_workers) {
      processes_->retire(std::move(done));
    } else {
      done();
    }
  }
  /// Fetches waiting on worker processes end now (dropped), and the processes are told to go.
  void shutdown() {
    if (processes_) processes_->shutdown(std::make_exception_ptr(Cancelled{}));
  }
  /// Waits for the processes (SIGKILL after a grace period), then joins the worker threads
  /// (consumer's thread, after the driver has ended).
  void close() {
    processes_.reset();
    local_.close();
  }

 private:
  Fetcher<D, C>& fetcher_;
  Driver& driver_;
  LocalPlace<D, C> local_;
  std::unique_ptr<ProcessBridge<D, C>> processes_;
};

}  // namespace coload::detail
