#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <coroutine>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coload/coro/detached.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/io/io.hpp"

namespace io = coload::io;
namespace fs = std::filesystem;
using coload::Detached;

namespace {

// ---- fixtures -----------------------------------------------------------------------------

/// A fresh directory under /tmp (a real file system, so O_DIRECT works), removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "coload-io-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  /// Writes `contents` to `name` and returns its path.
  std::string write(const std::string& name, const std::string& contents) const {
    const fs::path p = path / name;
    std::ofstream(p, std::ios::binary).write(contents.data(),
                                             static_cast<std::streamsize>(contents.size()));
    return p.string();
  }
};

/// `n` bytes that differ with `seed` and with the position (no period a bug could hide in).
std::string pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s[i] = static_cast<char>(x);
  }
  return s;
}

std::string text(const io::Buffer& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

/// Drops a file's pages from the page cache, so that reading it goes to the device.
/// Dirty pages stay: call ::sync() once after writing the files.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

int open_fd_count() {
  int n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

/// An io_context run by its own thread while the object lives, like the loader's driver.
struct IoThread {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  std::thread thread{[this] { ctx.run(); }};

  ~IoThread() {
    guard.reset();
    thread.join();
  }
  /// Runs `f` on the io thread and returns its result.
  template <class F>
  auto call(F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(ctx, [&task] { task(); });
    return result.get();
  }
};

/// Makes a Reader and destroys it on the io thread, as Reader's contract asks.
struct ReaderOn {
  IoThread& io;
  std::unique_ptr<io::Reader> reader;
  ReaderOn(IoThread& t, io::ReaderOptions options)
      : io(t), reader(std::make_unique<io::Reader>(t.ctx, options)) {}
  ~ReaderOn() { destroy(); }
  void destroy() {
    if (reader) io.call([this] { reader.reset(); });
  }
  io::Reader& operator*() { return *reader; }
  io::Reader* operator->() { return reader.get(); }
};

struct Outcome {
  std::optional<std::string> data;
  int error = 0;
  std::string what;
  std::thread::id resumed_on;
};

// The references stay valid: every caller waits on `done` before they go out of scope.
Detached read_into(io::Reader& reader, std::string path, Outcome& out, std::latch& done) {
  try {
    io::Buffer buffer = co_await reader.read_file(std::move(path));
    out.data = text(buffer);
  } catch (const io::IoError& e) {
    out.error = e.error();
    out.what = e.what();
  }
  out.resumed_on = std::this_thread::get_id();
  done.count_down();
}

/// Starts a read of every path in one turn of the io thread and waits for all of them.
std::vector<Outcome> read_all(IoThread& io, io::Reader& reader,
                              const std::vector<std::string>& paths) {
  std::vector<Outcome> out(paths.size());
  std::latch done(static_cast<std::ptrdiff_t>(paths.size()));
  io.call([&] {
    for (std::size_t i = 0; i < paths.size(); ++i) read_into(reader, paths[i], out[i], done);
  });
  done.wait();
  return out;
}

io::ReaderOptions with_backend(io::Backend backend, io::ReaderOptions options = {}) {
  options.backend = backend;
  return options;
}

const io::Backend kBackends[] = {io::Backend::uring, io::Backend::pread};

std::string name(io::Backend b) { return b == io::Backend::uring ? "uring" : "pread"; }

}  // namespace

// ---- tests --------------------------------------------------------------------------------

TEST_SUITE("io") {

TEST_CASE("a Buffer is aligned for O_DIRECT, moves its storage and resizes within capacity") {
  io::Buffer a(10, 8192);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % io::Buffer::alignment == 0);
  CHECK(a.size() == 10);
  CHECK(a.capacity() == 8192);
  std::byte* storage = a.data();
  io::Buffer b = std::move(a);
  CHECK(b.data() == storage);
  CHECK(a.data() == nullptr);
  CHECK(a.size() == 0);
  b.resize(8192);
  CHECK(b.bytes().size() == 8192);
  CHECK(io::Buffer().empty());
}

TEST_CASE("with COLOAD_IO=pread the Reader uses the pread pool and says so once on stderr") {
  // NOTE: first in the file: the notice is printed once per process, and this is the only
  // test that provokes it (forcing the pool by option prints nothing).
  IoThread io;
  TempDir dir;
  const std::string path = dir.write("f", pattern(1000, 1));
  const std::string log = (dir.path / "stderr").string();
  ::setenv("COLOAD_IO", "pread", 1);
  const int saved = ::dup(2);
  const int sink = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(sink, 2);
  {
    ReaderOn reader(io, {});
    CHECK(reader->backend() == io::Backend::pread);
    CHECK(text(coload::sync_wait(reader->read_file(path))) == pattern(1000, 1));
    ReaderOn second(io, {});  // a second Reader stays quiet
    CHECK(second->backend() == io::Backend::pread);
  }
  ::dup2(saved, 2);
  ::close(saved);
  ::close(sink);
  ::unsetenv("COLOAD_IO");
  std::ifstream in(log);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "coload: io_uring unavailable (COLOAD_IO=pread); reading with a pread pool\n");
}

