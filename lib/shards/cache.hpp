#pragma once
// The local cache of remote shards (cache.cpp): a folder of files, each a shard's bytes up to
// its last sample's end, named for its URL, least recently used evicted past a byte bound.
// Private to lib/shards.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "coload/shards/dataset.hpp"

namespace coload::shards::detail {

/// The bytes a cache entry of `shard` holds: [0, its last sample's end).
std::uint64_t cached_size(const ShardIndex& shard) noexcept;

/// The cached file of `shard`, and marked most recently used; nothing when the cache is off or
/// has no such entry. An entry is named for the URL and the version of the shard its index
/// describes (size, mtime), and verified by its size (the index has no checksum); one of the
/// wrong size is removed.
std::optional<std::string> cache_find(const ShardOptions& options, const ShardIndex& shard);

/// A new entry being written; commit() puts it in place (renamed over, after evicting the least
/// recently used entries until it fits the bound), and an entry never committed leaves nothing.
class CacheEntry {
 public:
  ~CacheEntry();
  /// Appends bytes; a failed write (a full disk) gives the entry up, and the stream goes on.
  void write(const std::byte* data, std::size_t n);
  void commit();

 private:
  friend std::unique_ptr<CacheEntry> cache_start(const ShardOptions&, const ShardIndex&);
  CacheEntry() = default;
  std::string dir_, tmp_, final_;
  std::uint64_t bound_ = 0, size_ = 0, written_ = 0;
  int fd_ = -1;
};

/// An entry for `shard`, or nothing when the cache is off or the shard larger than its bound.
std::unique_ptr<CacheEntry> cache_start(const ShardOptions& options, const ShardIndex& shard);

}  // namespace coload::shards::detail
