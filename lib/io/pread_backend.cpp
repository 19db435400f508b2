// The pread backend of Reader: a small pool of threads doing blocking reads, for where
// io_uring is refused. Completions are handed back to the io_context's thread.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <coroutine>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"

namespace coload::io::detail {
namespace {

/// One blocking operation, run whole on a pool thread. Lives in the awaiting coroutine's frame.
struct Job {
  enum class Kind { read_file, open, read_at };
  Kind kind = Kind::read_file;
  // Inputs.
  const char* path = nullptr;
  int open_flags = 0;
  int fd = -1;
  std::uint64_t offset = 0;
  std::span<std::byte> out;
  // Outputs: error (a positive errno) and the call that failed, or the results.
  int error = 0;
  const char* failed = "";
  Buffer buffer;
  std::size_t bytes = 0;
  std::uint64_t size = 0;
  std::coroutine_handle<> waiter;
  // Keeps io_context::run() from returning while the job is out, as Asio's own operations do.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;

  const char* detail = nullptr;  // what the file is, when it is no regular file
  void fail(const char* call, int e, const char* what = nullptr) noexcept {
    failed = call;
    error = e;
    detail = what;
  }
};

int open_read_only(const char* path, int& flags) {
  int fd;
  do {
    fd = ::open(path, flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == EINVAL && (flags & O_DIRECT)) {
    flags &= ~O_DIRECT;  // the file system refuses O_DIRECT: read buffered
    return open_read_only(path, flags);
  }
  return fd;
}

/// pread until `len` bytes or the end of the file; -1 with errno on failure.
ssize_t read_fully(int fd, std::byte* buf, std::size_t len, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < len) {
    // At most 1 GiB a call: the kernel returns at most 2 GiB - 4 KiB from one, which the
    // check below would take for the end of the file (a file over 2 GiB came back cut short).
    const std::size_t ask = std::min<std::size_t>(len - done, std::size_t{1} << 30);
    const ssize_t n = ::pread(fd, buf + done, ask, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    const std::size_t asked = ask;
    done += static_cast<std::size_t>(n);
    // A short read is the end of a regular file (and O_DIRECT may not read on from there).
    if (static_cast<std::size_t>(n) < asked) break;
  }
  return static_cast<ssize_t>(done);
}

// `staging` is the thread's own first_read-sized buffer: the first read lands there and is
// copied into a Buffer of the exact size (see the io_uring backend for why).
void run_read_file(Job& job, Buffer& staging) {
  int flags = job.open_flags;
  const int fd = open_read_only(job.path, flags);
  if (fd < 0) return job.fail("open", errno);
  const ssize_t first = read_fully(fd, staging.data(), staging.capacity(), 0);
  if (first == 0 || (first < 0 && errno == ESPIPE)) {
    // Nothing read, or nothing that can be read at an offset: a FIFO or a device is refused
    // by name (as the io_uring backend does), an empty file is empty.
    const int read_error = errno;
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      if (const char* what = not_regular(st.st_mode)) {
        job.fail("read", EINVAL, what);
        ::close(fd);
        return;
      }
    }
    errno = read_error;
  }
  if (first < 0) {
    job.fail("read", errno);
    ::close(fd);
    return;
  }
  // Not Buffer's throwing constructor: the fd is open here.
  Buffer buffer;
  if (!grow_for(buffer, static_cast<std::size_t>(first))) {
    job.fail("read", ENOMEM);
    ::close(fd);
    return;
  }
  buffer.resize(static_cast<std::size_t>(first));
  if (first > 0) std::memcpy(buffer.data(), staging.data(), buffer.size());
  std::size_t want = staging.capacity();
  std::size_t last = static_cast<std::size_t>(first);
  while (last == want) {
    // The last read filled its buffer: size the rest as the io_uring backend does, plus one
    // byte to see the end (rounded up for O_DIRECT).
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      job.fail("stat", errno);
      break;
    }
    // A device that reads like a file (/dev/zero) filled the first read: refused by name.
    if (const char* what = not_regular(st.st_mode)) {
      job.fail("read", EINVAL, what);
      break;
    }
    const std::size_t total = buffer.size();
    const std::optional<std::size_t> rest =
        rest_to_read(static_cast<std::uint64_t>(st.st_size), total);
    if (!rest) break;
    want = *rest;
    if (!grow_for(buffer, total + want)) {
      job.fail("read", ENOMEM, too_large);
      break;
    }
    const ssize_t n = read_fully(fd, buffer.data() + total, want, total);
    if (n < 0) {
      job.fail("read", errno);
      break;
    }
    last = static_cast<std::size_t>(n);
    buffer.resize(total + last);
  }
  ::close(fd);
  if (job.error == 0) job.buffer = std::move(buffer);
}

void run_open(Job& job) {
  int flags = job.open_flags;
  const int fd = open_read_only(job.path, flags);
  if (fd < 0) return job.fail("open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    job.fail("stat", errno);
    ::close(fd);
    return;
  }
  // A FIFO or a socket has no offsets to read at (opened without blocking, it would answer
  // with EAGAIN): refused by name, as the io_uring backend does. (A directory opens, and its
  // reads fail with EISDIR.)
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    job.fail("open", EINVAL, not_regular(st.st_mode));
    ::close(fd);
    return;
  }
  job.fd = fd;
  job.size = static_cast<std::uint64_t>(st.st_size);
}

void run_read_at(Job& job) {
  const ssize_t n = read_fully(job.fd, job.out.data(), job.out.size(), job.offset);
  if (n < 0) return job.fail("read", errno);
  job.bytes = static_cast<std::size_t>(n);
}

