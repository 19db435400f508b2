#pragma once
// Pin<T> and pin_batch(): a batch's tensors into page-locked memory, each copied at most once.

#include <ATen/core/Tensor.h>

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include "coload/device/pinned_pool.hpp"
#include "coload/device/tensor_map.hpp"

namespace coload {

class Pinner;

namespace detail {
/// A type with a member pin_memory() returning the pinned value (or void: pinned in place),
/// as PyTorch's pin-memory thread honours a batch's own pin_memory method.
template <class T>
concept HasPinMemory = !std::same_as<T, at::Tensor> && requires(T& v) {
  { v.pin_memory() };
} && (std::is_void_v<decltype(std::declval<T&>().pin_memory())> ||
      std::is_convertible_v<decltype(std::declval<T&>().pin_memory()), T>);
}  // namespace detail

/// How a T is pinned. The primary template calls a member `pin_memory()` when T has one, else
/// pins the tensors that TensorMap<T> reaches (numbers, strings and other types pass through).
/// Specialise it to pin a type your own way (a specialisation wins over `pin_memory()`):
///
///     template <> struct coload::Pin<MyBatch> {
///       static MyBatch pin(MyBatch b, coload::Pinner& p) { b.x = p(std::move(b.x)); return b; }
///     };
template <class T, class Enable = void>
struct Pin {
  static T pin(T value, Pinner& pinner);
};

/// Pins one batch: the recursion through Pin<T> and the tensors' leaf. Foreign tensors of one
/// batch share one BatchLease.
class Pinner {
 public:
  explicit Pinner(PinnedPool& pool) noexcept : pool_(pool) {}
  Pinner(const Pinner&) = delete;
  Pinner& operator=(const Pinner&) = delete;

  /// `value` pinned through Pin<U>.
  template <class U>
  U operator()(U value) {
    return Pin<U>::pin(std::move(value), *this);
  }
  /// A CPU tensor in page-locked memory: `t` itself when its data already is (this pool's
  /// slabs, or memory the backend pinned or registered), else a contiguous copy in the pool
  /// (counted in PinnedPoolStats::foreign_pins). Undefined and non-CPU tensors pass through.
  at::Tensor tensor(at::Tensor t);

  PinnedPool& pool() noexcept { return pool_; }

 private:
  PinnedPool& pool_;
  std::unique_ptr<BatchLease> lease_;
};

template <class T, class Enable>
T Pin<T, Enable>::pin(T value, Pinner& pinner) {
  if constexpr (detail::HasPinMemory<T>) {
    if constexpr (std::is_void_v<decltype(value.pin_memory())>) {
      value.pin_memory();
      return value;
    } else {
      return static_cast<T>(value.pin_memory());
    }
  } else {
    return TensorMap<T>::map(std::move(value), pinner);
  }
}

template <>
struct Pin<at::Tensor> {
  static at::Tensor pin(at::Tensor t, Pinner& pinner) { return pinner.tensor(std::move(t)); }
};

/// `batch` with every tensor in page-locked memory from `pool`: tensors already there (collated
/// into a BatchLease, or in memory the backend pinned or registered) pass through, others are
/// copied once. Types with `pin_memory()` or a Pin<T> specialisation are pinned through them.
template <class B>
B pin_batch(B batch, PinnedPool& pool) {
  Pinner pinner(pool);
  return pinner(std::move(batch));
}

}  // namespace coload
