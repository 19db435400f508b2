// Specification of resuming: LoaderState, state(), save_state() and load_state().
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "coload/coload.hpp"

using namespace coload;

namespace {

// A sample is its index, its epoch and a draw from its own Rng: what resuming must reproduce.
struct Drawn {
  std::int64_t n;
  std::int64_t size() const { return n; }
  std::tuple<std::int64_t, std::int64_t> get(Index i, SampleContext& ctx) const {
    return {i * 1000 + ctx.epoch, ctx.rng.randint(0, 1 << 30)};
  }
};

using Batch = std::tuple<at::Tensor, at::Tensor>;
using Row = std::vector<std::int64_t>;

Row row(const Batch& b) {
  Row r;
  auto a = std::get<0>(b).contiguous();
  auto c = std::get<1>(b).contiguous();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    r.push_back(a.data_ptr<std::int64_t>()[i]);
    r.push_back(c.data_ptr<std::int64_t>()[i]);
  }
  return r;
}

template <class Options>
std::vector<Row> run_epochs(Options options, int epochs, std::int64_t n = 50) {
  auto loader = make_data_loader(Drawn{n}, options);
  std::vector<Row> out;
  for (int e = 0; e < epochs; ++e) {
    for (auto& b : loader) out.push_back(row(b));
  }
  return out;
}

// Takes `first` batches of epoch `stop_epoch` (after the earlier epochs), saves the state,
// then a new loader resumes and runs to the end of epoch `epochs - 1`.
template <class Options>
std::vector<Row> interrupted(Options options, int epochs, int stop_epoch, int first,
                             std::int64_t n = 50) {
  std::vector<Row> out;
  LoaderState saved;
  {
    auto loader = make_data_loader(Drawn{n}, options);
    for (int e = 0; e < stop_epoch; ++e) {
      for (auto& b : loader) out.push_back(row(b));
    }
    auto epoch = loader.epoch();
    for (int i = 0; i < first; ++i) {
      auto b = sync_wait(epoch.next());
      REQUIRE(b);
      out.push_back(row(*b));
    }
    // Round trip through text, as a file would.
    saved = LoaderState::parse(loader.state().to_string());
  }
  auto loader = make_data_loader(Drawn{n}, options);
  loader.load_state(saved);
  for (int e = stop_epoch; e < epochs; ++e) {
    for (auto& b : loader) out.push_back(row(b));
  }
  return out;
}

