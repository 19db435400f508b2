// ShardStream: per-epoch shard order, the split over ranks x workers, chunked sequential
// reads kept ahead, the shuffle buffer, and its state for exact resume.

#include "coload/shards/stream.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "coload/core/warning.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/io/http.hpp"
#include "cache.hpp"
#include "checksum.hpp"
#include "unindexed.hpp"
#include "remote.hpp"

namespace coload::shards {

namespace {

std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::size_t below(std::uint64_t& state, std::size_t n) {
  return static_cast<std::size_t>(static_cast<unsigned __int128>(splitmix(state)) * n >> 64);
}

/// Reads one shard front to back in chunks, the next chunks in flight on helper threads while
/// the current one is copied out: two in direct mode (the disk works while a chunk is being
/// used, and a disk serves two large reads at once better than one), one when buffered (the
/// kernel's readahead is already ahead; a second thread only competes for the cores).
///
/// Chunk buffers come from, and go back to, `spare`, which the stream keeps for all its shards:
/// a fresh 16 MiB buffer costs 4096 page faults, each zeroing its page, and with 64 MiB shards
/// a reader per shard would make three of them for every four chunks it reads.
class ChunkReader {
 public:
  virtual ~ChunkReader() = default;
  /// Copies the shard's bytes [begin, end) to `dst`; `begin` never goes backwards.
  virtual void copy(std::uint64_t begin, std::uint64_t end, std::byte* dst,
                    const std::string& key) = 0;
  /// Whether a copy may wait for the network: the stream then co_awaits copy_async.
  virtual bool waits() const noexcept { return false; }
  /// Waits until the shard's own size is known to match its index's (a remote shard's first
  /// response); at once where it is known.
  virtual Task<void> confirm_size() { co_return; }
  /// copy for a coroutine, waiting without holding its thread.
  virtual Task<void> copy_async(std::uint64_t begin, std::uint64_t end, std::byte* dst,
                                const std::string& key) {
    copy(begin, end, dst, key);
    co_return;
  }
};

class LocalReader final : public ChunkReader {
 public:

  /// `url`: for a remote shard's cached copy (`shard` names the copy), the URL its errors name
  /// first.
  LocalReader(const ShardIndex& shard, bool direct, std::size_t chunk, std::uint64_t from,
              std::vector<io::Buffer>& spare, std::string url = {})
      : shard_(shard), url_(std::move(url)), spare_(spare),
        align_(direct ? io::Buffer::alignment : 1) {
    chunk_ = (std::max<std::size_t>(chunk, 64 << 10) + io::Buffer::alignment - 1) /
             io::Buffer::alignment * io::Buffer::alignment;
    if (direct) fd_ = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ < 0) fd_ = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      throw SystemError(errno, std::generic_category(), "cannot open shard '" + shard.path + "'");
    }
    if (!direct) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    // Nothing is read here: the first reads go out at once, so a reader made ahead of its shard
    // (the next shard's, while this one is used) has them done when its shard begins.
    next_ = from / io::Buffer::alignment * io::Buffer::alignment;
    current_.begin = next_;
    try {
      for (int k = 0; k < (direct ? 3 : 2); ++k) launch(take_spare());
    } catch (...) {
      // No thread to be had: the reads launched are waited for, then the file closed (the
      // destructor does not run for a constructor that throws).
      for (auto& f : ahead_) f.wait();
      ::close(fd_);
      throw;
    }
  }
  LocalReader(const LocalReader&) = delete;
  LocalReader& operator=(const LocalReader&) = delete;
  int fd() const noexcept { return fd_; }
  ~LocalReader() override {
    for (auto& f : ahead_) {
      if (!f.valid()) continue;  // its read failed, and copy() took the error out of it
      try {
        spare_.push_back(f.get().data);
      } catch (...) {  // a failed read ahead of where the stream stopped: nothing to return
      }
    }
    if (current_.data.capacity() >= chunk_) spare_.push_back(std::move(current_.data));
    ::close(fd_);
  }

  void copy(std::uint64_t begin, std::uint64_t end, std::byte* dst,
            const std::string& key) override {
    if (begin < current_.begin) {
      throw ShardError(shown(), key, begin,
                       "the index goes back before bytes already read" + copy_note());
    }
    while (begin < end) {
      while (begin >= current_.begin + current_.data.size()) {
        if ((started_ && current_.data.size() < chunk_) || ahead_.empty()) {
          throw ShardError(shown(), key, begin, "the shard ends inside the sample" + copy_note());
        }
        // The chunk just used goes back to the reader: two buffers serve the whole shard, so
        // no chunk costs fresh pages (a new 16 MiB buffer is 4096 page faults).
        Chunk next = ahead_.front().get();
        ahead_.pop_front();
        io::Buffer used = std::move(current_.data);
        current_ = std::move(next);
        started_ = true;
        launch(std::move(used));
      }
      const std::uint64_t stop = std::min<std::uint64_t>(end, current_.begin + current_.data.size());
      std::memcpy(dst, current_.data.data() + (begin - current_.begin), stop - begin);
      dst += stop - begin;
      begin = stop;
    }
  }

