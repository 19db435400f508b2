// Digest's hashing: XXH3 from libxxhash, inlined here (its header only: nothing to link).
#include "coload/collate/digest.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace coload {

Digest::Digest(std::uint64_t seed) noexcept
    : state_(XXH3_64bits_withSeed(nullptr, 0, seed ^ 0x6a09e667f3bcc909ULL)) {}

Digest& Digest::add(const void* data, std::size_t n) noexcept {
  state_ = XXH3_64bits_withSeed(data, n, state_);
  return *this;
}

}  // namespace coload
