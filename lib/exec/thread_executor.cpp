// ThreadExecutor: a fixed pool of threads that resume coroutines.

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "coload/core/worker_info.hpp"
#include "coload/exec/thread_executor.hpp"

namespace coload {

struct ThreadExecutor::State {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::coroutine_handle<>> queue;
  // NOTE: one queue per thread for work pinned to it; a pinned post wakes every thread (there
  // are few), and each thread serves its own queue before the shared one.
  std::vector<std::deque<std::coroutine_handle<>>> pinned;
  bool stopping = false;
  std::vector<std::thread> threads;

  void run(int id) {
    detail::set_current_worker_id(id);
    auto& own = pinned[static_cast<std::size_t>(id)];
    for (;;) {
      std::coroutine_handle<> h;
      {
        std::unique_lock lock(mutex);
        ready.wait(lock, [&] { return stopping || !own.empty() || !queue.empty(); });
        auto& from = !own.empty() ? own : queue;
        if (from.empty()) return;
        h = from.front();
        from.pop_front();
      }
      h.resume();
    }
  }
};

ThreadExecutor::ThreadExecutor(int num_threads, std::string name)
    : state_(std::make_unique<State>()) {
  if (num_threads < 1) num_threads = 1;
  state_->pinned.resize(static_cast<std::size_t>(num_threads));
  state_->threads.reserve(static_cast<std::size_t>(num_threads));
  for (int i = 0; i < num_threads; ++i) {
    state_->threads.emplace_back([s = state_.get(), i] { s->run(i); });
    // Linux limits thread names to 15 characters.
    const std::string thread_name = (name + std::to_string(i)).substr(0, 15);
    pthread_setname_np(state_->threads.back().native_handle(), thread_name.c_str());
  }
}

ThreadExecutor::~ThreadExecutor() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->ready.notify_all();
  for (auto& t : state_->threads) t.join();
}

int ThreadExecutor::size() const noexcept { return static_cast<int>(state_->threads.size()); }

// NOTE: posts notify while holding the lock. A thread outside the pool (an I/O thread, another
// pool) may post the last work item; once the lock is released that item can run, end the
// loader and destroy this executor, so the poster must not touch the condition variable after.
void ThreadExecutor::post(std::coroutine_handle<> h) {
  std::lock_guard lock(state_->mutex);
  state_->queue.push_back(h);
  state_->ready.notify_one();
}

void ThreadExecutor::post_to(int worker, std::coroutine_handle<> h) {
  std::lock_guard lock(state_->mutex);
  state_->pinned.at(static_cast<std::size_t>(worker)).push_back(h);
  state_->ready.notify_all();
}

int ThreadExecutor::current_worker_id() noexcept {
  return detail::current_worker_id();
}

}  // namespace coload
