#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// Specification of the samplers: SequentialSampler, RandomSampler (bit-for-bit parity with
// torch.utils.data.RandomSampler of PyTorch 1.13), BatchSampler, AnySampler, AnyBatchSampler.

#include <ATen/ATen.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/coro/coro.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sampler.hpp"
#include "coload/sampler/sequential.hpp"

using namespace coload;

// Lets doctest print index lists and batches in failure messages.
namespace doctest {
template <>
struct StringMaker<std::vector<std::int64_t>> {
  static String convert(const std::vector<std::int64_t>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return (out + "]").c_str();
  }
};
template <>
struct StringMaker<std::vector<std::vector<std::int64_t>>> {
  static String convert(const std::vector<std::vector<std::int64_t>>& v) {
    String out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      out += (i ? ", " : "");
      out += StringMaker<std::vector<std::int64_t>>::convert(v[i]);
    }
    return out + "]";
  }
};
}  // namespace doctest

namespace {

using Indices = std::vector<Index>;
using Batches = std::vector<std::vector<Index>>;

// One synchronous epoch of a sampler, as a vector.
template <class S>
Indices epoch_of(S& sampler) {
  Indices out;
  for (Index i : sampler.indices()) out.push_back(i);
  return out;
}

// One synchronous epoch of a batch sampler; moves each batch out, as the contract allows.
template <class S>
Batches batches_of(S& sampler) {
  Batches out;
  for (auto& b : sampler.batches()) out.push_back(std::move(b));
  return out;
}

// Drains an AsyncGenerator inside a coroutine, moving every value out.
template <class T>
Task<std::vector<T>> drain(AsyncGenerator<T> gen) {
  std::vector<T> out;
  while (T* v = co_await gen.next()) out.push_back(std::move(*v));
  co_return out;
}

Task<Index> twice(Index i) { co_return 2 * i; }

// A user-written asynchronous sampler: 0, 2, 4, ... (2n - 2), each computed by an awaited task.
struct AsyncEvens {
  std::int64_t n;
  AsyncGenerator<Index> indices() {
    for (Index i = 0; i < n; ++i) co_yield co_await twice(i);
  }
};

// The same, but it knows its length.
struct SizedAsyncEvens : AsyncEvens {
  std::int64_t size() const { return n; }
};

// A sampler that counts its epochs and has no size().
struct CountingSampler {
  int epochs = 0;
  std::int64_t n = 3;
  Generator<Index> indices() {
    ++epochs;
    for (Index i = n - 1; i >= 0; --i) co_yield i;
  }
};

// The message of the std::invalid_argument that `f` throws, or "" if it throws none.
template <class F>
std::string invalid_argument_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("sampler") {
  TEST_CASE("SequentialSampler yields 0 .. size-1 in order, every epoch") {
    SequentialSampler s(6);
    CHECK(s.size() == 6);
    CHECK(epoch_of(s) == Indices{0, 1, 2, 3, 4, 5});
    CHECK(epoch_of(s) == Indices{0, 1, 2, 3, 4, 5});
    SequentialSampler empty(0);
    CHECK(empty.size() == 0);
    CHECK(epoch_of(empty).empty());
  }

  TEST_CASE("the sampler concepts classify samplers and batch samplers") {
    static_assert(IndexSampler<SequentialSampler>);
    static_assert(IndexSampler<RandomSampler>);
    static_assert(IndexSampler<AsyncEvens>);
    static_assert(IndexSampler<AnySampler>);
    static_assert(!IndexSampler<int>);
    static_assert(SizedSampler<SequentialSampler>);
    static_assert(SizedSampler<RandomSampler>);
    static_assert(!SizedSampler<AsyncEvens>);
    static_assert(!SizedSampler<CountingSampler>);
    static_assert(BatchIndexSampler<BatchSampler<SequentialSampler>>);
    static_assert(BatchIndexSampler<BatchSampler<AsyncEvens>>);
    static_assert(BatchIndexSampler<AnyBatchSampler>);
    static_assert(!BatchIndexSampler<SequentialSampler>);
    static_assert(SizedSampler<BatchSampler<SequentialSampler>>);
    static_assert(SizedSampler<BatchSampler<SizedAsyncEvens>>);
    static_assert(!SizedSampler<BatchSampler<AsyncEvens>>);
  }

  TEST_CASE("RandomSampler with a generator matches PyTorch 1.13 across two epochs") {
    // RandomSampler(range(10), generator=torch.Generator().manual_seed(42)), iterated twice.
    RandomSampler s(10, false, std::nullopt, make_generator(42));
    CHECK(s.size() == 10);
    CHECK(epoch_of(s) == Indices{2, 6, 1, 8, 4, 5, 0, 9, 3, 7});
    CHECK(epoch_of(s) == Indices{7, 5, 0, 3, 1, 6, 9, 8, 4, 2});
  }

  TEST_CASE("RandomSampler without replacement and num_samples > size matches PyTorch") {
    // RandomSampler(range(7), num_samples=10, generator seed 3).
    RandomSampler s(7, false, 10, make_generator(3));
    CHECK(s.size() == 10);
    CHECK(epoch_of(s) == Indices{5, 3, 4, 6, 0, 2, 1, 2, 6, 3});
    // RandomSampler(range(4), num_samples=9, generator seed 0): two full passes and a part.
    RandomSampler t(4, false, 9, make_generator(0));
    CHECK(t.size() == 9);
    CHECK(epoch_of(t) == Indices{0, 1, 3, 2, 0, 2, 3, 1, 3});
  }

  TEST_CASE("RandomSampler with replacement matches PyTorch (chunks of 32 and the rest)") {
    // RandomSampler(range(7), replacement=True, num_samples=40, generator seed 5).
    RandomSampler s(7, true, 40, make_generator(5));
    CHECK(s.size() == 40);
    CHECK(epoch_of(s) == Indices{1, 5, 2, 3, 6, 1, 1, 3, 5, 4, 0, 6, 4, 2, 3, 2, 4, 5, 6, 5,
                                 3, 1, 0, 4, 1, 0, 1, 3, 6, 5, 3, 5, 5, 3, 2, 5, 5, 5, 4, 0});
    // Fewer than 32: only the remainder chunk; two epochs continue the stream.
    RandomSampler few(5, true, 7, make_generator(11));
    CHECK(epoch_of(few) == Indices{1, 4, 0, 2, 3, 2, 1});
    CHECK(epoch_of(few) == Indices{0, 2, 2, 2, 0, 0, 4});
    // Exactly 32: one full chunk and an empty remainder, still in step in the next epoch.
    RandomSampler full(3, true, 32, make_generator(9));
    CHECK(epoch_of(full) == Indices{1, 1, 0, 2, 2, 2, 1, 1, 1, 2, 0, 1, 0, 0, 1, 2,
                                    0, 0, 2, 0, 1, 0, 0, 0, 1, 2, 1, 0, 0, 2, 2, 0});
    CHECK(epoch_of(full) == Indices{0, 0, 1, 0, 0, 2, 2, 2, 1, 2, 1, 2, 1, 1, 1, 0,
                                    1, 0, 0, 0, 1, 1, 0, 2, 0, 0, 0, 1, 0, 1, 1, 2});
  }

  TEST_CASE("RandomSampler without a generator seeds each epoch from ATen's default generator") {
    // torch.manual_seed(123); s = RandomSampler(range(8)); list(s); list(s)
    at::manual_seed(123);
    RandomSampler s(8);
    CHECK(epoch_of(s) == Indices{5, 4, 1, 3, 7, 2, 6, 0});
    CHECK(epoch_of(s) == Indices{6, 2, 0, 5, 4, 3, 7, 1});
    // torch.manual_seed(7); s = RandomSampler(range(6), replacement=True, num_samples=5)
    at::manual_seed(7);
    RandomSampler r(6, true, 5);
    CHECK(epoch_of(r) == Indices{1, 5, 1, 3, 0});
    CHECK(epoch_of(r) == Indices{5, 1, 1, 5, 2});
  }

  TEST_CASE("at::manual_seed makes two generator-less RandomSamplers agree") {
    RandomSampler a(50);
    RandomSampler b(50);
    at::manual_seed(2024);
    const Indices first = epoch_of(a);
    at::manual_seed(2024);
    const Indices second = epoch_of(b);
    CHECK(first.size() == 50);
    CHECK(first == second);
    // A different seed gives a different permutation of the same indices.
    at::manual_seed(2025);
    Indices third = epoch_of(a);
    CHECK(third != first);
    std::sort(third.begin(), third.end());
    Indices expected(50);
    for (Index i = 0; i < 50; ++i) expected[static_cast<std::size_t>(i)] = i;
    CHECK(third == expected);
  }

  TEST_CASE("RandomSampler refuses a non-positive num_samples with PyTorch's message") {
    CHECK(invalid_argument_of([] { RandomSampler s(5, false, 0); }) ==
          "num_samples should be a positive integer value, but got num_samples=0");
    CHECK(invalid_argument_of([] { RandomSampler s(0); }) ==
          "num_samples should be a positive integer value, but got num_samples=0");
    CHECK(invalid_argument_of([] { RandomSampler s(5, true, -3); }) ==
          "num_samples should be a positive integer value, but got num_samples=-3");
    CHECK(invalid_argument_of([] { RandomSampler s(5, true, 1); }) == "");
  }

  TEST_CASE("BatchSampler groups a sequential sampler, keeping or dropping the last batch") {
    BatchSampler keep(SequentialSampler(10), 3, false);
    CHECK(keep.size() == 4);
    CHECK(keep.batch_size() == 3);
    CHECK_FALSE(keep.drop_last());
    static_assert(std::same_as<decltype(keep.batches()), Generator<std::vector<Index>>>);
    CHECK(batches_of(keep) == Batches{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});
    // A second epoch is the same.
    CHECK(batches_of(keep) == Batches{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});

    BatchSampler drop(SequentialSampler(10), 3, true);
    CHECK(drop.size() == 3);
    CHECK(drop.drop_last());
    CHECK(batches_of(drop) == Batches{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}});

    // When the size divides evenly, drop_last changes nothing.
    BatchSampler even_keep(SequentialSampler(6), 2, false);
    BatchSampler even_drop(SequentialSampler(6), 2, true);
    CHECK(even_keep.size() == 3);
    CHECK(even_drop.size() == 3);
    CHECK(batches_of(even_keep) == Batches{{0, 1}, {2, 3}, {4, 5}});
    CHECK(batches_of(even_drop) == Batches{{0, 1}, {2, 3}, {4, 5}});

    // Fewer indices than one batch.
    BatchSampler small_keep(SequentialSampler(2), 5, false);
    BatchSampler small_drop(SequentialSampler(2), 5, true);
    CHECK(small_keep.size() == 1);
    CHECK(small_drop.size() == 0);
    CHECK(batches_of(small_keep) == Batches{{0, 1}});
    CHECK(batches_of(small_drop).empty());
  }

