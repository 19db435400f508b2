#pragma once
// read_whole_file: a small file read at once (an image for decode_file, a saved loader state),
// with the checks every such read needs: never waiting on a FIFO, never reading a device
// without end, bounded by a limit the caller chooses.

#include <cstdint>
#include <filesystem>
#include <string>

namespace coload::io {

/// What read_whole_file found: the file's bytes, or why it has none. The caller words the
/// error, since each says it its own way ("loading the loader state: ...", an image's path).
struct WholeFile {
  enum class Status { read, cannot_open, cannot_stat, not_regular, too_big, grew, cannot_read };
  Status status = Status::read;
  /// cannot_open, cannot_stat, cannot_read: the errno value.
  int error = 0;
  /// not_regular: what the file is instead, as not_regular() says it ("a FIFO, not a regular
  /// file").
  const char* what = nullptr;
  /// too_big: the size the file had when opened (grew: it grew past the limit while read).
  std::uint64_t size = 0;
  /// read: the contents (fewer bytes than fstat said if the file shrank meanwhile).
  std::string bytes;

  bool ok() const noexcept { return status == Status::read; }
};

/// Reads the regular file at `path` whole, if it has at most `limit` bytes. Opened with
/// O_NONBLOCK, so that a FIFO is refused at once rather than waited on; a file that grows while
/// read stops one chunk past the limit. Allocates the size fstat gives, bounded by `limit`.
WholeFile read_whole_file(const std::filesystem::path& path, std::uint64_t limit);

}  // namespace coload::io
