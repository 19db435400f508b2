#pragma once
// The wire format that process workers use to hand a collated batch to the parent through
// shared memory: the worker encodes the batch into a region, the parent decodes it into the same
// C++ type, with every tensor made over the bytes in the region (no copy on the reading side).
//
// The region is a whole shared-memory slot, aligned to tensor_alignment. The message starts at
// byte `at` of the region (a multiple of tensor_alignment; 0 when the region holds nothing else).
// A tensor's data is either inline, inside the message, or already in the region outside the
// message (a tensor a batch allocator made in the slot before encoding, written where it lies
// instead of being copied); either way its record holds the data's offset from the start of the
// REGION. A message is a 16-byte header followed by the payload, the batch as a tree of tagged
// values; offsets in the table are from the start of the message:
//
//     offset  size  field
//          0     4  magic: the bytes 'C' 'L' 'W' '1'
//          4     4  u32 version (this build writes and reads `wire::version`, 1)
//          8     8  u64 payload size: the bytes that follow the header
//         16     …  the payload: one value, written by Wire<T>::write
//
// Every value starts with a one-byte tag (namespace `wire::tag`) so the reader can check that it
// decodes the type that was written, and says where it does not. After the tag:
//
//     tag             what follows
//     tensor          u32 dtype (the c10::ScalarType value), u32 dim, dim × i64 sizes,
//                     u64 byte count, u8 placement, u64 data offset from the start of the
//                     region (a multiple of tensor_alignment), then by placement:
//                       0 (inline): zero bytes up to the next multiple of tensor_alignment, then
//                         the contiguous data, which the offset points at;
//                       1 (in the region): nothing; the contiguous data lies at the offset,
//                         inside the region and outside the message
//     boolean         u8 0 or 1
//     i8 … i64        the integer's bytes (1, 2, 4 or 8)
//     u8 … u64        the same, unsigned
//     f32, f64        the IEEE value's 4 or 8 bytes
//     long_double     sizeof(long double) bytes
//     string          u64 length, then the bytes (they may hold NULs)
//     tuple           u32 element count, then each element
//     pair            first, then second
//     vector          u64 element count, then each element
//     array           u64 element count, then each element
//     optional        u8 0 (empty) or 1, then the value when 1
//     dict            u64 entry count, then for each entry its key (u64 length, bytes: a string
//                     without its tag) and its value; std::map and std::unordered_map both
//                     write a dict, so either type can read it
//     worker_task     a process worker's task and its reply: not batches but the messages
//     worker_reply    on the socket between a worker and its parent (coload/exec; their
//                     fields are listed in lib/exec/messages.hpp)
//     user … 0xff     free for user types' Wire specialisations
//
// NOTE: numbers are in the machine's own byte order and long double in its own layout: the format
// passes batches between processes of one host (a worker and its parent), never between machines.
// A big-endian reader would see a wrong version number and refuse the message.
//
// Adding a tag keeps the version; changing what follows an existing tag, or the header, must bump
// `wire::version`, and a reader refuses every version but its own.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"

