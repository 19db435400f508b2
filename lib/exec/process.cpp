// Process workers: fork, the task socket, the shared-memory arena, and death detection.
//
// Every worker is a child forked from the loader's driver thread, linked to the parent by a
// SOCK_SEQPACKET socket pair (one message a task or a reply; the slot's memfd rides along with
// each task as SCM_RIGHTS). The parent watches each child's socket and pidfd on the driver's
// io_context: replies resume the fetch that waits for them; a readable pidfd means the child
// is gone, and its replies still queued in the socket are taken before its death is judged.
//
// The arena is a set of slots, each a memfd the parent maps once (and again only when a child
// grew it). A slot is taken per task and comes back when the last tensor made over it dies.

#include "coload/exec/process.hpp"

#include <ATen/Parallel.h>
#include <asio/posix/stream_descriptor.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "coload/core/math.hpp"
#include "coload/core/warning.hpp"
#include "coload/exec/errors.hpp"

namespace coload::detail {

namespace {

[[noreturn]] void throw_errno(const std::string& what, int err) {
  throw std::system_error(err, std::generic_category(), what);
}

// ---- messages -------------------------------------------------------------------------------
// A message is a flat little-endian record: fixed fields, then variable parts with lengths.

class Out {
 public:
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    // NOTE: error texts are capped so a reply always fits one socket message.
    const std::size_t n = std::min<std::size_t>(s.size(), 16 * 1024);
    put<std::uint64_t>(n);
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + n);
  }
  std::vector<std::byte> bytes;
};

class In {
 public:
  In(const std::byte* p, std::size_t n) : p_(p), n_(n) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + at_), n);
    at_ += n;
    return s;
  }

 private:
  void need(std::size_t k) const {
    if (at_ + k > n_) throw std::runtime_error("coload: a worker message is truncated");
  }
  const std::byte* p_;
  std::size_t n_;
  std::size_t at_ = 0;
};

constexpr std::uint32_t task_magic = 0x434c5431;   // "CLT1"
constexpr std::uint32_t reply_magic = 0x434c5231;  // "CLR1"
constexpr std::size_t max_message = 256 * 1024;

std::vector<std::byte> encode_task(const ProcessTask& t, std::int64_t slot, std::uint64_t slot_bytes) {
  Out o;
  o.put(task_magic);
  o.put(static_cast<std::uint32_t>(t.kind));
  o.put(t.batch);
  o.put(t.epoch);
  o.put(t.worker_seed);
  o.put(t.sample_seed);
  o.put(t.want);
  o.put(slot);
  o.put(slot_bytes);
  o.put<std::uint64_t>(t.indices.size());
  for (auto i : t.indices) o.put(i);
  return std::move(o.bytes);
}

std::vector<std::byte> encode_reply(const ProcessReply& r) {
  Out o;
  o.put(reply_magic);
  o.put(static_cast<std::uint32_t>(r.status));
  o.put(r.batch);
  o.put(r.offset);
  o.put(r.bytes);
  o.put(r.slot_bytes);
  o.put(r.skipped);
  o.put<std::uint8_t>(r.stream_over ? 1 : 0);
  o.put(r.error_index);
  o.put_string(r.error_what);
  o.put_string(r.error_type);
  o.put_string(r.error_message);
  return std::move(o.bytes);
}

ProcessReply decode_reply(const std::byte* p, std::size_t n) {
  In in(p, n);
  if (in.get<std::uint32_t>() != reply_magic) {
    throw std::runtime_error("coload: a worker sent a message that is not a reply");
  }
  ProcessReply r;
  r.status = static_cast<ProcessReply::Status>(in.get<std::uint32_t>());
  r.batch = in.get<std::int64_t>();
  r.offset = in.get<std::uint64_t>();
  r.bytes = in.get<std::uint64_t>();
  r.slot_bytes = in.get<std::uint64_t>();
  r.skipped = in.get<std::int64_t>();
  r.stream_over = in.get<std::uint8_t>() != 0;
  r.error_index = in.get<std::int64_t>();
  r.error_what = in.get_string();
  r.error_type = in.get_string();
  r.error_message = in.get_string();
  return r;
}

