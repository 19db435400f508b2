#pragma once
// What a sampler is: any type whose indices() yields the indices of one epoch.

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/core/index.hpp"
#include "coload/coro/async_generator.hpp"
#include "coload/coro/generator.hpp"

namespace coload {

namespace detail {
template <class G, class T>
inline constexpr bool is_generator_of =
    std::same_as<G, Generator<T>> || std::same_as<G, AsyncGenerator<T>>;
template <class G>
inline constexpr bool is_async_generator = false;
template <class T>
inline constexpr bool is_async_generator<AsyncGenerator<T>> = true;
}  // namespace detail

/// A sampler: `indices()` returns a Generator<Index> or AsyncGenerator<Index> for one epoch.
template <class S>
concept IndexSampler = requires(S& s) {
  requires detail::is_generator_of<decltype(s.indices()), Index>;
};

/// A sampler that can also hand out its indices in contiguous blocks through
/// `index_blocks()` (a Generator<std::span<const Index>>), which BatchSampler slices instead
/// of taking one index at a time. The blocks hold exactly the indices of `indices()`.
template <class S>
concept BlockSampler = IndexSampler<S> && requires(S& s) {
  { s.index_blocks() } -> std::same_as<Generator<std::span<const Index>>>;
};

/// A batch sampler: `batches()` yields one std::vector<Index> per batch, sync or async.
template <class S>
concept BatchIndexSampler = requires(S& s) {
  requires detail::is_generator_of<decltype(s.batches()), std::vector<Index>>;
};

/// A sampler or batch sampler that knows its length, as `len(sampler)` in PyTorch.
template <class S>
concept SizedSampler = requires(const S& s) {
  { s.size() } -> std::convertible_to<std::int64_t>;
};

/// A sampler whose size() may be unknown: it returns a std::optional, as AnySampler's does and
/// torch::data's samplers do. Empty means "no length", as a Python sampler without __len__.
template <class S>
concept MaybeSizedSampler = !SizedSampler<S> && requires(const S& s) {
  { s.size() } -> std::convertible_to<std::optional<std::int64_t>>;
};

namespace detail {
/// The length of a sampler or batch sampler if it has one: its size(), the value of an
/// optional size(), or nothing for a sampler without size().
template <class S>
std::optional<std::int64_t> sampler_size(const S& s) {
  if constexpr (SizedSampler<S>) {
    return static_cast<std::int64_t>(s.size());
  } else if constexpr (MaybeSizedSampler<S>) {
    return std::optional<std::int64_t>(s.size());
  } else {
    return std::nullopt;
  }
}
}  // namespace detail

namespace detail {

template <class S>
S& deref(S& s) {
  return s;
}
template <class S>
S& deref(std::shared_ptr<S>& s) {
  return *s;
}
template <class S>
struct pointee {
  using type = S;
};
template <class S>
struct pointee<std::shared_ptr<S>> {
  using type = S;
};

/// Adapts a synchronous generator to the asynchronous interface the loader consumes.
template <class T>
AsyncGenerator<T> as_async(Generator<T> gen) {
  for (auto& value : gen) co_yield value;
}
template <class T>
AsyncGenerator<T> as_async(AsyncGenerator<T> gen) {
  return gen;
}

/// Type erasure shared by AnySampler and AnyBatchSampler.
template <class T>
class AnyYielder {
 public:
  AnyYielder() = default;

  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }
  std::optional<std::int64_t> size() const { return impl_ ? impl_->size() : std::nullopt; }
  /// Tells the sampler which epoch starts, if it has set_epoch (as DistributedSampler); the
  /// DataLoader calls it at the start of every epoch with its own epoch count.
  void set_epoch(std::int64_t epoch) {
    if (impl_) impl_->set_epoch(epoch);
  }

 protected:
  struct Concept {
    virtual ~Concept() = default;
    virtual AsyncGenerator<T> next_epoch() = 0;
    virtual std::optional<std::int64_t> size() const = 0;
    virtual void set_epoch(std::int64_t epoch) = 0;
  };
  template <class Holder, class Call>
  struct Model final : Concept {
    Holder held;
    explicit Model(Holder h) : held(std::move(h)) {}
    AsyncGenerator<T> next_epoch() override { return as_async(Call{}(deref(held))); }
    void set_epoch(std::int64_t epoch) override {
      if constexpr (requires { deref(held).set_epoch(epoch); }) deref(held).set_epoch(epoch);
    }
    std::optional<std::int64_t> size() const override {
      return sampler_size(deref(const_cast<Holder&>(held)));
    }
  };
  std::shared_ptr<Concept> impl_;
};

struct CallIndices {
  template <class S>
  auto operator()(S& s) const {
    return s.indices();
  }
};
struct CallBatches {
  template <class S>
  auto operator()(S& s) const {
    return s.batches();
  }
};

}  // namespace detail

/// Any sampler, type-erased: what LoaderOptions::sampler holds.
///
/// Built from a sampler by value (copied in) or from a std::shared_ptr to one (shared, so
/// the caller can still reach it, for example to call set_epoch).
class AnySampler : public detail::AnyYielder<Index> {
 public:
  AnySampler() = default;
  template <class S>
    requires IndexSampler<typename detail::pointee<std::remove_cvref_t<S>>::type> &&
             (!std::same_as<std::remove_cvref_t<S>, AnySampler>)
  AnySampler(S&& sampler) {  // NOLINT: implicit by design, as options are aggregates
    using Holder = std::remove_cvref_t<S>;
    impl_ = std::make_shared<Model<Holder, detail::CallIndices>>(std::forward<S>(sampler));
  }
  /// The indices of the next epoch.
  AsyncGenerator<Index> indices() { return impl_->next_epoch(); }
};

/// Any batch sampler, type-erased: what LoaderOptions::batch_sampler holds.
class AnyBatchSampler : public detail::AnyYielder<std::vector<Index>> {
 public:
  AnyBatchSampler() = default;
  template <class S>
    requires BatchIndexSampler<typename detail::pointee<std::remove_cvref_t<S>>::type> &&
             (!std::same_as<std::remove_cvref_t<S>, AnyBatchSampler>)
  AnyBatchSampler(S&& sampler) {  // NOLINT: implicit by design, as options are aggregates
    using Holder = std::remove_cvref_t<S>;
    impl_ = std::make_shared<Model<Holder, detail::CallBatches>>(std::forward<S>(sampler));
  }
  /// The index lists of the next epoch.
  AsyncGenerator<std::vector<Index>> batches() { return impl_->next_epoch(); }
};

}  // namespace coload
