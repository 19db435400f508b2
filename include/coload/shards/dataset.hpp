#pragma once
// ShardSample, and ShardDataset: the samples of tar shards as a map-style dataset, each
// sample fetched with one ranged read.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coload/core/index.hpp"
#include "coload/coro/task.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/io/buffer.hpp"
#include "coload/io/http.hpp"
#include "coload/shards/index.hpp"

namespace coload::io {
class Reader;
}  // namespace coload::io

namespace coload::shards {

/// One field of a ShardSample: its name and where its bytes lie in the sample's buffer.
struct ShardField {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// One WebDataset sample: its key (`__key__`), the shard it came from, and its fields, whose
/// bytes share one buffer (the sample was read with one read). Move-only.
struct ShardSample {
  std::string key;
  std::string shard;
  std::vector<ShardField> fields;
  io::Buffer data;

  /// The field called `name`, or nullptr.
  const ShardField* find(std::string_view name) const noexcept;
  /// The bytes of field `name`; throws OutOfRange naming the key, shard and fields present
  /// when the sample has no such field.
  std::span<const std::byte> field(std::string_view name) const;
  /// The field's bytes as text (cls, txt, json).
  std::string text(std::string_view name) const;
};

/// How a ShardDataset or ShardStream opens and reads its shards.
struct ShardOptions {
  /// How each shard's index is found (the file beside it, rebuilt when stale).
  IndexOptions index{};
  /// Open the shards with O_DIRECT (cold storage: no page cache), falling back to buffered
  /// reads for a file system that refuses it. Reads are then aligned to io::Buffer::alignment.
  bool direct = false;
  /// A local cache of shards named by URL (off while `cache_dir` is empty or `cache_bytes` 0):
  /// a shard streamed whole is kept in `cache_dir` (its bytes up to its last sample's end), and
  /// later epochs, streamed or map-style, read it from there. Map-style reads (read,
  /// read_async, a DataLoader's batches), which fetch samples alone, fill it too: each shard
  /// they touch is fetched whole (one GET, a background thread of the dataset's own, one shard
  /// at a time) while its samples are still read by ranged GETs, when all the dataset's shards
  /// by URL fit `cache_bytes` (else each epoch would fetch shards twice only to evict them),
  /// and never by evicting an entry used since the dataset was made (another dataset's on the
  /// same folder: where the folder is too small for both, the shards that do not fit beside
  /// the entries of the one read first are read by ranged GETs, and not cached);
  /// in a process worker they do not (the fetch thread is the parent's: a warning says so,
  /// once a process; call cache_fill() in the parent instead). cache_wait() (or cache_wait_for) waits
  /// for those fetches. The entries' bytes stay within
  /// `cache_bytes`, the least recently used evicted first; an entry is used only when its size
  /// is the index's and, when the index records a checksum (coload-shard's do), when its bytes
  /// hash to it (checked at a dataset's first use of the entry, and again if the file changes;
  /// a mismatch warns, naming the entry and the URL, and the shard is fetched again). Entries
  /// are written under a temporary name and renamed, so workers and processes may share the
  /// folder; one writer fetches an entry at a time (a lock file `.coload-fetch-<entry>` while
  /// it does), so that ranks on one node do not each fetch every shard. Only the cache's own files (named by a hash of the URL) are counted and evicted:
  /// the folder may hold others. Room for an entry is made as its fetch starts, and its
  /// unfinished file counts against the bound at its full size (a sparse file of that size
  /// from the start), so the bound holds while shards download; a shard whose room other
  /// writers' unfinished entries hold is not cached that time. An unfinished entry is removed
  /// once its process has gone (killed mid-shard). Shards without an index are
  /// not cached (nothing could verify them). A `cache_dir` that is a file is refused
  /// (InvalidArgument); one that cannot be made or written, or a full disk, warns once, naming
  /// the folder and the error, and the shards are read from their URLs. A commit tries the
  /// folder's lock for about a quarter second (it runs on the loader's driver): an entry whose
  /// lock stays held by another process is not kept that time, with a warning.
  std::string cache_dir{};
  std::uint64_t cache_bytes = 0;
  /// How every request for shards named by URL (the shard list, the indices, the shards'
  /// bytes) retries its faults; checked when the dataset is made, an error naming
  /// "ShardOptions::retry.<field>".
  io::RetryOptions retry{};
};

/// The samples of tar shards in the WebDataset layout as a map-style dataset: sample `i` is
/// the `i`-th sample counting through the shards in order (a folder's `.tar` files sorted by
/// name). Indices, samplers, DistributedSampler, per-sample determinism and resume work as
/// for any map-style dataset.
///
/// Each sample is fetched with one ranged read from the first member's data to the last
/// member's end (the headers between come along), through the loader's reader (`get_async`:
/// io_uring, without holding a worker) or with pread (`get`). Shard files are opened once,
/// lazily, and shared by copies of the dataset (thread workers) and inherited by forked ones.
class ShardDataset {
 public:
  using sample_type = ShardSample;

  /// Indexes the shards of `root` (a `.tar` file or a folder of them; see find_shards). A shard
  /// by URL must have its index beside it (`NAME.tar.idx`, which coload-shard writes): a
  /// missing one is an io::HttpError (404) saying so (ShardStream reads shards without one).
  explicit ShardDataset(const std::filesystem::path& root, ShardOptions options = {});
  /// Indexes the given shards, in this order.
  explicit ShardDataset(std::vector<std::string> shards, ShardOptions options = {});

  /// The number of samples over all shards.
  std::int64_t size() const noexcept;
  /// Sample `index`, read with pread on the calling thread (negative indices count from the
  /// end; OutOfRange outside).
  ShardSample get(Index index, SampleContext& ctx) const;
  /// Sample `index`, read through `ctx.io` (the loader's reader) when there is one.
  Task<ShardSample> get_async(Index index, SampleContext& ctx) const;

