#pragma once
// SampleContext: what a dataset's get(index, ctx) and a transform learn about the sample.

#include <ATen/core/Generator.h>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "coload/core/error.hpp"
#include "coload/core/index.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/coro/scheduler.hpp"

namespace coload {

class BatchAllocator;

namespace io {
class Reader;
}  // namespace io

/// A small, fast random stream (splitmix64) for per-sample randomness.
///
/// `Rng::for_sample(seed, epoch, index)` depends on nothing else, so augmentations drawn from
/// it are the same whichever worker runs the sample and in whatever order.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) noexcept : state_(seed) {}

  /// The stream of sample `index` in `epoch` of a loader seeded with `seed`.
  static Rng for_sample(std::uint64_t seed, std::int64_t epoch, Index index) noexcept {
    std::uint64_t s = mix(seed ^ 0x636f6c6f61642121ULL);
    s = mix(s ^ static_cast<std::uint64_t>(epoch));
    s = mix(s ^ static_cast<std::uint64_t>(index));
    return Rng{s};
  }

  /// The next 64 random bits.
  std::uint64_t next_u64() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }
  /// A double uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  /// An integer uniform in [low, high); requires low < high.
  std::int64_t randint(std::int64_t low, std::int64_t high) noexcept {
    // In unsigned arithmetic: high - low overflows for ranges wider than INT64_MAX.
    const std::uint64_t span = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
    return static_cast<std::int64_t>(
        static_cast<std::uint64_t>(low) +
        static_cast<std::uint64_t>(static_cast<unsigned __int128>(next_u64()) * span >> 64));
  }
  /// A CPU at::Generator seeded from this stream, for ATen's random functions.
  at::Generator torch_generator();

 private:
  static std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

namespace detail {
/// Where `co_await ctx.cpu()` goes: a scheduler (none: the caller stays where it is), the
/// sample whose work it moves (-1: a whole batch's), and its place in line there (0: none).
struct CpuPlace {
  Scheduler* pool = nullptr;
  Index sample = -1;
  /// The place in line of the work on `pool` (Scheduler::post_ordered); 0: none.
  std::uint64_t order = 0;
};

/// `co_await ctx.cpu()`: continues on the scheduler's thread (at once without one), which is
/// told what arrived (Scheduler::arrived) before the caller goes on.
struct CpuAwaiter {
  CpuPlace place;
  bool await_ready() const noexcept { return place.pool == nullptr; }
  void await_suspend(std::coroutine_handle<> h) const {
    if (place.order != 0) {
      place.pool->post_ordered(h, place.order);
    } else {
      place.pool->post(h);
    }
  }
  void await_resume() const {
    if (place.pool) place.pool->arrived(place.sample);
  }
};
}  // namespace detail

/// Passed to `get(index, ctx)`, `get_async(index, ctx)` and to transforms: where and when a
/// sample is being made.
struct SampleContext {
  /// The sample's index in the dataset.
  Index index = 0;
  /// The loader's epoch, counted from 0.
  std::int64_t epoch = 0;
  /// The sample's own random stream, a function of (seed, epoch, index) only.
  Rng rng;
  /// The worker fetching the sample, or nullptr when fetching on the driver (and in an
  /// asynchronous fetch, where the worker is known only after `co_await cpu()`).
  const WorkerInfo* worker = nullptr;
  /// In an asynchronous fetch (get_async, get_batch_async): the loader's reader, on whose
  /// thread (the driver) the fetch starts. `co_await ctx.io->read_file(path)` reads without
  /// holding a worker. nullptr elsewhere.
  io::Reader* io = nullptr;
  /// Where `cpu()` goes; set by the loader.
  detail::CpuPlace cpu_place{};

  /// Awaitable that moves an asynchronous fetch onto a worker for its CPU work (decoding,
  /// augmenting) once its reads are done; does nothing without workers.
  detail::CpuAwaiter cpu() const noexcept { return {cpu_place}; }
};

