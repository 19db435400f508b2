#pragma once
// What the shards tests share: a temporary folder, whole-file reads and writes, and archives
// built block by block.

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coload/shards/tar.hpp"

namespace shards_test {

/// A fresh folder under the build's temporary directory, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coload-shards-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline std::span<const std::byte> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& p, std::span<const std::byte> data) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

/// A pax record, "LEN key=value\n", LEN counting its own digits.
inline std::string pax_record(const std::string& key, const std::string& value) {
  const std::string body = " " + key + "=" + value + "\n";
  std::size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}

/// Writes the checksum of the header block at `h` anew, after a field of it was changed.
inline void fix_checksum(std::vector<std::byte>& tar, std::size_t h) {
  std::memset(&tar[h + 148], ' ', 8);
  unsigned sum = 0;
  for (std::size_t i = 0; i < 512; ++i) sum += static_cast<unsigned char>(tar[h + i]);
  char chk[8];
  std::snprintf(chk, sizeof chk, "%06o", sum);
  std::memcpy(&tar[h + 148], chk, 7);
}

/// Appends a header block of `type` ('0', 'x', 'g', 'L') for `name` (at most 100 bytes)
/// announcing `size` bytes, its checksum made right.
inline void append_typed_header(std::vector<std::byte>& tar, const std::string& name,
                                std::uint64_t size, char type) {
  coload::shards::append_tar_header(tar, name, size);
  const std::size_t h = tar.size() - 512;
  tar[h + 156] = static_cast<std::byte>(type);
  fix_checksum(tar, h);
}

/// Appends `data`, padded to a whole block.
inline void append_padded(std::vector<std::byte>& tar, std::string_view data) {
  tar.insert(tar.end(), bytes_of(data).begin(), bytes_of(data).end());
  tar.resize((tar.size() + 511) / 512 * 512);
}

/// A one-member archive whose member's pax header (its path and size) is followed by a pax
/// global header of two blocks, then by the member's own header (another name, size 0), as
/// tarfile reads it: the member is `path`, `data`.
inline std::vector<std::byte> pax_global_between(const std::string& path, std::string_view data) {
  std::vector<std::byte> tar;
  const std::string x = pax_record("path", path) + pax_record("size", std::to_string(data.size()));
  append_typed_header(tar, "././@PaxHeader", x.size(), 'x');
  append_padded(tar, x);
  const std::string g = pax_record("comment", std::string(600, 'c'));
  append_typed_header(tar, "pax_global_header", g.size(), 'g');
  append_padded(tar, g);
  append_typed_header(tar, "short-name.bin", 0, '0');
  append_padded(tar, data);
  tar.resize(tar.size() + 1024);  // the end blocks
  return tar;
}

}  // namespace shards_test
