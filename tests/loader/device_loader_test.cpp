// Specification of pin_memory and the device stage in the DataLoader, through the host backend.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coload/coload.hpp"
#include "coload/device/device.hpp"
#include "../support/needs.hpp"

using namespace coload;

namespace {

// Sample i is (i, i * i); counts fetches and lets the test wait for a number of them.
struct CountingDataset {
  struct Log {
    std::mutex m;
    std::condition_variable cv;
    int fetched = 0;
    void wait_for(int n) {
      std::unique_lock l(m);
      cv.wait(l, [&] { return fetched >= n; });
    }
    int count() {
      std::lock_guard l(m);
      return fetched;
    }
  };
  std::int64_t n;
  std::shared_ptr<Log> log = std::make_shared<Log>();
  std::int64_t size() const { return n; }
  std::tuple<std::int64_t, std::int64_t> get(Index i) const {
    if (i == failing) throw std::runtime_error("sample " + std::to_string(i) + " is bad");
    {
      std::lock_guard l(log->m);
      ++log->fetched;
    }
    log->cv.notify_all();
    return {i, i * i};
  }
  std::int64_t failing = -1;
};

// get_batch hands over tensors of its own: pin_memory must copy them in once.
struct OwnTensors {
  std::int64_t size() const { return 12; }
  std::int64_t get(Index i) const { return i; }
  at::Tensor get_batch(std::span<const Index> indices) const {
    auto t = at::empty({static_cast<std::int64_t>(indices.size())}, at::kLong);
    for (std::size_t k = 0; k < indices.size(); ++k) t[static_cast<std::int64_t>(k)] = indices[k];
    return t;
  }
};

// A batch type with its own pin_memory(), as PyTorch honours a custom batch's method.
struct CustomBatch {
  at::Tensor values;
  bool pinned = false;
  CustomBatch pin_memory() {
    CustomBatch out{values, true};
    return out;
  }
};
struct CustomCollate {
  CustomBatch operator()(std::vector<std::int64_t> samples) const {
    return CustomBatch{at::tensor(samples, at::kLong)};
  }
};
struct Plain {
  std::int64_t size() const { return 8; }
  std::int64_t get(Index i) const { return i; }
};

// A batch struct with a tensor inside but no TensorMap: the device stage cannot see into it.
struct Opaque {
  at::Tensor values;
};
struct OpaqueCollate {
  Opaque operator()(std::vector<std::int64_t> samples) const {
    return Opaque{at::tensor(samples, at::kLong)};
  }
};

using Batch = std::tuple<at::Tensor, at::Tensor>;

std::vector<std::int64_t> firsts(const Batch& b) {
  auto t = std::get<0>(b).contiguous();
  return {t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel()};
}

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("pin_memory collates into pinned slabs that are allocated once and recycled") {
    auto backend = std::make_shared<HostDeviceBackend>();
    for (const bool processes : {false, true}) {
      CAPTURE(processes);
      {
        auto loader = make_data_loader(
            CountingDataset{200},
            LoaderOptions<>{.batch_size = 4,
                            .num_workers = 2,
                            .pin_memory = true,
                            .executor = processes ? Executor::processes : Executor::threads,
                            .device_backend = backend});
        std::int64_t batches = 0;
        std::int64_t next = 0;
        for (int e = 0; e < 2; ++e) {
          next = 0;
          for (auto& b : loader) {
            CHECK(backend->is_pinned(std::get<0>(b).data_ptr()));
            CHECK(backend->is_pinned(std::get<1>(b).data_ptr()));
            CHECK(firsts(b).front() == next);
            next += 4;
            ++batches;
          }
        }
        CHECK(batches == 100);
        if (processes) {
          // The arena is registered as pinned: no slab is needed for the batches themselves.
          CHECK(backend->registered_ranges() > 0);
        }
      }
      // In flight (2 workers × 2) + 2: slabs, not batches, were allocated.
      CHECK(backend->pinned_allocations() <= 6);
      CHECK(backend->live_pinned_bytes() == 0);
      CHECK(backend->registered_ranges() == 0);
    }
  }

