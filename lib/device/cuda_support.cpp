// make_cuda_backend() and cuda_available(): what is missing, checked in a fixed order, whether
// or not coload was built with the CUDA Toolkit.

#include <ATen/Context.h>

#include <stdexcept>
#include <string>

#include "coload/config.hpp"
#include "coload/core/error.hpp"
#include "coload/device/backend.hpp"

namespace coload {

#if COLOAD_HAVE_CUDA
namespace detail {
int cuda_device_count(std::string* error) noexcept;  // cuda_backend.cpp
int cuda_current_device() noexcept;                  // cuda_backend.cpp
std::shared_ptr<DeviceBackend> make_cuda_backend_unchecked(int device_index);
}  // namespace detail
#endif

namespace {

// Why make_cuda_backend(device_index) cannot succeed, or an empty string.
std::string cuda_problem(int device_index) {
#if !COLOAD_HAVE_CUDA
  (void)device_index;
  return "coload was built without CUDA support (the CUDA Toolkit was not found at build time; "
         "rebuild with -Dcuda=enabled where it is installed)";
#else
  // NOTE: hasCUDART() is true when libtorch's CUDA library is loaded, device or not; hasCUDA()
  // would also be false on a CUDA build without a device, and name the wrong culprit.
  if (!at::globalContext().hasCUDART()) {
    return "libtorch was built without CUDA: at::hasCUDART() is false (use a CUDA build of "
           "libtorch, with libtorch_cuda linked), so it cannot make CUDA tensors";
  }
  std::string error;
  const int count = detail::cuda_device_count(&error);
  if (count < 0) return "no CUDA device is usable: " + error;
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found none";
  if (device_index < 0 || device_index >= count) {
    return "CUDA device index " + std::to_string(device_index) + " is out of range: the machine has " +
           std::to_string(count) + " CUDA device(s)";
  }
  return {};
#endif
}

}  // namespace

std::shared_ptr<DeviceBackend> make_cuda_backend(int device_index) {
#if COLOAD_HAVE_CUDA
  // -1: the calling thread's current device (under torchrun, the one this rank chose).
  if (device_index < 0 && at::globalContext().hasCUDART()) {
    device_index = detail::cuda_current_device();
  }
#endif
  if (std::string why = cuda_problem(device_index); !why.empty()) {
    throw RuntimeError("make_cuda_backend(" + std::to_string(device_index) + "): " + why);
  }
#if COLOAD_HAVE_CUDA
  return detail::make_cuda_backend_unchecked(device_index);
#else
  return nullptr;  // unreachable: cuda_problem() always names the missing toolkit
#endif
}

bool cuda_available() noexcept {
  try {
    return cuda_problem(0).empty();
  } catch (...) {
    return false;
  }
}

std::string cuda_unavailable_reason() {
  return cuda_problem(0);
}

}  // namespace coload
