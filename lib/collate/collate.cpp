// default_collate's tensor stacking, and where batches are allocated (BatchAllocator).

#include "coload/collate/collate.hpp"
#include "coload/collate/batch_allocator.hpp"

#include <ATen/ATen.h>

#include <cstring>

namespace coload::detail {

namespace {
bool stackable_by_copy(const std::vector<at::Tensor>& samples) {
  const at::Tensor& first = samples.front();
  if (!first.defined() || !first.device().is_cpu() || first.is_quantized() || first.is_sparse() ||
      first.layout() != at::kStrided) {
    return false;
  }
  for (const auto& t : samples) {
    // Conjugate and negative views store bytes that differ from their values: let stack resolve.
    // A sample that requires grad: stack records the graph (the batch's grad_fn), as PyTorch's.
    if (!t.defined() || !t.device().is_cpu() || t.is_conj() || t.is_neg() || t.requires_grad() ||
        t.scalar_type() != first.scalar_type() ||
        t.sizes() != first.sizes() || t.layout() != first.layout() || t.is_sparse()) {
      return false;
    }
  }
  return true;
}
}  // namespace

at::Tensor stack_samples(const std::vector<at::Tensor>& samples) {
  if (samples.empty()) return at::Tensor();
  // NOTE: at::stack makes one unsqueezed view per sample; for the common case (same shape,
  // CPU) copying each sample's bytes into one fresh tensor is several times cheaper.
  if (!stackable_by_copy(samples)) return at::stack(samples, 0);
  const at::Tensor& first = samples.front();
  std::vector<std::int64_t> shape;
  shape.reserve(first.dim() + 1);
  shape.push_back(static_cast<std::int64_t>(samples.size()));
  shape.insert(shape.end(), first.sizes().begin(), first.sizes().end());
  at::Tensor out = empty_batch_tensor(shape, first.options());
  const std::size_t row_bytes = first.nbytes();
  auto* dst = static_cast<char*>(out.data_ptr());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const at::Tensor& t = samples[i];
    if (t.is_contiguous()) {
      std::memcpy(dst + i * row_bytes, t.data_ptr(), row_bytes);
    } else {
      out.select(0, static_cast<std::int64_t>(i)).copy_(t);
    }
  }
  return out;
}

at::Tensor tensor_from_values(const void* data, std::int64_t count, c10::ScalarType dtype) {
  at::Tensor out = empty_batch_tensor({count}, at::TensorOptions().dtype(dtype));
  std::memcpy(out.data_ptr(), data, out.nbytes());
  return out;
}

}  // namespace coload::detail

namespace coload {

namespace {
thread_local BatchAllocator* t_batch_allocator = nullptr;
}  // namespace

BatchAllocator* detail::current_batch_allocator() noexcept { return t_batch_allocator; }

BatchAllocatorScope::BatchAllocatorScope(BatchAllocator* allocator) noexcept
    : previous_(t_batch_allocator) {
  t_batch_allocator = allocator;
}
BatchAllocatorScope::~BatchAllocatorScope() { t_batch_allocator = previous_; }

at::Tensor empty_batch_tensor(at::IntArrayRef sizes, at::TensorOptions options) {
  options = options.memory_format(c10::nullopt);
  if (BatchAllocator* a = t_batch_allocator; a && options.device().is_cpu()) {
    std::int64_t numel = 1;
    for (auto s : sizes) numel *= s;
    const std::size_t nbytes =
        static_cast<std::size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
    if (BatchMemory m = nbytes ? a->allocate_owned(nbytes) : BatchMemory{}; m.data) {
      if (!m.owner) {
        // The allocator owns the memory: the tensor only borrows it.
        return at::from_blob(m.data, sizes, [](void*) {}, options);
      }
      return at::from_blob(m.data, sizes, [owner = std::move(m.owner)](void*) {}, options);
    }
  }
  return at::empty(sizes, options);
}

}  // namespace coload
