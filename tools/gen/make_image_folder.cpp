// tools/gen/make_image_folder: a synthetic ImageNet-like folder of JPEGs, for the examples,
// tests and benchmarks of the vision module.
//
//   make_image_folder OUT [--classes 10] [--per-class 100] [--seed 0] [--threads N] [--quality 90]
//
// Writes OUT/class_000/img_00000.jpg ...: baseline JPEGs, quality 90, 4:2:0 chroma subsampling,
// of ImageNet-like sizes (shorter side uniform in 300..500, aspect ratio log-uniform in
// 3:4..4:3, landscape or portrait). Each picture is a smooth two-colour gradient and a handful
// of shapes under sine-grating texture and per-pixel noise, so its entropy (about 85 KB a file,
// 0.5 byte a pixel) is close to a photograph's. The class shows in two ways a small model can
// learn: the gradient's dominant hue and the stripes' orientation are the class's (with a little
// jitter); everything else is random. The output is a function of (seed, class, index) alone: the
// same command writes the same bytes whatever --threads.

#include <CLI/CLI.hpp>
#include <turbojpeg.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

constexpr double kPi = 3.14159265358979323846;

struct Args {
  std::string out;
  int classes = 10;
  int per_class = 100;
  std::uint64_t seed = 0;
  int threads = 0;
  int quality = 90;
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse(int argc, char** argv) {
  Args args;
  CLI::App app{"make_image_folder: writes OUT/class_000/img_00000.jpg ...: synthetic JPEGs of "
               "ImageNet-like sizes with a class-dependent hue and stripe orientation, "
               "deterministic for a seed"};
  app.add_option("OUT", args.out, "the folder to write (missing parents are created)");
  app.add_option("--classes", args.classes, "class folders")
      ->check(CLI::Range(1, 100'000))
      ->capture_default_str();
  app.add_option("--per-class", args.per_class, "images per class")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  app.add_option("--seed", args.seed, "seeds every picture")->capture_default_str();
  app.add_option("--threads", args.threads, "encoding threads; 0: one per CPU")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--quality", args.quality, "JPEG quality")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    // NOTE: OUT is checked after parsing, so that an unknown flag is named before it.
    if (args.out.empty()) throw CLI::RequiredError("OUT");
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return args;
}

// splitmix64: the picture's whole random stream, seeded from (seed, class, index).
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  int integer(int low, int high_inclusive) {
    return low + static_cast<int>(uniform() * (high_inclusive - low + 1));
  }

 private:
  std::uint64_t state_;
};

struct Rgb {
  double r, g, b;
};

// HSV (all in [0, 1], hue wrapping) to RGB in [0, 255].
Rgb hsv(double h, double s, double v) {
  h = (h - std::floor(h)) * 6.0;
  const int sector = static_cast<int>(h) % 6;
  const double f = h - std::floor(h);
  const double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  double r = v, g = t, b = p;
  switch (sector) {
    case 0:
      r = v, g = t, b = p;
      break;
    case 1:
      r = q, g = v, b = p;
      break;
    case 2:
      r = p, g = v, b = t;
      break;
    case 3:
      r = p, g = q, b = v;
      break;
    case 4:
      r = t, g = p, b = v;
      break;
    default:
      r = v, g = p, b = q;
      break;
  }
  return {r * 255, g * 255, b * 255};
}

std::uint8_t clamp_byte(int v) {
  return static_cast<std::uint8_t>(std::clamp(v, 0, 255));
}

// The class's signature. Hues: evenly spaced over up to 12 bins (classes % 12 when there are
// more), at least 1/12 apart, well beyond the ±0.03 jitter. Stripe angles: spread by the golden
// ratio, which tells apart classes that share a hue bin.
// NOTE: evenly spaced rather than golden-ratio hues: with the latter, classes 0 and 8 of ten
// were 0.056 apart in hue and 10° apart in angle, too close for a small model.
double class_hue(int c, int classes) {
  const int bins = std::min(classes, 12);
  return (c % bins + 0.5) / bins;
}
double class_angle(int c) {
  return std::fmod(c * 0.3819660112501051 + 0.1, 1.0) * kPi;
}

// Paints picture (class c of `classes`, index i) into `rgb` (resized to w × h × 3); returns w and
// h.
std::pair<int, int> paint(std::vector<std::uint8_t>& rgb, std::uint64_t seed, int classes, int c,
                          int i) {
  Random rng(
      Random::mix(Random::mix(seed ^ 0x6d616b652d696d67ULL) ^ static_cast<std::uint64_t>(c)) ^
      (static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL));
  const int shorter = rng.integer(300, 500);
  const double aspect = std::exp(rng.uniform(std::log(3.0 / 4.0), std::log(4.0 / 3.0)));
  const int w = aspect >= 1 ? static_cast<int>(std::lround(shorter * aspect)) : shorter;
  const int h = aspect >= 1 ? shorter : static_cast<int>(std::lround(shorter / aspect));
  rgb.resize(static_cast<std::size_t>(w) * h * 3);

  // Background: a gradient from the class hue to a second colour, along a random direction.
  const double hue = class_hue(c, classes) + rng.uniform(-0.03, 0.03);
  const Rgb from = hsv(hue, rng.uniform(0.55, 0.95), rng.uniform(0.55, 0.95));
  const Rgb to = hsv(hue + rng.uniform(-0.12, 0.12), rng.uniform(0.3, 0.8), rng.uniform(0.2, 0.6));
  const double g_angle = rng.uniform(0, 2 * kPi);
  const double gx = std::cos(g_angle) / std::hypot(w, h), gy = std::sin(g_angle) / std::hypot(w, h);

  // Three sine gratings added to every channel: the class's stripes (its angle, random period,
  // phase and strength), and two fine random ones for photographic texture.
  constexpr int kLut = 1024;
  static const std::vector<int> unit_sine = [] {
    std::vector<int> lut(kLut);
    for (int k = 0; k < kLut; ++k) {
      lut[static_cast<std::size_t>(k)] =
          static_cast<int>(std::lround(256 * std::sin(2 * kPi * k / kLut)));
    }
    return lut;
  }();
  struct Grating {
    std::uint32_t step_x;  // phase advance per pixel along x, in 2^-32 periods
    double per_y;          // periods per pixel along y
    double phase;          // periods
    int amplitude;         // levels
    std::uint32_t row_start(int y) const {
      const double p = y * per_y + phase;
      return static_cast<std::uint32_t>((p - std::floor(p)) * 4294967296.0);
    }
  };
  auto grating = [&](double angle, double period, int amplitude) {
    const double per_x = std::cos(angle) / period;
    return Grating{static_cast<std::uint32_t>(static_cast<std::int64_t>(
                       std::llround((per_x - std::floor(per_x)) * 4294967296.0))),
                   std::sin(angle) / period, rng.uniform(), amplitude};
  };
  const Grating gratings[3] = {
      grating(class_angle(c) + rng.uniform(-0.08, 0.08), rng.uniform(10, 36), rng.integer(18, 40)),
      grating(rng.uniform(0, kPi), rng.uniform(2.5, 6), rng.integer(4, 10)),
      grating(rng.uniform(0, kPi), rng.uniform(3, 9), rng.integer(4, 10)),
  };
  const int noise = rng.integer(12, 20);  // triangular noise, about this many levels each way

  // NOTE: fixed point throughout (the gradient position in 2^-32 units, channels in 1/256 of a
  // level, grating phases wrapping in 32 bits): painting then costs less than encoding.
  const auto level = [](double v) { return static_cast<std::int64_t>(std::lround(v * 256)); };
  const std::int64_t r0 = level(from.r), g0 = level(from.g), b0 = level(from.b);
  const std::int64_t dr = level(to.r) - r0, dg = level(to.g) - g0, db = level(to.b) - b0;
  const auto t_step = static_cast<std::int64_t>(std::llround(gx * 4294967296.0));
  for (int y = 0; y < h; ++y) {
    std::uint8_t* p = rgb.data() + static_cast<std::size_t>(y) * w * 3;
    std::int64_t t = std::llround((0.5 - (w / 2.0) * gx + (y - h / 2.0) * gy) * 4294967296.0);
    for (int x = 0; x < w; ++x, t += t_step, p += 3) {
      const std::int64_t t12 = std::clamp<std::int64_t>(t >> 20, 0, 4096);
      p[0] = static_cast<std::uint8_t>((r0 + ((dr * t12) >> 12)) >> 8);
      p[1] = static_cast<std::uint8_t>((g0 + ((dg * t12) >> 12)) >> 8);
      p[2] = static_cast<std::uint8_t>((b0 + ((db * t12) >> 12)) >> 8);
    }
  }

  // Shapes: ellipses and rectangles of random colours, blended over the background.
  const int shapes = rng.integer(3, 8);
  for (int k = 0; k < shapes; ++k) {
    const Rgb color = hsv(rng.uniform(), rng.uniform(0.2, 1.0), rng.uniform(0.1, 1.0));
    const double alpha = rng.uniform(0.45, 0.9);
    const double cx = rng.uniform(0, w), cy = rng.uniform(0, h);
    const double rx = rng.uniform(0.04, 0.25) * w, ry = rng.uniform(0.04, 0.25) * h;
    const bool ellipse = rng.uniform() < 0.6;
    const int x0 = std::max(0, static_cast<int>(cx - rx)),
              x1 = std::min(w, static_cast<int>(cx + rx) + 1);
    const int y0 = std::max(0, static_cast<int>(cy - ry)),
              y1 = std::min(h, static_cast<int>(cy + ry) + 1);
    const int a = static_cast<int>(alpha * 256);
    const int cr = static_cast<int>(color.r), cg = static_cast<int>(color.g),
              cb = static_cast<int>(color.b);
    for (int y = y0; y < y1; ++y) {
      std::uint8_t* row = rgb.data() + static_cast<std::size_t>(y) * w * 3;
      const double dy = (y - cy) / ry;
      for (int x = x0; x < x1; ++x) {
        if (ellipse) {
          const double dx = (x - cx) / rx;
          if (dx * dx + dy * dy > 1) continue;
        }
        std::uint8_t* p = row + 3 * x;
        p[0] = static_cast<std::uint8_t>((p[0] * (256 - a) + cr * a) >> 8);
        p[1] = static_cast<std::uint8_t>((p[1] * (256 - a) + cg * a) >> 8);
        p[2] = static_cast<std::uint8_t>((p[2] * (256 - a) + cb * a) >> 8);
      }
    }
  }

  // Texture and noise over everything, shapes included, as a camera's would be.
  for (int y = 0; y < h; ++y) {
    std::uint8_t* p = rgb.data() + static_cast<std::size_t>(y) * w * 3;
    Random pixel_rng(rng.next());
    std::uint32_t phase[3];
    for (int k = 0; k < 3; ++k) phase[k] = gratings[k].row_start(y);
    for (int x = 0; x < w; ++x, p += 3) {
      int texture = 0;
      for (int k = 0; k < 3; ++k) {
        texture += unit_sine[phase[k] >> 22] * gratings[k].amplitude;
        phase[k] += gratings[k].step_x;
      }
      texture /= 256;
      const std::uint64_t bits = pixel_rng.next();
      for (int ch = 0; ch < 3; ++ch) {
        const int n = ((static_cast<int>((bits >> (16 * ch)) & 0xff) +
                        static_cast<int>((bits >> (16 * ch + 8)) & 0xff) - 255) *
                       noise) >>
                      7;
        p[ch] = clamp_byte(p[ch] + texture + n);
      }
    }
  }
  return {w, h};
}

bool write_file(const std::string& path, const unsigned char* data, unsigned long size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  unsigned long done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return false;
    }
    done += static_cast<unsigned long>(n);
  }
  return ::close(fd) == 0;
}

