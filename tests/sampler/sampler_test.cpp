#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
// Specification of the samplers: SequentialSampler, RandomSampler, SubsetRandomSampler,
// WeightedRandomSampler and DistributedSampler (bit-for-bit parity with PyTorch 1.13's, checked
// against tests/sampler/golden.txt, which tools/golden/sampler_golden.py writes), BatchSampler,
// AnySampler, AnyBatchSampler.

#include <ATen/ATen.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/coro/coro.hpp"
#include "coload/loader/options.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/distributed.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sampler.hpp"
#include "coload/sampler/sequential.hpp"
#include "coload/sampler/subset_random.hpp"
#include "coload/sampler/weighted_random.hpp"

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

// Lends a sampler to a BatchSampler without copying it, keeping its index_blocks() if any.
template <class S>
struct RefSampler {
  S* s;
  auto indices() { return s->indices(); }
  auto index_blocks()
    requires BlockSampler<S>
  {
    return s->index_blocks();
  }
};

// The flattened batches of one epoch of BatchSampler(sampler, 7, keep last): the index_blocks()
// path for samplers that have one.
template <class S>
Indices batched_epoch_of(S& sampler) {
  BatchSampler batches(RefSampler<S>{&sampler}, 7, false);
  Indices out;
  for (auto& b : batches.batches()) out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Sets environment variable `name` to `value` (unsets it when nullopt) for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name_, value->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> old_;
};

// One line of tests/sampler/golden.txt (format in tools/golden/sampler_golden.py):
// `<kind> key=value ... | count=C sum=S wsum=W | <all indices, or the first few>`.
struct GoldenCase {
  std::string id;
  std::string kind;
  std::map<std::string, std::string> params;
  std::int64_t count = -1;
  std::int64_t sum = 0;
  std::int64_t wsum = 0;
  Indices shown;

  std::int64_t integer(const std::string& key) const { return std::stoll(params.at(key)); }
  bool flag(const std::string& key) const { return integer(key) != 0; }
  std::optional<std::int64_t> optional_integer(const std::string& key) const {
    if (params.at(key) == "none") return std::nullopt;
    return integer(key);
  }
};

// Where the fixture is: next to this source file. __FILE__ is absolute or relative to the
// build directory, which is where `meson test` runs us; MESON_SOURCE_ROOT is the fallback.
std::filesystem::path golden_path() {
  const auto beside = std::filesystem::path(__FILE__).parent_path() / "golden.txt";
  if (std::filesystem::exists(beside)) return beside;
  if (const char* root = std::getenv("MESON_SOURCE_ROOT")) {
    const auto in_root = std::filesystem::path(root) / "tests" / "sampler" / "golden.txt";
    if (std::filesystem::exists(in_root)) return in_root;
  }
  return beside;
}

std::vector<GoldenCase> read_golden(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<GoldenCase> cases;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] == '#') continue;
    const auto bar1 = text.find(" | ");
    const auto bar2 = text.find(" | ", bar1 + 3);
    if (bar1 == std::string::npos || bar2 == std::string::npos) {
      throw std::runtime_error("malformed golden line: " + text);
    }
    GoldenCase c;
    c.id = text.substr(0, bar1);
    std::istringstream id(c.id);
    id >> c.kind;
    for (std::string kv; id >> kv;) {
      const auto eq = kv.find('=');
      c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    std::istringstream sums(text.substr(bar1 + 3, bar2 - bar1 - 3));
    for (std::string kv; sums >> kv;) {
      const auto eq = kv.find('=');
      const auto key = kv.substr(0, eq);
      const std::int64_t value = std::stoll(kv.substr(eq + 1));
      (key == "count" ? c.count : key == "sum" ? c.sum : c.wsum) = value;
    }
    std::istringstream shown(text.substr(bar2 + 3));
    for (Index i; shown >> i;) c.shown.push_back(i);
    cases.push_back(std::move(c));
  }
  return cases;
}

// The parameters the golden script gives its subset and weighted cases.
std::vector<Index> golden_subset(std::int64_t n) {
  std::vector<Index> v;
  for (std::int64_t k = 0; k < n; ++k) v.push_back((k * 7919) % 10007);
  return v;
}
std::vector<double> golden_weights(std::int64_t n) {
  std::vector<double> w;
  for (std::int64_t k = 0; k < n; ++k) w.push_back(static_cast<double>((k * 37) % 11 + 1) * 0.25);
  return w;
}

