#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// Specification of the dataset module: TensorDataset, the dataset concepts, get_sample,
// SampleContext and the per-sample Rng; Subset, ConcatDataset and `a + b`, StackDataset and
// NamedStackDataset, random_split, the map adaptor and MNIST; torch::data's mapped datasets
// (`.map(Normalize<>(...))`, `.map(Stack<>())`) through the torch::data adapter.

#include <ATen/ATen.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>
#include <torch/data/datasets/map.h>
#include <torch/data/example.h>
#include <torch/data/samplers/sequential.h>
#include <torch/data/transforms/lambda.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"
#include "coload/collate/torch_data.hpp"
#include "coload/dataset/concat.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/iterable.hpp"
#include "coload/dataset/map.hpp"
#include "coload/dataset/mnist.hpp"
#include "coload/dataset/random_split.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/dataset/stack.hpp"
#include "coload/dataset/subset.hpp"
#include "coload/dataset/tensor_dataset.hpp"
#include "coload/dataset/torch_data.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/loader/errors.hpp"
#include "../support/idx_files.hpp"

using namespace coload;

namespace {

at::Tensor longs(std::vector<std::int64_t> values, std::vector<std::int64_t> shape) {
  return at::tensor(values).view(shape).clone();
}

bool same(const at::Tensor& t, const at::Tensor& expected) {
  return t.defined() && t.scalar_type() == expected.scalar_type() &&
         t.sizes() == expected.sizes() && at::equal(t, expected);
}

// x: [5, 3] float rows 0..14; y: [5] int64 labels 100..104.
TensorDataset make_dataset() {
  return TensorDataset{at::arange(15, at::kFloat).view({5, 3}), at::arange(100, 105, at::kLong)};
}

// The message of the exception of type E that `f` throws, or "" if it throws none.
template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// --- small datasets for the concepts -----------------------------------------------------------

struct PlainOnly {
  std::int64_t size() const { return 4; }
  int get(Index i) { return static_cast<int>(i) * 10; }
};

struct ContextOnly {
  std::int64_t size() const { return 4; }
  std::string get(Index i, SampleContext& ctx) {
    return std::to_string(i) + "@" + std::to_string(ctx.epoch);
  }
};

// Offers both: get_sample must prefer the contextual one, and sample_t follows it.
struct Both {
  int plain_calls = 0;
  int context_calls = 0;
  std::int64_t size() const { return 4; }
  int get(Index) {
    ++plain_calls;
    return -1;
  }
  std::string get(Index i, SampleContext& ctx) {
    ++context_calls;
    ctx.epoch += 100;  // the context is passed by reference
    return "ctx " + std::to_string(i) + " " + std::to_string(ctx.index);
  }
};

struct NoSize {
  int get(Index) { return 0; }
};

struct NoGet {
  std::int64_t size() const { return 1; }
};

struct Batched {
  std::int64_t size() const { return 3; }
  int get(Index) { return 0; }
  std::vector<int> get_batch(std::span<const Index> indices) {
    return std::vector<int>(indices.begin(), indices.end());
  }
};

// The first `n` 64-bit draws of a stream.
std::vector<std::uint64_t> draws(Rng rng, int n) {
  std::vector<std::uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(rng.next_u64());
  return out;
}

// --- datasets for the adaptors --------------------------------------------------------------

// Sample i is offset + i: every value says which dataset and index it came from.
struct Range {
  std::int64_t offset = 0;
  std::int64_t n = 0;
  std::int64_t size() const { return n; }
  std::int64_t get(Index i) const {
    if (i < 0 || i >= n) throw std::out_of_range("Range index " + std::to_string(i));
    return offset + i;
  }
};

// As Range, but wants the context: sample i is (offset + i, the first draw of ctx.rng).
struct RangeCtx {
  std::int64_t offset = 0;
  std::int64_t n = 0;
  std::int64_t size() const { return n; }
  std::pair<std::int64_t, std::uint64_t> get(Index i, SampleContext& ctx) const {
    return {offset + i, ctx.rng.next_u64()};
  }
};

// Records the indices get_batch was asked for.
struct RecordingBatched {
  std::vector<Index> asked;
  std::int64_t size() const { return 10; }
  std::int64_t get(Index i) const { return i; }
  std::vector<std::int64_t> get_batch(std::span<const Index> indices) {
    asked.assign(indices.begin(), indices.end());
    return std::vector<std::int64_t>(indices.begin(), indices.end());
  }
};

// Samples 0..size()-1 of a dataset with get(index).
template <class D>
std::vector<std::int64_t> values(D& ds) {
  std::vector<std::int64_t> out;
  for (Index i = 0; i < ds.size(); ++i) out.push_back(ds.get(i));
  return out;
}

// The indices of each subset.
template <class D>
std::vector<std::vector<Index>> split_of(const std::vector<Subset<D>>& subsets) {
  std::vector<std::vector<Index>> out;
  for (const auto& s : subsets) out.push_back(s.indices());
  return out;
}

// --- IDX files ---------------------------------------------------------------------------------

namespace fs = std::filesystem;
using namespace coload::test;

// A fresh, empty directory, removed with the object.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("coload_dataset_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// CRC-32 (the gzip trailer's), bit by bit.
std::uint32_t crc32_of(const std::string& bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Writes `bytes` as a gzip file of stored (uncompressed) deflate blocks: what zlib reads, made
// without linking zlib into the test.
void write_gz(const fs::path& path, const std::string& bytes) {
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  auto put16 = [&out](std::uint32_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>((v >> 8) & 0xff));
  };
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(bytes.size() - at, 65535);
    out.push_back(at + n == bytes.size() ? '\x01' : '\x00');  // BFINAL, BTYPE 00 (stored)
    put16(static_cast<std::uint32_t>(n));
    put16(static_cast<std::uint32_t>(~n & 0xffff));
    out.append(bytes, at, n);
    at += n;
  } while (at < bytes.size());
  const std::uint32_t crc = crc32_of(bytes);
  put16(crc & 0xffff);
  put16(crc >> 16);
  const auto size = static_cast<std::uint32_t>(bytes.size());
  put16(size & 0xffff);
  put16(size >> 16);
  write_plain(path, out);
}

at::Tensor expected_image(std::size_t k) {
  std::vector<std::uint8_t> px;
  for (std::size_t p = 0; p < 28 * 28; ++p) px.push_back(pixel(k, p));
  return at::from_blob(px.data(), {28, 28}, at::kByte).clone();
}

}  // namespace

