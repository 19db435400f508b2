// link_proxy: a TCP forwarder on 127.0.0.1 that behaves as a slow network link in front of a
// server (nginx), for shards_remote's proxy rows. It costs little CPU (one epoll thread, a
// read and a write a chunk), so those rows measure the link's delay and bandwidth, not the
// proxy, as tests/shards/serve.py's Python proxy (kept for the fault tests) did.
//
//   link_proxy --upstream PORT [--rtt-ms 20] [--link-mib 0] [--conn-mib 0] [--splice 1]
//
// Prints "PORT <port>" once it accepts connections, then runs until its standard input
// closes. Each client connection gets its own connection to 127.0.0.1:PORT. Bytes are
// forwarded both ways, each direction delayed by half of --rtt-ms (a request's answer starts
// one round trip later, as over a real link; connection set-up is not delayed). Bytes from the
// server to the clients leave at most --link-mib MiB/s for all connections together (the
// link) and --conn-mib MiB/s each (0: no cap); a chunk takes its turn on the link when it is
// read, as serve.py's "link" and "bw" tokens do. What is read and not yet due is held, at
// most 8 MiB a direction a connection (the server is then not read: TCP's flow control).
// With --splice 1 (the default) the bytes wait in a pipe a direction (splice(2): no copy
// through this process; at most the pipe's size, 4 MiB as root, else 1 MiB, is held).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace {

std::int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

constexpr std::size_t chunk_bytes = 256 << 10;
constexpr std::size_t held_bound = 8 << 20;

// Receive buffers, reused: a fresh 256 KiB one a read would be an mmap, its page faults and
// its zeroing each time, more than the forwarding itself.
std::vector<std::unique_ptr<char[]>> spare;

struct Chunk {
  std::int64_t due = 0;  // when its first byte may leave
  std::unique_ptr<char[]> data;
  std::size_t size = 0, sent = 0;
  Chunk() = default;
  Chunk(Chunk&&) = default;
  Chunk& operator=(Chunk&&) = default;
  ~Chunk() {
    if (data) spare.push_back(std::move(data));
  }
};

// One direction of a connection: bytes read from `from`, written to `to` once due.
struct Flow {
  int from = -1, to = -1;
  bool down = false;  // server to client: the link's direction
  bool readable = false, writable = true, eof = false, shut = false;
  std::deque<Chunk> held;
  std::size_t held_bytes = 0;
  std::int64_t conn_free = 0;  // when this connection's own cap lets the next byte go
  Flow* other = nullptr;       // the connection's other direction
  // splice(2): the held bytes wait in this pipe, never copied to or from this process (the
  // chunks then hold no data); without one, read and send through `spare` buffers.
  int pipe_r = -1, pipe_w = -1;
  std::size_t bound = held_bound;
};

// A pipe for a flow's held bytes, as large as the kernel lets it be (1 MiB unprivileged).
void open_pipe(Flow& f) {
  int p[2];
  if (::pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) return;
  int size = ::fcntl(p[1], F_SETPIPE_SZ, 4 << 20);
  if (size < 0) size = ::fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
  if (size < 0) size = ::fcntl(p[1], F_GETPIPE_SZ);
  f.pipe_r = p[0];
  f.pipe_w = p[1];
  f.bound = static_cast<std::size_t>(size);
}
void close_pipe(Flow& f) {
  if (f.pipe_r >= 0) ::close(f.pipe_r);
  if (f.pipe_w >= 0) ::close(f.pipe_w);
}

struct Conn {
  int client = -1, server = -1;
  Flow up, down;
  bool dead = false;
};

struct Link {
  std::int64_t one_way_ns = 0;
  double link_ns_per_byte = 0, conn_ns_per_byte = 0;
  std::int64_t link_free = 0;
};

void nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Reads what `f.from` has (while under the bound), each chunk stamped with when it is due.
// False when the connection failed.
bool pull(Flow& f, Link& link) {
  while (f.readable && !f.eof && f.held_bytes < f.bound) {
    Chunk c;
    ssize_t n = 0;
    if (f.pipe_w >= 0) {
      // A chunk at a time: a chunk leaves when the link has sent its last byte, so a larger
      // one would wait longer, and its bytes arrive in a lump.
      n = ::splice(f.from, nullptr, f.pipe_w, nullptr,
                   std::min(chunk_bytes, f.bound - f.held_bytes), SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    } else {
      if (spare.empty()) {
        c.data.reset(new char[chunk_bytes]);
      } else {
        c.data = std::move(spare.back());
        spare.pop_back();
      }
      n = ::read(f.from, c.data.get(), chunk_bytes);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Into a pipe, EAGAIN may mean the pipe's slots are taken (a slot a socket buffer's
      // fragment, however small): the socket may still hold bytes, and no new edge would come
      // for them, so it is tried again once some went out.
      if (f.pipe_w < 0 || f.held.empty()) f.readable = false;
      break;
    }
    if (n < 0) return false;
    if (n == 0) {
      f.eof = true;
      break;
    }
    c.size = static_cast<std::size_t>(n);
    const std::int64_t now = now_ns();
    std::int64_t leaves = now;
    if (f.down) {
      // Its turn on the link (all connections), then on this connection's own cap.
      if (link.link_ns_per_byte > 0) {
        link.link_free = std::max(now, link.link_free) +
                         static_cast<std::int64_t>(link.link_ns_per_byte * static_cast<double>(n));
        leaves = link.link_free;
      }
      if (link.conn_ns_per_byte > 0) {
        f.conn_free = std::max(leaves, f.conn_free) +
                      static_cast<std::int64_t>(link.conn_ns_per_byte * static_cast<double>(n));
        leaves = f.conn_free;
      }
    }
    c.due = leaves + link.one_way_ns;
    f.held_bytes += static_cast<std::size_t>(n);
    f.held.push_back(std::move(c));
  }
  return true;
}

// Writes the chunks that are due; the time the next one is due (or INT64_MAX). False when the
// connection failed.
bool push(Flow& f, std::int64_t now, std::int64_t& next_due) {
  while (!f.held.empty() && f.writable) {
    Chunk& c = f.held.front();
    if (c.due > now) {
      next_due = std::min(next_due, c.due);
      return true;
    }
    const ssize_t n =
        f.pipe_r >= 0
            ? ::splice(f.pipe_r, nullptr, f.to, nullptr, c.size - c.sent,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
            : ::send(f.to, c.data.get() + c.sent, c.size - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      f.writable = false;
      return true;
    }
    if (n < 0) return false;
    c.sent += static_cast<std::size_t>(n);
    f.held_bytes -= static_cast<std::size_t>(n);
    if (c.sent == c.size) f.held.pop_front();
  }
  if (f.held.empty() && f.eof && !f.shut) {
    ::shutdown(f.to, SHUT_WR);
    f.shut = true;
  }
  return true;
}

int listen_on_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd, 512) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("link_proxy: listen");
    std::exit(1);
  }
  port = ntohs(a.sin_port);
  nonblocking(fd);
  return fd;
}

