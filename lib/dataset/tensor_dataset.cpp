// TensorDataset: rows of tensors that share their first dimension.

#include "coload/dataset/tensor_dataset.hpp"

#include <ATen/ATen.h>

#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <optional>
#include <string>

#include "bounds.hpp"
#include "coload/core/error.hpp"
#include "coload/dataset/sample_context.hpp"

namespace coload {

TensorDataset::TensorDataset(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  if (tensors_.empty()) throw InvalidArgument("TensorDataset needs at least one tensor");
  for (const auto& t : tensors_) {
    if (!t.defined() || t.dim() == 0) {
      throw InvalidArgument("TensorDataset: every tensor needs a first dimension");
    }
  }
  size_ = tensors_.front().size(0);
  for (const auto& t : tensors_) requires_grad_ = requires_grad_ || t.requires_grad();
  for (std::size_t i = 1; i < tensors_.size(); ++i) {
    if (tensors_[i].size(0) != size_) {
      throw InvalidArgument("Size mismatch between tensors: tensor 0 has " + std::to_string(size_) +
                            " rows, tensor " + std::to_string(i) + " has " +
                            std::to_string(tensors_[i].size(0)));
    }
  }
}

std::vector<at::Tensor> TensorDataset::get(Index index) const {
  // NOTE: rows are views that collate copies out of. When no tensor needs gradients, making
  // them below the autograd and view-tracking layers halves the cost of each select.
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!requires_grad_) below_autograd.emplace();
  std::vector<at::Tensor> sample;
  sample.reserve(tensors_.size());
  for (const auto& t : tensors_) sample.push_back(t.select(0, index));
  return sample;
}

std::vector<at::Tensor> TensorDataset::get_batch(std::span<const Index> indices) const {
  detail::check_batch_indices(indices, size_);
  // NOTE: from_blob borrows the caller's indices; index_select copies out before we return.
  at::Tensor idx = at::from_blob(const_cast<Index*>(indices.data()),
                                 {static_cast<std::int64_t>(indices.size())}, at::kLong);
  // index_select refuses negative indices; get() counts them from the end, so wrap them here.
  if (std::any_of(indices.begin(), indices.end(), [](Index i) { return i < 0; })) {
    idx = at::where(idx < 0, idx + size_, idx);
  }
  std::vector<at::Tensor> batch;
  batch.reserve(tensors_.size());
  for (const auto& t : tensors_) batch.push_back(t.index_select(0, idx));
  return batch;
}

void detail::check_batch_indices(std::span<const Index> indices, std::int64_t size) {
  for (const Index i : indices) {
    if (i < -size || i >= size) {
      throw SampleError(i, "index " + std::to_string(i) +
                               " is out of bounds for dimension 0 with size " +
                               std::to_string(size));
    }
  }
}

}  // namespace coload