TEST_CASE("the default backend is io_uring here, and an option forces the pread pool") {
  IoThread io;
  ReaderOn uring(io, {});
  CHECK(uring->backend() == io::Backend::uring);
  ReaderOn pool(io, with_backend(io::Backend::pread));
  CHECK(pool->backend() == io::Backend::pread);
}

TEST_CASE("read_file returns the exact contents of empty, small, first-buffer-sized and large files") {
  TempDir dir;
  const std::size_t first = 128 * 1024;
  const std::vector<std::size_t> sizes = {0,         1,         100,           4095,
                                          4096,      4097,      first - 1,     first,
                                          first + 1, 2 * first, 3 * 1024 * 1024 + 17};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    paths.push_back(dir.write(std::to_string(i), pattern(sizes[i], static_cast<unsigned>(i))));
  }
  ::sync();
  for (const bool direct : {false, true}) {
    for (const io::Backend backend : kBackends) {
      CAPTURE(name(backend));
      CAPTURE(direct);
      IoThread io;
      io::ReaderOptions options = with_backend(backend);
      options.direct = direct;
      ReaderOn reader(io, options);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        CAPTURE(sizes[i]);
        if (direct) evict(paths[i]);
        const io::Buffer b = coload::sync_wait(reader->read_file(paths[i]));
        CHECK(b.size() == sizes[i]);
        CHECK(text(b) == pattern(sizes[i], static_cast<unsigned>(i)));
        // Small files do not keep the whole first buffer alive.
        CHECK(b.capacity() < std::max<std::size_t>(2 * b.size(), 2 * io::Buffer::alignment));
      }
    }
  }
}

