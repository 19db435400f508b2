// ThreadExecutor: a pool of threads that resume coroutines, of which a settable number take
// shared work.

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "coload/core/metrics.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/exec/thread_executor.hpp"

namespace coload {

struct ThreadExecutor::State {
  std::mutex mutex;
  // NOTE: workers that may take shared work sleep on `ready`, the others on `parked`, so that
  // a post's notify_one always wakes a worker that can take it; set_active wakes both, and
  // each worker picks its variable again.
  std::condition_variable ready;
  std::condition_variable parked;
  std::deque<std::coroutine_handle<>> queue;
  // NOTE: work posted with an order (a loader's samples, keyed by their batch's start) waits
  // in a heap behind `queue`: with prefetch_factor × workers batches in flight whose reads
  // complete in any order, first come first served would progress them all at once, and each
  // would hold its batch buffer meanwhile; lowest first finishes the oldest batch first.
  struct Ordered {
    std::uint64_t order;
    std::uint64_t seq;  // FIFO among equal orders
    std::coroutine_handle<> h;
    bool operator>(const Ordered& o) const noexcept {
      return order != o.order ? order > o.order : seq > o.seq;
    }
  };
  std::priority_queue<Ordered, std::vector<Ordered>, std::greater<>> ordered;
  std::uint64_t posted = 0;
  // NOTE: one queue per thread for work pinned to it; a pinned post wakes every thread (there
  // are few), and each thread serves its own queue before the shared one.
  std::vector<std::deque<std::coroutine_handle<>>> pinned;
  bool stopping = false;
  int active = 0;  // workers 0 .. active-1 take from the shared queue
  // Per worker, under the mutex: the nanoseconds waited so far, and since when it waits now
  // (-1: it is not waiting).
  std::vector<std::int64_t> idle_ns;
  std::vector<std::int64_t> idle_since;
  std::vector<std::thread> threads;

  static std::int64_t now_ns() noexcept { return static_cast<std::int64_t>(detail::now_ns()); }

  void run(int id) {
    detail::set_current_worker_id(id);
    const auto i = static_cast<std::size_t>(id);
    auto& own = pinned[i];
    auto has_work = [&] {
      return stopping || !own.empty() || (id < active && (!queue.empty() || !ordered.empty()));
    };
    for (;;) {
      std::coroutine_handle<> h;
      {
        std::unique_lock lock(mutex);
        if (!has_work()) {
          // Only a worker about to sleep reads the clock: a busy pool pays nothing.
          idle_since[i] = now_ns();
          do {
            (id < active ? ready : parked).wait(lock);
          } while (!has_work());
          idle_ns[i] += now_ns() - idle_since[i];
          idle_since[i] = -1;
        }
        if (id < active && own.empty() && queue.empty() && !ordered.empty()) {
          h = ordered.top().h;
          ordered.pop();
        } else {
          auto& from = !own.empty() ? own : id < active ? queue : own;
          if (from.empty()) return;
          h = from.front();
          from.pop_front();
        }
      }
      h.resume();
    }
  }
};

ThreadExecutor::ThreadExecutor(int num_threads, std::string name)
    : state_(std::make_unique<State>()) {
  if (num_threads < 1) num_threads = 1;
  state_->active = num_threads;
  state_->pinned.resize(static_cast<std::size_t>(num_threads));
  state_->idle_ns.assign(static_cast<std::size_t>(num_threads), 0);
  state_->idle_since.assign(static_cast<std::size_t>(num_threads), -1);
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
  state_->parked.notify_all();
  for (auto& t : state_->threads) t.join();
}

int ThreadExecutor::size() const noexcept { return static_cast<int>(state_->threads.size()); }

void ThreadExecutor::set_active(int n) {
  std::lock_guard lock(state_->mutex);
  state_->active = std::clamp(n, 1, size());
  // Every sleeper wakes and sleeps again where it now belongs; workers let in may find queued
  // work; those shut out notice after their current job.
  state_->ready.notify_all();
  state_->parked.notify_all();
}

int ThreadExecutor::active() const {
  std::lock_guard lock(state_->mutex);
  return state_->active;
}

std::int64_t ThreadExecutor::idle_nanoseconds(int n) const {
  n = std::clamp(n, 0, size());
  std::lock_guard lock(state_->mutex);
  const std::int64_t now = State::now_ns();
  std::int64_t total = 0;
  for (int w = 0; w < n; ++w) {
    const auto i = static_cast<std::size_t>(w);
    total += state_->idle_ns[i] + (state_->idle_since[i] >= 0 ? now - state_->idle_since[i] : 0);
  }
  return total;
}

// NOTE: posts notify while holding the lock. A thread outside the pool (an I/O thread, another
// pool) may post the last work item; once the lock is released that item can run, end the
// loader and destroy this executor, so the poster must not touch the condition variable after.
void ThreadExecutor::post(std::coroutine_handle<> h) {
  std::lock_guard lock(state_->mutex);
  state_->queue.push_back(h);
  state_->ready.notify_one();
}

void ThreadExecutor::post_ordered(std::coroutine_handle<> h, std::uint64_t order) {
  std::lock_guard lock(state_->mutex);
  state_->ordered.push({order, state_->posted++, h});
  state_->ready.notify_one();
}

void ThreadExecutor::post_to(int worker, std::coroutine_handle<> h) {
  std::lock_guard lock(state_->mutex);
  state_->pinned.at(static_cast<std::size_t>(worker)).push_back(h);
  state_->ready.notify_all();
  state_->parked.notify_all();
}

int ThreadExecutor::current_worker_id() noexcept {
  return detail::current_worker_id();
}

}  // namespace coload
