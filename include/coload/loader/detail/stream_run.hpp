#pragma once
// The streaming run: one epoch over an iterable dataset, each worker streaming from its own
// replica, batch numbers handed to the workers in turn.

#include <algorithm>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/dataset/iterable.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/place.hpp"
#include "coload/loader/detail/run.hpp"

namespace coload::detail {

/// One epoch over an iterable dataset, as PyTorch's loader runs an IterableDataset: each
/// worker streams from its own replica; batch n is asked of the n-th worker in round-robin
/// order, so with `in_order` the batches interleave worker by worker; a worker whose stream
/// ends leaves the rotation, and its last partial batch is kept or dropped (drop_last) on its
/// own. A worker whose stream throws delivers the error and, its stream being over, leaves.
template <class D, class C>
class StreamRun final : public RunBase<D, C>, public StreamSource<typename FetchPlan<D, C>::batch> {
  using Base = RunBase<D, C>;
  using Plan = FetchPlan<D, C>;
  using Sample = typename Plan::sample;

 public:
  using typename Base::Batch;
  using typename Base::Services;

  StreamRun(Services& svc, std::int64_t epoch, std::uint64_t base_seed, DeliveredSet resumed,
            std::vector<std::uint8_t> generator)
      : Base(svc, epoch, base_seed, std::move(resumed), std::move(generator)),
        skip_counts_(static_cast<std::size_t>(std::max(1, svc.options().num_workers)), 0),
        streams_(skip_counts_.size()),
        solo_(svc.fetcher.worker_info(0, 1, base_seed)),
        queues_(skip_counts_.size()) {}

