// ShardImagePipeline: shard samples decoded and transformed straight into the batch.

#include "coload/vision/shard_pipeline.hpp"

#include <ATen/ATen.h>

#include <charconv>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "coload/collate/batch_allocator.hpp"
#include "coload/coro/when_all.hpp"
#include "coload/core/error.hpp"
#include "coload/core/metrics.hpp"
#include "coload/io/reader.hpp"
#include "coload/vision/decode.hpp"
#include "jpeg_restart.hpp"
#include "slab_pool.hpp"

namespace coload::vision {
namespace {

// The restart intervals the shard's index records for a sample's JPEG member, handed to the
// region decoder for the duration of the sample's transform (see detail::RestartHint).
class RestartScope {
 public:
  RestartScope(const shards::ShardDataset& shards, Index index, const shards::ShardSample& sample) {
    const auto loc = shards.locate(index);
    const shards::ShardIndex& shard = shards.shards()[loc.shard];
    const shards::IndexSample& s = shard.samples[loc.sample];
    for (std::uint32_t k = s.first; k < s.first + s.count; ++k) {
      const shards::IndexMember& m = shard.members[k];
      const shards::ShardField* field = m.restarts.marked() ? sample.find(m.field) : nullptr;
      if (!field) continue;
      member_ = sample.key + "." + m.field;
      hint_.emplace(detail::RestartHint{sample.data.bytes().data() + field->offset, field->size,
                                        &m.restarts, &sample.shard, &member_});
      return;
    }
  }

 private:
  std::string member_;
  std::optional<detail::ScopedRestartHint> hint_;
};

}  // namespace

ShardImagePipeline::ShardImagePipeline(shards::ShardDataset shards, Transform transform,
                                       Label label, int num_classes)
    : shards_(std::move(shards)),
      transform_(std::move(transform)),
      label_(std::move(label)),
      num_classes_(num_classes),
      slabs_(std::make_shared<detail::SlabPool>()) {
  detail::check_square_output(transform_, "ShardImagePipeline");
  if (num_classes < 0) {
    throw InvalidArgument("ShardImagePipeline: num_classes must be >= 0 (0: the batch op's own), got " +
                          std::to_string(num_classes));
  }
}

int ShardImagePipeline::output_size() const noexcept { return fused_output_size(transform_); }

std::int64_t ShardImagePipeline::cls_label(const shards::ShardSample& sample) {
  std::string text = sample.text("cls");
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.pop_back();
  }
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
    throw InvalidArgument("sample '" + sample.key + "' of shard '" + sample.shard +
                          "': its cls field '" + text.substr(0, 40) + "' is not an integer");
  }
  return v;
}

std::span<const std::byte> ShardImagePipeline::image_field(const shards::ShardSample& sample) {
  for (const char* name : {"jpg", "jpeg", "png", "webp"}) {
    if (sample.find(name)) return sample.field(name);
  }
  return sample.field("jpg");  // throws, naming the fields the sample has
}

std::int64_t ShardImagePipeline::label_of(const shards::ShardSample& sample) const {
  return label_ ? label_(sample) : cls_label(sample);
}

void ShardImagePipeline::transform_into(const shards::ShardSample& sample, Rng& rng,
                                        float* dst) const {
  try {
    const auto encoded = image_field(sample);
    fused_apply(transform_, encoded, rng, dst);
  } catch (const DecompressionBombError& e) {
    // As ImagePipeline: the bomb keeps its type, naming the sample where a folder's names its file.
    throw e.with_path("sample '" + sample.key + "' in shard '" + sample.shard + "'");
  } catch (const std::exception& e) {
    throw RuntimeError("cannot load image of sample '" + sample.key + "' in shard '" +
                       sample.shard + "': " + e.what());
  }
}

ShardImagePipeline::sample_type ShardImagePipeline::get(Index index, SampleContext& ctx) const {
  const int s = output_size();
  at::Tensor image = at::empty({3, s, s}, at::kFloat);
  StageTimer read(Stage::read);
  const shards::ShardSample sample = shards_.read(index);
  read.stop();
  record_bytes_read(sample.data.bytes().size());
  const RestartScope restarts(shards_, index, sample);
  transform_into(sample, ctx.rng, image.data_ptr<float>());
  return {std::move(image), label_of(sample)};
}

