// Specification of num_workers = coload::auto_workers: the tuning rule, batches that do not
// depend on the worker count, a count that moves both ways, and where auto_workers is refused.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coload/coload.hpp"
#include "coload/collate/digest.hpp"
#include "coload/loader/detail/worker_count.hpp"
// The library's own reader of cgroup CPU quotas (not a public header).
#include "../../lib/loader/cpu_quota.hpp"

using namespace coload;
using coload::detail::TuningWindow;
using coload::detail::WorkerTuner;

namespace {

// A window of one second in which the consumer waited `wait` seconds, the workers in use were
// idle `idle` seconds together, and `batches` batches were completed.
TuningWindow window(double wait, double idle, double batches = 100) {
  return TuningWindow{1.0, wait, idle, batches};
}

// Samples drawn from each sample's Rng (a random "transform"): equal only if every sample's
// randomness depends on (seed, epoch, index) alone.
struct RandomDataset {
  std::int64_t n = 96;
  std::size_t size() const { return static_cast<std::size_t>(n); }
  at::Tensor get(Index i, SampleContext& ctx) const {
    auto t = at::empty({3}, at::kDouble);
    auto* p = t.data_ptr<double>();
    p[0] = static_cast<double>(i);
    p[1] = ctx.rng.uniform();
    p[2] = static_cast<double>(ctx.rng.randint(0, 1000));
    return t;
  }
};

// The digest of every batch of `epochs` epochs, in delivery order.
template <class Loader>
std::uint64_t digest_epochs(Loader& loader, int epochs) {
  Digest d;
  for (int e = 0; e < epochs; ++e) {
    for (auto& batch : loader) d.add(batch);
  }
  return d.value();
}

// Slow while `slow` is set: each get sleeps (the work a heavy decode would be).
struct SwitchableDataset {
  std::shared_ptr<std::atomic<bool>> slow;
  std::size_t size() const { return 480; }
  std::int64_t get(Index i) const {
    if (slow->load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return i;
  }
};

// Runs `make` (which makes a loader) on this thread cut to the first `cpus` of its CPUs, and
// gives the thread its CPUs back after: auto_workers' maximum is twice the CPUs of the thread
// that makes the loader (sched_getaffinity), and the worker threads it starts keep that set.
template <class Make>
auto with_cpus(int cpus, Make&& make) {
  cpu_set_t all;
  REQUIRE(::sched_getaffinity(0, sizeof all, &all) == 0);
  cpu_set_t few;
  CPU_ZERO(&few);
  for (int c = 0, n = 0; c < CPU_SETSIZE && n < cpus; ++c) {
    if (CPU_ISSET(c, &all)) CPU_SET(c, &few), ++n;
  }
  REQUIRE(::sched_setaffinity(0, sizeof few, &few) == 0);
  struct Restore {
    cpu_set_t set;
    ~Restore() { ::sched_setaffinity(0, sizeof set, &set); }
  } restore{all};
  return make();
}

struct StreamOf {
  Generator<std::int64_t> stream(const WorkerInfo&) const { co_yield 1; }
};

}  // namespace

TEST_SUITE("auto_workers") {
  TEST_CASE("the tuner starts with one worker and, while the consumer waits, keeps each added "
            "worker that raises the rate, up to its maximum") {
    WorkerTuner t(4);
    CHECK(t.workers() == 1);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);  // the consumer waited: try a second worker
    CHECK(t.workers() == 2);
    CHECK(t.decide(window(0.4, 0.2, 150)) == 1);  // +50%: kept, and a third tried at once
    CHECK(t.decide(window(0.3, 1.5, 180)) == 1);  // +20% though mostly idle: kept, try a 4th
    CHECK(t.decide(window(0.2, 2.0, 200)) == 0);  // +11%: kept; at the maximum
    CHECK(t.decide(window(0.2, 2.0, 200)) == 0);
    CHECK(t.workers() == 4);
    const WorkerTuning s = t.tuning();
    CHECK(s.automatic);
    CHECK(s.grown == 3);
    CHECK(s.shrunk == 0);
    CHECK(s.windows == 5);
    CHECK(s.max_seen == 4);
    CHECK(s.max_workers == 4);
  }

