#pragma once
// The bridge to worker processes: what the loader hands exec's process pool (the fetch that a
// worker process runs, the fork server's payload) and how a worker's answer becomes a batch.

#include <asio/io_context.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "coload/collate/wire.hpp"
#include "coload/core/warning.hpp"
#include "coload/coro/detached.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/device.hpp"
#include "coload/exec/errors.hpp"
#include "coload/exec/process.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/outcome.hpp"
#include "coload/loader/detail/place.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"

namespace coload::detail {

/// The options a fork-server worker receives: batch_size (-1: none), drop_last, on_error,
/// num_workers, persistent_workers, worker_init_fn's address (0: none), rank, world_size.
using ChildOptions = std::tuple<std::int64_t, bool, std::int32_t, std::int32_t, bool,
                                std::uint64_t, std::int32_t, std::int32_t>;

/// What a fork-server worker needs of `o`. Every field of LoaderOptions is named here, sent or
/// left to the parent, so that a new option does not compile until it is decided here (and in
/// options_in_child).
template <class C>
ChildOptions child_options(const LoaderOptions<C>& o, std::uint64_t init, int rank, int world) {
  [[maybe_unused]] const auto& [batch_size, shuffle, sampler, batch_sampler, num_workers, collate,
                                pin_memory, drop_last, timeout, worker_init_fn, prefetch_factor,
                                persistent_workers, in_order, seed, on_error, executor,
                                process_start, on_worker_death, max_worker_restarts, rank_option,
                                world_size_option, device, device_backend, metrics, trace] = o;
  // The parent's alone: where indices and seeds come from (each task carries them), the
  // scheduling of tasks and deaths, and where batches go (a worker writes into its slot, which
  // the parent pins; metrics and trace, resolved by the parent's recorder, which the worker
  // joins through RecorderView). The
  // worker makes its own collate (an empty type), and worker_init_fn
  // travels as a plain function's address; rank and world size as the loader resolved them.
  return ChildOptions{batch_size.value_or(-1), drop_last, static_cast<std::int32_t>(on_error),
                      num_workers, persistent_workers, init, rank, world};
}

/// The options a fork-server worker fetches with, from what child_options() sent.
template <class C>
LoaderOptions<C> options_in_child(const ChildOptions& sent) {
  LoaderOptions<C> o;
  [[maybe_unused]] auto& [batch_size, shuffle, sampler, batch_sampler, num_workers, collate,
                          pin_memory, drop_last, timeout, worker_init_fn, prefetch_factor,
                          persistent_workers, in_order, seed, on_error, executor, process_start,
                          on_worker_death, max_worker_restarts, rank, world_size, device,
                          device_backend, metrics, trace] = o;
  const auto& [batch, drop, error, workers, persistent, init, rank_sent, world_sent] = sent;
  batch_size = batch < 0 ? std::nullopt : std::optional<std::int64_t>(batch);
  drop_last = drop;
  on_error = static_cast<OnError>(error);
  num_workers = workers;
  persistent_workers = persistent;
  if (init) worker_init_fn = reinterpret_cast<void (*)(const WorkerInfo&)>(init);
  executor = Executor::processes;
  process_start = ProcessStart::forkserver;
  rank = rank_sent;
  world_size = world_sent;
  return o;
}

/// A loader's worker processes: the pool, the fetch each worker runs over the loader's fetch
/// side (its forked copy, or one rebuilt from the fork server's payload), and the parent's
/// side of a task: the Place of worker processes. Driver only, but where said.
template <class D, class C>
class ProcessBridge final : public Place<D, C> {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  using Run = RunBase<D, C>;
  static constexpr bool iterable = IterableDataset<D>;

