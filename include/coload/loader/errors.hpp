#pragma once
// The errors a DataLoader reports, each naming what failed and where.

#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>

namespace coload {

/// Base of every error the loader raises while running an epoch.
class LoaderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A sample could not be fetched or a batch collated. Keeps the original exception.
class WorkerError : public LoaderError {
 public:
  WorkerError(std::string what, int worker_id, std::int64_t batch, std::int64_t index,
              std::string original_type, std::string original_message,
              std::exception_ptr original);

  /// The worker that failed, or -1 for the driver (`num_workers = 0`).
  int worker_id() const noexcept { return worker_id_; }
  /// The batch number within the epoch, counted from 0.
  std::int64_t batch() const noexcept { return batch_; }
  /// The sample index that failed, or -1 when the failure was not one sample's (collate).
  std::int64_t index() const noexcept { return index_; }
  /// The demangled type of the original exception.
  const std::string& original_type() const noexcept { return original_type_; }
  /// The original exception's message, unchanged.
  const std::string& original_message() const noexcept { return original_message_; }
  /// The original exception, for `std::rethrow_exception`.
  std::exception_ptr original() const noexcept { return original_; }

 private:
  int worker_id_;
  std::int64_t batch_;
  std::int64_t index_;
  std::string original_type_;
  std::string original_message_;
  std::exception_ptr original_;
};

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

/// Replaces where coload's warnings go (stderr by default); an empty function restores it.
void set_warning_handler(std::function<void(const std::string&)> handler);

namespace detail {
/// Wraps the exception being handled (inside a catch block) as a WorkerError.
WorkerError wrap_current_exception(int worker_id, std::int64_t batch, std::int64_t index,
                                   const char* stage);
/// Emits a warning through the handler.
void warn(const std::string& message);
/// Emits a warning the first time `key` is seen in this process.
void warn_once(const std::string& key, const std::string& message);
/// Forgets which once-only warnings were given (for tests).
void forget_warnings();
/// PyTorch's check that num_workers does not exceed the CPUs this process may use.
void check_worker_number(int num_workers);
}  // namespace detail

}  // namespace coload
