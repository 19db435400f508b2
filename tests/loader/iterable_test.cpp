// Specification of the DataLoader over iterable datasets, and of automatic batching turned off.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "coload/coload.hpp"

using namespace coload;

namespace {

std::vector<std::int64_t> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

template <class Loader>
std::vector<std::vector<std::int64_t>> batches_of(Loader& loader) {
  std::vector<std::vector<std::int64_t>> out;
  for (auto& batch : loader) out.push_back(values(batch));
  return out;
}

// 0..n-1, sharded by worker as PyTorch's documentation does: worker k yields k, k+w, k+2w...
struct ShardedRange {
  std::int64_t n;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    for (std::int64_t i = info.id; i < n; i += info.num_workers) co_yield i;
  }
  std::int64_t size() const { return n; }
};

// Each worker yields `lengths[id]` values id*100, id*100+1, ...
struct UnevenShards {
  std::vector<std::int64_t> lengths;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    const std::int64_t len = lengths[static_cast<std::size_t>(info.id)];
    for (std::int64_t i = 0; i < len; ++i) co_yield info.id * 100 + i;
  }
};

// Records what each stream saw; worker 1's stream fails after two samples.
struct Observed {
  struct Log {
    std::mutex m;
    std::vector<std::string> lines;
    std::atomic<const void*> loaders_copy{nullptr};  // the loader's own dataset
    void add(std::string s) {
      std::lock_guard l(m);
      lines.push_back(std::move(s));
    }
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();
  bool fail_worker_1 = false;

  Generator<std::int64_t> stream(const WorkerInfo& info) {
    auto current = get_worker_info();
    log->add("stream " + std::to_string(info.id) + "/" + std::to_string(info.num_workers) +
             " seed " + std::to_string(info.seed) + " current " +
             (current ? std::to_string(current->id) : "none") + " thread " +
             std::to_string(ThreadExecutor::current_worker_id()) + " replica " +
             (this != log->loaders_copy.load() ? "yes" : "no") + " self " +
             (info.dataset == static_cast<const void*>(this) ? "yes" : "no"));
    for (std::int64_t i = 0; i < 4; ++i) {
      if (fail_worker_1 && info.id == 1 && i == 2) throw std::runtime_error("shard 1 is corrupt");
      co_yield info.id * 10 + i;
    }
  }
};

// An asynchronous stream that hops to another pool between samples.
struct HoppingStream {
  std::shared_ptr<ThreadExecutor> elsewhere = std::make_shared<ThreadExecutor>(1, "hop");
  std::int64_t n = 9;
  AsyncGenerator<std::int64_t> stream(const WorkerInfo& info) {
    for (std::int64_t i = info.id; i < n; i += info.num_workers) {
      co_await elsewhere->schedule();
      co_yield i;
    }
  }
};

template <class D, class Options>
std::string refusal(D dataset, Options options) {
  try {
    auto loader = make_data_loader(std::move(dataset), std::move(options));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

struct Pair {
  std::int64_t size() const { return 5; }
  std::pair<std::int64_t, std::string> get(Index i) const { return {i * i, std::to_string(i)}; }
};

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("an iterable dataset sharded over 3 workers yields every element exactly once, "
            "interleaved as PyTorch's") {
    auto loader = make_data_loader(ShardedRange{10}, {.batch_size = 3, .num_workers = 3});
    CHECK(loader.size() == 4);  // len(DataLoader) from the dataset's size
    // PyTorch 1.13: [[0, 3, 6], [1, 4, 7], [2, 5, 8], [9]]
    const std::vector<std::vector<std::int64_t>> expected{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}, {9}};
    CHECK(batches_of(loader) == expected);
    CHECK(batches_of(loader) == expected);  // a second epoch streams again

    auto pairs = make_data_loader(ShardedRange{10}, {.batch_size = 2, .num_workers = 3});
    // PyTorch 1.13: [[0, 3], [1, 4], [2, 5], [6, 9], [7], [8]]
    CHECK(batches_of(pairs) == std::vector<std::vector<std::int64_t>>{
                                   {0, 3}, {1, 4}, {2, 5}, {6, 9}, {7}, {8}});

    // Every element exactly once, with more elements than the in-flight bound many times over.
    auto big = make_data_loader(ShardedRange{1000},
                                {.batch_size = 7, .num_workers = 3, .prefetch_factor = 1});
    std::multiset<std::int64_t> seen;
    for (auto& b : batches_of(big)) seen.insert(b.begin(), b.end());
    CHECK(seen.size() == 1000);
    CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == 1000);
    CHECK(*seen.begin() == 0);
    CHECK(*seen.rbegin() == 999);
  }

