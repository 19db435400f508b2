#pragma once
// Writer: packs samples into tar shards of a target size in the WebDataset layout, with their
// index files; pack() packs any map-style dataset, optionally in a seeded order.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coload/shards/index.hpp"

namespace coload::shards {

/// One field of a sample to write: its name (the extension, "jpg", "cls") and its bytes.
struct WriteField {
  std::string name;
  std::span<const std::byte> data;
};

/// Settings of a Writer; an aggregate, set with designated initialisers.
struct WriterOptions {
  /// A shard is closed before a sample would take it past this many bytes (a sample larger
  /// than it gets a shard of its own).
  std::uint64_t shard_size = 64ull << 20;
  /// Shard file names: prefix, a zero-padded number from 0, ".tar" ("shard-000000.tar").
  std::string prefix = "shard-";
  /// Write each shard's index file beside it, and `shards.txt` (the shards' file names, one a
  /// line) in the folder: a folder served over HTTP has no listing, so a reader given the
  /// folder's URL learns its shards from that file.
  bool write_index = true;
  /// The mtime stored in every header (seconds): a fixed one makes shards reproducible.
  std::uint64_t mtime = 0;
  /// Record in the index where the restart intervals of each JPEG field ("jpg", "jpeg") lie,
  /// for those that have usable ones (see RestartIndex): crops of them then decode only the
  /// intervals they need. Costs a scan of the field's markers when written.
  bool index_restarts = true;
};

/// Writes samples into numbered tar shards in `folder` (created if missing), each a valid
/// ustar archive that `tar -tf`, Python's tarfile and webdataset read. A shard is written
/// under a temporary name and renamed when complete, so a reader never sees a torn one.
/// Not thread-safe.
class Writer {
 public:
  explicit Writer(std::filesystem::path folder, WriterOptions options = {});
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  /// Finishes the open shard (see finish); errors are swallowed here, so call finish().
  /// Destroyed by an exception's unwinding, it abandons instead (see abandon).
  ~Writer();

  /// Appends one sample: a member "<key>.<field>" per field, in the order given. Throws
  /// InvalidArgument for what a reader would not give back as written: an empty key, a key
  /// whose base name holds a dot, a member readers skip as webdataset's metadata
  /// (is_metadata_name: "__x__/k.jpg"), the key of the sample before (readers would join the two), no field, a field that is empty or
  /// holds a slash, or two fields of one name without regard to case (readers lowercase them);
  /// SystemError when writing fails.
  void write(std::string_view key, std::span<const WriteField> fields);
  /// Closes the open shard (end-of-archive blocks, rename, index file), writes `shards.txt`
  /// (with write_index) and returns the paths of every shard written. Nothing may be written after.
  std::vector<std::string> finish();
  /// Unless finish() has succeeded: removes what this writer wrote (its shards, their index
  /// files, the open shard, a shard list half written) and writes no shard list, so that a
  /// pack that failed leaves no folder that reads as a whole dataset (pack() abandons when a
  /// sample fails). Nothing may be written after; finish() then returns no shard. What cannot
  /// be removed stays.
  void abandon() noexcept;

  /// Samples written so far.
  std::int64_t samples() const noexcept { return samples_; }

 private:
  void open_next();
  void close_current();
  void write_manifest();
  /// Where write_manifest writes the shard list before its rename.
  std::filesystem::path manifest_tmp() const;

  std::filesystem::path folder_;
  WriterOptions options_;
  std::vector<std::string> written_;
  int fd_ = -1;
  std::string current_;     // final path of the open shard
  std::uint64_t offset_ = 0;
  std::vector<TarMember> members_;
  // The restart layouts of the open shard's JPEG members, by data offset (index_restarts).
  std::vector<std::pair<std::uint64_t, RestartIndex>> restarts_;
  std::vector<std::byte> staging_;
  std::int64_t samples_ = 0;
  std::string last_key_;  // the key of the sample written last
  bool finished_ = false;
  bool complete_ = false;  // finish() succeeded
  // Exceptions in flight when this was made: more at its destruction means it is unwinding.
  int uncaught_ = std::uncaught_exceptions();
};

/// The order pack() writes `n` samples in: 0..n-1, or a permutation drawn from `seed`
/// (Fisher-Yates over a splitmix64 stream: the same on every platform).
std::vector<std::int64_t> pack_order(std::int64_t n, std::optional<std::uint64_t> seed);

/// Packs `n` samples: for each index of pack_order(n, seed), `write_one(index, writer)` writes
/// that sample (any map-style dataset: get it and hand its fields to writer.write). Returns
/// the shards, after writer.finish(). Where a sample (or the finish) throws, abandons the
/// writer (Writer::abandon) and rethrows: a failed pack leaves none of its shards.
std::vector<std::string> pack(std::int64_t n, std::optional<std::uint64_t> seed, Writer& writer,
                              const std::function<void(std::int64_t, Writer&)>& write_one);

}  // namespace coload::shards
