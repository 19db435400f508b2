#pragma once
// A shard's checksum: XXH3-64 (libxxhash) of its bytes up to its last sample's end, the bytes a
// cache entry holds (cache.cpp). The index records it (version 3, see index.hpp), the writer
// computes it, and the cache checks an entry against it before using it. Private to lib/shards.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "coload/shards/index.hpp"

namespace coload::shards::detail {

/// XXH3-64 over bytes given in pieces.
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void update(const std::byte* data, std::size_t n);
  std::uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The checksum of the first `size` bytes of the open file `fd` (read with pread, in 1 MiB
/// pieces); nothing when the file holds fewer or cannot be read.
std::optional<std::uint64_t> file_checksum(int fd, std::uint64_t size);

/// The checksum of `index`'s shard (the local file at index.path): its bytes up to the last
/// sample's end; nothing when it cannot be read.
std::optional<std::uint64_t> shard_checksum(const ShardIndex& index);

/// The index's spelling: "xxh3:" and 16 lowercase hex digits (xxhsum -H3's, of those bytes).
std::string format_checksum(std::uint64_t sum);
bool parse_checksum(std::string_view text, std::uint64_t& sum);

}  // namespace coload::shards::detail
