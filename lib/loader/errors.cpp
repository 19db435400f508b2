// The loader's own error: TimeoutError.

#include "coload/loader/errors.hpp"

#include <sstream>
#include <string>

namespace coload {

namespace {
std::string format_seconds(double seconds) {
  std::ostringstream s;
  s << seconds;
  return s.str();
}
}  // namespace

TimeoutError::TimeoutError(std::int64_t batch, double seconds)
    : LoaderError("DataLoader timed out after " + format_seconds(seconds) +
                  " seconds waiting for batch " + std::to_string(batch)),
      batch_(batch),
      seconds_(seconds) {}

}  // namespace coload
