// SubsetRandomSampler, WeightedRandomSampler and DistributedSampler: PyTorch 1.13's algorithms
// over ATen's generator, randperm and multinomial, so the same seed gives the same indices.

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/sampler/distributed.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/subset_random.hpp"
#include "coload/sampler/weighted_random.hpp"

namespace coload {

namespace {

const at::TensorOptions long_options = at::TensorOptions().dtype(at::kLong);

// The span over a contiguous int64 tensor's elements.
std::span<const Index> span_of(const at::Tensor& t) {
  return {t.data_ptr<Index>(), static_cast<std::size_t>(t.numel())};
}

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

// The int in environment variable `name`, or nullopt when it is unset or empty. Anything but
// a decimal integer (a minus sign allowed) is refused, naming the variable and its value.
std::optional<int> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view value(text);
  int out = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec == std::errc::result_out_of_range) {
    throw InvalidArgument(std::string(name) + "=" + text + " is out of range");
  }
  if (ec != std::errc{} || end != value.data() + value.size()) {
    throw InvalidArgument(std::string(name) + "=" + text + " is not an integer");
  }
  return out;
}

}  // namespace

// ---- SubsetRandomSampler -------------------------------------------------------------------

SubsetRandomSampler::SubsetRandomSampler(std::vector<Index> indices,
                                         std::optional<at::Generator> generator)
    : indices_(std::move(indices)), generator_(std::move(generator)) {}

Generator<Index> SubsetRandomSampler::indices() {
  for (std::span<const Index> block : index_blocks()) {
    for (Index i : block) co_yield i;
  }
}

Generator<std::span<const Index>> SubsetRandomSampler::index_blocks() {
  const auto n = static_cast<std::int64_t>(indices_.size());
  // Drawn even for an empty subset, as PyTorch does, so the stream stays in step.
  const auto perm = generator_ ? at::randperm(n, *generator_, long_options)
                               : at::randperm(n, long_options);
  std::vector<Index> block(indices_.size());
  const Index* order = perm.data_ptr<Index>();
  for (std::size_t k = 0; k < block.size(); ++k) {
    block[k] = indices_[static_cast<std::size_t>(order[k])];
  }
  if (!block.empty()) co_yield std::span<const Index>(block);
}

// ---- WeightedRandomSampler -----------------------------------------------------------------

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

// ---- DistributedSampler --------------------------------------------------------------------

DistributedEnv distributed_env() {
  DistributedEnv env;
  // `name=text`, as the messages quote the variable.
  const auto quoted = [](const char* name) { return std::string(name) + "=" + std::getenv(name); };
  if (const auto world_size = env_int("WORLD_SIZE")) {
    if (*world_size < 1) {
      throw InvalidArgument(quoted("WORLD_SIZE") + " is not a positive integer");
    }
    env.world_size = *world_size;
  }
  // Both ranks lie in [0, WORLD_SIZE): one machine runs at most the whole job.
  const auto rank_of = [&](const char* name) {
    const auto value = env_int(name);
    if (value && (*value < 0 || *value >= env.world_size)) {
      throw InvalidArgument(quoted(name) +
                            " is not in [0, WORLD_SIZE=" + std::to_string(env.world_size) + ")");
    }
    return value.value_or(0);
  };
  env.rank = rank_of("RANK");
  env.local_rank = rank_of("LOCAL_RANK");
  return env;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size,
                                       std::optional<std::int64_t> num_replicas,
                                       std::optional<std::int64_t> rank, bool shuffle,
                                       std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      // PyTorch asks the process group (dist.get_world_size(), dist.get_rank()); coload has
      // none and reads what torchrun exports instead.
      num_replicas_(num_replicas ? *num_replicas : distributed_env().world_size),
      rank_(rank ? *rank : distributed_env().rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (rank_ >= num_replicas_ || rank_ < 0) {
    throw InvalidArgument("Invalid rank " + std::to_string(rank_) +
                          ", rank should be in the interval [0, " +
                          std::to_string(num_replicas_ - 1) + "]");
  }
  if (dataset_size_ < 0) {
    throw InvalidArgument(
        "dataset_size should be a non-negative integer value, but got "
        "dataset_size=" +
        std::to_string(dataset_size_));
  }
  if (drop_last_ && dataset_size_ % num_replicas_ != 0) {
    // math.ceil((len - num_replicas) / num_replicas): the largest multiple that fits.
    num_samples_ = dataset_size_ / num_replicas_;
  } else {
    num_samples_ = (dataset_size_ + num_replicas_ - 1) / num_replicas_;
  }
}

std::vector<Index> DistributedSampler::epoch_indices() const {
  std::vector<Index> all(static_cast<std::size_t>(dataset_size_));
  if (shuffle_) {
    // Deterministic across replicas: seeded with seed + epoch (wrapping, as manual_seed does).
    auto gen = make_generator(seed_ + static_cast<std::uint64_t>(epoch_));
    const auto perm = at::randperm(dataset_size_, gen, long_options);
    std::copy_n(perm.data_ptr<Index>(), all.size(), all.begin());
  } else {
    std::iota(all.begin(), all.end(), Index{0});
  }
  // Position k of the padded (repeated) or cut list is all[k % size]; take this rank's share.
  std::vector<Index> mine(static_cast<std::size_t>(num_samples_));
  for (std::int64_t j = 0; j < num_samples_; ++j) {
    const std::int64_t k = rank_ + j * num_replicas_;
    mine[static_cast<std::size_t>(j)] = all[static_cast<std::size_t>(k % dataset_size_)];
  }
  return mine;
}

Generator<Index> DistributedSampler::indices() {
  for (Index i : epoch_indices()) co_yield i;
}

Generator<std::span<const Index>> DistributedSampler::index_blocks() {
  const std::vector<Index> block = epoch_indices();
  if (!block.empty()) co_yield std::span<const Index>(block);
}

}  // namespace coload
