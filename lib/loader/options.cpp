// The checks of LoaderOptions that need no template: PyTorch's DataLoader.__init__ checks and
// its warning about the number of workers.

#include "coload/loader/options.hpp"

#include <sched.h>

#include <string>
#include <thread>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/sampler/distributed.hpp"

namespace coload::detail {

void check_worker_number(int num_workers, bool processes) {
  if (num_workers <= 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  int suggested = 0;
  bool cpuset_checked = false;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    suggested = CPU_COUNT(&set);
    cpuset_checked = true;
  } else {
    suggested = static_cast<int>(std::thread::hardware_concurrency());
  }
  if (suggested <= 0 || num_workers <= suggested) return;
  warn_once("worker-number",
            "This DataLoader will create " + std::to_string(num_workers) +
                (processes ? " worker processes" : " worker threads") +
                " in total. Our suggested max number of worker in current "
                "system is " +
                std::to_string(suggested) +
                (cpuset_checked ? "" : " (`cpuset` is not taken into account)") +
                ", which is smaller than what this DataLoader is going to create. Please be "
                "aware that excessive worker creation might get DataLoader running slow or even "
                "freeze, lower the worker number to avoid potential slowness/freeze if "
                "necessary.");
}

namespace {
constexpr int max_prefetch_factor = 1024;
}  // namespace

void validate_options(std::optional<std::int64_t> batch_size, bool shuffle, bool has_sampler,
                      bool has_batch_sampler, int num_workers, bool drop_last, double timeout,
                      std::optional<int> prefetch_factor, bool persistent_workers,
                      LoaderKind kind) {
  if (num_workers < 0) {
    throw InvalidArgument(
        "num_workers option should be non-negative; use num_workers=0 to disable "
        "multiprocessing.");
  }
  if (timeout < 0) throw InvalidArgument("timeout option should be non-negative");
  // As a steady_clock duration in nanoseconds: past about 9.2e9 s (and inf, NaN) the cast is
  // undefined, and on x86-64 the timer fired at once, "waiting inf seconds".
  if (!(timeout <= 1e9)) {
    throw InvalidArgument("timeout option should be a finite number of seconds, at most 1e9 "
                          "(0 waits for ever), but got " + std::to_string(timeout));
  }
  if (num_workers == 0 && prefetch_factor) {
    throw InvalidArgument(
        "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
        "to enable multiprocessing.");
  }
  if (prefetch_factor && *prefetch_factor <= 0) {
    throw InvalidArgument("prefetch_factor option should be positive, but got " +
                          std::to_string(*prefetch_factor));
  }
  // coload's own bound: each batch in flight has a slot of the reorder ring, allocated with
  // it (INT_MAX x 2 workers asked for 4.3e9 slots at the first epoch).
  if (prefetch_factor && *prefetch_factor > max_prefetch_factor) {
    throw InvalidArgument("prefetch_factor option should be at most " +
                          std::to_string(max_prefetch_factor) +
                          " (batches in flight a worker, each holding a slot of the reorder "
                          "ring), but got " + std::to_string(*prefetch_factor));
  }
  if (persistent_workers && num_workers == 0) {
    throw InvalidArgument("persistent_workers option needs num_workers > 0");
  }
  if (kind.iterable) {
    // NOTE: PyTorch prints the offending value; a C++ sampler has no repr, so its type stays
    // unnamed and shuffle prints as Python's True.
    if (shuffle) {
      throw InvalidArgument(
          "DataLoader with IterableDataset: expected unspecified shuffle option, but got "
          "shuffle=True");
    }
    if (has_sampler) {
      throw InvalidArgument(
          "DataLoader with IterableDataset: expected unspecified sampler option, but got "
          "sampler=<sampler>");
    }
    if (has_batch_sampler) {
      throw InvalidArgument(
          "DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
          "batch_sampler=<batch_sampler>");
    }
  }
  if (has_sampler && shuffle) {
    throw InvalidArgument("sampler option is mutually exclusive with shuffle");
  }
  if (has_batch_sampler) {
    if (batch_size != 1 || shuffle || has_sampler || drop_last) {
      throw InvalidArgument(
          "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
          "drop_last");
    }
  } else if (!batch_size) {
    if (drop_last) {
      throw InvalidArgument(
          "batch_size=None option disables auto-batching and is mutually exclusive with "
          "drop_last");
    }
  } else if (*batch_size <= 0) {
    throw InvalidArgument("batch_size should be a positive integer value, but got batch_size=" +
                          std::to_string(*batch_size));
  }
  // coload's own: the batch type follows from the collate, so it must agree with batch_size.
  if (kind.per_sample && batch_size) {
    throw InvalidArgument(
        "collate takes one sample at a time (as default_convert does), which needs "
        "batch_size=std::nullopt; got batch_size=" +
        std::to_string(*batch_size));
  }
  if (!kind.per_sample && !batch_size && !has_batch_sampler) {
    throw InvalidArgument(
        "batch_size=std::nullopt turns automatic batching off, so collate receives one sample "
        "at a time: pass a per-sample collate such as .collate = coload::DefaultConvert{}");
  }
}

RankSpec resolve_rank(std::optional<int> rank, std::optional<int> world_size) {
  RankSpec r;
  if (!rank || !world_size) {
    const DistributedEnv env = distributed_env();
    r.rank = rank.value_or(env.rank);
    r.world_size = world_size.value_or(env.world_size);
  } else {
    r.rank = *rank;
    r.world_size = *world_size;
  }
  if (r.world_size < 1 || r.rank < 0 || r.rank >= r.world_size) {
    throw InvalidArgument("Invalid rank " + std::to_string(r.rank) +
                          ", rank should be in the interval [0, " +
                          std::to_string(std::int64_t{r.world_size} - 1) + "]");
  }
  return r;
}

}  // namespace coload::detail
