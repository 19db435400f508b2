#pragma once
// The loader's core: what a DataLoader owns at a stable address and the lifetimes of it (the
// driver, the workers, the scope every coroutine runs in, shutdown), and the services it builds
// for its runs. A run is handed those services, never the core.

#include <ATen/core/Generator.h>
#include <asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/coro/async_scope.hpp"
#include "coload/coro/detached.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/detail/batches.hpp"
#include "coload/loader/detail/device_setup.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/map_run.hpp"
#include "coload/loader/detail/metrics_window.hpp"
#include "coload/loader/detail/placement.hpp"
#include "coload/loader/detail/resume.hpp"
#include "coload/loader/detail/run_services.hpp"
#include "coload/loader/detail/stream_run.hpp"
#include "coload/loader/detail/worker_count.hpp"
#include "coload/loader/driver.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"
#include "coload/loader/state.hpp"

namespace coload::detail {

/// What a DataLoader owns. Built on the consumer's thread; everything after runs on the
/// driver, except where a member says otherwise. Every coroutine it or a run starts is
/// spawned into its scope, which the destructor joins on the driver before the driver ends.
template <class D, class C>
class LoaderCore {
 public:
  using Plan = FetchPlan<D, C>;
  static constexpr bool iterable = IterableDataset<D>;
  using Run = std::conditional_t<iterable, StreamRun<D, C>, MapRun<D, C>>;

  /// Validates the options and starts the driver and the workers (consumer's thread).
  LoaderCore(D ds, LoaderOptions<C> opts)
      : workers_(opts.num_workers, opts.prefetch_factor, iterable,
                 opts.executor == Executor::processes,
                 Plan::is_async && opts.executor != Executor::processes),
        fetcher_(std::move(ds), with_workers(std::move(opts), workers_.started())),
        driver_(drives_inline<D, C>(fetcher_.options) ? Driver(Driver::Lazy{}) : Driver()) {
    LoaderOptions<C>& o = fetcher_.options;
    validate_options(o, LoaderKind{iterable, Plan::per_sample});
    // auto_workers picked its own most (twice the CPUs, max_auto_workers): no warning for it.
    if (!workers_.tuned()) check_worker_number(o.num_workers, o.executor == Executor::processes);
    if (o.seed) generator_ = make_generator(*o.seed);
    const RankSpec rank = resolve_rank(o.rank, o.world_size);
    fetcher_.rank = rank.rank;
    fetcher_.world_size = rank.world_size;
    if constexpr (!iterable) batches_ = make_batch_source(fetcher_, generator_);
    // The recorder once the options hold (a trace file is opened), before any worker forks.
    Recorder& recorder = window_.emplace(o.metrics, o.trace, o.num_workers).recorder();
    fetcher_.recorder = &recorder;
    asio::post(driver_.context(), [&recorder] { recorder.bind_thread(Recorder::driver); });
    // Batches between dispatch and consumer, one the consumer holds, one being collated.
    device_ = setup_device(o.pin_memory, o.device, o.device_backend,
                           static_cast<std::size_t>(workers_.capacity()) + 2, driver_.context());
    fetcher_.pinned = device_.pinned.get();
    place_ = make_place(fetcher_, driver_, recorder, workers_, device_.backend);
    fetcher_.driver_context = &driver_.context();
    if constexpr (Plan::is_async) {
      reader_ = std::make_unique<io::Reader>(driver_.context());
      fetcher_.reader = reader_.get();
    }
    services_.emplace(RunServices<D, C>{driver_, scope_, workers_, recorder, device_.stage.get(),
                                        *place_, fetcher_, iterable ? nullptr : &batches_,
                                        resume_.stopped()});
  }

  /// Cancels the current epoch, joins every coroutine on the driver, then the driver, the
  /// workers and the device (consumer's thread, never the driver's).
  ~LoaderCore() {
    request_stop();
    join_driver();
    // An Epoch kept on (this one's, or one stopped and not yet finished) posts nothing to the
    // driver any more, and its timer goes while the driver's io_context is still here.
    for (const auto& weak : runs_) {
      if (auto run = weak.lock()) run->close_after_join();
    }
    place_.reset();  // waits for the processes (SIGKILL after a grace period) or the threads
    // NOTE: the driver ran until every copy in flight had completed: nothing reads the slabs.
    device_.stage.reset();
    fetcher_.pinned = nullptr;
    device_.pinned.reset();
  }

  // --- the DataLoader's side (consumer's thread) ---

  /// How long stop_within() gives fetches to end after asking them to.
  static constexpr std::chrono::milliseconds stop_grace{2000};

