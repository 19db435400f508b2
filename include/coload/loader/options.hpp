#pragma once
// LoaderOptions: the DataLoader's constructor arguments, as an aggregate.

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "coload/collate/collate.hpp"
#include "coload/core/error.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/exec/process.hpp"
#include "coload/loader/auto_workers.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

class DeviceBackend;

/// What a DataLoader does, set with designated initializers in declaration order, e.g.
/// `{.batch_size = 64, .shuffle = true, .num_workers = 4}`. Fields follow PyTorch's DataLoader;
/// combinations PyTorch refuses are refused at construction, with PyTorch's wording.
template <class CollateFn = DefaultCollate>
struct LoaderOptions {
  /// Samples per batch. `std::nullopt` turns automatic batching off, as `batch_size=None`: each
  /// sample is a batch of its own, passed alone to a per-sample collate such as DefaultConvert
  /// (the batch type changes, so the collate must say so: `.collate = coload::DefaultConvert{}`).
  std::optional<std::int64_t> batch_size = 1;
  /// Reshuffle every epoch (a RandomSampler seeded from `seed`).
  bool shuffle = false;
  /// Where indices come from; exclusive with `shuffle`.
  AnySampler sampler{};
  /// Where whole index lists come from; exclusive with batch_size, shuffle, sampler, drop_last.
  AnyBatchSampler batch_sampler{};
  /// Worker threads fetching and collating; 0 fetches on the consumer's thread while it waits
  /// in the range-for (on the loader's driver thread where the driver needs one:
  /// docs/user-guide.md, Threads); a negative count is refused;
  /// coload::auto_workers lets the loader choose and adjust the count (auto_workers.hpp).
  int num_workers = 0;
  /// Turns a std::vector of samples into a batch; must be safe to call from several workers.
  CollateFn collate{};
  /// Batches in page-locked memory, for fast asynchronous copies to a CUDA device: collate
  /// writes straight into slabs of a pinned pool allocated once and recycled (no extra copy;
  /// tensors that a dataset made elsewhere are copied in once; a batch type with a
  /// `pin_memory()` member or a coload::Pin specialisation is pinned through it). Without CUDA
  /// (in coload, libtorch or the machine) batches stay in pageable memory, with one warning.
  bool pin_memory = false;
  /// Drop the last batch when it is smaller than batch_size.
  bool drop_last = false;
  /// Seconds to wait for a batch before raising TimeoutError; 0 waits forever.
  double timeout = 0;
  /// Runs in each worker before its first fetch (each epoch unless persistent_workers).
  std::function<void(const WorkerInfo&)> worker_init_fn{};
  /// Batches in flight per worker (default 2); needs num_workers > 0.
  std::optional<int> prefetch_factor{};
  /// Keep workers (and their worker_init_fn state) from one epoch to the next.
  bool persistent_workers = false;
  /// Deliver batches in sampler order; false delivers each as soon as it is ready.
  bool in_order = true;
  /// Seeds the shuffle order and every sample's Rng; unset draws from ATen's default generator.
  std::optional<std::uint64_t> seed{};
  /// A sample that fails to load: `raise` delivers the error in its batch's place; `skip`
  /// leaves the sample out of its batch (an emptied batch is left out of the epoch), counts
  /// it (DataLoader::skipped()) and names it once on stderr.
  OnError on_error = OnError::raise;
  /// Where the workers run: threads, or forked processes (crash-isolated; each batch comes
  /// back through shared memory without a copy). Processes need a batch type the wire
  /// format knows (coload::wire::Wire).
  Executor executor = Executor::threads;
  /// How worker processes start: forked from the loader (`fork`), or from the fork server
  /// started by coload::start_forkserver() at the top of main (`forkserver`), which is safe
  /// where other threads may hold locks when the loader forks.
  ProcessStart process_start = ProcessStart::fork;
  /// What a worker process's death does: `raise` delivers WorkerDied in place of the batch it
  /// was fetching and ends the epoch after it (one that died holding no batch fails the next
  /// batch asked for, as torch's DataLoader raises for any worker that dies); `restart` forks
  /// it again and re-fetches its batches, up to max_worker_restarts times per worker (then
  /// raises). Iterable datasets always raise: a restarted stream would start over.
  OnWorkerDeath on_worker_death = OnWorkerDeath::raise;
  int max_worker_restarts = 3;
  /// This process's rank and the number of ranks, for sharding an iterable dataset
  /// (WorkerInfo::shard_id) and for the loader's state; unset, from torchrun's `RANK` and
  /// `WORLD_SIZE` (0 and 1 without them).
  std::optional<int> rank{};
  std::optional<int> world_size{};
  /// Adds the device stage: each batch is copied from its pinned slab to this device on a
  /// stream of coload's own, and the consumer receives it once the copy has completed (the host
  /// never blocks on the device). A CUDA device that libtorch or the machine lacks is refused
  /// at construction, saying which. The batch's device tensors are freed stream-ordered: hand
  /// them to your stream with `coload::device_batch(batch).wait(stream)`.
  std::optional<at::Device> device{};
  /// The device runtime under pin_memory and the device stage; unset, CUDA's (for `device =
  /// at::kCPU`, a coload::HostDeviceBackend, which runs the stage on the host).
  std::shared_ptr<DeviceBackend> device_backend{};
  /// Records where the time goes (DataLoader::metrics()); off only to measure what recording
  /// costs. `COLOAD_METRICS=0` in the environment turns it off too.
  bool metrics = true;
  /// Writes a Chrome trace-event JSON file here (Perfetto, chrome://tracing): a track per worker
  /// thread and process, a span per sample's stages, the hand-offs and the consumer's waits.
  /// Empty: the path in `COLOAD_TRACE`, if set (the process's first loader writes there, each
  /// later one to that path plus ".1", ".2", ...); else no trace. Memory stays bounded: events
  /// are streamed to the file in chunks of 256 KiB.
  std::string trace{};
};

