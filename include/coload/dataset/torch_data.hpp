#pragma once
// The torch::data adapter: a libtorch dataset (`get(size_t)`, `std::optional<size_t> size()`,
// as torch::data::datasets::Dataset declares them), or one mapped with `.map(transform)`,
// loaded by coload as it is.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/core/index.hpp"

namespace coload {

namespace detail {

/// torch::data's size(): an optional size_t (c10::optional in libtorch 1.x, std::optional in
/// 2.x), empty for an unsized dataset.
template <class D>
concept TorchDataSized = requires(const D& cd) {
  { cd.size().has_value() } -> std::convertible_to<bool>;
  { *cd.size() } -> std::convertible_to<std::size_t>;
};

/// torch::data's per-example access: Dataset::get(size_t).
template <class D>
concept TorchDataGet = requires(D& d, std::size_t i) { d.get(i); };

/// torch::data's batch access, whatever the request: BatchDataset::get_batch(BatchRequestType).
template <class D>
concept TorchDataGetBatch = requires(D& d, typename D::BatchRequestType request) {
  d.get_batch(std::move(request));
};

/// A batch request that is a list of indices (c10::ArrayRef<size_t>, what every stateless
/// torch::data dataset takes), not a stream's batch size (StreamDataset's size_t).
template <class D>
concept TorchDataIndexRequest =
    TorchDataGetBatch<D> && !std::is_arithmetic_v<typename D::BatchRequestType> &&
    std::constructible_from<typename D::BatchRequestType, const std::size_t*, std::size_t>;

/// A stateful torch::data dataset (ChunkDataset): get_batch returns an optional batch.
template <class D>
consteval bool torch_data_stateful() {
  if constexpr (requires { D::is_stateful; }) {
    return D::is_stateful;
  } else {
    return false;
  }
}

/// torch::data::datasets::MapDataset: a source dataset and the transform applied to it.
template <class D>
concept TorchDataMapped = requires(D& d) {
  typename D::DatasetType;
  typename D::TransformType;
  { d.dataset() } -> std::same_as<const typename D::DatasetType&>;
};

template <class T>
inline constexpr bool torch_data_is_vector_v = false;
template <class T, class A>
inline constexpr bool torch_data_is_vector_v<std::vector<T, A>> = true;

template <class D>
using torch_data_batch_t = std::remove_cvref_t<decltype(std::declval<D&>().get_batch(
    std::declval<typename D::BatchRequestType>()))>;

/// True when get_batch of D yields a vector of examples (D itself, or every transform mapped on
/// it, works example by example), so one example is the batch of one index.
template <class D>
consteval bool torch_data_batch_is_examples() {
  if constexpr (TorchDataIndexRequest<D>) {
    return torch_data_is_vector_v<torch_data_batch_t<D>>;
  } else {
    return false;
  }
}

/// True when one example of D can be had: from get(size_t), from a batch of one index, or,
/// under a batch transform (Stack<>), from the mapped dataset's source.
template <class D>
consteval bool torch_data_has_examples() {
  if constexpr (TorchDataGet<D> || torch_data_batch_is_examples<D>()) {
    return true;
  } else if constexpr (TorchDataMapped<D>) {
    return torch_data_has_examples<typename D::DatasetType>();
  } else {
    return false;
  }
}

/// Example `index` of a torch::data dataset, before any batch transform.
template <class D>
auto torch_data_example(D& dataset, std::size_t index) {
  if constexpr (TorchDataGet<D>) {
    return dataset.get(index);
  } else if constexpr (torch_data_batch_is_examples<D>()) {
    auto batch = dataset.get_batch(typename D::BatchRequestType(&index, 1));
    if (batch.size() != 1) {
      throw InvalidArgument("coload: a torch::data dataset's get_batch gave " +
                            std::to_string(batch.size()) + " examples for the one index " +
                            std::to_string(index));
    }
    return std::move(batch.front());
  } else {
    // NOTE: MapDataset::dataset() is a non-const member that returns a const reference; the
    // source is a member of a dataset the adapter owns (never const), so casting the const
    // away is defined, and needed: Dataset::get is a non-const virtual.
    return torch_data_example(const_cast<typename D::DatasetType&>(dataset.dataset()), index);
  }
}

}  // namespace detail

/// A dataset shaped as libtorch's torch::data datasets: a `size()` that returns an optional
/// size_t, and `get(size_t)` (torch::data::datasets::Dataset) or `get_batch(request)`
/// (BatchDataset, MapDataset: what `.map(transform)` makes), so it is not a MapDataset by
/// itself. Recognised by its members, not its base class, so this header needs no torch/data
/// include. Some of them cannot be loaded (TorchDataAdapter says which, when built).
template <class D>
concept TorchDataDataset =
    detail::TorchDataSized<D> && (detail::TorchDataGet<D> || detail::TorchDataGetBatch<D>);

/// A torch::data dataset as a coload map-style dataset: make_data_loader wraps one in this by
/// itself, so `make_data_loader(MyTorchDataset{...}, {.batch_size = 64})` and
/// `make_data_loader(MyTorchDataset{...}.map(Normalize<>(0.5, 0.5)), ...)` just work.
///
/// Samples: `get(size_t)` where the dataset has it; for a mapped dataset, the batch of one
/// index (its example transforms applied, as torch::data applies them). A batch transform
/// (`.map(Stack<>())`) is kept: with the default collate the loader takes whole batches from
/// the dataset's get_batch, as torch::data's loader does; a collate of the caller's gets the
/// examples from under the batch transform instead.
///
/// Not loadable, refused when built: stateful datasets (ChunkDataset), streams whose requests
/// are a batch size (StreamDataset), and datasets that yield only whole batches with no
/// example to take out of them.
///
/// The length is read once, at construction: a torch::data dataset whose size() is empty
/// (unknown) is refused with InvalidArgument. `get` and `get_batch` are called from worker
/// threads at once, as libtorch's own DataLoader calls them (its datasets are written for that).
template <TorchDataDataset D>
class TorchDataAdapter {
  static_assert(!detail::torch_data_stateful<D>(),
                "coload: `D` (named above, in TorchDataAdapter<D>) is a stateful torch::data "
                "dataset (its get_batch returns an optional batch, as ChunkDataset's): coload "
                "cannot sample indices from it; write it as an iterable dataset, with "
                "`stream(const WorkerInfo&)`");
  static_assert(detail::torch_data_stateful<D>() || detail::TorchDataGet<D> ||
                    detail::TorchDataIndexRequest<D>,
                "coload: `D` (named above, in TorchDataAdapter<D>) is a torch::data stream "
                "(its get_batch takes a batch size, not indices, as StreamDataset's): coload "
                "cannot sample indices from it; write it as an iterable dataset, with "
                "`stream(const WorkerInfo&)`");
  static_assert(detail::torch_data_stateful<D>() ||
                    !(detail::TorchDataGet<D> || detail::TorchDataIndexRequest<D>) ||
                    detail::torch_data_has_examples<D>(),
                "coload: `D` (named above, in TorchDataAdapter<D>) is a torch::data dataset "
                "that yields only whole batches, with no example to take from them: give it "
                "`get(size_t)`, or make it the `.map(...)` of a dataset that has one");

