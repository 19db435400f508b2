// IoError: the message of a failed file operation.

#include "coload/io/errors.hpp"

#include <string>
#include <system_error>
#include <utility>

namespace coload::io {

namespace {
std::string describe(const std::string& path, const char* operation) {
  std::string what = "cannot ";
  what += operation;
  what += " '";
  what += path;
  what += '\'';
  return what;
}
}  // namespace

IoError::IoError(std::string path, const char* operation, int error)
    : std::system_error(error, std::system_category(), describe(path, operation)),
      path_(std::move(path)) {}

IoError::IoError(std::string path, const char* operation, int error, const char* detail)
    : std::system_error(error, std::system_category(),
                        describe(path, operation) + " (" + detail + ")"),
      path_(std::move(path)) {}

}  // namespace coload::io
