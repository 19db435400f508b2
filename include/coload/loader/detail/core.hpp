#pragma once
// The loader's core: what a DataLoader owns at a stable address (the fetch side, the driver,
// the workers, the device stage, the resume book), its setup and shutdown, and the narrow
// interface through which a run asks it for work.

#include <ATen/core/Generator.h>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/coro/async_scope.hpp"
#include "coload/coro/detached.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/device.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/auto_workers.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/map_run.hpp"
#include "coload/loader/detail/process_bridge.hpp"
#include "coload/loader/detail/resume.hpp"
#include "coload/loader/detail/stream_run.hpp"
#include "coload/loader/driver.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/metrics.hpp"
#include "coload/loader/options.hpp"
#include "coload/loader/state.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/distributed.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sequential.hpp"

namespace coload::detail {

/// What a DataLoader owns. Built on the consumer's thread; everything after runs on the
/// driver, except where a member says otherwise. Every coroutine it or a run starts is
/// spawned into its scope, which the destructor joins on the driver before the driver ends.
template <class D, class C>
class LoaderCore {
 public:
  using Plan = FetchPlan<D, C>;
  using Batch = typename Plan::batch;
  static constexpr bool iterable = IterableDataset<D>;
  using Run = std::conditional_t<iterable, StreamRun<D, C>, MapRun<D, C>>;

  /// Validates the options and starts the driver and the workers (consumer's thread).
  LoaderCore(D ds, LoaderOptions<C> opts)
      : tuner_(auto_tuner(opts)),
        fetcher_(std::move(ds), resolve_workers(std::move(opts))),
        driver_(drives_inline(fetcher_.options) ? Driver(Driver::Lazy{}) : Driver()) {
    const LoaderOptions<C>& o = fetcher_.options;
    validate_options(o, LoaderKind{iterable, Plan::per_sample});
    // auto_workers picked its own most (twice the CPUs, max_auto_workers): no warning for it.
    if (!tuner_) check_worker_number(o.num_workers, o.executor == Executor::processes);
    if (o.seed) generator_ = make_generator(*o.seed);
    if (!o.rank || !o.world_size) {
      const DistributedEnv env = distributed_env();
      fetcher_.rank = o.rank.value_or(env.rank);
      fetcher_.world_size = o.world_size.value_or(env.world_size);
    } else {
      fetcher_.rank = *o.rank;
      fetcher_.world_size = *o.world_size;
    }
    const int rank = fetcher_.rank;
    const int world_size = fetcher_.world_size;
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      throw InvalidArgument("Invalid rank " + std::to_string(rank) +
                                  ", rank should be in the interval [0, " +
                                  std::to_string(world_size - 1) + "]");
    }
    if constexpr (!iterable) batch_sampler_ = make_batch_sampler();
    make_recorder();
    setup_device();
    if (o.executor == Executor::processes) {
      processes_ = std::make_unique<ProcessBridge<D, C>>(fetcher_, driver_.context(),
                                                         device_backend_);
    } else if (o.num_workers > 0) {
      executor_ = std::make_unique<ThreadExecutor>(o.num_workers);
      fetcher_.executor = executor_.get();
      if (tuner_) {
        executor_->set_active(tuner_->workers());
        active_workers_.store(tuner_->workers(), std::memory_order_relaxed);
      }
    }
    if constexpr (Plan::is_async) {
      reader_ = std::make_unique<io::Reader>(driver_.context());
      fetcher_.reader = reader_.get();
    }
  }

  /// Cancels the current epoch, joins every coroutine on the driver, then the driver, the
  /// workers and the device (consumer's thread, never the driver's).
  ~LoaderCore() {
    request_stop();
    join_driver();
    processes_.reset();  // waits for the processes, SIGKILL after a grace period
    fetcher_.executor = nullptr;
    executor_.reset();
    // NOTE: the driver ran until every copy in flight had completed: nothing reads the slabs.
    stage_.reset();
    fetcher_.pinned = nullptr;
    pinned_.reset();
  }

