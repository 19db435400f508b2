// What SampleContext needs compiled: Rng's torch generator and the log of skipped samples.

#include "coload/dataset/sample_context.hpp"

#include <ATen/ATen.h>

#include <string>

#include "coload/core/warning.hpp"
#include "coload/sampler/random.hpp"

namespace coload {

at::Generator Rng::torch_generator() {
  return make_generator(next_u64());
}

std::int64_t detail::SkipLog::skip(Index index, const std::string& what) {
  const std::int64_t n = count_.fetch_add(1, std::memory_order_relaxed) + 1;
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    first = named_.insert(index).second;
  }
  if (first) detail::warn("skipping sample " + std::to_string(index) + ": " + what, "coload: ");
  return n;
}

}  // namespace coload
