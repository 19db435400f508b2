// ShardIndex: WebDataset grouping, the header-only build, and the index file beside a shard.

#include "coload/shards/index.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "coload/io/http.hpp"
#include "checksum.hpp"
#include "remote.hpp"

namespace coload::shards {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void escape_into(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

bool unescape(std::string_view s, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size()) return false;
    if (s[i] == '\\') {
      out += '\\';
    } else if (s[i] == 't') {
      out += '\t';
    } else if (s[i] == 'n') {
      out += '\n';
    } else {
      return false;
    }
  }
  return true;
}

template <class T>
bool number(std::string_view s, T& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && end == s.data() + s.size() && !s.empty();
}

std::vector<std::string_view> split_tabs(std::string_view line) {
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t tab = line.find('\t', pos);
    parts.push_back(line.substr(pos, tab == std::string_view::npos ? line.npos : tab - pos));
    if (tab == std::string_view::npos) return parts;
    pos = tab + 1;
  }
}

}  // namespace

bool is_metadata_name(std::string_view name) noexcept {
  const std::string_view first = name.substr(0, name.find('/'));
  return first.size() >= 4 && first.starts_with("__") && first.ends_with("__");
}

bool split_member_name(std::string_view name, std::string& key, std::string& field) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  if (is_metadata_name(name)) return false;
  const std::size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot == base || dot + 1 == name.size()) return false;
  key.assign(name.substr(0, dot));
  field.assign(name.substr(dot + 1));
  std::transform(field.begin(), field.end(), field.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return true;
}

void group_members(const std::string& shard, const std::vector<TarMember>& members,
                   ShardIndex& index) {
  std::string key, field;
  std::set<std::string> fields;  // of the current sample
  for (const TarMember& m : members) {
    if (!split_member_name(m.name, key, field)) continue;
    if (index.samples.empty() || index.samples.back().key != key) {
      IndexSample s;
      s.key = key;
      s.first = static_cast<std::uint32_t>(index.members.size());
      s.begin = m.offset;
      index.samples.push_back(std::move(s));
      fields.clear();
    }
    if (!fields.insert(field).second) {
      throw ShardError(shard, m.name, m.header_offset,
                       "duplicate field '" + field + "' in sample '" + key + "'");
    }
    IndexSample& s = index.samples.back();
    ++s.count;
    s.end = m.offset + m.size;
    index.members.push_back(IndexMember{field, m.offset, m.size});
  }
}

ShardIndex build_index(const std::filesystem::path& path, const TarLimits& limits) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    throw SystemError(errno, std::generic_category(), "cannot open shard '" + path.string() + "'");
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw SystemError(errno, std::generic_category(), "cannot stat shard '" + path.string() + "'");
  }
  if (!S_ISREG(st.st_mode)) {
    throw ShardError(path.string(), "", 0, "not a regular file");
  }
  ShardIndex index;
  index.path = path.string();
  index.file_size = static_cast<std::uint64_t>(st.st_size);
  index.mtime_ns = mtime_ns(st);
  std::vector<TarMember> members;
  walk_tar(
      index.path, index.file_size,
      [&](std::uint64_t offset, std::span<std::byte> out) -> std::size_t {
        std::size_t done = 0;
        while (done < out.size()) {
          const ssize_t n = ::pread(f.fd, out.data() + done, out.size() - done,
                                    static_cast<off_t>(offset + done));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            throw SystemError(errno, std::generic_category(),
                              "cannot read shard '" + index.path + "'");
          }
          if (n == 0) break;
          done += static_cast<std::size_t>(n);
        }
        return done;
      },
      [&](TarMember&& m) { members.push_back(std::move(m)); }, limits);
  group_members(index.path, members, index);
  return index;
}

std::filesystem::path index_path(const std::filesystem::path& shard) {
  std::filesystem::path p = shard;
  p += ".idx";
  return p;
}

