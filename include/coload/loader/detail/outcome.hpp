#pragma once
// What a fetch's end means for its batch: the one place that turns an exception into a fetch
// outcome (a batch's error, a skip, a cancelled fetch), and the one place that names a failed
// fetch's exception after its worker, batch and sample.

#include <cstdint>
#include <exception>

#include "coload/core/error.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/exec/errors.hpp"
#include "coload/loader/detail/handoff.hpp"
#include "coload/loader/errors.hpp"

namespace coload::detail {

/// Thrown inside a fetch when its epoch was cancelled; never reaches a consumer.
struct Cancelled {};

/// A fetch's result as its run takes it: the batch or its error (neither: every sample was
/// skipped), `dropped` when its epoch was cancelled, and for a stream `over` when nothing
/// follows it.
template <class Batch>
struct Fetched {
  Outcome<Batch> outcome;
  bool dropped = false;
  bool over = false;
};

/// The outcome of a fetch that ended in `error`, whoever ran it (the driver, a worker thread, a
/// worker process's reply):
/// - Cancelled: dropped; its epoch was cancelled and nothing is delivered for it;
/// - EmptyBatch (every sample was skipped) and BatchLost (queued on a worker process that
///   died, whose WorkerDied reports the death): a skip, the batch number completing with
///   neither batch nor error (a lost one marked `lost`: not delivered, for a resume);
/// - anything else: the batch's error, delivered in its place.
/// Every outcome but a cancelled one is `over`: a stream's fetch that ended in an exception has
/// nothing after it (a map-style run ignores `over`).
template <class Batch>
Fetched<Batch> fetch_outcome(std::exception_ptr error) noexcept {
  Fetched<Batch> out;
  try {
    std::rethrow_exception(error);
  } catch (const Cancelled&) {
    out.dropped = true;
    return out;
  } catch (const EmptyBatch&) {
  } catch (const BatchLost&) {
    out.outcome.lost = true;
  } catch (...) {
    out.outcome.error = std::current_exception();
  }
  out.over = true;
  return out;
}

/// Inside a catch block of a fetch: rethrows the exception in flight named after worker
/// `worker` (-1: the driver), batch `batch_no` and, for a SampleError, its sample. EmptyBatch
/// and Cancelled pass as they are (they are outcomes, not failures).
[[noreturn]] inline void rethrow_named(int worker, std::int64_t batch_no,
                                       const char* doing = "fetching") {
  try {
    throw;
  } catch (const EmptyBatch&) {
    throw;
  } catch (const Cancelled&) {
    throw;
  } catch (const SampleError& e) {
    throw wrap_current_exception(worker, batch_no, e.index(), doing);
  } catch (...) {
    throw wrap_current_exception(worker, batch_no, -1, doing);
  }
}

}  // namespace coload::detail
