#pragma once
// The fetch side of a loader: one batch from the dataset and the collate, on whatever thread
// calls it. Used by the loader's runs (on the driver and the worker threads) and, in a worker
// process, by that process's loop; it owns the dataset and nothing that drives.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "coload/collate/batch_allocator.hpp"
#include "coload/core/metrics.hpp"
#include "coload/coro/async_generator.hpp"
#include "coload/coro/task.hpp"
#include "coload/coro/when_all.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/iterable.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/device/device.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/detail/fetch_plan.hpp"
#include "coload/loader/detail/handoff.hpp"
#include "coload/loader/detail/outcome.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"

namespace coload::detail {

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

/// What a fetch asks of the epoch it runs in (a run, or a worker process's task):
/// `cancelled()`, `epoch()` and `sample_seed()`.
template <class S>
concept FetchScope = requires(const S& s) {
  { s.cancelled() } -> std::convertible_to<bool>;
  { s.epoch() } -> std::convertible_to<std::int64_t>;
  { s.sample_seed() } -> std::convertible_to<std::uint64_t>;
};

/// What each worker thread (and the driver) is fetching right now: the batch, the sample in
/// hand and the batch's first indices. Read by a timeout's error and by a shutdown that finds a
/// worker stuck in a dataset's code; written by the fetching threads (any thread).
class FetchBoard {
 public:
  /// One fetching thread's entry; `worker` -1 is the driver.
  struct Entry {
    int worker = -1;
    std::int64_t batch = -1;  ///< -1: idle
    Index sample = -1;        ///< the sample in hand, -1 between samples or for a whole batch
    std::vector<std::int64_t> first;  ///< the batch's first indices (at most 8)
    std::int64_t count = 0;           ///< how many indices the batch has
  };

  explicit FetchBoard(int workers) : entries_(static_cast<std::size_t>(std::max(0, workers)) + 1) {
    for (std::size_t i = 0; i < entries_.size(); ++i) entries_[i].worker = static_cast<int>(i) - 1;
  }
  /// Worker `worker` (-1: the driver) starts batch `batch` of `indices`.
  void begin(int worker, std::int64_t batch, std::span<const Index> indices) {
    std::lock_guard lock(mutex_);
    fill(at(worker), batch, indices);
  }
  /// Worker `worker` takes sample `i` (-1: done with samples).
  void sample(int worker, Index i) {
    std::lock_guard lock(mutex_);
    at(worker).sample = i;
  }
  /// Worker `worker` is done with its batch.
  void end(int worker) {
    std::lock_guard lock(mutex_);
    at(worker).batch = -1;
    at(worker).sample = -1;
  }
  /// An asynchronous fetch of batch `batch` starts (on the driver): no thread holds it until
  /// its CPU work reaches a worker (note()).
  void begin_async(std::int64_t batch, std::span<const Index> indices) {
    std::lock_guard lock(mutex_);
    Entry& e = pending_.emplace_back();
    fill(e, batch, indices);
  }
  /// Worker `worker` runs the CPU work of sample `sample` (-1: the whole batch, or its
  /// collation) of asynchronous batch `batch`, until it is done with it (done()).
  void note(int worker, std::int64_t batch, Index sample) {
    std::lock_guard lock(mutex_);
    Entry& e = at(worker);
    e.batch = batch;
    e.sample = sample;
    e.first.clear();
    e.count = 0;
    for (const Entry& p : pending_) {
      if (p.batch == batch) {
        e.first = p.first;
        e.count = p.count;
        break;
      }
    }
  }
  /// The work on sample `sample` (-1: the whole batch, or its collation) of asynchronous batch
  /// `batch` has ended, on whichever thread: no worker holds it any more.
  void done(std::int64_t batch, Index sample) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 1; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (e.batch == batch && e.sample == sample) e.batch = e.sample = -1;
    }
  }
  /// The asynchronous fetch of batch `batch` has ended.
  void end_async(std::int64_t batch) {
    std::lock_guard lock(mutex_);
    std::erase_if(pending_, [&](const Entry& p) { return p.batch == batch; });
  }
  /// The thread fetching batch `batch`, if one is; else an asynchronous fetch of it that no
  /// worker holds (its worker -1: awaiting reads on the driver).
  std::optional<Entry> find(std::int64_t batch) const {
    std::lock_guard lock(mutex_);
    for (const auto& e : entries_) {
      if (e.batch == batch) return e;
    }
    for (const auto& p : pending_) {
      if (p.batch == batch) return p;
    }
    return std::nullopt;
  }
  /// Who holds what, for a message: "worker 1 is in sample 7 of batch 3; the driver is in
  /// batch 4", or empty when no thread holds a batch.
  std::string describe_busy() const {
    std::string who;
    for (const auto& e : busy()) {
      if (!who.empty()) who += "; ";
      who += e.worker >= 0 ? "worker " + std::to_string(e.worker) : std::string("the driver");
      who += " is in ";
      who += e.sample >= 0 ? "sample " + std::to_string(e.sample) + " of " : std::string();
      who += "batch " + std::to_string(e.batch);
    }
    return who;
  }
  /// Every thread with a batch in hand.
  std::vector<Entry> busy() const {
    std::lock_guard lock(mutex_);
    std::vector<Entry> out;
    for (const auto& e : entries_) {
      if (e.batch >= 0) out.push_back(e);
    }
    return out;
  }

 private:
  static void fill(Entry& e, std::int64_t batch, std::span<const Index> indices) {
    e.batch = batch;
    e.sample = -1;
    e.first.assign(indices.begin(),
                   indices.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(indices.size(), 8)));
    e.count = static_cast<std::int64_t>(indices.size());
  }
  Entry& at(int worker) {
    const auto i = static_cast<std::size_t>(worker + 1);
    return entries_[i < entries_.size() ? i : 0];
  }
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<Entry> pending_;  // asynchronous fetches in flight
};

