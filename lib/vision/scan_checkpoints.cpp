// The JPEG checkpoints kept between decodes (restart_entropy.hpp's ScanCheckpoints): a
// process-wide table from a hash of a file's bytes to the points its crops' decodes recorded,
// the oldest files dropped beyond a byte budget (coload/vision/decode.hpp's
// jpeg_checkpoint_budget).

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <chrono>
#include <mutex>
#include <random>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "coload/core/warning.hpp"
#include "coload/vision/decode.hpp"
#include "restart_entropy.hpp"

namespace coload::vision {
namespace {

using Point = detail::ScanCheckpoints::Point;

struct Kept {
  std::uint64_t high = 0;  // the high half of the file's hash (its low half is the table's key)
  std::size_t size = 0;    // the file's bytes
  int per_row = 0;
  int rows = 0;
  std::vector<Point> points;
};

// A file's cost: its points, and about what its table entry and place in line take.
std::size_t cost(const Kept& k) { return k.points.size() * sizeof(Point) + 96; }

std::uint64_t draw_seed() noexcept {
  try {
    std::random_device device;
    return std::uint64_t{device()} << 32 ^ device();
  } catch (...) {  // no entropy source: the clock's, which no file is crafted for ahead of time
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
}

struct Table {
  // XXH3's seed, drawn once a process (forked workers share their parent's): with the
  // default one, two files can be made to hash alike whatever the hash's width (two 8-byte
  // words chosen within a block), and a crafted file's crops would start from another's
  // points (review).
  const std::uint64_t seed = draw_seed();
  std::mutex mutex;
  std::unordered_map<std::uint64_t, Kept> files;
  std::deque<std::uint64_t> order;  // oldest first
  std::size_t bytes = 0;
};

// Never destroyed: a worker thread may decode while the process exits.
Table& table() {
  static Table* t = new Table;
  return *t;
}

// NOTE: process workers are forked while other threads may be decoding: the table's lock is
// taken around every fork(), so that no child starts with it held (its first crop would hang).
// No other lock is ever taken while it is held.
void lock_for_fork() { table().mutex.lock(); }
void unlock_after_fork() { table().mutex.unlock(); }
[[maybe_unused]] const int fork_handlers_registered =
    (table(), ::pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork));

constexpr std::size_t default_budget = std::size_t{64} << 20;

// COLOAD_JPEG_CHECKPOINT_MB, read when the library is loaded (one thread, no lock: nothing a
// fork could catch half done); a value that is not a number of MiB keeps the default, and the
// first use of the budget warns, naming it.
struct FromEnvironment {
  std::size_t bytes = default_budget;
  std::string bad;  // the variable's value when it is not a number of MiB
};

FromEnvironment read_environment() {
  FromEnvironment out;
  const char* env = std::getenv("COLOAD_JPEG_CHECKPOINT_MB");
  if (!env || !*env) return out;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mb = std::strtoull(env, &end, 10);
  if (*end != '\0' || errno != 0 || env[0] == '-' || mb > (std::uint64_t{1} << 24)) {
    out.bad = env;
  } else {
    out.bytes = static_cast<std::size_t>(mb) << 20;
  }
  return out;
}

const FromEnvironment environment = read_environment();
std::atomic<bool> warned{false};

constexpr std::size_t unset = ~std::size_t{0};
std::atomic<std::size_t> budget_set{unset};  // set_jpeg_checkpoint_budget's, once called

// The budget, without the warning: what may be read under the table's lock.
std::size_t budget_quiet() noexcept {
  const std::size_t b = budget_set.load(std::memory_order_relaxed);
  return b != unset ? b : environment.bytes;
}

// NOTE: may warn (the first time, for a bad variable): never call it with the table's lock held.
std::size_t budget_now() noexcept {
  if (budget_set.load(std::memory_order_relaxed) != unset) return budget_quiet();
  if (!environment.bad.empty() && !warned.exchange(true)) {
    try {  // from noexcept callers: a handler that throws loses the warning, not the process
      coload::detail::warn("COLOAD_JPEG_CHECKPOINT_MB='" + environment.bad +
                           "' is not a number of MiB from 0 to 16777216: JPEG checkpoints keep "
                           "their default budget of 64 MiB");
    } catch (...) {
    }
  }
  return budget_quiet();
}

void evict_locked(Table& t, std::size_t limit) {
  while (t.bytes > limit && !t.order.empty()) {
    const auto it = t.files.find(t.order.front());
    t.order.pop_front();
    if (it == t.files.end()) continue;
    t.bytes -= cost(it->second);
    t.files.erase(it);
  }
}

}  // namespace

std::size_t jpeg_checkpoint_budget() noexcept { return budget_now(); }

std::size_t set_jpeg_checkpoint_budget(std::size_t bytes) noexcept {
  const std::size_t previous = budget_now();
  if (bytes == unset) --bytes;
  Table& t = table();
  // Set under the lock that stores take it under: a store either sees the new budget or comes
  // before this eviction.
  std::lock_guard lock(t.mutex);
  budget_set.store(bytes, std::memory_order_relaxed);
  evict_locked(t, bytes);
  return previous;
}

std::size_t jpeg_checkpoint_bytes() noexcept {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  return t.bytes;
}

namespace detail {

CheckpointKey load_checkpoints(std::span<const std::byte> data, int per_row, int rows,
                               ScanCheckpoints& out) {
  out.reset(per_row, rows);
  if (budget_now() == 0 || data.empty()) return {};
  // XXH3 of the whole file: about 4 us for 80 KB, against about 300 us of Huffman decoding.
  Table& t = table();
  const XXH128_hash_t hash = XXH3_128bits_withSeed(data.data(), data.size(), t.seed);
  const CheckpointKey key{hash.low64, hash.high64, data.size()};
  std::lock_guard lock(t.mutex);
  const auto it = t.files.find(key.low);
  if (it != t.files.end() && it->second.high == key.high && it->second.size == key.size &&
      it->second.per_row == per_row &&
      it->second.rows == rows && it->second.points.size() == out.points.size()) {
    out.points = it->second.points;
  }
  return key;
}

void store_checkpoints(const CheckpointKey& key, const ScanCheckpoints& checkpoints) noexcept {
  if (!key || !checkpoints.added || budget_now() == 0) return;  // warns, if it must, here
  try {
    Table& t = table();
    std::lock_guard lock(t.mutex);
    const std::size_t limit = budget_quiet();  // what set_jpeg_checkpoint_budget set last
    if (limit == 0) return;
    const auto it = t.files.find(key.low);
    if (it == t.files.end()) {
      // Built whole before it goes in: running out of memory leaves the table as it was.
      Kept kept{key.high, key.size, checkpoints.per_row, checkpoints.rows, checkpoints.points};
      const std::size_t bytes = cost(kept);
      t.order.push_back(key.low);
      try {
        t.files.emplace(key.low, std::move(kept));
      } catch (...) {
        t.order.pop_back();
        throw;
      }
      t.bytes += bytes;
    } else if (Kept& k = it->second; k.high == key.high && k.size == key.size &&
                                     k.per_row == checkpoints.per_row &&
                                     k.rows == checkpoints.rows &&
                                     k.points.size() == checkpoints.points.size()) {
      // Another thread's decode of the same bytes may have kept points meanwhile: both are right.
      for (std::size_t i = 0; i < k.points.size(); ++i) {
        if (k.points[i].bit == ScanCheckpoints::unknown) k.points[i] = checkpoints.points[i];
      }
    }
    evict_locked(t, limit);
  } catch (const std::bad_alloc&) {
    // Checkpoints only save time: a decode that succeeded is not failed for want of them.
  }
}

}  // namespace detail
}  // namespace coload::vision
