// Reader: picks its backend (io_uring, or the pread pool where io_uring is refused).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "backend.hpp"
#include "coload/config.hpp"
#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/io/reader.hpp"

namespace coload::io {
namespace {

// The reason io_uring must not be tried at all, or an empty string.
std::string uring_refused(const ReaderOptions& options) {
  if (options.backend == Backend::pread) return "ReaderOptions::backend is pread";
  if (const char* env = std::getenv("COLOAD_IO"); env && std::strcmp(env, "pread") == 0) {
    return "COLOAD_IO=pread";
  }
#if !COLOAD_HAVE_IO_URING
  return "built without liburing";
#else
  // 0: allowed; 1: only for the io_uring_group (io_uring_queue_init then fails with EPERM,
  // which the caller reports); 2: refused to everyone.
  std::ifstream disabled("/proc/sys/kernel/io_uring_disabled");
  int level = 0;
  if (disabled >> level && level == 2) return "kernel.io_uring_disabled=2";
  return {};
#endif
}

void say_once(const std::string& why) {
  static std::once_flag said;
  std::call_once(said, [&] {
    coload::detail::warn("io_uring unavailable (" + why + "); reading with a pread pool",
                         "coload: ");
  });
}

}  // namespace

Reader::Reader(asio::io_context& ctx, ReaderOptions options) : ctx_(&ctx) {
  // One read's length: io_uring's is 32 bits (4 GiB wrapped to 0, 3 GiB read as a negative
  // count and the file's rest dropped), and the kernel caps one read near 2 GiB.
  if (options.first_read > (std::size_t{1} << 30)) {
    throw InvalidArgument("ReaderOptions::first_read is " + std::to_string(options.first_read) +
                          " bytes: at most 1 GiB (2^30), the size of one read");
  }
  std::string why = uring_refused(options);
#if COLOAD_HAVE_IO_URING
  if (why.empty()) {
    backend_ = detail::make_uring_backend(ctx, options, why);
  }
#endif
  if (!backend_) {
    // NOTE: a caller who asked for the pool by option gets no notice: nothing is unavailable.
    if (options.backend != Backend::pread) say_once(why);
    backend_ = detail::make_pread_backend(ctx, options);
  }
}

Reader::~Reader() = default;

Task<Buffer> Reader::read_file(std::string path) { return backend_->read_file(std::move(path)); }

Task<File> Reader::open(std::string path) { return backend_->open(std::move(path)); }

Task<std::size_t> Reader::read_at(const File& file, std::uint64_t offset,
                                  std::span<std::byte> out) {
  return backend_->read_at(file, offset, out);
}

Backend Reader::backend() const noexcept { return backend_->kind(); }

ReaderStats Reader::stats() const noexcept { return backend_->stats(); }

}  // namespace coload::io
