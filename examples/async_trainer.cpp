// examples/async_trainer: a coroutine trainer, coload's native way to consume batches.
//
//   async_trainer [--epochs N] [--workers N] [--batch-size N] [--samples N]
//                 [--device cpu|cuda] [--json]
//
// Trains a 2-layer MLP on a synthetic classification set (labels from a fixed linear rule, so
// the loss visibly falls) inside a coload::Task, run to completion with coload::sync_wait.
// Prints, per epoch, the mean loss, the batches and samples/s. With --json, stdout is exactly
// one JSON line, {"samples_per_s": ..., "epochs": ..., "final_loss": ...}, so scripts can
// parse it; the per-epoch lines then go to stderr.

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
  bool json = false;
};

[[noreturn]] void usage(const char* argv0, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s [--epochs N] [--workers N] [--batch-size N] [--samples N]\n"
               "       [--device cpu|cuda] [--json]\n"
               "  --epochs N      passes over the data (default 2)\n"
               "  --workers N     loader worker threads, 0 fetches on the driver (default 2)\n"
               "  --batch-size N  samples per batch (default 256)\n"
               "  --samples N     synthetic dataset size (default 20000)\n"
               "  --device D      where to train: cpu (default); cuda is not available yet\n"
               "  --json          print one JSON line with the totals (epoch lines to stderr)\n",
               argv0);
  std::exit(rc);
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") usage(argv[0], 0);
    if (flag == "--json") {
      args.json = true;
      continue;
    }
    if (flag == "--device") {
      if (i + 1 == argc) usage(argv[0], 2);
      const std::string_view device = argv[++i];
      if (device == "cuda") {
        // Batches must reach the GPU through the loader's device stage (pinned staging and
        // copies overlapped with compute), which does not exist yet: refuse rather than fall
        // back to a slow synchronous .to(kCUDA) that would misrepresent the loader.
        std::fprintf(stderr,
                     "%s: --device cuda: the CUDA device stage of coload is not built yet; "
                     "use --device cpu\n",
                     argv[0]);
        std::exit(2);
      }
      if (device != "cpu") usage(argv[0], 2);
      continue;
    }
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

struct Totals {
  std::int64_t samples = 0;
  double seconds = 0;
  double final_loss = 0;
};

// The loader's type, named once: a TensorDataset with the default collate.
using Loader = coload::DataLoader<coload::TensorDataset>;

// Parameters are references: sync_wait keeps the caller's frame, and so these, alive until
// the task is done. A trainer that outlives its caller would take them by value instead.
coload::Task<void> train(Loader& loader, torch::nn::Sequential& model,
                         torch::optim::Optimizer& optimizer, std::int64_t epochs,
                         Totals& totals, std::FILE* log) {
  for (std::int64_t e = 1; e <= epochs; ++e) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::int64_t batches = 0, samples = 0;
    // next() suspends only when no batch is ready yet; under sync_wait this coroutine then
    // resumes on main's thread, so the model is only ever touched from one thread.
    auto epoch = loader.epoch();
    while (auto batch = co_await epoch.next()) {
      const auto& data = (*batch)[0];
      const auto& labels = (*batch)[1];
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
    const double mean_loss = loss_sum / static_cast<double>(samples);
    std::fprintf(log, "epoch %lld  loss %.4f  batches %lld  %.0f samples/s\n",
                 static_cast<long long>(e), mean_loss, static_cast<long long>(batches),
                 static_cast<double>(samples) / seconds);
    totals.samples += samples;
    totals.seconds += seconds;
    totals.final_loss = mean_loss;
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  torch::manual_seed(0);  // the same data and initial weights on every run

  // TensorDataset gathers a whole batch with one index_select per tensor, so each batch is
  // std::vector<at::Tensor>{data, labels} without a per-sample collate step.
  Loader loader(make_dataset(args.samples),
                {.batch_size = args.batch_size,
                 .shuffle = true,
                 .num_workers = static_cast<int>(args.workers),
                 .seed = 0});  // seeds the shuffle order too, so runs are reproducible

  torch::nn::Sequential model(torch::nn::Linear(kFeatures, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, kClasses));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  Totals totals;
  coload::sync_wait(train(loader, model, optimizer, args.epochs, totals,
                                args.json ? stderr : stdout));

  if (args.json) {
    std::printf("{\"samples_per_s\": %.1f, \"epochs\": %lld, \"final_loss\": %.6f}\n",
                static_cast<double>(totals.samples) / totals.seconds,
                static_cast<long long>(args.epochs), totals.final_loss);
  }
  return 0;
} catch (const std::exception& e) {
  // A failed fetch arrives here as a coload::WorkerError naming the worker, batch and sample.
  std::fprintf(stderr, "async_trainer: %s\n", e.what());
  return 1;
}
