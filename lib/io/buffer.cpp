// Buffer and File: aligned read buffers (pooled or owned) and open files.

#include <unistd.h>

#include <cassert>
#include <cstring>
#include <new>

#include "coload/io/buffer.hpp"
#include "coload/io/file.hpp"
#include "backend.hpp"

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
  if (pool_) {
    pool_->recycle(data_);
  } else if (data_) {
    ::operator delete(data_, std::align_val_t{alignment});
  }
  data_ = nullptr;
  pool_ = nullptr;
  size_ = capacity_ = 0;
}

namespace detail {

std::byte* BufferPool::take() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      std::byte* data = free_.back();
      free_.pop_back();
      return data;
    }
  }
  return static_cast<std::byte*>(::operator new(size_, std::align_val_t{Buffer::alignment}));
}

void BufferPool::give_back(std::byte* data) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (free_.size() < keep_) {
      try {
        free_.push_back(data);
        return;
      } catch (...) {
      }
    }
  }
  ::operator delete(data, std::align_val_t{Buffer::alignment});
}

Buffer BufferPool::wrap(std::byte* data, std::size_t size) noexcept {
  {
    std::lock_guard lock(mutex_);
    ++refs_;
  }
  Buffer b;
  b.data_ = data;
  b.size_ = size;
  b.capacity_ = size_;
  b.pool_ = this;
  return b;
}

void BufferPool::unref() noexcept {
  bool last;
  {
    std::lock_guard lock(mutex_);
    last = --refs_ == 0;
  }
  if (last) delete this;
}

BufferPool::~BufferPool() {
  for (std::byte* data : free_) ::operator delete(data, std::align_val_t{Buffer::alignment});
}

}  // namespace detail

void File::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace coload::io