namespace detail {
/// `options` with its collate replaced by `collate`, every other field as given.
// NOTE: a field added to LoaderOptions must be added here too; the static_assert below notices
// a LoaderOptions that grew (its size with an empty collate changes).
template <class C>
LoaderOptions<C> with_collate(LoaderOptions<>&& o, C collate) {
  return LoaderOptions<C>{
      .batch_size = o.batch_size,
      .shuffle = o.shuffle,
      .sampler = std::move(o.sampler),
      .batch_sampler = std::move(o.batch_sampler),
      .num_workers = o.num_workers,
      .collate = std::move(collate),
      .pin_memory = o.pin_memory,
      .drop_last = o.drop_last,
      .timeout = o.timeout,
      .worker_init_fn = std::move(o.worker_init_fn),
      .prefetch_factor = o.prefetch_factor,
      .persistent_workers = o.persistent_workers,
      .in_order = o.in_order,
      .seed = o.seed,
      .on_error = o.on_error,
      .executor = o.executor,
      .process_start = o.process_start,
      .on_worker_death = o.on_worker_death,
      .max_worker_restarts = o.max_worker_restarts,
      .rank = o.rank,
      .world_size = o.world_size,
      .device = o.device,
      .device_backend = std::move(o.device_backend),
      .metrics = o.metrics,
      .trace = std::move(o.trace),
  };
}
struct WithCollateFieldCheck {
  std::optional<std::int64_t> a; bool b; AnySampler c; AnyBatchSampler d; int e;
  DefaultCollate f; bool g, h; double i; std::function<void(const WorkerInfo&)> j;
  std::optional<int> k; bool l, m; std::optional<std::uint64_t> n; OnError o; Executor p;
  ProcessStart q; OnWorkerDeath r; int s; std::optional<int> t, u;
  std::optional<at::Device> v; std::shared_ptr<DeviceBackend> w; bool x; std::string y;
};
static_assert(sizeof(WithCollateFieldCheck) == sizeof(LoaderOptions<>),
              "LoaderOptions gained a field: copy it in detail::with_collate");

/// What the loader knows of its dataset and collate at compile time, for validation.
struct LoaderKind {
  /// The dataset is iterable (stream), not map-style.
  bool iterable = false;
  /// The collate takes one sample at a time (automatic batching off).
  bool per_sample = false;
};

/// The checks of torch.utils.data.DataLoader.__init__, over the option values.
void validate_options(std::optional<std::int64_t> batch_size, bool shuffle, bool has_sampler,
                      bool has_batch_sampler, int num_workers, bool drop_last, double timeout,
                      std::optional<int> prefetch_factor, bool persistent_workers,
                      LoaderKind kind);

/// This loader's place among the ranks of a distributed run.
struct RankSpec {
  int rank = 0;
  int world_size = 1;
};

/// The rank and world size the options give, or for either left out the environment's
/// (RANK/WORLD_SIZE, distributed_env); refuses a rank outside [0, world_size - 1] as
/// DistributedSampler does.
RankSpec resolve_rank(std::optional<int> rank, std::optional<int> world_size);

/// PyTorch's check that num_workers does not exceed the CPUs this process may use: a warning,
/// once per process, that says "worker processes" or "worker threads" for what they are.
void check_worker_number(int num_workers, bool processes);

template <class C>
void validate_options(const LoaderOptions<C>& o, LoaderKind kind) {
  validate_options(o.batch_size, o.shuffle, static_cast<bool>(o.sampler),
                   static_cast<bool>(o.batch_sampler), o.num_workers, o.drop_last, o.timeout,
                   o.prefetch_factor, o.persistent_workers, kind);
  // As PyTorch refuses a multiprocessing_context without worker processes.
  if (o.executor == Executor::processes && o.num_workers == 0) {
    throw InvalidArgument(
        "executor = processes can only be used with multi-process loading (num_workers > 0), "
        "but got num_workers=0");
  }
  if (o.max_worker_restarts < 0) {
    throw InvalidArgument("max_worker_restarts option should be non-negative, but got " +
                          std::to_string(o.max_worker_restarts));
  }
}
}  // namespace detail

}  // namespace coload
