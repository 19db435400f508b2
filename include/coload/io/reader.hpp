#pragma once
// Reader: asynchronous file reads for one thread, through io_uring or a pread pool.

#include <asio/io_context.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "coload/coro/task.hpp"
#include "coload/io/buffer.hpp"
#include "coload/io/errors.hpp"
#include "coload/io/file.hpp"

namespace coload::io {

/// Which mechanism carries a Reader's reads.
enum class Backend {
  uring,  ///< one io_uring ring, completions delivered through an eventfd
  pread,  ///< a small pool of threads calling pread(2)
};

/// Settings of a Reader; an aggregate, set with designated initialisers.
struct ReaderOptions {
  /// Submission queue entries of the ring; the completion queue has twice as many, and the
  /// operations in flight never exceed it (the rest wait in a queue in the Reader).
  unsigned queue_depth = 256;
  /// Read with O_DIRECT into aligned, registered buffers (cold storage). A file system that
  /// refuses O_DIRECT for a file (EINVAL) gets that file read buffered instead.
  bool direct = false;
  /// Bytes read_file asks for in its first read; larger files take a follow-up read.
  /// Rounded up to Buffer::alignment; at most 1 GiB (one read's size: InvalidArgument). Buffered io_uring reads land in recycled buffers of this
  /// size (a file under half of it is copied into a snug Buffer); direct reads and the pread
  /// pool use a staging buffer of this size per file slot or thread.
  std::size_t first_read = 128 * 1024;
  /// Slots of the ring's registered file table; 0 picks one per possible chain in flight.
  unsigned file_slots = 0;
  /// The preferred backend. `uring` falls back to `pread` where io_uring is refused;
  /// `pread` forces the pool (so does COLOAD_IO=pread in the environment).
  Backend backend = Backend::uring;
  /// Threads of the pread pool (used only by the pread backend).
  unsigned pread_threads = 4;
  /// Hand each read_file chain and each read_at read to the kernel's io-wq workers
  /// (IOSQE_ASYNC) instead of running it inline in io_uring_submit: reads of cached files then
  /// copy on several cores at once
  /// rather than on the submitting thread (measured about 2x warm, and faster cold, on 2 cores).
  bool async_punt = true;
  /// Most io-wq workers running this ring's punted reads at once (the kernel's default is
  /// 4 per CPU): a cold read blocks its worker on the disk, so this is the disk's queue depth.
  /// 0 keeps the kernel's default.
  unsigned wq_workers = 64;
};

/// Counters of a Reader, for tests and benchmarks. Zero where a backend has no such thing.
struct ReaderStats {
  std::uint64_t operations = 0;   ///< requests handed to the backend (a chain counts once)
  std::uint64_t submits = 0;      ///< io_uring_submit calls
  unsigned max_in_flight = 0;     ///< most completions outstanding at once
  unsigned completion_queue = 0;  ///< entries of the ring's completion queue
};

namespace detail {
class ReaderBackend;
}

/// Reads files asynchronously for the coroutines of one thread.
///
/// A Reader is bound to an asio::io_context run by exactly one thread. Its operations
/// return lazy tasks; awaiting one starts the operation and resumes the awaiting coroutine
/// on the io_context's thread once it has finished (never inline inside the co_await that
/// started it). Operations may be started from the io_context's thread (the fast path) or
/// from another thread, in which case the start is posted to the io_context. Operations in
/// flight keep io_context::run() from returning, as Asio's own operations do; an idle Reader
/// does not.
///
/// With io_uring, every operation started during one turn of the io_context's loop reaches
/// the kernel in a single submit, at most a completion queue's worth of operations are in
/// flight, and completions wake the io_context through an eventfd registered with the ring.
/// Where io_uring is unavailable (io_uring_queue_init fails, kernel.io_uring_disabled, or
/// COLOAD_IO=pread) the reads run on a pread pool, and the process says so once on stderr.
///
/// Failures throw IoError naming the path and the errno text.
class Reader {
 public:
  /// Binds a Reader to `ctx`, which must outlive it.
  explicit Reader(asio::io_context& ctx, ReaderOptions options = {});
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  /// Stops submitting, cancels what is in flight and waits for it, then frees the buffers
  /// and the ring. Every operation started on this Reader has resumed its awaiter when the
  /// destructor returns: with its result if it finished, otherwise with IoError(ECANCELED).
  /// Call it on the io_context's thread, or while no thread runs the io_context.
  ~Reader();

  /// Reads the whole file at `path`. With io_uring, open, read and close go to the kernel
  /// as one linked chain on a registered (direct) descriptor; a file longer than
  /// `first_read` is finished by a follow-up read sized by statx.
  /// The task must be started while the Reader lives.
  Task<Buffer> read_file(std::string path);

  /// Opens `path` read-only (O_DIRECT in direct mode) for read_at.
  Task<File> open(std::string path);

  /// Reads into `out` from byte `offset` of `file`, until `out` is full or the file ends;
  /// returns the number of bytes read. `file` and `out` must outlive the task. In direct
  /// mode `offset`, `out.data()` and `out.size()` must be multiples of the device's block size.
  Task<std::size_t> read_at(const File& file, std::uint64_t offset, std::span<std::byte> out);

  /// The backend that carries the reads.
  Backend backend() const noexcept;
  /// The counters so far. Call on the io_context's thread (or while no thread runs it).
  ReaderStats stats() const noexcept;
  /// The io_context it is bound to: other I/O of an asynchronous fetch (HttpClient::on) runs
  /// there too.
  asio::io_context& context() const noexcept { return *ctx_; }

 private:
  asio::io_context* ctx_;
  std::unique_ptr<detail::ReaderBackend> backend_;
};

}  // namespace coload::io
