// DistributedSampler and torchrun's environment, as PyTorch 1.13 (same seed, same indices).

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <system_error>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "coload/core/error.hpp"
#include "coload/sampler/distributed.hpp"
#include "coload/sampler/random.hpp"
#include "tensor_span.hpp"

namespace coload {

using detail::long_options;
using detail::span_of;

namespace {

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
  if (num_replicas_ <= 0) {
    throw InvalidArgument("num_replicas should be a positive integer value, but got num_replicas=" +
                          std::to_string(num_replicas_));
  }
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
    // The ceiling, without the overflow of (size + replicas - 1) near INT64_MAX.
    num_samples_ = dataset_size_ / num_replicas_ + (dataset_size_ % num_replicas_ != 0 ? 1 : 0);
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