  TEST_CASE("BatchSampler over a RandomSampler batches PyTorch's order") {
    // list(BatchSampler(RandomSampler(range(10), generator=seed 42), 4, drop_last))
    BatchSampler keep(RandomSampler(10, false, std::nullopt, make_generator(42)), 4, false);
    CHECK(keep.size() == 3);
    CHECK(batches_of(keep) == Batches{{2, 6, 1, 8}, {4, 5, 0, 9}, {3, 7}});
    BatchSampler drop(RandomSampler(10, false, std::nullopt, make_generator(42)), 4, true);
    CHECK(drop.size() == 2);
    CHECK(batches_of(drop) == Batches{{2, 6, 1, 8}, {4, 5, 0, 9}});
  }

  TEST_CASE("BatchSampler refuses a non-positive batch size with PyTorch's message") {
    CHECK(invalid_argument_of([] { BatchSampler b(SequentialSampler(4), 0, false); }) ==
          "batch_size should be a positive integer value, but got batch_size=0");
    CHECK(invalid_argument_of([] { BatchSampler b(SequentialSampler(4), -2, true); }) ==
          "batch_size should be a positive integer value, but got batch_size=-2");
    CHECK(invalid_argument_of([] { BatchSampler b(SequentialSampler(4), 1, true); }) == "");
  }

