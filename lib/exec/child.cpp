// The child's side of process workers: its setup after fork, its link to the parent, its loop.
//
// The link reads tasks, lends the task's slot as the batch allocator and sends replies; the
// loop runs the owner's fetch function for each task (see ChildWork in coload/exec/process.hpp).

#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <stdexcept>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/exec/process.hpp"
#include "messages.hpp"
#include "workers.hpp"

namespace coload::detail {

// ---- what every worker process does first ---------------------------------------------------

void prepare_worker(pid_t parent) {
  // NOTE: handlers the program installed for fatal signals (a test framework's, a crash
  // reporter's) are the parent's business: a worker dies of the signal itself, and the
  // parent reports it.
  for (int sig : {SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE, SIGCHLD}) {
    ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // NOTE: exit() in dataset code would run the parent's static destructors and atexit
  // handlers here, some of which join threads that do not exist in a forked child and hang.
  // Registered last, this handler runs first and leaves with the status at once.
  ::on_exit([](int status, void*) { ::_exit(status); }, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  // NOTE: a parent's OpenMP pool has no threads here; one thread keeps ATen from entering it
  // (GNU OpenMP hangs a forked child that does). Only when needed: setting it builds ATen's
  // pthreadpool, a thread of its own.
  if (at::get_num_threads() != 1) at::set_num_threads(1);
}

void run_worker(int id, const std::function<void()>& body) {
  int code = 0;
  try {
    body();
  } catch (const std::exception& e) {
    detail::warn("worker " + std::to_string(id) + ": " + e.what(), "coload: ");
    code = 70;
  } catch (...) {
    code = 70;
  }
  std::fflush(stderr);
  ::_exit(code);
}

std::byte* map_slot(int fd) {
  void* p = ::mmap(nullptr, slot_span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) throw_errno("coload: mapping a shared-memory batch slot", errno);
  return static_cast<std::byte*>(p);
}

// ---- the link to the parent -------------------------------------------------------------------

ChildLink::~ChildLink() {
  for (auto& m : mappings_) {
    if (m.data) ::munmap(m.data, slot_span);
    if (m.fd >= 0) ::close(m.fd);
  }
}

std::optional<ProcessTask> ChildLink::next() {
  MessageBuffer buffer(max_message);
  int fd = -1;
  int index_fd = -1;
  const ssize_t n = receive_message(socket_, buffer, &fd, false, &index_fd);
  if (n <= 0) return std::nullopt;
  TaskMessage message;
  try {
    message = decode_value<TaskMessage>(buffer);
    const std::uint64_t in_file = std::get<3>(message);
    if (in_file > 0 && index_fd < 0) {
      throw wire::FormatError("wire: a worker task of " + std::to_string(in_file) +
                              " indices in a file came without the file");
    }
    if (in_file > 0 && !std::get<0>(message).indices.empty()) {
      throw wire::FormatError("wire: a worker task with indices in a file and in the message");
    }
    if (in_file > 0) std::get<0>(message).indices = read_index_file(index_fd, in_file);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    if (index_fd >= 0) ::close(index_fd);
    throw;
  }
  if (index_fd >= 0) ::close(index_fd);
  auto& [t, slot_id, slot_bytes, in_file] = message;
  slot_id_ = slot_id;
  slot_bytes_ = slot_bytes;
  used_ = 0;
  if (t.kind == ProcessTask::Kind::stop) {
    if (fd >= 0) ::close(fd);
    return std::nullopt;
  }
  if (slot_id_ >= 0) {
    if (mappings_.size() <= static_cast<std::size_t>(slot_id_)) {
      mappings_.resize(static_cast<std::size_t>(slot_id_) + 1);
    }
    auto& m = mappings_[static_cast<std::size_t>(slot_id_)];
    if (m.fd < 0) {
      m.fd = fd;
    } else if (fd >= 0) {
      ::close(fd);  // the same memfd as the one kept
    }
  } else if (fd >= 0) {
    ::close(fd);
  }
  return std::move(t);
}

std::span<std::byte> ChildLink::slot(std::size_t bytes) {
  if (slot_id_ < 0) throw LogicError("coload: a task without a slot");
  auto& m = mappings_[static_cast<std::size_t>(slot_id_)];
  if (bytes > slot_span) {
    throw RuntimeError("coload: a batch of " + std::to_string(bytes) +
                          " bytes exceeds a worker process's slot (" +
                          std::to_string(slot_span) + " bytes)");
  }
  if (bytes > slot_bytes_) {
    // Grow with some room, so that batches a little larger next time fit.
    const std::size_t grown = std::min(slot_span, round_up(bytes + bytes / 8, 1 << 21));
    if (::ftruncate(m.fd, static_cast<off_t>(grown)) != 0) {
      throw_errno("coload: growing a shared-memory slot to " + std::to_string(grown) + " bytes",
                  errno);
    }
    slot_bytes_ = grown;
  }
  if (!m.data) m.data = map_slot(m.fd);
  if (m.populated < slot_bytes_) {
    // NOTE: a fresh child maps every slot anew; faulting its pages in one call costs a
    // fraction of taking a fault per 4 KiB page while the batch is written (a kernel before
    // 5.14 refuses, and the pages fault in one by one as before).
    (void)::madvise(m.data + m.populated, slot_bytes_ - m.populated, MADV_POPULATE_WRITE);
    m.populated = slot_bytes_;
  }
  return {m.data, slot_bytes_};
}

void* ChildLink::allocate(std::size_t nbytes) {
  if (slot_id_ < 0) return nullptr;
  const std::size_t at = used_;
  const std::size_t end = round_up(at + nbytes, 64);
  std::byte* base = slot(end).data();
  used_ = end;
  return base + at;
}

void ChildLink::reply(ProcessReply reply) {
  reply.slot_bytes = slot_bytes_;
  send_value(socket_, reply);
}

// ---- the child's loop -------------------------------------------------------------------------

namespace {
void fill_error(ProcessReply& reply, const WorkerError& e) {
  reply.status = ProcessReply::Status::error;
  reply.error_what = e.what();
  reply.error_type = e.original_type();
  reply.error_message = e.original_message();
  reply.error_index = e.index();
}
}  // namespace

void run_child(ChildLink& link, int worker_id, const ChildWork& work) {
  if (work.start) work.start(worker_id);
  while (auto task = link.next()) {
    ProcessReply reply;
    reply.batch = task->batch;
    const std::int64_t skipped_before = work.skipped ? work.skipped() : 0;
    try {
      // Collate's output is carved from the task's slot: the batch is encoded where it lies.
      BatchAllocatorScope in_slot(&link);
      work.fetch(*task, link, reply);
    } catch (const EmptyBatch&) {
      reply.status = ProcessReply::Status::empty;
    } catch (const WorkerError& e) {
      fill_error(reply, e);
    } catch (...) {
      fill_error(reply, wrap_current_exception(worker_id, task->batch, -1, "fetching"));
    }
    // A stream that failed has nothing after this reply.
    if (task->kind == ProcessTask::Kind::stream && reply.status == ProcessReply::Status::error) {
      reply.stream_over = true;
    }
    set_worker_info(nullptr);
    if (work.skipped) reply.skipped = work.skipped() - skipped_before;
    link.reply(std::move(reply));
  }
  if (work.finish) work.finish();
}

}  // namespace coload::detail
