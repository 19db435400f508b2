#include "coload/loader/detail/device_setup.hpp"

#include <asio/io_context.hpp>

#include <exception>
#include <string>

#include "coload/core/warning.hpp"
#include "coload/loader/errors.hpp"

namespace coload::detail {

namespace {
std::shared_ptr<DeviceBackend> backend_for(const at::Device& d) {
  if (d.is_cuda()) {
    try {
      // No index: the thread's current device, as at::Device("cuda") means in libtorch.
      return make_cuda_backend(d.has_index() ? d.index() : -1);
    } catch (const std::exception& e) {
      throw InvalidArgument("device = " + d.str() + ": " + e.what());
    }
  }
  if (d.is_cpu()) return std::make_shared<HostDeviceBackend>();
  throw InvalidArgument("device = " + d.str() +
                        ": coload's device stage copies to CUDA devices (or, through its host "
                        "backend, to the CPU)");
}
}  // namespace

DeviceSetup setup_device(bool pin_memory, const std::optional<at::Device>& device,
                         std::shared_ptr<DeviceBackend> backend, std::size_t pinned_batches,
                         asio::io_context& context) {
  DeviceSetup s;
  if (!pin_memory && !device) return s;
  s.backend = std::move(backend);
  if (!s.backend) {
    if (device) {
      s.backend = backend_for(*device);
    } else if (cuda_available()) {
      s.backend = make_cuda_backend(-1);
    } else {
      // As PyTorch: without an accelerator, pin_memory leaves batches where they are.
      warn_once("pin_memory without CUDA",
                "'pin_memory' argument is set as true but no accelerator is found, then device "
                "pinned memory won't be used (" + cuda_unavailable_reason() + ")");
      return s;
    }
  }
  if (device && s.backend->device().type() != device->type()) {
    throw InvalidArgument("device = " + device->str() + ", but device_backend copies to " +
                          s.backend->device().str());
  }
  s.pinned = std::make_unique<PinnedPool>(s.backend, pinned_batches);
  if (device) s.stage = std::make_unique<DeviceStage>(s.backend, context);
  return s;
}

}  // namespace coload::detail
