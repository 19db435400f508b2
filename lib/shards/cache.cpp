// The byte-bounded LRU cache of remote shards: an entry's atime is its last use (set by hand,
// so that its mtime changes only when its bytes do); eviction removes the least recently used
// until a new entry fits. Entries are written under a temporary name and renamed, so a reader
// (another worker, another process) never sees half of one. An entry is hashed before its
// first use, and again when its size or mtime changes, against its index's checksum where it
// records one, else the one in the entry's trailer (see entry_trailer_size).

#include "cache.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "checksum.hpp"
#include "coload/core/warning.hpp"
#include "coload/io/http.hpp"

namespace coload::shards::detail {

namespace {

namespace fs = std::filesystem;

// The entry's file name: a hash (FNV-1a) of the URL and of the version of the shard its index
// describes (size and mtime, from the index's header line), and the URL's last part, for a
// reader. A shard rewritten on the server, even to the same size, has a new index and so
// another entry: the old one's bytes are never taken for it, and age out of the cache.
std::string entry_name(const ShardIndex& shard) {
  const std::string& url = shard.path;
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  };
  mix(url);
  // Piece by piece, as the joined string would be (GCC 12 warned falsely of its "\n" + ...).
  for (const std::string& part : {std::string("\n"), std::to_string(shard.file_size),
                                  std::string("\n"), std::to_string(shard.mtime_ns)}) {
    mix(part);
  }
  // The entry's format (since the trailer): entries of an older coload sharing the folder have
  // other names, so neither removes the other's for its size; they age out by use.
  mix("\ntrailer1");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  // The readable part: the path's last name, without an http(s) URL's query (a token of
  // hundreds of bytes made a name past NAME_MAX, and the cache refused every shard), at most
  // 64 bytes. The hash above still covers the whole URL.
  std::string_view name = url;
  if (io::scheme_of(url) != io::Scheme::s3) name = name.substr(0, name.find_first_of("?#"));
  const auto slash = name.find_last_of('/');
  if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
  // A URL ending in '/' before its query names nothing readable: "shard" stands in (the name
  // must not end at the dash, where is_cache_file would not know it, nor evict it).
  if (name.empty()) name = "shard";
  return std::string(hex) + "-" + std::string(name.substr(0, 64));
}

std::int64_t ns(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

// Whether `path` still names the file open as `fd`: not renamed over or unlinked since.
bool still_named(int fd, const std::string& path) {
  struct stat opened {}, named {};
  return ::fstat(fd, &opened) == 0 && ::lstat(path.c_str(), &named) == 0 &&
         same_file(opened, named);
}

// The entries this process found equal to their checksum (or wrote), by path: the file as it
// was then, and its bytes' checksum, which an index's must equal where it records one (another
// dataset may have checked the entry by its trailer). One whose inode, size or mtime differs
// since (rewritten, or written to) is hashed again.
struct Verified {
  dev_t dev;
  ino_t ino;
  std::uint64_t size;
  std::int64_t mtime_ns;
  std::uint64_t sum;
  bool same(const struct stat& st) const {
    return dev == st.st_dev && ino == st.st_ino && size == static_cast<std::uint64_t>(st.st_size) &&
           mtime_ns == ns(st.st_mtim);
  }
};
std::mutex verified_mutex;
std::map<std::string, Verified>& verified() {
  static std::map<std::string, Verified> v;
  return v;
}
// The temporary files this process is writing. Eviction leaves them alone without trying their
// lock: where flock is emulated with per-process locks (NFS), our own lock would not stop us,
// and closing the probe's descriptor would drop it.
std::mutex parts_mutex;
std::set<std::string>& own_parts() {
  static std::set<std::string> p;
  return p;
}
// A worker process forked while another thread holds a lock would wait on it for ever (its
// holder is not in the child): the fork waits for them, as the JPEG checkpoint table's does.
void lock_for_fork() {
  verified_mutex.lock();
  parts_mutex.lock();
}
void unlock_after_fork() {
  parts_mutex.unlock();
  verified_mutex.unlock();
}
[[maybe_unused]] const int fork_handlers_registered =
    ::pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);

void remember(const std::string& path, const struct stat& st, std::uint64_t sum) {
  std::lock_guard lock(verified_mutex);
  verified()[path] = {st.st_dev, st.st_ino, static_cast<std::uint64_t>(st.st_size), ns(st.st_mtim),
                      sum};
}

// Marks the entry used now: its atime, which eviction orders by; its mtime stays its bytes'.
// A use within a second of the last is not marked again (a map-style read finds the entry
// once a sample).
void touch(const std::string& path, const struct stat& st) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (ns(now) - ns(st.st_atim) < 1000000000) return;
  const struct timespec times[2] = {now, {0, UTIME_OMIT}};
  ::utimensat(AT_FDCWD, path.c_str(), times, 0);
}

