// Specification of vision::ImagePipeline through the DataLoader: the batch path agrees with the
// single-sample path bit for bit whatever the number of workers, the per-sample Rng depends on
// (seed, epoch, index) only, and bad input (corrupt, truncated, empty, missing, not a regular
// file) gives an error naming the path with `on_error = raise`, or leaves the sample out, counted
// and named once on stderr, with `on_error = skip`.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "coload/collate/digest.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/device/backend.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/metrics.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "../support/needs.hpp"
#include "image_test_support.hpp"
#include "vision/slab_pool.hpp"

namespace fs = std::filesystem;
using coload::Digest;
using coload::Executor;
using coload::Index;
using coload::OnError;
using coload::WorkerError;
using coload::vision::EvalTransform;
using coload::vision::FolderError;
using coload::vision::FolderIndex;
using coload::vision::FolderOptions;
using coload::vision::FolderSample;
using coload::vision::ImagePipeline;
using coload::vision::TrainTransform;
namespace test = coload::vision::test;

namespace {

using Batch = ImagePipeline::batch_type;

// Small outputs keep every test fast.
TrainTransform small_train() {
  return TrainTransform{.size = 32};
}
EvalTransform small_eval() {
  return EvalTransform{.resize_size = 40, .crop_size = 32};
}

// Writes a synthetic JPEG (quality 90, 4:2:0) at `path`, creating its folder.
void write_jpeg(const fs::path& path, std::uint32_t seed, int width = 64, int height = 48) {
  fs::create_directories(path.parent_path());
  test::write_bytes(path, test::synthetic_jpeg(width, height, seed));
}

// Whether two tensors have the same shape, dtype and bytes.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

std::vector<std::int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// `path` between single quotes, as error messages name files.
std::string quoted(const fs::path& path) {
  std::string out = "'";
  out += path.string();
  out += '\'';
  return out;
}

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Sample `index` made alone, with the Rng the loader gives it: (seed, epoch, index).
ImagePipeline::sample_type single(const ImagePipeline& pipeline, Index index, std::int64_t epoch,
                                  std::uint64_t seed = 0) {
  coload::SampleContext ctx;
  ctx.index = index;
  ctx.epoch = epoch;
  ctx.rng = coload::Rng::for_sample(seed, epoch, index);
  return pipeline.get(index, ctx);
}

// What one place of an epoch delivered: a batch or a WorkerError.
struct Delivered {
  std::optional<Batch> batch;
  bool error = false;
  std::string what;
  std::string original_message;
  std::int64_t error_batch = -2;
  std::int64_t error_index = -2;
  int worker_id = -2;
};

// Runs one epoch to its end, keeping every batch and every WorkerError in order.
template <class Loader>
std::vector<Delivered> run_epoch(Loader& loader) {
  std::vector<Delivered> out;
  auto epoch = loader.epoch();
  for (;;) {
    Delivered d;
    try {
      std::optional<Batch> batch = coload::sync_wait(epoch.next());
      if (!batch) break;
      d.batch = std::move(*batch);
    } catch (const WorkerError& e) {
      d.error = true;
      d.what = e.what();
      d.original_message = e.original_message();
      d.error_batch = e.batch();
      d.error_index = e.index();
      d.worker_id = e.worker_id();
    }
    out.push_back(std::move(d));
  }
  return out;
}

// Every batch of one epoch; fails the test on an error.
template <class Loader>
std::vector<Batch> batches_of(Loader& loader) {
  std::vector<Batch> out;
  for (Delivered& d : run_epoch(loader)) {
    REQUIRE_MESSAGE(!d.error, d.what);
    out.push_back(std::move(*d.batch));
  }
  return out;
}

// Redirects the process's stderr (fd 2) into an anonymous file until text() or destruction;
// what was captured is written back to the real stderr afterwards.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    char name[] = "/tmp/coload_pipeline_stderr_XXXXXX";
    file_ = ::mkstemp(name);
    REQUIRE(file_ >= 0);
    ::unlink(name);
    saved_ = ::dup(2);
    REQUIRE(saved_ >= 0);
    REQUIRE(::dup2(file_, 2) == 2);
  }
  ~StderrCapture() {
    restore();
    ::close(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Stops capturing; everything written so far.
  std::string text() {
    restore();
    std::string out;
    char chunk[4096];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(file_, chunk, sizeof chunk, at);
      if (n <= 0) break;
      out.append(chunk, static_cast<std::size_t>(n));
      at += n;
    }
    if (!out.empty()) {
      [[maybe_unused]] const ssize_t w = ::write(2, out.data(), out.size());
    }
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  int file_ = -1;
  int saved_ = -1;
};

// root/<class>/<name>.jpg for three classes of 3, 4 and 3 images (10 samples), landscape and
// portrait, each with its own content.
struct SmallFolder {
  test::TempDir dir;
  SmallFolder() {
    const std::vector<std::pair<std::string, int>> classes = {{"cat", 3}, {"dog", 4}, {"owl", 3}};
    std::uint32_t seed = 1;
    for (const auto& [name, count] : classes) {
      for (int i = 0; i < count; ++i, ++seed) {
        const bool portrait = seed % 3 == 0;
        write_jpeg(dir / (name + "/img" + std::to_string(i) + ".jpg"), seed, portrait ? 48 : 64,
                   portrait ? 64 : 48);
      }
    }
  }
  const fs::path& root() const { return dir.path(); }
};

// Two shuffled epochs (batches of 3, seed 7) of the small train transform over `folder` under
// `options`: each batch's digest, in order, after `check(images, labels)` has seen it.
template <class Check>
std::vector<std::vector<std::uint64_t>> hashed_epochs(const SmallFolder& folder,
                                                      coload::LoaderOptions<> options, Check&& check) {
  options.batch_size = 3;
  options.shuffle = true;
  options.seed = 7;
  auto loader = coload::make_data_loader(ImagePipeline(folder.root(), small_train()), options);
  std::vector<std::vector<std::uint64_t>> out;
  for (int e = 0; e < 2; ++e) {
    auto& hashes = out.emplace_back();
    for (auto& [images, labels] : loader) {
      check(images, labels);
      hashes.push_back(Digest().add(images.cpu()).add(labels.cpu()).value());
    }
  }
  return out;
}

// hashed_epochs with 2 thread workers and pageable memory, which the pinned and device runs
// must equal: 2 epochs of 4 batches.
std::vector<std::vector<std::uint64_t>> pageable_epochs(const SmallFolder& folder) {
  auto out = hashed_epochs(folder, {.num_workers = 2}, [](const at::Tensor&, const at::Tensor&) {});
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].size() == 4);
  return out;
}

