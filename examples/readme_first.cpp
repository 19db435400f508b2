// examples/readme_first: the README's first snippet, whole. The lines between the [readme]
// markers are the README's first code block, word for word (tests/examples/readme_snippets.py
// checks it), so the snippet compiles and runs as written.
// [readme]
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <coload/coload.hpp>

#include <cstdio>
#include <exception>

std::int64_t seen = 0;
void train_step(const at::Tensor& images, const at::Tensor& labels) {  // your model's step
  seen += images.size(0);
  (void)labels;
}

coload::Task<void> train(auto& loader) {                            // a coroutine trainer
  auto epoch = loader.epoch();
  while (auto batch = co_await epoch.next()) train_step((*batch)[0], (*batch)[1]);
}

asio::awaitable<void> train_asio(auto& loader) {                    // any Asio completion token
  while (auto batch = co_await loader.async_next(asio::use_awaitable)) {
    train_step((*batch)[0], (*batch)[1]);
  }
}

int main() {
  auto images = at::randn({1000, 3, 32, 32});
  auto labels = at::randint(10, {1000});
  auto loader = coload::make_data_loader(coload::TensorDataset{images, labels},
                                         {.batch_size = 64, .shuffle = true, .num_workers = 4,
                                          .seed = 0});

  for (auto& batch : loader) train_step(batch[0], batch[1]);          // a range-for is an epoch

  coload::sync_wait(train(loader));                                   // runs the coroutine

  asio::io_context io;                                                // runs the Asio one
  asio::co_spawn(io, train_asio(loader), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  io.run();
  std::printf("%lld samples in 3 epochs\n", static_cast<long long>(seen));
}
// [/readme]