/// Finished jobs on their way back to the io_context. Shared with the handlers posted to the
/// io_context, so one that runs after the backend is gone finds an empty queue, not freed memory.
struct Completions {
  std::mutex mutex;
  std::deque<Job*> done;
  bool drain_posted = false;

  Job* pop() {
    std::lock_guard lock(mutex);
    if (done.empty()) {
      drain_posted = false;
      return nullptr;
    }
    Job* job = done.front();
    done.pop_front();
    return job;
  }
};

void resume(Job* job) {
  job->work.reset();
  job->waiter.resume();
}

class PreadBackend final : public ReaderBackend {
 public:
  PreadBackend(asio::io_context& ctx, const ReaderOptions& options)
      : ctx_(ctx), options_(options), first_read_(first_read_size(options)) {
    const unsigned n = std::max(1u, options.pread_threads);
    threads_.reserve(n);
    for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }

  ~PreadBackend() override {
    std::deque<Job*> unstarted;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      unstarted.swap(queue_);
    }
    wake_.notify_all();
    // NOTE: a job already running finishes (a blocking read cannot be interrupted); the
    // threads take no new ones.
    for (auto& t : threads_) t.join();
    for (Job* job : unstarted) {
      job->fail(job->kind == Job::Kind::read_at ? "read" : "open", ECANCELED);
      resume(job);
    }
    while (Job* job = completions_->pop()) resume(job);
  }

  Task<Buffer> read_file(std::string path) override {
    Job job;
    job.kind = Job::Kind::read_file;
    job.path = path.c_str();
    job.open_flags = open_flags();
    co_await run(job);
    if (job.error != 0 && job.detail) {
      throw IoError(std::move(path), job.failed, job.error, job.detail);
    }
    if (job.error != 0) throw IoError(std::move(path), job.failed, job.error);
    co_return std::move(job.buffer);
  }

  Task<File> open(std::string path) override {
    Job job;
    job.kind = Job::Kind::open;
    job.path = path.c_str();
    job.open_flags = open_flags();
    co_await run(job);
    if (job.error != 0 && job.detail)
      throw IoError(std::move(path), job.failed, job.error, job.detail);
    if (job.error != 0) throw IoError(std::move(path), job.failed, job.error);
    co_return File(job.fd, std::move(path), job.size);
  }

  Task<std::size_t> read_at(const File& file, std::uint64_t offset,
                            std::span<std::byte> out) override {
    Job job;
    job.kind = Job::Kind::read_at;
    job.fd = file.native_handle();
    job.offset = offset;
    job.out = out;
    co_await run(job);
    if (job.error != 0) throw IoError(file.path(), job.failed, job.error);
    co_return job.bytes;
  }

  Backend kind() const noexcept override { return Backend::pread; }
  ReaderStats stats() const noexcept override {
    ReaderStats s;
    s.operations = operations_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  struct Awaiter {
    PreadBackend* self;
    Job* job;
    bool await_ready() const noexcept {
      if (!self->stopping_) return false;
      job->fail(job->kind == Job::Kind::read_at ? "read" : "open", ECANCELED);
      return true;
    }
    void await_suspend(std::coroutine_handle<> h) const {
      job->waiter = h;
      self->enqueue(job);
    }
    void await_resume() const noexcept {}
  };
  Awaiter run(Job& job) noexcept { return Awaiter{this, &job}; }

  int open_flags() const noexcept {
    // O_NONBLOCK: a FIFO reads as empty instead of blocking the open (see the uring backend).
    return O_RDONLY | O_CLOEXEC | O_NONBLOCK | (options_.direct ? O_DIRECT : 0);
  }

  void enqueue(Job* job) {
    operations_.fetch_add(1, std::memory_order_relaxed);
    job->work.emplace(ctx_.get_executor());
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(job);
    }
    wake_.notify_one();
  }

  void work() {
    Buffer staging(0, first_read_);
    for (;;) {
      Job* job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        job = queue_.front();
        queue_.pop_front();
      }
      try {
        switch (job->kind) {
          case Job::Kind::read_file: run_read_file(*job, staging); break;
          case Job::Kind::open: run_open(*job); break;
          case Job::Kind::read_at: run_read_at(*job); break;
        }
      } catch (const std::bad_alloc&) {
        // Not out of this thread (std::terminate): the job fails, naming its file.
        job->fail(job->kind == Job::Kind::open ? "open" : "read", ENOMEM);
      }
      complete(job);
    }
  }

  // Hands a finished job to the io_context; one drain handler is posted per batch.
  void complete(Job* job) {
    bool post;
    {
      std::lock_guard lock(completions_->mutex);
      completions_->done.push_back(job);
      post = !std::exchange(completions_->drain_posted, true);
    }
    if (post) {
      asio::post(ctx_, [completions = completions_] {
        // A job resumed here may destroy the backend; the destructor then resumes the rest.
        while (Job* job = completions->pop()) resume(job);
      });
    }
  }

  asio::io_context& ctx_;
  ReaderOptions options_;
  std::size_t first_read_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job*> queue_;
  // NOTE: read without the lock by the awaiter; it changes only in the destructor, which the
  // contract puts on the io_context's thread, where every awaiter runs.
  bool stopping_ = false;
  std::atomic<std::uint64_t> operations_{0};
  std::shared_ptr<Completions> completions_ = std::make_shared<Completions>();
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<ReaderBackend> make_pread_backend(asio::io_context& ctx,
                                                  const ReaderOptions& options) {
  return std::make_unique<PreadBackend>(ctx, options);
}

}  // namespace coload::io::detail
