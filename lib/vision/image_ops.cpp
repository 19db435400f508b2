// vision/image_ops: ColorJitter's four adjustments, Gaussian blur, flips and grayscale on packed
// uint8 RGB, in place, with the float32 arithmetic of torchvision's tensor functional API (what
// torchvision runs on tensor images, and what the recipe tests compare with).

#include "image_ops.hpp"
#include "coload/core/error.hpp"
#include "coload/vision/recipe.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

namespace coload::vision::detail {
namespace {

std::size_t pixels(RgbSpan img) { return static_cast<std::size_t>(img.width) * img.height; }

// `_blend(img1, img2, ratio)` for uint8: (ratio · a + (1 - ratio) · b) in float32, clamped to
// [0, 255], truncated. `other` is (1 - ratio) · b, computed once per b where b is shared.
inline std::uint8_t blend(std::uint8_t a, float ratio, float other) noexcept {
  const float v = static_cast<float>(a) * ratio + other;
  return static_cast<std::uint8_t>(std::clamp(v, 0.0f, 255.0f));
}

}  // namespace

// ---- Draws ---------------------------------------------------------------------------------

namespace {

// x in [0, 1): the low 24 bits of a 32-bit word over 2^24, exact in float.
inline float unit_of(std::uint32_t word) noexcept {
  return static_cast<float>(word & 0xFFFFFFu) * (1.0f / 16777216.0f);
}

// x · (to − from) + from, rounded after the product and after the sum; the volatile keeps our
// own compiler from contracting it into an FMA.
inline float uniform_plain(float x, float from, float to) noexcept {
  volatile float product = x * (to - from);
  return product + from;
}

inline float uniform_fused(float x, float from, float to) noexcept {
  return std::fma(x, to - from, from);
}

// The range ATen's uniform_ accepts for float32 without an error: anything else goes to ATen.
inline bool plain_range(double lo, double hi) noexcept {
  constexpr double most = std::numeric_limits<float>::max();
  return lo <= hi && lo >= -most && hi <= most && hi - lo <= most;
}

at::CPUGeneratorImpl* cpu_generator(at::Generator& gen) {
  return gen.device().type() == at::kCPU ? at::check_generator<at::CPUGeneratorImpl>(gen) : nullptr;
}

}  // namespace

DrawForm draw_form() {
  static const DrawForm form = [] {
    constexpr std::uint64_t seed = 20261129;
    at::Generator a = at::detail::createCPUGenerator(seed);
    at::Generator b = at::detail::createCPUGenerator(seed);
    auto* words = at::check_generator<at::CPUGeneratorImpl>(b);
    bool plain = true;
    bool fused = true;
    bool same = true;  // the unit and integer draws
    int told_apart = 0;
    constexpr double ranges[3][2] = {{0.08, 1.0}, {-0.2876820724517809, 0.28768207245178085}, {-30.0, 30.0}};
    for (int k = 0; k < 96; ++k) {
      const auto& r = ranges[k % 3];
      const float got = at::empty({1}, at::kFloat).uniform_(r[0], r[1], a).item<float>();
      const float x = unit_of(words->random());
      const float p = uniform_plain(x, static_cast<float>(r[0]), static_cast<float>(r[1]));
      const float f = uniform_fused(x, static_cast<float>(r[0]), static_cast<float>(r[1]));
      plain = plain && got == p;
      fused = fused && got == f;
      told_apart += p != f;
      same = same && at::rand({1}, a).item<float>() == unit_of(words->random());
      same = same && at::randint(3, 1000, {1}, a).item<std::int64_t>() ==
                         static_cast<std::int64_t>(words->random() % 997u) + 3;
      constexpr std::int64_t big = std::int64_t{5} << 32;
      same = same && at::randint(-7, big, {1}, a).item<std::int64_t>() ==
                         static_cast<std::int64_t>(words->random64() %
                                                   static_cast<std::uint64_t>(big + 7)) - 7;
    }
    if (!same || told_apart == 0) return DrawForm::aten;
    return plain ? DrawForm::plain : fused ? DrawForm::fused : DrawForm::aten;
  }();
  return form;
}

float draw_unit(at::Generator& gen) {
  auto* cpu = draw_form() == DrawForm::aten ? nullptr : cpu_generator(gen);
  if (cpu == nullptr) return at::rand({1}, gen).item<float>();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return unit_of(cpu->random());
}

std::int64_t draw_int(std::int64_t low, std::int64_t high, at::Generator& gen) {
  // ATen takes 32 bits for a range below 2^28 and 64 from 2^32 on; between, torch 1.13 takes 32
  // and 2.x 64 (its threshold moved to 2^28): there, ATen's own call.
  const std::uint64_t range = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
  const bool known = low < high && (range < (std::uint64_t{1} << 28) || range >= (std::uint64_t{1} << 32));
  auto* cpu = draw_form() == DrawForm::aten || !known ? nullptr : cpu_generator(gen);
  if (cpu == nullptr) return at::randint(low, high, {1}, gen).item<std::int64_t>();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const std::uint64_t word = range >= (std::uint64_t{1} << 32) ? cpu->random64() : cpu->random();
  return static_cast<std::int64_t>(word % range + static_cast<std::uint64_t>(low));
}

float draw_uniform(double lo, double hi, at::Generator& gen) {
  const DrawForm form = draw_form();
  auto* cpu = form == DrawForm::aten || !plain_range(lo, hi) ? nullptr : cpu_generator(gen);
  if (cpu == nullptr) return at::empty({1}, at::kFloat).uniform_(lo, hi, gen).item<float>();
  const auto from = static_cast<float>(lo);
  const auto to = static_cast<float>(hi);
  std::lock_guard<std::mutex> lock(gen.mutex());
  const float x = unit_of(cpu->random());
  return form == DrawForm::fused ? uniform_fused(x, from, to) : uniform_plain(x, from, to);
}

std::array<double, 2> log_ratio(const std::array<double, 2>& ratio) {
  thread_local std::array<double, 2> key{NAN, NAN};
  thread_local std::array<double, 2> value{};
  if (ratio == key) return value;  // a NaN ratio never matches: computed each time
  const at::Tensor logs =
      at::log(at::tensor({static_cast<float>(ratio[0]), static_cast<float>(ratio[1])}));
  const float* l = logs.data_ptr<float>();
  value = {l[0], l[1]};
  key = ratio;
  return value;
}

float aten_exp(float v) {
  // In place on a one-element tensor of the thread's: the same exp kernel as at::exp (exp_ is
  // exp.out into itself), without allocating two tensors and reading one back a sample.
  thread_local at::Tensor t = at::empty({1}, at::kFloat);
  float* value = t.data_ptr<float>();
  *value = v;
  t.exp_();
  return *value;
}

std::string py_float(double v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  std::string out(text, end);
  if (out.find_first_of(".eine") == std::string::npos) out += ".0";
  return out;
}

void gray_row(const std::uint8_t* in, std::uint8_t* out, int width, int times) {
  for (int x = 0; x < width; ++x) {
    const std::uint8_t* p = in + 3 * x;
    std::uint8_t l = gray_of(p[0], p[1], p[2]);
    for (int t = 1; t < times; ++t) l = gray_of(l, l, l);
    out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = l;
  }
}

namespace {
// Maps every value through a 256-entry table: where an op's output depends on the value alone
// (and numbers fixed for the image), the table holds the op's own float arithmetic, computed
// 256 times instead of once per value.
template <typename Fn>
void map_values(RgbSpan img, Fn&& fn) {
  std::uint8_t table[256];
  for (int v = 0; v < 256; ++v) table[v] = fn(static_cast<std::uint8_t>(v));
  const std::size_t n = pixels(img) * 3;
  for (std::size_t i = 0; i < n; ++i) img.data[i] = table[img.data[i]];
}
}  // namespace

void adjust_brightness(RgbSpan img, double factor) {
  // `image.mul(factor).clamp_(0, 255)` (0.14's `_blend` with zeros adds (1 - factor) · 0 = 0).
  const auto ratio = static_cast<float>(factor);
  map_values(img, [&](std::uint8_t v) { return blend(v, ratio, 0.0f); });
}

void adjust_contrast(RgbSpan img, double factor) {
  // The mean of the truncated grayscale image in float32: torch sums the floats (exact while the
  // sum stays below 2^24, as for any crop up to 256 × 256) and divides by the count.
  std::int64_t sum = 0;
  const std::size_t n = pixels(img);
  for (std::size_t i = 0; i < n; ++i) {
    sum += gray_of(img.data[3 * i], img.data[3 * i + 1], img.data[3 * i + 2]);
  }
  const float mean = static_cast<float>(sum) / static_cast<float>(n);
  const float other = static_cast<float>(1.0 - factor) * mean;
  const auto ratio = static_cast<float>(factor);
  map_values(img, [&](std::uint8_t v) { return blend(v, ratio, other); });
}

void adjust_saturation(RgbSpan img, double factor) {
  // (1 - ratio) in double from the double ratio, then float32, as Python and torch compute it.
  const float rest = static_cast<float>(1.0 - factor);
  const auto ratio = static_cast<float>(factor);
  const std::size_t n = pixels(img);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t* p = img.data + 3 * i;
    const float other = rest * static_cast<float>(gray_of(p[0], p[1], p[2]));
    for (int c = 0; c < 3; ++c) p[c] = blend(p[c], ratio, other);
  }
}