Task<bool> ShardImagePipeline::fetch_one(BatchContext& ctx, std::size_t position,
                                         detail::BatchRows& rows, std::int64_t* label,
                                         std::optional<shards::ShardSample>* fetched) const {
  std::string what;
  try {
    shards::ShardSample sample;
    if (fetched && *fetched) {
      sample = std::move(**fetched);  // arrived with its shard's multi-range GET
      co_await ctx.cpu();
    } else if (ctx.io) {
      const std::uint64_t begin = read_begin();
      try {
        sample = co_await shards_.read_async(*ctx.io, ctx.indices[position]);
      } catch (...) {
        // A failed read ends too: the wait for it was the thread's all the same.
        record_read(begin, 0, ctx.indices[position]);
        throw;
      }
      record_read(begin, sample.data.bytes().size(), ctx.indices[position]);
      co_await ctx.cpu();
    } else {
      co_await ctx.cpu();
      StageTimer read(Stage::read);
      sample = shards_.read(ctx.indices[position]);
      read.stop();
      record_bytes_read(sample.data.bytes().size());
    }
    SampleContext sc = ctx.sample(position);
    *label = label_of(sample);
    const RestartScope restarts(shards_, ctx.indices[position], sample);
    transform_into(sample, sc.rng, rows.row(position));
    co_return true;
  } catch (const detail::BatchBufferError&) {
    throw;  // the batch's, not the sample's
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (!ctx.skip(position, what)) throw SampleError(ctx.loader_index(position), what);
  co_return false;
}

Task<bool> ShardImagePipeline::fetch_group(BatchContext& ctx, std::vector<std::size_t> group,
                                           detail::BatchRows& rows, std::int64_t* label,
                                           std::vector<char>& loaded) const {
  const std::uint64_t begin = read_begin();
  std::vector<std::optional<shards::ShardSample>> fetched;
  try {
    fetched = co_await shards_.prefetch_async(*ctx.io, ctx.indices, group);
  } catch (...) {
    record_read(begin, 0, ctx.indices[group.front()]);
    throw;
  }
  std::uint64_t bytes = 0;
  for (const auto& x : fetched) bytes += x ? x->data.bytes().size() : 0;
  record_read(begin, bytes, ctx.indices[group.front()]);
  std::vector<Task<bool>> loads;
  loads.reserve(group.size());
  for (std::size_t j = 0; j < group.size(); ++j) {
    loads.push_back(fetch_one(ctx, group[j], rows, label + group[j], &fetched[j]));
  }
  const std::vector<bool> done = co_await when_all(std::move(loads));
  for (std::size_t j = 0; j < group.size(); ++j) loaded[group[j]] = done[j];
  co_return true;
}

Task<ShardImagePipeline::batch_type> ShardImagePipeline::get_batch_async(
    std::span<const Index> indices, BatchContext& ctx) const {
  const auto n = static_cast<std::int64_t>(indices.size());
  const std::int64_t s = output_size();
  BatchAllocator* allocator =
      ctx.allocator ? ctx.allocator : coload::detail::current_batch_allocator();
  // As ImagePipeline: where the loader wants it, else a recycled slab taken when the first
  // image is ready (a fresh batch tensor costs thousands of page faults, a third of the
  // pipeline's time here).
  detail::BatchRows rows(allocator, std::static_pointer_cast<detail::SlabPool>(slabs_), n, s);
  at::Tensor labels;
  {
    BatchAllocatorScope scope(allocator);
    labels = coload::empty_batch_tensor({n}, at::kLong);
  }
  auto* label = labels.data_ptr<std::int64_t>();
  // Samples on a web server: a batch's members of one shard come a few at a time with one
  // multi-range GET (a ranged GET a sample cost the client and the server more CPU than the
  // bytes did), each group decoded as it arrives; fetch_one reads the rest one by one.
  std::vector<char> loaded(indices.size(), 0);  // written by groups on several threads: not bits
  std::vector<bool> grouped(indices.size(), false);
  std::vector<Task<bool>> loads;
  loads.reserve(indices.size());
  if (ctx.io) {
    for (std::vector<std::size_t>& group : shards_.remote_groups(ctx.indices)) {
      for (const std::size_t k : group) grouped[k] = true;
      loads.push_back(fetch_group(ctx, std::move(group), rows, label, loaded));
    }
  }
  const std::size_t groups = loads.size();
  std::vector<std::size_t> alone;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (grouped[k]) continue;
    alone.push_back(k);
    loads.push_back(fetch_one(ctx, k, rows, label + k, nullptr));
  }
  const std::vector<bool> done = co_await when_all(std::move(loads));
  for (std::size_t i = 0; i < alone.size(); ++i) loaded[alone[i]] = done[groups + i];
  std::vector<std::int64_t> keep;
  for (std::size_t k = 0; k < loaded.size(); ++k) {
    if (loaded[k]) keep.push_back(static_cast<std::int64_t>(k));
  }
  if (keep.empty()) throw EmptyBatch{};
  // Shards carry no class count: a batch op uses its own num_classes, else the one given.
  co_return detail::finish_batch(transform_, ctx, rows.images(), labels, keep, n, num_classes_);
}

}  // namespace coload::vision
