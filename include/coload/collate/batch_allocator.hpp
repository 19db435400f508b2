#pragma once
// BatchAllocator: where the tensors of a batch being collated get their memory.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>
#include <memory>

namespace coload {

/// Memory for a batch's output tensors. The loader installs one on the thread that collates
/// when the batch has a better home than the heap: a worker process's shared-memory slot (so
/// the batch is never copied on its way to the parent), and later pinned host memory.
/// default_collate and vision::ImagePipeline take their output from it through
/// empty_batch_tensor(); a collate of your own may do the same.
/// Memory for one tensor of a batch, and what keeps it alive: the tensor made from it holds
/// `owner` until it dies (nullptr: the memory is only lent, see empty_batch_tensor).
struct BatchMemory {
  void* data = nullptr;
  std::shared_ptr<void> owner;
};

class BatchAllocator {
 public:
  virtual ~BatchAllocator() = default;
  /// `nbytes` bytes aligned to 64, valid until the batch has been handed on; nullptr lets the
  /// caller allocate as usual.
  virtual void* allocate(std::size_t nbytes) = 0;
  /// `nbytes` bytes aligned to 64 that stay valid while the returned owner lives (pinned
  /// slabs: a tensor keeps its slab until it dies). By default, allocate()'s lent memory.
  virtual BatchMemory allocate_owned(std::size_t nbytes) { return {allocate(nbytes), nullptr}; }
};

/// Installs a BatchAllocator on the calling thread for the scope's life (nullptr: none).
class BatchAllocatorScope {
 public:
  explicit BatchAllocatorScope(BatchAllocator* allocator) noexcept;
  ~BatchAllocatorScope();
  BatchAllocatorScope(const BatchAllocatorScope&) = delete;
  BatchAllocatorScope& operator=(const BatchAllocatorScope&) = delete;

 private:
  BatchAllocator* previous_;
};

/// A contiguous, uninitialised tensor for a batch: from the calling thread's BatchAllocator
/// when one is installed (and serves), else from at::empty.
///
/// NOTE: memory from a BatchAllocator is lent for the batch's way out of the worker only: the
/// tensor must not be kept after the batch is returned.
at::Tensor empty_batch_tensor(at::IntArrayRef sizes, at::TensorOptions options);

namespace detail {
/// The calling thread's BatchAllocator, or nullptr.
BatchAllocator* current_batch_allocator() noexcept;
}  // namespace detail

}  // namespace coload
