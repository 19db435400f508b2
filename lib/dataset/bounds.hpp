#pragma once
// The index check of the datasets' get_batch: index_select's own error names no index.

#include <cstdint>
#include <span>

#include "coload/core/index.hpp"

namespace coload::detail {

/// Throws SampleError naming the first of `indices` outside [-size, size), in PyTorch's words
/// ("index 12 is out of bounds for dimension 0 with size 10").
void check_batch_indices(std::span<const Index> indices, std::int64_t size);

}  // namespace coload::detail