std::atomic<std::uint64_t> mismatches{0};

// The cache cannot keep what it is given (a folder that cannot be made or written, a full
// disk): the shards are read from their server as before, and this is said once a folder.
void unusable(const std::string& dir, const std::string& what, int err) {
  coload::detail::warn_once("shard cache " + dir,
                            "the shard cache '" + dir + "' is not used: " + what + ": " +
                                std::generic_category().message(err) +
                                " (shards are read from their URLs; said once)");
}

// Whether `name` is one of the cache's files (entry_name's 16 hex digits and a dash, maybe with
// a writer's temporary suffix): eviction touches nothing else in the folder, which may be shared
// with the user's own files (shards among them).
bool is_cache_file(const std::string& name) {
  if (name.size() < 18 || name[16] != '-') return false;
  return std::all_of(name.begin(), name.begin() + 16,
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// cache_start's temporary name: the entry's, then this, the writer's pid, '.' and a number.
constexpr std::string_view part_suffix = ".coload-part.";

// The writer's pid in a temporary file's name (`<entry>.coload-part.<pid>.<n>`), or 0 for a
// name that is not one.
pid_t part_writer(const std::string& name) {
  const auto at = name.rfind(part_suffix);
  if (at == std::string::npos) return 0;
  const std::size_t from = at + part_suffix.size();
  const auto dot = name.find('.', from);
  const auto digits = [&](std::size_t a, std::size_t b) {
    return a < b && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(a),
                                name.begin() + static_cast<std::ptrdiff_t>(b),
                                [](char c) { return c >= '0' && c <= '9'; });
  };
  if (dot == std::string::npos || dot - from > 9 || !digits(from, dot) ||
      !digits(dot + 1, name.size())) {
    return 0;
  }
  return static_cast<pid_t>(std::stol(name.substr(from, dot - from)));
}

// Whether the writer of the temporary file at `path` is gone (killed mid-shard), and if so
// removes it (under the lock, and only if the name is still the locked file's). A writer
// holds an exclusive flock on its file while it writes, which ends with its process: a lock,
// not its pid, which may be reused, or be another host's or pid namespace's (a shared
// folder). Only where the file system has no locks at all (ENOLCK, EOPNOTSUPP, ENOSYS) is the
// pid in the name asked instead; a lock that cannot be tried otherwise (a file of another
// user, read-only, on NFS) keeps the file.
bool remove_if_abandoned(const fs::path& path, pid_t writer) {
  {
    std::lock_guard lock(parts_mutex);
    if (own_parts().count(path.filename().string())) return false;
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);  // NFS's emulation needs it writable
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool gone = false;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    gone = true;
  } else if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {
    gone = writer != ::getpid() && ::kill(writer, 0) != 0 && errno == ESRCH;
  }
  // The writer may have renamed it into place and closed it between the open and the lock,
  // and a new writer taken the same name since.
  if (gone && still_named(fd, path)) {
    ::unlink(path.c_str());
  } else {
    gone = false;
  }
  ::close(fd);
  return gone;
}

// What evict_for found: room made; no room while other writers' unfinished files hold it (a
// later try may find it); no room but by evicting entries it was told to keep.
enum class Room { made, held, kept };

