// The parent's side of process workers: ProcessPool, its shared-memory arena, death detection.
//
// Every worker is a child forked from the loader's driver thread (or by the fork server),
// linked to the parent by a SOCK_SEQPACKET socket pair (one message a task or a reply; the
// slot's memfd rides along with each task as SCM_RIGHTS). The parent watches each child's socket
// and pidfd on the driver's io_context: replies resume the fetch that waits for them; a readable
// pidfd means the child is gone, and its replies still queued in the socket are taken before its
// death is judged.
//
// The arena is a set of slots, each a memfd the parent maps once (and again only when a child
// grew it). A slot is taken per task and comes back when the last tensor made over it dies.

#include <asio/posix/stream_descriptor.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/exec/errors.hpp"
#include "coload/exec/fork.hpp"
#include "coload/exec/process.hpp"
#include "messages.hpp"
#include "workers.hpp"

namespace coload {
namespace {
std::atomic<WorkerFork> worker_fork{nullptr};
}  // namespace
void set_worker_fork(WorkerFork fork) noexcept { worker_fork.store(fork); }
}  // namespace coload

namespace coload::detail {

namespace {

/// The name of signal `sig`, as "SIGSEGV".
std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_death(int worker, int pid, int status, std::int64_t batch,
                           const std::vector<std::int64_t>& indices);

/// `broke`: what the parent adds (why it killed a worker that broke the protocol), or empty.
std::string describe_death(int worker, int pid, int status, std::int64_t batch,
                           const std::vector<std::int64_t>& indices, const std::string& broke) {
  std::string s = describe_death(worker, pid, status, batch, indices);
  if (!broke.empty()) s += ", " + broke;
  return s;
}

std::string describe_death(int worker, int pid, int status, std::int64_t batch,
                           const std::vector<std::int64_t>& indices) {
  std::string s = "DataLoader worker " + std::to_string(worker) + " (pid " +
                  std::to_string(pid) + ")";
  if (WIFSIGNALED(status)) {
    s += " was killed by signal " + signal_name(WTERMSIG(status)) + " (" +
         ::strsignal(WTERMSIG(status)) + ")";
  } else {
    s += " exited with code " + std::to_string(WEXITSTATUS(status));
  }
  if (batch < 0) {
    s += " while idle, between batches";
    return s;
  }
  s += " while fetching batch " + std::to_string(batch);
  if (!indices.empty()) {
    s += " (indices ";
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i == 8 && indices.size() > 10) {
        s += ", ... " + std::to_string(indices.size() - 9) + " more, " + std::to_string(indices.back());
        break;
      }
      if (i) s += ", ";
      s += std::to_string(indices[i]);
    }
    s += ")";
  }
  return s;
}

