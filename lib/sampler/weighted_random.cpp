// WeightedRandomSampler: PyTorch 1.13's algorithm over ATen's multinomial (same seed, same indices).

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/sampler/weighted_random.hpp"
#include "tensor_span.hpp"

namespace coload {

using detail::long_options;
using detail::span_of;

namespace {

void check_num_samples(std::int64_t num_samples) {
  if (num_samples <= 0) {
    throw InvalidArgument("num_samples should be a positive integer value, but got num_samples=" +
                          std::to_string(num_samples));
  }
}

// A shape as Python prints a tuple: (), (5,), (2, 3).
std::string tuple_of(at::IntArrayRef shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}


}  // namespace

WeightedRandomSampler::WeightedRandomSampler(const std::vector<double>& weights,
                                             std::int64_t num_samples, bool replacement,
                                             std::optional<at::Generator> generator)
    : num_samples_(num_samples), replacement_(replacement), generator_(std::move(generator)) {
  check_num_samples(num_samples);
  weights_ = at::empty({static_cast<std::int64_t>(weights.size())}, at::kDouble);
  std::copy(weights.begin(), weights.end(), weights_.data_ptr<double>());
}

WeightedRandomSampler::WeightedRandomSampler(const at::Tensor& weights, std::int64_t num_samples,
                                             bool replacement,
                                             std::optional<at::Generator> generator)
    : num_samples_(num_samples), replacement_(replacement), generator_(std::move(generator)) {
  check_num_samples(num_samples);
  weights_ = weights.to(at::kCPU, at::kDouble);
  if (weights_.dim() != 1) {
    throw InvalidArgument("weights should be a 1d sequence but given weights have shape " +
                          tuple_of(weights_.sizes()));
  }
}

Generator<Index> WeightedRandomSampler::indices() {
  for (std::span<const Index> block : index_blocks()) {
    for (Index i : block) co_yield i;
  }
}

Generator<std::span<const Index>> WeightedRandomSampler::index_blocks() {
  const auto draw = (generator_ ? at::multinomial(weights_, num_samples_, replacement_, *generator_)
                                : at::multinomial(weights_, num_samples_, replacement_))
                        .contiguous();
  co_yield span_of(draw);
}

}  // namespace coload
