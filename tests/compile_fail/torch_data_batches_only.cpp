// A torch::data dataset whose get_batch(indices) yields a whole batch, with no get(size_t) and
// no mapped source to take one example from, is refused, naming torch::data.
// expect: TorchDataAdapter<Stacked>
// expect: is a torch::data dataset that yields only whole batches, with no example to take from them
#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>

#include "coload/loader/data_loader.hpp"

struct Stacked : torch::data::datasets::BatchDataset<Stacked, torch::data::Example<>> {
  torch::data::Example<> get_batch(c10::ArrayRef<std::size_t> indices) override {
    const auto n = static_cast<std::int64_t>(indices.size());
    return {at::zeros({n, 2}), at::zeros({n})};
  }
  torch::optional<std::size_t> size() const override { return 10; }
};

int main() { auto loader = coload::make_data_loader(Stacked{}, {.batch_size = 2}); }