 private:
  struct Chunk {
    std::uint64_t begin = 0;
    io::Buffer data;
  };

  Chunk read_chunk(std::uint64_t at, io::Buffer reuse) const {
    if (reuse.capacity() < chunk_) reuse = io::Buffer(chunk_);
    reuse.resize(chunk_);
    Chunk c{at, std::move(reuse)};
    std::size_t done = 0;
    while (done < chunk_ && at + done < shard_.file_size) {
      const ssize_t n = ::pread(fd_, c.data.data() + done, chunk_ - done,
                                static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw SystemError(errno, std::generic_category(),
                          "cannot read shard '" + shown() + "'" + copy_note());
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    c.data.resize(done);
    return c;
  }

  io::Buffer take_spare() {
    while (!spare_.empty()) {
      io::Buffer b = std::move(spare_.back());
      spare_.pop_back();
      if (b.capacity() >= chunk_) return b;
    }
    return {};
  }

  void launch(io::Buffer reuse) {
    if (next_ >= shard_.file_size) return;
    const std::uint64_t at = next_;
    next_ += chunk_;
    ahead_.push_back(std::async(std::launch::async, [this, at, b = std::move(reuse)]() mutable {
      return read_chunk(at, std::move(b));
    }));
  }

  const std::string& shown() const { return url_.empty() ? shard_.path : url_; }
  std::string copy_note() const {
    return url_.empty() ? std::string() : " (read from its cached copy '" + shard_.path + "')";
  }

  const ShardIndex& shard_;
  std::string url_;
  std::vector<io::Buffer>& spare_;
  std::size_t align_;
  std::size_t chunk_ = 0;
  int fd_ = -1;
  std::uint64_t next_ = 0;
  Chunk current_;
  std::deque<std::future<Chunk>> ahead_;  // reads in flight, in file order
  bool started_ = false;  // current_ holds a chunk read from the shard
};

/// Reads a shard named by URL with one GET from `from` to its last sample's end (the
/// end-of-archive blocks are not fetched), at most `window` bytes received ahead of the
/// samples copied out; faults are retried by the client, resuming from the byte reached.
/// With `cache` (the dataset's options, where the shard may be cached), the GET starts at
/// byte 0, a cache entry (`tee`) is started once the answer's first byte has come, and every
/// byte is also written to it; the entry is committed when the last sample's end is reached.
/// The GET starts when the reader is made (the next shard's, while this one is used), and
/// copy_async waits for its bytes without holding a thread.
class RemoteReader final : public ChunkReader {
 public:
  RemoteReader(io::HttpClient& client, const ShardIndex& shard, std::size_t window,
               std::uint64_t from, const ShardOptions* cache, const io::RetryOptions& retry)
      : shard_(shard),
        end_(shard.samples.back().end),
        cache_(cache),
        body_(client.stream(shard.path, cache_ ? 0 : from, end_, window, shard.file_size,
                            retry)) {}
  void copy(std::uint64_t begin, std::uint64_t end, std::byte* dst,
            const std::string& key) override {
    sync_wait(copy_async(begin, end, dst, key));
  }
  bool waits() const noexcept override { return true; }
  Task<void> confirm_size() override {
    if (confirmed_ || body_->position() >= end_) co_return;
    // The first byte comes only after the client has checked the response's size.
    co_await body_->wait_for(1);
    if (body_->available() == 0) {
      // Failed or ended before a byte: the read says which (a failure throws its HttpError).
      std::byte b{};
      co_await body_->read_async(&b, 1);
      throw io::HttpError(body_->url(), 0, 0,
                          "cannot read '" + body_->url() + "': the body ended before byte " +
                              std::to_string(body_->position()));
    }
    confirmed_ = true;
  }
  Task<void> copy_async(std::uint64_t begin, std::uint64_t end, std::byte* dst,
                        const std::string& key) override {
    if (const ShardOptions* cache = std::exchange(cache_, nullptr);
        cache && body_->position() == 0) {
      // The client hands over no byte before the answer's size matches the index's: the
      // entry, and the room it evicts others for, wait for the first one, so that a stale or
      // bogus index evicts nothing. (A failed GET brings none: the read below says why.)
      co_await body_->wait_for(1);
      if (body_->available() > 0) tee_ = detail::cache_start(*cache, shard_);
    }
    if (begin < body_->position()) {
      throw ShardError(body_->url(), key, begin, "the index goes back before bytes already read");
    }
    if (begin > body_->position()) {
      if (!tee_) {
        co_await body_->skip_async(begin - body_->position());
      } else {
        // Through a bounded buffer: the gap is what the index says lies between samples.
        std::vector<std::byte> gap(static_cast<std::size_t>(
            std::min<std::uint64_t>(begin - body_->position(), std::uint64_t{1} << 20)));
        while (body_->position() < begin) {
          const auto n = static_cast<std::size_t>(
              std::min<std::uint64_t>(begin - body_->position(), gap.size()));
          co_await read_exactly(gap.data(), n);
          tee(gap.data(), n);
        }
      }
    }
    co_await read_exactly(dst, static_cast<std::size_t>(end - begin));
    tee(dst, static_cast<std::size_t>(end - begin));
    // Not kept this time (the folder stayed locked): a later epoch streams it again.
    if (tee_ && body_->position() == end_) (void)std::exchange(tee_, nullptr)->commit();
  }

 private:
  // Copies read bytes to the cache entry, if any; an entry whose write failed is dropped at
  // once, letting go of its fetch lock (other streams and fillers wait for it no longer).
  void tee(const std::byte* data, std::size_t n) {
    if (!tee_) return;
    tee_->write(data, n);
    if (!tee_->alive()) tee_.reset();
  }

  Task<void> read_exactly(std::byte* dst, std::size_t n) {
    const std::uint64_t at = body_->position();
    if (co_await body_->read_async(dst, n) != n) {
      // The client checks every response against the index's size: a body that ends early
      // and stays so is a fault it could not mend.
      throw io::HttpError(body_->url(), 0, 0,
                          "cannot read '" + body_->url() + "': the body ended before byte " +
                              std::to_string(at + n));
    }
  }

  const ShardIndex& shard_;
  std::uint64_t end_;
  const ShardOptions* cache_;  // until the first copy: where the entry is to be started
  std::unique_ptr<detail::CacheEntry> tee_;
  std::unique_ptr<io::BodyStream> body_;
  bool confirmed_ = false;
};

/// A cached copy of a remote shard, read as a local shard is. A copy that fails to read (an
/// I/O error, or a file cut short since it was checked) is given up with a warning naming it,
/// and removed from the cache, and the shard read on from its URL, from the sample that
/// failed: the server still has the bytes, and the epoch loses none.
class CachedReader final : public ChunkReader {
 public:
  CachedReader(std::string path, const ShardIndex& shard, std::size_t chunk, std::uint64_t from,
               std::vector<io::Buffer>& spare, io::HttpClient& client, std::size_t window,
               const io::RetryOptions& retry)
      : file_{std::move(path), detail::cached_size(shard), 0, {}, {}, {}},
        local_(std::in_place, file_, false, chunk, from, spare, shard.path),
        shard_(shard), client_(client), window_(window), retry_(retry) {}
  void copy(std::uint64_t begin, std::uint64_t end, std::byte* dst,
            const std::string& key) override {
    sync_wait(copy_async(begin, end, dst, key));
  }
  // Through copy_async: the copy's own reads are local, but a fallback waits for the network.
  bool waits() const noexcept override { return true; }
  Task<void> copy_async(std::uint64_t begin, std::uint64_t end, std::byte* dst,
                        const std::string& key) override {
    if (!remote_) {
      std::string why;
      try {
        local_->copy(begin, end, dst, key);
        co_return;
      } catch (const ShardError& e) {
        why = e.what();
      } catch (const SystemError& e) {
        why = e.what();
      }
      coload::detail::warn("ShardStream: the cached copy '" + file_.path + "' of shard '" +
                           shard_.path + "' failed (" + why + "): the shard is read from its "
                           "URL from byte " + std::to_string(begin) + " on");
      detail::cache_discard(file_.path, local_->fd());  // a later epoch fetches it anew
      local_.reset();  // its reads ahead (up to 3 chunks) and its descriptor: not read again
      remote_ = std::make_unique<RemoteReader>(client_, shard_, window_, begin, nullptr, retry_);
      co_await remote_->confirm_size();
    }
    co_await remote_->copy_async(begin, end, dst, key);
  }

 private:
  ShardIndex file_;  // only the path and size: what LocalReader reads
  std::optional<LocalReader> local_;  // until the copy fails
  const ShardIndex& shard_;
  io::HttpClient& client_;
  std::size_t window_;
  io::RetryOptions retry_;
  std::unique_ptr<RemoteReader> remote_;  // once the copy failed
};

std::unique_ptr<ChunkReader> open_reader(io::HttpClient& client, const ShardIndex& shard,
                                         const ShardStreamOptions& o, bool direct,
                                         std::uint64_t from, std::vector<io::Buffer>& spare) {
  if (detail::is_remote(shard.path)) {
    const std::size_t window = std::max<std::size_t>(o.read_ahead / 2, 1 << 16);
    if (auto cached = detail::cache_find(o.shards, shard)) {
      try {
        return std::make_unique<CachedReader>(std::move(*cached), shard, o.read_size, from,
                                              spare, client, window, o.shards.retry);
      } catch (const SystemError&) {
        // Evicted by another process since it was found: from the server after all.
      }
    }
    // Only a shard streamed from its first sample is cached (a resumed one is not whole), and
    // only where the cache could take it (its entry is started with the first byte).
    const bool cache = from == shard.samples.front().begin && !o.shards.cache_dir.empty() &&
                       o.shards.cache_bytes > 0 &&
                       detail::entry_size(shard) <= o.shards.cache_bytes;
    return std::make_unique<RemoteReader>(client, shard, window, from,
                                          cache ? &o.shards : nullptr, o.shards.retry);
  }
  return std::make_unique<LocalReader>(shard, direct, o.read_size, from, spare);
}

/// Sample `g` (a resumed shuffle buffer's), its bytes from the cache or the local file (pread)
/// or, by URL, one ranged GET through `client` that waits without holding a thread.
Task<ShardSample> read_sample(const ShardDataset& data, std::int64_t g, io::HttpClient& client) {
  // NOTE: not data.read(g) for a cached shard: a copy evicted since it was found would have
  // read() fetch the sample from the server with a GET that holds this thread (the driver).
  if (auto local = data.read_local(g)) co_return std::move(*local);
  const ShardDataset::Location at = data.locate(g);
  const ShardIndex& shard = data.shards()[at.shard];
  const IndexSample& sample = shard.samples[at.sample];
  co_await detail::confirm_size_async(client, shard, sample.end - sample.begin,
                                      data.options().retry);
  ShardSample out;
  out.data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
  co_await client.get_range_async(shard.path, sample.begin, sample.end, out.data.data(),
                                  shard.file_size, data.options().retry);
  detail::place_fields(shard, sample, sample.begin, out);
  co_return out;
}

/// A plain loop's view of a stream: each sample waited for on the calling thread.
Generator<ShardSample> drain(AsyncGenerator<ShardSample> stream) {
  while (ShardSample* x = sync_wait(stream.next())) co_yield std::move(*x);
}

}  // namespace

/// What the streams of one ShardStream and its copies (in this process) learned of the shards
/// without an index, once one was streamed to its end: how many samples each held, and where
/// its end-of-archive block begins.
struct ShardStream::Learned {
  explicit Learned(std::size_t shards) : counts(shards, -1), ends(shards) {}
  void learn(std::size_t s, std::int64_t n, std::optional<std::uint64_t> end) {
    std::lock_guard lock(mutex);
    if (end && !ends[s]) ends[s] = end;
    if (counts[s] >= 0) return;
    counts[s] = n;
    sum += n;
  }
  std::int64_t count(std::size_t s) const {
    std::lock_guard lock(mutex);
    return counts[s];
  }
  std::optional<std::uint64_t> end(std::size_t s) const {
    std::lock_guard lock(mutex);
    return ends[s];
  }
  std::int64_t total() const {
    std::lock_guard lock(mutex);
    return sum;
  }

