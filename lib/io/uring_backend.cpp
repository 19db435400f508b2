// The io_uring backend of Reader: one ring per Reader, driven from its io_context's thread.
//
// Life of a request:
//  1. A coroutine co_awaits a Request; the awaiter appends it to `waiting_` and makes sure a
//     flush handler is posted to the io_context (one per turn of the loop).
//  2. flush() turns as many waiting requests into SQEs as the limits allow (SQ space, the
//     completion queue budget, free file slots), submits them all with ONE io_uring_submit,
//     and reaps what completed inline.
//  3. Every other completion signals the eventfd registered with the ring; the io_context
//     waits on it and then drains the completion queue fully (the eventfd is only a hint).
//  4. A request whose CQEs have all arrived joins `ready_`; ready coroutines are resumed
//     after the queue has been drained, never while the ring's state is half updated.

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <asio/post.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <coroutine>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "backend.hpp"
#include "coload/core/warning.hpp"

namespace coload::io::detail {
namespace {

/// One unit of work for the ring: a linked openat-read-close chain on a direct descriptor, or
/// a single openat, read or statx. It lives in the frame of the coroutine awaiting it.
struct alignas(8) Request {
  enum class Kind : std::uint8_t { chain, openat, read, statx };
  Kind kind = Kind::read;

  // Inputs.
  const char* path = nullptr;        // chain, openat, statx
  int open_flags = 0;                // chain, openat
  int fd = -1;                       // read
  std::byte* buf = nullptr;          // read, chain (set at prep when `staged`)
  unsigned len = 0;                  // read, chain
  std::uint64_t offset = 0;          // read, chain
  struct statx* stx = nullptr;       // statx
  bool staged = false;               // chain: read into the slot's staging buffer (direct)
  bool pooled = false;               // chain: read into a buffer taken from the pool (buffered)

  // Set at prep: the file slot (chain) and the number of CQEs still to come.
  unsigned slot = 0;
  unsigned pending = 0;
  // One result per CQE; a chain has three (open, read, close).
  std::array<int, 3> res{};
  std::coroutine_handle<> waiter;

  unsigned sqes() const noexcept { return kind == Kind::chain ? 3 : 1; }
  void cancel() noexcept {
    res.fill(-ECANCELED);
    pending = 0;
  }
};

std::uint64_t tag(Request* r, unsigned part) noexcept {
  return reinterpret_cast<std::uintptr_t>(r) | part;
}

std::string errno_text(const char* call, int error) {
  std::string s = call;
  s += ": ";
  s += std::strerror(error);
  return s;
}

class UringBackend final : public ReaderBackend {
 public:
  UringBackend(asio::io_context& ctx, const ReaderOptions& options)
      : ctx_(ctx), options_(options), first_read_(first_read_size(options)) {}

  /// Sets the ring up; on failure returns false with `why` set, and the object may be dropped.
  bool init(std::string& why);
  ~UringBackend() override;

  Task<Buffer> read_file(std::string path) override;
  Task<File> open(std::string path) override;
  Task<std::size_t> read_at(const File& file, std::uint64_t offset,
                            std::span<std::byte> out) override;
  Backend kind() const noexcept override { return Backend::uring; }
  ReaderStats stats() const noexcept override { return stats_; }

 private:
  struct Awaiter {
    UringBackend* self;
    Request* request;
    bool await_ready() const noexcept {
      // NOTE: a Reader that is shutting down refuses new work without suspending, so the
      // coroutines its destructor resumes finish inside the destructor.
      if (!self->stopping_) return false;
      request->cancel();
      return true;
    }
    void await_suspend(std::coroutine_handle<> h) const {
      request->waiter = h;
      if (self->ctx_.get_executor().running_in_this_thread()) {
        self->start(request);
        return;
      }
      // Started from another thread: the ring is touched only on the io_context's thread.
      asio::post(self->ctx_, [backend = self, r = request, alive = std::weak_ptr(self->alive_)] {
        if (alive.expired()) {
          r->cancel();
          r->waiter.resume();
          return;
        }
        backend->start(r);
      });
    }
    void await_resume() const noexcept {}
  };
  Awaiter submit(Request& request) noexcept { return Awaiter{this, &request}; }
  /// statx of `path` (its type and size) through the ring: 0, or a negative errno.
  Task<int> stat(const char* path, struct statx& stx);

