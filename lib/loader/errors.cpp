// The loader's own error: TimeoutError, naming the batch and who was fetching it.

#include "coload/loader/errors.hpp"

#include <sstream>
#include <string>
#include <utility>

namespace coload {

namespace {
std::string format_seconds(double seconds) {
  std::ostringstream s;
  s << seconds;
  return s.str();
}

std::string describe(std::int64_t batch, double seconds, int worker, int pid,
                     const std::vector<std::int64_t>& indices, std::int64_t batch_size) {
  std::string s = "DataLoader timed out after " + format_seconds(seconds) +
                  " seconds waiting for batch " + std::to_string(batch);
  if (worker >= 0) {
    s += " from worker " + std::to_string(worker);
    if (pid > 0) s += " (pid " + std::to_string(pid) + ")";
  }
  if (!indices.empty()) {
    s += worker >= 0 ? ", fetching indices " : " (indices ";
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(indices[i]);
    }
    if (batch_size > static_cast<std::int64_t>(indices.size())) {
      s += ", ... (" + std::to_string(batch_size) + " in all)";
    }
    if (worker < 0) s += ")";
  }
  return s;
}
}  // namespace

TimeoutError::TimeoutError(std::int64_t batch, double seconds, int worker_id, int pid,
                           std::vector<std::int64_t> indices, std::int64_t batch_size)
    : LoaderError(describe(batch, seconds, worker_id, pid, indices, batch_size)),
      batch_(batch),
      seconds_(seconds),
      worker_id_(worker_id),
      pid_(pid),
      indices_(std::move(indices)) {}

}  // namespace coload
