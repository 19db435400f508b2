// Specification of the coroutine core: Task, Generator, AsyncGenerator, sync_wait, AsyncScope,
// Detached.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <latch>
#include <limits>
#include <mutex>
#include <memory>
#include <numeric>
#include <ranges>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/counted.hpp"
#include "coload/coro/coro.hpp"

using namespace coload;

namespace {

// NOTE: GCC emits symmetric transfer as a tail call only when it may optimise sibling calls;
// ASan and TSan instrumentation prevents that, so under them each synchronous completion
// nests a stack frame. The stack-depth cases are skipped there (they run in every other build).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kNoTailCalls = true;
#else
constexpr bool kNoTailCalls = false;
#endif

using coload::test::Counted;

Task<int> answer() { co_return 42; }
Task<int> add_one(Task<int> inner) { co_return co_await std::move(inner) + 1; }
Task<void> throws_logic() {
  throw std::logic_error("task failed");
  co_return;
}
Task<int> throws_int() {
  throw std::runtime_error("int task failed");
  co_return 0;
}

// A one-shot event a coroutine can wait on, set from another thread.
struct ThreadResume {
  std::thread* thread;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    detail::ResumeQueue* q = detail::current_resume_queue;
    *thread = std::thread([h, q] { detail::resume_on(q, h); });
  }
  void await_resume() const noexcept {}
};