TEST_SUITE("dataset") {
  TEST_CASE("a TensorDataset has as many samples as its tensors have rows") {
    TensorDataset ds = make_dataset();
    CHECK(ds.size() == 5);
    REQUIRE(ds.tensors().size() == 2);
    CHECK(ds.tensors()[0].sizes() == at::IntArrayRef{5, 3});
    CHECK(ds.tensors()[1].sizes() == at::IntArrayRef{5});
    TensorDataset single{at::zeros({7, 2, 2})};
    CHECK(single.size() == 7);
  }

  TEST_CASE("TensorDataset::get returns row index of each tensor, counting negatives from the end") {
    TensorDataset ds = make_dataset();
    std::vector<at::Tensor> s = ds.get(1);
    REQUIRE(s.size() == 2);
    CHECK(same(s[0], at::tensor(std::vector<float>{3, 4, 5})));
    CHECK(s[1].dim() == 0);
    CHECK(s[1].item<std::int64_t>() == 101);

    std::vector<at::Tensor> last = ds.get(-1);
    CHECK(same(last[0], at::tensor(std::vector<float>{12, 13, 14})));
    CHECK(last[1].item<std::int64_t>() == 104);
    std::vector<at::Tensor> first = ds.get(-5);
    CHECK(same(first[0], at::tensor(std::vector<float>{0, 1, 2})));
    CHECK(first[1].item<std::int64_t>() == 100);
  }

  TEST_CASE("TensorDataset::get out of range throws") {
    TensorDataset ds = make_dataset();
    CHECK_THROWS_WITH_AS(ds.get(5), doctest::Contains("out of range"), c10::IndexError);
    CHECK_THROWS_AS(ds.get(-6), c10::IndexError);
    CHECK_THROWS_AS(ds.get(1000), c10::IndexError);
  }

  TEST_CASE("TensorDataset::get_batch equals the stack (and the default_collate) of the gets") {
    TensorDataset ds = make_dataset();
    const std::vector<Index> indices{3, 0, 3, 1};
    std::vector<at::Tensor> batch = ds.get_batch(indices);
    REQUIRE(batch.size() == 2);
    CHECK(same(batch[0], at::tensor(std::vector<float>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5})
                             .view({4, 3})));
    CHECK(same(batch[1], longs({103, 100, 103, 101}, {4})));

    std::vector<std::vector<at::Tensor>> samples;
    for (Index i : indices) samples.push_back(ds.get(i));
    for (std::size_t k = 0; k < 2; ++k) {
      std::vector<at::Tensor> column;
      for (const auto& s : samples) column.push_back(s[k]);
      CHECK(same(batch[k], at::stack(column)));
    }
    std::vector<at::Tensor> collated = default_collate(std::move(samples));
    REQUIRE(collated.size() == 2);
    CHECK(same(batch[0], collated[0]));
    CHECK(same(batch[1], collated[1]));
  }

  TEST_CASE("TensorDataset::get_batch copies: it outlives its indices and does not alias") {
    TensorDataset ds = make_dataset();
    std::vector<Index> indices{4, 2};
    std::vector<at::Tensor> batch = ds.get_batch(indices);
    indices = {0, 0};
    CHECK(same(batch[1], longs({104, 102}, {2})));
    batch[1].fill_(-1);
    CHECK(ds.get(4)[1].item<std::int64_t>() == 104);
    CHECK(ds.get(2)[1].item<std::int64_t>() == 102);
    std::vector<at::Tensor> none = ds.get_batch(std::span<const Index>{});
    CHECK(none[0].sizes() == at::IntArrayRef{0, 3});
    CHECK(none[1].sizes() == at::IntArrayRef{0});
  }

  TEST_CASE("TensorDataset::get_batch accepts negative indices as get does") {
    TensorDataset ds = make_dataset();
    const std::vector<Index> indices{-1, 0};
    std::vector<at::Tensor> batch = ds.get_batch(indices);
    CHECK(same(batch[1], longs({104, 100}, {2})));
  }

  TEST_CASE("TensorDataset refuses tensors of different first dimensions, none, or 0-dim ones") {
    const std::string mismatch = message_of<std::invalid_argument>(
        [] { TensorDataset ds{at::zeros({4, 2}), at::zeros({4}), at::zeros({5})}; });
    CHECK(mismatch.find("Size mismatch between tensors") != std::string::npos);
    CHECK(message_of<std::invalid_argument>(
              [] { TensorDataset ds{std::vector<at::Tensor>{}}; }) != "");
    CHECK(message_of<std::invalid_argument>(
              [] { TensorDataset ds{at::zeros({3}), at::scalar_tensor(1.0)}; }) != "");
    CHECK(message_of<std::invalid_argument>(
              [] { TensorDataset ds{at::zeros({3}), at::zeros({3, 1})}; }) == "");
  }

  TEST_CASE("the dataset concepts recognise what a dataset offers") {
    static_assert(MapDataset<TensorDataset>);
    static_assert(PlainGet<TensorDataset>);
    static_assert(!ContextualGet<TensorDataset>);
    static_assert(BatchedDataset<TensorDataset>);
    static_assert(std::same_as<sample_t<TensorDataset>, std::vector<at::Tensor>>);

    static_assert(MapDataset<PlainOnly> && PlainGet<PlainOnly> && !ContextualGet<PlainOnly>);
    static_assert(MapDataset<ContextOnly> && ContextualGet<ContextOnly> && !PlainGet<ContextOnly>);
    static_assert(MapDataset<Both> && ContextualGet<Both> && PlainGet<Both>);
    static_assert(!MapDataset<NoSize>);
    static_assert(!MapDataset<NoGet>);
    static_assert(!BatchedDataset<PlainOnly>);
    static_assert(MapDataset<Batched> && BatchedDataset<Batched>);

    static_assert(std::same_as<sample_t<PlainOnly>, int>);
    static_assert(std::same_as<sample_t<ContextOnly>, std::string>);
    static_assert(std::same_as<sample_t<Both>, std::string>);  // the contextual get wins
  }

  TEST_CASE("get_sample calls get(index, ctx) when present, get(index) otherwise") {
    SampleContext ctx;
    ctx.index = 2;
    ctx.epoch = 7;
    Both both;
    CHECK(get_sample(both, 2, ctx) == "ctx 2 2");
    CHECK(both.context_calls == 1);
    CHECK(both.plain_calls == 0);
    CHECK(ctx.epoch == 107);  // the same context, by reference

    ContextOnly only;
    SampleContext ctx3;
    ctx3.epoch = 3;
    CHECK(get_sample(only, 1, ctx3) == "1@3");

    PlainOnly plain;
    CHECK(get_sample(plain, 3, ctx) == 30);

    TensorDataset ds = make_dataset();
    std::vector<at::Tensor> s = get_sample(ds, 4, ctx);
    CHECK(s[1].item<std::int64_t>() == 104);
  }

  TEST_CASE("a default SampleContext is index 0, epoch 0, on no worker") {
    SampleContext ctx;
    CHECK(ctx.index == 0);
    CHECK(ctx.epoch == 0);
    CHECK(ctx.worker == nullptr);
    CHECK(draws(ctx.rng, 3) == draws(Rng{0}, 3));
  }

  TEST_CASE("Rng is splitmix64") {
    // The reference splitmix64 stream from state 0.
    CHECK(draws(Rng{0}, 3) == std::vector<std::uint64_t>{
                                  0xe220a8397b1dcdafULL, 0x6e789e6aa1b965f4ULL,
                                  0x06c45d188009454fULL});
    // for_sample(1, 2, 3) mixes the seed, the epoch and the index in turn.
    CHECK(Rng::for_sample(1, 2, 3).next_u64() == 0x3544760aafc31e1bULL);
  }

  TEST_CASE("Rng::for_sample is a pure function of (seed, epoch, index)") {
    CHECK(draws(Rng::for_sample(42, 3, 17), 8) == draws(Rng::for_sample(42, 3, 17), 8));
    const auto base = draws(Rng::for_sample(42, 3, 17), 4);
    CHECK(draws(Rng::for_sample(43, 3, 17), 4) != base);
    CHECK(draws(Rng::for_sample(42, 4, 17), 4) != base);
    CHECK(draws(Rng::for_sample(42, 3, 18), 4) != base);
    // Neighbouring samples of one epoch get distinct streams.
    std::set<std::uint64_t> firsts;
    for (Index i = 0; i < 1000; ++i) firsts.insert(Rng::for_sample(7, 0, i).next_u64());
    CHECK(firsts.size() == 1000);
    // Swapping epoch and index is a different stream too.
    CHECK(draws(Rng::for_sample(1, 2, 3), 2) != draws(Rng::for_sample(1, 3, 2), 2));
  }

  TEST_CASE("Rng::uniform lies in [0, 1) and randint in [low, high)") {
    Rng rng = Rng::for_sample(5, 0, 0);
    double lo = 1.0, hi = 0.0, sum = 0.0;
    for (int i = 0; i < 20000; ++i) {
      const double u = rng.uniform();
      REQUIRE(u >= 0.0);
      REQUIRE(u < 1.0);
      lo = std::min(lo, u);
      hi = std::max(hi, u);
      sum += u;
    }
    CHECK(lo < 0.01);
    CHECK(hi > 0.99);
    CHECK(sum / 20000 == doctest::Approx(0.5).epsilon(0.02));

    std::set<std::int64_t> seen;
    for (int i = 0; i < 5000; ++i) {
      const std::int64_t v = rng.randint(-3, 4);
      REQUIRE(v >= -3);
      REQUIRE(v < 4);
      seen.insert(v);
    }
    CHECK(seen == std::set<std::int64_t>{-3, -2, -1, 0, 1, 2, 3});
    for (int i = 0; i < 100; ++i) CHECK(rng.randint(10, 11) == 10);
    // A span wider than 2^32 stays in bounds.
    for (int i = 0; i < 1000; ++i) {
      const std::int64_t v = rng.randint(-(std::int64_t{1} << 40), std::int64_t{1} << 40);
      REQUIRE(v >= -(std::int64_t{1} << 40));
      REQUIRE(v < (std::int64_t{1} << 40));
    }
  }

  TEST_CASE("Rng::torch_generator is deterministic for equal Rngs and advances the stream") {
    Rng a = Rng::for_sample(9, 1, 2);
    Rng b = Rng::for_sample(9, 1, 2);
    at::Tensor ra = at::randint(1000, {16}, a.torch_generator(), at::kLong);
    at::Tensor rb = at::randint(1000, {16}, b.torch_generator(), at::kLong);
    CHECK(at::equal(ra, rb));
    // The Rngs have advanced in step, and the next generator differs from the first.
    CHECK(a.next_u64() == b.next_u64());
    at::Tensor again = at::randint(1000, {16}, a.torch_generator(), at::kLong);
    CHECK_FALSE(at::equal(ra, again));
    Rng c = Rng::for_sample(9, 1, 3);
    at::Tensor rc = at::randint(1000, {16}, c.torch_generator(), at::kLong);
    CHECK_FALSE(at::equal(ra, rc));
  }
}