  TEST_CASE("pin_memory copies a dataset's own tensors in once, and honours pin_memory()") {
    auto backend = std::make_shared<HostDeviceBackend>();
    {
      auto loader = make_data_loader(
          OwnTensors{}, LoaderOptions<>{.batch_size = 5, .num_workers = 1, .pin_memory = true,
                                        .device_backend = backend});
      std::vector<std::int64_t> seen;
      for (auto& b : loader) {
        CHECK(backend->is_pinned(b.data_ptr()));
        for (std::int64_t k = 0; k < b.numel(); ++k) seen.push_back(b[k].item<std::int64_t>());
      }
      CHECK(seen.size() == 12);
      CHECK(seen.back() == 11);
    }
    auto loader = make_data_loader(
        Plain{}, LoaderOptions<CustomCollate>{.batch_size = 4, .pin_memory = true,
                                              .device_backend = backend});
    int batches = 0;
    for (auto& b : loader) {
      CHECK(b.pinned);
      ++batches;
    }
    CHECK(batches == 2);
  }

  TEST_CASE("pin_memory without CUDA: pageable batches and one warning, as PyTorch") {
    std::vector<std::string> warnings;
    set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    coload::detail::forget_warnings();
    for (int i = 0; i < 2; ++i) {
      auto loader = make_data_loader(CountingDataset{8},
                                     LoaderOptions<>{.batch_size = 4, .pin_memory = true});
      int batches = 0;
      for ([[maybe_unused]] auto& b : loader) ++batches;
      CHECK(batches == 2);
    }
    set_warning_handler({});
    if (cuda_available()) {
      MESSAGE("skipped: this machine has CUDA, so pin_memory pins");
      return;
    }
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("'pin_memory' argument is set as true but no accelerator is found") !=
          std::string::npos);
    CHECK(warnings[0].find(cuda_unavailable_reason()) != std::string::npos);
  }

  TEST_CASE("the device stage delivers copies in order, and frees everything at the end") {
    auto backend = std::make_shared<HostDeviceBackend>();
    {
      auto loader =
          make_data_loader(CountingDataset{30}, LoaderOptions<>{.batch_size = 4,
                                                                .shuffle = true,
                                                                .num_workers = 2,
                                                                .seed = 3,
                                                                .device = at::Device(at::kCPU),
                                                                .device_backend = backend});
      auto plain = make_data_loader(
          CountingDataset{30},
          LoaderOptions<>{.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 3});
      std::vector<std::vector<std::int64_t>> staged, direct;
      for (auto& b : loader) {
        // Made by the stage: its DeviceBatch is found, and the copy has completed.
        auto db = device_batch(b);
        CHECK(db.ready());
        CHECK(!backend->is_pinned(std::get<0>(b).data_ptr()));
        staged.push_back(firsts(b));
      }
      for (auto& b : plain) direct.push_back(firsts(b));
      CHECK(staged == direct);
      CHECK(backend->copies_executed() >= 2 * 8);
    }
    // A batch's memory is freed on its stream, after the loader has gone: count once it ran.
    backend->synchronize(backend->copy_stream());
    CHECK(backend->live_device_allocations() == 0);
    CHECK(backend->live_pinned_bytes() == 0);
  }

  TEST_CASE("the device stage warns once when a batch type shows it no tensor") {
    std::vector<std::string> warnings;
    set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    coload::detail::forget_warnings();
    auto backend = std::make_shared<HostDeviceBackend>();
    std::vector<std::int64_t> got;
    {
      auto loader = make_data_loader(
          Plain{}, LoaderOptions<OpaqueCollate>{.batch_size = 4, .collate = OpaqueCollate{},
                                                .device = at::Device(at::kCPU),
                                                .device_backend = backend});
      for (int epoch = 0; epoch < 2; ++epoch) {
        for (auto& b : loader) {
          auto t = b.values.contiguous();
          got.insert(got.end(), t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel());
        }
      }
      // A batch the stage can see into says nothing.
      auto plain =
          make_data_loader(CountingDataset{8}, LoaderOptions<>{.batch_size = 4,
                                                               .device = at::Device(at::kCPU),
                                                               .device_backend = backend});
      for ([[maybe_unused]] auto& b : plain) {
      }
    }
    set_warning_handler({});
    CHECK(got == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7});
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("found no tensor in a batch of type") != std::string::npos);
    CHECK(warnings[0].find("Opaque") != std::string::npos);
    CHECK(warnings[0].find("coload::TensorMap") != std::string::npos);
    // A batch's memory is freed on its stream, after the loader has gone: count once it ran.
    backend->synchronize(backend->copy_stream());
    CHECK(backend->live_device_allocations() == 0);
  }

  TEST_CASE("the device stage keeps an error in its place behind the copies before it") {
    auto backend = std::make_shared<HostDeviceBackend>();
    CountingDataset ds{16};
    ds.failing = 9;  // batch 2
    auto loader = make_data_loader(
        ds, LoaderOptions<>{.batch_size = 4, .num_workers = 2, .device = at::Device(at::kCPU),
                            .device_backend = backend});
    auto epoch = loader.epoch();
    CHECK(firsts(*sync_wait(epoch.next())).front() == 0);
    CHECK(firsts(*sync_wait(epoch.next())).front() == 4);
    CHECK_THROWS_WITH(sync_wait(epoch.next()), doctest::Contains("sample 9 is bad"));
    CHECK(firsts(*sync_wait(epoch.next())).front() == 12);
    CHECK_FALSE(sync_wait(epoch.next()));
  }

  TEST_CASE("a slow device holds the loader within its in-flight bound; shutdown with copies "
            "in flight neither hangs nor leaks") {
    auto backend = std::make_shared<HostDeviceBackend>();
    const DeviceStream copies = backend->copy_stream();
    CountingDataset ds{400};
    auto log = ds.log;
    auto loader = std::make_unique<DataLoader<CountingDataset>>(
        ds, LoaderOptions<>{.batch_size = 2,
                            .num_workers = 2,
                            .prefetch_factor = 2,
                            .device = at::Device(at::kCPU),
                            .device_backend = backend});
    backend->pause(copies);
    auto epoch = loader->epoch();
    // Four batches (the bound) are fetched and wait on the paused copy stream.
    log->wait_for(4 * 2);
    backend->resume(copies);
    auto first = sync_wait(epoch.next());
    REQUIRE(first);
    // Nothing was taken before: the dispatcher stayed within the bound of four batches.
    CHECK(log->count() <= 4 * 2 + 2);
    first.reset();
    backend->pause(copies);
    // Let the next batches reach the paused stream, then destroy the loader mid-copy.
    log->wait_for(5 * 2);
    std::thread destroyer([&] {
      epoch = Epoch<Batch>(nullptr);
      loader.reset();
    });
    backend->resume(copies);
    destroyer.join();
    CHECK(log->count() < 400);
    // A batch's memory is freed on its stream, after the loader has gone: count once it ran.
    backend->synchronize(backend->copy_stream());
    CHECK(backend->live_device_allocations() == 0);
    CHECK(backend->live_pinned_bytes() == 0);
  }

  TEST_CASE("DeviceBatch::wait hands a loader's batch to the consumer's stream") {
    auto backend = std::make_shared<HostDeviceBackend>();
    const DeviceStream consumer = backend->create_stream();
    {
      auto loader =
          make_data_loader(CountingDataset{8}, LoaderOptions<>{.batch_size = 4,
                                                               .device = at::Device(at::kCPU),
                                                               .device_backend = backend});
      for (auto& b : loader) {
        auto db = device_batch(std::move(b));
        db.wait(consumer);
        backend->pause(consumer);
      }
      // The batches' memory is freed on the paused consumer stream: not yet.
      CHECK(backend->live_device_allocations() > 0);
      backend->resume(consumer);
      backend->synchronize(consumer);
    }
    CHECK(backend->live_device_allocations() == 0);
    backend->destroy_stream(consumer);
  }

  TEST_CASE("a CUDA device where there is none is refused at construction, saying why") {
    if (cuda_available()) {
      MESSAGE("skipped: this machine has CUDA");
      return;
    }
    try {
      auto loader = make_data_loader(
          CountingDataset{8}, LoaderOptions<>{.batch_size = 4, .device = at::Device(at::kCUDA, 0)});
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.find("device = cuda:0: ") == 0);
      CHECK(what.find(cuda_unavailable_reason()) != std::string::npos);
    }
    auto backend = std::make_shared<HostDeviceBackend>();
    CHECK_THROWS_WITH_AS(
        make_data_loader(CountingDataset{8}, LoaderOptions<>{.device = at::Device(at::kCUDA, 0),
                                                             .device_backend = backend}),
        "device = cuda:0, but device_backend copies to cpu", std::invalid_argument);
  }

  TEST_CASE("GPU: a loader with device = cuda delivers batches on the GPU" *
            testing::needs(testing::cuda())) {
    testing::require(testing::cuda());
    auto loader =
        make_data_loader(CountingDataset{64}, LoaderOptions<>{.batch_size = 8,
                                                              .num_workers = 2,
                                                              .pin_memory = true,
                                                              .device = at::Device(at::kCUDA, 0)});
    std::int64_t next = 0;
    for (auto& b : loader) {
      CHECK(std::get<0>(b).is_cuda());
      CHECK(std::get<0>(b).cpu()[0].item<std::int64_t>() == next);
      next += 8;
    }
    CHECK(next == 64);
  }
}
