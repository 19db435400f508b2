#pragma once
// AsyncScope: spawn work nobody awaits, then wait for all of it with `co_await scope.join()`.

#include <atomic>
#include <cassert>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <utility>

namespace coload {

class AsyncScope;

namespace detail {

/// The coroutine that runs one spawned awaitable and tells its scope when it has finished.
struct ScopeEntry {
  struct promise_type {
    AsyncScope& scope;
    template <class Work>
    promise_type(AsyncScope& s, Work&) noexcept : scope(s) {}
    ScopeEntry get_return_object() const noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    auto final_suspend() noexcept;
    void return_void() const noexcept {}
    void unhandled_exception() noexcept;
  };
};

}  // namespace detail

/// Owns the lifetimes of coroutines started without a caller: each is spawned into the scope,
/// and `co_await scope.join()` completes once every one of them has finished.
///
/// Threads: spawn() and the completions of spawned work may happen on any threads at once (the
/// count is atomic). A spawned awaitable starts at once on the thread calling spawn() and runs
/// there until it first suspends. The joiner is resumed inline, by symmetric transfer, on the
/// thread that finishes the last spawned work; if nothing is unfinished when join() is awaited,
/// the joiner goes on without suspending, on its own thread. A loader that completes all of its
/// work on the driver thread therefore joins on the driver thread.
///
/// Exceptions: an exception escaping spawned work is kept, the other work runs on, and join()
/// rethrows it once everything has finished; if several escape, the first is kept and the rest
/// are dropped. (Bodies are expected to catch their own errors; one that does not is a bug
/// that join() reports instead of ending the process. Detached, by contrast, terminates.)
///
/// Lifetimes: a spawned awaitable is moved into a frame the scope frees when it finishes,
/// before the joiner can resume, so after join() nothing spawned is alive. The scope must
/// outlive its work: destroy it only after join() has completed (the resumed joiner may do so
/// at once), or when nothing spawned is unfinished. A scope is joined once: awaiting join()
/// again completes at once, and spawn() after a completed join is an error (asserted).
class AsyncScope {
 public:
  AsyncScope() noexcept = default;
  AsyncScope(const AsyncScope&) = delete;
  AsyncScope& operator=(const AsyncScope&) = delete;
  ~AsyncScope() { assert(count_.load(std::memory_order_acquire) <= 1 && "work still running"); }

  /// Starts `work` (any awaitable, e.g. a Task<void>; its result is discarded) and returns when
  /// it first suspends or finishes. Call it before join() is awaited, or from work of this
  /// scope that has not finished yet (on any thread). Throws only if the frame or the move of
  /// `work` into it throws; then nothing was spawned.
  template <class Awaitable>
  void spawn(Awaitable&& work) {
    [[maybe_unused]] const std::size_t before = count_.fetch_add(1, std::memory_order_relaxed);
    assert(before > 0 && "spawn into a scope already joined");
    try {
      run<std::decay_t<Awaitable>>(*this, std::forward<Awaitable>(work));
    } catch (...) {
      count_.fetch_sub(1, std::memory_order_relaxed);  // never the last: the caller holds one
      throw;
    }
  }

  /// The awaiter of join(): ready once every spawned work has finished.
  class [[nodiscard]] JoinAwaiter {
   public:
    explicit JoinAwaiter(AsyncScope& scope) noexcept : scope_(scope) {}
    /// True when the scope was joined before.
    bool await_ready() const noexcept {
      return scope_.count_.load(std::memory_order_acquire) == 0;
    }
    /// Gives up the join's own share of the count; suspends unless that was the last.
    bool await_suspend(std::coroutine_handle<> joiner) noexcept {
      scope_.joiner_ = joiner;
      return scope_.count_.fetch_sub(1, std::memory_order_acq_rel) > 1;
    }
    /// Rethrows the first exception that escaped spawned work, if any.
    void await_resume() const {
      if (scope_.error_) std::rethrow_exception(scope_.error_);
    }

   private:
    AsyncScope& scope_;
  };

  /// Awaitable that completes when all spawned work has finished; see the class comment.
  JoinAwaiter join() noexcept { return JoinAwaiter(*this); }

 private:
  friend struct detail::ScopeEntry::promise_type;

  template <class Work>
  static detail::ScopeEntry run(AsyncScope&, Work work) {
    co_await std::move(work);
  }

  /// Called by each spawned work as its frame is gone: the joiner if it was the last, else none.
  std::coroutine_handle<> finish_one() noexcept {
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) return joiner_;
    return std::noop_coroutine();
  }

  /// Keeps the first escaped exception; its write is published by the finish_one() after it.
  void keep(std::exception_ptr error) noexcept {
    if (!failed_.exchange(true, std::memory_order_relaxed)) error_ = std::move(error);
  }

  // NOTE: the count starts at one, the join's share, so it reaches zero only once join() is
  // awaited and every spawned work has finished, whichever of them happens last.
  std::atomic<std::size_t> count_{1};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::coroutine_handle<> joiner_;
};

namespace detail {

inline auto ScopeEntry::promise_type::final_suspend() noexcept {
  struct Finish {
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> self) noexcept {
      AsyncScope& scope = self.promise().scope;
      self.destroy();  // the work's frame and arguments go before the joiner can run
      return scope.finish_one();
    }
    void await_resume() const noexcept {}
  };
  return Finish{};
}

inline void ScopeEntry::promise_type::unhandled_exception() noexcept {
  scope.keep(std::current_exception());
}

}  // namespace detail

}  // namespace coload
