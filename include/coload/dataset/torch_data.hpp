#pragma once
// The torch::data adapter: a libtorch dataset (`get(size_t)`, `std::optional<size_t> size()`,
// as torch::data::datasets::Dataset declares them) loaded by coload as it is.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/core/index.hpp"

namespace coload {

/// A dataset shaped as libtorch's torch::data::datasets::Dataset: `get(size_t)` and a
/// `size()` that returns an optional size_t (c10::optional in libtorch 1.x, std::optional in
/// 2.x), so it is not a MapDataset by itself. Recognised by its members, not its base class,
/// so this header needs no torch/data include.
template <class D>
concept TorchDataDataset = requires(D& d, const D& cd, std::size_t i) {
  d.get(i);
  { cd.size().has_value() } -> std::convertible_to<bool>;
  { *cd.size() } -> std::convertible_to<std::size_t>;
};

/// A torch::data dataset as a coload map-style dataset: make_data_loader wraps one in this by
/// itself, so `make_data_loader(MyTorchDataset{...}, {.batch_size = 64})` just works.
///
/// The length is read once, at construction: a torch::data dataset whose size() is empty
/// (unknown) is refused with InvalidArgument. `get` is called from worker threads at once, as
/// libtorch's own DataLoader calls it (its datasets are written for that).
template <TorchDataDataset D>
class TorchDataAdapter {
 public:
  using sample_type = std::remove_cvref_t<decltype(std::declval<D&>().get(std::size_t{}))>;

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
  /// Sample `index`, from the dataset's get(size_t).
  sample_type get(Index index) { return dataset_.get(static_cast<std::size_t>(index)); }
  /// The torch::data dataset itself.
  D& dataset() noexcept { return dataset_; }
  const D& dataset() const noexcept { return dataset_; }

 private:
  D dataset_;
  std::int64_t size_ = 0;
};

}  // namespace coload