  // --- the DataLoader's side (consumer's thread) ---

  /// How long stop_within() gives fetches to end after asking them to.
  static constexpr std::chrono::milliseconds stop_grace{2000};

  /// Cancels the current epoch and asks every coroutine and worker to end (once).
  void request_stop() {
    if (std::exchange(stop_requested_, true)) return;
    if (auto run = current_.lock()) run->cancel();
    asio::post(driver_.context(), [this] {
      // Fetches waiting on worker processes end now (dropped), and the processes are told to go.
      if (processes_) processes_->shutdown(std::make_exception_ptr(Cancelled{}));
      stop_when_joined(*this);
    });
  }

  /// Asks everything to stop and waits up to `grace` for it; true when it has (destroying
  /// the core then only joins). False when a fetch is still inside the dataset's code on a
  /// worker thread (or the driver), which nothing can interrupt: it says so, naming the
  /// worker and the sample, and the caller leaves the core to be destroyed once that code
  /// returns (its result is dropped: the epoch is cancelled).
  bool stop_within(std::chrono::milliseconds grace) {
    request_stop();
    if (driver_.runs_inline()) {
      // The driver's work runs here; what is left of it is this loader's own, which ends.
      join_driver();
      return true;
    }
    if (driver_.wait_for(grace)) return true;
    std::string who;
    for (const auto& e : fetcher_.board.busy()) {
      if (!who.empty()) who += "; ";
      who += e.worker >= 0 ? "worker " + std::to_string(e.worker) : std::string("the driver");
      who += " is in ";
      who += e.sample >= 0 ? "sample " + std::to_string(e.sample) + " of " : std::string();
      who += "batch " + std::to_string(e.batch);
    }
    if (who.empty()) who = "a fetch is still running";
    warn("DataLoader destroyed while its fetches had not ended " +
         std::to_string(grace.count()) + " ms after being asked to stop (" + who +
         "): a thread stuck in the dataset's code cannot be interrupted, so the loader "
         "returns now and frees its dataset and workers once that code returns, dropping its "
         "result");
    return false;
  }

  /// With no workers (threads, no timeout, no pinning or device stage, a synchronous
  /// map-style dataset), the consumer fetches on its own thread while it waits, as PyTorch's loader
  /// does with num_workers = 0: the driver's work runs inside drive(), and a thread of its own
  /// starts only when something else needs it (Epoch::next() awaited outside drive(),
  /// async_next, the executor). A hand-off between two threads for every batch costs more
  /// than the fetch itself on small batches, and far more when another thread holds a core.
  static bool drives_inline(const LoaderOptions<C>& o) noexcept {
    // NOTE: not iterable datasets: an asynchronous stream waits on other threads, and a
    // stuck one must leave the destructor its grace period (stop_within), not block it.
    return o.num_workers == 0 && o.executor == Executor::threads && !(o.timeout > 0) &&
           !o.pin_memory && !o.device && !Plan::is_async && !iterable;
  }

  /// Awaits `awaitable` (the next batch) on the calling thread, running the driver's work
  /// here while it waits: the range-for's wait when the driver runs inline. The thread's
  /// metrics binding is the driver's meanwhile, and restored after.
  template <class Awaitable>
  auto drive(Awaitable&& awaitable) {
    ThreadRecording& binding = thread_recording();
    const ThreadRecording saved = binding;
    recorder_->bind_thread(Recorder::driver);
    struct Restore {
      ThreadRecording& binding;
      ThreadRecording saved;
      ~Restore() { binding = saved; }
    } restore{binding, saved};
    Driver::Inline here(driver_);
    // NOTE: noexcept, as the driver thread's run: a handler that throws ends the process.
    return sync_wait_pumping(std::forward<Awaitable>(awaitable),
                             [&here]() noexcept { here.run_one(); });
  }
  /// Starts the driver's thread if it runs inline (any thread; see DataLoader::get_executor),
  /// bound to the metrics as the driver (its first binding ran inline, on the consumer).
  void start_driver() {
    driver_.start([this] { recorder_->bind_thread(Recorder::driver); });
  }

