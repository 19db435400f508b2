#pragma once
// The errors of exec's process pool: a worker process that died, and the batches lost with it.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"

namespace coload {

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
  /// The batch number it was fetching; -1 when it died holding none (idle, between batches).
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

/// A batch that no worker process will fetch: it was queued behind one that died (whose
/// WorkerDied reports the death), or every worker is gone. The loader ends it without a batch.
class BatchLost : public LoaderError {
 public:
  BatchLost() : LoaderError("the batch was queued on a worker process that is gone") {}
};

}  // namespace coload