/// Sends one message, with the fds in `fds` that are not -1 attached. False when the peer is
/// gone.
bool send_message(int socket, const std::vector<std::byte>& bytes, std::initializer_list<int> fds) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  int attached[2];
  std::size_t n_fds = 0;
  for (int fd : fds) {
    if (fd >= 0 && n_fds < 2) attached[n_fds++] = fd;
  }
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (n_fds) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    std::memcpy(CMSG_DATA(c), attached, n_fds * sizeof(int));
  }
  for (;;) {
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n >= 0) return true;
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return false;
    throw_errno("coload: sending to a worker", errno);
  }
}

/// Receives one message (and up to two attached fds into `fd`, -1 where none came). 0 at the
/// peer's end; -1 with EAGAIN when `dont_wait` and nothing is queued.
ssize_t receive_message(int socket, std::vector<std::byte>& buffer, int* fd, bool dont_wait,
                        int* second_fd = nullptr) {
  buffer.resize(max_message);
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (;;) {
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (n < 0 && errno == ECONNRESET) return 0;
    if (n < 0) throw_errno("coload: receiving from a worker", errno);
    int got[2] = {-1, -1};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t k = std::min<std::size_t>(2, (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        std::memcpy(got, CMSG_DATA(c), k * sizeof(int));
      }
    }
    if (fd) {
      *fd = got[0];
    } else if (got[0] >= 0) {
      ::close(got[0]);
    }
    if (second_fd) {
      *second_fd = got[1];
    } else if (got[1] >= 0) {
      ::close(got[1]);
    }
    buffer.resize(static_cast<std::size_t>(n));
    return n;
  }
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

}  // namespace

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}


// ---- what every worker process does first -----------------------------------------------------

namespace {

/// In a fresh worker, forked by `parent`: defaults for fatal signals, a prompt exit(), death
/// with the parent, one ATen thread.
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

/// Runs worker `id`'s body in a fresh worker and ends the process: status 0 when the body
/// returns, 70 when it throws (named on stderr).
[[noreturn]] void run_worker(int id, const std::function<void()>& body) {
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

// ---- the fork server --------------------------------------------------------------------------
// A child of main, started before main has threads. It forks each worker on request (the
// request carries the worker's socket and payload fds, and the address of the function to run:
// the server is a copy of this program, so the address is valid there), reaps its workers and
// reports each pid's wait status back.

constexpr std::uint32_t spawn_magic = 0x434c5331;    // "CLS1": main → server
constexpr std::uint32_t spawned_magic = 0x434c5032;  // "CLP2": server → main, a pid (or -errno)
constexpr std::uint32_t status_magic = 0x434c5733;   // "CLW3": server → main, pid and status

struct ForkServer {
  std::mutex mutex;
  int control = -1;
  pid_t pid = -1;
  std::map<int, int> statuses;  // pid → wait status, reported and not yet asked for

  /// Reads one message from the server (blocking): a status is kept, a spawn reply returned.
  std::optional<std::int64_t> read_one() {
    std::vector<std::byte> buffer;
    const ssize_t n = receive_message(control, buffer, nullptr, false);
    if (n <= 0) throw std::runtime_error("coload: the fork server has gone");
    In in(buffer.data(), buffer.size());
    const auto magic = in.get<std::uint32_t>();
    if (magic == status_magic) {
      const auto p = in.get<std::int32_t>();
      statuses[p] = in.get<std::int32_t>();
      return std::nullopt;
    }
    if (magic != spawned_magic) throw std::runtime_error("coload: the fork server is confused");
    return in.get<std::int64_t>();
  }
};
ForkServer g_server;

[[noreturn]] void serve(int control) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  const int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC);
  if (sfd < 0) ::_exit(1);
  const pid_t self = ::getpid();
  std::vector<std::byte> buffer;
  for (;;) {
    pollfd fds[2] = {{control, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ::_exit(1);
    }
    if (fds[1].revents) {
      signalfd_siginfo info;
      (void)!::read(sfd, &info, sizeof(info));
      int status = 0;
      for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
        Out o;
        o.put(status_magic);
        o.put<std::int32_t>(p);
        o.put<std::int32_t>(status);
        if (!send_message(control, o.bytes, {})) ::_exit(0);
      }
    }
    if (fds[0].revents) {
      int socket = -1, payload = -1;
      const ssize_t n = receive_message(control, buffer, &socket, false, &payload);
      if (n <= 0) ::_exit(0);  // main has gone
      In in(buffer.data(), buffer.size());
      if (in.get<std::uint32_t>() != spawn_magic) ::_exit(1);
      const auto entry = reinterpret_cast<ForkserverEntry>(in.get<std::uint64_t>());
      const auto id = in.get<std::int32_t>();
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(control);
        ::close(sfd);
        prepare_worker(self);
        run_worker(id, [&] { entry(socket, id, payload); });
      }
      const int err = errno;
      if (socket >= 0) ::close(socket);
      if (payload >= 0) ::close(payload);
      Out o;
      o.put(spawned_magic);
      o.put<std::int64_t>(pid < 0 ? -err : pid);
      if (!send_message(control, o.bytes, {})) ::_exit(0);
    }
  }
}

