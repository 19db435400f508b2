// The loader's driver: the thread that runs its asio::io_context.

#include "coload/loader/driver.hpp"

#include <pthread.h>

#include <asio/executor_work_guard.hpp>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace coload::detail {

struct Driver::State {
  asio::io_context context{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{context.get_executor()};
  std::thread thread;
  std::thread::id id;
  std::mutex mutex;
  std::condition_variable ended_cv;
  bool ended = false;

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
  state_->thread = std::thread([s = state_.get()] { s->run(); });
  state_->id = state_->thread.get_id();
  pthread_setname_np(state_->thread.native_handle(), "coload-driver");
}

Driver::Driver(Idle) : state_(std::make_shared<State>()) {}

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
  return std::this_thread::get_id() == state_->id;
}
void Driver::release() noexcept {
  state_->guard.reset();
}
void Driver::join() {
  if (state_->thread.joinable()) state_->thread.join();
}
bool Driver::wait_for(std::chrono::milliseconds timeout) {
  if (!state_->thread.joinable()) return true;
  std::unique_lock lock(state_->mutex);
  return state_->ended_cv.wait_for(lock, timeout, [this] { return state_->ended; });
}

}  // namespace coload::detail
