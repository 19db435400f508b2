// The fork server, and the payload memfd that carries a loader's dataset to the workers it forks.
//
// The server is a child of main, started before main has threads. It forks each worker on
// request (the request carries the worker's socket and payload fds, and the address of the
// function to run: the server is a copy of this program, so the address is valid there), reaps
// its workers and reports each pid's wait status back.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "coload/core/error.hpp"
#include "coload/exec/process.hpp"
#include "messages.hpp"
#include "workers.hpp"

namespace coload::detail {

namespace {

struct ForkServer {
  std::mutex mutex;
  int control = -1;
  pid_t pid = -1;
  std::map<int, int> statuses;  // pid → wait status, reported and not yet asked for
  // Workers given up at their spawn (no pidfd came): their statuses are not kept, or a later
  // worker given the same pid would be answered with this one's.
  std::set<int> abandoned;

  /// Reads one message from the server (blocking): a status is kept, a spawn reply returned
  /// (its worker's pidfd, if any, to `pidfd`; closed where null).
  std::optional<std::int64_t> read_one(int* pidfd = nullptr) {
    MessageBuffer buffer(max_message);
    const ssize_t n = receive_message(control, buffer, pidfd, false);
    if (n <= 0) throw RuntimeError("coload: the fork server has gone");
    ServerReport report;
    try {
      report = decode_value<ServerReport>(buffer);
    } catch (const wire::FormatError&) {
      throw RuntimeError("coload: the fork server is confused");
    }
    const auto [kind, value, status] = report;
    if (kind == report_reaped) {
      if (abandoned.erase(static_cast<int>(value)) == 0) statuses[static_cast<int>(value)] = status;
      return std::nullopt;
    }
    if (kind != report_spawned) throw RuntimeError("coload: the fork server is confused");
    return value;
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
  MessageBuffer buffer(max_message);
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
        if (!send_value(control, ServerReport{report_reaped, p, status})) ::_exit(0);
      }
    }
    if (fds[0].revents) {
      int socket = -1, payload = -1, metrics = -1;
      const ssize_t n = receive_message(control, buffer, &socket, false, &payload, &metrics);
      if (n <= 0) ::_exit(0);  // main has gone
      SpawnRequest request;
      try {
        request = decode_value<SpawnRequest>(buffer);
      } catch (const wire::FormatError&) {
        ::_exit(1);
      }
      const auto entry = reinterpret_cast<ForkserverEntry>(std::get<0>(request));
      const auto id = std::get<1>(request);
      const pid_t pid = ::fork();
      if (pid == 0) {
        // NOTE: nothing thrown in the worker may unwind out of serve(): it would go on as main.
        try {
          ::close(control);
          ::close(sfd);
          prepare_worker(self);
          run_worker(id, [&] { entry(socket, id, payload, metrics); });
        } catch (...) {
        }
        ::_exit(70);
      }
      int err = errno;
      // NOTE: opened here, before this loop can reap the worker: main cannot open it by pid,
      // which is no longer the worker's once reaped (pidfd_open: ESRCH, or another process).
      int pidfd = -1;
      if (pid > 0) {
        pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (pidfd < 0) {
          err = errno;
          ::kill(pid, SIGKILL);  // our own child, not reaped yet: the pid is still its own
          while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
          }
        }
      }
      if (socket >= 0) ::close(socket);
      if (payload >= 0) ::close(payload);
      if (metrics >= 0) ::close(metrics);
      const std::int64_t value = pid < 0 || pidfd < 0 ? -err : pid;
      const bool sent = send_value(control, ServerReport{report_spawned, value, 0}, {pidfd});
      if (pidfd >= 0) ::close(pidfd);
      if (!sent) ::_exit(0);
    }
  }
}

}  // namespace

pid_t forkserver_spawn(ForkserverEntry entry, int id, int socket, int payload, int metrics,
                       int& pidfd) {
  std::lock_guard lock(g_server.mutex);
  const SpawnRequest request{reinterpret_cast<std::uint64_t>(entry), id};
  if (!send_value(g_server.control, request, {socket, payload, metrics})) {
    throw RuntimeError("coload: the fork server has gone");
  }
  for (;;) {
    int fd = -1;
    if (auto r = g_server.read_one(&fd)) {
      if (*r < 0) {
        if (fd >= 0) ::close(fd);
        throw_errno("coload: the fork server's fork for worker " + std::to_string(id),
                    static_cast<int>(-*r));
      }
      if (fd < 0) {
        // NOTE: the server always sends it; none came when this process is out of fds
        // (MSG_CTRUNC). The worker ends at its first read, once the caller closes its socket.
        g_server.abandoned.insert(static_cast<int>(*r));
        throw RuntimeError("coload: no pidfd came with fork-server worker " +
                           std::to_string(id) + " (out of file descriptors?)");
      }
      pidfd = fd;
      return static_cast<pid_t>(*r);
    }
  }
}

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

}  // namespace coload::detail

namespace coload {

void start_forkserver() {
  auto& server = detail::g_server;
  std::lock_guard lock(server.mutex);
  if (server.pid > 0) return;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    detail::throw_errno("coload: socketpair for the fork server", errno);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    detail::throw_errno("coload: fork for the fork server", err);
  }
  if (pid == 0) {
    ::close(sv[0]);
    for (int sig : {SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE}) {
      ::signal(sig, SIG_DFL);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    ::prctl(PR_SET_NAME, "coload-forksrv");
    try {
      detail::serve(sv[1]);
    } catch (...) {
      // Its loop failed (out of memory, a broken socket): the server ends, never unwinding
      // into the program that started it; its parent finds it gone.
    }
    ::_exit(1);
  }
  ::close(sv[1]);
  server.control = sv[0];
  server.pid = pid;
}

bool forkserver_running() noexcept { return detail::g_server.pid > 0; }

}  // namespace coload
