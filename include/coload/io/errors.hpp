#pragma once
// IoError: the exception every failed read throws.

#include <string>
#include <system_error>

namespace coload::io {

/// A failed file operation. `code()` holds the errno value (system category), `path()` the
/// file, and `what()` reads like "cannot open '/data/x.jpg': No such file or directory".
class IoError : public std::system_error {
 public:
  /// `operation` names what failed ("open", "read", "stat"); `error` is a positive errno value.
  IoError(std::string path, const char* operation, int error);

  /// The file the operation was about.
  const std::string& path() const noexcept { return path_; }
  /// The errno value.
  int error() const noexcept { return code().value(); }

 private:
  std::string path_;
};

}  // namespace coload::io