/// The slots, shared by every lease so that tensors may outlive the pool.
class Arena {
 public:
  Arena(std::function<void(void*, std::size_t)> pin, std::function<void(void*)> unpin)
      : pin_(std::move(pin)), unpin_(std::move(unpin)) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (auto& s : slots_) {
      if (s.pinned && unpin_) unpin_(s.data);
      if (s.data) ::munmap(s.data, slot_span);
      if (s.fd >= 0) ::close(s.fd);
    }
  }

  /// A free slot, or a new empty one.
  std::int64_t take() {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      const auto id = free_.back();
      free_.pop_back();
      return id;
    }
    const int fd = ::memfd_create("coload-batch", MFD_CLOEXEC);
    if (fd < 0) throw_errno("coload: memfd_create for a batch slot", errno);
    slots_.push_back(Slot{fd, nullptr, 0, 0});
    return static_cast<std::int64_t>(slots_.size() - 1);
  }
  void give_back(std::int64_t id) {
    // In a process forked from the owner (a Python worker finalising a batch it inherited),
    // the free list is a copy nobody reads, and its mutex may have been held by another of
    // the owner's threads at the fork: nothing to give back.
    if (::getpid() != owner_) return;
    std::lock_guard lock(mutex_);
    free_.push_back(id);
  }
  std::pair<int, std::uint64_t> fd_and_size(std::int64_t id) {
    std::lock_guard lock(mutex_);
    const auto& s = slots_[static_cast<std::size_t>(id)];
    return {s.fd, s.size};
  }
  /// The slot's first `bytes` bytes, now that a child has made it `size` bytes long.
  std::span<const std::byte> view(std::int64_t id, std::uint64_t size, std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    auto& s = slots_[static_cast<std::size_t>(id)];
    if (size != s.size) {
      // Told by the child, checked against the memfd: a view past its end would be SIGBUS
      // here, in the parent.
      struct stat st {};
      if (::fstat(s.fd, &st) != 0) throw_errno("coload: fstat of a batch slot", errno);
      if (size > slot_span || size > static_cast<std::uint64_t>(st.st_size)) {
        throw RuntimeError("coload: a worker says its slot holds " + std::to_string(size) +
                           " bytes, but it holds " + std::to_string(st.st_size));
      }
      s.size = size;
    }
    if (bytes > size) {
      throw RuntimeError("coload: a worker's batch of " + std::to_string(bytes) +
                         " bytes overruns its slot of " + std::to_string(size));
    }
    if (!s.data && size) {
      s.data = map_slot(s.fd);
      // NOTE: workers map the slot themselves: forking the next ones need not copy the page
      // tables of the parent's view (tens of MB per slot once the consumer has read it).
      (void)::madvise(s.data, slot_span, MADV_DONTFORK);
    }
    // The parent's view is page-locked as far as the slot reaches (again when it grew).
    if (pin_ && s.data && s.pinned != size) {
      if (s.pinned && unpin_) unpin_(s.data);
      s.pinned = 0;
      pin_(s.data, size);
      s.pinned = size;
    }
    return {s.data, bytes};
  }

 private:
  struct Slot {
    int fd;
    std::byte* data;     // slot_span bytes reserved, the first `size` backed by the memfd
    std::uint64_t size;
    std::uint64_t pinned;  // bytes of the view page-locked through pin_
  };
  std::function<void(void*, std::size_t)> pin_;
  std::function<void(void*)> unpin_;
  const pid_t owner_ = ::getpid();
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::int64_t> free_;
};

struct SlotLease {
  std::shared_ptr<Arena> arena;
  std::int64_t id;
  SlotLease(std::shared_ptr<Arena> a, std::int64_t i) : arena(std::move(a)), id(i) {}
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() { arena->give_back(id); }
};

}  // namespace

struct ProcessPool::Pending {
  ProcessTask task;
  int worker = -1;
  std::int64_t slot = -1;
  std::coroutine_handle<> waiter;
  std::optional<ProcessResult> result;
  std::exception_ptr error;
  bool done = false;
};

namespace {
struct Worker : std::enable_shared_from_this<Worker> {
  int id = 0;
  int pid = -1;
  std::int64_t generation = 0;  // the start() that forked it (ProcessPool::start)
  bool via_server = false;  // a fork-server worker: the server reaps it
  std::unique_ptr<asio::posix::stream_descriptor> socket;
  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  std::deque<std::shared_ptr<ProcessPool::Pending>> outstanding;
  // The last `unsent` of `outstanding` wait to be sent: the socket was full (each task is a
  // record in its buffer until the worker reads it). They go in order as it drains, and the
  // stop after them where one was asked for meanwhile.
  std::size_t unsent = 0;
  bool stop_unsent = false;
  bool write_armed = false;  // a wait for room is pending
  bool exited = false;
  std::string broke;  // what the parent adds to its death: why it killed it, or why it guessed

  /// Sends `sig` through the pidfd: to this very process, never to another that was given its
  /// pid once it was reaped (a fork-server worker is reaped by the server, whenever it ends).
  /// Without a pidfd (let go of once the worker was reaped), nothing is sent. Where the call
  /// itself is refused (a seccomp filter), kill() by pid, as a worker that never got the
  /// signal would be waited for without end: for our own child, whose pid is its own until we
  /// reap it; for a fork-server worker, only while its pidfd says it has not ended.
  void signal(int sig) const noexcept {
    if (!pidfd) return;
    const int fd = pidfd->native_handle();
    if (::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) == 0) return;
    if (errno != ENOSYS && errno != EPERM) return;  // ESRCH: it has ended
    pollfd ended{fd, POLLIN, 0};
    if (!via_server || ::poll(&ended, 1, 0) == 0) ::kill(pid, sig);
  }
};
}  // namespace