// Makes room for `incoming` bytes (the writer's own `own_tmp`) under `bound`: entries go least
// recently used first. Another writer's unfinished file counts against the bound (at its full
// size: cache_start gives a part that size at once) but stays, unless its process is gone
// (killed mid-shard): then it is removed. The caller holds the folder's lock where it can, so
// that writers in other processes make room one at a time. An entry used at or after
// `keep_used_since` (CLOCK_REALTIME ns; 0: none) is not evicted: see CacheFiller. Never
// throws: a folder that cannot be listed is left as it is (and taken to have room).
Room evict_for(const std::string& dir, const std::string& own_tmp, std::uint64_t incoming,
               std::uint64_t bound, std::int64_t keep_used_since = 0) noexcept {
  struct Entry {
    fs::path path;
    std::uint64_t size;
    std::int64_t used;
  };
  try {
    std::vector<Entry> entries;
    std::uint64_t total = 0;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& path = it->path();
      const std::string name = path.filename().string();
      struct stat st {};
      if (!is_cache_file(name) || path == own_tmp || ::stat(path.c_str(), &st) != 0 ||
          !S_ISREG(st.st_mode)) {
        continue;
      }
      const auto size = static_cast<std::uint64_t>(st.st_size);
      if (const pid_t writer = part_writer(name)) {
        if (!remove_if_abandoned(path, writer)) total += size;
        continue;
      }
      entries.push_back({path, size, ns(st.st_atim)});
      total += size;
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.used < b.used; });
    bool kept = false;
    for (const Entry& e : entries) {
      if (total + incoming <= bound) break;
      if (keep_used_since > 0 && e.used >= keep_used_since) {
        kept = true;  // and so is every later one
        break;
      }
      if (fs::remove(e.path, ec)) total -= e.size;
    }
    return total + incoming <= bound ? Room::made : kept ? Room::kept : Room::held;
  } catch (...) {
    // Out of memory: nothing evicted this time, and the entry may pass the bound.
    return Room::made;
  }
}

// Gives the part open as `fd` its full `size` before a byte is written (a sparse file, at
// once: no block is allocated, or zeroed, on the thread that starts the fetch), so that every
// writer's eviction counts it whole from the start. The error, or 0.
int reserve(int fd, std::uint64_t size) noexcept {
  int r;
  while ((r = ::ftruncate(fd, static_cast<off_t>(size))) != 0 && errno == EINTR) {
  }
  return r == 0 ? 0 : errno;
}

// The cache folder's lock, held while room is made for a new entry (as its fetch starts) and
// from eviction to its rename (as it is committed), where the file system has flock; else
// not held, and the bound may be passed by an entry.
//
// The lock is only tried, a few times over about a quarter second: a start and a commit run
// on the loader's driver thread, and a holder that stopped (a process stopped by SIGSTOP or a
// debugger, a hung network file system) would stop every transfer with it. `busy()` then says
// the entry could not be started or committed; the shard is fetched again by a later epoch.
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir)
      : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) return;
    int r = -1;
    for (int wait_ms = 1; (r = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0; wait_ms *= 2) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK || wait_ms > 128) break;
      ::usleep(static_cast<useconds_t>(wait_ms) * 1000);
    }
    if (r != 0) {
      busy_ = errno == EWOULDBLOCK;
      ::close(fd_);
      fd_ = -1;
    }
  }
  /// Another process held the folder's lock throughout: says so (once a folder), naming the
  /// shard `url` that is not cached this time.
  bool busy(const std::string& dir, const std::string& url) const {
    if (busy_) {
      coload::detail::warn_once("shard cache busy " + dir,
                                "the shard cache '" + dir + "' stayed locked by another "
                                "process for a quarter second: shard '" + url +
                                "' is not cached this time (said once)");
    }
    return busy_;
  }
  ~FolderLock() {
    if (fd_ < 0) return;
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
  bool busy_ = false;
};

// An entry's fetch lock: `<dir>/.coload-fetch-<entry>`, flock'ed by the one writer of the
// entry (in this process or another sharing the folder) until it is committed or given up, so
// that ranks on one node, or a stream and a filler, do not each fetch the same shard whole.
// The holder removes the file before letting go of it, and a lock taken on a file no longer so
// named is taken again. Not a cache file (eviction leaves it alone); one left by a process
// killed mid-fetch is taken by the next writer.
struct FetchLock {
  int fd = -1;      // held; -1 with `busy` when another writer holds it
  bool busy = false;
  std::string path;
  FetchLock() = default;
  FetchLock(const FetchLock&) = delete;
  FetchLock& operator=(const FetchLock&) = delete;
  ~FetchLock() {
    if (fd < 0) return;  // given to its entry, or never held
    ::unlink(path.c_str());
    ::close(fd);
  }
};

