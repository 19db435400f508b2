#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// Specification of the execution module: ThreadExecutor and the per-thread WorkerInfo.

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <latch>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coload/coro/coro.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/exec/worker_info.hpp"

using namespace coload;
using namespace std::chrono_literals;

namespace {

// A one-shot flag another thread can wait on, with a bound so a broken executor fails the
// test instead of hanging it.
class Flag {
 public:
  void set() {
    std::lock_guard lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  bool wait_for(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

// A countdown with a bounded wait (std::latch has none).
class Countdown {
 public:
  explicit Countdown(int n) : left_(n) {}
  void count_down() {
    std::lock_guard lock(mutex_);
    if (--left_ == 0) cv_.notify_all();
  }
  bool wait_for(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return left_ <= 0; });
  }
  // Counts down, then waits for everybody else: a rendezvous.
  bool arrive_and_wait_for(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    if (--left_ == 0) cv_.notify_all();
    return cv_.wait_for(lock, limit, [&] { return left_ <= 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int left_;
};

struct Where {
  int worker_id;
  std::thread::id thread;
};

Task<Where> where_scheduled(ThreadExecutor& pool) {
  co_await pool.schedule();
  co_return Where{ThreadExecutor::current_worker_id(), std::this_thread::get_id()};
}

Task<Where> where_pinned(ThreadExecutor& pool, int worker) {
  co_await pool.schedule_on(worker);
  co_return Where{ThreadExecutor::current_worker_id(), std::this_thread::get_id()};
}

Detached count_job(ThreadExecutor& pool, std::atomic<int>& hits, std::atomic<int>& bad_ids,
                   std::latch& done) {
  co_await pool.schedule();
  const int id = ThreadExecutor::current_worker_id();
  if (id < 0 || id >= pool.size()) bad_ids.fetch_add(1);
  hits.fetch_add(1);
  done.count_down();
}

Detached blocking_job(ThreadExecutor& pool, std::atomic<int>& id, Flag& started, Flag& release,
                      Flag& finished) {
  co_await pool.schedule();
  id = ThreadExecutor::current_worker_id();
  started.set();
  release.wait_for(60s);
  finished.set();
}

Detached quick_job(ThreadExecutor& pool, std::mutex& m, std::vector<int>& ids, Countdown& done) {
  co_await pool.schedule();
  {
    std::lock_guard lock(m);
    ids.push_back(ThreadExecutor::current_worker_id());
  }
  done.count_down();
}

Detached rendezvous_job(ThreadExecutor& pool, Countdown& meet, std::mutex& m, std::set<int>& ids,
                        std::atomic<int>& met, Countdown& done) {
  co_await pool.schedule();
  if (meet.arrive_and_wait_for(30s)) met.fetch_add(1);
  {
    std::lock_guard lock(m);
    ids.insert(ThreadExecutor::current_worker_id());
  }
  done.count_down();
}

Detached gated_job(ThreadExecutor& pool, Flag& gate, std::atomic<int>& ran) {
  co_await pool.schedule();
  gate.wait_for(60s);
  ran.fetch_add(1);
}

// Queued with `order` (0: post, without one), then records `label` where it runs.
Detached ordered_job(ThreadExecutor& pool, std::uint64_t order, int label, std::mutex& m,
                     std::vector<int>& ran, Countdown& done) {
  struct Post {
    ThreadExecutor* pool;
    std::uint64_t order;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const {
      if (order == 0) {
        pool->post(h);
      } else {
        static_cast<Scheduler*>(pool)->post_ordered(h, order);
      }
    }
    void await_resume() const noexcept {}
  };
  co_await Post{&pool, order};
  {
    std::lock_guard lock(m);
    ran.push_back(label);
  }
  done.count_down();
}

Detached simple_job(ThreadExecutor& pool, std::atomic<int>& ran) {
  co_await pool.schedule();
  ran.fetch_add(1);
}

// Hops onto the pool `hops` times, checking each time that it is on a worker.
Task<int> hopping(ThreadExecutor& pool, int hops) {
  int on_worker = 0;
  for (int i = 0; i < hops; ++i) {
    co_await pool.schedule();
    if (ThreadExecutor::current_worker_id() >= 0) ++on_worker;
  }
  co_return on_worker;
}

// The names (comm) of this process's threads that start with `prefix`.
std::multiset<std::string> thread_names(const std::string& prefix) {
  std::multiset<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind(prefix, 0) == 0) names.insert(name);
  }
  return names;
}

// Threads with this prefix still listed in /proc/self/task, after waiting (bounded) for the
// kernel to reap joined threads: pthread_join returns when the thread has cleared its tid, a
// moment before the kernel unlists it, so there is no event to wait on but the listing itself.
std::size_t lingering_threads(const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::size_t n = thread_names(prefix).size();
  while (n != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    n = thread_names(prefix).size();
  }
  return n;
}

}  // namespace

TEST_SUITE("exec") {
  TEST_CASE("a ThreadExecutor has the number of threads asked for, and at least one") {
    ThreadExecutor four(4);
    CHECK(four.size() == 4);
    ThreadExecutor zero(0);
    CHECK(zero.size() == 1);
    ThreadExecutor negative(-3);
    CHECK(negative.size() == 1);
  }

  TEST_CASE("schedule() continues the coroutine on a worker, whose id is in [0, n)") {
    ThreadExecutor pool(3);
    CHECK(ThreadExecutor::current_worker_id() == -1);
    const auto main_thread = std::this_thread::get_id();
    for (int i = 0; i < 30; ++i) {
      const Where w = sync_wait(where_scheduled(pool));
      CHECK(w.worker_id >= 0);
      CHECK(w.worker_id < 3);
      CHECK(w.thread != main_thread);
    }
    // Still -1 on the main thread afterwards, and on any thread the pool does not own.
    CHECK(ThreadExecutor::current_worker_id() == -1);
    int foreign = 0;
    std::thread([&] { foreign = ThreadExecutor::current_worker_id(); }).join();
    CHECK(foreign == -1);
  }

  TEST_CASE("schedule_on(w) continues the coroutine on worker w, always the same thread") {
    ThreadExecutor pool(3);
    std::vector<std::thread::id> threads(3);
    for (int round = 0; round < 10; ++round) {
      for (int w = 0; w < 3; ++w) {
        const Where where = sync_wait(where_pinned(pool, w));
        CHECK(where.worker_id == w);
        if (round == 0) threads[static_cast<std::size_t>(w)] = where.thread;
        CHECK(where.thread == threads[static_cast<std::size_t>(w)]);
      }
    }
    CHECK(threads[0] != threads[1]);
    CHECK(threads[1] != threads[2]);
    CHECK_THROWS_AS(pool.post_to(3, std::noop_coroutine()), std::out_of_range);
  }

  TEST_CASE("a coroutine may hop onto the pool repeatedly") {
    ThreadExecutor pool(2);
    CHECK(sync_wait(hopping(pool, 100)) == 100);
  }

  TEST_CASE("every scheduled job runs exactly once") {
    constexpr int n = 2000;
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> bad_ids{0};
    std::latch done(n);
    {
      ThreadExecutor pool(4);
      for (int i = 0; i < n; ++i) count_job(pool, hits[static_cast<std::size_t>(i)], bad_ids, done);
      done.wait();
    }
    int total = 0;
    int exactly_once = 0;
    for (const auto& h : hits) {
      total += h.load();
      if (h.load() == 1) ++exactly_once;
    }
    CHECK(total == n);
    CHECK(exactly_once == n);
    CHECK(bad_ids.load() == 0);
  }

  TEST_CASE("jobs may be scheduled from several threads at once") {
    constexpr int threads = 4;
    constexpr int per_thread = 250;
    std::vector<std::atomic<int>> hits(threads * per_thread);
    std::atomic<int> bad_ids{0};
    std::latch done(threads * per_thread);
    {
      ThreadExecutor pool(3);
      std::vector<std::thread> posters;
      for (int t = 0; t < threads; ++t) {
        posters.emplace_back([&, t] {
          for (int i = 0; i < per_thread; ++i) {
            count_job(pool, hits[static_cast<std::size_t>(t * per_thread + i)], bad_ids, done);
          }
        });
      }
      for (auto& p : posters) p.join();
      done.wait();
    }
    int exactly_once = 0;
    for (const auto& h : hits) exactly_once += h.load() == 1 ? 1 : 0;
    CHECK(exactly_once == threads * per_thread);
    CHECK(bad_ids.load() == 0);
  }

  TEST_CASE("n jobs that wait for each other run at once on the n distinct workers") {
    Countdown meet(3);
    Countdown done(3);
    std::mutex m;
    std::set<int> ids;
    std::atomic<int> met{0};
    {
      ThreadExecutor pool(3);
      for (int i = 0; i < 3; ++i) rendezvous_job(pool, meet, m, ids, met, done);
      REQUIRE(done.wait_for(120s));
    }
    CHECK(met.load() == 3);
    CHECK(ids == std::set<int>{0, 1, 2});
  }

  TEST_CASE("set_active(k) lets only workers 0..k-1 take shared work; pinned work reaches all") {
    ThreadExecutor pool(3);
    CHECK(pool.active() == 3);
    pool.set_active(1);
    CHECK(pool.active() == 1);
    for (int i = 0; i < 50; ++i) CHECK(sync_wait(where_scheduled(pool)).worker_id == 0);
    CHECK(sync_wait(where_pinned(pool, 2)).worker_id == 2);  // a sleeping worker serves its own
    pool.set_active(0);
    CHECK(pool.active() == 1);  // clamped to [1, size()]
    pool.set_active(10);
    CHECK(pool.active() == 3);
    // Let back in, all three take shared work at once again.
    pool.set_active(2);
    pool.set_active(3);
    Countdown meet(3), done(3);
    std::mutex m;
    std::set<int> ids;
    std::atomic<int> met{0};
    for (int i = 0; i < 3; ++i) rendezvous_job(pool, meet, m, ids, met, done);
    REQUIRE(done.wait_for(120s));
    CHECK(met.load() == 3);
    CHECK(ids == std::set<int>{0, 1, 2});
  }

  TEST_CASE("a worker busy in a job adds no idle time; the pool's idle time only grows") {
    Flag started, release, finished;
    std::atomic<int> id{-1};
    ThreadExecutor pool(2);
    pool.set_active(1);  // the blocking job can only land on worker 0
    CHECK(pool.idle_nanoseconds(0) == 0);
    const std::int64_t before = pool.idle_nanoseconds(2);
    CHECK(before >= 0);
    blocking_job(pool, id, started, release, finished);
    REQUIRE(started.wait_for(30s));
    CHECK(id.load() == 0);
    const std::int64_t busy_a = pool.idle_nanoseconds(1);
    const std::int64_t all_a = pool.idle_nanoseconds(2);
    const Where w = sync_wait(where_pinned(pool, 1));  // worker 1 wakes and sleeps again
    CHECK(w.worker_id == 1);
    CHECK(pool.idle_nanoseconds(1) == busy_a);  // worker 0 is still in its job
    CHECK(pool.idle_nanoseconds(2) >= all_a);
    CHECK(all_a >= before);
    release.set();
    CHECK(finished.wait_for(30s));
  }

  TEST_CASE("a slow job does not hold back jobs queued behind it while another worker is free") {
    Flag started, release, finished;
    std::atomic<int> slow_id{-1};
    std::mutex m;
    std::vector<int> quick_ids;
    Countdown quick_done(10);
    {
      ThreadExecutor pool(2);
      blocking_job(pool, slow_id, started, release, finished);
      REQUIRE(started.wait_for(30s));
      for (int i = 0; i < 10; ++i) quick_job(pool, m, quick_ids, quick_done);
      // The slow job is still blocked: the quick ones must all finish on the other worker.
      CHECK(quick_done.wait_for(30s));
      release.set();
      CHECK(finished.wait_for(30s));
    }
    const int other = 1 - slow_id.load();
    CHECK(quick_ids == std::vector<int>(10, other));
  }

  TEST_CASE("work posted with an order runs lowest first, equal orders as posted, after all "
            "work posted without one") {
    // One worker, held by a job while everything is queued: the order it then runs them in is
    // the queue's alone (a loader's oldest batch in flight is finished first this way).
    Flag started, release, finished;
    std::atomic<int> id{-1};
    std::mutex m;
    std::vector<int> ran;
    const std::vector<std::pair<std::uint64_t, int>> posts{
        {7, 70}, {3, 30}, {0, 1}, {3, 31}, {1, 10}, {0, 2}, {9, 90}, {3, 32}, {1, 11}, {0, 3}};
    Countdown done(static_cast<int>(posts.size()));
    {
      ThreadExecutor pool(1);
      blocking_job(pool, id, started, release, finished);
      REQUIRE(started.wait_for(30s));
      for (const auto& [order, label] : posts) ordered_job(pool, order, label, m, ran, done);
      release.set();
      REQUIRE(done.wait_for(30s));
      CHECK(finished.wait_for(30s));
    }
    CHECK(ran == std::vector<int>{1, 2, 3, 10, 11, 30, 31, 32, 70, 90});
  }

  TEST_CASE("the destructor runs every queued job, then joins") {
    Flag gate;
    std::atomic<int> ran{0};
    std::mutex m;
    std::vector<int> ordered_ran;
    Countdown ordered_done(20);
    {
      ThreadExecutor pool(1);
      gated_job(pool, gate, ran);
      for (int i = 0; i < 50; ++i) simple_job(pool, ran);
      for (int i = 0; i < 20; ++i) {
        ordered_job(pool, static_cast<std::uint64_t>(20 - i), i, m, ordered_ran, ordered_done);
      }
      gate.set();
    }
    // No waiting: the destructor has returned, so all 51 and the 20 ordered ones have run.
    CHECK(ran.load() == 51);
    CHECK(ordered_ran.size() == 20);
    CHECK(ordered_ran.front() == 19);  // the lowest order, posted last
    CHECK(ordered_ran.back() == 0);
  }

  TEST_CASE("worker threads are named <name><id>, cut to 15 characters, and gone after destruction") {
    REQUIRE(thread_names("exectest").empty());
    {
      ThreadExecutor pool(3, "exectest");
      CHECK(thread_names("exectest") ==
            std::multiset<std::string>{"exectest0", "exectest1", "exectest2"});
    }
    CHECK(lingering_threads("exectest") == 0);

    REQUIRE(thread_names("abcdefghij").empty());
    {
      ThreadExecutor pool(2, "abcdefghijklmnopqrst");
      CHECK(thread_names("abcdefghij") ==
            std::multiset<std::string>{"abcdefghijklmno", "abcdefghijklmno"});
    }
    CHECK(lingering_threads("abcdefghij") == 0);

    // The default name.
    REQUIRE(thread_names("coload-w").empty());
    {
      ThreadExecutor pool(2);
      CHECK(thread_names("coload-w") == std::multiset<std::string>{"coload-w0", "coload-w1"});
    }
    CHECK(lingering_threads("coload-w") == 0);
  }

  TEST_CASE("get_worker_info is empty outside a worker") {
    CHECK_FALSE(get_worker_info().has_value());
    CHECK(coload::detail::current_worker_info() == nullptr);
    ThreadExecutor pool(1);
    bool empty_on_plain_thread = false;
    std::thread([&] { empty_on_plain_thread = !get_worker_info().has_value(); }).join();
    CHECK(empty_on_plain_thread);
  }

  TEST_CASE("detail::set_worker_info installs a thread's worker info, and nullptr clears it") {
    const std::vector<int> dataset{1, 2, 3};
    const WorkerInfo info{2, 4, 12345, &dataset};
    coload::detail::set_worker_info(&info);
    CHECK(coload::detail::current_worker_info() == &info);
    const std::optional<WorkerInfo> got = get_worker_info();
    REQUIRE(got.has_value());
    CHECK(got->id == 2);
    CHECK(got->num_workers == 4);
    CHECK(got->seed == 12345);
    CHECK(got->dataset == &dataset);
    CHECK(got->dataset_as<std::vector<int>>() == &dataset);
    CHECK(got->dataset_as<std::vector<int>>()->at(2) == 3);

    // Per thread: another thread does not see it, and what it installs stays its own.
    bool other_empty = false;
    const WorkerInfo other_info{0, 1, 7, nullptr};
    int other_id = -1;
    std::thread([&] {
      other_empty = !get_worker_info().has_value();
      coload::detail::set_worker_info(&other_info);
      other_id = get_worker_info()->id;
    }).join();
    CHECK(other_empty);
    CHECK(other_id == 0);
    CHECK(get_worker_info()->id == 2);

    coload::detail::set_worker_info(nullptr);
    CHECK_FALSE(get_worker_info().has_value());
    CHECK(coload::detail::current_worker_info() == nullptr);
  }

  TEST_CASE("a default WorkerInfo is worker 0 of 0 with no dataset") {
    const WorkerInfo info;
    CHECK(info.id == 0);
    CHECK(info.num_workers == 0);
    CHECK(info.seed == 0);
    CHECK(info.dataset == nullptr);
    CHECK(info.dataset_as<int>() == nullptr);
  }
}
