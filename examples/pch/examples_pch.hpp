// Precompiled header for the examples: libtorch's C++ frontend is the slow part.
#include <torch/torch.h>
#include <asio.hpp>