// Pass number `epoch` (from 0) of a sampler reused across epochs; each pass through `run`.
template <class S, class Run>
Indices pass_of(S& sampler, std::int64_t epoch, Run run) {
  Indices out;
  for (std::int64_t e = 0; e <= epoch; ++e) out = run(sampler);
  return out;
}

// What coload yields for a golden case; `batched` goes through BatchSampler instead.
Indices coload_indices(const GoldenCase& c, bool batched) {
  auto run = [batched](auto& s) { return batched ? batched_epoch_of(s) : epoch_of(s); };
  const std::int64_t n = c.integer("n");
  const std::int64_t epoch = c.integer("epoch");
  if (c.kind == "random") {
    RandomSampler s(n, c.flag("replacement"), c.optional_integer("num_samples"),
                    make_generator(static_cast<std::uint64_t>(c.integer("seed"))));
    return pass_of(s, epoch, run);
  }
  if (c.kind == "subset") {
    SubsetRandomSampler s(golden_subset(n),
                          make_generator(static_cast<std::uint64_t>(c.integer("seed"))));
    return pass_of(s, epoch, run);
  }
  if (c.kind == "weighted") {
    WeightedRandomSampler s(golden_weights(n), c.integer("num_samples"), c.flag("replacement"),
                            make_generator(static_cast<std::uint64_t>(c.integer("seed"))));
    return pass_of(s, epoch, run);
  }
  if (c.kind == "distributed") {
    DistributedSampler s(n, c.integer("num_replicas"), c.integer("rank"), c.flag("shuffle"),
                         static_cast<std::uint64_t>(c.integer("seed")), c.flag("drop_last"));
    s.set_epoch(epoch);
    return run(s);
  }
  throw std::runtime_error("unknown golden case kind: " + c.kind);
}

