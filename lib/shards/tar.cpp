// The tar format: header and pax parsing on byte spans, the header walk, and header writing.

#include "coload/shards/tar.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>

namespace coload::shards {

namespace {

// Offsets and lengths of a ustar header's fields.
constexpr std::size_t name_at = 0, name_len = 100;
constexpr std::size_t mode_at = 100, uid_at = 108, gid_at = 116;
constexpr std::size_t size_at = 124, size_len = 12;
constexpr std::size_t mtime_at = 136;
constexpr std::size_t chksum_at = 148, chksum_len = 8;
constexpr std::size_t type_at = 156;
constexpr std::size_t magic_at = 257;
constexpr std::size_t prefix_at = 345, prefix_len = 155;

std::string field_string(std::span<const std::byte> block, std::size_t at, std::size_t len) {
  const char* p = reinterpret_cast<const char*>(block.data()) + at;
  return std::string(p, strnlen(p, len));
}

// A numeric field: octal digits between optional spaces/NULs, or GNU's base-256 (the first
// byte's high bit set). Throws TarFormatError naming `what`.
std::uint64_t field_number(std::span<const std::byte> block, std::size_t at, std::size_t len,
                           const char* what) {
  const auto* p = reinterpret_cast<const unsigned char*>(block.data()) + at;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) throw TarFormatError(std::string("negative base-256 ") + what + " field");
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < len; ++i) {
      if (v >> 56) throw TarFormatError(std::string(what) + " field overflows 64 bits");
      v = (v << 8) | p[i];
    }
    return v;
  }
  std::size_t i = 0;
  while (i < len && (p[i] == ' ' || p[i] == 0)) ++i;
  std::uint64_t v = 0;
  for (; i < len && p[i] != ' ' && p[i] != 0; ++i) {
    if (p[i] < '0' || p[i] > '7') {
      throw TarFormatError(std::string("unreadable ") + what + " field (not octal)");
    }
    v = (v << 3) | static_cast<std::uint64_t>(p[i] - '0');
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != 0) {
      throw TarFormatError(std::string("unreadable ") + what + " field (not octal)");
    }
  }
  return v;
}

void put_octal(std::byte* field, std::size_t len, std::uint64_t value) {
  // len - 1 digits and a NUL, as GNU tar writes them.
  for (std::size_t i = len - 1; i-- > 0;) {
    field[i] = static_cast<std::byte>('0' + (value & 7));
    value >>= 3;
  }
  field[len - 1] = std::byte{0};
}

void put_string(std::byte* field, std::size_t len, std::string_view s) {
  std::memcpy(field, s.data(), std::min(len, s.size()));
}

std::string pax_record(std::string_view key, std::string_view value) {
  // The length counts itself: grow it until it is stable.
  const std::size_t body = key.size() + value.size() + 3;  // ' ', '=', '\n'
  std::size_t len = body + 1;
  while (std::to_string(len).size() + body != len) len = std::to_string(len).size() + body;
  return std::to_string(len) + " " + std::string(key) + "=" + std::string(value) + "\n";
}

std::uint64_t padded(std::uint64_t size) { return (size + tar_block - 1) / tar_block * tar_block; }

}  // namespace

ShardError::ShardError(std::string shard, std::string member, std::uint64_t offset,
                       const std::string& problem)
    : std::runtime_error("shard '" + shard + "'" +
                         (member.empty() ? std::string() : ", member '" + member + "'") +
                         " at offset " + std::to_string(offset) + ": " + problem),
      shard_(std::move(shard)),
      member_(std::move(member)),
      offset_(offset) {}

std::optional<TarHeader> parse_tar_header(std::span<const std::byte> block) {
  if (block.size() != tar_block) throw TarFormatError("a tar header is 512 bytes");
  const auto* u = reinterpret_cast<const unsigned char*>(block.data());
  if (std::all_of(u, u + tar_block, [](unsigned char c) { return c == 0; })) return std::nullopt;
  const std::uint64_t stored = field_number(block, chksum_at, chksum_len, "checksum");
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < tar_block; ++i) {
    const bool in_chksum = i >= chksum_at && i < chksum_at + chksum_len;
    unsigned_sum += in_chksum ? ' ' : u[i];
    signed_sum += in_chksum ? ' ' : static_cast<signed char>(u[i]);
  }
  if (stored != unsigned_sum && static_cast<std::int64_t>(stored) != signed_sum) {
    throw TarFormatError("header checksum mismatch (stored " + std::to_string(stored) +
                         ", computed " + std::to_string(unsigned_sum) + ")");
  }
  TarHeader h;
  h.typeflag = static_cast<char>(u[type_at]);
  h.size = field_number(block, size_at, size_len, "size");
  h.name = field_string(block, name_at, name_len);
  if (std::memcmp(u + magic_at, "ustar\0", 6) == 0) {  // POSIX ustar: a prefix may lead
    std::string prefix = field_string(block, prefix_at, prefix_len);
    if (!prefix.empty()) h.name = prefix + "/" + h.name;
  }
  switch (h.typeflag) {
    case '0':
    case '7': h.type = TarEntryType::file; break;
    case '\0':  // old tar: a trailing slash marks a directory
      h.type = !h.name.empty() && h.name.back() == '/' ? TarEntryType::other : TarEntryType::file;
      break;
    case 'L': h.type = TarEntryType::gnu_long_name; break;
    case 'K': h.type = TarEntryType::gnu_long_link; break;
    case 'x': h.type = TarEntryType::pax_local; break;
    case 'g': h.type = TarEntryType::pax_global; break;
    default: h.type = TarEntryType::other; break;
  }
  return h;
}

