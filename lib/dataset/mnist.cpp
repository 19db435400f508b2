// Built from lib/meson.build; the MNIST reader.

#include "coload/dataset/mnist.hpp"
#include "coload/core/error.hpp"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bounds.hpp"

namespace coload {
namespace {

namespace fs = std::filesystem;

// A file read through zlib, which reads gzip and plain files alike.
class GzFile {
 public:
  explicit GzFile(const fs::path& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      const int err = errno;
      throw RuntimeError(path_.string() + ": cannot open" +
                         (err != 0 ? std::string(": ") + std::strerror(err) : ""));
    }
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(file_); }

  // Reads up to `n` bytes; fewer only at the end of the file.
  std::size_t read(void* out, std::size_t n) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(file_, p + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* why = gzerror(file_, &code);
        throw RuntimeError(path_.string() + ": truncated or corrupt gzip data (zlib: " +
                           (why ? why : "unknown error") + ")");
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  // The number of bytes left to read.
  std::size_t rest() {
    std::array<unsigned char, 4096> buffer;
    std::size_t total = 0;
    while (const std::size_t got = read(buffer.data(), buffer.size())) total += got;
    return total;
  }

 private:
  fs::path path_;
  gzFile file_ = nullptr;
};

std::uint32_t big_endian(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Reads an IDX file of uint8 values with `dims` dimensions into a uint8 tensor of that shape.
at::Tensor read_idx(const fs::path& path, int dims, const char* what) {
  GzFile file(path);
  const std::uint32_t expected_magic = 0x00000800u | static_cast<std::uint32_t>(dims);
  const std::size_t header_bytes = 4 * (1 + static_cast<std::size_t>(dims));
  std::array<unsigned char, 16> header{};
  const std::size_t got = file.read(header.data(), header_bytes);
  if (got < 4) {
    throw RuntimeError(path.string() + ": truncated: expected a " + std::to_string(header_bytes) +
                       "-byte IDX header, found " + std::to_string(got) + " bytes");
  }
  const std::uint32_t magic = big_endian(header.data());
  if (magic != expected_magic) {
    throw RuntimeError(path.string() + ": wrong magic number " + hex(magic) + ", expected " +
                       hex(expected_magic) + " (an IDX file of uint8 " + what + ", " +
                       std::to_string(dims) + " dimensions)");
  }
  if (got < header_bytes) {
    throw RuntimeError(path.string() + ": truncated: expected a " + std::to_string(header_bytes) +
                       "-byte IDX header, found " + std::to_string(got) + " bytes");
  }
  std::vector<std::int64_t> shape;
  // Three 32-bit dimensions can multiply past 2^64: the count is exact in 128 bits, and the
  // body is read before anything of its announced size is allocated.
  unsigned __int128 count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(big_endian(header.data() + 4 * (1 + d)));
    count *= static_cast<std::uint64_t>(shape.back());
  }
  std::string layout = std::to_string(shape[0]) + " " + what;
  if (dims == 3) layout += " of " + std::to_string(shape[1]) + "x" + std::to_string(shape[2]);
  // Counts past 2^62 cannot be a file here (and would not print as a uint64).
  const bool absurd = count > (static_cast<unsigned __int128>(1) << 62);
  const std::string expected =
      "expected " +
      (absurd ? std::string("more than 2^62")
              : std::to_string(header_bytes + static_cast<std::uint64_t>(count))) +
      " bytes (a " + std::to_string(header_bytes) + "-byte header and " + layout + ")";
  // Read in pieces into memory that grows with what arrives: a header's word alone allocates
  // nothing (a 16-byte file announcing 10^11 bytes is a truncated file, not an allocation).
  std::vector<std::uint8_t> bytes;
  const std::uint64_t want = absurd ? ~std::uint64_t{0} : static_cast<std::uint64_t>(count);
  constexpr std::size_t piece = 4 << 20;
  while (bytes.size() < want) {
    const std::size_t at = bytes.size();
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(want - at, piece));
    bytes.resize(at + n);
    const std::size_t got_now = file.read(bytes.data() + at, n);
    bytes.resize(at + got_now);
    if (got_now < n) break;
  }
  const std::size_t body = bytes.size();
  if (body < want) {
    throw RuntimeError(path.string() + ": truncated: " + expected + ", found " +
                       std::to_string(header_bytes + body));
  }
  if (const std::size_t extra = file.rest(); extra != 0) {
    throw RuntimeError(path.string() + ": too long: " + expected + ", found " +
                       std::to_string(header_bytes + body + extra));
  }
  at::Tensor data = at::empty(shape, at::kByte);
  if (body > 0) std::memcpy(data.data_ptr<std::uint8_t>(), bytes.data(), body);
  return data;
}

// `root/name`, or its .gz form, or either under root/MNIST/raw.
fs::path find_file(const fs::path& root, const std::string& name) {
  for (const fs::path& dir : {root, root / "MNIST" / "raw"}) {
    for (const std::string& file : {name, name + ".gz"}) {
      std::error_code ec;
      if (fs::is_regular_file(dir / file, ec)) return dir / file;
    }
  }
  throw RuntimeError("MNIST: found neither " + (root / name).string() + " nor " +
                     (root / (name + ".gz")).string() + " (nor either under " +
                     (root / "MNIST" / "raw").string() + ")");
}

}  // namespace

at::Tensor MNIST::read_images(const std::filesystem::path& path) {
  return read_idx(path, 3, "images");
}

at::Tensor MNIST::read_labels(const std::filesystem::path& path) {
  return read_idx(path, 1, "labels").to(at::kLong);
}

MNIST::MNIST(const std::filesystem::path& root, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  images_path_ = find_file(root, prefix + "-images-idx3-ubyte");
  labels_path_ = find_file(root, prefix + "-labels-idx1-ubyte");
  images_ = read_images(images_path_);
  targets_ = read_labels(labels_path_);
  if (images_.size(0) != targets_.size(0)) {
    throw RuntimeError(images_path_.string() + " holds " + std::to_string(images_.size(0)) +
                       " images but " + labels_path_.string() + " holds " +
                       std::to_string(targets_.size(0)) + " labels; expected one label per image");
  }
  labels_ = targets_.data_ptr<std::int64_t>();
}

std::pair<at::Tensor, std::int64_t> MNIST::get(Index index) const {
  // As TensorDataset: the image is a view, made below autograd (nothing here needs gradients).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor image = images_.select(0, index);  // c10::IndexError when out of range
  const Index i = index < 0 ? index + size() : index;
  return {std::move(image), labels_[i]};
}

std::pair<at::Tensor, at::Tensor> MNIST::get_batch(std::span<const Index> indices) const {
  detail::check_batch_indices(indices, size());
  // NOTE: from_blob borrows the caller's indices; index_select copies out before we return.
  at::Tensor idx = at::from_blob(const_cast<Index*>(indices.data()),
                                 {static_cast<std::int64_t>(indices.size())}, at::kLong);
  if (std::any_of(indices.begin(), indices.end(), [](Index i) { return i < 0; })) {
    idx = at::where(idx < 0, idx + size(), idx);
  }
  return {images_.index_select(0, idx), targets_.index_select(0, idx)};
}

}  // namespace coload
