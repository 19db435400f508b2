#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "coload/coro/generator.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// The given indices in random order, as torch.utils.data.SubsetRandomSampler:
/// `indices[i] for i in randperm(len(indices))`.
///
/// A sampler given a generator continues its stream across epochs, as in PyTorch. Without one,
/// each epoch's `randperm` draws from ATen's default generator (as `generator=None` does), so
/// `at::manual_seed` makes it reproducible.
class SubsetRandomSampler {
 public:
  /// Samples from `indices`, drawing the order from `generator` (or ATen's default one).
  explicit SubsetRandomSampler(std::vector<Index> indices,
                               std::optional<at::Generator> generator = std::nullopt);
  /// Draws the order from a generator seeded with `seed`: `SubsetRandomSampler(indices, 42)`.
  SubsetRandomSampler(std::vector<Index> indices, std::uint64_t seed)
      : SubsetRandomSampler(std::move(indices), make_generator(seed)) {}

  /// The indices of one epoch.
  Generator<Index> indices();
  /// The same indices, as one block.
  Generator<std::span<const Index>> index_blocks();
  /// The number of indices per epoch: the number of indices given.
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(indices_.size()); }
  /// The indices given, in their original order.
  const std::vector<Index>& subset() const noexcept { return indices_; }

 private:
  std::vector<Index> indices_;
  std::optional<at::Generator> generator_;
};

}  // namespace coload
