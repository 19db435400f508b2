#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coload/coro/generator.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Indices in `[0, len(weights))` drawn with the given (unnormalised) probabilities, as
/// torch.utils.data.WeightedRandomSampler: each epoch is
/// `torch.multinomial(weights, num_samples, replacement, generator)`.
///
/// A sampler given a generator continues its stream across epochs, as in PyTorch; without one,
/// each epoch draws from ATen's default generator. ATen refuses an invalid distribution (for
/// example more samples than positive weights without replacement) when an epoch starts.
class WeightedRandomSampler {
 public:
  /// Refuses a non-positive `num_samples` with PyTorch's message.
  WeightedRandomSampler(const std::vector<double>& weights, std::int64_t num_samples,
                        bool replacement = true,
                        std::optional<at::Generator> generator = std::nullopt);
  /// Draws from a generator seeded with `seed`: `WeightedRandomSampler(weights, n, true, 42)`.
  WeightedRandomSampler(const std::vector<double>& weights, std::int64_t num_samples,
                        bool replacement, std::uint64_t seed)
      : WeightedRandomSampler(weights, num_samples, replacement, make_generator(seed)) {}
  /// Converts `weights` to a CPU float64 tensor, as `torch.as_tensor(weights, dtype=double)`
  /// (sharing its memory when it already is one); refuses a non-positive `num_samples` and a
  /// tensor that is not 1-D, with PyTorch's messages.
  WeightedRandomSampler(const at::Tensor& weights, std::int64_t num_samples,
                        bool replacement = true,
                        std::optional<at::Generator> generator = std::nullopt);

  /// The indices of one epoch.
  Generator<Index> indices();
  /// The same indices, as one block (one `multinomial` draw).
  Generator<std::span<const Index>> index_blocks();
  /// The number of indices per epoch: `num_samples`.
  std::int64_t size() const noexcept { return num_samples_; }
  /// The weights, as a 1-D float64 tensor.
  const at::Tensor& weights() const noexcept { return weights_; }
  /// Whether an index may be drawn more than once per epoch.
  bool replacement() const noexcept { return replacement_; }

 private:
  at::Tensor weights_;
  std::int64_t num_samples_;
  bool replacement_;
  std::optional<at::Generator> generator_;
};

}  // namespace coload