TEST_SUITE("dataset") {
  // --- Subset --------------------------------------------------------------------------------

  TEST_CASE("Subset's sample i is the dataset's sample indices[i], negatives from the end") {
    Subset sub(Range{100, 10}, {7, 2, 2, 9});
    static_assert(std::same_as<decltype(sub), Subset<Range>>);
    CHECK(sub.size() == 4);
    CHECK(values(sub) == std::vector<std::int64_t>{107, 102, 102, 109});
    CHECK(sub.get(-1) == 109);
    CHECK(sub.get(-4) == 107);
    CHECK(sub.indices() == std::vector<Index>{7, 2, 2, 9});
    CHECK(sub.dataset().offset == 100);
    CHECK(message_of<std::out_of_range>([&] { sub.get(4); }) ==
          "Subset index 4 is out of range for a subset of size 4");
    CHECK(message_of<std::out_of_range>([&] { sub.get(-5); }) ==
          "Subset index -5 is out of range for a subset of size 4");
    Subset<Range> empty(Range{0, 3}, {});
    CHECK(empty.size() == 0);
  }

  TEST_CASE("Subset offers what its dataset offers") {
    static_assert(MapDataset<Subset<Range>> && PlainGet<Subset<Range>>);
    static_assert(!ContextualGet<Subset<Range>> && !BatchedDataset<Subset<Range>>);
    static_assert(MapDataset<Subset<RangeCtx>> && ContextualGet<Subset<RangeCtx>>);
    static_assert(!PlainGet<Subset<RangeCtx>>);
    static_assert(BatchedDataset<Subset<TensorDataset>>);
    static_assert(std::same_as<sample_t<Subset<TensorDataset>>, std::vector<at::Tensor>>);
    static_assert(std::same_as<sample_t<Subset<RangeCtx>>, sample_t<RangeCtx>>);
  }

  TEST_CASE("Subset passes the context through and get_batch through at the mapped indices") {
    Subset sub(RangeCtx{0, 5}, {4, 1});
    SampleContext ctx{1, 2, Rng::for_sample(3, 2, 1), nullptr};
    const auto [value, draw] = sub.get(1, ctx);
    CHECK(value == 1);
    CHECK(draw == Rng::for_sample(3, 2, 1).next_u64());

    Subset<RecordingBatched> rec(RecordingBatched{}, {9, 0, 5});
    const std::vector<Index> asked{2, 0, -1};
    CHECK(rec.get_batch(asked) == std::vector<std::int64_t>{5, 9, 5});
    CHECK(rec.dataset().asked == std::vector<Index>{5, 9, 5});

    Subset<TensorDataset> rows(make_dataset(), {4, 0, 2});
    const std::vector<Index> which{0, 2};
    std::vector<at::Tensor> batch = rows.get_batch(which);
    CHECK(same(batch[1], longs({104, 102}, {2})));
    CHECK(rows.get(1)[1].item<std::int64_t>() == 100);
  }

  TEST_CASE("Subsets made from one shared dataset share it") {
    auto shared = std::make_shared<Range>(Range{10, 4});
    Subset<Range> a(shared, {0, 1});
    Subset<Range> b(shared, {3});
    shared->offset = 20;
    CHECK(values(a) == std::vector<std::int64_t>{20, 21});
    CHECK(values(b) == std::vector<std::int64_t>{23});
    CHECK(a.dataset_ptr() == b.dataset_ptr());
    CHECK(message_of<std::invalid_argument>([] {
            Subset<Range> s(std::shared_ptr<Range>{}, {});
          }) == "Subset needs a dataset, got a null pointer");
  }

  // --- ConcatDataset and a + b ---------------------------------------------------------------

  TEST_CASE("ConcatDataset finds each index in its dataset, empty datasets included") {
    ConcatDataset<Range> cat({Range{0, 2}, Range{100, 0}, Range{200, 3}, Range{300, 1}});
    CHECK(cat.size() == 6);
    CHECK(cat.cumulative_sizes() == std::vector<std::int64_t>{2, 2, 5, 6});
    CHECK(values(cat) == std::vector<std::int64_t>{0, 1, 200, 201, 202, 300});
    CHECK(cat.locate(2) == std::pair<std::size_t, Index>{2, 0});
    CHECK(cat.locate(5) == std::pair<std::size_t, Index>{3, 0});
    static_assert(MapDataset<ConcatDataset<Range>> && PlainGet<ConcatDataset<Range>>);
    static_assert(!ContextualGet<ConcatDataset<Range>>);
  }

  TEST_CASE("ConcatDataset counts negative indices from the end, as PyTorch") {
    ConcatDataset<Range> cat({Range{0, 2}, Range{200, 3}});
    CHECK(cat.get(-1) == 202);
    CHECK(cat.get(-3) == 200);
    CHECK(cat.get(-4) == 1);
    CHECK(cat.get(-5) == 0);
    CHECK(message_of<std::invalid_argument>([&] { cat.get(-6); }) ==
          "absolute value of index should not exceed dataset length");
    CHECK(message_of<std::out_of_range>([&] { cat.get(5); }) ==
          "ConcatDataset index 5 is out of range for a dataset of size 5");
  }

  TEST_CASE("ConcatDataset refuses an empty list with PyTorch's message") {
    CHECK(message_of<std::invalid_argument>([] { ConcatDataset<Range> c(std::vector<Range>{}); }) ==
          "datasets should not be an empty iterable");
  }

  TEST_CASE("ConcatDataset passes the context through") {
    ConcatDataset<RangeCtx> cat({RangeCtx{0, 2}, RangeCtx{50, 2}});
    static_assert(ContextualGet<ConcatDataset<RangeCtx>> && !PlainGet<ConcatDataset<RangeCtx>>);
    SampleContext ctx{3, 0, Rng::for_sample(1, 0, 3), nullptr};
    const auto [value, draw] = cat.get(3, ctx);
    CHECK(value == 51);
    CHECK(draw == Rng::for_sample(1, 0, 3).next_u64());
  }

  TEST_CASE("a + b on two map-style datasets of one type is their ConcatDataset") {
    auto ab = Range{0, 2} + Range{10, 3};
    static_assert(std::same_as<decltype(ab), ConcatDataset<Range>>);
    CHECK(values(ab) == std::vector<std::int64_t>{0, 1, 10, 11, 12});
    // Chained, it stays one flat ConcatDataset with the samples of PyTorch's nested ones.
    auto abc = Range{0, 2} + Range{10, 3} + Range{20, 1};
    static_assert(std::same_as<decltype(abc), ConcatDataset<Range>>);
    CHECK(abc.datasets().size() == 3);
    CHECK(values(abc) == std::vector<std::int64_t>{0, 1, 10, 11, 12, 20});
    auto left = Range{5, 1} + (Range{0, 1} + Range{7, 2});
    CHECK(values(left) == std::vector<std::int64_t>{5, 0, 7, 8});
    auto both = (Range{0, 1} + Range{1, 1}) + (Range{2, 1} + Range{3, 1});
    CHECK(both.datasets().size() == 4);
    CHECK(values(both) == std::vector<std::int64_t>{0, 1, 2, 3});

    auto tensors = make_dataset() + make_dataset();
    static_assert(std::same_as<decltype(tensors), ConcatDataset<TensorDataset>>);
    CHECK(tensors.size() == 10);
    CHECK(tensors.get(7)[1].item<std::int64_t>() == 102);
  }

  // --- StackDataset ------------------------------------------------------------------------

  TEST_CASE("ChainDataset streams each dataset in turn with the same worker info; a + b chains") {
    struct Count {
      std::int64_t from, to;
      Generator<std::int64_t> stream(const WorkerInfo& info) {
        for (std::int64_t i = from + info.id; i < to; i += info.num_workers) co_yield i;
      }
      std::int64_t size() const { return to - from; }
    };
    struct Later {  // asynchronous, no size
      AsyncGenerator<std::int64_t> stream(const WorkerInfo& info) {
        co_await std::suspend_never{};
        co_yield 100 + info.id;
      }
    };
    static_assert(IterableDataset<Count> && IterableDataset<Later>);
    static_assert(!MapDataset<Count>);
    static_assert(std::is_same_v<stream_sample_t<Count>, std::int64_t>);
    static_assert(!async_stream_v<Count> && async_stream_v<Later>);

    ChainDataset sync_chain(Count{0, 3}, Count{10, 12});
    static_assert(std::is_same_v<decltype(sync_chain.stream(WorkerInfo{})),
                                 Generator<std::int64_t>>);
    CHECK(sync_chain.size() == 5);
    std::vector<std::int64_t> got;
    for (auto v : sync_chain.stream(WorkerInfo{0, 1})) got.push_back(v);
    CHECK(got == std::vector<std::int64_t>{0, 1, 2, 10, 11});
    got.clear();
    for (auto v : sync_chain.stream(WorkerInfo{1, 2})) got.push_back(v);
    CHECK(got == std::vector<std::int64_t>{1, 11});

    // One asynchronous part makes the chain asynchronous; (a + b) + (c + d) stays flat.
    auto mixed = (Count{0, 2} + Later{}) + (Later{} + Count{5, 6});
    static_assert(std::is_same_v<decltype(mixed), ChainDataset<Count, Later, Later, Count>>);
    static_assert(!coload::detail::HasSize<decltype(mixed)>);
    auto all = [](auto& chain, WorkerInfo info) -> Task<std::vector<std::int64_t>> {
      std::vector<std::int64_t> out;
      auto stream = chain.stream(info);
      while (auto* v = co_await stream.next()) out.push_back(*v);
      co_return out;
    };
    CHECK(sync_wait(all(mixed, WorkerInfo{0, 1})) == std::vector<std::int64_t>{0, 1, 100, 100, 5});
    CHECK(sync_wait(all(mixed, WorkerInfo{1, 2})) == std::vector<std::int64_t>{1, 101, 101});
  }

  TEST_CASE("a + b on map-style datasets of different types concatenates them through AnyDataset") {
    struct Squares {
      std::int64_t size() const { return 3; }
      std::int64_t get(Index i) const { return i * i; }
    };
    struct Negatives {
      std::int64_t size() const { return 2; }
      std::int64_t get(Index i, SampleContext& ctx) const { return -i - 10 * ctx.epoch; }
    };
    struct Sevens {
      std::int64_t size() const { return 1; }
      std::int64_t get(Index) const { return 7; }
    };
    auto mixed = Squares{} + Negatives{};
    static_assert(std::is_same_v<decltype(mixed), ConcatDataset<AnyDataset<std::int64_t>>>);
    auto more = std::move(mixed) + Sevens{};
    static_assert(std::is_same_v<decltype(more), ConcatDataset<AnyDataset<std::int64_t>>>);
    REQUIRE(more.size() == 6);
    CHECK(more.cumulative_sizes() == std::vector<std::int64_t>{3, 5, 6});
    std::vector<std::int64_t> got;
    for (Index i = 0; i < more.size(); ++i) {
      SampleContext ctx{i, 2, Rng(0), nullptr};
      got.push_back(get_sample(more, i, ctx));
    }
    CHECK(got == std::vector<std::int64_t>{0, 1, 4, -20, -21, 7});
    CHECK(more.datasets()[1].target<Negatives>() != nullptr);
    CHECK(more.datasets()[1].target<Squares>() == nullptr);
    auto loader = make_data_loader(std::move(more), {.batch_size = 6});
    for (auto& batch : loader) {
      CHECK(at::equal(batch, at::tensor(std::vector<std::int64_t>{0, 1, 4, 0, -1, 7})));
    }
  }

  TEST_CASE("StackDataset's sample is the tuple of its datasets' samples") {
    StackDataset stack(Range{0, 5}, make_dataset(), Range{50, 5});
    static_assert(std::same_as<decltype(stack), StackDataset<Range, TensorDataset, Range>>);
    static_assert(PlainGet<decltype(stack)> && !ContextualGet<decltype(stack)>);
    static_assert(std::same_as<sample_t<decltype(stack)>,
                               std::tuple<std::int64_t, std::vector<at::Tensor>, std::int64_t>>);
    CHECK(stack.size() == 5);
    auto [a, t, b] = stack.get(3);
    CHECK(a == 3);
    CHECK(t[1].item<std::int64_t>() == 103);
    CHECK(b == 53);

    // A dataset whose sample is itself a tuple stays one element of the stack's tuple.
    StackDataset<StackDataset<Range, Range>> nested(StackDataset(Range{0, 2}, Range{5, 2}));
    CHECK(nested.get(1) == std::tuple<std::tuple<std::int64_t, std::int64_t>>{{1, 6}});

    // default_collate makes the tuple of the columns.
    std::vector<sample_t<StackDataset<Range, Range>>> samples{{0, 5}, {1, 6}};
    auto batch = default_collate(std::move(samples));
    CHECK(same(std::get<1>(batch), longs({5, 6}, {2})));
  }

  TEST_CASE("StackDataset gives the context to the datasets that take one, in order") {
    StackDataset stack(RangeCtx{0, 3}, Range{10, 3}, RangeCtx{20, 3});
    using S = decltype(stack);
    static_assert(ContextualGet<S> && !PlainGet<S>);
    SampleContext ctx{2, 0, Rng::for_sample(4, 0, 2), nullptr};
    const auto [x, y, z] = stack.get(2, ctx);
    Rng expected = Rng::for_sample(4, 0, 2);
    CHECK(x.first == 2);
    CHECK(x.second == expected.next_u64());
    CHECK(y == 12);
    CHECK(z.first == 22);
    CHECK(z.second == expected.next_u64());
  }

  TEST_CASE("StackDataset refuses datasets of different sizes with PyTorch's message") {
    CHECK(message_of<std::invalid_argument>([] {
            StackDataset s(Range{0, 3}, Range{0, 4});
          }) == "Size mismatch between datasets");
    CHECK(message_of<std::invalid_argument>([] {
            StackDataset s(Range{0, 5}, Range{0, 5}, make_dataset(), Range{0, 4});
          }) == "Size mismatch between datasets");
  }

  TEST_CASE("NamedStackDataset's sample maps each name to its dataset's sample") {
    NamedStackDataset<Range> named({{"x", Range{0, 3}}, {"y", Range{100, 3}}});
    static_assert(PlainGet<NamedStackDataset<Range>>);
    CHECK(named.size() == 3);
    CHECK(named.get(2) == std::map<std::string, std::int64_t>{{"x", 2}, {"y", 102}});
    CHECK(message_of<std::invalid_argument>([] {
            NamedStackDataset<Range> n({{"x", Range{0, 3}}, {"y", Range{0, 2}}});
          }) == "Size mismatch between datasets");
    CHECK(message_of<std::invalid_argument>([] { NamedStackDataset<Range> n({}); }) ==
          "At least one dataset should be passed");

    NamedStackDataset<RangeCtx> ctxs({{"a", RangeCtx{0, 2}}, {"b", RangeCtx{9, 2}}});
    static_assert(ContextualGet<NamedStackDataset<RangeCtx>>);
    SampleContext ctx{1, 0, Rng::for_sample(0, 0, 1), nullptr};
    auto sample = ctxs.get(1, ctx);
    CHECK(sample.at("a").first == 1);
    CHECK(sample.at("b").first == 10);
    CHECK(sample.at("a").second != sample.at("b").second);
  }

  // --- random_split ----------------------------------------------------------------------------

  // Golden values from PyTorch 1.13 (/usr/bin/python3):
  //   import torch
  //   from torch.utils.data import random_split
  //   parts = random_split(range(n), lengths, generator=torch.Generator().manual_seed(seed))
  //   print([list(p.indices) for p in parts])
  TEST_CASE("random_split of 10 splits as PyTorch for seeds 0 and 42, lengths and fractions") {
    using Split = std::vector<std::vector<Index>>;
    // n=10, seed=0, [3, 7] and [0.3, 0.3, 0.4]
    CHECK(split_of(random_split(Range{0, 10}, {3, 7}, make_generator(0))) ==
          Split{{4, 1, 7}, {5, 3, 9, 0, 8, 6, 2}});
    CHECK(split_of(random_split(Range{0, 10}, {0.3, 0.3, 0.4}, make_generator(0))) ==
          Split{{4, 1, 7}, {5, 3, 9}, {0, 8, 6, 2}});
    // n=10, seed=42
    CHECK(split_of(random_split(Range{0, 10}, {3, 7}, make_generator(42))) ==
          Split{{2, 6, 1}, {8, 4, 5, 0, 9, 3, 7}});
    CHECK(split_of(random_split(Range{0, 10}, std::vector<double>{0.3, 0.3, 0.4},
                                make_generator(42))) == Split{{2, 6, 1}, {8, 4, 5}, {0, 9, 3, 7}});
  }

  TEST_CASE("random_split of 100 splits as PyTorch for seeds 0 and 42, lengths and fractions") {
    // The whole randperm(100) of each seed: the splits are its consecutive slices.
    const std::vector<Index> perm0{
        44, 19, 93, 90, 71, 69, 37, 95, 53, 91, 81, 42, 80, 85, 74, 56, 76, 63, 82, 40,
        26, 92, 57, 10, 16, 66, 89, 41, 97, 8,  31, 24, 35, 30, 65, 7,  98, 23, 20, 29,
        78, 61, 94, 15, 4,  52, 59, 5,  54, 46, 3,  28, 2,  70, 6,  60, 49, 68, 55, 72,
        79, 77, 45, 1,  32, 34, 11, 0,  22, 12, 87, 50, 25, 47, 36, 96, 9,  83, 62, 84,
        18, 17, 75, 67, 13, 48, 39, 21, 64, 88, 38, 27, 14, 73, 33, 58, 86, 43, 99, 51};
    const std::vector<Index> perm42{
        42, 96, 62, 98, 46, 95, 60, 24, 78, 16, 68, 70, 11, 13, 97, 52, 99, 19, 71, 10,
        89, 86, 18, 40, 5,  38, 9,  82, 83, 43, 32, 94, 67, 93, 75, 59, 79, 1,  50, 73,
        66, 45, 63, 58, 22, 3,  87, 4,  61, 51, 12, 74, 21, 20, 6,  35, 44, 48, 37, 33,
        15, 88, 31, 69, 27, 81, 85, 56, 7,  65, 47, 41, 29, 80, 57, 84, 36, 17, 34, 72,
        2,  91, 8,  53, 30, 90, 26, 23, 54, 76, 14, 55, 0,  64, 77, 39, 25, 92, 49, 28};
    auto slices = [](const std::vector<Index>& perm, std::vector<std::size_t> lengths) {
      std::vector<std::vector<Index>> out;
      std::size_t at = 0;
      for (std::size_t l : lengths) {
        out.emplace_back(perm.begin() + static_cast<std::ptrdiff_t>(at),
                         perm.begin() + static_cast<std::ptrdiff_t>(at + l));
        at += l;
      }
      return out;
    };
    // n=100, [30, 70] and [0.3, 0.3, 0.4] (which PyTorch makes 30, 30, 40)
    CHECK(split_of(random_split(Range{0, 100}, {30, 70}, make_generator(0))) ==
          slices(perm0, {30, 70}));
    CHECK(split_of(random_split(Range{0, 100}, {0.3, 0.3, 0.4}, make_generator(0))) ==
          slices(perm0, {30, 30, 40}));
    CHECK(split_of(random_split(Range{0, 100}, {30, 70}, make_generator(42))) ==
          slices(perm42, {30, 70}));
    CHECK(split_of(random_split(Range{0, 100}, {0.3, 0.3, 0.4}, make_generator(42))) ==
          slices(perm42, {30, 30, 40}));
  }

  // Golden values as above, with seed 1.
  TEST_CASE("random_split hands the fractions' remainder out round-robin, as PyTorch") {
    using Split = std::vector<std::vector<Index>>;
    // random_split(range(10), [0.25, 0.25, 0.5]): floors 2, 2, 5, remainder 1 to the first.
    CHECK(split_of(random_split(Range{0, 10}, {0.25, 0.25, 0.5}, make_generator(1))) ==
          Split{{5, 6, 1}, {2, 0}, {8, 9, 3, 7, 4}});
    // random_split(range(7), [0.5, 0.5]): floors 3, 3.
    CHECK(split_of(random_split(Range{0, 7}, {0.5, 0.5}, make_generator(1))) ==
          Split{{0, 6, 1, 3}, {5, 2, 4}});
    // random_split(range(11), [0.1] * 10): the fractions sum to 0.9999999999999999.
    CHECK(split_of(random_split(Range{0, 11}, std::vector<double>(10, 0.1), make_generator(1))) ==
          Split{{0, 10}, {2}, {3}, {7}, {6}, {4}, {8}, {1}, {9}, {5}});
    // random_split(range(5), [0.7, 0.3]): floors 3, 1.
    CHECK(split_of(random_split(Range{0, 5}, {0.7, 0.3}, make_generator(1))) ==
          Split{{0, 4, 2, 3}, {1}});
  }

  // torch.manual_seed(7); random_split(range(10), [3, 7]) -> [[5, 0, 3], [4, 1, 7, 9, 6, 8, 2]]
  TEST_CASE("random_split without a generator draws from ATen's default one, as PyTorch") {
    at::manual_seed(7);
    CHECK(split_of(random_split(Range{0, 10}, {3, 7})) ==
          std::vector<std::vector<Index>>{{5, 0, 3}, {4, 1, 7, 9, 6, 8, 2}});
  }

  TEST_CASE("random_split's subsets share the dataset and give its samples") {
    auto parts = random_split(Range{1000, 10}, {3, 7}, make_generator(0));
    REQUIRE(parts.size() == 2);
    CHECK(parts[0].dataset_ptr() == parts[1].dataset_ptr());
    CHECK(values(parts[0]) == std::vector<std::int64_t>{1004, 1001, 1007});
    CHECK(parts[1].size() == 7);
  }

  // random_split(range(2), [0.5, 0.5, 0.0], generator=torch.Generator().manual_seed(3))
  //   -> [[0], [1], []], warning "Length of split at index 2 is 0. ..."
  // random_split(range(5), [0, 1], generator=torch.Generator().manual_seed(0))
  //   -> [[], [4, 0, 1, 3, 2]], warning for index 0: integers summing to 1 are fractions.
  TEST_CASE(
      "random_split warns of empty splits as PyTorch, and reads lengths summing to 1 as "
      "fractions") {
    std::vector<std::string> warnings;
    set_warning_handler([&warnings](const std::string& w) { warnings.push_back(w); });
    auto parts = random_split(Range{0, 2}, {0.5, 0.5, 0.0}, make_generator(3));
    CHECK(split_of(parts) == std::vector<std::vector<Index>>{{0}, {1}, {}});
    CHECK(warnings ==
          std::vector<std::string>{
              "Length of split at index 2 is 0. This might result in an empty dataset."});
    warnings.clear();
    auto quirk = random_split(Range{0, 5}, {0, 1}, make_generator(0));
    CHECK(split_of(quirk) == std::vector<std::vector<Index>>{{}, {4, 0, 1, 3, 2}});
    CHECK(warnings ==
          std::vector<std::string>{
              "Length of split at index 0 is 0. This might result in an empty dataset."});
    warnings.clear();
    // Integer lengths are never warned about.
    auto plain = random_split(Range{0, 3}, {0, 3}, make_generator(0));
    CHECK(plain[0].size() == 0);
    CHECK(warnings.empty());
    set_warning_handler({});
  }

  TEST_CASE("random_split refuses lengths that do not fit, with PyTorch's messages") {
    const std::string sum = "Sum of input lengths does not equal the length of the input dataset!";
    CHECK(message_of<std::invalid_argument>([] { random_split(Range{0, 10}, {4, 5}); }) == sum);
    CHECK(message_of<std::invalid_argument>([] { random_split(Range{0, 10}, {0.5, 0.4}); }) == sum);
    CHECK(message_of<std::invalid_argument>([] {
            random_split(Range{0, 10}, {-0.5, 1.5});
          }) == "Fraction at index 0 is not between 0 and 1");
    CHECK(message_of<std::invalid_argument>([] {
            random_split(Range{0, 10}, {1.1, -0.1});
          }) == "Fraction at index 0 is not between 0 and 1");
    CHECK(message_of<std::invalid_argument>([] {
            random_split(Range{0, 10}, {12, -2});
          }) == "Length of split at index 1 is negative (-2)");
    // Whole floating lengths are lengths; others are refused.
    CHECK(split_of(random_split(Range{0, 10}, {3.0, 7.0}, make_generator(0))) ==
          split_of(random_split(Range{0, 10}, {3, 7}, make_generator(0))));
    CHECK(message_of<std::invalid_argument>([] {
            random_split(Range{0, 3}, {1.5, 1.5});
          }) ==
          "Length of split at index 0 (1.500000) is neither a whole number nor part of fractions "
          "summing to 1");
    // No lengths for an empty dataset: no splits.
    CHECK(random_split(Range{0, 0}, std::vector<std::int64_t>{}).empty());
  }

  // --- map -------------------------------------------------------------------------------------

  TEST_CASE("map applies the transform to each sample, with or without the context") {
    auto doubled = map(Range{10, 4}, [](std::int64_t v) { return 2 * v; });
    static_assert(MapDataset<decltype(doubled)> && ContextualGet<decltype(doubled)>);
    static_assert(std::same_as<sample_t<decltype(doubled)>, std::int64_t>);
    CHECK(doubled.size() == 4);
    SampleContext ctx;
    CHECK(doubled.get(3, ctx) == 26);

    auto tagged = map(Range{0, 4}, [](std::int64_t v, SampleContext& c) {
      return std::to_string(v) + "@" + std::to_string(c.epoch);
    });
    static_assert(std::same_as<sample_t<decltype(tagged)>, std::string>);
    SampleContext ctx5{2, 5, Rng::for_sample(0, 5, 2), nullptr};
    CHECK(tagged.get(2, ctx5) == "2@5");

    // Over a contextual dataset, the dataset and the transform see the same context, in turn.
    auto chained =
        map(RangeCtx{0, 3}, [](std::pair<std::int64_t, std::uint64_t> s, SampleContext& c) {
          return std::tuple{s.first, s.second, c.rng.next_u64()};
        });
    SampleContext ctx1{1, 0, Rng::for_sample(8, 0, 1), nullptr};
    Rng expected = Rng::for_sample(8, 0, 1);
    const auto first = expected.next_u64();
    const auto second = expected.next_u64();
    CHECK(chained.get(1, ctx1) == std::tuple{std::int64_t{1}, first, second});

    // Transforms compose, and the other adaptors take mapped datasets.
    auto twice = map(map(Range{0, 3}, [](std::int64_t v) { return v + 1; }),
                     [](std::int64_t v) { return v * 10; });
    Subset sub(std::move(twice), {2, 0});
    SampleContext c0;
    CHECK(sub.get(0, c0) == 30);
  }

  TEST_CASE("map's randomness from ctx.rng depends only on (seed, epoch, index)") {
    // A random crop offset and flip, drawn from the sample's stream, plus a torch draw.
    auto augmented = map(make_dataset(), [](std::vector<at::Tensor> s, SampleContext& c) {
      const std::int64_t shift = c.rng.randint(0, 3);
      const bool flip = c.rng.uniform() < 0.5;
      at::Tensor row = s[0].roll(shift);
      if (flip) row = row.flip(0);
      at::Tensor noise = at::rand({2}, c.rng.torch_generator());
      return std::vector<at::Tensor>{row, s[1], noise};
    });
    auto sample = [&](std::uint64_t seed, std::int64_t epoch, Index i) {
      SampleContext ctx{i, epoch, Rng::for_sample(seed, epoch, i), nullptr};
      return augmented.get(i, ctx);
    };
    auto equal = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
      return a.size() == b.size() &&
             std::equal(a.begin(), a.end(), b.begin(),
                        [](const at::Tensor& x, const at::Tensor& y) { return same(x, y); });
    };
    for (Index i = 0; i < 5; ++i) {
      CHECK(equal(sample(42, 3, i), sample(42, 3, i)));
      CHECK(sample(42, 3, i)[1].item<std::int64_t>() == 100 + i);
    }
    // A different seed, epoch or index draws a different noise (and, somewhere, crop or flip).
    CHECK_FALSE(same(sample(42, 3, 1)[2], sample(43, 3, 1)[2]));
    CHECK_FALSE(same(sample(42, 3, 1)[2], sample(42, 4, 1)[2]));
    CHECK_FALSE(same(sample(42, 3, 1)[2], sample(42, 3, 2)[2]));
    std::set<std::vector<float>> rows;
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      at::Tensor row = sample(seed, 0, 0)[0].contiguous();
      rows.insert(std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + 3));
    }
    CHECK(rows.size() == 6);  // every shift and flip of {0, 1, 2} appears
  }

  TEST_CASE("a loader over a mapped dataset gives the same augmented batches with 0 or 2 workers") {
    auto make = [] {
      return map(Range{0, 12}, [](std::int64_t v, SampleContext& c) {
        return static_cast<std::int64_t>(v * 1000 + c.rng.randint(0, 1000));
      });
    };
    auto run = [&](int workers) {
      auto loader = make_data_loader(make(), {.batch_size = 4, .num_workers = workers, .seed = 5});
      std::vector<std::int64_t> out;
      for (const at::Tensor& batch : loader) {
        for (std::int64_t k = 0; k < batch.size(0); ++k)
          out.push_back(batch[k].item<std::int64_t>());
      }
      return out;
    };
    const auto single = run(0);
    REQUIRE(single.size() == 12);
    for (std::int64_t i = 0; i < 12; ++i) CHECK(single[static_cast<std::size_t>(i)] / 1000 == i);
    CHECK(run(2) == single);
  }

  // --- MNIST -------------------------------------------------------------------------------

  TEST_CASE("MNIST reads plain IDX files: uint8 [28, 28] images and int64 labels") {
    TempDir dir;
    write_plain(dir.path / "train-images-idx3-ubyte", images_file(3));
    write_plain(dir.path / "train-labels-idx1-ubyte", labels_file({7, 0, 9}));
    MNIST mnist(dir.path);
    CHECK(mnist.size() == 3);
    CHECK(mnist.images().sizes() == at::IntArrayRef{3, 28, 28});
    CHECK((mnist.images().scalar_type() == at::kByte));
    CHECK(same(mnist.targets(), longs({7, 0, 9}, {3})));
    CHECK(mnist.images_path().string() == (dir.path / "train-images-idx3-ubyte").string());
    static_assert(MapDataset<MNIST> && PlainGet<MNIST> && BatchedDataset<MNIST>);
    static_assert(std::same_as<sample_t<MNIST>, std::pair<at::Tensor, std::int64_t>>);

    for (std::size_t k = 0; k < 3; ++k) {
      auto [image, label] = mnist.get(static_cast<Index>(k));
      CHECK(same(image, expected_image(k)));
      CHECK(label == std::vector<std::int64_t>{7, 0, 9}[k]);
    }
    auto [last, last_label] = mnist.get(-1);
    CHECK(same(last, expected_image(2)));
    CHECK(last_label == 9);
    CHECK_THROWS_AS(mnist.get(3), c10::IndexError);
  }

  TEST_CASE("MNIST::get_batch equals the default_collate of the samples") {
    TempDir dir;
    write_plain(dir.path / "train-images-idx3-ubyte", images_file(3));
    write_plain(dir.path / "train-labels-idx1-ubyte", labels_file({7, 0, 9}));
    MNIST mnist(dir.path);
    const std::vector<Index> indices{2, 0, -1};
    auto [images, labels] = mnist.get_batch(indices);
    CHECK(same(images, at::stack({expected_image(2), expected_image(0), expected_image(2)})));
    CHECK(same(labels, longs({9, 7, 9}, {3})));
    std::vector<std::pair<at::Tensor, std::int64_t>> samples;
    for (Index i : indices) samples.push_back(mnist.get(i));
    auto collated = default_collate(std::move(samples));
    CHECK(same(collated.first, images));
    CHECK(same(collated.second, labels));
  }

  TEST_CASE("MNIST reads the .gz files, the t10k files when not train, and torchvision's layout") {
    TempDir dir;
    write_gz(dir.path / "t10k-images-idx3-ubyte.gz", images_file(2));
    write_gz(dir.path / "t10k-labels-idx1-ubyte.gz", labels_file({4, 1}));
    write_plain(dir.path / "train-images-idx3-ubyte", images_file(3));
    write_plain(dir.path / "train-labels-idx1-ubyte", labels_file({7, 0, 9}));
    MNIST test(dir.path, false);
    CHECK(test.size() == 2);
    CHECK(test.images_path().string() == (dir.path / "t10k-images-idx3-ubyte.gz").string());
    CHECK(same(test.get(1).first, expected_image(1)));
    CHECK(test.get(1).second == 1);
    CHECK(MNIST(dir.path, true).size() == 3);

    TempDir tv;
    fs::create_directories(tv.path / "MNIST" / "raw");
    write_gz(tv.path / "MNIST" / "raw" / "train-images-idx3-ubyte.gz", images_file(1));
    write_plain(tv.path / "MNIST" / "raw" / "train-labels-idx1-ubyte", labels_file({5}));
    MNIST nested(tv.path);
    CHECK(nested.size() == 1);
    CHECK(nested.get(0).second == 5);
    CHECK(same(nested.get(0).first, expected_image(0)));
  }

  TEST_CASE("MNIST names the file and what it expected when a file is missing or malformed") {
    TempDir dir;
    const fs::path images = dir.path / "train-images-idx3-ubyte";
    const fs::path labels = dir.path / "train-labels-idx1-ubyte";
    const std::string p = images.string();
    const std::string l = labels.string();
    const std::string root = dir.path.string();

    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          "MNIST: found neither " + p + " nor " + p + ".gz (nor either under " + root +
              "/MNIST/raw)");

    write_plain(labels, labels_file({7, 0, 9}));
    // The labels' magic in the images' file.
    write_plain(images, idx_bytes(0x801, {3}, {1, 2, 3}));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          p + ": wrong magic number 0x00000801, expected 0x00000803 (an IDX file of uint8 "
              "images, 3 dimensions)");

    // One byte short.
    std::string bytes = images_file(3);
    write_plain(images, bytes.substr(0, bytes.size() - 1));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          p + ": truncated: expected 2368 bytes (a 16-byte header and 3 images of 28x28), "
              "found 2367");
    // Cut inside the header.
    write_plain(images, bytes.substr(0, 10));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          p + ": truncated: expected a 16-byte IDX header, found 10 bytes");
    // Two bytes too many.
    write_plain(images, bytes + "xy");
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          p + ": too long: expected 2368 bytes (a 16-byte header and 3 images of 28x28), found "
              "2370");

    // The count of labels differs from that of images.
    write_plain(images, bytes);
    write_plain(labels, labels_file({7, 0}));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          p + " holds 3 images but " + l + " holds 2 labels; expected one label per image");

    // A truncated label file, and a wrong magic in a gzipped one.
    const std::string lbytes = labels_file({7, 0, 9});
    write_plain(labels, lbytes.substr(0, lbytes.size() - 2));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          l + ": truncated: expected 11 bytes (a 8-byte header and 3 labels), found 9");
    fs::remove(labels);
    write_gz(dir.path / "train-labels-idx1-ubyte.gz", idx_bytes(0x803, {1, 28, 28}, image_data(1)));
    CHECK(message_of<std::runtime_error>([&] { MNIST m(dir.path); }) ==
          l + ".gz: wrong magic number 0x00000803, expected 0x00000801 (an IDX file of uint8 "
              "labels, 1 dimensions)");
  }

  TEST_CASE("MNIST reports a truncated .gz file with its name") {
    TempDir dir;
    write_gz(dir.path / "train-images-idx3-ubyte.gz", images_file(3));
    write_plain(dir.path / "train-labels-idx1-ubyte", labels_file({7, 0, 9}));
    const fs::path gz = dir.path / "train-images-idx3-ubyte.gz";
    std::string compressed;
    {
      std::ifstream f(gz, std::ios::binary);
      compressed.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    write_plain(gz, compressed.substr(0, compressed.size() / 2));
    const std::string message = message_of<std::runtime_error>([&] { MNIST m(dir.path); });
    CHECK(message.rfind(gz.string() + ": truncated", 0) == 0);
  }

  TEST_CASE("sizes only told: an IDX header's dimensions allocate nothing, and sums and "
            "indices near INT64's ends are refused by name") {
    TempDir dir;
    const fs::path images = dir.path / "train-images-idx3-ubyte";
    const std::string p = images.string();
    write_plain(dir.path / "train-labels-idx1-ubyte", labels_file({7, 0, 9}));
    // 100000 images of 1000x1000 announced in 16 bytes: a truncated file (the tensor of 10^11
    // bytes was allocated before the body was read), and 2^96 bytes (the count overflowed).
    write_plain(images, idx_bytes(0x803, {100000, 1000, 1000}, {}));
    CHECK(message_of<std::runtime_error>([&] { MNIST::read_images(images); }) ==
          p + ": truncated: expected 100000000016 bytes (a 16-byte header and 100000 images of "
              "1000x1000), found 16");
    write_plain(images, idx_bytes(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {1, 2, 3}));
    CHECK(message_of<std::runtime_error>([&] { MNIST::read_images(images); }) ==
          p + ": truncated: expected more than 2^62 bytes (a 16-byte header and 4294967295 images "
              "of 4294967295x4294967295), found 19");
    // The real thing still reads, larger than one 4 MiB piece.
    write_plain(images, images_file(6000));
    CHECK(MNIST::read_images(images).sizes() == at::IntArrayRef{6000, 28, 28});
    CHECK(same(MNIST::read_images(images)[5999], expected_image(5999)));

    // get_batch names the index out of range, in PyTorch's words (index_select named none).
    TensorDataset ds = make_dataset();
    for (const Index bad : {Index{5}, Index{-6}}) {
      const std::vector<Index> indices{1, bad, 2};
      try {
        ds.get_batch(indices);
        FAIL("no error for index " << bad);
      } catch (const SampleError& e) {
        CHECK(e.index() == bad);
        CHECK(std::string(e.what()) == "index " + std::to_string(bad) +
                                           " is out of bounds for dimension 0 with size 5");
      }
    }

    // ConcatDataset: -INT64_MIN overflowed in the check of a negative index.
    ConcatDataset<Range> cat({Range{0, 2}, Range{200, 3}});
    CHECK(message_of<std::invalid_argument>([&] { cat.get(INT64_MIN); }) ==
          "absolute value of index should not exceed dataset length");

    // random_split: lengths whose int64 sum wraps around to the size, and a float length past
    // INT64_MAX whose sum with the others is the size.
    const std::string sum = "Sum of input lengths does not equal the length of the input dataset!";
    constexpr std::int64_t big = std::int64_t{1} << 62;
    CHECK(message_of<std::invalid_argument>([&] {
            random_split(Range{0, 2}, std::vector<std::int64_t>{4, big, big, big, big - 2});
          }) == sum);
    // Whole float lengths inside int64 are worded as int ones are.
    CHECK(message_of<std::invalid_argument>([] { random_split(Range{0, 10}, {12.0, -2.0}); }) ==
          "Length of split at index 1 is negative (-2)");
    CHECK(message_of<std::invalid_argument>([] {
            random_split(Range{0, 2}, {1e19, -1e19, 2.0});
          }) == "Length of split at index 0 (10000000000000000000.000000) exceeds the dataset's "
                "length 2");

    // Rng::randint over the whole int64 range (high - low overflowed) lands on both sides of 0.
    Rng rng = Rng::for_sample(1, 0, 0);
    bool negative = false, positive = false;
    for (int i = 0; i < 64; ++i) {
      const std::int64_t v = rng.randint(INT64_MIN, INT64_MAX);
      negative = negative || v < 0;
      positive = positive || v > 0;
    }
    CHECK(negative);
    CHECK(positive);
  }
}