void adjust_hue(RgbSpan img, float hue_factor) {
  // NOTE: torchvision 0.15 and later (transforms.v2's kernels, which transforms.functional
  // also runs): _rgb_to_hsv and _hsv_to_rgb operation for operation, and the conversions with
  // scale: v / 255 in, × (255 + 1 - 1e-3) truncated out. torchvision 0.14 converted back with
  // a plain × 255, one less on most pixels.
  const float sixth = static_cast<float>(1.0 / 6.0);
  const std::size_t n = pixels(img);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t* px = img.data + 3 * i;
    const float r = static_cast<float>(px[0]) / 255.0f;
    const float g = static_cast<float>(px[1]) / 255.0f;
    const float b = static_cast<float>(px[2]) / 255.0f;
    const float maxc = std::max(std::max(r, g), b);
    const float minc = std::min(std::min(r, g), b);
    const bool eqc = maxc == minc;
    const float range = maxc - minc;
    const float s = range / (eqc ? 1.0f : maxc);
    const float divisor = eqc ? 1.0f : range;
    const float rc = (maxc - r) / divisor;
    const float gc = (maxc - g) / divisor;
    const float bc = (maxc - b) / divisor;
    const bool neq_r = maxc != r;
    const bool eq_g = maxc == g;
    const float hg = (eq_g && neq_r) ? (rc + 2.0f) - bc : 0.0f;
    const float hr = !neq_r ? bc - gc : 0.0f;
    const float hb = (neq_r && !eq_g) ? (gc + 4.0f) - rc : 0.0f;
    float h = std::fmod((hr + hg + hb) * sixth + 1.0f, 1.0f);
    const float v = maxc;
    // h.add_(hue_factor).remainder_(1.0): the remainder takes the divisor's sign.
    h = h + hue_factor;
    h = h - std::floor(h);
    const float h6 = h * 6.0f;
    const float fi = std::floor(h6);
    const float f = h6 - fi;
    int sector = static_cast<int>(fi) % 6;
    if (sector < 0) sector += 6;
    const float sxf = s * f;
    const float one_minus_s = 1.0f - s;
    const float q = std::clamp((1.0f - sxf) * v, 0.0f, 1.0f);
    const float t = std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f);
    const float p = std::clamp(one_minus_s * v, 0.0f, 1.0f);
    const float table[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
    for (int c = 0; c < 3; ++c) {
      px[c] = static_cast<std::uint8_t>(table[sector][c] * 255.999f);
    }
  }
}

