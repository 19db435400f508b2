#pragma once
// DataLoader: owns the pipeline from sampler to consumer. This header is the contract; the
// machinery is in loader/detail/, one file per role (see docs/architecture.md):
//   fetch_plan.hpp      how a batch is built from the dataset's members, at compile time
//   batches.hpp         the batch sampler, its indices checked against the dataset
//   map_run.hpp         the map-style run: the batch sampler's index lists, one fetch each
//   stream_run.hpp      the streaming run: each worker streams its replica in turn
//   worker_count.hpp    the workers in use and the in-flight bound; auto_workers' tuner
//   place.hpp           where a fetch job runs, as one interface: the driver, threads or
//                       processes (placement.hpp, process_bridge.hpp)
//   placement.hpp       the driver's and worker threads' places, and the choice among them
//   fetch.hpp           the fetch side: a batch from the dataset and the collate, any thread
//   process_bridge.hpp  what the loader hands exec's process pool, and takes back
//   outcome.hpp         a fetch's exception as its outcome, in one function
//   run.hpp             one epoch's run: completion, reorder ring, device stage, hand-off
//   reorder_ring.hpp    batches wait here until those before them are done
//   run_services.hpp    what a run is given (never the core)
//   resume.hpp          where an epoch stands, and what a loaded state resumes
//   diagnose.hpp        the compile-time errors of make_data_loader
//   core.hpp            what a DataLoader owns: lifetimes, shutdown, the runs' services

#include <asio/async_result.hpp>
#include <asio/associated_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <concepts>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/iterable.hpp"
#include "coload/dataset/torch_data.hpp"
#include "coload/loader/detail/core.hpp"
#include "coload/loader/detail/diagnose.hpp"
#include "coload/loader/detail/fetch_plan.hpp"
#include "coload/loader/epoch.hpp"
#include "coload/loader/metrics.hpp"
#include "coload/loader/options.hpp"
#include "coload/loader/state.hpp"

namespace coload {

/// What a DataLoader loads from: a map-style dataset (`size()` and `get`) or an iterable one
/// (`stream`). A type with both is loaded as iterable, as PyTorch decides by IterableDataset.
template <class D>
concept LoadableDataset = MapDataset<D> || IterableDataset<D>;

/// Loads batches from a map-style or an iterable dataset, as torch.utils.data.DataLoader.
///
/// An iterable dataset (`stream(const WorkerInfo&)`) is streamed by every worker from its own
/// copy of the dataset (shared when the type cannot be copied), with that worker's info; the
/// batches interleave worker by worker, and `drop_last` drops each worker's last partial batch.
/// `shuffle`, `sampler` and `batch_sampler` are refused for it, as PyTorch refuses them.
///
/// Three ways to consume an epoch: `for (auto& batch : loader)` (each range-for is one epoch),
/// `auto epoch = loader.epoch(); while (auto b = co_await epoch.next())`, and
/// `co_await loader.async_next(token)` with any Asio completion token. One epoch at a time.
///
/// The dataset's `get`/`get_batch` and the collate function are called from several worker
/// threads at once when `num_workers > 1`: they must be safe to call concurrently.
template <LoadableDataset D, class C = DefaultCollate>
class DataLoader {
  using Core = detail::LoaderCore<D, C>;

 public:
  using dataset_type = D;
  using sample_type = detail::loader_sample_t<D>;
  /// What one batch is: get_batch's result, or the collate function's.
  using batch_type = typename detail::FetchPlan<D, C>::batch;
  using executor_type = asio::io_context::executor_type;

  /// Validates the options (std::invalid_argument, with PyTorch's wording) and starts the
  /// driver and the worker threads.
  DataLoader(D dataset, LoaderOptions<C> options)
      : core_(std::make_unique<Core>(std::move(dataset), std::move(options))) {}
  DataLoader(DataLoader&&) noexcept = default;
  /// The loader it held goes as the destructor lets it go (the same grace period, the same
  /// hand-off on the driver thread), then takes `other`'s.
  DataLoader& operator=(DataLoader&& other) noexcept {
    if (this != &other) {
      release();
      implicit_ = std::move(other.implicit_);
      core_ = std::move(other.core_);
    }
    return *this;
  }
  /// Stops the current epoch and joins every thread; returns once running fetches finish
  /// their current sample. Destroyed on its own driver thread (from a handler or a coroutine
  /// resumed there), it hands the joining to a detached thread instead.
  ///
  /// A fetch stuck in the dataset's code on a worker thread (a `get` that never returns) cannot
  /// be interrupted: after a grace period of 2 s the destructor warns, naming the worker and
  /// the sample, and returns; the loader's dataset, driver and worker threads are then freed
  /// by a detached thread once that code returns, and its result is dropped.
  ~DataLoader() { release(); }