  /// Makes the pool (nothing is forked before start()). `pin_backend`, when set, pins the
  /// arena in this process, so that batches decoded over it need no copy (consumer's thread).
  ProcessBridge(Fetcher<D, C>& fetcher, asio::io_context& driver,
                std::shared_ptr<DeviceBackend> pin_backend)
      : fetcher_(fetcher) {
    if constexpr (wire::Wireable<Batch>) {
      const auto& options = fetcher.options;
      ProcessPool::Options o;
      if (options.process_start == ProcessStart::forkserver) forkserver_options(o);
      o.num_workers = options.num_workers;
      // NOTE: a restarted stream would start over and repeat its samples.
      o.on_death = iterable ? OnWorkerDeath::raise : options.on_worker_death;
      o.max_restarts = options.max_worker_restarts;
      if (pin_backend) {
        o.pin_range = [pin_backend](void* p, std::size_t n) { pin_backend->register_host(p, n); };
        o.unpin_range = [pin_backend](void* p) { pin_backend->unregister_host(p); };
      }
      pool_ = std::make_unique<ProcessPool>(driver, o, child_work(fetcher));
    } else {
      (void)driver, (void)pin_backend;
      // NOTE: the executor is a run-time option, so this cannot be a compile-time error.
      const std::string type = demangle(typeid(Batch).name());
      throw InvalidArgument("coload: the process executor sends batches of `" + type +
                            "` through the wire format: specialise `coload::wire::Wire<" + type +
                            ">`");
    }
  }

  /// Forks every worker that is not running; without persistent_workers, an epoch's own
  /// (ProcessPool::start's `fresh`).
  std::int64_t start() override { return pool_->start(!fetcher_.options.persistent_workers); }
  /// Without persistent_workers, asks the epoch's workers (`generation`) to exit after their
  /// queued tasks; `done` runs once they are gone.
  void run_finished(std::int64_t generation, std::function<void()> done) override {
    if (fetcher_.options.persistent_workers) {
      done();
    } else {
      pool_->retire(generation, std::move(done));
    }
  }
  /// Ends pending tasks (dropped) and the workers with SIGTERM (then SIGKILL).
  void shutdown() override { pool_->shutdown(std::make_exception_ptr(Cancelled{})); }
  /// True once a worker died unrecovered.
  bool broken() const noexcept override { return pool_->broken(); }
  /// The worker process that has batch `batch`, its pid, first indices and count.
  FetchHolder holder(std::int64_t batch) const override {
    FetchHolder h;
    const auto [worker, pid] = pool_->holder(batch, h.first, h.count);
    h.worker = worker;
    h.pid = pid;
    return h;
  }

  /// Batch `batch_no` of a map-style epoch, fetched by the least busy worker process: the
  /// indices go out over its socket, the batch comes back in a shared-memory slot.
  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no,
                             std::vector<Index> indices) override {
    Fetched<Batch> out;
    out.dropped = run.cancelled();
    if (out.dropped) co_return out;
    try {
      ProcessTask task = make_task(ProcessTask::Kind::fetch, run, batch_no);
      task.indices = std::move(indices);
      auto result = co_await pool_->submit(-1, std::move(task));
      if (auto batch = take_result(std::move(result))) {
        // NOTE: a batch in the (registered) arena is pinned already; pin_batch passes it on.
        PinnedPool* pinned = fetcher_.pinned;
        out.outcome.batch.emplace(pinned ? pin_batch(std::move(*batch), *pinned)
                                         : std::move(*batch));
      }
    } catch (...) {
      out = fetch_outcome<Batch>(std::current_exception());
    }
    co_return out;
  }

  /// The next batch of worker process `w`'s stream (the process keeps the stream between
  /// tasks, so `source` is not needed); `over` once nothing follows it.
  Task<Fetched<Batch>> stream(Run& run, StreamSource<Batch>& /*source*/, int w,
                              std::int64_t batch_no) override {
    Fetched<Batch> out;
    try {
      ProcessTask t = make_task(ProcessTask::Kind::stream, run, batch_no);
      t.want = Plan::per_sample ? 1 : *fetcher_.options.batch_size;
      auto result = co_await pool_->submit(w, std::move(t));
      out.over = result.reply.stream_over;
      if (auto batch = take_result(std::move(result))) out.outcome.batch.emplace(std::move(*batch));
    } catch (...) {
      out = fetch_outcome<Batch>(std::current_exception());
    }
    co_return out;
  }

 private:
  /// A task of `kind` for batch `batch_no` of `run`, with the run's epoch and seeds.
  static ProcessTask make_task(ProcessTask::Kind kind, const Run& run, std::int64_t batch_no) {
    ProcessTask t;
    t.kind = kind;
    t.batch = batch_no;
    t.epoch = run.epoch();
    t.run = run.serial();
    t.worker_seed = run.base_seed();
    t.sample_seed = run.sample_seed();
    return t;
  }

