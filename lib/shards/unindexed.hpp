#pragma once
// A shard by URL that has no index (no `.idx` beside it), streamed by its tar headers
// (unindexed.cpp). Private to lib/shards.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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
///
/// The archive's end: where its end-of-archive block begins is stored to `*end_found` (where
/// given) once it is read. Given `end_known` (that offset, as an earlier read of the shard
/// found it), a transfer that fails right there (an io::HttpError), with every byte before it
/// read, ends the archive as the block would have: the sample being gathered is whole, and is
/// handed out. A body that ends there without failing is a torn archive, as before.
AsyncGenerator<ShardSample> stream_unindexed(std::shared_ptr<io::HttpClient> client,
                                             std::string url, std::size_t window,
                                             io::RetryOptions retry, TarLimits limits = {},
                                             std::optional<std::uint64_t> end_known = {},
                                             std::uint64_t* end_found = nullptr);

}  // namespace coload::shards::detail
