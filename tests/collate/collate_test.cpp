#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <optional>
#include <unordered_map>
// Specification of default_collate and the Collate<T> customisation point, checked against
// torch.utils.data.default_collate where PyTorch has an equivalent.

#include <ATen/ATen.h>

#include <complex>
#include <concepts>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coload/collate/collate.hpp"

using namespace coload;

namespace collate_test {

// A user sample type that opts in through a Collate specialisation.
struct Point {
  float x;
  float y;
};
struct PointBatch {
  at::Tensor xy;  // [n, 2]
  int count;
};

// A type nobody taught default_collate about.
struct Opaque {
  int v;
};

}  // namespace collate_test

namespace coload {
template <>
struct Collate<collate_test::Point> {
  static collate_test::PointBatch collate(std::vector<collate_test::Point>&& samples) {
    std::vector<float> flat;
    for (const auto& p : samples) {
      flat.push_back(p.x);
      flat.push_back(p.y);
    }
    const auto n = static_cast<std::int64_t>(samples.size());
    return {at::tensor(flat).view({n, 2}), static_cast<int>(samples.size())};
  }
};
}  // namespace coload

using collate_test::Opaque;
using collate_test::Point;
using collate_test::PointBatch;

namespace {

// A float tensor of the given shape holding `values`.
at::Tensor floats(std::vector<float> values, std::vector<std::int64_t> shape) {
  return at::tensor(values).view(shape).clone();
}
at::Tensor longs(std::vector<std::int64_t> values, std::vector<std::int64_t> shape) {
  return at::tensor(values).view(shape).clone();
}

// The dtype's name, as c10 spells it ("Float", "Long", ...).
std::string dtype(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

// True when `t` has exactly this dtype, shape and these values.
bool same(const at::Tensor& t, const at::Tensor& expected) {
  return t.defined() && t.scalar_type() == expected.scalar_type() &&
         t.sizes() == expected.sizes() && at::equal(t, expected);
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

}  // namespace

TEST_SUITE("collate") {
  TEST_CASE("tensors are stacked along a new first dimension, keeping their dtype") {
    std::vector<at::Tensor> samples{floats({1, 2, 3, 4}, {2, 2}), floats({5, 6, 7, 8}, {2, 2}),
                                    floats({9, 10, 11, 12}, {2, 2})};
    at::Tensor batch = default_collate(samples);
    CHECK(batch.sizes() == at::IntArrayRef{3, 2, 2});
    CHECK(dtype(batch) == "Float");
    CHECK(batch.is_contiguous());
    CHECK(same(batch, floats({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 2, 2})));

    // Integer tensors stay integer; scalars (0-dim) become a 1-D batch.
    at::Tensor ints = default_collate(std::vector<at::Tensor>{longs({7, -8}, {2}), longs({9, 10}, {2})});
    CHECK(same(ints, longs({7, -8, 9, 10}, {2, 2})));
    at::Tensor scalars =
        default_collate(std::vector<at::Tensor>{at::scalar_tensor(1.5, at::kDouble),
                                                 at::scalar_tensor(-2.0, at::kDouble)});
    CHECK(dtype(scalars) == "Double");
    CHECK(scalars.sizes() == at::IntArrayRef{2});
    CHECK(scalars[0].item<double>() == 1.5);
    CHECK(scalars[1].item<double>() == -2.0);
  }

  TEST_CASE("the stacked batch is a copy: writing to it leaves the samples unchanged") {
    at::Tensor a = floats({1, 2}, {2});
    at::Tensor b = floats({3, 4}, {2});
    at::Tensor batch = default_collate(std::vector<at::Tensor>{a, b});
    batch.fill_(0);
    CHECK(same(a, floats({1, 2}, {2})));
    CHECK(same(b, floats({3, 4}, {2})));
  }

  TEST_CASE("a sample that requires grad collates into a batch with its graph, as torch.stack") {
    // The byte-copy fast path made a batch without grad_fn: the graph was lost.
    at::Tensor a = floats({1, 2}, {2}).requires_grad_();
    at::Tensor b = floats({3, 4}, {2});
    at::Tensor batch = default_collate(std::vector<at::Tensor>{a, b});
    REQUIRE(batch.requires_grad());
    CHECK(batch.grad_fn() != nullptr);
    batch.sum().backward();
    CHECK(same(a.grad(), floats({1, 1}, {2})));
  }

  TEST_CASE("tensors of different shapes are refused with at::stack's message") {
    std::vector<at::Tensor> samples{at::zeros({2}), at::zeros({3})};
    CHECK_THROWS_WITH_AS(default_collate(samples),
                         doctest::Contains("stack expects each tensor to be equal size"),
                         c10::Error);
  }

  TEST_CASE("non-contiguous tensors (transposed, sliced, expanded) collate to their values") {
    // Transposed views: [[0, 3], [1, 4], [2, 5]] and the same plus 10.
    at::Tensor t0 = at::arange(6, at::kLong).view({2, 3}).t();
    at::Tensor t1 = (at::arange(6, at::kLong) + 10).view({2, 3}).t();
    REQUIRE_FALSE(t0.is_contiguous());
    at::Tensor batch = default_collate(std::vector<at::Tensor>{t0, t1});
    CHECK(same(batch, longs({0, 3, 1, 4, 2, 5, 10, 13, 11, 14, 12, 15}, {2, 3, 2})));

    // A contiguous sample first, then a transposed one.
    at::Tensor c = longs({100, 101, 102, 103, 104, 105}, {3, 2});
    CHECK(same(default_collate(std::vector<at::Tensor>{c, t0}),
               longs({100, 101, 102, 103, 104, 105, 0, 3, 1, 4, 2, 5}, {2, 3, 2})));

    // Rows of a larger tensor (contiguous with a storage offset), a strided column, and an
    // expanded (stride 0) tensor.
    at::Tensor big = at::arange(12, at::kLong).view({3, 4});
    at::Tensor rows = default_collate(std::vector<at::Tensor>{big[2], big[0]});
    CHECK(same(rows, longs({8, 9, 10, 11, 0, 1, 2, 3}, {2, 4})));
    at::Tensor cols = default_collate(
        std::vector<at::Tensor>{big.select(1, 1), big.select(1, 3)});
    CHECK(same(cols, longs({1, 5, 9, 3, 7, 11}, {2, 3})));
    at::Tensor expanded = longs({4}, {1}).expand({3});
    CHECK(same(default_collate(std::vector<at::Tensor>{expanded, longs({1, 2, 3}, {3})}),
               longs({4, 4, 4, 1, 2, 3}, {2, 3})));
  }

  TEST_CASE("conjugate and negative views collate to their logical values, as torch.stack") {
    // A conj or neg view is "contiguous" but its stored bytes are not its values.
    using C = c10::complex<float>;
    at::Tensor z = at::tensor(std::vector<C>{C(1, 2), C(3, -4)});
    at::Tensor zc = z.conj();
    REQUIRE(zc.is_conj());
    at::Tensor batch = default_collate(std::vector<at::Tensor>{zc, zc});
    at::Tensor expected = at::stack({zc, zc}).resolve_conj();
    CHECK(at::equal(batch.resolve_conj(), expected));
    CHECK(at::imag(batch)[0][0].item<float>() == -2.0f);

    at::Tensor x = floats({1, -2}, {2});
    at::Tensor neg = at::_neg_view(x);
    REQUIRE(neg.is_neg());
    CHECK(same(default_collate(std::vector<at::Tensor>{neg, x}).resolve_neg(),
               floats({-1, 2, 1, -2}, {2, 2})));
  }

  TEST_CASE("numbers become a 1-D tensor of the matching dtype") {
    at::Tensor f = default_collate(std::vector<float>{1.5f, -2.25f});
    CHECK(same(f, at::tensor(std::vector<float>{1.5f, -2.25f})));
    CHECK(dtype(f) == "Float");

    at::Tensor d = default_collate(std::vector<double>{0.1, 1e300});
    CHECK(dtype(d) == "Double");
    CHECK(d[0].item<double>() == 0.1);
    CHECK(d[1].item<double>() == 1e300);

    at::Tensor l = default_collate(std::vector<std::int64_t>{1, -2, std::int64_t{1} << 40});
    CHECK(same(l, longs({1, -2, std::int64_t{1} << 40}, {3})));
    CHECK(dtype(l) == "Long");

    // Every integer type becomes int64, as Python ints do; bool stays bool.
    at::Tensor i = default_collate(std::vector<std::int32_t>{7, -2147483647 - 1});
    CHECK(dtype(i) == "Long");
    CHECK(i.sizes() == at::IntArrayRef{2});
    CHECK(i[0].item<std::int64_t>() == 7);
    CHECK(i[1].item<std::int64_t>() == -2147483647 - 1);

    at::Tensor b = default_collate(std::vector<bool>{true, false, true});
    CHECK(dtype(b) == "Bool");
    CHECK(b.sizes() == at::IntArrayRef{3});
    CHECK(b[0].item<bool>());
    CHECK_FALSE(b[1].item<bool>());
    CHECK(b[2].item<bool>());

    at::Tensor u = default_collate(std::vector<std::uint8_t>{0, 255, 7});
    CHECK(dtype(u) == "Long");
    CHECK(u[1].item<std::int64_t>() == 255);
    at::Tensor c = default_collate(std::vector<std::int8_t>{-128, 5});
    CHECK(dtype(c) == "Long");
    CHECK(c[0].item<std::int64_t>() == -128);
    at::Tensor s = default_collate(std::vector<std::int16_t>{-300, 300});
    CHECK(dtype(s) == "Long");
    CHECK(s[0].item<std::int64_t>() == -300);
    at::Tensor w = default_collate(std::vector<std::uint32_t>{4000000000u, 1u});
    CHECK(dtype(w) == "Long");
    CHECK(w[0].item<std::int64_t>() == 4000000000LL);
    at::Tensor h = default_collate(std::vector<std::uint16_t>{65535, 2});
    CHECK(dtype(h) == "Long");
    CHECK(h[0].item<std::int64_t>() == 65535);
  }

  TEST_CASE("a tuple of a tensor and an int64 collates position by position") {
    using Sample = std::tuple<at::Tensor, std::int64_t>;
    static_assert(std::same_as<collated_t<Sample>, std::tuple<at::Tensor, at::Tensor>>);
    std::vector<Sample> samples{{floats({1, 2}, {2}), 10}, {floats({3, 4}, {2}), 20},
                                {floats({5, 6}, {2}), 30}};
    auto [x, y] = default_collate(std::move(samples));
    CHECK(same(x, floats({1, 2, 3, 4, 5, 6}, {3, 2})));
    CHECK(same(y, longs({10, 20, 30}, {3})));
  }

  TEST_CASE("a pair collates first and second separately") {
    using Sample = std::pair<at::Tensor, double>;
    static_assert(std::same_as<collated_t<Sample>, std::pair<at::Tensor, at::Tensor>>);
    std::vector<Sample> samples{{longs({1}, {1}), 0.5}, {longs({2}, {1}), -1.5}};
    auto batch = default_collate(std::move(samples));
    CHECK(same(batch.first, longs({1, 2}, {2, 1})));
    CHECK(same(batch.second, at::tensor(std::vector<double>{0.5, -1.5})));
  }

  TEST_CASE("a vector of tensors is transposed: one stacked tensor per position") {
    using Sample = std::vector<at::Tensor>;
    static_assert(std::same_as<collated_t<Sample>, std::vector<at::Tensor>>);
    std::vector<Sample> samples{{floats({1, 2}, {2}), longs({10}, {1})},
                                {floats({3, 4}, {2}), longs({20}, {1})},
                                {floats({5, 6}, {2}), longs({30}, {1})}};
    std::vector<at::Tensor> batch = default_collate(std::move(samples));
    REQUIRE(batch.size() == 2);
    CHECK(same(batch[0], floats({1, 2, 3, 4, 5, 6}, {3, 2})));
    CHECK(same(batch[1], longs({10, 20, 30}, {3, 1})));

    // A vector of numbers is transposed the same way (a list of ints in PyTorch).
    std::vector<std::vector<std::int64_t>> rows{{1, 2, 3}, {4, 5, 6}};
    std::vector<at::Tensor> columns = default_collate(std::move(rows));
    REQUIRE(columns.size() == 3);
    CHECK(same(columns[0], longs({1, 4}, {2})));
    CHECK(same(columns[1], longs({2, 5}, {2})));
    CHECK(same(columns[2], longs({3, 6}, {2})));
  }

  TEST_CASE("vectors of unequal length are refused with PyTorch's message") {
    std::vector<std::vector<at::Tensor>> samples{{at::zeros({1}), at::zeros({1})},
                                                 {at::zeros({1}), at::zeros({1}), at::zeros({1})}};
    const std::string msg =
        message_of<std::runtime_error>([&] { (void)default_collate(std::move(samples)); });
    CHECK(msg.rfind("each element in list of batch should be of equal size", 0) == 0);
  }

  TEST_CASE("a string-keyed map collates each key of the first sample") {
    using Sample = std::map<std::string, at::Tensor>;
    static_assert(std::same_as<collated_t<Sample>, std::map<std::string, at::Tensor>>);
    std::vector<Sample> samples{
        {{"image", floats({1, 2}, {2})}, {"label", longs({0}, {})}},
        // A key the first sample lacks is ignored, as in PyTorch.
        {{"image", floats({3, 4}, {2})}, {"label", longs({1}, {})}, {"extra", at::zeros({9})}}};
    auto batch = default_collate(std::move(samples));
    REQUIRE(batch.size() == 2);
    CHECK(batch.count("extra") == 0);
    CHECK(same(batch.at("image"), floats({1, 2, 3, 4}, {2, 2})));
    CHECK(same(batch.at("label"), longs({0, 1}, {2})));

    // A key of the first sample missing from a later one is an error naming it.
    std::vector<Sample> missing{{{"a", at::zeros({1})}, {"b", at::zeros({1})}},
                                {{"a", at::zeros({1})}}};
    const std::string msg =
        message_of<std::runtime_error>([&] { (void)default_collate(std::move(missing)); });
    CHECK(msg.find("'b'") != std::string::npos);
    CHECK(msg.find("sample 1") != std::string::npos);
  }

  TEST_CASE("arrays, hash maps and optionals collate element by element") {
    using Arr = std::array<std::int64_t, 3>;
    static_assert(std::same_as<collated_t<Arr>, std::array<at::Tensor, 3>>);
    auto cols = default_collate(std::vector<Arr>{{1, 2, 3}, {4, 5, 6}});
    CHECK(same(cols[0], longs({1, 4}, {2})));
    CHECK(same(cols[2], longs({3, 6}, {2})));

    using Dict = std::unordered_map<std::string, double>;
    static_assert(std::same_as<collated_t<Dict>, std::unordered_map<std::string, at::Tensor>>);
    auto by_key = default_collate(std::vector<Dict>{{{"x", 1.0}, {"y", 2.0}},
                                                    {{"x", 3.0}, {"y", 4.0}}});
    REQUIRE(by_key.size() == 2);
    CHECK(dtype(by_key.at("x")) == "Double");
    CHECK(by_key.at("x")[1].item<double>() == 3.0);
    CHECK(by_key.at("y")[0].item<double>() == 2.0);
    CHECK_THROWS_WITH_AS(default_collate(std::vector<Dict>{{{"x", 1.0}}, {{"z", 2.0}}}),
                         "default_collate: sample 1 has no key 'x' that sample 0 has",
                         std::runtime_error);

    static_assert(std::same_as<collated_t<std::optional<float>>, at::Tensor>);
    auto present = default_collate(std::vector<std::optional<float>>{1.5f, 2.5f});
    CHECK(same(present, at::tensor(std::vector<float>{1.5f, 2.5f})));
    CHECK_THROWS_WITH_AS(
        default_collate(std::vector<std::optional<float>>{1.5f, std::nullopt}),
        "default_collate: sample 1 is an empty std::optional; every sample must hold a value",
        std::runtime_error);
  }

  TEST_CASE("strings are kept as a vector of strings") {
    static_assert(std::same_as<collated_t<std::string>, std::vector<std::string>>);
    auto names = default_collate(std::vector<std::string>{"cat", "", "dog"});
    CHECK(names == std::vector<std::string>{"cat", "", "dog"});

    using Sample = std::tuple<std::string, std::int32_t>;
    static_assert(
        std::same_as<collated_t<Sample>, std::tuple<std::vector<std::string>, at::Tensor>>);
    auto [labels, ids] = default_collate(std::vector<Sample>{{"a", 1}, {"b", 2}});
    CHECK(labels == std::vector<std::string>{"a", "b"});
    CHECK(dtype(ids) == "Long");
    CHECK(ids[1].item<std::int64_t>() == 2);
  }

  TEST_CASE("a user type opts in through a Collate specialisation, used by DefaultCollate") {
    static_assert(Collatable<Point>);
    static_assert(!Collatable<Opaque>);
    static_assert(!Collatable<std::tuple<at::Tensor, Opaque>>);
    static_assert(!Collatable<std::map<int, at::Tensor>>);
    static_assert(std::same_as<collated_t<Point>, PointBatch>);

    PointBatch batch = DefaultCollate{}(std::vector<Point>{{1, 2}, {3, 4}, {5, 6}});
    CHECK(batch.count == 3);
    CHECK(same(batch.xy, floats({1, 2, 3, 4, 5, 6}, {3, 2})));

    // The specialisation composes with the standard ones.
    using Sample = std::pair<Point, std::int64_t>;
    static_assert(std::same_as<collated_t<Sample>, std::pair<PointBatch, at::Tensor>>);
    auto [points, labels] = DefaultCollate{}(std::vector<Sample>{{{7, 8}, 1}, {{9, 10}, 0}});
    CHECK(points.count == 2);
    CHECK(same(points.xy, floats({7, 8, 9, 10}, {2, 2})));
    CHECK(same(labels, longs({1, 0}, {2})));
  }

  TEST_CASE("a nested sample matches torch.utils.data.default_collate") {
    // batch = [(tensor([1., 2.]), 3, {"a": tensor([[1, 2], [3, 4]]), "b": tensor(0.5)},
    //           [0.25, 1.0]), ...]; default_collate(batch) gives, in PyTorch 1.13:
    //   [tensor([[1., 2.], [5., 6.], [9., 10.]]), tensor([3, 7, -1]),
    //    {"a": int64 [3, 2, 2] tensor 1..12, "b": float32 tensor([0.5, 1.5, -2.0])},
    //    [float64 tensor([0.25, 2.5, 8.0]), float64 tensor([1.0, -4.0, 0.125])]]
    using Dict = std::map<std::string, at::Tensor>;
    using Sample = std::tuple<at::Tensor, std::int64_t, Dict, std::vector<double>>;
    std::vector<Sample> samples{
        {floats({1, 2}, {2}), 3,
         Dict{{"a", longs({1, 2, 3, 4}, {2, 2})}, {"b", at::scalar_tensor(0.5, at::kFloat)}},
         {0.25, 1.0}},
        {floats({5, 6}, {2}), 7,
         Dict{{"a", longs({5, 6, 7, 8}, {2, 2})}, {"b", at::scalar_tensor(1.5, at::kFloat)}},
         {2.5, -4.0}},
        {floats({9, 10}, {2}), -1,
         Dict{{"a", longs({9, 10, 11, 12}, {2, 2})}, {"b", at::scalar_tensor(-2.0, at::kFloat)}},
         {8.0, 0.125}}};
    auto [x, y, dict, list] = DefaultCollate{}(std::move(samples));
    CHECK(same(x, floats({1, 2, 5, 6, 9, 10}, {3, 2})));
    CHECK(same(y, longs({3, 7, -1}, {3})));
    REQUIRE(dict.size() == 2);
    CHECK(same(dict.at("a"), longs({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 2, 2})));
    CHECK(same(dict.at("b"), floats({0.5, 1.5, -2.0}, {3})));
    REQUIRE(list.size() == 2);
    CHECK(same(list[0], at::tensor(std::vector<double>{0.25, 2.5, 8.0})));
    CHECK(same(list[1], at::tensor(std::vector<double>{1.0, -4.0, 0.125})));
  }
}