namespace coload::wire {

/// The format version this build writes, and the only one it reads.
inline constexpr std::uint32_t version = 1;

/// Tensor data starts at an offset from the start of the region that is a multiple of this, so
/// tensors read from an aligned region are aligned for every dtype (and for SIMD loads). Regions
/// start at such an address, and messages at such an offset into their region.
inline constexpr std::size_t tensor_alignment = 64;

/// The first four bytes of every message.
inline constexpr std::array<char, 4> magic = {'C', 'L', 'W', '1'};

/// Bytes in the header: magic, u32 version, u64 payload size.
inline constexpr std::size_t header_size = 16;

/// The type tags: the first byte of every value. Their numbers are part of the format.
namespace tag {
inline constexpr std::uint8_t tensor = 0x01;       ///< at::Tensor
inline constexpr std::uint8_t boolean = 0x02;      ///< bool
inline constexpr std::uint8_t i8 = 0x03;           ///< a signed 1-byte integer (signed char, int8_t)
inline constexpr std::uint8_t i16 = 0x04;          ///< a signed 2-byte integer
inline constexpr std::uint8_t i32 = 0x05;          ///< a signed 4-byte integer
inline constexpr std::uint8_t i64 = 0x06;          ///< a signed 8-byte integer
inline constexpr std::uint8_t u8 = 0x07;           ///< an unsigned 1-byte integer (char8_t, uint8_t)
inline constexpr std::uint8_t u16 = 0x08;          ///< an unsigned 2-byte integer
inline constexpr std::uint8_t u32 = 0x09;          ///< an unsigned 4-byte integer
inline constexpr std::uint8_t u64 = 0x0a;          ///< an unsigned 8-byte integer
inline constexpr std::uint8_t f32 = 0x0b;          ///< float
inline constexpr std::uint8_t f64 = 0x0c;          ///< double
inline constexpr std::uint8_t long_double = 0x0d;  ///< long double, in this machine's layout
inline constexpr std::uint8_t string = 0x10;       ///< std::string
inline constexpr std::uint8_t tuple = 0x11;        ///< std::tuple
inline constexpr std::uint8_t pair = 0x12;         ///< std::pair
inline constexpr std::uint8_t vector = 0x13;       ///< std::vector
inline constexpr std::uint8_t array = 0x14;        ///< std::array
inline constexpr std::uint8_t optional = 0x15;     ///< std::optional
inline constexpr std::uint8_t dict = 0x16;         ///< std::map / std::unordered_map, string keys
inline constexpr std::uint8_t worker_task = 0x20;  ///< a process worker's task (coload/exec)
inline constexpr std::uint8_t worker_reply = 0x21; ///< a process worker's reply (coload/exec)
/// Tags from here to 0xff are left to user types; coload never uses them.
inline constexpr std::uint8_t user = 0x80;
}  // namespace tag

/// What a tag stands for ("a tensor", "an int64", "a user type", "an unknown tag"), for messages.
const char* tag_name(std::uint8_t tag) noexcept;

/// A message that cannot be written or read: a bad header, a type mismatch, a truncated message,
/// a tensor the format cannot carry. The message says what and at which byte.
class FormatError : public std::runtime_error, public Error {
 public:
  using runtime_error::runtime_error;
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// The destination is too small for the batch. `needed()` is exact when thrown by encode() (the
/// caller can take a larger region and try again); from a Writer alone it is the lower bound known
/// when the write failed.
class RegionTooSmall : public FormatError {
 public:
  RegionTooSmall(std::size_t needed, std::size_t available, bool exact);
  std::size_t needed() const noexcept { return needed_; }
  std::size_t available() const noexcept { return available_; }

 private:
  std::size_t needed_;
  std::size_t available_;
};

/// Writes values into a message at byte `at` of a region, or, made by measure(), only counts the
/// bytes they take, so that the region can be sized exactly before writing.
///
/// A tensor whose data already lies in the region (see Writer::tensor) is recorded by its offset
/// instead of being copied. The message must not run over such a tensor: a Writer remembers the
/// nearest one after the message and throws FormatError rather than write into it.
class Writer {
 public:
  /// The simple case: writes a message at the start of `dest`, as Writer(dest, 0); an empty span
  /// measures instead, as measure() with no region.
  explicit Writer(std::span<std::byte> dest = {});
  /// Writes a message starting at `region.data() + at`; tensors that lie in `region` are written
  /// where they are. `region` must be aligned to tensor_alignment and `at` a multiple of it, at
  /// most region.size() (FormatError otherwise). The message may take region.size() - at bytes.
  Writer(std::span<std::byte> region, std::size_t at);
  /// A Writer that writes nothing and counts the bytes a message takes, counting no data for the
  /// tensors that Writer(region, at) would find in `region` (none when it is empty).
  static Writer measure(std::span<const std::byte> region = {});

  bool measuring() const noexcept { return measuring_; }
  /// Bytes of the message written (or, measuring, that would be written) so far.
  std::size_t size() const noexcept { return offset_; }
  /// Where the message starts: its offset from the start of the region (0 when measuring).
  std::size_t start() const noexcept { return start_; }