void parse_pax_records(std::span<const std::byte> data, PaxRecords& out) {
  const std::string_view s(reinterpret_cast<const char*>(data.data()), data.size());
  std::size_t pos = 0;
  while (pos < s.size()) {
    if (s.find_first_not_of('\0', pos) == std::string_view::npos) break;  // NUL padding
    const std::size_t space = s.find(' ', pos);
    if (space == std::string_view::npos || space == pos || space - pos > 20) {
      throw TarFormatError("malformed pax record at byte " + std::to_string(pos));
    }
    std::size_t len = 0;
    const auto [end, ec] = std::from_chars(s.data() + pos, s.data() + space, len);
    if (ec != std::errc{} || end != s.data() + space || len <= space - pos + 1 ||
        len > s.size() - pos || s[pos + len - 1] != '\n') {
      throw TarFormatError("malformed pax record length at byte " + std::to_string(pos));
    }
    const std::string_view record = s.substr(space + 1, pos + len - 1 - (space + 1));
    const std::size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      throw TarFormatError("pax record without key=value at byte " + std::to_string(pos));
    }
    const std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      out.path = std::string(value);
    } else if (key == "size") {
      std::uint64_t v = 0;
      const auto [e, c] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (c != std::errc{} || e != value.data() + value.size() || value.empty()) {
        throw TarFormatError("unreadable pax size '" + std::string(value.substr(0, 40)) + "'");
      }
      out.size = v;
    }
    pos += len;
  }
}

void walk_tar(const std::string& shard, std::uint64_t archive_size, const TarRead& read,
              const std::function<void(TarMember&&)>& on_member, const TarLimits& limits) {
  std::uint64_t offset = 0;
  std::optional<std::string> long_name;
  PaxRecords pax;
  std::uint64_t first_header = 0;
  bool pending = false;  // an extended header waits for its member
  std::byte block[tar_block];
  for (;;) {
    if (archive_size - offset < tar_block) {
      const std::uint64_t left = archive_size - offset;
      throw ShardError(shard, long_name.value_or(pax.path.value_or("")), offset,
                       left == 0 ? "the archive ends without its end-of-archive block "
                                   "(a torn or truncated shard)"
                                 : "truncated header (" + std::to_string(left) +
                                       " of 512 bytes; a torn or truncated shard)");
    }
    if (read(offset, block) != tar_block) {
      throw ShardError(shard, "", offset, "truncated header (the file shrank while read)");
    }
    std::optional<TarHeader> h;
    try {
      h = parse_tar_header(block);
    } catch (const TarFormatError& e) {
      throw ShardError(shard, long_name.value_or(pax.path.value_or("")), offset, e.what());
    }
    if (!h) return;  // end of archive (tarfile stops at the first zero block too)
    if (!pending) first_header = offset;
    // A pax header's size is its member's: an extended header between the two (a global
    // one, a GNU long name, another pax header) has its own, as tarfile reads them.
    const bool member = h->type == TarEntryType::file || h->type == TarEntryType::other;
    const std::uint64_t size = member ? pax.size.value_or(h->size) : h->size;
    const std::uint64_t data_at = offset + tar_block;
    std::string name = pax.path ? *pax.path : long_name ? *long_name : h->name;
    if (size > archive_size - data_at) {
      throw ShardError(shard, name, offset,
                       "header claims " + std::to_string(size) + " bytes of data but only " +
                           std::to_string(archive_size - data_at) +
                           " remain (a torn shard, or an absurd size)");
    }
    auto read_extended = [&](const char* what) {
      if (size > limits.max_extended_header) {
        throw ShardError(shard, "", offset,
                         std::string(what) + " of " + std::to_string(size) +
                             " bytes exceeds the limit of " +
                             std::to_string(limits.max_extended_header));
      }
      std::vector<std::byte> data(static_cast<std::size_t>(size));
      if (read(data_at, data) != data.size()) {
        throw ShardError(shard, "", offset, std::string("truncated ") + what);
      }
      return data;
    };
    switch (h->type) {
      case TarEntryType::gnu_long_name: {
        const auto data = read_extended("GNU long name");
        const char* p = reinterpret_cast<const char*>(data.data());
        long_name = std::string(p, strnlen(p, data.size()));
        pending = true;
        break;
      }
      case TarEntryType::pax_local: {
        const auto data = read_extended("pax header");
        try {
          parse_pax_records(data, pax);
        } catch (const TarFormatError& e) {
          throw ShardError(shard, "", offset, e.what());
        }
        pending = true;
        break;
      }
      case TarEntryType::gnu_long_link:
      case TarEntryType::pax_global: pending = pending || h->type == TarEntryType::gnu_long_link;
        break;
      case TarEntryType::file:
        on_member(TarMember{std::move(name), data_at, size, first_header});
        [[fallthrough]];
      case TarEntryType::other:
        long_name.reset();
        pax = {};
        pending = false;
        break;
    }
    offset = data_at + padded(size);
    if (offset > archive_size) offset = archive_size;  // padding cut off: reported next turn
  }
}