namespace {

/// A torch::data dataset as a libtorch user writes one: example i is data [2, 1, 1] holding
/// (i, 10 i), an image of two channels, and target i.
struct TorchChannels : torch::data::datasets::Dataset<TorchChannels> {
  std::size_t n;
  explicit TorchChannels(std::size_t n) : n(n) {}
  torch::data::Example<> get(std::size_t index) override {
    const auto i = static_cast<double>(index);
    return {at::tensor({i, 10 * i}, at::kFloat).view({2, 1, 1}),
            at::scalar_tensor(static_cast<std::int64_t>(index), at::kLong)};
  }
  torch::optional<std::size_t> size() const override { return n; }
};

/// A torch::data dataset that does not know its length.
struct TorchUnsized : torch::data::datasets::Dataset<TorchUnsized> {
  torch::data::Example<> get(std::size_t) override { return {at::zeros({2, 1, 1}), at::zeros({})}; }
  torch::optional<std::size_t> size() const override { return torch::nullopt; }
};

/// Per channel: (i - 1) / 0.5 and (10 i - 2) / 4, exact in float.
torch::data::transforms::Normalize<> channel_normalize() {
  return torch::data::transforms::Normalize<>({1.0, 2.0}, {0.5, 4.0});
}

/// Example i of TorchChannels after channel_normalize(), written out.
at::Tensor normalized(std::int64_t i) {
  const auto x = static_cast<float>(i);
  return at::tensor({2 * x - 2, 2.5f * x - 0.5f}, at::kFloat).view({2, 1, 1});
}

/// The batches torch::data's own loader gives for `dataset`, in order (SequentialSampler).
template <class D>
std::vector<torch::data::Example<>> torch_data_batches(D dataset, std::size_t batch_size) {
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(dataset), torch::data::DataLoaderOptions().batch_size(batch_size));
  std::vector<torch::data::Example<>> batches;
  for (auto& batch : *loader) batches.push_back(batch);
  return batches;
}

}  // namespace