  /// A worker process's answer as a batch: decoded over its slot without a copy; nothing when
  /// every sample was skipped; its error as a WorkerError.
  std::optional<Batch> take_result(ProcessResult result) {
    const auto& r = result.reply;
    if (r.skipped) fetcher_.skips.add(r.skipped);
    if (r.status == ProcessReply::Status::error) {
      // The child's message names its worker id; the pid is the parent's to add.
      std::string what = r.error_what;
      const std::string worker = "DataLoader worker " + std::to_string(result.worker);
      if (const auto at = what.find(worker); at != std::string::npos) {
        what.insert(at + worker.size(), " (pid " + std::to_string(result.pid) + ")");
      }
      // NOTE: original() stays null: the exception object lives in the worker process; its
      // type name and message travel.
      throw WorkerError(std::move(what), result.worker, r.batch, r.error_index, r.error_type,
                        r.error_message, nullptr, result.pid);
    }
    if (!result.lease) {
      if (r.status == ProcessReply::Status::empty && !r.stream_over) throw EmptyBatch{};
      return std::nullopt;
    }
    if constexpr (wire::Wireable<Batch>) {
      return wire::decode<Batch>(result.bytes, static_cast<std::size_t>(r.offset),
                                 std::move(result.lease));
    } else {
      throw LogicError("unreachable: a batch type without a wire format");
    }
  }

  /// The parent's recorder as a fork-server worker joins it (with the memfd sent beside the
  /// payload): its worker shards, whether metrics are on, the trace file and its clock base.
  using RecorderView = std::tuple<std::int32_t, bool, std::string, std::uint64_t>;
  /// What a fork-server worker receives: the dataset, the options it fetches with, and the
  /// parent's recorder.
  using Payload = std::tuple<D, ChildOptions, RecorderView>;

  /// A fork-server worker's entry: rebuilds the loader's fetch side from the payload and
  /// serves the parent. Runs in the worker, never returns.
  static void forkserver_entry(int socket, int id, int payload_fd, int metrics_fd) {
    if constexpr (wire::Wireable<D>) {
      auto bytes = map_payload(payload_fd);
      ::close(payload_fd);
      auto [ds, sent, view] = wire::decode<Payload>(bytes, 0, nullptr);
      auto fetcher = std::make_unique<Fetcher<D, C>>(std::move(ds), options_in_child<C>(sent));
      fetcher->rank = std::get<6>(sent);
      fetcher->world_size = std::get<7>(sent);
      // The parent's metrics shards and trace file: this process records into worker `id`'s
      // (the work's start binds it), as a worker forked from the parent does. Kept until the
      // process exits. A worker that cannot join (its trace file gone) serves unrecorded
      // rather than die.
      std::unique_ptr<Recorder> recorder;
      if (metrics_fd >= 0) {
        const auto& [workers, enabled, trace, base] = view;
        try {
          recorder = std::make_unique<Recorder>(
              Recorder::Joined{metrics_fd, workers, enabled, trace, base});
          fetcher->recorder = recorder.get();
        } catch (const std::exception& e) {
          coload::detail::warn_once("forkserver-metrics",
                                    std::string("a fork-server worker records no "
                                                "metrics: ") + e.what());
        }
      }
      ChildLink link(socket);
      run_child(link, id, child_work(*fetcher));
      std::fflush(stderr);
      ::_exit(0);
    } else {
      (void)socket, (void)id, (void)payload_fd, (void)metrics_fd;
      ::_exit(70);
    }
  }

