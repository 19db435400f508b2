#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// Specification of the dataset module: TensorDataset, the dataset concepts, get_sample,
// SampleContext and the per-sample Rng.

#include <ATen/ATen.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/collate/collate.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/dataset/tensor_dataset.hpp"

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
