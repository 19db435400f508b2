#pragma once

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <chrono>
#include <coroutine>
#include <memory>

namespace coload::detail {

/// The loader's driver: one thread running an asio::io_context. Sampling, scheduling,
/// reordering and the hand-off to the consumer happen on it, so that state needs no locks.
class Driver {
 public:
  /// Starts the thread; it runs until release() has been called and no work is left.
  Driver();
  /// A driver without a thread (a worker process's copy of a loader, which never drives).
  struct Idle {};
  explicit Driver(Idle);
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  /// Releases the keep-alive if still held and joins the thread.
  ~Driver();

  asio::io_context& context() noexcept;
  /// True on the driver thread itself.
  bool on_driver_thread() const noexcept;
  /// Lets the thread end once the io_context runs out of work. Call on the driver thread.
  void release() noexcept;
  /// Waits for the thread to end (after release()).
  void join();
  /// Waits at most `timeout` for the thread's io_context to run out of work (after
  /// release()); true when it has, and join() then returns at once.
  bool wait_for(std::chrono::milliseconds timeout);

  /// Awaitable continuing the awaiting coroutine on the driver thread. Safe from any thread,
  /// including one the loader does not own and does not join (an asynchronous dataset's).
  auto schedule() noexcept {
    struct Awaiter {
      Driver* driver;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) const { driver->post_resume(h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{this};
  }

  /// Resumes `h` on the driver thread.
  void post_resume(std::coroutine_handle<> h);

 private:
  struct State;
  // NOTE: shared, so that a thread posting to the driver keeps the io_context alive until its
  // post returns, even if the coroutine it posted ends the loader first.
  std::shared_ptr<State> state_;
};

}  // namespace coload::detail
