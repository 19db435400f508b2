#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>
#include <span>

#include "coload/coro/generator.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// A CPU generator seeded as `torch.Generator().manual_seed(seed)`.
at::Generator make_generator(std::uint64_t seed);

namespace detail {
/// One int64 draw as `torch.empty((), dtype=torch.int64).random_(generator=gen)`; from ATen's
/// default generator when `gen` is empty.
std::uint64_t draw_seed(const std::optional<at::Generator>& gen);
}  // namespace detail

/// RandomSampler's keyword arguments, as in Python: `RandomSampler(n, {.seed = 42})` is
/// `RandomSampler(range(n), generator=torch.Generator().manual_seed(42))`.
struct RandomSamplerOptions {
  /// Draw with replacement.
  bool replacement = false;
  /// Indices per epoch; unset, the dataset size.
  std::optional<std::int64_t> num_samples{};
  /// Seeds the sampler's own generator; unset, each epoch draws from ATen's default generator.
  std::optional<std::uint64_t> seed{};
};

/// Random order, as torch.utils.data.RandomSampler, drawing the same indices for the same
/// generator state: `randperm` without replacement, `randint` in chunks of 32 with it.
///
/// A sampler given a generator continues its stream across epochs (the second epoch differs
/// from the first, exactly as in PyTorch). Without one, each epoch seeds a fresh generator from
/// ATen's default generator, so `at::manual_seed` makes it reproducible.
class RandomSampler {
 public:
  /// Refuses a non-positive `num_samples` with PyTorch's message, and a negative size, or an
  /// empty dataset to draw from (PyTorch fails only when iterated), in coload's words.
  explicit RandomSampler(std::int64_t size, bool replacement = false,
                         std::optional<std::int64_t> num_samples = std::nullopt,
                         std::optional<at::Generator> generator = std::nullopt);
  /// With Python's keywords: `RandomSampler(n, {.replacement = true, .seed = 42})`.
  RandomSampler(std::int64_t size, const RandomSamplerOptions& options)
      : RandomSampler(size, options.replacement, options.num_samples,
                      options.seed ? std::optional<at::Generator>(make_generator(*options.seed))
                                   : std::nullopt) {}

  /// The indices of one epoch.
  Generator<Index> indices();
  /// The same indices, one block per `randperm`/`randint` draw.
  Generator<std::span<const Index>> index_blocks();
  /// The number of indices per epoch (`num_samples`, or the dataset size).
  std::int64_t size() const noexcept { return num_samples_; }

 private:
  std::int64_t size_;
  bool replacement_;
  std::int64_t num_samples_;
  std::optional<at::Generator> generator_;
};

}  // namespace coload
