// Writer: tar shards of a target size with their index files; pack() and its seeded order.

#include "coload/shards/writer.hpp"

#include "../vision/jpeg_restart.hpp"
#include "checksum.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <set>
#include <system_error>
#include <utility>

namespace coload::shards {

namespace {

void write_all(int fd, const std::byte* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw SystemError(errno, std::generic_category(), "cannot write '" + path + "'");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::uint64_t padded(std::uint64_t size) { return (size + tar_block - 1) / tar_block * tar_block; }

std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Writer::Writer(std::filesystem::path folder, WriterOptions options)
    : folder_(std::move(folder)), options_(std::move(options)) {
  if (options_.shard_size < 2 * tar_block) {
    throw InvalidArgument("shards::Writer: shard_size must be at least 1024 bytes, got " +
                          std::to_string(options_.shard_size));
  }
  std::error_code ec;
  std::filesystem::create_directories(folder_, ec);
  if (ec) {
    throw SystemError(ec, "cannot create the shard folder '" + folder_.string() + "'");
  }
}

Writer::~Writer() {
  // Unwinding from a finish() that threw (finished_ set, complete_ not) abandons too.
  if (!complete_ && std::uncaught_exceptions() > uncaught_) {
    abandon();
    return;
  }
  try {
    if (!finished_) finish();
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
  }
}

void Writer::abandon() noexcept {
  finished_ = true;
  if (complete_) return;
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  try {
    // The open shard, or one whose close failed (close_current lets go of fd_ first).
    if (!current_.empty()) ::unlink((current_ + ".tmp").c_str());
    for (const std::string& shard : written_) {
      ::unlink(shard.c_str());
      ::unlink(index_path(shard).c_str());
    }
    ::unlink(manifest_tmp().c_str());
  } catch (...) {  // a path's allocation: what is left stays
  }
  written_.clear();
}

void Writer::open_next() {
  char number[32];
  std::snprintf(number, sizeof number, "%06zu", written_.size());
  current_ = (folder_ / (options_.prefix + number + ".tar")).string();
  const std::string tmp = current_ + ".tmp";
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw SystemError(errno, std::generic_category(), "cannot create '" + tmp + "'");
  offset_ = 0;
  members_.clear();
  restarts_.clear();
}

void Writer::close_current() {
  if (fd_ < 0) return;
  const std::string tmp = current_ + ".tmp";
  // Two zero blocks end the archive; GNU tar and tarfile pad to a 10 KiB record: so do we.
  const std::uint64_t end = offset_ + 2 * tar_block;
  const std::uint64_t record = 20 * tar_block;
  const std::vector<std::byte> zeros((end + record - 1) / record * record - offset_);
  write_all(fd_, zeros.data(), zeros.size(), tmp);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw SystemError(errno, std::generic_category(), "cannot write '" + tmp + "'");
  if (::rename(tmp.c_str(), current_.c_str()) != 0) {
    throw SystemError(errno, std::generic_category(), "cannot rename '" + tmp + "'");
  }
  written_.push_back(current_);
  if (options_.write_index) {
    struct stat st {};
    if (::stat(current_.c_str(), &st) != 0) {
      throw SystemError(errno, std::generic_category(), "cannot stat '" + current_ + "'");
    }
    ShardIndex index;
    index.path = current_;
    index.file_size = static_cast<std::uint64_t>(st.st_size);
    index.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    group_members(current_, members_, index);
    // Both in archive order: one pass pairs them.
    auto r = restarts_.begin();
    for (IndexMember& m : index.members) {
      while (r != restarts_.end() && r->first < m.offset) ++r;
      if (r != restarts_.end() && r->first == m.offset) m.restarts = r->second;
    }
    index.checksum = detail::shard_checksum(index);  // what a cached copy is checked by
    const std::string idx = index_path(current_).string();
    std::ofstream out(idx, std::ios::binary | std::ios::trunc);
    out << format_index(index);
    if (!out) throw SystemError(EIO, std::generic_category(), "cannot write '" + idx + "'");
  }
}

void Writer::write(std::string_view key, std::span<const WriteField> fields) {
  if (finished_) throw LogicError("shards::Writer: write after finish");
  const std::size_t slash = key.rfind('/');
  if (key.empty() || key.find('.', slash == key.npos ? 0 : slash + 1) != key.npos ||
      key.back() == '/') {
    throw InvalidArgument("shards::Writer: invalid key '" + std::string(key) +
                          "' (empty, or a dot in its base name)");
  }
  // A tar name ends at its first NUL: "a\0b.jpg" reads back as "a", a member without a field.
  if (key.find('\0') != key.npos) {
    throw InvalidArgument(
        "shards::Writer: the key of " +
        (last_key_.empty() ? std::string("the first sample") : "the sample after '" + last_key_ + "'") +
        " holds a NUL byte, where a tar member's name would end");
  }
  // What a reader would not give back as this sample: its members skipped as webdataset's
  // metadata (below), or joined with the sample before (readers group consecutive members by
  // key).
  if (key == last_key_) {
    throw InvalidArgument("shards::Writer: key '" + std::string(key) +
                          "' is the key of the sample before, which readers would join it to");
  }
  if (fields.empty()) {
    throw InvalidArgument("shards::Writer: sample '" + std::string(key) + "' has no field");
  }
  std::set<std::string> names;  // lowercased, as readers name fields
  std::uint64_t bytes = 0;
  staging_.clear();
  for (const WriteField& f : fields) {
    std::string lower = f.name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (f.name.find('\0') != std::string::npos) {
      throw InvalidArgument("shards::Writer: a field name of sample '" + std::string(key) +
                            "' holds a NUL byte, where a tar member's name would end");
    }
    if (f.name.empty() || f.name.find('/') != std::string::npos || !names.insert(lower).second) {
      throw InvalidArgument("shards::Writer: invalid or repeated field '" + f.name +
                            "' in sample '" + std::string(key) +
                            "' (fields are named without regard to case)");
    }
    if (const std::string member = std::string(key) + "." + f.name; is_metadata_name(member)) {
      throw InvalidArgument("shards::Writer: sample '" + std::string(key) + "': member '" +
                            member + "' is one readers skip as webdataset's metadata (its "
                            "first folder, or its name, is __x__)");
    }
    // A name too long for ustar may bring a pax header along (at most two blocks and the path).
    const std::size_t name = key.size() + 1 + f.name.size();
    bytes += (name <= 100 ? tar_block : 3 * tar_block + padded(name)) + padded(f.data.size());
  }
  if (fd_ >= 0 && offset_ > 0 && offset_ + bytes + 2 * tar_block > options_.shard_size) {
    close_current();
  }
  if (fd_ < 0) open_next();
  for (const WriteField& f : fields) {
    const std::string name = std::string(key) + "." + f.name;
    const std::size_t header_at = staging_.size();
    append_tar_header(staging_, name, f.data.size(), options_.mtime);
    const std::uint64_t data_at = offset_ + staging_.size();
    members_.push_back(TarMember{name, data_at, f.data.size(), offset_ + header_at});
    if (options_.index_restarts && (f.name == "jpg" || f.name == "jpeg")) {
      if (auto layout = vision::detail::scan_restart_layout(f.data)) {
        restarts_.emplace_back(data_at, std::move(*layout));
      }
    }
    write_all(fd_, staging_.data(), staging_.size(), current_ + ".tmp");
    offset_ += staging_.size();
    staging_.clear();
    write_all(fd_, f.data.data(), f.data.size(), current_ + ".tmp");
    const std::size_t pad = static_cast<std::size_t>(padded(f.data.size()) - f.data.size());
    static const std::byte zeros[tar_block] = {};
    write_all(fd_, zeros, pad, current_ + ".tmp");
    offset_ += f.data.size() + pad;
  }
  ++samples_;
  last_key_ = key;
}

std::vector<std::string> Writer::finish() {
  if (!finished_) {
    finished_ = true;
    close_current();
    if (options_.write_index) write_manifest();
    complete_ = true;
  }
  return written_;
}

std::filesystem::path Writer::manifest_tmp() const {
  std::filesystem::path tmp = folder_ / shard_list_name;
  tmp += ".tmp" + std::to_string(::getpid());
  return tmp;
}

void Writer::write_manifest() {
  // Written whole under a temporary name and renamed, like the shards: a reader listing the
  // folder by URL never sees half a list.
  const std::filesystem::path list = folder_ / shard_list_name;
  const std::filesystem::path tmp = manifest_tmp();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    for (const std::string& s : written_) out << std::filesystem::path(s).filename().string() << '\n';
    if (!out.flush()) throw SystemError(errno, std::generic_category(), "cannot write '" + tmp.string() + "'");
  }
  std::filesystem::rename(tmp, list);
}

std::vector<std::int64_t> pack_order(std::int64_t n, std::optional<std::uint64_t> seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  if (seed) {
    std::uint64_t state = *seed;
    for (std::size_t i = order.size(); i > 1; --i) {
      const auto j = static_cast<std::size_t>(
          static_cast<unsigned __int128>(splitmix(state)) * i >> 64);
      std::swap(order[i - 1], order[j]);
    }
  }
  return order;
}

std::vector<std::string> pack(std::int64_t n, std::optional<std::uint64_t> seed, Writer& writer,
                              const std::function<void(std::int64_t, Writer&)>& write_one) {
  try {
    for (std::int64_t i : pack_order(n, seed)) write_one(i, writer);
    return writer.finish();
  } catch (...) {
    writer.abandon();
    throw;
  }
}

}  // namespace coload::shards
