#pragma once
// ThreadExecutor: the pool of worker threads that runs CPU work.

#include <coroutine>
#include <cstdint>
#include <memory>
#include <string>

#include "coload/coro/scheduler.hpp"

namespace coload {

/// A pool of worker threads that resume coroutines: `co_await pool.schedule()` moves the
/// awaiting coroutine onto one of the workers. Work is taken from one shared queue, so a slow
/// job never holds back jobs queued behind it while another worker is free. Work posted
/// without an order goes first, in the order posted; then work posted with one, lowest order
/// first (equal orders in the order posted).
///
/// All threads start at construction; set_active(k) lets only workers 0 .. k-1 take from the
/// shared queue (the others sleep, still serving work pinned to them), which is how the loader
/// tunes its worker count without starting or joining threads. Each worker counts the time it
/// spends waiting for work (read by idle_nanoseconds), at the cost of a clock read each time it
/// goes to sleep, never per job.
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

  /// Lets workers 0 .. n-1 take from the shared queue (n clamped to [1, size()]); a worker past
  /// n finishes the job it holds and then sleeps. Callable from any thread.
  void set_active(int n);
  /// How many workers take from the shared queue (size() until set_active says otherwise).
  int active() const;
  /// The total time workers 0 .. n-1 have spent waiting for work since they started, a wait
  /// in progress included (n clamped to [0, size()]). Callable from any thread.
  std::int64_t idle_nanoseconds(int n) const;

  /// Queues `h` to be resumed on a worker thread. Callable from any thread.
  void post(std::coroutine_handle<> h) override;
  /// Queues `h` behind all work posted without an order and before work of a higher order.
  /// Callable from any thread.
  void post_ordered(std::coroutine_handle<> h, std::uint64_t order) override;

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