/// What a forked worker runs as its whole body: exec's child loop over the owner's ChildWork.
using ChildMain = std::function<void(ChildLink& link, int worker_id)>;

struct ProcessPool::State : std::enable_shared_from_this<ProcessPool::State> {
  asio::io_context& driver;
  Options options;
  ChildMain main;
  std::shared_ptr<Arena> arena =
      std::make_shared<Arena>(options.pin_range, options.unpin_range);
  std::vector<std::shared_ptr<Worker>> workers;    // by id; null where none runs
  std::vector<std::shared_ptr<Worker>> departing;  // retired or killed, not yet reaped
  std::vector<int> restarts;
  bool broken = false;
  bool shut = false;
  // A worker that died holding no batch, under `raise`: the next submit carries it.
  std::exception_ptr idle_death;
  std::exception_ptr cancelled;
  std::size_t next_worker = 0;
  std::vector<std::function<void()>> retired;  // waiting for every departing worker's end
  std::int64_t generation = 0;  // of the workers start() forks now

  /// Asks current workers of `up_to` and before to exit after their queued tasks: they depart.
  void stop_workers(std::int64_t up_to) {
    for (auto& w : workers) {
      if (!w || w->generation > up_to) continue;
      // NOTE: the stop is not a task that is answered: it is not queued as outstanding.
      w->stop_unsent = true;
      if (w->unsent == 0) flush(*w);
      departing.push_back(std::move(w));
      w.reset();
    }
  }

  void notify_retired() {
    if (!departing.empty() && !shut) return;
    auto waiting = std::move(retired);
    retired.clear();
    for (auto& f : waiting) f();
  }

  State(asio::io_context& d, Options o, ChildMain m)
      : driver(d), options(o), main(std::move(m)),
        workers(static_cast<std::size_t>(o.num_workers)),
        restarts(static_cast<std::size_t>(o.num_workers), 0) {}

