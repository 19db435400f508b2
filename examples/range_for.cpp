// examples/range_for: the simplest way to train with coload, a plain range-for per epoch.
//
//   range_for [--epochs N] [--workers N] [--batch-size N] [--samples N]
//
// Trains a 2-layer MLP on a synthetic classification set (labels from a fixed linear rule, so
// the loss visibly falls) and prints, per epoch, the mean loss, the batches and samples/s.

#include <torch/torch.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "coload/coload.hpp"

namespace {

constexpr std::int64_t kFeatures = 32;
constexpr std::int64_t kClasses = 4;

struct Args {
  std::int64_t epochs = 2;
  std::int64_t workers = 2;
  std::int64_t batch_size = 256;
  std::int64_t samples = 20'000;
};

[[noreturn]] void usage(const char* argv0, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s [--epochs N] [--workers N] [--batch-size N] [--samples N]\n"
               "  --epochs N      passes over the data (default 2)\n"
               "  --workers N     loader worker threads, 0 fetches on the driver (default 2)\n"
               "  --batch-size N  samples per batch (default 256)\n"
               "  --samples N     synthetic dataset size (default 20000)\n",
               argv0);
  std::exit(rc);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") usage(argv[0], 0);
    std::int64_t* target = flag == "--epochs"       ? &args.epochs
                           : flag == "--workers"    ? &args.workers
                           : flag == "--batch-size" ? &args.batch_size
                           : flag == "--samples"    ? &args.samples
                                                    : nullptr;
    if (!target || i + 1 == argc) usage(argv[0], 2);
    const std::string_view value = argv[++i];
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *target);
    // Every count must be positive, except workers, where 0 means "no worker threads".
    const std::int64_t min = target == &args.workers ? 0 : 1;
    if (ec != std::errc{} || end != value.data() + value.size() || *target < min) {
      usage(argv[0], 2);
    }
  }
  return args;
}

// Features ~ N(0, 1); the label is the argmax of a fixed random projection, so a model can
// learn it exactly and the loss has somewhere to fall to.
coload::TensorDataset make_dataset(std::int64_t samples) {
  auto x = torch::randn({samples, kFeatures});
  auto projection = torch::randn({kFeatures, kClasses});
  auto y = x.matmul(projection).argmax(1);  // int64 class ids, what cross_entropy wants
  return coload::TensorDataset{x, y};
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  torch::manual_seed(0);  // the same data and initial weights on every run

  // TensorDataset gathers a whole batch with one index_select per tensor, so each batch is
  // std::vector<at::Tensor>{data, labels} without a per-sample collate step.
  auto loader = coload::make_data_loader(
      make_dataset(args.samples),
      {.batch_size = args.batch_size,
       .shuffle = true,
       .num_workers = static_cast<int>(args.workers),
       .seed = 0});  // seeds the shuffle order too, so runs are reproducible

  torch::nn::Sequential model(torch::nn::Linear(kFeatures, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, kClasses));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  for (std::int64_t epoch = 1; epoch <= args.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::int64_t batches = 0, samples = 0;
    // Each range-for over the loader is one epoch; the workers fetch ahead while we train.
    for (auto& batch : loader) {
      const auto& data = batch[0];
      const auto& labels = batch[1];
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(data), labels);
      loss.backward();
      optimizer.step();
      // Weight by batch size: the last batch may be short.
      loss_sum += loss.item<double>() * static_cast<double>(data.size(0));
      samples += data.size(0);
      ++batches;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %lld  loss %.4f  batches %lld  %.0f samples/s\n",
                static_cast<long long>(epoch), loss_sum / static_cast<double>(samples),
                static_cast<long long>(batches), static_cast<double>(samples) / seconds);
  }
  return 0;
} catch (const std::exception& e) {
  // A failed fetch arrives here as a coload::WorkerError naming the worker, batch and sample.
  std::fprintf(stderr, "range_for: %s\n", e.what());
  return 1;
}
