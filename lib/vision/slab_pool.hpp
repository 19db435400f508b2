#pragma once
// SlabPool: recycled batch buffers of one size, shared by ImagePipeline and ShardImagePipeline.

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace coload::vision::detail {

/// Batch buffers of one size, recycled: a fresh 38 MB batch tensor per batch costs thousands
/// of page faults (it is above malloc's mmap threshold), more than resizing all its images.
/// Buffers come back when the consumer drops the batch; at most `keep` idle ones are kept.
class SlabPool : public std::enable_shared_from_this<SlabPool> {
 public:
  static constexpr std::size_t keep = 8;
  static constexpr std::size_t alignment = 2 << 20;  // lets the kernel back them with huge pages

  ~SlabPool() {
    for (void* p : idle_) std::free(p);
  }

  /// A float tensor of `shape` whose storage returns to this pool.
  at::Tensor take(at::IntArrayRef shape) {
    std::size_t bytes = sizeof(float);
    for (auto d : shape) bytes *= static_cast<std::size_t>(d);
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (bytes != bytes_) {  // a new size (the last, shorter batch): start over
        for (void* q : idle_) std::free(q);
        idle_.clear();
        bytes_ = bytes;
      }
      if (!idle_.empty()) {
        p = idle_.back();
        idle_.pop_back();
      }
    }
    if (!p) {
      const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
      p = std::aligned_alloc(alignment, rounded);
      if (!p) throw std::bad_alloc();
      ::madvise(p, rounded, MADV_HUGEPAGE);
    }
    return at::from_blob(
        p, shape,
        [pool = shared_from_this(), bytes](void* q) { pool->give(q, bytes); },
        at::TensorOptions().dtype(at::kFloat));
  }

 private:
  void give(void* p, std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      if (bytes == bytes_ && idle_.size() < keep) {
        idle_.push_back(p);
        return;
      }
    }
    std::free(p);
  }

  std::mutex mutex_;
  std::size_t bytes_ = 0;
  std::vector<void*> idle_;
};

}  // namespace coload::vision::detail
