#pragma once
// Task<T>: a lazy coroutine with symmetric transfer in both directions.

#include <cassert>
#include <coroutine>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>
#include <variant>

namespace coload {

template <class T = void>
class Task;

namespace detail {

/// Final awaiter shared by every task: hands control straight to whoever awaited the task.
struct TaskFinalAwaiter {
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> self) noexcept {
    // NOTE: symmetric transfer keeps a million synchronous completions off the stack.
    return self.promise().continuation;
  }
  void await_resume() const noexcept {}
};

struct TaskPromiseBase {
  std::coroutine_handle<> continuation = std::noop_coroutine();
  std::suspend_always initial_suspend() const noexcept { return {}; }
  TaskFinalAwaiter final_suspend() const noexcept { return {}; }
};

template <class T>
struct TaskPromise : TaskPromiseBase {
  using Stored = std::conditional_t<std::is_reference_v<T>,
                                    std::add_pointer_t<std::remove_reference_t<T>>, T>;
  std::variant<std::monostate, Stored, std::exception_ptr> result;

  Task<T> get_return_object() noexcept;
  void unhandled_exception() noexcept { result.template emplace<2>(std::current_exception()); }

  template <class U>
    requires std::is_convertible_v<U&&, T>
  void return_value(U&& value) {
    if constexpr (std::is_reference_v<T>) {
      T ref = static_cast<U&&>(value);
      result.template emplace<1>(std::addressof(ref));
    } else {
      result.template emplace<1>(std::forward<U>(value));
    }
  }

  T take() {
    if (result.index() == 2) std::rethrow_exception(std::get<2>(result));
    assert(result.index() == 1 && "task finished without a value");
    if constexpr (std::is_reference_v<T>) {
      return static_cast<T>(*std::get<1>(result));
    } else {
      return std::move(std::get<1>(result));
    }
  }
};

template <>
struct TaskPromise<void> : TaskPromiseBase {
  std::exception_ptr error;
  Task<void> get_return_object() noexcept;
  void unhandled_exception() noexcept { error = std::current_exception(); }
  void return_void() noexcept {}
  void take() {
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace detail

/// A lazily started coroutine producing a T (or an exception) for exactly one awaiter.
///
/// The body runs only when the task is awaited; completion resumes the awaiter through
/// symmetric transfer, so chains of synchronously completing tasks use constant stack.
template <class T>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  using value_type = T;

  Task() noexcept = default;
  explicit Task(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  /// True while the task owns a coroutine.
  bool valid() const noexcept { return static_cast<bool>(handle_); }
  /// True once the body has run to completion.
  bool is_ready() const noexcept { return !handle_ || handle_.done(); }

  auto operator co_await() && noexcept {
    struct Awaiter {
      std::coroutine_handle<promise_type> callee;
      bool await_ready() const noexcept { return !callee || callee.done(); }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
        callee.promise().continuation = caller;
        return callee;
      }
      T await_resume() { return callee.promise().take(); }
    };
    assert(handle_ && "awaiting an empty Task");
    return Awaiter{handle_};
  }

  /// Releases ownership of the coroutine frame (for detached starters).
  std::coroutine_handle<promise_type> release() noexcept { return std::exchange(handle_, {}); }

 private:
  void reset() noexcept {
    if (handle_) handle_.destroy();
    handle_ = {};
  }
  std::coroutine_handle<promise_type> handle_;
};

namespace detail {
template <class T>
Task<T> TaskPromise<T>::get_return_object() noexcept {
  return Task<T>{std::coroutine_handle<TaskPromise<T>>::from_promise(*this)};
}
inline Task<void> TaskPromise<void>::get_return_object() noexcept {
  return Task<void>{std::coroutine_handle<TaskPromise<void>>::from_promise(*this)};
}
}  // namespace detail

}  // namespace coload
