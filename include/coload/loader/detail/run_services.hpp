#pragma once
// What a run is given: the driver's context and scope, the in-flight bound, the recorder, the
// device stage, the placement, the fetch side and the sampler. A run asks these, never the
// loader that built them.

#include <asio/io_context.hpp>

#include <memory>
#include <utility>

#include "coload/core/metrics.hpp"
#include "coload/coro/async_scope.hpp"
#include "coload/coro/task.hpp"
#include "coload/device/device.hpp"
#include "coload/loader/detail/batches.hpp"
#include "coload/loader/detail/fetch.hpp"
#include "coload/loader/detail/place.hpp"
#include "coload/loader/detail/resume.hpp"
#include "coload/loader/detail/worker_count.hpp"
#include "coload/loader/driver.hpp"

namespace coload::detail {

/// The services of one loader, built by its core at a stable address and outliving every run
/// that uses them while it runs (a run that outlives its loader touches none: its consumer-side
/// calls end once it has finished).
template <class D, class C>
struct RunServices {
  Driver& driver;            ///< the driver: its io_context and thread
  AsyncScope& scope;         ///< every coroutine a run starts, joined at shutdown (driver)
  WorkerCount& workers;      ///< the in-flight bound (any thread) and auto_workers' tuning
  Recorder& recorder;        ///< the metrics and trace (any thread)
  DeviceStage* stage;        ///< the device stage, or nullptr (driver)
  Place<D, C>& placement;    ///< where fetches run (driver)
  Fetcher<D, C>& fetcher;    ///< the dataset, its options and workers' records (any thread)
  BatchSource* batches;      ///< map-style: the batch sampler (driver); nullptr otherwise
  std::shared_ptr<StoppedEpoch> stopped;  ///< where a consumer's stop is recorded (any thread)

  const LoaderOptions<C>& options() const noexcept { return fetcher.options; }
  /// The driver's io_context (any thread).
  asio::io_context& context() noexcept { return driver.context(); }
  /// Starts `task` now, in the loader's scope: the loader ends only after it has finished.
  void spawn(Task<void> task) { scope.spawn(std::move(task)); }
  /// Starts the driver's thread if it runs inline (any thread), bound to the metrics as the
  /// driver (its first binding ran inline, on the consumer).
  void start_driver() {
    driver.start([r = &recorder] { r->bind_thread(Recorder::driver); });
  }
};

}  // namespace coload::detail
