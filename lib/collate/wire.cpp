// The wire format's compiled parts: the writer, the reader, tensors, and the errors they raise.

#include "coload/collate/wire.hpp"

#include <ATen/ATen.h>

#include <cstring>
#include <sstream>
#include <string>
#include <utility>

namespace coload::wire {

namespace {
std::string str(std::size_t v) { return std::to_string(v); }

std::size_t padding_at(std::size_t offset) {
  return (tensor_alignment - offset % tensor_alignment) % tensor_alignment;
}

void check_aligned(const void* p, const char* which) {
  if (reinterpret_cast<std::uintptr_t>(p) % tensor_alignment != 0) {
    std::ostringstream os;
    os << "wire: the " << which << " region must be aligned to " << tensor_alignment
       << " bytes (it starts at " << p << ")";
    throw FormatError(os.str());
  }
}

/// Checks that a message can start at byte `at` of a region of `size` bytes.
void check_start(std::size_t at, std::size_t size) {
  if (at % tensor_alignment != 0) {
    throw FormatError("wire: a message must start at a multiple of " + str(tensor_alignment) +
                      " bytes into its region, not at byte " + str(at));
  }
  if (at > size) {
    throw FormatError("wire: a message cannot start at byte " + str(at) + " of a region of " +
                      str(size) + " bytes");
  }
}

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// The bytes that the elements of `t` (numel > 0) take in memory, [first, last), whatever its
/// strides: a view may reach before its data pointer.
std::pair<std::uintptr_t, std::uintptr_t> extent(const at::Tensor& t) {
  std::int64_t low = 0;
  std::int64_t high = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    const std::int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? low : high) += reach;
  }
  const auto element = static_cast<std::int64_t>(t.element_size());
  const std::uintptr_t p = address(t.data_ptr());
  return {p + static_cast<std::uintptr_t>(low * element),
          p + static_cast<std::uintptr_t>((high + 1) * element)};
}

/// Where `p` is, in bytes from `base`, for messages: negative before it.
std::string position(std::uintptr_t p, std::uintptr_t base) {
  return p >= base ? str(p - base) : "-" + str(base - p);
}

[[noreturn]] void throw_overlap(const std::string& data_at, std::size_t nbytes, std::size_t start,
                                std::size_t end) {
  throw FormatError("wire: a tensor in the region at byte " + data_at + " (+" + str(nbytes) +
                    " bytes) overlaps the message, which takes bytes [" + str(start) + ", " +
                    str(end) + ") of the region");
}
}  // namespace

const char* tag_name(std::uint8_t t) noexcept {
  switch (t) {
    case tag::tensor: return "a tensor";
    case tag::boolean: return "a bool";
    case tag::i8: return "an int8";
    case tag::i16: return "an int16";
    case tag::i32: return "an int32";
    case tag::i64: return "an int64";
    case tag::u8: return "a uint8";
    case tag::u16: return "a uint16";
    case tag::u32: return "a uint32";
    case tag::u64: return "a uint64";
    case tag::f32: return "a float";
    case tag::f64: return "a double";
    case tag::long_double: return "a long double";
    case tag::string: return "a string";
    case tag::tuple: return "a tuple";
    case tag::pair: return "a pair";
    case tag::vector: return "a vector";
    case tag::array: return "an array";
    case tag::optional: return "an optional";
    case tag::dict: return "a string-keyed map";
    case tag::worker_task: return "a worker task";
    case tag::worker_reply: return "a worker reply";
    default: return t >= tag::user ? "a user type" : "an unknown tag";
  }
}

RegionTooSmall::RegionTooSmall(std::size_t needed, std::size_t available, bool exact)
    : FormatError("wire: the batch needs " + std::string(exact ? "" : "at least ") + str(needed) +
                  " bytes, the region has " + str(available)),
      needed_(needed),
      available_(available) {}

// --- Writer ----------------------------------------------------------------------------------

Writer::Writer(std::span<std::byte> dest) : Writer(Measuring{}, {}) {
  if (!dest.empty()) *this = Writer(dest, 0);
}

Writer::Writer(std::span<std::byte> region, std::size_t at)
    : region_(region.data()),
      region_size_(region.size()),
      start_(at),
      measuring_(false) {
  check_aligned(region.data(), "destination");
  check_start(at, region.size());
  data_ = region.data() + at;
  capacity_ = region.size() - at;
  limit_ = capacity_;
}

