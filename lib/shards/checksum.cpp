// XXH3-64 from libxxhash, inlined here (its header only, as collate/digest.cpp uses it).

#include "checksum.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <algorithm>
#include <cstdio>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace coload::shards::detail {

struct Checksum::State {
  XXH3_state_t xxh;
};

Checksum::Checksum() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->xxh); }
Checksum::~Checksum() = default;

void Checksum::update(const std::byte* data, std::size_t n) {
  XXH3_64bits_update(&state_->xxh, data, n);
}

std::uint64_t Checksum::digest() const { return XXH3_64bits_digest(&state_->xxh); }

std::optional<std::uint64_t> file_checksum(int fd, std::uint64_t size) {
  Checksum sum;
  std::vector<std::byte> block(std::min<std::uint64_t>(size, 1 << 20));
  for (std::uint64_t at = 0; at < size;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), size - at));
    const ssize_t n = ::pread(fd, block.data(), want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    sum.update(block.data(), static_cast<std::size_t>(n));
    at += static_cast<std::uint64_t>(n);
  }
  return sum.digest();
}

std::optional<std::uint64_t> shard_checksum(const ShardIndex& index) {
  const int fd = ::open(index.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto sum = file_checksum(fd, index.samples.empty() ? 0 : index.samples.back().end);
  ::close(fd);
  return sum;
}

std::string format_checksum(std::uint64_t sum) {
  char text[32];
  std::snprintf(text, sizeof text, "xxh3:%016llx", static_cast<unsigned long long>(sum));
  return text;
}

bool parse_checksum(std::string_view text, std::uint64_t& sum) {
  if (!text.starts_with("xxh3:") || text.size() != 5 + 16) return false;
  for (char c : text.substr(5)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  const auto [end, ec] = std::from_chars(text.data() + 5, text.data() + text.size(), sum, 16);
  return ec == std::errc{} && end == text.data() + text.size();
}

}  // namespace coload::shards::detail