namespace {

// _get_gaussian_kernel1d in float32: linspace(-(k-1)/2, (k-1)/2, k), exp(-0.5 (x / sigma)^2),
// divided by its sum.
std::vector<float> gaussian_kernel(int k, float sigma) {
  std::vector<float> w(static_cast<std::size_t>(k));
  const float half = static_cast<float>(k - 1) * 0.5f;
  float sum = 0;
  for (int i = 0; i < k; ++i) {
    const float x = -half + static_cast<float>(i);
    const float z = x / sigma;
    w[static_cast<std::size_t>(i)] = std::exp(-0.5f * (z * z));
    sum += w[static_cast<std::size_t>(i)];
  }
  for (float& v : w) v /= sum;
  return w;
}

// Reflect padding's source index (no edge repeat: -1 → 1), for |pad| < n.
inline int reflect(int i, int n) noexcept {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

}  // namespace

void gaussian_blur(RgbSpan img, int kx, int ky, float sigma_x, float sigma_y) {
  const std::vector<float> wx = gaussian_kernel(kx, sigma_x);
  const std::vector<float> wy = gaussian_kernel(ky, sigma_y);
  const int w = img.width;
  const int h = img.height;
  const int rx = kx / 2;
  const int ry = ky / 2;
  // NOTE: torchvision convolves with the 2-D outer product in float32; the separable passes
  // here accumulate in float too, so the sums differ only in rounding, which the final
  // round-to-nearest hides but for values within a rounding error of a half.
  // The horizontal pass over a float copy of each row with its reflected margins: tap by tap
  // over the whole row (a loop the compiler vectorises), each value summed in the same order
  // (taps left to right from 0) as a per-pixel loop, so the sums are the same to the bit.
  const std::size_t row_floats = static_cast<std::size_t>(w) * 3;
  thread_local std::vector<float> tmp;
  tmp.resize(row_floats * static_cast<std::size_t>(h));
  thread_local std::vector<float> padded;
  padded.resize(static_cast<std::size_t>(w + 2 * rx) * 3);
  for (int y = 0; y < h; ++y) {
    const std::uint8_t* row = img.data + static_cast<std::size_t>(y) * row_floats;
    for (int i = 0; i < w + 2 * rx; ++i) {
      const std::uint8_t* p = row + 3 * reflect(i - rx, w);
      for (int c = 0; c < 3; ++c) padded[static_cast<std::size_t>(3 * i + c)] = static_cast<float>(p[c]);
    }
    float* __restrict out = tmp.data() + static_cast<std::size_t>(y) * row_floats;
    std::fill(out, out + row_floats, 0.0f);
    for (int k = 0; k < kx; ++k) {
      const float wt = wx[static_cast<std::size_t>(k)];
      const float* __restrict src = padded.data() + 3 * k;
      for (std::size_t i = 0; i < row_floats; ++i) out[i] += wt * src[i];
    }
  }
  thread_local std::vector<float> acc;
  acc.resize(row_floats);
  for (int y = 0; y < h; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int t = -ry; t <= ry; ++t) {
      const float* src = tmp.data() + static_cast<std::size_t>(reflect(y + t, h)) * row_floats;
      const float wt = wy[static_cast<std::size_t>(t + ry)];
      for (std::size_t i = 0; i < row_floats; ++i) acc[i] += wt * src[i];
    }
    std::uint8_t* out = img.data + static_cast<std::size_t>(y) * row_floats;
    for (std::size_t i = 0; i < row_floats; ++i) {
      // torch.round: half to even, as nearbyint in the default rounding mode.
      out[i] = static_cast<std::uint8_t>(std::clamp(std::nearbyint(acc[i]), 0.0f, 255.0f));
    }
  }
}