  void u8(std::uint8_t v) { put(&v, sizeof v); }
  void u32(std::uint32_t v) { put(&v, sizeof v); }
  void u64(std::uint64_t v) { put(&v, sizeof v); }
  void i64(std::int64_t v) { put(&v, sizeof v); }
  void f64(double v) { put(&v, sizeof v); }
  /// Raw bytes, without a length: the reader must know how many to take.
  void bytes(std::span<const std::byte> data) { put(data.data(), data.size()); }
  /// A u64 length, then the bytes (no tag: Wire<std::string> writes that).
  void string(std::string_view s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  /// A type tag (namespace `tag`).
  void tag(std::uint8_t t) { u8(t); }
  /// The tag, dtype, dim, sizes, byte count, placement and data offset (see the format above).
  ///
  /// A tensor already in the region (contiguous, not a conjugate or negative view, at least one
  /// byte, all of them inside the region, at an offset that is a multiple of tensor_alignment) is
  /// recorded where it lies and not copied. Its bytes must not overlap the message: a FormatError
  /// says so, and the message written before it was found may already have overwritten some of
  /// them. Every other tensor is copied inline: zero padding up to tensor_alignment, then its
  /// bytes in contiguous order (one memcpy; measuring copies nothing); conjugate and negative
  /// views are written as their values. A tensor inside the region that is copied must not
  /// overlap the message up to the end of its copy (FormatError), as its bytes would be
  /// overwritten before or while they are read.
  ///
  /// Only defined, strided, non-quantized CPU tensors can be written: anything else is a
  /// FormatError that says why.
  void tensor(const at::Tensor& t);

 private:
  struct Measuring {};
  Writer(Measuring, std::span<const std::byte> region);

  void put(const void* data, std::size_t n) {
    if (!measuring_ && n != 0) {
      if (n > limit_ - offset_) overflow(n);
      std::memcpy(data_ + offset_, data, n);
    }
    offset_ += n;
  }
  /// Zero bytes up to the next multiple of tensor_alignment.
  void pad_to_alignment();
  /// Whether `t`, of `nbytes` bytes, is written where it lies in the region rather than copied.
  bool in_region(const at::Tensor& t, std::size_t nbytes) const;
  /// Throws FormatError if the bytes of `t` overlap the message's first `message_end` bytes;
  /// when `keep` and they lie after them, the message may not grow into them later.
  void guard(const at::Tensor& t, std::size_t message_end, bool keep);
  /// `n` bytes do not fit: RegionTooSmall, or FormatError when a tensor in place is in the way.
  [[noreturn]] void overflow(std::size_t n) const;

  const std::byte* region_ = nullptr;  ///< the region, for finding tensors in it
  std::size_t region_size_ = 0;
  std::byte* data_ = nullptr;          ///< where the message starts (null when measuring)
  std::size_t start_ = 0;              ///< its offset in the region
  std::size_t capacity_ = 0;           ///< bytes from the message start to the region's end
  std::size_t limit_ = 0;              ///< bytes the message may take: capacity_, or less where
                                       ///< a tensor written in place lies after the message
  std::size_t blocker_at_ = 0;         ///< that tensor's offset and bytes, for the error
  std::size_t blocker_bytes_ = 0;
  std::size_t offset_ = 0;
  bool measuring_ = true;
};

/// Reads values back from a message, in the order they were written. Tensors alias the region.
class Reader {
 public:
  /// The simple case: the message is the whole of `src`, which is also the region, as
  /// Reader(src, 0, src.size(), owner).
  Reader(std::span<const std::byte> src, std::shared_ptr<void> owner);
  /// The message is the `size` bytes at byte `at` of `region`; tensor data offsets are counted
  /// from the start of `region` and must lie inside it. `region` must be aligned to
  /// tensor_alignment, `at` a multiple of it, and the message inside the region (FormatError
  /// otherwise). `owner` is copied into the deleter of every tensor this reader makes, so
  /// whatever it owns (the shared-memory slot) lives as long as the last of them; it may be null
  /// when the caller keeps the region alive by other means.
  Reader(std::span<const std::byte> region, std::size_t at, std::size_t size,
         std::shared_ptr<void> owner);

