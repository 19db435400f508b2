#pragma once
// TensorMap<T>: the traversal of a batch's tensors, shared by pinning (Pin<T>) and the device
// stage (each tensor mapped to its device copy).

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace coload {

/// How to reach the tensors inside a T, keeping its shape. Specialise it for a batch type of
/// your own (the containers below are done):
///
///     template <> struct coload::TensorMap<MyBatch> {
///       template <class M> static MyBatch map(MyBatch b, M& m) {
///         b.images = m(std::move(b.images)); b.labels = m(std::move(b.labels)); return b;
///       }
///       template <class V> static void visit(const MyBatch& b, V& v) { v(b.images); v(b.labels); }
///     };
///
/// `m(x)` maps a member (of any type, recursively through its own TensorMap) and returns the
/// mapped value; `v(x)` visits one. `map` and `visit` must reach the tensors in the same order.
/// The primary template holds no tensor: numbers, strings and other types pass through.
template <class T, class Enable = void>
struct TensorMap {
  template <class M>
  static T map(T value, M&) {
    return value;
  }
  template <class V>
  static void visit(const T&, V&) {}
};

template <>
struct TensorMap<at::Tensor> {
  template <class M>
  static at::Tensor map(at::Tensor t, M& m) {
    return m.tensor(std::move(t));
  }
  template <class V>
  static void visit(const at::Tensor& t, V& v) {
    v.tensor(t);
  }
};

template <class T, class A>
  requires(!std::is_same_v<T, bool>)
struct TensorMap<std::vector<T, A>> {
  template <class M>
  static std::vector<T, A> map(std::vector<T, A> value, M& m) {
    for (auto& e : value) e = m(std::move(e));
    return value;
  }
  template <class V>
  static void visit(const std::vector<T, A>& value, V& v) {
    for (const auto& e : value) v(e);
  }
};

template <class T, std::size_t N>
struct TensorMap<std::array<T, N>> {
  template <class M>
  static std::array<T, N> map(std::array<T, N> value, M& m) {
    for (auto& e : value) e = m(std::move(e));
    return value;
  }
  template <class V>
  static void visit(const std::array<T, N>& value, V& v) {
    for (const auto& e : value) v(e);
  }
};

template <class... Ts>
struct TensorMap<std::tuple<Ts...>> {
  template <class M>
  static std::tuple<Ts...> map(std::tuple<Ts...> value, M& m) {
    std::apply([&m](auto&... e) { ((e = m(std::move(e))), ...); }, value);
    return value;
  }
  template <class V>
  static void visit(const std::tuple<Ts...>& value, V& v) {
    std::apply([&v](const auto&... e) { (v(e), ...); }, value);
  }
};

template <class A, class B>
struct TensorMap<std::pair<A, B>> {
  template <class M>
  static std::pair<A, B> map(std::pair<A, B> value, M& m) {
    value.first = m(std::move(value.first));
    value.second = m(std::move(value.second));
    return value;
  }
  template <class V>
  static void visit(const std::pair<A, B>& value, V& v) {
    v(value.first);
    v(value.second);
  }
};

template <class T>
struct TensorMap<std::optional<T>> {
  template <class M>
  static std::optional<T> map(std::optional<T> value, M& m) {
    if (value) *value = m(std::move(*value));
    return value;
  }
  template <class V>
  static void visit(const std::optional<T>& value, V& v) {
    if (value) v(*value);
  }
};

/// Maps: the values are mapped, the keys kept.
template <class K, class T, class C, class A>
struct TensorMap<std::map<K, T, C, A>> {
  template <class M>
  static std::map<K, T, C, A> map(std::map<K, T, C, A> value, M& m) {
    for (auto& kv : value) kv.second = m(std::move(kv.second));
    return value;
  }
  template <class V>
  static void visit(const std::map<K, T, C, A>& value, V& v) {
    for (const auto& kv : value) v(kv.second);
  }
};

template <class K, class T, class H, class E, class A>
struct TensorMap<std::unordered_map<K, T, H, E, A>> {
  template <class M>
  static std::unordered_map<K, T, H, E, A> map(std::unordered_map<K, T, H, E, A> value, M& m) {
    for (auto& kv : value) kv.second = m(std::move(kv.second));
    return value;
  }
  template <class V>
  static void visit(const std::unordered_map<K, T, H, E, A>& value, V& v) {
    for (const auto& kv : value) v(kv.second);
  }
};

namespace detail {

template <class F>
struct TensorMapper {
  F& f;
  template <class U>
  U operator()(U value) {
    return TensorMap<U>::map(std::move(value), *this);
  }
  at::Tensor tensor(at::Tensor t) { return f(std::move(t)); }
};

template <class F>
struct TensorVisitor {
  F& f;
  template <class U>
  void operator()(const U& value) {
    TensorMap<U>::visit(value, *this);
  }
  void tensor(const at::Tensor& t) { f(t); }
};

}  // namespace detail

/// `value` with each tensor `t` inside it replaced by `f(t)` (an at::Tensor), in TensorMap
/// order.
template <class T, class F>
T map_tensors(T value, F&& f) {
  detail::TensorMapper<std::remove_reference_t<F>> m{f};
  return m(std::move(value));
}

/// Calls `f(const at::Tensor&)` for each tensor inside `value`, in TensorMap order.
template <class T, class F>
void visit_tensors(const T& value, F&& f) {
  detail::TensorVisitor<std::remove_reference_t<F>> v{f};
  v(value);
}

}  // namespace coload
