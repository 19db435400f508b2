#pragma once
// File: an open file for positional reads (Reader::read_at).

#include <cstdint>
#include <string>
#include <utility>

namespace coload::io {

/// An open, read-only file: owns its descriptor and closes it when destroyed.
///
/// Made by `Reader::open`. Closing does not cancel reads: a File must outlive every
/// `read_at` on it, which holds when the caller awaits each read before dropping the File.
class File {
 public:
  /// A File that owns nothing.
  File() noexcept = default;
  /// Takes ownership of `fd`, an open descriptor of the file at `path` that is `size` bytes long.
  File(int fd, std::string path, std::uint64_t size) noexcept
      : fd_(fd), size_(size), path_(std::move(path)) {}
  File(File&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        size_(std::exchange(other.size_, 0)),
        path_(std::move(other.path_)) {}
  File& operator=(File&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = std::exchange(other.fd_, -1);
      size_ = std::exchange(other.size_, 0);
      path_ = std::move(other.path_);
    }
    return *this;
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { close(); }

  /// True while the File owns a descriptor.
  bool is_open() const noexcept { return fd_ >= 0; }
  /// The descriptor (-1 when closed).
  int native_handle() const noexcept { return fd_; }
  /// The path it was opened with; errors name it.
  const std::string& path() const noexcept { return path_; }
  /// The file's size when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  /// Closes the descriptor now (the destructor does it otherwise).
  void close() noexcept;

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string path_;
};

}  // namespace coload::io
