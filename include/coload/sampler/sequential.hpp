#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "coload/coro/generator.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// Yields 0, 1, ..., size - 1, as torch.utils.data.SequentialSampler.
class SequentialSampler {
 public:
  explicit SequentialSampler(std::int64_t size) : size_(size) {}

  /// The indices of one epoch, in order.
  Generator<Index> indices() const {
    for (Index i = 0; i < size_; ++i) co_yield i;
  }
  /// The same indices in blocks of up to 4096.
  Generator<std::span<const Index>> index_blocks() const {
    std::vector<Index> block;
    for (Index start = 0; start < size_; start += 4096) {
      block.resize(static_cast<std::size_t>(std::min<Index>(4096, size_ - start)));
      std::iota(block.begin(), block.end(), start);
      co_yield std::span<const Index>(block);
    }
  }
  std::int64_t size() const noexcept { return size_; }

 private:
  std::int64_t size_;
};

}  // namespace coload