void take_fetch_lock(FetchLock& l, const std::string& dir, const std::string& entry) {
  l.path = (fs::path(dir) / (".coload-fetch-" + entry)).string();
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = ::open(l.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    // Another user's lock file in a shared folder: flock needs no write access.
    if (fd < 0 && errno == EACCES) fd = ::open(l.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // no lock: fetched as before, maybe by two writers at once
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      // Held: another writer fetches it. No locks on this file system: fetched unlocked.
      l.busy = errno == EWOULDBLOCK;
      ::close(fd);
      return;
    }
    if (still_named(fd, l.path)) {
      l.fd = fd;
      return;
    }
    ::close(fd);  // its last holder removed it between the open and the lock: a new one
  }
}

}  // namespace

std::uint64_t cached_size(const ShardIndex& shard) noexcept {
  return shard.samples.empty() ? 0 : shard.samples.back().end;
}

std::uint64_t entry_size(const ShardIndex& shard) noexcept {
  return cached_size(shard) + entry_trailer_size;
}

namespace {

enum class Check { good, bad, gone, replaced };

constexpr char trailer_magic[8] = {'c', 'o', 'l', 'o', 'a', 'd', '\x01', '\n'};

// The checksum an entry's trailer records (see entry_trailer_size), from the open file `fd`
// of `data` bytes before it; nothing when the trailer is not one (never written out) or
// cannot be read.
std::optional<std::uint64_t> trailer_checksum(int fd, std::uint64_t data) {
  unsigned char t[entry_trailer_size];
  ssize_t n;
  while ((n = ::pread(fd, t, sizeof t, static_cast<off_t>(data))) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof t) || std::memcmp(t, trailer_magic, 8) != 0) {
    return std::nullopt;
  }
  std::uint64_t sum = 0;
  for (int k = 7; k >= 0; --k) sum = (sum << 8) | t[8 + k];
  return sum;
}

// Whether the entry at `path`, as `st` describes it, holds `shard`'s bytes: its size, and its
// checksum, the index's or else its trailer's (a bad entry is removed); `gone` when it was
// evicted since that stat, `replaced` when another process committed a new copy over it
// meanwhile.
Check check_entry(const std::string& path, const struct stat& st, const ShardIndex& shard) {
  if (static_cast<std::uint64_t>(st.st_size) != entry_size(shard)) {
    // Not this shard's bytes (the shard changed, a torn copy, an entry from before trailers).
    ::unlink(path.c_str());
    return Check::bad;
  }
  {
    std::lock_guard lock(verified_mutex);
    const auto it = verified().find(path);
    if (it != verified().end() && it->second.same(st) &&
        (!shard.checksum || it->second.sum == *shard.checksum)) {
      return Check::good;
    }
  }
  // Hashed from an fd opened now, if it is the file the stat above saw.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Check::gone;  // evicted meanwhile
  struct stat fst {};
  if (::fstat(fd, &fst) != 0 || !same_file(fst, st)) {
    ::close(fd);
    return Check::replaced;
  }
  // The index's checksum where it records one, else the one the entry was written with.
  const std::optional<std::uint64_t> expected =
      shard.checksum ? shard.checksum : trailer_checksum(fd, cached_size(shard));
  std::optional<std::uint64_t> sum;
  if (expected) {
    try {
      sum = file_checksum(fd, cached_size(shard));
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  const bool good = expected && sum == expected;
  // Removed by what it is, not by name: another reader may have removed it while this one
  // hashed and committed a fresh copy under the name, which stays (and is checked instead).
  const bool named = still_named(fd, path);
  if (!good && named) ::unlink(path.c_str());
  ::close(fd);
  if (!named) return Check::replaced;
  if (!good) {
    ++mismatches;
    const std::string entry = "the cache entry '" + path + "' of shard '" + shard.path + "'";
    coload::detail::warn(
        !expected ? entry + " has no checksum after its bytes (they may not have reached the "
                            "disk before a crash): removed, and the shard fetched again"
                  : entry + " does not match the checksum " +
                        (shard.checksum ? "its index records" : "it was written with") + " (" +
                        (sum ? format_checksum(*sum) : std::string("unreadable")) +
                        ", expected " + format_checksum(*expected) +
                        "): removed, and the shard fetched again");
    return Check::bad;
  }
  remember(path, fst, *sum);
  return Check::good;
}

}  // namespace

std::optional<std::string> cache_find(const ShardOptions& options, const ShardIndex& shard,
                                      bool* removed) {
  if (options.cache_dir.empty() || options.cache_bytes == 0) return std::nullopt;
  const std::string path = (fs::path(options.cache_dir) / entry_name(shard)).string();
  // Another process may commit a fresh copy over the entry between the stat and the check's
  // open: the check then starts again on the new file (a few times at most), rather than count
  // the replaced one as a mismatch and remove a good entry.
  for (int attempt = 0; attempt < 4; ++attempt) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    switch (check_entry(path, st, shard)) {
      case Check::good:
        touch(path, st);  // now its most recent use
        return path;
      case Check::bad:
        if (removed) *removed = true;
        return std::nullopt;
      case Check::gone:
        return std::nullopt;
      case Check::replaced:
        break;
    }
  }
  return std::nullopt;
}