TEST_SUITE("dataset") {
  TEST_CASE("a torch::data dataset mapped with Normalize<> loads through coload as torch::data loads it") {
    using Mapped = torch::data::datasets::MapDataset<TorchChannels,
                                                     torch::data::transforms::Normalize<>>;
    static_assert(TorchDataDataset<Mapped> && !MapDataset<Mapped>);
    static_assert(std::same_as<TorchDataAdapter<Mapped>::sample_type, torch::data::Example<>>);
    // torch::data's loader needs the batch transform; coload's default collate stacks alike.
    const auto expected =
        torch_data_batches(TorchChannels(7).map(channel_normalize()).map(
                               torch::data::transforms::Stack<>()),
                           3);
    REQUIRE(expected.size() == 3);
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(TorchChannels(7).map(channel_normalize()),
                                     {.batch_size = 3, .num_workers = workers});
      static_assert(std::same_as<decltype(loader)::batch_type, torch::data::Example<>>);
      std::int64_t next = 0;
      std::size_t b = 0;
      for (torch::data::Example<>& batch : loader) {
        REQUIRE(b < expected.size());
        CHECK(batch.data.equal(expected[b].data));
        CHECK(batch.target.equal(expected[b].target));
        // The values themselves: each example normalized per channel, targets in order.
        const std::int64_t n = batch.target.size(0);
        for (std::int64_t k = 0; k < n; ++k) {
          CHECK(batch.data[k].equal(normalized(next + k)));
          CHECK(batch.target[k].item<std::int64_t>() == next + k);
        }
        next += n;
        ++b;
      }
      CHECK(b == 3);
      CHECK(next == 7);
    }
  }

  TEST_CASE("a torch::data dataset mapped with a batch transform (Stack<>) loads its own batches") {
    auto mapped = [] {
      return TorchChannels(5).map(channel_normalize()).map(torch::data::transforms::Stack<>());
    };
    const auto expected = torch_data_batches(mapped(), 2);
    REQUIRE(expected.size() == 3);
    // The default collate: whole batches from the dataset's get_batch, Stack<> and all.
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(mapped(), {.batch_size = 2, .num_workers = workers});
      static_assert(std::same_as<decltype(loader)::batch_type, torch::data::Example<>>);
      std::size_t b = 0;
      for (torch::data::Example<>& batch : loader) {
        REQUIRE(b < expected.size());
        CHECK(batch.data.equal(expected[b].data));
        CHECK(batch.target.equal(expected[b].target));
        ++b;
      }
      CHECK(b == 3);
    }
    // Any batch transform of torch::data's is the dataset's own: a BatchLambda's batches.
    auto summed = make_data_loader(
        TorchChannels(5).map(channel_normalize()).map(
            torch::data::transforms::BatchLambda<std::vector<torch::data::Example<>>, at::Tensor>(
                [](std::vector<torch::data::Example<>> examples) {
                  return at::full({1}, static_cast<double>(examples.size()), at::kFloat);
                })),
        {.batch_size = 2});
    static_assert(std::same_as<decltype(summed)::batch_type, at::Tensor>);
    std::vector<float> sizes;
    for (const at::Tensor& batch : summed) sizes.push_back(batch.item<float>());
    CHECK(sizes == std::vector<float>{2, 2, 1});
    // A collate of the caller's takes the place of Stack<>: it gets the examples, normalized.
    auto loader = make_data_loader(
        mapped(), {.batch_size = 2},
        [](std::vector<torch::data::Example<>> examples) {
          std::vector<at::Tensor> data;
          for (auto& e : examples) data.push_back(e.data);
          return at::stack(data).sum(0);  // not what Stack<> makes
        });
    std::int64_t next = 0;
    for (const at::Tensor& sum : loader) {
      const std::int64_t n = std::min<std::int64_t>(2, 5 - next);
      at::Tensor want = normalized(next);
      if (n == 2) want = want + normalized(next + 1);
      CHECK(sum.equal(want));
      next += n;
    }
    CHECK(next == 5);
  }

  TEST_CASE("a mapped torch::data dataset without a size is refused with the adapter's message") {
    CHECK_THROWS_WITH_AS(make_data_loader(TorchUnsized{}.map(channel_normalize()), {.batch_size = 2}),
                         doctest::Contains("torch::data dataset whose size() is empty"),
                         InvalidArgument);
  }
}