 private:
  mutable std::mutex mutex;
  std::vector<std::int64_t> counts;  // per shard: -1 while not known
  std::vector<std::optional<std::uint64_t>> ends;
  std::int64_t sum = 0;
};

namespace {
// The options checked before anything is fetched with them: a chunk or a window of more than
// a GiB is a mistake (read_size near SIZE_MAX rounded its chunk to 0, and a read never ended).
const ShardStreamOptions& checked(const ShardStreamOptions& o) {
  constexpr std::size_t most = std::size_t{1} << 30;
  for (const auto& [name, value] : {std::pair{"read_size", o.read_size},
                                    std::pair{"read_ahead", o.read_ahead}}) {
    if (value > most) {
      throw InvalidArgument(std::string("ShardStreamOptions::") + name + " is " +
                            std::to_string(value) + ": at most 1 GiB (" +
                            std::to_string(most) + ")");
    }
  }
  return o;
}
}  // namespace

namespace {
/// What a state names its shards and their order by: XXH3 over each shard's file name (its
/// path's last part, a URL's query left out), size and sample count (those two for an indexed
/// shard only), in order, and the shuffle options. The same shards in another folder or by
/// URL give the same; another list (reordered, a shard added or rewritten) or shuffle another,
/// whose positions would mean other samples.
std::uint64_t shards_fingerprint(const ShardDataset& data, const ShardStreamOptions& o) {
  detail::Checksum sum;
  const std::uint64_t shuffle[2] = {o.shuffle_shards ? 1u : 0u, o.shuffle_buffer};
  sum.update(reinterpret_cast<const std::byte*>(shuffle), sizeof shuffle);
  const auto& shards = data.shards();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::string_view path = shards[s].path;
    const io::Scheme scheme = io::scheme_of(path);
    const bool http = scheme == io::Scheme::http || scheme == io::Scheme::https;
    if (http) path = path.substr(0, path.find_first_of("?#"));
    path = path.substr(path.rfind('/') + 1);  // (npos + 1 is 0: the whole path)
    // An http(s) URL's name percent-decoded, as the file's ("a%20b.tar": "a b.tar"; an s3://
    // URL names its key as it is).
    std::string name;
    for (std::size_t i = 0; i < path.size(); ++i) {
      unsigned byte = 0;
      const char* hex = path.data() + i + 1;
      if (http && path[i] == '%' && i + 2 < path.size() &&
          std::from_chars(hex, hex + 2, byte, 16).ptr == hex + 2) {
        name += static_cast<char>(byte);
        i += 2;
      } else {
        name += path[i];
      }
    }
    std::int64_t words[3] = {static_cast<std::int64_t>(name.size()), -1, -1};
    if (data.indexed(s)) {
      words[1] = static_cast<std::int64_t>(shards[s].file_size);
      words[2] = static_cast<std::int64_t>(shards[s].samples.size());
    }
    sum.update(reinterpret_cast<const std::byte*>(name.data()), name.size());
    sum.update(reinterpret_cast<const std::byte*>(words), sizeof words);
  }
  return sum.digest();
}
}  // namespace

