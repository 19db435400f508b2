#pragma once
// ShardImagePipeline: ImagePipeline's fused train and eval transforms over tar shards: each
// sample's image field decoded straight into the batch, its label from `cls` or a function.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "coload/coro/task.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/vision/pipeline.hpp"

namespace coload::vision {

/// Image samples of tar shards (WebDataset layout) with ImagePipeline's transforms.
///
/// In a DataLoader it fetches whole batches asynchronously: each sample is read with one
/// ranged read through the loader's reader on the driver (from a web server, a batch's samples
/// of one shard a few to one multi-range GET: ShardDataset::remote_groups), then decoded (its
/// `jpg`, `jpeg`, `png` or `webp` field, the first present) and transformed on a worker
/// straight into its row of the [N, 3, S, S] float batch; the label comes from the `cls` field
/// (decimal text) or from `label`. A sample's crop and flip come from its own Rng, so batches
/// do not depend on the worker count. With the loader's `on_error = skip` a bad sample is left out.
class ShardImagePipeline {
 public:
  using Transform = ImagePipeline::Transform;
  using Label = std::function<std::int64_t(const shards::ShardSample&)>;
  using sample_type = std::pair<at::Tensor, std::int64_t>;
  using batch_type = std::pair<at::Tensor, at::Tensor>;

  /// Over `shards`, labelling with `label` (the `cls` field when empty). `num_classes` is the
  /// class count a recipe's MixUp or CutMix with num_classes 0 uses (shards carry none:
  /// coload-shard lists the classes in classes.txt beside them); 0 leaves it to the op.
  ShardImagePipeline(shards::ShardDataset shards, Transform transform, Label label = {},
                     int num_classes = 0);

  std::int64_t size() const noexcept { return shards_.size(); }
  /// One sample `{image [3, S, S], label}`, read with pread.
  sample_type get(Index index, SampleContext& ctx) const;
  /// A whole batch, as the loader fetches it.
  Task<batch_type> get_batch_async(std::span<const Index> indices, BatchContext& ctx) const;

  /// The shards.
  const shards::ShardDataset& shards() const noexcept { return shards_; }
  /// The side of the square output images.
  int output_size() const noexcept;

  /// The `cls` field as an integer (InvalidArgument naming the key and shard otherwise).
  static std::int64_t cls_label(const shards::ShardSample& sample);
  /// The encoded image: the first of the fields jpg, jpeg, png, webp that the sample has.
  static std::span<const std::byte> image_field(const shards::ShardSample& sample);

 private:
  Task<bool> fetch_one(BatchContext& ctx, std::size_t position, detail::BatchRows& rows,
                       std::int64_t* label, std::optional<shards::ShardSample>* fetched) const;
  Task<bool> fetch_group(BatchContext& ctx, std::vector<std::size_t> group,
                         detail::BatchRows& rows, std::int64_t* label,
                         std::vector<char>& loaded) const;
  void transform_into(const shards::ShardSample& sample, Rng& rng, float* dst) const;
  std::int64_t label_of(const shards::ShardSample& sample) const;

  shards::ShardDataset shards_;
  Transform transform_;
  Label label_;
  int num_classes_ = 0;
  std::shared_ptr<void> slabs_;  // recycled batch buffers, shared by copies
};

}  // namespace coload::vision