  TEST_CASE("the consumer may move each batch out without disturbing the batches after it") {
    BatchSampler b(SequentialSampler(5), 2, false);
    Batches kept;
    for (auto& batch : b.batches()) {
      kept.push_back(std::move(batch));  // the generator must not reuse the moved-from vector
    }
    CHECK(kept == Batches{{0, 1}, {2, 3}, {4}});
  }

  TEST_CASE("BatchSampler over an asynchronous sampler yields asynchronous batches") {
    BatchSampler keep(AsyncEvens{7}, 3, false);
    static_assert(std::same_as<decltype(keep.batches()), AsyncGenerator<std::vector<Index>>>);
    CHECK(sync_wait(drain(keep.batches())) == Batches{{0, 2, 4}, {6, 8, 10}, {12}});
    // Every epoch starts over.
    CHECK(sync_wait(drain(keep.batches())) == Batches{{0, 2, 4}, {6, 8, 10}, {12}});

    BatchSampler drop(AsyncEvens{7}, 3, true);
    CHECK(sync_wait(drain(drop.batches())) == Batches{{0, 2, 4}, {6, 8, 10}});

    BatchSampler sized(SizedAsyncEvens{{7}}, 3, true);
    CHECK(sized.size() == 2);
    CHECK(sync_wait(drain(sized.batches())) == Batches{{0, 2, 4}, {6, 8, 10}});

    BatchSampler empty(AsyncEvens{0}, 3, false);
    CHECK(sync_wait(drain(empty.batches())).empty());
  }

