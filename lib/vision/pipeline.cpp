// ImagePipeline: fused decode and transform of image folders straight into the batch.

#include "coload/vision/pipeline.hpp"
#include "coload/core/error.hpp"
#include "coload/core/metrics.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <exception>
#include <stdexcept>
#include <system_error>

#include "coload/collate/batch_allocator.hpp"
#include "coload/coro/when_all.hpp"
#include "coload/io/reader.hpp"
#include "coload/vision/decode.hpp"
#include "slab_pool.hpp"

namespace coload::vision {

using detail::SlabPool;

namespace {

/// The whole file at `path`, read with plain reads (outside a loader's reader).
std::vector<std::byte> read_whole_file(const std::string& path) {
  // NOTE: O_NONBLOCK so that opening a FIFO named like an image does not block the worker
  // (it is then refused unread); it changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw SystemError(errno, std::generic_category(), "cannot open '" + path + "'");
  }
  std::vector<std::byte> data;
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  // A FIFO or a device named like an image (/dev/zero would be read without end): refused unread.
  if (const char* what = stat_ok ? io::not_regular(st.st_mode) : nullptr) {
    ::close(fd);
    throw SystemError(EINVAL, std::generic_category(), "cannot read '" + path + "' (" + what + ")");
  }
  if (stat_ok && st.st_size > 0) data.reserve(static_cast<std::size_t>(st.st_size));
  std::byte chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      throw SystemError(e, std::generic_category(), "cannot read '" + path + "'");
    }
    if (n == 0) break;
    data.insert(data.end(), chunk, chunk + n);
  }
  ::close(fd);
  return data;
}

}  // namespace

at::Tensor DefaultImageLoader::operator()(const std::string& path) const {
  return PILToTensor{}(decode_file(path));
}

ImagePipeline::ImagePipeline(const std::filesystem::path& root, Transform transform,
                             FolderOptions options)
    : ImagePipeline(
          [&] {
            if (!options.extensions && !options.is_valid_file) {
              options.extensions.emplace(image_extensions.begin(), image_extensions.end());
            }
            return index_folder(root, options);
          }(),
          std::move(transform)) {}

ImagePipeline::ImagePipeline(FolderIndex index, Transform transform)
    : index_(std::make_shared<const FolderIndex>(std::move(index))),
      transform_(std::move(transform)),
      slabs_(std::make_shared<SlabPool>()) {
  detail::check_square_output(transform_, "ImagePipeline");
}

int ImagePipeline::output_size() const noexcept { return fused_output_size(transform_); }

void ImagePipeline::transform_into(std::span<const std::byte> encoded, const std::string& path,
                                   Rng& rng, float* dst) const {
  try {
    fused_apply(transform_, encoded, rng, dst);
  } catch (const DecompressionBombError& e) {
    throw e.with_path(path);
  } catch (const std::exception& e) {
    throw RuntimeError("cannot load image '" + path + "': " + e.what());
  }
}

ImagePipeline::sample_type ImagePipeline::get(Index index, SampleContext& ctx) const {
  const Index i = detail::checked_folder_index(index, size());
  const auto& sample = index_->samples[static_cast<std::size_t>(i)];
  const int s = output_size();
  at::Tensor image = at::empty({3, s, s}, at::kFloat);
  StageTimer read(Stage::read);
  const std::vector<std::byte> data = read_whole_file(sample.path);
  read.stop();
  record_bytes_read(data.size());
  transform_into(data, sample.path, ctx.rng, image.data_ptr<float>());
  return {std::move(image), sample.class_index};
}

Task<bool> ImagePipeline::fetch_one(BatchContext& ctx, std::size_t position,
                                     detail::BatchRows& rows) const {
  const Index i = detail::checked_folder_index(ctx.indices[position], size());
  const std::string& path = index_->samples[static_cast<std::size_t>(i)].path;
  std::string what;
  try {
    if (ctx.io) {
      const std::uint64_t begin = read_begin();
      io::Buffer data;
      try {
        data = co_await ctx.io->read_file(path);
      } catch (...) {
        // A failed read ends too: the wait for it was the thread's all the same.
        record_read(begin, 0, ctx.indices[position]);
        throw;
      }
      record_read(begin, data.bytes().size(), ctx.indices[position]);
      co_await ctx.cpu();
      SampleContext sample = ctx.sample(position);
      transform_into(data.bytes(), path, sample.rng, rows.row(position));
    } else {
      co_await ctx.cpu();
      SampleContext sample = ctx.sample(position);
      StageTimer read(Stage::read);
      const std::vector<std::byte> data = read_whole_file(path);
      read.stop();
      record_bytes_read(data.size());
      transform_into(data, path, sample.rng, rows.row(position));
    }
    co_return true;
  } catch (const detail::BatchBufferError&) {
    throw;  // the batch's, not the sample's
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (!ctx.skip(position, what)) throw SampleError(ctx.loader_index(position), what);
  co_return false;
}

Task<ImagePipeline::batch_type> ImagePipeline::get_batch_async(std::span<const Index> indices,
                                                              BatchContext& ctx) const {
  const auto n = static_cast<std::int64_t>(indices.size());
  const std::int64_t s = output_size();
  // The batch goes straight where the loader wants it (a pinned slab, a worker process's
  // shared-memory slot); otherwise into a recycled slab of the pipeline's own, taken when its
  // first image is ready.
  BatchAllocator* allocator =
      ctx.allocator ? ctx.allocator : coload::detail::current_batch_allocator();
  detail::BatchRows rows(allocator, std::static_pointer_cast<SlabPool>(slabs_), n, s);
  at::Tensor labels;
  {
    BatchAllocatorScope scope(allocator);
    labels = coload::empty_batch_tensor({n}, at::kLong);
  }
  auto* label = labels.data_ptr<std::int64_t>();
  std::vector<Task<bool>> loads;
  loads.reserve(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const Index i = detail::checked_folder_index(indices[k], size());
    label[k] = index_->samples[static_cast<std::size_t>(i)].class_index;
    loads.push_back(fetch_one(ctx, k, rows));
  }
  const std::vector<bool> loaded = co_await when_all(std::move(loads));
  std::vector<std::int64_t> keep;
  keep.reserve(loaded.size());
  for (std::size_t k = 0; k < loaded.size(); ++k) {
    if (loaded[k]) keep.push_back(static_cast<std::int64_t>(k));
  }
  if (keep.empty()) throw EmptyBatch{};
  co_return detail::finish_batch(transform_, ctx, rows.images(), labels, keep, n,
                                 static_cast<int>(index_->classes.size()));
}

}  // namespace coload::vision