void hflip_inplace(RgbSpan img) {
  for (int y = 0; y < img.height; ++y) {
    std::uint8_t* row = img.data + static_cast<std::size_t>(y) * img.width * 3;
    for (int a = 0, b = img.width - 1; a < b; ++a, --b) {
      for (int c = 0; c < 3; ++c) std::swap(row[3 * a + c], row[3 * b + c]);
    }
  }
}

void vflip_inplace(RgbSpan img) {
  const std::size_t bytes = static_cast<std::size_t>(img.width) * 3;
  for (int a = 0, b = img.height - 1; a < b; ++a, --b) {
    std::swap_ranges(img.data + a * bytes, img.data + (a + 1) * bytes, img.data + b * bytes);
  }
}

void grayscale_inplace(RgbSpan img) {
  const std::size_t n = pixels(img);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t* p = img.data + 3 * i;
    p[0] = p[1] = p[2] = gray_of(p[0], p[1], p[2]);
  }
}

}  // namespace coload::vision::detail

namespace coload::vision {

// ---- The public functional forms and op objects --------------------------------------------------------------------------------

Image vflip(const ImageView& src) {
  Image out = Image::zeros(src.width, src.height, src.channels);
  const auto row_bytes = static_cast<std::size_t>(src.width) * src.channels;
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, src.height - 1 - y), src.row(y), row_bytes);
  }
  return out;
}