Writer::Writer(Measuring, std::span<const std::byte> region)
    : region_(region.data()), region_size_(region.size()) {}

Writer Writer::measure(std::span<const std::byte> region) { return Writer(Measuring{}, region); }

void Writer::overflow(std::size_t n) const {
  if (limit_ < capacity_) {
    throw_overlap(str(blocker_at_), blocker_bytes_, start_, start_ + offset_ + n);
  }
  throw RegionTooSmall(offset_ + n, capacity_, false);
}

void Writer::pad_to_alignment() {
  const std::size_t pad = padding_at(offset_);
  if (!measuring_ && pad != 0) {
    if (pad > limit_ - offset_) overflow(pad);
    std::memset(data_ + offset_, 0, pad);
  }
  offset_ += pad;
}

bool Writer::in_region(const at::Tensor& t, std::size_t nbytes) const {
  if (region_size_ == 0 || nbytes == 0 || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
    return false;
  }
  const std::uintptr_t p = address(t.data_ptr());
  const std::uintptr_t base = address(region_);
  if (p < base || p - base > region_size_) return false;
  const std::size_t at = p - base;
  return nbytes <= region_size_ - at && at % tensor_alignment == 0;
}

void Writer::guard(const at::Tensor& t, std::size_t message_end, bool keep) {
  if (t.numel() == 0) return;
  const auto [first, last] = extent(t);
  const std::uintptr_t begin = address(data_);
  const std::uintptr_t end = begin + message_end;
  if (first < end && last > begin) {
    throw_overlap(position(first, address(region_)),
                  static_cast<std::size_t>(last - first), start_, start_ + message_end);
  }
  if (keep && first >= end && first - begin < limit_) {
    limit_ = static_cast<std::size_t>(first - begin);
    blocker_at_ = static_cast<std::size_t>(first - address(region_));
    blocker_bytes_ = static_cast<std::size_t>(last - first);
  }
}

void Writer::tensor(const at::Tensor& t) {
  if (!t.defined()) {
    throw FormatError(
        "wire: cannot write an undefined tensor (a default-constructed at::Tensor); "
        "use std::optional<at::Tensor> for a tensor that may be absent");
  }
  if (!t.device().is_cpu()) {
    throw FormatError("wire: cannot write a tensor on " + t.device().str() +
                      ": only CPU tensors go through shared memory");
  }
  if (t.layout() != at::kStrided) {
    std::ostringstream layout;
    layout << t.layout();
    throw FormatError("wire: cannot write a tensor of layout " + layout.str() +
                      ": only strided (dense) tensors have bytes to copy");
  }
  if (t.is_quantized()) {
    throw FormatError("wire: cannot write a quantized tensor (" +
                      std::string(c10::toString(t.scalar_type())) +
                      "): its scale and zero point have no place in the format");
  }
  const std::size_t nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  const bool placed = in_region(t, nbytes);
  // tag, dtype, dim, sizes, byte count, placement, data offset
  const std::size_t record_end = offset_ + 1 + 4 + 4 + 8 * static_cast<std::size_t>(t.dim()) +
                                 8 + 1 + 8;
  const std::size_t inline_at = record_end + padding_at(record_end);
  const std::size_t data_offset =
      placed ? static_cast<std::size_t>(address(t.data_ptr()) - address(region_))
             : start_ + inline_at;
  // NOTE: checked before anything of the tensor is written: a tensor in the region must not lie
  // under the message, nor, copied, under its own copy.
  if (!measuring_ && region_size_ != 0) guard(t, placed ? record_end : inline_at + nbytes, placed);

  tag(tag::tensor);
  u32(static_cast<std::uint32_t>(t.scalar_type()));
  u32(static_cast<std::uint32_t>(t.dim()));
  for (const std::int64_t s : t.sizes()) i64(s);
  u64(nbytes);
  u8(placed ? 1 : 0);
  u64(data_offset);
  if (placed) return;
  pad_to_alignment();
  if (measuring_ || nbytes == 0) {
    offset_ += nbytes;
    return;
  }
  // NOTE: checked before contiguous(), which would copy a non-contiguous tensor for nothing.
  if (nbytes > limit_ - offset_) overflow(nbytes);
  // Conjugate and negative views keep the bytes of their base: write their values instead.
  const at::Tensor src = t.resolve_conj().resolve_neg().contiguous();
  std::memcpy(data_ + offset_, src.data_ptr(), nbytes);
  offset_ += nbytes;
}

