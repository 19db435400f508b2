// coload/coload.hpp is "the one include": a translation unit that includes nothing else names
// every module's main types, and the loader's concepts accept its datasets. (A newcomer's first
// build with only this include failed: "'coload::vision' has not been declared", then errors
// about ::pipe, which the failed declaration of a variable `pipe` left to POSIX's pipe().)
// one_include.py checks that no public header is left out.
#include "coload/coload.hpp"

namespace {

// vision/
static_assert(coload::MapDataset<coload::vision::ImagePipeline>);
static_assert(coload::MapDataset<coload::vision::ImageFolder<>>);
static_assert(coload::MapDataset<coload::vision::ShardImagePipeline>);
[[maybe_unused]] coload::vision::TrainTransform (*train_transform)() = nullptr;
// shards/
static_assert(coload::MapDataset<coload::shards::ShardDataset>);
static_assert(coload::IterableDataset<coload::shards::ShardStream>);
[[maybe_unused]] coload::shards::Writer* writer = nullptr;
// io/ and device/
[[maybe_unused]] coload::io::Reader* reader = nullptr;
[[maybe_unused]] coload::PinnedPool* pinned_pool = nullptr;
// loader/, dataset/, sampler/ (what the README's first snippet uses)
static_assert(coload::MapDataset<coload::TensorDataset>);
[[maybe_unused]] coload::LoaderOptions<> options{.batch_size = 4};

}  // namespace
