// The parts every example shares: flags, the synthetic dataset, the model and an epoch meter.
// Each example file shows only what differs between them: how it consumes the loader.
#pragma once

#include <torch/torch.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "coload/coload.hpp"

namespace example {

inline constexpr std::int64_t kFeatures = 32;
inline constexpr std::int64_t kClasses = 4;

struct Args {
  std::int64_t epochs = 2;
  std::int64_t workers = 2;
  std::int64_t batch_size = 256;
  std::int64_t samples = 20'000;
};

/// An example's own flag: returns true when it took `flag` (and its value, advancing `i`).
using ExtraFlag = std::function<bool(std::string_view flag, int& i, int argc, char** argv)>;

[[noreturn]] inline void usage(const char* argv0, const char* extra_usage, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s [--epochs N] [--workers N] [--batch-size N] [--samples N]%s\n"
               "  --epochs N      passes over the data (default 2)\n"
               "  --workers N     loader worker threads, 0 fetches on the driver (default 2)\n"
               "  --batch-size N  samples per batch (default 256)\n"
               "  --samples N     synthetic dataset size (default 20000)\n",
               argv0, extra_usage);
  std::exit(rc);
}

/// Parses the common flags; unknown flags, bad numbers or counts below 1 (workers: 0) exit 2.
inline Args parse_args(int argc, char** argv, const char* extra_usage = "",
                       const ExtraFlag& extra = {}) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") usage(argv[0], extra_usage, 0);
    if (extra && extra(flag, i, argc, argv)) continue;
    std::int64_t* target = flag == "--epochs"       ? &args.epochs
                           : flag == "--workers"    ? &args.workers
                           : flag == "--batch-size" ? &args.batch_size
                           : flag == "--samples"    ? &args.samples
                                                    : nullptr;
    if (!target || i + 1 == argc) usage(argv[0], extra_usage, 2);
    const std::string_view value = argv[++i];
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *target);
    const std::int64_t min = target == &args.workers ? 0 : 1;
    if (ec != std::errc{} || end != value.data() + value.size() || *target < min) {
      usage(argv[0], extra_usage, 2);
    }
  }
  return args;
}

/// The loader every example uses: a TensorDataset batched with one index_select per tensor,
/// so each batch is std::vector<at::Tensor>{data, labels}.
using Loader = coload::DataLoader<coload::TensorDataset>;

/// Features ~ N(0, 1); the label is the argmax of a fixed random projection, so a model can
/// learn it exactly and the loss has somewhere to fall to. Seeds the shuffle too.
///
/// With a CUDA `device`, batches are collated into pinned memory and copied to the GPU by
/// the loader's device stage; the loader refuses a device this machine or libtorch lacks.
inline Loader make_loader(const Args& args, std::optional<at::Device> device = std::nullopt) {
  torch::manual_seed(0);  // the same data and initial weights on every run
  auto x = torch::randn({args.samples, kFeatures});
  auto y = x.matmul(torch::randn({kFeatures, kClasses})).argmax(1);
  return Loader(coload::TensorDataset{x, y}, {.batch_size = args.batch_size,
                                               .shuffle = true,
                                               .num_workers = static_cast<int>(args.workers),
                                               .pin_memory = device.has_value(),
                                               .seed = 0,
                                               .device = device});
}

/// A 2-layer MLP with SGD: train(batch) takes one step and returns the batch's loss.
struct Trainer {
  torch::nn::Sequential model{torch::nn::Linear(kFeatures, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, kClasses)};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};

  double train(const std::vector<at::Tensor>& batch) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  }
};

/// Tallies one epoch: mean loss weighted by batch size (the last batch may be short),
/// batches and samples/s.
class EpochMeter {
 public:
  void add(const std::vector<at::Tensor>& batch, double loss) {
    const auto n = batch[0].size(0);
    loss_sum_ += loss * static_cast<double>(n);
    samples_ += n;
    ++batches_;
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double mean_loss() const { return loss_sum_ / static_cast<double>(samples_); }
  std::int64_t samples() const { return samples_; }
  void print(std::FILE* out, std::int64_t epoch) const {
    std::fprintf(out, "epoch %lld  loss %.4f  batches %lld  %.0f samples/s\n",
                 static_cast<long long>(epoch), mean_loss(), static_cast<long long>(batches_),
                 static_cast<double>(samples_) / seconds());
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double loss_sum_ = 0;
  std::int64_t samples_ = 0;
  std::int64_t batches_ = 0;
};

}  // namespace example