std::uint64_t cache_mismatches() noexcept { return mismatches.load(); }

bool cache_discard(const std::string& path, int fd) {
  if (fd < 0 || !still_named(fd, path)) return false;
  ::unlink(path.c_str());
  std::lock_guard lock(verified_mutex);
  verified().erase(path);
  return true;
}

void cache_forget_verified() {
  std::lock_guard lock(verified_mutex);
  verified().clear();
}

std::unique_ptr<CacheEntry> cache_start(const ShardOptions& options, const ShardIndex& shard,
                                        CacheRefusal* why, std::int64_t keep_used_since,
                                        bool room) {
  CacheRefusal ignored;
  CacheRefusal& refusal = why ? *why : ignored;
  refusal = CacheRefusal::never;
  const std::uint64_t size = cached_size(shard);
  if (options.cache_dir.empty() || options.cache_bytes == 0 ||
      entry_size(shard) > options.cache_bytes) {
    return nullptr;
  }
  std::error_code ec;
  fs::create_directories(options.cache_dir, ec);
  if (ec) {
    unusable(options.cache_dir, "cannot create the folder", ec.value());
    return nullptr;
  }
  // One writer an entry: while another (a rank on this node, or this process's filler or
  // stream) fetches the shard, this reader reads it from its URL uncached, and a later read
  // finds the entry that writer commits.
  const std::string name = entry_name(shard);
  FetchLock fetch;
  take_fetch_lock(fetch, options.cache_dir, name);
  if (fetch.busy) {
    refusal = CacheRefusal::busy;
    return nullptr;
  }
  std::unique_ptr<CacheEntry> e(new CacheEntry);
  e->owner_ = ::getpid();
  e->fetch_path_ = fetch.path;
  e->fetch_fd_ = std::exchange(fetch.fd, -1);
  e->dir_ = options.cache_dir;
  e->final_ = (fs::path(options.cache_dir) / name).string();
  if (::access(e->final_.c_str(), F_OK) == 0) return nullptr;  // committed since it was looked for
  e->tmp_ = e->final_ + std::string(part_suffix) + std::to_string(::getpid()) + "." +
            std::to_string(reinterpret_cast<std::uintptr_t>(e.get()));
  e->bound_ = options.cache_bytes;
  e->keep_used_since_ = keep_used_since;
  e->size_ = size;
  e->url_ = shard.path;
  e->expected_ = shard.checksum;
  e->sum_ = std::make_unique<Checksum>();
  {
    // Ours before it exists: this process's eviction never probes it (by its name, whatever
    // spelling of the folder another dataset uses). The destructor lets go of it.
    std::lock_guard lock(parts_mutex);
    own_parts().insert(fs::path(e->tmp_).filename().string());
  }
  // O_EXCL: a name taken already (the same pid in another pid namespace) is not written over.
  const int fd = ::open(e->tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    // A cache folder that cannot be written: no cache, said once (not a silent refetch of
    // every shard every epoch).
    const int err = errno;
    if (err != EEXIST) unusable(options.cache_dir, "cannot create '" + e->tmp_ + "'", err);
    return nullptr;
  }
  // The lock tells other processes' eviction that this writer is alive (remove_if_abandoned).
  // Between the open and the lock, one may have taken the empty file for abandoned and
  // removed it: then the name is no longer this file's, and it is left alone. A file system
  // without flock leaves eviction the pid in the name.
  const bool lost = (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) ||
                    !still_named(fd, e->tmp_);
  if (lost) {
    ::close(fd);
    return nullptr;  // the destructor only lets go of the name
  }
  e->fd_ = fd;
  if (room && !e->make_room(&refusal)) return nullptr;  // the destructor removes the part
  refusal = CacheRefusal::none;
  return e;
}