  /// Bytes read so far, which is the offset of the next byte from the start of the message.
  std::size_t offset() const noexcept { return offset_; }
  /// Bytes of the message left to read.
  std::size_t remaining() const noexcept { return message_.size() - offset_; }
  /// Where the message starts: its offset from the start of the region.
  std::size_t start() const noexcept { return start_; }

  std::uint8_t u8() { return take<std::uint8_t>(); }
  std::uint32_t u32() { return take<std::uint32_t>(); }
  std::uint64_t u64() { return take<std::uint64_t>(); }
  std::int64_t i64() { return take<std::int64_t>(); }
  double f64() { return take<double>(); }
  /// The next `n` bytes, as a view into the source.
  std::span<const std::byte> bytes(std::size_t n) { return {advance(n), n}; }
  /// A u64 length and that many bytes, as Writer::string wrote them.
  std::string string();
  /// A tensor as Writer::tensor wrote it: a CPU tensor of the written dtype and shape, made by
  /// at::from_blob over its bytes in the region, inline or not (no copy). It ALIASES the region:
  /// writing to it writes into the region, and the region must not be reused while it lives; its
  /// deleter holds a copy of the owner, which is how the region's owner knows when that is. Data
  /// outside the region, at an offset that is not a multiple of tensor_alignment, overlapping the
  /// message (when not inline) or not where the inline data is is a FormatError.
  at::Tensor tensor();
  /// Reads a tag and checks it is `expected`, else FormatError
  /// "wire: expected <what>, found tag N at byte K (<what N is>)".
  void expect_tag(std::uint8_t expected, const char* what);

 private:
  template <class T>
  T take() {
    T v;
    std::memcpy(&v, advance(sizeof v), sizeof v);
    return v;
  }
  const std::byte* advance(std::size_t n) {
    if (n > message_.size() - offset_) past_end(n);
    const std::byte* p = message_.data() + offset_;
    offset_ += n;
    return p;
  }
  [[noreturn]] void past_end(std::size_t n) const;

