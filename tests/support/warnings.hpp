#pragma once
// Collects coload's warnings for the life of the object, in the order they were given, where
// they would have gone to stderr. coload's warn() calls the handler under a lock of its own, one
// warning at a time; messages() copies under this object's lock, so a test may read while the
// loader's threads are still warning.

#include <mutex>
#include <string>
#include <vector>

#include "coload/core/warning.hpp"

namespace coload::test {

class Warnings {
 public:
  /// `forget`: warn_once's record is cleared first, so that a warning another case gave once
  /// in this process is given again.
  explicit Warnings(bool forget = false) {
    if (forget) coload::detail::forget_warnings();
    set_warning_handler([this](const std::string& w) {
      std::lock_guard lock(mutex_);
      messages_.push_back(w);
    });
  }
  ~Warnings() { set_warning_handler({}); }
  Warnings(const Warnings&) = delete;
  Warnings& operator=(const Warnings&) = delete;

  std::vector<std::string> messages() const {
    std::lock_guard lock(mutex_);
    return messages_;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    messages_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace coload::test
