// coload::Error's shared errors: WorkerError and the wrapping of a caught exception.

#include "coload/core/error.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <utility>

namespace coload {

WorkerError::WorkerError(std::string what, int worker_id, std::int64_t batch, std::int64_t index,
                         std::string original_type, std::string original_message,
                         std::exception_ptr original, int pid)
    : LoaderError(std::move(what)),
      worker_id_(worker_id),
      batch_(batch),
      index_(index),
      original_type_(std::move(original_type)),
      original_message_(std::move(original_message)),
      original_(std::move(original)),
      pid_(pid) {}

namespace detail {

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = (status == 0 && out) ? out : name;
  std::free(out);
  return result;
}

WorkerError wrap_current_exception(int worker_id, std::int64_t batch, std::int64_t index,
                                   const char* stage) {
  std::exception_ptr original = std::current_exception();
  std::string type = "unknown exception";
  std::string message;
  try {
    throw;
  } catch (const WorkerError& e) {
    // Already wrapped further down (a nested fetch): keep the innermost context.
    return e;
  } catch (const std::exception& e) {
    const auto* ours = dynamic_cast<const Error*>(&e);
    type = demangle(ours ? ours->reported_type().name() : typeid(e).name());
    message = e.what();
  } catch (...) {
  }
  std::string where = worker_id >= 0 ? "DataLoader worker " + std::to_string(worker_id)
                                     : std::string("the DataLoader driver (num_workers = 0)");
  std::string what = "Caught " + type + " in " + where + " while " + stage;
  if (index >= 0) what += " sample " + std::to_string(index) + " of";
  if (batch >= 0 || index >= 0) what += " batch " + std::to_string(batch);  // -1: no batch
  what += ": " + message;
  return WorkerError(std::move(what), worker_id, batch, index, std::move(type), std::move(message),
                     std::move(original));
}

}  // namespace detail
}  // namespace coload