bool CacheEntry::make_room(CacheRefusal* why) {
  CacheRefusal ignored;
  CacheRefusal& refusal = why ? *why : ignored;
  refusal = CacheRefusal::never;
  if (fd_ < 0) return false;
  // Room for the whole entry, made before a byte is written and held by the part's size (see
  // reserve): the folder's cache files, unfinished ones included, stay within the bound while
  // shards download, not only once they are committed. Where other writers' unfinished
  // entries hold the room, the shard is not cached this time (the destructor removes the part).
  FolderLock folder(dir_);
  if (folder.busy(dir_, url_)) {
    refusal = CacheRefusal::later;
    return false;
  }
  switch (evict_for(dir_, tmp_, size_ + entry_trailer_size, bound_, keep_used_since_)) {
    case Room::made:
      break;
    case Room::held:
      refusal = CacheRefusal::later;
      return false;
    case Room::kept:
      return false;
  }
  if (const int err = reserve(fd_, size_ + entry_trailer_size)) {
    unusable(dir_, "cannot reserve " + std::to_string(size_ + entry_trailer_size) +
                       " bytes for '" + tmp_ + "' (shard '" + url_ + "')",
             err);
    return false;
  }
  refusal = CacheRefusal::none;
  return true;
}

CacheEntry::~CacheEntry() {
  // A forked child's copy only closes its descriptors: the files are its parent's, still
  // being written (the locks are the parent's too, and stay while the parent holds them).
  const bool mine = owner_ == ::getpid();
  if (fd_ >= 0) {
    if (mine) ::unlink(tmp_.c_str());  // before the close, which lets go of the lock
    ::close(fd_);
  }
  if (fetch_fd_ >= 0) {
    if (mine) ::unlink(fetch_path_.c_str());  // likewise: a writer that opened it takes a new one
    ::close(fetch_fd_);
  }
  if (tmp_.empty()) return;
  std::lock_guard lock(parts_mutex);
  own_parts().erase(fs::path(tmp_).filename().string());
}

void CacheEntry::write(const std::byte* data, std::size_t n) {
  while (fd_ >= 0 && n > 0) {
    const ssize_t k = ::write(fd_, data, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const int err = k < 0 ? errno : ENOSPC;
      unusable(dir_, "cannot write '" + tmp_ + "' (shard '" + url_ + "')", err);
      ::unlink(tmp_.c_str());
      ::close(fd_);
      fd_ = -1;
      return;
    }
    sum_->update(data, static_cast<std::size_t>(k));
    data += k;
    n -= static_cast<std::size_t>(k);
    written_ += static_cast<std::uint64_t>(k);
  }
}

