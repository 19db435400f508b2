// Worker messages: ProcessTask and ProcessReply on the wire, and the socket calls that carry them.

#include "messages.hpp"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "workers.hpp"

namespace coload::wire {

namespace {
// NOTE: error texts are capped so a reply always fits one socket message.
constexpr std::size_t max_text = 16 * 1024;

void capped(Writer& w, const std::string& s) {
  w.string(std::string_view(s).substr(0, std::min(s.size(), max_text)));
}

[[noreturn]] void bad_enum(const char* what, std::uint32_t found, std::size_t at) {
  throw FormatError("wire: " + std::string(what) + " " + std::to_string(found) + " at byte " +
                    std::to_string(at) + " is not one this build knows");
}
}  // namespace

void Wire<coload::detail::ProcessTask>::write(Writer& w, const coload::detail::ProcessTask& t) {
  w.tag(tag::worker_task);
  w.u32(static_cast<std::uint32_t>(t.kind));
  w.i64(t.batch);
  w.i64(t.epoch);
  w.u64(t.run);
  w.u64(t.worker_seed);
  w.u64(t.sample_seed);
  w.i64(t.want);
  w.u64(t.indices.size());
  w.bytes(std::as_bytes(std::span(t.indices)));
}

coload::detail::ProcessTask Wire<coload::detail::ProcessTask>::read(Reader& r) {
  using Kind = coload::detail::ProcessTask::Kind;
  r.expect_tag(tag::worker_task, "a worker task");
  coload::detail::ProcessTask t;
  const std::size_t kind_at = r.offset();
  const std::uint32_t kind = r.u32();
  if (kind < static_cast<std::uint32_t>(Kind::fetch) ||
      kind > static_cast<std::uint32_t>(Kind::stop)) {
    bad_enum("a task kind", kind, kind_at);
  }
  t.kind = static_cast<Kind>(kind);
  t.batch = r.i64();
  t.epoch = r.i64();
  t.run = r.u64();
  t.worker_seed = r.u64();
  t.sample_seed = r.u64();
  t.want = r.i64();
  const std::size_t count_at = r.offset();
  const std::uint64_t n = r.u64();
  // NOTE: the count is checked against the bytes received before the vector is sized.
  if (n > r.remaining() / sizeof(std::int64_t)) {
    throw FormatError("wire: truncated message: a worker task of " + std::to_string(n) +
                      " indices (the count at byte " + std::to_string(count_at) + ") has " +
                      std::to_string(r.remaining()) + " bytes left for them");
  }
  const auto raw = r.bytes(static_cast<std::size_t>(n) * sizeof(std::int64_t));
  t.indices.resize(static_cast<std::size_t>(n));
  // NOTE: no memcpy for none: an empty vector's data() may be null, which memcpy may not take.
  if (n != 0) std::memcpy(t.indices.data(), raw.data(), raw.size());
  return t;
}

void Wire<coload::detail::ProcessReply>::write(Writer& w, const coload::detail::ProcessReply& r) {
  w.tag(tag::worker_reply);
  w.u32(static_cast<std::uint32_t>(r.status));
  w.i64(r.batch);
  w.u64(r.offset);
  w.u64(r.bytes);
  w.u64(r.slot_bytes);
  w.i64(r.skipped);
  w.u8(r.stream_over ? 1 : 0);
  w.i64(r.error_index);
  capped(w, r.error_what);
  capped(w, r.error_type);
  capped(w, r.error_message);
}

coload::detail::ProcessReply Wire<coload::detail::ProcessReply>::read(Reader& r) {
  using Status = coload::detail::ProcessReply::Status;
  r.expect_tag(tag::worker_reply, "a worker reply");
  coload::detail::ProcessReply p;
  const std::size_t status_at = r.offset();
  const std::uint32_t status = r.u32();
  if (status < static_cast<std::uint32_t>(Status::batch) ||
      status > static_cast<std::uint32_t>(Status::error)) {
    bad_enum("a reply status", status, status_at);
  }
  p.status = static_cast<Status>(status);
  p.batch = r.i64();
  p.offset = r.u64();
  p.bytes = r.u64();
  p.slot_bytes = r.u64();
  p.skipped = r.i64();
  const std::size_t flag_at = r.offset();
  const std::uint8_t over = r.u8();
  if (over > 1) detail::throw_bad_flag("a reply's stream_over", over, flag_at);
  p.stream_over = over == 1;
  p.error_index = r.i64();
  // Reader::string checks each length against the bytes left before it allocates.
  p.error_what = r.string();
  p.error_type = r.string();
  p.error_message = r.string();
  return p;
}

}  // namespace coload::wire

namespace coload::detail {

bool send_message(int socket, std::span<const std::byte> bytes, std::initializer_list<int> fds) {
  const SendOutcome outcome = try_send_message(socket, bytes, fds);
  if (outcome == SendOutcome::full) throw_errno("coload: sending to a worker", EAGAIN);
  return outcome == SendOutcome::sent;
}

SendOutcome try_send_message(int socket, std::span<const std::byte> bytes,
                             std::initializer_list<int> fds) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  int attached[3];
  std::size_t n_fds = 0;
  for (int fd : fds) {
    if (fd >= 0 && n_fds < 3) attached[n_fds++] = fd;
  }
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
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
    if (n >= 0) return SendOutcome::sent;
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return SendOutcome::peer_gone;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return SendOutcome::full;
    throw_errno("coload: sending to a worker", errno);
  }
}

int make_index_file(std::span<const std::int64_t> indices) {
  const std::string what =
      "coload: writing a task's " + std::to_string(indices.size()) + " indices to a memfd";
  const int fd = ::memfd_create("coload-task-indices", MFD_CLOEXEC);
  if (fd < 0) throw_errno(what, errno);
  const auto* p = reinterpret_cast<const char*>(indices.data());
  std::size_t left = indices.size_bytes();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw_errno(what, err);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return fd;
}

std::vector<std::int64_t> read_index_file(int fd, std::uint64_t count) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("coload: reading a task's index file", errno);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size % sizeof(std::int64_t) != 0 || size / sizeof(std::int64_t) != count) {
    throw wire::FormatError("wire: a worker task of " + std::to_string(count) +
                            " indices came with an index file of " + std::to_string(size) +
                            " bytes");
  }
  std::vector<std::int64_t> indices(static_cast<std::size_t>(count));
  auto* p = reinterpret_cast<char*>(indices.data());
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("coload: reading a task's index file", errno);
    if (n == 0) {
      throw wire::FormatError("wire: a worker task's index file ended at byte " +
                              std::to_string(done) + " of " + std::to_string(size));
    }
    done += static_cast<std::size_t>(n);
  }
  return indices;
}

ssize_t receive_message(int socket, MessageBuffer& buffer, int* fd, bool dont_wait,
                        int* second_fd, int* third_fd) {
  const auto whole = buffer.whole();
  iovec iov{whole.data(), whole.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (;;) {
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (n < 0 && errno == ECONNRESET) return 0;
    if (n < 0) throw_errno("coload: receiving from a worker", errno);
    int got[3] = {-1, -1, -1};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t k = std::min<std::size_t>(3, (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
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
    if (third_fd) {
      *third_fd = got[2];
    } else if (got[2] >= 0) {
      ::close(got[2]);
    }
    buffer.resize(static_cast<std::size_t>(n));
    return n;
  }
}

}  // namespace coload::detail