  /// The fork server's part of the pool's options, after checking that the loader's dataset,
  /// collate and worker_init_fn can travel to a worker that does not share this memory.
  void forkserver_options(ProcessPool::Options& o) {
    const auto& options = fetcher_.options;
    if (!forkserver_running()) {
      throw LogicError(
          "process_start = forkserver needs coload::start_forkserver() called first thing in "
          "main, before the program starts threads");
    }
    if constexpr (!wire::Wireable<D> || !std::is_copy_constructible_v<D>) {
      throw InvalidArgument(
          "process_start = forkserver sends the dataset to each worker through the wire "
          "format: specialise coload::wire::Wire for the dataset type (and make it copyable)");
    } else if constexpr (!std::is_empty_v<C> || !std::default_initializable<C>) {
      throw InvalidArgument(
          "process_start = forkserver needs a collate function of an empty type (a worker "
          "makes its own); use executor = processes with process_start = fork");
    } else {
      std::uint64_t init = 0;
      if (options.worker_init_fn) {
        auto* fn = options.worker_init_fn.template target<void (*)(const WorkerInfo&)>();
        if (!fn) {
          throw InvalidArgument(
              "process_start = forkserver needs worker_init_fn to be a plain function (a "
              "lambda that captures nothing, converted with +[](const WorkerInfo&) {...}): a "
              "worker cannot receive anything else");
        }
        init = reinterpret_cast<std::uint64_t>(*fn);
      }
      RecorderView view{0, false, std::string(), 0};
      if (Recorder* r = fetcher_.recorder; r && r->memory_fd() >= 0) {
        const Recorder::Joined j = r->joined();
        view = RecorderView{j.workers, j.enabled, j.trace_path, j.trace_base_ns};
        o.metrics = j.fd;
      }
      Payload payload{fetcher_.dataset,
                      child_options(options, init, fetcher_.rank, fetcher_.world_size), view};
      const std::size_t size = wire::encoded_size(payload);
      o.payload = payload_memfd(size, [&](std::span<std::byte> region) {
        wire::encode(payload, region, 0);
      });
      o.entry = &ProcessBridge::forkserver_entry;
    }
  }

  /// What a fetch in a worker process sees of its epoch.
  struct ChildScope {
    std::int64_t epoch_no;
    std::uint64_t seed;
    bool cancelled() const noexcept { return false; }
    std::int64_t epoch() const noexcept { return epoch_no; }
    std::uint64_t sample_seed() const noexcept { return seed; }
  };

  /// An asynchronous fetch in a child: what it reads and writes, on the heap and owned with
  /// its coroutine, so that one that stalls (and is left suspended when the task fails) and is
  /// resumed later writes into memory that is still its own, not into a finished task's stack.
  struct ChildFetch {
    ChildScope scope;
    std::vector<Index> indices;
    std::optional<Batch> out;
    std::exception_ptr error;
    bool done = false;
  };

