// random_split's non-template parts: the split lengths and the slices.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/dataset/random_split.hpp"

namespace coload::detail {
namespace {

// Python's math.isclose(a, b) with its default rel_tol=1e-09 and abs_tol=0.
bool isclose(double a, double b) {
  if (a == b) return true;
  return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
}

// PyTorch's fraction branch: floor each, then hand out the remainder round-robin.
std::vector<std::int64_t> from_fractions(std::int64_t size, std::span<const double> fractions) {
  std::vector<std::int64_t> lengths;
  lengths.reserve(fractions.size());
  for (std::size_t i = 0; i < fractions.size(); ++i) {
    const double frac = fractions[i];
    if (frac < 0 || frac > 1) {
      throw InvalidArgument("Fraction at index " + std::to_string(i) + " is not between 0 and 1");
    }
    lengths.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(size) * frac)));
  }
  std::int64_t remainder = size;
  for (std::int64_t l : lengths) remainder -= l;
  for (std::int64_t i = 0; i < remainder; ++i) {
    lengths[static_cast<std::size_t>(i) % lengths.size()] += 1;
  }
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] == 0) {
      warn("Length of split at index " + std::to_string(i) +
           " is 0. This might result in an empty dataset.");
    }
  }
  return lengths;
}

void check_sum(std::int64_t size, std::span<const std::int64_t> lengths) {
  __int128 sum = 0;  // lengths near INT64_MAX must not wrap around to the size
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) {
      throw InvalidArgument("Length of split at index " + std::to_string(i) + " is negative (" +
                            std::to_string(lengths[i]) + ")");
    }
    sum += lengths[i];
  }
  if (sum != size) {
    throw InvalidArgument("Sum of input lengths does not equal the length of the input dataset!");
  }
}

}  // namespace

std::vector<std::int64_t> split_lengths(std::int64_t size, std::span<const double> lengths) {
  // Python's sum(): left to right from 0.
  double sum = 0;
  for (double l : lengths) sum += l;
  std::vector<std::int64_t> out;
  if (!lengths.empty() && isclose(sum, 1) && sum <= 1) {
    out = from_fractions(size, lengths);
  } else {
    if (sum != static_cast<double>(size)) {
      throw InvalidArgument("Sum of input lengths does not equal the length of the input dataset!");
    }
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] != std::floor(lengths[i])) {
        throw InvalidArgument("Length of split at index " + std::to_string(i) + " (" +
                              std::to_string(lengths[i]) +
                              ") is neither a whole number nor part of fractions summing "
                              "to 1");
      }
      // Past int64's range the cast is undefined (1e19): refused before it. Others are cast,
      // and check_sum words them as it does int lengths.
      if (lengths[i] < -0x1p63) {
        throw InvalidArgument("Length of split at index " + std::to_string(i) +
                              " is negative (" + std::to_string(lengths[i]) + ")");
      }
      if (lengths[i] >= 0x1p63) {
        throw InvalidArgument("Length of split at index " + std::to_string(i) + " (" +
                              std::to_string(lengths[i]) + ") exceeds the dataset's length " +
                              std::to_string(size));
      }
      out.push_back(static_cast<std::int64_t>(lengths[i]));
    }
  }
  check_sum(size, out);
  return out;
}

std::vector<std::int64_t> split_lengths(std::int64_t size, std::span<const std::int64_t> lengths) {
  __int128 sum = 0;
  for (std::int64_t l : lengths) sum += l;
  if (sum == 1) {
    // PyTorch reads any lengths summing to 1 as fractions: [0, 1] means "everything in the
    // second split", whatever the size.
    const std::vector<double> fractions(lengths.begin(), lengths.end());
    return split_lengths(size, std::span<const double>(fractions));
  }
  std::vector<std::int64_t> out(lengths.begin(), lengths.end());
  check_sum(size, out);
  return out;
}

std::vector<std::vector<Index>> split_indices(std::span<const std::int64_t> lengths,
                                              const std::optional<at::Generator>& generator) {
  std::int64_t total = 0;
  for (std::int64_t l : lengths) total += l;
  const auto options = at::TensorOptions().dtype(at::kLong);
  const at::Tensor perm =
      (generator ? at::randperm(total, *generator, options) : at::randperm(total, options))
          .contiguous();
  const Index* p = perm.data_ptr<Index>();
  std::vector<std::vector<Index>> out;
  out.reserve(lengths.size());
  for (std::int64_t l : lengths) {
    out.emplace_back(p, p + l);
    p += l;
  }
  return out;
}

}  // namespace coload::detail