  void start(Request* request);
  void schedule_flush();
  void flush();
  void prep_waiting();
  void prep(Request* r);
  void submit_prepared();
  /// Drains the completion queue; returns the number of CQEs seen.
  unsigned reap();
  /// Resumes ready coroutines; false when one of them destroyed this backend.
  bool run_ready();
  void arm_eventfd();

  asio::io_context& ctx_;
  ReaderOptions options_;
  std::size_t first_read_;
  io_uring ring_{};
  bool ring_ready_ = false;
  unsigned cq_budget_ = 0;  // CQEs allowed in flight: the CQ size less one for the shutdown cancel
  unsigned inflight_ = 0;   // CQEs still to come
  std::vector<unsigned> free_slots_;
  std::byte* slab_ = nullptr;  // direct mode: a registered staging buffer per file slot
  bool slab_registered_ = false;
  BufferPool* pool_ = nullptr;  // buffered mode: recycled first-read buffers
  int eventfd_ = -1;
  std::unique_ptr<asio::posix::stream_descriptor> eventfd_wait_;
  bool eventfd_armed_ = false;
  std::deque<Request*> waiting_;
  std::deque<std::coroutine_handle<>> ready_;
  bool flush_posted_ = false;
  bool stopping_ = false;
  ReaderStats stats_;
  // Handlers posted to the io_context hold a weak_ptr to this; it expires when destruction
  // begins, so a late handler never touches a destroyed backend.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

bool UringBackend::init(std::string& why) {
  const unsigned depth = std::clamp(options_.queue_depth, 4u, 32768u);
  // NOTE: COOP_TASKRUN: completions that need this thread's task work (the steps of a chain
  // that ran inline) no longer interrupt it with an IPI; they run at its next system call, and
  // a thread asleep in epoll is still woken. io-wq's completions posted to the CQ are unaffected.
  // Each kernel that does not know a flag answers EINVAL; the next set drops the newest.
  int rc = -EINVAL;
  io_uring_params params{};
  constexpr unsigned base = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CLAMP;
  for (unsigned flags : {base | IORING_SETUP_COOP_TASKRUN, base, unsigned{IORING_SETUP_CLAMP}}) {
    params = io_uring_params{};
    params.flags = flags;
    rc = io_uring_queue_init_params(depth, &ring_, &params);
    if (rc != -EINVAL) break;
  }
  if (rc < 0) {
    why = errno_text("io_uring_queue_init", -rc);
    return false;
  }
  ring_ready_ = true;
  cq_budget_ = params.cq_entries - 1;
  if (options_.wq_workers != 0) {
    // NOTE: io-wq runs punted reads of regular files as "bounded" work, whose workers the
    // kernel caps at min(SQ entries, 4 x CPUs): 8 on two cores, so a cold read chain that
    // blocks on the disk leaves at most 8 reads outstanding. Raising the cap gives the disk
    // the depth a 32-thread pool would. A refusal (kernel before 5.15) only keeps the default.
    unsigned limits[2] = {options_.wq_workers, 0};
    (void)io_uring_register_iowq_max_workers(&ring_, limits);
  }
  stats_.completion_queue = params.cq_entries;

  // NOTE: one slot per chain that can be in flight, unless the caller chose; slots are picked
  // from our own free list (liburing 2.3's IORING_FILE_INDEX_ALLOC helper is broken).
  const unsigned slots = options_.file_slots != 0 ? options_.file_slots
                                                  : std::max(1u, cq_budget_ / 3);
  rc = io_uring_register_files_sparse(&ring_, slots);
  if (rc < 0) {
    why = errno_text("io_uring_register_files_sparse", -rc);
    return false;
  }
  free_slots_.reserve(slots);
  for (unsigned s = slots; s-- > 0;) free_slots_.push_back(s);

  // NOTE: buffered first reads go straight into recycled pool buffers that the caller then
  // owns (no copy; a fresh 128 KiB Buffer per file was served by mmap and paid ~32 page faults
  // and an munmap, a quarter of the warm speed). Direct reads land in a staging buffer per
  // slot, registered with the ring so the kernel need not map user pages for each read, and
  // are copied out: for cold storage the copy is noise, and registered memory cannot be
  // handed to callers who keep it for as long as they like.
  if (!options_.direct) {
    pool_ = BufferPool::create(first_read_, slots);
  } else {
    slab_ = static_cast<std::byte*>(
        ::operator new(std::size_t{slots} * first_read_, std::align_val_t{Buffer::alignment}));
    std::vector<iovec> iov(slots);
    for (unsigned s = 0; s < slots; ++s) iov[s] = {slab_ + std::size_t{s} * first_read_, first_read_};
    // Where registration is refused (memlock limits), plain reads into the slab work as well.
    slab_registered_ = io_uring_register_buffers(&ring_, iov.data(), slots) == 0;
  }

  eventfd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (eventfd_ < 0) {
    why = errno_text("eventfd", errno);
    return false;
  }
  rc = io_uring_register_eventfd(&ring_, eventfd_);
  if (rc < 0) {
    why = errno_text("io_uring_register_eventfd", -rc);
    return false;
  }
  eventfd_wait_ = std::make_unique<asio::posix::stream_descriptor>(ctx_, eventfd_);
  return true;
}

UringBackend::~UringBackend() {
  alive_.reset();
  stopping_ = true;
  for (Request* r : waiting_) {
    r->cancel();
    ready_.push_back(r->waiter);
  }
  waiting_.clear();
  if (ring_ready_) {
    if (inflight_ > 0) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) {
        io_uring_submit(&ring_);
        sqe = io_uring_get_sqe(&ring_);
      }
      if (sqe) {
        // NOTE: closing a descriptor does not cancel its reads; cancel them all, then wait.
        // Requests already running (a read waiting for the disk) cannot be cancelled and
        // simply finish; kernels before 5.19 answer -EINVAL and everything finishes.
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        io_uring_sqe_set_data64(sqe, 0);
        ++inflight_;
      }
    }
    while (inflight_ > 0) {
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        coload::detail::warn(
            std::string("io_uring_submit_and_wait failed during shutdown: ") + std::strerror(-rc),
            "coload: ");
        std::abort();  // freeing buffers the kernel may still write into is worse
      }
      reap();
    }
  }
  // Every coroutine learns its outcome while the buffers it may read from still exist.
  while (!ready_.empty()) {
    std::coroutine_handle<> h = ready_.front();
    ready_.pop_front();
    h.resume();
  }
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (eventfd_wait_) {
    eventfd_wait_.reset();  // closes the eventfd; a pending wait completes as operation_aborted
  } else if (eventfd_ >= 0) {
    ::close(eventfd_);  // init failed before the stream_descriptor took it over
  }
  if (slab_) ::operator delete(slab_, std::align_val_t{Buffer::alignment});
  if (pool_) pool_->drop_owner();  // buffers still held by callers keep it alive
}

