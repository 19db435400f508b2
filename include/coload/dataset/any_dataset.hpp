#pragma once
// AnyDataset<Sample>: any map-style dataset of one sample type, behind one type.

#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"

namespace coload {

/// A map-style dataset of samples of type S, whatever its own type: what lets datasets of
/// different types be concatenated (`a + b`), as Python concatenates any two datasets.
///
/// Copies share the dataset they hold (as Python's references do). Each `get` is one virtual
/// call; a `get_batch` of the held dataset is not used through it.
template <class S>
class AnyDataset {
 public:
  using sample_type = S;

  /// Holds `dataset` (moved in).
  template <MapDataset D>
    requires(!std::same_as<std::remove_cvref_t<D>, AnyDataset> && std::same_as<sample_t<D>, S> &&
             (ContextualGet<D> || PlainGet<D>))
  AnyDataset(D dataset)  // NOLINT(google-explicit-constructor): a dataset is an AnyDataset
      : impl_(std::make_shared<Model<D>>(std::move(dataset))) {}

  std::int64_t size() const { return impl_->size(); }
  S get(Index index, SampleContext& ctx) { return impl_->get(index, ctx); }

  /// The dataset held, if it is a D; nullptr otherwise.
  template <class D>
  D* target() noexcept {
    auto* model = dynamic_cast<Model<D>*>(impl_.get());
    return model ? &model->dataset : nullptr;
  }

 private:
  struct Interface {
    virtual ~Interface() = default;
    virtual std::int64_t size() const = 0;
    virtual S get(Index index, SampleContext& ctx) = 0;
  };
  template <class D>
  struct Model final : Interface {
    explicit Model(D d) : dataset(std::move(d)) {}
    std::int64_t size() const override { return static_cast<std::int64_t>(dataset.size()); }
    S get(Index index, SampleContext& ctx) override { return get_sample(dataset, index, ctx); }
    D dataset;
  };
  std::shared_ptr<Interface> impl_;
};

}  // namespace coload
