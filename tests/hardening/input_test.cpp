// hardening: bad input costs nothing. Decompression bombs are refused by every decode path
// before anything is allocated (peak RSS measured in a fresh process); the bad-input matrix of
// an image folder names each file; state files are input; and fuzz smoke tests (fixed seeds,
// a fixed number of inputs) of LoaderState::parse, wire::decode and the JPEG and PNG header paths.

#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "coload/coload.hpp"
#include "coload/shards/tar.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/transforms.hpp"
#include "../vision/image_test_support.hpp"
#include "support.hpp"

extern char** environ;

using namespace coload;
namespace fs = std::filesystem;
namespace vt = coload::vision::test;
using vision::DecompressionBombError;

namespace coload::hardening {

/// The bomb folder: class `a` holding one good JPEG, a JPEG bomb and a PNG bomb.
void write_bomb_folder(const fs::path& root) {
  fs::create_directories(root / "a");
  vt::write_bytes(root / "a/0_good.jpg", vt::synthetic_jpeg(64, 48, 1));
  vt::write_bytes(root / "a/1_bomb.jpg", vt::bomb_jpeg(60000, 60000));
  vt::write_bytes(root / "a/2_bomb.png", vt::bomb_png(60000, 60000));
}

/// The child's side of the bomb test: every decode path over the bombs in `root`; 0 when each
/// refused them by name, else the number of paths that did not.
int decode_bombs(const fs::path& root) {
  int failures = 0;
  auto expect_bomb = [&](const char* what, auto&& f) {
    try {
      f();
      std::fprintf(stderr, "%s accepted a bomb\n", what);
      ++failures;
    } catch (const DecompressionBombError& e) {
      if (std::string(e.what()).find("60000x60000") == std::string::npos) ++failures;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", what, e.what());
      ++failures;
    }
  };
  for (const char* name : {"a/1_bomb.jpg", "a/2_bomb.png"}) {
    const fs::path path = root / name;
    const auto bytes = vt::read_bytes(path);
    const auto data = vision::as_bytes_span(bytes);
    for (int d : {1, 2, 4, 8}) expect_bomb("decode", [&] { (void)vision::decode(data, d); });
    expect_bomb("decode_file", [&] { (void)vision::decode_file(path); });
    expect_bomb("DefaultImageLoader", [&] { (void)vision::DefaultImageLoader{}(path.string()); });
    for (int d : {1, 8}) {
      expect_bomb("decode_resized_crop", [&] {
        (void)vision::decode_resized_crop(data, vision::CropBox{0, 0, 30000, 30000}, 224, 224, d);
      });
    }
    std::vector<float> out(3 * 224 * 224);
    for (bool dct : {true, false}) {
      expect_bomb("TrainTransform", [&] {
        at::Generator gen = at::detail::createCPUGenerator(1);
        vision::TrainTransform{.dct_scaling = dct}(data, gen, out.data());
      });
      expect_bomb("EvalTransform",
                  [&] { vision::EvalTransform{.dct_scaling = dct}(data, out.data()); });
    }
  }
  // Through a loader, with on_error = skip: both bombs are counted and left out.
  {
    auto loader = make_data_loader(vision::ImagePipeline(root, vision::TrainTransform{}),
                                   {.batch_size = 3, .num_workers = 2, .on_error = OnError::skip});
    std::int64_t images = 0;
    for (auto& [x, y] : loader) images += x.size(0);
    if (images != 1 || loader.skipped() != 2) ++failures;
  }
  {
    auto loader = make_data_loader(vision::ImageFolder<>(root),
                                   {.batch_size = 1, .num_workers = 2, .on_error = OnError::skip});
    std::int64_t images = 0;
    for ([[maybe_unused]] auto& sample : loader) ++images;
    if (images != 1 || loader.skipped() != 2) ++failures;
  }
  return failures;
}

}  // namespace coload::hardening

