#pragma once
// What the samplers in lib/sampler share: int64 tensor options, and a span over a tensor.

#include <ATen/ATen.h>

#include <cstddef>
#include <span>

#include "coload/core/index.hpp"

namespace coload::detail {

inline const at::TensorOptions long_options = at::TensorOptions().dtype(at::kLong);

/// The span over a contiguous int64 tensor's elements.
inline std::span<const Index> span_of(const at::Tensor& t) {
  return {t.data_ptr<Index>(), static_cast<std::size_t>(t.numel())};
}

}  // namespace coload::detail
