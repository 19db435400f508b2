#pragma once
// Helpers shared by the decode and transform tests: synthetic images, a progressive JPEG writer,
// a minimal PNG writer, a scratch directory, and the torchvision reference script run through
// /usr/bin/python3.

#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/vision/decode.hpp"
#include "coload/vision/image.hpp"
#include "../support/needs.hpp"

namespace coload::vision::test {

/// A directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("coload_vision_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, const void* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

template <typename Container>
void write_bytes(const std::filesystem::path& path, const Container& bytes) {
  write_bytes(path, bytes.data(), bytes.size());
}

inline std::vector<std::uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A deterministic RGB image with smooth gradients, edges and mild noise: photo-like enough that
/// resampling differences show, with a seed-dependent layout.
inline Image synthetic_image(int width, int height, std::uint32_t seed, int noise = 12) {
  Image img = Image::zeros(width, height, 3);
  std::uint32_t state = seed * 2654435761u + 12345u;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  const double cx = width * (0.3 + 0.4 * (seed % 7) / 7.0);
  const double cy = height * (0.3 + 0.4 * (seed % 5) / 5.0);
  const double radius = std::min(width, height) * 0.3;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double fx = static_cast<double>(x) / width;
      const double fy = static_cast<double>(y) / height;
      const bool inside = std::hypot(x - cx, y - cy) < radius;
      double v[3] = {
          200 * fx + 30 * std::sin(y / 9.0 + seed),
          180 * fy + 40 * std::sin((x + y) / 23.0),
          120 + 80 * std::sin(fx * 6.0 + fy * 3.0 + seed),
      };
      if (inside) {
        v[0] = 255 - v[0] * 0.5;
        v[2] = v[2] * 0.4;
      }
      if (((x / 40) + (y / 40)) % 5 == 0) v[1] = 30;  // hard-edged tiles
      std::uint8_t* p = img.pixel(x, y);
      for (int c = 0; c < 3; ++c) {
        const double n = noise > 0 ? static_cast<double>(next() % (2 * noise + 1)) - noise : 0;
        p[c] = static_cast<std::uint8_t>(std::clamp(v[c] + n, 0.0, 255.0));
      }
    }
  }
  return img;
}

/// A JPEG of a synthetic image, quality 90, 4:2:0.
inline std::vector<std::byte> synthetic_jpeg(int width, int height, std::uint32_t seed) {
  return encode_jpeg(synthetic_image(width, height, seed).view(), 90, ChromaSubsampling::s420);
}

/// An RGB image encoded by TurboJPEG itself (quality 90) with any of its subsamplings
/// (TJSAMP_*) and flags: what encode_jpeg does not write (4:4:0, 4:1:1, progressive).
inline std::vector<std::byte> turbo_jpeg(const Image& image, int tj_subsampling, int flags = 0,
                                         int quality = 90) {
  tjhandle handle = tjInitCompress();
  if (!handle) throw std::runtime_error("tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, image.data.data(), image.width, image.width * 3,
                             image.height, TJPF_RGB, &out, &size, tj_subsampling, quality, flags);
  std::vector<std::byte> jpeg;
  if (rc == 0) {
    const auto* first = reinterpret_cast<const std::byte*>(out);
    jpeg.assign(first, first + size);
  }
  tjFree(out);
  tjDestroy(handle);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return jpeg;
}

/// A progressive JPEG of a synthetic image (quality 90, 4:2:0), which the region decoder
/// declines: the pipelines then decode the whole image.
inline std::vector<std::byte> progressive_jpeg(int width, int height, std::uint32_t seed) {
  return turbo_jpeg(synthetic_image(width, height, seed), TJSAMP_420, TJFLAG_PROGRESSIVE);
}

inline std::vector<std::uint8_t> make_png(int width, int height, int bit_depth, int color_type,
                                          const std::vector<std::vector<std::uint8_t>>& rows,
                                          const std::vector<std::uint8_t>& palette = {}) {
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto put32 = [](std::vector<std::uint8_t>& v, std::uint32_t x) {
    for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<std::uint8_t>(x >> s));
  };
  auto chunk = [&](const char* type, const std::vector<std::uint8_t>& data) {
    put32(out, static_cast<std::uint32_t>(data.size()));
    std::vector<std::uint8_t> body(type, type + 4);
    body.insert(body.end(), data.begin(), data.end());
    out.insert(out.end(), body.begin(), body.end());
    put32(out, static_cast<std::uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
  };
  std::vector<std::uint8_t> ihdr;
  put32(ihdr, static_cast<std::uint32_t>(width));
  put32(ihdr, static_cast<std::uint32_t>(height));
  ihdr.insert(ihdr.end(), {static_cast<std::uint8_t>(bit_depth),
                           static_cast<std::uint8_t>(color_type), 0, 0, 0});
  chunk("IHDR", ihdr);
  if (!palette.empty()) chunk("PLTE", palette);
  std::vector<std::uint8_t> raw;
  for (const auto& row : rows) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), row.begin(), row.end());
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<std::uint8_t> z(size);
  compress(z.data(), &size, raw.data(), static_cast<uLong>(raw.size()));
  z.resize(size);
  chunk("IDAT", z);
  chunk("IEND", {});
  return out;
}