ShardStream::ShardStream(const std::filesystem::path& root, ShardStreamOptions options)
    : dataset_(ShardDataset::streamed(root, checked(options).shards)),
      options_(std::move(options)),
      learned_(std::make_shared<Learned>(dataset_.shards().size())),
      fingerprint_(shards_fingerprint(dataset_, options_)) {}

ShardStream::ShardStream(std::vector<std::string> shards, ShardStreamOptions options)
    : dataset_(std::move(shards), checked(options).shards, ShardDataset::AllowUnindexed{}),
      options_(std::move(options)),
      learned_(std::make_shared<Learned>(dataset_.shards().size())),
      fingerprint_(shards_fingerprint(dataset_, options_)) {}

std::int64_t ShardStream::total_samples() const noexcept {
  return dataset_.size() + learned_->total();
}

void ShardStream::set_driver(asio::io_context& ctx) noexcept {
  driver_.ctx = &ctx;
  driver_.pid = static_cast<long>(::getpid());
}

std::shared_ptr<io::HttpClient> ShardStream::client() const {
  // A forked worker process has the parent's pointer but not its driver thread.
  if (driver_.ctx && driver_.pid == static_cast<long>(::getpid())) {
    return io::HttpClient::on(*driver_.ctx);
  }
  return io::HttpClient::shared();
}

