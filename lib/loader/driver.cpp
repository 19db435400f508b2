// The loader's driver: the thread that runs its asio::io_context.

#include "coload/loader/driver.hpp"

#include <pthread.h>

#include <asio/executor_work_guard.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "coload/core/warning.hpp"

namespace coload::detail {

namespace {
// The driver whose work the calling thread runs inline (Driver::Inline), or nullptr.
thread_local const void* t_inline_driver = nullptr;
}  // namespace

struct Driver::State {
  asio::io_context context{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{context.get_executor()};
  std::thread thread;
  // NOTE: atomic: a lazy driver's thread starts while other threads may ask on_driver_thread.
  std::atomic<std::thread::id> id{};
  bool lazy = false;
  std::atomic<bool> started{false};
  // A lazy driver being joined: its work runs to its end on the joining thread, and start()
  // starts no thread any more.
  std::atomic<bool> joining{false};
  std::mutex start_mutex;  // start() from two threads at once starts one thread
  std::mutex mutex;
  std::condition_variable ended_cv;
  bool ended = false;

  /// A lazy driver that has started no thread: marks it joining (start() starts none from now
  /// on) and returns true, for the caller to run its work to the end on its own thread.
  /// Decided under start_mutex, so that a start() on another thread cannot assign the thread
  /// meanwhile; the work runs after it, since a handler run then may wait for a thread inside
  /// start() (a consumer's before_wait holds its run's entry lock, which the run's close()
  /// takes).
  bool end_inline() {
    if (!lazy) return false;
    std::lock_guard lock(start_mutex);
    if (started.load(std::memory_order_acquire)) return false;
    joining.store(true);
    return true;
  }

  void run() {
    context.run();
    {
      std::lock_guard lock(mutex);
      ended = true;
    }
    ended_cv.notify_all();
  }
};

Driver::Driver() : state_(std::make_shared<State>()) {
  start_thread({});
}

Driver::Driver(Idle) : state_(std::make_shared<State>()) {}

Driver::Driver(Lazy) : state_(std::make_shared<State>()) {
  state_->lazy = true;
}

void Driver::start_thread(std::function<void()> first) {
  state_->thread = std::thread([s = state_.get(), first = std::move(first)] {
    if (first) first();
    s->run();
  });
  state_->id.store(state_->thread.get_id());
  pthread_setname_np(state_->thread.native_handle(), "coload-driver");
  state_->started.store(true, std::memory_order_release);
}

bool Driver::runs_inline() const noexcept {
  return state_->lazy && !state_->started.load(std::memory_order_acquire);
}

void Driver::start(std::function<void()> first) {
  if (!runs_inline() || state_->joining.load()) return;
  std::lock_guard lock(state_->start_mutex);
  if (runs_inline() && !state_->joining.load()) start_thread(std::move(first));
}

Driver::Inline::Inline(Driver& driver) noexcept
    : driver_(driver), previous_(std::exchange(t_inline_driver, driver.state_.get())) {}

Driver::Inline::~Inline() {
  t_inline_driver = previous_;
}

void Driver::Inline::run_one() {
  driver_.state_->context.run_one();
}

Driver::~Driver() {
  if (state_->thread.joinable()) {
    asio::post(state_->context, [s = state_.get()] { s->guard.reset(); });
    state_->thread.join();
  }
}

asio::io_context& Driver::context() noexcept {
  return state_->context;
}
void Driver::post_resume(std::coroutine_handle<> h) {
  // The copy outlives the post: once posted, `h` may run, end the loader and destroy `*this`.
  const std::shared_ptr<State> keep = state_;
  asio::post(keep->context, [h] { h.resume(); });
}
bool Driver::on_driver_thread() const noexcept {
  return t_inline_driver == state_.get() || std::this_thread::get_id() == state_->id.load();
}
void Driver::release() noexcept {
  state_->guard.reset();
}
void Driver::join() {
  if (state_->end_inline()) {
    Inline here(*this);
    state_->context.run();
    return;
  }
  if (state_->thread.joinable()) state_->thread.join();
}
bool Driver::wait_for(std::chrono::milliseconds timeout) {
  if (state_->end_inline()) {
    Inline here(*this);
    state_->context.run_for(timeout);
    return state_->context.stopped();
  }
  if (!state_->thread.joinable()) return true;
  std::unique_lock lock(state_->mutex);
  return state_->ended_cv.wait_for(lock, timeout, [this] { return state_->ended; });
}

void warn_stuck_stop(std::chrono::milliseconds grace, std::string busy) {
  if (busy.empty()) busy = "a fetch is still running";
  warn("DataLoader destroyed while its fetches had not ended " + std::to_string(grace.count()) +
       " ms after being asked to stop (" + busy +
       "): a thread stuck in the dataset's code cannot be interrupted, so the loader returns "
       "now and frees its dataset and workers once that code returns, dropping its result");
}

}  // namespace coload::detail