// Checks that `batches` are the folder's samples in order, batched by 4, with labels from the
// index and images equal to the single-sample path's for `epoch` (seed 0).
void check_against_single(const ImagePipeline& pipeline, const std::vector<Batch>& batches,
                          std::int64_t epoch) {
  const FolderIndex& index = pipeline.index();
  const auto n = static_cast<std::int64_t>(index.samples.size());
  REQUIRE(static_cast<std::int64_t>(batches.size()) == (n + 3) / 4);
  Index next = 0;
  for (const Batch& batch : batches) {
    const auto& [images, labels] = batch;
    const std::int64_t rows = std::min<std::int64_t>(4, n - next);
    CHECK(std::string(c10::toString(images.scalar_type())) == "Float");
    CHECK(std::string(c10::toString(labels.scalar_type())) == "Long");
    REQUIRE(images.sizes().vec() == std::vector<std::int64_t>{rows, 3, 32, 32});
    REQUIRE(labels.sizes().vec() == std::vector<std::int64_t>{rows});
    const std::vector<std::int64_t> got = values(labels);
    for (std::int64_t r = 0; r < rows; ++r, ++next) {
      CAPTURE(next);
      CHECK(got[static_cast<std::size_t>(r)] == index.targets[static_cast<std::size_t>(next)]);
      const auto [image, label] = single(pipeline, next, epoch);
      CHECK(label == index.targets[static_cast<std::size_t>(next)]);
      CHECK(same_bits(images[r], image));
    }
  }
  CHECK(next == n);
}

// Sets COLOAD_IO=pread (the loader's reader then uses its pread pool) for its lifetime.
class ForcePread {
 public:
  explicit ForcePread(bool on) : on_(on) {
    if (on_) ::setenv("COLOAD_IO", "pread", 1);
  }
  ~ForcePread() {
    if (on_) ::unsetenv("COLOAD_IO");
  }
  ForcePread(const ForcePread&) = delete;
  ForcePread& operator=(const ForcePread&) = delete;

 private:
  bool on_;
};

// Bytes of a deterministic pseudo-random stream.
std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> out(n);
  std::uint32_t state = seed * 747796405u + 2891336453u;
  for (auto& b : out) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<std::uint8_t>(state >> 24);
  }
  return out;
}

std::vector<std::uint8_t> valid_jpeg_bytes(std::uint32_t seed) {
  const std::vector<std::byte> jpeg = test::synthetic_jpeg(64, 48, seed);
  std::vector<std::uint8_t> out(jpeg.size());
  std::memcpy(out.data(), jpeg.data(), jpeg.size());
  return out;
}

// One kind of bad input: how the bad entry is made at its path (before indexing), what happens
// to it after indexing, and the fragments its error message holds besides the path.
struct BadInput {
  std::string name;
  std::function<void(const fs::path&)> make;
  std::function<void(const fs::path&)> after_index{};
  std::vector<std::string> expected{};
  // The entry is not a sample of the folder's index (a directory): put it at its place by hand.
  bool add_to_index = false;
};

// The payload of the JPEG segment whose marker is 0xff `marker`: [first, last) after its length.
std::pair<std::size_t, std::size_t> segment_payload(const std::vector<std::uint8_t>& jpeg,
                                                    std::uint8_t marker) {
  for (std::size_t at = 2; at + 4 <= jpeg.size();) {
    REQUIRE(jpeg[at] == 0xff);
    const std::size_t length = static_cast<std::size_t>(jpeg[at + 2]) << 8 | jpeg[at + 3];
    if (jpeg[at + 1] == marker) return {at + 4, at + 2 + length};
    at += 2 + length;
  }
  FAIL("no such segment");
  return {0, 0};
}

// SOI and the first segment (JFIF's APP0) of a valid JPEG, then random bytes: no valid header.
BadInput corrupt_header() {
  return {"corrupt JPEG (random bytes after SOI and APP0)",
          [](const fs::path& p) {
            std::vector<std::uint8_t> bytes = valid_jpeg_bytes(3);
            REQUIRE(bytes[2] == 0xff);
            bytes.resize(4 + (static_cast<std::size_t>(bytes[4]) << 8 | bytes[5]));
            const auto tail = random_bytes(3000, 7);
            bytes.insert(bytes.end(), tail.begin(), tail.end());
            test::write_bytes(p, bytes);
          },
          {},
          {"cannot load image 'PATH'", "corrupt JPEG header"}};
}

// A valid JPEG whose frame header (SOF0) is overwritten with random bytes, marker and length
// kept: garbage in the middle of the header.
BadInput corrupt_frame() {
  return {"corrupt JPEG (garbage in the frame header)",
          [](const fs::path& p) {
            std::vector<std::uint8_t> bytes = valid_jpeg_bytes(4);
            const auto [first, last] = segment_payload(bytes, 0xc0);
            const auto garbage = random_bytes(last - first, 11);
            std::copy(garbage.begin(), garbage.end(),
                      bytes.begin() + static_cast<std::ptrdiff_t>(first));
            test::write_bytes(p, bytes);
          },
          {},
          {"cannot load image 'PATH'", "corrupt JPEG header"}};
}

// The first half of a valid JPEG.
BadInput truncated() {
  return {"truncated JPEG (first half)",
          [](const fs::path& p) {
            std::vector<std::uint8_t> bytes = valid_jpeg_bytes(99);
            bytes.resize(bytes.size() / 2);
            test::write_bytes(p, bytes);
          },
          {},
          {"cannot load image 'PATH'", "truncated JPEG data"}};
}

BadInput zero_bytes() {
  return {"zero-byte .jpg",
          [](const fs::path& p) { test::write_bytes(p, std::string()); },
          {},
          {"cannot load image 'PATH'", "empty data (0 bytes)"}};
}

BadInput not_an_image() {
  return {"text file named .jpg",
          [](const fs::path& p) { test::write_bytes(p, std::string("hello, not a JPEG\n")); },
          {},
          {"cannot load image 'PATH'", "unknown image format"}};
}

BadInput dangling_symlink() {
  return {"dangling symlink .jpg",
          [](const fs::path& p) { fs::create_symlink(p.parent_path() / "nowhere.jpg", p); },
          {},
          {"cannot open 'PATH'", "No such file or directory"}};
}

BadInput deleted_after_indexing() {
  return {"file deleted after indexing",
          [](const fs::path& p) { write_jpeg(p, 5); },
          [](const fs::path& p) { REQUIRE(fs::remove(p)); },
          {"cannot open 'PATH'", "No such file or directory"}};
}

// A directory where a sample's file should be: indexing walks into it (as torchvision does), so
// it reaches the pipeline only through an index made by hand.
BadInput directory_in_index() {
  return {"directory in a hand-made index",
          [](const fs::path& p) { fs::create_directory(p); },
          {},
          {"'PATH'", "Is a directory"},
          true};
}

// The fragment with "PATH" replaced by `path`.
std::string with_path(std::string fragment, const std::string& path) {
  if (const auto at = fragment.find("PATH"); at != std::string::npos) {
    fragment.replace(at, 4, path);
  }
  return fragment;
}

