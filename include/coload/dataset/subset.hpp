#pragma once
// Subset: a view of a dataset through a list of indices, as torch.utils.data.Subset.

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// The samples of `dataset` at `indices`, as torch.utils.data.Subset: sample `i` of the subset
/// is sample `indices[i]` of the dataset.
///
/// The dataset is shared (several subsets of one dataset, as random_split makes, hold the same
/// object, as in Python). `get(index, ctx)` passes the loader's context through unchanged, so a
/// sample's random stream is that of its index in the subset.
template <MapDataset D>
class Subset {
 public:
  /// Takes `dataset` (moved in) and the indices into it.
  Subset(D dataset, std::vector<Index> indices)
      : Subset(std::make_shared<D>(std::move(dataset)), std::move(indices)) {}
  /// Shares `dataset` with whoever else holds it.
  Subset(std::shared_ptr<D> dataset, std::vector<Index> indices)
      : dataset_(std::move(dataset)), indices_(std::move(indices)) {
    if (!dataset_) throw std::invalid_argument("Subset needs a dataset, got a null pointer");
  }

  /// The number of indices.
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(indices_.size()); }
  /// Sample `indices()[index]` of the dataset (negative indices count from the end).
  decltype(auto) get(Index index) requires PlainGet<D> { return dataset_->get(resolve(index)); }
  /// Sample `indices()[index]` of the dataset, given the context (negative indices count from
  /// the end).
  decltype(auto) get(Index index, SampleContext& ctx) requires ContextualGet<D> {
    return dataset_->get(resolve(index), ctx);
  }
  /// The dataset's get_batch at the mapped indices (as PyTorch's Subset.__getitems__).
  decltype(auto) get_batch(std::span<const Index> indices) requires BatchedDataset<D> {
    std::vector<Index> mapped;
    mapped.reserve(indices.size());
    for (Index i : indices) mapped.push_back(resolve(i));
    return dataset_->get_batch(std::span<const Index>(mapped));
  }

  /// The indices into the dataset, in order.
  const std::vector<Index>& indices() const noexcept { return indices_; }
  /// The whole dataset.
  D& dataset() noexcept { return *dataset_; }
  /// The whole dataset.
  const D& dataset() const noexcept { return *dataset_; }
  /// The shared pointer to the whole dataset.
  const std::shared_ptr<D>& dataset_ptr() const noexcept { return dataset_; }

 private:
  Index resolve(Index index) const {
    const std::int64_t n = size();
    if (index < -n || index >= n) {
      throw std::out_of_range("Subset index " + std::to_string(index) +
                              " is out of range for a subset of size " + std::to_string(n));
    }
    return indices_[static_cast<std::size_t>(index < 0 ? index + n : index)];
  }

  std::shared_ptr<D> dataset_;
  std::vector<Index> indices_;
};

}  // namespace coload