/// Times a fetch's stages on the calling thread, for its loader's metrics and trace: each lap
/// reads the clock once, at a boundary between two stages. Without a recorder bound to the
/// thread (metrics off and no trace) it reads no clock at all.
struct StageClock {
  ThreadRecording& rec = thread_recording();
  Shard* shard = rec.shard;
  Tracer* tracer = shard ? rec.recorder->tracer() : nullptr;
  bool metrics = shard && rec.recorder->enabled();
  std::uint64_t mark = shard ? now_ns() : 0;

  /// The time since the last mark was `stage`, over `items` items (one span per item when
  /// tracing, or one for the lap); returns the lap's nanoseconds.
  std::uint64_t lap(Stage stage, std::uint64_t items, const char* arg_name = nullptr,
                    std::int64_t arg = -1) {
    if (!shard) return 0;
    const std::uint64_t end = now_ns();
    const std::uint64_t ns = end - mark;
    if (metrics) shard->add(stage, ns, items);
    if (tracer) tracer->span(stage_name(stage), rec.track, mark, end, arg_name, arg);
    shard->account_until(end);  // the lap's time is its stage's, not a wait on reads in flight
    mark = end;
    return ns;
  }
  /// A lap of `get`s: what finer stages (StageTimer) did not take is `read`; with finer stages
  /// it adds only their remainder's time, so that their spans are not counted twice.
  void read_lap(std::uint64_t items, const char* arg_name = nullptr, std::int64_t arg = -1) {
    if (!shard) return;
    const std::uint64_t end = now_ns();
    const std::uint64_t ns = end - mark;
    const std::uint64_t nested = std::exchange(rec.nested_ns, 0);
    if (metrics) {
      if (nested == 0) {
        shard->add(Stage::read, ns, items);
      } else if (ns > nested) {
        shard->add_ns(Stage::read, ns - nested);
      }
    }
    if (tracer) tracer->span("read", rec.track, mark, end, arg_name, arg);
    shard->account_until(end);  // the lap's time is its stage's, not a wait on reads in flight
    mark = end;
  }
  void restart() {
    if (shard) {
      mark = now_ns();
      rec.nested_ns = 0;
    }
  }
};