Image rgb_to_grayscale(const ImageView& src, int num_output_channels) {
  if (num_output_channels != 1 && num_output_channels != 3) {
    throw InvalidArgument("num_output_channels should be either 1 or 3");
  }
  if (src.channels != 1 && src.channels != 3) {
    throw InvalidArgument(std::string("rgb_to_grayscale needs 1 or 3 channels, got ") +
                          std::to_string(src.channels));
  }
  Image out = Image::zeros(src.width, src.height, num_output_channels);
  for (int y = 0; y < src.height; ++y) {
    const std::uint8_t* in = src.row(y);
    for (int x = 0; x < src.width; ++x) {
      const std::uint8_t l =
          src.channels == 3 ? detail::gray_of(in[3 * x], in[3 * x + 1], in[3 * x + 2]) : in[x];
      std::memset(out.pixel(x, y), l, static_cast<std::size_t>(num_output_channels));
    }
  }
  return out;
}

bool RandomVerticalFlip::draw(at::Generator& gen) const {
  return detail::draw_unit(gen) < static_cast<float>(p);
}

Image RandomVerticalFlip::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return vflip(image.view());
  return image;
}

Image Grayscale::operator()(const Image& image) const {
  return rgb_to_grayscale(image.view(), num_output_channels);
}

bool RandomGrayscale::draw(at::Generator& gen) const {
  return detail::draw_unit(gen) < static_cast<float>(p);
}

Image RandomGrayscale::operator()(Image image, at::Generator& gen) const {
  if (draw(gen)) return rgb_to_grayscale(image.view(), image.channels);
  return image;
}

at::Tensor ToDtype::operator()(const at::Tensor& image) const {
  if (image.scalar_type() == dtype) return image;
  if (scale && image.scalar_type() == at::kByte && at::isFloatingType(dtype)) {
    // transforms.v2's arithmetic: times 1/255 (ToTensor divides by 255).
    return image.to(dtype).mul_(1.0 / 255.0);
  }
  if (scale && !(image.is_floating_point() && at::isFloatingType(dtype))) {
    throw InvalidArgument("ToDtype with scale supports uint8 or floating point to floating "
                          "point only");
  }
  return image.to(dtype);
}

