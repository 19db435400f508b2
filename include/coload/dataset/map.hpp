#pragma once
// map: a dataset whose samples are another dataset's, transformed; the transform may take the
// SampleContext so that its randomness comes from the per-sample stream.

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>

#include "coload/coro/task.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/sampler/sampler.hpp"

namespace coload {

/// A transform of D's samples: callable with (sample, SampleContext&) or with the sample alone.
template <class F, class D>
concept SampleTransform = MapDataset<D> &&
    (std::invocable<F&, sample_t<D>&&, SampleContext&> || std::invocable<F&, sample_t<D>&&>);

/// The samples of D, each passed through a transform F: what `map(dataset, transform)` returns.
///
/// `get(index, ctx)` fetches the sample with the same context and returns
/// `transform(sample, ctx)`, or `transform(sample)` when the transform takes no context. Draw
/// augmentation randomness from `ctx.rng` and it depends only on (seed, epoch, index). The
/// transform is called from several workers at once when the loader has several.
template <MapDataset D, class F>
requires SampleTransform<F, D>
class MappedDataset {
 public:
  /// Takes the dataset and the transform (both moved in).
  MappedDataset(D dataset, F transform)
      : dataset_(std::move(dataset)), transform_(std::move(transform)) {}

  /// The number of samples (the dataset's).
  std::int64_t size() const { return static_cast<std::int64_t>(dataset_.size()); }
  /// The transform of the dataset's sample `index` (returned by value).
  auto get(Index index, SampleContext& ctx) requires(PlainGet<D> || ContextualGet<D>) {
    if constexpr (std::invocable<F&, sample_t<D>&&, SampleContext&>) {
      return std::invoke(transform_, get_sample(dataset_, index, ctx), ctx);
    } else {
      return std::invoke(transform_, get_sample(dataset_, index, ctx));
    }
  }

  /// The transform of the dataset's asynchronous sample `index`: the dataset's get_async, then
  /// the transform, on a worker (CPU work).
  auto get_async(Index index, SampleContext& ctx) requires AsyncGet<D> {
    return transform_async<D>(index, ctx);
  }

  /// The underlying dataset.
  D& dataset() noexcept { return dataset_; }
  /// The underlying dataset.
  const D& dataset() const noexcept { return dataset_; }
  /// The transform.
  F& transform() noexcept { return transform_; }

 private:
  // (Templates, so that these are only formed for datasets that have get_async.)
  template <class DD>
  using async_sample_t = typename detail::TaskValue<std::remove_cvref_t<decltype(
      std::declval<DD&>().get_async(Index{}, std::declval<SampleContext&>()))>>::type;
  template <class S>
  static auto apply(F& f, S&& s, SampleContext& ctx) {
    if constexpr (std::invocable<F&, S&&, SampleContext&>) {
      return std::invoke(f, std::move(s), ctx);
    } else {
      return std::invoke(f, std::move(s));
    }
  }
  template <class DD>
  auto transform_async(Index index, SampleContext& ctx)
      -> Task<decltype(apply(std::declval<F&>(), std::declval<async_sample_t<DD>&&>(),
                             std::declval<SampleContext&>()))> {
    async_sample_t<DD> sample = co_await dataset_.get_async(index, ctx);
    co_await ctx.cpu();
    co_return apply(transform_, std::move(sample), ctx);
  }

  D dataset_;
  F transform_;
};

/// `dataset` with `transform` applied to each sample; see MappedDataset.
template <class D, class F>
requires MapDataset<std::remove_cvref_t<D>> &&
    SampleTransform<std::decay_t<F>, std::remove_cvref_t<D>>
        MappedDataset<std::remove_cvref_t<D>, std::decay_t<F>> map(D&& dataset, F&& transform) {
  return MappedDataset<std::remove_cvref_t<D>, std::decay_t<F>>(std::forward<D>(dataset),
                                                                std::forward<F>(transform));
}

}  // namespace coload