  /// Cancels the current epoch and asks every coroutine and worker to end (once).
  void request_stop() {
    if (std::exchange(stop_requested_, true)) return;
    if (auto run = current_.lock()) run->cancel();
    asio::post(driver_.context(), [this] {
      place_->shutdown();
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
    warn_stuck_stop(grace, fetcher_.board.describe_busy());
    return false;
  }

  /// Awaits `awaitable` (the next batch) on the calling thread, running the driver's work
  /// here while it waits: the range-for's wait when the driver runs inline. The thread's
  /// metrics binding is the driver's meanwhile, and restored after.
  template <class Awaitable>
  auto drive(Awaitable&& awaitable) {
    AsDriver binding(window_->recorder());
    Driver::Inline here(driver_);
    // NOTE: noexcept, as the driver thread's run: a handler that throws ends the process.
    return sync_wait_pumping(std::forward<Awaitable>(awaitable),
                             [&here]() noexcept { here.run_one(); });
  }
  /// Starts the driver's thread if it runs inline (any thread; see DataLoader::get_executor).
  void start_driver() { services_->start_driver(); }

  Fetcher<D, C>& fetcher() noexcept { return fetcher_; }
  const LoaderOptions<C>& options() const noexcept { return fetcher_.options; }
  Driver& driver() noexcept { return driver_; }
  std::int64_t skipped() const noexcept { return fetcher_.skips.count(); }
  /// The current or last epoch's measurements (all zero before the first epoch; any thread).
  Metrics metrics() const { return window_->epoch(skipped()); }
  /// Every epoch's measurements so far, as one window (any thread).
  Metrics total_metrics() const { return window_->total(skipped()); }
  /// Where the worker count stands (any thread).
  WorkerTuning worker_tuning() const { return workers_.tuning(); }
  /// Batches in an epoch, as len(DataLoader).
  std::int64_t size() const { return epoch_size(fetcher_, batches_); }

  /// Starts the next epoch; refuses while the current one is in progress. `base_seed`: the
  /// workers' seeds' base for this epoch, drawn by the caller (see DataLoader::epoch).
  std::shared_ptr<Run> start_epoch(std::optional<std::uint64_t> base_seed = std::nullopt) {
    if (auto run = current_.lock(); run && !run->cancelled() && !run->handoff.ended()) {
      throw LogicError("DataLoader: epoch " + std::to_string(run->epoch()) +
                       " is still in progress; finish or destroy it before starting another");
    }
    wait_for_dispatcher();
    // As PyTorch's iterator: the base seed is drawn before the sampler's first draw, from the
    // loader's generator (`seed`) or ATen's default one.
    // A base seed given by the caller replaces the draw, which is made all the same: the
    // generator's later draws (and what a saved state replays) stay those of any epoch.
    // Persistent workers keep the first epoch's, which later epochs do not draw again.
    auto start_state = generator_state(generator_);
    const bool persistent = options().persistent_workers && options().num_workers > 0;
    run_start_base_ = persistent ? kept_base_ : std::nullopt;
    const std::uint64_t drawn = run_start_base_ ? *run_start_base_ : draw_seed(generator_);
    if (persistent) kept_base_ = drawn;
    auto run = std::make_shared<Run>(*services_, epochs_started_++, base_seed.value_or(drawn),
                                     resume_.take_delivered(), std::move(start_state));
    // The metrics' window: this epoch from now; the last one's time joins the total.
    window_->start_epoch(skipped(), run->ended_ns);
    run->recorder = window_->shared_recorder();
    if constexpr (iterable) {
      if (auto marks = resume_.take_marks()) run->resume_streams(std::move(*marks));
    }
    current_ = run;
    std::erase_if(runs_, [](const std::weak_ptr<Run>& r) { return r.expired(); });
    runs_.push_back(run);
    asio::post(driver_.context(), [this, run] { scope_.spawn(Run::run(run)); });
    return run;
  }

  /// True if `channel` is an epoch this loader started (consumer's thread). By owner: no
  /// count is taken, and an ended run's control block stays while runs_ names it.
  template <class Channel>
  bool started(const std::shared_ptr<Channel>& channel) const noexcept {
    return std::any_of(runs_.begin(), runs_.end(), [&](const std::weak_ptr<Run>& r) {
      return !r.owner_before(channel) && !channel.owner_before(r);
    });
  }

  /// Waits until a stopped map-style epoch's dispatcher has ended (consumer's thread). It may
  /// still be inside the sampler, in the call past the last batch where RandomSampler draws
  /// its trailing permutation from the loader's generator: the generator state that the next
  /// epoch records and load_state sets must not move under it (else a resumed epoch replays
  /// another order). A driver that runs inline runs its work here meanwhile (the stop's own
  /// handler ends a dispatcher waiting for room), and looks every 10 ms for a dispatcher that
  /// a sampler resumed on another thread. On the driver itself nothing is waited for: it
  /// would wait on itself (a synchronous sampler's call has returned there, and only an
  /// asynchronous one suspended inside it could still draw).
  void wait_for_dispatcher() {
    if constexpr (!iterable) {
      const auto run = current_.lock();
      if (!run || run->dispatch_ended() || driver_.on_driver_thread()) return;
      if (!driver_.runs_inline()) {
        run->wait_dispatch_ended();
        return;
      }
      AsDriver binding(window_->recorder());
      Driver::Inline here(driver_);
      // NOTE: noexcept, as drive()'s pump: a handler that throws ends the process.
      [&]() noexcept {
        while (!run->dispatch_ended()) {
          driver_.context().run_one_for(std::chrono::milliseconds(10));
        }
      }();
    }
  }

  /// Where the loader stands: mid-epoch while the current epoch's consumer has not seen its
  /// end (even if the epoch was abandoned), else at the start of the next epoch.
  LoaderState state() const {
    auto run = current_.lock();
    std::optional<EpochPosition> running;
    if (run && !run->handoff.ended()) running = run->position();
    // A run stopped before its consumer saw the end the stop made is as gone: where it was
    // stopped says where the loader stands.
    const bool live = run && !(run->cancelled() && run->handoff.ended());
    LoaderState s = resume_.state(loader_identity(fetcher_), std::move(running), live,
                                  epochs_started_, generator_state(generator_));
    // An epoch begun (resumed from its start): the base seed it began with; the next one:
    // the kept one.
    s.base_seed = s.epoch < epochs_started_ ? run_start_base_ : kept_base_;
    return s;
  }

  /// Makes the next epoch the one `saved` was taken in, minus the batches it had delivered.
  void load_state(const LoaderState& saved) {
    if (auto run = current_.lock(); run && !run->handoff.ended() && !run->cancelled()) {
      throw LogicError("DataLoader: load_state while epoch " + std::to_string(run->epoch()) +
                       " is in progress");
    }
    check_compatible(saved, loader_identity(fetcher_));
    wait_for_dispatcher();
    set_generator_state(generator_, saved.generator);
    kept_base_ = options().persistent_workers && options().num_workers > 0 ? saved.base_seed
                                                                             : std::nullopt;
    epochs_started_ = saved.epoch;
    resume_.load(saved, iterable, fetcher_.stream_states_usable());
  }

 private:
  /// The calling thread's metrics binding is the driver's while this lives.
  struct AsDriver {
    explicit AsDriver(Recorder& r) : saved(binding) { r.bind_thread(Recorder::driver); }
    ~AsDriver() { binding = saved; }
    ThreadRecording& binding = thread_recording();
    const ThreadRecording saved;
  };

  /// Joins the driver; one that runs inline runs its remaining work here, as the driver.
  void join_driver() {
    if (!driver_.runs_inline()) {
      driver_.join();
      return;
    }
    AsDriver binding(window_->recorder());
    driver_.join();
  }

  /// Driver: once every coroutine of the scope has finished, lets the driver thread end (the
  /// reader, idle by then, goes first, on the thread that runs its io_context).
  static Detached stop_when_joined(LoaderCore& core) {
    co_await core.scope_.join();
    core.fetcher_.reader = nullptr;
    core.reader_.reset();
    core.driver_.release();
  }

  /// `o` with num_workers the count of workers to start (auto_workers: its most).
  static LoaderOptions<C> with_workers(LoaderOptions<C>&& o, int started) {
    o.num_workers = started;
    return std::move(o);
  }

  WorkerCount workers_;  // before fetcher_: made from the options that move into fetcher_
  Fetcher<D, C> fetcher_;
  std::optional<MetricsWindow> window_;  // its recorder outlives the driver and the workers
  BatchSource batches_;  // map-style
  std::optional<at::Generator> generator_;
  std::int64_t epochs_started_ = 0;
  // persistent_workers: the base seed the first epoch drew, kept (consumer's thread); and the
  // one the current run began with (unset: it drew its own).
  std::optional<std::uint64_t> kept_base_;
  std::optional<std::uint64_t> run_start_base_;
  bool stop_requested_ = false;  // consumer's thread
  ResumeBook resume_;
  std::weak_ptr<Run> current_;
  std::vector<std::weak_ptr<Run>> runs_;  // every run that may still be held (consumer's thread)
  AsyncScope scope_;  // driver
  Driver driver_;
  DeviceSetup device_;                         // pin_memory or device
  std::unique_ptr<Place<D, C>> place_;         // after validation: it starts the workers
  std::unique_ptr<io::Reader> reader_;         // asynchronous datasets; driver after construction
  std::optional<RunServices<D, C>> services_;  // what every run is given
};

}  // namespace coload::detail
