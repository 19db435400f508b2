#pragma once
// ShardStream: tar shards as an iterable dataset, each shard read sequentially in large
// chunks kept ahead, shards shuffled per epoch and split across ranks and workers, a seeded
// shuffle buffer, and exact resume.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coload/core/worker_info.hpp"
#include "coload/coro/async_generator.hpp"
#include "coload/coro/generator.hpp"
#include "coload/shards/dataset.hpp"

namespace coload::shards {

/// Settings of a ShardStream; an aggregate, set with designated initialisers.
struct ShardStreamOptions {
  /// How shards are indexed and opened (`direct` reads them with O_DIRECT).
  ShardOptions shards{};
  /// Shuffle the shards each epoch (from the loader's epoch seed, the same in every worker).
  bool shuffle_shards = true;
  /// Samples held in the shuffle buffer; 0 or 1 yields each shard's samples in order.
  std::size_t shuffle_buffer = 0;
  /// Bytes of one sequential read; the next one is already in flight while a chunk is used.
  /// At most 1 GiB, as `read_ahead` (InvalidArgument naming the option).
  std::size_t read_size = 16 << 20;
  /// Shards named by http(s) URL: the bytes received ahead of the samples handed out, in all.
  /// Two shards are in flight (the one being read and the next, so that its first bytes
  /// overlap this one's tail), each holding at most half of this (at least 64 KiB), plus one
  /// receive buffer (256 KiB: curl hands over what one read of the socket brought before the
  /// transfer pauses). io::HttpClient::read_ahead_peak() measures it. A shard found in the
  /// cache is read as a local one is, in `read_size` chunks.
  std::size_t read_ahead = 64 << 20;
  /// A remote shard that fails for good (see io::RetryOptions) ends the stream with an
  /// io::HttpError naming its URL, status, attempts and samples, and one without an index whose
  /// body is no archive (cut short, or altered) with a ShardError naming it, as a local shard
  /// that cannot be opened or read (SystemError) or ends inside a sample (ShardError) ends it
  /// with its error; with this set (or the loader's `on_error = skip`, see set_error_policy), a
  /// warning says so instead, its samples not yet read count in skipped_samples(), and the
  /// stream goes on with the next shard.
  bool skip_failed_shards = false;
};

/// Tar shards in the WebDataset layout as an iterable dataset yielding ShardSample.
///
/// Each epoch the shards are put in an order drawn from the loader's epoch seed (the same in
/// every worker and, with LoaderOptions::seed set alike, on every rank: set it when training
/// with several ranks) and dealt out: shard `k` of that order goes to the worker whose
/// `WorkerInfo::shard_id()` is `k % num_shards()`, so across ranks × workers every sample is
/// streamed exactly once. A worker reads its shards one after another, each from start to end
/// in chunks of `read_size` with the next chunk read ahead on a helper thread; samples pass
/// through a shuffle buffer seeded from the epoch seed and the worker's shard id.
///
/// Shards by URL are read through an io::HttpClient: in a loader, the one on its driver
/// (set_driver), so that a worker waiting for bytes holds no thread: the stream is an
/// AsyncGenerator whose waits go on in the driver's handlers, and the worker only copies out
/// and parses bytes that have arrived. Read-ahead is bounded in shards (the one being read and
/// the next) and in bytes (`read_ahead`). Outside a loader the process's own client is used
/// (samples() waits for it on the calling thread).
///
/// Exact resume: `state()` names the worker's position (its shard, the next sample, the
/// shuffle buffer's samples and its random state) after the samples yielded so far;
/// `load_state()` makes the next stream() continue from there, re-reading the buffered samples
/// with ranged reads: nothing is lost, nothing repeated. With process workers the loader
/// cannot carry per-worker state and replays each worker's stream up to the saved batch
/// instead (deterministic, so still exact). A position inside a shard by URL without an index
/// resumes by streaming that shard again from its start and dropping the samples already
/// handed out (an archive's order is fixed); a state whose shuffle buffer holds samples of such
/// a shard cannot be re-read, and load_state refuses it.
class ShardStream {
 public:
  using sample_type = ShardSample;

  /// The shards of `root` (a `.tar` file or a folder of them).
  explicit ShardStream(const std::filesystem::path& root, ShardStreamOptions options = {});
  /// The given shards. A shard by URL whose index is not found (404) is streamed by its tar
  /// headers; so is one named by a URL with a query (a presigned URL, whose signature covers
  /// that shard alone) whose index is refused (403). Once this stream (or a copy, in this
  /// process) has read such a shard to its end-of-archive block, a later transfer of it that
  /// fails right at that block, every byte before it read, loses nothing: the last sample is
  /// whole, and is handed out.
  explicit ShardStream(std::vector<std::string> shards, ShardStreamOptions options = {});

