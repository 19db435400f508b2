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
#include "coload/loader/detail/run.hpp"

namespace coload::detail {

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
  using typename Base::Services;

  StreamRun(Services& svc, std::int64_t epoch, std::uint64_t base_seed, DeliveredSet resumed,
            std::vector<std::uint8_t> generator)
      : Base(svc, epoch, base_seed, std::move(resumed), std::move(generator)),
        skip_counts_(static_cast<std::size_t>(std::max(1, svc.options().num_workers)), 0),
        queues_(static_cast<std::size_t>(std::max(1, svc.options().num_workers))) {}

  /// Driver: hands batch numbers to the active workers in turn, under the in-flight bound.
  static Task<void> run(std::shared_ptr<StreamRun> self) {
    Services& svc = self->svc_;
    try {
      svc.placement.start();
    } catch (...) {
      self->queues_closed_ = true;
      self->dispatch_done(std::current_exception());
      co_return;
    }
    for (int w = 0; w < static_cast<int>(self->queues_.size()); ++w) {
      if (svc.placement.in_processes()) {
        svc.spawn(stream_in_process(self, w));
      } else {
        svc.spawn(stream_worker(self, w));
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
  static Task<void> stream_worker(std::shared_ptr<StreamRun> self, int w) {
    Services& svc = self->svc_;
    Placement<D, C>& place = svc.placement;
    Fetcher<D, C>& fetcher = svc.fetcher;
    const bool hop = place.worker_threads();
    const std::size_t want =
        Plan::per_sample ? 1 : static_cast<std::size_t>(*svc.options().batch_size);
    // Without workers the stream still gets a WorkerInfo, though get_worker_info() stays empty.
    WorkerInfo solo = fetcher.worker_info(0, 1, self->base_seed_);
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
      if (hop) co_await place.to_worker(w);
      Outcome<Batch> outcome;
      bool dropped = false;
      bool ended = false;
      std::vector<Sample> samples;
      if (hop) {
        set_worker_info(&info);
        svc.recorder.bind_thread(w);
      }
      fetcher.board.begin(hop ? w : -1, *task, {});
      // NOTE: a resumed epoch drops the batches this worker had delivered before, without
      // giving up this batch number: the rotation stays that of the interrupted run.
      for (;;) {
        try {
          if (!cursor) {
            if (hop) {
              fetcher.init_worker(info, self->epoch_);
              replica = fetcher.replica(w);
              info.dataset = static_cast<const void*>(replica.get());
            }
            D& dataset = replica ? *replica : fetcher.dataset;
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
          // The stream's pulls are its `read` (one span per batch), then collate.
          StageClock clock;
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
                    co_await place.to_worker(w);
                  } else {
                    co_await place.to_driver();
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
          clock.read_lap(samples.size(), "batch", *task);
          if (clock.metrics) {
            clock.shard->samples.fetch_add(samples.size(), std::memory_order_relaxed);
          }
          const bool partial = samples.size() < want;
          if constexpr (ResumableStream<D>) {
            if (fetcher.stream_states_usable()) {
              const D& streamed = replica ? *replica : fetcher.dataset;
              outcome.stream_state = std::make_shared<const std::string>(streamed.state());
            }
          }
          if (!samples.empty() && !(partial && svc.options().drop_last)) {
            outcome.batch.emplace(fetcher.place_batch([&] {
              return fetcher.collate_samples(std::move(samples), hop ? w : -1, *task);
            }));
            clock.lap(Stage::collate, 1, "batch", *task);
          }
        } catch (...) {
          // The outcome keeps the stream state taken before the failure, if any.
          Fetched<Batch> end = fetch_outcome<Batch>(std::current_exception());
          dropped = end.dropped;
          ended = end.over;
          outcome.error = std::move(end.outcome.error);
        }
        if (!self->drop_delivered(w, outcome, dropped) || ended) break;
        samples.clear();
      }
      fetcher.board.end(hop ? w : -1);
      if (hop) set_worker_info(nullptr);
      if (hop) co_await place.to_driver();
      if (ended) {
        over = true;
        self->queues_[static_cast<std::size_t>(w)].active = false;
      }
      self->hand_on(w, *task, std::move(outcome), dropped);
    }
    // NOTE: the stream (and with it the replica's generator frame) ends here, on the driver.
    cursor.reset();
    replica.reset();
  }

  /// Worker process `w` for this epoch: asks its process for one batch of its stream per
  /// batch number (the process keeps the stream between them). Runs on the driver.
  static Task<void> stream_in_process(std::shared_ptr<StreamRun> self, int w) {
    Placement<D, C>& place = self->svc_.placement;
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
        auto streamed = co_await place.stream_in_process(*self, w, *task);
        outcome = std::move(streamed.outcome);
        dropped = streamed.dropped;
        over = streamed.over;
        if (!self->drop_delivered(w, outcome, dropped) || over) break;
      }
      if (over) self->queues_[static_cast<std::size_t>(w)].active = false;
      self->hand_on(w, *task, std::move(outcome), dropped);
    }
  }

  std::vector<WorkerQueue> queues_;  // driver
  int next_worker_ = 0;              // driver
  bool queues_closed_ = false;       // driver
};

}  // namespace coload::detail