// root/a/s00.jpg ... s05.jpg (samples 0-5, class 0) and root/b/s00.jpg ... s05.jpg (samples
// 6-11, class 1), with the entries named in `bad` (under a/) made by their BadInput instead.
// Batches of 4: [0-3], [4-7], [8-11].
struct BadFolder {
  test::TempDir dir;
  std::vector<std::pair<fs::path, BadInput>> bad;

  explicit BadFolder(const std::vector<std::pair<int, BadInput>>& bad_inputs) {
    fs::create_directories(dir / "a");
    fs::create_directories(dir / "b");
    for (const char* cls : {"a", "b"}) {
      for (int i = 0; i < 6; ++i) {
        const fs::path path = dir / (std::string(cls) + "/s0" + std::to_string(i) + ".jpg");
        const BadInput* input = nullptr;
        if (std::string(cls) == "a") {
          for (const auto& [at, b] : bad_inputs) {
            if (at == i) input = &b;
          }
        }
        if (input) {
          input->make(path);
          bad.emplace_back(path, *input);
        } else {
          write_jpeg(path, static_cast<std::uint32_t>(100 + i + (cls[0] - 'a') * 6));
        }
      }
    }
  }
  const fs::path& root() const { return dir.path(); }
  // The folder's pipeline (eval), with the bad entries that indexing leaves out put at their
  // places (all under class a, so their targets are 0).
  ImagePipeline pipeline() const {
    ImagePipeline indexed(root(), small_eval());
    bool added = false;
    FolderIndex index = indexed.index();
    for (const auto& [path, input] : bad) {
      if (!input.add_to_index) continue;
      const std::string name = path.string();
      auto at = index.samples.begin();
      while (at != index.samples.end() && at->class_index == 0 && at->path < name) ++at;
      const auto offset = at - index.samples.begin();
      index.samples.insert(at, FolderSample{name, 0});
      index.targets.insert(index.targets.begin() + offset, 0);
      added = true;
    }
    if (!added) return indexed;
    return ImagePipeline(std::move(index), small_eval());
  }
  void after_index() const {
    for (const auto& [path, input] : bad) {
      if (input.after_index) input.after_index(path);
    }
  }
};

// Checks that `batch` holds samples `indices` of `pipeline`, as get() makes them (eval).
void check_batch(const ImagePipeline& pipeline, const Batch& batch,
                 const std::vector<Index>& indices) {
  const auto rows = static_cast<std::int64_t>(indices.size());
  REQUIRE(batch.first.sizes().vec() == std::vector<std::int64_t>{rows, 3, 32, 32});
  REQUIRE(batch.second.sizes().vec() == std::vector<std::int64_t>{rows});
  const std::vector<std::int64_t> labels = values(batch.second);
  for (std::int64_t r = 0; r < rows; ++r) {
    const Index i = indices[static_cast<std::size_t>(r)];
    CAPTURE(i);
    CHECK(labels[static_cast<std::size_t>(r)] ==
          pipeline.index().targets[static_cast<std::size_t>(i)]);
    CHECK(same_bits(batch.first[r], single(pipeline, i, 0).first));
  }
}

// The error message of `d` names the bad path and what went wrong.
void check_error_names(const Delivered& d, const fs::path& path, const BadInput& input) {
  CAPTURE(d.what);
  CHECK(d.what.find(path.string()) != std::string::npos);
  CHECK(d.original_message.find(path.string()) != std::string::npos);
  for (const std::string& fragment : input.expected) {
    CHECK(d.what.find(with_path(fragment, path.string())) != std::string::npos);
  }
}

// The ways a loader is run over bad input: workers, and the reader's backend.
struct LoaderSetup {
  int workers;
  bool pread;
};
constexpr LoaderSetup kSetups[] = {{0, false}, {2, false}, {2, true}};

// Sample 5 (root/a/s05.jpg) is bad; with `raise`, batch 1 is a WorkerError naming it, and
// batches 0 and 2 arrive intact.
void check_raise(const BadInput& input) {
  for (const LoaderSetup setup : kSetups) {
    CAPTURE(input.name);
    CAPTURE(setup.workers);
    CAPTURE(setup.pread);
    const ForcePread force(setup.pread);
    const BadFolder folder({{5, input}});
    const ImagePipeline pipeline = folder.pipeline();
    REQUIRE(pipeline.size() == 12);
    const fs::path bad = folder.bad.at(0).first;
    REQUIRE(pipeline.index().samples[5] == FolderSample{bad.string(), 0});
    folder.after_index();
    auto loader = coload::make_data_loader(
        pipeline,
        {.batch_size = 4, .num_workers = setup.workers, .seed = 0, .on_error = OnError::raise});
    const std::vector<Delivered> out = run_epoch(loader);
    REQUIRE(out.size() == 3);
    REQUIRE(out[0].batch);
    check_batch(pipeline, *out[0].batch, {0, 1, 2, 3});
    REQUIRE(out[1].error);
    check_error_names(out[1], bad, input);
    CHECK(out[1].error_batch == 1);
    CHECK(out[1].error_index == 5);
    CHECK(out[1].worker_id >= -1);
    CHECK(out[1].worker_id < std::max(setup.workers, 1));
    REQUIRE(out[2].batch);
    check_batch(pipeline, *out[2].batch, {8, 9, 10, 11});
    CHECK(loader.skipped() == 0);
  }
}

// Sample 5 is bad; with `skip`, batch 1 arrives without it, it is counted each epoch and named
// once on stderr, and the other batches are unaffected.
void check_skip(const BadInput& input) {
  for (const LoaderSetup setup : kSetups) {
    CAPTURE(input.name);
    CAPTURE(setup.workers);
    CAPTURE(setup.pread);
    const ForcePread force(setup.pread);
    const BadFolder folder({{5, input}});
    const ImagePipeline pipeline = folder.pipeline();
    REQUIRE(pipeline.size() == 12);
    const fs::path bad = folder.bad.at(0).first;
    REQUIRE(pipeline.index().samples[5].path == bad.string());
    folder.after_index();
    auto loader = coload::make_data_loader(
        pipeline,
        {.batch_size = 4, .num_workers = setup.workers, .seed = 0, .on_error = OnError::skip});
    std::vector<Delivered> epoch0;
    std::vector<Delivered> epoch1;
    std::int64_t skipped_after_epoch0 = -1;
    std::string err;
    {
      StderrCapture capture;
      epoch0 = run_epoch(loader);
      skipped_after_epoch0 = loader.skipped();
      epoch1 = run_epoch(loader);
      err = capture.text();
    }
    for (const auto* epoch : {&epoch0, &epoch1}) {
      REQUIRE(epoch->size() == 3);
      for (const Delivered& d : *epoch) REQUIRE_MESSAGE(!d.error, d.what);
      check_batch(pipeline, *(*epoch)[0].batch, {0, 1, 2, 3});
      check_batch(pipeline, *(*epoch)[1].batch, {4, 6, 7});
      check_batch(pipeline, *(*epoch)[2].batch, {8, 9, 10, 11});
    }
    CHECK(values((*epoch0[1].batch).second) == std::vector<std::int64_t>{0, 1, 1});
    CHECK(skipped_after_epoch0 == 1);
    CHECK(loader.skipped() == 2);
    // Named once, with the path and the reason, though skipped in both epochs.
    CAPTURE(err);
    const std::string prefix = "coload: skipping sample 5: ";
    CHECK(count_of(err, prefix) == 1);
    CHECK(count_of(err, "coload: skipping sample") == 1);
    const auto at = err.find(prefix);
    REQUIRE(at != std::string::npos);
    const std::string line = err.substr(at, err.find('\n', at) - at);
    CHECK(line.find(bad.string()) != std::string::npos);
    for (const std::string& fragment : input.expected) {
      CHECK(line.find(with_path(fragment, bad.string())) != std::string::npos);
    }
  }
}

