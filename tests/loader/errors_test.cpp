// Specification of coload::Error: every error the loader, io, exec, vision and state code raise
// is caught as coload::Error, and still as the standard type it derives from.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <signal.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "coload/coload.hpp"
#include "coload/io/errors.hpp"
#include "coload/io/reader.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/folder.hpp"

using namespace coload;

namespace {

/// The exception `f` throws (null when it throws none).
template <class F>
std::exception_ptr raised(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

/// Checks that `error` is caught as `Concrete`, as coload::Error, as `Standard` and as
/// std::exception, with one message each way, and that the message holds `fragment`.
template <class Concrete, class Standard>
void check_caught(const std::exception_ptr& error, const std::string& fragment) {
  REQUIRE_MESSAGE(error, "nothing was thrown");
  std::string as_concrete = "(not caught)", as_error = "(not caught)", as_standard = "(not caught)",
              as_exception = "(not caught)";
  try {
    std::rethrow_exception(error);
  } catch (const Concrete& e) {
    as_concrete = e.what();
  } catch (...) {
  }
  try {
    std::rethrow_exception(error);
  } catch (const coload::Error& e) {
    as_error = e.what();
  } catch (...) {
  }
  try {
    std::rethrow_exception(error);
  } catch (const Standard& e) {
    as_standard = e.what();
  } catch (...) {
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    as_exception = e.what();
  } catch (...) {
  }
  CAPTURE(as_exception);
  CHECK(as_concrete == as_exception);
  CHECK(as_error == as_exception);
  CHECK(as_standard == as_exception);
  CHECK(as_exception.find(fragment) != std::string::npos);
}

TensorDataset range_dataset(std::int64_t n) {
  return TensorDataset{at::arange(n, at::kLong)};
}

/// Runs an io_context on a thread of its own, as a loader's driver does.
struct IoThread {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  std::thread thread{[this] { ctx.run(); }};
  ~IoThread() {
    guard.reset();
    thread.join();
  }
  /// Runs `f` on the io thread and waits for it.
  template <class F>
  void call(F f) {
    std::promise<void> done;
    asio::post(ctx, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
};

/// Sample `bad` throws a user's exception; sample `slow` takes a while.
struct Faulty {
  std::int64_t n = 8;
  std::int64_t bad = -1;
  std::int64_t slow = -1;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const {
    if (i == bad) throw std::runtime_error("sample " + std::to_string(i) + " is bad");
    if (i == slow) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return i;
  }
};

/// A worker process fetching sample `fatal` kills itself.
struct Fatal {
  std::int64_t fatal = 5;
  std::int64_t size() const { return 8; }
  std::int64_t get(Index i) const {
    if (i == fatal) ::raise(SIGKILL);
    return i;
  }
};

/// The first error an epoch of `loader` delivers.
template <class Loader>
std::exception_ptr first_error(Loader& loader) {
  auto epoch = loader.epoch();
  for (;;) {
    try {
      if (!sync_wait(epoch.next())) return nullptr;
    } catch (...) {
      return std::current_exception();
    }
  }
}

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("catch (const coload::Error&) catches the loader's option and run errors") {
    SUBCASE("a refused option: std::invalid_argument") {
      check_caught<InvalidArgument, std::invalid_argument>(
          raised([] { make_data_loader(range_dataset(8), {.batch_size = 0}); }),
          "batch_size should be a positive integer value, but got batch_size=0");
    }
    SUBCASE("a user's exception in a worker: WorkerError, a std::runtime_error") {
      auto loader = make_data_loader(Faulty{.bad = 3}, {.batch_size = 2, .num_workers = 2});
      const std::exception_ptr error = first_error(loader);
      check_caught<WorkerError, std::runtime_error>(error, "sample 3 is bad");
      check_caught<LoaderError, std::runtime_error>(error, "Caught std::runtime_error");
    }
    SUBCASE("a coload error raised in a worker is named by its standard type, as before") {
      // The outer subset's sample 1 is the inner one's sample 5, past its end.
      Subset<TensorDataset> inner(range_dataset(4), {0, 1});
      auto loader =
          make_data_loader(Subset<Subset<TensorDataset>>(inner, {0, 5}), {.batch_size = 2});
      const std::exception_ptr error = first_error(loader);
      check_caught<WorkerError, std::runtime_error>(error, "Caught std::out_of_range");
      try {
        std::rethrow_exception(error);
      } catch (const WorkerError& e) {
        check_caught<OutOfRange, std::out_of_range>(e.original(), "");
      }
    }
    SUBCASE("no batch within the timeout: TimeoutError, a std::runtime_error") {
      auto loader =
          make_data_loader(Faulty{.slow = 0}, {.batch_size = 2, .num_workers = 1, .timeout = 0.02});
      check_caught<TimeoutError, std::runtime_error>(first_error(loader), "waiting for batch 0");
    }
    SUBCASE("a worker process that dies: WorkerDied, a std::runtime_error") {
      LoaderOptions<> options;
      options.batch_size = 2;
      options.num_workers = 1;
      options.executor = Executor::processes;
      auto loader = make_data_loader(Fatal{}, options);
      check_caught<WorkerDied, std::runtime_error>(first_error(loader),
                                                   "was killed by signal SIGKILL");
    }
  }

  TEST_CASE("catch (const coload::Error&) catches io, vision, wire and state errors") {
    SUBCASE("a missing file read through io::Reader: IoError, a std::system_error") {
      IoThread io;
      auto reader = std::make_unique<io::Reader>(io.ctx);
      const std::exception_ptr error =
          raised([&] { sync_wait(reader->read_file("/nonexistent/coload/errors_test.bin")); });
      io.call([&reader] { reader.reset(); });  // a Reader is destroyed on its thread
      check_caught<io::IoError, std::system_error>(error, "/nonexistent/coload/errors_test.bin");
    }
    SUBCASE("bytes that are no image: DecodeError, a std::runtime_error") {
      const std::array<std::byte, 16> junk{};
      check_caught<vision::DecodeError, std::runtime_error>(raised([&] { vision::decode(junk); }),
                                                            "");
    }
    SUBCASE("an image folder that is not there: FolderError, a std::runtime_error") {
      check_caught<vision::FolderError, std::runtime_error>(
          raised([] { vision::index_folder("/nonexistent/coload/images", {}); }),
          "/nonexistent/coload/images");
    }
    SUBCASE("a wire message with a bad header: FormatError, a std::runtime_error") {
      alignas(64) std::array<std::byte, 256> zeros{};
      check_caught<wire::FormatError, std::runtime_error>(
          raised([&] { wire::decode<at::Tensor>(std::span<const std::byte>(zeros), nullptr); }),
          "wire");
    }
    SUBCASE("a batch larger than its region: RegionTooSmall, a FormatError") {
      alignas(64) std::array<std::byte, 64> small{};
      check_caught<wire::RegionTooSmall, wire::FormatError>(
          raised([&] { wire::encode(at::ones({1000}), std::span<std::byte>(small)); }), "");
    }
    SUBCASE("a corrupt state: std::invalid_argument; a missing one: std::system_error") {
      check_caught<InvalidArgument, std::invalid_argument>(
          raised([] { LoaderState::parse("this is no loader state"); }), "");
      check_caught<SystemError, std::system_error>(
          raised([] { LoaderState::load("/nonexistent/coload/state.txt"); }),
          "/nonexistent/coload/state.txt");
    }
    SUBCASE("a dataset's argument error: std::invalid_argument") {
      check_caught<InvalidArgument, std::invalid_argument>(
          raised([] { TensorDataset empty{std::vector<at::Tensor>{}}; }),
          "TensorDataset needs at least one tensor");
    }
  }

  TEST_CASE("the loader's internal signals are coload errors too") {
    check_caught<EmptyBatch, std::runtime_error>(raised([] { throw EmptyBatch{}; }), "skipped");
    check_caught<SampleError, std::runtime_error>(raised([] { throw SampleError(4, "bad"); }),
                                                  "bad");
    check_caught<BatchLost, std::runtime_error>(raised([] { throw BatchLost{}; }), "gone");
  }
}