  TEST_CASE("drop_last drops each worker's last partial batch, as PyTorch") {
    auto loader =
        make_data_loader(ShardedRange{10}, {.batch_size = 3, .num_workers = 3, .drop_last = true});
    CHECK(loader.size() == 3);
    // PyTorch 1.13: [[0, 3, 6], [1, 4, 7], [2, 5, 8]]: worker 0's [9] is dropped.
    CHECK(batches_of(loader) ==
          std::vector<std::vector<std::int64_t>>{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}});

    // Uneven shards: each worker's batches keep their order, and only partial ones drop.
    auto uneven = make_data_loader(UnevenShards{{5, 1, 3}},
                                   {.batch_size = 2, .num_workers = 3, .drop_last = true});
    std::map<std::int64_t, std::vector<std::vector<std::int64_t>>> by_worker;
    for (auto& b : batches_of(uneven)) by_worker[b.front() / 100].push_back(b);
    CHECK(by_worker[0] == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}});
    CHECK(by_worker.count(1) == 0);
    CHECK(by_worker[2] == std::vector<std::vector<std::int64_t>>{{200, 201}});
  }

  TEST_CASE("uneven shards: a worker whose stream ends leaves the rotation, nothing is lost") {
    for (bool in_order : {true, false}) {
      CAPTURE(in_order);
      auto loader = make_data_loader(
          UnevenShards{{7, 0, 3}}, {.batch_size = 1, .num_workers = 3, .in_order = in_order});
      std::map<std::int64_t, std::vector<std::int64_t>> by_worker;
      int batches = 0;
      for (auto& b : batches_of(loader)) {
        REQUIRE(b.size() == 1);
        by_worker[b[0] / 100].push_back(b[0]);
        ++batches;
      }
      CHECK(batches == 10);
      CHECK(by_worker[0] == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
      CHECK(by_worker[2] == std::vector<std::int64_t>{200, 201, 202});
    }
  }

  TEST_CASE("shuffle, sampler and batch_sampler are refused for an iterable dataset with "
            "PyTorch's messages") {
    CHECK(refusal(ShardedRange{4}, LoaderOptions{.shuffle = true}) ==
          "DataLoader with IterableDataset: expected unspecified shuffle option, but got "
          "shuffle=True");
    CHECK(refusal(ShardedRange{4}, LoaderOptions{.sampler = SequentialSampler(4)}) ==
          "DataLoader with IterableDataset: expected unspecified sampler option, but got "
          "sampler=<sampler>");
    CHECK(refusal(ShardedRange{4},
                  LoaderOptions{.batch_sampler = BatchSampler(SequentialSampler(4), 2, false)}) ==
          "DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
          "batch_sampler=<batch_sampler>");
    CHECK(refusal(ShardedRange{4}, LoaderOptions{.batch_size = 0}) ==
          "batch_size should be a positive integer value, but got batch_size=0");
  }

  TEST_CASE("each worker streams from its own replica with its info, on its own thread, "
            "after worker_init_fn") {
    Observed dataset;
    auto log = dataset.log;
    std::vector<std::string> inits;
    std::mutex inits_m;
    auto loader = make_data_loader(
        dataset, {.batch_size = 4,
                  .num_workers = 2,
                  .worker_init_fn =
                      [&](const WorkerInfo& info) {
                        std::lock_guard l(inits_m);
                        inits.push_back("init " + std::to_string(info.id) + " thread " +
                                        std::to_string(ThreadExecutor::current_worker_id()));
                        log->add("init " + std::to_string(info.id));
                      },
                  .seed = 7});
    log->loaders_copy = &loader.dataset();
    const auto lists = batches_of(loader);
    CHECK(lists == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {10, 11, 12, 13}});
    std::sort(inits.begin(), inits.end());
    CHECK(inits == std::vector<std::string>{"init 0 thread 0", "init 1 thread 1"});
    // PyTorch's base seed for DataLoader(generator=torch.Generator().manual_seed(7)).
    const std::uint64_t base = 1407639518939636932ULL;
    std::vector<std::string> streams;
    for (const auto& line : log->lines) {
      if (line.rfind("stream", 0) == 0) streams.push_back(line);
    }
    std::sort(streams.begin(), streams.end());
    // Each worker streams from its own copy of the loader's dataset.
    CHECK(streams == std::vector<std::string>{
                         "stream 0/2 seed " + std::to_string(base) +
                             " current 0 thread 0 replica yes self yes",
                         "stream 1/2 seed " + std::to_string(base + 1) +
                             " current 1 thread 1 replica yes self yes"});
    // worker_init_fn ran before that worker's stream started.
    for (int w : {0, 1}) {
      const auto& lines = log->lines;
      const auto init = std::find(lines.begin(), lines.end(), "init " + std::to_string(w));
      const auto stream =
          std::find_if(lines.begin(), lines.end(), [w](const std::string& l) {
            return l.rfind("stream " + std::to_string(w) + "/", 0) == 0;
          });
      CHECK(init < stream);
    }
  }

  TEST_CASE("without workers the stream gets worker 0 of 1, and get_worker_info stays empty") {
    Observed dataset;
    auto log = dataset.log;
    auto loader = make_data_loader(dataset, {.batch_size = 3});
    log->loaders_copy = &loader.dataset();
    CHECK(batches_of(loader) == std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3}});
    REQUIRE(log->lines.size() == 1);
    // No replica without workers: the loader's own copy streams.
    CHECK(log->lines[0].find("stream 0/1 seed ") == 0);
    CHECK(log->lines[0].find(" current none thread -1 replica no self yes") !=
          std::string::npos);
  }

  TEST_CASE("an exception in a stream reaches the consumer in its place; the other workers' "
            "batches all arrive") {
    for (bool in_order : {true, false}) {
      CAPTURE(in_order);
      Observed dataset;
      dataset.fail_worker_1 = true;
      auto loader = make_data_loader(
          dataset, {.batch_size = 1, .num_workers = 2, .in_order = in_order});
      auto epoch = loader.epoch();
      std::vector<std::int64_t> got;
      int errors = 0;
      for (;;) {
        try {
          auto b = sync_wait(epoch.next());
          if (!b) break;
          got.push_back(values(*b).at(0));
        } catch (const WorkerError& e) {
          ++errors;
          CHECK(e.worker_id() == 1);
          CHECK(e.original_message() == "shard 1 is corrupt");
          CHECK(std::string(e.what()).find("shard 1 is corrupt") != std::string::npos);
          CHECK(std::string(e.what()).find("DataLoader worker 1") != std::string::npos);
        }
      }
      CHECK(errors == 1);
      std::sort(got.begin(), got.end());
      CHECK(got == std::vector<std::int64_t>{0, 1, 2, 3, 10, 11});
    }
  }

  TEST_CASE("an AsyncGenerator stream that resumes on another thread is loaded in order") {
    for (int workers : {0, 3}) {
      CAPTURE(workers);
      auto loader = make_data_loader(HoppingStream{}, {.batch_size = 2, .num_workers = workers});
      const auto lists = batches_of(loader);
      if (workers == 0) {
        CHECK(lists == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8}});
      } else {
        CHECK(lists == std::vector<std::vector<std::int64_t>>{{0, 3}, {1, 4}, {2, 5}, {6}, {7}, {8}});
      }
    }
  }

  TEST_CASE("destroying an iterable epoch early stops its streams; the next epoch is whole") {
    auto loader = make_data_loader(ShardedRange{100000}, {.batch_size = 10, .num_workers = 2});
    {
      auto epoch = loader.epoch();
      auto first = sync_wait(epoch.next());
      REQUIRE(first);
      CHECK(values(*first) == std::vector<std::int64_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18});
    }
    auto small = make_data_loader(ShardedRange{6}, {.batch_size = 4, .num_workers = 2});
    CHECK(batches_of(small) == std::vector<std::vector<std::int64_t>>{{0, 2, 4}, {1, 3, 5}});
    std::int64_t count = 0;
    for (auto& b : loader) count += b.numel();
    CHECK(count == 100000);
  }

  TEST_CASE("ChainDataset and a + b stream one dataset after another through the loader") {
    auto chain = ShardedRange{3} + HoppingStream{std::make_shared<ThreadExecutor>(1, "hop"), 2} + ShardedRange{2};
    static_assert(std::is_same_v<decltype(chain),
                                 ChainDataset<ShardedRange, HoppingStream, ShardedRange>>);
    auto loader = make_data_loader(std::move(chain), {.batch_size = 4});
    CHECK(batches_of(loader) == std::vector<std::vector<std::int64_t>>{{0, 1, 2, 0}, {1, 0, 1}});
  }

  TEST_CASE("batch_size = nullopt turns automatic batching off: each sample alone through "
            "default_convert or the user's collate") {
    auto loader = make_data_loader(
        Pair{}, LoaderOptions{.batch_size = std::nullopt, .collate = DefaultConvert{}});
    static_assert(std::is_same_v<decltype(loader)::batch_type, std::pair<std::int64_t, std::string>>);
    CHECK(loader.size() == 5);
    std::vector<std::pair<std::int64_t, std::string>> got;
    for (auto& sample : loader) got.push_back(sample);
    CHECK(got == std::vector<std::pair<std::int64_t, std::string>>{
                     {0, "0"}, {1, "1"}, {4, "2"}, {9, "3"}, {16, "4"}});

    // With workers, shuffled, and a per-sample collate of the user's.
    auto shuffled = make_data_loader(
        Pair{}, LoaderOptions{.batch_size = std::nullopt,
                              .shuffle = true,
                              .num_workers = 2,
                              .collate = [](std::pair<std::int64_t, std::string> s) {
                                return s.second + "!";
                              },
                              .seed = 3});
    std::multiset<std::string> names;
    for (auto& s : shuffled) names.insert(s);
    CHECK(names == std::multiset<std::string>{"0!", "1!", "2!", "3!", "4!"});

    // An iterable dataset, unbatched.
    auto stream = make_data_loader(
        ShardedRange{5},
        LoaderOptions{.batch_size = std::nullopt, .num_workers = 2, .collate = DefaultConvert{}});
    std::vector<std::int64_t> order;
    for (auto v : stream) order.push_back(v);
    CHECK(stream.size() == 5);
    CHECK(order == std::vector<std::int64_t>{0, 1, 2, 3, 4});  // PyTorch: 0, 1, 2, 3, 4
  }

  TEST_CASE("batch_size = nullopt is checked against drop_last and the collate") {
    CHECK(refusal(Pair{}, LoaderOptions{.batch_size = std::nullopt,
                                        .collate = DefaultConvert{},
                                        .drop_last = true}) ==
          "batch_size=None option disables auto-batching and is mutually exclusive with "
          "drop_last");
    CHECK(refusal(Pair{}, LoaderOptions{.batch_size = std::nullopt}) ==
          "batch_size=std::nullopt turns automatic batching off, so collate receives one sample "
          "at a time: pass a per-sample collate such as .collate = coload::DefaultConvert{}");
    CHECK(refusal(Pair{}, LoaderOptions{.batch_size = 4, .collate = DefaultConvert{}}) ==
          "collate takes one sample at a time (as default_convert does), which needs "
          "batch_size=std::nullopt; got batch_size=4");
  }
}