  std::span<const std::byte> region_;
  std::span<const std::byte> message_;
  std::size_t start_ = 0;
  std::shared_ptr<void> owner_;
  std::size_t offset_ = 0;
};

/// How a value of T is written to and read from the wire. Specialise it for your own batch types,
/// writing a tag of your own (from tag::user up) and then the members through their Wire:
///
///     template <> struct coload::wire::Wire<MyBatch> {
///       static void write(Writer& w, const MyBatch& b) {
///         w.tag(tag::user);
///         Wire<at::Tensor>::write(w, b.images);
///         Wire<std::vector<std::string>>::write(w, b.paths);
///       }
///       static MyBatch read(Reader& r) {
///         r.expect_tag(tag::user, "a MyBatch");
///         auto images = Wire<at::Tensor>::read(r);
///         auto paths = Wire<std::vector<std::string>>::read(r);
///         return {std::move(images), std::move(paths)};
///       }
///     };
///
/// The primary template is left undefined: a type without a specialisation cannot go on the wire.
template <class T>
struct Wire;

/// A type that can be written to the wire and read back as itself.
template <class T>
concept Wireable = requires(Writer& w, Reader& r, const T& v) {
  Wire<T>::write(w, v);
  { Wire<T>::read(r) } -> std::same_as<T>;
};

namespace detail {
/// The tag for an arithmetic type: its kind and width, so that e.g. int and int32_t share one.
template <class T>
constexpr std::uint8_t arithmetic_tag() {
  if constexpr (std::is_same_v<T, bool>) {
    return tag::boolean;
  } else if constexpr (std::is_integral_v<T>) {
    constexpr bool is_signed = std::is_signed_v<T>;
    if constexpr (sizeof(T) == 1) return is_signed ? tag::i8 : tag::u8;
    else if constexpr (sizeof(T) == 2) return is_signed ? tag::i16 : tag::u16;
    else if constexpr (sizeof(T) == 4) return is_signed ? tag::i32 : tag::u32;
    else if constexpr (sizeof(T) == 8) return is_signed ? tag::i64 : tag::u64;
    else static_assert(sizeof(T) == 0, "wire: no tag for an integer of this width");
  } else if constexpr (std::is_same_v<T, float>) {
    return tag::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return tag::f64;
  } else {
    return tag::long_double;
  }
}

/// Writes a header declaring `payload` bytes.
void write_header(Writer& w, std::uint64_t payload);
/// Stores the payload size of a message of `message_size` bytes into the header at `dest`.
void finish_header(std::span<std::byte> dest, std::size_t message_size);
/// Checks the alignment of `region` and `at`, then the magic, the version and the declared size of
/// the message at byte `at` against the bytes the region has from there; returns the message's
/// size (header and payload).
std::size_t check_header(std::span<const std::byte> region, std::size_t at);
[[noreturn]] void throw_count_mismatch(const char* what, std::uint64_t expected,
                                       std::uint64_t found, std::size_t at);
[[noreturn]] void throw_bad_flag(const char* what, std::uint8_t found, std::size_t at);
[[noreturn]] void throw_trailing(std::size_t read, std::size_t message_size);
}  // namespace detail

/// Tensors: see Writer::tensor and Reader::tensor.
template <>
struct Wire<at::Tensor> {
  static void write(Writer& w, const at::Tensor& t) { w.tensor(t); }
  static at::Tensor read(Reader& r) { return r.tensor(); }
};

/// Numbers: their exact bytes, so every value (NaN payloads included) comes back unchanged.
template <class T>
  requires std::is_arithmetic_v<T>
struct Wire<T> {
  static constexpr std::uint8_t tag_value = detail::arithmetic_tag<T>();

  static void write(Writer& w, T v) {
    w.tag(tag_value);
    if constexpr (std::is_same_v<T, bool>) {
      w.u8(v ? 1 : 0);
    } else {
      w.bytes(std::as_bytes(std::span<const T, 1>(&v, 1)));
    }
  }
  static T read(Reader& r) {
    r.expect_tag(tag_value, tag_name(tag_value));
    if constexpr (std::is_same_v<T, bool>) {
      const std::size_t at = r.offset();
      const std::uint8_t b = r.u8();
      if (b > 1) detail::throw_bad_flag("a bool", b, at);
      return b == 1;
    } else {
      T v;
      std::memcpy(&v, r.bytes(sizeof v).data(), sizeof v);
      return v;
    }
  }
};

/// Strings: a u64 length and the bytes.
template <>
struct Wire<std::string> {
  static void write(Writer& w, const std::string& s) {
    w.tag(tag::string);
    w.string(s);
  }
  static std::string read(Reader& r) {
    r.expect_tag(tag::string, "a string");
    return r.string();
  }
};

/// Tuples: the element count, then each element in order.
template <Wireable... Ts>
struct Wire<std::tuple<Ts...>> {
  static void write(Writer& w, const std::tuple<Ts...>& t) {
    w.tag(tag::tuple);
    w.u32(static_cast<std::uint32_t>(sizeof...(Ts)));
    std::apply([&w](const Ts&... e) { (Wire<Ts>::write(w, e), ...); }, t);
  }
  static std::tuple<Ts...> read(Reader& r) {
    r.expect_tag(tag::tuple, "a tuple");
    const std::size_t at = r.offset();
    const std::uint32_t n = r.u32();
    if (n != sizeof...(Ts)) detail::throw_count_mismatch("a tuple", sizeof...(Ts), n, at);
    // NOTE: a braced list is evaluated left to right, so the elements are read in order.
    return std::tuple<Ts...>{Wire<Ts>::read(r)...};
  }
};

/// Pairs: first, then second.
template <Wireable A, Wireable B>
struct Wire<std::pair<A, B>> {
  static void write(Writer& w, const std::pair<A, B>& p) {
    w.tag(tag::pair);
    Wire<A>::write(w, p.first);
    Wire<B>::write(w, p.second);
  }
  static std::pair<A, B> read(Reader& r) {
    r.expect_tag(tag::pair, "a pair");
    A first = Wire<A>::read(r);
    B second = Wire<B>::read(r);
    return {std::move(first), std::move(second)};
  }
};

/// Vectors: the element count, then each element.
template <Wireable T>
struct Wire<std::vector<T>> {
  static void write(Writer& w, const std::vector<T>& v) {
    w.tag(tag::vector);
    w.u64(v.size());
    for (const auto& e : v) Wire<T>::write(w, e);
  }
  static std::vector<T> read(Reader& r) {
    r.expect_tag(tag::vector, "a vector");
    const std::uint64_t n = r.u64();
    std::vector<T> v;
    // NOTE: every element takes at least its tag byte, and the reserve at most the message's
    // bytes (not its bytes' worth of elements, sizeof(T) each): a corrupt count cannot
    // reserve more than the message could hold; a count larger than that fails on reading
    // past the end.
    v.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, r.remaining() / sizeof(T))));
    for (std::uint64_t i = 0; i < n; ++i) v.push_back(Wire<T>::read(r));
    return v;
  }
};

