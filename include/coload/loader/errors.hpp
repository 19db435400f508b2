#pragma once
// The errors a DataLoader reports, each naming what failed and where: WorkerError and
// LoaderError (core/error.hpp), WorkerDied (exec/errors.hpp), and TimeoutError, the loader's
// own. The whole hierarchy is tabled in core/error.hpp. Also brings in the warning handler.

#include <cstdint>

#include "coload/core/error.hpp"
#include "coload/core/warning.hpp"
#include "coload/exec/errors.hpp"

namespace coload {

/// No batch arrived within `timeout` seconds. The batch stays in flight: waiting again is allowed.
class TimeoutError : public LoaderError {
 public:
  TimeoutError(std::int64_t batch, double seconds);
  /// The batch number that was awaited.
  std::int64_t batch() const noexcept { return batch_; }
  /// The seconds waited.
  double seconds() const noexcept { return seconds_; }

 private:
  std::int64_t batch_;
  double seconds_;
};

}  // namespace coload
