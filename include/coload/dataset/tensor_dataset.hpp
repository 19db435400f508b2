#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "coload/sampler/sampler.hpp"

namespace coload {

/// Samples are rows of one or more tensors of equal first dimension, as
/// torch.utils.data.TensorDataset. A sample is the vector of each tensor's row `index`.
class TensorDataset {
 public:
  /// Refuses tensors whose first dimensions differ ("Size mismatch between tensors").
  explicit TensorDataset(std::vector<at::Tensor> tensors);
  TensorDataset(std::initializer_list<at::Tensor> tensors)
      : TensorDataset(std::vector<at::Tensor>(tensors)) {}

  /// The number of samples.
  std::int64_t size() const noexcept { return size_; }
  /// Row `index` of each tensor (negative indices count from the end).
  std::vector<at::Tensor> get(Index index) const;
  /// Rows `indices` of each tensor, gathered with one index_select per tensor: already the
  /// batch that default_collate would build from the samples.
  std::vector<at::Tensor> get_batch(std::span<const Index> indices) const;
  /// The tensors, in the order given.
  const std::vector<at::Tensor>& tensors() const noexcept { return tensors_; }

 private:
  std::vector<at::Tensor> tensors_;
  std::int64_t size_ = 0;
  bool requires_grad_ = false;
};

}  // namespace coload
