// Shards named by URL: brace patterns, a folder URL's shards.txt, and remote index files.

#include "remote.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/io/http.hpp"
#include "coload/shards/dataset.hpp"

namespace coload::shards {

namespace {

constexpr std::size_t max_names = 1'000'000;

bool all_digits(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The alternatives one brace group stands for.
std::vector<std::string> alternatives(std::string_view body, std::string_view pattern) {
  const auto dots = body.find("..");
  if (dots != std::string_view::npos) {
    const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    std::uint64_t lo = 0, hi = 0;
    if (!all_digits(a) || !all_digits(b) || a.size() > 18 || b.size() > 18) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "': {" +
                            std::string(body) + "} is not a range of numbers");
    }
    std::from_chars(a.data(), a.data() + a.size(), lo);
    std::from_chars(b.data(), b.data() + b.size(), hi);
    if (hi < lo || hi - lo >= max_names) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "': the range {" +
                            std::string(body) + "} goes down or names over " +
                            std::to_string(max_names) + " shards");
    }
    // As bash and braceexpand (WebDataset's): when either end has a leading zero ("0" alone
    // has none), every name is padded to the wider end's width: {1..010} is 001 .. 010.
    const auto leading_zero = [](std::string_view s) { return s.size() > 1 && s[0] == '0'; };
    const std::size_t width =
        leading_zero(a) || leading_zero(b) ? std::max(a.size(), b.size()) : 0;
    std::vector<std::string> out;
    for (std::uint64_t k = lo; k <= hi; ++k) {
      std::string n = std::to_string(k);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
    return out;
  }
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto comma = body.find(',', start);
    out.emplace_back(body.substr(start, comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string base_of(std::string_view path) {
  return path.empty() || path.back() != '/' ? std::string(path) + '/' : std::string(path);
}

/// The http(s) URL split before its query or fragment ("?token=...", a token that covers the
/// folder): names derived from it (its index, a folder's list, the shards listed there) go in
/// the path and carry the query. (A presigned URL's signature covers its one object: the
/// index beside it needs its own.) An s3:// URL names a key, which may hold
/// both bytes: not split.
std::pair<std::string_view, std::string_view> split_query(std::string_view url) noexcept {
  if (io::scheme_of(url) == io::Scheme::s3) return {url, {}};
  const auto q = url.find_first_of("?#");
  if (q == std::string_view::npos) return {url, {}};
  return {url.substr(0, q), url.substr(q)};
}

}  // namespace

std::vector<std::string> expand_braces(std::string_view pattern) {
  std::vector<std::string> names{""};
  std::size_t at = 0;
  while (at < pattern.size()) {
    const auto open = pattern.find('{', at);
    const std::string_view literal = pattern.substr(at, open - at);
    for (std::string& n : names) n += literal;
    if (literal.find('}') != std::string_view::npos) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "': '}' at " +
                            std::to_string(at + literal.find('}')) + " closes no '{'");
    }
    if (open == std::string_view::npos) break;
    const auto close = pattern.find('}', open);
    if (close == std::string_view::npos) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "': '{' at " +
                            std::to_string(open) + " is not closed");
    }
    const auto inner = pattern.find('{', open + 1);
    if (inner < close) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "': '{' at " +
                            std::to_string(inner) + " is inside another group (groups do not "
                            "nest; write each name's groups side by side)");
    }
    const auto alts = alternatives(pattern.substr(open + 1, close - open - 1), pattern);
    if (names.size() * alts.size() > max_names) {
      throw InvalidArgument("brace pattern '" + std::string(pattern) + "' names over " +
                            std::to_string(max_names) + " shards");
    }
    std::vector<std::string> next;
    next.reserve(names.size() * alts.size());
    for (const std::string& n : names) {
      for (const std::string& a : alts) next.push_back(n + a);
    }
    names = std::move(next);
    at = close + 1;
  }
  return names;
}

std::optional<std::string> read_beside_shards(std::string_view root, std::string_view name,
                                              std::uint64_t limit,
                                              const io::RetryOptions& retry) {
  // One shard or a pattern of them: the folder they are in; else root is the folder.
  // A pattern's first name stands for it (its folder part may hold braces too).
  const auto folder_of = [](std::string_view path) {
    if (path.empty()) return std::string();
    std::string first(path);
    if (path.find('{') != std::string_view::npos) first = expand_braces(path).front();
    const bool one_shard = first.size() > 4 && first.ends_with(".tar");
    return one_shard ? first.substr(0, first.rfind('/') + 1) : base_of(first);
  };
  if (detail::is_remote(root)) {
    const auto [path, query] = split_query(root);
    const std::string url = folder_of(path) + std::string(name) + std::string(query);
    try {
      return io::HttpClient::shared()->get(url, limit, retry);
    } catch (const io::HttpError& e) {
      // S3 answers a missing key with 403 to a reader who may not list the bucket.
      if (e.status() == 404 || (e.status() == 403 && io::scheme_of(root) == io::Scheme::s3)) {
        return std::nullopt;
      }
      throw;
    }
  }
  const std::string local = io::scheme_of(root) == io::Scheme::file ? detail::file_url_path(root)
                                                                  : std::string(root);
  std::error_code ec;
  const std::string dir = std::filesystem::is_directory(local, ec) ? local : folder_of(local);
  const std::filesystem::path file = std::filesystem::path(dir.empty() ? "." : dir) / name;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (!std::filesystem::exists(file, ec)) return std::nullopt;
    throw SystemError(err, std::generic_category(), "cannot read '" + file.string() + "'");
  }
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > limit) {
      throw InvalidArgument("'" + file.string() + "' is over " + std::to_string(limit) + " bytes");
    }
  }
  if (in.bad()) throw SystemError(EIO, std::generic_category(), "cannot read '" + file.string() + "'");
  return text;
}