// A one-shot event the test sets: waiters resume inline, in the order they waited, on the
// thread that calls set().
class ManualEvent {
 public:
  // NOTE: a separate awaiter, not the event itself: GCC 12 copies an lvalue awaiter reached
  // through a lambda's reference capture, so a waiter would queue on the copy.
  auto operator co_await() noexcept {
    struct Awaiter {
      ManualEvent* event;
      bool await_ready() const noexcept { return event->set_; }
      void await_suspend(std::coroutine_handle<> h) { event->waiters_.push_back(h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{this};
  }
  void set() {
    set_ = true;
    for (auto h : std::exchange(waiters_, {})) h.resume();
  }

 private:
  bool set_ = false;
  std::vector<std::coroutine_handle<>> waiters_;
};

// A thread that resumes the coroutines scheduled onto it, in order.
class Loop {
 public:
  Loop() : thread_([this] { run(); }) {}
  ~Loop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  auto schedule() {
    struct Awaiter {
      Loop* loop;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) { loop->post(h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{this};
  }
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void post(std::coroutine_handle<> h) {
    std::lock_guard lock(mutex_);
    queue_.push_back(h);
    ready_.notify_one();
  }
  void run() {
    for (;;) {
      std::coroutine_handle<> h;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        h = queue_.front();
        queue_.pop_front();
      }
      h.resume();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::coroutine_handle<>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The address of this function's own frame: how deep the stack is where it is called.
[[gnu::noinline]] std::uintptr_t stack_depth() {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

}  // namespace

TEST_SUITE("coro") {
  TEST_CASE("a task is lazy: its body runs only when awaited") {
    int runs = 0;
    // NOTE: a capturing lambda coroutine must outlive its frame, so it is named, not a temporary.
    auto body = [&]() -> Task<int> {
      ++runs;
      co_return 7;
    };
    auto t = body();
    CHECK(runs == 0);
    CHECK_FALSE(t.is_ready());
    CHECK(sync_wait(std::move(t)) == 7);
    CHECK(runs == 1);
  }

  TEST_CASE("a task chain returns the inner value") {
    CHECK(sync_wait(add_one(add_one(answer()))) == 44);
  }

  TEST_CASE("a task's exception is rethrown at the awaiter, with its type and message") {
    CHECK_THROWS_WITH_AS(sync_wait(throws_logic()), "task failed", std::logic_error);
    auto outer = []() -> Task<std::string> {
      try {
        co_await throws_int();
      } catch (const std::runtime_error& e) {
        co_return std::string("caught: ") + e.what();
      }
      co_return "not caught";
    };
    CHECK(sync_wait(outer()) == "caught: int task failed");
  }

  TEST_CASE("a million synchronous completions in a loop do not overflow the stack" *
            doctest::skip(kNoTailCalls)) {
    auto loop = []() -> Task<long> {
      long sum = 0;
      for (int i = 0; i < 1'000'000; ++i) sum += co_await answer();
      co_return sum;
    };
    CHECK(sync_wait(loop()) == 42'000'000L);
  }

  TEST_CASE("a task holds move-only and reference results") {
    auto unique = []() -> Task<std::unique_ptr<int>> { co_return std::make_unique<int>(5); };
    CHECK(*sync_wait(unique()) == 5);
    int target = 1;
    auto ref = [&]() -> Task<int&> { co_return target; };
    int& r = sync_wait(ref());
    r = 9;
    CHECK(target == 9);
  }

  TEST_CASE("a destroyed, never-started task destroys its arguments exactly once") {
    Counted::reset();
    {
      auto t = [](Counted c) -> Task<int> { co_return c.value; }(Counted{3});
    }
    CHECK(Counted::alive() == 0);
    CHECK(Counted::constructed >= 1);
  }

  TEST_CASE("sync_wait resumes a coroutine completed by another thread on the waiting thread") {
    std::thread other;
    const auto waiting = std::this_thread::get_id();
    auto t = [&]() -> Task<bool> {
      co_await ThreadResume{&other};
      co_return std::this_thread::get_id() == waiting;
    };
    CHECK(sync_wait(t()));
    other.join();
  }

  TEST_CASE("a Generator is an input range that works with std::ranges algorithms") {
    auto squares = [](int n) -> Generator<int> {
      for (int i = 0; i < n; ++i) co_yield i * i;
    };
    static_assert(std::ranges::input_range<Generator<int>>);
    static_assert(std::ranges::view<Generator<int>>);
    std::vector<int> out;
    std::ranges::copy(squares(5), std::back_inserter(out));
    CHECK(out == std::vector<int>{0, 1, 4, 9, 16});
    auto evens = squares(6) | std::views::filter([](int v) { return v % 2 == 0; });
    std::vector<int> even_out;
    for (int v : evens) even_out.push_back(v);
    CHECK(even_out == std::vector<int>{0, 4, 16});
    auto g = squares(4);
    CHECK(std::ranges::count_if(g, [](int v) { return v > 1; }) == 2);
  }

  TEST_CASE("a Generator rethrows the body's exception from the iterator step") {
    auto g = []() -> Generator<int> {
      co_yield 1;
      throw std::runtime_error("generator failed");
    }();
    auto it = g.begin();
    CHECK(*it == 1);
    CHECK_THROWS_WITH_AS(++it, "generator failed", std::runtime_error);
  }

  TEST_CASE("a Generator yields by address: references and move-only values") {
    std::vector<int> data{1, 2, 3};
    auto refs = [&]() -> Generator<int&> {
      for (int& v : data) co_yield v;
    };
    for (int& v : refs()) v *= 10;
    CHECK(data == std::vector<int>{10, 20, 30});
    auto owned = []() -> Generator<std::unique_ptr<int>> {
      co_yield std::make_unique<int>(4);
      co_yield std::make_unique<int>(5);
    };
    int sum = 0;
    for (auto& p : owned()) {
      auto taken = std::move(p);
      sum += *taken;
    }
    CHECK(sum == 9);
  }

  TEST_CASE("destroying a Generator early destroys the values in scope exactly once") {
    Counted::reset();
    {
      auto g = []() -> Generator<Counted> {
        Counted local(1);
        for (int i = 0; i < 100; ++i) co_yield Counted(i);
      }();
      int seen = 0;
      for (auto& c : g) {
        if (++seen == 3) break;
        (void)c;
      }
      CHECK(Counted::alive() == 2);  // `local` and the yielded temporary at the suspension point
    }
    CHECK(Counted::alive() == 0);
  }

  TEST_CASE("an AsyncGenerator yields values in order, by address, and then nullptr") {
    auto gen = []() -> AsyncGenerator<int> {
      for (int i = 0; i < 3; ++i) {
        co_await answer();
        co_yield i;
      }
    };
    auto consume = [&]() -> Task<std::vector<int>> {
      std::vector<int> out;
      auto g = gen();
      while (auto v = co_await g.next()) out.push_back(*v);
      CHECK(co_await g.next() == nullptr);
      co_return out;
    };
    CHECK(sync_wait(consume()) == std::vector<int>{0, 1, 2});
  }

  TEST_CASE("an AsyncGenerator rethrows the producer's exception at the consumer") {
    auto consume = []() -> Task<int> {
      auto g = []() -> AsyncGenerator<int> {
        co_yield 1;
        throw std::out_of_range("producer failed");
      }();
      int got = 0;
      try {
        while (auto v = co_await g.next()) got += *v;
      } catch (const std::out_of_range& e) {
        CHECK(std::string(e.what()) == "producer failed");
        got += 100;
      }
      CHECK(co_await g.next() == nullptr);  // finished after the error
      co_return got;
    };
    CHECK(sync_wait(consume()) == 101);
  }

  TEST_CASE("an AsyncGenerator may be destroyed between next() calls without running further") {
    Counted::reset();
    int steps = 0;
    auto consume = [&]() -> Task<int> {
      auto producer = [&]() -> AsyncGenerator<Counted> {
        Counted local(-1);
        for (int i = 0; i < 10; ++i) {
          ++steps;
          co_yield Counted(i);
        }
      };
      auto g = producer();
      auto v = co_await g.next();
      int first = v->value;
      co_await g.next();
      co_return first;  // g destroyed here, suspended at its second co_yield
    };
    CHECK(sync_wait(consume()) == 0);
    CHECK(steps == 2);
    CHECK(Counted::alive() == 0);
    CHECK(Counted::constructed == 3);
  }

  TEST_CASE("an AsyncGenerator handles references and move-only values") {
    auto consume = []() -> Task<int> {
      int a = 1, b = 2;
      auto make_refs = [&]() -> AsyncGenerator<int&> {
        co_yield a;
        co_yield b;
      };
      auto refs = make_refs();
      while (auto v = co_await refs.next()) *v += 10;
      auto owned = []() -> AsyncGenerator<std::unique_ptr<int>> {
        co_yield std::make_unique<int>(7);
      }();
      auto p = co_await owned.next();
      auto taken = std::move(*p);
      co_return a + b + *taken;
    };
    CHECK(sync_wait(consume()) == 11 + 12 + 7);
  }

  TEST_CASE("a million synchronous AsyncGenerator yields do not overflow the stack" *
            doctest::skip(kNoTailCalls)) {
    auto consume = []() -> Task<long> {
      auto g = []() -> AsyncGenerator<int> {
        for (int i = 0; i < 1'000'000; ++i) co_yield 1;
      }();
      long n = 0;
      while (auto v = co_await g.next()) n += *v;
      co_return n;
    };
    CHECK(sync_wait(consume()) == 1'000'000);
  }
}

TEST_SUITE("coro") {
  TEST_CASE("joining an empty scope completes at once, and so does joining it again") {
    AsyncScope scope;
    int joined = 0;
    auto joiner = [&]() -> Detached {
      co_await scope.join();
      ++joined;
      co_await scope.join();
      ++joined;
    };
    joiner();
    CHECK(joined == 2);
  }

  TEST_CASE("join completes only after the last spawned task has finished") {
    std::vector<std::string> log;
    ManualEvent first, second;
    auto work = [&log](ManualEvent& event, std::string name) -> Task<void> {
      log.push_back(name + " started");
      co_await event;
      log.push_back(name + " finished");
    };
    AsyncScope scope;
    scope.spawn(work(first, "a"));
    scope.spawn(work(second, "b"));
    CHECK(log == std::vector<std::string>{"a started", "b started"});
    auto joiner = [&]() -> Detached {
      co_await scope.join();
      log.push_back("joined");
    };
    joiner();
    CHECK(log.size() == 2);
    second.set();
    CHECK(log.back() == "b finished");
    first.set();
    CHECK(log == std::vector<std::string>{"a started", "b started", "b finished", "a finished",
                                          "joined"});
  }

  TEST_CASE("a spawned task's frame and arguments are destroyed before the joiner resumes") {
    Counted::reset();
    ManualEvent go;
    AsyncScope scope;
    auto hold = [](ManualEvent& event, Counted c) -> Task<void> {
      co_await event;
      CHECK(c.value >= 0);
    };
    for (int i = 0; i < 3; ++i) scope.spawn(hold(go, Counted(i)));
    CHECK(Counted::alive() == 3);  // one argument in each suspended frame
    int alive_at_join = -1;
    auto joiner = [&]() -> Detached {
      co_await scope.join();
      alive_at_join = Counted::alive();
    };
    joiner();
    go.set();
    CHECK(alive_at_join == 0);
    CHECK(Counted::alive() == 0);
    CHECK(Counted::constructed >= 6);
  }

  TEST_CASE("when_all destroys every task's frame and arguments before its caller resumes") {
    // The last task to finish resumes the caller inline: its frame (and an error its promise
    // holds) must already be gone, or it is freed behind a caller that handed the result on.
    Counted::reset();
    ManualEvent go;
    auto hold = [](ManualEvent& event, Counted c) -> Task<int> {
      co_await event;
      if (c.value == 1) throw std::runtime_error("task 1 failed");
      co_return c.value;
    };
    int alive_at_resume = -1;
    std::string error;
    auto caller = [&]() -> Detached {
      std::vector<Task<int>> tasks;
      for (int i = 0; i < 3; ++i) tasks.push_back(hold(go, Counted(i)));
      try {
        co_await when_all(std::move(tasks));
      } catch (const std::runtime_error& e) {
        error = e.what();
      }
      alive_at_resume = Counted::alive();
    };
    caller();
    CHECK(Counted::alive() == 3);  // one argument in each suspended frame
    go.set();
    CHECK(error == "task 1 failed");
    CHECK(alive_at_resume == 0);
    CHECK(Counted::alive() == 0);
  }

  TEST_CASE("an exception escaping spawned work is rethrown by join once all work has finished") {
    std::vector<std::string> log;
    ManualEvent go;
    auto fail_now = []() -> Task<void> {
      throw std::runtime_error("first failure");
      co_return;
    };
    auto fail_later = [&log](ManualEvent& event) -> Task<void> {
      co_await event;
      log.push_back("later failed");
      throw std::logic_error("second failure");  // dropped: the first is kept
    };
    auto finish_later = [&log](ManualEvent& event) -> Task<void> {
      co_await event;
      log.push_back("other finished");
    };
    AsyncScope scope;
    scope.spawn(fail_now());
    scope.spawn(fail_later(go));
    scope.spawn(finish_later(go));
    auto joiner = [&]() -> Detached {
      try {
        co_await scope.join();
        log.push_back("joined without error");
      } catch (const std::exception& e) {
        log.push_back(std::string("join threw: ") + e.what());
      }
    };
    joiner();
    CHECK(log.empty());
    go.set();
    CHECK(log == std::vector<std::string>{"later failed", "other finished",
                                          "join threw: first failure"});
  }

  TEST_CASE("a million spawns that complete synchronously do not grow the stack") {
    AsyncScope scope;
    long runs = 0;
    std::uintptr_t lowest = std::numeric_limits<std::uintptr_t>::max(), highest = 0;
    auto body = [&]() -> Task<void> {
      const std::uintptr_t depth = stack_depth();
      lowest = std::min(lowest, depth);
      highest = std::max(highest, depth);
      ++runs;
      co_return;
    };
    auto spawner = [&]() -> Task<void> {
      for (int i = 0; i < 1'000'000; ++i) scope.spawn(body());
      co_await scope.join();
    };
    sync_wait(spawner());
    CHECK(runs == 1'000'000);
    CHECK(highest - lowest < 4096);
  }

  TEST_CASE("the joiner resumes on the thread that finishes the last spawned task") {
    ManualEvent go;
    AsyncScope scope;
    auto wait_for = [](ManualEvent& event) -> Task<void> { co_await event; };
    scope.spawn(wait_for(go));
    std::thread::id resumed_on;
    auto joiner = [&]() -> Detached {
      co_await scope.join();
      resumed_on = std::this_thread::get_id();
    };
    joiner();
    CHECK(resumed_on == std::thread::id{});
    std::thread other([&] { go.set(); });
    const auto other_id = other.get_id();
    other.join();
    CHECK(resumed_on == other_id);
  }

  TEST_CASE("spawns from two threads and completions on two others are all joined") {
    constexpr int kPerThread = 20'000;
    std::atomic<int> finished{0};
    AsyncScope scope;
    Loop loops[2];
    auto hop = [&finished](Loop& loop) -> Task<void> {
      co_await loop.schedule();
      finished.fetch_add(1, std::memory_order_relaxed);
    };
    std::latch start(2);
    auto spawner = [&](int k) {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) scope.spawn(hop(loops[(i + k) % 2]));
    };
    std::thread a(spawner, 0), b(spawner, 1);
    a.join();
    b.join();
    std::thread::id resumed_on;
    auto join_and_note = [&]() -> Task<void> {
      co_await scope.join();
      resumed_on = std::this_thread::get_id();
    };
    sync_wait(join_and_note());
    CHECK(finished.load() == 2 * kPerThread);
    CHECK((resumed_on == loops[0].id() || resumed_on == loops[1].id() ||
           resumed_on == std::this_thread::get_id()));
  }

  TEST_CASE("a Detached coroutine starts at once and frees its frame when its body ends") {
    Counted::reset();
    ManualEvent go;
    bool started = false, ended = false;
    auto body = [&](Counted c) -> Detached {
      started = true;
      co_await go;
      ended = c.value == 1;
    };
    body(Counted(1));
    CHECK(started);
    CHECK_FALSE(ended);
    CHECK(Counted::alive() == 1);
    go.set();
    CHECK(ended);
    CHECK(Counted::alive() == 0);
  }
}
