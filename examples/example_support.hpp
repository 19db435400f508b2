// The parts every example shares: flags, the synthetic dataset, the model and an epoch meter.
// Each example file shows only what differs between them: how it consumes the loader.
#pragma once

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
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

/// Adds an example's own flags to the parser.
using ExtraFlags = std::function<void(CLI::App&)>;

/// Parses the common flags with CLI11: `--help` prints them; an unknown flag, a bad number or a
/// count below 1 (workers: below 0) is named on stderr and exits 2.
inline Args parse_args(int argc, char** argv, const std::string& description,
                       const ExtraFlags& extra = {}) {
  Args args;
  CLI::App app{description};
  app.add_option("--epochs", args.epochs, "passes over the data")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--workers", args.workers,
                 "loader worker threads, 0 fetches on the driver")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1024}))
      ->capture_default_str();
  app.add_option("--batch-size", args.batch_size, "samples per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--samples", args.samples, "synthetic dataset size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  if (extra) extra(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
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