namespace detail {

bool is_remote(std::string_view name) noexcept {
  const io::Scheme scheme = io::scheme_of(name);
  return scheme != io::Scheme::none && scheme != io::Scheme::file;
}

std::string file_url_path(std::string_view url) {
  std::string_view rest = url.substr(7);
  if (rest.substr(0, 9) == "localhost") rest.remove_prefix(9);
  const auto skipped = static_cast<std::size_t>(rest.data() - url.data());  // for positions
  if (rest.empty() || rest[0] != '/') {
    throw InvalidArgument("'" + std::string(url) +
                          "': a file:// URL names a local path (file:///path)");
  }
  // Percent-decoded, as a URL's path is (Python's Path.as_uri() writes a space as %20); a '%'
  // not followed by two hex digits is refused, naming the URL.
  std::string path;
  path.reserve(rest.size());
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] != '%') {
      path += rest[i];
      continue;
    }
    unsigned byte = 0;
    const char* digits = rest.data() + i + 1;
    if (i + 2 >= rest.size() || std::from_chars(digits, digits + 2, byte, 16).ptr != digits + 2) {
      throw InvalidArgument("'" + std::string(url) + "': '%' at " + std::to_string(skipped + i) +
                            " is not followed by two hex digits (a file:// URL's path is "
                            "percent-encoded: '%' is %25)");
    }
    const char c = static_cast<char>(byte);
    if (c == '\0' || c == '/') {
      // A NUL would end the path early; a '/' inside a name is no name a file can have.
      throw InvalidArgument("'" + std::string(url) + "': " + std::string(rest.substr(i, 3)) +
                            " at " + std::to_string(skipped + i) + " names no byte a path's name "
                            "can hold");
    }
    path += c;
    i += 2;
  }
  return path;
}

std::string beside(std::string_view url, std::string_view suffix) {
  const auto [path, query] = split_query(url);
  return std::string(path) + std::string(suffix) + std::string(query);
}

std::vector<std::string> find_url_shards(const std::string& root, const io::RetryOptions& retry) {
  if (!is_remote(root)) {
    // file://: local paths, read as any local shard is (pread, io_uring, the page cache).
    if (root.find('{') == std::string::npos) return find_shards(file_url_path(root));
    std::vector<std::string> out;
    for (const std::string& name : expand_braces(root)) out.push_back(file_url_path(name));
    return out;
  }
  if (root.find('{') != std::string::npos) return expand_braces(root);
  const auto [path, query] = split_query(root);
  if (path.size() > 4 && path.ends_with(".tar")) return {root};
  const std::string base = base_of(path);
  const std::string list_url = base + std::string(shard_list_name) + std::string(query);
  std::string text;
  try {
    text = io::HttpClient::shared()->get(list_url, 64 << 20, retry);
  } catch (const io::HttpError& e) {
    throw io::HttpError(e.url(), e.status(), e.attempts(),
                        std::string(e.what()) + " (a folder URL is read through the " +
                            std::string(shard_list_name) +
                            " that coload-shard writes beside its shards; or name the shards "
                            "with a brace pattern, .../shard-{000000..000009}.tar)");
  }
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line.find('/') != std::string::npos || line == "..") {
      throw InvalidArgument("'" + list_url + "' names '" + line +
                            "': shards are listed by file name, in that folder");
    }
    // A file name as Writer wrote it ("a b-000000.tar"), not a URL: for an http(s) path,
    // encoded as one segment (a space, '%', '?', '#', bytes past ASCII); an s3:// key is the
    // name itself (s3_http_url encodes it).
    const bool s3 = io::scheme_of(root) == io::Scheme::s3;
    out.push_back(base + (s3 ? line : io::percent_encode(line, "-._~!$&'()*+,;=:@")) +
                  std::string(query));
  }
  if (out.empty()) throw InvalidArgument("no shards in '" + list_url + "'");
  return out;
}

ShardIndex load_remote_index(const std::string& url, const io::RetryOptions& retry) {
  const std::string idx = beside(url, ".idx");
  std::string text;
  try {
    text = io::HttpClient::shared()->get(idx, 1u << 30, retry);
  } catch (const io::HttpError& e) {
    throw io::HttpError(e.url(), e.status(), e.attempts(),
                        std::string(e.what()) + " (shard '" + url +
                            "' is read by URL through the index file beside it, which "
                            "coload-shard writes)");
  }
  // The size of the shard is the second line's first field; the index is checked against it
  // here, and the shard against it on every read (the server's Content-Range).
  std::uint64_t size = 0;
  const auto nl = text.find('\n');
  if (nl != std::string::npos) {
    const char* p = text.data() + nl + 1;
    std::from_chars(p, text.data() + text.size(), size);
  }
  ShardIndex index;
  std::string why;
  if (!parse_index(text, size, index, &why)) {
    throw ShardError(url, "", 0, "its index '" + idx + "' is not a coload shard index (" + why + ")");
  }
  index.path = url;
  return index;
}

Task<void> confirm_size_async(io::HttpClient& client, const ShardIndex& shard,
                              std::uint64_t bytes, io::RetryOptions retry) {
  if (bytes <= unconfirmed_sample_bound || shard.samples.empty()) co_return;
  const std::uint64_t at = shard.samples.front().begin;
  std::byte first{};
  co_await client.get_range_async(shard.path, at, at + 1, &first, shard.file_size, retry);
}

}  // namespace detail

}  // namespace coload::shards