std::vector<std::size_t> ShardStream::shards_for(std::uint64_t epoch_seed, int shard_id,
                                                 int num_shards) const {
  const std::size_t n = dataset_.shards().size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  if (options_.shuffle_shards) {
    std::uint64_t state = epoch_seed ^ 0x7368617264732121ULL;
    for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[below(state, i)]);
  }
  std::vector<std::size_t> mine;
  for (std::size_t k = static_cast<std::size_t>(shard_id); k < n;
       k += static_cast<std::size_t>(num_shards)) {
    mine.push_back(order[k]);
  }
  return mine;
}

AsyncGenerator<ShardSample> ShardStream::stream(const WorkerInfo& info) {
  if (static_cast<std::size_t>(info.num_shards()) > dataset_.shards().size()) {
    coload::detail::warn_once("shard-stream-few-shards",
                              "ShardStream: " + std::to_string(dataset_.shards().size()) +
                                  " shards for " + std::to_string(info.num_shards()) +
                                  " ranks x workers: some workers stream nothing");
  }
  return run(this, info);
}

Generator<ShardSample> ShardStream::samples(const WorkerInfo& info) { return drain(stream(info)); }

AsyncGenerator<ShardSample> ShardStream::run(ShardStream* self, WorkerInfo info) {
  const std::uint64_t epoch_seed = info.seed - static_cast<std::uint64_t>(info.id);
  const int sid = info.shard_id(), ns = info.num_shards();
  const std::vector<std::size_t> order = self->shards_for(epoch_seed, sid, ns);
  const ShardDataset& data = self->dataset_;
  const std::size_t capacity = std::max<std::size_t>(self->options_.shuffle_buffer, 1);
  const std::size_t window = std::max<std::size_t>(self->options_.read_ahead / 2, 1 << 16);
  // Shards by URL: the driver's client in a loader (its waits hold no thread), else the
  // process's own. Made only when a shard is remote.
  std::shared_ptr<io::HttpClient> client;
  const auto http = [&]() -> io::HttpClient& {
    if (!client) client = self->client();
    return *client;
  };
  const bool skip = self->options_.skip_failed_shards || self->on_error_ == OnError::skip;
  const auto count_skipped = [&](std::int64_t n) {
    self->skipped_ += n;
    // Counted where the loader counts its skips (DataLoader::skipped()); the warning names
    // them, once for the shard rather than once a sample.
    if (self->skip_log_) self->skip_log_->add(n);
  };
  // This stream's position, its own: a stream() started later (a second loop over this
  // replica, or the next epoch's while this one's last read completes) does not move it.
  std::shared_ptr<Position> mine;
  std::vector<ShardSample> buffer;
  if (self->resume_) {
    const Position& r = *self->resume_;
    if (r.epoch_seed != epoch_seed || r.shard_id != sid || r.num_shards != ns) {
      // Kept for a stream() of the epoch and split it is of.
      throw InvalidArgument("ShardStream::load_state: the state is of worker shard " +
                            std::to_string(r.shard_id) + " of " + std::to_string(r.num_shards) +
                            " in another epoch or split, not of shard " + std::to_string(sid) +
                            " of " + std::to_string(ns));
    }
    mine = std::make_shared<Position>(std::move(*self->resume_));
    self->resume_.reset();
    self->progress_.at = mine;
    // The buffered samples read again, in slot order. One whose shard fails for good is,
    // with skip, left out of the buffer and counted, as are that shard's others there (not
    // asked for again; one warning a shard); else the error names it.
    std::vector<std::int64_t> kept;
    std::vector<std::size_t> failed;  // shards
    for (std::int64_t g : mine->buffer) {
      const std::size_t of = data.locate(g).shard;
      if (std::find(failed.begin(), failed.end(), of) != failed.end()) {
        count_skipped(1);
        continue;
      }
      const std::string lost_note = "; sample " + std::to_string(g) +
                                    " of the resumed shuffle buffer is lost to this epoch" +
                                    (skip ? ", with the buffer's other samples of its shard" : "");
      std::string lost;  // with skip: why the sample, and its shard's others here, are left out
      try {
        buffer.push_back(co_await read_sample(data, g, http()));
        kept.push_back(g);
      } catch (const io::HttpError& e) {
        io::HttpError named(e.url(), e.status(), e.attempts(), std::string(e.what()) + lost_note);
        if (!skip) throw named;
        lost = named.what();
      } catch (const SystemError& e) {  // a local shard gone, or unreadable, since indexed
        const int code = e.code().value();
        if (!skip || code == EMFILE || code == ENFILE || code == ENOMEM) throw;
        lost = e.what() + lost_note;
      } catch (const ShardError& e) {  // ... or cut short
        if (!skip) throw;
        lost = e.what() + lost_note;
      }
      if (!lost.empty()) {
        coload::detail::warn("ShardStream: skipped: " + lost);
        count_skipped(1);
        failed.push_back(of);
      }
    }
    mine->buffer = std::move(kept);
  } else {
    mine = std::make_shared<Position>(Position{
        epoch_seed, sid, ns, 0, 0,
        epoch_seed ^ (static_cast<std::uint64_t>(sid) * 0x9e3779b97f4a7c15ULL), {}});
    self->progress_.at = mine;
  }
  Position& pos = *mine;
  // Passes a sample through the shuffle buffer: what to hand out now, if anything. `g` is its
  // global index (-1: a shard without an index), kept for the state.
  const auto shuffle = [&](ShardSample&& x, std::int64_t g) -> std::optional<ShardSample> {
    if (capacity <= 1) return std::move(x);
    if (buffer.size() < capacity) {
      buffer.push_back(std::move(x));
      pos.buffer.push_back(g);
      return std::nullopt;
    }
    const std::size_t j = below(pos.rng, buffer.size());
    ShardSample out = std::move(buffer[j]);
    buffer[j] = std::move(x);
    pos.buffer[j] = g;
    return out;
  };
  std::vector<io::Buffer> spare;  // chunk buffers, reused from shard to shard
  std::unique_ptr<ChunkReader> next_reader;
  std::size_t next_reader_shard = 0;
  for (; pos.shard_pos < order.size(); ++pos.shard_pos, pos.sample = 0) {
    const std::size_t s = order[pos.shard_pos];
    const ShardIndex& shard = data.shards()[s];
    if (!data.indexed(s)) {
      // No index: streamed by its tar headers, its samples counted as they come (and kept
      // for total_samples() once it ends). A state taken inside it resumes by streaming it
      // again from its start and dropping the samples already handed out: an archive's order
      // is fixed. (One whose shuffle buffer holds its samples is refused by load_state.)
      // Each sample is handed out once the next one, or the archive's end, has been read: so
      // the shard's last one goes out with the position already past the shard, and a state
      // taken after it does not stream the shard again (to find nothing left, or to fail and
      // call samples lost that were all read).
      const std::size_t already = pos.sample;
      std::size_t seen = 0;
      std::optional<ShardSample> held;
      bool ended = false;
      std::exception_ptr failure;  // without skip: thrown once the sample held is handed out
      std::string lost;
      std::int64_t left = 0;
      try {
        http();
        // Where an earlier epoch found its end: a transfer failing there loses nothing. 0: no
        // end found (an empty archive's is at 0, and has nothing to lose).
        std::uint64_t end_found = 0;
        auto samples = detail::stream_unindexed(client, shard.path, window, data.options().retry,
                                                data.options().index.limits,
                                                self->learned_->end(s), &end_found);
        while (ShardSample* x = co_await samples.next()) {
          if (seen++ < already) continue;
          if (held) {
            ++pos.sample;
            auto out = shuffle(std::move(*held), -1);
            held = std::move(*x);
            if (out) co_yield std::move(*out);
          } else {
            held = std::move(*x);
          }
        }
        self->learned_->learn(s, static_cast<std::int64_t>(seen),
                              end_found ? std::optional<std::uint64_t>(end_found) : std::nullopt);
        ended = true;
      } catch (const std::exception& e) {
        // The client gave up on the shard, or its body is no archive (cut short or altered: a
        // ShardError, which propagates as it is). How many are lost is known when an earlier
        // epoch streamed the shard whole. A resumed stream's first `already` samples were
        // handed out before the state was taken, whether or not they were read again now;
        // the sample held was read whole, and goes out before the error.
        const auto* http_error = dynamic_cast<const io::HttpError*>(&e);
        if (!http_error && !dynamic_cast<const ShardError*>(&e)) throw;
        const std::int64_t known = self->learned_->count(s);
        const auto read = static_cast<std::int64_t>(pos.sample + (held ? 1 : 0));
        if (known >= 0 && read >= known) {
          // Only the archive's end failed, after its every sample (as an earlier epoch
          // counted them): nothing is lost.
          ended = true;
        } else {
          left = known >= 0 ? std::max<std::int64_t>(known - read, 0) : 0;
          lost = std::string(e.what()) + "; shard '" + shard.path + "' has no index: " +
                 std::to_string(read) + " of its samples were read, " +
                 (known >= 0 ? "the other " + std::to_string(left) + " of its " +
                                   std::to_string(known) + " are lost to this epoch"
                             : std::string("the rest (how many is not known: it was never "
                                           "streamed whole) are lost to this epoch"));
          if (!skip) {
            failure = http_error ? std::make_exception_ptr(io::HttpError(
                                       http_error->url(), http_error->status(),
                                       http_error->attempts(), lost))
                                 : std::current_exception();
          }
        }
      }
      if (!lost.empty() && skip) {
        coload::detail::warn("ShardStream: skipped: " + lost);
        if (left > 0) count_skipped(left);
      }
      // The shard is done with when its end was read or it was skipped: the position moves
      // past it before its last sample goes out (the loop's step moves past it again, so it
      // is taken back after).
      const bool done = ended || (!lost.empty() && skip);
      if (held) {
        if (done) {
          ++pos.shard_pos;
          pos.sample = 0;
        } else {
          ++pos.sample;
        }
        auto out = shuffle(std::move(*held), -1);
        held.reset();
        if (out) co_yield std::move(*out);
        if (done) --pos.shard_pos;
      }
      if (failure) std::rethrow_exception(failure);
      continue;
    }
    if (pos.sample >= shard.samples.size()) continue;
    // This shard's reader (made ahead while the previous shard was used, when it starts at its
    // first sample), and the next shard's, so that its first reads overlap this one's tail.
    // What this epoch loses of the shard when it fails for good at sample pos.sample.
    const auto losing = [&] {
      const std::int64_t first = data.offsets()[s];
      return "shard '" + shard.path + "' holds samples " + std::to_string(first) + ".." +
             std::to_string(first + static_cast<std::int64_t>(shard.samples.size()) - 1) +
             ", of which " + std::to_string(pos.sample) + " were read and " +
             std::to_string(shard.samples.size() - pos.sample) + " are lost to this epoch";
    };
    // A local shard that cannot be opened or read (gone, cut short since it was indexed, an I/O
    // error): its error as it is, or with skip, left out and counted as a remote one is. Not
    // for want of fds or memory, which is no fault of the shard's (the next would fail alike).
    const auto skippable = [&](const SystemError& e) {
      const int code = e.code().value();
      return skip && code != EMFILE && code != ENFILE && code != ENOMEM;
    };
    const auto skip_local = [&](const std::exception& e) {
      coload::detail::warn(std::string("ShardStream: skipped: ") + e.what() + "; " + losing());
      count_skipped(static_cast<std::int64_t>(shard.samples.size() - pos.sample));
    };
    std::unique_ptr<ChunkReader> reader = std::move(next_reader);
    if (!reader || next_reader_shard != s || pos.sample != 0) {
      bool opened = false;
      try {
        reader = open_reader(http(), shard, self->options_, data.options().direct,
                             shard.samples[pos.sample].begin, spare);
        opened = true;
      } catch (const SystemError& e) {
        if (!skippable(e)) throw;
        skip_local(e);
      }
      if (!opened) continue;
    }
    next_reader.reset();
    for (std::size_t k = pos.shard_pos + 1; k < order.size(); ++k) {
      const ShardIndex& following = data.shards()[order[k]];
      if (following.samples.empty()) continue;
      try {
        next_reader = open_reader(http(), following, self->options_, data.options().direct,
                                  following.samples.front().begin, spare);
        next_reader_shard = order[k];
      } catch (...) {
        // Not this shard's fault (the next one gone, no thread or fd to be had): this shard's
        // samples go out first, and the next is opened again when its turn comes, where its
        // error names it.
      }
      break;
    }
    const bool waits = reader->waits();
    while (pos.sample < shard.samples.size()) {
      const IndexSample& is = shard.samples[pos.sample];
      ShardSample x;
      bool lost = false;
      try {
        if (waits) {
          if (is.end - is.begin > detail::unconfirmed_sample_bound) co_await reader->confirm_size();
          x.data = io::Buffer(static_cast<std::size_t>(is.end - is.begin));
          co_await reader->copy_async(is.begin, is.end, x.data.data(), is.key);
        } else {
          x.data = io::Buffer(static_cast<std::size_t>(is.end - is.begin));
          reader->copy(is.begin, is.end, x.data.data(), is.key);
        }
      } catch (const io::HttpError& e) {
        // The client gave up on the shard: say which samples it held and how many of them were
        // read, so that a caller knows exactly what this epoch is missing.
        io::HttpError named(e.url(), e.status(), e.attempts(),
                            std::string(e.what()) + "; " + losing());
        if (!skip) throw named;
        coload::detail::warn(std::string("ShardStream: skipped: ") + named.what());
        count_skipped(static_cast<std::int64_t>(shard.samples.size() - pos.sample));
        lost = true;
      } catch (const SystemError& e) {
        if (!skippable(e)) throw;
        skip_local(e);
        lost = true;
      } catch (const ShardError& e) {
        if (!skip) throw;
        skip_local(e);
        lost = true;
      }
      if (lost) break;  // on to the next shard, whose reader is already running
      detail::place_fields(shard, is, is.begin, x);
      const std::int64_t g = data.offsets()[s] + static_cast<std::int64_t>(pos.sample);
      ++pos.sample;
      if (auto out = shuffle(std::move(x), g)) co_yield std::move(*out);
    }
  }
  while (!buffer.empty()) {
    const std::size_t j = below(pos.rng, buffer.size());
    ShardSample out = std::move(buffer[j]);
    buffer[j] = std::move(buffer.back());
    buffer.pop_back();
    pos.buffer[j] = pos.buffer.back();
    pos.buffer.pop_back();
    co_yield std::move(out);
  }
}