  /// The number of batches in an epoch, as `len(DataLoader)` (honours drop_last).
  std::int64_t size() const { return core_->size(); }
  /// How many samples `on_error = skip` has left out so far, over all epochs.
  std::int64_t skipped() const noexcept { return core_->skipped(); }
  /// Where the current (or last) epoch's time went: per stage, per worker, the consumer's
  /// wait, and `report()`'s verdict. Any thread; a snapshot, cheap enough for each epoch's end.
  Metrics metrics() const { return core_->metrics(); }
  /// The same over every epoch so far.
  Metrics total_metrics() const { return core_->total_metrics(); }
  /// How many workers take work now and, under `num_workers = coload::auto_workers`, how the
  /// count has moved (any thread).
  WorkerTuning worker_tuning() const { return core_->worker_tuning(); }
  /// The dataset.
  D& dataset() noexcept { return core_->fetcher().dataset; }
  /// The options, as given (except `sampler` and `batch_sampler`, moved into the pipeline, and
  /// auto_workers, replaced by the number of threads it may use).
  const LoaderOptions<C>& options() const noexcept { return core_->options(); }
  /// The driver's executor: where completions without an associated executor run. With
  /// num_workers = 0 this starts the driver's own thread (docs/user-guide.md, Threads): call it from the
  /// consumer's thread, or while no range-for over the loader is waiting.
  executor_type get_executor() {
    core_->start_driver();  // what is posted there must run without the consumer
    return core_->driver().context().get_executor();
  }

  /// Where the loader stands, between two batches: the epoch in progress (until its consumer
  /// has seen its end, even if the epoch was stopped early) and which of its batches the
  /// consumer has had, or the next epoch. Call it from the consumer, between batches.
  LoaderState state() const { return core_->state(); }
  /// Writes state() to `path` atomically (a temporary file renamed over it).
  void save_state(const std::filesystem::path& path) const { state().save(path); }
  /// Makes the next epoch resume from `saved`: it is the epoch `saved` was taken in, with the
  /// same shuffle and sample seeds, and delivers exactly the batches that had not been
  /// delivered (batches that were prefetched but not delivered are fetched again); the
  /// epochs after it are those of the uninterrupted run. Refuses, with std::invalid_argument
  /// naming the mismatch, a state from a loader with another dataset size, batch size, seed,
  /// rank, world size or state version; std::logic_error while an epoch is in progress.
  ///
  /// A loader without `seed` draws from ATen's default generator: loading sets that generator
  /// back to where it was when the saved epoch began. An iterable dataset with `state()` and
  /// `load_state()` members (ResumableStream) continues each worker's stream from the state
  /// taken after its last delivered batch (thread workers and none; with process workers, and
  /// for other iterable datasets, the loader fast-forwards: it loads the delivered batches
  /// again and drops them, and says so once).
  void load_state(const LoaderState& saved) { core_->load_state(saved); }
  /// Loads a state written by save_state().
  void load_state(const std::filesystem::path& path) { load_state(LoaderState::load(path)); }

  /// Waits until the epoch last stopped early (a destroyed Epoch, a range-for left by `break`)
  /// has let go of its sampler, whose call past the last batch may still be drawing from the
  /// generator (consumer's thread). epoch() and load_state() wait for it themselves; a front
  /// end that reads or draws the generator on its own before epoch() calls this first.
  void wait_stopped_epoch() { core_->wait_for_dispatcher(); }

