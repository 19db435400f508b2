// examples/asio_trainer: an asio::awaitable trainer consuming the loader with a completion
// token, for programs whose training loop already lives on an Asio io_context.
//
//   asio_trainer [--epochs N] [--workers N] [--batch-size N] [--samples N]
//
// loader.async_next(asio::use_awaitable) yields the next batch of the current epoch, or an
// empty optional at the end of each epoch; the next call then starts the following epoch.

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdio>
#include <exception>

#include "example_support.hpp"

namespace {

// References are safe here: main runs io.run() until this coroutine has finished.
asio::awaitable<void> train(example::Loader& loader, example::Trainer& trainer,
                            std::int64_t epochs) {
  for (std::int64_t epoch = 1; epoch <= epochs; ++epoch) {
    example::EpochMeter meter;
    // The handler runs on this io_context (the awaitable's executor), never on a loader thread.
    while (auto batch = co_await loader.async_next(asio::use_awaitable)) {
      meter.add(*batch, trainer.train(*batch));
    }
    meter.print(stdout, epoch);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const example::Args args = example::parse_args(
      argc, argv, "asio_trainer: an Asio coroutine trainer (co_spawn) over a coload loader");
  auto loader = example::make_loader(args);
  example::Trainer trainer;
  asio::io_context io;
  // The completion handler rethrows, so an error in training (a coload::WorkerError from a
  // failed fetch, say) leaves io.run() and reaches the catch below instead of vanishing.
  asio::co_spawn(io, train(loader, trainer, args.epochs), [](std::exception_ptr error) {
    if (error) std::rethrow_exception(error);
  });
  io.run();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "asio_trainer: %s\n", e.what());
  return 1;
}
