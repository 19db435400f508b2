// Specification of the wire format that process workers use to hand a collated batch to the
// parent through shared memory: exact round trips, tensors read in place (no copy), exact
// sizes, and errors that say what is wrong and where.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "coload/collate/wire.hpp"

using namespace coload;
using namespace std::string_literals;

namespace wire_test {

// A user batch type that opts in through a Wire specialisation.
struct Detections {
  at::Tensor boxes;                 // [n, 4]
  std::vector<std::string> labels;  // n
  std::int32_t image_id;
};

// A type nobody taught the wire about.
struct Opaque {
  int v;
};

}  // namespace wire_test

template <>
struct coload::wire::Wire<wire_test::Detections> {
  static constexpr std::uint8_t tag_value = tag::user + 1;
  static void write(Writer& w, const wire_test::Detections& d) {
    w.tag(tag_value);
    Wire<at::Tensor>::write(w, d.boxes);
    Wire<std::vector<std::string>>::write(w, d.labels);
    Wire<std::int32_t>::write(w, d.image_id);
  }
  static wire_test::Detections read(Reader& r) {
    r.expect_tag(tag_value, "a Detections");
    auto boxes = Wire<at::Tensor>::read(r);
    auto labels = Wire<std::vector<std::string>>::read(r);
    auto image_id = Wire<std::int32_t>::read(r);
    return {std::move(boxes), std::move(labels), image_id};
  }
};

namespace wire_test {
namespace {

static_assert(wire::Wireable<at::Tensor>);
static_assert(wire::Wireable<std::map<std::string, std::vector<std::optional<double>>>>);
static_assert(wire::Wireable<Detections>);
static_assert(!wire::Wireable<Opaque>);
static_assert(!wire::Wireable<std::vector<Opaque>>);
static_assert(!wire::Wireable<std::map<int, at::Tensor>>);  // keys must be strings

// A zeroed region aligned to tensor_alignment, as a shared-memory slot is.
class Region {
 public:
  explicit Region(std::size_t size) : storage_(size + wire::tensor_alignment), size_(size) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    offset_ = (wire::tensor_alignment - addr % wire::tensor_alignment) % wire::tensor_alignment;
  }
  std::span<std::byte> bytes() { return {storage_.data() + offset_, size_}; }

 private:
  std::vector<std::byte> storage_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

// Encodes `value` into a region of exactly encoded_size bytes.
template <class T>
Region encoded(const T& value) {
  Region region(wire::encoded_size(value));
  REQUIRE(wire::encode(value, region.bytes()) == region.bytes().size());
  return region;
}

template <class T>
T round_trip(const T& value) {
  Region region = encoded(value);
  // The tensors read alias the region: keep it alive through the owner.
  auto shared = std::make_shared<Region>(std::move(region));
  return wire::decode<T>(shared->bytes(), shared);
}

// True when `t` has exactly this dtype, shape and these values.
bool same(const at::Tensor& t, const at::Tensor& expected) {
  return t.defined() && t.scalar_type() == expected.scalar_type() &&
         t.sizes() == expected.sizes() && at::equal(t, expected);
}

using Nested =
    std::tuple<at::Tensor, at::Tensor, std::vector<std::string>, std::map<std::string, at::Tensor>,
               double, std::int64_t, bool, std::optional<int>,
               std::pair<float, std::array<at::Tensor, 2>>>;

Nested nested_batch() {
  return Nested{
      at::arange(2 * 3 * 4 * 5, at::kFloat).reshape({2, 3, 4, 5}),
      at::tensor(std::vector<std::int64_t>{7, -1}),
      {"cat.jpg", ""s, "a\0b"s},
      {{"mask", at::tensor(std::vector<float>{1, 0, 1}).to(at::kBool)},
       {"weights", at::tensor(std::vector<double>{0.25, 1e-300, -2.0})},
       {"half", at::arange(5, at::kFloat).to(at::kHalf).reshape({5, 1})}},
      0.1,
      -(std::int64_t{1} << 62) - 3,
      true,
      42,
      {2.5f, {at::arange(200, at::kByte), at::tensor(std::vector<std::int32_t>{-5, 9})}}};
}

// Every tensor in a Nested batch.
std::vector<at::Tensor> tensors_of(const Nested& b) {
  std::vector<at::Tensor> out{std::get<0>(b), std::get<1>(b)};
  for (const auto& [key, t] : std::get<3>(b)) out.push_back(t);
  for (const auto& t : std::get<8>(b).second) out.push_back(t);
  return out;
}

// The message of the FormatError that `f` throws, or "" if it throws none.
template <class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const wire::FormatError& e) {
    return e.what();
  }
  return "";
}

