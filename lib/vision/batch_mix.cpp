// vision/batch_mix: a recipe's batch op, MixUp or CutMix (or a RandomChoice of them), drawn and
// applied as torchvision.transforms.v2 does on a collated batch, with one-hot soft labels.

#include "coload/core/error.hpp"
#include "coload/vision/recipe.hpp"

#include "recipe_plan.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace coload::vision {
namespace {

// MixUp on a contiguous float batch, in place: row i becomes x[i]·lam + x[i-1]·(1 - lam) (row
// 0 takes the last row), the floats of torchvision's roll, mul_ and add_ (each product rounded
// in float, then their sum), without the batch-sized copy roll allocates (a 64 × 3 × 176²
// batch is 24 MB: a fresh mapping, page faults and four passes over it, each batch). Rows go
// from the last down, so each reads its predecessor unchanged; the last row is kept for row 0.
void mixup_in_place(at::Tensor& images, double lam) {
  const std::int64_t n = images.size(0);
  if (n == 0) return;
  const std::int64_t row = images.numel() / n;
  float* x = images.data_ptr<float>();
  const auto a = static_cast<float>(lam);
  const auto b = static_cast<float>(1.0 - lam);
  const std::vector<float> last(x + (n - 1) * row, x + n * row);
  const auto mix = [&](float* out, const float* prev) {
    for (std::int64_t k = 0; k < row; ++k) {
      const float p = out[k] * a;
      const float q = prev[k] * b;
      out[k] = p + q;  // ISO C++ (-std=c++20) does not contract this into an FMA
    }
  };
  for (std::int64_t i = n - 1; i >= 1; --i) mix(x + i * row, x + (i - 1) * row);
  mix(x, last.data());
}

// CutMix on a contiguous float batch, in place: the box of row i becomes row i-1's (row 0 takes
// the last row's), as `box.copy_(box.roll(1, 0))` does, without the box-sized copy.
void cutmix_in_place(at::Tensor& images, const BatchMixParams& p) {
  const std::int64_t n = images.size(0);
  if (n == 0) return;
  const std::int64_t channels = images.size(1);
  const std::int64_t height = images.size(2);
  const std::int64_t width = images.size(3);
  const std::int64_t y1 = std::clamp<std::int64_t>(p.y1, 0, height);
  const std::int64_t y2 = std::clamp<std::int64_t>(p.y2, y1, height);
  const std::int64_t x1 = std::clamp<std::int64_t>(p.x1, 0, width);
  const std::int64_t x2 = std::clamp<std::int64_t>(p.x2, x1, width);
  const std::int64_t span = x2 - x1;
  if (span == 0 || y2 == y1) return;
  float* x = images.data_ptr<float>();
  const std::int64_t image = channels * height * width;
  // Hands `f` each line of row `i`'s box (every channel, every row of the box), in one order.
  const auto each_line = [&](std::int64_t i, auto&& f) {
    for (std::int64_t c = 0; c < channels; ++c) {
      for (std::int64_t y = y1; y < y2; ++y) f(x + i * image + (c * height + y) * width + x1);
    }
  };
  std::vector<float> saved;
  saved.reserve(static_cast<std::size_t>(channels * (y2 - y1) * span));
  each_line(n - 1, [&](const float* line) { saved.insert(saved.end(), line, line + span); });
  for (std::int64_t i = n - 1; i >= 1; --i) {
    // The same line of the row before, which is still its own (rows go from the last down).
    each_line(i, [&](float* line) { std::memcpy(line, line - image, span * sizeof(float)); });
  }
  const float* next = saved.data();
  each_line(0, [&](float* line) {
    std::memcpy(line, next, span * sizeof(float));
    next += span;
  });
}

}  // namespace