  Fetcher<D, C>& fetcher() noexcept { return fetcher_; }
  const LoaderOptions<C>& options() const noexcept { return fetcher_.options; }
  Driver& driver() noexcept { return driver_; }
  std::int64_t skipped() const noexcept { return fetcher_.skips.count(); }

  /// The current or last epoch's measurements (all zero before the first epoch).
  Metrics metrics() const {
    std::lock_guard lock(window_mutex_);
    const double seconds = static_cast<double>(epoch_ns_locked()) / 1e9;
    return make_metrics(*recorder_, epoch_base_, seconds, skipped());
  }
  /// Every epoch's measurements so far, as one window.
  Metrics total_metrics() const {
    std::lock_guard lock(window_mutex_);
    const double seconds = static_cast<double>(finished_ns_ + epoch_ns_locked()) / 1e9;
    return make_metrics(*recorder_, MetricsBase{}, seconds, skipped());
  }
  /// The recorder (any thread).
  Recorder& recorder() noexcept { return *recorder_; }

  /// Starts the next epoch; refuses while the current one is in progress.
  std::shared_ptr<Run> start_epoch() {
    if (auto run = current_.lock(); run && !run->cancelled() && !run->handoff.ended()) {
      throw LogicError("DataLoader: epoch " + std::to_string(run->epoch()) +
                             " is still in progress; finish or destroy it before starting "
                             "another");
    }
    // As PyTorch's iterator: the base seed is drawn before the sampler's first draw, from the
    // loader's generator (`seed`) or ATen's default one.
    auto start_state = generator_state(generator_);
    const std::uint64_t base_seed = draw_seed(generator_);
    auto run = std::make_shared<Run>(*this, epochs_started_++, base_seed,
                                     resume_.take_delivered(), std::move(start_state));
    {
      // The metrics' window: this epoch from now; the last one's time joins the total.
      std::lock_guard lock(window_mutex_);
      finished_ns_ += epoch_ns_locked();
      epoch_base_ = metrics_base(*recorder_, skipped());
      epoch_start_ns_ = now_ns();
      epoch_end_ = run->ended_ns;
    }
    run->recorder = recorder_.get();
    if constexpr (iterable) {
      if (auto marks = resume_.take_marks()) run->resume_streams(std::move(*marks));
    }
    current_ = run;
    asio::post(driver_.context(), [this, run] { spawn(Run::run(run)); });
    return run;
  }

  /// Where the loader stands: mid-epoch while the current epoch's consumer has not seen its
  /// end (even if the epoch was abandoned), else at the start of the next epoch.
  LoaderState state() const {
    auto run = current_.lock();
    std::optional<EpochPosition> running;
    if (run && !run->handoff.ended()) running = run->position();
    return resume_.state(identity(), std::move(running), static_cast<bool>(run),
                         epochs_started_, generator_state(generator_));
  }

  /// Makes the next epoch the one `saved` was taken in, minus the batches it had delivered.
  void load_state(const LoaderState& saved) {
    if (auto run = current_.lock(); run && !run->handoff.ended() && !run->cancelled()) {
      throw LogicError("DataLoader: load_state while epoch " +
                             std::to_string(run->epoch()) + " is in progress");
    }
    check_compatible(saved, identity());
    set_generator_state(generator_, saved.generator);
    epochs_started_ = saved.epoch;
    resume_.load(saved, iterable, stream_states_usable());
  }

