#pragma once
// SampleContext: what a dataset's get(index, ctx) and a transform learn about the sample.

#include <ATen/core/Generator.h>

#include <cstdint>

#include "coload/sampler/sampler.hpp"

namespace coload {

struct WorkerInfo;

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
    const auto span = static_cast<std::uint64_t>(high - low);
    return low + static_cast<std::int64_t>(
                     static_cast<unsigned __int128>(next_u64()) * span >> 64);
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

/// Passed to `get(index, ctx)` and to transforms: where and when a sample is being made.
struct SampleContext {
  /// The sample's index in the dataset.
  Index index = 0;
  /// The loader's epoch, counted from 0.
  std::int64_t epoch = 0;
  /// The sample's own random stream, a function of (seed, epoch, index) only.
  Rng rng;
  /// The worker fetching the sample, or nullptr when fetching on the driver.
  const WorkerInfo* worker = nullptr;
};

}  // namespace coload
