#pragma once
// SlabPool: recycled batch buffers, shared by ImagePipeline and ShardImagePipeline.

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/collate/batch_allocator.hpp"

namespace coload::vision::detail {

/// Batch buffers, recycled: a fresh 38 MB batch tensor per batch costs thousands of page
/// faults (it is above malloc's mmap threshold), more than resizing all its images.
/// Every buffer has the capacity of the largest batch asked for so far, so that an epoch's
/// shorter last batch takes a recycled one and the next epoch's batches find theirs again
/// (dropping them there cost 5% of the image pipeline's CPU, all of it zeroing fresh pages).
/// Buffers come back when the consumer drops the batch; at most `keep` idle ones are kept.
class SlabPool : public std::enable_shared_from_this<SlabPool> {
 public:
  static constexpr std::size_t keep = 8;
  /// Buffers start on a page (madvise needs it): 4 KiB, or the system's larger page.
  static std::size_t alignment() noexcept {
    static const std::size_t page = std::max<std::size_t>(
        4096, static_cast<std::size_t>(std::max(::sysconf(_SC_PAGESIZE), 0L)));
    return page;
  }

  ~SlabPool() {
    for (void* p : idle_) std::free(p);
  }

  /// A float tensor of `shape` whose storage returns to this pool. A failed allocation
  /// (std::bad_alloc) leaves the pool as it was.
  at::Tensor take(at::IntArrayRef shape) {
    std::size_t bytes = sizeof(float);
    for (auto d : shape) bytes *= static_cast<std::size_t>(d);
    const std::size_t needed = (bytes + alignment() - 1) / alignment() * alignment();
    void* p = nullptr;
    std::size_t capacity = 0;
    {
      std::lock_guard lock(mutex_);
      capacity = std::max(capacity_, needed);
      if (capacity == capacity_ && !idle_.empty()) {
        p = idle_.back();
        idle_.pop_back();
      }
    }
    if (!p) {
      p = std::aligned_alloc(alignment(), capacity);
      if (!p) throw std::bad_alloc();
      // NOTE: 4 KiB pages, not huge ones (MADV_NOHUGEPAGE, for kernels whose THP setting is
      // `always`): a buffer is faulted in once and then recycled, so its pages only cost the
      // first batches. There, on a VM that reports free memory to its host (virtio-balloon free
      // page reporting, this project's development VM), a fresh 2 MB huge page cost about 5 ms
      // to fault in and an epoch's first batch took 70-80 ms instead of 32-40 (traced after
      // another process freed 1 GiB, 4 runs each: the transform's time was 90-107 ms of page
      // faults with huge pages, 22-25 ms with 4 KiB ones); steady state is the same either way.
      // Advice only: where it fails, only the first batches pay.
      ::madvise(p, capacity, MADV_NOHUGEPAGE);
      std::lock_guard lock(mutex_);
      ++allocated_;
      if (capacity > capacity_) {  // a larger batch than any before: the idle buffers are too small
        for (void* q : idle_) std::free(q);
        idle_.clear();
        capacity_ = capacity;
      }
    }
    try {
      return at::from_blob(
          p, shape,
          [pool = shared_from_this(), capacity](void* q) { pool->give(q, capacity); },
          at::TensorOptions().dtype(at::kFloat));
    } catch (...) {
      give(p, capacity);
      throw;
    }
  }

  /// How many buffers were allocated fresh, not recycled (for tests).
  std::size_t allocated() const {
    std::lock_guard lock(mutex_);
    return allocated_;
  }

 private:
  void give(void* p, std::size_t capacity) {
    {
      std::lock_guard lock(mutex_);
      if (capacity == capacity_ && idle_.size() < keep) {
        idle_.push_back(p);
        return;
      }
    }
    std::free(p);
  }

  mutable std::mutex mutex_;
  std::size_t capacity_ = 0;
  std::size_t allocated_ = 0;
  std::vector<void*> idle_;
};

/// A batch's buffer could not be allocated. The fetches rethrow it rather than skip or blame
/// the sample that asked first.
class BatchBufferError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The images of a batch being made, [n, 3, side, side] floats, row by row. Where the loader
/// gives an allocator (a pinned slab, a worker process's shared-memory slot) the tensor is
/// taken at once. Otherwise a slab of `pool` is taken when the first image is ready to be
/// written, not when the batch starts: with worker threads the loader starts
/// prefetch_factor × workers batches at once and the workers finish the oldest first
/// (ThreadExecutor's ordered queue), so the batches still waiting hold no buffer (each held its
/// 38 MB from the start, and peak memory grew by that much per batch in flight: 853 MiB at 8
/// workers).
class BatchRows {
 public:
  BatchRows(BatchAllocator* allocator, std::shared_ptr<SlabPool> pool, std::int64_t n,
            std::int64_t side)
      : pool_(std::move(pool)), n_(n), side_(side) {
    if (allocator) {
      BatchAllocatorScope scope(allocator);
      take(coload::empty_batch_tensor({n, 3, side, side}, at::kFloat));
    }
  }

  /// Where image `k` goes; the first call takes the slab. Safe from any thread. Throws
  /// BatchBufferError when the slab cannot be had: the batch's error, not the sample's.
  float* row(std::size_t k) {
    std::lock_guard lock(mutex_);
    if (!base_) {
      try {
        take(pool_->take({n_, 3, side_, side_}));
      } catch (const std::exception& e) {
        throw BatchBufferError("cannot allocate the batch's buffer of " + std::to_string(n_) +
                               " x 3 x " + std::to_string(side_) + " x " + std::to_string(side_) +
                               " floats: " + e.what());
      }
    }
    return base_ + static_cast<std::int64_t>(k) * 3 * side_ * side_;
  }

  /// The batch's images; undefined when no row was asked for.
  at::Tensor images() const {
    std::lock_guard lock(mutex_);
    return images_;
  }

 private:
  void take(at::Tensor images) {
    images_ = std::move(images);
    base_ = images_.data_ptr<float>();
  }

  mutable std::mutex mutex_;
  std::shared_ptr<SlabPool> pool_;
  std::int64_t n_;
  std::int64_t side_;
  at::Tensor images_;
  float* base_ = nullptr;
};

}  // namespace coload::vision::detail