  /// Batches in an epoch, as len(DataLoader).
  std::int64_t size() const {
    if constexpr (iterable) {
      // As len(DataLoader) over an IterableDataset: from the dataset's own length.
      if constexpr (requires(const D& d) { d.size(); }) {
        const auto n = static_cast<std::int64_t>(fetcher_.dataset.size());
        const auto& o = fetcher_.options;
        if (!o.batch_size) return n;
        const std::int64_t b = *o.batch_size;
        return o.drop_last ? n / b : (n + b - 1) / b;
      } else {
        throw LogicError("DataLoader: the iterable dataset has no size()");
      }
    } else {
      auto n = batch_sampler_.size();
      if (!n) throw LogicError("DataLoader: the sampler has no size()");
      return *n;
    }
  }

  // --- a run's side: what a run may ask of the core (driver, unless said otherwise) ---

  /// Starts `task` now, in the core's scope: the loader ends only after it has finished.
  void spawn(Task<void> task) { scope_.spawn(std::move(task)); }
  /// The driver's io_context (any thread).
  asio::io_context& context() noexcept { return driver_.context(); }
  /// At most this many batches between dispatch and the consumer now: prefetch_factor per
  /// worker in use (any thread).
  std::int64_t in_flight_bound() const noexcept {
    if (!tuner_) return in_flight_capacity();
    return static_cast<std::int64_t>(fetcher_.options.prefetch_factor.value_or(2)) *
           active_workers_.load(std::memory_order_relaxed);
  }
  /// The worker threads taking work now (num_workers when fixed; any thread).
  int workers_in_use() const noexcept {
    return tuner_ ? active_workers_.load(std::memory_order_relaxed) : fetcher_.options.num_workers;
  }
  /// The in-flight bound of a map-style epoch until its first batch is done, so that the first
  /// batch is not made alongside the ones after it (time to first batch; each batch's fresh
  /// buffer also costs page faults). With worker threads and an asynchronous dataset every
  /// thread works on one batch's samples, so that batch goes alone; otherwise a batch is made
  /// on one worker, so each worker makes one (driver).
  std::int64_t first_batch_bound() const noexcept {
    if constexpr (Plan::is_async) {
      if (!in_processes()) return 1;
    }
    return std::min<std::int64_t>(in_flight_bound(), std::max(workers_in_use(), 1));
  }
  /// The most in_flight_bound() can be: prefetch_factor per worker thread (any thread).
  std::int64_t in_flight_capacity() const noexcept {
    const auto& o = fetcher_.options;
    // NOTE: with no workers the driver still fetches up to two batches ahead of the consumer.
    return o.num_workers > 0
               ? static_cast<std::int64_t>(o.prefetch_factor.value_or(2)) * o.num_workers
               : 2;
  }

  /// Where the worker count stands (any thread).
  WorkerTuning worker_tuning() const {
    if (tuner_) {
      std::lock_guard lock(tuning_mutex_);
      return tuner_->tuning();
    }
    const int n = fetcher_.options.num_workers;
    return WorkerTuning{.workers = n, .max_workers = n, .min_seen = n, .max_seen = n};
  }

