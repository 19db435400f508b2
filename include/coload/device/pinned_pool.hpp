#pragma once
// PinnedPool: page-locked host memory in slabs that are recycled, never pinned per batch;
// BatchLease: one batch's memory from it, handed to collate as its BatchAllocator.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>

#include "coload/collate/batch_allocator.hpp"
#include "coload/device/backend.hpp"

namespace coload {

namespace detail {
struct PinnedPoolState;
struct PinnedSlab;
}  // namespace detail

/// Counters of a PinnedPool, for tests and metrics.
struct PinnedPoolStats {
  std::size_t slabs_allocated = 0;  ///< slabs ever allocated from the backend
  std::size_t slabs_live = 0;       ///< slabs allocated and not freed (free + leased)
  std::size_t slabs_in_use = 0;     ///< slabs leased: a batch or a tensor still holds them
  std::size_t slabs_recycled = 0;   ///< times a leased slab came back to the pool
  std::size_t slabs_reused = 0;     ///< times a lease got a slab from the free list
  std::size_t slabs_replaced = 0;   ///< free slabs freed to make room for a bigger one
  std::size_t slabs_over_hint = 0;  ///< allocations made while the hint was already reached
  std::size_t foreign_pins = 0;     ///< tensors pin_batch() copied into the pool
  std::size_t slab_bytes = 0;       ///< the slab size learned from the batches so far
};

/// One batch's share of a PinnedPool: a slab (more when the batch outgrows it) from which
/// the batch's tensors are carved, 64-byte aligned. Install it with BatchAllocatorScope while
/// collating: default_collate and the image pipeline then write the batch straight into pinned
/// memory. Used by one thread at a time.
///
/// Each piece's owner keeps its slab leased until every tensor made from it has died (the
/// lease itself may die first); then the slab goes back to the pool's free list.
class BatchLease final : public BatchAllocator {
 public:
  ~BatchLease() override;
  BatchLease(const BatchLease&) = delete;
  BatchLease& operator=(const BatchLease&) = delete;

  /// Lent memory is not offered: pinned pieces must be owned (see allocate_owned).
  void* allocate(std::size_t nbytes) override;
  /// `nbytes` bytes of pinned memory aligned to 64, valid while `owner` (the slab) lives.
  BatchMemory allocate_owned(std::size_t nbytes) override;
  /// A contiguous copy of the CPU tensor `t` in this lease's memory (same sizes and dtype).
  at::Tensor copy_in(const at::Tensor& t);
  /// Bytes handed out so far, padding included.
  std::size_t bytes() const noexcept { return total_; }

 private:
  friend class PinnedPool;
  explicit BatchLease(std::shared_ptr<detail::PinnedPoolState> pool);

  std::shared_ptr<detail::PinnedPoolState> pool_;
  std::shared_ptr<detail::PinnedSlab> slab_;  // the slab pieces are carved from now
  std::size_t used_ = 0;                      // bytes of slab_ handed out
  std::size_t total_ = 0;                     // bytes handed out over all slabs
};

/// Page-locked host memory from a DeviceBackend, allocated in slabs and recycled.
///
/// Slabs are sized from the batches seen: the first batch teaches the size (a batch larger
/// than the slab gets a bigger slab, which replaces a smaller free one), later slabs have that
/// size rounded up to 64 KiB. `max_slabs_hint` is the number of slabs the pipeline should
/// need (batches in flight + the device stage's depth): when no slab is free and the hint is
/// reached, the pool still allocates (a consumer may hold batches) but counts it, and frees
/// slabs above the hint as they come back. Thread-safe.
///
/// Destroying the pool while slabs are leased is safe: each is freed when its last owner
/// dies (the pool's state and the backend are kept alive by them).
class PinnedPool {
 public:
  PinnedPool(std::shared_ptr<DeviceBackend> backend, std::size_t max_slabs_hint);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  /// Memory for one batch (see BatchLease). Cheap: the slab is taken at the first
  /// allocation.
  std::unique_ptr<BatchLease> begin_batch();

  /// True when `p` lies in one of this pool's slabs.
  bool owns(const void* p) const;
  /// True when `p` lies in page-locked memory: this pool's, or what the backend knows of
  /// (alloc_pinned, register_host).
  bool is_pinned(const void* p) const;

  PinnedPoolStats stats() const;
  DeviceBackend& backend() const noexcept;
  const std::shared_ptr<DeviceBackend>& backend_ptr() const noexcept;

  /// Counts a tensor copied into the pool by pinning (pin_batch).
  void count_foreign_pin() noexcept;

 private:
  std::shared_ptr<detail::PinnedPoolState> state_;
};

}  // namespace coload
