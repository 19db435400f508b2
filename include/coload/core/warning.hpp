#pragma once
// The one warning handler: every warning coload gives goes through detail::warn.

#include <functional>
#include <string>

namespace coload {

/// Replaces where coload's warnings go (stderr by default); an empty function restores it.
///
/// The handler receives each warning's message, without a prefix or newline. It is called
/// under a lock (one warning at a time), on whichever thread warns: the driver, a worker
/// thread, or inside a worker process (a copy of the handler, in the child). It must not warn
/// itself, nor fork.
void set_warning_handler(std::function<void(const std::string&)> handler);

namespace detail {
/// Emits a warning through the handler. Without a handler, writes `stderr_prefix`, the message
/// and a newline to stderr.
///
/// NOTE: safe in a forked child: the lock the handler is called under is taken around every
/// fork() (pthread_atfork), so no other thread of the parent can hold it when the child starts.
void warn(const std::string& message, const char* stderr_prefix = "coload warning: ");
/// Emits a warning the first time `key` is seen in this process.
void warn_once(const std::string& key, const std::string& message,
               const char* stderr_prefix = "coload warning: ");
/// Forgets which once-only warnings were given (for tests).
void forget_warnings();
}  // namespace detail

}  // namespace coload
