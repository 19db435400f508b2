// The calling thread's worker: get_worker_info() and the thread-local state behind it.

#include "coload/core/worker_info.hpp"

namespace coload {

namespace {
thread_local const WorkerInfo* t_worker_info = nullptr;
thread_local int t_worker_id = -1;
}  // namespace

std::optional<WorkerInfo> get_worker_info() {
  if (!t_worker_info) return std::nullopt;
  return *t_worker_info;
}

void detail::set_worker_info(const WorkerInfo* info) noexcept {
  t_worker_info = info;
}
const WorkerInfo* detail::current_worker_info() noexcept {
  return t_worker_info;
}

void detail::set_current_worker_id(int id) noexcept {
  t_worker_id = id;
}
int detail::current_worker_id() noexcept {
  return t_worker_id;
}

}  // namespace coload
