#pragma once
// IoError: the exception every failed read throws.

#include <sys/stat.h>

#include <string>
#include <system_error>

#include "coload/core/error.hpp"

namespace coload::io {

/// What a file of mode `mode` is, as "a FIFO, not a regular file", or nullptr for a regular
/// file. read_file refuses the others: a FIFO or a device named like a data file would read as
/// empty, or fail with an error (ESPIPE) that does not say why.
inline const char* not_regular(unsigned mode) noexcept {
  switch (mode & S_IFMT) {
    case S_IFREG: return nullptr;
    case S_IFIFO: return "a FIFO, not a regular file";
    case S_IFSOCK: return "a socket, not a regular file";
    case S_IFCHR: return "a character device, not a regular file";
    case S_IFBLK: return "a block device, not a regular file";
    case S_IFDIR: return "a directory, not a regular file";
    default: return "not a regular file";
  }
}

/// A failed file operation. `code()` holds the errno value (system category), `path()` the
/// file, and `what()` reads like "cannot open '/data/x.jpg': No such file or directory".
class IoError : public std::system_error, public Error {
 public:
  /// `operation` names what failed ("open", "read", "stat"); `error` is a positive errno value.
  IoError(std::string path, const char* operation, int error);
  /// As above, with `detail` said after the path: "cannot read '/data/x.jpg' (a FIFO, not a
  /// regular file): Invalid argument".
  IoError(std::string path, const char* operation, int error, const char* detail);

  const char* what() const noexcept override { return std::system_error::what(); }

  /// The file the operation was about.
  const std::string& path() const noexcept { return path_; }
  /// The errno value.
  int error() const noexcept { return code().value(); }

 private:
  std::string path_;
};

}  // namespace coload::io
