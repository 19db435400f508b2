// The metrics hooks: stage names, histogram merging, the shared shards and the trace writer.

#include "coload/core/metrics.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <new>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"

namespace coload {

std::string_view stage_name(Stage stage) noexcept {
  switch (stage) {
    case Stage::sample: return "sample";
    case Stage::read: return "read";
    case Stage::decode: return "decode";
    case Stage::transform: return "transform";
    case Stage::collate: return "collate";
    case Stage::pin: return "pin";
    case Stage::copy: return "copy";
    case Stage::wait: return "wait";
  }
  return "?";
}

namespace detail {

double bucket_mid_ns(std::size_t i) noexcept {
  if (i < 4) return static_cast<double>(i);
  const std::size_t b = i / 4;
  const double sub = static_cast<double>(i % 4);
  const double low = std::ldexp(1.0 + sub / 4.0, static_cast<int>(b));
  const double high = std::ldexp(1.0 + (sub + 1.0) / 4.0, static_cast<int>(b));
  return (low + high) / 2.0;
}

void StageTotals::add(const StageCell& c) noexcept {
  count += c.count.load(std::memory_order_relaxed);
  ns += c.ns.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < histogram_buckets; ++i) {
    buckets[i] += c.buckets[i].load(std::memory_order_relaxed);
  }
}

void StageTotals::subtract(const StageTotals& base) noexcept {
  // NOTE: the cells are read one by one while writers add: a figure read before its base
  // cannot be smaller, but clamp anyway.
  count = count > base.count ? count - base.count : 0;
  ns = ns > base.ns ? ns - base.ns : 0;
  for (std::size_t i = 0; i < histogram_buckets; ++i) {
    buckets[i] = buckets[i] > base.buckets[i] ? buckets[i] - base.buckets[i] : 0;
  }
}

double StageTotals::quantile_ms(double q) const noexcept {
  std::uint64_t total = 0;
  for (auto b : buckets) total += b;
  if (total == 0) return 0.0;
  const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < histogram_buckets; ++i) {
    seen += buckets[i];
    if (seen >= std::max<std::uint64_t>(rank, 1)) return bucket_mid_ns(i) / 1e6;
  }
  return bucket_mid_ns(histogram_buckets - 1) / 1e6;
}

void ShardTotals::add(const Shard& s) noexcept {
  for (std::size_t i = 0; i < stage_count; ++i) stages[i].add(s.stages[i]);
  read_latency.add(s.read_latency);
  bytes_read += s.bytes_read.load(std::memory_order_relaxed);
  samples += s.samples.load(std::memory_order_relaxed);
  if (const auto p = s.pid.load(std::memory_order_relaxed)) pid = p;
}

void ShardTotals::subtract(const ShardTotals& base) noexcept {
  for (std::size_t i = 0; i < stage_count; ++i) stages[i].subtract(base.stages[i]);
  read_latency.subtract(base.read_latency);
  bytes_read = bytes_read > base.bytes_read ? bytes_read - base.bytes_read : 0;
  samples = samples > base.samples ? samples - base.samples : 0;
}

std::uint64_t ShardTotals::busy_ns() const noexcept {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < stage_count; ++i) {
    if (static_cast<Stage>(i) != Stage::wait) n += stages[i].ns;
  }
  return n;
}

ThreadRecording& thread_recording() noexcept {
  thread_local ThreadRecording r;
  return r;
}

Recorder::Recorder(int workers, bool enabled, const std::string& trace_path)
    : enabled_(enabled), workers_(std::max(workers, 1)), count_(workers_ + 3) {
  if (!enabled_ && trace_path.empty()) {
    count_ = 0;
    return;
  }
  bytes_ = sizeof(Shard) * static_cast<std::size_t>(count_);
  // Shared, so that worker processes forked later write into the parent's figures; a memfd,
  // so that fork-server workers, which are not forked from here, can map it too.
  fd_ = ::memfd_create("coload-metrics", MFD_CLOEXEC);
  if (fd_ >= 0 && ::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
  void* p = fd_ >= 0 ? ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0)
                     : ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                              -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (fd_ >= 0) ::close(fd_);
    throw SystemError(err, std::generic_category(), "metrics: cannot map the shards");
  }
  shards_ = static_cast<Shard*>(p);
  for (int i = 0; i < count_; ++i) new (&shards_[i]) Shard();
  if (!trace_path.empty()) {
    tracer_ = std::make_unique<Tracer>(trace_path);
    tracer_->name_track(0, "consumer");
  }
}

Recorder::Recorder(const Joined& j)
    : enabled_(j.enabled), workers_(std::max(j.workers, 1)), count_(workers_ + 3), owner_(false) {
  bytes_ = sizeof(Shard) * static_cast<std::size_t>(count_);
  // The trace first: a constructor that throws after the mapping would leave it mapped.
  try {
    if (!j.trace_path.empty()) tracer_ = std::make_unique<Tracer>(j.trace_path, j.trace_base_ns);
  } catch (...) {
    ::close(j.fd);
    throw;
  }
  struct stat st {};
  if (::fstat(j.fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes_) {
    ::close(j.fd);
    throw InvalidArgument("metrics: the parent's shards are not a memfd of " +
                          std::to_string(bytes_) + " bytes");
  }
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, j.fd, 0);
  const int err = errno;
  ::close(j.fd);
  if (p == MAP_FAILED) {
    throw SystemError(err, std::generic_category(), "metrics: cannot map the parent's shards");
  }
  shards_ = static_cast<Shard*>(p);
}

