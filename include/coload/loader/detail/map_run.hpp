#pragma once
// The map-style run: one epoch over a map-style dataset, fed by the batch sampler's index
// lists, each fetched and collated on whichever worker is free.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/run.hpp"

namespace coload::detail {

/// One epoch over a map-style dataset. The dispatcher walks the batch sampler on the driver,
/// keeping at most the in-flight bound of batches between dispatch and consumer; each batch
/// is a fetch of its own, spawned into the loader's scope, which the placement runs on a worker
/// thread, on the driver, or in a worker process.
template <class D, class C>
class MapRun final : public RunBase<D, C> {
  using Base = RunBase<D, C>;

 public:
  using typename Base::Batch;
  using typename Base::Services;
  using Base::Base;

  /// Driver: the dispatcher. Ends once the sampler is exhausted, the epoch is cancelled, or a
  /// worker process died unrecovered; an error from the sampler ends the epoch after the
  /// batches before it.
  static Task<void> run(std::shared_ptr<MapRun> self) {
    Services& svc = self->svc_;
    std::exception_ptr error;
    try {
      // NOTE: on the driver: a stopped epoch's dispatcher may still be reading the sampler here.
      // Every epoch, even one stopped before it ran, asks for its batches first, in the order
      // the epochs started: a sampler handed one index iterator an epoch (Python's) hands each
      // epoch its own.
      BatchSource& source = *svc.batches;
      source.sampler.set_epoch(self->epoch_);
      auto batches = source.sampler.batches();
      // An epoch stopped before it ran starts no workers: worker processes would fork only to
      // go (and the next epoch, which waits for this dispatcher, would wait for the forks).
      if (!self->cancelled()) self->placement_generation_ = svc.placement.start();
      self->hold_first_ = true;
      // NOTE: each epoch, as the sampler's: a dataset may grow between epochs.
      const auto size = static_cast<std::int64_t>(svc.fetcher.dataset.size());
      for (;;) {
        while (self->full() && !self->cancelled()) co_await self->slot();
        if (self->cancelled()) break;
        // A worker process died and was not restarted: the epoch ends after its error.
        if (svc.placement.broken()) break;
        StageClock clock;
        std::vector<Index>* indices = co_await batches.next();
        if (!indices) break;
        clock.lap(Stage::sample, 1, "batch", self->dispatched_);
        if (self->resumed_.contains(self->dispatched_)) {
          // Delivered before the state this epoch resumed from: not fetched again.
          self->complete(self->dispatched_++, Outcome<Batch>(), false);
          continue;
        }
        const std::size_t given = indices->size();
        if (auto refused = source.admit(*indices, self->dispatched_, size,
                                        svc.options().on_error, svc.fetcher.skips);
            refused || (given > 0 && indices->empty())) {
          // An index outside the dataset: the batch's error, or (every index skipped) a skip.
          Outcome<Batch> outcome;
          outcome.error = std::move(refused);
          self->complete(self->dispatched_++, std::move(outcome), false);
          continue;
        }
        // The wait for the first batch's bytes counts from here: not the sampler's first draw
        // (a permutation of a large dataset takes milliseconds of its own).
        if (self->hold_first_) self->hold_start_ns_ = now_ns();
        svc.spawn(fetch(self, self->dispatched_++, std::move(*indices)));
        self->note_dispatch();
      }
    } catch (...) {
      error = std::current_exception();
    }
    self->dispatch_done(std::move(error));
  }

 private:
  /// Driver (at its start and its end): batch `batch_no`, fetched where the placement runs it,
  /// and handed to the reorder ring.
  static Task<void> fetch(std::shared_ptr<MapRun> self, std::int64_t batch_no,
                          std::vector<Index> indices) {
    const std::size_t samples = indices.size();
    auto fetched = co_await self->svc_.placement.fetch(*self, batch_no, std::move(indices));
    Recorder& r = self->svc_.recorder;
    if (fetched.outcome.batch && r.enabled()) {
      r.shard(Recorder::driver).samples.fetch_add(samples, std::memory_order_relaxed);
    }
    self->complete(batch_no, std::move(fetched.outcome), fetched.dropped);
  }
};

}  // namespace coload::detail