TEST_SUITE("hardening") {

TEST_CASE("bombs: a 1 KB JPEG or PNG declaring 60000x60000 is refused by every decode path "
          "with a peak RSS under 300 MB") {
  vt::TempDir dir;
  hardening::write_bomb_folder(dir.path());
  CHECK(fs::file_size(dir / "a/1_bomb.jpg") < 1024);
  CHECK(fs::file_size(dir / "a/2_bomb.png") < 1024);
  // A fresh process, so that its peak RSS is the decode paths' (plus libtorch's own).
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string root = dir.path().string();
  const char* argv[] = {self.c_str(), "--decode-bombs", root.c_str(), nullptr};
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, self.c_str(), nullptr, nullptr, const_cast<char**>(argv),
                        environ) == 0);
  int status = 0;
  rusage usage{};
  REQUIRE(::wait4(pid, &status, 0, &usage) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const double peak_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;
  MESSAGE("peak RSS of every decode path over both bombs: " << peak_mb << " MB");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // ASan's shadow memory and quarantine come on top (about 420 MB here; TSan's shadow about
  // 390 MB); the 300 MB bound is the plain build's. Either is far below the 10 GB a bomb would take.
  CHECK(peak_mb < 600);
#else
  CHECK(peak_mb < 300);
#endif
}

