#pragma once
// The image-folder input pipeline: ImageFolder read through the loader's io_uring reader,
// decoded and transformed by the fused train or eval path straight into the batch tensor.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/recipe.hpp"
#include "coload/vision/transforms.hpp"

namespace coload::vision {

namespace detail {
class BatchRows;  // a batch's image rows, taken when the first is written (lib/vision)
}  // namespace detail

/// ImageFolder's default loader: the image at `path` as a [3, H, W] uint8 RGB tensor (as
/// PIL's `convert('RGB')` then `PILToTensor()`).
struct DefaultImageLoader {
  at::Tensor operator()(const std::string& path) const;
};

/// An ImageFolder whose samples are made by a fused transform: the standard ImageNet train
/// transform (RandomResizedCrop, flip, ToTensor, Normalize), the eval one (Resize,
/// CenterCrop, ToTensor, Normalize), or a Recipe of torchvision ops with a square output.
///
/// In a DataLoader it fetches whole batches asynchronously: every file of the batch is read
/// through the loader's reader (io_uring where the kernel allows) on the driver, then each
/// image is decoded and transformed on a worker straight into its row of the batch's
/// [N, 3, S, S] float tensor. A batch is `{images, labels}` (labels int64 [N]). The crop and
/// flip of a sample come from its own Rng, so they do not depend on which worker ran it.
/// With the loader's `on_error = skip` an unreadable or undecodable image is left out.
///
/// `get(index, ctx)` gives one sample `{image [3, S, S], label}` without a loader.
class ImagePipeline {
 public:
  using Transform = FusedTransform;
  using sample_type = std::pair<at::Tensor, std::int64_t>;
  using batch_type = std::pair<at::Tensor, at::Tensor>;

  /// Indexes `root` as ImageFolder does (std::runtime_error naming the root when it is
  /// missing or has no class folder). A recipe whose output is not square is refused
  /// (std::invalid_argument).
  ImagePipeline(const std::filesystem::path& root, Transform transform,
                FolderOptions options = {});
  /// Over an existing index.
  ImagePipeline(FolderIndex index, Transform transform);

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(index_->samples.size()); }
  /// One sample, read with plain reads and transformed at once.
  sample_type get(Index index, SampleContext& ctx) const;
  /// A whole batch, as the loader fetches it.
  Task<batch_type> get_batch_async(std::span<const Index> indices, BatchContext& ctx) const;

  /// The index (classes, samples, targets), shared by copies.
  const FolderIndex& index() const noexcept { return *index_; }
  /// The side of the square output images.
  int output_size() const noexcept;
  /// The transform.
  const Transform& transform() const noexcept { return transform_; }

  /// Decodes `encoded` (the file at `path`) and writes the transformed image into `dst`
  /// (3 × S × S floats), drawing from `rng`. Errors name the path.
  void transform_into(std::span<const std::byte> encoded, const std::string& path, Rng& rng,
                      float* dst) const;

 private:
  Task<bool> fetch_one(BatchContext& ctx, std::size_t position, detail::BatchRows& rows) const;

  std::shared_ptr<const FolderIndex> index_;
  Transform transform_;
  std::shared_ptr<void> slabs_;  // recycled batch buffers, shared by copies
};

}  // namespace coload::vision
