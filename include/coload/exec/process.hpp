#pragma once
// Process workers: forked children that fetch and collate batches into a shared-memory arena
// mapped by the parent, and whose death the parent sees at once through a pidfd.

#include <asio/io_context.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "coload/collate/batch_allocator.hpp"
#include "coload/collate/wire.hpp"

namespace coload {

/// Where a loader's workers run (`LoaderOptions::executor`).
enum class Executor {
  threads,    ///< num_workers threads in this process (the default)
  processes,  ///< num_workers forked processes: a crash or a leak stays in the child
};

/// How worker processes start (`LoaderOptions::process_start`), as PyTorch's
/// multiprocessing_context.
enum class ProcessStart {
  /// Forked from the loader itself: the child is a copy of the program as it is, dataset and
  /// all. A lock another thread held at that moment stays locked in the child.
  fork,
  /// Forked from the fork server that start_forkserver() started at the top of main, before
  /// any thread: nothing is locked there. The dataset travels to the worker through the wire
  /// format (its type needs a coload::wire::Wire specialisation), worker_init_fn must be a
  /// plain function, and the collate an empty type.
  forkserver,
};

/// Starts the fork server for `process_start = forkserver`. Call it once, first thing in main,
/// while the program has no other thread; later calls do nothing. Throws std::system_error
/// when the server cannot be started.
void start_forkserver();
/// True once start_forkserver() has run in this process.
bool forkserver_running() noexcept;

/// What the loader does when a worker process dies (`LoaderOptions::on_worker_death`).
enum class OnWorkerDeath {
  raise,    ///< the batch it was fetching (or, idle, the next one) fails with WorkerDied; the
            ///< epoch ends after it
  restart,  ///< fork a new worker and fetch its batches again (up to max_worker_restarts)
};

namespace detail {

/// One message from the parent to a worker process.
struct ProcessTask {
  enum class Kind : std::uint32_t {
    fetch = 1,   ///< fetch and collate `indices` (map-style datasets)
    stream = 2,  ///< take up to `want` samples from the worker's stream (iterable datasets)
    stop = 3,    ///< exit once the task queue before this message is done
  };
  Kind kind = Kind::fetch;
  std::int64_t batch = 0;
  std::int64_t epoch = 0;
  /// The iteration (one per epoch begun, unique in the process) the task belongs to: a
  /// persistent worker's stream starts over when it changes.
  std::uint64_t run = 0;
  std::uint64_t worker_seed = 0;  ///< WorkerInfo::seed for this epoch
  std::uint64_t sample_seed = 0;  ///< the seed of every sample's Rng
  std::int64_t want = 0;          ///< stream: samples per batch
  std::vector<std::int64_t> indices;
};

/// What a worker process answers for one task.
struct ProcessReply {
  enum class Status : std::uint32_t {
    batch = 1,  ///< the batch is in the slot, `bytes` long
    empty = 2,  ///< no batch: every sample was skipped, or the stream had nothing left
    error = 3,  ///< the fetch threw: `error_*` describe it
  };
  Status status = Status::empty;
  std::int64_t batch = 0;
  std::uint64_t offset = 0;      ///< where the encoded batch starts in the slot
  std::uint64_t bytes = 0;       ///< bytes of the encoded batch in the slot, from `offset`
  std::uint64_t slot_bytes = 0;  ///< the slot's size now (a worker grows a slot that is too small)
  std::int64_t skipped = 0;      ///< samples left out under on_error = skip
  bool stream_over = false;      ///< stream: nothing follows this reply (error or end)
  std::int64_t error_index = -1;
  std::string error_what;        ///< the full WorkerError text made in the child
  std::string error_type;
  std::string error_message;
};

/// What a worker started by the fork server runs: `socket` is its link to the parent,
/// `payload` the memfd with what the loader sent it (the dataset, the options), `metrics` the
/// memfd of the loader's metrics shards (-1: none).
using ForkserverEntry = void (*)(int socket, int worker_id, int payload, int metrics);

/// A memfd of `size` bytes filled by `fill` (its mapping is 64-byte aligned), for a payload.
int payload_memfd(std::size_t size, const std::function<void(std::span<std::byte>)>& fill);
/// Maps payload memfd `fd` read-only for the rest of the process's life.
std::span<const std::byte> map_payload(int fd);

/// The child's side of its link to the parent: blocking, one task at a time. It is also the
/// BatchAllocator of the current task: collate output is carved from the front of the slot.
class ChildLink final : public BatchAllocator {
 public:
  explicit ChildLink(int socket) noexcept : socket_(socket) {}
  ChildLink(const ChildLink&) = delete;
  ChildLink& operator=(const ChildLink&) = delete;
  ~ChildLink() override;

