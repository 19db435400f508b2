#pragma once
// A shard by URL that has no index (no `.idx` beside it), streamed by its tar headers
// (unindexed.cpp). Private to lib/shards.

#include <cstddef>
#include <memory>
#include <string>

#include "coload/coro/async_generator.hpp"
#include "coload/io/http.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/tar.hpp"

namespace coload::shards::detail {

/// The samples of the shard at `url`, read front to back with one GET through `client` (at
/// most `window` bytes received ahead), grouped as an index groups them (consecutive members
/// sharing a key). Each sample's bytes are those an indexed read gives: from its first
/// member's data to its last member's end. A malformed or torn archive is a ShardError naming
/// the URL, the member and the offset; a failed transfer an io::HttpError. Nothing is
/// allocated for a size a header merely claims: a member's bytes are kept as they arrive.
/// It waits for bytes without holding a thread (BodyStream::read_async).
AsyncGenerator<ShardSample> stream_unindexed(std::shared_ptr<io::HttpClient> client,
                                             std::string url, std::size_t window,
                                             io::RetryOptions retry, TarLimits limits = {});

}  // namespace coload::shards::detail