/// Arrays: the element count (checked against N), then each element.
template <Wireable T, std::size_t N>
struct Wire<std::array<T, N>> {
  static void write(Writer& w, const std::array<T, N>& a) {
    w.tag(tag::array);
    w.u64(N);
    for (const auto& e : a) Wire<T>::write(w, e);
  }
  static std::array<T, N> read(Reader& r) {
    r.expect_tag(tag::array, "an array");
    const std::size_t at = r.offset();
    const std::uint64_t n = r.u64();
    if (n != N) detail::throw_count_mismatch("an array", N, n, at);
    // NOTE: a loop where T has a default value: an index pack of N reads takes the compiler
    // minutes past a few thousand elements (std::array<double, 65536> took over ten).
    if constexpr (std::is_default_constructible_v<T>) {
      std::array<T, N> a{};
      for (auto& e : a) e = Wire<T>::read(r);
      return a;
    } else {
      return [&r]<std::size_t... I>(std::index_sequence<I...>) {
        return std::array<T, N>{((void)I, Wire<T>::read(r))...};
      }(std::make_index_sequence<N>{});
    }
  }
};

/// Optionals: u8 0 when empty; 1 and the value when not.
template <Wireable T>
struct Wire<std::optional<T>> {
  static void write(Writer& w, const std::optional<T>& o) {
    w.tag(tag::optional);
    w.u8(o ? 1 : 0);
    if (o) Wire<T>::write(w, *o);
  }
  static std::optional<T> read(Reader& r) {
    r.expect_tag(tag::optional, "an optional");
    const std::size_t at = r.offset();
    const std::uint8_t has = r.u8();
    if (has > 1) detail::throw_bad_flag("an optional's flag", has, at);
    if (has == 0) return std::nullopt;
    return Wire<T>::read(r);
  }
};

namespace detail {
template <class Map>
void write_dict(Writer& w, const Map& m) {
  w.tag(tag::dict);
  w.u64(m.size());
  for (const auto& [key, value] : m) {
    w.string(key);
    Wire<typename Map::mapped_type>::write(w, value);
  }
}

template <class Map>
Map read_dict(Reader& r) {
  r.expect_tag(tag::dict, "a string-keyed map");
  const std::uint64_t n = r.u64();
  Map m;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string key = r.string();
    auto value = Wire<typename Map::mapped_type>::read(r);
    m.insert_or_assign(std::move(key), std::move(value));
  }
  return m;
}
}  // namespace detail

/// String-keyed maps: the entry count, then each key and value (in the map's order).
template <Wireable T>
struct Wire<std::map<std::string, T>> {
  static void write(Writer& w, const std::map<std::string, T>& m) { detail::write_dict(w, m); }
  static std::map<std::string, T> read(Reader& r) {
    return detail::read_dict<std::map<std::string, T>>(r);
  }
};

