#pragma once

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <chrono>
#include <coroutine>
#include <functional>
#include <memory>
#include <string>

namespace coload::detail {

/// The loader's driver: one thread running an asio::io_context. Sampling, scheduling,
/// reordering and the hand-off to the consumer happen on it, so that state needs no locks.
/// A lazy driver has no thread until start(): the consumer runs its io_context inside an
/// Inline meanwhile, one thread at a time either way.
class Driver {
 public:
  /// Starts the thread; it runs until release() has been called and no work is left.
  Driver();
  /// A driver without a thread (a worker process's copy of a loader, which never drives).
  struct Idle {};
  explicit Driver(Idle);
  /// A driver whose io_context the consumer runs on its own thread while it waits (Inline),
  /// until something needs it to run on its own: start() then starts the thread, for good.
  struct Lazy {};
  explicit Driver(Lazy);
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  /// Releases the keep-alive if still held and joins the thread.
  ~Driver();

  asio::io_context& context() noexcept;
  /// True on the driver thread itself, and on a thread inside an Inline of this driver.
  bool on_driver_thread() const noexcept;

  /// True while a lazy driver has no thread: its work runs only inside an Inline.
  bool runs_inline() const noexcept;
  /// Starts the thread of a lazy driver that has none yet, which runs `first` (if any) before
  /// the driver's work; does nothing otherwise. Call it outside any Inline; two threads may
  /// call it at once.
  void start(std::function<void()> first = {});

  /// Marks the calling thread as running this (lazy, threadless) driver for its lifetime:
  /// run_one() may then run the driver's work here. Nests; restores the previous mark.
  class Inline {
   public:
    explicit Inline(Driver& driver) noexcept;
    Inline(const Inline&) = delete;
    Inline& operator=(const Inline&) = delete;
    ~Inline();
    /// Runs one handler of the driver's io_context on this thread, blocking until there is
    /// one.
    void run_one();

   private:
    Driver& driver_;
    const void* previous_;
  };
  /// Lets the thread end once the io_context runs out of work. Call on the driver thread.
  void release() noexcept;
  /// Waits for the thread to end (after release()); a lazy driver without a thread runs its
  /// remaining work on the calling thread instead.
  void join();
  /// Waits at most `timeout` for the thread's io_context to run out of work (after
  /// release()), running it here for a lazy driver without a thread; true when it has, and
  /// join() then returns at once.
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
  void start_thread(std::function<void()> first);
  struct State;
  // NOTE: shared, so that a thread posting to the driver keeps the io_context alive until its
  // post returns, even if the coroutine it posted ends the loader first.
  std::shared_ptr<State> state_;
};

/// Warns that a loader's fetches had not ended `grace` after being asked to stop, saying who
/// holds what (`busy`, as FetchBoard::describe_busy says it; empty: not known): the loader
/// returns and frees its dataset and workers once that code returns.
void warn_stuck_stop(std::chrono::milliseconds grace, std::string busy);

}  // namespace coload::detail
