// make_cuda_backend() and cuda_available(): what is missing, checked in a fixed order, whether
// or not coload was built with the CUDA Toolkit. The backend itself is the plugin
// libcoload_cuda.so (cuda_plugin.hpp), loaded here the first time it is needed.

#include <ATen/Context.h>
#include <dlfcn.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "coload/config.hpp"
#include "coload/core/error.hpp"
#include "coload/device/backend.hpp"
#include "cuda_plugin.hpp"

namespace coload {

#if COLOAD_HAVE_CUDA
namespace {

struct LoadedPlugin {
  const detail::CudaPlugin* plugin = nullptr;
  std::string error;  // why `plugin` is null
};

// Loads libcoload_cuda.so from the directory this libcoload was loaded from, once; never unloads
// it (backends and their vtables live there).
LoadedPlugin load_cuda_plugin() {
  std::string path = detail::kCudaPluginFile;
  Dl_info self{};
  if (::dladdr(reinterpret_cast<const void*>(&cuda_unavailable_reason), &self) != 0 && self.dli_fname &&
      std::strchr(self.dli_fname, '/')) {
    const std::string lib = self.dli_fname;
    path = lib.substr(0, lib.rfind('/') + 1) + detail::kCudaPluginFile;
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = ::dlerror();
    return {nullptr, "coload's CUDA backend " + path + " cannot be loaded: " + (e ? e : "dlopen failed")};
  }
  using Entry = const detail::CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, detail::kCudaPluginEntry));
  const detail::CudaPlugin* plugin = entry ? entry() : nullptr;
  if (!plugin) return {nullptr, "coload's CUDA backend " + path + " has no entry point " + detail::kCudaPluginEntry};
  if (std::strcmp(plugin->version, COLOAD_VERSION) != 0) {
    return {nullptr, "coload's CUDA backend " + path + " is version " + plugin->version + ", libcoload " +
                         COLOAD_VERSION};
  }
  return {plugin, {}};
}

const LoadedPlugin& cuda_plugin() {
  static const LoadedPlugin loaded = load_cuda_plugin();
  return loaded;
}

}  // namespace
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
  const LoadedPlugin& loaded = cuda_plugin();
  if (!loaded.plugin) return loaded.error;
  std::string error;
  const int count = loaded.plugin->device_count(&error);
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
  if (device_index < 0 && at::globalContext().hasCUDART() && cuda_plugin().plugin) {
    device_index = cuda_plugin().plugin->current_device();
  }
#endif
  if (std::string why = cuda_problem(device_index); !why.empty()) {
    throw RuntimeError("make_cuda_backend(" + std::to_string(device_index) + "): " + why);
  }
#if COLOAD_HAVE_CUDA
  return cuda_plugin().plugin->make_backend(device_index);
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
