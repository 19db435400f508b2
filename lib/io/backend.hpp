#pragma once
// The seam between Reader and the two mechanisms that carry its reads.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <vector>
#include <span>
#include <string>

#include "coload/core/math.hpp"
#include "coload/coro/task.hpp"
#include "coload/io/reader.hpp"

namespace coload::io::detail {

/// One backend of a Reader. Its tasks follow Reader's contract (see reader.hpp).
class ReaderBackend {
 public:
  virtual ~ReaderBackend() = default;
  virtual Task<Buffer> read_file(std::string path) = 0;
  virtual Task<File> open(std::string path) = 0;
  virtual Task<std::size_t> read_at(const File& file, std::uint64_t offset,
                                    std::span<std::byte> out) = 0;
  virtual Backend kind() const noexcept = 0;
  virtual ReaderStats stats() const noexcept = 0;
};

/// The io_uring backend, or nullptr with `why` set to the reason it is unavailable.
std::unique_ptr<ReaderBackend> make_uring_backend(asio::io_context& ctx,
                                                  const ReaderOptions& options, std::string& why);
/// The pread pool backend; never fails.
std::unique_ptr<ReaderBackend> make_pread_backend(asio::io_context& ctx,
                                                  const ReaderOptions& options);

/// Recycles a Reader's first-read buffers, so that reading a file neither copies it nor
/// faults in fresh pages (glibc serves 128 KiB with mmap, so a new Buffer per file paid ~32
/// page faults and an munmap). Buffers handed out return here when the user drops them, from
/// any thread; the pool lives until its owner and every such buffer are gone.
class BufferPool {
 public:
  /// A pool of `size`-byte aligned buffers keeping at most `keep` of them free.
  static BufferPool* create(std::size_t size, std::size_t keep) { return new BufferPool(size, keep); }
  /// The owner lets go; the pool is freed once the last buffer has come back.
  void drop_owner() noexcept { unref(); }

  std::size_t buffer_size() const noexcept { return size_; }
  /// A buffer of buffer_size() bytes, to be returned by give_back or wrapped by wrap.
  std::byte* take();
  /// Returns an unwrapped buffer.
  void give_back(std::byte* data) noexcept;
  /// Wraps `data` (from take) as a Buffer of `size` bytes that returns here when destroyed.
  Buffer wrap(std::byte* data, std::size_t size) noexcept;
  /// Called by ~Buffer.
  void recycle(std::byte* data) noexcept {
    give_back(data);
    unref();
  }

 private:
  BufferPool(std::size_t size, std::size_t keep) : size_(size), keep_(keep) {}
  ~BufferPool();
  void unref() noexcept;

  const std::size_t size_;
  const std::size_t keep_;
  std::mutex mutex_;
  std::vector<std::byte*> free_;
  std::size_t refs_ = 1;  // the owner, plus one per wrapped Buffer alive (under mutex_)
};

using coload::detail::round_up;

/// Bytes the first read of read_file asks for.
inline std::size_t first_read_size(const ReaderOptions& options) noexcept {
  return round_up(options.first_read == 0 ? 1 : options.first_read, Buffer::alignment);
}

/// The bytes read_file's follow-up asks for once `total` bytes filled every read so far, the
/// file's size saying `size`: the rest and one byte more, to see the end (rounded up for
/// O_DIRECT); none where the size says the end was reached. (A /proc file says 0, and its
/// reads come a page at a time: read_file is for regular files, and gives what its first
/// read brought.)
inline std::optional<std::size_t> rest_to_read(std::uint64_t size, std::size_t total) noexcept {
  if (size <= total) return std::nullopt;
  return static_cast<std::size_t>(round_up(size - total + 1, Buffer::alignment));
}

/// Makes room in `buffer` for `needed` bytes, its data kept: once for a file's whole rest, the
/// reads of 1 GiB that fill it reusing the room. False where the memory is not to be had (a
/// file, or a size that lies, of terabytes): the read fails with ENOMEM, naming the file,
/// rather than std::bad_alloc naming nothing (or ending a pread thread, and the process).
inline bool grow_for(Buffer& buffer, std::size_t needed) noexcept {
  if (buffer.capacity() >= needed) return true;
  try {
    Buffer grown(buffer.size(), needed);
    if (buffer.size() != 0) std::memcpy(grown.data(), buffer.data(), buffer.size());
    buffer = std::move(grown);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

/// grow_for's failure, as IoError's detail.
inline constexpr const char* too_large = "the file's size is more than memory can hold";

}  // namespace coload::io::detail
