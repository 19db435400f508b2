// A stateful torch::data dataset (ChunkDataset's kind: get_batch returns an optional batch)
// cannot be sampled by index: refused, naming torch::data and what to write instead.
// expect: TorchDataAdapter<Chunks>
// expect: is a stateful torch::data dataset (its get_batch returns an optional batch, as ChunkDataset's): coload cannot sample indices from it
#include <torch/data/datasets/base.h>

#include "coload/loader/data_loader.hpp"

using Batch = std::vector<torch::data::Example<>>;

struct Chunks : torch::data::datasets::BatchDataset<Chunks, torch::optional<Batch>, std::size_t> {
  torch::optional<Batch> get_batch(std::size_t batch_size) override { return Batch(batch_size); }
  torch::optional<std::size_t> size() const override { return 10; }
};

int main() { auto loader = coload::make_data_loader(Chunks{}, {.batch_size = 2}); }