  /// The next task; a stop message or the parent's end gives nullopt.
  std::optional<ProcessTask> next();
  /// BatchAllocator: `nbytes` from the current task's slot (grown as needed).
  void* allocate(std::size_t nbytes) override;
  /// Bytes handed out by allocate() for the current task, rounded up to 64.
  std::size_t allocated() const noexcept { return used_; }
  /// The current task's slot, grown to at least `bytes` bytes.
  std::span<std::byte> slot(std::size_t bytes);
  /// Answers the current task.
  void reply(ProcessReply reply);

 private:
  struct Mapping {
    int fd = -1;
    std::byte* data = nullptr;
    std::size_t populated = 0;  // bytes whose pages this process has faulted in
  };
  int socket_;
  std::int64_t slot_id_ = -1;
  std::size_t slot_bytes_ = 0;
  std::size_t used_ = 0;
  std::vector<Mapping> mappings_;  // by slot id
};

/// What a worker process does, as its owner (the loader) gives it to exec. exec runs the
/// child's loop: it reads each task, fetches it through `fetch` with the slot as the batch
/// allocator (BatchAllocatorScope), turns what `fetch` throws into the reply (EmptyBatch: an empty
/// reply; WorkerError: its fields; anything else: wrapped by wrap_current_exception as
/// "fetching" the task's batch, index -1; a stream task's error also ends its stream), clears the
/// worker info, reports the growth of `skipped` and sends the reply.
struct ChildWork {
  /// Runs once in each new child (after fork, or in a fork-server worker), with the worker's id,
  /// before its first task: release what belongs to the parent, build the child's own context.
  /// What it throws ends the child with status 70. May be empty.
  std::function<void(int worker_id)> start;
  /// Fetches one task into `reply`, whose `batch` is set and `status` is `empty`: encode the
  /// batch into the slot with encode_batch(), or leave the reply empty (no batch), and set
  /// `stream_over` when a stream has nothing after this reply. May install the thread's worker
  /// info (detail::set_worker_info): the loop clears it after each task.
  std::function<void(const ProcessTask& task, ChildLink& link, ProcessReply& reply)> fetch;
  /// Samples left out so far in this child (on_error = skip); each reply carries how much it
  /// grew during its task. May be empty (no skips).
  std::function<std::int64_t()> skipped;
  /// Runs once after the last task (the parent's stop, or its end), before the child exits.
  /// May be empty.
  std::function<void()> finish;
};

/// The child's loop: serves the parent over `link` with `work` until a stop message or the
/// parent's end, then returns. Runs in the child; a fork-server entry calls it with a ChildLink
/// over its socket (a forked worker of a pool made with a ChildWork runs it by itself).
void run_child(ChildLink& link, int worker_id, const ChildWork& work);

/// Encodes `batch` into the current task's slot, after what collate already allocated there (the
/// tensors it made in the slot are written where they lie), and makes `reply` say so: status
/// `batch`, its offset in the slot and its bytes. Throws what wire::encode throws.
template <wire::Wireable B>
void encode_batch(ChildLink& link, const B& batch, ProcessReply& reply) {
  const std::size_t at = link.allocated();
  const std::size_t need =
      wire::encoded_size(batch, std::span<const std::byte>(link.slot(at)));
  reply.bytes = wire::encode(batch, link.slot(at + need), at);
  reply.offset = at;
  reply.status = ProcessReply::Status::batch;
}

/// A finished task as the parent sees it: the reply and, for a batch, the slot's bytes and a
/// lease that returns the slot when the last holder lets go.
struct ProcessResult {
  ProcessReply reply;
  int worker = -1;  ///< the worker that answered
  int pid = -1;     ///< its process id
  std::span<const std::byte> bytes;
  std::shared_ptr<void> lease;
};

/// The worker processes of one loader, driven from its driver thread. Tasks go to a worker
/// over a Unix socket (with the slot's memfd); replies and deaths are read on the driver's
/// io_context (the sockets and each child's pidfd), so a death is seen at once.
class ProcessPool {
 public:
  struct Options {
    int num_workers = 1;
    OnWorkerDeath on_death = OnWorkerDeath::raise;
    int max_restarts = 3;
    /// Seconds between SIGTERM and SIGKILL at shutdown.
    double grace = 2.0;
    /// Start workers from the fork server, running `entry` over `payload` (a memfd the pool
    /// then owns), instead of forking `main` from this process.
    ForkserverEntry entry = nullptr;
    int payload = -1;
    /// The memfd of the loader's metrics shards, sent to each fork-server worker (the pool
    /// does not own it; -1: none).
    int metrics = -1;
    /// Page-locks the parent's view of a slot's first `n` bytes (pin_memory), and undoes it;
    /// called as slots are mapped and grown, and before they are unmapped.
    std::function<void(void*, std::size_t)> pin_range;
    std::function<void(void*)> unpin_range;
  };

