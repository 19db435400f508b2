#pragma once
// Index: the position of a sample in a map-style dataset.

#include <cstdint>

namespace coload {

/// The index of a sample in a map-style dataset.
using Index = std::int64_t;

}  // namespace coload