namespace {

Image checked_copy(const ImageView& src, const char* what) {
  if (src.channels != 3) {
    throw InvalidArgument(std::string(what) + " needs an RGB image, got " +
                          std::to_string(src.channels) + " channels");
  }
  Image out = Image::zeros(src.width, src.height, 3);
  for (int y = 0; y < src.height; ++y) {
    std::memcpy(out.pixel(0, y), src.row(y), static_cast<std::size_t>(src.width) * 3);
  }
  return out;
}

detail::RgbSpan span_of(Image& img) { return {img.data.data(), img.width, img.height}; }

float draw_uniform(at::Generator& gen, double lo, double hi) {
  return detail::draw_uniform(lo, hi, gen);
}

}  // namespace

namespace {
// The public form of an adjustment with a non-negative factor: checked, on a copy.
Image adjusted(const ImageView& src, double factor, const char* name,
               void (*adjust)(detail::RgbSpan, double)) {
  if (!(factor >= 0)) {
    throw InvalidArgument(std::string(name) + "_factor (" + detail::py_float(factor) +
                          ") is not non-negative.");
  }
  Image out = checked_copy(src, name);
  adjust(span_of(out), factor);
  return out;
}
}  // namespace

Image adjust_brightness(const ImageView& src, double factor) {
  return adjusted(src, factor, "brightness", detail::adjust_brightness);
}

Image adjust_contrast(const ImageView& src, double factor) {
  return adjusted(src, factor, "contrast", detail::adjust_contrast);
}

Image adjust_saturation(const ImageView& src, double factor) {
  return adjusted(src, factor, "saturation", detail::adjust_saturation);
}

Image adjust_hue(const ImageView& src, double hue_factor) {
  if (!(hue_factor >= -0.5 && hue_factor <= 0.5)) {
    throw InvalidArgument("hue_factor (" + detail::py_float(hue_factor) + ") is not in [-0.5, 0.5].");
  }
  Image out = checked_copy(src, "adjust_hue");
  detail::adjust_hue(span_of(out), static_cast<float>(hue_factor));
  return out;
}

Image gaussian_blur(const ImageView& src, int kx, int ky, double sigma_x, double sigma_y) {
  if (kx <= 0 || kx % 2 == 0 || ky <= 0 || ky % 2 == 0) {
    throw InvalidArgument("kernel_size should have odd and positive integers. Got [" +
                          std::to_string(kx) + ", " + std::to_string(ky) + "]");
  }
  if (!(sigma_x > 0) || !(sigma_y > 0)) {
    throw InvalidArgument("sigma should have positive values.");
  }
  if (kx / 2 >= src.width || ky / 2 >= src.height) {
    throw InvalidArgument("gaussian_blur: the kernel's half (reflect padding) must be smaller "
                          "than the image");
  }
  Image out = checked_copy(src, "gaussian_blur");
  detail::gaussian_blur(span_of(out), kx, ky, static_cast<float>(sigma_x),
                        static_cast<float>(sigma_y));
  return out;
}

ColorJitter::Params ColorJitter::get_params(at::Generator& gen) const {
  Params params;
  const at::Tensor order = at::randperm(4, gen, at::kLong);
  for (int i = 0; i < 4; ++i) params.order[static_cast<std::size_t>(i)] = static_cast<int>(order[i].item<std::int64_t>());
  const double values[4] = {brightness, contrast, saturation, hue};
  for (std::size_t i = 0; i < 4; ++i) {
    params.factor[i] = NAN;
    if (values[i] == 0) continue;  // torchvision's None: nothing drawn
    const double lo = i == 3 ? -values[i] : std::max(0.0, 1.0 - values[i]);
    const double hi = i == 3 ? values[i] : 1.0 + values[i];
    params.factor[i] = draw_uniform(gen, lo, hi);
  }
  return params;
}

namespace detail {
void apply_jitter(RgbSpan img, const ColorJitter::Params& params) {
  for (const int fn : params.order) {
    const float f = params.factor[static_cast<std::size_t>(fn)];
    if (std::isnan(f)) continue;
    switch (fn) {
      case 0: adjust_brightness(img, f); break;
      case 1: adjust_contrast(img, f); break;
      case 2: adjust_saturation(img, f); break;
      default: adjust_hue(img, f); break;
    }
  }
}
}  // namespace detail

