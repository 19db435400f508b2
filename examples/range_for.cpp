// examples/range_for: the simplest way to train with coload, a plain range-for per epoch.
//
//   range_for [--epochs N] [--workers N] [--batch-size N] [--samples N]
//
// Trains a small MLP on a synthetic classification set and prints, per epoch, the mean loss,
// the batches and samples/s (the shared parts are in example_support.hpp).

#include <cstdio>
#include <exception>

#include "example_support.hpp"

int main(int argc, char** argv) try {
  const example::Args args = example::parse_args(
      argc, argv, "range_for: the simplest coload trainer, one range-for per epoch");
  auto loader = example::make_loader(args);
  example::Trainer trainer;
  for (std::int64_t epoch = 1; epoch <= args.epochs; ++epoch) {
    example::EpochMeter meter;
    // Each range-for over the loader is one epoch; the workers fetch ahead while we train.
    for (auto& batch : loader) meter.add(batch, trainer.train(batch));
    meter.print(stdout, epoch);
  }
  return 0;
} catch (const std::exception& e) {
  // A failed fetch arrives here as a coload::WorkerError naming the worker, batch and sample.
  std::fprintf(stderr, "range_for: %s\n", e.what());
  return 1;
}
