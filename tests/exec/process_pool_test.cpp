// Specification of the process pool without a DataLoader: tasks in, batches and errors out,
// deaths named, restarts, shutdown leaving no child behind, and malformed messages refused.
#include <doctest/doctest.h>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <fstream>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "coload/collate/wire.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/exec/process.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/loader/errors.hpp"
#include "../support/warnings.hpp"
#include "exec/messages.hpp"  // lib/exec: the messages, for the malformed-message cases
#include "exec/workers.hpp"   // lib/exec: forkserver_spawn, forkserver_status

using namespace coload;
using namespace coload::detail;
using namespace std::chrono_literals;

namespace {

/// What a test worker answers: each index times two, the worker's pid and id.
using Answer = std::tuple<std::vector<std::int64_t>, std::int64_t, std::int64_t>;

/// How a test worker treats an index: fetch it, or fail in some way.
struct Faults {
  std::int64_t throw_at = -1;    // throws std::out_of_range("no row N")
  std::int64_t wrapped_at = -1;  // throws the WorkerError naming the sample
  std::int64_t empty_at = -1;    // throws EmptyBatch
  std::int64_t skip_at = -1;     // counts one skipped sample, fetches the others
  std::int64_t kill_at = -1;     // raise(SIGKILL), the first `kill_times` times
  std::int64_t exit_at = -1;     // _exit(3)
  std::int64_t block_at = -1;    // waits for a signal, forever
  std::int64_t lie_at = -1;      // answers for another batch than the one it was given
  std::int64_t overrun_at = -1;  // says its batch runs past the end of its slot
  std::int64_t gate_at = -1;     // reads a byte from `gate_fd` (a pipe) first: held till then
  int gate_fd = -1;
  int exit0_worker = -1;         // this worker exits with code 0 as it starts
  int kill_times = 1 << 30;
};

/// Memory shared by the test and every worker it forks (a MAP_SHARED anonymous mapping).
struct Shared {
  std::atomic<int> kills{0};
  std::atomic<int> starts{0};
  std::atomic<std::int64_t> exited_pid{0};  // the exit0_worker's
};

Shared* shared_page() {
  static Shared* page = [] {
    void* p =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    return new (p) Shared;
  }();
  return page;
}

/// The child's work of a test pool: `state` is the child's own copy once forked.
ChildWork test_work(Faults faults) {
  struct State {
    int id = -1;
    std::int64_t skipped = 0;
    WorkerInfo info;
  };
  auto state = std::make_shared<State>();
  Shared* shared = shared_page();
  ChildWork work;
  work.start = [state, shared, faults](int id) {
    state->id = id;
    shared->starts.fetch_add(1);
    if (id == faults.exit0_worker) {
      shared->exited_pid = ::getpid();
      ::_exit(0);
    }
  };
  work.fetch = [state, faults, shared](const ProcessTask& task, ChildLink& link,
                                       ProcessReply& reply) {
    state->info.id = state->id;
    set_worker_info(&state->info);
    std::vector<std::int64_t> doubled;
    for (const std::int64_t i : task.indices) {
      if (i == faults.throw_at) throw std::out_of_range("no row " + std::to_string(i));
      if (i == faults.wrapped_at) {
        try {
          throw std::invalid_argument("bad sample");
        } catch (...) {
          throw wrap_current_exception(state->id, task.batch, i, "fetching");
        }
      }
      if (i == faults.empty_at) throw EmptyBatch{};
      if (i == faults.kill_at && shared->kills.fetch_add(1) < faults.kill_times) {
        ::raise(SIGKILL);
      }
      if (i == faults.exit_at) ::_exit(3);
      if (i == faults.gate_at) {
        char byte = 0;
        while (::read(faults.gate_fd, &byte, 1) < 0 && errno == EINTR) {
        }
      }
      if (i == faults.block_at) {
        for (;;) ::pause();
      }
      if (i == faults.skip_at) {
        ++state->skipped;
        continue;
      }
      doubled.push_back(2 * i);
    }
    if (task.kind == ProcessTask::Kind::stream) reply.stream_over = true;
    encode_batch(link, Answer{doubled, ::getpid(), state->id}, reply);
    for (const std::int64_t i : task.indices) {
      if (i == faults.lie_at) reply.batch = task.batch + 1000;
      if (i == faults.overrun_at) reply.bytes = std::uint64_t{1} << 41;  // past any slot
    }
  };
  work.skipped = [state] { return state->skipped; };
  return work;
}

/// A coroutine that starts at once and records what an awaited submit gave.
struct Outcome {
  std::optional<ProcessResult> result;
  std::exception_ptr error;
  bool done = false;
};

struct Eager {
  struct promise_type {
    Eager get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_never final_suspend() const noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

Eager await_into(ProcessPool::Awaiter awaiter, std::shared_ptr<Outcome> out) {
  try {
    out->result.emplace(co_await awaiter);
  } catch (...) {
    out->error = std::current_exception();
  }
  out->done = true;
}

std::shared_ptr<Outcome> submit(ProcessPool& pool, int worker, std::vector<std::int64_t> indices,
                                std::int64_t batch,
                                ProcessTask::Kind kind = ProcessTask::Kind::fetch) {
  ProcessTask task;
  task.kind = kind;
  task.batch = batch;
  task.indices = std::move(indices);
  auto out = std::make_shared<Outcome>();
  await_into(pool.submit(worker, std::move(task)), out);
  return out;
}

/// Runs `io` until every outcome is done; false when it stalls (nothing left to run) or takes
/// longer than the limit, so a broken pool fails the test instead of hanging it.
bool run_until_done(asio::io_context& io, const std::vector<std::shared_ptr<Outcome>>& outs) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    bool all = true;
    for (const auto& o : outs) all = all && o->done;
    if (all) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.restart();
    if (io.run_one_for(deadline - now) == 0 && io.stopped()) return false;
  }
}

Answer answer_of(Outcome& out) {
  REQUIRE(out.done);
  if (out.error) std::rethrow_exception(out.error);
  REQUIRE(out.result);
  REQUIRE(out.result->reply.status == ProcessReply::Status::batch);
  return wire::decode<Answer>(out.result->bytes, static_cast<std::size_t>(out.result->reply.offset),
                              out.result->lease);
}

/// True when `pid` is neither running nor a zombie waiting to be reaped.
bool gone(std::int64_t pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
}

ProcessPool::Options pool_options(int workers, OnWorkerDeath on_death = OnWorkerDeath::raise) {
  ProcessPool::Options o;
  o.num_workers = workers;
  o.on_death = on_death;
  o.max_restarts = 3;
  return o;
}

using coload::test::Warnings;

/// EPOLL_CTL_ADDs let through before one fails with ENOSPC (fs.epoll.max_user_watches
/// reached); -1: none fails. Read by the epoll_ctl below.
std::atomic<int> epoll_adds_before_failure{-1};

/// Open fds of this process.
int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

/// A fork-server worker's whole body: it exits at once.
void exit_at_once(int, int, int, int) { ::_exit(0); }

/// Runs `body` in a process of its own (its fork server goes with it, and no other case sees
/// it); its wait status: exited with body's code, or 1 where body threw.
int status_in_own_process(const std::function<int()>& body) {
  const pid_t tester = ::fork();
  REQUIRE(tester >= 0);
  if (tester == 0) {
    int code = 1;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(tester, &status, 0) == tester);
  return status;
}

}  // namespace