TEST_CASE("the bad-input matrix: each bad file of an image folder is named, costs nothing "
          "else, and on_error = skip counts it") {
  vt::TempDir dir;
  const fs::path a = dir / "a";
  fs::create_directories(a);
  const auto jpeg = vt::synthetic_jpeg(64, 48, 2);
  vt::write_bytes(a / "00_good.jpg", jpeg);
  std::vector<std::uint8_t> corrupt = {0xff, 0xd8, 0xff};
  for (int i = 0; i < 300; ++i) corrupt.push_back(static_cast<std::uint8_t>(i * 37 + 11));
  vt::write_bytes(a / "01_corrupt.jpg", corrupt);
  vt::write_bytes(a / "02_truncated.jpg", std::vector<std::byte>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  vt::write_bytes(a / "03_empty.jpg", std::string());
  REQUIRE(::mkfifo((a / "04_fifo.jpg").c_str(), 0600) == 0);
  fs::create_symlink(dir / "nowhere.jpg", a / "05_dangling.jpg");
  vt::write_bytes(a / "06_deleted.jpg", jpeg);
  fs::create_symlink("/dev/zero", a / "07_dev_zero.jpg");
  vt::write_bytes(a / "08_bomb.jpg", vt::bomb_jpeg(60000, 60000));
  vt::write_bytes(a / "09_bomb.png", vt::bomb_png(60000, 60000));
  vt::write_bytes(a / "10_not_an_image.jpg", std::string("hello"));
  const vision::FolderIndex index =
      vision::index_folder(dir.path(), {.extensions = std::vector<std::string>{".jpg", ".png"}});
  REQUIRE(index.samples.size() == 11);
  fs::remove(a / "06_deleted.jpg");
  const std::int64_t bad = 10;

  for (const bool fused : {true, false}) {
    CAPTURE(fused);
    std::vector<std::string> errors(11);
    auto note = [&](const WorkerError& e) {
      REQUIRE(e.index() >= 1);
      errors[static_cast<std::size_t>(e.index())] = e.what();
    };
    std::int64_t good = 0;
    if (fused) {
      auto loader = make_data_loader(vision::ImagePipeline(index, vision::EvalTransform{}),
                                     {.batch_size = 1, .num_workers = 2});
      auto epoch = loader.epoch();
      for (;;) {
        try {
          if (!sync_wait(epoch.next())) break;
          ++good;
        } catch (const WorkerError& e) {
          note(e);
        }
      }
    } else {
      auto loader = make_data_loader(
          vision::DatasetFolder<vision::DefaultImageLoader>(vision::FolderIndex(index),
                                                            vision::DefaultImageLoader{}),
          {.batch_size = 1, .num_workers = 2});
      auto epoch = loader.epoch();
      for (;;) {
        try {
          if (!sync_wait(epoch.next())) break;
          ++good;
        } catch (const WorkerError& e) {
          note(e);
        }
      }
    }
    CHECK(good == 1);
    for (std::size_t i = 1; i < errors.size(); ++i) {
      const std::string& path = index.samples[i].path;
      CAPTURE(path);
      CHECK(errors[i].find(path) != std::string::npos);
      CHECK(errors[i].find("sample " + std::to_string(i) + " of batch " + std::to_string(i)) !=
            std::string::npos);
      MESSAGE(std::string(fused ? "ImagePipeline" : "ImageFolder") << " row " << fs::path(path).filename()
                                                        << ": " << errors[i]);
    }
    CHECK(errors[8].find("image size 60000x60000") != std::string::npos);
    CHECK(errors[9].find("image size 60000x60000") != std::string::npos);
  }
  // on_error = skip: every bad file counted, the good one delivered.
  auto loader = make_data_loader(vision::ImagePipeline(index, vision::EvalTransform{}),
                                 {.batch_size = 4, .num_workers = 2, .on_error = OnError::skip});
  std::int64_t images = 0;
  {
    hardening::Warnings quiet;
    for (auto& [x, y] : loader) images += x.size(0);
  }
  CHECK(images == 1);
  CHECK(loader.skipped() == bad);
}

TEST_CASE("state files are input: /dev/zero, a FIFO, a folder, 10 MB and garbage fail at once "
          "naming the path") {
  vt::TempDir dir;
  struct Dataset {
    std::int64_t size() const { return 10; }
    std::int64_t get(Index i) const { return i; }
  };
  auto loader = make_data_loader(Dataset{}, {.batch_size = 2});
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  {
    std::ofstream big(dir / "big.state");
    big << loader.state().to_string();
  }
  fs::resize_file(dir / "big.state", 10 << 20);
  vt::write_bytes(dir / "garbage.state", std::string("\x01\x02garbage\n", 10));
  // The scale of the bound below: loading a good state file, in this run. A refusal must not
  // wait for a FIFO's writer nor read /dev/zero or the 10 MiB file to the end.
  vt::write_bytes(dir / "good.state", loader.state().to_string());
  const double good = hardening::timed([&] { loader.load_state(dir / "good.state"); });
  for (const fs::path& p : {fs::path("/dev/zero"), dir / "fifo", dir.path(), dir / "big.state",
                            dir / "garbage.state", dir / "missing.state"}) {
    CAPTURE(p);
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      loader.load_state(p);
      FAIL("loaded");
    } catch (const coload::Error& e) {
      what = e.what();
    }
    CHECK(hardening::seconds_since(t0) < hardening::prompt(good));
    CHECK(what.find(p.string()) != std::string::npos);
    MESSAGE("load_state(" << p.filename() << "): " << what);
  }
}

