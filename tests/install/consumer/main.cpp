// A consumer of an installed coload (tests/install): loads a TensorDataset through
// make_data_loader with two worker threads and checks every value it receives. Exits non-zero
// on a wrong batch. Built three ways: CMake's find_package, pkg-config, a Meson subproject.

#include <coload/coload.hpp>
#include <torch/torch.h>

#include <cstdio>

int main() try {
  // x = [[0, 1], [2, 3], ... [18, 19]], y = 0..9: row i of x is {2i, 2i + 1}.
  const torch::Tensor x = torch::arange(20, torch::kFloat).reshape({10, 2});
  const torch::Tensor y = torch::arange(10, torch::kLong);
  auto loader = coload::make_data_loader(coload::TensorDataset{x, y},
                                         {.batch_size = 4, .num_workers = 2});
  std::int64_t next = 0;
  int batches = 0;
  for (auto& batch : loader) {
    const std::int64_t n = batch[1].size(0);
    const torch::Tensor want_y = torch::arange(next, next + n, torch::kLong);
    const torch::Tensor want_x = torch::arange(2 * next, 2 * (next + n), torch::kFloat).reshape({n, 2});
    if (!torch::equal(batch[1], want_y) || !torch::equal(batch[0], want_x)) {
      std::fprintf(stderr, "consumer: batch %d is wrong (first label %lld, expected %lld)\n", batches,
                   static_cast<long long>(batch[1][0].item<std::int64_t>()), static_cast<long long>(next));
      return 1;
    }
    next += n;
    ++batches;
  }
  if (next != 10 || batches != 3) {
    std::fprintf(stderr, "consumer: %d batches with %lld samples, expected 3 with 10\n", batches,
                 static_cast<long long>(next));
    return 1;
  }
  std::printf("consumer: 3 batches, 10 samples, values as expected\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