std::vector<TarMember> list_tar(std::span<const std::byte> archive, const std::string& shard,
                                const TarLimits& limits) {
  std::vector<TarMember> members;
  walk_tar(
      shard, archive.size(),
      [&](std::uint64_t offset, std::span<std::byte> out) -> std::size_t {
        if (offset >= archive.size()) return 0;
        const std::size_t n = std::min<std::size_t>(out.size(), archive.size() - offset);
        std::memcpy(out.data(), archive.data() + offset, n);
        return n;
      },
      [&](TarMember&& m) { members.push_back(std::move(m)); }, limits);
  return members;
}

namespace {

void append_block(std::vector<std::byte>& out, std::string_view name, std::string_view prefix,
                  std::uint64_t size, std::uint64_t mtime, char typeflag) {
  std::byte b[tar_block] = {};
  put_string(b + name_at, name_len, name);
  put_octal(b + mode_at, 8, 0644);
  put_octal(b + uid_at, 8, 0);
  put_octal(b + gid_at, 8, 0);
  if (size < (std::uint64_t{1} << 33)) {
    put_octal(b + size_at, size_len, size);
  } else {  // GNU base-256 (the pax header carries the size too)
    b[size_at] = std::byte{0x80};
    for (std::size_t i = size_len; i-- > 1; size >>= 8) b[size_at + i] = std::byte(size & 0xff);
  }
  put_octal(b + mtime_at, 12, mtime);
  b[type_at] = static_cast<std::byte>(typeflag);
  put_string(b + magic_at, 8, std::string_view("ustar\0" "00", 8));
  put_string(b + prefix_at, prefix_len, prefix);
  std::memset(b + chksum_at, ' ', chksum_len);
  unsigned sum = 0;
  for (std::byte c : b) sum += static_cast<unsigned char>(c);
  put_octal(b + chksum_at, 7, sum);  // six digits and a NUL, then the space left in place
  out.insert(out.end(), b, b + tar_block);
}

}  // namespace

void append_tar_header(std::vector<std::byte>& out, const std::string& name, std::uint64_t size,
                       std::uint64_t mtime) {
  if (name.empty()) throw InvalidArgument("append_tar_header: empty member name");
  if (name.size() <= name_len && size < (std::uint64_t{1} << 33)) {
    append_block(out, name, "", size, mtime, '0');
    return;
  }
  // ustar's prefix: split at a slash so that both halves fit.
  if (size < (std::uint64_t{1} << 33)) {
    for (std::size_t slash = name.find('/'); slash != std::string::npos;
         slash = name.find('/', slash + 1)) {
      if (slash <= prefix_len && name.size() - slash - 1 <= name_len && slash + 1 < name.size()) {
        append_block(out, std::string_view(name).substr(slash + 1),
                     std::string_view(name).substr(0, slash), size, mtime, '0');
        return;
      }
    }
  }
  // A pax header with the path (and the size when octal cannot hold it), as tarfile writes.
  std::string records = pax_record("path", name);
  if (size >= (std::uint64_t{1} << 33)) records += pax_record("size", std::to_string(size));
  append_block(out, "././@PaxHeader", "", records.size(), mtime, 'x');
  const auto* r = reinterpret_cast<const std::byte*>(records.data());
  out.insert(out.end(), r, r + records.size());
  out.resize(out.size() + (padded(records.size()) - records.size()));
  append_block(out, std::string_view(name).substr(0, name_len), "", size, mtime, '0');
}

}  // namespace coload::shards