TEST_CASE("buffers read by a Reader stay valid after it is destroyed, and may die on any thread") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 20; ++i) paths.push_back(dir.write(std::to_string(i), pattern(100'000 + i, i)));
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    std::vector<io::Buffer> kept;
    {
      IoThread io;
      ReaderOn reader(io, with_backend(backend));
      for (const auto& p : paths) kept.push_back(coload::sync_wait(reader->read_file(p)));
      // Recycled storage: a buffer dropped now is handed out again, intact contents or not.
      kept.pop_back();
      kept.push_back(coload::sync_wait(reader->read_file(paths.back())));
    }
    std::thread other([&] {
      for (unsigned i = 0; i < 10; ++i) {
        CHECK(text(kept[i]) == pattern(100'000 + i, i));
        kept[i] = io::Buffer();
      }
    });
    other.join();
    for (unsigned i = 10; i < 20; ++i) CHECK(text(kept[i]) == pattern(100'000 + i, i));
  }
}

TEST_CASE("a small first read takes several follow-ups for a growing file size, bytes intact") {
  TempDir dir;
  const std::string path = dir.write("big", pattern(1'000'003, 7));
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    io::ReaderOptions options = with_backend(backend);
    options.first_read = 1;  // rounded up to one page
    ReaderOn reader(io, options);
    CHECK(text(coload::sync_wait(reader->read_file(path))) == pattern(1'000'003, 7));
  }
}

TEST_CASE("many more concurrent reads than the queue holds all return their own bytes") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 600; ++i) {
    // Mostly small files, every 50th one larger than the first buffer.
    const std::size_t size = i % 50 == 0 ? 300'000 + i : 1000 + 97 * i;
    paths.push_back(dir.write(std::to_string(i), pattern(size, i)));
  }
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    io::ReaderOptions options = with_backend(backend);
    options.queue_depth = 8;
    ReaderOn reader(io, options);
    const std::vector<Outcome> out = read_all(io, *reader, paths);
    for (unsigned i = 0; i < 600; ++i) {
      REQUIRE(out[i].data.has_value());
      CHECK(*out[i].data == pattern(i % 50 == 0 ? 300'000 + i : 1000 + 97 * i, i));
      CHECK(out[i].resumed_on == io.thread.get_id());
    }
    const io::ReaderStats stats = io.call([&] { return reader->stats(); });
    CHECK(stats.operations >= 600);
    if (backend == io::Backend::uring) {
      CHECK(stats.completion_queue == 16);
      CHECK(stats.max_in_flight > 3);
      CHECK(stats.max_in_flight <= stats.completion_queue);
    }
  }
}

TEST_CASE("reads started in one turn of the loop reach the kernel in one submit") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 40; ++i) paths.push_back(dir.write(std::to_string(i), pattern(5000, i)));
  IoThread io;
  ReaderOn reader(io, {});  // 256 SQEs: room for all 40 chains of three
  const std::vector<Outcome> out = read_all(io, *reader, paths);
  for (unsigned i = 0; i < 40; ++i) CHECK(out[i].data == pattern(5000, i));
  const io::ReaderStats stats = io.call([&] { return reader->stats(); });
  CHECK(stats.operations == 40);
  CHECK(stats.submits == 1);
  CHECK(stats.max_in_flight == 120);
}

TEST_CASE("with more files than file slots, slots are reused only after their close, no fd leaks") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 300; ++i) paths.push_back(dir.write(std::to_string(i), pattern(3000 + i, i)));
  for (const unsigned slots : {1u, 3u}) {
    CAPTURE(slots);
    const int fds_before = open_fd_count();
    {
      IoThread io;
      io::ReaderOptions options;
      options.file_slots = slots;
      ReaderOn reader(io, options);
      const std::vector<Outcome> out = read_all(io, *reader, paths);
      for (unsigned i = 0; i < 300; ++i) CHECK(out[i].data == pattern(3000 + i, i));
      // Errors free their slot too: a failed open, then a failed read.
      CHECK_THROWS_AS(coload::sync_wait(reader->read_file((dir.path / "missing").string())), io::IoError);
      CHECK_THROWS_AS(coload::sync_wait(reader->read_file(dir.path.string())), io::IoError);
      CHECK(read_all(io, *reader, paths)[299].data == pattern(3299, 299));
    }
    CHECK(open_fd_count() == fds_before);
  }
}

TEST_CASE("errors name the path and the errno text: missing file, directory, not a directory") {
  TempDir dir;
  const std::string file = dir.write("plain", "x");
  struct Case {
    std::string path;
    int error;
  };
  const std::vector<Case> cases = {{(dir.path / "missing.jpg").string(), ENOENT},
                                   {dir.path.string(), EISDIR},
                                   {file + "/below", ENOTDIR}};
  for (const io::Backend backend : kBackends) {
    IoThread io;
    ReaderOn reader(io, with_backend(backend));
    for (const Case& c : cases) {
      CAPTURE(name(backend));
      CAPTURE(c.path);
      try {
        (void)coload::sync_wait(reader->read_file(c.path));
        FAIL("read_file did not throw");
      } catch (const io::IoError& e) {
        CHECK(e.error() == c.error);
        CHECK(e.path() == c.path);
        CHECK(e.code() == std::error_code(c.error, std::system_category()));
        const std::string what = e.what();
        CHECK(what.find("'" + c.path + "'") != std::string::npos);
        CHECK(what.find(std::strerror(c.error)) != std::string::npos);
      }
    }
    try {
      (void)coload::sync_wait(reader->open(cases[0].path));
      FAIL("open did not throw");
    } catch (const io::IoError& e) {
      CHECK(std::string(e.what()) ==
            "cannot open '" + cases[0].path + "': " + std::strerror(ENOENT));
    }
  }
}