bool CacheEntry::commit() {
  // The file stays open, and so locked, until it has its entry's name: another process's
  // eviction takes a part no one holds for an abandoned one. What is not renamed, the
  // destructor removes (unlink, then close).
  if (fd_ < 0 || written_ != size_) return true;  // a write failed: said there
  const std::uint64_t digest = sum_->digest();
  if (expected_ && digest != *expected_) {
    // The server sent other bytes than the index describes (the shard replaced without its
    // index): not kept, so a later epoch does not take them for the indexed shard.
    ::unlink(tmp_.c_str());
    ::close(std::exchange(fd_, -1));
    ++mismatches;
    coload::detail::warn("shard '" + url_ + "' as fetched does not match the checksum its index "
                         "records (" + format_checksum(digest) + ", expected " +
                         format_checksum(*expected_) + "): not cached");
    return true;
  }
  // The trailer (see entry_trailer_size): the checksum the entry is checked by where its
  // index records none.
  unsigned char trailer[entry_trailer_size];
  std::memcpy(trailer, trailer_magic, 8);
  for (int k = 0; k < 8; ++k) trailer[8 + k] = static_cast<unsigned char>(digest >> (8 * k));
  ssize_t n;
  while ((n = ::pwrite(fd_, trailer, sizeof trailer, static_cast<off_t>(size_))) < 0 &&
         errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof trailer)) {
    unusable(dir_, "cannot write '" + tmp_ + "' (shard '" + url_ + "')", n < 0 ? errno : ENOSPC);
    ::unlink(tmp_.c_str());
    ::close(std::exchange(fd_, -1));
    return true;
  }
  {
    // Room made and the entry renamed under the folder's lock: two processes committing at
    // once do not both count the same free bytes.
    FolderLock folder(dir_);
    if (folder.busy(dir_, url_)) return false;  // the destructor removes the part
    // Room was made at the start; made again here where a writer without the folder's lock
    // (a file system without flock) took some meanwhile.
    evict_for(dir_, tmp_, size_ + entry_trailer_size, bound_, keep_used_since_);
    // Used now: its atime was the download's start, older than entries used meanwhile.
    struct timespec now {};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const struct timespec times[2] = {now, {0, UTIME_OMIT}};
    ::utimensat(AT_FDCWD, tmp_.c_str(), times, 0);
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) return false;
  }
  ::close(std::exchange(fd_, -1));
  struct stat st {};
  // Hashed as it was written: its first use need not read it again.
  if (::stat(final_.c_str(), &st) == 0) remember(final_, st, digest);
  return true;
}

namespace {
std::int64_t now_ns() {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return ns(now);
}
}  // namespace

CacheFiller::CacheFiller(ShardOptions options)
    : options_(std::move(options)), owner_(static_cast<int>(::getpid())), started_(now_ns()) {}

bool CacheFiller::forked() const noexcept { return static_cast<int>(::getpid()) != owner_; }

CacheFiller::~CacheFiller() {
  // Never run in a forked child (see forked()): its thread is the parent's.
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    if (current_) current_->cancel();
  }
  queued_.notify_all();
  idle_.notify_all();
  if (thread_) thread_->join();
}

void CacheFiller::want_all_queued() {
  // A forked child's mutex may be locked for ever (by the parent's thread at the fork), and
  // nothing it queues is fetched: its reads still say so.
  if (forked()) return;
  std::lock_guard lock(mutex_);
  if (!stop_) all_queued_.store(true);  // stopped: nothing was queued, and the warning stays
}

void CacheFiller::want(const ShardIndex& shard) {
  if (forked()) {
    if (all_queued_.load()) return;  // the parent queued every shard (cache_fill): it fills
    // A process worker's reads: the fetch thread is the parent's, and this copy's queue would
    // reach no thread. Said once a process, so that a run with a cache and process workers
    // knows why later epochs still read by URL.
    coload::detail::warn_once("shard cache filler in a process worker " + options_.cache_dir,
                              "the shard cache '" + options_.cache_dir +
                                  "' is not filled behind reads in worker processes (the "
                                  "fetches belong to the parent process): call the dataset's "
                                  "cache_fill() in the parent, read an epoch with thread "
                                  "workers, or stream it (ShardStream), to fill it");
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (stop_ || asked_.count(&shard)) return;
    if (!thread_) {
      try {
        thread_ = std::make_unique<std::thread>([this] { run(); });
      } catch (const std::system_error& e) {
        // No thread to be had (a limit on threads): the reads go on by ranged GETs.
        stop_ = true;
        coload::detail::warn_once("shard cache filler " + options_.cache_dir,
                                  "the shard cache '" + options_.cache_dir +
                                      "' is not filled behind map-style reads: cannot start "
                                      "its thread (" + e.what() + ")");
        return;
      }
    }
    asked_.insert(&shard);
    queue_.push_back(&shard);
  }
  queued_.notify_one();
}

void CacheFiller::lost(const ShardIndex& shard) {
  if (forked()) return;
  std::lock_guard lock(mutex_);
  const bool queued = std::find(queue_.begin(), queue_.end(), &shard) != queue_.end();
  if (!queued && ++failures_[&shard] < 3) asked_.erase(&shard);
}

