#pragma once
// Small integer helpers that several stages share.

#include <cstddef>

namespace coload::detail {

/// `n` rounded up to a multiple of `to` (`to` > 0).
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

}  // namespace coload::detail