void UringBackend::start(Request* request) {
  ++stats_.operations;
  waiting_.push_back(request);
  schedule_flush();
}

void UringBackend::schedule_flush() {
  if (flush_posted_) return;
  flush_posted_ = true;
  asio::post(ctx_, [this, alive = std::weak_ptr(alive_)] {
    if (!alive.expired()) flush();
  });
}

void UringBackend::flush() {
  flush_posted_ = false;
  prep_waiting();
  submit_prepared();
  reap();
  run_ready();
}

void UringBackend::prep_waiting() {
  while (!waiting_.empty()) {
    Request* r = waiting_.front();
    const unsigned n = r->sqes();
    if (inflight_ + n > cq_budget_ || io_uring_sq_space_left(&ring_) < n) return;
    if (r->kind == Request::Kind::chain && free_slots_.empty()) return;
    waiting_.pop_front();
    prep(r);
  }
}

void UringBackend::prep(Request* r) {
  r->pending = r->sqes();
  inflight_ += r->pending;
  stats_.max_in_flight = std::max(stats_.max_in_flight, inflight_);
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  switch (r->kind) {
    case Request::Kind::chain: {
      r->slot = free_slots_.back();
      free_slots_.pop_back();
      if (r->staged) r->buf = slab_ + std::size_t{r->slot} * first_read_;
      if (r->pooled) r->buf = pool_->take();
      io_uring_prep_openat_direct(sqe, AT_FDCWD, r->path, r->open_flags, 0, r->slot);
      // NOTE: IOSQE_ASYNC on the chain's head sends the whole chain to io-wq (see
      // ReaderOptions::async_punt); inline, a cached read's copy would run on this thread.
      io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK | (options_.async_punt ? IOSQE_ASYNC : 0));
      io_uring_sqe_set_data64(sqe, tag(r, 0));

      sqe = io_uring_get_sqe(&ring_);
      if (r->staged && slab_registered_) {
        io_uring_prep_read_fixed(sqe, static_cast<int>(r->slot), r->buf, r->len, r->offset,
                                 static_cast<int>(r->slot));
      } else {
        io_uring_prep_read(sqe, static_cast<int>(r->slot), r->buf, r->len, r->offset);
      }
      // NOTE: a hard link: a short read (every file smaller than the buffer) fails a plain
      // link, which would cancel the close and leak the slot.
      io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK);
      io_uring_sqe_set_data64(sqe, tag(r, 1));

      sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_close_direct(sqe, r->slot);
      io_uring_sqe_set_data64(sqe, tag(r, 2));
      break;
    }
    case Request::Kind::openat:
      io_uring_prep_openat(sqe, AT_FDCWD, r->path, r->open_flags, 0);
      io_uring_sqe_set_data64(sqe, tag(r, 0));
      break;
    case Request::Kind::read:
      io_uring_prep_read(sqe, r->fd, r->buf, r->len, r->offset);
      // NOTE: punted like the chains: read_at's ranged reads of cached shards then copy on
      // io-wq's threads, several at once, not one by one on this thread.
      if (options_.async_punt) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      io_uring_sqe_set_data64(sqe, tag(r, 0));
      break;
    case Request::Kind::statx:
      io_uring_prep_statx(sqe, AT_FDCWD, r->path, 0, STATX_TYPE | STATX_SIZE, r->stx);
      io_uring_sqe_set_data64(sqe, tag(r, 0));
      break;
  }
}