  /// This worker's samples for the epoch whose seed `info` carries (what a loader streams).
  AsyncGenerator<ShardSample> stream(const WorkerInfo& info);
  /// The same samples for a plain loop: stream(), each sample waited for on this thread.
  Generator<ShardSample> samples(const WorkerInfo& info);

  /// The loader's driver, given by the loader before it starts each stream in this process:
  /// shards by URL are then read through io::HttpClient::on(ctx), so that no worker thread
  /// waits for the network. `ctx` must outlive the streams started after this call. Not given
  /// in a worker process (the process's own client is used there).
  void set_driver(asio::io_context& ctx) noexcept;

  /// Where this replica's stream stands (text; see the class comment).
  std::string state() const;
  /// Makes the next stream() continue from `state`; InvalidArgument when it is malformed,
  /// was taken over other shards (another list, order, or a shard rewritten: the state names
  /// the shards by their file names, sizes and sample counts, so the same shards moved to
  /// another folder or served by URL resume) or with other shuffle options, or names a
  /// position these shards do not have. A stream() of another epoch or worker split
  /// refuses it (InvalidArgument, at its first sample) and keeps it for the stream it is of;
  /// load_state("shard-stream 1 none") drops it.
  void load_state(const std::string& state);

  /// The loader's `on_error` and its count of skipped samples, given by the loader before it
  /// starts each stream: with OnError::skip a shard that fails for good is skipped as
  /// with `skip_failed_shards` (its URL and samples in the warning), and its samples not yet
  /// read count in `log` too (DataLoader::skipped()). `log` must outlive the streams.
  void set_error_policy(OnError on_error, coload::detail::SkipLog* log) noexcept {
    on_error_ = on_error;
    skip_log_ = log;
  }
  /// The samples this replica left out (`skip_failed_shards`, or the loader's `on_error =
  /// skip`), over all its epochs. A shard without an index that fails counts the samples it
  /// had left when its count is known (see total_samples()); otherwise its warning says the
  /// count is not known, and it adds nothing here.
  std::int64_t skipped_samples() const noexcept { return skipped_; }
  /// The samples over all shards, as far as they are known: a shard by URL without an index
  /// counts once this stream (or a copy of it, in this process) has streamed it to its end;
  /// before that it counts 0.
  std::int64_t total_samples() const noexcept;
  /// The shards worker `shard_id` of `num_shards` streams in the epoch of `epoch_seed`, in order.
  std::vector<std::size_t> shards_for(std::uint64_t epoch_seed, int shard_id,
                                      int num_shards) const;
  /// The map-style view of the same shards (their indices, ranged reads).
  const ShardDataset& dataset() const noexcept { return dataset_; }

  /// Where a worker's stream stands: what state() writes.
  struct Position {
    std::uint64_t epoch_seed = 0;
    int shard_id = 0;
    int num_shards = 1;
    std::size_t shard_pos = 0;  // in this worker's list of shards
    std::size_t sample = 0;     // the next sample of that shard to read
    std::uint64_t rng = 0;      // the shuffle buffer's random state
    std::vector<std::int64_t> buffer;  // global indices of the buffered samples, in slot order
  };

 private:
  static AsyncGenerator<ShardSample> run(ShardStream* self, WorkerInfo info);
  std::shared_ptr<io::HttpClient> client() const;

  struct Learned;  // the sample counts of shards without an index, once streamed whole
  ShardDataset dataset_;  // indices and files, shared by copies
  ShardStreamOptions options_;
  std::shared_ptr<Learned> learned_;  // shared by copies
  std::uint64_t fingerprint_;         // the shards, as state() names them
  // The loader's driver, in the process that set it. Not copied: a copy (a worker's replica,
  // which the loader gives its driver again, or a user's) must not outlive it holding it.
  struct DriverRef {
    asio::io_context* ctx = nullptr;
    long pid = 0;
    DriverRef() = default;
    DriverRef(const DriverRef&) noexcept {}
    DriverRef& operator=(const DriverRef&) noexcept {
      ctx = nullptr;
      pid = 0;
      return *this;
    }
  };
  DriverRef driver_;
  // This replica's latest stream's position, which that stream's coroutine moves; a later
  // stream() makes a new one. A copy of the replica takes a copy of it, not a share.
  struct Progress {
    std::shared_ptr<Position> at;
    Progress() = default;
    Progress(const Progress& o) : at(o.at ? std::make_shared<Position>(*o.at) : nullptr) {}
    Progress& operator=(const Progress& o) {
      at = o.at ? std::make_shared<Position>(*o.at) : nullptr;
      return *this;
    }
  };
  Progress progress_;
  std::optional<Position> resume_;    // from load_state, for the next stream()
  std::int64_t skipped_ = 0;
  OnError on_error_ = OnError::raise;
  coload::detail::SkipLog* skip_log_ = nullptr;  // the loader's, while it streams
};

}  // namespace coload::shards
