// The device module: PinnedPool, pinning (Pin<T>, TensorMap<T>), DeviceStage and DeviceBatch,
// exercised through HostDeviceBackend; the CUDA backend's refusal here; a GPU case that runs
// only where a CUDA device is.
// NOTE: ATen before doctest: libtorch's glog logging defines CHECK too, and doctest's must win.
#include <ATen/ATen.h>
#include <asio/io_context.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <array>
#include <coroutine>
#include <latch>
#include <thread>
#include <cstdlib>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "coload/collate/batch_allocator.hpp"
#include "coload/config.hpp"
#include "coload/device/device.hpp"
#include "../support/needs.hpp"

using namespace coload;

namespace {

/// A coroutine started at once and destroyed by its owner (so a test can abandon one that is
/// still suspended).
struct Job {
  struct promise_type {
    Job get_return_object() noexcept { return Job{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_always final_suspend() const noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit Job(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
  Job(Job&& o) noexcept : handle(std::exchange(o.handle, {})) {}
  Job& operator=(Job&&) = delete;
  ~Job() {
    if (handle) handle.destroy();
  }
  bool done() const { return handle.done(); }
  std::coroutine_handle<promise_type> handle;
};

using Pair = std::pair<at::Tensor, at::Tensor>;

struct Results {
  std::vector<int> order;
  std::vector<DeviceBatch<Pair>> batches;
};

Job copy_job(DeviceStage& stage, Pair batch, Results& results, int id) {
  DeviceBatch<Pair> d = co_await stage.copy(std::move(batch));
  results.order.push_back(id);
  results.batches.push_back(std::move(d));
}

Job counted_copy_job(DeviceStage& stage, Pair batch, Results& results, int id, std::latch& done) {
  DeviceBatch<Pair> d = co_await stage.copy(std::move(batch));
  results.order.push_back(id);
  results.batches.push_back(std::move(d));
  done.count_down();
}

Job fence_job(DeviceStage& stage, Results& results, int id) {
  co_await stage.fence();
  results.order.push_back(id);
}

/// Runs what the copy stream has posted to the driver (the test thread is the driver).
void drive(asio::io_context& ctx) {
  ctx.restart();
  ctx.poll();
}

/// Lets the copy stream run everything queued, then the driver.
void settle(HostDeviceBackend& backend, asio::io_context& ctx) {
  backend.synchronize(backend.copy_stream());
  drive(ctx);
}

/// A batch collated into a lease of `pool`, the way a loader's worker makes one: values from
/// `seed`. 16x33 floats and 16 longs fit in one 64 KiB slab.
Pair make_batch(PinnedPool& pool, int seed, std::int64_t rows = 16) {
  auto lease = pool.begin_batch();
  BatchAllocatorScope scope(lease.get());
  at::Tensor x = empty_batch_tensor({rows, 33}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor y = empty_batch_tensor({rows}, at::TensorOptions().dtype(at::kLong));
  x.copy_(at::arange(rows * 33, at::kFloat).reshape({rows, 33}) + seed * 1000);
  y.copy_(at::arange(rows, at::kLong) * seed);
  return {x, y};
}

Pair expected_batch(int seed, std::int64_t rows = 16) {
  return {at::arange(rows * 33, at::kFloat).reshape({rows, 33}) + seed * 1000, at::arange(rows, at::kLong) * seed};
}

struct Fixture {
  std::shared_ptr<HostDeviceBackend> backend = std::make_shared<HostDeviceBackend>();
  asio::io_context ctx;
};

}  // namespace

namespace {
struct WithPinMemory {
  at::Tensor x;
  int pinned_by_method = 0;
  WithPinMemory pin_memory() const {
    WithPinMemory c = *this;
    c.pinned_by_method = 1;
    return c;
  }
};
struct Specialised {
  at::Tensor x;
  int how = 0;
  Specialised pin_memory() const {
    Specialised c = *this;
    c.how = 1;
    return c;
  }
};
}  // namespace

namespace {
/// A batch whose map throws after its first tensor (a TensorMap whose map and visit disagree).
struct Throwing {
  at::Tensor x, y;
};
}  // namespace

template <>
struct coload::TensorMap<Throwing> {
  template <class M>
  static Throwing map(Throwing b, M& m) {
    b.x = m(std::move(b.x));
    throw std::runtime_error("the batch's map failed");
  }
  template <class V>
  static void visit(const Throwing& b, V& v) {
    v(b.x);
    v(b.y);
  }
};

namespace {
Job throwing_copy_job(DeviceStage& stage, Throwing batch, std::string& error) {
  try {
    (void)co_await stage.copy(std::move(batch));
  } catch (const std::exception& e) {
    error = e.what();
  }
}
}  // namespace

template <>
struct coload::Pin<Specialised> {
  static Specialised pin(Specialised v, Pinner& p) {
    v.x = p(std::move(v.x));
    v.how = 2;
    return v;
  }
};

TEST_SUITE("device") {

TEST_CASE("TensorMap visits and maps the tensors of nested containers in one order") {
  using Batch = std::tuple<at::Tensor, std::vector<at::Tensor>, std::optional<at::Tensor>, std::pair<int, at::Tensor>,
                           std::map<std::string, at::Tensor>, std::array<at::Tensor, 2>, std::string>;
  Batch b{at::full({1}, 0), {at::full({1}, 1), at::full({1}, 2)}, at::full({1}, 3), {7, at::full({1}, 4)},
          {{"a", at::full({1}, 5)}, {"b", at::full({1}, 6)}}, {at::full({1}, 7), at::full({1}, 8)}, "text"};
  std::vector<double> seen;
  visit_tensors(b, [&](const at::Tensor& t) { seen.push_back(t.item<double>()); });
  CHECK((seen == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  Batch m = map_tensors(b, [](at::Tensor t) { return t + 10; });
  std::vector<double> mapped;
  visit_tensors(m, [&](const at::Tensor& t) { mapped.push_back(t.item<double>()); });
  CHECK((mapped == std::vector<double>{10, 11, 12, 13, 14, 15, 16, 17, 18}));
  CHECK(std::get<3>(m).first == 7);
  CHECK(std::get<6>(m) == "text");
}

TEST_CASE("PinnedPool: a batch collated into a lease lies in one recycled slab") {
  auto backend = std::make_shared<HostDeviceBackend>();
  {
    PinnedPool pool(backend, 2);
    Pair a = make_batch(pool, 1);
    CHECK(pool.owns(a.first.data_ptr()));
    CHECK(pool.owns(a.second.data_ptr()));
    CHECK(reinterpret_cast<std::uintptr_t>(a.first.data_ptr()) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(a.second.data_ptr()) % 64 == 0);
    CHECK(at::equal(a.first, expected_batch(1).first));
    auto s = pool.stats();
    CHECK(s.slabs_allocated == 1);
    CHECK(s.slabs_in_use == 1);
    CHECK(s.slab_bytes == 65536);  // learned from the first batch
    a = Pair{};                    // the batch's tensors die: the slab comes back
    s = pool.stats();
    CHECK(s.slabs_in_use == 0);
    CHECK(s.slabs_recycled == 1);
    Pair b = make_batch(pool, 2);
    s = pool.stats();
    CHECK(s.slabs_allocated == 1);  // reused, not pinned again
    CHECK(s.slabs_reused == 1);
    CHECK(backend->pinned_allocations() == 1);
  }
  CHECK(backend->live_pinned_bytes() == 0);
}

TEST_CASE("PinnedPool: a larger batch gets a bigger slab that replaces a smaller free one") {
  auto backend = std::make_shared<HostDeviceBackend>();
  PinnedPool pool(backend, 1);
  { Pair a = make_batch(pool, 1); }
  { Pair big = make_batch(pool, 2, 1024); }  // 1024x33 floats: 135 KB
  auto s = pool.stats();
  CHECK(s.slabs_replaced == 1);
  CHECK(s.slabs_live == 1);
  CHECK(s.slab_bytes >= 1024 * 33 * 4);
  CHECK(backend->live_pinned_bytes() == static_cast<std::int64_t>(s.slab_bytes));
  { Pair small = make_batch(pool, 3); }  // fits the big slab
  CHECK(pool.stats().slabs_allocated == 2);
}

TEST_CASE("PinnedPool: beyond the hint it still allocates, counts it, and shrinks back") {
  auto backend = std::make_shared<HostDeviceBackend>();
  PinnedPool pool(backend, 1);
  Pair a = make_batch(pool, 1);
  Pair b = make_batch(pool, 2);  // the consumer holds `a`: no slab is free
  auto s = pool.stats();
  CHECK(s.slabs_allocated == 2);
  CHECK(s.slabs_over_hint == 1);
  a = Pair{};
  b = Pair{};
  s = pool.stats();
  CHECK(s.slabs_live == 1);  // the one above the hint was freed as it came back
  CHECK(s.slabs_in_use == 0);
}

TEST_CASE("PinnedPool: destroyed while a slab is leased, the slab is freed when its tensor dies") {
  auto backend = std::make_shared<HostDeviceBackend>();
  Pair held;
  {
    PinnedPool pool(backend, 2);
    held = make_batch(pool, 4);
    { Pair other = make_batch(pool, 5); }  // a free slab, freed with the pool
  }
  CHECK(backend->live_pinned_bytes() == 65536);
  CHECK(at::equal(held.first, expected_batch(4).first));
  held = Pair{};
  CHECK(backend->live_pinned_bytes() == 0);
}

TEST_CASE("pin_batch copies a foreign tensor once, counts it, and passes pinned ones through") {
  auto backend = std::make_shared<HostDeviceBackend>();
  PinnedPool pool(backend, 2);
  at::Tensor foreign = at::arange(100, at::kInt);
  at::Tensor pinned = pin_batch(foreign, pool);
  CHECK(pinned.data_ptr() != foreign.data_ptr());
  CHECK(pool.owns(pinned.data_ptr()));
  CHECK(at::equal(pinned, foreign));
  CHECK(pool.stats().foreign_pins == 1);

  at::Tensor again = pin_batch(pinned, pool);  // already in the pool
  CHECK(again.data_ptr() == pinned.data_ptr());
  CHECK(pool.stats().foreign_pins == 1);

  // Memory the backend registered (a shared-memory arena) is pinned already.
  std::vector<float> arena(64, 2.5f);
  backend->register_host(arena.data(), arena.size() * sizeof(float));
  at::Tensor in_arena = at::from_blob(arena.data(), {64}, at::kFloat);
  CHECK(pin_batch(in_arena, pool).data_ptr() == arena.data());
  CHECK(pool.stats().foreign_pins == 1);
  backend->unregister_host(arena.data());
  CHECK(backend->registered_ranges() == 0);

  // A non-contiguous tensor is copied contiguous, values kept.
  at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).t();
  at::Tensor pt = pin_batch(t, pool);
  CHECK(pt.is_contiguous());
  CHECK(at::equal(pt, t));
  CHECK(pool.stats().foreign_pins == 2);
}

TEST_CASE("Pin<T> reaches nested containers; pin_memory() and Pin specialisations are honoured") {
  auto backend = std::make_shared<HostDeviceBackend>();
  PinnedPool pool(backend, 2);
  using Batch = std::tuple<std::vector<at::Tensor>, std::map<std::string, at::Tensor>, std::optional<at::Tensor>,
                           std::pair<int, std::string>, std::array<at::Tensor, 2>, WithPinMemory,
                           std::unordered_map<int, std::vector<at::Tensor>>, Specialised, std::vector<WithPinMemory>>;
  Batch b{{at::full({2}, 1.0), at::full({2}, 2.0)},
          {{"k", at::full({3}, 3.0)}},
          at::full({1}, 4.0),
          {5, "five"},
          {at::full({2}, 6.0), at::full({2}, 7.0)},
          WithPinMemory{at::full({2}, 8.0)},
          {{9, {at::full({2}, 9.0)}}},
          Specialised{at::full({2}, 10.0)},
          {WithPinMemory{at::full({1}, 11.0)}}};
  Batch p = pin_batch(b, pool);
  // Every tensor the traversal reaches lies in the pool with its values; one lease served them.
  for (const at::Tensor& t : std::get<0>(p)) CHECK(pool.owns(t.data_ptr()));
  CHECK(pool.owns(std::get<1>(p).at("k").data_ptr()));
  CHECK(pool.owns(std::get<2>(p)->data_ptr()));
  CHECK(pool.owns(std::get<4>(p)[1].data_ptr()));
  CHECK(pool.owns(std::get<6>(p).at(9)[0].data_ptr()));
  CHECK(at::equal(std::get<4>(p)[1], at::full({2}, 7.0)));
  CHECK((std::get<3>(p) == std::pair<int, std::string>{5, "five"}));
  // pin_memory() pinned WithPinMemory its own way (here: untouched tensor, flag set), also
  // inside a vector.
  CHECK(std::get<5>(p).pinned_by_method == 1);
  CHECK(std::get<5>(p).x.data_ptr() == std::get<5>(b).x.data_ptr());
  CHECK(std::get<8>(p)[0].pinned_by_method == 1);
  // The Pin specialisation wins over the member.
  CHECK(std::get<7>(p).how == 2);
  CHECK(pool.owns(std::get<7>(p).x.data_ptr()));
  auto s = pool.stats();
  CHECK(s.foreign_pins == 8);
  CHECK(s.slabs_allocated == 1);
}

TEST_CASE("DeviceStage: copies arrive byte-identical and resume in submission order") {
  Fixture f;
  PinnedPool pool(f.backend, 8);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  std::vector<Job> jobs;
  std::vector<void*> sources;
  for (int i = 0; i < 6; ++i) {
    Pair b = make_batch(pool, i);
    sources.push_back(b.first.data_ptr());
    jobs.push_back(copy_job(stage, std::move(b), results, i));
  }
  CHECK(stage.in_flight() == 6);
  settle(*f.backend, f.ctx);
  CHECK((results.order == std::vector<int>{0, 1, 2, 3, 4, 5}));
  CHECK(stage.in_flight() == 0);
  CHECK(f.backend->copies_executed() == 12);
  for (int i = 0; i < 6; ++i) {
    const DeviceBatch<Pair>& d = results.batches[static_cast<std::size_t>(i)];
    CHECK(d.ready());
    CHECK(d.batch.first.data_ptr() != sources[static_cast<std::size_t>(i)]);
    CHECK_FALSE(pool.owns(d.batch.first.data_ptr()));
    CHECK(at::equal(d.batch.first, expected_batch(i).first));
    CHECK(at::equal(d.batch.second, expected_batch(i).second));
    CHECK(coload::detail::device_state_of(d.batch.first) == d.state);
  }
  CHECK(f.backend->live_device_allocations() == 6);  // one allocation per batch
  results.batches.clear();
  f.backend->synchronize(f.backend->copy_stream());
  CHECK(f.backend->live_device_allocations() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
}

TEST_CASE("DeviceStage: batches collated on worker threads, copied and resumed on a driver thread") {
  auto backend = std::make_shared<HostDeviceBackend>();
  constexpr int kPerWorker = 24;
  PinnedPool pool(backend, 6);
  asio::io_context ctx;
  auto guard = asio::make_work_guard(ctx);
  std::thread driver([&ctx] { ctx.run(); });
  Results results;      // touched on the driver only
  std::vector<Job> jobs;  // likewise
  std::latch done(2 * kPerWorker);
  {
    DeviceStage stage(backend, ctx);
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] {
        for (int i = 0; i < kPerWorker; ++i) {
          const int id = w * 1000 + i;
          Pair batch = make_batch(pool, id % 97);
          asio::post(ctx, [&, id, batch = std::move(batch)]() mutable {
            jobs.push_back(counted_copy_job(stage, std::move(batch), results, id, done));
          });
        }
      });
    }
    for (auto& t : workers) t.join();
    done.wait();
    std::promise<void> checked;
    asio::post(ctx, [&] {
      // Each worker's batches resume in the order it posted them, with their own bytes.
      int last[2] = {-1, -1};
      for (std::size_t k = 0; k < results.order.size(); ++k) {
        const int id = results.order[k];
        const int w = id / 1000;
        CHECK(id % 1000 == last[w] + 1);
        last[w] = id % 1000;
        CHECK(at::equal(results.batches[k].batch.first, expected_batch(id % 97).first));
      }
      results.batches.clear();
      jobs.clear();
      checked.set_value();
    });
    checked.get_future().wait();
  }
  guard.reset();
  driver.join();
  backend->synchronize(backend->copy_stream());
  CHECK(backend->live_device_allocations() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
}

TEST_CASE("DeviceStage: a slab is recycled only after the copy that read it has completed") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  f.backend->pause(f.backend->copy_stream());
  Job job = copy_job(stage, make_batch(pool, 3), results, 0);
  CHECK(f.backend->queued(f.backend->copy_stream()) == 3);  // two copies, the callback
  CHECK(pool.stats().slabs_in_use == 1);
  CHECK(pool.stats().slabs_recycled == 0);
  drive(f.ctx);
  CHECK(results.order.empty());
  f.backend->resume(f.backend->copy_stream());
  f.backend->synchronize(f.backend->copy_stream());
  // The copy has run and its completion is posted; the slab is released on the driver.
  CHECK(f.backend->copies_executed() == 2);
  CHECK(pool.stats().slabs_in_use == 1);
  drive(f.ctx);
  CHECK((results.order == std::vector<int>{0}));
  CHECK(pool.stats().slabs_in_use == 0);
  CHECK(pool.stats().slabs_recycled == 1);
  CHECK(at::equal(results.batches[0].batch.first, expected_batch(3).first));
}

TEST_CASE("DeviceStage: a batch whose map throws keeps its sources until its queued copies ran") {
  // The copy's pending state (its sources) was dropped with the exception: the slab went back
  // to the pool while the paused stream's copies still had to read it, and in_flight stayed 1.
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  f.backend->pause(f.backend->copy_stream());
  std::string error;
  {
    Pair p = make_batch(pool, 3);
    Job job = throwing_copy_job(stage, Throwing{p.first, p.second}, error);
    CHECK(job.done());
  }
  CHECK(error == "the batch's map failed");
  CHECK(f.backend->queued(f.backend->copy_stream()) == 3);  // two copies, the abandon
  CHECK(pool.stats().slabs_in_use == 1);                    // still read by them
  f.backend->resume(f.backend->copy_stream());
  settle(*f.backend, f.ctx);
  CHECK(f.backend->copies_executed() == 2);
  CHECK(stage.in_flight() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
  settle(*f.backend, f.ctx);  // the device memory's free, queued on the stream as it was let go
  CHECK(f.backend->live_device_allocations() == 0);
}

TEST_CASE("DeviceStage: a slow copy stream holds back completions; a bounded submitter stays within the hint") {
  Fixture f;
  constexpr std::size_t depth = 3;
  PinnedPool pool(f.backend, depth);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  std::vector<Job> jobs;
  int next = 0;
  f.backend->pause(f.backend->copy_stream());
  for (int round = 0; round < 4; ++round) {
    // The submitter tops up to `depth` copies in flight, no more.
    while (stage.in_flight() < depth) {
      jobs.push_back(copy_job(stage, make_batch(pool, next), results, next));
      ++next;
    }
    drive(f.ctx);
    CHECK(results.order.size() == static_cast<std::size_t>(round) * depth);  // nothing completed
    auto s = pool.stats();
    CHECK(s.slabs_live <= depth);
    CHECK(s.slabs_over_hint == 0);
    CHECK(s.slabs_in_use == depth);
    f.backend->resume(f.backend->copy_stream());
    settle(*f.backend, f.ctx);
    f.backend->pause(f.backend->copy_stream());
    CHECK(results.order.size() == static_cast<std::size_t>(round + 1) * depth);
    results.batches.clear();  // the consumer is done with them
  }
  for (std::size_t i = 0; i < results.order.size(); ++i) CHECK(results.order[i] == static_cast<int>(i));
  CHECK(pool.stats().slabs_allocated == depth);
  CHECK(f.backend->pinned_allocations() == depth);
  f.backend->resume(f.backend->copy_stream());
}

TEST_CASE("DeviceStage: fence resumes after the copies submitted before it") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  f.backend->pause(f.backend->copy_stream());
  std::vector<Job> jobs;
  jobs.push_back(copy_job(stage, make_batch(pool, 0), results, 0));
  jobs.push_back(copy_job(stage, make_batch(pool, 1), results, 1));
  jobs.push_back(fence_job(stage, results, 100));
  jobs.push_back(copy_job(stage, make_batch(pool, 2), results, 2));
  drive(f.ctx);
  CHECK(results.order.empty());
  f.backend->resume(f.backend->copy_stream());
  settle(*f.backend, f.ctx);
  CHECK((results.order == std::vector<int>{0, 1, 100, 2}));
  Job lone = fence_job(stage, results, 101);
  settle(*f.backend, f.ctx);
  CHECK(results.order.back() == 101);
}

TEST_CASE("DeviceStage: destroyed with copies in flight, it neither hangs nor leaks") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  Results results;
  std::vector<Job> jobs;
  f.backend->pause(f.backend->copy_stream());
  {
    DeviceStage stage(f.backend, f.ctx);
    for (int i = 0; i < 4; ++i) jobs.push_back(copy_job(stage, make_batch(pool, i), results, i));
    CHECK(f.backend->live_device_allocations() == 4);
  }  // the stage dies while the stream is paused
  jobs.clear();  // the owners destroy the suspended coroutines
  CHECK(pool.stats().slabs_in_use == 4);  // still read by the queued copies
  f.backend->resume(f.backend->copy_stream());
  settle(*f.backend, f.ctx);
  CHECK(results.order.empty());  // never resumed
  CHECK(f.backend->copies_executed() == 8);
  CHECK(f.backend->live_device_allocations() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
}

TEST_CASE("DeviceStage: a coroutine destroyed while its copy is in flight is not resumed") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  f.backend->pause(f.backend->copy_stream());
  {
    Job abandoned = copy_job(stage, make_batch(pool, 0), results, 0);
  }
  Job kept = copy_job(stage, make_batch(pool, 1), results, 1);
  f.backend->resume(f.backend->copy_stream());
  settle(*f.backend, f.ctx);
  CHECK((results.order == std::vector<int>{1}));
  CHECK(stage.in_flight() == 0);
  results.batches.clear();
  f.backend->synchronize(f.backend->copy_stream());
  CHECK(f.backend->live_device_allocations() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
}

TEST_CASE("DeviceStage: completions posted to a driver that is destroyed unrun release their batch") {
  auto backend = std::make_shared<HostDeviceBackend>();
  PinnedPool pool(backend, 4);
  Results results;
  std::vector<Job> jobs;
  {
    auto ctx = std::make_unique<asio::io_context>();
    DeviceStage stage(backend, *ctx);
    for (int i = 0; i < 3; ++i) jobs.push_back(copy_job(stage, make_batch(pool, i), results, i));
    backend->synchronize(backend->copy_stream());  // completions posted, not run
    jobs.clear();
  }  // the stage, then the io_context with its handlers, die
  CHECK(results.order.empty());
  backend->synchronize(backend->copy_stream());
  CHECK(backend->live_device_allocations() == 0);
  CHECK(pool.stats().slabs_in_use == 0);
}

TEST_CASE("DeviceBatch::wait makes the consumer's stream wait and moves the free onto it") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  const DeviceStream consumer = f.backend->create_stream();
  Results results;
  Job a = copy_job(stage, make_batch(pool, 0), results, 0);
  Job b = copy_job(stage, make_batch(pool, 1), results, 1);
  settle(*f.backend, f.ctx);
  REQUIRE(results.batches.size() == 2);

  // Batch 0 waited on by the consumer's (paused) stream: its free queues behind the wait.
  f.backend->pause(consumer);
  results.batches[0].wait(consumer);
  at::Tensor kept = results.batches[0].batch.first;  // a tensor outliving its DeviceBatch
  results.batches.erase(results.batches.begin());
  CHECK(f.backend->live_device_allocations() == 2);
  kept = at::Tensor();
  f.backend->synchronize(f.backend->copy_stream());
  CHECK(f.backend->live_device_allocations() == 2);  // queued on the paused consumer
  CHECK(f.backend->queued(consumer) == 2);           // the wait, then the free

  // Batch 1 never waited on: freed on the copy stream.
  results.batches.clear();
  f.backend->synchronize(f.backend->copy_stream());
  CHECK(f.backend->live_device_allocations() == 1);

  f.backend->resume(consumer);
  f.backend->synchronize(consumer);
  CHECK(f.backend->live_device_allocations() == 0);
  f.backend->destroy_stream(consumer);

  // DeviceStream{} is the default stream (where libtorch runs by default on CUDA).
  Job c = copy_job(stage, make_batch(pool, 2), results, 2);
  settle(*f.backend, f.ctx);
  REQUIRE(results.batches.size() == 1);
  f.backend->pause(DeviceStream{});
  results.batches[0].wait(DeviceStream{});
  results.batches.clear();
  f.backend->synchronize(f.backend->copy_stream());
  CHECK(f.backend->live_device_allocations() == 1);
  CHECK(f.backend->queued(DeviceStream{}) == 2);
  f.backend->resume(DeviceStream{});
  f.backend->synchronize(DeviceStream{});
  CHECK(f.backend->live_device_allocations() == 0);
}

TEST_CASE("device_batch recovers the DeviceBatch of a plain batch, and refuses others") {
  Fixture f;
  PinnedPool pool(f.backend, 4);
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  Job a = copy_job(stage, make_batch(pool, 0), results, 0);
  settle(*f.backend, f.ctx);
  REQUIRE(results.batches.size() == 1);
  Pair plain = results.batches[0].batch;
  DeviceBatch<Pair> d = device_batch(plain);
  CHECK(d.state == results.batches[0].state);
  CHECK(d.ready());

  CHECK_THROWS_WITH_AS(device_batch(Pair{plain.first, at::zeros({2})}),
                       doctest::Contains("tensor 1 of the batch (on cpu) was not made by a DeviceStage"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(device_batch(std::string("no tensor")), doctest::Contains("holds no tensor"),
                       std::invalid_argument);
  Job b = copy_job(stage, make_batch(pool, 1), results, 1);
  settle(*f.backend, f.ctx);
  CHECK_THROWS_WITH_AS(device_batch(Pair{plain.first, results.batches[1].batch.second}),
                       doctest::Contains("another DeviceStage copy"), std::invalid_argument);
}

TEST_CASE("DeviceStage copies pageable and non-contiguous tensors too, and passes others through") {
  Fixture f;
  DeviceStage stage(f.backend, f.ctx);
  Results results;
  at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).t();
  Job a = copy_job(stage, Pair{t, at::Tensor()}, results, 0);
  settle(*f.backend, f.ctx);
  REQUIRE(results.batches.size() == 1);
  CHECK(at::equal(results.batches[0].batch.first, t));
  CHECK_FALSE(results.batches[0].batch.second.defined());
}

TEST_CASE("make_cuda_backend says why it cannot work here") {
  if (cuda_available()) {
    // The refusal cannot be seen here; the GPU case below checks the backend it makes.
    CHECK(cuda_unavailable_reason().empty());
    return;
  }
  CHECK_FALSE(cuda_unavailable_reason().empty());
#if COLOAD_HAVE_CUDA
  const char* expected = at::globalContext().hasCUDART() ? "CUDA device" : "libtorch was built without CUDA";
#else
  const char* expected = "coload was built without CUDA support";
#endif
  CHECK_THROWS_WITH_AS(make_cuda_backend(0), doctest::Contains(expected), std::runtime_error);
  MESSAGE("make_cuda_backend(0) refused: " << cuda_unavailable_reason());
}

TEST_CASE("GPU: the stage copies to a CUDA device and the consumer's stream waits" *
          testing::needs(testing::cuda())) {
  testing::require(testing::cuda());
  auto backend = make_cuda_backend(0);
  CHECK_THROWS_WITH_AS(make_cuda_backend(1 << 20), doctest::Contains("out of range"), std::runtime_error);
  asio::io_context ctx;
  PinnedPool pool(backend, 4);
  DeviceStage stage(backend, ctx);
  Results results;
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back(copy_job(stage, make_batch(pool, i), results, i));
  while (results.order.size() < 4) {
    ctx.restart();
    ctx.run_one();
  }
  CHECK((results.order == std::vector<int>{0, 1, 2, 3}));
  const DeviceStream consumer = backend->create_stream();
  for (int i = 0; i < 4; ++i) {
    DeviceBatch<Pair>& d = results.batches[static_cast<std::size_t>(i)];
    CHECK(d.ready());
    CHECK(d.batch.first.is_cuda());
    d.wait(consumer);
    CHECK(at::equal(d.batch.first.cpu(), expected_batch(i).first));
  }
  results.batches.clear();
  backend->synchronize(consumer);
  backend->destroy_stream(consumer);
}

}  // TEST_SUITE