  /// Starts the next epoch. Throws std::logic_error while another epoch is in progress.
  Epoch<batch_type> epoch() { return Epoch<batch_type>(core_->start_epoch()); }
  /// Starts the next epoch with its workers' seeds based on `base_seed` (worker i's
  /// WorkerInfo::seed is base_seed + i) rather than on the loader's own draw: for a front end
  /// that draws the base seed itself, as coload's Python DataLoader draws torch's. The loader's
  /// generator advances as for epoch(); after load_state, pass the seed the resumed epoch had.
  Epoch<batch_type> epoch(std::uint64_t base_seed) {
    return Epoch<batch_type>(core_->start_epoch(base_seed));
  }

  /// Waits on the calling thread for `epoch`'s next batch, as the range-for does: empty at the
  /// epoch's end; the batch's error rethrown. While fetches_here(), the fetches run here, in
  /// this wait, and none runs ahead of it: the dataset is called on the consumer's thread, one
  /// batch per call, as PyTorch's loader calls it with num_workers = 0. Throws
  /// InvalidArgument for an epoch this loader did not start (another loader's, or a moved-from
  /// one): its wait would run this loader's work, never the epoch's. On the consumer's thread,
  /// the one that starts the loader's epochs.
  std::optional<batch_type> next(Epoch<batch_type>& epoch) {
    if (!epoch) throw InvalidArgument("DataLoader::next: the epoch was moved from");
    if (!core_->started(epoch.channel())) {
      throw InvalidArgument("DataLoader::next: the epoch was started by another DataLoader");
    }
    return next_on(*core_, epoch);
  }
  /// True while next() fetches on its caller's thread: no workers (detail::drives_inline) and
  /// no driver thread started yet (async_next, get_executor or a wait outside next() starts
  /// one, for good). Any thread.
  bool fetches_here() const noexcept { return core_->driver().runs_inline(); }

  /// The range-for adapter: each range-for over the loader is one epoch.
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    iterator(Epoch<batch_type> epoch, Core* core) : epoch_(std::move(epoch)), core_(core) {
      ++*this;
    }
    batch_type& operator*() noexcept { return *current_; }
    batch_type* operator->() noexcept { return &*current_; }
    iterator& operator++() {
      // The loop body is done with the last batch: freed before the wait, its memory (a
      // worker process's slot, or the allocator's block) serves the batch fetched meanwhile,
      // not one more. A copy the body kept keeps its storage alive, as ever.
      current_.reset();
      current_ = next_on(*core_, epoch_);
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.current_;
    }

   private:
    Epoch<batch_type> epoch_{nullptr};
    Core* core_ = nullptr;  // not the DataLoader: a loader moved mid-loop keeps its core
    std::optional<batch_type> current_;
  };
  /// Starts an epoch and waits for its first batch.
  iterator begin() { return iterator(epoch(), core_.get()); }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// Asynchronously takes the next batch of the loader's current epoch, starting an epoch
  /// when none is running; completes with an empty optional at the end of each epoch.
  ///
  /// Completion signature: `void(std::exception_ptr, std::optional<batch_type>)`, so
  /// `asio::use_awaitable` returns the optional and throws the error. The handler is never
  /// invoked from within this function; it runs on its associated executor, or on the
  /// loader's driver thread if it has none. One operation at a time per loader.
  template <class CompletionToken>
  auto async_next(CompletionToken&& token) {
    using Signature = void(std::exception_ptr, std::optional<batch_type>);
    return asio::async_initiate<CompletionToken, Signature>(
        [this](auto handler) { initiate_next(std::move(handler)); }, token);
  }

 private:
  static std::optional<batch_type> next_on(Core& core, Epoch<batch_type>& epoch) {
    if (core.driver().runs_inline()) return core.drive(epoch.next());
    return sync_wait(epoch.next());
  }

