#pragma once

#include <cstdint>

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
  std::int64_t size() const noexcept { return size_; }

 private:
  std::int64_t size_;
};

}  // namespace coload
