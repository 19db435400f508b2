// The warning handler: set_warning_handler, warn and warn_once.

#include "coload/core/warning.hpp"

#include <pthread.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <utility>

namespace coload {

namespace {

std::mutex& warning_mutex() {
  static std::mutex m;
  return m;
}
std::function<void(const std::string&)>& warning_handler() {
  static std::function<void(const std::string&)> handler;
  return handler;
}
std::mutex& seen_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& seen_warnings() {
  static std::set<std::string> seen;
  return seen;
}

// NOTE: a process worker is forked from a parent whose other threads may be warning at that
// moment; a lock they held would stay held forever in the child, and the child's first warning
// would hang it. Both locks are taken around every fork(), so the child starts with them free.
// The two are never held together anywhere else, so taking both here cannot deadlock.
void lock_for_fork() {
  seen_mutex().lock();
  warning_mutex().lock();
}
void unlock_after_fork() {
  warning_mutex().unlock();
  seen_mutex().unlock();
}
[[maybe_unused]] const int fork_handlers_registered =
    (warning_mutex(), seen_mutex(), warning_handler(), seen_warnings(),
     ::pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork));

}  // namespace

void set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard lock(warning_mutex());
  warning_handler() = std::move(handler);
}

namespace detail {

void warn(const std::string& message, const char* stderr_prefix) {
  std::lock_guard lock(warning_mutex());
  if (warning_handler()) {
    warning_handler()(message);
  } else {
    std::fprintf(stderr, "%s%s\n", stderr_prefix, message.c_str());
    std::fflush(stderr);
  }
}

void warn_once(const std::string& key, const std::string& message, const char* stderr_prefix) {
  {
    std::lock_guard lock(seen_mutex());
    if (!seen_warnings().insert(key).second) return;
  }
  warn(message, stderr_prefix);
}

void forget_warnings() {
  std::lock_guard lock(seen_mutex());
  seen_warnings().clear();
}

}  // namespace detail
}  // namespace coload
