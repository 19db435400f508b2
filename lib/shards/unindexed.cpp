// Streaming a shard by URL without its index: the tar headers are walked as the body arrives
// (tar.hpp's parsers, one block at a time), since a remote shard cannot be walked by seeking.

#include "unindexed.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/shards/index.hpp"

namespace coload::shards::detail {

namespace {

constexpr std::size_t piece = 1 << 20;  // the most read at once into a sample

std::uint64_t padding(std::uint64_t size) noexcept {
  return (tar_block - size % tar_block) % tar_block;
}

/// The body and the bytes of the sample being gathered.
struct Walk {
  std::shared_ptr<io::HttpClient> client;
  std::string url;
  std::size_t window = 0;
  io::RetryOptions retry;
  std::unique_ptr<io::BodyStream> body;
  std::uint64_t offset = 0;  // of the next byte read
  std::uint64_t asked = 0;   // where the body was last asked for from
  bool open = false;         // a sample is being gathered: what is read is kept
  std::vector<std::byte> raw;  // the open sample's bytes from its first member's data

  void open_body() {
    asked = offset;
    // Going on from where an earlier body ended: from the version its bytes were of (If-Range;
    // another version is an error), never the rest of a replaced shard after the old one's
    // first part.
    const io::BodyVersion version = body ? body->version() : io::BodyVersion{};
    body = client->stream(url, offset, ~std::uint64_t{0}, window, 0, retry, version);
  }

  /// Reads up to `n` bytes to `dst` (nullptr drops them), fewer only at the shard's end.
  /// Where the body ends early, it is asked for again from the byte reached: a response whose
  /// Content-Length lied looks complete, and with no index telling the shard's size only the
  /// server can say whether more follows (416: no more).
  Task<std::size_t> read(std::byte* dst, std::size_t n) {
    std::size_t got = 0;
    for (;;) {
      std::size_t more = 0;
      try {
        more = co_await body->read_async(dst ? dst + got : nullptr, n - got);
      } catch (const io::HttpError& e) {
        if (e.status() != 416) throw;  // 416: nothing past the byte reached
      }
      offset += more;
      got += more;
      if (got == n || offset == asked) co_return got;  // done, or nothing gained since asked
      open_body();
    }
  }

  /// Reads `n` bytes, kept when a sample is open; a body that ends first is a torn shard.
  Task<void> take(std::uint64_t n, std::string member, std::uint64_t header, const char* what) {
    while (n > 0) {
      const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(n, piece));
      std::byte* dst = nullptr;
      if (open) {
        raw.resize(raw.size() + k);  // grows only as bytes arrive, piece by piece
        dst = raw.data() + raw.size() - k;
      }
      if (co_await read(dst, k) < k) {
        throw ShardError(url, member, header,
                         std::string("the archive ends inside ") + what +
                             " (a torn or truncated shard)");
      }
      n -= k;
    }
  }
  /// Reads an extended header's data (a long name, pax records), bounded by the limits.
  Task<std::vector<std::byte>> extended(std::uint64_t size, std::uint64_t header,
                                        const char* what, TarLimits limits) {
    if (size > limits.max_extended_header) {
      throw ShardError(url, "", header,
                       std::string(what) + " of " + std::to_string(size) +
                           " bytes exceeds the limit of " +
                           std::to_string(limits.max_extended_header));
    }
    const std::size_t before = raw.size();
    const bool was_open = open;
    std::vector<std::byte> data(static_cast<std::size_t>(size));
    open = true;  // read into raw, then moved out
    co_await take(size, "", header, what);
    std::memcpy(data.data(), raw.data() + before, data.size());
    if (!was_open) raw.resize(before);
    open = was_open;
    co_return data;
  }
};

}  // namespace