at::Tensor apply_batch_mix(at::Tensor& images, const at::Tensor& labels, int num_classes,
                           const BatchMixParams& params) {
  if (images.dim() != 4 || !images.is_floating_point() || labels.dim() != 1 ||
      labels.size(0) != images.size(0)) {
    throw InvalidArgument("MixUp/CutMix: expected float images [N, C, H, W] and labels [N]");
  }
  const at::Tensor long_labels = labels.to(at::kLong);
  const auto* l = long_labels.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < long_labels.numel(); ++i) {
    if (l[i] < 0 || l[i] >= num_classes) {
      throw InvalidArgument("MixUp/CutMix: label " + std::to_string(l[i]) + " of batch row " +
                            std::to_string(i) + " is not in [0, " + std::to_string(num_classes) +
                            ") (num_classes)");
    }
  }
  // NOTE: torchvision's expressions, in its order: rolled · (1 - lam) + x · lam; the sum's two
  // products are each rounded, so adding them the other way round gives the same floats.
  if (params.op == 0) {
    if (images.scalar_type() == at::kFloat && images.is_contiguous()) {
      mixup_in_place(images, params.lam);
    } else {
      at::Tensor rolled = images.roll(1, 0).mul_(1.0 - params.lam);
      images.mul_(params.lam).add_(rolled);
    }
  } else if (params.x2 > params.x1 && params.y2 > params.y1) {
    if (images.scalar_type() == at::kFloat && images.is_contiguous()) {
      cutmix_in_place(images, params);
    } else {
      at::Tensor box = images.narrow(2, params.y1, params.y2 - params.y1)
                           .narrow(3, params.x1, params.x2 - params.x1);
      box.copy_(box.roll(1, 0));
    }
  }
  const at::Tensor one_hot = at::one_hot(long_labels, num_classes).to(at::kFloat);
  return one_hot.roll(1, 0).mul_(1.0 - params.lam).add_(one_hot.mul(params.lam));
}

bool Recipe::has_batch_op() const noexcept { return !plan_->batch_steps.empty(); }

namespace {
// sample_batch's draw; `choice` is the drawn op's place in the plan's batch ops (params.op is
// its kind, MixUp or CutMix, which differs for MixUp alone, CutMix alone or a reordered
// RandomChoice).
BatchMixParams draw_batch_op(const Recipe::Plan& plan, int height, int width, at::Generator& gen,
                             std::size_t& choice) {
  BatchMixParams params;
  choice = 0;
  if (plan.batch_ops.empty()) return params;
  if (!plan.batch_p.empty()) {
    // RandomChoice: `torch.multinomial(torch.tensor(p), 1)` over the normalised weights.
    double total = 0;
    for (double w : plan.batch_p) total += w;
    std::vector<float> p;
    for (double w : plan.batch_p) p.push_back(static_cast<float>(w / total));
    choice = static_cast<std::size_t>(
        at::multinomial(at::tensor(p, at::kFloat), 1, false, gen).item<std::int64_t>());
  }
  const auto& op = plan.batch_ops[choice];
  const double alpha = std::visit([](const auto& m) { return m.alpha; }, op);
  // `float(Beta(tensor([alpha]), tensor([alpha])).sample(()))`: Beta samples a Dirichlet of
  // concentration [alpha, alpha] and keeps its first component.
  const at::Tensor concentration =
      at::full({1, 2}, static_cast<float>(alpha), at::TensorOptions().dtype(at::kFloat));
  const double lam = at::_sample_dirichlet(concentration, gen)[0][0].item<float>();
  params.op = static_cast<int>(op.index());
  params.lam = lam;
  if (params.op == 1) {
    const auto r_x = at::randint(width, {1}, gen).item<std::int64_t>();
    const auto r_y = at::randint(height, {1}, gen).item<std::int64_t>();
    const double r = 0.5 * std::sqrt(1.0 - lam);
    const auto r_w_half = static_cast<std::int64_t>(r * width);
    const auto r_h_half = static_cast<std::int64_t>(r * height);
    params.x1 = static_cast<int>(std::max<std::int64_t>(r_x - r_w_half, 0));
    params.y1 = static_cast<int>(std::max<std::int64_t>(r_y - r_h_half, 0));
    params.x2 = static_cast<int>(std::min<std::int64_t>(r_x + r_w_half, width));
    params.y2 = static_cast<int>(std::min<std::int64_t>(r_y + r_h_half, height));
    params.lam = 1.0 - static_cast<double>(params.x2 - params.x1) * (params.y2 - params.y1) /
                           (static_cast<double>(width) * height);
  }
  return params;
}
}  // namespace