void CacheFiller::wait_idle() {
  if (forked()) return;
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() || stop_; });
}

bool CacheFiller::wait_idle_for(std::chrono::milliseconds timeout) {
  if (forked()) return true;
  // Past a year, no bound: now() + a bound near milliseconds::max() would overflow.
  if (timeout > std::chrono::hours(24 * 366)) {
    wait_idle();
    return true;
  }
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return queue_.empty() || stop_; });
}

void CacheFiller::run() {
  // One client for the thread's life (HttpClient::shared() takes a process-wide lock).
  std::shared_ptr<io::HttpClient> client;
  for (;;) {
    const ShardIndex* shard = nullptr;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      shard = queue_.front();
    }
    Fill result = Fill::failed;
    try {
      if (!client) client = io::HttpClient::shared();
      result = fill(*client, *shard);
    } catch (...) {
      // The map-style reads go on by ranged GETs, and report faults themselves.
    }
    {
      std::unique_lock lock(mutex_);
      queue_.pop_front();
      if (result == Fill::busy) {
        // Another writer is fetching it: still wanted (that writer may give up), so it goes
        // to the back, and is tried again once the others have been; when every queued shard
        // is another's, a tenth of a second passes first.
        queue_.push_back(shard);
        if (++busy_in_a_row_ >= queue_.size()) {
          busy_in_a_row_ = 0;
          queued_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; });
        }
        continue;
      }
      busy_in_a_row_ = 0;
      // A fetch that failed is asked again by a later read, up to three fetches a shard.
      if (result == Fill::failed && ++failures_[shard] < 3) asked_.erase(shard);
    }
    idle_.notify_all();
  }
}

CacheFiller::Fill CacheFiller::fill(io::HttpClient& client, const ShardIndex& shard) {
  if (cache_find(options_, shard)) return Fill::done;
  CacheRefusal refusal{};
  // Entries used from a little before it was made on are kept: a use within a second of the
  // last does not move an entry's atime (see touch), and a file system may keep it coarsely.
  // Its room is made once the first bytes have come (below).
  auto entry = cache_start(options_, shard, &refusal, started_ - 2'000'000'000, false);
  // What a refusal means, for cache_start's and for make_room's.
  const auto refused = [&] {
    if (refusal == CacheRefusal::busy) return Fill::busy;
    if (refusal == CacheRefusal::later) return Fill::failed;  // asked again by a later read
    // The cache is off for it: too large, the folder unusable, or only entries in use could
    // make its room.
    return Fill::done;
  };
  if (!entry) return refused();
  const std::uint64_t end = cached_size(shard);
  // One GET of the whole entry, at most 4 MiB of it held ahead of the writes here.
  auto body = client.stream(shard.path, 0, end, std::size_t{4} << 20, shard.file_size,
                            options_.retry);
  {
    std::lock_guard lock(mutex_);
    if (stop_) return Fill::done;
    current_ = body.get();
  }
  // Let go of before `body` is destroyed: the destructor may cancel it until then.
  struct Release {
    CacheFiller& filler;
    ~Release() {
      std::lock_guard lock(filler.mutex_);
      filler.current_ = nullptr;
    }
  } release{*this};
  std::vector<std::byte> chunk(std::size_t{1} << 20);
  std::uint64_t done = 0;
  while (done < end) {
    // The first read is of one byte: the client hands over none before the answer's size
    // matches the index's, and only then is the entry's room made (so that a stale or bogus
    // index evicts nothing), before the rest arrives (so that the bound counts it whole).
    const std::size_t n = body->read_up_to(
        chunk.data(),
        done == 0 ? 1 : static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), end - done)));
    if (n == 0) return Fill::failed;  // the body ended early: nothing kept
    if (done == 0 && !entry->make_room(&refusal)) return refused();
    entry->write(chunk.data(), n);
    // A write failed (said there): the rest of the shard would be fetched for nothing.
    if (!entry->alive()) return Fill::done;
    done += n;
  }
  // Not kept for a passing cause (the folder stayed locked, the rename failed): fetched again
  // when a later read asks (its checksum missed, or a write failed: said there, and done).
  return entry->commit() ? Fill::done : Fill::failed;
}

}  // namespace coload::shards::detail