// A FIFO named .jpg, with no writer.
BadInput fifo() {
  return {"FIFO named .jpg",
          [](const fs::path& p) { REQUIRE(::mkfifo(p.c_str(), 0600) == 0); },
          {},
          {"'PATH' (a FIFO, not a regular file)"}};
}

// Opens `fifo` for writing without blocking and closes it at once: a reader blocked opening it
// wakes and then reads end-of-file. Returns whether a reader was there.
bool release_fifo_reader(const fs::path& fifo) {
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;  // ENXIO: nobody has it open for reading
  ::close(fd);
  return true;
}

// One epoch over a folder whose sample 5 is a FIFO, each batch awaited at most the loader's
// `timeout`. A batch that does not come in time counts as blocked; the FIFO is then opened for
// writing (waking a reader blocked in open()), so the test ends either way.
template <class Loader>
std::pair<std::vector<Delivered>, bool> run_fifo_epoch(Loader& loader, const fs::path& fifo) {
  std::vector<Delivered> out;
  bool blocked = false;
  auto epoch = loader.epoch();
  for (;;) {
    Delivered d;
    try {
      std::optional<Batch> batch = coload::sync_wait(epoch.next());
      if (!batch) break;
      d.batch = std::move(*batch);
    } catch (const coload::TimeoutError&) {
      blocked = true;
      release_fifo_reader(fifo);
      continue;
    } catch (const WorkerError& e) {
      d.error = true;
      d.what = e.what();
      d.original_message = e.original_message();
      d.error_batch = e.batch();
    }
    out.push_back(std::move(d));
  }
  return {std::move(out), blocked};
}

// Sample 5 is a FIFO without a writer: with `raise`, its batch is an error naming it, with
// `skip` it is left out, and in neither case does the loader wait for a writer.
void check_fifo(bool pread) {
  const ForcePread force(pread);
  for (const OnError policy : {OnError::raise, OnError::skip}) {
    for (const int workers : {0, 2}) {
      CAPTURE(pread);
      CAPTURE(workers);
      CAPTURE(policy == OnError::skip);
      const BadFolder folder({{5, fifo()}});
      const ImagePipeline pipeline = folder.pipeline();
      const fs::path bad = folder.bad.at(0).first;
      // Indexing files a FIFO as a file (os.walk: anything that is not a folder).
      REQUIRE(pipeline.index().samples.at(5).path == bad.string());
      auto loader = coload::make_data_loader(
          pipeline,
          {.batch_size = 4, .num_workers = workers, .timeout = 5, .seed = 0, .on_error = policy});
      std::pair<std::vector<Delivered>, bool> run;
      std::string err;
      {
        StderrCapture capture;
        run = run_fifo_epoch(loader, bad);
        err = capture.text();
      }
      const auto& [out, blocked] = run;
      CHECK_MESSAGE(!blocked, "reading a FIFO without a writer blocked the loader");
      REQUIRE(out.size() == 3);
      REQUIRE(out[0].batch);
      check_batch(pipeline, *out[0].batch, {0, 1, 2, 3});
      if (policy == OnError::raise) {
        REQUIRE(out[1].error);
        CHECK(out[1].what.find(quoted(bad) + " (a FIFO, not a regular file)") != std::string::npos);
      } else {
        REQUIRE(out[1].batch);
        check_batch(pipeline, *out[1].batch, {4, 6, 7});
        CHECK(loader.skipped() == 1);
        CHECK(err.find("coload: skipping sample 5: ") != std::string::npos);
        CHECK(err.find(quoted(bad) + " (a FIFO, not a regular file)") != std::string::npos);
      }
      REQUIRE(out[2].batch);
      check_batch(pipeline, *out[2].batch, {8, 9, 10, 11});
    }
  }
}

}  // namespace