TEST_CASE("a file the process may not read fails with EACCES naming the path") {
  TempDir dir;
  const std::string path = dir.write("secret", "hidden");
  ::chmod(path.c_str(), 0600);
  ::chmod(dir.path.c_str(), 0755);
  // Root reads everything; the check runs in a child that drops to nobody first.
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  std::fflush(nullptr);  // the child must not print the parent's buffered output again
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    std::string report;
    for (const io::Backend backend : kBackends) {
      IoThread io;
      ReaderOn reader(io, with_backend(backend));
      try {
        (void)coload::sync_wait(reader->read_file(path));
        report += "no error\n";
      } catch (const io::IoError& e) {
        report += std::to_string(e.error()) + "|" + e.what() + "\n";
      }
    }
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char chunk[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) report.append(chunk, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string line = std::to_string(EACCES) + "|cannot open '" + path + "': " +
                           std::strerror(EACCES) + "\n";
  CHECK(report == line + line);
}

TEST_CASE("read_at reads at offsets, stops at the end of the file, and names the path on errors") {
  TempDir dir;
  const std::string contents = pattern(200'000, 3);
  const std::string path = dir.write("records", contents);
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    ReaderOn reader(io, with_backend(backend));
    io::File file = coload::sync_wait(reader->open(path));
    CHECK(file.is_open());
    CHECK(file.size() == 200'000);
    CHECK(file.path() == path);
    std::vector<std::byte> out(10'000);
    struct Probe {
      std::uint64_t offset;
      std::size_t expect;
    };
    for (const Probe p : {Probe{0, 10'000}, Probe{12'345, 10'000}, Probe{195'000, 5'000},
                          Probe{199'999, 1}, Probe{200'000, 0}, Probe{1'000'000, 0}}) {
      CAPTURE(p.offset);
      const std::size_t n = coload::sync_wait(reader->read_at(file, p.offset, out));
      REQUIRE(n == p.expect);
      CHECK(std::memcmp(out.data(), contents.data() + p.offset, n) == 0);
    }
    // A directory opens, but reading it fails.
    io::File folder = coload::sync_wait(reader->open(dir.path.string()));
    try {
      (void)coload::sync_wait(reader->read_at(folder, 0, out));
      FAIL("read_at did not throw");
    } catch (const io::IoError& e) {
      CHECK(e.error() == EISDIR);
      CHECK(std::string(e.what()) ==
            "cannot read '" + dir.path.string() + "': " + std::strerror(EISDIR));
    }
  }
}

TEST_CASE("direct mode read_at with aligned buffers returns the file's bytes") {
  TempDir dir;
  const std::string contents = pattern(64 * 1024 + 100, 9);
  const std::string path = dir.write("direct", contents);
  ::sync();
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    io::ReaderOptions options = with_backend(backend);
    options.direct = true;
    ReaderOn reader(io, options);
    evict(path);
    io::File file = coload::sync_wait(reader->open(path));
    io::Buffer out(16 * 1024);
    CHECK(coload::sync_wait(reader->read_at(file, 8192, out.mutable_bytes())) == 16 * 1024);
    CHECK(std::memcmp(out.data(), contents.data() + 8192, 16 * 1024) == 0);
    // The tail: a short read at the end of the file.
    CHECK(coload::sync_wait(reader->read_at(file, 64 * 1024, out.mutable_bytes())) == 100);
    CHECK(std::memcmp(out.data(), contents.data() + 64 * 1024, 100) == 0);
  }
}

TEST_CASE("completions resume the awaiting coroutine on the io_context's thread") {
  TempDir dir;
  const std::string path = dir.write("f", pattern(777, 5));
  for (const io::Backend backend : kBackends) {
    IoThread io;
    ReaderOn reader(io, with_backend(backend));
    // Started from this thread (not the io thread): the start is posted over.
    std::thread::id resumed_on;
    auto body = [&]() -> coload::Task<std::string> {
      io::Buffer b = co_await reader->read_file(path);
      resumed_on = std::this_thread::get_id();
      co_return text(b);
    };
    CHECK(coload::sync_wait(body()) == pattern(777, 5));
    CHECK(resumed_on == io.thread.get_id());
  }
}

TEST_CASE("destroying a Reader with hundreds of reads queued and in flight resumes every one") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 400; ++i) paths.push_back(dir.write(std::to_string(i), pattern(40'000 + i, i)));
  ::sync();
  for (const io::Backend backend : kBackends) {
    for (const bool direct : {false, true}) {
      // A round where every read finished before the Reader went (its threads ran them all while
      // this thread waited for a turn, on a loaded machine) cancels nothing and shows nothing:
      // it is run again, up to 5 times.
      for (int round = 0; round < 5; ++round) {
        CAPTURE(name(backend));
        CAPTURE(direct);
        CAPTURE(round);
        for (const auto& p : paths) evict(p);
        IoThread io;
        io::ReaderOptions options = with_backend(backend);
        options.queue_depth = 64;
        options.direct = direct;
        options.pread_threads = 2;
        auto reader = std::make_unique<io::Reader>(io.ctx, options);
        std::vector<Outcome> out(paths.size());
        std::latch done(static_cast<std::ptrdiff_t>(paths.size()));
        io.call([&] {
          for (std::size_t i = 0; i < paths.size(); ++i) read_into(*reader, paths[i], out[i], done);
        });
        // A later turn: the first submit has gone out, and reads are in the kernel.
        const bool all_resumed = io.call([&] {
          reader.reset();
          return done.try_wait();
        });
        CHECK(all_resumed);
        unsigned ok = 0;
        unsigned cancelled = 0;
        for (unsigned i = 0; i < paths.size(); ++i) {
          if (out[i].data) {
            ++ok;
            CHECK(*out[i].data == pattern(40'000 + i, i));
          } else {
            ++cancelled;
            CHECK(out[i].error == ECANCELED);
            CHECK(out[i].what.find(paths[i]) != std::string::npos);
          }
        }
        CHECK(ok + cancelled == 400);
        if (cancelled > 0) break;
        CHECK_MESSAGE(round < 4, "no read was cancelled in 5 rounds");
      }
    }
  }
}

TEST_CASE("a coroutine resumed by the Reader may destroy it while others are in flight") {
  TempDir dir;
  std::vector<std::string> paths;
  for (unsigned i = 0; i < 200; ++i) paths.push_back(dir.write(std::to_string(i), pattern(2000 + i, i)));
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    io::ReaderOptions options = with_backend(backend);
    options.queue_depth = 16;
    auto reader = std::make_unique<io::Reader>(io.ctx, options);
    std::vector<Outcome> out(paths.size());
    std::latch done(static_cast<std::ptrdiff_t>(paths.size()));
    std::promise<bool> destroyed;
    // The first read to finish destroys the Reader from inside its own completion.
    auto first = [&]() -> Detached {
      Outcome mine;
      try {
        mine.data = text(co_await reader->read_file(paths[0]));
      } catch (const io::IoError& e) {
        mine.error = e.error();
      }
      reader.reset();
      destroyed.set_value(mine.data == pattern(2000, 0));
    };
    io.call([&] {
      first();
      for (std::size_t i = 1; i < paths.size(); ++i) read_into(*reader, paths[i], out[i], done);
      done.count_down();  // out[0] is read by `first`
    });
    CHECK(destroyed.get_future().get());
    done.wait();
    for (unsigned i = 1; i < paths.size(); ++i) {
      if (out[i].data) {
        CHECK(*out[i].data == pattern(2000 + i, i));
      } else {
        CHECK(out[i].error == ECANCELED);
      }
    }
  }
}

TEST_CASE("a FIFO is refused at once as no regular file, naming the path (both backends)") {
  TempDir dir;
  const std::string fifo = (dir.path / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const io::Backend backend : {io::Backend::uring, io::Backend::pread}) {
    CAPTURE(static_cast<int>(backend));
    IoThread io;
    auto reader = std::make_unique<io::Reader>(io.ctx, io::ReaderOptions{.backend = backend});
    Outcome out;
    std::latch done(1);
    io.call([&] { read_into(*reader, fifo, out, done); });
    done.wait();
    // Opened without blocking (no writer), then refused for what it is.
    CHECK_FALSE(out.data);
    CHECK(out.error == EINVAL);
    CHECK(out.what == "cannot read '" + fifo + "' (a FIFO, not a regular file): Invalid argument");
    io.call([&] { reader.reset(); });
  }
  // open() for read_at too: the io_uring backend's read_at retried the FIFO's EAGAIN for ever.
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    ReaderOn reader(io, with_backend(backend));
    try {
      (void)coload::sync_wait(reader->open(fifo));
      FAIL("open did not throw");
    } catch (const io::IoError& e) {
      CHECK(e.error() == EINVAL);
      CHECK(std::string(e.what()) ==
            "cannot open '" + fifo + "' (a FIFO, not a regular file): Invalid argument");
    }
  }
}

TEST_CASE("a device that reads like a file, a FIFO with a writer and a size past memory (both backends)") {
  // The type was checked only when nothing was read: /dev/zero filled the first read and came
  // back as 128 KiB of a file. A size of a terabyte was allocated whole (a pread thread's
  // bad_alloc ended the process; io_uring's named no file), and a first_read of 4 GiB wrapped
  // to 0 in io_uring's 32-bit length.
  TempDir dir;
  const std::string fifo = (dir.path / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int writer = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer, nothing written
  REQUIRE(writer >= 0);
  const std::string huge = (dir.path / "huge.jpg").string();
  {
    const int fd = ::open(huge.c_str(), O_CREAT | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 40) == 0);  // sparse: a terabyte of zeros, said
    ::close(fd);
  }
  for (const io::Backend backend : kBackends) {
    CAPTURE(name(backend));
    IoThread io;
    ReaderOn reader(io, with_backend(backend));
    const auto error_of = [&](const std::string& path) -> std::string {
      try {
        (void)coload::sync_wait(reader->read_file(path));
        return "no error";
      } catch (const io::IoError& e) {
        return e.what();
      }
    };
    CHECK(error_of("/dev/zero") ==
          "cannot read '/dev/zero' (a character device, not a regular file): Invalid argument");
    CHECK(error_of(fifo) ==
          "cannot read '" + fifo + "' (a FIFO, not a regular file): Invalid argument");
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // (A sanitizer's allocator aborts on a terabyte rather than failing it.) Overcommit
    // "always" would hand it out.
    if (std::ifstream("/proc/sys/vm/overcommit_memory").get() != '1') {
      CHECK(error_of(huge) == "cannot read '" + huge +
                                  "' (the file's size is more than memory can hold): Cannot "
                                  "allocate memory");
    }
#endif
  }
  ::close(writer);
  IoThread io;
  CHECK_THROWS_WITH_AS(io::Reader(io.ctx, io::ReaderOptions{.first_read = std::size_t{4} << 30}),
                       "ReaderOptions::first_read is 4294967296 bytes: at most 1 GiB (2^30), the "
                       "size of one read",
                       coload::InvalidArgument);
}

}  // TEST_SUITE
