#pragma once
// The errors a DataLoader reports, each naming what failed and where.

#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

/// A worker process died (killed by a signal, or exited) while it had a batch to fetch.
class WorkerDied : public LoaderError {
 public:
  WorkerDied(std::string what, int worker_id, int pid, int signal, int exit_code,
             std::int64_t batch, std::vector<std::int64_t> indices)
      : LoaderError(std::move(what)),
        worker_id_(worker_id),
        pid_(pid),
        signal_(signal),
        exit_code_(exit_code),
        batch_(batch),
        indices_(std::move(indices)) {}
  /// The worker's id.
  int worker_id() const noexcept { return worker_id_; }
  /// The worker's process id.
  int pid() const noexcept { return pid_; }
  /// The signal that killed it, or 0 when it exited.
  int signal() const noexcept { return signal_; }
  /// Its exit status when it exited, or -1 when a signal killed it.
  int exit_code() const noexcept { return exit_code_; }
  /// The batch number it was fetching.
  std::int64_t batch() const noexcept { return batch_; }
  /// The indices of that batch (empty for an iterable dataset's batch).
  const std::vector<std::int64_t>& indices() const noexcept { return indices_; }

 private:
  int worker_id_;
  int pid_;
  int signal_;
  int exit_code_;
  std::int64_t batch_;
  std::vector<std::int64_t> indices_;
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
