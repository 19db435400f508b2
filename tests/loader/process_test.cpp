// Specification of process workers (executor = processes): the same batches as threads, zero
// copies through the shared arena, worker deaths reported at once, nothing left behind.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "coload/coload.hpp"

using namespace coload;

namespace {

/// Children of this process (zombies included), from /proc.
int child_count() {
  int n = 0;
  const std::string me = std::to_string(::getpid());
  DIR* d = ::opendir("/proc");
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    // pid (comm) state ppid ...: the comm may hold spaces, so parse after the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string state, ppid;
    rest >> state >> ppid;
    if (ppid == me) ++n;
  }
  ::closedir(d);
  return n;
}

int fd_count() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d)) ++n;
  ::closedir(d);
  return n;
}

/// The /proc/self/maps line of the mapping holding `p`, or "" when none does.
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> lo >> dash >> hi;
    if (a >= lo && a < hi) return line;
  }
  return "";
}

int arena_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("coload-batch") != std::string::npos;
  return n;
}

// Sample i: (a 2x3 tensor of i, i, the pid and worker id that fetched it, the worker's seed).
using Sample = std::tuple<at::Tensor, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

int g_init_value = 0;  // set by worker_init_fn, in whichever process runs it

enum class Fault { none, throw_error, bad_alloc, sigkill, null_write, abort, exit3, hang, kill_once };

struct Probe {
  std::int64_t n = 24;
  Fault fault = Fault::none;
  std::int64_t fault_at = -1;
  std::string marker;  // kill_once: the file that says the crash already happened
  bool use_aten = false;

  std::size_t size() const { return static_cast<std::size_t>(n); }
  Sample get(std::size_t index) const {
    const auto i = static_cast<std::int64_t>(index);
    if (i == fault_at) {
      switch (fault) {
        case Fault::none: break;
        case Fault::throw_error: throw std::runtime_error("sample " + std::to_string(i) + " is bad");
        case Fault::bad_alloc: throw std::bad_alloc();
        case Fault::sigkill: ::raise(SIGKILL); break;
        case Fault::null_write: ::raise(SIGSEGV); break;  // a segfault, without UB to excuse
        case Fault::abort: std::abort();
        case Fault::exit3: std::exit(3);
        case Fault::hang: for (;;) ::pause();
        case Fault::kill_once:
          if (::access(marker.c_str(), F_OK) != 0) {
            std::ofstream(marker) << "crashed";
            ::raise(SIGKILL);
          }
          break;
      }
    }
    at::Tensor t = at::full({2, 3}, static_cast<double>(i), at::kFloat);
    if (use_aten) {
      // A multi-threaded operation in the parent before the fork must not hang this one: a
      // reduction big enough for ATen's parallel_for (GNU OpenMP's pool).
      // NOTE: not BLAS: under libtorch 2.11's MKL a forked child's sgemm spun forever in MKL's
      // allocator (mm_account_ptr_by_tid) in 1 run of 44 (README: process_start).
      auto m = at::ones({1 << 17});
      t = t + (m.sum() * 0).to(at::kFloat);
    }
    const auto info = get_worker_info();
    return {t, i, ::getpid(), info ? info->id : -1,
            info ? static_cast<std::int64_t>(info->seed - static_cast<std::uint64_t>(info->id)) : -1};
  }
};

using Batch = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

std::vector<std::int64_t> ints(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// The index lists of the batches `probe` gives with `options` through worker threads: what
// process workers must give with the same options.
template <class Dataset>
std::vector<std::vector<std::int64_t>> batches_with_threads(const Dataset& probe,
                                                            LoaderOptions<> options) {
  options.executor = Executor::threads;
  std::vector<std::vector<std::int64_t>> out;
  auto loader = make_data_loader(probe, options);
  for (auto& b : loader) out.push_back(ints(std::get<1>(b)));
  return out;
}

LoaderOptions<> process_options(int workers) {
  LoaderOptions<> o;
  o.batch_size = 4;
  o.num_workers = workers;
  o.executor = Executor::processes;
  return o;
}

// A dataset the wire format can carry to a fork-server worker: rows of a table.
struct Table {
  at::Tensor rows;
  std::int64_t crash_at = -1;
  std::size_t size() const { return static_cast<std::size_t>(rows.size(0)); }
  std::tuple<at::Tensor, std::int64_t, std::int64_t, std::int64_t> get(std::size_t i) const {
    // The same lock the test holds in the parent: a forked copy of a locked mutex stays locked.
    std::lock_guard lock(held_mutex());
    if (static_cast<std::int64_t>(i) == crash_at) ::raise(SIGSEGV);
    return {rows[static_cast<std::int64_t>(i)], g_init_value, ::getpid(), ::getppid()};
  }
  static std::mutex& held_mutex() {
    static std::mutex m;
    return m;
  }
};

void set_init_value(const WorkerInfo& info) { g_init_value = 500 + info.id; }

}  // namespace