TEST_CASE("fuzz: LoaderState::parse refuses mutated states with InvalidArgument, and what it "
          "accepts round-trips") {
  LoaderState s;
  s.epoch = 3;
  s.delivered = 7;
  s.beyond = {9, 12};
  s.generator = {1, 2, 3, 250};
  s.dataset_size = 100;
  s.batch_size = 8;
  s.seed = 42;
  s.stream_workers = 2;
  s.last_stream = 1;
  s.streams = {{0, 3, std::string("ab")}, {1, 4, std::nullopt}};
  const std::string base = s.to_string();
  std::mt19937_64 rng(20261124);
  const char* tokens[] = {"-1", "9223372036854775807", "18446744073709551616", "0", " ", "\n",
                          "epoch", "stream", "beyond", "9007199254740993", "x", "-"};
  int accepted = 0, refused = 0;
  // A fixed number of inputs, whatever the machine's speed, so that the coverage is too.
  constexpr int inputs = 20000;
  for (int iter = 0; iter < inputs; ++iter) {
    std::string t = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const std::size_t at = t.empty() ? 0 : rng() % t.size();
      switch (rng() % 4) {
        case 0: if (!t.empty()) t[at] = static_cast<char>(rng() % 256); break;
        case 1: t.insert(at, tokens[rng() % std::size(tokens)]); break;
        case 2: t.erase(at, rng() % 16); break;
        case 3: t.insert(at, t.substr(at, rng() % 40)); break;
      }
    }
    try {
      const LoaderState p = LoaderState::parse(t);
      ++accepted;
      CHECK(p.epoch >= 0);
      CHECK(p.epoch <= LoaderState::max_count);
      const LoaderState q = LoaderState::parse(p.to_string());
      CHECK(q.to_string() == p.to_string());
    } catch (const InvalidArgument&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL("parse threw something else than InvalidArgument: " << e.what());
    }
  }
  MESSAGE("LoaderState::parse fuzz: " << accepted << " accepted, " << refused << " refused");
  CHECK(accepted + refused == inputs);
  CHECK(refused > 0);
}

TEST_CASE("fuzz: wire::decode refuses mutated messages with FormatError") {
  using Batch = std::pair<at::Tensor, at::Tensor>;
  const Batch batch{at::arange(24, at::kFloat).reshape({2, 3, 4}), at::arange(2, at::kLong)};
  const std::size_t size = wire::encoded_size(batch);
  std::vector<std::byte> storage(size + 2 * wire::tensor_alignment);
  auto* aligned = reinterpret_cast<std::byte*>(
      (reinterpret_cast<std::uintptr_t>(storage.data()) + wire::tensor_alignment - 1) /
      wire::tensor_alignment * wire::tensor_alignment);
  const std::span<std::byte> region(aligned, size);
  REQUIRE(wire::encode(batch, region) == size);
  const std::vector<std::byte> good(region.begin(), region.end());
  std::mt19937_64 rng(17);
  int accepted = 0, refused = 0;
  // A fixed number of inputs, whatever the machine's speed, so that the coverage is too.
  constexpr int inputs = 20000;
  for (int iter = 0; iter < inputs; ++iter) {
    std::memcpy(region.data(), good.data(), size);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      // Mostly the message's header and tensor descriptions, where sizes and offsets lie.
      const std::size_t at = rng() % std::min<std::size_t>(size, rng() % 2 ? 256 : size);
      region[at] = static_cast<std::byte>(rng() % 256);
    }
    try {
      const Batch b = wire::decode<Batch>(region, nullptr);
      ++accepted;
      CHECK(b.first.numel() * b.first.element_size() <= static_cast<std::int64_t>(size));
    } catch (const wire::FormatError&) {
      ++refused;
    } catch (const coload::Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL("decode threw " << e.what());
    }
  }
  MESSAGE("wire::decode fuzz: " << accepted << " accepted, " << refused << " refused");
  CHECK(accepted + refused == inputs);
  CHECK(refused > 0);
}

