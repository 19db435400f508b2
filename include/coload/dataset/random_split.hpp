#pragma once
// random_split: non-overlapping random Subsets, the same split as
// torch.utils.data.random_split for the same generator state.

#include <ATen/core/Generator.h>

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "coload/dataset/dataset.hpp"
#include "coload/dataset/subset.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {
namespace detail {

/// The split lengths PyTorch 1.13 uses for `lengths` over `size` samples: when they sum to 1
/// (math.isclose and at most 1) they are fractions, floored, with the remainder handed out one
/// by one round-robin from the first split (a zero-length split is warned about); otherwise
/// they are the lengths themselves. Throws std::invalid_argument with PyTorch's messages.
std::vector<std::int64_t> split_lengths(std::int64_t size, std::span<const double> lengths);
/// As above for integer lengths (which PyTorch, too, reads as fractions when they sum to 1).
std::vector<std::int64_t> split_lengths(std::int64_t size, std::span<const std::int64_t> lengths);
/// `randperm(sum(lengths), generator)` cut into consecutive slices of `lengths`.
std::vector<std::vector<Index>> split_indices(std::span<const std::int64_t> lengths,
                                              const std::optional<at::Generator>& generator);

}  // namespace detail

/// Splits `dataset` into non-overlapping random Subsets of the given lengths, or of the given
/// fractions of its size, exactly as torch.utils.data.random_split: the indices are
/// `randperm(size, generator)` cut into consecutive slices. Without a generator, ATen's default
/// generator is used (so `at::manual_seed(s)` matches `torch.manual_seed(s)`).
///
/// The subsets share the dataset. Lengths that do not sum to the dataset's size are refused
/// ("Sum of input lengths does not equal the length of the input dataset!"), as are fractions
/// outside [0, 1] ("Fraction at index i is not between 0 and 1"), negative lengths, and
/// non-whole floating lengths that are not fractions.
template <MapDataset D, class T>
requires(std::integral<T> || std::floating_point<T>) std::vector<Subset<D>> random_split(
    D dataset, std::span<const T> lengths, std::optional<at::Generator> generator = std::nullopt) {
  const auto size = static_cast<std::int64_t>(dataset.size());
  std::vector<std::int64_t> cut;
  if constexpr (std::floating_point<T>) {
    const std::vector<double> given(lengths.begin(), lengths.end());
    cut = detail::split_lengths(size, given);
  } else {
    const std::vector<std::int64_t> given(lengths.begin(), lengths.end());
    cut = detail::split_lengths(size, given);
  }
  auto shared = std::make_shared<D>(std::move(dataset));
  std::vector<Subset<D>> subsets;
  subsets.reserve(cut.size());
  for (auto& indices : detail::split_indices(cut, generator)) {
    subsets.emplace_back(shared, std::move(indices));
  }
  return subsets;
}

/// random_split with lengths or fractions in a vector.
template <MapDataset D, class T>
requires(std::integral<T> || std::floating_point<T>) std::vector<Subset<D>> random_split(
    D dataset, const std::vector<T>& lengths,
    std::optional<at::Generator> generator = std::nullopt) {
  return random_split(std::move(dataset), std::span<const T>(lengths), std::move(generator));
}

/// random_split with lengths (`{3, 7}`) or fractions (`{0.3, 0.7}`) written in place.
template <MapDataset D, class T>
requires(std::integral<T> || std::floating_point<T>) std::vector<Subset<D>> random_split(
    D dataset, std::initializer_list<T> lengths,
    std::optional<at::Generator> generator = std::nullopt) {
  return random_split(std::move(dataset), std::span<const T>(lengths.begin(), lengths.size()),
                      std::move(generator));
}

}  // namespace coload