  /// Driver, after each completed batch of epoch `epoch`: under auto_workers, once a window of
  /// at least tune_window has passed, measures it (the consumer's wait from `handoff`, the
  /// workers' idle time from the executor) and lets the tuner add or remove a worker. Returns
  /// the change (+1, -1, 0). The first completion of each epoch only opens a window, so the
  /// pipeline's filling and the pause between epochs are not judged.
  template <class Handoff>
  int tune(std::int64_t epoch, const Handoff& handoff) {
    if (!tuner_ || !executor_) return 0;
    const auto now = std::chrono::steady_clock::now();
    ++window_.batches;
    if (epoch == window_.epoch &&
        (now - window_.start < tune_window || window_.batches < tune_batches)) {
      return 0;
    }
    const int active = tuner_->workers();
    const std::int64_t wait = handoff.wait_nanoseconds();
    const std::int64_t idle = executor_->idle_nanoseconds(active);
    int change = 0;
    if (epoch == window_.epoch) {
      TuningWindow w;
      w.seconds = std::chrono::duration<double>(now - window_.start).count();
      w.consumer_wait = 1e-9 * static_cast<double>(wait - window_.wait_ns);
      w.worker_idle = 1e-9 * static_cast<double>(idle - window_.idle_ns);
      w.batches = static_cast<double>(window_.batches);
      {
        std::lock_guard lock(tuning_mutex_);
        change = tuner_->decide(w);
      }
      if (change != 0) {
        executor_->set_active(tuner_->workers());
        active_workers_.store(tuner_->workers(), std::memory_order_relaxed);
      }
    }
    // The next window starts now, with the workers in use from now on.
    window_ = TuneWindowStart{epoch, now, wait,
                              change != 0 ? executor_->idle_nanoseconds(tuner_->workers())
                                          : idle};
    return change;
  }
  /// The shortest window auto_workers judges: this long, and this many batches (its rates
  /// are compared, and a window of one or two large batches says little). 3 ms: with 10 ms
  /// the overhead workload's 20 ms epochs held one or two windows each, and climbing from one
  /// worker to four (2 windows a step, see tune_span) took most of a 10-epoch run; with 3 ms
  /// it is done within the warm-up epoch. Slow batches (images: 30 ms) are bounded by the
  /// batch count instead.
  static constexpr std::chrono::milliseconds tune_window{3};
  static constexpr std::int64_t tune_batches = 4;
  /// The windows over which auto_workers compares rates (WorkerTuner's span).
  static constexpr int tune_span = 2;
  /// Where runs record the position their consumer stopped at (any thread).
  const std::shared_ptr<StoppedEpoch>& stopped() const noexcept { return resume_.stopped(); }
  /// Worker `id` of `n` for an epoch whose worker seed is `seed` (any thread).
  WorkerInfo worker_info(int id, int n, std::uint64_t seed) const noexcept {
    return WorkerInfo{id, n, seed, static_cast<const void*>(&fetcher_.dataset), fetcher_.rank,
                      fetcher_.world_size};
  }
  /// worker_init_fn for `info` (worker `info.id`'s thread).
  void init_worker(const WorkerInfo& info, std::int64_t epoch) { fetcher_.init_worker(info, epoch); }
  /// The device stage, or nullptr.
  DeviceStage* stage() const noexcept { return stage_.get(); }

  /// Forks the worker processes that are not running (at each epoch's start).
  void start_workers() {
    if (processes_) processes_->start();
  }
  /// True once a worker process died unrecovered: dispatch stops.
  bool workers_broken() const noexcept { return processes_ && processes_->broken(); }
  /// True when the workers are processes.
  bool in_processes() const noexcept { return processes_ != nullptr; }
  /// True when the workers are threads of this process.
  bool worker_threads() const noexcept { return executor_ != nullptr; }
  /// Awaitable: continue on worker thread `w` (worker_threads() only).
  auto to_worker(int w) noexcept { return executor_->schedule_on(w); }
  /// Awaitable: continue on the driver (any thread).
  auto to_driver() noexcept { return driver_.schedule(); }
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

  /// The batch sampler's index lists for epoch `epoch`.
  auto batches(std::int64_t epoch)
    requires(!iterable)
  {
    // On the driver: a stopped epoch's dispatcher may still be reading the sampler here.
    batch_sampler_.set_epoch(epoch);
    return batch_sampler_.batches();
  }

  /// True when each stream's state() describes that worker's stream alone: the dataset has
  /// state()/load_state(), each worker streams its own copy, and in this process (any thread).
  bool stream_states_usable() const noexcept {
    if constexpr (ResumableStream<D>) {
      return fetcher_.options.executor != Executor::processes &&
             (std::is_copy_constructible_v<D> || fetcher_.options.num_workers <= 1);
    } else {
      return false;
    }
  }

