#include <cxxabi.h>
#include <pthread.h>
#include <sched.h>

#include <asio/executor_work_guard.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <typeinfo>

#include "coload/loader/driver.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"

namespace coload {

namespace {

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = (status == 0 && out) ? out : name;
  std::free(out);
  return result;
}

std::string format_seconds(double seconds) {
  std::ostringstream s;
  s << seconds;
  return s.str();
}

std::mutex& warning_mutex() {
  static std::mutex m;
  return m;
}
std::function<void(const std::string&)>& warning_handler() {
  static std::function<void(const std::string&)> handler;
  return handler;
}

}  // namespace

WorkerError::WorkerError(std::string what, int worker_id, std::int64_t batch, std::int64_t index,
                         std::string original_type, std::string original_message,
                         std::exception_ptr original)
    : LoaderError(std::move(what)),
      worker_id_(worker_id),
      batch_(batch),
      index_(index),
      original_type_(std::move(original_type)),
      original_message_(std::move(original_message)),
      original_(std::move(original)) {}

TimeoutError::TimeoutError(std::int64_t batch, double seconds)
    : LoaderError("DataLoader timed out after " + format_seconds(seconds) +
                  " seconds waiting for batch " + std::to_string(batch)),
      batch_(batch),
      seconds_(seconds) {}

void set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard lock(warning_mutex());
  warning_handler() = std::move(handler);
}

namespace detail {

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
    type = demangle(typeid(e).name());
    message = e.what();
  } catch (...) {
  }
  std::string where = worker_id >= 0 ? "DataLoader worker " + std::to_string(worker_id)
                                     : std::string("the DataLoader driver (num_workers = 0)");
  std::string what = "Caught " + type + " in " + where + " while " + stage;
  if (index >= 0) what += " sample " + std::to_string(index) + " of";
  what += " batch " + std::to_string(batch) + ": " + message;
  return WorkerError(std::move(what), worker_id, batch, index, std::move(type),
                     std::move(message), std::move(original));
}

void warn(const std::string& message) {
  std::lock_guard lock(warning_mutex());
  if (warning_handler()) {
    warning_handler()(message);
  } else {
    std::cerr << "coload warning: " << message << std::endl;
  }
}

namespace {
std::mutex seen_mutex;
std::set<std::string> seen_warnings;
}  // namespace

void warn_once(const std::string& key, const std::string& message) {
  {
    std::lock_guard lock(seen_mutex);
    if (!seen_warnings.insert(key).second) return;
  }
  warn(message);
}

void forget_warnings() {
  std::lock_guard lock(seen_mutex);
  seen_warnings.clear();
}

void check_worker_number(int num_workers) {
  if (num_workers <= 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  int suggested = 0;
  bool cpuset_checked = false;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    suggested = CPU_COUNT(&set);
    cpuset_checked = true;
  } else {
    suggested = static_cast<int>(std::thread::hardware_concurrency());
  }
  if (suggested <= 0 || num_workers <= suggested) return;
  warn_once("worker-number",
            "This DataLoader will create " + std::to_string(num_workers) +
                " worker processes in total. Our suggested max number of worker in current "
                "system is " +
                std::to_string(suggested) +
                (cpuset_checked ? "" : " (`cpuset` is not taken into account)") +
                ", which is smaller than what this DataLoader is going to create. Please be "
                "aware that excessive worker creation might get DataLoader running slow or even "
                "freeze, lower the worker number to avoid potential slowness/freeze if "
                "necessary.");
}

void validate_options(std::optional<std::int64_t> batch_size, bool shuffle, bool has_sampler,
                      bool has_batch_sampler, int num_workers, bool drop_last, double timeout,
                      std::optional<int> prefetch_factor, bool persistent_workers,
                      LoaderKind kind) {
  if (num_workers < 0) {
    throw std::invalid_argument(
        "num_workers option should be non-negative; use num_workers=0 to disable "
        "multiprocessing.");
  }
  if (timeout < 0) throw std::invalid_argument("timeout option should be non-negative");
  if (num_workers == 0 && prefetch_factor) {
    throw std::invalid_argument(
        "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
        "to enable multiprocessing.");
  }
  if (prefetch_factor && *prefetch_factor <= 0) {
    throw std::invalid_argument("prefetch_factor option should be positive, but got " +
                                std::to_string(*prefetch_factor));
  }
  if (persistent_workers && num_workers == 0) {
    throw std::invalid_argument("persistent_workers option needs num_workers > 0");
  }
  if (kind.iterable) {
    // NOTE: PyTorch prints the offending value; a C++ sampler has no repr, so its type stays
    // unnamed and shuffle prints as Python's True.
    if (shuffle) {
      throw std::invalid_argument(
          "DataLoader with IterableDataset: expected unspecified shuffle option, but got "
          "shuffle=True");
    }
    if (has_sampler) {
      throw std::invalid_argument(
          "DataLoader with IterableDataset: expected unspecified sampler option, but got "
          "sampler=<sampler>");
    }
    if (has_batch_sampler) {
      throw std::invalid_argument(
          "DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
          "batch_sampler=<batch_sampler>");
    }
  }
  if (has_sampler && shuffle) {
    throw std::invalid_argument("sampler option is mutually exclusive with shuffle");
  }
  if (has_batch_sampler) {
    if (batch_size != 1 || shuffle || has_sampler || drop_last) {
      throw std::invalid_argument(
          "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
          "drop_last");
    }
  } else if (!batch_size) {
    if (drop_last) {
      throw std::invalid_argument(
          "batch_size=None option disables auto-batching and is mutually exclusive with "
          "drop_last");
    }
  } else if (*batch_size <= 0) {
    throw std::invalid_argument(
        "batch_size should be a positive integer value, but got batch_size=" +
        std::to_string(*batch_size));
  }
  // coload's own: the batch type follows from the collate, so it must agree with batch_size.
  if (kind.per_sample && batch_size) {
    throw std::invalid_argument(
        "collate takes one sample at a time (as default_convert does), which needs "
        "batch_size=std::nullopt; got batch_size=" + std::to_string(*batch_size));
  }
  if (!kind.per_sample && !batch_size && !has_batch_sampler) {
    throw std::invalid_argument(
        "batch_size=std::nullopt turns automatic batching off, so collate receives one sample "
        "at a time: pass a per-sample collate such as .collate = coload::DefaultConvert{}");
  }
}

// --- Driver ---------------------------------------------------------------------------------

struct Driver::State {
  asio::io_context context{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{context.get_executor()};
  std::thread thread;
  std::thread::id id;
};

Driver::Driver() : state_(std::make_shared<State>()) {
  state_->thread = std::thread([s = state_.get()] { s->context.run(); });
  state_->id = state_->thread.get_id();
  pthread_setname_np(state_->thread.native_handle(), "coload-driver");
}

Driver::Driver(Idle) : state_(std::make_shared<State>()) {}

Driver::~Driver() {
  if (state_->thread.joinable()) {
    asio::post(state_->context, [s = state_.get()] { s->guard.reset(); });
    state_->thread.join();
  }
}

asio::io_context& Driver::context() noexcept { return state_->context; }
void Driver::post_resume(std::coroutine_handle<> h) {
  // The copy outlives the post: once posted, `h` may run, end the loader and destroy `*this`.
  const std::shared_ptr<State> keep = state_;
  asio::post(keep->context, [h] { h.resume(); });
}
bool Driver::on_driver_thread() const noexcept {
  return std::this_thread::get_id() == state_->id;
}
void Driver::release() noexcept { state_->guard.reset(); }
void Driver::join() {
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace detail
}  // namespace coload
