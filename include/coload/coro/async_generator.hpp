#pragma once
// AsyncGenerator<T>: a coroutine that co_yields values and may co_await in between.

#include <cassert>
#include <coroutine>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

namespace coload {

/// An asynchronous generator, consumed with `while (auto v = co_await gen.next()) use(*v);`.
///
/// Values are yielded by address: `next()` resumes the producer up to its next `co_yield`
/// and returns a pointer to the yielded object, valid until the following `next()` or the
/// generator's destruction; it returns nullptr once the producer has finished. An exception
/// thrown by the producer is rethrown by the `next()` that resumed it, after which the
/// generator is finished.
///
/// Drain safety: the generator may be destroyed between two `next()` calls (but not while a
/// `next()` is pending). Destruction destroys every object in scope at the producer's current
/// suspension point exactly once and never runs the producer any further.
template <class T>
class [[nodiscard]] AsyncGenerator {
 public:
  using value_type = std::remove_cvref_t<T>;
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;
  using pointer = std::add_pointer_t<reference>;

  class promise_type {
   public:
    AsyncGenerator get_return_object() noexcept {
      return AsyncGenerator{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }

    struct YieldAwaiter {
      bool await_ready() const noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> self) noexcept {
        return self.promise().consumer_;
      }
      void await_resume() const noexcept {}
    };
    YieldAwaiter final_suspend() noexcept {
      value_ = nullptr;
      return {};
    }
    YieldAwaiter yield_value(std::remove_reference_t<T>& value) noexcept {
      value_ = std::addressof(value);
      return {};
    }
    YieldAwaiter yield_value(std::remove_reference_t<T>&& value) noexcept {
      value_ = std::addressof(value);
      return {};
    }
    void unhandled_exception() noexcept { error_ = std::current_exception(); }
    void return_void() noexcept {}

   private:
    friend class AsyncGenerator;
    std::coroutine_handle<> consumer_ = std::noop_coroutine();
    pointer value_ = nullptr;
    std::exception_ptr error_;
  };

  AsyncGenerator() noexcept = default;
  AsyncGenerator(AsyncGenerator&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  AsyncGenerator& operator=(AsyncGenerator&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, {});
    }
    return *this;
  }
  AsyncGenerator(const AsyncGenerator&) = delete;
  AsyncGenerator& operator=(const AsyncGenerator&) = delete;
  ~AsyncGenerator() {
    if (handle_) handle_.destroy();
  }

  /// Awaitable resuming the producer; yields a pointer to the next value or nullptr at the end.
  auto next() noexcept {
    struct Awaiter {
      std::coroutine_handle<promise_type> producer;
      bool await_ready() const noexcept { return !producer || producer.done(); }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> consumer) noexcept {
        producer.promise().consumer_ = consumer;
        return producer;
      }
      pointer await_resume() {
        if (!producer) return nullptr;
        auto& p = producer.promise();
        if (p.error_) std::rethrow_exception(std::exchange(p.error_, nullptr));
        return producer.done() ? nullptr : p.value_;
      }
    };
    return Awaiter{handle_};
  }

 private:
  explicit AsyncGenerator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

}  // namespace coload