int connect_upstream(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  int upstream = 0;
  double rtt_ms = 0, link_mib = 0, conn_mib = 0;
  bool use_splice = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (k == "--upstream") {
      upstream = static_cast<int>(v);
    } else if (k == "--rtt-ms") {
      rtt_ms = v;
    } else if (k == "--link-mib") {
      link_mib = v;
    } else if (k == "--conn-mib") {
      conn_mib = v;
    } else if (k == "--splice") {
      use_splice = v != 0;
    } else {
      std::fprintf(stderr, "link_proxy: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (upstream <= 0) {
    std::fprintf(stderr, "usage: link_proxy --upstream PORT [--rtt-ms MS] [--link-mib MIB/S] "
                         "[--conn-mib MIB/S]\n");
    return 2;
  }
  Link link;
  link.one_way_ns = static_cast<std::int64_t>(rtt_ms * 1e6 / 2);
  if (link_mib > 0) link.link_ns_per_byte = 1e9 / (link_mib * (1 << 20));
  if (conn_mib > 0) link.conn_ns_per_byte = 1e9 / (conn_mib * (1 << 20));

  int port = 0;
  const int listener = listen_on_loopback(port);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the listener
  ::epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
  static int stdin_tag;
  ev.data.ptr = &stdin_tag;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
  std::printf("PORT %d\n", port);
  std::fflush(stdout);

  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<epoll_event> events(256);
  std::int64_t next_due = INT64_MAX;
  for (;;) {
    int timeout = -1;
    if (next_due != INT64_MAX) {
      const std::int64_t wait = next_due - now_ns();
      timeout = wait <= 0 ? 0 : static_cast<int>((wait + 999999) / 1000000);
    }
    const int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) break;
    for (int k = 0; k < n; ++k) {
      void* tag = events[k].data.ptr;
      if (tag == &stdin_tag) {
        char b[256];
        if (::read(0, b, sizeof b) <= 0) return 0;  // the bench is done with us
        continue;
      }
      if (tag == nullptr) {
        for (;;) {
          const int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
          if (c < 0) break;
          const int s = connect_upstream(upstream);
          if (s < 0) {
            ::close(c);
            continue;
          }
          const int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          nonblocking(c);
          nonblocking(s);
          auto conn = std::make_unique<Conn>();
          conn->client = c;
          conn->server = s;
          conn->up.from = conn->down.to = c;
          conn->up.to = conn->down.from = s;
          conn->down.down = true;
          conn->up.other = &conn->down;
          conn->down.other = &conn->up;
          if (use_splice) {
            open_pipe(conn->up);
            open_pipe(conn->down);
          }
          // Edge-triggered: each event sets a flag, and the loop below reads and writes until
          // the socket says EAGAIN.
          epoll_event e{};
          e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
          e.data.ptr = &conn->up;  // the client's socket: up's source, down's sink
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
          e.data.ptr = &conn->down;  // the server's socket: down's source, up's sink
          ::epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
          conns.push_back(std::move(conn));
        }
        continue;
      }
      // `f` reads this socket; the other flow of the connection writes to it.
      Flow* f = static_cast<Flow*>(tag);
      Flow& other = *f->other;
      if (events[k].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) f->readable = true;
      if (events[k].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) other.writable = true;
    }
    const std::int64_t now = now_ns();
    next_due = INT64_MAX;
    for (auto& c : conns) {
      // Twice: what was written makes room under the bound for more, which may be due at
      // once (no delay) or sets when the loop wakes next.
      for (int turn = 0; turn < 2 && !c->dead; ++turn) {
        if (!pull(c->up, link) || !pull(c->down, link) || !push(c->up, now, next_due) ||
            !push(c->down, now, next_due) || (c->up.shut && c->down.shut)) {
          c->dead = true;
        }
      }
    }
    std::erase_if(conns, [](const std::unique_ptr<Conn>& c) {
      if (!c->dead) return false;
      ::close(c->client);
      ::close(c->server);
      close_pipe(c->up);
      close_pipe(c->down);
      return true;
    });
  }
  return 0;
}
