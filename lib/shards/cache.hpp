#pragma once
// The local cache of remote shards (cache.cpp): a folder of files, each a shard's bytes up to
// its last sample's end, named for its URL, least recently used evicted past a byte bound; and
// CacheFiller, which fills it behind map-style reads.
// Private to lib/shards.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "coload/io/http.hpp"

#include "coload/shards/dataset.hpp"

namespace coload::shards::detail {

class Checksum;

/// The bytes of `shard` a cache entry holds: [0, its last sample's end).
std::uint64_t cached_size(const ShardIndex& shard) noexcept;

/// After those bytes, an entry's file ends with a trailer: 8 bytes "coload\x01\n", then the
/// XXH3-64 of the bytes (little-endian), computed as they were written. An index without a
/// checksum (one built from a tar, not written by the shard writer) leaves the entry's own to
/// check it by: a copy whose bytes never reached the disk (a crash after the rename, its
/// reserved size all there) is then found out, not read as zeros.
inline constexpr std::uint64_t entry_trailer_size = 16;

/// The size of a cache entry's file for `shard`: cached_size and the trailer.
std::uint64_t entry_size(const ShardIndex& shard) noexcept;

/// The cached file of `shard`, and marked most recently used; nothing when the cache is off or
/// has no such entry. An entry is named for the URL and the version of the shard its index
/// describes (size, mtime), and verified by its size and by a checksum, the index's where it
/// records one, else the trailer's: hashed at its first use in this process (or since
/// cache_forget_verified), and again whenever its size, mtime or inode has changed. One of the
/// wrong size is removed; one of the wrong checksum, or whose trailer is not one, is removed
/// with a warning naming it and the URL (the caller then fetches the shard), and `*removed`
/// (where given) set. Hashing a 64 MiB entry costs about
/// 10 ms, on the calling thread.
std::optional<std::string> cache_find(const ShardOptions& options, const ShardIndex& shard,
                                      bool* removed = nullptr);

/// Removes the cache entry at `path` if it is still the file open as `fd` (a copy that failed
/// to read: an I/O error), and forgets that it was verified; a copy another process has
/// committed over it since stays. Whether it was removed.
bool cache_discard(const std::string& path, int fd);

/// Entries refused for their checksum (found, or as fetched) in this process so far.
std::uint64_t cache_mismatches() noexcept;

/// Makes every entry hashed again at its next use: a new dataset checks what it reads.
void cache_forget_verified();

/// Why cache_start gave no entry: `busy`, another writer is fetching the shard; `later`, the
/// room is held by other writers' unfinished entries, or the folder's lock by another process
/// (a later try may find it free); `never`, the cache is off, the shard larger than its bound,
/// the folder unusable, or only entries to be kept could make the room.
enum class CacheRefusal { none, busy, later, never };

/// A new entry being written (made by cache_start, which gives none while another writer, in
/// this process or another sharing the folder, is fetching the same shard, and none where
/// other writers' unfinished entries hold the room it needs); its file has the entry's full
/// size from the start, so that the bound counts it whole while it downloads. commit() puts it
/// in place (renamed over), unless its bytes miss the index's checksum (then it warns and
/// keeps nothing); an entry never committed leaves nothing.
class CacheEntry {
 public:
  ~CacheEntry();
  /// Appends bytes; a failed write (a full disk) gives the entry up, and the stream goes on.
  void write(const std::byte* data, std::size_t n);
  /// False once a write failed: nothing more is kept, so drop the entry (which lets go of its
  /// fetch lock, so that other writers need not wait for the rest of the shard).
  bool alive() const noexcept { return fd_ >= 0; }
  /// Makes the entry's room under the bound (the least recently used entries evicted) and
  /// gives its file the entry's full size; for an entry cache_start made with `room = false`,
  /// once the server's answer has confirmed the shard's size (a stale or bogus index then
  /// evicts nothing). False, and why in `*why`, where there is no room (`later` or `never`,
  /// as for cache_start); the entry is then to be dropped.
  [[nodiscard]] bool make_room(CacheRefusal* why = nullptr);
  /// Writes the trailer and puts the entry in place; false where it was not kept for a passing
  /// cause (the folder's lock stayed held by another process, the rename failed), so that
  /// fetching it again may keep it. True also where it is not kept for good reason (a failed
  /// write, a checksum missed), which says so itself.
  [[nodiscard]] bool commit();