std::multiset<Row> as_multiset(const std::vector<Row>& rows) { return {rows.begin(), rows.end()}; }

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("LoaderState round-trips through text, and malformed text is refused by name") {
    LoaderState s;
    s.epoch = 3;
    s.delivered = 7;
    s.beyond = {9, 12};
    s.generator = {0, 1, 254, 255};
    s.dataset_size = 100;
    s.batch_size = 8;
    s.seed = 42;
    s.rank = 1;
    s.world_size = 2;
    const auto t = LoaderState::parse(s.to_string());
    CHECK(t.epoch == 3);
    CHECK(t.delivered == 7);
    CHECK(t.beyond == std::vector<std::int64_t>{9, 12});
    CHECK(t.generator == s.generator);
    CHECK(t.dataset_size == 100);
    CHECK(t.batch_size == 8);
    CHECK(t.seed == std::optional<std::uint64_t>(42));
    CHECK(t.rank == 1);
    CHECK(t.world_size == 2);
    CHECK_FALSE(t.base_seed);
    s.seed.reset();
    CHECK_FALSE(LoaderState::parse(s.to_string()).seed);
    s.base_seed = 77;
    CHECK(LoaderState::parse(s.to_string()).base_seed == std::optional<std::uint64_t>(77));

    CHECK_THROWS_WITH(LoaderState::parse("hello 1\n"),
                      doctest::Contains("not a coload loader state"));
    CHECK_THROWS_WITH(LoaderState::parse("coload-loader-state 2\n"),
                      doctest::Contains("version 2 is not this coload's version 1"));
    std::string text = s.to_string();
    text.erase(text.find("batch_size"), text.find('\n', text.find("batch_size")) -
                                            text.find("batch_size") + 1);
    CHECK_THROWS_WITH(LoaderState::parse(text), doctest::Contains("'batch_size' is missing"));
    CHECK_THROWS_WITH(LoaderState::parse("coload-loader-state 1\nepoch x\n"),
                      doctest::Contains("epoch is not a number: 'x'"));
  }

  TEST_CASE("a resumed loader delivers exactly what the interrupted one had not, then the "
            "same epochs as an uninterrupted run") {
    LoaderOptions<> o{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 11};
    const auto full = run_epochs(o, 3);
    REQUIRE(full.size() == 3 * 13);
    SUBCASE("threads, mid-epoch") { CHECK(interrupted(o, 3, 1, 5) == full); }
    SUBCASE("at an epoch's first batch") { CHECK(interrupted(o, 3, 1, 0) == full); }
    SUBCASE("after an epoch's last batch, before its end was seen") {
      CHECK(interrupted(o, 3, 0, 13) == full);
    }
    SUBCASE("no workers") {
      o.num_workers = 0;
      CHECK(interrupted(o, 3, 2, 3) == run_epochs(o, 3));
    }
    SUBCASE("process workers") {
      o.executor = Executor::processes;
      CHECK(interrupted(o, 3, 1, 6) == full);
    }
    SUBCASE("persistent workers, which keep the first epoch's base seed") {
      o.persistent_workers = true;
      const auto kept = run_epochs(o, 3);
      CHECK(kept != full);  // later epochs draw no base seed: another shuffle
      CHECK(interrupted(o, 3, 0, 4) == kept);  // the epoch that drew it
      CHECK(interrupted(o, 3, 1, 5) == kept);
      CHECK(interrupted(o, 3, 2, 0) == kept);
    }
    SUBCASE("in_order = false: nothing lost, nothing twice") {
      o.in_order = false;
      o.num_workers = 3;
      const auto got = interrupted(o, 2, 1, 7);
      CHECK(got.size() == 2 * 13);
      CHECK(as_multiset(got) == as_multiset(run_epochs(o, 2)));
    }
  }

  TEST_CASE("without a seed, resuming restores ATen's default generator for the epoch") {
    LoaderOptions<> o{.batch_size = 5, .shuffle = true, .num_workers = 1};
    at::manual_seed(5);
    const auto full = run_epochs(o, 2);
    at::manual_seed(5);
    const auto got = interrupted(o, 2, 1, 4);
    CHECK(got == full);
  }

  TEST_CASE("state() between epochs points at the next epoch; an abandoned epoch resumes where "
            "its consumer stopped") {
    LoaderOptions<> o{.batch_size = 10, .shuffle = true, .seed = 3};
    auto loader = make_data_loader(Drawn{50}, o);
    CHECK(loader.state().epoch == 0);
    CHECK(loader.state().delivered == 0);
    for ([[maybe_unused]] auto& b : loader) {
    }
    CHECK(loader.state().epoch == 1);
    CHECK(loader.state().delivered == 0);
    int taken = 0;
    for ([[maybe_unused]] auto& b : loader) {
      if (++taken == 2) break;
    }
    const auto s = loader.state();
    CHECK(s.epoch == 1);
    CHECK(s.delivered == 2);
    CHECK(s.beyond.empty());
    CHECK(s.seed == std::optional<std::uint64_t>(3));
    CHECK(s.dataset_size == 50);
    CHECK(s.batch_size == 10);
  }

  TEST_CASE("epoch() and load_state() return only after a stopped epoch's sampler call has") {
    // A batch sampler whose call past its last batch waits (at most `hold`) for the consumer's
    // next step to return: before the fix that step returned at once, while the call was still
    // inside the sampler (where RandomSampler draws from the generator); now it waits for the
    // call, which therefore ends by its timeout, first.
    struct Held {
      std::mutex mutex;
      std::condition_variable cv;
      bool in_tail = false;
      bool step_returned = false;
      std::vector<bool> ended_first;  // each call past the last batch: did it end first?
    };
    struct HeldTail {
      std::shared_ptr<Held> held;
      std::int64_t size() const { return 4; }
      Generator<std::vector<Index>> batches() {
        for (Index b = 0; b < 4; ++b) {
          std::vector<Index> list(2, 2 * b);
          list[1] += 1;
          co_yield list;
        }
        constexpr auto hold = std::chrono::milliseconds(500);
        std::unique_lock lock(held->mutex);
        held->in_tail = true;
        held->cv.notify_all();
        held->cv.wait_for(lock, hold, [this] { return held->step_returned; });
        held->ended_first.push_back(!held->step_returned);
      }
    };
    for (const bool load : {false, true}) {
      CAPTURE(load);
      auto held = std::make_shared<Held>();
      // In-flight bound 6: the dispatcher reaches the call past the last batch unconsumed.
      auto loader = make_data_loader(Drawn{8}, LoaderOptions<>{.batch_sampler = HeldTail{held},
                                                               .num_workers = 2,
                                                               .prefetch_factor = 3,
                                                               .seed = 1});
      const LoaderState start = loader.state();
      {
        auto epoch = loader.epoch();
        std::unique_lock lock(held->mutex);
        held->cv.wait(lock, [&] { return held->in_tail; });
      }  // stopped while its dispatcher is in the sampler
      std::optional<Epoch<decltype(loader)::batch_type>> next;
      if (load) {
        loader.load_state(start);
      } else {
        next.emplace(loader.epoch());
      }
      {
        std::lock_guard lock(held->mutex);
        held->step_returned = true;
        held->cv.notify_all();
      }
      // The next epoch's own call may have come too, after.
      std::lock_guard lock(held->mutex);
      REQUIRE_FALSE(held->ended_first.empty());
      CHECK(held->ended_first[0]);
    }
  }

  TEST_CASE("an epoch stopped at its end lets go of the sampler before the next epoch starts "
            "or a state loads, so the next epoch resumes in its own order") {
    // RandomSampler draws its trailing permutation in the dispatcher's call past the last
    // batch, on the driver. A consumer that stops an epoch then while the dispatcher is in that
    // call must not record (start_epoch) or set (load_state) the generator's state under it: a
    // resume would replay another order. This is the race itself, with RandomSampler: each
    // round stops where it can happen. Before the fix 4 to 23 of these 150 rounds resumed
    // wrongly (eleven runs), and 3 to 14 of the 300 load_state rounds below drew another order
    // (five runs); the test case above holds the sampler there and fails every time.
    constexpr int rounds = 150;
    constexpr std::int64_t n = 20;  // 10 batches of 2; the in-flight bound is 4
    int wrong = 0;
    for (int round = 0; round < rounds; ++round) {
      CAPTURE(round);
      const LoaderOptions<> o{.batch_size = 2,
                              .shuffle = true,
                              .num_workers = 2,
                              .seed = static_cast<std::uint64_t>(round)};
      auto loader = make_data_loader(Drawn{n}, o);
      {
        auto epoch = loader.epoch();
        for (int i = 0; i < 8 + round % 3; ++i) REQUIRE(sync_wait(epoch.next()));
      }
      auto epoch = loader.epoch();
      for (int i = 0; i < 3; ++i) REQUIRE(sync_wait(epoch.next()));
      const LoaderState saved = loader.state();
      std::vector<Row> rest;
      while (auto b = sync_wait(epoch.next())) rest.push_back(row(*b));
      REQUIRE(rest.size() == 7);
      auto resumed = make_data_loader(Drawn{n}, o);
      resumed.load_state(saved);
      std::vector<Row> again;
      for (auto& b : resumed) again.push_back(row(b));
      if (again != rest) ++wrong;
    }
    CHECK(wrong == 0);

    // load_state right after a stop: the generator it sets is the one the next epoch draws from.
    const LoaderOptions<> o{.batch_size = 2, .shuffle = true, .num_workers = 2, .seed = 7};
    LoaderState first;
    std::vector<Row> expected;
    {
      auto loader = make_data_loader(Drawn{n}, o);
      first = loader.state();
      for (auto& b : loader) expected.push_back(row(b));
    }
    int differ = 0;
    auto loader = make_data_loader(Drawn{n}, o);
    for (int round = 0; round < 2 * rounds; ++round) {
      CAPTURE(round);
      {
        auto epoch = loader.epoch();
        for (int i = 0; i < 8 + round % 3; ++i) REQUIRE(sync_wait(epoch.next()));
      }
      loader.load_state(first);
      std::vector<Row> got;
      for (auto& b : loader) got.push_back(row(b));
      if (got != expected) ++differ;
    }
    CHECK(differ == 0);

    // Without workers, in a range-for, the driver runs on the consumer's thread: the wait runs
    // the stopped epoch's work there, and returns.
    const LoaderOptions<> inline_o{.batch_size = 2, .shuffle = true, .seed = 5};
    auto inline_loader = make_data_loader(Drawn{n}, inline_o);
    for (int round = 0; round < 3; ++round) {
      CAPTURE(round);
      int taken = 0;
      for ([[maybe_unused]] auto& b : inline_loader) {
        if (++taken == 9) break;
      }
      inline_loader.wait_stopped_epoch();
      std::vector<Row> rest;  // the batches after the state
      LoaderState saved;
      for (auto& b : inline_loader) {
        if (saved.delivered == 0) {
          saved = inline_loader.state();
          continue;
        }
        rest.push_back(row(b));
      }
      REQUIRE(saved.delivered == 1);
      REQUIRE(rest.size() == 9);
      auto resumed = make_data_loader(Drawn{n}, inline_o);
      resumed.load_state(saved);
      std::vector<Row> again;
      for (auto& b : resumed) again.push_back(row(b));
      CHECK(again == rest);
    }
  }

  TEST_CASE("a state from an incompatible loader is refused, naming the mismatch") {
    LoaderOptions<> o{.batch_size = 4, .shuffle = true, .seed = 1};
    const auto saved = make_data_loader(Drawn{50}, o).state();
    {
      auto other = o;
      other.batch_size = 8;
      auto loader = make_data_loader(Drawn{50}, other);
      CHECK_THROWS_WITH_AS(loader.load_state(saved),
                           "loader state: it was saved by a loader with batch_size 4, but this "
                           "loader has 8",
                           std::invalid_argument);
    }
    {
      auto loader = make_data_loader(Drawn{49}, o);
      CHECK_THROWS_WITH(loader.load_state(saved), doctest::Contains("dataset size 50"));
    }
    {
      auto other = o;
      other.seed = 2;
      auto loader = make_data_loader(Drawn{50}, other);
      CHECK_THROWS_WITH(loader.load_state(saved),
                        doctest::Contains("seed 1, but this loader has 2"));
      other.seed.reset();
      auto unseeded = make_data_loader(Drawn{50}, other);
      CHECK_THROWS_WITH(unseeded.load_state(saved), doctest::Contains("has no seed"));
    }
    {
      auto other = o;
      other.rank = 1;
      other.world_size = 2;
      auto loader = make_data_loader(Drawn{50}, other);
      CHECK_THROWS_WITH(loader.load_state(saved), doctest::Contains("world size 1"));
    }
    {
      auto loader = make_data_loader(Drawn{50}, o);
      auto epoch = loader.epoch();
      CHECK_THROWS_AS(loader.load_state(saved), std::logic_error);
    }
  }

  TEST_CASE("save_state writes atomically and load_state(path) reads it back") {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("coload-state-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto path = dir / "loader.state";
    LoaderOptions<> o{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 9};
    std::vector<Row> first;
    {
      auto loader = make_data_loader(Drawn{30}, o);
      auto epoch = loader.epoch();
      for (int i = 0; i < 3; ++i) {
        first.push_back(row(*sync_wait(epoch.next())));
        loader.save_state(path);
      }
    }
    // Only the state file: no temporary left behind.
    int files = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
    CHECK(files == 1);
    auto loader = make_data_loader(Drawn{30}, o);
    loader.load_state(path);
    for (auto& b : loader) first.push_back(row(b));
    CHECK(first == run_epochs(o, 1, 30));

    std::ofstream(dir / "bad.state") << "coload-loader-state 1\nepoch 1\n";
    const std::string bad = (dir / "bad.state").string() + ": loader state: the field";
    CHECK_THROWS_WITH(loader.load_state(dir / "bad.state"), doctest::Contains(bad.c_str()));
    const std::string missing = "cannot open " + (dir / "missing.state").string();
    CHECK_THROWS_WITH(loader.load_state(dir / "missing.state"),
                      doctest::Contains(missing.c_str()));
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("a state file is input: only a regular file of at most 1 MiB, every error naming "
            "the path, and numbers out of range refused by field") {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("coload_state_input_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto loader = make_data_loader(Drawn{30}, LoaderOptions<>{.batch_size = 4, .seed = 1});
    auto refused = [&](const std::filesystem::path& p, const std::string& what) {
      CAPTURE(p);
      CHECK_THROWS_WITH_AS(loader.load_state(p),
                           ("loading the loader state: " + p.string() + what).c_str(),
                           InvalidArgument);
    };
    refused("/dev/zero", " is a character device, not a regular file");
    refused(dir, " is a directory, not a regular file");
    const auto fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    refused(fifo, " is a FIFO, not a regular file");  // at once: no writer is waited for
    const auto big = dir / "big.state";
    std::filesystem::resize_file((std::ofstream(big), big), (1 << 20) + 1);
    refused(big, " has 1048577 bytes, more than a state's limit of 1048576 bytes (1 MiB)");

    LoaderState s = loader.state();
    auto with = [&](const std::string& key, const std::string& value) {
      std::string text = s.to_string();
      const auto at = text.find("\n" + key) + 1;
      REQUIRE(at != 0);
      text.replace(at, text.find('\n', at) - at, key + " " + value);
      return text;
    };
    auto out_of_range = [&](const std::string& key, const std::string& value,
                            const std::string& message) {
      CAPTURE(key);
      CHECK_THROWS_WITH_AS(LoaderState::parse(with(key, value)),
                           ("loader state: " + message).c_str(), InvalidArgument);
    };
    out_of_range("epoch", "9223372036854775807",
                 "epoch 9223372036854775807 is out of range [0, 9007199254740992]");
    out_of_range("epoch", "-1", "epoch -1 is out of range [0, 9007199254740992]");
    out_of_range("delivered", "9007199254740993",
                 "delivered 9007199254740993 is out of range [0, 9007199254740992]");
    out_of_range("beyond", "4 -5", "beyond -5 is out of range [0, 9007199254740992]");
    out_of_range("dataset_size", "-2", "dataset_size -2 is out of range [-1, 9007199254740992]");
    out_of_range("batch_size", "0", "batch_size 0 is not -1 or positive");
    out_of_range("world_size", "0", "world_size 0 is out of range [1, 16777216]");
    out_of_range("rank", "3", "rank 3 is not below world_size 1");
    out_of_range("stream_workers", "100000", "stream_workers 100000 is out of range [-1, 65536]");
    CHECK_THROWS_WITH_AS(LoaderState::parse(with("epoch", "99999999999999999999")),
                         "loader state: epoch is not a number: '99999999999999999999'",
                         InvalidArgument);

    // The largest epoch a state may hold loads, and state() after it does not overflow.
    s.epoch = LoaderState::max_count;
    const auto path = dir / "last.state";
    s.save(path);
    loader.load_state(path);
    CHECK(loader.state().epoch == LoaderState::max_count);
    CHECK(LoaderState::parse(loader.state().to_string()).epoch == LoaderState::max_count);
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("the loader tells a DistributedSampler each epoch, so resumed epochs shuffle alike") {
    auto make = [] {
      return LoaderOptions<>{.batch_size = 3,
                             .sampler = DistributedSampler(20, 2, 1, true, 7),
                             .num_workers = 1};
    };
    auto loader = make_data_loader(Drawn{20}, make());
    std::vector<std::vector<Row>> epochs(2);
    for (auto& e : epochs) {
      for (auto& b : loader) e.push_back(row(b));
    }
    CHECK(epochs[0] != epochs[1]);
    // The same rank's indices in epoch 1 as a DistributedSampler told set_epoch(1).
    DistributedSampler manual(20, 2, 1, true, 7);
    manual.set_epoch(1);
    std::vector<std::int64_t> want;
    for (auto i : manual.indices()) want.push_back(i * 1000 + 1);
    std::vector<std::int64_t> got;
    for (auto& r : epochs[1]) {
      for (std::size_t k = 0; k < r.size(); k += 2) got.push_back(r[k]);
    }
    CHECK(got == want);
  }
}

namespace {
// 0..n-1, cut into world_size × num_workers shards: worker w of rank r takes shard r*W + w.
struct ShardedStream {
  std::int64_t n;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    for (std::int64_t i = info.shard_id(); i < n; i += info.num_shards()) co_yield i;
  }
};

std::vector<std::int64_t> flat(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}
}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("an iterable dataset's shards span ranks and workers: rank × num_workers + id") {
    std::vector<std::int64_t> all;
    for (int rank = 0; rank < 3; ++rank) {
      auto loader = make_data_loader(
          ShardedStream{40}, LoaderOptions<>{.batch_size = 4, .num_workers = 2, .rank = rank,
                                             .world_size = 3});
      for (auto& b : loader) {
        for (auto v : flat(b)) {
          // Worker w of this rank streams shard rank*2 + w of 6.
          CHECK(v % 6 / 2 == rank);
          all.push_back(v);
        }
      }
    }
    std::sort(all.begin(), all.end());
    std::vector<std::int64_t> want(40);
    std::iota(want.begin(), want.end(), 0);
    CHECK(all == want);

    ::setenv("RANK", "1", 1);
    ::setenv("WORLD_SIZE", "2", 1);
    auto from_env = make_data_loader(ShardedStream{8}, LoaderOptions<>{.batch_size = 2});
    std::vector<std::int64_t> got;
    for (auto& b : from_env) {
      for (auto v : flat(b)) got.push_back(v);
    }
    CHECK(from_env.state().rank == 1);
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
    CHECK(got == std::vector<std::int64_t>{1, 3, 5, 7});
    CHECK_THROWS_WITH_AS(
        make_data_loader(ShardedStream{8}, LoaderOptions<>{.rank = 2, .world_size = 2}),
        "Invalid rank 2, rank should be in the interval [0, 1]", std::invalid_argument);
  }

  TEST_CASE("an iterable dataset without state() resumes by fast-forwarding") {
    auto options = [] { return LoaderOptions<>{.batch_size = 3, .num_workers = 2}; };
    std::vector<std::vector<std::int64_t>> full;
    {
      auto loader = make_data_loader(ShardedStream{30}, options());
      for (int e = 0; e < 2; ++e) {
        for (auto& b : loader) full.push_back(flat(b));
      }
    }
    std::vector<std::vector<std::int64_t>> got;
    LoaderState saved;
    {
      auto loader = make_data_loader(ShardedStream{30}, options());
      auto epoch = loader.epoch();
      for (int i = 0; i < 4; ++i) got.push_back(flat(*sync_wait(epoch.next())));
      saved = loader.state();
    }
    CHECK(saved.dataset_size == -1);
    CHECK(saved.delivered == 4);
    auto loader = make_data_loader(ShardedStream{30}, options());
    loader.load_state(saved);
    for (int e = 0; e < 2; ++e) {
      for (auto& b : loader) got.push_back(flat(b));
    }
    CHECK(got == full);
  }
}

TEST_SUITE("loader") {
  TEST_CASE("resume works per rank: each rank's state restores its own shard position") {
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      auto options = [rank] {
        return LoaderOptions<>{.batch_size = 3,
                               .sampler = DistributedSampler(25, 2, rank, true, 5),
                               .num_workers = 2,
                               .seed = 1,
                               .rank = rank,
                               .world_size = 2};
      };
      std::vector<Row> full;
      {
        auto loader = make_data_loader(Drawn{25}, options());
        for (int e = 0; e < 2; ++e) {
          for (auto& b : loader) full.push_back(row(b));
        }
      }
      std::vector<Row> got;
      LoaderState saved;
      {
        auto loader = make_data_loader(Drawn{25}, options());
        for (auto& b : loader) got.push_back(row(b));
        auto epoch = loader.epoch();
        got.push_back(row(*sync_wait(epoch.next())));
        got.push_back(row(*sync_wait(epoch.next())));
        saved = loader.state();
      }
      CHECK(saved.rank == rank);
      CHECK(saved.epoch == 1);
      auto loader = make_data_loader(Drawn{25}, options());
      loader.load_state(saved);
      for (auto& b : loader) got.push_back(row(b));
      CHECK(got == full);
      if (rank == 1) {
        // Rank 0's state is refused here.
        auto other = options();
        other.rank = 0;
        other.sampler = DistributedSampler(25, 2, 0, true, 5);
        auto rank0 = make_data_loader(Drawn{25}, other);
        CHECK_THROWS_WITH(rank0.load_state(saved), doctest::Contains("rank 1, but this loader has 0"));
      }
    }
  }
}

