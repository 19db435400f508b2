#pragma once
// A shard by URL that has no index (no `.idx` beside it), streamed by its tar headers
// (unindexed.cpp). Private to lib/shards.

#include <cstddef>
#include <string>

#include "coload/coro/generator.hpp"
#include "coload/io/http.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/tar.hpp"

namespace coload::shards::detail {

/// The samples of the shard at `url`, read front to back with one GET (at most `window` bytes
/// received ahead), grouped as an index groups them (consecutive members sharing a key). Each
/// sample's bytes are those an indexed read gives: from its first member's data to its last
/// member's end. A malformed or torn archive is a ShardError naming the URL, the member and
/// the offset; a failed transfer an io::HttpError. Nothing is allocated for a size a header
/// merely claims: a member's bytes are kept as they arrive.
Generator<ShardSample> stream_unindexed(std::string url, std::size_t window,
                                        io::RetryOptions retry, TarLimits limits = {});

}  // namespace coload::shards::detail