std::string ShardStream::state() const {
  if (!progress_.at) return "shard-stream 1 none";
  const Position& p = *progress_.at;
  std::ostringstream out;
  out << "shard-stream 2 " << fingerprint_ << ' ' << p.epoch_seed << ' ' << p.shard_id << ' '
      << p.num_shards << ' ' << p.shard_pos << ' ' << p.sample << ' ' << p.rng << ' '
      << p.buffer.size();
  for (std::int64_t g : p.buffer) out << ' ' << g;
  return out.str();
}

void ShardStream::load_state(const std::string& state) {
  std::istringstream in(state);
  std::string magic, version;
  in >> magic >> version;
  if (magic != "shard-stream" || (version != "1" && version != "2")) {
    throw InvalidArgument("ShardStream::load_state: not a ShardStream state: '" +
                          state.substr(0, 60) + "'");
  }
  if (state == "shard-stream 1 none") {
    resume_.reset();
    return;
  }
  // Version 2 names the shards it was taken over (version 1, before it, did not: taken as it
  // is); a position in other shards would resume at other samples, without a word.
  if (version == "2") {
    std::uint64_t fingerprint = 0;
    if (in >> fingerprint && fingerprint != fingerprint_) {
      throw InvalidArgument(
          "ShardStream::load_state: the state was taken over other shards than these " +
          std::to_string(dataset_.shards().size()) +
          ", or with other shuffle options (the shards' names, sizes, sample counts and order, "
          "shuffle_shards and shuffle_buffer must be the same)");
    }
  }
  Position p;
  std::size_t n = 0;
  in >> p.epoch_seed >> p.shard_id >> p.num_shards >> p.shard_pos >> p.sample >> p.rng >> n;
  const auto total = dataset_.size();
  if (!in || p.num_shards < 1 || p.shard_id < 0 || p.shard_id >= p.num_shards ||
      p.shard_pos > dataset_.shards().size() ||
      n > std::max(static_cast<std::size_t>(total), options_.shuffle_buffer)) {
    throw InvalidArgument("ShardStream::load_state: malformed state '" + state.substr(0, 60) + "'");
  }
  // The position is checked against the shards it names: sample "-1" would parse as SIZE_MAX
  // and skip a shard's every sample, without a word.
  const std::vector<std::size_t> order = shards_for(p.epoch_seed, p.shard_id, p.num_shards);
  if (p.shard_pos > order.size()) {
    throw InvalidArgument("ShardStream::load_state: the state is at shard " +
                          std::to_string(p.shard_pos) + " of a worker shard of " +
                          std::to_string(order.size()));
  }
  if (p.shard_pos < order.size()) {
    // A shard without an index holds what an earlier epoch counted, where one streamed it
    // whole; else fewer than 2^40 (a member takes 512 bytes at least).
    const std::size_t s = order[p.shard_pos];
    const std::int64_t known = dataset_.indexed(s)
                                   ? static_cast<std::int64_t>(dataset_.shards()[s].samples.size())
                                   : learned_->count(s);
    const std::uint64_t most = known >= 0 ? static_cast<std::uint64_t>(known) : 1ull << 40;
    if (p.sample > most) {
      throw InvalidArgument(
          "ShardStream::load_state: the state is at sample " + std::to_string(p.sample) +
          " of shard '" + dataset_.shards()[s].path + "', which " +
          (known >= 0 ? "holds " + std::to_string(known)
                      : std::string("has no index, and no shard holds so many")));
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t g = -1;
    in >> g;
    if (in && g == -1) {
      throw InvalidArgument("ShardStream::load_state: the state's shuffle buffer holds samples "
                            "of a shard without an index, which a resume cannot re-read");
    }
    if (!in || g < 0 || g >= total) {
      throw InvalidArgument("ShardStream::load_state: a buffered sample outside the shards");
    }
    p.buffer.push_back(g);
  }
  resume_ = std::move(p);
}

}  // namespace coload::shards