  /// Sample `index` read with pread.
  ShardSample read(Index index) const;
  /// Sample `index` read with pread from its local file or the cache's copy of its shard;
  /// nothing when it is only on its server (not cached, or the copy evicted or unreadable
  /// since it was found): for a caller that then fetches it without holding its thread.
  std::optional<ShardSample> read_local(Index index) const;
  /// Samples `indices`, in that order. For shards named by URL, samples of one shard whose
  /// byte ranges lie within `gap` bytes of each other are fetched with one ranged GET (the
  /// bytes between come along), and every GET of the batch is in flight at once; local and
  /// cached samples are read with pread, one each (and uncached shards queued for the cache,
  /// as read() does).
  std::vector<ShardSample> read_batch(std::span<const Index> indices,
                                      std::uint64_t gap = 64 << 10) const;
  /// Sample `index` read through `reader` (which must outlive the task).
  Task<ShardSample> read_async(io::Reader& reader, Index index) const;
  /// For a DataLoader's batch fetch: the samples of `indices` to read together with
  /// prefetch_async, as positions in `indices`: those of one shard on an HTTP(S) server (not
  /// in the cache), in the shard's order, at least 2 and at most `max_parts` a group. A
  /// position in no group (a local or cached sample, the only one of its shard, a repeat) is
  /// read_async's.
  std::vector<std::vector<std::size_t>> remote_groups(std::span<const Index> indices,
                                                      std::size_t max_parts = 8) const;
  /// One group of remote_groups with one multi-range GET (HttpClient::get_ranges_async;
  /// neighbours at most `gap` bytes apart asked as one range) on `reader`'s io_context.
  /// Entry j is the sample at indices[group[j]] when it arrived whole, and empty when the
  /// answer did not complete it: read_async reads that one (with its retries, and the error
  /// that names the URL), so a fault here costs a request, never a sample.
  Task<std::vector<std::optional<ShardSample>>> prefetch_async(io::Reader& reader,
                                                               std::span<const Index> indices,
                                                               std::vector<std::size_t> group,
                                                               std::uint64_t gap = 4096) const;

  /// Which shard, and which sample of it, global index `index` is.
  struct Location {
    std::size_t shard = 0;
    std::size_t sample = 0;
  };
  Location locate(Index index) const;
  /// The global index of the first sample of each shard, and the total at the end.
  const std::vector<std::int64_t>& offsets() const noexcept;
  /// Every shard's index, in order.
  const std::vector<ShardIndex>& shards() const noexcept;
  /// The options.
  const ShardOptions& options() const noexcept;
  /// Waits until the shards that map-style reads have queued for the cache are in it (or were
  /// given up): then a later epoch reads them from disk. At once without a cache, or where the
  /// cache does not fill behind map-style reads (see ShardOptions::cache_dir).
  void cache_wait() const;
  /// cache_wait() for at most `timeout`: whether those fetches were done with by then.
  bool cache_wait_for(std::chrono::milliseconds timeout) const;
  /// Queues every shard by URL for the cache, as map-style reads queue those they touch, and
  /// returns at once (those already in it are found so by the fetch thread, and not fetched);
  /// cache_wait() waits for them. A shard whose fetch failed is asked again by a later read
  /// or a later cache_fill(), up to three fetches (so call it each epoch). With worker processes, whose reads fill nothing, call it in
  /// the parent (before the workers start: their reads then do not warn that they fill
  /// nothing); or call it to fill the cache before training. Nothing where the cache does not
  /// fill behind map-style reads (see ShardOptions::cache_dir); in a forked child, a warning.
  void cache_fill() const;
  /// Whether shard `s` has an index: always, but in a ShardStream's view of shards by URL,
  /// where one without (its samples unknown until streamed) has none.
  bool indexed(std::size_t s) const noexcept;

  struct State;

 private:
  friend class ShardStream;
  // ShardStream's view: a shard by URL whose index is missing (404), or refused (403) to a URL
  // with a query (a presigned URL's signature covers its shard alone), is kept, without
  // samples.
  struct AllowUnindexed {};
  ShardDataset(std::vector<std::string> shards, ShardOptions options, AllowUnindexed);
  static ShardDataset streamed(const std::filesystem::path& root, const ShardOptions& options);
  std::shared_ptr<State> state_;
};

/// The text of the file `name` in the folder of the shards `root` names: a folder, one shard,
/// a brace pattern (its first name's folder), or the URL of one (an http(s) URL's query
/// carried, as find_shards carries it); e.g. the classes.txt coload-shard writes beside its
/// shards. std::nullopt when that file is not there (a 404; for s3://, a 403 too, which S3
/// answers for a missing key to a reader who may not list the bucket). A file longer than
/// `limit` bytes is an io::HttpError by URL and an InvalidArgument by path; another failure
/// an io::HttpError or SystemError naming the URL or path.
std::optional<std::string> read_beside_shards(std::string_view root, std::string_view name,
                                              std::uint64_t limit = 16 << 20,
                                              const io::RetryOptions& retry = {});

namespace detail {
/// The byte range one read of a sample covers ([begin, end) of the shard, aligned for direct
/// reads when `align` > 1) and the sample with its fields placed in that range.
struct SampleRead {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};
SampleRead sample_range(const IndexSample& sample, std::uint64_t file_size, std::size_t align);
/// Fills `out`'s key, shard and fields for `sample` of `index`, whose bytes start at file
/// offset `begin` in `out.data`.
void place_fields(const ShardIndex& index, const IndexSample& sample, std::uint64_t begin,
                  ShardSample& out);
}  // namespace detail

}  // namespace coload::shards
