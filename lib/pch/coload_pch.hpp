// Precompiled header for the library: the heavy third-party headers only.
#include <ATen/ATen.h>
#include <asio.hpp>