TEST_SUITE("vision") {
  TEST_CASE(
      "pipeline: batches through the loader equal get() for the same Rng, with 0, 1 and 3 "
      "workers") {
    const SmallFolder folder;
    for (const bool train : {false, true}) {
      CAPTURE(train);
      const ImagePipeline::Transform transform =
          train ? ImagePipeline::Transform(small_train()) : ImagePipeline::Transform(small_eval());
      const ImagePipeline pipeline(folder.root(), transform);
      REQUIRE(pipeline.size() == 10);
      CHECK(pipeline.output_size() == 32);
      CHECK(pipeline.index().classes == std::vector<std::string>{"cat", "dog", "owl"});
      CHECK(pipeline.index().targets == std::vector<std::int64_t>{0, 0, 0, 1, 1, 1, 1, 2, 2, 2});

      std::optional<std::vector<Batch>> first;
      for (const int workers : {0, 1, 3}) {
        CAPTURE(workers);
        auto loader =
            coload::make_data_loader(ImagePipeline(folder.root(), transform),
                                     {.batch_size = 4, .num_workers = workers, .seed = 0});
        CHECK(loader.size() == 3);
        const std::vector<Batch> batches = batches_of(loader);
        check_against_single(pipeline, batches, 0);
        CHECK(loader.skipped() == 0);
        if (!first) {
          first = batches;
          continue;
        }
        REQUIRE(first->size() == batches.size());
        for (std::size_t b = 0; b < batches.size(); ++b) {
          CAPTURE(b);
          CHECK(same_bits((*first)[b].first, batches[b].first));
          CHECK(same_bits((*first)[b].second, batches[b].second));
        }
      }
    }
  }

  TEST_CASE("pipeline: the slab pool recycles batch buffers across an epoch's shorter last "
            "batch and allocates anew only for a larger one") {
    auto pool = std::make_shared<coload::vision::detail::SlabPool>();
    const std::vector<std::int64_t> full{4, 3, 32, 32};
    const std::vector<std::int64_t> last{2, 3, 32, 32};
    {
      // An epoch: two full batches alive at once, then the last, shorter one.
      at::Tensor a = pool->take(full);
      at::Tensor b = pool->take(full);
      CHECK(pool->allocated() == 2);
      a.fill_(1.0f);
      a = at::Tensor();
      at::Tensor c = pool->take(last);  // a's buffer, not a fresh one
      CHECK(pool->allocated() == 2);
      CHECK(c.sizes() == at::IntArrayRef(last));
      CHECK(c.numel() == 2 * 3 * 32 * 32);
      c.fill_(2.0f);
    }
    {
      // The next epoch finds both buffers again.
      at::Tensor a = pool->take(full);
      at::Tensor b = pool->take(full);
      CHECK(pool->allocated() == 2);
      a.fill_(3.0f);
      CHECK(a.sum().item<double>() == doctest::Approx(3.0 * 4 * 3 * 32 * 32));
    }
    // A larger batch than any before cannot use them: fresh buffers, and the small ones go.
    const std::vector<std::int64_t> larger{64, 3, 64, 64};
    at::Tensor big = pool->take(larger);
    CHECK(pool->allocated() == 3);
    big.fill_(4.0f);
    big = at::Tensor();
    at::Tensor small = pool->take(full);  // the large one, recycled
    CHECK(pool->allocated() == 3);
  }

  TEST_CASE("pipeline: a batch takes its slab when its first row is asked for, once, from any "
            "thread") {
    using coload::vision::detail::BatchRows;
    auto pool = std::make_shared<coload::vision::detail::SlabPool>();
    BatchRows waiting(nullptr, pool, 4, 8);  // a batch whose images are all still queued
    BatchRows started(nullptr, pool, 4, 8);
    CHECK(pool->allocated() == 0);
    CHECK_FALSE(waiting.images().defined());
    std::vector<float*> rows(4);
    {
      std::vector<std::thread> threads;
      for (std::size_t k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] { rows[k] = started.row(k); });
      }
      for (auto& t : threads) t.join();
    }
    CHECK(pool->allocated() == 1);  // one slab for four rows asked at once
    CHECK_FALSE(waiting.images().defined());
    const at::Tensor images = started.images();
    REQUIRE(images.defined());
    CHECK(images.sizes() == at::IntArrayRef({4, 3, 8, 8}));
    for (std::size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(rows[k] == images.data_ptr<float>() + static_cast<std::ptrdiff_t>(k) * 3 * 8 * 8);
      CHECK(started.row(k) == rows[k]);
    }
    CHECK(pool->allocated() == 1);
    waiting.row(2);
    CHECK(pool->allocated() == 2);

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // A buffer that cannot be had is the batch's error (the fetches rethrow it instead of
    // skipping the sample that asked), and the pool is as it was. (The sanitizers' allocators
    // abort on such a request instead of failing it.)
    BatchRows huge(nullptr, pool, std::int64_t{1} << 40, 8);
    CHECK_THROWS_WITH_AS(huge.row(0),
                         doctest::Contains("cannot allocate the batch's buffer of 1099511627776 x "
                                           "3 x 8 x 8 floats"),
                         coload::vision::detail::BatchBufferError);
    CHECK_FALSE(huge.images().defined());
    CHECK(pool->allocated() == 2);
    BatchRows after(nullptr, pool, 4, 8);  // the failed size did not stick to the pool
    CHECK(after.row(3) != nullptr);
    CHECK(pool->allocated() == 3);