  /// Workers that run exec's child loop over `work` (see ChildWork).
  ProcessPool(asio::io_context& driver, Options options, ChildWork work);
  ProcessPool(const ProcessPool&) = delete;
  ProcessPool& operator=(const ProcessPool&) = delete;
  /// Kills and reaps whatever is still running (blocking).
  ~ProcessPool();

  /// Driver: forks every worker that is not running, and returns the generation of the
  /// workers now running. With `fresh` (an epoch of its own workers: no persistent workers),
  /// workers that an earlier start() forked and that still run (their epoch was broken off
  /// and has not finished yet) are asked to exit once their queued tasks are done, and new
  /// ones are forked in their place: the new epoch's tasks never go to workers that the old
  /// epoch's end retires.
  std::int64_t start(bool fresh = false);
  /// Driver: asks the workers of `generation` and before to exit once their queued tasks are
  /// done (end of an epoch without persistent workers); `done` runs on the driver once every
  /// departing worker is reaped (or at once on shutdown).
  void retire(std::int64_t generation, std::function<void()> done);
  /// Driver: SIGTERM to every worker, SIGKILL after the grace period; tasks still pending
  /// fail with `cancelled` at once.
  void shutdown(std::exception_ptr cancelled);
  /// True once a worker died under `on_death = raise` (or past its restarts): dispatch stops.
  bool broken() const noexcept;
  /// Driver: the worker (id, pid) that has task `batch` sent to it and not answered yet, or
  /// {-1, -1}; the task's first indices go to `indices` (at most 8) and their count is returned
  /// in `count`.
  std::pair<int, int> holder(std::int64_t batch, std::vector<std::int64_t>& indices,
                             std::int64_t& count) const;

  struct Awaiter;
  /// Driver: sends `task` to worker `worker` (or, with -1, to the live worker with the fewest
  /// tasks) and completes with its result. Throws WorkerDied when the worker dies with it.
  Awaiter submit(int worker, ProcessTask task);

  struct Pending;
  struct Awaiter {
    std::shared_ptr<Pending> pending;
    bool await_ready() const noexcept;
    void await_suspend(std::coroutine_handle<> h) const noexcept;
    ProcessResult await_resume() const;
  };

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace detail
}  // namespace coload
