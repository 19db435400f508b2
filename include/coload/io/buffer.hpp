#pragma once
// Buffer: the owning byte buffer that file reads fill.

#include <cstddef>
#include <span>
#include <utility>

namespace coload::io {

namespace detail {
class BufferPool;
}

/// An owning, movable byte buffer whose storage is aligned for O_DIRECT.
///
/// A Buffer has a size (the bytes that hold data) and a capacity (the bytes allocated);
/// `resize` moves the size within the capacity without touching the bytes. The storage
/// starts on a `Buffer::alignment` boundary, so direct-mode reads may land in it.
class Buffer {
 public:
  /// Alignment of the storage: the page size, which covers every block device's sector.
  static constexpr std::size_t alignment = 4096;

  /// An empty buffer that owns no storage.
  Buffer() noexcept = default;
  /// A buffer of `size` bytes (uninitialised) with at least that capacity.
  explicit Buffer(std::size_t size) : Buffer(size, size) {}
  /// A buffer of `size` bytes (uninitialised) with room for `capacity` (at least `size`).
  Buffer(std::size_t size, std::size_t capacity);
  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)),
        pool_(std::exchange(other.pool_, nullptr)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
      pool_ = std::exchange(other.pool_, nullptr);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  /// The first byte (nullptr when nothing is allocated).
  std::byte* data() noexcept { return data_; }
  /// The first byte (nullptr when nothing is allocated).
  const std::byte* data() const noexcept { return data_; }
  /// The number of bytes that hold data.
  std::size_t size() const noexcept { return size_; }
  /// The number of bytes allocated.
  std::size_t capacity() const noexcept { return capacity_; }
  /// True when size() is zero.
  bool empty() const noexcept { return size_ == 0; }
  /// The data as read-only bytes.
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The data as writable bytes.
  std::span<std::byte> mutable_bytes() noexcept { return {data_, size_}; }
  /// Sets the size to `size`, which must not exceed capacity(); the bytes are kept.
  void resize(std::size_t size) noexcept;

 private:
  friend class detail::BufferPool;
  void release() noexcept;

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  // Where the storage goes back when the Buffer dies (a Reader's recycled first-read
  // buffers), or nullptr for the allocator. Safe from any thread, after the Reader too.
  detail::BufferPool* pool_ = nullptr;
};

}  // namespace coload::io