  /// Batch `batch_no` of a map-style run: on a worker process, a worker thread, or the
  /// driver; an asynchronous fetch starts on the driver (where its reads are submitted) and
  /// moves onto a worker itself with `co_await ctx.cpu()`. Starts and ends on the driver.
  Task<Fetched<Batch>> fetch(Run& run, std::int64_t batch_no, std::vector<Index> indices)
    requires(!iterable)
  {
    if (processes_) co_return co_await processes_->fetch(run, batch_no, std::move(indices));
    Fetched<Batch> out;
    if constexpr (Plan::is_async) {
      out.dropped = run.cancelled();
      if (!out.dropped) {
        fetcher_.board.begin_async(batch_no, indices);
        try {
          out.outcome.batch.emplace(co_await fetcher_.fetch_batch_async(run, indices, batch_no));
        } catch (const Cancelled&) {
          out.dropped = true;
        } catch (const EmptyBatch&) {
          // Every sample was skipped: the batch number completes as a skip.
        } catch (...) {
          out.outcome.error = std::current_exception();
        }
        fetcher_.board.end_async(batch_no);
        set_worker_info(nullptr);
        if (!driver_.on_driver_thread()) co_await driver_.schedule();
      }
    } else {
      const bool hop = executor_ != nullptr;
      if (hop) co_await executor_->schedule();
      out.dropped = run.cancelled();
      if (!out.dropped) {
        const int worker = hop ? ThreadExecutor::current_worker_id() : -1;
        const WorkerInfo* info = hop ? &run.worker_infos()[worker] : nullptr;
        if (hop) recorder_->bind_thread(worker);
        set_worker_info(info);
        fetcher_.board.begin(worker, batch_no, indices);
        try {
          if (info) fetcher_.init_worker(*info, run.epoch());
          out.outcome.batch.emplace(fetcher_.place_batch(
              [&] { return fetcher_.fetch_batch(run, indices, info, batch_no); }));
        } catch (const Cancelled&) {
          out.dropped = true;
        } catch (const EmptyBatch&) {
          // Every sample was skipped: the batch number completes as a skip.
        } catch (...) {
          out.outcome.error = std::current_exception();
        }
        fetcher_.board.end(worker);
        set_worker_info(nullptr);
      }
      if (hop) co_await driver_.schedule();
    }
    co_return out;
  }

  /// Driver: batch `fetched` of `samples` samples came back (for the metrics).
  void note_fetched(const Fetched<Batch>& fetched, std::size_t samples) noexcept {
    if (fetched.outcome.batch && recorder_->enabled()) {
      recorder_->shard(Recorder::driver).samples.fetch_add(samples, std::memory_order_relaxed);
    }
  }

  /// Who has batch `batch` of the current epoch in hand: a worker process, a worker thread or
  /// the driver (driver).
  FetchHolder holder(std::int64_t batch) const {
    FetchHolder h;
    if (processes_) {
      const auto [worker, pid] = processes_->holder(batch, h.first, h.count);
      h.worker = worker;
      h.pid = pid;
    } else if (auto e = fetcher_.board.find(batch)) {
      h.worker = e->worker;
      h.first = std::move(e->first);
      h.count = e->count;
    }
    return h;
  }

  /// The next batch of worker process `w`'s stream, as batch `batch_no` (in_processes()).
  Task<Fetched<Batch>> stream_in_process(Run& run, int w, std::int64_t batch_no)
    requires iterable
  {
    co_return co_await processes_->stream(run, w, batch_no);
  }

 private:
  /// Joins the driver; one that runs inline runs its remaining work here, with the thread's
  /// metrics binding the driver's meanwhile.
  void join_driver() {
    if (!driver_.runs_inline()) {
      driver_.join();
      return;
    }
    ThreadRecording& binding = thread_recording();
    const ThreadRecording saved = binding;
    recorder_->bind_thread(Recorder::driver);
    driver_.join();
    binding = saved;
  }

