// examples/readme_first: the README's custom-dataset snippet and its three ways to consume an
// epoch, whole. The lines between each pair of [readme:NAME] markers are a code block of the
// README, word for word, and the two blocks one after the other are this program
// (tests/examples/readme_snippets.py checks both and runs it), so the snippets compile and run
// as written.
// [readme:dataset]
#include <coload/coload.hpp>

// A map-style dataset: size() and get(index). ctx.rng is the sample's own random stream, a
// function of (seed, epoch, index) alone, so an augmentation is the same on every worker.
struct Waves {
  std::int64_t size() const { return 1000; }
  std::pair<at::Tensor, std::int64_t> get(coload::Index i, coload::SampleContext& ctx) const {
    const std::int64_t label = i % 10;
    const double phase = 6.28 * ctx.rng.uniform();  // a random shift: the augmentation
    auto wave = at::sin(at::arange(32, at::kFloat) * 0.1 * static_cast<double>(label + 1) + phase);
    return {wave, label};  // collated into {float [B, 32], int64 [B]}
  }
};
// [/readme:dataset]
// [readme:epoch]
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdio>
#include <exception>

std::int64_t seen = 0;
void train_step(const at::Tensor& x, const at::Tensor& /*y*/) { seen += x.size(0); }  // a model

coload::Task<void> train(auto& loader) {                      // 1. co_await, in a coroutine
  auto epoch = loader.epoch();
  while (auto batch = co_await epoch.next()) train_step(batch->first, batch->second);
}

asio::awaitable<void> train_asio(auto& loader) {              // 3. any Asio completion token
  while (auto batch = co_await loader.async_next(asio::use_awaitable)) {
    train_step(batch->first, batch->second);
  }
}

int main() {
  auto loader = coload::make_data_loader(
      Waves{}, {.batch_size = 64, .shuffle = true, .num_workers = 4, .seed = 0});

  coload::sync_wait(train(loader));                           // runs the coroutine: an epoch

  for (auto& [x, y] : loader) train_step(x, y);               // 2. a range-for is an epoch

  asio::io_context io;                                        // runs the Asio one: an epoch
  asio::co_spawn(io, train_asio(loader), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
  std::printf("%lld samples in 3 epochs\n", static_cast<long long>(seen));
}
// [/readme:epoch]