  /// Runs an asynchronous fetch to its end on the child's own io_context.
  static Detached child_fetch_async(Fetcher<D, C>& fetcher, std::shared_ptr<ChildFetch> f,
                                    std::int64_t batch_no)
    requires(Plan::is_async)
  {
    try {
      f->out.emplace(co_await fetcher.fetch_batch_async(f->scope, f->indices, batch_no));
    } catch (...) {
      f->error = std::current_exception();
    }
    f->done = true;
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
  static std::optional<Batch> child_stream(Fetcher<D, C>& fetcher,
                                           std::optional<StreamCursor<stream_probe_t>>& cursor,
                                           bool& over, const WorkerInfo& info,
                                           std::int64_t want, int id, std::int64_t batch_no) {
    if constexpr (iterable) {
      if (over) return std::nullopt;
      if (!cursor) {
        try {
          fetcher.share_error_policy(fetcher.dataset);
          cursor.emplace(fetcher.dataset.stream(info));
        } catch (...) {
          over = true;
          throw wrap_current_exception(id, batch_no, -1, "starting the stream for");
        }
      }
      std::vector<typename Plan::sample> samples;
      samples.reserve(static_cast<std::size_t>(std::min<std::int64_t>(want, 512)));  // batch_size
      // As on a worker thread: the stream's pulls are its `read` (one span per batch), then
      // collate, into this worker's shard of the parent's metrics.
      StageClock clock;
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
      clock.read_lap(samples.size(), "batch", batch_no);
      if (clock.metrics) clock.shard->samples.fetch_add(samples.size(), std::memory_order_relaxed);
      const bool partial = static_cast<std::int64_t>(samples.size()) < want;
      if (samples.empty() || (partial && fetcher.options.drop_last)) return std::nullopt;
      auto batch = fetcher.collate_samples(std::move(samples), id, batch_no);
      clock.lap(Stage::collate, 1, "batch", batch_no);
      return batch;
    } else {
      (void)fetcher, (void)cursor, (void)over, (void)info, (void)want, (void)id, (void)batch_no;
      return std::nullopt;
    }
  }

  /// What a worker process keeps between its tasks: its own io_context and reader (for an
  /// asynchronous dataset), its WorkerInfo, and its stream (iterable datasets).
  struct ChildState {
    std::optional<asio::io_context> io;
    std::unique_ptr<io::Reader> reader;
    WorkerInfo info;
    std::optional<StreamCursor<stream_probe_t>> cursor;
    bool stream_over = false;
    std::uint64_t stream_run = 0;  // the iteration `cursor` streams for
  };

  /// What exec's child loop runs in worker process `id` over `fetcher`: the child's copy of
  /// the loader's fetch side (forked), or one rebuilt from the fork server's payload. Its
  /// reader, executor and pinned pool are the parent's and are never touched in the child.
  static ChildWork child_work(Fetcher<D, C>& fetcher) {
    auto state = std::make_shared<ChildState>();
    ChildWork work;
    work.start = [&fetcher, state](int id) {
      if constexpr (Plan::is_async) {
        // NOTE: the parent's reader shares its ring with the parent: destroying it here would
        // cancel the parent's reads. It is left alone, and the child reads through its own.
        state->io.emplace();
        state->reader = std::make_unique<io::Reader>(*state->io);
      }
      fetcher.reader = state->reader.get();
      // The recorder's shards are shared with the parent: this process records into worker
      // `id`'s. Its trace events go to the same file, from this process's own buffer.
      if (fetcher.recorder) {
        fetcher.recorder->after_fork();
        fetcher.recorder->bind_thread(id);
      }
      // The parent's pinned pool is the parent's: the child writes into its slot, which the
      // parent has registered as pinned.
      fetcher.pinned = nullptr;
      state->info = WorkerInfo{id, fetcher.options.num_workers, 0,
                               static_cast<const void*>(&fetcher.dataset), fetcher.rank,
                               fetcher.world_size};
    };
    work.fetch = [&fetcher, state](const ProcessTask& task, ChildLink& link, ProcessReply& reply) {
      ChildState& st = *state;
      const int id = st.info.id;
      st.info.seed = task.worker_seed + static_cast<std::uint64_t>(id);
      set_worker_info(&st.info);
      {
        // Each task: worker_init_fn runs once (init_worker knows), and once it has failed the
        // epoch's later tasks fail with it. Not in the slot: what it makes outlives the task.
        BatchAllocatorScope outside_slot(nullptr);
        fetcher.init_worker(st.info, task.epoch, task.batch);
      }
      std::optional<Batch> batch;
      if constexpr (iterable) {
        if (task.run != st.stream_run) {
          // A new epoch, or one begun again after a break: its stream starts over, as a worker
          // thread's does (persistent workers keep the process, not the stream).
          st.cursor.reset();
          st.stream_over = false;
          st.stream_run = task.run;
        }
        try {
          batch = child_stream(fetcher, st.cursor, st.stream_over, st.info, task.want, id,
                               task.batch);
        } catch (...) {
          st.stream_over = true;  // a failed stream has nothing after its error
          throw;
        }
        reply.stream_over = st.stream_over;
      } else {
        ChildScope scope{task.epoch, task.sample_seed};
        if constexpr (Plan::is_async) {
          auto f = std::make_shared<ChildFetch>(ChildFetch{
              scope, std::vector<Index>(task.indices.begin(), task.indices.end()), {}, {}, false});
          child_fetch_async(fetcher, f, task.batch);
          st.io->restart();
          while (!f->done && st.io->run_one() > 0) {
          }
          if (!f->done) {
            throw LogicError("coload: an asynchronous fetch stalled in a worker process: batch " +
                             std::to_string(task.batch) +
                             " awaits something its process's io_context does not run");
          }
          if (f->error) std::rethrow_exception(f->error);
          batch = std::move(f->out);
        } else {
          batch.emplace(fetcher.fetch_batch(scope, task.indices, &st.info, task.batch));
        }
      }
      if constexpr (wire::Wireable<Batch>) {
        if (batch) encode_batch(link, *batch, reply);
      }
      if (Tracer* t = fetcher.recorder ? fetcher.recorder->tracer() : nullptr) t->flush();
    };
    work.skipped = [&fetcher] { return fetcher.skips.count(); };
    work.finish = [state] {
      state->cursor.reset();
      // NOTE: the child exits next: its ring goes with the process, without the
      // cancel-and-reap walk of an orderly shutdown, so the parent sees the worker gone sooner.
      (void)state->reader.release();
    };
    return work;
  }

  Fetcher<D, C>& fetcher_;
  std::unique_ptr<ProcessPool> pool_;
};

}  // namespace coload::detail
