#pragma once
// Subset: a view of a dataset through a list of indices, as torch.utils.data.Subset.

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/coro/task.hpp"
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
    if (!dataset_) throw InvalidArgument("Subset needs a dataset, got a null pointer");
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
  /// The dataset's get_async for sample `indices()[index]`, given the context.
  auto get_async(Index index, SampleContext& ctx) requires AsyncGet<D> {
    return dataset_->get_async(resolve(index), ctx);
  }
  /// The dataset's get_batch_async at the mapped indices: the dataset sees its own indices,
  /// in its batch context too (as PyTorch's Subset.__getitems__ hands them on), while each
  /// sample's Rng stays that of its index in the subset (BatchContext::loader_indices), as in
  /// get(index, ctx).
  auto get_batch_async(std::span<const Index> indices, BatchContext& ctx)
    requires AsyncBatchedDataset<D>
  {
    std::vector<Index> mapped;
    mapped.reserve(indices.size());
    for (Index i : indices) mapped.push_back(resolve(i));
    return forward_batch(dataset_, std::move(mapped), ctx);
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
      throw OutOfRange("Subset index " + std::to_string(index) +
                       " is out of range for a subset of size " + std::to_string(n));
    }
    return indices_[static_cast<std::size_t>(index < 0 ? index + n : index)];
  }

  // NOTE: a coroutine of its own so that the mapped indices (and the context that points at
  // them) live in its frame while the dataset's task runs.
  // (A template, so that its return type is only formed for datasets that have
  // get_batch_async.)
  template <class DD>
  static auto forward_batch(std::shared_ptr<DD> dataset, std::vector<Index> mapped,
                            BatchContext& outer)
      -> Task<typename detail::TaskValue<std::remove_cvref_t<decltype(std::declval<DD&>()
                 .get_batch_async(std::declval<std::span<const Index>>(),
                                  std::declval<BatchContext&>()))>>::type> {
    BatchContext ctx = outer;
    if (ctx.loader_indices.empty()) ctx.loader_indices = outer.indices;  // outermost wins
    ctx.indices = mapped;
    co_return co_await dataset->get_batch_async(std::span<const Index>(mapped), ctx);
  }

  std::shared_ptr<D> dataset_;
  std::vector<Index> indices_;
};

}  // namespace coload
