#pragma once
// when_all: run several tasks at once and wait for all of them.

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "coload/coro/task.hpp"

namespace coload {
namespace detail {

template <class T>
struct WhenAllState {
  explicit WhenAllState(std::size_t n) : results(n), pending(n + 1) {}
  std::vector<std::optional<T>> results;
  std::exception_ptr error;  // the first task's error, by position
  std::size_t error_at = static_cast<std::size_t>(-1);
  std::atomic<std::size_t> pending;  // unfinished tasks, plus one for the waiting parent
  std::coroutine_handle<> parent;

  /// One finisher: whoever brings `pending` to zero resumes the parent.
  void arrive() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) parent.resume();
  }
};

struct WhenAllRunner {
  struct promise_type {
    WhenAllRunner get_return_object() const noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() const noexcept { std::terminate(); }
  };
};

template <class T>
WhenAllRunner when_all_run(Task<T> task, WhenAllState<T>* state, std::size_t i,
                           std::mutex* error_mutex) {
  {
    // NOTE: the task's frame (and the exception its promise holds) goes before arrive(): the
    // last arrival resumes the parent here, which may hand the result or the error to another
    // thread and return only after that thread is done with it. Destroying the frame after
    // would release the exception last, on this thread, behind the other's back.
    Task<T> own = std::move(task);
    try {
      state->results[i].emplace(co_await std::move(own));
    } catch (...) {
      std::lock_guard lock(*error_mutex);
      if (i < state->error_at) {
        state->error_at = i;
        state->error = std::current_exception();
      }
    }
  }
  state->arrive();
}

}  // namespace detail

/// Starts every task at once and completes when all have finished, with their results in
/// order. When some fail, every task still runs to its end, then the error of the first failed
/// one (by position) is rethrown. The caller resumes on the thread that finished last.
template <class T>
Task<std::vector<T>> when_all(std::vector<Task<T>> tasks) {
  detail::WhenAllState<T> state(tasks.size());
  std::mutex error_mutex;
  // NOTE: the parent is registered before any task starts, so a task that finishes at once
  // (or on another thread) always finds it; the extra count stops an early resume.
  struct Start {
    std::vector<Task<T>>* tasks;
    detail::WhenAllState<T>* state;
    std::mutex* error_mutex;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
      state->parent = h;
      for (std::size_t i = 0; i < tasks->size(); ++i) {
        detail::when_all_run(std::move((*tasks)[i]), state, i, error_mutex);
      }
      return state->pending.fetch_sub(1, std::memory_order_acq_rel) != 1;
    }
    void await_resume() const noexcept {}
  };
  co_await Start{&tasks, &state, &error_mutex};
  if (state.error) std::rethrow_exception(state.error);
  std::vector<T> out;
  out.reserve(state.results.size());
  for (auto& r : state.results) out.push_back(std::move(*r));
  co_return out;
}

}  // namespace coload