namespace {
// An iterable dataset that knows where its stream stands: state() after each sample, and
// load_state() to make the next stream() continue from there. Counts the samples it yields.
struct ResumableRange {
  std::int64_t n;
  std::shared_ptr<std::atomic<int>> pulled = std::make_shared<std::atomic<int>>(0);
  std::int64_t next_ = -1;
  std::int64_t resume_ = -1;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    std::int64_t i = resume_ >= 0 ? std::exchange(resume_, -1) : info.shard_id();
    while (i < n) {
      std::int64_t v = i;
      i += info.num_shards();
      next_ = i;
      pulled->fetch_add(1);
      co_yield v;
    }
  }
  std::string state() const { return std::to_string(next_); }
  void load_state(const std::string& s) { resume_ = std::stoll(s); }
};
}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("an iterable dataset with state()/load_state() resumes each worker's stream "
            "without re-reading what was delivered") {
    for (const int workers : {0, 2, 3}) {
      CAPTURE(workers);
      auto options = [workers] { return LoaderOptions<>{.batch_size = 3, .num_workers = workers}; };
      std::vector<std::vector<std::int64_t>> full;
      {
        auto loader = make_data_loader(ResumableRange{40}, options());
        for (int e = 0; e < 2; ++e) {
          for (auto& b : loader) full.push_back(flat(b));
        }
      }
      std::vector<std::vector<std::int64_t>> got;
      LoaderState saved;
      std::int64_t delivered_samples = 0;
      {
        auto loader = make_data_loader(ResumableRange{40}, options());
        auto epoch = loader.epoch();
        for (int i = 0; i < 5; ++i) {
          got.push_back(flat(*sync_wait(epoch.next())));
          delivered_samples += static_cast<std::int64_t>(got.back().size());
        }
        saved = LoaderState::parse(loader.state().to_string());
      }
      CHECK(!saved.streams.empty());
      std::vector<std::string> warnings;
      set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
      coload::detail::forget_warnings();
      ResumableRange resumed{40};
      auto pulled = resumed.pulled;
      auto loader = make_data_loader(std::move(resumed), options());
      loader.load_state(saved);
      for (int e = 0; e < 2; ++e) {
        for (auto& b : loader) got.push_back(flat(b));
      }
      set_warning_handler({});
      for (const auto& w : warnings) CHECK(w.find("fast-forward") == std::string::npos);
      CHECK(got == full);
      // The rest of the interrupted epoch and all of the next: nothing delivered is re-read.
      CHECK(pulled->load() == (40 - delivered_samples) + 40);
    }
  }
}

