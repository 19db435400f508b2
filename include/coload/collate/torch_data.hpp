#pragma once
// default_collate for libtorch's torch::data::Example: a batch of examples is one Example whose
// data and target are the collated data and targets (`batch.data`, `batch.target`), as
// torch::data::transforms::Stack<> makes it.

#include <torch/data/example.h>

#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"

namespace coload {

/// Examples with a target: Example<collated data, collated target>.
template <Collatable Data, Collatable Target>
struct Collate<torch::data::Example<Data, Target>> {
  static torch::data::Example<collated_t<Data>, collated_t<Target>> collate(
      std::vector<torch::data::Example<Data, Target>>&& samples) {
    auto data = detail::column<Data>(samples, [](auto& s) -> auto& { return s.data; });
    auto target = detail::column<Target>(samples, [](auto& s) -> auto& { return s.target; });
    return {Collate<Data>::collate(std::move(data)), Collate<Target>::collate(std::move(target))};
  }
};

/// Examples without a target (torch::data::TensorExample): Example<collated data, NoTarget>.
template <Collatable Data>
struct Collate<torch::data::Example<Data, torch::data::example::NoTarget>> {
  static torch::data::Example<collated_t<Data>, torch::data::example::NoTarget> collate(
      std::vector<torch::data::Example<Data, torch::data::example::NoTarget>>&& samples) {
    auto data = detail::column<Data>(samples, [](auto& s) -> auto& { return s.data; });
    return {Collate<Data>::collate(std::move(data))};
  }
};

}  // namespace coload