// Checks coload's indices against one golden case: count, checksums and the stored indices.
void check_golden(const GoldenCase& c, const Indices& got) {
  CHECK(static_cast<std::int64_t>(got.size()) == c.count);
  std::int64_t sum = 0;
  std::int64_t wsum = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    sum += got[k];
    wsum += static_cast<std::int64_t>(k + 1) * got[k];
  }
  CHECK(sum == c.sum);
  CHECK(wsum == c.wsum);
  const Indices head(got.begin(),
                     got.begin() + static_cast<std::ptrdiff_t>(std::min(got.size(), c.shown.size())));
  CHECK(head == c.shown);
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
    // An empty dataset with num_samples set divided by zero when drawn (PyTorch: a
    // ZeroDivisionError when iterated); a negative size was reported as num_samples.
    CHECK(invalid_argument_of([] { RandomSampler s(0, false, 5); }) ==
          "RandomSampler: cannot draw num_samples=5 from an empty dataset");
    CHECK(invalid_argument_of([] { RandomSampler s(0, true, 5); }) ==
          "RandomSampler: cannot draw num_samples=5 from an empty dataset");
    CHECK(invalid_argument_of([] { RandomSampler s(-5); }) ==
          "RandomSampler: the dataset size is negative (-5)");
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

  TEST_CASE("every sampler yields PyTorch 1.13's indices for every golden case") {
    const auto path = golden_path();
    INFO("fixture: " << path.string());
    REQUIRE(std::filesystem::exists(path));
    const auto cases = read_golden(path);
    REQUIRE(cases.size() >= 30);
    std::map<std::string, int> per_kind;
    for (const GoldenCase& c : cases) {
      CAPTURE(c.id);
      ++per_kind[c.kind];
      check_golden(c, coload_indices(c, false));
      check_golden(c, coload_indices(c, true));  // through BatchSampler and index_blocks()
    }
    CHECK(per_kind.size() == 4);
    for (const auto& [kind, count] : per_kind) {
      CAPTURE(kind);
      CHECK(count >= 30);
    }
  }

  TEST_CASE("the new samplers are sized block samplers") {
    static_assert(BlockSampler<SubsetRandomSampler>);
    static_assert(BlockSampler<WeightedRandomSampler>);
    static_assert(BlockSampler<DistributedSampler>);
    static_assert(SizedSampler<SubsetRandomSampler>);
    static_assert(SizedSampler<WeightedRandomSampler>);
    static_assert(SizedSampler<DistributedSampler>);
    static_assert(BlockSampler<RefSampler<DistributedSampler>>);
    static_assert(BlockSampler<RefSampler<RandomSampler>>);
    static_assert(!BlockSampler<RefSampler<CountingSampler>>);
    static_assert(std::same_as<decltype(std::declval<SubsetRandomSampler&>().indices()),
                               Generator<Index>>);
    static_assert(std::same_as<decltype(std::declval<WeightedRandomSampler&>().indices()),
                               Generator<Index>>);
    static_assert(std::same_as<decltype(std::declval<DistributedSampler&>().indices()),
                               Generator<Index>>);
  }

  TEST_CASE("SubsetRandomSampler permutes the given indices as PyTorch does") {
    // SubsetRandomSampler([10, 20, 30, 40, 50], generator=seed 1) through BatchSampler(2).
    SubsetRandomSampler s({10, 20, 30, 40, 50}, make_generator(1));
    CHECK(s.size() == 5);
    CHECK(s.subset() == Indices{10, 20, 30, 40, 50});
    BatchSampler batches(std::move(s), 2, false);
    CHECK(batches.size() == 3);
    CHECK(batches_of(batches) == Batches{{10, 50}, {30, 40}, {20}});
    // Without a generator: torch.manual_seed(3); list(s); list(s)
    SubsetRandomSampler plain({10, 20, 30, 40, 50});
    at::manual_seed(3);
    CHECK(epoch_of(plain) == Indices{20, 10, 40, 50, 30});
    CHECK(epoch_of(plain) == Indices{10, 20, 30, 50, 40});
    // An empty subset yields nothing.
    SubsetRandomSampler empty({}, make_generator(0));
    CHECK(empty.size() == 0);
    CHECK(epoch_of(empty).empty());
    CHECK(batched_epoch_of(empty).empty());
  }

  TEST_CASE("WeightedRandomSampler draws as torch.multinomial") {
    // list(WeightedRandomSampler([.9, .4, .05, .2, .3, .1], 5, replacement=False, seed 8)), twice
    WeightedRandomSampler no_repl({0.9, 0.4, 0.05, 0.2, 0.3, 0.1}, 5, false, make_generator(8));
    CHECK(no_repl.size() == 5);
    CHECK_FALSE(no_repl.replacement());
    CHECK(epoch_of(no_repl) == Indices{3, 0, 1, 2, 4});
    CHECK(epoch_of(no_repl) == Indices{1, 0, 4, 3, 2});
    // Zero weights are never drawn.
    WeightedRandomSampler zeros({0.0, 1.0, 0.0, 2.0}, 8, true, make_generator(2));
    CHECK(zeros.replacement());
    CHECK(epoch_of(zeros) == Indices{3, 1, 3, 3, 3, 3, 1, 1});
    // A float32 tensor is converted to float64, as torch.as_tensor(weights, dtype=double).
    WeightedRandomSampler tensor(at::tensor({1.0f, 2.0f, 3.0f}), 4, true, make_generator(4));
    CHECK(tensor.weights().dtype() == at::kDouble);
    CHECK(tensor.weights().dim() == 1);
    CHECK(tensor.weights().size(0) == 3);
    CHECK(epoch_of(tensor) == Indices{1, 2, 0, 2});
    // Without a generator: torch.manual_seed(5); list(s); list(s)
    WeightedRandomSampler plain({0.1, 0.9, 0.4, 0.7, 3.0, 0.6}, 6);
    at::manual_seed(5);
    CHECK(epoch_of(plain) == Indices{4, 3, 3, 3, 3, 4});
    CHECK(epoch_of(plain) == Indices{4, 4, 4, 4, 3, 3});
    // Through BatchSampler(3, drop_last).
    BatchSampler batches(WeightedRandomSampler({0.1, 0.9, 0.4, 0.7, 3.0, 0.6}, 7, true,
                                               make_generator(1)),
                         3, true);
    CHECK(batches.size() == 2);
    CHECK(batches_of(batches) == Batches{{1, 2, 2}, {2, 4, 1}});
  }

  TEST_CASE("WeightedRandomSampler refuses what PyTorch refuses, with its messages") {
    CHECK(invalid_argument_of([] { WeightedRandomSampler s({1.0, 2.0}, 0); }) ==
          "num_samples should be a positive integer value, but got num_samples=0");
    CHECK(invalid_argument_of([] { WeightedRandomSampler s(at::ones({2}), -4, false); }) ==
          "num_samples should be a positive integer value, but got num_samples=-4");
    CHECK(invalid_argument_of([] { WeightedRandomSampler s(at::ones({2, 3}), 3); }) ==
          "weights should be a 1d sequence but given weights have shape (2, 3)");
    CHECK(invalid_argument_of([] { WeightedRandomSampler s(at::ones({}), 3); }) ==
          "weights should be a 1d sequence but given weights have shape ()");
    CHECK(invalid_argument_of([] { WeightedRandomSampler s(at::ones({1, 2, 3}), 3); }) ==
          "weights should be a 1d sequence but given weights have shape (1, 2, 3)");
    CHECK(invalid_argument_of([] { WeightedRandomSampler s(at::ones({2}), 3); }) == "");
    // More samples than categories without replacement: ATen refuses when the epoch starts.
    WeightedRandomSampler too_many({1.0, 2.0}, 3, false, make_generator(0));
    std::string message;
    try {
      epoch_of(too_many);
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
    CHECK(message.find("cannot sample n_sample > prob_dist.size(-1) samples without replacement") !=
          std::string::npos);
  }

  TEST_CASE("DistributedSampler shares out a shuffled, padded order as PyTorch does") {
    // DistributedSampler(range(10), num_replicas=3, rank=1, seed=7)
    DistributedSampler s(10, 3, 1, true, 7);
    CHECK(s.size() == 4);
    CHECK(s.total_size() == 12);
    CHECK(s.num_replicas() == 3);
    CHECK(s.rank() == 1);
    CHECK(s.epoch() == 0);
    CHECK(epoch_of(s) == Indices{0, 1, 6, 5});
    CHECK(epoch_of(s) == Indices{0, 1, 6, 5});  // the same until set_epoch
    s.set_epoch(1);
    CHECK(s.epoch() == 1);
    CHECK(epoch_of(s) == Indices{5, 2, 7, 3});
    s.set_epoch(0);
    BatchSampler pairs(RefSampler<DistributedSampler>{&s}, 2, false);
    CHECK(batches_of(pairs) == Batches{{0, 1}, {6, 5}});
    // drop_last cuts the tail instead: 9 of 10 indices, 3 per replica.
    DistributedSampler cut(10, 3, 1, true, 7, true);
    CHECK(cut.size() == 3);
    CHECK(cut.total_size() == 9);
    CHECK(epoch_of(cut) == Indices{0, 1, 6});
    // Padding longer than the dataset repeats it: 2 indices over 5 replicas.
    for (std::int64_t rank = 0; rank < 5; ++rank) {
      CAPTURE(rank);
      DistributedSampler pad(2, 5, rank, false);
      CHECK(pad.size() == 1);
      CHECK(epoch_of(pad) == Indices{rank % 2});
      DistributedSampler none(2, 5, rank, false, 0, true);
      CHECK(none.size() == 0);
      CHECK(epoch_of(none).empty());
      CHECK(batched_epoch_of(none).empty());
    }
    DistributedSampler empty(0, 2, 1);
    CHECK(empty.size() == 0);
    CHECK(epoch_of(empty).empty());
  }

  TEST_CASE("DistributedSampler refuses a rank outside [0, num_replicas) with PyTorch's message") {
    CHECK(invalid_argument_of([] { DistributedSampler s(4, 3, 3); }) ==
          "Invalid rank 3, rank should be in the interval [0, 2]");
    CHECK(invalid_argument_of([] { DistributedSampler s(4, 3, -1); }) ==
          "Invalid rank -1, rank should be in the interval [0, 2]");
    // PyTorch says "Invalid rank 0, rank should be in the interval [0, -1]" for no replicas;
    // coload names the option (and INT64_MIN replicas overflowed in that message).
    CHECK(invalid_argument_of([] { DistributedSampler s(4, 0, 0); }) ==
          "num_replicas should be a positive integer value, but got num_replicas=0");
    CHECK(invalid_argument_of([] { DistributedSampler s(4, INT64_MIN, 0); }) ==
          "num_replicas should be a positive integer value, but got num_replicas=" +
              std::to_string(INT64_MIN));
    CHECK(invalid_argument_of([] { DistributedSampler s(4, 3, 2); }) == "");
    // The share of a size near INT64_MAX: (size + replicas - 1) overflowed to a negative.
    CHECK(DistributedSampler(INT64_MAX, 2, 0, false).size() == (INT64_MAX / 2) + 1);
  }

  TEST_CASE("DistributedSampler reads num_replicas and rank from torchrun's environment") {
    {
      ScopedEnv world("WORLD_SIZE", std::nullopt);
      ScopedEnv rank("RANK", std::nullopt);
      DistributedSampler s(5);
      CHECK(s.num_replicas() == 1);
      CHECK(s.rank() == 0);
      CHECK(s.size() == 5);
    }
    {
      ScopedEnv world("WORLD_SIZE", "4");
      ScopedEnv rank("RANK", "2");
      DistributedSampler s(10, std::nullopt, std::nullopt, false);
      CHECK(s.num_replicas() == 4);
      CHECK(s.rank() == 2);
      CHECK(epoch_of(s) == Indices{2, 6, 0});
      // Explicit arguments win over the environment.
      DistributedSampler t(10, 2, 1, false);
      CHECK(t.num_replicas() == 2);
      CHECK(t.rank() == 1);
      // The rank from the environment is checked too.
      ScopedEnv bad_rank("RANK", "4");
      CHECK(invalid_argument_of([] { DistributedSampler u(10); }) ==
            "RANK=4 is not in [0, WORLD_SIZE=4)");
      // Whenever the environment supplies one of the two, all of it is checked; with both
      // explicit it is not read.
      CHECK(invalid_argument_of([] { DistributedSampler u(10, 3); }) ==
            "RANK=4 is not in [0, WORLD_SIZE=4)");
      CHECK(invalid_argument_of([] { DistributedSampler u(10, 3, 2); }) == "");
    }
    {
      ScopedEnv world("WORLD_SIZE", "four");
      ScopedEnv rank("RANK", "0");
      CHECK(invalid_argument_of([] { DistributedSampler s(10); }) ==
            "WORLD_SIZE=four is not an integer");
    }
  }

  TEST_CASE("distributed_env reads torchrun's RANK, WORLD_SIZE and LOCAL_RANK") {
    // Every case sets all three (nullopt: unset), then restores what the process had.
    struct Case {
      std::optional<std::string> rank, world_size, local_rank;
    };
    const auto env_of = [](const Case& c) {
      ScopedEnv rank("RANK", c.rank);
      ScopedEnv world("WORLD_SIZE", c.world_size);
      ScopedEnv local("LOCAL_RANK", c.local_rank);
      return distributed_env();
    };
    const auto error_of = [&env_of](const Case& c) {
      return invalid_argument_of([&] { env_of(c); });
    };

    const DistributedEnv none = env_of({std::nullopt, std::nullopt, std::nullopt});
    CHECK(none.rank == 0);
    CHECK(none.world_size == 1);
    CHECK(none.local_rank == 0);
    const DistributedEnv empty = env_of({"", "", ""});
    CHECK((empty.rank == 0 && empty.world_size == 1 && empty.local_rank == 0));
    const DistributedEnv set = env_of({"5", "8", "1"});
    CHECK(set.rank == 5);
    CHECK(set.world_size == 8);
    CHECK(set.local_rank == 1);

    CHECK(error_of({"abc", "2", "0"}) == "RANK=abc is not an integer");
    CHECK(error_of({"1", "2x", "0"}) == "WORLD_SIZE=2x is not an integer");
    CHECK(error_of({"1", "2", " 1"}) == "LOCAL_RANK= 1 is not an integer");
    CHECK(error_of({"1.0", "2", "0"}) == "RANK=1.0 is not an integer");
    CHECK(error_of({"0", "99999999999", "0"}) == "WORLD_SIZE=99999999999 is out of range");
    CHECK(error_of({"3", "2", "0"}) == "RANK=3 is not in [0, WORLD_SIZE=2)");
    CHECK(error_of({"-1", "2", "0"}) == "RANK=-1 is not in [0, WORLD_SIZE=2)");
    CHECK(error_of({"1", std::nullopt, "0"}) == "RANK=1 is not in [0, WORLD_SIZE=1)");
    CHECK(error_of({"0", "2", "2"}) == "LOCAL_RANK=2 is not in [0, WORLD_SIZE=2)");
    CHECK(error_of({"0", "0", "0"}) == "WORLD_SIZE=0 is not a positive integer");
    CHECK(error_of({"0", "-3", "0"}) == "WORLD_SIZE=-3 is not a positive integer");
  }

  TEST_CASE("DistributedSampler shards by torchrun's WORLD_SIZE and RANK: the ranks partition "
            "the padded order") {
    // 7 indices over 3 ranks: 9 positions, the first two of the (unshuffled) order repeated.
    ScopedEnv world("WORLD_SIZE", "3");
    Indices all;
    for (const char* r : {"0", "1", "2"}) {
      ScopedEnv rank("RANK", r);
      DistributedSampler s(7, std::nullopt, std::nullopt, false);
      CHECK(s.num_replicas() == 3);
      CHECK(s.size() == 3);
      const Indices mine = epoch_of(s);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    CHECK(all == Indices{0, 0, 1, 1, 2, 3, 4, 5, 6});
  }

  TEST_CASE("a seeded sampler reads as in Python: RandomSampler(n, {.seed = 42})") {
    // RandomSampler(range(10), generator=torch.Generator().manual_seed(42)).
    RandomSampler seeded(10, {.seed = 42});
    CHECK(epoch_of(seeded) == Indices{2, 6, 1, 8, 4, 5, 0, 9, 3, 7});
    CHECK(epoch_of(seeded) == Indices{7, 5, 0, 3, 1, 6, 9, 8, 4, 2});  // the stream goes on
    RandomSampler keywords(10, {.replacement = true, .num_samples = 5, .seed = 1});
    RandomSampler positional(10, true, 5, make_generator(1));
    CHECK(keywords.size() == 5);
    CHECK(epoch_of(keywords) == epoch_of(positional));
    SubsetRandomSampler subset({10, 20, 30, 40, 50}, 1);
    CHECK(epoch_of(subset) == Indices{10, 50, 30, 40, 20});
    WeightedRandomSampler weighted({0.0, 1.0, 0.0, 2.0}, 8, true, 2);
    CHECK(epoch_of(weighted) == Indices{3, 1, 3, 3, 3, 3, 1, 1});
  }

  TEST_CASE("the new samplers go into LoaderOptions::sampler, by value or shared") {
    LoaderOptions<> subset{.sampler = SubsetRandomSampler({10, 20, 30, 40, 50}, make_generator(1))};
    CHECK(subset.sampler.size() == std::optional<std::int64_t>(5));
    CHECK(sync_wait(drain(subset.sampler.indices())) == Indices{10, 50, 30, 40, 20});

    LoaderOptions<> weighted{
        .sampler = WeightedRandomSampler({0.0, 1.0, 0.0, 2.0}, 8, true, make_generator(2))};
    CHECK(weighted.sampler.size() == std::optional<std::int64_t>(8));
    CHECK(sync_wait(drain(weighted.sampler.indices())) == Indices{3, 1, 3, 3, 3, 3, 1, 1});

    // Shared, so the training loop can call set_epoch between epochs.
    auto distributed = std::make_shared<DistributedSampler>(10, 3, 1, true, 7);
    LoaderOptions<> options{.batch_size = 2, .sampler = distributed};
    CHECK(options.sampler.size() == std::optional<std::int64_t>(4));
    CHECK(sync_wait(drain(options.sampler.indices())) == Indices{0, 1, 6, 5});
    distributed->set_epoch(1);
    CHECK(sync_wait(drain(options.sampler.indices())) == Indices{5, 2, 7, 3});
  }
}
