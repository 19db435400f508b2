// Specification of asynchronous fetching: get_async and get_batch_async read through the
// loader's reader on the driver and move their CPU work onto the workers.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "coload/coload.hpp"
#include "coload/io/reader.hpp"

using namespace coload;

namespace {

std::vector<std::int64_t> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// A directory of files f<i> whose content is i copies of the byte 'a' + i % 26.
struct Files {
  std::filesystem::path dir;
  explicit Files(int n) {
    dir = std::filesystem::temp_directory_path() /
          ("coload_async_" + std::to_string(::getpid()) + "_" + std::to_string(n));
    std::filesystem::create_directories(dir);
    for (int i = 0; i < n; ++i) {
      std::ofstream(dir / ("f" + std::to_string(i))) << std::string(static_cast<std::size_t>(i),
                                                                     static_cast<char>('a' + i % 26));
    }
  }
  ~Files() { std::filesystem::remove_all(dir); }
  std::string path(Index i) const { return (dir / ("f" + std::to_string(i))).string(); }
};

struct Seen {
  std::atomic<int> on_driver_before_cpu{0};
  std::atomic<int> on_worker_after_cpu{0};
  std::atomic<int> worker_info_after_cpu{0};
};

// Sample i: the length of file i, read through the loader's reader.
struct FileLengths {
  const Files* files;
  std::int64_t n;
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  std::int64_t size() const { return n; }
  Task<std::int64_t> get_async(Index i, SampleContext& ctx) {
    if (ThreadExecutor::current_worker_id() < 0) seen->on_driver_before_cpu.fetch_add(1);
    io::Buffer data = co_await ctx.io->read_file(files->path(i));
    co_await ctx.cpu();
    if (ThreadExecutor::current_worker_id() >= 0) seen->on_worker_after_cpu.fetch_add(1);
    if (auto info = get_worker_info(); info && info->id == ThreadExecutor::current_worker_id()) {
      seen->worker_info_after_cpu.fetch_add(1);
    }
    co_return static_cast<std::int64_t>(data.size());
  }
};

// The whole batch at once: a [n] tensor of file lengths plus the sum of their first bytes.
struct BatchLengths {
  const Files* files;
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const { return i; }  // the sample type; not used by the loader
  Task<std::pair<at::Tensor, std::int64_t>> get_batch_async(std::span<const Index> indices,
                                                            BatchContext& ctx) {
    std::vector<Task<io::Buffer>> reads;
    for (Index i : indices) reads.push_back(ctx.io->read_file(files->path(i)));
    std::vector<io::Buffer> buffers = co_await when_all(std::move(reads));
    co_await ctx.cpu();
    at::Tensor lengths = at::empty({static_cast<std::int64_t>(indices.size())}, at::kLong);
    std::int64_t first_bytes = 0;
    for (std::size_t k = 0; k < buffers.size(); ++k) {
      lengths.data_ptr<std::int64_t>()[k] = static_cast<std::int64_t>(buffers[k].size());
      if (buffers[k].size() > 0) first_bytes += static_cast<std::int64_t>(buffers[k].bytes()[0]);
    }
    co_return std::pair{lengths, first_bytes};
  }
};

// Sample i: the first draw of its Rng, fetched one by one (get_async) ...
struct DrawEach {
  std::int64_t n;
  std::int64_t size() const { return n; }
  Task<std::int64_t> get_async(Index, SampleContext& ctx) {
    co_return static_cast<std::int64_t>(ctx.rng.next_u64() >> 1);
  }
};

// ... or by whole batches (get_batch_async), each sample drawing from ctx.sample(k).
struct DrawBatch {
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const { return i; }  // the sample type; not used by the loader
  Task<at::Tensor> get_batch_async(std::span<const Index> indices, BatchContext& ctx) {
    at::Tensor draws = at::empty({static_cast<std::int64_t>(indices.size())}, at::kLong);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      draws.data_ptr<std::int64_t>()[k] =
          static_cast<std::int64_t>(ctx.sample(k).rng.next_u64() >> 1);
    }
    co_return draws;
  }
};

