#pragma once
// The errors a DataLoader reports, each naming what failed and where: WorkerError and
// LoaderError (core/error.hpp), WorkerDied (exec/errors.hpp), and TimeoutError, the loader's
// own. The whole hierarchy is tabled in core/error.hpp. Also brings in the warning handler.

#include <cstdint>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/exec/errors.hpp"

namespace coload {

/// No batch arrived within `timeout` seconds. The batch stays in flight: waiting again is allowed.
/// Names the batch and, where the loader knows them, the worker fetching it (its id, and its pid
/// for a worker process) and the batch's first indices.
class TimeoutError : public LoaderError {
 public:
  TimeoutError(std::int64_t batch, double seconds, int worker_id = -1, int pid = -1,
               std::vector<std::int64_t> indices = {}, std::int64_t batch_size = 0);
  /// The batch number that was awaited.
  std::int64_t batch() const noexcept { return batch_; }
  /// The seconds waited.
  double seconds() const noexcept { return seconds_; }
  /// The worker fetching the batch, or -1 when none had it (not dispatched yet, queued, or
  /// fetched on the driver or asynchronously).
  int worker_id() const noexcept { return worker_id_; }
  /// That worker's process id (executor = processes), or -1.
  int pid() const noexcept { return pid_; }
  /// The first indices of the batch (at most 8), empty when unknown.
  const std::vector<std::int64_t>& indices() const noexcept { return indices_; }

 private:
  std::int64_t batch_;
  double seconds_;
  int worker_id_;
  int pid_;
  std::vector<std::int64_t> indices_;
};

}  // namespace coload
