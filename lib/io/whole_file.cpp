// read_whole_file: one regular file, read at once under a size limit.

#include "coload/io/whole_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "coload/io/errors.hpp"

namespace coload::io {

WholeFile read_whole_file(const std::filesystem::path& path, std::uint64_t limit) {
  using Status = WholeFile::Status;
  WholeFile out;
  const auto failed = [&out](Status status) {
    out.status = status;
    out.error = errno;
    return std::move(out);
  };
  // NOTE: O_NONBLOCK: opening a FIFO must not wait for a writer; the file is then refused for
  // not being a regular one before anything is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return failed(Status::cannot_open);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return failed(Status::cannot_stat);
  if (const char* what = not_regular(st.st_mode)) {
    out.status = Status::not_regular;
    out.what = what;
    return out;
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > limit) {
    out.status = Status::too_big;
    out.size = size;
    return out;
  }
  // The size may change under us: read in chunks, and stop once past the limit.
  out.bytes.reserve(static_cast<std::size_t>(size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return failed(Status::cannot_read);
    if (n == 0) break;
    out.bytes.append(chunk, static_cast<std::size_t>(n));
    if (out.bytes.size() > limit) {
      out.status = Status::grew;
      out.bytes = {};
      return out;
    }
  }
  return out;
}

}  // namespace coload::io
