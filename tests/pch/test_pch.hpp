#include <ATen/ATen.h>
#include <asio.hpp>
