#pragma once
// Scheduler: somewhere a coroutine can be sent to resume, as the stages below exec see a pool.

#include <coroutine>
#include <cstdint>

namespace coload {

/// A place that resumes coroutines on threads of its own. exec's ThreadExecutor is one; a
/// dataset's SampleContext holds a Scheduler* so that the dataset module needs nothing of exec.
class Scheduler {
 public:
  /// Queues `h` to be resumed on one of the scheduler's threads. Callable from any thread.
  virtual void post(std::coroutine_handle<> h) = 0;
  /// Queues `h` with a place in line: of the work queued with an order, a scheduler that
  /// keeps one resumes the lowest first (a loader passes its batches' starting order, so the
  /// oldest batch in flight is finished first). This default ignores it.
  virtual void post_ordered(std::coroutine_handle<> h, std::uint64_t order) {
    static_cast<void>(order);
    post(h);
  }
  /// Called on the thread that resumed a coroutine sent here by `co_await ctx.cpu()`, before
  /// the coroutine goes on, with the sample it works on (-1: a whole batch). A scheduler that
  /// keeps records of its work overrides it (a loader names the worker for get_worker_info(),
  /// notes who holds which sample, and runs worker_init_fn); this default does nothing.
  virtual void arrived(std::int64_t sample) { static_cast<void>(sample); }

 protected:
  ~Scheduler() = default;
};

}  // namespace coload