// Stands in for libc's (asio's reactor calls it, in libcoload as here: the executable's
// definition comes first): the failure of a descriptor's registration, on demand.
extern "C" int epoll_ctl(int epfd, int op, int fd, epoll_event* event) noexcept {
  if (op == EPOLL_CTL_ADD) {
    const int left = epoll_adds_before_failure.load();
    if (left >= 0) {
      epoll_adds_before_failure.store(left - 1);
      if (left == 0) {
        errno = ENOSPC;
        return -1;
      }
    }
  }
  // The next definition: libc's, or a sanitizer's interceptor in front of it.
  using EpollCtl = int (*)(int, int, int, epoll_event*);
  static const auto next = reinterpret_cast<EpollCtl>(::dlsym(RTLD_NEXT, "epoll_ctl"));
  return next(epfd, op, fd, event);
}

TEST_SUITE("process pool") {
  TEST_CASE("a pool of 2 workers answers each task with its batch, from the worker it went to") {
    asio::io_context io;
    std::vector<std::int64_t> pids;
    {
      ProcessPool pool(io, pool_options(2), test_work({}));
      pool.start();
      auto a = submit(pool, 0, {1, 2, 3}, 0);
      auto b = submit(pool, 1, {4, 5}, 1);
      auto c = submit(pool, 0, {6}, 2);
      auto d = submit(pool, -1, {7, 8}, 3);  // the live worker with the fewest tasks
      REQUIRE(run_until_done(io, {a, b, c, d}));
      const auto [va, pa, ia] = answer_of(*a);
      const auto [vb, pb, ib] = answer_of(*b);
      const auto [vc, pc, ic] = answer_of(*c);
      const auto [vd, pd, id] = answer_of(*d);
      CHECK(va == std::vector<std::int64_t>{2, 4, 6});
      CHECK(vb == std::vector<std::int64_t>{8, 10});
      CHECK(vc == std::vector<std::int64_t>{12});
      CHECK(vd == std::vector<std::int64_t>{14, 16});
      // The worker that answered is the one the task went to, in the parent's and its own view.
      CHECK(a->result->worker == 0);
      CHECK(ia == 0);
      CHECK(b->result->worker == 1);
      CHECK(ib == 1);
      CHECK(c->result->worker == 0);
      CHECK(pc == pa);
      CHECK(d->result->worker == id);
      // Two processes, neither of them this one.
      CHECK(pa != pb);
      CHECK(pa != ::getpid());
      CHECK(pb != ::getpid());
      CHECK(a->result->reply.batch == 0);
      CHECK(d->result->reply.batch == 3);
      CHECK(!pool.broken());
      pids = {pa, pb};
    }
    // The destructor reaped both.
    for (auto p : pids) CHECK(gone(p));
  }

  TEST_CASE("a fetch's failure comes back in the reply: its type, message and sample index") {
    asio::io_context io;
    Faults faults;
    faults.throw_at = 7;
    faults.wrapped_at = 8;
    faults.empty_at = 9;
    faults.skip_at = 10;
    ProcessPool pool(io, pool_options(2), test_work(faults));
    pool.start();
    auto plain = submit(pool, 0, {6, 7}, 4);
    auto wrapped = submit(pool, 1, {8}, 5);
    auto empty = submit(pool, 0, {9}, 6);
    auto skipped = submit(pool, 1, {10, 11}, 7);
    auto stream = submit(pool, 0, {7}, 8, ProcessTask::Kind::stream);
    auto after = submit(pool, 0, {1}, 9);
    REQUIRE(run_until_done(io, {plain, wrapped, empty, skipped, stream, after}));

    // Any exception: wrapped as WorkerError naming the worker and batch, no sample.
    REQUIRE(plain->result);
    const auto& p = plain->result->reply;
    CHECK(p.status == ProcessReply::Status::error);
    CHECK(p.batch == 4);
    CHECK(p.error_type == "std::out_of_range");
    CHECK(p.error_message == "no row 7");
    CHECK(p.error_index == -1);
    CHECK(p.error_what ==
          "Caught std::out_of_range in DataLoader worker 0 while fetching batch 4: no row 7");
    CHECK(!p.stream_over);
    CHECK(!plain->result->lease);

    // A WorkerError keeps its own fields, the sample index included.
    const auto& w = wrapped->result->reply;
    CHECK(w.status == ProcessReply::Status::error);
    CHECK(w.error_type == "std::invalid_argument");
    CHECK(w.error_message == "bad sample");
    CHECK(w.error_index == 8);
    CHECK(w.error_what ==
          "Caught std::invalid_argument in DataLoader worker 1 while fetching sample 8 of batch "
          "5: bad sample");

    // EmptyBatch: no batch, no error.
    CHECK(empty->result->reply.status == ProcessReply::Status::empty);
    CHECK(!empty->result->lease);

    // Skips are counted per reply.
    CHECK(skipped->result->reply.skipped == 1);
    CHECK(std::get<0>(answer_of(*skipped)) == std::vector<std::int64_t>{22});
    CHECK(plain->result->reply.skipped == 0);

    // A stream task's failure ends its stream.
    CHECK(stream->result->reply.status == ProcessReply::Status::error);
    CHECK(stream->result->reply.stream_over);

    // The worker goes on after a failure.
    CHECK(std::get<0>(answer_of(*after)) == std::vector<std::int64_t>{2});
    CHECK(!pool.broken());
  }

  TEST_CASE("a worker whose reply the parent cannot use is killed and reported as a death, "
            "saying why; the parent goes on") {
    // It answered for a batch it was not given: the parent's driver threw out of its loop,
    // which ended the whole process (std::terminate).
    asio::io_context io;
    Faults faults;
    faults.lie_at = 7;
    ProcessPool pool(io, pool_options(2), test_work(faults));
    pool.start();
    auto first = submit(pool, 0, {1}, 0);
    REQUIRE(run_until_done(io, {first}));
    const std::int64_t pid = std::get<1>(answer_of(*first));
    auto lying = submit(pool, 0, {6, 7}, 3);
    auto other = submit(pool, 1, {8}, 4);
    REQUIRE(run_until_done(io, {lying, other}));
    REQUIRE(lying->error);
    try {
      std::rethrow_exception(lying->error);
    } catch (const WorkerDied& e) {
      CHECK(e.worker_id() == 0);
      CHECK(e.pid() == pid);
      CHECK(e.signal() == SIGKILL);
      CHECK(e.batch() == 3);
      CHECK(std::string(e.what()) ==
            "DataLoader worker 0 (pid " + std::to_string(pid) +
                ") was killed by signal SIGKILL (Killed) while fetching batch 3 (indices 6, 7), "
                "by the parent, which could not use what it sent: coload: worker 0 answered a "
                "batch it was not given");
    }
    CHECK(std::get<0>(answer_of(*other)) == std::vector<std::int64_t>{16});
    CHECK(pool.broken());
    CHECK(gone(pid));
  }

  TEST_CASE("a reply whose slot the parent cannot read fails its batch, named; the worker goes "
            "on") {
    // Before, the batch was taken off the worker's queue before its slot was read: a slot that
    // could not be read (overrun, mapped or pinned) left the batch unfinished for ever, and
    // the epoch and the loader's shutdown waiting for it.
    asio::io_context io;
    Faults faults;
    faults.overrun_at = 5;
    ProcessPool pool(io, pool_options(1), test_work(faults));
    pool.start();
    auto overrun = submit(pool, 0, {4, 5}, 2);
    auto after = submit(pool, 0, {1}, 4);
    REQUIRE(run_until_done(io, {overrun, after}));
    REQUIRE(overrun->error);
    std::string over;
    try {
      std::rethrow_exception(overrun->error);
    } catch (const std::exception& e) {
      over = e.what();
    }
    CHECK(over.starts_with("coload: worker 0's reply to batch 2 could not be taken: coload: a "
                           "worker's batch of "));
    CHECK(over.find(" bytes overruns its slot of ") != std::string::npos);
    CHECK(std::get<0>(answer_of(*after)) == std::vector<std::int64_t>{2});
    CHECK(!pool.broken());
  }

  TEST_CASE("a worker that exits with code 0 while idle is a death, reported as one") {
    // Before, a current worker's exit 0 was taken for a stop it had been told: it was
    // forgotten, and the batches later sent its way were lost without a word.
    asio::io_context io;
    Faults faults;
    faults.exit0_worker = 1;
    shared_page()->exited_pid = 0;
    ProcessPool pool(io, pool_options(2), test_work(faults));
    pool.start();
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while ((shared_page()->exited_pid == 0 || !gone(shared_page()->exited_pid)) &&
           std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_one_for(100ms);
    }
    const std::int64_t pid = shared_page()->exited_pid;
    REQUIRE(pid > 0);
    REQUIRE(gone(pid));  // reaped by the pool
    auto next = submit(pool, 0, {3}, 2);
    REQUIRE(run_until_done(io, {next}));
    REQUIRE(next->error);
    try {
      std::rethrow_exception(next->error);
    } catch (const WorkerDied& e) {
      CHECK(e.worker_id() == 1);
      CHECK(e.exit_code() == 0);
      CHECK(std::string(e.what()) == "DataLoader worker 1 (pid " + std::to_string(pid) +
                                         ") exited with code 0 while idle, between batches");
    }
  }

  TEST_CASE("a task of 40000 or 100000 indices goes in an index file and is answered in order") {
    // Before, a task of more than about 26000 indices was larger than a worker's socket takes
    // (EMSGSIZE): a batch_sampler's large batch could not reach a worker process at all.
    asio::io_context io;
    ProcessPool pool(io, pool_options(2), test_work({}));
    pool.start();
    std::vector<std::int64_t> big(40000), bigger(100000);
    for (std::size_t i = 0; i < big.size(); ++i) {
      big[i] = static_cast<std::int64_t>(i) * 7 % 40000;
    }
    for (std::size_t i = 0; i < bigger.size(); ++i) {
      bigger[i] = 99999 - static_cast<std::int64_t>(i);
    }
    const std::vector<std::int64_t> small(inline_indices, 3);  // the most a message carries
    auto a = submit(pool, 0, big, 5);
    auto b = submit(pool, 1, bigger, 6);
    auto c = submit(pool, 0, small, 7);
    auto d = submit(pool, 1, {4}, 8);
    REQUIRE(run_until_done(io, {a, b, c, d}));
    const auto doubled = [](std::vector<std::int64_t> v) {
      for (auto& x : v) x *= 2;
      return v;
    };
    CHECK(std::get<0>(answer_of(*a)) == doubled(big));
    CHECK(std::get<0>(answer_of(*b)) == doubled(bigger));
    CHECK(std::get<0>(answer_of(*c)) == doubled(small));
    CHECK(std::get<0>(answer_of(*d)) == std::vector<std::int64_t>{8});
    CHECK(!pool.broken());
  }

  TEST_CASE("tasks past what a worker's socket holds wait for it to read, and go in order") {
    // Before, a send that found the socket full (EAGAIN) failed its batch: prefetch_factor 16
    // with batches of 1000 indices failed "could not be sent to worker 0: ... Resource
    // temporarily unavailable". Here the worker is held at its first task while tasks of 1024
    // indices are queued: 8 KiB records, about 16 KiB each of the socket's buffer, twice as
    // many as its default size (net.core.wmem_default) takes.
    std::int64_t buffer = 212992;
    std::ifstream("/proc/sys/net/core/wmem_default") >> buffer;
    const std::int64_t tasks = std::clamp<std::int64_t>(buffer / 8192 + 4, 30, 256);
    int gate[2];
    REQUIRE(::pipe(gate) == 0);
    Faults faults;
    faults.gate_at = -7;
    faults.gate_fd = gate[0];
    asio::io_context io;
    {
      ProcessPool pool(io, pool_options(1), test_work(faults));
      const std::int64_t generation = pool.start();
      std::vector<std::shared_ptr<Outcome>> outs{submit(pool, 0, {-7}, 0)};
      std::vector<std::vector<std::int64_t>> sent{{-7}};
      for (std::int64_t b = 1; b <= tasks; ++b) {
        std::vector<std::int64_t> indices(inline_indices);
        for (std::size_t i = 0; i < indices.size(); ++i) {
          indices[i] = b * 10000 + static_cast<std::int64_t>(i);
        }
        sent.push_back(indices);
        outs.push_back(submit(pool, 0, indices, b));
      }
      // Then the worker's stop: it waits behind them too, and the worker leaves after the last.
      bool retired = false;
      pool.retire(generation, [&retired] { retired = true; });
      const char open = 1;
      REQUIRE(::write(gate[1], &open, 1) == 1);
      REQUIRE(run_until_done(io, outs));
      for (std::size_t b = 0; b < outs.size(); ++b) {
        CAPTURE(b);
        auto want = sent[b];
        for (auto& x : want) x *= 2;
        CHECK(std::get<0>(answer_of(*outs[b])) == want);
      }
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while (!retired && std::chrono::steady_clock::now() < deadline) {
        io.restart();
        io.run_one_for(1s);
      }
      CHECK(retired);
      CHECK(!pool.broken());
    }
    ::close(gate[0]);
    ::close(gate[1]);
  }

  TEST_CASE("a task that cannot be sent fails its submit, named, and leaves nothing queued") {
    // Before, the task was queued before it was sent: a send that failed left it queued, and
    // the worker's next reply, to the next batch, was taken for a lie: the worker was killed.
    // Here the index file cannot be made: no file descriptor is left under RLIMIT_NOFILE.
    asio::io_context io;
    ProcessPool pool(io, pool_options(1), test_work({}));
    pool.start();
    {
      // A batch answered and let go: its slot is free, so the big task takes no new memfd.
      auto first = submit(pool, 0, {2}, 4);
      REQUIRE(run_until_done(io, {first}));
      CHECK(std::get<0>(answer_of(*first)) == std::vector<std::int64_t>{4});
    }
    ProcessTask big;
    big.batch = 5;
    big.indices.assign(40000, 1);
    std::string what;
    {
      rlimit saved{};
      REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
      const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      REQUIRE(lowest_free >= 0);
      ::close(lowest_free);
      rlimit tight = saved;
      tight.rlim_cur = static_cast<rlim_t>(lowest_free);
      REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
      try {
        (void)pool.submit(0, std::move(big));
      } catch (const std::exception& e) {
        what = e.what();
      }
      REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
    }
    CHECK(what ==
          "coload: batch 5 (40000 indices) could not be sent to worker 0: coload: writing a "
          "task's 40000 indices to a memfd: Too many open files");
    auto next = submit(pool, 0, {3}, 6);
    REQUIRE(run_until_done(io, {next}));
    CHECK(std::get<0>(answer_of(*next)) == std::vector<std::int64_t>{6});
    CHECK(!pool.broken());
  }

  TEST_CASE("a worker that dies with a task fails that submit with WorkerDied naming it") {
    asio::io_context io;
    Faults faults;
    faults.kill_at = 13;
    faults.exit_at = 21;
    shared_page()->kills = 0;

    SUBCASE("killed by a signal") {
      ProcessPool pool(io, pool_options(2), test_work(faults));
      pool.start();
      auto first = submit(pool, 1, {1}, 0);
      REQUIRE(run_until_done(io, {first}));
      const std::int64_t pid = std::get<1>(answer_of(*first));
      auto dying = submit(pool, 1, {12, 13, 14}, 5);
      REQUIRE(run_until_done(io, {dying}));
      REQUIRE(dying->error);
      try {
        std::rethrow_exception(dying->error);
      } catch (const WorkerDied& e) {
        CHECK(e.worker_id() == 1);
        CHECK(e.pid() == pid);
        CHECK(e.signal() == SIGKILL);
        CHECK(e.exit_code() == -1);
        CHECK(e.batch() == 5);
        CHECK(e.indices() == std::vector<std::int64_t>{12, 13, 14});
        CHECK(std::string(e.what()) ==
              "DataLoader worker 1 (pid " + std::to_string(pid) +
                  ") was killed by signal SIGKILL (Killed) while fetching batch 5 (indices 12, "
                  "13, 14)");
      }
      CHECK(pool.broken());
      CHECK(gone(pid));
    }

    SUBCASE("exited") {
      ProcessPool pool(io, pool_options(2), test_work(faults));
      pool.start();
      auto first = submit(pool, 0, {1}, 0);
      REQUIRE(run_until_done(io, {first}));
      const std::int64_t pid = std::get<1>(answer_of(*first));
      auto dying = submit(pool, 0, {21}, 3);
      REQUIRE(run_until_done(io, {dying}));
      REQUIRE(dying->error);
      try {
        std::rethrow_exception(dying->error);
      } catch (const WorkerDied& e) {
        CHECK(e.worker_id() == 0);
        CHECK(e.pid() == pid);
        CHECK(e.signal() == 0);
        CHECK(e.exit_code() == 3);
        CHECK(e.batch() == 3);
        CHECK(e.indices() == std::vector<std::int64_t>{21});
        CHECK(std::string(e.what()) == "DataLoader worker 0 (pid " + std::to_string(pid) +
                                           ") exited with code 3 while fetching batch 3 (indices "
                                           "21)");
      }
      CHECK(pool.broken());
    }
  }

  TEST_CASE("a worker that dies idle under on_death = raise fails the next submit with "
            "WorkerDied naming it, as torch raises") {
    asio::io_context io;
    Faults faults;
    ProcessPool pool(io, pool_options(2), test_work(faults));
    pool.start();
    auto a = submit(pool, 0, {1}, 0);
    auto b = submit(pool, 1, {2}, 1);
    REQUIRE(run_until_done(io, {a, b}));
    const std::int64_t pid = std::get<1>(answer_of(*b));
    REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
    // The pool reaps it when the driver runs: then it is gone, holding no batch.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!gone(pid) && std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_one_for(100ms);
    }
    REQUIRE(gone(pid));
    CHECK(!pool.broken());  // nothing asked for yet
    // The next batch, for the worker still alive, carries the death; none after it is sent.
    auto next = submit(pool, 0, {3}, 2);
    REQUIRE(run_until_done(io, {next}));
    REQUIRE(next->error);
    try {
      std::rethrow_exception(next->error);
    } catch (const WorkerDied& e) {
      CHECK(e.worker_id() == 1);
      CHECK(e.pid() == pid);
      CHECK(e.signal() == SIGKILL);
      CHECK(e.exit_code() == -1);
      CHECK(e.batch() == -1);
      CHECK(e.indices().empty());
      CHECK(std::string(e.what()) == "DataLoader worker 1 (pid " + std::to_string(pid) +
                                         ") was killed by signal SIGKILL (Killed) while idle, "
                                         "between batches");
    }
    CHECK(pool.broken());
    // Reported once: a later submit goes to the live worker as before.
    auto later = submit(pool, 0, {4}, 3);
    REQUIRE(run_until_done(io, {later}));
    CHECK(std::get<0>(answer_of(*later)) == std::vector<std::int64_t>{8});
  }

  TEST_CASE("on_death = restart: a new worker fetches the lost task again") {
    asio::io_context io;
    Faults faults;
    faults.kill_at = 13;
    faults.kill_times = 1;  // the first worker to see 13 dies; its successor fetches it
    shared_page()->kills = 0;
    shared_page()->starts = 0;
    Warnings warnings;
    ProcessPool pool(io, pool_options(2, OnWorkerDeath::restart), test_work(faults));
    pool.start();
    auto first = submit(pool, 1, {1}, 0);
    auto other = submit(pool, 0, {2}, 1);
    REQUIRE(run_until_done(io, {first, other}));
    const std::int64_t pid = std::get<1>(answer_of(*first));
    auto lost = submit(pool, 1, {13}, 4);
    auto queued = submit(pool, 1, {14}, 5);  // queued behind it on the same worker
    REQUIRE(run_until_done(io, {lost, queued}));
    const auto [values, new_pid, id] = answer_of(*lost);
    CHECK(values == std::vector<std::int64_t>{26});
    CHECK(lost->result->worker == 1);
    CHECK(id == 1);
    CHECK(new_pid != pid);
    CHECK(gone(pid));
    CHECK(std::get<0>(answer_of(*queued)) == std::vector<std::int64_t>{28});
    CHECK(std::get<1>(answer_of(*queued)) == new_pid);
    CHECK(!pool.broken());
    CHECK(shared_page()->starts.load() == 3);  // two workers, and the one that replaced worker 1
    REQUIRE(warnings.messages().size() == 1);
    CHECK(warnings.messages()[0] == "DataLoader worker 1 (pid " + std::to_string(pid) +
                                  ") was killed by signal SIGKILL (Killed) while fetching batch "
                                  "4 (indices 13); restarting it (restart 1 of 3)");
  }

  TEST_CASE("on_death = restart: a lost task whose indices went in an index file is sent again "
            "with them") {
    asio::io_context io;
    Faults faults;
    faults.kill_at = 13;
    faults.kill_times = 1;
    shared_page()->kills = 0;
    shared_page()->starts = 0;
    Warnings warnings;
    ProcessPool pool(io, pool_options(1, OnWorkerDeath::restart), test_work(faults));
    pool.start();
    std::vector<std::int64_t> big(3 * inline_indices);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::int64_t>(i) + 13;
    auto lost = submit(pool, 0, big, 4);
    REQUIRE(run_until_done(io, {lost}));
    std::vector<std::int64_t> doubled = big;
    for (auto& x : doubled) x *= 2;
    CHECK(std::get<0>(answer_of(*lost)) == doubled);
    CHECK(shared_page()->starts.load() == 2);  // the worker, and the one that replaced it
    CHECK(shared_page()->kills.load() >= 1);
    REQUIRE(warnings.messages().size() == 1);
    CHECK(warnings.messages()[0].find("while fetching batch 4") != std::string::npos);
    CHECK(!pool.broken());
  }

  TEST_CASE("shutdown fails pending tasks with the cancellation given, and leaves no child") {
    asio::io_context io;
    Faults faults;
    faults.block_at = 99;
    std::vector<std::int64_t> pids;
    std::shared_ptr<Outcome> busy, queued, idle_queued, late;
    {
      ProcessPool pool(io, pool_options(2), test_work(faults));
      pool.start();
      auto a = submit(pool, 0, {1}, 0);
      auto b = submit(pool, 1, {2}, 1);
      REQUIRE(run_until_done(io, {a, b}));
      pids = {std::get<1>(answer_of(*a)), std::get<1>(answer_of(*b))};
      busy = submit(pool, 0, {99}, 2);   // worker 0 blocks in it
      queued = submit(pool, 0, {3}, 3);  // behind it
      idle_queued = submit(pool, 1, {4, 99}, 4);
      pool.shutdown(std::make_exception_ptr(std::runtime_error("cancelled by the test")));
      for (auto& o : {busy, queued, idle_queued}) {
        CHECK(o->done);
        REQUIRE(o->error);
        CHECK_THROWS_WITH_AS(std::rethrow_exception(o->error), "cancelled by the test",
                             std::runtime_error);
      }
      // After shutdown, a submit fails at once with the same exception.
      late = submit(pool, -1, {5}, 5);
      CHECK(late->done);
      CHECK_THROWS_WITH_AS(std::rethrow_exception(late->error), "cancelled by the test",
                           std::runtime_error);
    }
    // The destructor has killed and reaped both workers: no process, no zombie.
    for (auto p : pids) CHECK(gone(p));
    int status = 0;
    const pid_t reaped = ::waitpid(-1, &status, WNOHANG);
    const int err = errno;  // before a CHECK's report (-s) overwrites it
    CHECK(reaped == -1);
    CHECK(err == ECHILD);
  }
}