  void spawn(int id) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      throw_errno("coload: socketpair for worker " + std::to_string(id), errno);
    }
    const pid_t parent = ::getpid();
    pid_t pid = -1;
    int pidfd = -1;
    if (options.entry) {
      try {
        pid = forkserver_spawn(options.entry, id, sv[1], options.payload, options.metrics, pidfd);
      } catch (...) {
        ::close(sv[0]);
        ::close(sv[1]);
        throw;
      }
    } else {
      const WorkerFork fork = worker_fork.load();
      pid = fork ? fork() : ::fork();
    }
    if (pid < 0) {
      const int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      throw_errno("coload: fork for worker " + std::to_string(id), err);
    }
    if (pid == 0) {
      // The child: never returns, nor unwinds into the driver's code that called spawn().
      try {
        ::close(sv[0]);
        prepare_worker(parent);
        run_worker(id, [&] {
          ChildLink link(sv[1]);
          main(link, id);
        });
      } catch (...) {
      }
      ::_exit(70);
    }
    ::close(sv[1]);
    // NOTE: a fork-server worker is the server's child: the server opened its pidfd (which
    // says at once when it ends) before it could reap it, and reports its wait status.
    // NOTE: glibc 2.36's <sys/pidfd.h> lacks extern "C" for C++; the system call is direct.
    if (!options.entry) {
      pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) {
        const int err = errno;
        ::kill(pid, SIGKILL);  // our own child, not reaped yet: the pid is still its own
        reap(pid, false);
        ::close(sv[0]);
        throw_errno("coload: pidfd_open for worker " + std::to_string(id), err);
      }
    }
    std::shared_ptr<Worker> w;
    try {
      w = std::make_shared<Worker>();
      w->id = id;
      w->pid = pid;
      w->generation = generation;
      w->via_server = options.entry != nullptr;
      // NOTE: registering a descriptor with the reactor may fail (epoll_ctl: ENOSPC, ENOMEM);
      // the fd is then still ours.
      w->socket = std::make_unique<asio::posix::stream_descriptor>(driver, sv[0]);
      sv[0] = -1;
      w->pidfd = std::make_unique<asio::posix::stream_descriptor>(driver, pidfd);
      pidfd = -1;
    } catch (...) {
      // The child runs, and nothing would watch it, send it a task or reap it: it goes now.
      if (w) w->socket.reset();
      if (sv[0] >= 0) ::close(sv[0]);
      if (::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) != 0) {
        // Refused (seccomp): by pid, as Worker::signal, while the pid is still the child's.
        pollfd ended{pidfd, POLLIN, 0};
        if (!options.entry || ::poll(&ended, 1, 0) == 0) ::kill(pid, SIGKILL);
      }
      try {
        (void)reap(pid, options.entry != nullptr);
      } catch (...) {
        // The fork server has gone, and its workers with it.
      }
      ::close(pidfd);
      throw;
    }
    workers[static_cast<std::size_t>(id)] = w;
    watch_socket(w);
    watch_pid(w);
  }

  /// Waits for worker `pid` to end; its wait status.
  static int reap(pid_t pid, bool via_server) {
    if (via_server) return forkserver_status(pid);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }

  /// Sends `w`'s tasks held back and then its stop, where asked for, in order, while the
  /// socket takes them; waits for room for the rest. A send that fails otherwise kills the
  /// worker, whose death reports (or, restarted, sends again) its batches.
  void flush(Worker& w) {
    if (!w.socket || !w.broke.empty()) return;
    // A task that cannot be sent fails alone, as in send(), once the queue is settled (failing
    // it resumes its consumer, which may submit again).
    std::vector<std::pair<std::shared_ptr<Pending>, std::exception_ptr>> failed;
    const auto fail_those = [&] {
      for (auto& [p, e] : failed) fail(*p, e);
    };
    try {
      while (w.unsent > 0) {
        const auto at = w.outstanding.end() - static_cast<std::ptrdiff_t>(w.unsent);
        try {
          if (send_task(w, **at) == SendOutcome::full) {
            wait_for_room(w);
            return fail_those();
          }
        } catch (const std::exception& e) {
          failed.emplace_back(*at, std::make_exception_ptr(not_sent(w, **at, e)));
          w.outstanding.erase(at);
        }
        --w.unsent;
      }
      if (w.stop_unsent) {
        ProcessTask stop;
        stop.kind = ProcessTask::Kind::stop;
        const auto outcome =
            try_send_value(w.socket->native_handle(), TaskMessage{stop, -1, 0, 0});
        if (outcome == SendOutcome::full) {
          wait_for_room(w);
          return fail_those();
        }
        w.stop_unsent = false;
      }
    } catch (const std::exception& e) {
      // The stop could not be sent: the worker is let go of by force.
      w.broke = std::string("by the parent, which could not send it its stop: ") + e.what();
      w.signal(SIGKILL);
    }
    fail_those();
  }
  void wait_for_room(Worker& w) {
    if (w.write_armed) return;
    w.write_armed = true;
    w.socket->async_wait(
        asio::posix::stream_descriptor::wait_write,
        [self = shared_from_this(), w = w.shared_from_this()](std::error_code ec) {
          w->write_armed = false;
          if (self->shut || !w->socket) return;
          if (ec == asio::error::operation_aborted) return;
          if (ec) {
            // Its held-back tasks would wait for ever: it dies, and its death reports them.
            w->broke = "by the parent, whose wait to send it a task failed: " + ec.message();
            w->signal(SIGKILL);
            return;
          }
          self->flush(*w);
        });
  }

  void watch_socket(const std::shared_ptr<Worker>& w) {
    w->socket->async_wait(asio::posix::stream_descriptor::wait_read,
                          [self = shared_from_this(), w](std::error_code ec) {
                            if (ec || self->shut) return;
                            if (self->drain_or_kill(*w)) self->watch_socket(w);
                          });
  }
  void watch_pid(const std::shared_ptr<Worker>& w) {
    w->pidfd->async_wait(asio::posix::stream_descriptor::wait_read,
                         [self = shared_from_this(), w](std::error_code ec) {
                           if (ec || self->shut) return;
                           self->on_exit(w);
                         });
  }

  /// drain, for a worker still trusted: one whose reply cannot be used (malformed, for a batch
  /// it was not given, past its slot) is killed, and its death reports its batches as any
  /// death does, saying why. False once nothing more is to be read from it. An exception
  /// here would leave the driver's loop, and end the process the workers exist to protect.
  bool drain_or_kill(Worker& w) {
    if (!w.broke.empty()) return false;
    try {
      return drain(w);
    } catch (const std::exception& e) {
      w.broke = std::string("by the parent, which could not use what it sent: ") + e.what();
      w.signal(SIGKILL);
      return false;
    }
  }

  /// Takes every reply queued on `w`'s socket. False once the socket is at its end.
  bool drain(Worker& w) {
    MessageBuffer buffer(max_message);
    for (;;) {
      const ssize_t n = receive_message(w.socket->native_handle(), buffer, nullptr, true);
      if (n < 0) return true;
      if (n == 0) return false;
      ProcessReply reply = decode_value<ProcessReply>(buffer);
      if (w.outstanding.size() == w.unsent || w.outstanding.front()->task.batch != reply.batch) {
        throw RuntimeError("coload: worker " + std::to_string(w.id) +
                                 " answered a batch it was not given");
      }
      auto p = w.outstanding.front();
      w.outstanding.pop_front();
      ProcessResult result;
      result.worker = w.id;
      result.pid = w.pid;
      try {
        if (reply.status == ProcessReply::Status::batch) {
          if (reply.offset > std::numeric_limits<std::uint64_t>::max() - reply.bytes) {
            throw RuntimeError("coload: a batch's offset and length overflow");
          }
          result.bytes = arena->view(p->slot, reply.slot_bytes, reply.offset + reply.bytes);
          result.lease = std::make_shared<SlotLease>(arena, p->slot);
        } else {
          // The slot may have been grown without a batch in it: remember its size.
          (void)arena->view(p->slot, reply.slot_bytes, 0);
          arena->give_back(p->slot);
        }
      } catch (const std::exception& e) {
        // Taken off the queue, the batch fails here (its slot given back), or it would never
        // end: the epoch would wait for it, and the loader's shutdown with it.
        fail(*p, std::make_exception_ptr(RuntimeError(
                     "coload: worker " + std::to_string(w.id) + "'s reply to batch " +
                     std::to_string(p->task.batch) + " could not be taken: " + e.what())));
        continue;
      }
      p->slot = -1;
      result.reply = std::move(reply);
      p->result = std::move(result);
      finish(*p);
    }
  }

  void finish(Pending& p) {
    p.done = true;
    if (p.waiter) std::exchange(p.waiter, nullptr).resume();
  }
  void fail(Pending& p, std::exception_ptr e) {
    if (p.slot >= 0) {
      arena->give_back(p.slot);
      p.slot = -1;
    }
    p.error = std::move(e);
    finish(p);
  }

  void on_exit(const std::shared_ptr<Worker>& w) {
    // Replies it sent before it went are results like any other.
    if (w->socket) drain_or_kill(*w);
    int status = 0;
    try {
      status = reap(w->pid, w->via_server);
    } catch (const std::exception& e) {
      // The fork server, which reports its workers' statuses, has gone (its workers go with
      // it): the death is reported as a kill, saying so, rather than ending the driver.
      status = SIGKILL;  // as a wait status: killed by SIGKILL
      if (w->broke.empty()) {
        w->broke = std::string("as its workers are once the fork server has gone (") + e.what() +
                   "): its own exit status is unknown";
      }
    }
    w->exited = true;
    std::erase(departing, w);
    notify_retired();
    const bool current = workers[static_cast<std::size_t>(w->id)] == w;
    if (current) workers[static_cast<std::size_t>(w->id)].reset();
    w->socket.reset();
    w->pidfd.reset();
    if (w->outstanding.empty()) {
      // NOTE: a current worker exits only when it dies: one told to stop has departed first.
      // Code 0 included (user code's exit(0), which the child turns into _exit(0)): ignored,
      // its batches would have been lost without a word.
      if (current && !shut) {
        // Died idle: nothing was lost. Under `restart` a new one is forked; under `raise`, or
        // when no new one can be (its restarts spent, or the fork failed), the next batch
        // asked for fails with it, as torch's DataLoader raises for a worker that died
        // whatever it was doing (its SIGCHLD handler), and nothing is dispatched after.
        const bool restarted = options.on_death == OnWorkerDeath::restart && try_restart(w->id);
        if (!restarted && !idle_death) {
          const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
          const int code = WIFSIGNALED(status) ? -1 : WEXITSTATUS(status);
          std::string what = describe_death(w->id, w->pid, status, -1, {}, w->broke);
          if (options.on_death == OnWorkerDeath::restart) {
            what += " (after " + std::to_string(restarts[static_cast<std::size_t>(w->id)]) +
                    " restarts)";
          }
          idle_death = std::make_exception_ptr(WorkerDied(what, w->id, w->pid, sig, code, -1, {}));
        }
      }
      return;
    }
    auto lost = std::move(w->outstanding);
    w->outstanding.clear();
    w->unsent = 0;
    if (!current) {
      // A departing worker: its tasks are those of an epoch that has ended or was broken off
      // (dropped there). No restart, which would take the slot of this epoch's worker, and no
      // breaking of this epoch: they end without a batch.
      for (auto& p : lost) fail(*p, std::make_exception_ptr(BatchLost{}));
      return;
    }
    const auto& first = lost.front();
    if (options.on_death == OnWorkerDeath::restart &&
        restarts[static_cast<std::size_t>(w->id)] < options.max_restarts && !shut) {
      ++restarts[static_cast<std::size_t>(w->id)];
      detail::warn(describe_death(w->id, w->pid, status, first->task.batch, first->task.indices,
                                  w->broke) +
                   "; restarting it (restart " +
                   std::to_string(restarts[static_cast<std::size_t>(w->id)]) + " of " +
                   std::to_string(options.max_restarts) + ")");
      try {
        spawn(w->id);
        auto& fresh = workers[static_cast<std::size_t>(w->id)];
        try {
          for (auto& p : lost) send(*fresh, p);
        } catch (...) {
          // The batches fail below, every one: none may stay queued on the new worker too
          // (its reply would find the batch ended, its slot given back). It departs, killed:
          // its end is not another death to report.
          auto gone = std::move(fresh);
          gone->outstanding.clear();
          gone->unsent = 0;
          gone->signal(SIGKILL);
          departing.push_back(std::move(gone));
          throw;
        }
        return;
      } catch (const std::exception& e) {
        // No new worker: the batches fail as under `raise`, saying why.
        detail::warn(std::string("coload: restarting worker ") + std::to_string(w->id) +
                     " failed: " + e.what());
      }
    }
    broken = true;
    std::string what =
        describe_death(w->id, w->pid, status, first->task.batch, first->task.indices, w->broke);
    if (options.on_death == OnWorkerDeath::restart) {
      what += " (after " + std::to_string(options.max_restarts) + " restarts)";
    }
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    const int code = WIFSIGNALED(status) ? -1 : WEXITSTATUS(status);
    // NOTE: made before fail() hands it on, so the temporary (which shares the message's
    // buffer) is gone by the time the consumer can read it on its own thread.
    auto died = std::make_exception_ptr(WorkerDied(what, w->id, w->pid, sig, code,
                                                   first->task.batch, first->task.indices));
    fail(*first, std::move(died));
    // The batches queued behind it were never started: they end without a batch.
    for (std::size_t i = 1; i < lost.size(); ++i) {
      fail(*lost[i], std::make_exception_ptr(BatchLost{}));
    }
  }

  /// Forks worker `id` again, within its restarts; false when it cannot (restarts spent, the
  /// pool shut, or the fork failed: warned).
  bool try_restart(int id) {
    if (restarts[static_cast<std::size_t>(id)] >= options.max_restarts || shut) return false;
    ++restarts[static_cast<std::size_t>(id)];
    try {
      spawn(id);
      return true;
    } catch (const std::exception& e) {
      detail::warn(std::string("coload: restarting worker ") + std::to_string(id) +
                   " failed: " + e.what());
      return false;
    }
  }

  /// Queues `p` on worker `w`. Throws, with nothing queued and no slot held, when the task
  /// cannot be sent (the caller fails the batch with that error).
  void send(Worker& w, const std::shared_ptr<Pending>& p) {
    const bool took = p->slot < 0 && p->task.kind != ProcessTask::Kind::stop;
    if (took) p->slot = arena->take();
    bool sent = false;
    try {
      // Behind tasks held back, it waits its turn.
      sent = w.unsent == 0 && send_task(w, *p) != SendOutcome::full;
    } catch (const std::exception& e) {
      if (took) {
        arena->give_back(p->slot);
        p->slot = -1;
      }
      throw not_sent(w, *p, e);
    }
    p->worker = w.id;
    w.outstanding.push_back(p);
    if (!sent) {
      // NOTE: torch's queues take any number of tasks; a worker's socket holds about 200 KiB
      // of them (a prefetch_factor of 16 with batches of 1000 indices failed with EAGAIN).
      ++w.unsent;
      wait_for_room(w);
    }
  }

  static RuntimeError not_sent(const Worker& w, const Pending& p, const std::exception& e) {
    return RuntimeError("coload: batch " + std::to_string(p.task.batch) + " (" +
                        std::to_string(p.task.indices.size()) +
                        " indices) could not be sent to worker " + std::to_string(w.id) + ": " +
                        e.what());
  }

  /// Sends `p`'s task to `w`, its slot's memfd attached. A worker that is gone reports through
  /// its pidfd (its queue is handled there): that counts as sent.
  SendOutcome send_task(Worker& w, Pending& p) {
    const auto [fd, size] =
        p.slot >= 0 ? arena->fd_and_size(p.slot) : std::pair<int, std::uint64_t>{-1, 0};
    const int socket = w.socket->native_handle();
    if (p.task.indices.size() <= inline_indices || fd < 0) {
      return try_send_value(socket, TaskMessage{p.task, p.slot, size, 0}, {fd});
    }
    // A long list goes in an index file after the slot's memfd; the task keeps its list (a
    // restarted worker is sent it again).
    ProcessTask head;
    std::vector<std::int64_t> indices = std::move(p.task.indices);
    head = p.task;
    p.task.indices = std::move(indices);
    const int index_fd = make_index_file(p.task.indices);
    SendOutcome outcome = SendOutcome::sent;
    try {
      outcome = try_send_value(socket, TaskMessage{head, p.slot, size, p.task.indices.size()},
                               {fd, index_fd});
    } catch (...) {
      ::close(index_fd);
      throw;
    }
    ::close(index_fd);
    return outcome;
  }

  int pick(int wanted) {
    if (wanted >= 0) return wanted;
    int best = -1;
    const std::size_t n = workers.size();
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (next_worker + k) % n;
      if (!workers[i]) continue;
      if (best < 0 || workers[i]->outstanding.size() <
                          workers[static_cast<std::size_t>(best)]->outstanding.size()) {
        best = static_cast<int>(i);
      }
    }
    next_worker = (next_worker + 1) % std::max<std::size_t>(n, 1);
    return best;
  }
};

