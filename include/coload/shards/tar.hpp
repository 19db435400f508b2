#pragma once
// The tar format as GNU tar and Python's tarfile write it (ustar, GNU long names, pax headers):
// header parsing on byte spans, and a walk over an archive's headers that reads nothing else.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/core/error.hpp"

namespace coload::shards {

/// A malformed, torn or truncated shard. `what()` reads like
/// "shard '/data/s-000001.tar', member 'a/b.jpg' at offset 1536: header checksum mismatch
/// (stored 1234, computed 4321)"; the member is empty when the header that failed named none.
class ShardError : public std::runtime_error, public Error {
 public:
  ShardError(std::string shard, std::string member, std::uint64_t offset,
             const std::string& problem);
  const char* what() const noexcept override { return std::runtime_error::what(); }
  /// The shard's path.
  const std::string& shard() const noexcept { return shard_; }
  /// The member the failure is about (empty when unknown).
  const std::string& member() const noexcept { return member_; }
  /// The byte offset in the shard of the header (or data) that failed.
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::string shard_;
  std::string member_;
  std::uint64_t offset_;
};

/// The problem with one header block, without its location (parse_tar_header throws it; the
/// walk turns it into a ShardError naming shard, member and offset).
class TarFormatError : public std::runtime_error, public Error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// The size of a tar block: headers take one, member data is padded to a multiple.
inline constexpr std::size_t tar_block = 512;

/// What kind of entry a header starts.
enum class TarEntryType {
  file,           ///< a regular file ('0', '\0' or '7'): a member with data
  gnu_long_name,  ///< 'L': its data is the next header's name
  gnu_long_link,  ///< 'K': its data is the next header's link name (ignored)
  pax_local,      ///< 'x': pax records for the next header
  pax_global,     ///< 'g': pax records for the rest of the archive (ignored)
  other,          ///< a directory, link, device...: skipped with its data
};

/// One header block, decoded.
struct TarHeader {
  /// The name: ustar's prefix joined with name (POSIX magic), or the name field alone.
  std::string name;
  /// The data's size in bytes, as the header claims it (octal or GNU base-256).
  std::uint64_t size = 0;
  /// The type flag byte.
  char typeflag = '0';
  TarEntryType type = TarEntryType::file;
};

/// Decodes one 512-byte header block (`block.size()` must be tar_block). Returns nullopt for
/// an all-zero block (the end-of-archive marker). Throws TarFormatError on a bad checksum (the
/// unsigned and the historic signed sum are both accepted) or an unreadable numeric field.
/// Reads nothing outside `block`; safe on arbitrary bytes.
std::optional<TarHeader> parse_tar_header(std::span<const std::byte> block);

/// What a pax extended header says about the next member (other keys are ignored).
struct PaxRecords {
  std::optional<std::string> path;
  std::optional<std::uint64_t> size;
};

/// Parses pax records ("%d %s=%s\n" each, the length counting the whole record) into `out`.
/// Throws TarFormatError on a malformed record. Safe on arbitrary bytes.
void parse_pax_records(std::span<const std::byte> data, PaxRecords& out);

/// A regular-file member of an archive: its full name and where its data lies.
struct TarMember {
  std::string name;
  /// Offset of the data (just past its header) in the archive.
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  /// Offset of the member's first header (a pax or GNU long-name header when it has one).
  std::uint64_t header_offset = 0;
};

/// Limits on what a header may make the walk read.
struct TarLimits {
  /// Largest GNU long name or pax header read (their data is read into memory).
  std::size_t max_extended_header = 1 << 20;
};

/// Reads up to `out.size()` bytes at `offset`; returns how many (fewer only at the end).
using TarRead = std::function<std::size_t(std::uint64_t offset, std::span<std::byte> out)>;

/// Walks the headers of an archive of `archive_size` bytes named `shard` (for errors), reading
/// only headers (and GNU long names and pax records) through `read`, and calls `on_member` for
/// each regular file in order. Throws ShardError naming shard, member and offset for a bad
/// header, a member whose data runs past the end of the archive (a torn shard, or a header
/// claiming an absurd size: nothing of that size is allocated), an extended header above the
/// limit, or an archive that ends without its end-of-archive block.
void walk_tar(const std::string& shard, std::uint64_t archive_size, const TarRead& read,
              const std::function<void(TarMember&&)>& on_member, const TarLimits& limits = {});

/// The regular-file members of an archive held in memory (tests, fuzzers).
std::vector<TarMember> list_tar(std::span<const std::byte> archive,
                                const std::string& shard = "<memory>",
                                const TarLimits& limits = {});

/// Appends a header for a regular file `name` of `size` bytes to `out`: one ustar block, or a
/// pax header carrying the path first when the name does not fit ustar's name and prefix.
/// `mtime` is seconds since the epoch. Throws InvalidArgument for an empty name.
void append_tar_header(std::vector<std::byte>& out, const std::string& name, std::uint64_t size,
                       std::uint64_t mtime = 0);

}  // namespace coload::shards
