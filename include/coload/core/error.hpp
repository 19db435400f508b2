#pragma once
// coload::Error, the base of every error coload throws, and the errors every stage shares.
//
// `catch (const coload::Error&)` catches anything coload raises. Error is a mixin, not a
// std::exception: each concrete error derives from exactly one standard exception type (the
// one PyTorch's Python error maps to: ValueError -> std::invalid_argument, IndexError ->
// std::out_of_range, RuntimeError/OSError -> std::runtime_error/std::system_error) and from
// Error, and its single `what()` override serves both bases. So `catch (const
// std::exception&)` stays unambiguous, and code that catches the standard type keeps working.
//
// clang-format off
// | error                | standard base         | defined in        | thrown by                  |
// |----------------------|-----------------------|-------------------|----------------------------|
// | InvalidArgument      | std::invalid_argument | core/error.hpp    | option and argument checks |
// | OutOfRange           | std::out_of_range     | core/error.hpp    | an index outside a dataset |
// | LogicError           | std::logic_error      | core/error.hpp    | a call the state forbids   |
// | RuntimeError         | std::runtime_error    | core/error.hpp    | failures with no own type  |
// | SystemError          | std::system_error     | core/error.hpp    | failed calls outside io    |
// | LoaderError          | std::runtime_error    | core/error.hpp    | (base of the four below)   |
// | WorkerError          | LoaderError           | core/error.hpp    | loader, exec: a sample or  |
// |                      |                       |                   | batch failed (wraps it)    |
// | TimeoutError         | LoaderError           | loader/errors.hpp | loader: no batch in time   |
// | WorkerDied           | LoaderError           | exec/errors.hpp   | exec: a worker died        |
// | BatchLost            | LoaderError           | exec/errors.hpp   | exec: a batch lost with it |
// | EmptyBatch           | std::runtime_error    | dataset/sample_.. | datasets: all skipped      |
// | SampleError          | std::runtime_error    | dataset/sample_.. | datasets: names the sample |
// | wire::FormatError    | std::runtime_error    | collate/wire.hpp  | collate: the wire format   |
// | wire::RegionTooSmall | wire::FormatError     | collate/wire.hpp  | collate: region too small  |
// | io::IoError          | std::system_error     | io/errors.hpp     | io: open, stat, read       |
// | vision::DecodeError  | std::runtime_error    | vision/decode.hpp | vision: undecodable image  |
// | vision::Decompress.. | vision::DecodeError   | vision/decode.hpp | vision: over max pixels    |
// | vision::FolderError  | std::runtime_error    | vision/folder.hpp | vision: folder indexing    |
// clang-format on
//
// InvalidArgument: LoaderOptions, samplers, datasets, transforms, decode options, the device
// stage, LoaderState::parse/load. OutOfRange: Subset, ConcatDataset, ImageFolder. LogicError:
// DataLoader, the host device backend. RuntimeError: MNIST files, collate mismatches, the CUDA
// backend, ImagePipeline. SystemError: saving and loading a LoaderState, ImagePipeline's slabs.
// BatchLost, EmptyBatch: the loader catches them and leaves the batch out; SampleError: the
// loader wraps it as a WorkerError naming the sample (dataset/sample_context.hpp).
//
// Not coload's own: std::bad_alloc (memory exhaustion, wherever it happens) and whatever a
// user's dataset, sampler or collate throws, which reaches the caller wrapped as WorkerError.

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <typeinfo>

namespace coload {

/// The base of every error coload throws. Not a std::exception itself: each concrete error
/// also derives from one standard exception type, whose `what()` it returns.
class Error {
 public:
  virtual ~Error() = default;
  /// The message, the same as the standard base's `what()`.
  virtual const char* what() const noexcept = 0;
  /// The type a WorkerError names when this error is raised inside a worker ("Caught <type>"):
  /// the error's own type, or for the generic errors below their standard type, so that
  /// messages read as they did before those types existed.
  virtual const std::type_info& reported_type() const noexcept { return typeid(*this); }

 protected:
  Error() = default;
  Error(const Error&) = default;
  Error& operator=(const Error&) = default;
};

/// An argument or option with a value coload refuses (PyTorch's ValueError).
class InvalidArgument : public std::invalid_argument, public Error {
 public:
  using std::invalid_argument::invalid_argument;
  const char* what() const noexcept override { return std::invalid_argument::what(); }
  const std::type_info& reported_type() const noexcept override {
    return typeid(std::invalid_argument);
  }
};

/// An index outside a dataset (PyTorch's IndexError).
class OutOfRange : public std::out_of_range, public Error {
 public:
  using std::out_of_range::out_of_range;
  const char* what() const noexcept override { return std::out_of_range::what(); }
  const std::type_info& reported_type() const noexcept override {
    return typeid(std::out_of_range);
  }
};

/// A call that the object's current state does not allow.
class LogicError : public std::logic_error, public Error {
 public:
  using std::logic_error::logic_error;
  const char* what() const noexcept override { return std::logic_error::what(); }
  const std::type_info& reported_type() const noexcept override { return typeid(std::logic_error); }
};

/// A failure at run time that has no error type of its own (PyTorch's RuntimeError).
class RuntimeError : public std::runtime_error, public Error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
  const std::type_info& reported_type() const noexcept override {
    return typeid(std::runtime_error);
  }
};

/// A failed system call outside the io module; `code()` holds the errno value.
class SystemError : public std::system_error, public Error {
 public:
  using std::system_error::system_error;
  const char* what() const noexcept override { return std::system_error::what(); }
  const std::type_info& reported_type() const noexcept override {
    return typeid(std::system_error);
  }
};

/// Base of every error the loader raises while running an epoch.
class LoaderError : public std::runtime_error, public Error {
 public:
  using std::runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// A sample could not be fetched or a batch collated. Keeps the original exception's type
/// and message, and the exception itself where it was raised in this process.
class WorkerError : public LoaderError {
 public:
  WorkerError(std::string what, int worker_id, std::int64_t batch, std::int64_t index,
              std::string original_type, std::string original_message, std::exception_ptr original,
              int pid = -1);

  /// The worker that failed, or -1 for the driver (`num_workers = 0`).
  int worker_id() const noexcept { return worker_id_; }
  /// The worker's process id (executor = processes), or -1 for a thread or the driver.
  int pid() const noexcept { return pid_; }
  /// The batch number within the epoch, counted from 0.
  std::int64_t batch() const noexcept { return batch_; }
  /// The sample index that failed, or -1 when the failure was not one sample's (collate).
  std::int64_t index() const noexcept { return index_; }
  /// The demangled type of the original exception.
  const std::string& original_type() const noexcept { return original_type_; }
  /// The original exception's message, unchanged.
  const std::string& original_message() const noexcept { return original_message_; }
  /// The original exception, for `std::rethrow_exception`. Null when it was raised in a worker
  /// process: an exception object cannot cross the process boundary, so only its type name
  /// (original_type) and message (original_message) come back.
  std::exception_ptr original() const noexcept { return original_; }

 private:
  int worker_id_;
  std::int64_t batch_;
  std::int64_t index_;
  std::string original_type_;
  std::string original_message_;
  std::exception_ptr original_;
  int pid_;
};

namespace detail {
/// Wraps the exception being handled (inside a catch block) as a WorkerError.
WorkerError wrap_current_exception(int worker_id, std::int64_t batch, std::int64_t index,
                                   const char* stage);
/// The readable form of a mangled type name (`typeid(T).name()`); the name itself when it
/// cannot be demangled.
std::string demangle(const char* name);
}  // namespace detail

}  // namespace coload