// --- Reader ----------------------------------------------------------------------------------

Reader::Reader(std::span<const std::byte> src, std::shared_ptr<void> owner)
    : Reader(src, 0, src.size(), std::move(owner)) {}

Reader::Reader(std::span<const std::byte> region, std::size_t at, std::size_t size,
               std::shared_ptr<void> owner)
    : region_(region), start_(at), owner_(std::move(owner)) {
  if (!region.empty()) check_aligned(region.data(), "source");
  check_start(at, region.size());
  if (size > region.size() - at) {
    throw FormatError("wire: a message of " + str(size) + " bytes at byte " + str(at) +
                      " does not fit in a region of " + str(region.size()) + " bytes");
  }
  message_ = region.subspan(at, size);
}

void Reader::past_end(std::size_t n) const {
  throw FormatError("wire: truncated message: reading " + str(n) + " bytes at byte " +
                    str(offset_) + " goes past its end at byte " + str(message_.size()));
}

void Reader::expect_tag(std::uint8_t expected, const char* what) {
  const std::size_t at = offset_;
  const std::uint8_t found = u8();
  if (found != expected) {
    throw FormatError("wire: expected " + std::string(what) + ", found tag " + str(found) +
                      " at byte " + str(at) + " (" + tag_name(found) + ")");
  }
}

std::string Reader::string() {
  const std::uint64_t n = u64();
  if (n > remaining()) past_end(static_cast<std::size_t>(n));
  const std::byte* p = advance(static_cast<std::size_t>(n));
  return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
}

at::Tensor Reader::tensor() {
  expect_tag(tag::tensor, "a tensor");
  const std::size_t dtype_at = offset_;
  const std::uint32_t raw_dtype = u32();
  if (raw_dtype >= static_cast<std::uint32_t>(c10::ScalarType::NumOptions) ||
      raw_dtype == static_cast<std::uint32_t>(c10::ScalarType::Undefined) ||
      c10::isQIntType(static_cast<c10::ScalarType>(raw_dtype))) {
    throw FormatError("wire: a tensor's dtype " + str(raw_dtype) + " at byte " + str(dtype_at) +
                      " is not one this build can read");
  }
  const auto dtype = static_cast<c10::ScalarType>(raw_dtype);
  const std::uint32_t dim = u32();
  std::vector<std::int64_t> sizes;
  sizes.reserve(std::min<std::size_t>(dim, remaining() / sizeof(std::int64_t)));
  std::uint64_t numel = 1;
  bool overflowed = false;
  for (std::uint32_t d = 0; d < dim; ++d) {
    const std::size_t size_at = offset_;
    const std::int64_t s = i64();
    if (s < 0) {
      throw FormatError("wire: a tensor's size " + std::to_string(s) + " at byte " +
                        str(size_at) + " is negative");
    }
    overflowed |= __builtin_mul_overflow(numel, static_cast<std::uint64_t>(s), &numel);
    sizes.push_back(s);
  }
  std::uint64_t expected_bytes = 0;
  overflowed |= __builtin_mul_overflow(numel, static_cast<std::uint64_t>(c10::elementSize(dtype)),
                                       &expected_bytes);
  const std::size_t nbytes_at = offset_;
  const std::uint64_t nbytes = u64();
  if (overflowed || nbytes != expected_bytes) {
    throw FormatError("wire: a " + std::string(c10::toString(dtype)) + " tensor of shape " +
                      c10::str(c10::IntArrayRef(sizes)) + " holds " +
                      (overflowed ? std::string("more than 2^64") : str(expected_bytes)) +
                      " bytes, the message says " + str(nbytes) + " at byte " + str(nbytes_at));
  }
  const std::size_t placement_at = offset_;
  const std::uint8_t placement = u8();
  if (placement > 1) detail::throw_bad_flag("a tensor's placement", placement, placement_at);
  const std::size_t data_offset_at = offset_;
  const std::uint64_t data_offset = u64();
  if (data_offset > region_.size() || nbytes > region_.size() - data_offset) {
    throw FormatError("wire: tensor data at byte " + std::to_string(data_offset) + " (+" +
                      std::to_string(nbytes) + " bytes) lies outside the region of " +
                      str(region_.size()) + " bytes");
  }
  if (data_offset % tensor_alignment != 0) {
    throw FormatError("wire: tensor data at byte " + std::to_string(data_offset) +
                      " of the region is not at a multiple of " + str(tensor_alignment) +
                      " (the offset at byte " + str(data_offset_at) + ")");
  }
  if (placement == 0) {
    advance(padding_at(offset_));
    if (data_offset != start_ + offset_) {
      throw FormatError("wire: a tensor's inline data is at byte " + str(start_ + offset_) +
                        " of the region, the message says " + std::to_string(data_offset) +
                        " at byte " + str(data_offset_at));
    }
    if (nbytes > remaining()) past_end(static_cast<std::size_t>(nbytes));
    advance(static_cast<std::size_t>(nbytes));
  } else if (nbytes != 0 && data_offset < start_ + message_.size() &&
             data_offset + nbytes > start_) {
    throw FormatError("wire: tensor data at byte " + std::to_string(data_offset) + " (+" +
                      std::to_string(nbytes) + " bytes) overlaps the message, which takes bytes [" +
                      str(start_) + ", " + str(start_ + message_.size()) + ") of the region");
  }
  const std::byte* data = region_.data() + data_offset;
  // NOTE: from_blob wants a mutable pointer; the tensor aliases the region, which the caller
  // lent us for as long as `owner` lives, and every tensor keeps a copy of `owner`.
  return at::from_blob(const_cast<std::byte*>(data), sizes, [owner = owner_](void*) {},
                       at::TensorOptions().dtype(dtype).device(at::kCPU));
}

