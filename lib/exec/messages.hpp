#pragma once
// Worker messages (parent and worker, main and fork server) on the wire format, and their socket.
//
// Every message is one SOCK_SEQPACKET record holding one wire message (coload/collate/wire.hpp:
// header, then one value). A task is the tuple (ProcessTask, i64 slot id or -1, u64 the slot's
// size as the parent knows it, u64 the indices in an index file), with the slot's memfd attached
// as SCM_RIGHTS, and after it, for a task of more than inline_indices indices, a memfd holding
// them (the task's own list is then empty); a reply is a ProcessReply. After their tags
// (wire::tag::worker_task, wire::tag::worker_reply) their fields are written without tags, in
// this order:
//
//     ProcessTask    u32 kind (1 fetch, 2 stream, 3 stop), i64 batch, i64 epoch,
//                    u64 worker_seed, u64 sample_seed, i64 want, u64 index count, the indices
//                    (i64 each)
//     ProcessReply   u32 status (1 batch, 2 empty, 3 error), i64 batch, u64 offset, u64 bytes,
//                    u64 slot_bytes, i64 skipped, u8 stream_over (0 or 1), i64 error_index,
//                    then error_what, error_type, error_message (each a u64 length and the bytes,
//                    at most 16 KiB: longer texts are cut)
//
// Decoding checks every length against the bytes received before anything is allocated, and
// a kind or status out of range, a wrong tag or a truncated message is a wire::FormatError.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <tuple>
#include <vector>

#include "coload/collate/wire.hpp"
#include "coload/exec/process.hpp"

namespace coload::wire {

template <>
struct Wire<coload::detail::ProcessTask> {
  static void write(Writer& w, const coload::detail::ProcessTask& t);
  static coload::detail::ProcessTask read(Reader& r);
};

template <>
struct Wire<coload::detail::ProcessReply> {
  static void write(Writer& w, const coload::detail::ProcessReply& r);
  static coload::detail::ProcessReply read(Reader& r);
};

}  // namespace coload::wire

namespace coload::detail {

/// The longest message a socket receive takes (a task with its indices, a reply with its texts).
inline constexpr std::size_t max_message = 256 * 1024;

/// What goes down a worker's socket with a task: the task, the slot its batch goes in (-1 for a
/// stop), that slot's size, and how many indices the attached index file holds (0: none, the
/// task's list holds them).
using TaskMessage = std::tuple<ProcessTask, std::int64_t, std::uint64_t, std::uint64_t>;

/// The most indices a task carries in its message; a longer list goes in an index file.
/// NOTE: a SOCK_SEQPACKET record must fit the socket's send buffer (net.core.wmem_default,
/// 208 KiB on most systems, about 26000 indices): a batch_sampler's batch of 40000 could not be
/// sent at all (EMSGSIZE). The tasks queued for a worker share that buffer too: the parent
/// holds back what finds it full until the worker has read some (ProcessPool's send).
inline constexpr std::size_t inline_indices = 1024;

/// A memfd holding `indices` (i64 each, in order), to attach to a task. Throws
/// SystemError naming the count when it cannot be made.
int make_index_file(std::span<const std::int64_t> indices);

/// The `count` indices of an index file; wire::FormatError when the file does not hold exactly
/// that many (checked before anything is allocated), SystemError when it cannot be read.
std::vector<std::int64_t> read_index_file(int fd, std::uint64_t count);

/// Bytes for one message, aligned as the wire format wants a region.
class MessageBuffer {
 public:
  explicit MessageBuffer(std::size_t capacity)
      : data_(static_cast<std::byte*>(
            ::operator new[](capacity, std::align_val_t{wire::tensor_alignment}))),
        capacity_(capacity) {}
  std::span<std::byte> bytes() noexcept { return {data_.get(), size_}; }
  std::span<std::byte> whole() noexcept { return {data_.get(), capacity_}; }
  void resize(std::size_t n) noexcept { size_ = n; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept {
      ::operator delete[](p, std::align_val_t{wire::tensor_alignment});
    }
  };
  std::unique_ptr<std::byte[], Free> data_;
  std::size_t capacity_;
  std::size_t size_ = 0;
};

/// What a send came to: sent, the peer gone, or (a socket that does not wait) no room yet.
enum class SendOutcome { sent, peer_gone, full };

/// Sends one message, with the fds in `fds` that are not -1 attached (three at most, in order:
/// the receiver tells them apart by position, so only trailing ones may be -1). `full` when
/// the socket does not wait and its buffer has no room for it (EAGAIN); throws SystemError on
/// any other failure.
SendOutcome try_send_message(int socket, std::span<const std::byte> bytes,
                             std::initializer_list<int> fds);

/// try_send_message on a socket that waits (or where no room is an error): false when the peer
/// is gone.
bool send_message(int socket, std::span<const std::byte> bytes, std::initializer_list<int> fds);

/// Receives one message into `buffer` (which holds max_message bytes), and up to three attached
/// fds into `fd`, `second_fd` and `third_fd` (-1 where none came; closed where the pointer is
/// null). 0 at the peer's end; -1 when `dont_wait` and nothing is queued.
ssize_t receive_message(int socket, MessageBuffer& buffer, int* fd, bool dont_wait,
                        int* second_fd = nullptr, int* third_fd = nullptr);

/// Encodes `value` as one wire message and sends it (see try_send_message).
template <wire::Wireable T>
SendOutcome try_send_value(int socket, const T& value, std::initializer_list<int> fds = {}) {
  MessageBuffer buffer(wire::encoded_size(value));
  buffer.resize(wire::encode(value, buffer.whole()));
  return try_send_message(socket, buffer.bytes(), fds);
}

/// Encodes `value` as one wire message and sends it (see send_message).
template <wire::Wireable T>
bool send_value(int socket, const T& value, std::initializer_list<int> fds = {}) {
  MessageBuffer buffer(wire::encoded_size(value));
  buffer.resize(wire::encode(value, buffer.whole()));
  return send_message(socket, buffer.bytes(), fds);
}

/// The value in a message received into `buffer`; wire::FormatError when it is not one.
template <wire::Wireable T>
T decode_value(MessageBuffer& buffer) {
  return wire::decode<T>(buffer.bytes(), nullptr);
}

/// What main sends the fork server: the address of the entry to run and the worker's id (its
/// socket and payload fds ride along).
using SpawnRequest = std::tuple<std::uint64_t, std::int32_t>;
/// What the fork server sends main: (spawned, the pid or -errno, 0) answers a SpawnRequest;
/// (reaped, a pid, its wait status) reports a worker's end.
using ServerReport = std::tuple<std::uint8_t, std::int64_t, std::int32_t>;
inline constexpr std::uint8_t report_spawned = 1;
inline constexpr std::uint8_t report_reaped = 2;

}  // namespace coload::detail