/// The dataset, the options it is fetched with, and where a fetch's memory, reads and CPU
/// work go. The pointers are the loader's (or, in a worker process, that process's own);
/// every member may be called from several worker threads at once.
template <class D, class C>
class Fetcher {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  using Sample = typename Plan::sample;
  static constexpr bool iterable = IterableDataset<D>;

  Fetcher(D ds, LoaderOptions<C> opts)
      : dataset(std::move(ds)), options(std::move(opts)), board(std::max(0, options.num_workers)) {
    // NOTE: the options are validated after this (by the core): a negative count sizes nothing.
    const auto workers = static_cast<std::size_t>(std::max(0, options.num_workers));
    worker_init_epoch_.assign(workers, -1);
    worker_init_error_.resize(workers);
    replicas_.resize(workers);
  }

  D dataset;
  LoaderOptions<C> options;
  SkipLog skips;
  FetchBoard board;  ///< what each worker thread is fetching (thread workers and the driver)
  int rank = 0;
  int world_size = 1;
  io::Reader* reader = nullptr;        ///< asynchronous datasets only
  asio::io_context* driver_context = nullptr;  ///< the driver's, for share_driver
  PinnedPool* pinned = nullptr;        ///< pin_memory with a device runtime
  Recorder* recorder = nullptr;        ///< the loader's metrics (a forked worker binds to it)

  /// Gives a stream that takes them (ShardStream::set_error_policy) the loader's on_error and
  /// skip count before it starts: its own faults (a remote shard that failed for good) are
  /// then skipped and counted as the loader skips a sample.
  template <class S>
  void share_error_policy(S& stream) {
    if constexpr (requires { stream.set_error_policy(options.on_error, &skips); }) {
      stream.set_error_policy(options.on_error, &skips);
    }
  }

  /// Gives a stream that takes it (ShardStream::set_driver) this loader's driver, where its
  /// network waits go on without holding a worker thread. Not in a worker process: the driver
  /// is the parent's there.
  template <class S>
  void share_driver(S& stream) {
    if constexpr (requires { stream.set_driver(*driver_context); }) {
      if (driver_context) stream.set_driver(*driver_context);
    }
  }

  /// Worker `id` of `n` for an epoch whose worker seed is `seed` (any thread).
  WorkerInfo worker_info(int id, int n, std::uint64_t seed) const noexcept {
    return WorkerInfo{id, n, seed, static_cast<const void*>(&dataset), rank, world_size};
  }

  /// True when each stream's state() describes that worker's stream alone: the dataset has
  /// state()/load_state(), each worker streams its own copy, and in this process (any thread).
  bool stream_states_usable() const noexcept {
    if constexpr (ResumableStream<D>) {
      return options.executor != Executor::processes &&
             (std::is_copy_constructible_v<D> || options.num_workers <= 1);
    } else {
      return false;
    }
  }

  /// worker_init_fn, once per worker per epoch (once ever with persistent_workers), before
  /// batch `batch`. Once it has failed, every later batch of the epoch on that worker fails
  /// with its error, as every fetch of a torch worker whose worker_init_fn failed does in that
  /// epoch (none is served by a worker left half set up; torch's persistent worker serves the
  /// next epochs). Called on worker `info.id`'s thread only, for each batch.
  void init_worker(const WorkerInfo& info, std::int64_t epoch, std::int64_t batch) {
    const auto w = static_cast<std::size_t>(info.id);
    auto& last = worker_init_epoch_[w];
    auto& failed = worker_init_error_[w];
    if (last >= 0 && (options.persistent_workers || last == epoch)) {
      if (failed.error && failed.epoch == epoch) {
        try {
          std::rethrow_exception(failed.error);
        } catch (...) {
          throw wrap_current_exception(info.id, batch, -1,
                                       "serving, as its worker_init_fn had failed,");
        }
      }
      return;
    }
    last = epoch;
    failed = {};
    if (!options.worker_init_fn) return;
    try {
      options.worker_init_fn(info);
    } catch (...) {
      failed = {std::current_exception(), epoch};
      throw wrap_current_exception(info.id, batch, -1,
                                   batch >= 0 ? "running worker_init_fn before"
                                              : "running worker_init_fn");
    }
  }

