// ShardDataset and ShardSample: global indices over shards, one ranged read per sample.

#include "coload/shards/dataset.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>

#include "coload/core/warning.hpp"
#include "coload/io/file.hpp"
#include "coload/io/http.hpp"
#include "coload/io/reader.hpp"
#include "cache.hpp"
#include "remote.hpp"

namespace coload::shards {

const ShardField* ShardSample::find(std::string_view name) const noexcept {
  for (const ShardField& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::span<const std::byte> ShardSample::field(std::string_view name) const {
  const ShardField* f = find(name);
  if (!f) {
    std::string present;
    for (const ShardField& g : fields) present += (present.empty() ? "" : ", ") + g.name;
    throw OutOfRange("sample '" + key + "' of shard '" + shard + "' has no field '" +
                     std::string(name) + "' (it has " + present + ")");
  }
  return data.bytes().subspan(f->offset, f->size);
}

std::string ShardSample::text(std::string_view name) const {
  const auto b = field(name);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

namespace detail {

SampleRead sample_range(const IndexSample& sample, std::uint64_t file_size, std::size_t align) {
  SampleRead r{sample.begin, sample.end};
  if (align > 1) {
    r.begin = r.begin / align * align;
    r.end = std::min<std::uint64_t>((r.end + align - 1) / align * align,
                                    (file_size + align - 1) / align * align);
  }
  return r;
}

void place_fields(const ShardIndex& index, const IndexSample& sample, std::uint64_t begin,
                  ShardSample& out) {
  out.key = sample.key;
  out.shard = index.path;
  out.fields.clear();
  out.fields.reserve(sample.count);
  for (std::uint32_t k = sample.first; k < sample.first + sample.count; ++k) {
    const IndexMember& m = index.members[k];
    out.fields.push_back(ShardField{m.field, static_cast<std::size_t>(m.offset - begin),
                                    static_cast<std::size_t>(m.size)});
  }
}

}  // namespace detail

struct ShardDataset::State {
  std::vector<ShardIndex> shards;
  std::vector<bool> unindexed;  // a ShardStream's shards by URL without an index
  std::optional<io::HttpError> missing;  // the first one's 404
  std::vector<std::int64_t> offsets;  // shards.size() + 1
  ShardOptions options;
  std::mutex mutex;
  std::vector<std::unique_ptr<io::File>> files;

  const io::File& file(std::size_t s) {
    std::lock_guard lock(mutex);
    if (!files[s]) {
      const std::string& path = shards[s].path;
      int fd = -1;
      if (options.direct) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        throw SystemError(errno, std::generic_category(), "cannot open shard '" + path + "'");
      }
      struct stat st {};
      ::fstat(fd, &st);
      if (static_cast<std::uint64_t>(st.st_size) != shards[s].file_size) {
        ::close(fd);
        throw ShardError(path, "", 0,
                         "the shard changed since it was indexed (" +
                             std::to_string(st.st_size) + " bytes, indexed at " +
                             std::to_string(shards[s].file_size) + ")");
      }
      files[s] = std::make_unique<io::File>(fd, path, shards[s].file_size);
    }
    return *files[s];
  }

  std::size_t align() const noexcept { return options.direct ? io::Buffer::alignment : 1; }

  // Fills the cache behind map-style reads (a ShardDataset's own, not a ShardStream's, which
  // caches the shards it streams). Last: destroyed first, while `shards` is still there.
  std::unique_ptr<detail::CacheFiller> filler;

  ~State() {
    // A forked child's copy is left alone: destroying it would wait for the parent's thread.
    if (filler && filler->forked()) (void)filler.release();
  }

  /// Shard s's cached copy; where there is none and the filler is on, the shard is queued for
  /// it (once, and again where a copy it made was found bad and removed).
  std::optional<std::string> cached(std::size_t s) {
    bool removed = false;
    auto found = detail::cache_find(options, shards[s], &removed);
    if (!found && filler) {
      if (removed) filler->lost(shards[s]);
      filler->want(shards[s]);
    }
    return found;
  }
};

namespace {
// The options checked before anything is fetched with them.
const ShardOptions& checked(const ShardOptions& options) {
  io::validate(options.retry, "ShardOptions::retry");
  std::error_code ec;
  if (!options.cache_dir.empty() && options.cache_bytes > 0 &&
      std::filesystem::exists(options.cache_dir, ec) &&
      !std::filesystem::is_directory(options.cache_dir, ec)) {
    throw InvalidArgument("ShardOptions::cache_dir '" + options.cache_dir +
                          "' is not a folder");
  }
  return options;
}

// find_shards, a URL's list fetched with the options' retry.
std::vector<std::string> shards_of(const std::filesystem::path& root, const ShardOptions& o) {
  if (io::is_url(root.native())) return detail::find_url_shards(root.native(), o.retry);
  return find_shards(root);
}
}  // namespace

ShardDataset::ShardDataset(const std::filesystem::path& root, ShardOptions options)
    : ShardDataset(shards_of(root, checked(options)), options) {}

ShardDataset::ShardDataset(std::vector<std::string> shards, ShardOptions options)
    : ShardDataset(std::move(shards), std::move(options), AllowUnindexed{}) {
  if (const auto& e = state_->missing) {
    throw io::HttpError(e->url(), e->status(), e->attempts(),
                        std::string(e->what()) +
                            "; it has no index, which a ShardDataset needs: stream the shards "
                            "with ShardStream, which reads them by their tar headers");
  }
  // Map-style reads fill the cache when the dataset's remote shards all fit its bound: where
  // they do not, each epoch would fetch shards twice (samples, then the whole shard) only to
  // evict them again.
  const ShardOptions& o = state_->options;
  if (o.cache_dir.empty() || o.cache_bytes == 0) return;
  std::uint64_t remote = 0;
  for (const ShardIndex& shard : state_->shards) {
    if (detail::is_remote(shard.path)) remote += detail::entry_size(shard);
  }
  if (remote > 0 && remote <= o.cache_bytes) {
    state_->filler = std::make_unique<detail::CacheFiller>(o);
  }
}

void ShardDataset::cache_wait() const {
  if (state_->filler) state_->filler->wait_idle();
}

bool ShardDataset::cache_wait_for(std::chrono::milliseconds timeout) const {
  return !state_->filler || state_->filler->wait_idle_for(timeout);
}

void ShardDataset::cache_fill() const {
  if (!state_->filler) return;
  // Queued as they are: the fetch thread looks each up (cache_find hashes an entry it has not
  // verified, about 10 ms for 64 MiB), not this one.
  for (const ShardIndex& shard : state_->shards) {
    if (detail::is_remote(shard.path) && !shard.samples.empty()) state_->filler->want(shard);
  }
  state_->filler->want_all_queued();
}

ShardDataset::ShardDataset(std::vector<std::string> shards, ShardOptions options,
                           AllowUnindexed)
    : state_(std::make_shared<State>()) {
  checked(options);
  state_->options = std::move(options);
  // A new dataset hashes each cache entry again before its first use (see cache_find).
  if (!state_->options.cache_dir.empty()) detail::cache_forget_verified();
  state_->offsets.push_back(0);
  for (const std::string& path : shards) {
    bool missing = false;
    if (detail::is_remote(path)) {
      try {
        state_->shards.push_back(detail::load_remote_index(path, state_->options.retry));
      } catch (const io::HttpError& e) {
        // A presigned URL's signature covers its one object: the index beside it, asked with
        // the same query, is refused (403). Such a shard is streamed as one without an index.
        const bool signed_alone = e.status() == 403 && io::scheme_of(path) != io::Scheme::s3 &&
                                  path.find('?') != std::string::npos;
        if (e.status() != 404 && !signed_alone) throw;
        missing = true;  // its samples are known once streamed
        if (!state_->missing) state_->missing = e;
        ShardIndex none;
        none.path = path;
        state_->shards.push_back(std::move(none));
      }
    } else {
      // A file:// URL is its local path, read as any local shard is.
      const bool file_url = io::scheme_of(path) == io::Scheme::file;
      state_->shards.push_back(
          load_index(file_url ? detail::file_url_path(path) : path, state_->options.index));
    }
    state_->unindexed.push_back(missing);
    state_->offsets.push_back(state_->offsets.back() +
                              static_cast<std::int64_t>(state_->shards.back().samples.size()));
  }
  state_->files.resize(state_->shards.size());
}

ShardDataset ShardDataset::streamed(const std::filesystem::path& root,
                                   const ShardOptions& options) {
  return ShardDataset(shards_of(root, checked(options)), options, AllowUnindexed{});
}

bool ShardDataset::indexed(std::size_t s) const noexcept {
  return s >= state_->unindexed.size() || !state_->unindexed[s];
}

std::int64_t ShardDataset::size() const noexcept { return state_->offsets.back(); }

const std::vector<std::int64_t>& ShardDataset::offsets() const noexcept { return state_->offsets; }

const std::vector<ShardIndex>& ShardDataset::shards() const noexcept { return state_->shards; }

const ShardOptions& ShardDataset::options() const noexcept { return state_->options; }

ShardDataset::Location ShardDataset::locate(Index index) const {
  const std::int64_t n = size();
  if (index < -n || index >= n) {
    throw OutOfRange("ShardDataset: index " + std::to_string(index) + " is out of range for " +
                     std::to_string(n) + " samples");
  }
  if (index < 0) index += n;
  const auto& off = state_->offsets;
  const auto it = std::upper_bound(off.begin(), off.end(), index) - 1;
  const auto s = static_cast<std::size_t>(it - off.begin());
  return {s, static_cast<std::size_t>(index - *it)};
}

namespace {

// detail::confirm_size_async, waited for on this thread (read() runs on no io_context).
void confirm_size(const ShardIndex& shard, std::uint64_t bytes, const io::RetryOptions& retry) {
  if (bytes <= detail::unconfirmed_sample_bound || shard.samples.empty()) return;
  const std::uint64_t at = shard.samples.front().begin;
  std::byte first{};
  io::HttpClient::shared()->get_range(shard.path, at, at + 1, &first, shard.file_size, retry);
}
Task<void> confirm_size_async(io::Reader& reader, const ShardIndex& shard, std::uint64_t bytes,
                              io::RetryOptions retry) {
  co_await detail::confirm_size_async(*io::HttpClient::on(reader.context()), shard, bytes, retry);
}

}  // namespace

namespace {
/// `sample` from the cached copy at `path`, read with pread as a local shard is; nothing when
/// it was evicted meanwhile or cannot be read (the caller fetches it from the server). A copy
/// that cannot be read is removed, and `filler` (where there is one) told.
std::optional<ShardSample> read_cached(const std::string& path, const ShardIndex& shard,
                                       const IndexSample& sample, detail::CacheFiller* filler) {
  ShardSample out;
  out.data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::size_t done = 0;
  int err = 0;
  while (fd >= 0 && done < out.data.size()) {
    const ssize_t n = ::pread(fd, out.data.data() + done, out.data.size() - done,
                              static_cast<off_t>(sample.begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  // The copy was verified when found, so a short read is the disk's fault (an I/O error) or
  // the file's (cut short since): removed, not read and failed again for each of the shard's
  // samples every epoch, and the filler may fetch the shard again. Said by the reader that
  // removed it (others reading it at once find it no longer so named).
  const bool discarded = fd >= 0 && done != out.data.size() && detail::cache_discard(path, fd);
  if (fd >= 0) ::close(fd);
  if (discarded) {
    if (filler) filler->lost(shard);
    coload::detail::warn("the cached copy '" + path + "' of shard '" + shard.path +
                         "' cannot be read at byte " + std::to_string(sample.begin + done) +
                         " (" + (err ? std::generic_category().message(err) : "it ends there") +
                         "): removed; the shard is read from its URL");
  }
  if (done != out.data.size()) return std::nullopt;
  detail::place_fields(shard, sample, sample.begin, out);
  return out;
}
}  // namespace

ShardSample ShardDataset::read(Index index) const {
  const Location at = locate(index);
  const ShardIndex& shard = state_->shards[at.shard];
  const IndexSample& sample = shard.samples[at.sample];
  if (detail::is_remote(shard.path)) {
    if (auto cached = state_->cached(at.shard)) {
      if (auto out = read_cached(*cached, shard, sample, state_->filler.get())) {
        return std::move(*out);
      }
    }
    // One ranged GET of the sample's bytes; the client retries faults and checks the shard's
    // size against the index on each response. A sample too large to size by the index's word
    // alone has the server answer for the shard's size first, with its first byte.
    confirm_size(shard, sample.end - sample.begin, state_->options.retry);
    ShardSample out;
    out.data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
    io::HttpClient::shared()->get_range(shard.path, sample.begin, sample.end,
                                        out.data.data(), shard.file_size,
                                        state_->options.retry);
    detail::place_fields(shard, sample, sample.begin, out);
    return out;
  }
  const io::File& file = state_->file(at.shard);
  const auto range = detail::sample_range(sample, shard.file_size, state_->align());
  ShardSample out;
  out.data = io::Buffer(static_cast<std::size_t>(range.end - range.begin));
  std::size_t done = 0;
  while (done < out.data.size()) {
    const ssize_t n = ::pread(file.native_handle(), out.data.data() + done,
                              out.data.size() - done, static_cast<off_t>(range.begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw SystemError(errno, std::generic_category(), "cannot read shard '" + shard.path + "'");
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  if (done < sample.end - range.begin) {
    throw ShardError(shard.path, sample.key, sample.begin, "the shard ends inside the sample");
  }
  detail::place_fields(shard, sample, range.begin, out);
  return out;
}

std::vector<ShardSample> ShardDataset::read_batch(std::span<const Index> indices,
                                                  std::uint64_t gap) const {
  std::vector<ShardSample> out(indices.size());
  // The remote samples, by shard and offset; each run of neighbours becomes one GET.
  struct Want {
    std::size_t shard, sample, slot;
  };
  std::vector<Want> remote;
  // Each remote shard's cached copy, looked up once a batch (which queues an uncached one for
  // the filler, as read() does).
  std::map<std::size_t, std::optional<std::string>> copies;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const Location at = locate(indices[k]);
    const ShardIndex& shard = state_->shards[at.shard];
    if (!detail::is_remote(shard.path)) {
      out[k] = read(indices[k]);
      continue;
    }
    auto copy = copies.find(at.shard);
    if (copy == copies.end()) copy = copies.emplace(at.shard, state_->cached(at.shard)).first;
    if (copy->second) {
      if (auto cached = read_cached(*copy->second, shard, shard.samples[at.sample],
                                    state_->filler.get())) {
        out[k] = std::move(*cached);
        continue;
      }
    }
    remote.push_back({at.shard, at.sample, k});
  }
  const auto& shards = state_->shards;
  const auto begin_of = [&](const Want& w) { return shards[w.shard].samples[w.sample].begin; };
  const auto end_of = [&](const Want& w) { return shards[w.shard].samples[w.sample].end; };
  std::sort(remote.begin(), remote.end(), [&](const Want& a, const Want& b) {
    return a.shard != b.shard ? a.shard < b.shard : begin_of(a) < begin_of(b);
  });
  struct Run {
    std::size_t first, last;  // [first, last) of `remote`
    std::uint64_t begin, end;
    std::unique_ptr<io::BodyStream> body;
  };
  std::vector<Run> runs;
  for (std::size_t i = 0; i < remote.size(); ++i) {
    const Want& w = remote[i];
    if (!runs.empty() && remote[runs.back().first].shard == w.shard &&
        (begin_of(w) <= runs.back().end || begin_of(w) - runs.back().end <= gap)) {
      runs.back().last = i + 1;
      runs.back().end = std::max(runs.back().end, end_of(w));
    } else {
      runs.push_back({i, i + 1, begin_of(w), end_of(w), nullptr});
    }
  }
  // Every GET goes out before the first is waited for: the client runs them together.
  const auto client = io::HttpClient::shared();
  for (Run& r : runs) {
    const ShardIndex& shard = shards[remote[r.first].shard];
    r.body = client->stream(shard.path, r.begin, r.end, static_cast<std::size_t>(r.end - r.begin),
                            shard.file_size, state_->options.retry);
  }
  std::vector<std::byte> bytes;
  for (Run& r : runs) {
    confirm_size(shards[remote[r.first].shard], r.end - r.begin, state_->options.retry);
    bytes.resize(static_cast<std::size_t>(r.end - r.begin));
    r.body->read(bytes.data(), bytes.size());
    r.body.reset();
    for (std::size_t i = r.first; i < r.last; ++i) {
      const Want& w = remote[i];
      const ShardIndex& shard = shards[w.shard];
      const IndexSample& sample = shard.samples[w.sample];
      ShardSample& x = out[w.slot];
      x.data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
      std::memcpy(x.data.data(), bytes.data() + (sample.begin - r.begin), x.data.size());
      detail::place_fields(shard, sample, sample.begin, x);
    }
  }
  return out;
}

std::optional<ShardSample> ShardDataset::read_local(Index index) const {
  const Location at = locate(index);
  const ShardIndex& shard = state_->shards[at.shard];
  if (!detail::is_remote(shard.path)) return read(index);
  if (auto cached = state_->cached(at.shard)) {
    return read_cached(*cached, shard, shard.samples[at.sample], state_->filler.get());
  }
  return std::nullopt;
}

Task<ShardSample> ShardDataset::read_async(io::Reader& reader, Index index) const {
  const Location at = locate(index);
  const ShardIndex& shard = state_->shards[at.shard];
  const IndexSample& sample = shard.samples[at.sample];
  if (detail::is_remote(shard.path)) {
    // The cached copy (found once: each lookup stats the entry and marks its use).
    if (auto cached = state_->cached(at.shard)) {
      if (auto out = read_cached(*cached, shard, sample, state_->filler.get())) {
        co_return std::move(*out);
      }
    }
    // One ranged GET on the reader's io_context (the loader's driver): the fetch holds no
    // thread while it waits, as a file's read does.
    co_await confirm_size_async(reader, shard, sample.end - sample.begin, state_->options.retry);
    ShardSample out;
    out.data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
    co_await io::HttpClient::on(reader.context())
        ->get_range_async(shard.path, sample.begin, sample.end, out.data.data(), shard.file_size,
                          state_->options.retry);
    detail::place_fields(shard, sample, sample.begin, out);
    co_return out;
  }
  const io::File& file = state_->file(at.shard);
  const auto range = detail::sample_range(sample, shard.file_size, state_->align());
  ShardSample out;
  out.data = io::Buffer(static_cast<std::size_t>(range.end - range.begin));
  const std::size_t done = co_await reader.read_at(file, range.begin, out.data.mutable_bytes());
  if (done < sample.end - range.begin) {
    throw ShardError(shard.path, sample.key, sample.begin, "the shard ends inside the sample");
  }
  detail::place_fields(shard, sample, range.begin, out);
  co_return out;
}

std::vector<std::vector<std::size_t>> ShardDataset::remote_groups(std::span<const Index> indices,
                                                                  std::size_t max_parts) const {
  if (max_parts < 2) return {};  // a group of one is read_async's own GET
  struct Want {
    std::size_t shard, sample, slot;
  };
  const auto& shards = state_->shards;
  std::vector<Want> remote;
  std::vector<signed char> served(shards.size(), -1);  // per shard: by HTTP(S), not cached
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const Location at = locate(indices[k]);
    signed char& by_http = served[at.shard];
    if (by_http < 0) {
      const std::string& path = shards[at.shard].path;
      const io::Scheme scheme = io::scheme_of(path);
      by_http = (scheme == io::Scheme::http || scheme == io::Scheme::https) &&
                !state_->cached(at.shard);
    }
    if (by_http) remote.push_back({at.shard, at.sample, k});
  }
  std::sort(remote.begin(), remote.end(), [](const Want& a, const Want& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.sample < b.sample;
  });
  // A repeat is left to read_async: the parts of one request must not overlap.
  remote.erase(std::unique(remote.begin(), remote.end(),
                           [](const Want& a, const Want& b) {
                             return a.shard == b.shard && a.sample == b.sample;
                           }),
               remote.end());
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < remote.size();) {
    std::size_t j = i + 1;
    while (j < remote.size() && remote[j].shard == remote[i].shard) ++j;
    // Split evenly: a batch's decode starts as each group arrives, not after the whole shard's.
    const std::size_t n = j - i, count = (n + max_parts - 1) / max_parts;
    for (std::size_t g = 0; g < count && n > 1; ++g) {
      std::vector<std::size_t> group;
      for (std::size_t k = i + n * g / count; k < i + n * (g + 1) / count; ++k) {
        group.push_back(remote[k].slot);
      }
      if (group.size() > 1) groups.push_back(std::move(group));
    }
    i = j;
  }
  return groups;
}

Task<std::vector<std::optional<ShardSample>>> ShardDataset::prefetch_async(
    io::Reader& reader, std::span<const Index> indices, std::vector<std::size_t> group,
    std::uint64_t gap) const {
  std::vector<std::optional<ShardSample>> out(group.size());
  if (group.empty()) co_return out;
  // Each slot checked before any sample is looked up: the group is of one shard's samples.
  std::vector<Location> at(group.size());
  for (std::size_t j = 0; j < group.size(); ++j) {
    if (group[j] >= indices.size()) {
      throw InvalidArgument("ShardDataset::prefetch_async: the group names slot " +
                            std::to_string(group[j]) + " of " + std::to_string(indices.size()) +
                            " indices");
    }
    at[j] = locate(indices[group[j]]);
    if (at[j].shard != at[0].shard) {
      throw InvalidArgument("ShardDataset::prefetch_async: the group's samples are of more "
                            "than one shard");
    }
  }
  const ShardIndex& shard = state_->shards[at[0].shard];
  std::vector<ShardSample> got(group.size());
  std::vector<const IndexSample*> samples;
  std::vector<io::RangePart> parts;
  std::uint64_t claimed = 0;
  for (const Location& l : at) {
    // Saturated: a lying index's sizes must not wrap round below what the server confirms.
    const std::uint64_t n = shard.samples[l.sample].end - shard.samples[l.sample].begin;
    claimed = n > UINT64_MAX - claimed ? UINT64_MAX : claimed + n;
  }
  // A size the server does not confirm costs this group its request, as any fault here:
  // read_async then reads each sample, and its error names the sample's URL.
  bool confirmed = true;
  try {
    co_await confirm_size_async(reader, shard, claimed, state_->options.retry);
  } catch (const io::HttpError&) {
    confirmed = false;
  }
  if (!confirmed) co_return out;
  for (std::size_t j = 0; j < group.size(); ++j) {
    const IndexSample& sample = shard.samples[at[j].sample];
    samples.push_back(&sample);
    got[j].data = io::Buffer(static_cast<std::size_t>(sample.end - sample.begin));
    parts.push_back({sample.begin, sample.end, got[j].data.data()});
  }
  const std::vector<std::uint64_t> filled =
      co_await io::HttpClient::on(reader.context())
          ->get_ranges_async(shard.path, parts, shard.file_size, gap, state_->options.retry);
  for (std::size_t j = 0; j < group.size(); ++j) {
    if (filled[j] != parts[j].end - parts[j].begin) continue;
    detail::place_fields(shard, *samples[j], parts[j].begin, got[j]);
    out[j] = std::move(got[j]);
  }
  co_return out;
}

ShardSample ShardDataset::get(Index index, SampleContext&) const { return read(index); }

Task<ShardSample> ShardDataset::get_async(Index index, SampleContext& ctx) const {
  if (ctx.io) co_return co_await read_async(*ctx.io, index);
  co_return read(index);
}

}  // namespace coload::shards