 public:
  using sample_type =
      std::remove_cvref_t<decltype(detail::torch_data_example(std::declval<D&>(), 0))>;

  explicit TorchDataAdapter(D dataset) : dataset_(std::move(dataset)) {
    const auto n = dataset_.size();
    if (!n.has_value()) {
      throw InvalidArgument(
          "coload: a torch::data dataset whose size() is empty cannot be loaded map-style: "
          "coload needs its length to sample indices");
    }
    size_ = static_cast<std::int64_t>(*n);
  }

  /// The length the dataset gave at construction.
  std::int64_t size() const noexcept { return size_; }
  /// Sample `index`: the dataset's get(size_t), or its batch of that one index.
  sample_type get(Index index) {
    return detail::torch_data_example(dataset_, static_cast<std::size_t>(index));
  }
  /// The batch of `indices` from the dataset's get_batch, its batch transform applied; only
  /// where it has one (its get_batch does not yield a vector of examples).
  auto get_batch(std::span<const Index> indices)
    requires(detail::TorchDataIndexRequest<D> && !detail::TorchDataGet<D> &&
             !detail::torch_data_batch_is_examples<D>())
  {
    std::vector<std::size_t> request(indices.begin(), indices.end());
    return dataset_.get_batch(typename D::BatchRequestType(request.data(), request.size()));
  }
  /// The torch::data dataset itself.
  D& dataset() noexcept { return dataset_; }
  const D& dataset() const noexcept { return dataset_; }

 private:
  D dataset_;
  std::int64_t size_ = 0;
};

}  // namespace coload