namespace {

// A member's restart intervals as the index's fifth field: "<interval>:<row starts as
// differences>". Differences keep the text short: a row is a few kilobytes.
void format_restarts(std::string& out, const RestartIndex& r) {
  out += '\t';
  out += std::to_string(r.interval);
  out += ':';
  std::uint32_t previous = 0;
  for (std::size_t k = 0; k < r.rows.size(); ++k) {
    if (k > 0) out += ',';
    out += std::to_string(r.rows[k] - previous);
    previous = r.rows[k];
  }
}

bool parse_restarts(std::string_view s, std::uint64_t member_size, RestartIndex& r) {
  const std::size_t colon = s.find(':');
  if (colon == std::string_view::npos || !number(s.substr(0, colon), r.interval) ||
      r.interval == 0) {
    return false;
  }
  r.rows.clear();
  std::uint64_t at = 0;
  std::size_t pos = colon + 1;
  while (pos <= s.size()) {
    const std::size_t comma = std::min(s.find(',', pos), s.size());
    std::uint32_t delta = 0;
    // Rows go forward (a row holds at least one byte) and start inside the member.
    if (!number(s.substr(pos, comma - pos), delta) || (!r.rows.empty() && delta == 0)) {
      return false;
    }
    at += delta;
    if (at >= member_size) return false;
    r.rows.push_back(static_cast<std::uint32_t>(at));
    pos = comma + 1;
  }
  return !r.rows.empty();
}

}  // namespace

std::string format_index(const ShardIndex& index) {
  // Version 1 unless a member has restart intervals: readers from before version 2 still read
  // every shard without them.
  const bool restarts = std::any_of(index.members.begin(), index.members.end(),
                                    [](const IndexMember& m) { return m.restarts.marked(); });
  std::string out = index.checksum ? "coload-shard-index\t3\n"
                    : restarts     ? "coload-shard-index\t2\n"
                                   : "coload-shard-index\t1\n";
  out += std::to_string(index.file_size) + "\t" + std::to_string(index.mtime_ns) + "\t" +
         std::to_string(index.members.size()) + "\t" + std::to_string(index.samples.size());
  if (index.checksum) out += "\t" + detail::format_checksum(*index.checksum);
  out += '\n';
  for (const IndexSample& s : index.samples) {
    for (std::uint32_t k = s.first; k < s.first + s.count; ++k) {
      const IndexMember& m = index.members[k];
      out += std::to_string(m.offset) + "\t" + std::to_string(m.size) + "\t";
      escape_into(out, s.key);
      out += '\t';
      escape_into(out, m.field);
      if (m.restarts.marked()) format_restarts(out, m.restarts);
      out += '\n';
    }
  }
  return out;
}

bool parse_index(std::string_view text, std::uint64_t file_size, ShardIndex& out,
                 std::string* why) {
  std::size_t pos = 0, line_no = 0;
  auto next_line = [&](std::string_view& line) {
    if (pos >= text.size()) return false;
    const std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) return false;
    line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    return true;
  };
  // Says where and why the text is refused: the line last read (0: the text as a whole).
  const auto refuse = [&](const std::string& reason) {
    if (why) *why = (line_no > 0 ? "line " + std::to_string(line_no) + ": " : "") + reason;
    return false;
  };
  // A line that is not there, or has no end: it is the next one.
  const auto refuse_next = [&](const std::string& reason) {
    ++line_no;
    return refuse(reason);
  };
  std::string_view line;
  if (!next_line(line)) return refuse_next("no version line");
  const bool v3 = line == "coload-shard-index\t3";
  const bool v2 = v3 || line == "coload-shard-index\t2";  // restart intervals allowed
  if (!v2 && line != "coload-shard-index\t1") {
    return refuse("not 'coload-shard-index' and a version this reader knows (1, 2 or 3)");
  }
  if (!next_line(line)) return refuse_next("no header line");
  auto head = split_tabs(line);
  std::uint64_t members = 0, samples = 0, sum = 0;
  if (head.size() != (v3 ? 5u : 4u) || !number(head[0], out.file_size) ||
      !number(head[1], out.mtime_ns) || !number(head[2], members) ||
      !number(head[3], samples) || (v3 && !detail::parse_checksum(head[4], sum))) {
    return refuse(std::string("a malformed header (size, mtime, members, samples") +
                  (v3 ? ", checksum)" : ")"));
  }
  if (out.file_size != file_size) {
    return refuse("made for a shard of " + std::to_string(out.file_size) + " bytes, not " +
                  std::to_string(file_size));
  }
  out.checksum = v3 ? std::optional<std::uint64_t>(sum) : std::nullopt;
  // Bounded by the text itself, not by what the header claims.
  if (members > text.size() / 8 || samples > members) {
    return refuse("claims " + std::to_string(members) + " members and " +
                  std::to_string(samples) + " samples, more than its text holds");
  }
  out.members.clear();
  out.samples.clear();
  // An IndexMember is larger than its line of text: the reserve is held to a 64th of the
  // text's size, and a denser index grows the vector as its lines are read.
  out.members.reserve(std::min<std::uint64_t>(members, text.size() / 64));
  std::string key, field;
  while (next_line(line)) {
    auto parts = split_tabs(line);
    IndexMember m;
    if ((parts.size() != 4 && !(v2 && parts.size() == 5)) || !number(parts[0], m.offset) ||
        !number(parts[1], m.size) || !unescape(parts[2], key) || !unescape(parts[3], field) ||
        key.empty() || field.empty() ||
        (parts.size() == 5 && !parse_restarts(parts[4], m.size, m.restarts))) {
      return refuse("a malformed member (offset, size, key, field[, restarts])");
    }
    if (m.offset > file_size || m.size > file_size - m.offset) {
      return refuse("a member of " + std::to_string(m.size) + " bytes at " +
                    std::to_string(m.offset) + ", past the shard's end (" +
                    std::to_string(file_size) + " bytes)");
    }
    if (out.samples.empty() || out.samples.back().key != key) {
      // Samples go forward too: readers stream a shard in order, never back.
      if (!out.samples.empty() && m.offset < out.samples.back().end) {
        return refuse("sample '" + key + "' begins before the previous one ends");
      }
      IndexSample s;
      s.key = key;
      s.first = static_cast<std::uint32_t>(out.members.size());
      s.begin = m.offset;
      out.samples.push_back(std::move(s));
    }
    IndexSample& s = out.samples.back();
    if (m.offset < s.end) return refuse("a member that begins before the previous one ends");
    ++s.count;
    s.end = m.offset + m.size;
    m.field = field;
    out.members.push_back(std::move(m));
  }
  if (pos != text.size()) return refuse_next("an unfinished last line");
  if (out.members.size() != members || out.samples.size() != samples) {
    line_no = 0;
    return refuse("the header says " + std::to_string(members) + " members and " +
                  std::to_string(samples) + " samples; it lists " +
                  std::to_string(out.members.size()) + " and " +
                  std::to_string(out.samples.size()));
  }
  return true;
}

