#pragma once
// What the hardening tests share: counts of what a loader could leave behind (children, fds,
// memfds, threads, /dev/shm entries) and the warnings collector (tests/support/warnings.hpp).

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/warnings.hpp"

namespace coload::hardening {

/// What a process holds that a loader might leave behind.
struct Held {
  int children = 0;
  int fds = 0;
  int memfds = 0;
  int threads = 0;
  int shm = 0;
  friend bool operator==(const Held&, const Held&) = default;
};

inline int entries(const char* dir) {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

inline Held held() {
  Held h;
  const std::string self = std::to_string(::getpid());
  std::error_code ec;
  for ([[maybe_unused]] const auto& task :
       std::filesystem::directory_iterator("/proc/self/task", ec)) {
    ++h.threads;
  }
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = proc.path().filename().string();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    std::ifstream f(proc.path() / "stat");
    std::string line;
    if (!std::getline(f, line) || line.rfind(')') == std::string::npos) continue;
    // pid (comm) state ppid ...: the comm may hold spaces, so parse after the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string state, ppid;
    rest >> state >> ppid;
    if (ppid == self) ++h.children;
  }
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    ++h.fds;
    std::error_code e2;
    const auto target = std::filesystem::read_symlink(fd.path(), e2).string();
    if (target.starts_with("/memfd:")) ++h.memfds;
  }
  h.shm = entries("/dev/shm");
  return h;
}

inline std::string to_string(const Held& h) {
  std::ostringstream s;
  s << "children " << h.children << ", fds " << h.fds << ", memfds " << h.memfds << ", threads "
    << h.threads << ", /dev/shm " << h.shm;
  return s.str();
}

using coload::test::Warnings;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Seconds `f()` takes.
template <class F>
double timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return seconds_since(t0);
}

/// The longest that work which waits on no timer may take, given `baseline`: how long the same
/// work without the fault took, measured in the same run. A second plus four baselines: a
/// loaded or sanitized machine is slower at both, so the bound grows with it, while a report
/// that waited on a timer or a poll (or never came) still exceeds it.
inline double prompt(double baseline) { return 1.0 + 4.0 * baseline; }

}  // namespace coload::hardening