AsyncGenerator<ShardSample> stream_unindexed(std::shared_ptr<io::HttpClient> client,
                                             std::string url, std::size_t window,
                                             io::RetryOptions retry, TarLimits limits,
                                             std::optional<std::uint64_t> end_known,
                                             std::uint64_t* end_found) {
  Walk w;
  w.client = std::move(client);
  w.url = url;
  w.window = window;
  w.retry = retry;
  w.open_body();
  std::string key, field, name;
  std::optional<std::string> long_name;
  PaxRecords pax;
  std::uint64_t first_header = 0;
  bool pending = false;  // an extended header waits for its member
  // The open sample.
  ShardSample cur;
  std::uint64_t begin = 0, end = 0;
  std::set<std::string> names;
  const auto flush = [&] {
    ShardSample out = std::move(cur);
    out.shard = url;
    out.data = io::Buffer(static_cast<std::size_t>(end - begin));
    std::memcpy(out.data.data(), w.raw.data(), out.data.size());
    w.raw.clear();
    w.open = false;
    cur = ShardSample{};
    names.clear();
    return out;
  };
  std::byte block[tar_block];
  for (;;) {
    const std::uint64_t at = w.offset;
    // Where an earlier read found the end block, its bytes failing are the archive's end:
    // everything before them was read, so the sample being gathered has all its members.
    // A body that ends there cleanly is not the same: the shard now ends where its end block
    // was (rewritten since), and is a torn archive as any other.
    const bool at_known_end = end_known && at == *end_known;
    std::size_t got = 0;
    try {
      got = co_await w.read(block, tar_block);
    } catch (const io::HttpError&) {
      if (!at_known_end) throw;
      break;
    }
    if (got < tar_block) {
      throw ShardError(url, long_name.value_or(pax.path.value_or("")), at,
                       got == 0 ? "the archive ends without its end-of-archive block "
                                  "(a torn or truncated shard)"
                                : "truncated header (" + std::to_string(got) +
                                      " of 512 bytes; a torn or truncated shard)");
    }
    if (w.open) w.raw.insert(w.raw.end(), block, block + tar_block);  // trimmed if not its
    std::optional<TarHeader> h;
    try {
      h = parse_tar_header(block);
    } catch (const TarFormatError& e) {
      throw ShardError(url, long_name.value_or(pax.path.value_or("")), at, e.what());
    }
    if (!h) {  // end of archive
      if (end_found) *end_found = at;
      break;
    }
    if (!pending) first_header = at;
    // A pax header's size is its member's: an extended header between the two (a global
    // one, a GNU long name, another pax header) has its own, as tarfile reads them.
    const bool member = h->type == TarEntryType::file || h->type == TarEntryType::other;
    const std::uint64_t size = member ? pax.size.value_or(h->size) : h->size;
    name = pax.path ? *pax.path : long_name ? *long_name : h->name;
    switch (h->type) {
      case TarEntryType::gnu_long_name: {
        const auto data = co_await w.extended(size, at, "GNU long name", limits);
        const char* p = reinterpret_cast<const char*>(data.data());
        long_name = std::string(p, strnlen(p, data.size()));
        co_await w.take(padding(size), "", at, "GNU long name");
        pending = true;
        continue;
      }
      case TarEntryType::pax_local: {
        const auto data = co_await w.extended(size, at, "pax header", limits);
        try {
          parse_pax_records(data, pax);
        } catch (const TarFormatError& e) {
          throw ShardError(url, "", at, e.what());
        }
        co_await w.take(padding(size), "", at, "pax header");
        pending = true;
        continue;
      }
      case TarEntryType::gnu_long_link:
        co_await w.take(size, "", at, "GNU long link");  // apart: a pax size near 2^64 wraps
        co_await w.take(padding(size), "", at, "GNU long link");
        pending = true;
        continue;
      case TarEntryType::pax_global:
        // Records for the rest of the archive, ignored here as in walk_tar (tarfile applies
        // their path and size to later members; shards carry none): a long name or pax header
        // before it still names the member after it, as in walk_tar and tarfile.
        co_await w.take(size, "", at, "pax global header");
        co_await w.take(padding(size), "", at, "pax global header");
        continue;
      case TarEntryType::file:
        if (split_member_name(name, key, field)) {
          if (w.open && key != cur.key) co_yield flush();
          if (!w.open) {
            w.open = true;
            w.raw.clear();
            cur.key = key;
            begin = w.offset;
          }
          if (!names.insert(field).second) {
            throw ShardError(url, name, first_header,
                             "duplicate field '" + field + "' in sample '" + key + "'");
          }
          cur.fields.push_back(ShardField{field, static_cast<std::size_t>(w.offset - begin),
                                          static_cast<std::size_t>(size)});
          co_await w.take(size, name, first_header, "a member's data");
          end = w.offset;
          co_await w.take(padding(size), name, first_header, "a member's padding");
          break;
        }
        [[fallthrough]];  // metadata or a name without a field: skipped, as an index skips it
      default:  // other entries: skipped
        co_await w.take(size, name, first_header, "an entry's data");
        co_await w.take(padding(size), name, first_header, "an entry's data");
        break;
    }
    long_name.reset();
    pax = PaxRecords{};
    pending = false;
  }
  if (w.open) co_yield flush();
}

}  // namespace coload::shards::detail