template <class T>
void set_at(std::span<std::byte> bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Where `t`'s data lies, in bytes from the start of `region` (which holds it).
std::size_t offset_in(std::span<const std::byte> region, const at::Tensor& t) {
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  REQUIRE(p >= region.data());
  return static_cast<std::size_t>(p - region.data());
}

// A float tensor of `n` elements made over the region's bytes at `at`, as a batch allocator
// makes one in a slot, holding 0, 1, 2, ...
at::Tensor placed_at(std::span<std::byte> region, std::size_t at, std::int64_t n) {
  at::Tensor t = at::from_blob(region.data() + at, {n}, at::kFloat);
  t.copy_(at::arange(n, at::kFloat));
  return t;
}

}  // namespace
}  // namespace wire_test

using namespace wire_test;

TEST_SUITE("collate/wire") {
  TEST_CASE("a nested batch round-trips with its values, dtypes and shapes") {
    const Nested in = nested_batch();
    const Nested out = round_trip(in);

    CHECK(same(std::get<0>(out), std::get<0>(in)));
    CHECK(std::get<0>(out).sizes() == at::IntArrayRef({2, 3, 4, 5}));
    CHECK(same(std::get<1>(out), std::get<1>(in)));
    CHECK((std::get<1>(out).scalar_type() == at::kLong));
    CHECK(std::get<2>(out) == std::vector<std::string>{"cat.jpg", "", "a\0b"s});
    CHECK(std::get<2>(out)[2].size() == 3);

    const auto& map = std::get<3>(out);
    REQUIRE(map.size() == 3);
    CHECK(same(map.at("mask"), std::get<3>(in).at("mask")));
    CHECK((map.at("mask").scalar_type() == at::kBool));
    CHECK(same(map.at("weights"), std::get<3>(in).at("weights")));
    CHECK(map.at("weights")[1].item<double>() == 1e-300);
    CHECK(same(map.at("half"), std::get<3>(in).at("half")));
    CHECK((map.at("half").scalar_type() == at::kHalf));

    CHECK(std::get<4>(out) == 0.1);
    CHECK(std::get<5>(out) == -(std::int64_t{1} << 62) - 3);
    CHECK(std::get<6>(out) == true);
    CHECK((std::get<7>(out) == std::optional<int>(42)));
    CHECK(std::get<8>(out).first == 2.5f);
    CHECK(same(std::get<8>(out).second[0], std::get<8>(in).second[0]));
    CHECK((std::get<8>(out).second[0].scalar_type() == at::kByte));
    CHECK(same(std::get<8>(out).second[1], std::get<8>(in).second[1]));
    CHECK((std::get<8>(out).second[1].scalar_type() == at::kInt));

    for (const auto& t : tensors_of(out)) {
      CHECK(t.device().is_cpu());
      CHECK(t.is_contiguous());
      CHECK_FALSE(t.requires_grad());
    }
  }

  TEST_CASE("numbers, strings, optionals and maps round-trip exactly") {
    CHECK(round_trip(std::numeric_limits<std::uint64_t>::max()) ==
          std::numeric_limits<std::uint64_t>::max());
    CHECK(round_trip(std::numeric_limits<std::int8_t>::min()) ==
          std::numeric_limits<std::int8_t>::min());
    CHECK(round_trip(std::uint16_t{65535}) == 65535);
    CHECK(round_trip('x') == 'x');
    CHECK(round_trip(false) == false);
    CHECK(round_trip(3.0f / 7.0f) == 3.0f / 7.0f);
    CHECK(round_trip(std::numeric_limits<double>::denorm_min()) ==
          std::numeric_limits<double>::denorm_min());
    CHECK(std::signbit(round_trip(-0.0)));
    CHECK(std::isnan(round_trip(std::numeric_limits<float>::quiet_NaN())));
    CHECK(round_trip(1.0L / 3.0L) == 1.0L / 3.0L);

    CHECK(round_trip(std::string(1000, 'z')) == std::string(1000, 'z'));
    CHECK_FALSE(round_trip(std::optional<at::Tensor>()).has_value());
    CHECK(round_trip(std::vector<int>{}).empty());
    CHECK((round_trip(std::tuple<>{}) == std::tuple<>{}));

    const std::unordered_map<std::string, std::vector<std::optional<double>>> dict{
        {"a", {1.5, std::nullopt}}, {"", {}}, {"c", {std::nullopt}}};
    CHECK((round_trip(dict) == dict));

    // std::map and std::unordered_map share the dict tag: either reads the other.
    Region region = encoded(dict);
    const auto as_map = wire::decode<std::map<std::string, std::vector<std::optional<double>>>>(
        region.bytes(), nullptr);
    CHECK((as_map == std::map<std::string, std::vector<std::optional<double>>>(dict.begin(),
                                                                                dict.end())));
  }

  TEST_CASE("decoded tensors alias the region at 64-byte offsets and keep its owner alive") {
    bool released = false;
    Region region(wire::encoded_size(nested_batch()));
    const std::span<std::byte> bytes = region.bytes();
    REQUIRE(wire::encode(nested_batch(), bytes) == bytes.size());

    std::shared_ptr<void> owner(new int(0), [&released](void* p) {
      delete static_cast<int*>(p);
      released = true;
    });
    auto batch = std::make_unique<Nested>(wire::decode<Nested>(bytes, owner));
    const auto* begin = reinterpret_cast<const std::byte*>(bytes.data());
    const auto* end = begin + bytes.size();

    std::vector<at::Tensor> tensors = tensors_of(*batch);
    REQUIRE(tensors.size() == 7);
    for (const auto& t : tensors) {
      const auto* p = static_cast<const std::byte*>(t.data_ptr());
      CHECK(p >= begin);
      CHECK(p + t.nbytes() <= end);
      CHECK((p - begin) % static_cast<std::ptrdiff_t>(wire::tensor_alignment) == 0);
    }

    // No copy: a byte changed in the region shows in the tensor.
    const at::Tensor& images = std::get<0>(*batch);
    const std::size_t images_at =
        static_cast<std::size_t>(static_cast<const std::byte*>(images.data_ptr()) - begin);
    set_at(bytes, images_at, 123.0f);
    CHECK(images.flatten()[0].item<float>() == 123.0f);

    // The owner goes only when its last copy, held by the last tensor, does.
    CHECK(owner.use_count() > 1);
    owner.reset();
    tensors.clear();
    CHECK_FALSE(released);
    at::Tensor last = std::get<8>(*batch).second[1];
    batch.reset();
    CHECK_FALSE(released);
    CHECK(last[1].item<std::int32_t>() == 9);
    last = at::Tensor();
    CHECK(released);
  }

  TEST_CASE("encoded_size is exactly what encode writes, and a short region names both sizes") {
    const auto check_exact = [](const auto& value) {
      const std::size_t size = wire::encoded_size(value);
      Region region(size + 256);  // room to spare: encode must still stop at `size`
      CHECK(wire::encode(value, region.bytes()) == size);
    };
    check_exact(nested_batch());
    check_exact(at::Tensor(at::ones({3}, at::kDouble)));
    check_exact(at::arange(12).reshape({3, 4}).t());
    check_exact(std::string("abc"));
    check_exact(std::vector<at::Tensor>{at::ones({1}), at::zeros({0}), at::ones({65}, at::kByte)});
    check_exact(std::int64_t{5});
    CHECK(wire::encoded_size(std::int64_t{5}) == wire::header_size + 1 + 8);

    // The header declares the payload that follows it.
    Region small = encoded(std::string("hello"));
    std::uint64_t payload = 0;
    std::memcpy(&payload, small.bytes().data() + 8, sizeof payload);
    CHECK(payload == small.bytes().size() - wire::header_size);

    const Nested batch = nested_batch();
    const std::size_t need = wire::encoded_size(batch);
    Region region(need);
    const std::string expected =
        "wire: the batch needs " + std::to_string(need) + " bytes, the region has " +
        std::to_string(need - 1);
    CHECK_THROWS_WITH_AS(wire::encode(batch, region.bytes().first(need - 1)), expected.c_str(),
                         wire::FormatError);

    // Far too small, and empty: still the exact size, and as a RegionTooSmall.
    try {
      wire::encode(batch, region.bytes().first(40));
      FAIL("encode into 40 bytes did not throw");
    } catch (const wire::RegionTooSmall& e) {
      CHECK(e.needed() == need);
      CHECK(e.available() == 40);
      CHECK(std::string(e.what()) ==
            "wire: the batch needs " + std::to_string(need) + " bytes, the region has 40");
    }
    CHECK(message_of([&] { wire::encode(batch, std::span<std::byte>()); }) ==
          "wire: the batch needs " + std::to_string(need) + " bytes, the region has 0");
  }

  TEST_CASE("a bad magic, another version or a truncated message is refused") {
    const std::tuple<at::Tensor, std::int64_t> value{at::arange(10), 3};
    using Value = std::tuple<at::Tensor, std::int64_t>;

    Region bad_magic = encoded(value);
    bad_magic.bytes()[0] = std::byte{'X'};
    CHECK_THROWS_WITH_AS(wire::decode<Value>(bad_magic.bytes(), nullptr),
                         "wire: not a coload batch (bad magic)", wire::FormatError);

    Region newer = encoded(value);
    set_at(newer.bytes(), 4, std::uint32_t{7});
    CHECK_THROWS_WITH_AS(wire::decode<Value>(newer.bytes(), nullptr),
                         "wire: version 7 is not supported (this build reads version 1)",
                         wire::FormatError);

    Region whole = encoded(value);
    const std::size_t n = whole.bytes().size();
    const std::string truncated = "wire: truncated message: the header declares " +
                                  std::to_string(n - 16) + " payload bytes, the source holds " +
                                  std::to_string(n - 17);
    CHECK_THROWS_WITH_AS(wire::decode<Value>(whole.bytes().first(n - 1), nullptr),
                         truncated.c_str(), wire::FormatError);
    CHECK_THROWS_WITH_AS(wire::decode<Value>(whole.bytes().first(10), nullptr),
                         "wire: truncated message: 10 bytes, shorter than the 16-byte header",
                         wire::FormatError);

    // A header that lies about the payload: the reader stops at the declared end.
    Region lying = encoded(value);
    set_at(lying.bytes(), 8, std::uint64_t{n - 16 - 8});
    CHECK_THROWS_WITH_AS(wire::decode<Value>(lying.bytes(), nullptr),
                         doctest::Contains("goes past its end at byte"), wire::FormatError);

    // Bytes past the value that the header still declares.
    Region longer(n + 8);
    wire::encode(value, longer.bytes());
    set_at(longer.bytes(), 8, std::uint64_t{n + 8 - 16});
    const std::string trailing = "wire: the value ends at byte " + std::to_string(n) +
                                 " but the message has " + std::to_string(n + 8) +
                                 " bytes; was it written as another type?";
    CHECK_THROWS_WITH_AS(wire::decode<Value>(longer.bytes(), nullptr), trailing.c_str(),
                         wire::FormatError);

    // The region must be aligned as a slot is.
    Region shifted(n + 64);
    CHECK_THROWS_WITH_AS(wire::encode(value, shifted.bytes().subspan(8)),
                         doctest::Contains("must be aligned to 64 bytes"), wire::FormatError);
    std::memcpy(shifted.bytes().data() + 8, whole.bytes().data(), n);
    CHECK_THROWS_WITH_AS(wire::decode<Value>(shifted.bytes().subspan(8, n), nullptr),
                         doctest::Contains("must be aligned to 64 bytes"), wire::FormatError);
  }

  TEST_CASE("a vector's corrupt count reserves no more than the message's bytes") {
    // The reserve was bounded by the bytes left counted as elements: one 512 KiB element's
    // message reserved 512 Ki elements of 512 KiB (bad_alloc, not the FormatError).
    using Big = std::array<double, 65536>;
    std::vector<Big> one(1);
    one[0][65535] = 2.5;
    Region region = encoded(one);
    CHECK(wire::decode<std::vector<Big>>(region.bytes(), nullptr)[0][65535] == 2.5);
    set_at(region.bytes(), 17, std::numeric_limits<std::uint64_t>::max());  // after the tag
    CHECK_THROWS_WITH_AS(wire::decode<std::vector<Big>>(region.bytes(), nullptr),
                         doctest::Contains("goes past its end at byte"), wire::FormatError);
  }

  TEST_CASE("a value read as another type names the tag it found and where") {
    Region region = encoded(std::tuple<at::Tensor, std::int64_t>{at::ones({2}), 1});
    // Header (16 bytes), the tuple's tag (byte 16) and count (17..20), then the first element.
    CHECK_THROWS_WITH_AS((wire::decode<std::tuple<std::int64_t, at::Tensor>>(region.bytes(),
                                                                            nullptr)),
                         "wire: expected an int64, found tag 1 at byte 21 (a tensor)",
                         wire::FormatError);
    CHECK_THROWS_WITH_AS(
        (wire::decode<std::tuple<at::Tensor, std::int64_t, int>>(region.bytes(), nullptr)),
        "wire: expected a tuple of 3 elements, found 2 at byte 17", wire::FormatError);
    CHECK_THROWS_WITH_AS((wire::decode<std::pair<at::Tensor, std::int64_t>>(region.bytes(),
                                                                           nullptr)),
                         "wire: expected a pair, found tag 17 at byte 16 (a tuple)",
                         wire::FormatError);

    // Integers of another width are another type: no silent narrowing or widening.
    Region int32 = encoded(std::int32_t{5});
    CHECK_THROWS_WITH_AS(wire::decode<std::int64_t>(int32.bytes(), nullptr),
                         "wire: expected an int64, found tag 5 at byte 16 (an int32)",
                         wire::FormatError);
    Region arr = encoded(std::array<int, 3>{1, 2, 3});
    CHECK_THROWS_WITH_AS((wire::decode<std::array<int, 2>>(arr.bytes(), nullptr)),
                         "wire: expected an array of 2 elements, found 3 at byte 17",
                         wire::FormatError);
  }

  TEST_CASE("non-contiguous, 0-dim and zero-element tensors round-trip") {
    const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
    const at::Tensor transposed = base.t();
    REQUIRE_FALSE(transposed.is_contiguous());
    const at::Tensor t = round_trip(transposed);
    CHECK(same(t, transposed));
    CHECK(t.sizes() == at::IntArrayRef({4, 3}));
    CHECK(t[0][1].item<float>() == 4.0f);

    const at::Tensor sliced = at::arange(10, at::kLong).slice(0, 3, 7);  // a storage offset
    CHECK(same(round_trip(sliced), at::tensor(std::vector<std::int64_t>{3, 4, 5, 6})));
    const at::Tensor expanded = at::tensor(std::vector<double>{1.0, 2.0}).expand({3, 2});
    CHECK(same(round_trip(expanded), expanded.contiguous()));

    const at::Tensor scalar = at::scalar_tensor(3.5, at::kDouble);
    const at::Tensor s = round_trip(scalar);
    CHECK(s.dim() == 0);
    CHECK((s.scalar_type() == at::kDouble));
    CHECK(s.item<double>() == 3.5);

    const at::Tensor empty = at::empty({0, 3}, at::kFloat);
    const at::Tensor e = round_trip(empty);
    CHECK(e.sizes() == at::IntArrayRef({0, 3}));
    CHECK(e.numel() == 0);
    CHECK((e.scalar_type() == at::kFloat));

    // A negative view is written as its values.
    const at::Tensor negative = at::_neg_view(at::tensor(std::vector<float>{1, -2}));
    REQUIRE(negative.is_neg());
    CHECK(same(round_trip(negative), at::tensor(std::vector<float>{-1, 2})));
  }

  TEST_CASE("a user type opts in through a Wire specialisation") {
    const std::vector<Detections> in{
        {at::rand({2, 4}), {"cat", "dog"}, 7},
        {at::empty({0, 4}), {}, 8},
    };
    const std::vector<Detections> out = round_trip(in);
    REQUIRE(out.size() == 2);
    for (std::size_t i = 0; i < in.size(); ++i) {
      CHECK(same(out[i].boxes, in[i].boxes));
      CHECK(out[i].labels == in[i].labels);
      CHECK(out[i].image_id == in[i].image_id);
    }

    Region region = encoded(in[0]);
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(region.bytes(), nullptr),
                         "wire: expected a tensor, found tag 129 at byte 16 (a user type)",
                         wire::FormatError);
  }

  TEST_CASE("a tensor the format cannot carry is refused, saying why") {
    CHECK_THROWS_WITH_AS(wire::encoded_size(at::Tensor()),
                         doctest::Contains("wire: cannot write an undefined tensor"),
                         wire::FormatError);
    Region region(4096);
    CHECK_THROWS_WITH_AS(wire::encode(std::make_tuple(at::ones({2}), at::Tensor()), region.bytes()),
                         doctest::Contains("wire: cannot write an undefined tensor"),
                         wire::FormatError);
    CHECK_THROWS_WITH_AS(wire::encoded_size(at::empty({2}, at::Device(at::kMeta))),
                         "wire: cannot write a tensor on meta: only CPU tensors go through shared "
                         "memory",
                         wire::FormatError);
    CHECK_THROWS_WITH_AS(wire::encoded_size(at::eye(3).to_sparse()),
                         doctest::Contains("wire: cannot write a tensor of layout Sparse"),
                         wire::FormatError);
  }

  TEST_CASE("a tensor already in the region is written where it lies and read in place") {
    using Batch = std::tuple<at::Tensor, at::Tensor>;
    Region region(1 << 20);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor placed = placed_at(bytes, 0, 256 * 256).reshape({256, 256});
    const at::Tensor small = at::arange(10, at::kLong);
    const Batch batch{placed, small};
    const std::size_t at = round_up(placed.nbytes(), wire::tensor_alignment);

    // Header, tuple; the placed tensor's record only; the small one's record, padding and data.
    const std::size_t size = wire::encoded_size(batch, bytes);
    CHECK(size == 16 + 5 + 42 + 34 + 31 + 80);
    CHECK(size < placed.nbytes());
    CHECK(wire::encoded_size(batch) > placed.nbytes());  // no region: every tensor is copied
    REQUIRE(wire::encode(batch, bytes, at) == size);
    CHECK(std::memcmp(bytes.data() + at, wire::magic.data(), wire::magic.size()) == 0);

    const Batch out = wire::decode<Batch>(bytes, at, nullptr);
    const at::Tensor& images = std::get<0>(out);
    CHECK(images.data_ptr() == static_cast<void*>(bytes.data()));
    CHECK(images.sizes() == at::IntArrayRef({256, 256}));
    CHECK(same(images, at::arange(256 * 256, at::kFloat).reshape({256, 256})));
    set_at(bytes, 4, -7.5f);  // element [0][1], after encoding
    CHECK(images[0][1].item<float>() == -7.5f);

    // The small tensor is inline, in the message after `at`, aligned.
    const at::Tensor& inline_t = std::get<1>(out);
    CHECK(same(inline_t, small));
    CHECK(offset_in(bytes, inline_t) == at + 128);
    CHECK(offset_in(bytes, inline_t) + inline_t.nbytes() <= at + size);

    // Too small a region counts from `at` and not the tensor in place.
    const std::string expected = "wire: the batch needs " + std::to_string(size) +
                                 " bytes, the region has " + std::to_string(size - 1);
    CHECK_THROWS_WITH_AS(wire::encode(batch, bytes.first(at + size - 1), at), expected.c_str(),
                         wire::RegionTooSmall);
  }

  TEST_CASE("encoded_size with the region is exactly what encode writes at any offset") {
    Region region(1 << 20);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor placed = placed_at(bytes, 4096, 1000);
    using Value = std::tuple<at::Tensor, Nested, std::vector<at::Tensor>>;
    const Value value{placed, nested_batch(), {placed.reshape({10, 100}), at::ones({3})}};
    const std::size_t size = wire::encoded_size(value, bytes);
    CHECK(size + 2 * placed.nbytes() <= wire::encoded_size(value));
    for (const std::size_t at : {std::size_t{0}, std::size_t{8192}, std::size_t{65536}}) {
      CAPTURE(at);
      if (at == 0) {
        // The message ends before the tensor starts.
        REQUIRE(size <= 4096);
      }
      CHECK(wire::encode(value, bytes, at) == size);
      const Value out = wire::decode<Value>(bytes, at, nullptr);
      CHECK(offset_in(bytes, std::get<0>(out)) == 4096);
      CHECK(offset_in(bytes, std::get<2>(out)[0]) == 4096);
      CHECK(same(std::get<0>(out), at::arange(1000, at::kFloat)));
      CHECK(same(std::get<0>(std::get<1>(out)), std::get<0>(nested_batch())));
    }
  }

  TEST_CASE("a tensor in the region that cannot be pointed at is copied inline") {
    Region region(1 << 20);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor placed = placed_at(bytes, 0, 64 * 64).reshape({64, 64});
    const std::size_t at = 64 * 64 * 4;

    const auto check_inline = [&](const at::Tensor& t) {
      const std::size_t size = wire::encoded_size(t, bytes);
      CHECK(size > t.nbytes());
      REQUIRE(wire::encode(t, bytes, at) == size);
      const at::Tensor out = wire::decode<at::Tensor>(bytes, at, nullptr);
      CHECK(same(out, t));
      CHECK(offset_in(bytes, out) >= at);
    };
    check_inline(placed.t());                      // not contiguous
    check_inline(placed.flatten().slice(0, 1, 9));  // 4 bytes in: not at a multiple of 64
    check_inline(at::_neg_view(placed));            // its bytes are not its values
  }

  TEST_CASE("a tensor in the region that the message would overlap is refused") {
    Region region(1 << 20);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor placed = placed_at(bytes, 0, 256 * 256);
    const std::tuple<at::Tensor, at::Tensor> batch{placed, at::arange(10, at::kLong)};
    // The message at byte 64, over the tensor: found at its record, which ends at byte 64 + 55.
    CHECK_THROWS_WITH_AS(wire::encode(batch, bytes, 64),
                         "wire: a tensor in the region at byte 0 (+262144 bytes) overlaps the "
                         "message, which takes bytes [64, 119) of the region",
                         wire::FormatError);

    // A tensor after the message that the message then grows into.
    const at::Tensor ahead = placed_at(bytes, 128, 16);
    const std::tuple<at::Tensor, std::string> grows{ahead, std::string(500, 'x')};
    CHECK(wire::encoded_size(grows, bytes) == 16 + 5 + 34 + 9 + 500);
    CHECK_THROWS_WITH_AS(wire::encode(grows, bytes, 0),
                         "wire: a tensor in the region at byte 128 (+64 bytes) overlaps the "
                         "message, which takes bytes [0, 564) of the region",
                         wire::FormatError);
    CHECK(wire::encode(grows, bytes, 256) == 564);  // past it, fine

    // A tensor in the region that is copied must not lie under its own copy.
    const at::Tensor under = at::from_blob(bytes.data() + 64, {4, 32}, at::kFloat).t();
    CHECK_THROWS_WITH_AS(wire::encode(under, bytes, 0),
                         doctest::Contains("wire: a tensor in the region at byte 64 (+512 bytes) "
                                           "overlaps the message"),
                         wire::FormatError);
  }

  TEST_CASE("tensor data outside the region, misaligned or over the message is refused") {
    Region region(8192);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor ahead = placed_at(bytes, 4096, 1024);
    // Header, then the tensor's tag, dtype, dim, size, byte count, placement (byte 41), offset.
    REQUIRE(wire::encode(ahead, bytes) == 16 + 34);
    CHECK(same(wire::decode<at::Tensor>(bytes, nullptr), at::arange(1024, at::kFloat)));

    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes.first(4096 + 100), 0, nullptr),
                         "wire: tensor data at byte 4096 (+4096 bytes) lies outside the region of "
                         "4196 bytes",
                         wire::FormatError);
    set_at(bytes, 42, std::uint64_t{8192});
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         "wire: tensor data at byte 8192 (+4096 bytes) lies outside the region of "
                         "8192 bytes",
                         wire::FormatError);
    set_at(bytes, 42, std::numeric_limits<std::uint64_t>::max() - 63);
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         doctest::Contains("lies outside the region of 8192 bytes"),
                         wire::FormatError);
    set_at(bytes, 42, std::uint64_t{2052});
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         "wire: tensor data at byte 2052 of the region is not at a multiple of 64 "
                         "(the offset at byte 42)",
                         wire::FormatError);
    set_at(bytes, 42, std::uint64_t{0});
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         "wire: tensor data at byte 0 (+4096 bytes) overlaps the message, which "
                         "takes bytes [0, 50) of the region",
                         wire::FormatError);
    set_at(bytes, 41, std::uint8_t{2});
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         "wire: a tensor's placement must be 0 or 1, found 2 at byte 41",
                         wire::FormatError);

    // Inline data must be where the record says.
    REQUIRE(wire::encode(at::arange(4, at::kLong), bytes) == 64 + 32);
    set_at(bytes, 42, std::uint64_t{128});
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 0, nullptr),
                         "wire: a tensor's inline data is at byte 64 of the region, the message "
                         "says 128 at byte 42",
                         wire::FormatError);
  }

  TEST_CASE("a message starts at a multiple of 64 bytes inside its region") {
    Region region(4096);
    const std::span<std::byte> bytes = region.bytes();
    const at::Tensor t = at::arange(4, at::kLong);
    CHECK_THROWS_WITH_AS(wire::encode(t, bytes, 8),
                         "wire: a message must start at a multiple of 64 bytes into its region, "
                         "not at byte 8",
                         wire::FormatError);
    CHECK_THROWS_WITH_AS(wire::encode(t, bytes, 4096 + 64),
                         "wire: a message cannot start at byte 4160 of a region of 4096 bytes",
                         wire::FormatError);
    try {
      wire::encode(t, bytes, 4096);
      FAIL("encode at the region's end did not throw");
    } catch (const wire::RegionTooSmall& e) {
      CHECK(e.needed() == wire::encoded_size(t));
      CHECK(e.available() == 0);
    }

    REQUIRE(wire::encode(t, bytes, 1024) == 64 + 32);
    CHECK(same(wire::decode<at::Tensor>(bytes, 1024, nullptr), t));
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 1024 + 8, nullptr),
                         "wire: a message must start at a multiple of 64 bytes into its region, "
                         "not at byte 1032",
                         wire::FormatError);
    CHECK_THROWS_WITH_AS(wire::decode<at::Tensor>(bytes, 4096 + 64, nullptr),
                         doctest::Contains("cannot start at byte 4160"), wire::FormatError);
  }
}
