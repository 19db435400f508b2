#pragma once
// Place: where a batch's CPU work runs, as one interface. Three implementations: InlinePlace
// (the driver itself, num_workers = 0), ThreadPlace (worker threads) and ProcessBridge (worker
// processes). Each takes a fetch job (a map-style batch's indices, or the next batch of one
// worker's stream) and returns its outcome, made by fetch_outcome(). Runs see only this.

#include <coroutine>
#include <cstdint>
#include <functional>
#include <vector>

#include "coload/coro/scheduler.hpp"
#include "coload/coro/task.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/loader/detail/fetch_plan.hpp"
#include "coload/loader/detail/outcome.hpp"

namespace coload::detail {

/// Told, from any thread, when a batch's CPU work is first queued: its bytes have arrived.
class CpuStarted {
 public:
  virtual void cpu_started() noexcept = 0;

 protected:
  ~CpuStarted() = default;
};

template <class D, class C>
class RunBase;

/// Who has a batch in hand: the worker (-1: none known), its pid (worker processes) and the
/// batch's first indices with their count.
struct FetchHolder {
  int worker = -1;
  int pid = -1;
  std::vector<std::int64_t> first;
  std::int64_t count = 0;
};

/// The streams of an iterable epoch, as a place in this process runs them: the streaming run.
/// A worker process keeps its own stream and needs none.
template <class Batch>
class StreamSource {
 public:
  /// The next batch of worker `w`'s stream, as batch `batch_no`; `over` once nothing follows.
  /// Runs where the place put it: on worker thread `w` (`worker` resumes a coroutine there,
  /// for a stream that awaited something and came back elsewhere) or on the driver (`worker`
  /// is nullptr).
  virtual Task<Fetched<Batch>> next(int w, std::int64_t batch_no, Scheduler* worker) = 0;

 protected:
  ~StreamSource() = default;
};

/// Awaitable: continues on one of `scheduler`'s threads.
struct ResumeOn {
  Scheduler& scheduler;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) { scheduler.post(h); }
  void await_resume() const noexcept {}
};

/// Where a loader's fetch jobs run. Built on the consumer's thread; used on the driver, but
/// where said. Every job starts and ends on the driver, whatever thread or process ran it.
template <class D, class C>
class Place {
 public:
  using Batch = typename FetchPlan<D, C>::batch;

  virtual ~Place() = default;

  /// Batch `batch_no` of a map-style `run`: fetches `indices`.
  virtual Task<Fetched<Batch>> fetch(RunBase<D, C>& run, std::int64_t batch_no,
                                     std::vector<Index> indices) = 0;
  /// The next batch of worker `w`'s stream, as batch `batch_no` of `run`, from `source` (a
  /// place in this process) or the worker process's own stream.
  virtual Task<Fetched<Batch>> stream(RunBase<D, C>& run, StreamSource<Batch>& source, int w,
                                      std::int64_t batch_no) = 0;
  /// Who has batch `batch` of the current epoch in hand.
  virtual FetchHolder holder(std::int64_t batch) const = 0;

  /// At each epoch's start: starts the workers that are not running (processes fork); returns
  /// the generation of the workers the epoch uses, which run_finished gets back.
  virtual std::int64_t start() { return 0; }
  /// True once a worker died unrecovered: dispatch stops.
  virtual bool broken() const noexcept { return false; }
  /// An epoch has ended: `done` runs once the workers that go with it (worker processes
  /// without persistent_workers: those of `generation`, what its start() returned) are gone,
  /// else at once.
  virtual void run_finished(std::int64_t generation, std::function<void()> done) {
    (void)generation;
    done();
  }
  /// Fetches waiting on other processes end now (dropped), and those processes are told to go.
  virtual void shutdown() {}
};

}  // namespace coload::detail
