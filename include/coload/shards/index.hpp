#pragma once
// The index of one shard: its members grouped into WebDataset samples, built from the headers
// alone and kept beside the shard in a small text file.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coload/shards/tar.hpp"

namespace coload::shards {

/// Where the restart intervals of a JPEG member lie (one written by `coload-shard --fast-crop`,
/// or one that came with restart markers): a crop's decode starts at the intervals covering it.
/// Each MCU row is a whole number of intervals; the row starts are recorded and the intervals
/// within a row found from them (a row's few RST markers), so an index holds a number per MCU
/// row, not per interval: tens of bytes a member, also for millions of members.
struct RestartIndex {
  /// MCUs per interval (the JPEG's DRI); 0 for a member without usable restart markers.
  std::uint32_t interval = 0;
  /// Offset, in the member's data, of the first entropy-coded byte of each MCU row.
  std::vector<std::uint32_t> rows;

  bool marked() const noexcept { return interval != 0; }
  friend bool operator==(const RestartIndex&, const RestartIndex&) = default;
};

/// One member of a sample: its field (the extension) and where its data lies in the shard.
struct IndexMember {
  std::string field;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  /// Its restart intervals, for a JPEG that has usable ones (index version 2).
  RestartIndex restarts{};

  friend bool operator==(const IndexMember&, const IndexMember&) = default;
};

/// One WebDataset sample: the run of consecutive members that share a key.
struct IndexSample {
  std::string key;
  /// Its members, a range of ShardIndex::members.
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  /// The bytes from the first member's data to the last member's end: one read covers every
  /// field (the headers and padding between them come along).
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  friend bool operator==(const IndexSample&, const IndexSample&) = default;
};

/// A shard's samples and members, and the shard's size and mtime when indexed.
struct ShardIndex {
  std::string path;
  std::uint64_t file_size = 0;
  std::int64_t mtime_ns = 0;
  /// XXH3-64 of the shard's bytes up to its last sample's end (what a cache entry of it holds),
  /// when the index records one (version 3: Writer's indexes; an index built from the headers
  /// alone has none). A cached copy of the shard is checked against it before it is used.
  std::optional<std::uint64_t> checksum{};
  std::vector<IndexSample> samples;
  std::vector<IndexMember> members;

  friend bool operator==(const ShardIndex&, const ShardIndex&) = default;
};

/// WebDataset's split of a member name into key and field: the key is the path up to the
/// first dot of the base name, the field what follows it, lowercased ("a/b.seg.PNG" gives
/// "a/b" and "seg.png"). Returns false for a name whose base name has no dot, or is empty,
/// and for WebDataset's metadata names (is_metadata_name): such members belong to no sample
/// and are skipped, as webdataset skips them.
bool split_member_name(std::string_view name, std::string& key, std::string& field);

/// Whether `name` is one webdataset skips as metadata: its first path component begins and
/// ends with "__" ("__key__", "__cache__/000001.jpg"; webdataset's `__[^/]*__($|/)`).
bool is_metadata_name(std::string_view name) noexcept;

/// Groups members (in archive order) into samples: consecutive members with the same key
/// form one sample. Throws ShardError when a key repeats a field (webdataset's "duplicate
/// file name").
void group_members(const std::string& shard, const std::vector<TarMember>& members,
                   ShardIndex& index);

/// Builds the index of the shard at `path` by reading its headers only (a read of 512 bytes
/// per member). Throws ShardError for a malformed shard, io-style SystemError when it cannot
/// be opened.
ShardIndex build_index(const std::filesystem::path& path, const TarLimits& limits = {});

/// Where a shard's index file lives: beside it, its name with ".idx" appended.
std::filesystem::path index_path(const std::filesystem::path& shard);

/// The index file's text. Format (UTF-8 text, one record a line, fields separated by tabs;
/// in keys and fields a backslash, tab and newline are written `\\`, `\t` and `\n`):
///
///     coload-shard-index<TAB><version: 3 with a checksum, else 2 when a member has restart
///                              intervals, else 1>
///     <shard size in bytes><TAB><shard mtime in ns since the epoch><TAB><members><TAB><samples>
///         [<TAB>xxh3:<checksum, 16 lowercase hex digits>]          (version 3 only)
///     <offset><TAB><size><TAB><key><TAB><field>        (one line per member, in archive order)
///
/// In versions 2 and 3 a member with restart intervals has a fifth field,
/// `<interval>:<row 0 start>,<row 1 start - row 0 start>,...` (MCUs per interval, then the row
/// starts as differences). The checksum is XXH3-64 of the shard's first `<last sample's end>`
/// bytes, as `head -c END shard.tar | xxhsum -H3` prints it. Each version is written only
/// when its feature is used, so a reader from before it still reads every index without it;
/// versions 1 and 2 are read as before.
/// Samples are not stored: they are the runs of consecutive members with the same key.
std::string format_index(const ShardIndex& index);

/// Parses an index file's text for the shard of `file_size` bytes. Returns false (leaving
/// `out` unspecified) when the text is not a valid index of such a shard: a different
/// version, malformed lines, a member outside the shard. Then `why`, if given, says which line
/// and what is wrong with it.
bool parse_index(std::string_view text, std::uint64_t file_size, ShardIndex& out,
                 std::string* why = nullptr);

/// How an index is found.
struct IndexOptions {
  /// Write a fresh index beside the shard (atomically: a temporary file renamed over it)
  /// when the file there is missing or stale. A folder that cannot be written is not an error.
  bool write = true;
  TarLimits limits{};
};

/// The shard's index: the file beside it when that file matches the shard's size and mtime,
/// otherwise built from the headers (and written, see IndexOptions::write). For a shard named
/// by an http(s) URL, the index file at `<url>.idx` (its size is checked on every read, since
/// a server gives no mtime); io::HttpError naming that URL when it cannot be read.
ShardIndex load_index(const std::filesystem::path& shard, const IndexOptions& options = {});

/// The file, in a folder of shards, that lists them (one file name a line), written by Writer:
/// a folder given by URL is read through it.
inline constexpr std::string_view shard_list_name = "shards.txt";

/// The shards of `root`: the file itself, the `.tar` files of a folder sorted by name, or the
/// names of a brace pattern (`/data/train-{000000..000127}.tar`, see expand_braces).
/// `root` may be a URL: `file://` names a local file or folder (its path percent-decoded); an
/// `http://` or `https://` URL whose path ends in `.tar` names one shard, one holding `{`...`}`
/// a WebDataset brace pattern (`https://host/train-{000000..000127}.tar`), and any other
/// names a folder whose shards `shards.txt` lists. Remote shards are read through their index
/// files (`<shard>.idx`, as Writer writes them). An http(s) URL's query (a token that covers
/// the folder, `?token=...`; not a presigned URL's signature, which covers one object) is
/// carried to each name derived from it: `x.tar.idx?token=...`, and a folder's
/// `shards.txt?token=...` and the shards it lists. Throws InvalidArgument when there are
/// none, and io::HttpError when the list cannot be read.
std::vector<std::string> find_shards(const std::filesystem::path& root);

/// WebDataset's brace expansion: each `{a..b}` (numbers, zero-padded to the width of `a`
/// when `a` has a leading zero or both have the same width) and each `{x,y,z}` multiplies the
/// names; "s-{0..1}-{a,b}" gives s-0-a, s-0-b, s-1-a, s-1-b. Groups do not nest. Throws
/// InvalidArgument naming the pattern for an unclosed brace, a nested one, a '}' that closes
/// none, a range going down, or more than 1,000,000 names.
std::vector<std::string> expand_braces(std::string_view pattern);

}  // namespace coload::shards
