#include "coload/sampler/random.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

namespace coload {

at::Generator make_generator(std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return gen;
}

std::uint64_t detail::draw_seed(const std::optional<at::Generator>& gen) {
  auto t = at::empty({}, at::kLong);
  if (gen) {
    t.random_(*gen);
  } else {
    t.random_();
  }
  return static_cast<std::uint64_t>(t.item<std::int64_t>());
}

RandomSampler::RandomSampler(std::int64_t size, bool replacement,
                             std::optional<std::int64_t> num_samples,
                             std::optional<at::Generator> generator)
    : size_(size),
      replacement_(replacement),
      num_samples_(num_samples.value_or(size)),
      generator_(std::move(generator)) {
  if (num_samples_ <= 0) {
    throw std::invalid_argument(
        "num_samples should be a positive integer value, but got num_samples=" +
        std::to_string(num_samples_));
  }
}

namespace {
// Yields every element of a 1-D int64 tensor, or its first `count`.
Generator<Index> yield_all(at::Tensor t, std::int64_t count) {
  const Index* p = t.data_ptr<Index>();
  for (std::int64_t i = 0; i < count; ++i) co_yield Index{p[i]};
}
}  // namespace

Generator<Index> RandomSampler::indices() {
  at::Generator gen;
  if (generator_) {
    gen = *generator_;
  } else {
    // As PyTorch: a fresh generator per epoch, seeded from the default generator.
    gen = make_generator(detail::draw_seed(std::nullopt));
  }
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  if (replacement_) {
    for (std::int64_t chunk = 0; chunk < num_samples_ / 32; ++chunk) {
      for (Index i : yield_all(at::randint(size_, {32}, gen, long_opts), 32)) co_yield i;
    }
    const std::int64_t rest = num_samples_ % 32;
    for (Index i : yield_all(at::randint(size_, {rest}, gen, long_opts), rest)) co_yield i;
  } else {
    for (std::int64_t pass = 0; pass < num_samples_ / size_; ++pass) {
      for (Index i : yield_all(at::randperm(size_, gen, long_opts), size_)) co_yield i;
    }
    const std::int64_t rest = num_samples_ % size_;
    // NOTE: PyTorch draws a whole permutation for the remainder too; so do we, to stay in step.
    for (Index i : yield_all(at::randperm(size_, gen, long_opts), rest)) co_yield i;
  }
}

}  // namespace coload
