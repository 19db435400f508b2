// examples/async_trainer: a coroutine trainer, coload's native way to consume batches.
//
//   async_trainer [--epochs N] [--workers N] [--batch-size N] [--samples N]
//                 [--device cpu|cuda] [--json]
//
// Trains a small MLP inside a coload::Task run with coload::sync_wait and prints, per epoch,
// the mean loss, the batches and samples/s. With --json, stdout is exactly one JSON line,
// {"samples_per_s": ..., "epochs": ..., "final_loss": ...}; the epoch lines go to stderr.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "example_support.hpp"

namespace {

struct Totals {
  std::int64_t samples = 0;
  double seconds = 0;
  double final_loss = 0;
};

// Parameters are references: sync_wait keeps the caller's frame, and so these, alive until
// the task is done. A trainer that outlives its caller would take them by value instead.
coload::Task<void> train(example::Loader& loader, example::Trainer& trainer,
                         std::int64_t epochs, bool on_device, Totals& totals, std::FILE* log) {
  for (std::int64_t e = 1; e <= epochs; ++e) {
    example::EpochMeter meter;
    // next() suspends only when no batch is ready yet; under sync_wait this coroutine then
    // resumes on main's thread, so the model is only ever touched from one thread.
    auto epoch = loader.epoch();
    while (auto batch = co_await epoch.next()) {
      // On the GPU, the batch arrives once its copy is done. Handing it to the stream the
      // model runs on (libtorch's default stream) makes its memory be freed after that
      // stream's work on it, not on coload's copy stream.
      if (on_device) coload::device_batch(*batch).wait(coload::DeviceStream{});
      meter.add(*batch, trainer.train(*batch));
    }
    meter.print(log, e);
    totals.samples += meter.samples();
    totals.seconds += meter.seconds();
    totals.final_loss = meter.mean_loss();
  }
}

}  // namespace

int main(int argc, char** argv) try {
  bool json = false;
  std::string device_name = "cpu";
  const example::Args args = example::parse_args(
      argc, argv, "async_trainer: a coroutine trainer over a coload loader", [&](CLI::App& app) {
        app.add_option("--device", device_name, "where the batches go")
            ->check(CLI::IsMember({"cpu", "cuda"}))
            ->capture_default_str();
        app.add_flag("--json", json, "stdout: one JSON line with the totals");
      });
  const bool cuda = device_name == "cuda";
  // --device cuda: the loader's device stage copies each pinned batch to the GPU on its own
  // stream (refused at construction, saying why, where libtorch or the machine has no CUDA).
  std::optional<at::Device> device;
  if (cuda) device = at::Device(at::kCUDA, 0);
  auto loader = example::make_loader(args, device);
  example::Trainer trainer;
  if (device) trainer.model->to(*device);
  Totals totals;
  coload::sync_wait(
      train(loader, trainer, args.epochs, cuda, totals, json ? stderr : stdout));
  if (json) {
    const nlohmann::json line{
        {"samples_per_s", static_cast<double>(totals.samples) / totals.seconds},
        {"epochs", args.epochs},
        {"final_loss", totals.final_loss}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
} catch (const std::exception& e) {
  // A failed fetch arrives here as a coload::WorkerError naming the worker, batch and sample.
  std::fprintf(stderr, "async_trainer: %s\n", e.what());
  return 1;
}