  /// Worker `w`'s own copy of the dataset (as each PyTorch worker process has one), made on
  /// its first stream and, with persistent_workers, kept across epochs. A dataset that cannot
  /// be copied is shared. Called on worker `w`'s thread only.
  std::shared_ptr<D> replica(int w) {
    auto& slot = replicas_[static_cast<std::size_t>(w)];
    if constexpr (std::is_copy_constructible_v<D>) {
      if (!slot || !options.persistent_workers) slot = std::make_shared<D>(std::as_const(dataset));
      return slot;
    } else {
      return std::shared_ptr<D>(std::shared_ptr<D>{}, &dataset);
    }
  }

  /// Batch `batch_no` of indices `indices`, synchronously on the calling thread (worker
  /// `info`, or the driver when null).
  template <FetchScope Scope>
  Batch fetch_batch(Scope& run, std::span<const Index> indices, const WorkerInfo* info,
                    std::int64_t batch_no)
    requires(!iterable && !Plan::is_async)
  {
    const int worker = info ? info->id : -1;
    StageClock clock;
    if constexpr (Plan::whole_batch) {
      try {
        clock.restart();
        Batch batch = dataset.get_batch(indices);
        clock.read_lap(indices.size(), "batch", batch_no);
        return batch;
      } catch (...) {
        rethrow_named(worker, batch_no);
      }
    } else {
      std::vector<Sample> samples;
      if constexpr (Plan::batch_of_samples) {
        try {
          clock.restart();
          samples = dataset.get_batch(indices);
          clock.read_lap(indices.size(), "batch", batch_no);
        } catch (...) {
          rethrow_named(worker, batch_no);
        }
      } else {
        samples.reserve(indices.size());
        clock.restart();
        for (Index i : indices) {
          if (run.cancelled()) throw Cancelled{};
          SampleContext ctx{i, run.epoch(), Rng::for_sample(run.sample_seed(), run.epoch(), i),
                            info};
          board.sample(worker, i);
          try {
            samples.push_back(get_sample(dataset, i, ctx));
          } catch (...) {
            // Failed once the epoch was stopped (an interrupt that stopped it, say): the batch
            // is dropped, and the sample neither skipped nor reported.
            if (run.cancelled()) throw Cancelled{};
            auto error = wrap_current_exception(worker, batch_no, i, "fetching");
            if (options.on_error != OnError::skip) throw error;
            skips.skip(i, error.what());
          }
          // NOTE: a span per sample only when tracing; metrics time the batch's gets at once.
          if (clock.tracer) clock.read_lap(1, "index", i);
        }
        if (!clock.tracer) clock.read_lap(indices.size());
        if (samples.empty()) throw EmptyBatch{};
      }
      Batch batch = collate_samples(std::move(samples), worker, batch_no);
      clock.lap(Stage::collate, 1, "batch", batch_no);
      return batch;
    }
  }