Image ColorJitter::apply(const ImageView& src, const Params& params) {
  Image out = checked_copy(src, "ColorJitter");
  detail::apply_jitter(span_of(out), params);
  return out;
}

Image ColorJitter::operator()(const Image& image, at::Generator& gen) const {
  return apply(image.view(), get_params(gen));
}

float GaussianBlur::get_params(at::Generator& gen) const {
  return draw_uniform(gen, sigma[0], sigma[1]);
}

Image GaussianBlur::operator()(const Image& image, at::Generator& gen) const {
  const float s = get_params(gen);
  return gaussian_blur(image.view(), kernel_x, kernel_y > 0 ? kernel_y : kernel_x, s, s);
}

std::optional<CropBox> RandomErasing::get_params(int height, int width, at::Generator& gen) const {
  // NOTE: torchvision's calls on the generator, as RandomResizedCrop::get_params makes them;
  // here h takes sqrt(area · ratio) and w sqrt(area / ratio), the other way round.
  const double area = static_cast<double>(height) * width;
  const auto [log_lo, log_hi] = detail::log_ratio(ratio);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * draw_uniform(gen, scale[0], scale[1]);
    const double aspect = detail::aten_exp(detail::draw_uniform(log_lo, log_hi, gen));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < height && w < width)) continue;
    const auto i = detail::draw_int(0, height - h + 1, gen);
    const auto j = detail::draw_int(0, width - w + 1, gen);
    return CropBox{static_cast<int>(i), static_cast<int>(j), h, w};
  }
  return std::nullopt;
}

std::array<int, 4> RandomCrop::padding_for(int image_height, int image_width) const noexcept {
  std::array<int, 4> pad = padding;  // left, top, right, bottom
  const int th = height;
  const int tw = width > 0 ? width : height;
  if (pad_if_needed) {
    const int ph = image_height + pad[1] + pad[3];
    const int pw = image_width + pad[0] + pad[2];
    if (ph < th) {
      pad[1] += th - ph;
      pad[3] += th - ph;
    }
    if (pw < tw) {
      pad[0] += tw - pw;
      pad[2] += tw - pw;
    }
  }
  return pad;
}

CropBox RandomCrop::get_params(int image_height, int image_width, at::Generator& gen) const {
  const auto pad = padding_for(image_height, image_width);
  const int th = height;
  const int tw = width > 0 ? width : height;
  const int ph = image_height + pad[1] + pad[3];
  const int pw = image_width + pad[0] + pad[2];
  if (ph < th || pw < tw) {
    const bool padded = padding != std::array<int, 4>{0, 0, 0, 0};
    throw InvalidArgument("Required crop size (" + std::to_string(th) + ", " + std::to_string(tw) +
                          ") is larger than " + (padded ? "padded " : "") + "input image size (" +
                          std::to_string(ph) + ", " + std::to_string(pw) + ").");
  }
  int top = 0;
  int left = 0;
  if (ph > th) top = static_cast<int>(detail::draw_int(0, ph - th + 1, gen));
  if (pw > tw) left = static_cast<int>(detail::draw_int(0, pw - tw + 1, gen));
  return CropBox{top, left, th, tw};
}

at::Tensor RandomErasing::operator()(const at::Tensor& image, at::Generator& gen) const {
  at::Tensor out = image.clone();
  if (!(detail::draw_unit(gen) < static_cast<float>(p))) return out;
  const auto box = get_params(static_cast<int>(image.size(-2)), static_cast<int>(image.size(-1)), gen);
  if (!box) return out;
  const at::Tensor v = at::tensor(value, at::kDouble).to(image.scalar_type()).view({-1, 1, 1});
  out.narrow(-2, box->top, box->height).narrow(-1, box->left, box->width).copy_(v.expand(
      {image.size(-3), box->height, box->width}));
  return out;
}

}  // namespace coload::vision