  /// Driver: hands batch numbers to the active workers in turn, under the in-flight bound.
  static Task<void> run(std::shared_ptr<StreamRun> self) {
    Services& svc = self->svc_;
    try {
      self->placement_generation_ = svc.placement.start();
    } catch (...) {
      self->queues_closed_ = true;
      self->dispatch_done(std::current_exception());
      co_return;
    }
    for (int w = 0; w < static_cast<int>(self->queues_.size()); ++w) {
      svc.spawn(stream_worker(self, w));
    }
    for (;;) {
      while (self->full() && !self->cancelled()) co_await self->slot();
      if (self->cancelled()) break;
      // A worker process died and was not restarted: the epoch ends after its error, as a
      // map-style one does (the other workers' streams were being delivered on).
      if (self->svc_.placement.broken()) break;
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

  /// Worker `w` for this epoch: takes batch numbers from its queue and has the placement fill
  /// each from the worker's stream (on its worker thread, in its process, or on the driver).
  /// Runs on the driver.
  static Task<void> stream_worker(std::shared_ptr<StreamRun> self, int w) {
    Place<D, C>& place = self->svc_.placement;
    bool over = false;
    for (;;) {
      std::optional<std::int64_t> task = co_await TaskAwaiter{self.get(), w};
      if (!task) break;
      if (over || self->cancelled() || place.broken()) {
        self->complete(*task, {}, self->cancelled());
        continue;
      }
      Outcome<Batch> outcome;
      bool dropped = false;
      // NOTE: a resumed epoch drops the batches this worker had delivered before, without
      // giving up this batch number: the rotation stays that of the interrupted run.
      for (;;) {
        auto fetched = co_await place.stream(*self, *self, w, *task);
        outcome = std::move(fetched.outcome);
        dropped = fetched.dropped;
        over = fetched.over;
        if (!self->drop_delivered(w, outcome, dropped) || over) break;
      }
      if (over) self->queues_[static_cast<std::size_t>(w)].active = false;
      self->hand_on(w, *task, std::move(outcome), dropped);
    }
    // NOTE: the stream (and with it the replica's generator frame) ends here, on the driver.
    self->streams_[static_cast<std::size_t>(w)] = WorkerStream{};
  }

 public:
  /// Where the placement put it (worker thread `w`, or the driver): the next batch of worker
  /// `w`'s stream, started on its first call (on the worker's replica, from its saved state
  /// when the epoch resumes from one).
  Task<Fetched<Batch>> next(int w, std::int64_t batch_no, Scheduler* worker) override {
    Fetcher<D, C>& fetcher = this->svc_.fetcher;
    const bool hop = worker != nullptr;
    const int who = hop ? w : -1;
    const std::size_t want =
        Plan::per_sample ? 1 : static_cast<std::size_t>(*this->svc_.options().batch_size);
    WorkerStream& s = streams_[static_cast<std::size_t>(w)];
    // Without workers the stream still gets a WorkerInfo, though get_worker_info() stays empty.
    WorkerInfo& info = hop ? this->workers_[static_cast<std::size_t>(w)] : solo_;
    Fetched<Batch> out;
    bool ended = false;
    std::vector<Sample> samples;
    try {
      if (!s.cursor) {
        if (hop) {
          fetcher.init_worker(info, this->epoch_, batch_no);
          s.replica = fetcher.replica(w);
          info.dataset = static_cast<const void*>(s.replica.get());
        }
        D& dataset = s.replica ? *s.replica : fetcher.dataset;
        try {
          if constexpr (ResumableStream<D>) {
            if (auto it = resume_states_.find(w); it != resume_states_.end()) {
              dataset.load_state(it->second);
            }
          }
          fetcher.share_error_policy(dataset);
          fetcher.share_driver(dataset);
          s.cursor.emplace(dataset.stream(std::as_const(info)));
        } catch (...) {
          throw wrap_current_exception(who, batch_no, -1, "starting the stream for");
        }
      }
      samples.reserve(std::min<std::size_t>(want, 512));  // want is batch_size: maybe huge
      // The stream's pulls are its `read` (one span per batch), then collate.
      StageClock clock;
      while (samples.size() < want) {
        if (this->cancelled()) throw Cancelled{};
        typename stream_t<D>::pointer sample = nullptr;
        try {
          if constexpr (async_stream_v<D>) {
            const auto thread = std::this_thread::get_id();
            sample = co_await s.cursor->next_async();
            // A stream that awaited something may resume elsewhere: come back to this
            // worker's thread (or the driver) before going on.
            if (std::this_thread::get_id() != thread) {
              if (hop) {
                co_await ResumeOn{*worker};
              } else {
                co_await this->svc_.driver.schedule();
              }
            }
          } else {
            sample = s.cursor->next_sync();
          }
        } catch (...) {
          ended = true;
          throw wrap_current_exception(who, batch_no, -1, "fetching");
        }
        if (!sample) {
          ended = true;
          break;
        }
        samples.push_back(std::move(*sample));
      }
      clock.read_lap(samples.size(), "batch", batch_no);
      if (clock.metrics) clock.shard->samples.fetch_add(samples.size(), std::memory_order_relaxed);
      const bool partial = samples.size() < want;
      if constexpr (ResumableStream<D>) {
        if (fetcher.stream_states_usable()) {
          const D& streamed = s.replica ? *s.replica : fetcher.dataset;
          out.outcome.stream_state = std::make_shared<const std::string>(streamed.state());
        }
      }
      if (!samples.empty() && !(partial && this->svc_.options().drop_last)) {
        out.outcome.batch.emplace(fetcher.place_batch(
            [&] { return fetcher.collate_samples(std::move(samples), who, batch_no); }));
        clock.lap(Stage::collate, 1, "batch", batch_no);
      }
    } catch (...) {
      // The outcome keeps the stream state taken before the failure, if any.
      Fetched<Batch> end = fetch_outcome<Batch>(std::current_exception());
      out.dropped = end.dropped;
      ended = end.over;
      out.outcome.error = std::move(end.outcome.error);
    }
    out.over = ended;
    co_return out;
  }

 private:
  /// Worker `w`'s stream in this process: its replica (worker threads) and its cursor. Touched
  /// where the placement runs worker `w`, and reset on the driver once the worker is done.
  struct WorkerStream {
    std::shared_ptr<D> replica;
    std::optional<StreamCursor<stream_t<D>>> cursor;
  };
  std::vector<WorkerStream> streams_;  // element w: worker w's place
  WorkerInfo solo_;                    // the stream's WorkerInfo without workers

  std::vector<WorkerQueue> queues_;  // driver
  int next_worker_ = 0;              // driver
  bool queues_closed_ = false;       // driver
};

}  // namespace coload::detail