Recorder::Joined Recorder::joined() const {
  return Joined{fd_, workers_, enabled_, tracer_ ? tracer_->path() : std::string(),
                tracer_ ? tracer_->base_ns() : 0};
}

Recorder::~Recorder() {
  tracer_.reset();
  if (shards_) {
    if (owner_) {
      for (int i = 0; i < count_; ++i) shards_[i].~Shard();
    }
    ::munmap(shards_, bytes_);
  }
  if (fd_ >= 0) ::close(fd_);
}

Shard& Recorder::shard(int who) noexcept {
  if (who == consumer) return shards_[0];
  if (who == driver) return shards_[1];
  if (who >= 0 && who < workers_) return shards_[2 + who];
  return shards_[count_ - 1];
}

int Recorder::role_of(int i) const noexcept {
  if (i == 0) return consumer;
  if (i == 1) return driver;
  if (i < count_ - 1) return i - 2;
  return -3;
}

void Recorder::bind_thread(int who) noexcept {
  auto& r = thread_recording();
  if (!shards_) {
    r = ThreadRecording{};
    return;
  }
  r.recorder = this;
  r.shard = &shard(who);
  const auto pid = static_cast<std::int32_t>(::getpid());
  if (r.shard->pid.exchange(pid, std::memory_order_relaxed) != pid) {
    // Another process takes the role (a worker restarted after a death): the reads the last
    // one left in flight are not this one's.
    r.shard->reads_in_flight.store(0, std::memory_order_relaxed);
    r.shard->accounted_ns.store(0, std::memory_order_relaxed);
  }
  r.track = static_cast<int>(r.shard - shards_);
  if (tracer_) {
    const int i = r.track;
    const int role = role_of(i);
    tracer_->name_track(i, role == consumer ? "consumer"
                           : role == driver ? "driver"
                           : role >= 0      ? "worker " + std::to_string(role)
                                            : std::string("other"));
  }
}

void Recorder::after_fork() noexcept {
  if (tracer_) tracer_->after_fork();
}

// --- Tracer ---

Tracer::Tracer(const std::string& path) : path_(path), owner_(::getpid()), base_ns_(now_ns()) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw SystemError(errno, std::generic_category(), "trace: cannot open '" + path + "'");
  }
  buffer_.reserve(chunk);
  // At once: worker processes append their events to the file from their first task.
  buffer_ = "[\n";
  write_locked();
}

Tracer::Tracer(const std::string& path, std::uint64_t base_ns)
    : path_(path), owner_(-1), base_ns_(base_ns) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) {
    throw SystemError(errno, std::generic_category(), "trace: cannot open '" + path + "'");
  }
  buffer_.reserve(chunk);
}

Tracer::~Tracer() {
  if (::getpid() != owner_) return;  // a forked worker's copy: the parent closes the file
  lock();
  // A closing metadata event, so that every event line before it can end with a comma.
  buffer_ += R"({"name":"process_name","ph":"M","pid":)" + std::to_string(::getpid()) +
             R"(,"tid":0,"args":{"name":"coload"}})" "\n]\n";
  write_locked();
  unlock();
  ::close(fd_);
}

void Tracer::write_locked() {
  std::size_t off = 0;
  while (off < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + off, buffer_.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      warn_once("trace write " + path_, "trace: cannot write '" + path_ + "': the trace stops");
      break;
    }
    off += static_cast<std::size_t>(n);
  }
  buffer_.clear();
}

void Tracer::append(const std::string& line) {
  lock();
  buffer_ += line;
  if (buffer_.size() >= chunk) write_locked();
  unlock();
}

namespace {
std::string micros(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e3);
  return buf;
}
}  // namespace

void Tracer::span(std::string_view name, int track, std::uint64_t begin_ns, std::uint64_t end_ns,
                  const char* arg_name, std::int64_t arg) {
  std::string line = R"({"name":")";
  line += name;
  line += R"(","ph":"X","ts":)" + micros(begin_ns > base_ns_ ? begin_ns - base_ns_ : 0) +
          R"(,"dur":)" + micros(end_ns > begin_ns ? end_ns - begin_ns : 0) +
          R"(,"pid":)" + std::to_string(::getpid()) + R"(,"tid":)" + std::to_string(track);
  if (arg_name && arg >= 0) {
    line += R"(,"args":{")";
    line += arg_name;
    line += R"(":)" + std::to_string(arg) + "}";
  }
  line += "},\n";
  append(line);
}