// `value` in decimal, zero-padded to `width` digits.
std::string padded(long long value, int width) {
  std::string s = std::to_string(value);
  if (static_cast<int>(s.size()) < width)
    s.insert(0, static_cast<std::size_t>(width) - s.size(), '0');
  return s;
}

int digits(long long n) {
  int d = 1;
  while (n >= 10) n /= 10, ++d;
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const auto start = std::chrono::steady_clock::now();

  const int class_width = std::max(3, digits(args.classes - 1));
  const int image_width = std::max(5, digits(args.per_class - 1));
  std::vector<std::string> class_dirs;
  if (std::error_code ec; !std::filesystem::create_directories(args.out, ec) && ec) {
    std::fprintf(stderr, "make_image_folder: cannot create %s: %s\n", args.out.c_str(),
                 ec.message().c_str());
    return 1;
  }
  for (int c = 0; c < args.classes; ++c) {
    class_dirs.push_back(args.out + "/class_" + padded(c, class_width));
    if (::mkdir(class_dirs.back().c_str(), 0755) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "make_image_folder: cannot create %s: %s\n", class_dirs.back().c_str(),
                   std::strerror(errno));
      return 1;
    }
  }

  const long long total = static_cast<long long>(args.classes) * args.per_class;
  std::atomic<long long> next{0};
  std::atomic<long long> files{0};
  std::atomic<long long> bytes{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    tjhandle encoder = tjInitCompress();
    if (!encoder) {
      std::fprintf(stderr, "make_image_folder: tjInitCompress: %s\n", tjGetErrorStr2(nullptr));
      failed = true;
      return;
    }
    std::vector<std::uint8_t> rgb;
    unsigned char* jpeg = nullptr;
    unsigned long jpeg_size = 0;
    for (;;) {
      const long long job = next.fetch_add(1);
      if (job >= total || failed) break;
      const int c = static_cast<int>(job / args.per_class);
      const int i = static_cast<int>(job % args.per_class);
      const auto [w, h] = paint(rgb, args.seed, args.classes, c, i);
      // NOTE: tjCompress2 reallocates `jpeg` as needed (no TJFLAG_NOREALLOC), so one buffer
      // serves every picture of this thread.
      if (tjCompress2(encoder, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &jpeg_size, TJSAMP_420,
                      args.quality, 0) != 0) {
        std::fprintf(stderr, "make_image_folder: tjCompress2: %s\n", tjGetErrorStr2(encoder));
        failed = true;
        break;
      }
      const std::string path =
          class_dirs[static_cast<std::size_t>(c)] + "/img_" + padded(i, image_width) + ".jpg";
      if (!write_file(path, jpeg, jpeg_size)) {
        std::fprintf(stderr, "make_image_folder: cannot write %s: %s\n", path.c_str(),
                     std::strerror(errno));
        failed = true;
        break;
      }
      files += 1;
      bytes += static_cast<long long>(jpeg_size);
    }
    tjFree(jpeg);
    tjDestroy(encoder);
  };
  int threads = args.threads > 0
                    ? args.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<long long>(threads, total));
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
  }
  if (failed) return 1;

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "make_image_folder: wrote %lld files, %lld bytes (%.1f MiB, %.0f KB per file) in "
      "%d classes under %s in %.2f s\n",
      files.load(), bytes.load(), bytes.load() / 1048576.0,
      bytes.load() / 1000.0 / std::max(1LL, files.load()), args.classes, args.out.c_str(), seconds);
  return 0;
}
