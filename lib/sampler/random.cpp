// RandomSampler and make_generator: the seeded generators behind the samplers.

#include "coload/sampler/random.hpp"
#include "coload/core/error.hpp"

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
  if (size_ < 0) {
    throw InvalidArgument("RandomSampler: the dataset size is negative (" +
                          std::to_string(size_) + ")");
  }
  if (num_samples_ <= 0) {
    throw InvalidArgument("num_samples should be a positive integer value, but got num_samples=" +
                          std::to_string(num_samples_));
  }
  if (size_ == 0) {
    // PyTorch fails only when iterated (a ZeroDivisionError, or randint's empty range); the
    // division by zero here would kill the process.
    throw InvalidArgument("RandomSampler: cannot draw num_samples=" + std::to_string(num_samples_) +
                          " from an empty dataset");
  }
}

Generator<Index> RandomSampler::indices() {
  for (std::span<const Index> block : index_blocks()) {
    for (Index i : block) co_yield i;
  }
}

Generator<std::span<const Index>> RandomSampler::index_blocks() {
  at::Generator gen;
  if (generator_) {
    gen = *generator_;
  } else {
    // As PyTorch: a fresh generator per epoch, seeded from the default generator.
    gen = make_generator(detail::draw_seed(std::nullopt));
  }
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto first = [](const at::Tensor& t, std::int64_t count) {
    return std::span<const Index>(t.data_ptr<Index>(), static_cast<std::size_t>(count));
  };
  if (replacement_) {
    for (std::int64_t chunk = 0; chunk < num_samples_ / 32; ++chunk) {
      const auto draw = at::randint(size_, {32}, gen, long_opts);
      co_yield first(draw, 32);
    }
    const std::int64_t rest = num_samples_ % 32;
    const auto draw = at::randint(size_, {rest}, gen, long_opts);
    if (rest > 0) co_yield first(draw, rest);
  } else {
    for (std::int64_t pass = 0; pass < num_samples_ / size_; ++pass) {
      const auto perm = at::randperm(size_, gen, long_opts);
      co_yield first(perm, size_);
    }
    const std::int64_t rest = num_samples_ % size_;
    // NOTE: PyTorch draws a whole permutation for the remainder too; so do we, to stay in step.
    const auto perm = at::randperm(size_, gen, long_opts);
    if (rest > 0) co_yield first(perm, rest);
  }
}

}  // namespace coload