void UringBackend::submit_prepared() {
  if (io_uring_sq_ready(&ring_) == 0) return;
  int rc;
  ++stats_.submits;
  do {
    rc = io_uring_submit(&ring_);
  } while (rc == -EINTR);
  if (rc == -EAGAIN || rc == -EBUSY) {
    // The kernel keeps the unconsumed SQEs in the ring; try again on the next turn.
    schedule_flush();
  } else if (rc < 0) {
    coload::detail::warn(std::string("io_uring_submit failed: ") + std::strerror(-rc), "coload: ");
    std::abort();
  }
  // NOTE: the eventfd is waited on only while something is in flight, so that an idle Reader,
  // like an idle Asio socket, does not keep io_context::run() from returning. Completions
  // reaped inline below still signal the eventfd, so a wait armed now always fires.
  arm_eventfd();
}

unsigned UringBackend::reap() {
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    --inflight_;
    const std::uint64_t data = io_uring_cqe_get_data64(cqe);
    if (data == 0) continue;  // the shutdown cancel
    auto* r = reinterpret_cast<Request*>(data & ~std::uint64_t{7});
    const unsigned part = static_cast<unsigned>(data & 7);
    r->res[part] = cqe->res;
    if (r->kind == Request::Kind::chain && part == 2) {
      // NOTE: a slot is reused only after its close completed. Whatever the close's result
      // (-ECANCELED when the open failed), the slot is empty or will be replaced by the next
      // openat_direct into it, which the kernel allows.
      free_slots_.push_back(r->slot);
    }
    if (--r->pending == 0) ready_.push_back(r->waiter);
  }
  io_uring_cq_advance(&ring_, seen);
  if (seen != 0 && !waiting_.empty() && !stopping_) schedule_flush();
  return seen;
}