bool ProcessPool::Awaiter::await_ready() const noexcept { return pending->done; }
void ProcessPool::Awaiter::await_suspend(std::coroutine_handle<> h) const noexcept {
  pending->waiter = h;
}
ProcessResult ProcessPool::Awaiter::await_resume() const {
  // NOTE: the error leaves the pending record, so the exception has one owner on its way to
  // the consumer: the driver never drops the last reference after the consumer has read it.
  if (pending->error) std::rethrow_exception(std::exchange(pending->error, nullptr));
  return std::move(*pending->result);
}

ProcessPool::ProcessPool(asio::io_context& driver, Options options, ChildWork work)
    : state_(std::make_shared<State>(
          driver, options, ChildMain([work = std::move(work)](ChildLink& link, int id) {
            run_child(link, id, work);
          }))) {}

ProcessPool::~ProcessPool() {
  auto& s = *state_;
  s.shut = true;
  std::vector<std::shared_ptr<Worker>> all = s.departing;
  for (auto& w : s.workers) {
    if (w) all.push_back(w);
  }
  for (auto& w : all) {
    if (!w->exited) w->signal(SIGTERM);
  }
  // Wait for each to go, up to the grace period, then kill what is left.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(s.options.grace));
  for (auto& w : all) {
    if (w->exited || !w->pidfd) continue;
    pollfd p{w->pidfd->native_handle(), POLLIN, 0};
    int ready = -1;
    do {  // a signal's EINTR is not its end: waitpid below would wait for ever on one that
          // ignores SIGTERM
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) w->signal(SIGKILL);
  }
  for (auto& w : all) {
    if (w->exited) continue;
    try {
      State::reap(w->pid, w->via_server);
    } catch (...) {
      // The fork server has gone, and its workers with it.
    }
    w->exited = true;
    w->socket.reset();
    w->pidfd.reset();
  }
  if (s.options.payload >= 0) ::close(s.options.payload);
}

