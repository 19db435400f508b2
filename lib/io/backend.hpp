#pragma once
// The seam between Reader and the two mechanisms that carry its reads.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>

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

/// `n` rounded up to a multiple of `to` (a power of two).
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) & ~(to - 1);
}

/// Bytes the first read of read_file asks for.
inline std::size_t first_read_size(const ReaderOptions& options) noexcept {
  return round_up(options.first_read == 0 ? 1 : options.first_read, Buffer::alignment);
}

}  // namespace coload::io::detail