/// Asks the fork server for a worker; returns its pid (a child of the server, not of ours).
pid_t forkserver_spawn(ForkserverEntry entry, int id, int socket, int payload) {
  std::lock_guard lock(g_server.mutex);
  Out o;
  o.put(spawn_magic);
  o.put<std::uint64_t>(reinterpret_cast<std::uint64_t>(entry));
  o.put<std::int32_t>(id);
  if (!send_message(g_server.control, o.bytes, {socket, payload})) {
    throw std::runtime_error("coload: the fork server has gone");
  }
  for (;;) {
    if (auto r = g_server.read_one()) {
      if (*r < 0) throw_errno("coload: the fork server's fork for worker " + std::to_string(id),
                              static_cast<int>(-*r));
      return static_cast<pid_t>(*r);
    }
  }
}

/// The wait status of fork-server worker `pid`, once the server has reaped it (blocking).
int forkserver_status(pid_t pid) {
  std::lock_guard lock(g_server.mutex);
  for (;;) {
    if (auto it = g_server.statuses.find(pid); it != g_server.statuses.end()) {
      const int status = it->second;
      g_server.statuses.erase(it);
      return status;
    }
    (void)g_server.read_one();
  }
}

}  // namespace

void start_forkserver_impl() {
  std::lock_guard lock(g_server.mutex);
  if (g_server.pid > 0) return;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw_errno("coload: socketpair for the fork server", errno);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    throw_errno("coload: fork for the fork server", err);
  }
  if (pid == 0) {
    ::close(sv[0]);
    for (int sig : {SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE}) {
      ::signal(sig, SIG_DFL);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    ::prctl(PR_SET_NAME, "coload-forksrv");
    serve(sv[1]);
  }
  ::close(sv[1]);
  g_server.control = sv[0];
  g_server.pid = pid;
}

bool forkserver_running_impl() noexcept { return g_server.pid > 0; }

int payload_memfd(std::size_t size, const std::function<void(std::span<std::byte>)>& fill) {
  const int fd = ::memfd_create("coload-payload", MFD_CLOEXEC);
  if (fd < 0) throw_errno("coload: memfd_create for a worker payload", errno);
  const std::size_t mapped = std::max<std::size_t>(size, 1);
  void* p = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
    p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw_errno("coload: a worker payload of " + std::to_string(size) + " bytes", err);
  }
  try {
    fill({static_cast<std::byte*>(p), size});
  } catch (...) {
    ::munmap(p, mapped);
    ::close(fd);
    throw;
  }
  ::munmap(p, mapped);
  return fd;
}

