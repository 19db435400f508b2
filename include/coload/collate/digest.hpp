#pragma once
// Digest: a fast 64-bit hash of a batch's bytes, to compare runs batch by batch.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>

namespace coload {

/// Hashes bytes eight at a time (a multiply-xorshift mix; not cryptographic): equal bytes give
/// equal digests on any machine of the same byte order. Feed tensors with add(); value()
/// gives the digest so far.
class Digest {
 public:
  explicit Digest(std::uint64_t seed = 0) noexcept : state_(mix(seed ^ 0x6a09e667f3bcc909ULL)) {}

  Digest& add(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    std::uint64_t a = state_, b = state_ ^ 0x9e3779b97f4a7c15ULL;
    for (; i + 16 <= n; i += 16) {
      std::uint64_t x, y;
      std::memcpy(&x, p + i, 8);
      std::memcpy(&y, p + i + 8, 8);
      a = (a ^ x) * 0xbf58476d1ce4e5b9ULL;
      b = (b ^ y) * 0x94d049bb133111ebULL;
      a ^= a >> 29;
      b ^= b >> 31;
    }
    if (i + 8 <= n) {
      std::uint64_t x;
      std::memcpy(&x, p + i, 8);
      a = (a ^ x) * 0xbf58476d1ce4e5b9ULL;
      a ^= a >> 29;
      i += 8;
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);  // fewer than 8 bytes
    state_ = mix(a ^ mix(b ^ tail) ^ n);
    return *this;
  }
  Digest& add(std::uint64_t v) noexcept { return add(&v, sizeof v); }
  /// A tensor's shape, dtype and elements (in logical order, whatever its strides).
  Digest& add(const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    add(static_cast<std::uint64_t>(c.scalar_type()));
    for (auto s : c.sizes()) add(static_cast<std::uint64_t>(s));
    return add(c.data_ptr(), c.nbytes());
  }

  std::uint64_t value() const noexcept { return state_; }

 private:
  static std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

}  // namespace coload