 private:
  friend std::unique_ptr<CacheEntry> cache_start(const ShardOptions&, const ShardIndex&,
                                                 CacheRefusal*, std::int64_t, bool);
  CacheEntry() = default;
  std::string dir_, tmp_, final_, url_;
  std::uint64_t bound_ = 0, size_ = 0, written_ = 0;
  std::int64_t keep_used_since_ = 0;  // see cache_start
  std::optional<std::uint64_t> expected_;  // the index's checksum
  std::unique_ptr<Checksum> sum_;          // of the bytes written (the trailer's)
  int fd_ = -1;
  pid_t owner_ = 0;  // the writer's process: a forked child's copy removes nothing
  // The entry's fetch lock (`<dir>/.coload-fetch-<entry>`), held while it is written so
  // that no other writer fetches the same shard meanwhile; -1 where none could be had.
  int fetch_fd_ = -1;
  std::string fetch_path_;
};

/// An entry for `shard`, room made for it under the bound (the least recently used entries
/// evicted), or nothing, and why in `*why` where given (a warning, once, when the folder's
/// lock stayed held). Entries used at or after `keep_used_since` (CLOCK_REALTIME ns; 0: no
/// such rule) are not evicted for it. With `room = false` the room is left for make_room,
/// and the entry only holds the shard's fetch lock and an empty file.
std::unique_ptr<CacheEntry> cache_start(const ShardOptions& options, const ShardIndex& shard,
                                        CacheRefusal* why = nullptr,
                                        std::int64_t keep_used_since = 0, bool room = true);

/// Fetches whole shards into the cache behind map-style reads, which fetch samples alone: a
/// shard asked for is queued once, and a thread of its own (started at the first) streams the
/// queued shards one at a time through HttpClient::shared() into CacheEntry's. A fetch that
/// fails (or whose commit the folder's lock stopped, or whose copy was later found bad and
/// removed: lost()) is asked again by a later read, up to three fetches a shard (the reads go
/// on by ranged GETs, and report faults themselves). A shard another writer is fetching (its
/// entry's lock held, see cache_start) stays queued, tried again after the others (every 100 ms when
/// it is all there is), until that writer commits it or gives up; one whose room other writers'
/// unfinished entries hold counts as a failed fetch. A fetch evicts no entry used since the
/// filler was made, or in the two seconds before (a shard this or another dataset on the
/// folder reads now): where only such entries could make room, the shard is not cached. So of two datasets
/// sharing a folder too small for both, the one read first keeps its entries; before, the
/// other's fills evicted them (the first's whole fetches wasted, its reads by ranged GETs
/// from then on). Only the process that made it fetches: in a
/// forked child, want() and wait_idle() do nothing, and its owner must not destroy it (see
/// forked()). The destructor cancels the fetch in flight and waits for the thread.
class CacheFiller {
 public:
  explicit CacheFiller(ShardOptions options);
  /// Not in a forked child: glibc's condition variable waits there for the parent's thread,
  /// which is not in the child, to stop waiting on it. Such an owner leaks it.
  ~CacheFiller();
  /// Whether this is a forked child's copy (made by another process).
  bool forked() const noexcept;
  CacheFiller(const CacheFiller&) = delete;
  CacheFiller& operator=(const CacheFiller&) = delete;
  /// Queues `shard` (which outlives the filler), unless it was asked for before. In a forked
  /// child, nothing: a warning (once a process) says the cache is not filled there, unless
  /// the parent had said every shard was queued (want_all_queued).
  void want(const ShardIndex& shard);
  /// Says that every shard has been queued (ShardDataset::cache_fill): a forked child's reads
  /// then have nothing to warn of. Not where the fetch thread could not be started.
  void want_all_queued();
  /// Says that `shard`'s copy was found bad (cache_find) or unreadable (an I/O error) and
  /// removed: a later read asks for it again, as after a failed fetch (up to three a shard).
  /// Nothing in a forked child.
  void lost(const ShardIndex& shard);
  /// Waits until every shard queued so far has been fetched or given up.
  void wait_idle();
  /// wait_idle for at most `timeout`: whether they were by then.
  bool wait_idle_for(std::chrono::milliseconds timeout);

 private:
  enum class Fill { done, failed, busy };
  void run();
  /// `failed`: to be asked again by a later read; `busy`: another writer is fetching it.
  Fill fill(io::HttpClient& client, const ShardIndex& shard);
  ShardOptions options_;
  const int owner_;  // the pid of the process that made it
  // When it was made (CLOCK_REALTIME ns): a fetch evicts no entry used since (see the class).
  const std::int64_t started_;
  std::mutex mutex_;
  std::condition_variable queued_, idle_;
  std::deque<const ShardIndex*> queue_;  // the front one is being fetched
  std::set<const ShardIndex*> asked_;
  std::map<const ShardIndex*, int> failures_;  // fetches failed, a shard
  std::size_t busy_in_a_row_ = 0;  // queued shards found another writer's, one after another
  io::BodyStream* current_ = nullptr;  // the fetch in flight, for the destructor to cancel
  bool stop_ = false;
  std::atomic<bool> all_queued_{false};  // read in a forked child, which may not lock mutex_
  std::unique_ptr<std::thread> thread_;
};

}  // namespace coload::shards::detail