  template <class Handler>
  void initiate_next(Handler handler) {
    // The previous implicit epoch is over once its end has been delivered: start the next.
    if (implicit_ && implicit_->channel()->handoff.ended()) implicit_.reset();
    if (!implicit_) implicit_.emplace(epoch());
    auto channel = implicit_->channel();
    struct Op {
      Handler handler;
      asio::executor_work_guard<asio::associated_executor_t<Handler, executor_type>> work;
      detail::ConsumerSlot<batch_type> slot;
      std::shared_ptr<detail::EpochChannel<batch_type>> channel;
    };
    auto ex = asio::get_associated_executor(handler, get_executor());
    auto op = std::make_shared<Op>(Op{std::move(handler), asio::make_work_guard(ex), {}, channel});
    if (channel->recorder && channel->recorder->shard_count() > 0) {
      op->slot.asked_ns = detail::now_ns();
    }
    auto complete = [op] {
      auto ex2 = op->work.get_executor();
      asio::post(ex2, [op] {
        std::exception_ptr error;
        std::optional<batch_type> batch;
        try {
          batch = detail::take_outcome(*op->channel, op->slot);
        } catch (...) {
          error = std::current_exception();
        }
        op->work.reset();
        auto h = std::move(op->handler);
        std::move(h)(error, std::move(batch));
      });
    };
    const bool waiting = channel->handoff.poll_or_wait(
        op->slot, complete, [c = channel.get()](std::uint64_t generation, std::int64_t batch) {
          c->arm_timeout(generation, batch);
        });
    if (!waiting) complete();
  }

  /// Lets go of the loader held (the destructor's and move assignment's way): the implicit
  /// epoch first, while its loader exists; then the loader, within the grace period, or by a
  /// detached thread when that passes or when this runs on the loader's own driver thread.
  void release() noexcept {
    implicit_.reset();
    if (core_ && (core_->driver().on_driver_thread() || !core_->stop_within(Core::stop_grace))) {
      std::thread([core = std::move(core_)]() mutable { core.reset(); }).detach();
    }
    core_.reset();
  }

  std::optional<Epoch<batch_type>> implicit_;
  std::unique_ptr<Core> core_;
};

namespace detail {
/// True when the loader would hand the default collate a vector of samples it cannot batch.
template <class D, class C>
consteval bool default_collate_unusable() {
  if constexpr (!std::same_as<C, DefaultCollate>) {
    return false;
  } else {
    // NOTE: not through FetchPlan, whose batch type is the very error this check forestalls.
    constexpr FetchPath path = choose_fetch_path<D, C>();
    if constexpr (path == FetchPath::whole_batch || path == FetchPath::whole_batch_async) {
      return false;  // get_batch builds the batch itself
    } else {
      return !Collatable<loader_sample_t<D>>;
    }
  }
}
}  // namespace detail

/// Makes a DataLoader over `dataset` (moved in) with `options`. A torch::data dataset
/// (`std::optional<size_t> size()` with `get(size_t)`, or one made by `.map(transform)`) is
/// loaded through TorchDataAdapter, which says which ones it refuses; its
/// torch::data::Example samples collate into an Example batch (collate/torch_data.hpp).
///
/// A type that is not a dataset, or samples the default collate cannot batch, stop the build
/// with an error whose first lines name the type and say what it lacks (see
/// loader/detail/diagnose.hpp).
template <class D, class C = DefaultCollate>
auto make_data_loader(D&& dataset, LoaderOptions<C> options = {}) {
  using Dataset = std::remove_cvref_t<D>;
  if constexpr (!LoadableDataset<Dataset> && TorchDataDataset<Dataset>) {
    // A libtorch dataset, as it is: through the torch::data adapter.
    return make_data_loader(TorchDataAdapter<Dataset>(std::forward<D>(dataset)),
                            std::move(options));
  } else if constexpr (!LoadableDataset<Dataset>) {
    static_assert(diagnose::is_not_a_dataset<Dataset>::value);
  } else if constexpr (detail::default_collate_unusable<Dataset, C>()) {
    static_assert(diagnose::default_collate_cannot_batch<detail::loader_sample_t<Dataset>>::value);
  } else {
    return DataLoader<Dataset, C>(std::forward<D>(dataset), std::move(options));
  }
}

/// Makes a DataLoader over `dataset` with `options` and a collate function of the caller's
/// (any callable, a lambda included), without spelling `LoaderOptions<Collate>`:
/// `make_data_loader(dataset, {.batch_size = 4}, [](std::vector<Sample> s) { ... })`.
/// `options.collate` is replaced by `collate`.
template <class D, class C>
auto make_data_loader(D&& dataset, LoaderOptions<> options, C collate) {
  return make_data_loader(std::forward<D>(dataset),
                          detail::with_collate(std::move(options), std::move(collate)));
}

}  // namespace coload
