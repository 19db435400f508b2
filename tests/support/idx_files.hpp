#pragma once
// Tiny MNIST IDX files for tests: the bytes of n 28x28 uint8 images and of their labels, in
// the format torchvision's and libtorch's MNIST read (big-endian magic and dimensions).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace coload::test {

/// An IDX file: big-endian magic, big-endian dimensions, then the bytes.
inline std::string idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                             const std::vector<std::uint8_t>& data) {
  std::string out;
  auto put = [&out](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put(magic);
  for (std::uint32_t d : dims) put(d);
  out.append(data.begin(), data.end());
  return out;
}

inline void write_plain(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Pixel p of image k of the tiny set.
inline std::uint8_t pixel(std::size_t k, std::size_t p) {
  return static_cast<std::uint8_t>((k * 31 + p * 7) % 256);
}

/// The bytes of `n` 28x28 images.
inline std::vector<std::uint8_t> image_data(std::size_t n) {
  std::vector<std::uint8_t> data;
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t p = 0; p < 28 * 28; ++p) data.push_back(pixel(k, p));
  }
  return data;
}

inline std::string images_file(std::size_t n) {
  return idx_bytes(0x803, {static_cast<std::uint32_t>(n), 28, 28}, image_data(n));
}
inline std::string labels_file(const std::vector<std::uint8_t>& labels) {
  return idx_bytes(0x801, {static_cast<std::uint32_t>(labels.size())}, labels);
}

}  // namespace coload::test