std::span<const std::byte> map_payload(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("coload: fstat of a worker payload", errno);
  const auto size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, std::max<std::size_t>(size, 1), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw_errno("coload: mapping a worker payload", errno);
  return {static_cast<const std::byte*>(p), size};
}

// ---- the child's side -------------------------------------------------------------------------

namespace {
/// Reserves `slot_span` bytes of address space over memfd `fd` (pages past its size are never
/// touched: the slot is grown first).
std::byte* map_slot(int fd) {
  void* p = ::mmap(nullptr, slot_span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) throw_errno("coload: mapping a shared-memory batch slot", errno);
  return static_cast<std::byte*>(p);
}
}  // namespace

ChildLink::~ChildLink() {
  for (auto& m : mappings_) {
    if (m.data) ::munmap(m.data, slot_span);
    if (m.fd >= 0) ::close(m.fd);
  }
}

std::optional<ProcessTask> ChildLink::next() {
  std::vector<std::byte> buffer;
  int fd = -1;
  const ssize_t n = receive_message(socket_, buffer, &fd, false);
  if (n <= 0) return std::nullopt;
  In in(buffer.data(), buffer.size());
  if (in.get<std::uint32_t>() != task_magic) throw std::runtime_error("coload: not a task message");
  ProcessTask t;
  t.kind = static_cast<ProcessTask::Kind>(in.get<std::uint32_t>());
  t.batch = in.get<std::int64_t>();
  t.epoch = in.get<std::int64_t>();
  t.worker_seed = in.get<std::uint64_t>();
  t.sample_seed = in.get<std::uint64_t>();
  t.want = in.get<std::int64_t>();
  slot_id_ = in.get<std::int64_t>();
  slot_bytes_ = in.get<std::uint64_t>();
  t.indices.resize(in.get<std::uint64_t>());
  for (auto& i : t.indices) i = in.get<std::int64_t>();
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
  return t;
}