bool UringBackend::run_ready() {
  std::weak_ptr<char> alive = alive_;
  while (!ready_.empty()) {
    std::coroutine_handle<> h = ready_.front();
    ready_.pop_front();
    h.resume();
    if (alive.expired()) return false;
  }
  return true;
}

void UringBackend::arm_eventfd() {
  if (eventfd_armed_) return;
  eventfd_armed_ = true;
  eventfd_wait_->async_wait(asio::posix::stream_descriptor::wait_read,
                            [this, alive = std::weak_ptr(alive_)](const asio::error_code& ec) {
                              if (ec || alive.expired()) return;
                              eventfd_armed_ = false;
                              eventfd_t value;
                              (void)::eventfd_read(eventfd_, &value);  // reset the hint
                              reap();
                              if (inflight_ > 0) arm_eventfd();
                              run_ready();
                            });
}

Task<Buffer> UringBackend::read_file(std::string path) {
  // NOTE: no O_CLOEXEC: the kernel refuses it (EINVAL) for direct descriptors, which no exec
  // can inherit anyway. O_NONBLOCK: a FIFO named like a data file reads as empty instead of
  // blocking its open forever (regular files ignore the flag).
  int flags = O_RDONLY | O_NONBLOCK | (options_.direct ? O_DIRECT : 0);
  Request first;
  first.kind = Request::Kind::chain;
  first.path = path.c_str();
  first.open_flags = flags;
  first.len = static_cast<unsigned>(first_read_);
  first.staged = options_.direct;
  first.pooled = !options_.direct;
  co_await submit(first);
  if (first.res[0] == -EINVAL && (flags & O_DIRECT)) {
    // The file system refuses O_DIRECT for this file: read it buffered (still staged).
    flags &= ~O_DIRECT;
    first.open_flags = flags;
    co_await submit(first);
  }
  int got = first.res[1];
  bool more = got == static_cast<int>(first.len);
  if (got == -EAGAIN || got == -EINTR) {
    got = 0;
    more = true;
  }
  if (first.res[0] < 0 || got < 0) {
    if (first.pooled && first.buf) pool_->give_back(first.buf);
    if (first.res[0] < 0) throw IoError(std::move(path), "open", -first.res[0]);
    throw IoError(std::move(path), "read", -got);
  }
  Buffer buffer;
  const auto size = static_cast<std::size_t>(got);
  if (first.pooled && size >= first_read_ / 2) {
    buffer = pool_->wrap(first.buf, size);
  } else {
    // NOTE: copy out before suspending again. A staging buffer's slot was freed when the
    // close completed, but slots are handed out again only by flush(), which runs as its own
    // handler: the coroutines a reap makes ready are all resumed before that handler returns.
    // A small file is copied out of a pool buffer too, so it does not pin 128 KiB.
    buffer = Buffer(size);
    if (size > 0) std::memcpy(buffer.data(), first.buf, size);
    if (first.pooled) pool_->give_back(first.buf);
  }
  if (size == 0 && !more) {
    // Nothing read: an empty file, or no regular file at all (a FIFO without a writer reads
    // as empty), which is refused by name. An empty read is rare enough for one more statx.
    struct statx stx {};
    if (co_await stat(path.c_str(), stx) == 0) {
      if (const char* what = not_regular(stx.stx_mode)) {
        throw IoError(std::move(path), "read", EINVAL, what);
      }
    }
  }

  // NOTE: the follow-up for a file that filled the first buffer. The chain has closed the
  // file, so statx (by path) sizes the rest and a second chain reopens the file and reads it
  // at the offset reached, asking for one byte more than statx promised (rounded up for
  // O_DIRECT): a read that fills even that means the file grew, and the loop goes round again.
  // A file replaced by rename between the two opens would be read partly from each version.
  int retries = 0;
  while (more) {
    struct statx stx {};
    if (const int rc = co_await stat(path.c_str(), stx); rc < 0) {
      throw IoError(std::move(path), "stat", -rc);
    }
    // A device that reads like a file (/dev/zero) filled the first read, and a FIFO with a
    // writer answered EAGAIN: refused by name, as an empty read of one is above.
    if (const char* what = not_regular(stx.stx_mode)) {
      throw IoError(std::move(path), "read", EINVAL, what);
    }
    const std::size_t total = buffer.size();
    const std::optional<std::size_t> to_read = rest_to_read(stx.stx_size, total);
    if (!to_read) break;
    const std::size_t want = *to_read;
    if (!grow_for(buffer, total + want)) throw IoError(std::move(path), "read", ENOMEM, too_large);

    Request rest;
    rest.kind = Request::Kind::chain;
    rest.path = path.c_str();
    rest.open_flags = flags;
    rest.buf = buffer.data() + total;
    rest.len = static_cast<unsigned>(std::min<std::size_t>(want, 1u << 30));
    rest.offset = total;
    co_await submit(rest);
    if (rest.res[0] < 0) throw IoError(std::move(path), "open", -rest.res[0]);
    int n = rest.res[1];
    more = n == static_cast<int>(rest.len);
    if (n == -EAGAIN || n == -EINTR) {
      if (++retries > 8) throw IoError(std::move(path), "read", -n);
      n = 0;
      more = true;
    }
    if (n < 0) throw IoError(std::move(path), "read", -n);
    buffer.resize(total + static_cast<std::size_t>(n));
  }
  co_return buffer;
}