/// What the loader does with a sample that fails to load (LoaderOptions::on_error).
enum class OnError {
  /// The batch's place in the epoch delivers the error (a WorkerError naming the sample).
  raise,
  /// The sample is left out of its batch, counted, and named once on stderr.
  skip,
};

/// Thrown by a get_batch_async whose every sample was skipped: the batch is left out of the
/// epoch (the loader catches it; it reaches no caller).
class EmptyBatch : public std::runtime_error, public Error {
 public:
  EmptyBatch() : std::runtime_error("every sample of the batch was skipped") {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// Thrown by a whole-batch fetch (get_batch, get_batch_async) when one sample failed: the
/// loader's WorkerError then names that sample's index, as it does for per-sample fetches.
class SampleError : public std::runtime_error, public Error {
 public:
  SampleError(Index index, const std::string& what) : std::runtime_error(what), index_(index) {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
  /// The dataset index of the sample that failed.
  Index index() const noexcept { return index_; }

 private:
  Index index_;
};

namespace detail {
/// Counts and reports skipped samples for one loader; thread-safe.
class SkipLog {
 public:
  /// Records that sample `index` was skipped because of `what` (named on stderr once per
  /// index); returns the number skipped so far.
  std::int64_t skip(Index index, const std::string& what);
  /// How many samples were skipped.
  std::int64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  /// Counts `n` samples skipped elsewhere (in a worker process, which named them itself).
  void add(std::int64_t n) noexcept { count_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> count_{0};
  std::mutex mutex_;
  std::unordered_set<Index> named_;
};
}  // namespace detail

/// Passed to `get_batch_async(indices, ctx)`: one batch's indices, and what each sample's
/// context is made of.
struct BatchContext {
  /// The batch's indices, in order.
  std::span<const Index> indices;
  /// The batch's number in the epoch.
  std::int64_t batch = 0;
  /// The loader's epoch, counted from 0.
  std::int64_t epoch = 0;
  /// The seed behind every sample's Rng.
  std::uint64_t seed = 0;
  /// The loader's reader (see SampleContext::io).
  io::Reader* io = nullptr;
  /// Where `cpu()` goes; set by the loader.
  detail::CpuPlace cpu_place{};
  /// The loader's policy for a sample that fails to load.
  OnError on_error = OnError::raise;
  /// Where skipped samples are counted (set by the loader; nullptr counts nothing).
  detail::SkipLog* skip_log = nullptr;
  /// Where the batch's tensors should live (a pinned lease, a worker process's slot), or
  /// nullptr: install it with BatchAllocatorScope around empty_batch_tensor() calls. Unlike
  /// the thread's own BatchAllocator, it stays with the batch across threads.
  BatchAllocator* allocator = nullptr;
  /// The loader's own indices of the batch's samples, where a wrapper (Subset) handed the
  /// dataset its own `indices`; empty when they are the same. Each sample's Rng, and the index
  /// that skips and errors name, go by these: a wrapped dataset then draws and reports alike
  /// whether it is fetched by batch or sample by sample.
  std::span<const Index> loader_indices{};

  /// With `on_error = skip`: records that the sample at `position` was left out because of
  /// `what` and returns true; with `raise`, returns false (the caller throws).
  bool skip(std::size_t position, const std::string& what) const {
    if (on_error != OnError::skip) return false;
    if (skip_log) skip_log->skip(loader_index(position), what);
    return true;
  }

  /// The loader's index of the sample at `position` (see loader_indices).
  Index loader_index(std::size_t position) const noexcept {
    return loader_indices.empty() ? indices[position] : loader_indices[position];
  }

  /// The context of the sample at `position` in the batch, with its own Rng: the same as the
  /// loader gives a per-sample fetch of it.
  SampleContext sample(std::size_t position) const noexcept {
    const Index i = loader_index(position);
    return SampleContext{i, epoch, Rng::for_sample(seed, epoch, i), nullptr, io, cpu_place};
  }
  /// As SampleContext::cpu().
  detail::CpuAwaiter cpu() const noexcept { return {cpu_place}; }
};

}  // namespace coload