// Sample i: i. Notes, when each sample starts, how many samples had finished by then.
struct FinishedBefore {
  std::int64_t n;
  std::shared_ptr<std::vector<std::atomic<int>>> started_after =
      std::make_shared<std::vector<std::atomic<int>>>(static_cast<std::size_t>(n));
  std::shared_ptr<std::atomic<int>> finished = std::make_shared<std::atomic<int>>(0);
  std::int64_t size() const { return n; }
  Task<std::int64_t> get_async(Index i, SampleContext& ctx) {
    (*started_after)[static_cast<std::size_t>(i)] = finished->load();
    co_await ctx.cpu();
    finished->fetch_add(1);
    co_return i;
  }
};

// Sets how long an epoch's first batch may wait for its bytes and still hold the others back,
// for one test.
struct SlowFirstBytes {
  std::chrono::nanoseconds was = coload::detail::WorkerCount::slow_first_bytes();
  explicit SlowFirstBytes(std::chrono::nanoseconds limit) {
    coload::detail::WorkerCount::set_slow_first_bytes(limit);
  }
  ~SlowFirstBytes() { coload::detail::WorkerCount::set_slow_first_bytes(was); }
};

// 32 samples in batches of 4. Batch 0's samples wait, as if for their bytes, until release()
// resumes them; release() notes whether a later batch's sample had started before. Sample 0's
// CPU work then waits (at most 60 s) for a later batch's sample to start, and notes whether one
// did while it ran.
struct StartsBeside {
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::coroutine_handle<>> parked;
    bool later_started = false;
    bool later_before_bytes = false;
    bool overlapped = false;
  };
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::int64_t size() const { return 32; }

  struct Park {
    Shared* s;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const {
      std::lock_guard lock(s->m);
      s->parked.push_back(h);
      s->cv.notify_all();
    }
    void await_resume() const noexcept {}
  };

  Task<std::int64_t> get_async(Index i, SampleContext& ctx) {
    Shared& s = *shared;
    if (i < 4) {
      co_await Park{&s};
    } else {
      std::lock_guard lock(s.m);
      s.later_started = true;
      s.cv.notify_all();
    }
    co_await ctx.cpu();
    if (i == 0) {
      std::unique_lock lock(s.m);
      s.overlapped = s.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.later_started; });
    }
    co_return i;
  }

  // Once batch 0's four samples wait (at most 60 s), resumes them on this thread.
  static void release(Shared& s) {
    std::vector<std::coroutine_handle<>> parked;
    {
      std::unique_lock lock(s.m);
      s.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.parked.size() == 4; });
      s.later_before_bytes = s.later_started;
      parked.swap(s.parked);
    }
    for (auto h : parked) h.resume();
  }
};

// Batches 1-3 of 16 samples (batch size 4): sample 4 blocks the single worker until a releaser
// thread has resumed samples 5-15, parked before their CPU work, in reverse order (batch 3's
// first), as reads completing out of order would; `ran` records the batch of each sample's CPU
// work in the order the worker ran it.
struct OutOfOrderReads {
  struct Shared {
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::pair<Index, std::coroutine_handle<>>> parked;
    bool blocker_running = false;
    bool released = false;
    std::vector<std::int64_t> ran;
  };
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::int64_t size() const { return 16; }

