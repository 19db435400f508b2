#include "coload/collate/collate.hpp"

#include <ATen/ATen.h>

#include <cstring>

namespace coload::detail {

namespace {
bool stackable_by_copy(const std::vector<at::Tensor>& samples) {
  const at::Tensor& first = samples.front();
  if (!first.defined() || !first.device().is_cpu() || first.is_quantized() || first.is_sparse()) {
    return false;
  }
  for (const auto& t : samples) {
    // Conjugate and negative views store bytes that differ from their values: let stack resolve.
    if (!t.defined() || !t.device().is_cpu() || t.is_conj() || t.is_neg() ||
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
  at::Tensor out = at::empty(shape, first.options().memory_format(at::MemoryFormat::Contiguous));
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
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(dtype));
  std::memcpy(out.data_ptr(), data, out.nbytes());
  return out;
}

}  // namespace coload::detail
