#include <unistd.h>

#include <cassert>
#include <cstring>
#include <new>

#include "coload/io/buffer.hpp"
#include "coload/io/errors.hpp"
#include "coload/io/file.hpp"

namespace coload::io {

Buffer::Buffer(std::size_t size, std::size_t capacity) : size_(size), capacity_(capacity) {
  if (capacity_ < size_) capacity_ = size_;
  if (capacity_ != 0) {
    data_ = static_cast<std::byte*>(::operator new(capacity_, std::align_val_t{alignment}));
  }
}

void Buffer::resize(std::size_t size) noexcept {
  assert(size <= capacity_ && "Buffer::resize beyond capacity");
  size_ = size <= capacity_ ? size : capacity_;
}

void Buffer::release() noexcept {
  if (data_) ::operator delete(data_, std::align_val_t{alignment});
  data_ = nullptr;
  size_ = capacity_ = 0;
}

void File::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

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

}  // namespace coload::io