template <>
struct coload::wire::Wire<Table> {
  static void write(Writer& w, const Table& t) {
    Wire<at::Tensor>::write(w, t.rows);
    Wire<std::int64_t>::write(w, t.crash_at);
  }
  static Table read(Reader& r) {
    Table t{Wire<at::Tensor>::read(r)};
    t.crash_at = Wire<std::int64_t>::read(r);
    return t;
  }
};

/// A batch type the wire format has no Wire<> for.
struct UnwiredBatch {
  std::size_t n;
};

// NOTE: skipped under TSan. Its runtime (GCC 12's) does not hold its own allocators' locks
// across fork(): a child forked while another thread of the parent held one spins on it for
// ever (seen in CI: a worker process of "worker_init_fn and get_worker_info run in the worker
// process" spinning in the stack depot's allocator until the suite's timeout). ASan+UBSan runs
// these tests.
#if defined(__SANITIZE_THREAD__)
constexpr bool under_tsan = true;
#else
constexpr bool under_tsan = false;
#endif

TEST_SUITE("loader" * doctest::skip(under_tsan)) {
  TEST_CASE("process workers yield the same batches as threads, from forked processes") {
    // GNU OpenMP hangs a forked child that enters its pool: use the pool here first.
    at::set_num_threads(2);
    auto big = at::rand({256, 256});
    CHECK(at::mm(big, big).size(0) == 256);

    const int children_before = child_count();
    Probe probe;
    probe.use_aten = true;
    auto options = process_options(3);
    options.shuffle = true;
    options.seed = 11;
    const auto expected = batches_with_threads(probe, options);
    auto loader = make_data_loader(probe, options);
    std::vector<std::vector<std::int64_t>> got;
    std::set<std::int64_t> pids, workers, seeds;
    for (auto& b : loader) {
      const auto idx = ints(std::get<1>(b));
      got.push_back(idx);
      // Tensor values travel with their sample.
      const auto first = std::get<0>(b).select(0, 0).flatten();
      CHECK(first[0].item<float>() == static_cast<float>(idx[0]));
      CHECK(std::get<0>(b).sizes() == at::IntArrayRef({static_cast<std::int64_t>(idx.size()), 2, 3}));
      for (auto p : ints(std::get<2>(b))) pids.insert(p);
      for (auto w : ints(std::get<3>(b))) workers.insert(w);
      for (auto s : ints(std::get<4>(b))) seeds.insert(s);
    }
    CHECK(got == expected);
    CHECK(pids.count(::getpid()) == 0);
    CHECK(pids.size() >= 2);
    CHECK(pids.size() <= 3);
    CHECK(*workers.begin() >= 0);
    CHECK(*workers.rbegin() <= 2);
    // Every worker's seed is the epoch's base seed plus its id: one base seed for all.
    CHECK(seeds.size() == 1);
    CHECK(child_count() == children_before);  // the epoch's processes went with it
  }

  TEST_CASE("a batch of 40000 samples reaches a worker process, the same as with threads") {
    // Before, its index list was larger than a worker's socket takes (EMSGSIZE, about 26000
    // indices, and over the 256 KiB a worker receives whatever the socket takes): the batch
    // failed with "could not be sent to worker 0". Now the list goes in an index file attached
    // to the task.
    Probe probe;
    probe.n = 80000;
    auto options = process_options(2);
    options.batch_size = 40000;
    options.shuffle = true;
    options.seed = 5;
    const auto expected = batches_with_threads(probe, options);
    REQUIRE(expected.size() == 2);
    auto loader = make_data_loader(probe, options);
    std::vector<std::vector<std::int64_t>> got;
    std::set<std::int64_t> pids;
    for (auto& b : loader) {
      got.push_back(ints(std::get<1>(b)));
      // Each sample's tensor came with it: the first element of sample k is its index.
      CHECK(ints(std::get<0>(b).select(1, 0).select(1, 0).to(at::kLong)) == got.back());
      for (auto p : ints(std::get<2>(b))) pids.insert(p);
    }
    CHECK(got == expected);
    CHECK(pids.count(::getpid()) == 0);
    std::vector<std::int64_t> all;
    for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
    std::sort(all.begin(), all.end());
    std::vector<std::int64_t> every(80000);
    std::iota(every.begin(), every.end(), 0);
    CHECK(all == every);
  }

  TEST_CASE("a batch from a worker process lies in the shared arena, not copied") {
    auto loader = make_data_loader(Probe{}, process_options(2));
    int batches = 0;
    for (auto& b : loader) {
      const std::string where = mapping_of(std::get<0>(b).data_ptr());
      INFO(where);
      CHECK(where.find("/memfd:coload-batch") != std::string::npos);
      CHECK(mapping_of(std::get<1>(b).data_ptr()) == where);  // one slot holds the whole batch
      // default_collate stacked the samples straight into the slot (its first bytes), where
      // the parent finds them: not copied in the child either.
      CHECK(std::stoull(where.substr(0, where.find('-')), nullptr, 16) ==
            reinterpret_cast<std::uintptr_t>(std::get<0>(b).data_ptr()));
      ++batches;
    }
    CHECK(batches == 6);
    // Bounded: slots are recycled once the consumer lets go (2 workers x prefetch 2 in flight).
    CHECK(arena_mappings() <= 6);
  }

  TEST_CASE("worker_init_fn and get_worker_info run in the worker process") {
    auto options = process_options(2);
    options.worker_init_fn = [](const WorkerInfo& info) { g_init_value = 100 + info.id; };
    struct Init {
      std::size_t size() const { return 8; }
      std::int64_t get(std::size_t) const { return g_init_value; }
    };
    auto loader = make_data_loader(Init{}, options);
    std::set<std::int64_t> seen;
    for (auto& b : loader) {
      for (auto v : ints(b)) seen.insert(v);
    }
    CHECK(seen == std::set<std::int64_t>{100, 101});
    CHECK(g_init_value == 0);  // never run in the parent
  }

  TEST_CASE("an exception in a worker process reaches the consumer with its type, message and index") {
    Probe probe;
    probe.fault = Fault::throw_error;
    probe.fault_at = 9;
    auto loader = make_data_loader(probe, process_options(2));
    auto epoch = loader.epoch();
    int good = 0;
    std::string what, type;
    std::int64_t index = -2, batch = -2;
    for (;;) {
      try {
        auto b = sync_wait(epoch.next());
        if (!b) break;
        ++good;
      } catch (const WorkerError& e) {
        what = e.what();
        type = e.original_type();
        index = e.index();
        batch = e.batch();
        CHECK(e.original_message() == "sample 9 is bad");
        CHECK(e.worker_id() >= 0);
      }
    }
    CHECK(good == 5);  // the epoch goes on
    CHECK(type == "std::runtime_error");
    CHECK(index == 9);
    CHECK(batch == 2);
    CHECK(what.find("sample 9 is bad") != std::string::npos);

    const int children_before = child_count();
    probe.fault = Fault::bad_alloc;
    int failures = 0;
    {
      auto oom = make_data_loader(probe, process_options(2));
      auto e2 = oom.epoch();
      for (;;) {
        try {
          if (!sync_wait(e2.next())) break;
        } catch (const WorkerError& e) {
          ++failures;
          CHECK(e.original_type() == "std::bad_alloc");
          CHECK(e.index() == 9);
        }
      }
    }
    CHECK(failures == 1);
    CHECK(child_count() == children_before);
  }

  TEST_CASE("an asynchronous fetch that stalls in a worker process is that batch's error; "
            "the worker goes on") {
    // Sample 2's read awaits something that nothing resumes: the child's io_context runs out
    // of work with the fetch suspended. Its frame stays suspended, owning what it would write.
    struct Stalls {
      struct Never {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<>) const noexcept {}
        void await_resume() const noexcept {}
      };
      std::int64_t size() const { return 8; }
      Task<std::int64_t> get_async(Index i, SampleContext& ctx) {
        if (i == 2) co_await Never{};
        co_await ctx.cpu();
        co_return i * 10;
      }
    };
    LoaderOptions<> o = process_options(1);
    o.batch_size = 2;
    auto loader = make_data_loader(Stalls{}, o);
    auto epoch = loader.epoch();
    std::vector<std::vector<std::int64_t>> got;
    std::vector<std::string> errors;
    for (;;) {
      try {
        auto b = sync_wait(epoch.next());
        if (!b) break;
        got.push_back(std::vector<std::int64_t>(b->data_ptr<std::int64_t>(),
                                                b->data_ptr<std::int64_t>() + b->numel()));
      } catch (const std::exception& e) {
        errors.push_back(e.what());
      }
    }
    CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 10}, {40, 50}, {60, 70}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].find("an asynchronous fetch stalled in a worker process: batch 1 awaits "
                         "something its process's io_context does not run") != std::string::npos);
  }

  TEST_CASE("a worker process that dies is reported with its pid, cause, batch and indices") {
    const int children_before = child_count();
    struct Case {
      Fault fault;
      const char* cause;
    };
    for (const Case c : {Case{Fault::sigkill, "was killed by signal SIGKILL (Killed)"},
                         Case{Fault::null_write, "was killed by signal SIGSEGV (Segmentation fault)"},
                         Case{Fault::abort, "was killed by signal SIGABRT (Aborted)"},
                         Case{Fault::exit3, "exited with code 3"}}) {
      const std::string cause = c.cause;
      CAPTURE(cause);
      Probe probe;
      probe.fault = c.fault;
      probe.fault_at = 13;  // batch 3: indices 12..15
      std::vector<std::int64_t> delivered;
      std::string what;
      int worker = -1, pid = -1;
      {
        auto options = process_options(2);
        auto loader = make_data_loader(probe, options);
        auto epoch = loader.epoch();
        for (;;) {
          try {
            auto b = sync_wait(epoch.next());
            if (!b) break;
            for (auto i : ints(std::get<1>(*b))) delivered.push_back(i);
          } catch (const WorkerDied& e) {
            what = e.what();
            worker = e.worker_id();
            pid = e.pid();
            CHECK(e.batch() == 3);
            CHECK(e.indices() == std::vector<std::int64_t>{12, 13, 14, 15});
          }
        }
      }
      CHECK(what.find("DataLoader worker " + std::to_string(worker) + " (pid " +
                      std::to_string(pid) + ") " + c.cause +
                      " while fetching batch 3 (indices 12, 13, 14, 15)") != std::string::npos);
      // Batches before it are not lost.
      for (std::int64_t i = 0; i < 12; ++i) CHECK(std::count(delivered.begin(), delivered.end(), i) == 1);
      CHECK(child_count() == children_before);
    }
  }

  TEST_CASE("a stuck worker process times out, and the loader's end kills it") {
    const int children_before = child_count();
    Probe probe;
    probe.fault = Fault::hang;
    probe.fault_at = 1;
    {
      auto options = process_options(1);
      options.timeout = 0.5;
      auto loader = make_data_loader(probe, options);
      auto epoch = loader.epoch();
      CHECK_THROWS_AS(sync_wait(epoch.next()), TimeoutError);
      CHECK(child_count() == children_before + 1);
    }
    CHECK(child_count() == children_before);
  }

  TEST_CASE("a state saved after a worker death: the batches lost with the worker are fetched "
            "by the resumed epoch, nothing twice") {
    // One worker, two batches in flight: when it dies fetching batch 1 (indices 4-7), batch 2
    // is queued behind it and lost. Its number used to count as delivered in the state, so
    // the resumed epoch left samples 8-11 out.
    const std::string marker = "/tmp/coload-lost-" + std::to_string(::getpid());
    ::unlink(marker.c_str());
    Probe probe;
    probe.fault = Fault::kill_once;
    probe.fault_at = 5;
    probe.marker = marker;
    auto options = process_options(1);
    std::vector<std::int64_t> seen;
    LoaderState state;
    {
      auto loader = make_data_loader(probe, options);
      try {
        for (auto& b : loader) {
          for (auto i : ints(std::get<1>(b))) seen.push_back(i);
        }
        FAIL("no WorkerDied");
      } catch (const WorkerDied& e) {
        CHECK(e.batch() == 1);
      }
      state = loader.state();
    }
    auto resumed = make_data_loader(probe, options);
    resumed.load_state(state);
    for (auto& b : resumed) {
      for (auto i : ints(std::get<1>(b))) seen.push_back(i);
    }
    ::unlink(marker.c_str());
    std::sort(seen.begin(), seen.end());
    // Every sample once, but batch 1's: its error was delivered in its place.
    std::vector<std::int64_t> expected;
    for (std::int64_t i = 0; i < 24; ++i) {
      if (i < 4 || i > 7) expected.push_back(i);
    }
    CHECK(seen == expected);
  }

  TEST_CASE("on_worker_death = restart forks the worker again and fetches its batches anew") {
    const std::string marker = "/tmp/coload-restart-" + std::to_string(::getpid());
    ::unlink(marker.c_str());
    Probe probe;
    probe.fault = Fault::kill_once;
    probe.fault_at = 5;
    probe.marker = marker;
    auto options = process_options(2);
    options.on_worker_death = OnWorkerDeath::restart;
    std::vector<std::string> warnings;
    set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    auto loader = make_data_loader(probe, options);
    std::vector<std::int64_t> all;
    for (auto& b : loader) {
      for (auto i : ints(std::get<1>(b))) all.push_back(i);
    }
    set_warning_handler({});
    ::unlink(marker.c_str());
    std::vector<std::int64_t> expected(24);
    for (std::int64_t i = 0; i < 24; ++i) expected[static_cast<std::size_t>(i)] = i;
    CHECK(all == expected);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("was killed by signal SIGKILL") != std::string::npos);
    CHECK(warnings[0].find("restarting it (restart 1 of 3)") != std::string::npos);
  }

  TEST_CASE("persistent_workers keeps the processes; without it each epoch forks new ones") {
    auto pids_of_epoch = [](auto& loader) {
      std::set<std::int64_t> pids;
      for (auto& b : loader) {
        for (auto p : ints(std::get<2>(b))) pids.insert(p);
      }
      return pids;
    };
    auto options = process_options(2);
    auto fresh = make_data_loader(Probe{}, options);
    const auto a = pids_of_epoch(fresh);
    const auto b = pids_of_epoch(fresh);
    std::vector<std::int64_t> common;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
    CHECK(common.empty());

    options.persistent_workers = true;
    auto kept = make_data_loader(Probe{}, options);
    const auto c = pids_of_epoch(kept);
    const auto d = pids_of_epoch(kept);
    CHECK(c == d);
  }

  TEST_CASE("an epoch stopped before its dispatcher asked for workers forks none") {
    // Before, the dispatcher started (forked) the epoch's workers before it looked whether the
    // epoch had been stopped: two processes forked only to be told to go, and the next
    // epoch(), which waits for that dispatcher, waited for the forks too.
    struct Gate {
      std::mutex mutex;
      std::condition_variable cv;
      bool entered = false;
      bool released = false;
    };
    struct GatedSampler {
      std::shared_ptr<Gate> gate;
      std::int64_t size() const { return 2; }
      // The dispatcher's first call: held here until the test has stopped the epoch.
      Generator<std::vector<Index>> batches() {
        std::unique_lock lock(gate->mutex);
        gate->entered = true;
        gate->cv.notify_all();
        gate->cv.wait(lock, [this] { return gate->released; });
        return lists();
      }
      static Generator<std::vector<Index>> lists() {
        for (Index first : {0, 4}) {
          std::vector<Index> list;
          for (Index i = first; i < std::min<Index>(first + 4, 6); ++i) list.push_back(i);
          co_yield list;
        }
      }
    };
    auto gate = std::make_shared<Gate>();
    auto options = process_options(2);
    options.batch_size = 1;  // a batch_sampler takes batch_size's place
    options.batch_sampler = GatedSampler{gate};
    auto loader = make_data_loader(Probe{}, options);
    const int children_before = child_count();
    {
      auto epoch = loader.epoch();
      std::unique_lock lock(gate->mutex);
      gate->cv.wait(lock, [&] { return gate->entered; });
    }  // stopped while its dispatcher is in the sampler, before any worker started
    {
      std::lock_guard lock(gate->mutex);
      gate->released = true;
      gate->cv.notify_all();
    }
    loader.wait_stopped_epoch();
    CHECK(child_count() == children_before);
    // The next epoch forks its own two and has every batch.
    std::vector<std::vector<std::int64_t>> got;
    std::set<std::int64_t> pids;
    for (auto& b : loader) {
      got.push_back(ints(std::get<1>(b)));
      for (auto p : ints(std::get<2>(b))) pids.insert(p);
    }
    CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 5}});
    CHECK(pids.count(::getpid()) == 0);
  }

  TEST_CASE("destroying a loader mid-epoch leaves no process, fd or mapping behind") {
    const int children_before = child_count();
    const int fds_before = fd_count();
    const int maps_before = arena_mappings();
    {
      Probe probe;
      probe.n = 400;
      auto options = process_options(2);
      options.persistent_workers = true;
      auto loader = make_data_loader(probe, options);
      auto epoch = loader.epoch();
      for (int k = 0; k < 3; ++k) REQUIRE(sync_wait(epoch.next()));
      CHECK(child_count() == children_before + 2);
    }
    CHECK(child_count() == children_before);
    CHECK(fd_count() == fds_before);
    CHECK(arena_mappings() == maps_before);
  }

  TEST_CASE("an iterable dataset streams from each worker process's own replica") {
    struct Sharded {
      std::int64_t n = 10;
      Generator<std::int64_t> stream(const WorkerInfo& info) {
        for (std::int64_t i = info.id; i < n; i += info.num_workers) co_yield i;
      }
    };
    auto options = LoaderOptions<>{.batch_size = 2, .num_workers = 3};
    std::vector<std::vector<std::int64_t>> threads;
    {
      auto loader = make_data_loader(Sharded{}, options);
      for (auto& b : loader) threads.push_back(ints(b));
    }
    options.executor = Executor::processes;
    auto loader = make_data_loader(Sharded{}, options);
    std::vector<std::vector<std::int64_t>> processes;
    for (auto& b : loader) processes.push_back(ints(b));
    // PyTorch's interleaving: worker 0 [0,3] [6,9], worker 1 [1,4] [7], worker 2 [2,5] [8].
    const std::vector<std::vector<std::int64_t>> expected = {{0, 3}, {1, 4}, {2, 5},
                                                             {6, 9}, {7}, {8}};
    CHECK(threads == expected);
    CHECK(processes == expected);
  }

  TEST_CASE("an epoch broken off early and the next begun at once: the next has every batch, "
            "with or without persistent workers") {
    // The broken-off epoch's tasks are still in its workers when the next one starts.
    for (const bool persistent : {false, true}) {
      CAPTURE(persistent);
      Probe probe;
      probe.n = 400;
      auto options = process_options(2);
      options.persistent_workers = persistent;
      auto loader = make_data_loader(probe, options);
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        int taken = 0;
        for (auto& b : loader) {
          (void)b;
          if (++taken == 3) break;
        }
        std::vector<std::int64_t> seen;
        for (auto& b : loader) {
          const auto ids = ints(std::get<1>(b));
          seen.insert(seen.end(), ids.begin(), ids.end());
        }
        std::vector<std::int64_t> all(400);
        std::iota(all.begin(), all.end(), 0);
        CHECK(seen == all);
      }
    }
  }

  TEST_CASE("an iterable dataset streams every epoch anew from persistent worker processes") {
    struct Sharded {
      std::int64_t n = 10;
      Generator<std::int64_t> stream(const WorkerInfo& info) {
        for (std::int64_t i = info.id; i < n; i += info.num_workers) co_yield i;
      }
    };
    auto options = LoaderOptions<>{.batch_size = 2, .num_workers = 3,
                                   .executor = Executor::processes};
    options.persistent_workers = true;
    auto loader = make_data_loader(Sharded{}, options);
    const std::vector<std::vector<std::int64_t>> expected = {{0, 3}, {1, 4}, {2, 5},
                                                             {6, 9}, {7}, {8}};
    for (int epoch = 0; epoch < 3; ++epoch) {
      CAPTURE(epoch);
      std::vector<std::vector<std::int64_t>> got;
      for (auto& b : loader) got.push_back(ints(b));
      CHECK(got == expected);
    }
    // An epoch broken off after its first batch: the next streams from the start again.
    for (auto& b : loader) {
      (void)b;
      break;
    }
    std::vector<std::vector<std::int64_t>> got;
    for (auto& b : loader) got.push_back(ints(b));
    CHECK(got == expected);
  }

  TEST_CASE("process_start = forkserver forks workers from the server, safe while a lock is held") {
    REQUIRE(forkserver_running());
    const auto rows = at::arange(40, at::kLong).reshape({20, 2});
    auto options = process_options(2);
    options.process_start = ProcessStart::forkserver;
    options.worker_init_fn = &set_init_value;
    std::set<std::int64_t> pids, parents, inits;
    std::vector<std::int64_t> values;
    {
      // Held by this thread for the whole epoch: a worker forked from here would inherit it
      // locked and hang in get(); the server forked before the lock was taken.
      std::lock_guard held(Table::held_mutex());
      auto loader = make_data_loader(Table{rows}, options);
      for (auto& b : loader) {
        for (auto v : ints(std::get<0>(b).flatten())) values.push_back(v);
        for (auto v : ints(std::get<1>(b))) inits.insert(v);
        for (auto v : ints(std::get<2>(b))) pids.insert(v);
        for (auto v : ints(std::get<3>(b))) parents.insert(v);
      }
    }
    std::vector<std::int64_t> expected(40);
    for (std::int64_t i = 0; i < 40; ++i) expected[static_cast<std::size_t>(i)] = i;
    CHECK(values == expected);
    CHECK(inits == std::set<std::int64_t>{500, 501});
    CHECK(pids.size() == 2);
    // Their parent is the server, not this process.
    REQUIRE(parents.size() == 1);
    CHECK(*parents.begin() != ::getpid());
    // The epoch's workers are gone (reaped by the server) once it ends.
    for (auto p : pids) CHECK(::kill(static_cast<pid_t>(p), 0) == -1);

    // A crash in a fork-server worker is reported as in a forked one, with the status the
    // server saw.
    Table crashing{rows};
    crashing.crash_at = 9;
    options.worker_init_fn = {};
    auto loader = make_data_loader(crashing, options);
    auto epoch = loader.epoch();
    std::string what;
    for (;;) {
      try {
        if (!sync_wait(epoch.next())) break;
      } catch (const WorkerDied& e) {
        what = e.what();
        CHECK(e.signal() == SIGSEGV);
        CHECK(e.batch() == 2);
      }
    }
    CHECK(what.find("was killed by signal SIGSEGV (Segmentation fault) while fetching batch 2 "
                    "(indices 8, 9, 10, 11)") != std::string::npos);
  }

  TEST_CASE("process_start = forkserver refuses what cannot reach a worker") {
    auto options = process_options(2);
    options.process_start = ProcessStart::forkserver;
    CHECK_THROWS_WITH_AS(make_data_loader(Probe{}, options),
                         doctest::Contains("specialise coload::wire::Wire for the dataset type"),
                         std::invalid_argument);
    int captured = 3;
    options.worker_init_fn = [captured](const WorkerInfo&) { g_init_value = captured; };
    CHECK_THROWS_WITH_AS(make_data_loader(Table{at::zeros({4, 2})}, options),
                         doctest::Contains("worker_init_fn to be a plain function"),
                         std::invalid_argument);
  }

  TEST_CASE("executor = processes with a batch type the wire format lacks names the type") {
    auto loader = [] {
      return make_data_loader(Probe{}, {.batch_size = 2, .num_workers = 1,
                                        .executor = Executor::processes},
                              [](std::vector<Sample> samples) {
                                return UnwiredBatch{samples.size()};
                              });
    };
    CHECK_THROWS_WITH_AS(loader(),
                         "coload: the process executor sends batches of `UnwiredBatch` through "
                         "the wire format: specialise `coload::wire::Wire<UnwiredBatch>`",
                         std::invalid_argument);
  }

  TEST_CASE("executor = processes without workers is refused") {
    auto options = process_options(0);
    CHECK_THROWS_WITH_AS(make_data_loader(Probe{}, options),
                         "executor = processes can only be used with multi-process loading "
                         "(num_workers > 0), but got num_workers=0",
                         std::invalid_argument);
  }
}
