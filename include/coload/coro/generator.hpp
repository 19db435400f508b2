#pragma once
// Generator<T>: a synchronous coroutine generator that models std::ranges::input_range.

#include <coroutine>
#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>

namespace coload {

/// A synchronous generator: `co_yield` values, consume with range-for or std::ranges.
///
/// Values are yielded by address, never copied. `co_await` inside a Generator does not
/// compile: use AsyncGenerator when the producer must wait. An exception thrown by the body
/// is rethrown from the iterator operation that resumed it.
template <class T>
class [[nodiscard]] Generator {
 public:
  using value_type = std::remove_cvref_t<T>;
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;
  using pointer = std::add_pointer_t<reference>;

  class promise_type {
   public:
    Generator get_return_object() noexcept {
      return Generator{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    std::suspend_always final_suspend() const noexcept { return {}; }

    std::suspend_always yield_value(std::remove_reference_t<T>& value) noexcept {
      value_ = std::addressof(value);
      return {};
    }
    std::suspend_always yield_value(std::remove_reference_t<T>&& value) noexcept {
      value_ = std::addressof(value);
      return {};
    }
    void unhandled_exception() noexcept { error_ = std::current_exception(); }
    void return_void() noexcept {}

    /// Generators are synchronous: awaiting inside one is a compile error by design.
    template <class U>
    std::suspend_never await_transform(U&&) = delete;

    reference value() const noexcept { return static_cast<reference>(*value_); }
    void rethrow_if_failed() {
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

   private:
    pointer value_ = nullptr;
    std::exception_ptr error_;
  };

  class iterator {
   public:
    using iterator_concept = std::input_iterator_tag;
    using difference_type = std::ptrdiff_t;
    using value_type = Generator::value_type;
    using reference = Generator::reference;

    iterator() noexcept = default;
    explicit iterator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}

    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.handle_ || it.handle_.done();
    }
    iterator& operator++() {
      handle_.resume();
      if (handle_.done()) handle_.promise().rethrow_if_failed();
      return *this;
    }
    void operator++(int) { ++*this; }
    reference operator*() const noexcept { return handle_.promise().value(); }

   private:
    std::coroutine_handle<promise_type> handle_;
  };

  Generator() noexcept = default;
  Generator(Generator&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Generator& operator=(Generator&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, {});
    }
    return *this;
  }
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  ~Generator() {
    if (handle_) handle_.destroy();
  }

  /// Starts the body and runs it to its first `co_yield`; call once.
  iterator begin() {
    if (handle_) {
      handle_.resume();
      if (handle_.done()) handle_.promise().rethrow_if_failed();
    }
    return iterator{handle_};
  }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  explicit Generator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

}  // namespace coload

template <class T>
inline constexpr bool std::ranges::enable_view<coload::Generator<T>> = true;
