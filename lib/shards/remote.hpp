#pragma once
// Shards named by URL: the list of a folder URL, brace patterns, and the index file fetched
// beside a remote shard (remote.cpp). Private to lib/shards.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/io/http.hpp"
#include "coload/shards/index.hpp"

namespace coload::shards::detail {

/// Whether `name` is an http://, https:// or s3:// URL (file:// URLs are read as local paths).
bool is_remote(std::string_view name) noexcept;
/// The local path a file:// URL names ("file:///data/x.tar", "file://localhost/data/x.tar"),
/// percent-decoded ("file:///my%20data": "/my data"); InvalidArgument for another host or a
/// '%' not followed by two hex digits.
std::string file_url_path(std::string_view url);
/// `url` with `suffix` appended to its path: before an http(s) URL's query or fragment
/// ("https://h/x.tar?sig=1" and ".idx": "https://h/x.tar.idx?sig=1"); an s3:// key, which
/// may hold '?' and '#', at its end.
std::string beside(std::string_view url, std::string_view suffix);
/// find_shards for a URL (see find_shards); a folder URL's list is fetched with `retry`.
std::vector<std::string> find_url_shards(const std::string& root,
                                         const io::RetryOptions& retry = {});
/// load_index for an http(s) URL, fetched with `retry`.
ShardIndex load_remote_index(const std::string& url, const io::RetryOptions& retry = {});

/// A remote shard's index is only the server's word for its sizes until the server has
/// answered for the shard itself (the client checks every response's size against the index):
/// a sample larger than this is not given a buffer before that answer.
inline constexpr std::uint64_t unconfirmed_sample_bound = std::uint64_t{64} << 20;

/// Before buffers of `bytes` in all for remote `shard`, sized by its index alone: beyond
/// unconfirmed_sample_bound, the server first answers for the shard (its first sample's first
/// byte, whose response's size `client` checks against the index), so that an index that lies
/// about its shard is an HttpError naming the URL, not an allocation of what it claims.
Task<void> confirm_size_async(io::HttpClient& client, const ShardIndex& shard,
                              std::uint64_t bytes, io::RetryOptions retry);

}  // namespace coload::shards::detail
