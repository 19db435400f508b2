#pragma once
// pin_memory and device: the device runtime, the pinned pool and the device stage a loader
// builds from its options.

#include <ATen/core/TensorBody.h>

#include <cstddef>
#include <memory>
#include <optional>

#include "coload/device/device.hpp"

namespace asio {
class io_context;
}

namespace coload::detail {

/// What pin_memory and device give a loader; each is empty where its option is off. The
/// loader destroys them in the order stage, pinned, backend, once nothing copies any more.
struct DeviceSetup {
  std::shared_ptr<DeviceBackend> backend;  // pin_memory or device
  std::unique_ptr<PinnedPool> pinned;      // pin_memory or device, with a backend
  std::unique_ptr<DeviceStage> stage;      // device
};

/// The device runtime for `device` (a CUDA device, or the CPU through the host backend) or
/// `backend` when the options give one; a pinned pool sized for `pinned_batches` batches; a
/// device stage on `context` with `device`. pin_memory without CUDA warns once and pins
/// nothing, as PyTorch. Errors name the `device` option.
DeviceSetup setup_device(bool pin_memory, const std::optional<at::Device>& device,
                         std::shared_ptr<DeviceBackend> backend, std::size_t pinned_batches,
                         asio::io_context& context);

}  // namespace coload::detail