Task<int> UringBackend::stat(const char* path, struct statx& stx) {
  Request r;
  r.kind = Request::Kind::statx;
  r.path = path;
  r.stx = &stx;
  co_await submit(r);
  co_return r.res[0];
}

Task<File> UringBackend::open(std::string path) {
  Request r;
  r.kind = Request::Kind::openat;
  r.path = path.c_str();
  r.open_flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (options_.direct ? O_DIRECT : 0);
  co_await submit(r);
  if (r.res[0] == -EINVAL && options_.direct) {
    r.open_flags &= ~O_DIRECT;
    co_await submit(r);
  }
  if (r.res[0] < 0) throw IoError(std::move(path), "open", -r.res[0]);
  const int fd = r.res[0];
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw IoError(std::move(path), "stat", error);
  }
  // A FIFO or a socket has no offsets to read at: opened without blocking, it answers every
  // read with EAGAIN, which read_at retried for ever. Refused by name. (A directory opens, and
  // its reads fail with EISDIR.)
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    ::close(fd);
    throw IoError(std::move(path), "open", EINVAL, not_regular(st.st_mode));
  }
  co_return File(fd, std::move(path), static_cast<std::uint64_t>(st.st_size));
}

Task<std::size_t> UringBackend::read_at(const File& file, std::uint64_t offset,
                                        std::span<std::byte> out) {
  const int fd = file.native_handle();
  std::size_t done = 0;
  while (done < out.size()) {
    Request r;
    r.kind = Request::Kind::read;
    r.fd = fd;
    r.buf = out.data() + done;
    r.len = static_cast<unsigned>(std::min<std::size_t>(out.size() - done, 1u << 30));
    r.offset = offset + done;
    co_await submit(r);
    const int n = r.res[0];
    if (n == -EAGAIN || n == -EINTR) continue;
    if (n < 0) throw IoError(file.path(), "read", -n);
    done += static_cast<std::size_t>(n);
    // A short read is the end of a regular file (and O_DIRECT may not read on from there).
    if (static_cast<unsigned>(n) < r.len) break;
  }
  co_return done;
}

}  // namespace

std::unique_ptr<ReaderBackend> make_uring_backend(asio::io_context& ctx,
                                                  const ReaderOptions& options, std::string& why) {
  auto backend = std::make_unique<UringBackend>(ctx, options);
  if (!backend->init(why)) return nullptr;
  return backend;
}

}  // namespace coload::io::detail