#endif
  }

  TEST_CASE("pipeline: with a seed, every batch of every epoch hashes alike whatever the "
            "workers, the executor or in_order") {
    const SmallFolder folder;
    struct Config {
      int workers;
      Executor executor;
      bool in_order;
    };
    auto hashes = [&](Config c) {
      auto loader = coload::make_data_loader(
          ImagePipeline(folder.root(), small_train()),
          {.batch_size = 3, .shuffle = true, .num_workers = c.workers, .in_order = c.in_order,
           .seed = 7, .executor = c.executor});
      std::vector<std::vector<std::uint64_t>> epochs;
      for (int e = 0; e < 2; ++e) {
        auto& out = epochs.emplace_back();
        for (auto& [images, labels] : loader) out.push_back(Digest().add(images).add(labels).value());
      }
      return epochs;
    };
    const auto reference = hashes({0, Executor::threads, true});
    REQUIRE(reference.size() == 2);
    REQUIRE(reference[0].size() == 4);
    CHECK(reference[0] != reference[1]);  // the epoch changes the shuffle and the crops
    for (const Config c : {Config{1, Executor::threads, true}, Config{3, Executor::threads, true},
                           Config{2, Executor::processes, true}}) {
      CAPTURE(c.workers);
      CAPTURE(c.executor == Executor::processes);
      CHECK(hashes(c) == reference);
    }
    // Out of order, the same batches as a multiset.
    for (const Config c : {Config{3, Executor::threads, false},
                           Config{2, Executor::processes, false}}) {
      CAPTURE(c.workers);
      auto got = hashes(c);
      for (std::size_t e = 0; e < 2; ++e) {
        std::multiset<std::uint64_t> a(got[e].begin(), got[e].end());
        std::multiset<std::uint64_t> b(reference[e].begin(), reference[e].end());
        CHECK(a == b);
      }
    }
  }

  TEST_CASE("pipeline: with pin_memory, batches arrive pinned and equal the pageable ones, "
            "with threads and processes") {
    // The loader's pinned lease (threads) or the worker's pinned slot (processes) is the
    // allocator BatchRows takes its tensor from at once, instead of a slab of the pipeline's pool.
    const SmallFolder folder;
    const auto reference = pageable_epochs(folder);
    for (const Executor executor : {Executor::threads, Executor::processes}) {
      CAPTURE(executor == Executor::processes);
      auto backend = std::make_shared<coload::HostDeviceBackend>();
      int checked = 0;
      const auto got = hashed_epochs(
          folder, {.num_workers = 2, .pin_memory = true, .executor = executor, .device_backend = backend},
          [&](const at::Tensor& images, const at::Tensor& labels) {
            CHECK(images.sizes() == at::IntArrayRef({labels.size(0), 3, 32, 32}));
            CHECK(backend->is_pinned(images.data_ptr()));
            CHECK(backend->is_pinned(labels.data_ptr()));
            // Processes write into the shared arena, registered as pinned while it lives.
            if (executor == Executor::processes) CHECK(backend->registered_ranges() > 0);
            ++checked;
          });
      CHECK(checked == 8);
      CHECK(got == reference);
      // 8 batches, but at most the in-flight bound (2 workers x 2) + 2 slabs: recycled, not
      // taken per batch; and all given back.
      CHECK(backend->pinned_allocations() <= 6);
      CHECK(backend->live_pinned_bytes() == 0);
      CHECK(backend->registered_ranges() == 0);
    }
  }

  TEST_CASE("GPU: the pipeline with pin_memory and device = cuda delivers on the device the "
            "batches it delivers pageable, with threads and processes" *
            coload::testing::needs(coload::testing::cuda())) {
    coload::testing::require(coload::testing::cuda());
    const SmallFolder folder;
    const auto reference = pageable_epochs(folder);
    for (const Executor executor : {Executor::threads, Executor::processes}) {
      CAPTURE(executor == Executor::processes);
      int on_device = 0;
      const auto got = hashed_epochs(folder,
                              {.num_workers = 2,
                               .pin_memory = true,
                               .executor = executor,
                               .device = at::Device(at::kCUDA, 0)},
                              [&](const at::Tensor& images, const at::Tensor& labels) {
                                on_device += images.is_cuda() && labels.is_cuda();
                              });
      CHECK(on_device == 8);
      CHECK(got == reference);
    }
  }

  TEST_CASE("pipeline: the eval transform has no randomness: two epochs are equal") {
    const SmallFolder folder;
    auto loader = coload::make_data_loader(ImagePipeline(folder.root(), small_eval()),
                                           {.batch_size = 4, .num_workers = 2, .seed = 0});
    const std::vector<Batch> epoch0 = batches_of(loader);
    const std::vector<Batch> epoch1 = batches_of(loader);
    REQUIRE(epoch0.size() == 3);
    REQUIRE(epoch1.size() == 3);
    for (std::size_t b = 0; b < epoch0.size(); ++b) {
      CAPTURE(b);
      CHECK(same_bits(epoch0[b].first, epoch1[b].first));
      CHECK(same_bits(epoch0[b].second, epoch1[b].second));
    }
    // And the eval output does not depend on the Rng at all.
    const ImagePipeline pipeline(folder.root(), small_eval());
    CHECK(same_bits(single(pipeline, 4, 0, 0).first, single(pipeline, 4, 7, 12345).first));
  }

  TEST_CASE("pipeline: the train transform's crops and flips change with the epoch") {
    const SmallFolder folder;
    const ImagePipeline pipeline(folder.root(), small_train());
    auto loader = coload::make_data_loader(ImagePipeline(folder.root(), small_train()),
                                           {.batch_size = 4, .num_workers = 2, .seed = 0});
    const std::vector<Batch> epoch0 = batches_of(loader);
    const std::vector<Batch> epoch1 = batches_of(loader);
    check_against_single(pipeline, epoch0, 0);
    check_against_single(pipeline, epoch1, 1);
    REQUIRE(epoch0.size() == epoch1.size());
    int differing_images = 0;
    for (std::size_t b = 0; b < epoch0.size(); ++b) {
      CHECK(same_bits(epoch0[b].second, epoch1[b].second));  // labels do not move
      for (std::int64_t r = 0; r < epoch0[b].first.size(0); ++r) {
        if (!same_bits(epoch0[b].first[r], epoch1[b].first[r])) ++differing_images;
      }
    }
    // Ten independent crops: all of them equal in both epochs would be a Rng that ignores the
    // epoch.
    CHECK(differing_images >= 8);
    // A loader seeded alike repeats epoch 0 exactly.
    auto again = coload::make_data_loader(ImagePipeline(folder.root(), small_train()),
                                          {.batch_size = 4, .num_workers = 0, .seed = 0});
    const std::vector<Batch> replay = batches_of(again);
    REQUIRE(replay.size() == epoch0.size());
    for (std::size_t b = 0; b < replay.size(); ++b)
      CHECK(same_bits(replay[b].first, epoch0[b].first));
  }

  TEST_CASE("pipeline: bad input: a corrupt JPEG (random bytes after SOI)") {
    check_raise(corrupt_header());
    check_skip(corrupt_header());
  }

  TEST_CASE("pipeline: bad input: a corrupt JPEG (garbage in the frame header)") {
    check_raise(corrupt_frame());
    check_skip(corrupt_frame());
  }

  TEST_CASE("pipeline: bad input: a truncated JPEG (the first half of a valid file)") {
    check_raise(truncated());
    check_skip(truncated());
  }

  TEST_CASE("pipeline: bad input: a zero-byte .jpg") {
    check_raise(zero_bytes());
    check_skip(zero_bytes());
  }

  TEST_CASE("pipeline: bad input: a text file named .jpg") {
    check_raise(not_an_image());
    check_skip(not_an_image());
  }

  TEST_CASE("pipeline: bad input: a dangling symlink .jpg") {
    check_raise(dangling_symlink());
    check_skip(dangling_symlink());
  }

  TEST_CASE("pipeline: bad input: a file deleted after indexing") {
    check_raise(deleted_after_indexing());
    check_skip(deleted_after_indexing());
  }

  TEST_CASE("pipeline: bad input: a directory given as a sample by a hand-made index") {
    check_raise(directory_in_index());
    check_skip(directory_in_index());
  }

  TEST_CASE("pipeline: bad input: a directory named x.jpg in a class is walked into, not loaded") {
    // torchvision's make_dataset walks a class with os.walk(followlinks=True): a folder named
    // x.jpg is a folder to descend, never a sample; files inside it are samples of the class,
    // after the class folder's own files (sorted walk).
    for (const bool with_file : {false, true}) {
      CAPTURE(with_file);
      const BadFolder folder({});
      const fs::path x = folder.dir / "a/x.jpg";
      fs::create_directory(x);
      if (with_file) write_jpeg(x / "inner.jpg", 77);
      const ImagePipeline pipeline(folder.root(), small_eval());
      FolderOptions options;
      options.extensions.emplace(coload::vision::image_extensions.begin(),
                                 coload::vision::image_extensions.end());
      const FolderIndex reference = coload::vision::index_folder(folder.root(), options);
      CHECK(pipeline.index().samples == reference.samples);
      CHECK(pipeline.index().targets == reference.targets);
      for (const FolderSample& s : pipeline.index().samples) CHECK(s.path != x.string());
      REQUIRE(pipeline.size() == (with_file ? 13 : 12));
      if (with_file) {
        CHECK(pipeline.index().samples[6] == FolderSample{(x / "inner.jpg").string(), 0});
      }
      for (const OnError policy : {OnError::raise, OnError::skip}) {
        auto loader = coload::make_data_loader(
            pipeline, {.batch_size = 4, .num_workers = 2, .seed = 0, .on_error = policy});
        const std::vector<Batch> batches = batches_of(loader);
        REQUIRE(batches.size() == (with_file ? 4u : 3u));
        check_batch(pipeline, batches[0], {0, 1, 2, 3});
        check_batch(pipeline, batches[1], {4, 5, 6, 7});
        check_batch(pipeline, batches[2], {8, 9, 10, 11});
        if (with_file) check_batch(pipeline, batches[3], {12});
        CHECK(loader.skipped() == 0);
      }
    }
  }

  // Samples 0-3 (the whole of batch 0) are bad, each in its own way.
  std::vector<std::pair<int, BadInput>> bad_first_batch() {
    return {{0, zero_bytes()}, {1, truncated()}, {2, corrupt_header()}, {3, dangling_symlink()}};
  }

  TEST_CASE("pipeline: bad input: a batch whose every sample is bad, on_error = raise") {
    for (const LoaderSetup setup : kSetups) {
      CAPTURE(setup.workers);
      CAPTURE(setup.pread);
      const ForcePread force(setup.pread);
      const auto bad = bad_first_batch();
      {
        // raise: the first batch's place holds the error, the others arrive.
        const BadFolder folder(bad);
        const ImagePipeline pipeline = folder.pipeline();
        auto loader = coload::make_data_loader(
            pipeline, {.batch_size = 4, .num_workers = setup.workers, .seed = 0});
        const std::vector<Delivered> out = run_epoch(loader);
        REQUIRE(out.size() == 3);
        REQUIRE(out[0].error);
        CHECK(out[0].error_index >= 0);
        CHECK(out[0].error_index <= 3);
        CHECK(out[0].error_batch == 0);
        int named = 0;
        for (const auto& [path, input] : folder.bad) {
          if (out[0].what.find(quoted(path)) != std::string::npos) ++named;
        }
        CHECK(named == 1);
        REQUIRE(out[1].batch);
        check_batch(pipeline, *out[1].batch, {4, 5, 6, 7});
        REQUIRE(out[2].batch);
        check_batch(pipeline, *out[2].batch, {8, 9, 10, 11});
      }
    }
  }

  // (At 286001e the loader wrapped EmptyBatch as a WorkerError; fixed in 16f8aa2.)
  TEST_CASE("pipeline: bad input: a batch whose every sample is bad, on_error = skip") {
    for (const LoaderSetup setup : kSetups) {
      CAPTURE(setup.workers);
      CAPTURE(setup.pread);
      const ForcePread force(setup.pread);
      const auto bad = bad_first_batch();
      {
        // skip: the emptied batch is left out of the epoch; each sample is counted and named.
        const BadFolder folder(bad);
        const ImagePipeline pipeline = folder.pipeline();
        auto loader = coload::make_data_loader(
            pipeline,
            {.batch_size = 4, .num_workers = setup.workers, .seed = 0, .on_error = OnError::skip});
        CHECK(loader.size() == 3);
        std::vector<Delivered> out;
        std::string err;
        {
          StderrCapture capture;
          out = run_epoch(loader);
          err = capture.text();
        }
        for (const Delivered& d : out) CHECK_MESSAGE(!d.error, d.what);
        REQUIRE(out.size() == 2);
        REQUIRE(out[0].batch);
        check_batch(pipeline, *out[0].batch, {4, 5, 6, 7});
        REQUIRE(out[1].batch);
        check_batch(pipeline, *out[1].batch, {8, 9, 10, 11});
        CHECK(loader.skipped() == 4);
        CAPTURE(err);
        CHECK(count_of(err, "coload: skipping sample") == 4);
        for (int i = 0; i < 4; ++i) {
          const std::string prefix = "coload: skipping sample " + std::to_string(i) + ": ";
          const auto at = err.find(prefix);
          REQUIRE(at != std::string::npos);
          const std::string line = err.substr(at, err.find('\n', at) - at);
          const auto& [path, input] = folder.bad.at(static_cast<std::size_t>(i));
          CHECK(line.find(quoted(path)) != std::string::npos);
          CHECK(line.find(input.expected.back()) != std::string::npos);
        }
      }
    }
  }

  // (At 286001e a whole-batch fetch's error had index -1; fixed in 16f8aa2.)
  TEST_CASE("pipeline: a WorkerError for a bad image names the sample index") {
    // LoaderError's contract: index() is the failing sample, or -1 when the failure was not one
    // sample's (collate); what() then reads "... while fetching sample 5 of batch 1: ...".
    const BadFolder folder({{5, zero_bytes()}});
    const ImagePipeline pipeline = folder.pipeline();
    for (const int workers : {0, 2}) {
      CAPTURE(workers);
      auto loader =
          coload::make_data_loader(pipeline, {.batch_size = 4, .num_workers = workers, .seed = 0});
      const std::vector<Delivered> out = run_epoch(loader);
      REQUIRE(out.size() == 3);
      REQUIRE(out[1].error);
      CAPTURE(out[1].what);
      CHECK(out[1].error_index == 5);
      CHECK(out[1].what.find("sample 5 of batch 1") != std::string::npos);
    }
  }

  TEST_CASE("pipeline: a missing root, a root without classes, an empty class folder") {
    const test::TempDir dir;
    const fs::path missing = dir / "missing";
    try {
      ImagePipeline pipeline(missing, small_eval());
      FAIL("constructed over a missing root");
    } catch (const FolderError& e) {
      CHECK(std::string(e.what()) ==
            "[Errno 2] No such file or directory: '" + missing.string() + "'");
      CHECK(e.error_number() == ENOENT);
    }

    const fs::path bare = dir / "bare";
    fs::create_directories(bare);
    test::write_bytes(bare / "loose.jpg", test::synthetic_jpeg(64, 48, 1));
    const std::string no_class = "Couldn't find any class folder in " + bare.string() + ".";
    CHECK_THROWS_WITH_AS(ImagePipeline(bare, small_eval()), no_class.c_str(), FolderError);

    // Class b is empty, class c holds no image file: torchvision's message lists both.
    const fs::path root = dir / "root";
    write_jpeg(root / "a/0.jpg", 1);
    write_jpeg(root / "a/1.jpg", 2);
    fs::create_directories(root / "b");
    fs::create_directories(root / "c");
    test::write_bytes(root / "c/notes.txt", std::string("not an image"));
    CHECK_THROWS_WITH_AS(ImagePipeline(root, small_train()),
                         "Found no valid file for the classes b, c. Supported extensions are: "
                         ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp",
                         FolderError);
    try {
      ImagePipeline pipeline(root, small_train());
    } catch (const FolderError& e) {
      CHECK(e.error_number() == 0);
    }

    // allow_empty keeps them as classes without samples.
    FolderOptions allow_empty;
    allow_empty.allow_empty = true;
    const ImagePipeline pipeline(root, small_eval(), allow_empty);
    CHECK(pipeline.index().classes == std::vector<std::string>{"a", "b", "c"});
    REQUIRE(pipeline.size() == 2);
    auto loader = coload::make_data_loader(pipeline, {.batch_size = 4, .seed = 0});
    const std::vector<Batch> batches = batches_of(loader);
    REQUIRE(batches.size() == 1);
    check_batch(pipeline, batches[0], {0, 1});
  }

  // (At 286001e io::Reader blocked forever opening a FIFO, with either backend; fixed in
  // 18dd2e1.) Should a read block again, the loader's 5 s timeout fires and the FIFO is opened
  // for writing, which releases the reader, so the test fails instead of hanging.
  TEST_CASE("pipeline: bad input: a FIFO named .jpg, io_uring reader") {
    check_fifo(false);
  }

  TEST_CASE("pipeline: bad input: a FIFO named .jpg, pread reader") {
    check_fifo(true);
  }

  // (At 286001e get() blocked opening a FIFO; fixed in 16f8aa2.) A blocked get() is released
  // after 5 s, so the test fails instead of hanging.
  TEST_CASE("pipeline: get() of a FIFO named .jpg gives an error instead of blocking") {
    const BadFolder folder({{5, fifo()}});
    const ImagePipeline pipeline = folder.pipeline();
    const fs::path bad = folder.bad.at(0).first;
    auto result = std::async(std::launch::async, [&] {
      try {
        single(pipeline, 5, 0);
        return std::string("no error");
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    });
    bool blocked = false;
    if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      blocked = true;
      release_fifo_reader(bad);
    }
    const std::string what = result.get();
    CHECK_MESSAGE(!blocked, "get() blocked opening a FIFO without a writer");
    CHECK(what.find(quoted(bad) + " (a FIFO, not a regular file)") != std::string::npos);
  }

  TEST_CASE("pipeline: the loader's metrics see each image's read (with its bytes), decode and "
            "transform") {
    const SmallFolder folder;
    std::uint64_t file_bytes = 0;
    for (const auto& e : fs::recursive_directory_iterator(folder.root())) {
      if (e.is_regular_file()) file_bytes += static_cast<std::uint64_t>(e.file_size());
    }
    // One epoch through get_batch_async (reads through the loader's reader, decode and transform
    // on the workers) of the folder at `root`, in batches of `batch_size`; its metrics.
    auto epoch_metrics = [](const fs::path& root, bool train, std::int64_t batch_size, int workers,
                            std::size_t batches) {
      auto pipeline =
          train ? ImagePipeline(root, small_train()) : ImagePipeline(root, small_eval());
      auto loader = coload::make_data_loader(
          std::move(pipeline), {.batch_size = batch_size, .num_workers = workers, .seed = 0});
      CHECK(batches_of(loader).size() == batches);
      return loader.metrics();
    };
    for (const bool train : {true, false}) {
      CAPTURE(train);
      const coload::Metrics m = epoch_metrics(folder.root(), train, 4, 2, 3);
      CHECK(m.stage(coload::Stage::read).count == 10);
      CHECK(m.stage(coload::Stage::decode).count == 10);
      CHECK(m.stage(coload::Stage::transform).count == 10);
      CHECK(m.bytes_read == file_bytes);
      CHECK(m.samples == 10);
      CHECK(m.batches == 3);
      // The workers' time is decode and transform (the reads held no worker).
      CHECK(m.worker_seconds[static_cast<std::size_t>(coload::Stage::read)] == 0);
      CHECK(m.worker_seconds[static_cast<std::size_t>(coload::Stage::decode)] > 0);
    }
    // Progressive JPEGs, which the region decoder declines: one decode each all the same (the
    // eval transform counted its declined attempt as a second).
    const test::TempDir progressive;
    fs::create_directories(progressive / "c");
    for (int i = 0; i < 3; ++i) {
      test::write_bytes(progressive / ("c/p" + std::to_string(i) + ".jpg"),
                        test::progressive_jpeg(64, 48, static_cast<std::uint32_t>(20 + i)));
    }
    for (const bool train : {true, false}) {
      CAPTURE(train);
      const coload::Metrics m = epoch_metrics(progressive.path(), train, 2, 1, 2);
      CHECK(m.stage(coload::Stage::decode).count == 3);
      CHECK(m.stage(coload::Stage::transform).count == 3);
    }
  }

  // (Issue 30: at 9b003d1 each asynchronous read's latency was added to `read`, though a batch
  // has all its reads in flight at once; a worker process, which reaps its own reads, was
  // counted busy reading for their sum: `read` 141 s in a 2.7 s epoch, and a verdict blaming
  // reads where decoding costs.) A worker is one thread or one process, so what it is recorded
  // busy with fits in the epoch: no stage, and no worker's stages together, exceed the epoch's
  // seconds times the workers. No slack: every span lies inside the window (a fresh loader's
  // first epoch, read after its last batch).
  TEST_CASE("pipeline: metrics: no stage takes more than the epoch times the workers, and the "
            "verdict names decode when decoding costs, with threads or processes") {
    // JPEGs in the page cache (just written), decoded at full size (no DCT scaling) and
    // resampled to a small output: decoding is the work.
    const test::TempDir folder;
    constexpr int files = 96;
    for (int i = 0; i < files; ++i) {
      write_jpeg(folder / ("c" + std::to_string(i % 3) + "/" + std::to_string(i) + ".jpg"),
                 static_cast<std::uint32_t>(300 + i), 640, 480);
    }
    constexpr int workers = 2;
    for (const Executor executor : {Executor::threads, Executor::processes}) {
      CAPTURE(executor == Executor::processes);
      TrainTransform full_decode = small_train();
      full_decode.dct_scaling = false;
      auto loader = coload::make_data_loader(
          ImagePipeline(folder.path(), full_decode),
          {.batch_size = 16, .num_workers = workers, .seed = 0, .executor = executor});
      REQUIRE(batches_of(loader).size() == 6);
      const coload::Metrics m = loader.metrics();
      CAPTURE(m.to_json());
      CAPTURE(m.report());
      REQUIRE(m.seconds > 0);
      const double bound = m.seconds * workers;
      double worker_busy = 0;
      for (std::size_t s = 0; s < coload::stage_count; ++s) {
        CAPTURE(coload::stage_name(static_cast<coload::Stage>(s)));
        CHECK(m.stages[s].seconds <= bound);
        if (static_cast<coload::Stage>(s) != coload::Stage::wait) worker_busy += m.worker_seconds[s];
      }
      CHECK(worker_busy <= bound);
      CHECK(m.stage(coload::Stage::read).count == files);
      CHECK(m.stage(coload::Stage::decode).count == files);
      // Each file's latency, from its read's start to its data reaching the fetch, apart.
      CHECK(m.read_latency.count == files);
      CHECK(m.read_latency.p50_ms > 0);
      // The consumer does nothing, so the epoch is input-bound; the waits on reads are not what
      // costs most, whatever the build. (A worker process does wait on its own reads, which it
      // starts only once it has the task: the verdict may name read second, as it did with
      // "decode 78% of their time, read 12%" against libtorch 2.11.)
      const std::string report = m.report();
      CHECK(report.rfind("input-bound", 0) == 0);
      CHECK(report.find(" busy, read ") == std::string::npos);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
      // Decoding is. (Under a sanitizer our own resampling is instrumented and libturbojpeg's
      // decoder is not: the transform costs most there.)
      CHECK(report.find(" busy, decode ") != std::string::npos);
      CHECK(report.find(" decode would help") != std::string::npos);
#endif
    }
  }

}  // TEST_SUITE("vision")
