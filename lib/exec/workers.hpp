#pragma once
// What the fork server, the child's side and the parent's side of process workers share.

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <system_error>

#include "coload/core/error.hpp"
#include "coload/core/math.hpp"
#include "coload/exec/process.hpp"

namespace coload::detail {

[[noreturn]] inline void throw_errno(const std::string& what, int err) {
  throw SystemError(err, std::generic_category(), what);
}



/// Address space reserved for each slot of the arena, in the parent and in every child: a
/// slot grows (ftruncate) inside it without ever moving.
inline constexpr std::size_t slot_span = std::size_t{16} << 30;

/// Reserves `slot_span` bytes of address space over memfd `fd` (pages past its size are never
/// touched: the slot is grown first).
std::byte* map_slot(int fd);

/// In a fresh worker, forked by `parent`: defaults for fatal signals, a prompt exit(), death
/// with the parent, one ATen thread.
void prepare_worker(pid_t parent);

/// Runs worker `id`'s body in a fresh worker and ends the process: status 0 when the body
/// returns, 70 when it throws (named on stderr).
[[noreturn]] void run_worker(int id, const std::function<void()>& body);

/// Asks the fork server for a worker running `entry`; returns its pid (a child of the server,
/// not of ours) and, in `pidfd`, the pidfd the server opened before it could reap it: the only
/// safe handle on it (its pid may be reaped, and reused, before the caller looks).
pid_t forkserver_spawn(ForkserverEntry entry, int id, int socket, int payload, int metrics,
                       int& pidfd);

/// The wait status of fork-server worker `pid`, once the server has reaped it (blocking).
int forkserver_status(pid_t pid);

}  // namespace coload::detail
