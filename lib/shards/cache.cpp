// The byte-bounded LRU cache of remote shards: an entry's mtime is its last use; eviction
// removes the oldest until a new entry fits. Entries are written under a temporary name and
// renamed, so a reader (another worker, another process) never sees half of one.

#include "cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <vector>

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
  mix("\n" + std::to_string(shard.file_size) + "\n" + std::to_string(shard.mtime_ns));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  const auto slash = url.find_last_of('/');
  return std::string(hex) + "-" + url.substr(slash == std::string::npos ? 0 : slash + 1);
}

void evict_for(const std::string& dir, std::uint64_t incoming, std::uint64_t bound) {
  struct Entry {
    fs::path path;
    std::uint64_t size;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".tar" || !e.is_regular_file(ec)) continue;
    const auto size = e.file_size(ec);
    if (ec) continue;
    entries.push_back({e.path(), size, e.last_write_time(ec)});
    total += size;
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const Entry& e : entries) {
    if (total + incoming <= bound) break;
    if (fs::remove(e.path, ec)) total -= e.size;
  }
}

}  // namespace

std::uint64_t cached_size(const ShardIndex& shard) noexcept {
  return shard.samples.empty() ? 0 : shard.samples.back().end;
}

std::optional<std::string> cache_find(const ShardOptions& options, const ShardIndex& shard) {
  if (options.cache_dir.empty() || options.cache_bytes == 0) return std::nullopt;
  const std::string path = (fs::path(options.cache_dir) / entry_name(shard)).string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  if (static_cast<std::uint64_t>(st.st_size) != cached_size(shard)) {
    ::unlink(path.c_str());  // not this shard's bytes (the shard changed, or a torn copy)
    return std::nullopt;
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // now its most recent use
  return path;
}

std::unique_ptr<CacheEntry> cache_start(const ShardOptions& options, const ShardIndex& shard) {
  const std::uint64_t size = cached_size(shard);
  if (options.cache_dir.empty() || options.cache_bytes == 0 || size > options.cache_bytes) {
    return nullptr;
  }
  std::error_code ec;
  fs::create_directories(options.cache_dir, ec);
  std::unique_ptr<CacheEntry> e(new CacheEntry);
  e->dir_ = options.cache_dir;
  e->final_ = (fs::path(options.cache_dir) / entry_name(shard)).string();
  e->tmp_ = e->final_ + ".part" + std::to_string(::getpid()) + "-" +
            std::to_string(reinterpret_cast<std::uintptr_t>(e.get()));
  e->bound_ = options.cache_bytes;
  e->size_ = size;
  e->fd_ = ::open(e->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (e->fd_ < 0) return nullptr;  // a cache folder that cannot be written: no cache
  return e;
}

CacheEntry::~CacheEntry() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void CacheEntry::write(const std::byte* data, std::size_t n) {
  while (fd_ >= 0 && n > 0) {
    const ssize_t k = ::write(fd_, data, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
      fd_ = -1;
      return;
    }
    data += k;
    n -= static_cast<std::size_t>(k);
    written_ += static_cast<std::uint64_t>(k);
  }
}

void CacheEntry::commit() {
  if (fd_ < 0) return;
  const bool whole = written_ == size_;
  ::close(fd_);
  fd_ = -1;
  if (!whole) {
    ::unlink(tmp_.c_str());
    return;
  }
  evict_for(dir_, size_, bound_);
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) ::unlink(tmp_.c_str());
}

}  // namespace coload::shards::detail
