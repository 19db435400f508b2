#pragma once
// The device module in one include: backends, the pinned pool, pinning, the device stage.

#include "coload/device/backend.hpp"
#include "coload/device/pin.hpp"
#include "coload/device/pinned_pool.hpp"
#include "coload/device/stage.hpp"
#include "coload/device/tensor_map.hpp"
