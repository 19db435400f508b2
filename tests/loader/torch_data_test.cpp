// Specification of the torch::data adapter: a libtorch dataset loads through coload unchanged,
// and its torch::data::Example samples collate into an Example batch.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/example.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "../support/idx_files.hpp"
#include "coload/coload.hpp"

using namespace coload;
namespace fs = std::filesystem;

namespace {

/// A torch::data dataset as a libtorch user writes one: sample i is ([i, 10 i], i % 3).
struct Squares : torch::data::datasets::Dataset<Squares> {
  std::size_t n;
  explicit Squares(std::size_t n) : n(n) {}
  torch::data::Example<> get(std::size_t index) override {
    const auto i = static_cast<double>(index);
    return {at::tensor({i, 10 * i}, at::kFloat),
            at::scalar_tensor(static_cast<std::int64_t>(index % 3), at::kLong)};
  }
  torch::optional<std::size_t> size() const override { return n; }
};

/// A dataset of inputs only (torch::data::TensorExample).
struct Inputs : torch::data::datasets::Dataset<Inputs, torch::data::TensorExample> {
  torch::data::TensorExample get(std::size_t index) override {
    return {at::full({2}, static_cast<double>(index), at::kFloat)};
  }
  torch::optional<std::size_t> size() const override { return 5; }
};

/// A torch::data dataset that does not know its length.
struct Unsized : torch::data::datasets::Dataset<Unsized> {
  torch::data::Example<> get(std::size_t) override { return {at::zeros({1}), at::zeros({})}; }
  torch::optional<std::size_t> size() const override { return torch::nullopt; }
};

struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / ("coload_torch_data_test_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_SUITE("loader") {
  TEST_CASE("a torch::data dataset loads unchanged, in Example batches, with threads or none") {
    static_assert(TorchDataDataset<Squares> && !MapDataset<Squares>);
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader = make_data_loader(Squares(7), {.batch_size = 3, .num_workers = workers});
      static_assert(std::is_same_v<decltype(loader)::batch_type, torch::data::Example<>>);
      CHECK(loader.size() == 3);
      std::vector<std::int64_t> seen;
      std::int64_t batches = 0;
      for (torch::data::Example<>& batch : loader) {
        const auto b = batch.data.size(0);
        CHECK(batch.data.sizes() == at::IntArrayRef{b, 2});
        CHECK(batch.target.sizes() == at::IntArrayRef{b});
        CHECK((batch.target.scalar_type() == at::kLong));
        for (std::int64_t k = 0; k < b; ++k) {
          const auto i = static_cast<std::int64_t>(batch.data[k][0].item<float>());
          CHECK(batch.data[k][1].item<float>() == 10.0f * static_cast<float>(i));
          CHECK(batch.target[k].item<std::int64_t>() == i % 3);
          seen.push_back(i);
        }
        ++batches;
      }
      CHECK(batches == 3);
      CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
    }
  }

  TEST_CASE("a torch::data dataset shuffles with a seed and its length; unsized ones are refused") {
    auto a = make_data_loader(Squares(10), {.batch_size = 10, .shuffle = true, .seed = 7});
    auto b = make_data_loader(Squares(10), {.batch_size = 10, .shuffle = true, .seed = 7});
    const auto first = (*a.begin()).target;
    CHECK(first.equal((*b.begin()).target));
    // PyTorch's order for DataLoader(range(10), shuffle=True, generator=manual_seed(7)).
    const auto order = (*make_data_loader(Squares(10), {.batch_size = 10, .shuffle = true,
                                                        .seed = 7})
                             .begin())
                           .data.select(1, 0)
                           .to(at::kLong);
    CHECK(order.equal(at::tensor({1, 3, 5, 7, 9, 4, 6, 2, 8, 0}, at::kLong)));

    CHECK_THROWS_WITH_AS(make_data_loader(Unsized{}, {.batch_size = 2}),
                         doctest::Contains("torch::data dataset whose size() is empty"),
                         InvalidArgument);
  }

  TEST_CASE("torch::data TensorExample samples collate into a TensorExample batch") {
    auto loader = make_data_loader(Inputs{}, {.batch_size = 2});
    static_assert(std::is_same_v<decltype(loader)::batch_type, torch::data::TensorExample>);
    std::vector<at::Tensor> batches;
    for (auto& batch : loader) batches.push_back(batch.data);
    REQUIRE(batches.size() == 3);
    CHECK(batches[0].equal(at::tensor({0.0f, 0.0f, 1.0f, 1.0f}).reshape({2, 2})));
    CHECK(batches[2].equal(at::tensor({4.0f, 4.0f}).reshape({1, 2})));
  }

  TEST_CASE("libtorch's own torch::data::datasets::MNIST loads through coload, worker threads "
            "included") {
    // NOTE: libtorch's MNIST insists on the real counts: 10000 images in the test set.
    constexpr std::size_t n = 10000;
    TempDir dir;
    std::vector<std::uint8_t> labels(n);
    for (std::size_t k = 0; k < n; ++k) labels[k] = static_cast<std::uint8_t>(k * 7 % 10);
    test::write_plain(dir.path / "t10k-images-idx3-ubyte", test::images_file(n));
    test::write_plain(dir.path / "t10k-labels-idx1-ubyte", test::labels_file(labels));
    torch::data::datasets::MNIST mnist(dir.path.string(), torch::data::datasets::MNIST::Mode::kTest);
    REQUIRE(mnist.size().value() == n);

    auto loader = make_data_loader(mnist, {.batch_size = 512, .num_workers = 2});
    CHECK(loader.size() == 20);
    std::vector<at::Tensor> targets, pixels;
    for (torch::data::Example<>& batch : loader) {
      // libtorch's MNIST: float images in [0, 1], [B, 1, 28, 28]; int64 targets.
      CHECK(batch.data.sizes() == at::IntArrayRef{batch.target.size(0), 1, 28, 28});
      CHECK((batch.target.scalar_type() == at::kLong));
      targets.push_back(batch.target);
      pixels.push_back(batch.data.flatten(1).select(1, 100));
    }
    REQUIRE(targets.size() == 20);
    const auto k = at::arange(static_cast<std::int64_t>(n), at::kLong);
    CHECK(at::cat(targets).equal(k * 7 % 10));
    // Pixel 100 of every image, as the IDX file holds it, scaled as libtorch scales it.
    const auto expected = ((k * 31 + 100 * 7) % 256).to(at::kFloat) / 255;
    CHECK(at::cat(pixels).allclose(expected));
  }
}