TEST_SUITE("process pool") {
  TEST_CASE("a worker whose socket or pidfd cannot be watched is killed and reaped as start() "
            "throws: no child, no fd left") {
    asio::io_context io;
    {
      // The reactor registers its own descriptors the first time: before any failure.
      int p[2];
      REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
      asio::posix::stream_descriptor warm(io, p[0]);
      ::close(p[1]);
    }
    for (const int before : {0, 1}) {  // the socket's registration fails, then the pidfd's
      CAPTURE(before);
      const int fds = open_fds();
      {
        ProcessPool pool(io, pool_options(1), test_work(Faults{}));
        epoll_adds_before_failure = before;
        CHECK_THROWS_WITH_AS(pool.start(), doctest::Contains("No space left on device"),
                             std::system_error);
        epoll_adds_before_failure = -1;
      }
      // Before: the child runs on, blocked on a socket nothing reads, and never reaped.
      int status = 0;
      const pid_t reaped = ::waitpid(-1, &status, WNOHANG);
      const int err = errno;  // before a CHECK's report (-s) overwrites it
      CHECK(reaped == -1);
      CHECK(err == ECHILD);
      CHECK(open_fds() == fds);  // before: its socket and pidfd stay open
    }
  }

  TEST_CASE("a fork-server worker reaped by the server before its parent looks is still the "
            "process its pidfd names") {
    const int status = status_in_own_process([] {
      start_forkserver();
      int pidfd = -1;
      const pid_t pid = forkserver_spawn(&exit_at_once, 0, -1, -1, -1, pidfd);
      // Once this returns the server has reaped it: its pid is free for any process.
      // (Before: spawn() ran pidfd_open(pid) here, and got ESRCH, or another process.)
      const int worker = forkserver_status(pid);
      pollfd ended{pidfd, POLLIN, 0};
      if (!WIFEXITED(worker) || WEXITSTATUS(worker) != 0) return 2;
      if (::poll(&ended, 1, 0) != 1) return 3;  // its end is seen through the pidfd
      // and the pidfd names that very process, never the pid's next owner
      if (::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0 || errno != ESRCH) return 4;
      return 0;
    });
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TEST_CASE("fork-server workers that exit at once are deaths, named, never a failed start()") {
    const int status = status_in_own_process([] {
      start_forkserver();
      for (int round = 0; round < 100; ++round) {
        asio::io_context io;
        auto options = pool_options(4);
        options.entry = &exit_at_once;
        ProcessPool pool(io, options, ChildWork{});
        // Before: now and then SystemError "pidfd_open for worker N: No such process" (the
        // process then exits with 1).
        pool.start();
        auto out = submit(pool, -1, {1}, 0);
        if (!run_until_done(io, {out})) return 2;
        if (!out->error) return 5;
        try {
          std::rethrow_exception(out->error);
        } catch (const WorkerDied& e) {
          if (std::string(e.what()).find("exited with code 0") == std::string::npos) return 3;
        } catch (...) {
          return 4;
        }
      }
      return 0;
    });
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_SUITE("process pool messages") {
  TEST_CASE("a task and a reply go through the wire format and come back equal") {
    ProcessTask task;
    task.kind = ProcessTask::Kind::stream;
    task.batch = 7;
    task.epoch = 2;
    task.worker_seed = 11;
    task.sample_seed = 13;
    task.want = 4;
    task.indices = {5, 6, 7};
    MessageBuffer buffer(max_message);
    buffer.resize(wire::encode(TaskMessage{task, 3, 4096, 0}, buffer.whole()));
    const auto [back, slot, slot_bytes, in_file] = decode_value<TaskMessage>(buffer);
    CHECK(back.kind == task.kind);
    CHECK(back.batch == 7);
    CHECK(back.epoch == 2);
    CHECK(back.worker_seed == 11);
    CHECK(back.sample_seed == 13);
    CHECK(back.want == 4);
    CHECK(back.indices == task.indices);
    CHECK(slot == 3);
    CHECK(slot_bytes == 4096);
    CHECK(in_file == 0);

    ProcessReply reply;
    reply.status = ProcessReply::Status::error;
    reply.batch = 9;
    reply.stream_over = true;
    reply.error_index = 3;
    reply.error_what = std::string(20000, 'w');  // cut to 16 KiB
    reply.error_type = "std::runtime_error";
    reply.error_message = "boom";
    buffer.resize(wire::encode(reply, buffer.whole()));
    const auto r = decode_value<ProcessReply>(buffer);
    CHECK(r.status == ProcessReply::Status::error);
    CHECK(r.batch == 9);
    CHECK(r.stream_over);
    CHECK(r.error_index == 3);
    CHECK(r.error_what == std::string(16 * 1024, 'w'));
    CHECK(r.error_type == "std::runtime_error");
    CHECK(r.error_message == "boom");
  }

  TEST_CASE("an index file gives back its indices, and one of another size is a FormatError") {
    const std::vector<std::int64_t> indices{9, -1, 1ll << 40};
    const int fd = make_index_file(indices);
    REQUIRE(fd >= 0);
    CHECK(read_index_file(fd, 3) == indices);
    CHECK(read_index_file(fd, 3) == indices);  // read by position: again the same
    CHECK_THROWS_WITH_AS(read_index_file(fd, 4),
                         "wire: a worker task of 4 indices came with an index file of 24 bytes",
                         wire::FormatError);
    // A count no file holds is refused before anything is sized by it.
    CHECK_THROWS_WITH_AS(read_index_file(fd, std::uint64_t{1} << 61),
                         "wire: a worker task of 2305843009213693952 indices came with an index "
                         "file of 24 bytes",
                         wire::FormatError);
    ::close(fd);
  }

  TEST_CASE("a malformed message is a named FormatError, never an allocation of a claimed size") {
    ProcessReply reply;
    reply.status = ProcessReply::Status::empty;
    reply.error_message = "abc";
    MessageBuffer buffer(max_message);
    const std::size_t size = wire::encode(reply, buffer.whole());

    // Truncated: the header declares more than arrived.
    buffer.resize(size - 1);
    CHECK_THROWS_WITH_AS(decode_value<ProcessReply>(buffer), doctest::Contains("truncated message"),
                         wire::FormatError);

    // A task where a reply was expected: the tag says so.
    ProcessTask task;
    buffer.resize(wire::encode(TaskMessage{task, -1, 0, 0}, buffer.whole()));
    CHECK_THROWS_WITH_AS(decode_value<ProcessReply>(buffer),
                         "wire: expected a worker reply, found tag 17 at byte 16 (a tuple)",
                         wire::FormatError);

    // A status out of range.
    buffer.resize(wire::encode(reply, buffer.whole()));
    const std::uint32_t bad_status = 9;
    std::memcpy(buffer.bytes().data() + wire::header_size + 1, &bad_status, sizeof bad_status);
    CHECK_THROWS_WITH_AS(decode_value<ProcessReply>(buffer),
                         "wire: a reply status 9 at byte 17 is not one this build knows",
                         wire::FormatError);

    // A string claiming 2^62 bytes: refused before anything is allocated.
    buffer.resize(wire::encode(reply, buffer.whole()));
    const std::size_t message_at = size - 8 - 3;  // error_message's length field
    const std::uint64_t huge = std::uint64_t{1} << 62;
    std::memcpy(buffer.bytes().data() + message_at, &huge, sizeof huge);
    CHECK_THROWS_WITH_AS(decode_value<ProcessReply>(buffer), doctest::Contains("truncated message"),
                         wire::FormatError);

    // A task claiming 2^61 indices: refused before the vector is sized.
    task.indices = {1, 2};
    buffer.resize(wire::encode(TaskMessage{task, -1, 0, 0}, buffer.whole()));
    // header, tuple tag and count, task tag, kind, six 8-byte fields: the count follows
    const std::size_t count_at = wire::header_size + 1 + 4 + 1 + 4 + 6 * 8;
    const std::uint64_t many = std::uint64_t{1} << 61;
    std::memcpy(buffer.bytes().data() + count_at, &many, sizeof many);
    CHECK_THROWS_WITH_AS(decode_value<TaskMessage>(buffer),
                         doctest::Contains("truncated message: a worker task of "
                                           "2305843009213693952 indices"),
                         wire::FormatError);
  }
}