  /// An asynchronous fetch of batch `batch_no`: get_batch_async, or get_async for every index
  /// at once and then collate. Starts on the driver; its CPU work goes to `cpu` (the
  /// placement's scheduler for this batch; none: it stays on the calling thread), in the order
  /// the batches started.
  template <FetchScope Scope>
  Task<Batch> fetch_batch_async(Scope& run, std::span<const Index> indices, std::int64_t batch_no,
                                Scheduler* cpu = nullptr)
    requires(Plan::is_async)
  {
    const CpuPlace place{cpu, -1, cpu ? order_key(run.epoch(), batch_no) : 0};
    if constexpr (Plan::path == FetchPath::whole_batch_async) {
      BatchContext ctx{indices, batch_no, run.epoch(), run.sample_seed(), reader, place,
                       options.on_error, &skips};
      // The batch's memory: a pinned lease, or (in a worker process) the task's slot.
      std::unique_ptr<BatchLease> lease = pinned ? pinned->begin_batch() : nullptr;
      ctx.allocator = lease ? lease.get() : current_batch_allocator();
      try {
        BoardDone done{board, batch_no};
        Batch batch = co_await dataset.get_batch_async(indices, ctx);
        if (!pinned) co_return batch;
        StageClock clock;
        Batch out = pin_batch(std::move(batch), *pinned);
        clock.lap(Stage::pin, 1, "batch", batch_no);
        co_return out;
      } catch (...) {
        rethrow_named(current_worker_id_or_driver(), batch_no);
      }
    } else {
      std::vector<Task<std::optional<Sample>>> tasks;
      tasks.reserve(indices.size());
      for (Index i : indices) {
        CpuPlace sample_place = place;
        sample_place.sample = i;
        tasks.push_back(sample_async(
            SampleContext{i, run.epoch(), Rng::for_sample(run.sample_seed(), run.epoch(), i),
                          nullptr, reader, sample_place},
            batch_no));
      }
      auto fetched = co_await when_all(std::move(tasks));
      if (run.cancelled()) throw Cancelled{};
      std::vector<Sample> samples;
      samples.reserve(fetched.size());
      for (auto& s : fetched) {
        if (s) samples.push_back(std::move(*s));
      }
      if (samples.empty()) throw EmptyBatch{};
      // Collating is CPU work: a fetch whose samples did none of theirs on a worker moves now.
      if (place.pool && !current_worker_info()) co_await CpuAwaiter{place};
      const int worker = current_worker_id_or_driver();
      if (worker >= 0) board.note(worker, batch_no, -1);
      BoardDone done{board, batch_no};
      co_return place_batch([&] {
        StageClock clock;
        Batch batch = collate_samples(std::move(samples), worker, batch_no);
        clock.lap(Stage::collate, 1, "batch", batch_no);
        return batch;
      });
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
    StageClock clock;
    Batch out = pin_batch(std::move(*batch), *pinned);
    clock.lap(Stage::pin, 1);
    return out;
  }

  /// Collate's batch from `samples` (a per-sample collate gets the one sample alone).
  Batch collate_samples(std::vector<Sample>&& samples, int worker, std::int64_t batch_no) {
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

  /// The id of the worker running the caller, or -1 (the driver).
  static int current_worker_id_or_driver() noexcept {
    const WorkerInfo* info = current_worker_info();
    return info ? info->id : -1;
  }

 private:
  /// The place in line of batch `batch_no`'s CPU work: the batches in the order they started
  /// (epoch, then batch), so that the oldest in flight finishes first rather than all of them
  /// progressing at once.
  /// NOTE: batches past 2^32 - 2 in an epoch share the last key (FIFO among them); the key is
  /// never 0, which means none.
  static std::uint64_t order_key(std::int64_t epoch, std::int64_t batch_no) noexcept {
    return (static_cast<std::uint64_t>(epoch) << 32) +
           static_cast<std::uint64_t>(std::clamp<std::int64_t>(batch_no, 0, 0xFFFFFFFE)) + 1;
  }

  /// One sample of an asynchronous fetch; its failure names the sample, and with
  /// `on_error = skip` leaves it out (an empty result).
  Task<std::optional<Sample>> sample_async(SampleContext ctx, std::int64_t batch_no) {
    std::optional<WorkerError> error;
    try {
      std::optional<Sample> sample(co_await dataset.get_async(ctx.index, ctx));
      board.done(batch_no, ctx.index);
      co_return sample;
    } catch (...) {
      board.done(batch_no, ctx.index);
      error.emplace(wrap_current_exception(current_worker_id_or_driver(), batch_no, ctx.index,
                                           "fetching"));
    }
    if (options.on_error != OnError::skip) throw *error;
    skips.skip(ctx.index, error->what());
    co_return std::nullopt;
  }

  /// Clears the note of an asynchronous batch's whole-batch work (its collation, or its
  /// get_batch_async) when that work ends.
  struct BoardDone {
    FetchBoard& board;
    std::int64_t batch;
    ~BoardDone() { board.done(batch, -1); }
  };

  std::vector<std::int64_t> worker_init_epoch_;  // element i: worker i's thread only
  struct InitFailure {
    std::exception_ptr error;  // worker_init_fn's own exception
    std::int64_t epoch = -1;
  };
  std::vector<InitFailure> worker_init_error_;  // as worker_init_epoch_
  std::vector<std::shared_ptr<D>> replicas_;     // element i: worker i's thread only
};

}  // namespace coload::detail
