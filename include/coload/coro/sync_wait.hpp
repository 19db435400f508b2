#pragma once
// sync_wait: run an awaitable to completion from ordinary (non-coroutine) code.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "coload/coro/task.hpp"

namespace coload {
namespace detail {

/// A queue through which other threads hand a suspended coroutine back to the thread that
/// runs sync_wait, so that a consumer resumes on its own thread, not on the producer's.
class ResumeQueue {
 public:
  /// Schedules `h` to be resumed by the thread inside run(). Callable from any thread.
  void post(std::coroutine_handle<> h) {
    std::lock_guard lock(mutex_);
    queue_.push_back(h);
    pending_.store(true, std::memory_order_release);
    // NOTE: notify under the lock: run() may return and destroy this queue right after.
    ready_.notify_one();
  }
  /// Makes run() return once the queue is empty.
  void finish() {
    std::lock_guard lock(mutex_);
    done_ = true;
    pending_.store(true, std::memory_order_release);
    ready_.notify_one();
  }
  /// Resumes posted coroutines on the calling thread until finish() is called; whenever none
  /// is posted, calls `pump()`, which must do some of the work that posts them (a driver's
  /// handler run on this thread), instead of waiting for another thread to post.
  template <class Pump>
  void run(Pump&& pump) {
    for (;;) {
      std::coroutine_handle<> h;
      {
        std::lock_guard lock(mutex_);
        if (!queue_.empty()) {
          h = queue_.front();
          queue_.pop_front();
        } else if (done_) {
          return;
        }
        pending_.store(!queue_.empty() || done_, std::memory_order_relaxed);
      }
      if (h) {
        h.resume();
      } else {
        pump();
      }
    }
  }
  /// Resumes posted coroutines on the calling thread until finish() is called.
  void run() {
    for (;;) {
      spin_briefly();
      std::coroutine_handle<> h;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        h = queue_.front();
        queue_.pop_front();
        pending_.store(!queue_.empty() || done_, std::memory_order_relaxed);
      }
      h.resume();
    }
  }

 private:
  // NOTE: a consumer usually waits only microseconds for the next batch. Sleeping on the
  // condition variable then costs a futex wake-up on both sides (an inter-processor interrupt
  // on a VM), which alone can halve a fast loader's throughput; a spin bounded in time avoids
  // it, and a longer wait still sleeps.
  void spin_briefly() const noexcept {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::microseconds(50);
    for (int i = 1; !pending_.load(std::memory_order_acquire); ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (i % 64 == 0 && clock::now() > deadline) return;
    }
  }
  std::atomic<bool> pending_{false};
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::coroutine_handle<>> queue_;
  bool done_ = false;
};

/// The ResumeQueue of the sync_wait running on this thread, or nullptr.
inline thread_local ResumeQueue* current_resume_queue = nullptr;

/// Resumes `h` on the thread that suspended it when that thread is inside sync_wait;
/// otherwise resumes it inline on the calling thread.
inline void resume_on(ResumeQueue* queue, std::coroutine_handle<> h) {
  if (queue) {
    queue->post(h);
  } else {
    h.resume();
  }
}

struct SyncWaitTask {
  struct promise_type {
    ResumeQueue* queue = nullptr;
    SyncWaitTask get_return_object() noexcept {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    auto final_suspend() noexcept {
      struct Finish {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<promise_type> h) noexcept {
          h.promise().queue->finish();
        }
        void await_resume() const noexcept {}
      };
      return Finish{};
    }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  std::coroutine_handle<promise_type> handle;
};

template <class A>
decltype(auto) get_awaiter(A&& a) {
  if constexpr (requires { std::forward<A>(a).operator co_await(); }) {
    return std::forward<A>(a).operator co_await();
  } else if constexpr (requires { operator co_await(std::forward<A>(a)); }) {
    return operator co_await(std::forward<A>(a));
  } else {
    return std::forward<A>(a);
  }
}

template <class A>
using await_result_t = decltype(get_awaiter(std::declval<A>()).await_resume());

}  // namespace detail

namespace detail {
/// sync_wait, with `drain(queue)` running the resume queue (ResumeQueue::run, or run(pump)).
template <class Awaitable, class Drain>
decltype(auto) sync_wait_draining(Awaitable&& awaitable, Drain&& drain) {
  using R = detail::await_result_t<Awaitable>;
  using Stored = std::conditional_t<std::is_reference_v<R>,
                                    std::add_pointer_t<std::remove_reference_t<R>>,
                                    std::conditional_t<std::is_void_v<R>, char, R>>;
  std::optional<Stored> value;
  std::exception_ptr error;
  detail::ResumeQueue queue;
  auto body = [&]() -> detail::SyncWaitTask {
    try {
      if constexpr (std::is_void_v<R>) {
        co_await std::forward<Awaitable>(awaitable);
        value.emplace();
      } else if constexpr (std::is_reference_v<R>) {
        decltype(auto) r = co_await std::forward<Awaitable>(awaitable);
        value.emplace(std::addressof(r));
      } else {
        value.emplace(co_await std::forward<Awaitable>(awaitable));
      }
    } catch (...) {
      error = std::current_exception();
    }
  };
  detail::SyncWaitTask task = body();
  task.handle.promise().queue = &queue;
  detail::ResumeQueue* previous = std::exchange(detail::current_resume_queue, &queue);
  task.handle.resume();
  drain(queue);
  detail::current_resume_queue = previous;
  task.handle.destroy();
  if (error) std::rethrow_exception(error);
  if constexpr (std::is_reference_v<R>) {
    return static_cast<R>(**value);
  } else if constexpr (!std::is_void_v<R>) {
    return R(std::move(*value));
  }
}
}  // namespace detail

/// Runs `awaitable` to completion on the calling thread and returns its result (or rethrows).
///
/// Coroutines suspended inside it that another thread completes are resumed back on this
/// thread (through a queue that this call drains), so a sync_wait caller never runs its
/// continuation on a worker or driver thread.
template <class Awaitable>
decltype(auto) sync_wait(Awaitable&& awaitable) {
  return detail::sync_wait_draining(std::forward<Awaitable>(awaitable),
                                    [](detail::ResumeQueue& q) { q.run(); });
}

/// Like sync_wait, but while nothing has been posted back it calls `pump()` on the calling
/// thread, which must make progress towards the awaitable's completion itself (run one of its
/// producer's handlers here) rather than wait for another thread.
template <class Awaitable, class Pump>
decltype(auto) sync_wait_pumping(Awaitable&& awaitable, Pump&& pump) {
  return detail::sync_wait_draining(std::forward<Awaitable>(awaitable),
                                    [&pump](detail::ResumeQueue& q) { q.run(pump); });
}

}  // namespace coload