std::int64_t ProcessPool::start(bool fresh) {
  auto& s = *state_;
  if (s.shut) return s.generation;
  if (fresh) {
    // The workers still running belong to an epoch broken off whose end has not come yet:
    // they finish its queued tasks and go, and this epoch forks its own.
    s.stop_workers(s.generation);
    ++s.generation;
  }
  for (int i = 0; i < s.options.num_workers; ++i) {
    if (!s.workers[static_cast<std::size_t>(i)]) s.spawn(i);
  }
  s.broken = false;
  return s.generation;
}

void ProcessPool::retire(std::int64_t generation, std::function<void()> done) {
  auto& s = *state_;
  if (s.shut) {
    done();
    return;
  }
  s.retired.push_back(std::move(done));
  s.stop_workers(generation);
  s.notify_retired();
}

void ProcessPool::shutdown(std::exception_ptr cancelled) {
  auto& s = *state_;
  if (s.shut) return;
  s.shut = true;
  s.cancelled = cancelled;
  std::vector<std::shared_ptr<Worker>> all = s.departing;
  for (auto& w : s.workers) {
    if (w) all.push_back(w);
  }
  for (auto& w : all) {
    w->signal(SIGTERM);
    // NOTE: cancelling the waits lets the driver's io_context run out of work; the destructor
    // reaps the children.
    if (w->socket) w->socket->cancel();
    if (w->pidfd) w->pidfd->cancel();
    auto lost = std::move(w->outstanding);
    w->outstanding.clear();
    w->unsent = 0;
    for (auto& p : lost) s.fail(*p, cancelled);
  }
  s.notify_retired();
}

