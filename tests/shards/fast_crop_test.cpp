// Shards whose JPEGs carry restart markers (coload-shard --fast-crop): the index records them,
// and the image pipeline gives the batches it gives over plain shards of the same images.

#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "../vision/image_test_support.hpp"
#include "coload/coload.hpp"
#include "coload/core/warning.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/writer.hpp"
#include "coload/vision/shard_pipeline.hpp"
#include "shards_test_support.hpp"
#include "vision/jpeg_restart.hpp"

namespace coload {

namespace fs = std::filesystem;
using shards_test::bytes_of;
using shards_test::TempDir;

namespace {

constexpr int images = 24;

// Image i: a 4:2:0 JPEG of a size that varies with i, marked every 4 MCUs or not.
std::vector<std::byte> image(int i, bool marked) {
  auto jpg = vision::test::synthetic_jpeg(208 + i % 5 * 24, 176 + i % 3 * 16,
                                          static_cast<std::uint32_t>(i));
  if (!marked) return jpg;
  std::vector<std::byte> out;
  REQUIRE(vision::detail::add_restart_markers(jpg, 4, out) ==
          vision::detail::RestartOutcome::marked);
  return out;
}

void write(const fs::path& dir, bool marked) {
  shards::Writer writer(dir, {.shard_size = 200000});
  for (int i = 0; i < images; ++i) {
    const auto jpg = image(i, marked);
    const std::string cls = std::to_string(i % 4);
    const shards::WriteField fields[] = {{"jpg", jpg}, {"cls", bytes_of(cls)}};
    writer.write("img" + std::to_string(i), fields);
  }
  writer.finish();
}

std::vector<at::Tensor> epoch(const fs::path& dir, const vision::FusedTransform& transform,
                              int workers, Executor executor) {
  vision::ShardImagePipeline pipe(shards::ShardDataset(dir), transform);
  auto loader = make_data_loader(pipe, LoaderOptions<>{.batch_size = 5, .shuffle = true,
                                                       .num_workers = workers, .seed = 11,
                                                       .executor = executor});
  std::vector<at::Tensor> out;
  for (auto& [batch, labels] : loader) out.push_back(batch.clone());
  return out;
}

}  // namespace

TEST_SUITE("shards") {

TEST_CASE("index version 2: a member's restart rows round-trip; version 1 still reads; a "
          "malformed or outlying restart field makes the index invalid") {
  shards::ShardIndex index;
  index.path = "x.tar";
  index.file_size = 100000;
  index.mtime_ns = 7;
  index.members = {{"jpg", 512, 60000, {2, {620, 2000, 4100}}}, {"cls", 61440, 1, {}}};
  index.samples = {{"k", 0, 2, 512, 61441}};
  const std::string text = shards::format_index(index);
  CHECK(text.rfind("coload-shard-index\t2\n", 0) == 0);
  CHECK(text.find("\tjpg\t2:620,1380,2100\n") != std::string::npos);
  shards::ShardIndex back;
  REQUIRE(shards::parse_index(text, 100000, back));
  CHECK((back.members == index.members));
  // Without restart rows the file is version 1, as before, and reads the same.
  index.members[0].restarts = {};
  const std::string v1 = shards::format_index(index);
  CHECK(v1.rfind("coload-shard-index\t1\n", 0) == 0);
  REQUIRE(shards::parse_index(v1, 100000, back));
  CHECK_FALSE(back.members[0].restarts.marked());
  // A fifth field in version 1, and restart fields that are not rows of the member.
  auto with = [&](const std::string& version, const std::string& field) {
    std::string t = "coload-shard-index\t" + version + "\n100000\t7\t2\t1\n" +
                    "512\t60000\tk\tjpg\t" + field + "\n61440\t1\tk\tcls\n";
    return shards::parse_index(t, 100000, back);
  };
  CHECK(with("2", "2:620,1380"));
  CHECK_FALSE(with("1", "2:620,1380"));
  CHECK_FALSE(with("2", "0:620"));           // no interval
  CHECK_FALSE(with("2", "2:"));              // no rows
  CHECK_FALSE(with("2", "2:620,0"));         // a row of no bytes
  CHECK_FALSE(with("2", "2:620,60000"));     // past the member's end
  CHECK_FALSE(with("2", "2:620,x"));
  CHECK_FALSE(with("3", "2:620"));
}

TEST_CASE("--fast-crop shards: the index records each marked JPEG's rows (version 2), and every "
          "recipe gives the batches of plain shards, with threads and processes") {
  TempDir plain, fast;
  write(plain.path, false);
  write(fast.path, true);
  const shards::ShardDataset plain_set(plain.path), fast_set(fast.path);
  int marked = 0;
  for (const auto& index : fast_set.shards()) {
    // Version 3: Writer records a checksum (and the restarts, as version 2 did).
    CHECK(shards_test::read_text(shards::index_path(index.path)).rfind("coload-shard-index\t3\n", 0) == 0);
    for (const auto& sample : index.samples) {
      const int i = std::stoi(sample.key.substr(3));
      for (std::uint32_t k = sample.first; k < sample.first + sample.count; ++k) {
        const auto& m = index.members[k];
        if (m.field != "jpg") {
          CHECK_FALSE(m.restarts.marked());
          continue;
        }
        ++marked;
        // 208..304 pixels wide: 13..19 MCUs, so 4 or fewer MCUs an interval dividing the row.
        const int per_row = (208 + i % 5 * 24 + 15) / 16;
        CHECK(m.restarts.interval ==
              static_cast<std::uint32_t>(vision::detail::restart_interval_for(per_row, 4)));
        CHECK(m.restarts.rows.size() == static_cast<std::size_t>((176 + i % 3 * 16) / 16));
      }
    }
  }
  CHECK(marked == images);
  for (const auto& index : plain_set.shards()) {
    CHECK(shards_test::read_text(shards::index_path(index.path)).rfind("coload-shard-index\t3\n", 0) == 0);
    for (const auto& m : index.members) CHECK_FALSE(m.restarts.marked());
  }
  // Each transform, and whether its crops are small enough to go through the intervals (at
  // full scale or at a DCT scale alike): a crop covering most of its image (the eval centre
  // crop) decodes the whole image as before, and must still give the same batches.
  const std::vector<std::pair<vision::FusedTransform, bool>> transforms{
      {vision::TrainTransform{.size = 64}, true},
      {vision::TrainTransform{.size = 64, .dct_scaling = false}, true},
      {vision::EvalTransform{.resize_size = 72, .crop_size = 64, .dct_scaling = false}, false},
      {vision::Recipe{vision::RandomResizedCrop{48}, vision::RandomHorizontalFlip{},
                      vision::ToDtype{at::kFloat, true}}
           .with_dct_scaling(false),
       true},
      {vision::Recipe{vision::RandomResizedCrop{48}, vision::ToDtype{at::kFloat, true}}, true},
  };
  for (std::size_t t = 0; t < transforms.size(); ++t) {
    CAPTURE(t);
    const auto& [transform, through_intervals] = transforms[t];
    const auto want = epoch(plain.path, transform, 0, Executor::threads);
    const std::uint64_t before = vision::detail::restart_region_decodes();
    const auto got = epoch(fast.path, transform, 0, Executor::threads);
    // At least half the crops went through the intervals, where they can.
    if (through_intervals) {
      CHECK(vision::detail::restart_region_decodes() - before >= images / 2);
    }
    const auto by_processes = epoch(fast.path, transform, 2, Executor::processes);
    REQUIRE(got.size() == want.size());
    REQUIRE(by_processes.size() == want.size());
    for (std::size_t b = 0; b < want.size(); ++b) {
      CHECK(at::equal(got[b], want[b]));
      CHECK(at::equal(by_processes[b], want[b]));
    }
  }
}

}  // TEST_SUITE

}  // namespace coload