  /// What must match between a saved state and the loader that loads it.
  LoaderState identity() const {
    LoaderState s;
    if constexpr (requires(const D& d) { d.size(); }) {
      s.dataset_size = static_cast<std::int64_t>(fetcher_.dataset.size());
    }
    s.batch_size = fetcher_.options.batch_size.value_or(-1);
    s.seed = fetcher_.options.seed;
    if constexpr (iterable) s.stream_workers = fetcher_.options.num_workers;
    s.rank = fetcher_.rank;
    s.world_size = fetcher_.world_size;
    return s;
  }

  /// Driver: once every coroutine of the scope has finished, lets the driver thread end (the
  /// reader, idle by then, goes first, on the thread that runs its io_context).
  static Detached stop_when_joined(LoaderCore& core) {
    co_await core.scope_.join();
    core.fetcher_.reader = nullptr;
    core.reader_.reset();
    core.driver_.release();
  }

  /// The current or last epoch's wall time so far (window_mutex_ held).
  std::uint64_t epoch_ns_locked() const noexcept {
    if (!epoch_start_ns_ || !epoch_end_) return 0;
    const std::uint64_t end = epoch_end_->load() ? epoch_end_->load() : now_ns();
    return end > epoch_start_ns_ ? end - epoch_start_ns_ : 0;
  }

  /// The metrics' recorder, before any worker is forked (its shards are shared with them), and
  /// the driver's thread bound to it.
  void make_recorder() {
    auto& o = fetcher_.options;
    bool on = o.metrics;
    if (const char* env = std::getenv("COLOAD_METRICS"); env && std::string(env) == "0") {
      on = false;
    }
    std::string trace = o.trace;
    if (trace.empty()) {
      // Every loader of the process traces: the first to PATH, each later one to PATH.1, .2...
      static std::atomic<int> traced{0};
      if (const char* env = std::getenv("COLOAD_TRACE"); env && *env) {
        trace = env;
        if (const int n = traced.fetch_add(1)) trace += "." + std::to_string(n);
      }
    }
    const int shards = std::max({o.num_workers, 1, static_cast<int>(std::thread::hardware_concurrency())});
    recorder_ = std::make_unique<Recorder>(shards, on, trace);
    fetcher_.recorder = recorder_.get();
    asio::post(driver_.context(), [this] { recorder_->bind_thread(Recorder::driver); });
  }

  /// pin_memory and device: the device runtime, the pinned pool and the device stage.
  void setup_device() {
    const auto& o = fetcher_.options;
    const bool with_stage = o.device.has_value();
    if (!o.pin_memory && !with_stage) return;
    device_backend_ = o.device_backend;
    if (!device_backend_) {
      if (with_stage) {
        const at::Device d = *o.device;
        if (d.is_cuda()) {
          try {
            // No index: the thread's current device, as at::Device("cuda") means in libtorch.
            device_backend_ = make_cuda_backend(d.has_index() ? d.index() : -1);
          } catch (const std::exception& e) {
            throw InvalidArgument("device = " + d.str() + ": " + e.what());
          }
        } else if (d.is_cpu()) {
          device_backend_ = std::make_shared<HostDeviceBackend>();
        } else {
          throw InvalidArgument("device = " + d.str() +
                                      ": coload's device stage copies to CUDA devices (or, "
                                      "through its host backend, to the CPU)");
        }
      } else if (cuda_available()) {
        device_backend_ = make_cuda_backend(-1);
      } else {
        // As PyTorch: without an accelerator, pin_memory leaves batches where they are.
        warn_once("pin_memory without CUDA",
                  "'pin_memory' argument is set as true but no accelerator is found, then "
                  "device pinned memory won't be used (" + cuda_unavailable_reason() + ")");
        return;
      }
    }
    if (with_stage && device_backend_->device().type() != o.device->type()) {
      throw InvalidArgument("device = " + o.device->str() +
                                  ", but device_backend copies to " +
                                  device_backend_->device().str());
    }
    // Batches between dispatch and consumer, one the consumer holds, one being collated.
    pinned_ = std::make_unique<PinnedPool>(device_backend_,
                                           static_cast<std::size_t>(in_flight_capacity()) + 2);
    fetcher_.pinned = pinned_.get();
    if (with_stage) stage_ = std::make_unique<DeviceStage>(device_backend_, driver_.context());
  }

