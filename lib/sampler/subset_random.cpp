// SubsetRandomSampler: PyTorch 1.13's algorithm over ATen's randperm (same seed, same indices).

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/sampler/subset_random.hpp"
#include "tensor_span.hpp"

namespace coload {

using detail::long_options;
using detail::span_of;

SubsetRandomSampler::SubsetRandomSampler(std::vector<Index> indices,
                                         std::optional<at::Generator> generator)
    : indices_(std::move(indices)), generator_(std::move(generator)) {}

Generator<Index> SubsetRandomSampler::indices() {
  for (std::span<const Index> block : index_blocks()) {
    for (Index i : block) co_yield i;
  }
}

Generator<std::span<const Index>> SubsetRandomSampler::index_blocks() {
  const auto n = static_cast<std::int64_t>(indices_.size());
  // Drawn even for an empty subset, as PyTorch does, so the stream stays in step.
  const auto perm = generator_ ? at::randperm(n, *generator_, long_options)
                               : at::randperm(n, long_options);
  std::vector<Index> block(indices_.size());
  const Index* order = perm.data_ptr<Index>();
  for (std::size_t k = 0; k < block.size(); ++k) {
    block[k] = indices_[static_cast<std::size_t>(order[k])];
  }
  if (!block.empty()) co_yield std::span<const Index>(block);
}

}  // namespace coload