BatchMixParams Recipe::sample_batch(int height, int width, at::Generator& gen) const {
  std::size_t choice = 0;
  return draw_batch_op(*plan_, height, width, gen, choice);
}

at::Tensor Recipe::mix_batch(at::Tensor& images, const at::Tensor& labels, int num_classes,
                             at::Generator& gen) const {
  const Plan& plan = *plan_;
  if (plan.batch_ops.empty()) return labels;
  std::size_t choice = 0;
  const BatchMixParams params = draw_batch_op(plan, static_cast<int>(images.size(2)),
                                              static_cast<int>(images.size(3)), gen, choice);
  const int own = std::visit([](const auto& m) { return m.num_classes; }, plan.batch_ops[choice]);
  const int classes = own > 0 ? own : num_classes;
  if (classes <= 0) {
    throw InvalidArgument("MixUp/CutMix: num_classes is 0 and the pipeline knows no class count: "
                          "give the op its num_classes");
  }
  return apply_batch_mix(images, labels, classes, params);
}

at::Tensor Recipe::run_batch_ops(at::Tensor& images, at::Tensor labels, int num_classes,
                                 std::uint64_t seed, std::int64_t epoch,
                                 std::int64_t batch) const {
  const Plan& plan = *plan_;
  const std::int64_t n = images.size(0);
  for (const Plan::BatchStep& step : plan.batch_steps) {
    if (!step.custom) {
      at::Generator gen = batch_generator(seed, epoch, batch);
      labels = mix_batch(images, labels, num_classes, gen);
      continue;
    }
    const std::string who = "Recipe: op " + std::to_string(step.op) + " (CustomBatch '" +
                            step.custom->name + "') on batch " + std::to_string(batch);
    // A stream of its own per op: a function of (seed, epoch, batch, the op's position).
    Rng rng = Rng::for_sample(seed ^ (0x637573746f6d6261ULL + 0x9e3779b97f4a7c15ULL * step.op),
                              epoch, batch);
    try {
      step.custom->fn(images, labels, rng);
    } catch (const std::exception& e) {
      throw RuntimeError(who + " failed: " + e.what());
    } catch (...) {
      throw RuntimeError(who + " failed: it threw something that is not a std::exception");
    }
    if (!images.defined() || images.dim() != 4 || images.size(0) != n ||
        images.scalar_type() != at::kFloat || !labels.defined() || labels.dim() < 1 ||
        labels.size(0) != n) {
      throw RuntimeError(who + ": left images or labels of the wrong shape (images must stay "
                         "float32 [" + std::to_string(n) + ", C, H, W], labels [" +
                         std::to_string(n) + ", ...])");
    }
  }
  return labels;
}

at::Generator Recipe::batch_generator(std::uint64_t seed, std::int64_t epoch, std::int64_t batch) {
  // A stream apart from every sample's: the seed is mixed with a constant of its own.
  Rng rng = Rng::for_sample(seed ^ 0x62617463686d6978ULL, epoch, batch);
  return rng.torch_generator();
}

namespace detail {
std::pair<at::Tensor, at::Tensor> finish_batch(const FusedTransform& t, const BatchContext& ctx,
                                               at::Tensor images, at::Tensor labels,
                                               const std::vector<std::int64_t>& keep,
                                               std::int64_t n, int num_classes) {
  if (static_cast<std::int64_t>(keep.size()) != n) {
    // NOTE: with skipped samples the batch shrinks; one copy of the rows that loaded.
    const at::Tensor rows_kept = at::tensor(keep, at::kLong);
    images = images.index_select(0, rows_kept);
    labels = labels.index_select(0, rows_kept);
  }
  // A recipe's batch ops (MixUp/CutMix, a user's): on the collated batch, drawing from the
  // batch's own generator.
  if (const auto* recipe = std::get_if<Recipe>(&t); recipe && recipe->has_batch_op()) {
    labels = recipe->run_batch_ops(images, std::move(labels), num_classes, ctx.seed, ctx.epoch,
                                   ctx.batch);
  }
  return {std::move(images), std::move(labels)};
}
}  // namespace detail

}  // namespace coload::vision