namespace {
// Worker w yields lengths[w] values w*100, w*100+1, ...: shards that end at different times.
struct Uneven {
  std::vector<std::int64_t> lengths;
  Generator<std::int64_t> stream(const WorkerInfo& info) {
    const std::int64_t len = lengths[static_cast<std::size_t>(info.id)];
    for (std::int64_t i = 0; i < len; ++i) {
      std::int64_t v = info.id * 100 + i;
      co_yield v;
    }
  }
};
}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("resuming iterable datasets counts each worker's batches: uneven shards, process "
            "workers, and a changed num_workers refused") {
    auto check = [](auto make, LoaderOptions<> o, int first) {
      std::vector<std::vector<std::int64_t>> full, got;
      {
        auto loader = make_data_loader(make(), o);
        for (int e = 0; e < 2; ++e) {
          for (auto& b : loader) full.push_back(flat(b));
        }
      }
      LoaderState saved;
      {
        auto loader = make_data_loader(make(), o);
        auto epoch = loader.epoch();
        for (int i = 0; i < first; ++i) got.push_back(flat(*sync_wait(epoch.next())));
        saved = LoaderState::parse(loader.state().to_string());
      }
      auto loader = make_data_loader(make(), o);
      loader.load_state(saved);
      for (int e = 0; e < 2; ++e) {
        for (auto& b : loader) got.push_back(flat(b));
      }
      CHECK(got == full);
      return saved;
    };
    const auto uneven = [] { return Uneven{{3, 17}}; };
    for (int first : {1, 2, 3, 5, 8}) {
      CAPTURE(first);
      check(uneven, LoaderOptions<>{.batch_size = 2, .num_workers = 2}, first);
    }
    check(uneven, LoaderOptions<>{.batch_size = 2, .num_workers = 2,
                                  .executor = Executor::processes}, 4);
    // A dataset with state(), under process workers: fast-forwarded, still exact.
    const auto saved = check([] { return ResumableRange{30}; },
                             LoaderOptions<>{.batch_size = 3, .num_workers = 2,
                                             .executor = Executor::processes}, 3);
    CHECK(saved.stream_workers == 2);
    auto three = make_data_loader(ResumableRange{30}, LoaderOptions<>{.batch_size = 3,
                                                                      .num_workers = 3});
    CHECK_THROWS_WITH(three.load_state(saved),
                      doctest::Contains("num_workers (for an iterable dataset) 2, but this "
                                        "loader has 3"));
  }
}
