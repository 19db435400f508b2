// Precompiled header for the test suites: doctest and the heavy third-party headers.
#include <doctest/doctest.h>
#include <ATen/ATen.h>
#include <asio.hpp>