/// String-keyed hash maps: as std::map (the same tag: either type reads the other).
template <Wireable T>
struct Wire<std::unordered_map<std::string, T>> {
  static void write(Writer& w, const std::unordered_map<std::string, T>& m) {
    detail::write_dict(w, m);
  }
  static std::unordered_map<std::string, T> read(Reader& r) {
    return detail::read_dict<std::unordered_map<std::string, T>>(r);
  }
};

/// The exact number of bytes encode(value, region, at) writes for `value` (header included), for
/// every `at` where it succeeds: tensors that lie in `region` as Writer::tensor describes count
/// their record and no data. Walks the value without copying any tensor data.
template <Wireable T>
std::size_t encoded_size(const T& value, std::span<const std::byte> region) {
  Writer w = Writer::measure(region);
  detail::write_header(w, 0);
  Wire<T>::write(w, value);
  return w.size();
}

/// The exact number of bytes encode(value, dest) writes for `value` when no tensor lies in `dest`:
/// every tensor's data counted.
template <Wireable T>
std::size_t encoded_size(const T& value) {
  return encoded_size(value, std::span<const std::byte>());
}

/// Writes `value` as a whole message at byte `at` of `region` and returns the bytes written from
/// there. `region` must be aligned to tensor_alignment and `at` a multiple of it, at most
/// region.size() (FormatError otherwise). Tensors whose bytes already lie in the region outside
/// the message are recorded by their offset, not copied (see Writer::tensor; one that overlaps the
/// message is a FormatError). A message that does not fit in the region.size() - at bytes from
/// `at` is a RegionTooSmall naming the exact size needed:
/// "wire: the batch needs N bytes, the region has M" (M = region.size() - at).
template <Wireable T>
std::size_t encode(const T& value, std::span<std::byte> region, std::size_t at) {
  Writer w(region, at);
  try {
    detail::write_header(w, 0);
    Wire<T>::write(w, value);
  } catch (const RegionTooSmall&) {
    // NOTE: the Writer knows only how far it got; measuring again (only on this failure path)
    // gives the caller the exact size to ask for, without a measuring pass on every encode.
    throw RegionTooSmall(encoded_size(value, region), region.size() - at, true);
  }
  detail::finish_header(region.subspan(at), w.size());
  return w.size();
}

/// encode(value, dest, 0): the message at the start of `dest` (aligned to tensor_alignment).
template <Wireable T>
std::size_t encode(const T& value, std::span<std::byte> dest) {
  return encode(value, dest, 0);
}

/// Reads the message that encode() wrote at byte `at` of `region` back as a T. Tensors are made
/// over their bytes in `region` (no copy), inline in the message or where they lay when encoded,
/// and keep a copy of `owner` in their deleter, so `owner` is released only when the last of
/// them, and every other copy of it, is gone. Throws FormatError for a misaligned region or
/// `at`, a bad magic, another version, a message longer than the region has from `at`, a tag
/// that does not match T, bytes of the message left unread, or tensor data outside the region:
/// "wire: tensor data at byte X (+N bytes) lies outside the region of M bytes". Byte positions
/// in messages about the message itself count from its start; tensor data offsets from the
/// region's.
template <Wireable T>
T decode(std::span<const std::byte> region, std::size_t at, std::shared_ptr<void> owner) {
  const std::size_t message_size = detail::check_header(region, at);
  Reader r(region, at, message_size, std::move(owner));
  r.bytes(header_size);
  T value = Wire<T>::read(r);
  if (r.remaining() != 0) detail::throw_trailing(r.offset(), message_size);
  return value;
}

/// decode(src, 0, owner): the message at the start of `src`, which is the whole region.
template <Wireable T>
T decode(std::span<const std::byte> src, std::shared_ptr<void> owner) {
  return decode<T>(src, 0, std::move(owner));
}

}  // namespace coload::wire