/// A real 16x16 baseline JPEG (about 700 bytes) whose SOF0 header is patched to declare
/// `width` x `height` (at most 65535 each): a decompression bomb's header.
inline std::vector<std::byte> bomb_jpeg(int width, int height) {
  std::vector<std::byte> jpeg = synthetic_jpeg(16, 16, 1);
  for (std::size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == std::byte{0xff} && jpeg[i + 1] == std::byte{0xc0}) {
      // FFC0, length (2), precision (1), height (2), width (2)
      jpeg[i + 5] = static_cast<std::byte>(height >> 8);
      jpeg[i + 6] = static_cast<std::byte>(height & 0xff);
      jpeg[i + 7] = static_cast<std::byte>(width >> 8);
      jpeg[i + 8] = static_cast<std::byte>(width & 0xff);
      return jpeg;
    }
  }
  return {};
}

/// A valid PNG header (IHDR with its CRC, RGB8) declaring `width` x `height`, one tiny IDAT and
/// IEND: under 100 bytes.
inline std::vector<std::uint8_t> bomb_png(int width, int height) {
  return make_png(width, height, 8, 2, {});
}

/// Peak signal-to-noise ratio in dB between two equally sized 8-bit buffers (inf when equal).
inline double psnr(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  if (sum == 0) return INFINITY;
  return 10.0 * std::log10(255.0 * 255.0 / (sum / static_cast<double>(a.size())));
}

/// tools/vision/reference.py, found from this file's compile-time path, relative to the working
/// directory or to the directories above the test executable; empty when not found.
inline std::filesystem::path reference_script() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path(__FILE__).parent_path() / "../../tools/vision/reference.py";
  std::vector<fs::path> bases = {fs::current_path()};
  std::error_code ec;
  for (fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
       !ec && !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    bases.push_back(dir);
  }
  if (rel.is_absolute() && fs::exists(rel)) return fs::weakly_canonical(rel);
  for (const auto& base : bases) {
    if (fs::exists(base / rel)) return fs::weakly_canonical(base / rel);
  }
  return {};
}

/// What running the reference script came to.
enum class Reference { ok, unavailable, failed };

/// The Python that runs the reference script: $COLOAD_REFERENCE_PYTHON, or /usr/bin/python3
/// (Debian's torchvision 0.14) when that is unset or empty. CI's libtorch 2 stage sets it to a
/// venv with a current torchvision, whose transforms.v2.functional the script then runs.
inline std::string reference_python() {
  const char* env = std::getenv("COLOAD_REFERENCE_PYTHON");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("/usr/bin/python3");
}

/// `s` single-quoted for the shell.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs the reference script on `commands` (one per line) with reference_python(). A case that
/// calls it is decorated with needs(torchvision_reference()) and requires it first, so here
/// `unavailable` (no script, or the script's exit 77) is a failure like any other.
inline Reference run_reference(const TempDir& dir, const std::string& commands) {
  const auto script = reference_script();
  const std::string python = reference_python();
  if (script.empty() || ::access(python.c_str(), X_OK) != 0) return Reference::unavailable;
  const auto file = dir / "commands.txt";
  write_bytes(file, commands);
  const std::string cmd =
      shell_quoted(python) + " " + shell_quoted(script.string()) + " " + shell_quoted(file.string());
  const int status = std::system(cmd.c_str());
  if (status == -1 || !WIFEXITED(status)) return Reference::failed;
  if (WEXITSTATUS(status) == 77) return Reference::unavailable;
  return WEXITSTATUS(status) == 0 ? Reference::ok : Reference::failed;
}

/// Whether reference_python()'s torchvision runs the ops through transforms.v2.functional
/// (0.16 and later: tools/vision/reference.py then does), asked once. Its uint8 arithmetic
/// differs from 0.14's by 1 in a few values for some ops (AutoContrast divides by the range
/// over 255, the blends add with alpha), so a case exact against 0.14 allows 1 of 255 there.
inline bool reference_runs_v2() {
  static const bool v2 = [] {
    const std::string check = shell_quoted(reference_python()) +
                              " -c 'import torchvision.transforms.v2.functional as F; F.to_dtype'"
                              " >/dev/null 2>&1";
    const int status = std::system(check.c_str());
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }();
  return v2;
}

/// What the torchvision comparisons need: tools/vision/reference.py, and reference_python()
/// importing what it and the folder listing import. Checked once per process, at registration
/// (one import of torch, about 2 s); the reason names whichever is missing, with Python's error.
inline const coload::testing::Need& torchvision_reference() {
  static const coload::testing::Need need = [] {
    const char* env = "COLOAD_REQUIRE_REFERENCES";
    if (reference_script().empty()) {
      return coload::testing::Need(
          env, "tools/vision/reference.py not found (from " + std::filesystem::current_path().string() +
                   " or above the test executable)");
    }
    const std::string python = reference_python();
    if (::access(python.c_str(), X_OK) != 0) {
      return coload::testing::Need(env, "no " + python + " to run tools/vision/reference.py");
    }
    const std::string check = shell_quoted(python) +
                              " -c 'import torch, torchvision.transforms.functional, "
                              "torchvision.datasets, PIL.Image' 2>&1";
    std::string out;
    FILE* pipe = ::popen(check.c_str(), "r");
    if (!pipe) return coload::testing::Need(env, "cannot run " + python + " (popen failed)");
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    const int status = ::pclose(pipe);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      return coload::testing::Need(env, "");
    }
    // Python's last line says what failed ("ModuleNotFoundError: No module named 'torchvision'").
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
    return coload::testing::Need(
        env, "torchvision not importable by " + python + ": " + (last.empty() ? "it failed" : last));
  }();
  return need;
}

}  // namespace coload::vision::test
