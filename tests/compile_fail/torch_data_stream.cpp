// A torch::data stream (StreamDataset: get_batch takes a batch size, not indices) cannot be
// sampled by index: refused, naming torch::data and what to write instead.
// expect: TorchDataAdapter<Numbers>
// expect: is a torch::data stream (its get_batch takes a batch size, not indices, as StreamDataset's): coload cannot sample indices from it
#include <torch/data/datasets/base.h>

#include "coload/loader/data_loader.hpp"

struct Numbers : torch::data::datasets::StreamDataset<Numbers> {
  std::vector<torch::data::Example<>> get_batch(std::size_t batch_size) override {
    return std::vector<torch::data::Example<>>(batch_size);
  }
  torch::optional<std::size_t> size() const override { return 10; }
};

int main() { auto loader = coload::make_data_loader(Numbers{}, {.batch_size = 2}); }