  /// auto_workers: the tuner, allowed the CPUs this process may use (checked where it
  /// applies); nothing for a fixed count.
  static std::optional<WorkerTuner> auto_tuner(const LoaderOptions<C>& o) {
    if (o.num_workers != auto_workers) return std::nullopt;
    check_auto_workers(iterable, o.executor == Executor::processes);
    return WorkerTuner(max_auto_workers(), tune_span);
  }
  /// `o` with auto_workers replaced by the threads it may use (all started, most asleep).
  static LoaderOptions<C> resolve_workers(LoaderOptions<C>&& o) {
    if (o.num_workers == auto_workers) o.num_workers = max_auto_workers();
    return std::move(o);
  }

  AnyBatchSampler make_batch_sampler() {
    auto& o = fetcher_.options;
    if (o.batch_sampler) return std::move(o.batch_sampler);
    const auto n = static_cast<std::int64_t>(fetcher_.dataset.size());
    // Without automatic batching each "batch" is one index.
    const std::int64_t b = o.batch_size.value_or(1);
    if (o.sampler) return BatchSampler<AnySampler>(std::move(o.sampler), b, o.drop_last);
    if (o.shuffle) {
      return BatchSampler<RandomSampler>(RandomSampler(n, false, std::nullopt, generator_), b,
                                         o.drop_last);
    }
    return BatchSampler<SequentialSampler>(SequentialSampler(n), b, o.drop_last);
  }

  // auto_workers (declared before fetcher_: the options it is made from move into fetcher_)
  std::optional<WorkerTuner> tuner_;
  mutable std::mutex tuning_mutex_;          // tuner_'s counts, read by worker_tuning()
  std::atomic<int> active_workers_{0};      // tuner_->workers(), for in_flight_bound()
  struct TuneWindowStart {
    std::int64_t epoch = -1;
    std::chrono::steady_clock::time_point start{};
    std::int64_t wait_ns = 0;
    std::int64_t idle_ns = 0;
    std::int64_t batches = 0;  // completed since start
  };
  TuneWindowStart window_;  // driver
  Fetcher<D, C> fetcher_;
  AnyBatchSampler batch_sampler_;
  std::optional<at::Generator> generator_;
  std::int64_t epochs_started_ = 0;
  bool stop_requested_ = false;  // consumer's thread
  ResumeBook resume_;
  std::weak_ptr<Run> current_;
  std::unique_ptr<Recorder> recorder_;  // outlives the driver and the workers that record
  mutable std::mutex window_mutex_;    // the metrics' epoch window, below
  MetricsBase epoch_base_;
  std::uint64_t epoch_start_ns_ = 0;
  std::uint64_t finished_ns_ = 0;  // the finished epochs' time
  std::shared_ptr<const std::atomic<std::uint64_t>> epoch_end_;
  AsyncScope scope_;  // driver
  Driver driver_;
  std::unique_ptr<ThreadExecutor> executor_;
  std::unique_ptr<ProcessBridge<D, C>> processes_;  // executor = processes
  std::unique_ptr<io::Reader> reader_;  // asynchronous datasets only; driver after construction
  std::shared_ptr<DeviceBackend> device_backend_;  // pin_memory or device
  std::unique_ptr<PinnedPool> pinned_;             // pin_memory or device, with a backend
  std::unique_ptr<DeviceStage> stage_;             // device
};

}  // namespace coload::detail
