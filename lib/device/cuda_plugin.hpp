#pragma once
// The seam between libcoload and its CUDA backend, which is a plugin of its own
// (libcoload_cuda.so, installed beside libcoload): libcoload loads it with dlopen() the first time
// a CUDA backend is asked for, so a CPU program never needs the CUDA runtime, and only the plugin
// names libcudart. Private to lib/: the public API is make_cuda_backend() and cuda_available().

#include <memory>
#include <string>

#include "coload/device/backend.hpp"

namespace coload::detail {

/// File name of the plugin, looked up beside the libcoload that loads it.
inline constexpr const char* kCudaPluginFile = "libcoload_cuda.so";
/// The plugin's entry point: an extern "C" function returning a CudaPlugin.
inline constexpr const char* kCudaPluginEntry = "coload_cuda_plugin";

/// What the plugin offers. Both sides are built from the same sources by the same compiler, so
/// C++ types cross the seam; `version` refuses a plugin left over from another coload build.
struct CudaPlugin {
  const char* version;  // COLOAD_VERSION of the plugin's build
  /// cudaGetDeviceCount(), or -1 with the runtime's error in *error.
  int (*device_count)(std::string* error) noexcept;
  /// The calling thread's current device (0 when the runtime cannot say).
  int (*current_device)() noexcept;
  /// A backend for a device already checked to exist.
  std::shared_ptr<DeviceBackend> (*make_backend)(int device_index);
};

}  // namespace coload::detail

extern "C" const coload::detail::CudaPlugin* coload_cuda_plugin();
