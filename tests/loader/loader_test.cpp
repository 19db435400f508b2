// Specification of the DataLoader: options, order, workers, errors, the three ways to consume.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <climits>
#include <limits>
#include <map>
#include <numeric>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coload/coload.hpp"

using namespace coload;

namespace {

int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Threads of this process named `name` (/proc/self/task/*/comm).
int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

TensorDataset range_dataset(std::int64_t n) { return TensorDataset{at::arange(n, at::kLong)}; }

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// Samples are their own index; records which worker and seed fetched each.
struct IndexDataset {
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const { return i; }
};

// Records the thread of every get.
struct ThreadRecordingDataset {
  struct Seen {
    std::mutex m;
    std::vector<std::thread::id> threads;
  };
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  std::int64_t size() const { return 6; }
  std::int64_t get(Index i) const {
    std::lock_guard lock(seen->m);
    seen->threads.push_back(std::this_thread::get_id());
    return i;
  }
  // How many gets ran on `id`, and how many elsewhere; forgets them.
  std::pair<int, int> take(std::thread::id id) const {
    std::lock_guard lock(seen->m);
    const auto on = static_cast<int>(std::count(seen->threads.begin(), seen->threads.end(), id));
    const int off = static_cast<int>(seen->threads.size()) - on;
    seen->threads.clear();
    return {on, off};
  }
};

// A gate the test opens; workers that reach it wait. Counts arrivals without sleeping.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int fetched = 0;
  std::int64_t max_index = -1;
  void wait_open() {
    std::unique_lock l(m);
    cv.wait(l, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard l(m);
      open = true;
    }
    cv.notify_all();
  }
  void arrived(std::int64_t index) {
    {
      std::lock_guard l(m);
      ++fetched;
      max_index = std::max(max_index, index);
    }
    cv.notify_all();
  }
  void wait_fetched(int count) {
    std::unique_lock l(m);
    cv.wait(l, [&] { return fetched >= count; });
  }
};

// Sample 0 waits at the gate; every other sample is fetched at once.
struct GatedDataset {
  std::shared_ptr<Gate> gate;
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const {
    if (i == 0) gate->wait_open();
    gate->arrived(i);
    return i;
  }
};

// Each get takes a while and counts itself.
struct SlowDataset {
  std::shared_ptr<std::atomic<int>> gets;
  std::int64_t size() const { return 100000; }
  std::int64_t get(Index i) const {
    gets->fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the work, not synchronisation
    return i;
  }
};

struct ThrowingDataset {
  std::int64_t size() const { return 12; }
  std::int64_t get(Index i) const {
    if (i == 5) throw std::out_of_range("no sample five here");
    return i;
  }
};

template <class Options>
std::string refusal(Options options) {
  try {
    auto loader = make_data_loader(range_dataset(10), std::move(options));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

template <class Loader>
std::vector<std::vector<std::int64_t>> epoch_lists(Loader& loader) {
  std::vector<std::vector<std::int64_t>> out;
  for (auto& batch : loader) {
    if constexpr (std::is_same_v<std::decay_t<decltype(batch)>, at::Tensor>) {
      out.push_back(to_vector(batch));
    } else {
      out.push_back(to_vector(batch.at(0)));
    }
  }
  return out;
}

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("invalid option combinations are refused with PyTorch's wording") {
    CHECK(refusal(LoaderOptions{.shuffle = true, .sampler = SequentialSampler(10)}) ==
          "sampler option is mutually exclusive with shuffle");
    CHECK(refusal(LoaderOptions{.batch_size = 4,
                                .batch_sampler = BatchSampler(SequentialSampler(10), 2, false)}) ==
          "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
          "drop_last");
    // (-1 is coload::auto_workers.)
    CHECK(refusal(LoaderOptions{.num_workers = -2}) ==
          "num_workers option should be non-negative; use num_workers=0 to disable "
          "multiprocessing.");
    CHECK(refusal(LoaderOptions{.prefetch_factor = 4}) ==
          "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
          "to enable multiprocessing.");
    CHECK(refusal(LoaderOptions{.timeout = -1}) == "timeout option should be non-negative");
    CHECK(refusal(LoaderOptions{.persistent_workers = true}) ==
          "persistent_workers option needs num_workers > 0");
    CHECK(refusal(LoaderOptions{.batch_size = 0}) ==
          "batch_size should be a positive integer value, but got batch_size=0");
    CHECK(refusal(LoaderOptions{.num_workers = 1, .prefetch_factor = 2}) == "accepted");
    // coload's bounds: a prefetch_factor sized the reorder ring (INT_MAX asked for 4.3e9
    // slots), and a timeout of inf or 1e10 s fired at once (its nanoseconds overflowed).
    CHECK(refusal(LoaderOptions{.num_workers = 2, .prefetch_factor = INT_MAX}) ==
          "prefetch_factor option should be at most 1024 (batches in flight a worker, each "
          "holding a slot of the reorder ring), but got 2147483647");
    CHECK(refusal(LoaderOptions{.num_workers = 2, .prefetch_factor = 1024}) == "accepted");
    for (const double t : {1e10, std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()}) {
      CAPTURE(t);
      CHECK(refusal(LoaderOptions{.num_workers = 1, .timeout = t}).starts_with(
          "timeout option should be a finite number of seconds, at most 1e9 (0 waits for ever), "
          "but got "));
    }
    CHECK(refusal(LoaderOptions{.num_workers = 1, .timeout = 1e9}) == "accepted");
  }

  TEST_CASE("size() counts batches per epoch as len(DataLoader), honouring drop_last") {
    CHECK(make_data_loader(range_dataset(10), {.batch_size = 3}).size() == 4);
    CHECK(make_data_loader(range_dataset(10), {.batch_size = 3, .drop_last = true}).size() == 3);
    CHECK(make_data_loader(range_dataset(9), {.batch_size = 3}).size() == 3);
  }

  TEST_CASE("size() counts batches with every sampler of sampler/, by value or shared") {
    // Each sampler's own length, batched by 3 (ceil) or with drop_last (floor).
    auto check = [](AnySampler sampler, std::int64_t length) {
      CAPTURE(length);
      auto kept = make_data_loader(range_dataset(10), {.batch_size = 3, .sampler = sampler});
      CHECK(kept.size() == (length + 2) / 3);
      auto dropped = make_data_loader(range_dataset(10),
                                      {.batch_size = 3, .sampler = sampler, .drop_last = true});
      CHECK(dropped.size() == length / 3);
      // size() is what an epoch delivers.
      CHECK(static_cast<std::int64_t>(epoch_lists(kept).size()) == kept.size());
    };
    check(SequentialSampler(10), 10);
    check(std::make_shared<SequentialSampler>(7), 7);
    check(RandomSampler(10), 10);
    check(RandomSampler(10, true, 5, make_generator(1)), 5);
    check(SubsetRandomSampler({1, 3, 5, 7}, make_generator(2)), 4);
    check(WeightedRandomSampler({1.0, 2.0, 3.0}, 8, true, make_generator(3)), 8);
    check(DistributedSampler(10, 3, 0, true, 7), 4);  // ceil(10 / 3) per rank
    check(DistributedSampler(10, 3, 2, true, 7, true), 3);  // drop_last: floor(10 / 3)
    auto shared = std::make_shared<DistributedSampler>(10, 4, 1, false);
    check(shared, 3);

    // A batch sampler's own length is the loader's.
    auto batched = make_data_loader(
        range_dataset(10), {.batch_sampler = BatchSampler(RandomSampler(10), 4, false)});
    CHECK(batched.size() == 3);
  }

  TEST_CASE("a collate passed as make_data_loader's third argument, a lambda included") {
    auto loader = make_data_loader(IndexDataset{5}, {.batch_size = 2, .num_workers = 1},
                                   [](std::vector<std::int64_t> s) {
                                     return std::accumulate(s.begin(), s.end(), std::int64_t{0});
                                   });
    static_assert(std::same_as<decltype(loader)::batch_type, std::int64_t>);
    CHECK(loader.options().batch_size == 2);  // the other options are kept
    CHECK(loader.options().num_workers == 1);
    std::vector<std::int64_t> sums;
    for (auto& s : loader) sums.push_back(s);
    CHECK(sums == std::vector<std::int64_t>{0 + 1, 2 + 3, 4});
  }

  TEST_CASE("size() over a user sampler without size() names what is missing") {
    struct Unsized {
      Generator<Index> indices() const {
        for (Index i = 0; i < 4; ++i) co_yield i;
      }
    };
    auto loader = make_data_loader(range_dataset(10), {.batch_size = 3, .sampler = Unsized{}});
    CHECK(epoch_lists(loader).size() == 2);  // it loads, it just has no length
    try {
      (void)loader.size();
      FAIL("size() returned");
    } catch (const LogicError& e) {
      CHECK(std::string(e.what()) == "DataLoader: the sampler has no size()");
    }
  }

  TEST_CASE("a range-for is one epoch of batches in sampler order, and may be repeated") {
    auto loader = make_data_loader(range_dataset(10), {.batch_size = 4});
    const std::vector<std::vector<std::int64_t>> expected{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}};
    CHECK(epoch_lists(loader) == expected);
    CHECK(epoch_lists(loader) == expected);
  }

  TEST_CASE("a seeded shuffle yields PyTorch's order for DataLoader(generator=manual_seed(7))") {
    // torch 1.13: DataLoader(range(10), batch_size=3, shuffle=True,
    //                        generator=torch.Generator().manual_seed(7)), two epochs.
    const std::vector<std::vector<std::int64_t>> first{{1, 3, 5}, {7, 9, 4}, {6, 2, 8}, {0}};
    const std::vector<std::vector<std::int64_t>> second{{5, 1, 6}, {0, 9, 7}, {8, 4, 3}, {2}};
    for (int workers : {0, 1, 3}) {
      CAPTURE(workers);
      auto loader = make_data_loader(range_dataset(10),
                                     {.batch_size = 3, .shuffle = true, .num_workers = workers,
                                      .seed = 7});
      CHECK(epoch_lists(loader) == first);
      CHECK(epoch_lists(loader) == second);
    }
  }

  TEST_CASE("per-sample get and default_collate build the same batches as get_batch") {
    struct PerSample {
      TensorDataset inner;
      std::int64_t size() const { return inner.size(); }
      std::vector<at::Tensor> get(Index i) const { return inner.get(i); }
    };
    auto data = at::arange(40, at::kFloat).reshape({20, 2});
    auto labels = at::arange(20, at::kLong) * 10;
    auto batched = make_data_loader(TensorDataset{data, labels},
                                    {.batch_size = 6, .shuffle = true, .seed = 3});
    auto per_sample = make_data_loader(PerSample{TensorDataset{data, labels}},
                                       {.batch_size = 6, .shuffle = true, .num_workers = 2,
                                        .seed = 3});
    std::vector<std::vector<at::Tensor>> a, b;
    for (auto& batch : batched) a.push_back(batch);
    for (auto& batch : per_sample) b.push_back(batch);
    REQUIRE(a.size() == 4);
    REQUIRE(b.size() == 4);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].size() == 2);
      CHECK(a[i][0].equal(b[i][0]));
      CHECK(a[i][1].equal(b[i][1]));
      CHECK(a[i][1].equal(a[i][0].select(1, 0).div(2).to(at::kLong) * 10));
    }
  }

  TEST_CASE("an epoch is consumed with co_await epoch.next()") {
    auto loader = make_data_loader(IndexDataset{7}, {.batch_size = 2, .num_workers = 2});
    auto consume = [&]() -> Task<std::vector<std::int64_t>> {
      std::vector<std::int64_t> seen;
      auto epoch = loader.epoch();
      while (auto batch = co_await epoch.next()) {
        for (auto v : to_vector(*batch)) seen.push_back(v);
      }
      co_return seen;
    };
    CHECK(sync_wait(consume()) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
    CHECK(sync_wait(consume()) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
  }

  TEST_CASE("async_next serves asio::use_awaitable, use_future and a plain callback") {
    auto loader = make_data_loader(IndexDataset{5}, {.batch_size = 2, .num_workers = 1});

    asio::io_context io;
    std::vector<std::int64_t> awaited;
    int epochs_ended = 0;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          for (int e = 0; e < 2; ++e) {
            while (auto batch = co_await loader.async_next(asio::use_awaitable)) {
              for (auto v : to_vector(*batch)) awaited.push_back(v);
            }
            ++epochs_ended;
          }
        },
        asio::detached);
    io.run();
    CHECK(epochs_ended == 2);
    CHECK(awaited == std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4});

    std::vector<std::int64_t> from_futures;
    for (;;) {
      auto batch = loader.async_next(asio::use_future).get();
      if (!batch) break;
      for (auto v : to_vector(*batch)) from_futures.push_back(v);
    }
    CHECK(from_futures == std::vector<std::int64_t>{0, 1, 2, 3, 4});

    std::promise<std::vector<std::int64_t>> done;
    std::vector<std::int64_t> from_callbacks;
    std::function<void(std::exception_ptr, std::optional<at::Tensor>)> on_batch =
        [&](std::exception_ptr error, std::optional<at::Tensor> batch) {
          if (error || !batch) {
            done.set_value(from_callbacks);
            return;
          }
          for (auto v : to_vector(*batch)) from_callbacks.push_back(v);
          loader.async_next(on_batch);
        };
    const auto caller = std::this_thread::get_id();
    std::thread::id ran_on;
    loader.async_next([&](std::exception_ptr e, std::optional<at::Tensor> b) {
      ran_on = std::this_thread::get_id();
      on_batch(e, std::move(b));
    });
    CHECK(done.get_future().get() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
    CHECK(ran_on != caller);  // never invoked from within async_next
  }

  TEST_CASE("a slow batch does not stop the other workers fetching ahead, up to the bound") {
    auto gate = std::make_shared<Gate>();
    // 2 workers x prefetch 2: at most 4 batches of 2 in flight; sample 0 (batch 0) is stuck.
    auto loader = make_data_loader(GatedDataset{gate, 40},
                                   {.batch_size = 2, .num_workers = 2, .prefetch_factor = 2});
    auto epoch = loader.epoch();
    gate->wait_fetched(6);  // batches 1..3 fetched by the free worker while batch 0 waits
    {
      std::lock_guard l(gate->m);
      CHECK(gate->max_index == 7);  // nothing beyond the 4th batch was started
    }
    gate->release();
    std::vector<std::int64_t> seen;
    while (auto batch = sync_wait(epoch.next())) {
      for (auto v : to_vector(*batch)) seen.push_back(v);
    }
    std::vector<std::int64_t> expected(40);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(seen == expected);  // and still delivered in order
  }

  TEST_CASE("in_order = false delivers ready batches before a slow one") {
    auto gate = std::make_shared<Gate>();
    auto loader = make_data_loader(GatedDataset{gate, 8},
                                   {.batch_size = 2, .num_workers = 2, .in_order = false});
    auto epoch = loader.epoch();
    auto first = sync_wait(epoch.next());
    gate->release();
    REQUIRE(first);
    const auto first_values = to_vector(*first);
    CHECK(first_values[0] != 0);
    std::multiset<std::int64_t> all(first_values.begin(), first_values.end());
    while (auto batch = sync_wait(epoch.next())) {
      for (auto v : to_vector(*batch)) all.insert(v);
    }
    CHECK(all == std::multiset<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }

  TEST_CASE("an exception in get reaches the consumer with its message, index and worker") {
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(ThrowingDataset{}, {.batch_size = 4, .num_workers = workers});
      auto epoch = loader.epoch();
      auto first = sync_wait(epoch.next());
      REQUIRE(first);
      CHECK(to_vector(*first) == std::vector<std::int64_t>{0, 1, 2, 3});
      try {
        sync_wait(epoch.next());
        FAIL("batch 1 should have failed");
      } catch (const WorkerError& e) {
        const std::string what = e.what();
        CHECK(what.find("no sample five here") != std::string::npos);
        CHECK(what.find("std::out_of_range") != std::string::npos);
        CHECK(what.find("sample 5 of batch 1") != std::string::npos);
        CHECK(e.index() == 5);
        CHECK(e.batch() == 1);
        CHECK(e.original_message() == "no sample five here");
        if (workers == 0) {
          CHECK(e.worker_id() == -1);
          CHECK(what.find("driver") != std::string::npos);
        } else {
          CHECK(e.worker_id() >= 0);
          CHECK(e.worker_id() < workers);
          CHECK(what.find("DataLoader worker " + std::to_string(e.worker_id())) !=
                std::string::npos);
        }
        CHECK_THROWS_AS(std::rethrow_exception(e.original()), std::out_of_range);
      }
      auto third = sync_wait(epoch.next());  // nothing else is lost
      REQUIRE(third);
      CHECK(to_vector(*third) == std::vector<std::int64_t>{8, 9, 10, 11});
      CHECK_FALSE(sync_wait(epoch.next()));
    }
  }

  TEST_CASE("timeout raises an error naming the batch, the seconds, the worker and the indices, "
            "and the batch can still come") {
    auto gate = std::make_shared<Gate>();
    const int before = thread_count();
    {
      auto loader = make_data_loader(GatedDataset{gate, 4},
                                     {.batch_size = 2, .num_workers = 1, .timeout = 0.05});
      auto epoch = loader.epoch();
      try {
        sync_wait(epoch.next());
        FAIL("expected a timeout");
      } catch (const TimeoutError& e) {
        CHECK(std::string(e.what()) == "DataLoader timed out after 0.05 seconds waiting for batch 0 "
                                       "from worker 0, fetching indices 0, 1");
        CHECK(e.batch() == 0);
        CHECK(e.worker_id() == 0);
        CHECK(e.pid() == -1);
        CHECK(e.indices() == std::vector<std::int64_t>{0, 1});
        CHECK(e.seconds() == doctest::Approx(0.05));
      }
      gate->release();
      auto batch = sync_wait(epoch.next());
      REQUIRE(batch);
      CHECK(to_vector(*batch) == std::vector<std::int64_t>{0, 1});
    }
    CHECK(thread_count() == before);
  }

  TEST_CASE("a timeout names the batch waited for, not the count taken (in_order = false)") {
    // Batch 0 waits at the gate; batches 1-3 come out of order and are taken first. The wait
    // then is for batch 0, however many were taken.
    auto gate = std::make_shared<Gate>();
    {
      auto loader = make_data_loader(
          GatedDataset{gate, 8},
          {.batch_size = 2, .num_workers = 2, .timeout = 0.2, .in_order = false});
      auto epoch = loader.epoch();
      std::vector<std::vector<std::int64_t>> got;
      std::optional<TimeoutError> timeout;
      while (!timeout) {
        try {
          auto b = sync_wait(epoch.next());
          REQUIRE(b);
          got.push_back(to_vector(*b));
        } catch (const TimeoutError& e) {
          timeout = e;
        }
      }
      CHECK(got.size() <= 3);
      CHECK(timeout->batch() == 0);
      CHECK(timeout->indices() == std::vector<std::int64_t>{0, 1});
      const std::string what = timeout->what();
      CHECK(what.rfind("DataLoader timed out after 0.2 seconds waiting for batch 0 from worker ", 0) == 0);
      CHECK(what.find("fetching indices 0, 1") != std::string::npos);
      gate->release();
      while (auto b = sync_wait(epoch.next())) got.push_back(to_vector(*b));
      std::sort(got.begin(), got.end());
      CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    }
  }

  TEST_CASE("get_worker_info is the worker's inside get and empty outside") {
    struct InfoDataset {
      std::int64_t size() const { return 64; }
      std::vector<std::int64_t> get(Index i) const {
        auto info = get_worker_info();
        REQUIRE(info);
        REQUIRE(info->dataset_as<InfoDataset>() != nullptr);
        return {i, info->id, info->num_workers, static_cast<std::int64_t>(info->seed)};
      }
    };
    CHECK_FALSE(get_worker_info());
    auto loader = make_data_loader(InfoDataset{}, {.batch_size = 4, .num_workers = 3, .seed = 11});
    std::set<std::int64_t> base_seeds;
    for (auto& batch : loader) {
      REQUIRE(batch.size() == 4);
      auto ids = to_vector(batch[1]);
      auto counts = to_vector(batch[2]);
      auto seeds = to_vector(batch[3]);
      for (std::size_t k = 0; k < ids.size(); ++k) {
        CHECK(ids[k] >= 0);
        CHECK(ids[k] < 3);
        CHECK(counts[k] == 3);
        base_seeds.insert(seeds[k] - ids[k]);  // seed = epoch base seed + worker id
      }
    }
    CHECK(base_seeds.size() == 1);
    CHECK_FALSE(get_worker_info());

    struct MainThreadDataset {
      std::int64_t size() const { return 3; }
      std::int64_t get(Index i) const { return get_worker_info() ? -1 : i; }
    };
    auto inline_loader = make_data_loader(MainThreadDataset{}, {.batch_size = 3});
    for (auto& batch : inline_loader) CHECK(to_vector(batch) == std::vector<std::int64_t>{0, 1, 2});
  }

  TEST_CASE("worker seeds are PyTorch's: base_seed drawn from the loader's seed, plus the id") {
    // torch 1.13: torch.empty((), dtype=torch.int64).random_(
    //     generator=torch.Generator().manual_seed(7)).item() == 1407639518939636932
    const std::int64_t base_seed = 1407639518939636932;
    auto seen = std::make_shared<std::map<int, std::uint64_t>>();
    auto m = std::make_shared<std::mutex>();
    auto loader = make_data_loader(
        IndexDataset{8}, {.batch_size = 2,
                          .num_workers = 2,
                          .worker_init_fn =
                              [seen, m](const WorkerInfo& info) {
                                std::lock_guard l(*m);
                                (*seen)[info.id] = info.seed;
                              },
                          .seed = 7});
    for ([[maybe_unused]] auto& batch : loader) {
    }
    std::lock_guard l(*m);
    REQUIRE_FALSE(seen->empty());
    for (auto [id, seed] : *seen) CHECK(seed == static_cast<std::uint64_t>(base_seed + id));
  }

  TEST_CASE("worker_init_fn runs once per worker before its first fetch") {
    struct Tally {
      std::mutex m;
      std::map<int, int> inits;
      std::map<int, int> fetched_before_init;
    };
    auto tally = std::make_shared<Tally>();
    struct CheckingDataset {
      std::shared_ptr<Tally> tally;
      std::int64_t size() const { return 60; }
      std::int64_t get(Index i) const {
        auto info = get_worker_info();
        std::lock_guard l(tally->m);
        if (tally->inits[info->id] != 1) ++tally->fetched_before_init[info->id];
        return i;
      }
    };
    for (bool persistent : {true, false}) {
      CAPTURE(persistent);
      tally->inits.clear();
      auto loader = make_data_loader(
          CheckingDataset{tally},
          {.batch_size = 3,
           .num_workers = 2,
           .worker_init_fn =
               [tally](const WorkerInfo& info) {
                 std::lock_guard l(tally->m);
                 ++tally->inits[info.id];
               },
           .persistent_workers = persistent});
      std::int64_t batches = 0;
      for (auto& batch : loader) batches += batch.size(0) > 0;
      CHECK(batches == 20);
      std::lock_guard l(tally->m);
      CHECK(tally->fetched_before_init.empty());
      CHECK_FALSE(tally->inits.empty());
      for (auto [id, n] : tally->inits) CHECK(n == 1);
    }
  }

  TEST_CASE("a batch size beyond the dataset's, up to INT64_MAX, is one batch of everything, as "
            "torch's") {
    // Before, len() overflowed ((n + b - 1) / b) and each batch reserved b indices up front.
    for (const std::int64_t b : {std::int64_t{6}, std::numeric_limits<std::int64_t>::max()}) {
      CAPTURE(b);
      for (const int workers : {0, 1}) {
        auto loader = make_data_loader(IndexDataset{5}, {.batch_size = b, .num_workers = workers});
        CHECK(loader.size() == 1);
        CHECK(epoch_lists(loader) == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3, 4}});
      }
    }
  }

  TEST_CASE("persistent workers draw the base seed once, as PyTorch's: every epoch's shuffle is "
            "torch's") {
    // torch 1.13: DataLoader(range(8), batch_size=8, shuffle=True, num_workers=1,
    // persistent_workers=p, generator=torch.Generator().manual_seed(1234)), three epochs.
    // Before, coload drew a base seed every epoch: from the second on, another order.
    const std::vector<std::vector<std::int64_t>> persistent = {
        {6, 0, 4, 7, 2, 5, 3, 1}, {4, 2, 1, 5, 6, 3, 0, 7}, {7, 2, 4, 5, 1, 3, 6, 0}};
    const std::vector<std::vector<std::int64_t>> fresh = {
        {6, 0, 4, 7, 2, 5, 3, 1}, {2, 6, 0, 5, 4, 3, 7, 1}, {4, 0, 2, 1, 6, 3, 7, 5}};
    for (const bool p : {true, false}) {
      CAPTURE(p);
      auto loader = make_data_loader(IndexDataset{8}, {.batch_size = 8,
                                                       .shuffle = true,
                                                       .num_workers = 1,
                                                       .persistent_workers = p,
                                                       .seed = 1234});
      std::vector<std::vector<std::int64_t>> got;
      for (int e = 0; e < 3; ++e) got.push_back(epoch_lists(loader).at(0));
      CHECK(got == (p ? persistent : fresh));
    }
  }

  TEST_CASE("a worker whose worker_init_fn failed fails every later batch of the epoch, with that "
            "error") {
    // Before, only the first batch failed: the worker served the next ones half set up, as a
    // worker process did every one after its first (torch's worker fails every fetch of the
    // epoch after its worker_init_fn has failed; a persistent one serves the next epochs).
    for (const bool persistent : {false, true}) {
      for (const Executor executor : {Executor::threads, Executor::processes}) {
        CAPTURE(persistent);
        CAPTURE(static_cast<int>(executor));
        auto inits = std::make_shared<std::atomic<int>>(0);  // the threads' count
        auto loader = make_data_loader(IndexDataset{6}, {.batch_size = 2,
                                                         .num_workers = 1,
                                                         .worker_init_fn =
                                                             [inits](const WorkerInfo&) {
                                                               ++*inits;
                                                               throw std::runtime_error(
                                                                   "no GPU here");
                                                             },
                                                         .persistent_workers = persistent,
                                                         .executor = executor});
        for (int epoch = 0; epoch < 2; ++epoch) {
          CAPTURE(epoch);
          auto e = loader.epoch();
          std::vector<std::int64_t> failed;
          std::int64_t served = 0;
          for (;;) {
            try {
              if (!sync_wait(e.next())) break;
              ++served;
            } catch (const WorkerError& error) {
              failed.push_back(error.batch());
              const std::string what = error.what();
              // A worker process adds its pid after its id.
              CHECK(what.starts_with("Caught std::runtime_error in DataLoader worker 0 "));
              CHECK(what.ends_with(" while " +
                                   std::string(failed.size() == 1
                                                   ? "running worker_init_fn before"
                                                   : "serving, as its worker_init_fn had failed,") +
                                   " batch " + std::to_string(error.batch()) + ": no GPU here"));
            }
          }
          if (persistent && epoch == 1) {
            CHECK(served == 3);  // worker_init_fn runs once; the next epoch is served
            CHECK(failed.empty());
          } else {
            CHECK(failed == std::vector<std::int64_t>{0, 1, 2});
            CHECK(served == 0);
          }
          if (executor == Executor::threads) CHECK(inits->load() == (persistent ? 1 : epoch + 1));
        }
      }
    }
  }

  TEST_CASE("get(index, ctx) receives the index, the epoch and a per-sample Rng independent of workers") {
    struct Augmenting {
      std::int64_t size() const { return 30; }
      std::tuple<std::int64_t, std::int64_t, double> get(Index i, SampleContext& ctx) const {
        REQUIRE(ctx.index == i);
        return {i, ctx.epoch, ctx.rng.uniform()};
      }
    };
    std::vector<at::Tensor> reference;
    for (int workers : {0, 1, 3}) {
      CAPTURE(workers);
      auto loader = make_data_loader(Augmenting{}, {.batch_size = 5, .shuffle = true,
                                                    .num_workers = workers, .seed = 99});
      std::vector<at::Tensor> run;
      for (int e = 0; e < 2; ++e) {
        for (auto& [idx, epoch, noise] : loader) {
          CHECK(to_vector(epoch) == std::vector<std::int64_t>(5, e));
          run.push_back(at::stack({idx.to(at::kDouble), noise}));
        }
      }
      if (reference.empty()) {
        reference = run;
        CHECK_FALSE(reference[0].equal(reference[6]));  // epochs differ
      } else {
        REQUIRE(run.size() == reference.size());
        for (std::size_t k = 0; k < run.size(); ++k) CHECK(run[k].equal(reference[k]));
      }
    }
  }

  TEST_CASE("a user sampler, batch sampler and collate replace the defaults") {
    struct Backwards {
      std::int64_t n;
      AsyncGenerator<Index> indices() const {
        for (Index i = n - 1; i >= 0; --i) co_yield i;
      }
    };
    auto loader = make_data_loader(IndexDataset{5},
                                   LoaderOptions{.batch_size = 2, .sampler = Backwards{5},
                                                 .collate = [](std::vector<std::int64_t> s) {
                                                   return std::accumulate(s.begin(), s.end(),
                                                                          std::int64_t{0});
                                                 }});
    std::vector<std::int64_t> sums;
    for (auto& s : loader) sums.push_back(s);
    CHECK(sums == std::vector<std::int64_t>{4 + 3, 2 + 1, 0});
    CHECK_THROWS_AS(loader.size(), std::logic_error);  // the sampler has no size()

    struct Pairs {
      Generator<std::vector<Index>> batches() const {
        // NOTE: GCC 12 miscompiles braced lists inside coroutines ("array used as initializer").
        static constexpr Index first[] = {3, 1};
        co_yield std::vector<Index>(std::begin(first), std::end(first));
        co_yield std::vector<Index>(1, 0);
      }
      std::int64_t size() const { return 2; }
    };
    auto by_batch = make_data_loader(IndexDataset{5}, {.batch_sampler = Pairs{}});
    CHECK(by_batch.size() == 2);
    std::vector<std::vector<std::int64_t>> lists;
    for (auto& b : by_batch) lists.push_back(to_vector(b));
    CHECK(lists == std::vector<std::vector<std::int64_t>>{{3, 1}, {0}});
  }

  TEST_CASE("a sampler's index outside the dataset fails its batch, naming it, and the epoch goes on") {
    struct PastTheEnd {
      AsyncGenerator<Index> indices() const {
        // NOTE: an array, not a braced list: GCC 12 miscompiles those inside coroutines.
        static constexpr Index order[] = {0, 1, 2, 5, 3, -5};
        for (Index i : order) co_yield i;
      }
    };
    const std::string message =
        "DataLoader: the sampler gave index 5 in batch 1, outside the dataset's 5 samples "
        "(indices -5 to 4)";
    for (const int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(
          IndexDataset{5}, {.batch_size = 2, .sampler = PastTheEnd{}, .num_workers = workers});
      // The range-for stops at the error, after the batch before it.
      std::vector<std::vector<std::int64_t>> got;
      std::string error = "(nothing thrown)";
      try {
        for (auto& b : loader) got.push_back(to_vector(b));
      } catch (const OutOfRange& e) {
        error = e.what();
      }
      CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1}});
      CHECK(error == message);
      // Epoch::next() goes on after a batch's error; a negative index within the dataset is
      // read from its end, as coload's datasets (and Python) do.
      auto epoch = loader.epoch();
      std::vector<std::string> seen;
      for (;;) {
        try {
          auto b = sync_wait(epoch.next());
          if (!b) break;
          const auto v = to_vector(*b);
          seen.push_back(std::to_string(v.at(0)) + "," + std::to_string(v.at(1)));
        } catch (const OutOfRange& e) {
          seen.push_back(e.what());
        }
      }
      CHECK(seen == std::vector<std::string>{"0,1", message, "3,-5"});
    }
    // With on_error = skip the index is a skipped sample; a batch left empty is skipped.
    struct Skips {
      Generator<std::vector<Index>> batches() const {
        static constexpr Index first[] = {0, 7};
        co_yield std::vector<Index>(std::begin(first), std::end(first));
        co_yield std::vector<Index>(1, -6);
        co_yield std::vector<Index>(1, 4);
      }
    };
    auto skipping = make_data_loader(IndexDataset{5},
                                     {.batch_sampler = Skips{}, .on_error = OnError::skip});
    std::vector<std::vector<std::int64_t>> kept;
    for (auto& b : skipping) kept.push_back(to_vector(b));
    CHECK(kept == std::vector<std::vector<std::int64_t>>{{0}, {4}});
    CHECK(skipping.skipped() == 2);
    struct Negative {
      Generator<std::vector<Index>> batches() const { co_yield std::vector<Index>(1, -6); }
    };
    auto loader = make_data_loader(IndexDataset{5}, {.batch_sampler = Negative{}});
    CHECK_THROWS_WITH_AS(
        [&] {
          for (auto& b : loader) (void)b;
        }(),
        "DataLoader: the batch_sampler gave index -6 in batch 0, outside the dataset's 5 "
        "samples (indices -5 to 4)",
        OutOfRange);
  }

  TEST_CASE("one epoch at a time: a second epoch() while one runs is refused") {
    auto loader = make_data_loader(IndexDataset{10}, {.batch_size = 2});
    auto epoch = loader.epoch();
    CHECK_THROWS_WITH_AS(loader.epoch(), doctest::Contains("still in progress"), std::logic_error);
    while (sync_wait(epoch.next())) {
    }
    auto next = loader.epoch();  // the first has ended
    CHECK(sync_wait(next.next()).has_value());
  }

  TEST_CASE("destroying a loader mid-epoch returns promptly and leaves no thread behind") {
    const int before = thread_count();
    auto gets = std::make_shared<std::atomic<int>>(0);
    const auto start = std::chrono::steady_clock::now();
    std::chrono::steady_clock::duration first_batch{};
    {
      auto loader = make_data_loader(SlowDataset{gets},
                                     {.batch_size = 64, .num_workers = 2, .prefetch_factor = 4});
      auto epoch = loader.epoch();
      auto first = sync_wait(epoch.next());
      REQUIRE(first);
      CHECK(first->size(0) == 64);
      CHECK(thread_count() == before + 3);  // the driver and two workers
      first_batch = std::chrono::steady_clock::now() - start;
    }  // the batch, the epoch and the loader are destroyed here
    const auto teardown = std::chrono::steady_clock::now() - start - first_batch;
    CHECK(thread_count() == before);
    // Fetching stops between samples: far fewer gets than the 8 batches x 64 in flight.
    CHECK(gets->load() < 64 * 4);
    // And the destructor waits for one sample per worker, not for a batch: against the first
    // batch (64 samples of 5 ms, measured in this run), with a second to spare.
    CHECK(teardown < first_batch + std::chrono::seconds(1));
  }

  TEST_CASE("with no workers a range-for fetches on the consumer's thread and starts no thread; "
            "waiting elsewhere starts the driver's") {
    const auto me = std::this_thread::get_id();
    const int before = thread_count();
    const int drivers = threads_named("coload-driver");
    ThreadRecordingDataset ds;
    auto loader = make_data_loader(ds, {.batch_size = 2});
    CHECK(thread_count() == before);
    std::vector<std::vector<std::int64_t>> lists;
    for (auto& b : loader) {
      lists.push_back(to_vector(b));
      CHECK(thread_count() == before);
    }
    CHECK(lists == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4, 5}});
    CHECK(ds.take(me) == std::pair{6, 0});
    // loader.next(epoch) waits as the range-for does: here, a batch a call, none fetched ahead.
    CHECK(loader.fetches_here());
    {
      auto epoch = loader.epoch();
      for (std::int64_t b = 0; b < 3; ++b) {
        auto batch = loader.next(epoch);
        REQUIRE(batch);
        CHECK(to_vector(*batch) == std::vector<std::int64_t>{2 * b, 2 * b + 1});
        CHECK(ds.take(me) == std::pair{2, 0});
      }
      CHECK_FALSE(loader.next(epoch));
      CHECK(ds.take(me) == std::pair{0, 0});
    }
    CHECK(thread_count() == before);
    // async_next needs the driver to run without the consumer: its thread starts, for good.
    // (A plain handler, which runs on the driver: use_future's would start Asio's system
    // threads, named after the thread that starts them.)
    auto next = [&loader] {
      std::promise<std::optional<at::Tensor>> done;
      auto got = done.get_future();
      loader.async_next([&done](std::exception_ptr, std::optional<at::Tensor> batch) {
        done.set_value(std::move(batch));
      });
      return got.get();
    };
    auto first = next();
    REQUIRE(first);
    CHECK(to_vector(*first) == std::vector<std::int64_t>{0, 1});
    CHECK(thread_count() == before + 1);
    CHECK(threads_named("coload-driver") == drivers + 1);
    CHECK_FALSE(loader.fetches_here());
    while (next()) {
    }
    CHECK(ds.take(me) == std::pair{0, 6});
    lists.clear();
    for (auto& b : loader) lists.push_back(to_vector(b));
    CHECK(lists.size() == 3);
    CHECK(ds.take(me) == std::pair{0, 6});
    // So does a sync_wait on an epoch's next() (not the loader's range-for).
    ThreadRecordingDataset ds2;
    auto other = make_data_loader(ds2, {.batch_size = 3});
    auto epoch = other.epoch();
    int batches = 0;
    while (sync_wait(epoch.next())) ++batches;
    CHECK(batches == 2);
    // next(epoch) takes only the loader's own epochs: another loader's would wait on a driver
    // that never runs its fetches (it hung), a moved-from one has none. Nothing is fetched.
    {
      ThreadRecordingDataset ds3;
      auto third = make_data_loader(ds3, {.batch_size = 2});
      auto foreign = third.epoch();
      ThreadRecordingDataset ds4;
      auto fourth = make_data_loader(ds4, {.batch_size = 2});
      REQUIRE(fourth.fetches_here());
      CHECK_THROWS_WITH_AS(fourth.next(foreign),
                           "DataLoader::next: the epoch was started by another DataLoader",
                           InvalidArgument);
      auto taken = std::move(foreign);
      CHECK_THROWS_WITH_AS(third.next(foreign), "DataLoader::next: the epoch was moved from",
                           InvalidArgument);
      CHECK(ds4.take(me) == std::pair{0, 0});
      CHECK(ds3.take(me) == std::pair{0, 0});
      // Its own epoch still runs after the refusals.
      auto batch = third.next(taken);
      REQUIRE(batch);
      CHECK(to_vector(*batch) == std::vector<std::int64_t>{0, 1});
    }
    CHECK(ds2.take(me) == std::pair{0, 6});
    // A timeout needs a driver that runs while a fetch is stuck: it has its thread at once.
    ThreadRecordingDataset ds3;
    CHECK(threads_named("coload-driver") == drivers + 2);  // the two loaders' above
    auto timed = make_data_loader(ds3, {.batch_size = 2, .timeout = 5});
    CHECK(threads_named("coload-driver") == drivers + 3);
    for ([[maybe_unused]] auto& b : timed) {
    }
    CHECK(ds3.take(me) == std::pair{0, 6});
  }

  TEST_CASE("the range-for frees the last batch before it waits for the next") {
    // Batches that count how many of them are alive (moves share one token).
    struct Count {
      std::atomic<int> alive{0};
      std::atomic<int> peak{0};
    };
    struct Token {
      std::shared_ptr<Count> c;
      explicit Token(std::shared_ptr<Count> count) : c(std::move(count)) {
        const int now = ++c->alive;
        int p = c->peak.load();
        while (now > p && !c->peak.compare_exchange_weak(p, now)) {
        }
      }
      ~Token() { --c->alive; }
    };
    struct Tracked {
      std::shared_ptr<Token> token;
      std::vector<std::int64_t> items;
    };
    auto count = std::make_shared<Count>();
    auto loader = make_data_loader(IndexDataset{20}, {.batch_size = 2},
                                   [count](std::vector<std::int64_t> s) {
                                     return Tracked{std::make_shared<Token>(count), std::move(s)};
                                   });
    std::int64_t sum = 0;
    for (auto& b : loader) {
      for (auto i : b.items) sum += i;
      CHECK(count->alive.load() == 1);
    }
    CHECK(sum == 190);
    // One in flight (no workers: the driver runs in the wait, and makes the batch waited for)
    // and none held while it is made: were the last batch kept through the wait, two would be
    // alive at once.
    CHECK(count->peak.load() == 1);
    CHECK(count->alive.load() == 0);
  }

  TEST_CASE("an ended epoch may outlive its loader, and a loader may be move-assigned mid-epoch") {
    std::optional<Epoch<at::Tensor>> kept;
    std::optional<Epoch<at::Tensor>> first;
    {
      auto loader = make_data_loader(IndexDataset{4},
                                     {.batch_size = 2, .num_workers = 1, .timeout = 5});
      first.emplace(loader.epoch());
      int batches = 0;
      while (sync_wait(first->next())) ++batches;
      CHECK(batches == 2);
      kept.emplace(loader.epoch());  // a second epoch, read to its end too
      while (sync_wait(kept->next())) ++batches;
      CHECK(batches == 4);
    }
    // Asking them for more, or destroying them, must not touch the loader's driver or its
    // metrics (ASan checks this: each next() used the loader's recorder, freed with it).
    CHECK_FALSE(sync_wait(first->next()));
    CHECK_FALSE(sync_wait(kept->next()));
    first.reset();
    kept.reset();

    auto a = make_data_loader(IndexDataset{6}, {.batch_size = 2, .timeout = 5});
    auto started = a.async_next(asio::use_future).get();  // a's implicit epoch is mid-way
    REQUIRE(started);
    a = make_data_loader(IndexDataset{3}, {.batch_size = 3, .timeout = 5});
    auto batch = a.async_next(asio::use_future).get();
    REQUIRE(batch);
    CHECK(to_vector(*batch) == std::vector<std::int64_t>{0, 1, 2});
  }

  TEST_CASE("destroying an epoch early stops it and the next epoch starts cleanly") {
    auto loader = make_data_loader(IndexDataset{100}, {.batch_size = 10, .num_workers = 2});
    {
      auto epoch = loader.epoch();
      CHECK(to_vector(*sync_wait(epoch.next()))[0] == 0);
    }
    auto lists = epoch_lists(loader);
    CHECK(lists.size() == 10);
    CHECK(lists.front().front() == 0);
    CHECK(lists.back().back() == 99);
  }

  TEST_CASE("more workers than CPUs prints PyTorch's warning once, naming threads or processes") {
    std::vector<std::string> warnings;
    coload::detail::forget_warnings();  // earlier cases may have used more workers than CPUs
    set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    const int too_many = static_cast<int>(std::thread::hardware_concurrency()) + 64;
    { auto a = make_data_loader(IndexDataset{4}, {.num_workers = too_many}); }
    { auto b = make_data_loader(IndexDataset{4}, {.num_workers = too_many}); }
    set_warning_handler(nullptr);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("This DataLoader will create " + std::to_string(too_many) +
                           " worker threads in total. Our suggested max number of worker in "
                           "current system is") == 0);
    CHECK(warnings[0].find("lower the worker number to avoid potential slowness/freeze if "
                           "necessary.") != std::string::npos);

    // Processes (never forked here: the loader forks only when an epoch starts).
    warnings.clear();
    coload::detail::forget_warnings();
    set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    {
      auto p = make_data_loader(IndexDataset{4},
                                {.num_workers = too_many, .executor = Executor::processes});
    }
    set_warning_handler(nullptr);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("This DataLoader will create " + std::to_string(too_many) +
                           " worker processes in total.") == 0);
  }
}

// As a program using process_start = forkserver: the fork server starts first thing in main,
// before any thread exists.
int main(int argc, char** argv) {
  coload::start_forkserver();
  return doctest::Context(argc, argv).run();
}
