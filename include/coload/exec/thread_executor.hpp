#pragma once
// ThreadExecutor: the pool of worker threads that runs CPU work.

#include <coroutine>
#include <memory>
#include <string>

#include "coload/coro/scheduler.hpp"

namespace coload {

/// A fixed pool of worker threads that resume coroutines: `co_await pool.schedule()` moves the
/// awaiting coroutine onto one of the workers. Work is taken from one shared queue, so a slow
/// job never holds back jobs queued behind it while another worker is free.
class ThreadExecutor final : public Scheduler {
 public:
  /// Starts `num_threads` threads (at least one), named `<name><id>`.
  explicit ThreadExecutor(int num_threads, std::string name = "coload-w");
  ThreadExecutor(const ThreadExecutor&) = delete;
  ThreadExecutor& operator=(const ThreadExecutor&) = delete;
  /// Resumes everything already queued, then joins every thread.
  ~ThreadExecutor();

  /// The number of threads.
  int size() const noexcept;

  /// Queues `h` to be resumed on a worker thread. Callable from any thread.
  void post(std::coroutine_handle<> h) override;

  /// Queues `h` to be resumed on worker thread `worker` (in [0, size())), ahead of the shared
  /// queue. Callable from any thread.
  void post_to(int worker, std::coroutine_handle<> h);

  /// Awaitable that continues the awaiting coroutine on a worker thread.
  auto schedule() noexcept {
    struct Awaiter {
      ThreadExecutor* pool;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) { pool->post(h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{this};
  }

  /// Awaitable that continues the awaiting coroutine on worker thread `worker`: work that
  /// belongs to one worker (an iterable dataset's stream, its worker_init_fn) stays on it.
  auto schedule_on(int worker) noexcept {
    struct Awaiter {
      ThreadExecutor* pool;
      int worker;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) { pool->post_to(worker, h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{this, worker};
  }

  /// The id of the calling worker thread in its pool, or -1 on any other thread.
  static int current_worker_id() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace coload
