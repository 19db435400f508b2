#pragma once
// Iterable datasets: `stream(const WorkerInfo&)` yields the samples, as torch.utils.data's
// IterableDataset; ChainDataset and `a + b` chain them.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "coload/core/worker_info.hpp"
#include "coload/coro/async_generator.hpp"
#include "coload/coro/generator.hpp"

namespace coload {

namespace detail {
template <class G>
struct StreamTraits {
  static constexpr bool valid = false;
};
template <class T>
struct StreamTraits<Generator<T>> {
  static constexpr bool valid = true;
  static constexpr bool async = false;
  using value_type = std::remove_cvref_t<T>;
};
template <class T>
struct StreamTraits<AsyncGenerator<T>> {
  static constexpr bool valid = true;
  static constexpr bool async = true;
  using value_type = std::remove_cvref_t<T>;
};

template <class D>
concept HasSize = requires(const D& d) { d.size(); };

template <class D>
using stream_result_t =
    std::remove_cvref_t<decltype(std::declval<D&>().stream(std::declval<const WorkerInfo&>()))>;
}  // namespace detail

/// An iterable dataset: `stream(const WorkerInfo&)` returns a Generator or an AsyncGenerator of
/// samples, as IterableDataset.__iter__.
///
/// The loader calls `stream` once per worker and epoch, with that worker's WorkerInfo, so a
/// dataset shards itself with `info.id` and `info.num_workers` (as PyTorch users do with
/// get_worker_info()). Without workers it gets `{.id = 0, .num_workers = 1}`.
template <class D>
concept IterableDataset = requires(D& d, const WorkerInfo& info) { d.stream(info); } &&
                          detail::StreamTraits<detail::stream_result_t<D>>::valid;

/// An iterable dataset that can say where its stream stands (`state()`, any text) and continue
/// from there (`load_state(text)`: the next `stream()` resumes where that state was taken), so
/// a loader resumes it without re-reading what was delivered.
template <class D>
concept ResumableStream = requires(const D& d, D& m, const std::string& s) {
  { d.state() } -> std::convertible_to<std::string>;
  m.load_state(s);
};

/// The generator type that `D::stream` returns.
template <IterableDataset D>
using stream_t = detail::stream_result_t<D>;

/// The type of one sample of iterable dataset D.
template <IterableDataset D>
using stream_sample_t = typename detail::StreamTraits<stream_t<D>>::value_type;

/// True when D's stream is an AsyncGenerator (it may co_await between samples).
template <IterableDataset D>
inline constexpr bool async_stream_v = detail::StreamTraits<stream_t<D>>::async;

/// Iterable datasets one after another, as torch.utils.data.ChainDataset: the stream yields
/// every sample of the first dataset's stream, then the second's, and so on. The datasets may
/// be of different types but must yield the same sample type; the chain is asynchronous when
/// any of them is. `size()` exists when every dataset has one, and is their sum.
template <IterableDataset... Ds>
  requires(sizeof...(Ds) > 0)
class ChainDataset {
  using First = std::tuple_element_t<0, std::tuple<Ds...>>;

 public:
  using sample_type = stream_sample_t<First>;
  static_assert((std::same_as<stream_sample_t<Ds>, sample_type> && ...),
                "ChainDataset: every dataset must yield the same sample type");
  static constexpr bool is_async = (async_stream_v<Ds> || ...);
  using stream_type =
      std::conditional_t<is_async, AsyncGenerator<sample_type>, Generator<sample_type>>;

  explicit ChainDataset(Ds... datasets) : datasets_(std::move(datasets)...) {}

  /// Every dataset's stream in turn, each given the same worker info.
  stream_type stream(const WorkerInfo& info) {
    return chain(this, parts(std::index_sequence_for<Ds...>{}), info);
  }

  /// The sum of the datasets' sizes.
  std::int64_t size() const
    requires(detail::HasSize<Ds> && ...)
  {
    return std::apply(
        [](const auto&... d) { return (static_cast<std::int64_t>(d.size()) + ...); },
        datasets_);
  }

  /// The datasets, in order.
  std::tuple<Ds...>& datasets() noexcept { return datasets_; }
  const std::tuple<Ds...>& datasets() const noexcept { return datasets_; }

 private:
  using Part = stream_type (*)(ChainDataset*, const WorkerInfo&);

  template <std::size_t I>
  static stream_type part(ChainDataset* self, const WorkerInfo& info) {
    auto inner = std::get<I>(self->datasets_).stream(info);
    if constexpr (detail::StreamTraits<decltype(inner)>::async) {
      while (auto* sample = co_await inner.next()) co_yield std::move(*sample);
    } else {
      for (auto&& sample : inner) co_yield std::move(sample);
    }
  }

  template <std::size_t... Is>
  static std::array<Part, sizeof...(Is)> parts(std::index_sequence<Is...>) {
    return std::array<Part, sizeof...(Is)>{&ChainDataset::part<Is>...};
  }

  // NOTE: the list of parts is built outside the coroutine body (GCC 12 cannot compile braced
  // lists inside one), and `info` is copied into the frame: the caller's may not outlive it.
  static stream_type chain(ChainDataset* self, std::array<Part, sizeof...(Ds)> list,
                           WorkerInfo info) {
    for (Part p : list) {
      auto inner = p(self, info);
      if constexpr (is_async) {
        while (auto* sample = co_await inner.next()) co_yield std::move(*sample);
      } else {
        for (auto&& sample : inner) co_yield std::move(sample);
      }
    }
  }

  std::tuple<Ds...> datasets_;
};

template <class... Ds>
ChainDataset(Ds...) -> ChainDataset<Ds...>;

namespace detail {
template <class T>
struct IsChain : std::false_type {};
template <class... Ds>
struct IsChain<ChainDataset<Ds...>> : std::true_type {};
}  // namespace detail

/// `a + b` on two iterable datasets: their ChainDataset, as IterableDataset.__add__.
template <IterableDataset A, IterableDataset B>
  requires(!detail::IsChain<A>::value && !detail::IsChain<B>::value)
ChainDataset<A, B> operator+(A a, B b) {
  return ChainDataset<A, B>(std::move(a), std::move(b));
}

/// `(a + b) + c`: the same samples as PyTorch's nested ChainDataset, kept flat.
template <class... As, IterableDataset B>
  requires(!detail::IsChain<B>::value)
ChainDataset<As..., B> operator+(ChainDataset<As...> a, B b) {
  return std::apply(
      [&b](As&... parts) { return ChainDataset<As..., B>(std::move(parts)..., std::move(b)); },
      a.datasets());
}

/// `a + (b + c)`: the same samples as PyTorch's nested ChainDataset, kept flat.
template <IterableDataset A, class... Bs>
  requires(!detail::IsChain<A>::value)
ChainDataset<A, Bs...> operator+(A a, ChainDataset<Bs...> b) {
  return std::apply(
      [&a](Bs&... parts) { return ChainDataset<A, Bs...>(std::move(a), std::move(parts)...); },
      b.datasets());
}

/// `(a + b) + (c + d)`: the same samples as PyTorch's nested ChainDataset, kept flat.
template <class... As, class... Bs>
ChainDataset<As..., Bs...> operator+(ChainDataset<As...> a, ChainDataset<Bs...> b) {
  return std::apply(
      [&b](As&... left) {
        return std::apply(
            [&left...](Bs&... right) {
              return ChainDataset<As..., Bs...>(std::move(left)..., std::move(right)...);
            },
            b.datasets());
      },
      a.datasets());
}

}  // namespace coload