TEST_CASE("fuzz: JPEG and PNG headers, mutated, decode or fail with a DecodeError within the "
          "pixel limit") {
  struct Restore {
    ~Restore() { vision::set_max_image_pixels(vision::default_max_image_pixels); }
  } restore;
  // A limit that keeps each decode small, so the fuzz stays fast whatever sizes it makes up.
  vision::set_max_image_pixels(1 << 20);
  const auto jpeg = vt::synthetic_jpeg(48, 32, 5);
  const auto png8 = vt::make_png(16, 8, 8, 2, std::vector(8, std::vector<std::uint8_t>(48, 7)));
  const std::vector<std::byte> png(reinterpret_cast<const std::byte*>(png8.data()),
                                   reinterpret_cast<const std::byte*>(png8.data()) + png8.size());
  std::mt19937_64 rng(99);
  for (const auto* image : {&jpeg, &png}) {
    int decoded = 0, refused = 0;
    constexpr int inputs = 5000;  // a fixed number, whatever the machine's speed
    for (int iter = 0; iter < inputs; ++iter) {
      std::vector<std::byte> t = *image;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < edits; ++k) {
        // The header: JPEG's markers up to SOS, PNG's signature and IHDR.
        const std::size_t at = rng() % std::min<std::size_t>(t.size(), image == &png ? 33 : 700);
        t[at] = static_cast<std::byte>(rng() % 256);
      }
      if (rng() % 8 == 0) t.resize(rng() % t.size());
      try {
        const vision::ImageInfo info = vision::peek(t);
        CHECK(info.width > 0);
        const vision::Image img = vision::decode(t);
        CHECK(static_cast<std::int64_t>(img.width) * img.height <= (1 << 20));
        ++decoded;
      } catch (const vision::DecodeError&) {
        ++refused;
      } catch (const std::exception& e) {
        FAIL("decode threw " << e.what());
      }
    }
    MESSAGE(std::string(image == &png ? "PNG" : "JPEG") << " header fuzz: " << decoded << " decoded, "
                                             << refused << " refused");
    CHECK(decoded + refused == inputs);
    CHECK(refused > 0);
  }
}

TEST_CASE("fuzz: tar headers, mutated, list within the archive or fail with a named ShardError") {
  // Three members: a ustar header, a name too long for ustar (a pax header carries it) and a
  // one-byte label; then the end-of-archive blocks.
  std::vector<std::byte> good;
  const auto add = [&good](const std::string& name, std::size_t size) {
    shards::append_tar_header(good, name, size);
    for (std::size_t i = 0; i < size; ++i) good.push_back(static_cast<std::byte>(i * 7));
    good.resize((good.size() + shards::tar_block - 1) / shards::tar_block * shards::tar_block);
  };
  add("sample-000.jpg", 700);
  add(std::string(150, 'd') + "/sample-001.jpg", 300);
  add("sample-001.cls", 1);
  good.resize(good.size() + 2 * shards::tar_block);
  REQUIRE(shards::list_tar(good).size() == 3);

  std::mt19937_64 rng(23);
  std::vector<std::byte> archive;
  int accepted = 0, refused = 0;
  // A fixed number of inputs, whatever the machine's speed, so that the coverage is too.
  constexpr int inputs = 20000;
  for (int iter = 0; iter < inputs; ++iter) {
    archive = good;
    // Sometimes torn: cut anywhere.
    if (rng() % 8 == 0) archive.resize(rng() % archive.size());
    const int edits = archive.empty() ? 0 : 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      // Mostly the size, checksum and type fields of some header block, where the claims lie.
      std::size_t at = rng() % archive.size();
      if (rng() % 2) at = at / shards::tar_block * shards::tar_block + 124 + rng() % 40;
      if (at < archive.size()) archive[at] = static_cast<std::byte>(rng() % 256);
    }
    try {
      const auto members = shards::list_tar(archive, "fuzz.tar");
      ++accepted;
      for (const auto& m : members) CHECK(m.offset + m.size <= archive.size());
    } catch (const shards::ShardError& e) {
      ++refused;
      CHECK(e.shard() == "fuzz.tar");
      CHECK(std::string(e.what()).find("fuzz.tar") != std::string::npos);
    } catch (const std::exception& e) {
      FAIL("list_tar threw something else than a ShardError: " << e.what());
    }
    // A lone block of noise: a header or a TarFormatError, nothing else.
    std::array<std::byte, shards::tar_block> block;
    for (auto& b : block) b = static_cast<std::byte>(rng() % 256);
    try {
      (void)shards::parse_tar_header(block);
    } catch (const shards::TarFormatError&) {
    }
  }
  MESSAGE("tar fuzz: " << accepted << " archives accepted, " << refused << " refused");
  CHECK(accepted + refused == inputs);
  CHECK(accepted > 0);
  CHECK(refused > 0);
}

}  // TEST_SUITE
