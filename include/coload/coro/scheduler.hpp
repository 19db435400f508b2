#pragma once
// Scheduler: somewhere a coroutine can be sent to resume, as the stages below exec see a pool.

#include <coroutine>

namespace coload {

/// A place that resumes coroutines on threads of its own. exec's ThreadExecutor is one; a
/// dataset's SampleContext holds a Scheduler* so that the dataset module needs nothing of exec.
class Scheduler {
 public:
  /// Queues `h` to be resumed on one of the scheduler's threads. Callable from any thread.
  virtual void post(std::coroutine_handle<> h) = 0;

 protected:
  ~Scheduler() = default;
};

}  // namespace coload
