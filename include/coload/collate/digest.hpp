#pragma once
// Digest: a fast 64-bit hash of a batch's bytes, to compare runs batch by batch.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace coload {

/// Hashes bytes with XXH3 (not cryptographic), each add() seeded with the digest so far, so
/// the order of the parts counts: equal bytes given in the same parts give equal digests on
/// any machine of the same byte order. Feed tensors with add(); value() gives the digest so
/// far.
// NOTE: XXH3 (libxxhash, inlined into lib/collate/digest.cpp, so users need neither its header
// nor a library) replaced a hand-written multiply-xorshift loop: a 64 MiB hash runs at 21 GB/s
// against 5 (best of 15, one core). Digests are compared between runs, never stored, so their
// values were free to change with it.
class Digest {
 public:
  explicit Digest(std::uint64_t seed = 0) noexcept;

  Digest& add(const void* data, std::size_t n) noexcept;
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
  std::uint64_t state_;
};

}  // namespace coload