  TEST_CASE("at the maximum one fewer is tried, and kept when the rate does not fall") {
    WorkerTuner t(3);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);  // probe 2
    CHECK(t.decide(window(0.4, 0.2, 150)) == 1);  // kept; probe 3
    CHECK(t.decide(window(0.3, 0.5, 160)) == 0);  // +7%: kept; at the maximum, held 2
    CHECK(t.decide(window(0.3, 0.5, 160)) == 0);
    CHECK(t.decide(window(0.3, 0.5, 160)) == -1);  // one fewer tried
    CHECK(t.decide(window(0.3, 0.2, 150)) == 1);   // slower: back to 3, held max_hold
    CHECK(t.workers() == 3);
    for (int i = 0; i < WorkerTuner::max_hold; ++i) CHECK(t.decide(window(0.3, 0.5, 160)) == 0);
    CHECK(t.decide(window(0.3, 0.5, 160)) == -1);  // tried again
    CHECK(t.decide(window(0.3, 0.1, 175)) == 0);   // 2 do better than 3 did: kept, held 2
    CHECK(t.workers() == 2);
    CHECK(t.decide(window(0.3, 0.1, 175)) == 0);
    CHECK(t.decide(window(0.3, 0.1, 175)) == 1);   // and 3 probed again, up
    CHECK(t.decide(window(0.3, 0.5, 170)) == -1);  // which does not pay: back to 2
    CHECK(t.workers() == 2);
    WorkerTuner one(1);
    for (int i = 0; i < 5; ++i) CHECK(one.decide(window(0.9, 0.0, 100)) == 0);
    // The long hold after a lost probe down is for probes down only: a worker removed
    // meanwhile (the consumer stopped waiting for a window) comes back as soon as it waits.
    WorkerTuner v(3);
    CHECK(v.decide(window(0.5, 0.0, 100)) == 1);
    CHECK(v.decide(window(0.4, 0.2, 150)) == 1);
    CHECK(v.decide(window(0.3, 0.5, 160)) == 0);  // at the maximum, held 2
    CHECK(v.decide(window(0.3, 0.5, 160)) == 0);
    CHECK(v.decide(window(0.3, 0.5, 160)) == -1);
    CHECK(v.decide(window(0.3, 0.2, 150)) == 1);   // slower: back to 3, probes down held
    CHECK(v.decide(window(0.0, 2.0, 160)) == -1);  // no wait, two of three idle: one removed
    CHECK(v.decide(window(0.5, 0.0, 150)) == 1);   // waiting again: the third is probed at once
    // A probe down kept, then the maximum regained: the next probe down waits twice as long.
    WorkerTuner u(2);
    CHECK(u.decide(window(0.5, 0.0, 100)) == 1);
    CHECK(u.decide(window(0.5, 0.0, 150)) == 0);  // kept, at the maximum: held 2
    CHECK(u.decide(window(0.5, 0.0, 150)) == 0);
    CHECK(u.decide(window(0.5, 0.0, 150)) == -1);  // probe down
    CHECK(u.decide(window(0.5, 0.0, 150)) == 0);   // as fast: kept, held 2
    CHECK(u.decide(window(0.5, 0.0, 150)) == 0);
    CHECK(u.decide(window(0.5, 0.0, 150)) == 1);   // probe up
    CHECK(u.decide(window(0.5, 0.0, 160)) == 0);   // kept: held 4 now
    for (int i = 0; i < 3; ++i) CHECK(u.decide(window(0.5, 0.0, 160)) == 0);
    CHECK(u.decide(window(0.5, 0.0, 160)) == -1);
  }

  TEST_CASE("over a span of two windows, a probe is judged on both of its windows against "
            "the two before it") {
    WorkerTuner t(4, 2);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 0);  // one window at 1 worker: no base yet
    CHECK(t.decide(window(0.5, 0.0, 120)) == 1);  // base 110/s: probe 2
    // The probe's first window alone (+36%) does not decide it; with its second the span's
    // rate is 111/s, not 2% more than 110: back to 1.
    CHECK(t.decide(window(0.5, 0.5, 150)) == 0);
    CHECK(t.workers() == 2);
    CHECK(t.decide(window(0.5, 0.5, 72)) == -1);
    CHECK(t.workers() == 1);
    // Held 2 windows; the base then is the last two windows at 1 worker: (90 + 110) / 2.
    CHECK(t.decide(window(0.5, 0.0, 90)) == 0);
    CHECK(t.decide(window(0.5, 0.0, 110)) == 0);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);  // base (110 + 100) / 2 = 105/s
    CHECK(t.decide(window(0.5, 0.2, 100)) == 0);
    CHECK(t.decide(window(0.5, 0.2, 116)) == 1);  // 108/s > 105 x 1.02: kept, 3 tried at once
    CHECK(t.workers() == 3);
    CHECK(t.tuning().grown == 3);
    CHECK(t.tuning().shrunk == 1);
    CHECK(t.tuning().windows == 9);
  }

  TEST_CASE("with a maximum of 32 (a 16-core machine) and every added worker paying, the "
            "loader's tuner climbs to 32 in 2 windows a worker, more than an epoch of 120 "
            "batches holds") {
    using coload::detail::WorkerCount;
    WorkerTuner t(32, WorkerCount::tune_span);
    // Samples that sleep: each worker adds the same rate, so every probe pays (+1/w > 2%).
    int windows = 0;
    while (t.workers() < 32 && windows < 1000) {
      ++windows;
      CHECK(t.decide(window(0.5, 0.0, 10.0 * t.workers())) >= 0);
    }
    CHECK(t.workers() == 32);
    CHECK(windows == 2 * 31);
    CHECK(t.tuning().grown == 31);
    CHECK(t.tuning().shrunk == 0);
    // The loader judges a window after at least tune_batches batches: the climb needs more
    // batches than the live case's epoch has, which is why that case caps the maximum.
    CHECK(windows * WorkerCount::tune_batches > 120);
    // Held at the maximum while each window waits as much and is as fast.
    for (int i = 0; i < 2; ++i) CHECK(t.decide(window(0.5, 0.0, 320)) == 0);
    CHECK(t.tuning().max_seen == 32);
  }

  TEST_CASE("a worker that does not raise the rate is taken back, and tried again after a "
            "hold that doubles") {
    WorkerTuner t(8);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);   // probe 2
    CHECK(t.decide(window(0.5, 0.5, 101)) == -1);  // +1% is not more than min_gain: back to 1
    CHECK(t.workers() == 1);
    // Held for 2 windows although the consumer waits, then tried again.
    CHECK(t.decide(window(0.5, 0.0, 100)) == 0);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 0);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);
    CHECK(t.decide(window(0.5, 0.5, 90)) == -1);  // slower: back, now held for 4
    for (int i = 0; i < 4; ++i) CHECK(t.decide(window(0.5, 0.0, 100)) == 0);
    CHECK(t.decide(window(0.5, 0.0, 100)) == 1);
    // This time it pays: kept, and the hold starts again from 2 after the next miss.
    CHECK(t.decide(window(0.4, 0.2, 130)) == 1);   // 3 tried at once
    CHECK(t.decide(window(0.4, 1.2, 129)) == -1);  // 3 does not pay: back to 2, held 2
    CHECK(t.decide(window(0.4, 0.2, 130)) == 0);
    CHECK(t.decide(window(0.4, 0.2, 130)) == 0);
    CHECK(t.decide(window(0.4, 0.2, 130)) == 1);
    CHECK(t.tuning().grown == 5);
    CHECK(t.tuning().shrunk == 3);
    CHECK(t.tuning().max_seen == 3);
  }

  TEST_CASE("the tuner removes idle workers down to one when the consumer does not wait, and "
            "keeps a count the load needs") {
    WorkerTuner t(4);
    for (int i = 0; i < 3; ++i) t.decide(window(0.9, 0.0, 100.0 * (i + 1)));
    REQUIRE(t.workers() == 4);
    // The consumer never waits and 3 of 4 workers idle: one fewer each window, down to one
    // (the first window also judges the probe of the 4th: it paid).
    CHECK(t.decide(window(0.0, 3.0, 500)) == -1);
    CHECK(t.decide(window(0.0, 2.0)) == -1);
    CHECK(t.decide(window(0.0, 1.5)) == -1);
    CHECK(t.decide(window(0.0, 0.5)) == 0);
    CHECK(t.workers() == 1);
    CHECK(t.tuning().shrunk == 3);
    CHECK(t.tuning().min_seen == 1);
    // A load of 1.5 workers on 2 with a consumer that does not wait: 2 keep it (1.5 > 0.75 x 1),
    // window after window.
    WorkerTuner u(4);
    u.decide(window(0.5, 0.0, 100));
    REQUIRE(u.workers() == 2);
    CHECK(u.decide(window(0.0, 0.5, 150)) == 0);  // the probe paid; no wait, no new probe
    for (int i = 0; i < 10; ++i) CHECK(u.decide(window(0.01, 0.5)) == 0);
    CHECK(u.workers() == 2);
    // A window of no length is not judged.
    CHECK(u.decide(TuningWindow{0.0, 0.0, 0.0, 0.0}) == 0);
    CHECK(u.tuning().windows == 12);
  }

  TEST_CASE("over a span of two windows, a worker is removed only when two windows in a row "
            "had one to spare") {
    WorkerTuner t(4, 2);
    t.decide(window(0.5, 0.0, 100));
    REQUIRE(t.decide(window(0.5, 0.0, 100)) == 1);  // probe 2
    CHECK(t.decide(window(0.5, 0.0, 150)) == 0);
    REQUIRE(t.decide(window(0.5, 0.0, 150)) == 1);  // 2 kept, probe 3
    CHECK(t.decide(window(0.4, 0.5, 180)) == 0);
    REQUIRE(t.decide(window(0.4, 0.5, 180)) == 1);  // 3 kept, probe 4
    CHECK(t.decide(window(0.3, 0.5, 200)) == 0);
    CHECK(t.decide(window(0.3, 0.5, 200)) == 0);  // +11%: kept; at the maximum, held
    REQUIRE(t.workers() == 4);
    // One window where the consumer did not wait and 2 of 4 workers idled, between windows
    // where it waited: nothing removed.
    CHECK(t.decide(window(0.0, 2.0)) == 0);
    CHECK(t.decide(window(0.1, 0.5)) == 0);
    CHECK(t.decide(window(0.0, 2.0)) == 0);
    CHECK(t.workers() == 4);
    // Two in a row: one removed; then two more at 3 for the next.
    CHECK(t.decide(window(0.0, 2.0)) == -1);
    CHECK(t.decide(window(0.0, 1.5)) == 0);
    CHECK(t.decide(window(0.0, 1.5)) == -1);
    CHECK(t.workers() == 2);
    CHECK(t.tuning().shrunk == 2);
  }

  TEST_CASE("batches are bitwise the same under auto_workers as under any fixed count") {
    // Shuffled, with a random transform, over two epochs.
    auto run = [](int workers) {
      auto loader = make_data_loader(RandomDataset{},
                                     {.batch_size = 5, .shuffle = true, .num_workers = workers,
                                      .seed = 1234});
      return digest_epochs(loader, 2);
    };
    const std::uint64_t fixed1 = run(1);
    CHECK(run(0) == fixed1);
    CHECK(run(2) == fixed1);
    CHECK(run(3) == fixed1);
    CHECK(run(auto_workers) == fixed1);
    // And while the count changes mid-epoch: a slow dataset grows it, its batches do not move.
    auto slow = std::make_shared<std::atomic<bool>>(true);
    auto digest_of = [&](int workers) {
      auto loader = make_data_loader(SwitchableDataset{slow},
                                     {.batch_size = 4, .shuffle = true, .num_workers = workers,
                                      .seed = 99});
      const auto d = digest_epochs(loader, 1);
      return std::pair{d, loader.worker_tuning()};
    };
    const auto [tuned, tuning] = digest_of(auto_workers);
    CHECK(tuned == digest_of(2).first);
    CHECK(tuning.automatic);
    if (tuning.max_workers >= 2) CHECK(tuning.max_seen >= 2);
  }

  TEST_CASE("a slow dataset adds workers, a slow consumer removes them") {
    auto slow = std::make_shared<std::atomic<bool>>(true);
    // Made on at most 2 CPUs, so that its maximum is at most 4 workers, which the 120 batches
    // of epoch 0 can climb to (each added worker is judged over 2 windows of at least 4
    // batches) on any machine: with every CPU of a 16-core one the maximum is 32.
    int usable = 0;
    auto loader = with_cpus(2, [&] {
      usable = coload::detail::usable_cpus();
      return make_data_loader(SwitchableDataset{slow},
                              {.batch_size = 4, .num_workers = auto_workers});
    });
    CAPTURE(usable);
    CHECK(usable <= 2);
    WorkerTuning t = loader.worker_tuning();
    CHECK(t.automatic);
    CHECK(t.workers == 1);  // starts small
    CHECK(t.max_workers == 2 * usable);  // twice the CPUs of the thread that made it
    CHECK(loader.options().num_workers == t.max_workers);  // threads started, most asleep
    // Epoch 0: every sample takes 2 ms in get and the consumer takes none.
    std::int64_t seen = 0;
    for (auto& batch : loader) seen += batch.size(0);
    CHECK(seen == 480);
    t = loader.worker_tuning();
    CAPTURE(t.windows);
    CHECK(t.windows > 0);
    if (t.max_workers < 2) {
      MESSAGE("one usable CPU: auto_workers stays at one worker");
      CHECK(t.grown == 0);
      return;
    }
    // Each added worker raises the rate (the samples sleep): the climb reaches the maximum. A
    // probe taken back counts as a removal, so only the end state and the climb are asserted.
    CHECK(t.grown >= t.max_workers - 1);
    CHECK(t.max_seen == t.max_workers);
    REQUIRE(t.workers >= 2);
    const std::int64_t shrunk_before = t.shrunk;
    const int workers_before = t.workers;
    // Epoch 1: the samples are free and the consumer takes 10 ms a batch (the model's step):
    // the workers idle, and are removed down to one. (With 3 ms, on a loaded machine, a
    // worker woken late made the consumer wait in enough windows to keep 2 workers.)
    slow->store(false);
    seen = 0;
    for (auto& batch : loader) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      seen += batch.size(0);
    }
    CHECK(seen == 480);
    t = loader.worker_tuning();
    CHECK(t.shrunk - shrunk_before >= workers_before - 1);
    CHECK(t.workers == 1);
    CHECK(t.min_seen == 1);
    // Occupancy is against the bound at each dispatch, which fell with the workers: batches
    // piled up to the bound all epoch, so it is near 1, never above.
    const Metrics m = loader.metrics();
    CAPTURE(m.occupancy);
    CHECK(m.occupancy > 0.5);
    CHECK(m.occupancy <= 1.0);
  }

  TEST_CASE("a fixed count reports itself and never moves") {
    auto loader = make_data_loader(RandomDataset{}, {.batch_size = 8, .num_workers = 2});
    for (auto& batch : loader) (void)batch;
    const WorkerTuning t = loader.worker_tuning();
    CHECK_FALSE(t.automatic);
    CHECK(t.workers == 2);
    CHECK(t.max_workers == 2);
    CHECK(t.grown + t.shrunk == 0);
  }

  TEST_CASE("auto_workers is refused for iterable datasets and worker processes, naming it") {
    auto message = [](auto make) -> std::string {
      try {
        make();
      } catch (const InvalidArgument& e) {
        return e.what();
      }
      return "(nothing thrown)";
    };
    const std::string iterable = message(
        [] { return make_data_loader(StreamOf{}, {.num_workers = auto_workers}); });
    CHECK(iterable.find("num_workers = auto_workers") != std::string::npos);
    CHECK(iterable.find("iterable") != std::string::npos);
    const std::string processes = message([] {
      return make_data_loader(RandomDataset{}, {.batch_size = 4, .num_workers = auto_workers,
                                                .executor = Executor::processes});
    });
    CHECK(processes.find("num_workers = auto_workers") != std::string::npos);
    CHECK(processes.find("processes") != std::string::npos);
    // Other negative counts keep PyTorch's error.
    const std::string negative =
        message([] { return make_data_loader(RandomDataset{}, {.num_workers = -2}); });
    CHECK(negative.find("num_workers option should be non-negative") != std::string::npos);
    // -1 is a count like any other, refused: auto_workers has a spelling of its own.
    for (const int n : {-1, std::numeric_limits<int>::min()}) {
      CAPTURE(n);
      const std::string refused =
          message([n] { return make_data_loader(RandomDataset{}, {.num_workers = n}); });
      CHECK(refused ==
            "num_workers option should be non-negative; use num_workers=0 to disable "
            "multiprocessing.");
    }
    CHECK(auto_workers > 0);
  }

  TEST_CASE("a cgroup CPU quota bounds the usable CPUs: the smallest on the cgroup's path, "
            "rounded up, in cgroup v2 and v1") {
    namespace fs = std::filesystem;
    const fs::path root = fs::temp_directory_path() /
                          ("coload_cpu_quota_" + std::to_string(::getpid()));
    fs::remove_all(root);
    const auto put = [&](const fs::path& file, const std::string& text) {
      fs::create_directories(file.parent_path());
      std::ofstream(file) << text << "\n";
    };
    // A v2 hierarchy mounted at a path with a space (mountinfo writes it as \040), a v1 cpu
    // hierarchy whose mount shows a container's cgroup (root /docker/c1), and a v1 hierarchy
    // of another controller, whose files must not count.
    const std::string v2 = (root / "unified dir").string();
    const std::string v1 = (root / "cpu,cpuacct").string();
    const std::string memory = (root / "memory").string();
    // As mountinfo writes a path: a space, tab, newline or backslash as \ and three octal
    // digits (the temporary folder's name may hold one too).
    const auto escaped = [](const std::string& path) {
      std::string out;
      for (const char c : path) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\\') {
          char octal[5];
          std::snprintf(octal, sizeof octal, "\\%03o", static_cast<unsigned char>(c));
          out += octal;
        } else {
          out += c;
        }
      }
      return out;
    };
    // A bind mount of the v1 hierarchy's root, listed first, which the process's cgroup is
    // not under: the mount whose root holds it is read.
    const std::string mountinfo =
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "40 31 0:40 / " + escaped(v2) + " rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
        "43 31 0:41 /other " + escaped(memory) + " rw - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:41 /docker/c1 " + escaped(v1) +
        " rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
        "42 31 0:42 / " + escaped(memory) + " rw,relatime - cgroup cgroup rw,memory\n";
    const auto limit = [&](const std::string& cgroup) {
      return coload::detail::cgroup_cpu_limit(cgroup, mountinfo);
    };
    // No quota files at all, or no cgroup lines: no limit.
    CHECK(limit("0::/a/b\n") == 0);
    CHECK(limit("") == 0);
    // v2: the leaf says max, its parent 1.5 CPUs (rounded up to 2), the root is not read
    // beyond the mount point's own file.
    put(fs::path(v2) / "a" / "b" / "cpu.max", "max 100000");
    put(fs::path(v2) / "a" / "cpu.max", "150000 100000");
    CHECK(limit("0::/a/b\n") == 2);
    CHECK(limit("0::/a/b/\n") == 2);  // a trailing slash names the same cgroup
    // A tighter quota below a looser one binds.
    put(fs::path(v2) / "a" / "b" / "cpu.max", "50000 100000");
    CHECK(limit("0::/a/b\n") == 1);
    // A sibling's quota does not.
    CHECK(limit("0::/a/c\n") == 2);
    // Malformed files are ignored, not taken for a quota.
    put(fs::path(v2) / "x" / "cpu.max", "banana 100000");
    put(fs::path(v2) / "x" / "y" / "cpu.max", "100000 0");
    CHECK(limit("0::/x/y\n") == 0);
    // v1: the process's cgroup /docker/c1/inner is the mount's root plus /inner; quota -1
    // means none; 3.2 CPUs round up to 4. The memory hierarchy's quota-like files are not read.
    put(fs::path(v1) / "inner" / "cpu.cfs_quota_us", "-1");
    put(fs::path(v1) / "inner" / "cpu.cfs_period_us", "100000");
    put(fs::path(v1) / "cpu.cfs_quota_us", "320000");
    put(fs::path(v1) / "cpu.cfs_period_us", "100000");
    put(fs::path(memory) / "cpu.cfs_quota_us", "10000");
    put(fs::path(memory) / "cpu.cfs_period_us", "100000");
    CHECK(limit("5:memory:/\n4:cpu,cpuacct:/docker/c1/inner\n") == 4);
    // A path outside the mount's root is read at the first such mount's point only (here the
    // memory folder, whose cfs files say 1), as is one that climbs out or is not absolute.
    CHECK(limit("4:cpuacct,cpu:/elsewhere\n") == 1);
    put(fs::path(v2) / "cpu.max", "300000 100000");
    CHECK(limit("0::/../a/b\n") == 3);
    CHECK(limit("0::a/b\n") == 3);
    // Both hierarchies: the smaller limit.
    CHECK(limit("4:cpu,cpuacct:/docker/c1\n0::/a/b\n") == 1);
    fs::remove_all(root);
  }
}