void Tracer::async_span(std::string_view name, std::uint64_t id, std::uint64_t begin_ns,
                        std::uint64_t end_ns, const char* arg_name, std::int64_t arg) {
  std::string head = R"({"name":")";
  head += name;
  head += R"(","cat":")";
  head += name;
  const std::string tail = R"(,"id":)" + std::to_string(id) + R"(,"pid":)" +
                           std::to_string(::getpid()) + R"(,"tid":1)";
  std::string line = head + R"(","ph":"b","ts":)" +
                     micros(begin_ns > base_ns_ ? begin_ns - base_ns_ : 0) + tail +
                     R"(,"args":{")" + arg_name + R"(":)" + std::to_string(arg) + "}},\n";
  line += head + R"(","ph":"e","ts":)" + micros(end_ns > base_ns_ ? end_ns - base_ns_ : 0) +
          tail + "},\n";
  append(line);
}

void Tracer::instant(std::string_view name, int track, std::uint64_t at_ns, const char* arg_name,
                     std::int64_t arg) {
  std::string line = R"({"name":")";
  line += name;
  line += R"(","ph":"i","s":"t","ts":)" + micros(at_ns > base_ns_ ? at_ns - base_ns_ : 0) +
          R"(,"pid":)" + std::to_string(::getpid()) + R"(,"tid":)" + std::to_string(track) +
          R"(,"args":{")" + arg_name + R"(":)" + std::to_string(arg) + "}},\n";
  append(line);
}

void Tracer::name_track(int track, std::string_view name) {
  const auto i = static_cast<std::size_t>(track);
  if (i < named_.size()) {
    lock();
    const bool seen = std::exchange(named_[i], true);
    unlock();
    if (seen) return;
  }
  std::string line = R"({"name":"thread_name","ph":"M","pid":)" + std::to_string(::getpid()) +
                     R"(,"tid":)" + std::to_string(track) + R"(,"args":{"name":")";
  line += name;
  line += "\"}},\n";
  append(line);
}

void Tracer::flush() {
  lock();
  write_locked();
  unlock();
}

void Tracer::after_fork() noexcept {
  // NOTE: the lock may have been held by a parent thread that does not exist here, in the
  // middle of growing the buffer: the copy is left alone (leaked, at most one chunk) and the
  // child starts a buffer of its own.
  lock_.store(false);
  new (&buffer_) std::string();
  named_.fill(false);
}

}  // namespace detail

void StageTimer::stop() noexcept {
  if (!begin_) return;
  auto& r = detail::thread_recording();
  const std::uint64_t end = detail::now_ns();
  const std::uint64_t ns = end - begin_;
  if (r.shard) {
    if (r.recorder->enabled()) {
      r.shard->add(stage_, ns);
      if (stage_ == Stage::read) r.shard->add_read_latency(ns);
    }
    r.nested_ns += ns;
    // The span's time is its stage's: a read completing later does not count it as waiting.
    r.shard->account_until(end);
    if (auto* t = r.recorder->tracer()) {
      try {
        t->span(stage_name(stage_), r.track, begin_, end);
      } catch (...) {
      }
    }
  }
  begin_ = 0;
}

void record_bytes_read(std::uint64_t bytes) noexcept {
  auto& r = detail::thread_recording();
  if (r.shard) r.shard->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace coload

namespace coload {

std::uint64_t read_begin() noexcept {
  auto& r = detail::thread_recording();
  if (!r.shard) return 0;
  detail::Shard& s = *r.shard;
  const std::uint64_t now = detail::now_ns();
  // With no read in flight, the role was not waiting on reads until now.
  if (s.reads_in_flight.fetch_add(1, std::memory_order_relaxed) == 0) s.account_until(now);
  return now;
}

void record_read(std::uint64_t begin_ns, std::uint64_t bytes, std::int64_t index) noexcept {
  auto& r = detail::thread_recording();
  if (!r.shard || !begin_ns) return;
  const std::uint64_t end = detail::now_ns();
  // NOTE: the reads of a batch are in flight together (io_uring); the sum of their latencies
  // is no one's time. What the role spent on them is the time since it last accounted for its
  // time (a completion, a stage's span, or its first read's start) while it had reads in
  // flight: the pieces never overlap, so a role's `read` never exceeds its wall time. A read
  // begun elsewhere (none in flight here) counts from its own start at the earliest.
  detail::Shard& s = *r.shard;
  std::uint64_t from = s.accounted_ns.load(std::memory_order_relaxed);
  if (s.reads_in_flight.load(std::memory_order_relaxed) > 0) {
    s.reads_in_flight.fetch_sub(1, std::memory_order_relaxed);
  } else {
    from = std::max(from, begin_ns);
  }
  const std::uint64_t waited = end > from ? end - from : 0;
  s.account_until(end);
  if (r.recorder->enabled()) {
    r.shard->add(Stage::read, waited);
    r.shard->add_read_latency(end - begin_ns);
    r.shard->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (auto* t = r.recorder->tracer()) {
    static std::atomic<std::uint64_t> next_id{1};
    try {
      t->async_span("read", next_id.fetch_add(1, std::memory_order_relaxed), begin_ns, end,
                    "index", index);
    } catch (...) {
    }
  }
}

}  // namespace coload