std::span<std::byte> ChildLink::slot(std::size_t bytes) {
  if (slot_id_ < 0) throw std::logic_error("coload: a task without a slot");
  auto& m = mappings_[static_cast<std::size_t>(slot_id_)];
  if (bytes > slot_span) {
    throw std::length_error("coload: a batch of " + std::to_string(bytes) +
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
  send_message(socket_, encode_reply(reply), {});
}

// ---- the parent's side ------------------------------------------------------------------------

namespace {

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
    s.size = size;
    if (bytes > size) throw std::runtime_error("coload: a worker's batch overruns its slot");
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
struct Worker {
  int id = 0;
  int pid = -1;
  bool via_server = false;  // a fork-server worker: the server reaps it
  std::unique_ptr<asio::posix::stream_descriptor> socket;
  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  std::deque<std::shared_ptr<ProcessPool::Pending>> outstanding;
  bool exited = false;
};
}  // namespace

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
  std::exception_ptr cancelled;
  std::size_t next_worker = 0;
  std::vector<std::function<void()>> retired;  // waiting for every departing worker's end

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
    if (options.entry) {
      try {
        pid = forkserver_spawn(options.entry, id, sv[1], options.payload);
      } catch (...) {
        ::close(sv[0]);
        ::close(sv[1]);
        throw;
      }
    } else {
      pid = ::fork();
    }
    if (pid < 0) {
      const int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      throw_errno("coload: fork for worker " + std::to_string(id), err);
    }
    if (pid == 0) {
      // The child: never returns.
      ::close(sv[0]);
      prepare_worker(parent);
      run_worker(id, [&] {
        ChildLink link(sv[1]);
        main(link, id);
      });
    }
    ::close(sv[1]);
    // NOTE: a fork-server worker is the server's child: its pidfd still says at once when it
    // ends, and the server reports its wait status.
    // NOTE: glibc 2.36's <sys/pidfd.h> lacks extern "C" for C++; the system call is direct.
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      const int err = errno;
      ::kill(pid, SIGKILL);
      reap(pid, options.entry != nullptr);
      ::close(sv[0]);
      throw_errno("coload: pidfd_open for worker " + std::to_string(id), err);
    }
    auto w = std::make_shared<Worker>();
    w->id = id;
    w->pid = pid;
    w->via_server = options.entry != nullptr;
    w->socket = std::make_unique<asio::posix::stream_descriptor>(driver, sv[0]);
    w->pidfd = std::make_unique<asio::posix::stream_descriptor>(driver, pidfd);
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

  void watch_socket(const std::shared_ptr<Worker>& w) {
    w->socket->async_wait(asio::posix::stream_descriptor::wait_read,
                          [self = shared_from_this(), w](std::error_code ec) {
                            if (ec || self->shut) return;
                            if (self->drain(*w)) self->watch_socket(w);
                          });
  }
  void watch_pid(const std::shared_ptr<Worker>& w) {
    w->pidfd->async_wait(asio::posix::stream_descriptor::wait_read,
                         [self = shared_from_this(), w](std::error_code ec) {
                           if (ec || self->shut) return;
                           self->on_exit(w);
                         });
  }

  /// Takes every reply queued on `w`'s socket. False once the socket is at its end.
  bool drain(Worker& w) {
    std::vector<std::byte> buffer;
    for (;;) {
      const ssize_t n = receive_message(w.socket->native_handle(), buffer, nullptr, true);
      if (n < 0) return true;
      if (n == 0) return false;
      ProcessReply reply = decode_reply(buffer.data(), buffer.size());
      if (w.outstanding.empty() || w.outstanding.front()->task.batch != reply.batch) {
        throw std::runtime_error("coload: worker " + std::to_string(w.id) +
                                 " answered a batch it was not given");
      }
      auto p = w.outstanding.front();
      w.outstanding.pop_front();
      ProcessResult result;
      result.worker = w.id;
      if (reply.status == ProcessReply::Status::batch) {
        result.bytes = arena->view(p->slot, reply.slot_bytes, reply.offset + reply.bytes);
        result.lease = std::make_shared<SlotLease>(arena, p->slot);
      } else {
        // The slot may have been grown without a batch in it: remember its size.
        (void)arena->view(p->slot, reply.slot_bytes, 0);
        arena->give_back(p->slot);
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
    if (w->socket) drain(*w);
    const int status = reap(w->pid, w->via_server);
    w->exited = true;
    std::erase(departing, w);
    notify_retired();
    const bool current = workers[static_cast<std::size_t>(w->id)] == w;
    if (current) workers[static_cast<std::size_t>(w->id)].reset();
    w->socket.reset();
    w->pidfd.reset();
    if (w->outstanding.empty()) {
      if (current && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        // Died idle: the next epoch (or a restart) forks a new one; nothing was lost.
        if (options.on_death == OnWorkerDeath::restart) spawn_or_break(w->id);
      }
      return;
    }
    auto lost = std::move(w->outstanding);
    const auto& first = lost.front();
    if (options.on_death == OnWorkerDeath::restart &&
        restarts[static_cast<std::size_t>(w->id)] < options.max_restarts && !shut) {
      ++restarts[static_cast<std::size_t>(w->id)];
      detail::warn(describe_death(w->id, w->pid, status, first->task.batch, first->task.indices) +
                   "; restarting it (restart " +
                   std::to_string(restarts[static_cast<std::size_t>(w->id)]) + " of " +
                   std::to_string(options.max_restarts) + ")");
      try {
        spawn(w->id);
        auto& fresh = workers[static_cast<std::size_t>(w->id)];
        for (auto& p : lost) send(*fresh, p);
        return;
      } catch (const std::exception& e) {
        // No new worker: the batches fail as under `raise`, saying why.
        detail::warn(std::string("coload: restarting worker ") + std::to_string(w->id) +
                     " failed: " + e.what());
      }
    }
    broken = true;
    std::string what =
        describe_death(w->id, w->pid, status, first->task.batch, first->task.indices);
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

  void spawn_or_break(int id) {
    if (restarts[static_cast<std::size_t>(id)] >= options.max_restarts || shut) return;
    ++restarts[static_cast<std::size_t>(id)];
    try {
      spawn(id);
    } catch (const std::exception& e) {
      detail::warn(std::string("coload: restarting worker ") + std::to_string(id) +
                   " failed: " + e.what());
    }
  }

  void send(Worker& w, const std::shared_ptr<Pending>& p) {
    p->worker = w.id;
    w.outstanding.push_back(p);
    if (p->slot < 0 && p->task.kind != ProcessTask::Kind::stop) p->slot = arena->take();
    const auto [fd, size] =
        p->slot >= 0 ? arena->fd_and_size(p->slot) : std::pair<int, std::uint64_t>{-1, 0};
    // A worker that is gone reports through its pidfd; its queue is handled there.
    send_message(w.socket->native_handle(), encode_task(p->task, p->slot, size), {fd});
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

ProcessPool::ProcessPool(asio::io_context& driver, Options options, ChildMain main)
    : state_(std::make_shared<State>(driver, options, std::move(main))) {}

ProcessPool::~ProcessPool() {
  auto& s = *state_;
  s.shut = true;
  std::vector<std::shared_ptr<Worker>> all = s.departing;
  for (auto& w : s.workers) {
    if (w) all.push_back(w);
  }
  for (auto& w : all) {
    if (!w->exited) ::kill(w->pid, SIGTERM);
  }
  // Wait for each to go, up to the grace period, then kill what is left.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(s.options.grace));
  for (auto& w : all) {
    if (w->exited || !w->pidfd) continue;
    pollfd p{w->pidfd->native_handle(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count()))) == 0) {
      ::kill(w->pid, SIGKILL);
    }
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

void ProcessPool::start() {
  auto& s = *state_;
  if (s.shut) return;
  for (int i = 0; i < s.options.num_workers; ++i) {
    if (!s.workers[static_cast<std::size_t>(i)]) s.spawn(i);
  }
  s.broken = false;
}

void ProcessPool::retire(std::function<void()> done) {
  auto& s = *state_;
  if (s.shut) {
    done();
    return;
  }
  s.retired.push_back(std::move(done));
  for (auto& w : s.workers) {
    if (!w) continue;
    ProcessTask stop;
    stop.kind = ProcessTask::Kind::stop;
    // NOTE: the stop is not a task that is answered: it is not queued as outstanding.
    send_message(w->socket->native_handle(), encode_task(stop, -1, 0), {});
    s.departing.push_back(std::move(w));
    w.reset();
  }
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
    ::kill(w->pid, SIGTERM);
    // NOTE: cancelling the waits lets the driver's io_context run out of work; the destructor
    // reaps the children.
    if (w->socket) w->socket->cancel();
    if (w->pidfd) w->pidfd->cancel();
    auto lost = std::move(w->outstanding);
    for (auto& p : lost) s.fail(*p, cancelled);
  }
  s.notify_retired();
}

bool ProcessPool::broken() const noexcept { return state_->broken; }

ProcessPool::Awaiter ProcessPool::submit(int worker, ProcessTask task) {
  auto& s = *state_;
  auto p = std::make_shared<Pending>();
  p->task = std::move(task);
  if (s.shut) {
    s.fail(*p, s.cancelled);
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

namespace coload {
void start_forkserver() { detail::start_forkserver_impl(); }
bool forkserver_running() noexcept { return detail::forkserver_running_impl(); }
}  // namespace coload