  TEST_CASE("AnySampler holds a sampler by value: a copy, with its size") {
    CountingSampler original;
    AnySampler any = original;
    CHECK(static_cast<bool>(any));
    CHECK(any.size() == std::nullopt);  // CountingSampler has no size()
    CHECK(sync_wait(drain(any.indices())) == Indices{2, 1, 0});
    CHECK(sync_wait(drain(any.indices())) == Indices{2, 1, 0});
    CHECK(original.epochs == 0);  // the AnySampler ran its own copy

    AnySampler seq = SequentialSampler(4);
    CHECK(seq.size() == std::optional<std::int64_t>(4));
    CHECK(sync_wait(drain(seq.indices())) == Indices{0, 1, 2, 3});
  }

  TEST_CASE("AnySampler holds a std::shared_ptr by sharing: the caller still reaches it") {
    auto shared = std::make_shared<CountingSampler>();
    AnySampler any = shared;
    CHECK(any.size() == std::nullopt);
    CHECK(sync_wait(drain(any.indices())) == Indices{2, 1, 0});
    CHECK(shared->epochs == 1);
    shared->n = 5;  // visible to the next epoch
    CHECK(sync_wait(drain(any.indices())) == Indices{4, 3, 2, 1, 0});
    CHECK(shared->epochs == 2);

    auto seq = std::make_shared<SequentialSampler>(3);
    AnySampler sized = seq;
    CHECK(sized.size() == std::optional<std::int64_t>(3));
    CHECK(sync_wait(drain(sized.indices())) == Indices{0, 1, 2});
  }

  TEST_CASE("AnySampler over a RandomSampler keeps PyTorch's stream across epochs") {
    AnySampler any = RandomSampler(10, false, std::nullopt, make_generator(42));
    CHECK(any.size() == std::optional<std::int64_t>(10));
    CHECK(sync_wait(drain(any.indices())) == Indices{2, 6, 1, 8, 4, 5, 0, 9, 3, 7});
    CHECK(sync_wait(drain(any.indices())) == Indices{7, 5, 0, 3, 1, 6, 9, 8, 4, 2});
  }

  TEST_CASE("AnySampler passes an asynchronous sampler through") {
    AnySampler any = AsyncEvens{4};
    CHECK(any.size() == std::nullopt);
    CHECK(sync_wait(drain(any.indices())) == Indices{0, 2, 4, 6});
    AnySampler sized = SizedAsyncEvens{{2}};
    CHECK(sized.size() == std::optional<std::int64_t>(2));
    CHECK(sync_wait(drain(sized.indices())) == Indices{0, 2});
  }

  TEST_CASE("a default AnySampler and AnyBatchSampler are empty and have no size") {
    AnySampler none;
    CHECK_FALSE(static_cast<bool>(none));
    CHECK(none.size() == std::nullopt);
    AnyBatchSampler no_batches;
    CHECK_FALSE(static_cast<bool>(no_batches));
    CHECK(no_batches.size() == std::nullopt);
  }

  TEST_CASE("AnyBatchSampler holds a batch sampler by value or by std::shared_ptr") {
    AnyBatchSampler by_value = BatchSampler(SequentialSampler(7), 3, false);
    CHECK(static_cast<bool>(by_value));
    CHECK(by_value.size() == std::optional<std::int64_t>(3));
    CHECK(sync_wait(drain(by_value.batches())) == Batches{{0, 1, 2}, {3, 4, 5}, {6}});

    auto shared = std::make_shared<BatchSampler<AsyncEvens>>(AsyncEvens{5}, 2, true);
    AnyBatchSampler by_pointer = shared;
    CHECK(by_pointer.size() == std::nullopt);  // the async inner sampler has no size()
    CHECK(sync_wait(drain(by_pointer.batches())) == Batches{{0, 2}, {4, 6}});
    shared->sampler().n = 3;  // the caller still reaches the shared sampler
    CHECK(sync_wait(drain(by_pointer.batches())) == Batches{{0, 2}});

    auto sized = std::make_shared<BatchSampler<SequentialSampler>>(SequentialSampler(5), 2, true);
    AnyBatchSampler sized_any = sized;
    CHECK(sized_any.size() == std::optional<std::int64_t>(2));
    CHECK(sync_wait(drain(sized_any.batches())) == Batches{{0, 1}, {2, 3}});
  }
}