  struct Park {
    Shared* s;
    Index i;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) const {
      std::lock_guard lock(s->m);
      s->parked.emplace_back(i, h);
      s->cv.notify_all();
    }
    void await_resume() const noexcept {}
  };

  Task<std::int64_t> get_async(Index i, SampleContext& ctx) {
    Shared* s = shared.get();
    if (i >= 5) co_await Park{s, i};
    co_await ctx.cpu();
    std::unique_lock lock(s->m);
    if (i == 4) {
      s->blocker_running = true;
      s->cv.notify_all();
      s->cv.wait_for(lock, std::chrono::seconds(60), [&] { return s->released; });
    }
    if (i >= 4) s->ran.push_back(i / 4);
    co_return i;
  }

  // The releaser: once sample 4 holds the worker and 5-15 are parked, resumes them from the
  // highest index down (each goes as far as queuing its CPU work), then lets sample 4 finish.
  static void release(Shared& s) {
    std::vector<std::pair<Index, std::coroutine_handle<>>> parked;
    {
      std::unique_lock lock(s.m);
      s.cv.wait_for(lock, std::chrono::seconds(60),
                    [&] { return s.blocker_running && s.parked.size() == 11; });
      parked = s.parked;
    }
    std::sort(parked.begin(), parked.end(), [](const auto& a, const auto& b) {
      return a.first > b.first;
    });
    for (auto& [i, h] : parked) h.resume();
    std::lock_guard lock(s.m);
    s.released = true;
    s.cv.notify_all();
  }
};

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("the workers run the CPU work of the oldest batch in flight first, whatever order "
            "its samples' reads complete in") {
    OutOfOrderReads dataset;
    auto shared = dataset.shared;
    auto loader = make_data_loader(dataset, {.batch_size = 4, .num_workers = 1,
                                             .prefetch_factor = 4});
    std::thread releaser([&] { OutOfOrderReads::release(*shared); });
    std::vector<std::int64_t> seen;
    for (auto& batch : loader) {
      auto v = values(batch);
      seen.insert(seen.end(), v.begin(), v.end());
    }
    releaser.join();
    std::vector<std::int64_t> expected(16);
    for (int i = 0; i < 16; ++i) expected[static_cast<std::size_t>(i)] = i;
    CHECK(seen == expected);
    std::lock_guard lock(shared->m);
    CHECK(shared->parked.size() == 11);
    // First come first served would run 1, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1.
    CHECK(shared->ran == std::vector<std::int64_t>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  }

  TEST_CASE("an epoch's first batch whose bytes came quickly is made alone: the next start "
            "once it is done") {
    // Without the hold, batch 1 is dispatched in the same driver turn as batch 0, before any
    // worker has finished one of batch 0's samples.
    const SlowFirstBytes never(std::chrono::hours(1));
    for (int epoch = 0; epoch < 2; ++epoch) {
      FinishedBefore dataset{32};
      auto loader = make_data_loader(dataset, {.batch_size = 4, .num_workers = 2,
                                               .persistent_workers = true});
      std::vector<std::int64_t> seen;
      for (int e = 0; e <= epoch; ++e) {
        seen.clear();
        dataset.finished->store(0);
        for (auto& batch : loader) {
          auto v = values(batch);
          seen.insert(seen.end(), v.begin(), v.end());
        }
      }
      CAPTURE(epoch);
      CHECK(seen.size() == 32);
      // Every later sample started after the first batch's four were done.
      int after_first = 0;
      for (std::size_t i = 4; i < 32; ++i) after_first += (*dataset.started_after)[i] >= 4;
      CHECK(after_first == 28);
    }
  }

  TEST_CASE("an epoch's first batch whose bytes were slow goes alone until they arrive: the "
            "next batches' reads then overlap its CPU work") {
    // Without the hold, batches 1-3 would start in the driver's turn that starts batch 0, before
    // its bytes. Holding them until batch 0 is done would add a second round trip to each
    // epoch's start on a remote source: sample 0's CPU work would wait its 60 s in vain.
    // (Any wait counts as slow here: the test's bytes come from a thread, not a link.)
    const SlowFirstBytes always(std::chrono::nanoseconds(0));
    for (int epochs = 1; epochs <= 2; ++epochs) {
      StartsBeside dataset;
      auto loader = make_data_loader(dataset, {.batch_size = 4, .num_workers = 2,
                                               .persistent_workers = true});
      for (int e = 0; e < epochs; ++e) {
        StartsBeside::Shared& s = *dataset.shared;
        {
          std::lock_guard lock(s.m);
          s.later_started = s.later_before_bytes = s.overlapped = false;
        }
        std::thread releaser([&s] { StartsBeside::release(s); });
        std::vector<std::int64_t> seen;
        for (auto& batch : loader) {
          auto v = values(batch);
          seen.insert(seen.end(), v.begin(), v.end());
        }
        releaser.join();
        CAPTURE(e);
        std::vector<std::int64_t> expected(32);
        for (int i = 0; i < 32; ++i) expected[static_cast<std::size_t>(i)] = i;
        CHECK(seen == expected);
        std::lock_guard lock(s.m);
        CHECK_FALSE(s.later_before_bytes);
        CHECK(s.overlapped);
      }
    }
  }

  TEST_CASE("when_all runs tasks at once and returns their results in order, or the first error") {
    ThreadExecutor pool(2);
    auto hop_and_square = [](ThreadExecutor& p, int v) -> Task<int> {
      co_await p.schedule();
      if (v == 7 || v == 9) throw std::runtime_error("bad " + std::to_string(v));
      co_return v * v;
    };
    std::vector<Task<int>> tasks;
    for (int v = 0; v < 50; ++v) {
      if (v != 7 && v != 9) tasks.push_back(hop_and_square(pool, v));
    }
    const auto squares = sync_wait(when_all(std::move(tasks)));
    REQUIRE(squares.size() == 48);
    CHECK(squares[0] == 0);
    CHECK(squares[7] == 64);
    CHECK(squares[47] == 49 * 49);
    std::vector<Task<int>> failing;
    for (int v : {1, 9, 7, 2}) failing.push_back(hop_and_square(pool, v));
    CHECK_THROWS_WITH(sync_wait(when_all(std::move(failing))), "bad 9");
    CHECK(sync_wait(when_all(std::vector<Task<int>>{})).empty());
  }

  TEST_CASE("get_async reads on the driver, works on a worker, and keeps batches in order") {
    Files files(40);
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      FileLengths dataset{&files, 40};
      auto seen = dataset.seen;
      auto loader = make_data_loader(dataset, {.batch_size = 8, .num_workers = workers});
      std::vector<std::int64_t> lengths;
      for (auto& batch : loader) {
        auto v = values(batch);
        lengths.insert(lengths.end(), v.begin(), v.end());
      }
      std::vector<std::int64_t> expected(40);
      for (int i = 0; i < 40; ++i) expected[static_cast<std::size_t>(i)] = i;
      CHECK(lengths == expected);
      CHECK(seen->on_driver_before_cpu == 40);
      CHECK(seen->on_worker_after_cpu == (workers ? 40 : 0));
      CHECK(seen->worker_info_after_cpu == (workers ? 40 : 0));
    }
  }

  TEST_CASE("worker_init_fn runs on each worker before its first asynchronous fetch's CPU work") {
    Files files(32);
    struct Log {
      std::mutex m;
      std::vector<std::pair<int, std::int64_t>> inits;  // (worker, epoch seen by the loader)
    };
    auto log = std::make_shared<Log>();
    auto epoch_no = std::make_shared<std::atomic<std::int64_t>>(0);
    for (bool persistent : {false, true}) {
      CAPTURE(persistent);
      log->inits.clear();
      LoaderOptions<> options{.batch_size = 4, .num_workers = 2};
      options.persistent_workers = persistent;
      options.worker_init_fn = [log, epoch_no](const WorkerInfo& info) {
        // It runs on the worker itself, with that worker's info installed.
        CHECK(get_worker_info()->id == info.id);
        std::lock_guard l(log->m);
        log->inits.emplace_back(info.id, epoch_no->load());
      };
      auto loader = make_data_loader(FileLengths{&files, 32}, options);
      for (std::int64_t e = 0; e < 2; ++e) {
        epoch_no->store(e);
        std::int64_t n = 0;
        for (auto& batch : loader) n += batch.size(0);
        CHECK(n == 32);
      }
      std::sort(log->inits.begin(), log->inits.end());
      // Each worker that did CPU work ran it once per epoch (once ever when persistent); a
      // worker may sit an epoch out when the other took every batch, never run it twice.
      std::set<std::pair<int, std::int64_t>> unique(log->inits.begin(), log->inits.end());
      CHECK(unique.size() == log->inits.size());
      if (persistent) {
        CHECK(log->inits.size() <= 2);
      } else {
        CHECK(log->inits.size() <= 4);
      }
      CHECK(!log->inits.empty());
    }
  }

  TEST_CASE("a failed read names the path and the sample; the rest of the epoch arrives") {
    Files files(12);
    std::filesystem::remove(files.path(5));
    auto loader =
        make_data_loader(FileLengths{&files, 12}, {.batch_size = 4, .num_workers = 2});
    auto epoch = loader.epoch();
    auto first = sync_wait(epoch.next());
    REQUIRE(first);
    CHECK(values(*first) == std::vector<std::int64_t>{0, 1, 2, 3});
    try {
      sync_wait(epoch.next());
      FAIL("batch 1 should have failed");
    } catch (const WorkerError& e) {
      const std::string what = e.what();
      CHECK(e.index() == 5);
      CHECK(e.batch() == 1);
      CHECK(what.find(files.path(5)) != std::string::npos);
      CHECK(what.find("No such file or directory") != std::string::npos);
    }
    auto third = sync_wait(epoch.next());
    REQUIRE(third);
    CHECK(values(*third) == std::vector<std::int64_t>{8, 9, 10, 11});
    CHECK_FALSE(sync_wait(epoch.next()));
  }

  TEST_CASE("on_error = skip leaves failed samples out, counts them, and drops emptied batches") {
    struct Flaky {
      std::int64_t size() const { return 12; }
      std::int64_t get(Index i) const {
        if (i == 5 || (i >= 8)) throw std::runtime_error("sample " + std::to_string(i) + " is bad");
        return i;
      }
    };
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(
          Flaky{}, {.batch_size = 4, .num_workers = workers, .on_error = OnError::skip});
      std::vector<std::vector<std::int64_t>> got;
      for (auto& b : loader) got.push_back(values(b));
      // Batch 2 (8..11) lost every sample, so the epoch has two batches.
      CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 6, 7}});
      CHECK(loader.skipped() == 5);
    }
    // The asynchronous path: a missing file is skipped the same way.
    Files files(12);
    std::filesystem::remove(files.path(5));
    auto loader = make_data_loader(FileLengths{&files, 12},
                                   {.batch_size = 4, .num_workers = 2, .on_error = OnError::skip});
    std::vector<std::vector<std::int64_t>> got;
    for (auto& b : loader) got.push_back(values(b));
    CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 6, 7}, {8, 9, 10, 11}});
    CHECK(loader.skipped() == 1);
  }

  TEST_CASE("get_batch_async builds whole batches, preferred over per-sample get") {
    Files files(10);
    static_assert(std::is_same_v<DataLoader<BatchLengths>::batch_type,
                                 std::pair<at::Tensor, std::int64_t>>);
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader =
          make_data_loader(BatchLengths{&files, 10}, {.batch_size = 4, .num_workers = workers});
      std::vector<std::vector<std::int64_t>> lengths;
      std::vector<std::int64_t> firsts;
      for (auto& [t, first] : loader) {
        lengths.push_back(values(t));
        firsts.push_back(first);
      }
      CHECK(lengths == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
      // File i starts with 'a' + i; file 0 is empty.
      CHECK(firsts == std::vector<std::int64_t>{'b' + 'c' + 'd', 'e' + 'f' + 'g' + 'h', 'i' + 'j'});
    }
  }

  TEST_CASE("destroying a loader with reads in flight returns and leaves no thread behind") {
    Files files(64);
    for (int round = 0; round < 3; ++round) {
      auto loader = make_data_loader(FileLengths{&files, 64},
                                     {.batch_size = 16, .num_workers = 2, .prefetch_factor = 2});
      auto epoch = loader.epoch();
      auto first = sync_wait(epoch.next());
      REQUIRE(first);
      CHECK(first->numel() == 16);
    }
  }
}