// --- Messages --------------------------------------------------------------------------------

namespace detail {

void write_header(Writer& w, std::uint64_t payload) {
  w.bytes(std::as_bytes(std::span(magic)));
  w.u32(version);
  w.u64(payload);
}

void finish_header(std::span<std::byte> dest, std::size_t message_size) {
  const std::uint64_t payload = message_size - header_size;
  std::memcpy(dest.data() + magic.size() + sizeof(std::uint32_t), &payload, sizeof payload);
}

std::size_t check_header(std::span<const std::byte> region, std::size_t at) {
  if (!region.empty()) check_aligned(region.data(), "source");
  check_start(at, region.size());
  const std::span<const std::byte> src = region.subspan(at);
  if (src.size() < header_size) {
    throw FormatError("wire: truncated message: " + str(src.size()) +
                      " bytes, shorter than the " + str(header_size) + "-byte header");
  }
  if (std::memcmp(src.data(), magic.data(), magic.size()) != 0) {
    throw FormatError("wire: not a coload batch (bad magic)");
  }
  std::uint32_t v = 0;
  std::memcpy(&v, src.data() + magic.size(), sizeof v);
  if (v != version) {
    throw FormatError("wire: version " + std::to_string(v) +
                      " is not supported (this build reads version " + std::to_string(version) +
                      ")");
  }
  std::uint64_t payload = 0;
  std::memcpy(&payload, src.data() + magic.size() + sizeof v, sizeof payload);
  if (payload > src.size() - header_size) {
    throw FormatError("wire: truncated message: the header declares " + std::to_string(payload) +
                      " payload bytes, the source holds " + str(src.size() - header_size));
  }
  return header_size + static_cast<std::size_t>(payload);
}

void throw_count_mismatch(const char* what, std::uint64_t expected, std::uint64_t found,
                          std::size_t at) {
  throw FormatError("wire: expected " + std::string(what) + " of " + std::to_string(expected) +
                    " elements, found " + std::to_string(found) + " at byte " + str(at));
}

void throw_bad_flag(const char* what, std::uint8_t found, std::size_t at) {
  throw FormatError("wire: " + std::string(what) + " must be 0 or 1, found " + str(found) +
                    " at byte " + str(at));
}

void throw_trailing(std::size_t read, std::size_t message_size) {
  throw FormatError("wire: the value ends at byte " + str(read) + " but the message has " +
                    str(message_size) + " bytes; was it written as another type?");
}

}  // namespace detail

}  // namespace coload::wire
