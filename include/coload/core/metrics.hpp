#pragma once
// The metrics and trace hooks every stage records into: stages, fixed log-bucket histograms,
// per-thread shards (shared with forked worker processes), StageTimer, and the trace writer.

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace coload {

/// The stages of the pipeline, in the order a sample meets them. `read` is what a dataset's
/// `get` spends outside any finer stage it marks itself (a plain dataset's whole `get`), and
/// for asynchronous reads (record_read) the time a thread waited on them, counted once however
/// many were in flight: each read's own latency is recorded apart (Shard::read_latency).
enum class Stage : std::uint8_t { sample, read, decode, transform, collate, pin, copy, wait };
inline constexpr std::size_t stage_count = 8;

/// The stage's name as the metrics and the trace spell it ("sample", "read", ...).
std::string_view stage_name(Stage stage) noexcept;

namespace detail {

/// Nanoseconds on the steady clock (system-wide: the same in forked worker processes).
inline std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Histogram buckets: four per power of two of nanoseconds (quarter octaves, about 19% wide).
inline constexpr std::size_t histogram_buckets = 256;
constexpr std::size_t bucket_of(std::uint64_t ns) noexcept {
  if (ns < 4) return static_cast<std::size_t>(ns);
  const int b = std::bit_width(ns) - 1;  // >= 2
  const auto sub = static_cast<std::size_t>((ns >> (b - 2)) & 3u);
  return static_cast<std::size_t>(b) * 4 + sub;
}
/// The middle of bucket `i`, in nanoseconds.
double bucket_mid_ns(std::size_t i) noexcept;

/// One stage's figures in one shard: spans, their total, and their histogram (of the mean per
/// item, weighted by the items, when a span covers several).
struct StageCell {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> ns{0};
  std::array<std::atomic<std::uint64_t>, histogram_buckets> buckets{};
};

/// What one thread (a worker, the driver, the consumer) records. Relaxed atomics: each shard
/// has one writer in practice, so the adds never contend; readers merge at snapshot time.
struct alignas(64) Shard {
  std::array<StageCell, stage_count> stages{};
  /// Each read's latency, from its start to its data in the reader's hands (record_read, and
  /// StageTimer spans of `read`). Reads overlap, so only the count and the histogram mean
  /// anything: the sum is no one's time.
  StageCell read_latency{};
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> samples{0};  ///< samples fetched into batches
  std::atomic<std::int32_t> pid{0};       ///< the process that last wrote here
  /// Asynchronous reads that this shard's role started (read_begin) and has not recorded yet
  /// (record_read); and up to when the role's time is accounted for: a StageTimer span's end,
  /// or the last read completion recorded here (the wait before it counted as `read`). A
  /// completion counts only the time since then, so that reads in flight together count once,
  /// and never the time of a stage of its own. State, not figures: never merged; written by
  /// the role's thread (the driver's, whichever thread runs it), reset when another process
  /// takes the shard (a restarted worker).
  std::atomic<std::uint64_t> reads_in_flight{0};
  std::atomic<std::uint64_t> accounted_ns{0};

  /// Seconds that belong to `s` but make no span of their own (what a `get` spent outside the
  /// finer stages it marked).
  void add_ns(Stage s, std::uint64_t ns) noexcept {
    stages[static_cast<std::size_t>(s)].ns.fetch_add(ns, std::memory_order_relaxed);
  }
  void add(Stage s, std::uint64_t ns, std::uint64_t items = 1) noexcept {
    add_to(stages[static_cast<std::size_t>(s)], ns, items);
  }
  /// One read's latency (start to completion).
  void add_read_latency(std::uint64_t ns) noexcept { add_to(read_latency, ns, 1); }
  /// The role's time up to `end_ns` is accounted for (a span of a stage ended then): a read
  /// completing later counts as waiting only the time after it.
  void account_until(std::uint64_t end_ns) noexcept {
    if (accounted_ns.load(std::memory_order_relaxed) < end_ns) {
      accounted_ns.store(end_ns, std::memory_order_relaxed);
    }
  }

 private:
  static void add_to(StageCell& c, std::uint64_t ns, std::uint64_t items) noexcept {
    c.count.fetch_add(items, std::memory_order_relaxed);
    c.ns.fetch_add(ns, std::memory_order_relaxed);
    c.buckets[bucket_of(items > 1 ? ns / items : ns)].fetch_add(items, std::memory_order_relaxed);
  }
};

/// A merged copy of shards (plain numbers), as a snapshot takes it.
struct StageTotals {
  std::uint64_t count = 0;
  std::uint64_t ns = 0;
  std::array<std::uint64_t, histogram_buckets> buckets{};
  void add(const StageCell& c) noexcept;
  void subtract(const StageTotals& base) noexcept;
  /// The `q` quantile (0..1) in milliseconds, from the buckets; 0 without spans.
  double quantile_ms(double q) const noexcept;
};
struct ShardTotals {
  std::array<StageTotals, stage_count> stages{};
  StageTotals read_latency;
  std::uint64_t bytes_read = 0;
  std::uint64_t samples = 0;
  std::int32_t pid = 0;
  void add(const Shard& s) noexcept;
  void subtract(const ShardTotals& base) noexcept;
  /// Nanoseconds of work recorded on this shard (every stage but wait).
  std::uint64_t busy_ns() const noexcept;
};

class Tracer;

/// A loader's recorder: one shard per role (consumer, driver, worker 0..n-1, and one shared by
/// any other thread), in a shared mapping of a memfd made before any worker process is forked,
/// so that a forked worker's figures reach the parent without a message; a worker forked by
/// the fork server maps the same memfd, sent to it (Joined). Optional trace.
class Recorder {
 public:
  static constexpr int consumer = -2;
  static constexpr int driver = -1;

  /// `workers`: how many worker shards (ids beyond share the last shard). `trace_path`: empty
  /// for no trace.
  Recorder(int workers, bool enabled, const std::string& trace_path);
  /// What a fork-server worker needs to record into its parent's recorder.
  struct Joined {
    int fd = -1;                  ///< the parent's memory_fd() (mapped, then closed here)
    int workers = 0;
    bool enabled = false;
    std::string trace_path;       ///< empty: no trace
    std::uint64_t trace_base_ns = 0;
  };
  /// The parent's recorder as seen from a fork-server worker: its shards (mapped, not
  /// constructed) and its trace file (appended to on the parent's clock).
  explicit Recorder(const Joined& joined);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  bool enabled() const noexcept { return enabled_; }
  Tracer* tracer() const noexcept { return tracer_.get(); }
  /// The memfd holding the shards (-1 where memfd_create failed and the mapping is anonymous,
  /// or in a worker that joined), to send to a fork-server worker.
  int memory_fd() const noexcept { return fd_; }
  /// What a fork-server worker needs to join this recorder (fd: memory_fd()).
  Joined joined() const;
  int shard_count() const noexcept { return count_; }
  /// The shard of role `who` (consumer, driver, or a worker id).
  Shard& shard(int who) noexcept;
  /// Shard `i` as stored (0 consumer, 1 driver, 2 + worker id, the last: any other thread).
  const Shard& at(int i) const noexcept { return shards_[i]; }
  /// Worker id of stored shard `i` (-2 consumer, -1 driver, -3 other).
  int role_of(int i) const noexcept;

  /// Makes the calling thread record into role `who`'s shard (and its trace track).
  void bind_thread(int who) noexcept;
  /// In a forked worker process: forget the parent's unwritten trace events.
  void after_fork() noexcept;

  // Driver-side counters.
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> occupancy_sum{0};  ///< in-flight batches, summed at each dispatch
  std::atomic<std::uint64_t> occupancy_n{0};
  std::atomic<std::uint64_t> bound_sum{0};      ///< the in-flight bound, summed at each dispatch
  std::atomic<std::uint64_t> workers_sum{0};    ///< worker count, summed at each dispatch

 private:
  bool enabled_;
  int workers_;
  int count_;
  Shard* shards_ = nullptr;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  bool owner_ = true;  // constructs and destroys the shards (false in a joined worker)
  std::unique_ptr<Tracer> tracer_;
};

/// Where the calling thread records: its recorder and shard (null: nowhere), its trace track.
struct ThreadRecording {
  Recorder* recorder = nullptr;
  Shard* shard = nullptr;
  int track = 0;
  /// Nanoseconds that finer stages (StageTimer) recorded on this thread: the loader subtracts
  /// them from the `get` that contained them.
  std::uint64_t nested_ns = 0;
};
ThreadRecording& thread_recording() noexcept;

/// The trace writer: Chrome trace-event JSON ("[" then one event per line), streamed to the
/// file in chunks of at most `chunk` bytes, so memory stays bounded whatever the run's length.
/// Worker processes append to the same file (O_APPEND, whole lines per write()).
class Tracer {
 public:
  static constexpr std::size_t chunk = 256 * 1024;
  explicit Tracer(const std::string& path);
  /// A fork-server worker's writer to its parent's file: appends, on the parent's clock
  /// (`base_ns`, the parent's base_ns()), and never opens or closes the array.
  Tracer(const std::string& path, std::uint64_t base_ns);
  ~Tracer();  ///< writes what is left and closes the array
  std::uint64_t base_ns() const noexcept { return base_ns_; }
  /// A complete span ("X") on `track` of this process; `arg_name` = `arg` when arg >= 0.
  void span(std::string_view name, int track, std::uint64_t begin_ns, std::uint64_t end_ns,
            const char* arg_name = nullptr, std::int64_t arg = -1);
  /// An asynchronous span ("b"/"e", its own row): reads and copies, which overlap.
  void async_span(std::string_view name, std::uint64_t id, std::uint64_t begin_ns,
                  std::uint64_t end_ns, const char* arg_name, std::int64_t arg);
  /// An instant event ("i") on `track`.
  void instant(std::string_view name, int track, std::uint64_t at_ns, const char* arg_name,
               std::int64_t arg);
  /// Names `track` of this process (once per process and track).
  void name_track(int track, std::string_view name);
  /// Writes the buffered events now (a worker process, after each task).
  void flush();
  void after_fork() noexcept;
  const std::string& path() const noexcept { return path_; }

 private:
  void append(const std::string& line);
  void write_locked();
  void lock() noexcept {
    while (lock_.exchange(true, std::memory_order_acquire)) {
    }
  }
  void unlock() noexcept { lock_.store(false, std::memory_order_release); }
  std::string path_;
  int fd_ = -1;
  int owner_;  ///< the process that closes the array
  std::uint64_t base_ns_;
  std::atomic<bool> lock_{false};
  std::string buffer_;
  std::array<bool, 256> named_{};
};

}  // namespace detail

/// Times a stage of your own inside a dataset's `get` (decode, transform, ...): from
/// construction to destruction, recorded into the loader's metrics and its trace when the
/// calling thread fetches for a loader, and subtracted from that `get`'s `read`. Costs one
/// branch outside a loader.
class StageTimer {
 public:
  explicit StageTimer(Stage stage) noexcept : stage_(stage) {
    auto& r = detail::thread_recording();
    if (r.shard) begin_ = detail::now_ns();
  }
  ~StageTimer() { stop(); }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  /// Ends the span now (once).
  void stop() noexcept;

 private:
  Stage stage_;
  std::uint64_t begin_ = 0;
};

/// Records `bytes` read by the calling thread (a dataset's own reads).
void record_bytes_read(std::uint64_t bytes) noexcept;

/// Records an asynchronous read of `bytes` (for sample `index`) that began at `begin_ns`
/// (read_begin(), on a thread of the same role) and completed now (or failed: `bytes` 0), on
/// the thread that saw it complete; every read_begin() that returned non-zero needs one.
/// Reads overlap, so each one's latency goes to Shard::read_latency (and the trace shows it as
/// an asynchronous span on its own row), while `read` gets only the time the role (the
/// thread's shard) had reads in flight since it last recorded anything: a worker process
/// waiting on its batch's reads is busy reading for that long, once, not for the sum of their
/// latencies. A read begun in another role counts its wall time from `begin_ns`, within the
/// same bound.
void record_read(std::uint64_t begin_ns, std::uint64_t bytes, std::int64_t index) noexcept;
/// Starts an asynchronous read on the calling thread: detail::now_ns() when it records for a
/// loader (the read's `begin_ns` for record_read), else 0 (no clock read).
std::uint64_t read_begin() noexcept;

}  // namespace coload