TEST_SUITE("loader") {
  TEST_CASE("a Subset's samples draw the same randomness fetched by batch or one by one") {
    const std::vector<Index> picked{9, 2, 14, 5, 2, 11};
    auto draws = [&](auto dataset) {
      auto loader = make_data_loader(Subset(std::move(dataset), picked),
                                     LoaderOptions<>{.batch_size = 3, .num_workers = 2, .seed = 7});
      std::vector<std::int64_t> all;
      for (auto& b : loader) {
        for (auto v : values(b)) all.push_back(v);
      }
      return all;
    };
    const std::vector<std::int64_t> each = draws(DrawEach{16});
    const std::vector<std::int64_t> batched = draws(DrawBatch{16});
    REQUIRE(each.size() == 6);
    // Sample k draws from its index in the subset, not from the dataset index it maps to:
    // positions 1 and 4 both map to dataset index 2, yet draw differently.
    CHECK(batched == each);
    CHECK(each[1] != each[4]);
  }

  TEST_CASE("Subset, ConcatDataset and map forward get_async and get_batch_async") {
    const Files files(12);
    // Subset: sample k is file indices[k].
    auto subset = Subset(FileLengths{&files, 12}, std::vector<Index>{11, 3, 7, 0});
    auto seen = subset.dataset().seen;
    {
      auto loader = make_data_loader(std::move(subset),
                                     LoaderOptions<>{.batch_size = 2, .num_workers = 2});
      std::vector<std::int64_t> got;
      for (auto& b : loader) {
        for (auto v : values(b)) got.push_back(v);
      }
      CHECK(got == std::vector<std::int64_t>{11, 3, 7, 0});
      // Read asynchronously (on the driver first), not through a blocking get.
      CHECK(seen->on_driver_before_cpu.load() == 4);
    }
    {
      auto loader = make_data_loader(
          Subset(BatchLengths{&files, 12}, std::vector<Index>{5, 9, 2}),
          LoaderOptions<>{.batch_size = 3, .num_workers = 1});
      int batches = 0;
      for (auto& [lengths, first_bytes] : loader) {
        CHECK(values(lengths) == std::vector<std::int64_t>{5, 9, 2});
        CHECK(first_bytes == ('a' + 5) + ('a' + 9) + ('a' + 2));
        ++batches;
      }
      CHECK(batches == 1);
    }
    {
      std::vector<FileLengths> parts{FileLengths{&files, 4}, FileLengths{&files, 12}};
      auto loader = make_data_loader(ConcatDataset<FileLengths>(std::move(parts)),
                                     LoaderOptions<>{.batch_size = 8, .num_workers = 2});
      std::vector<std::int64_t> got;
      for (auto& b : loader) {
        for (auto v : values(b)) got.push_back(v);
      }
      REQUIRE(got.size() == 16);
      CHECK(got[3] == 3);
      CHECK(got[4] == 0);  // the second dataset's first file
      CHECK(got[15] == 11);
    }
    {
      auto doubled = coload::map(FileLengths{&files, 6}, [](std::int64_t len, SampleContext& ctx) {
        CHECK(ThreadExecutor::current_worker_id() >= 0);  // the transform runs on a worker
        return len * 2 + ctx.epoch;
      });
      auto loader = make_data_loader(std::move(doubled),
                                     LoaderOptions<>{.batch_size = 6, .num_workers = 2});
      for (auto& b : loader) {
        CHECK(values(b) == std::vector<std::int64_t>{0, 2, 4, 6, 8, 10});
      }
    }
  }
}