ShardIndex load_index(const std::filesystem::path& shard, const IndexOptions& options) {
  if (detail::is_remote(shard.native())) return detail::load_remote_index(shard.native());
  struct stat st {};
  if (::stat(shard.c_str(), &st) != 0) {
    throw SystemError(errno, std::generic_category(), "cannot stat shard '" + shard.string() + "'");
  }
  const std::filesystem::path idx = index_path(shard);
  {
    std::ifstream in(idx, std::ios::binary);
    struct stat ist {};
    // An index file is a few dozen bytes a member: one far larger than its shard is not ours.
    if (in && ::stat(idx.c_str(), &ist) == 0 && ist.st_size <= st.st_size + 4096) {
      std::string text(static_cast<std::size_t>(ist.st_size), '\0');
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      ShardIndex index;
      if (in.gcount() == static_cast<std::streamsize>(text.size()) &&
          parse_index(text, static_cast<std::uint64_t>(st.st_size), index) &&
          index.mtime_ns == mtime_ns(st)) {
        index.path = shard.string();
        return index;
      }
    }
  }
  ShardIndex index = build_index(shard, options.limits);
  if (options.write) {
    std::filesystem::path tmp = idx;
    tmp += ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (out) out << format_index(index);
      if (!out) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        return index;  // a read-only folder: the index stays in memory
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, idx, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }
  return index;
}

std::vector<std::string> find_shards(const std::filesystem::path& root) {
  if (io::is_url(root.native())) return detail::find_url_shards(root.native());
  std::vector<std::string> shards;
  std::error_code ec;
  if (std::filesystem::is_directory(root, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
      if (entry.path().extension() == ".tar" && entry.is_regular_file(ec)) {
        shards.push_back(entry.path().string());
      }
    }
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) {
      throw InvalidArgument("no .tar shards in '" + root.string() + "'");
    }
  } else if (std::filesystem::exists(root, ec)) {
    shards.push_back(root.string());
  } else if (root.native().find('{') != std::string::npos) {
    // A brace pattern of local names (".../shard-{000000..000009}.tar"), as a URL's is; a
    // name it gives that is not there is named when its index is read.
    return expand_braces(root.native());
  } else {
    throw InvalidArgument("no shard or folder of shards at '" + root.string() + "'");
  }
  return shards;
}

}  // namespace coload::shards