bool ProcessPool::broken() const noexcept { return state_->broken; }

std::pair<int, int> ProcessPool::holder(std::int64_t batch, std::vector<std::int64_t>& indices,
                                        std::int64_t& count) const {
  for (const auto& w : state_->workers) {
    if (!w) continue;
    for (const auto& p : w->outstanding) {
      if (p->task.batch != batch) continue;
      const auto& all = p->task.indices;
      const std::size_t n = std::min<std::size_t>(all.size(), 8);
      indices.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
      count = static_cast<std::int64_t>(all.size());
      return {w->id, w->pid};
    }
  }
  return {-1, -1};
}

ProcessPool::Awaiter ProcessPool::submit(int worker, ProcessTask task) {
  auto& s = *state_;
  auto p = std::make_shared<Pending>();
  p->task = std::move(task);
  if (s.shut) {
    s.fail(*p, s.cancelled);
    return Awaiter{p};
  }
  if (s.idle_death) {
    s.broken = true;
    s.fail(*p, std::exchange(s.idle_death, nullptr));
    return Awaiter{p};
  }
  const int w = s.pick(worker);
  if (w < 0 || !s.workers[static_cast<std::size_t>(w)]) {
    // Every worker is gone (each death already reported): nothing fetches this batch.
    s.fail(*p, std::make_exception_ptr(BatchLost{}));
    return Awaiter{p};
  }
  s.send(*s.workers[static_cast<std::size_t>(w)], p);
  return Awaiter{p};
}

}  // namespace coload::detail
