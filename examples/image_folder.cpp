// examples/image_folder: coload's main job. An ImageNet-style input pipeline over a folder of
// JPEGs (read through io_uring, decoded and augmented on workers, collated into batches) feeding
// a tiny classifier.
//
//   image_folder ROOT [--batch-size 64] [--workers 2] [--executor threads|processes]
//                [--epochs 1] [--seed 0] [--eval] [--limit N] [--json]
//                [--hashes] [--state FILE] [--resume FILE]
//   image_folder --shards DIR [the same options]
//
// With --shards DIR the images come from tar shards (as coload-shard packs a folder: WebDataset
// layout, the label in each sample's cls field, the class names in DIR/classes.txt) instead
// of ROOT, read with one ranged read per sample.
// ROOT holds one sub-folder per class, as torchvision's ImageFolder reads it. Each epoch runs
// the standard train transform (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
// Normalize) in shuffled order, or with --eval the eval transform (Resize(256),
// CenterCrop(224), ToTensor, Normalize) in folder order; the model trains on the batches either
// way. Per epoch it prints the images, seconds, images/s, the seconds the consumer spent
// blocked waiting for a batch, and the mean loss; while an epoch runs a progress bar goes to
// stderr (a line every few seconds when stderr is not a terminal). With --json, stdout is
// exactly one JSON object per epoch, one per line:
//   {"epoch": 0, "images": 1000, "seconds": 0.41, "images_per_s": 2439.0,
//    "wait_seconds": 0.01, "loss": 2.1, "accuracy": 0.31, "digest": "9f0c..."}
// "digest" hashes every batch of the epoch in delivery order (coload::Digest), so two runs can
// be compared from the command line; --hashes also prints, after each batch, a line
// `batch <epoch> <n> <hex>` with that batch's hash (n counts the epoch's batches from 0).
// --state FILE saves the loader's state after every batch (before its hash line); --resume
// FILE starts the loader from such a state (the model starts afresh: only the data resumes).
// Exit status: 0, 1 on an error (a missing or empty ROOT, an unreadable image), 2 on bad flags.

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coload/coload.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/shard_pipeline.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Args {
  std::string root;
  std::int64_t batch_size = 64;
  std::int64_t workers = 2;
  std::string executor = "threads";
  std::int64_t epochs = 1;
  std::int64_t seed = 0;
  bool eval = false;
  std::optional<std::int64_t> limit;
  bool json = false;
  bool hashes = false;
  std::string state_file;
  std::string resume_file;
  std::string shards;  // --shards DIR: train from tar shards instead of ROOT
};

constexpr const char* kUsage =
    "usage: image_folder ROOT [--batch-size 64] [--workers 2] [--executor threads|processes]\n"
    "                    [--epochs 1] [--seed 0] [--eval] [--limit N] [--json]\n"
    "                    [--hashes] [--state FILE] [--resume FILE]\n"
    "       image_folder --shards DIR [the same options]\n"
    "  ROOT              a folder of class sub-folders of images (torchvision's ImageFolder)\n"
    "  --batch-size N    images per batch (default 64)\n"
    "  --workers N       loader workers; 0 decodes on the loader's own thread (default 2)\n"
    "  --executor KIND   threads (default) or processes\n"
    "  --epochs N        passes over the data (default 1)\n"
    "  --seed N          seeds the shuffle, every crop and flip, and the model (default 0)\n"
    "  --eval            eval transform (resize 256, centre-crop 224) in folder order\n"
    "  --limit N         use only the first N images of the folder\n"
    "  --json            stdout: one JSON object per epoch (and --hashes lines)\n"
    "  --hashes          after each batch: batch <epoch> <n> <hash of its bytes>\n"
    "  --state FILE      save the loader's state to FILE after every batch\n"
    "  --resume FILE     start from a state saved with --state (--epochs counts from 0)\n"
    "  --shards DIR      train from the tar shards in DIR (coload-shard's output) instead of ROOT\n";

[[noreturn]] void usage(int rc) {
  std::fputs(kUsage, rc ? stderr : stdout);
  std::exit(rc);
}

std::int64_t parse_count(std::string_view value, std::int64_t min) {
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n < min) usage(2);
  return n;
}

Args parse_args(int argc, char** argv) {
  Args args;
  bool have_root = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    // Both `--flag value` and `--flag=value`.
    std::optional<std::string_view> inline_value;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != flag.npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 == argc) usage(2);
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) usage(2);
    };
    if (flag == "--help" || flag == "-h") {
      usage(0);
    } else if (flag == "--batch-size") {
      args.batch_size = parse_count(value(), 1);
    } else if (flag == "--workers") {
      args.workers = parse_count(value(), 0);
    } else if (flag == "--executor") {
      args.executor = value();
      if (args.executor != "threads" && args.executor != "processes") usage(2);
    } else if (flag == "--epochs") {
      args.epochs = parse_count(value(), 1);
    } else if (flag == "--seed") {
      args.seed = parse_count(value(), 0);
    } else if (flag == "--limit") {
      args.limit = parse_count(value(), 1);
    } else if (flag == "--eval") {
      no_value();
      args.eval = true;
    } else if (flag == "--json") {
      no_value();
      args.json = true;
    } else if (flag == "--hashes") {
      no_value();
      args.hashes = true;
    } else if (flag == "--state") {
      args.state_file = value();
    } else if (flag == "--resume") {
      args.resume_file = value();
    } else if (flag == "--shards") {
      args.shards = value();
    } else if (flag.starts_with("-") || have_root) {
      usage(2);
    } else {
      args.root = flag;
      have_root = true;
    }
  }
  if (have_root == !args.shards.empty()) usage(2);
  return args;
}

/// A classifier that is cheap next to decoding: the 224×224 input averaged down to 8×8 (what
/// is left is the colour layout, and the synthetic classes differ by hue), then a two-layer
/// MLP. Keeping it this small keeps the data pipeline the bottleneck, which is what the
/// example measures.
struct Classifier {
  Classifier(std::int64_t classes)
      : model(torch::nn::AdaptiveAvgPool2d(8), torch::nn::Flatten(),
              torch::nn::Linear(3 * 8 * 8, 128), torch::nn::ReLU(),
              torch::nn::Linear(128, classes)),
        optimizer(model->parameters(), torch::optim::AdamOptions(3e-3)) {}

  /// One optimiser step on a batch: its mean loss and how many images it got right.
  std::pair<double, std::int64_t> train(const at::Tensor& images, const at::Tensor& labels) {
    optimizer.zero_grad();
    const auto logits = model->forward(images);
    auto loss = torch::nn::functional::cross_entropy(logits, labels);
    loss.backward();
    optimizer.step();
    const auto correct = logits.argmax(1).eq(labels).sum().item<std::int64_t>();
    return {loss.item<double>(), correct};
  }

  torch::nn::Sequential model;
  torch::optim::Adam optimizer;
};

/// What one epoch measured.
struct EpochStats {
  std::int64_t images = 0;
  double seconds = 0;
  double wait_seconds = 0;
  double loss_sum = 0;  // weighted by batch size: the last batch may be short
  std::int64_t correct = 0;
  coload::Digest digest;

  double images_per_s() const { return seconds > 0 ? static_cast<double>(images) / seconds : 0; }
  double mean_loss() const { return images ? loss_sum / static_cast<double>(images) : 0; }
  double accuracy() const {
    return images ? static_cast<double>(correct) / static_cast<double>(images) : 0;
  }
};

/// The live view of an epoch on stderr: a bar redrawn in place on a terminal; elsewhere (a log
/// file, CI) a plain line every few seconds, since carriage returns would garble it.
class Progress {
 public:
  Progress(std::int64_t epoch, std::int64_t total, bool quiet_when_not_tty)
      : epoch_(epoch), total_(total), tty_(isatty(STDERR_FILENO) != 0),
        enabled_(tty_ || !quiet_when_not_tty) {}

  void update(const EpochStats& s) {
    if (!enabled_) return;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(s.images) / elapsed : 0;
    if (tty_) {
      // Redrawing costs a write per batch; ten times a second is plenty for the eye.
      if (s.images < total_ && now - last_ < std::chrono::milliseconds(100)) return;
      constexpr int kWidth = 30;
      const auto filled = static_cast<int>(kWidth * s.images / std::max<std::int64_t>(total_, 1));
      std::string bar(static_cast<std::size_t>(filled), '=');
      if (filled < kWidth) bar += '>';
      bar.resize(kWidth, ' ');
      std::fprintf(stderr, "\repoch %lld [%s] %lld/%lld  %.0f images/s  loss %.4f\x1b[K",
                   static_cast<long long>(epoch_), bar.c_str(), static_cast<long long>(s.images),
                   static_cast<long long>(total_), rate, s.mean_loss());
    } else {
      if (now - last_ < std::chrono::seconds(5)) return;
      std::fprintf(stderr, "epoch %lld: %lld/%lld images  %.0f images/s  loss %.4f\n",
                   static_cast<long long>(epoch_), static_cast<long long>(s.images),
                   static_cast<long long>(total_), rate, s.mean_loss());
    }
    last_ = now;
  }

  /// Clears the bar so the epoch's summary line takes its place.
  void finish() {
    if (enabled_ && tty_) std::fputs("\r\x1b[K", stderr);
  }

 private:
  std::int64_t epoch_;
  std::int64_t total_;
  bool tty_;
  bool enabled_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

template <class Loader>
EpochStats run_epoch(Loader& loader, Classifier& classifier, std::int64_t epoch_no,
                     std::int64_t total, const Args& args) {
  EpochStats stats;
  // With --json a harness is reading; it gets the bar only if it handed over a terminal.
  Progress progress(epoch_no, total, args.json);
  const auto start = Clock::now();
  // A resumed epoch goes on counting its batches where the saved run stopped.
  std::int64_t batch_no = loader.state().delivered;
  auto epoch = loader.epoch();
  for (;;) {
    // The time spent blocked here is the time the trainer was starved: 0 means the pipeline
    // keeps up with the model, and anything near `seconds` means the data is the bottleneck.
    const auto wait_start = Clock::now();
    auto batch = coload::sync_wait(epoch.next());
    stats.wait_seconds += seconds_since(wait_start);
    if (!batch) break;
    const auto& [images, labels] = *batch;
    if (!args.state_file.empty()) loader.save_state(args.state_file);
    if (args.hashes || args.json) {
      const std::uint64_t h = coload::Digest().add(images).add(labels).value();
      stats.digest.add(h);
      if (args.hashes) {
        std::printf("batch %lld %lld %016llx\n", static_cast<long long>(epoch_no),
                    static_cast<long long>(batch_no), static_cast<unsigned long long>(h));
        std::fflush(stdout);
      }
    }
    ++batch_no;
    const auto [loss, correct] = classifier.train(images, labels);
    const auto n = images.size(0);
    stats.images += n;
    stats.loss_sum += loss * static_cast<double>(n);
    stats.correct += correct;
    progress.update(stats);
  }
  stats.seconds = seconds_since(start);
  progress.finish();
  return stats;
}

/// --shards DIR: the same training loop over tar shards (ShardImagePipeline: one ranged read
/// per sample through the loader's reader, the same fused transforms, labels from cls).
int train_from_shards(const Args& args) {
  std::vector<std::string> class_names;
  {
    std::ifstream in(std::filesystem::path(args.shards) / "classes.txt");
    for (std::string line; std::getline(in, line);) class_names.push_back(line);
  }
  if (args.limit) throw std::runtime_error("--limit does not apply to --shards (pack fewer images)");
  if (class_names.empty()) {
    throw std::runtime_error("--shards " + args.shards +
                             ": no classes.txt there (coload-shard writes it beside the shards)");
  }
  coload::vision::ShardImagePipeline::Transform transform = coload::vision::TrainTransform{};
  if (args.eval) transform = coload::vision::EvalTransform{};
  coload::vision::ShardImagePipeline pipeline(coload::shards::ShardDataset(args.shards),
                                              transform);
  const auto classes = static_cast<std::int64_t>(class_names.size());
  const std::int64_t images = pipeline.size();
  auto loader = coload::make_data_loader(
      std::move(pipeline),
      {.batch_size = args.batch_size,
       .shuffle = !args.eval,
       .num_workers = static_cast<int>(args.workers),
       .seed = static_cast<std::uint64_t>(args.seed),
       .executor = args.executor == "processes" ? coload::Executor::processes
                                                : coload::Executor::threads});
  if (!args.json) {
    std::printf("%s: %lld images in %lld classes from shards; %s transform, batch %lld, %lld "
                "workers\n",
                args.shards.c_str(), static_cast<long long>(images),
                static_cast<long long>(classes), args.eval ? "eval" : "train",
                static_cast<long long>(args.batch_size), static_cast<long long>(args.workers));
    std::fflush(stdout);
  }
  std::int64_t first_epoch = 0;
  if (!args.resume_file.empty()) {
    loader.load_state(args.resume_file);
    first_epoch = loader.state().epoch;
  }
  Classifier classifier(classes);
  for (std::int64_t e = first_epoch; e < args.epochs; ++e) {
    const EpochStats s = run_epoch(loader, classifier, e, images, args);
    std::printf(args.json ? "{\"epoch\": %lld, \"images\": %lld, \"seconds\": %.4f, "
                            "\"images_per_s\": %.1f, \"wait_seconds\": %.4f, \"loss\": %.4f, "
                            "\"accuracy\": %.4f, \"digest\": \"%016llx\"}\n"
                          : "epoch %lld  %lld images  %.2f s  %.1f images/s  waited %.2f s  "
                            "loss %.4f  accuracy %.4f  digest %016llx\n",
                static_cast<long long>(e), static_cast<long long>(s.images), s.seconds,
                s.images_per_s(), s.wait_seconds, s.mean_loss(), s.accuracy(),
                static_cast<unsigned long long>(s.digest.value()));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  // The model runs on this thread alone: libtorch's intra-op threads would only compete with
  // the loader's workers for the same cores.
  torch::set_num_threads(1);
  torch::manual_seed(static_cast<std::uint64_t>(args.seed));
  if (!args.shards.empty()) return train_from_shards(args);

  // Index once, then cut to --limit: the first N samples in folder order, the same every run.
  coload::vision::FolderOptions folder_options;
  folder_options.extensions.emplace(coload::vision::image_extensions.begin(),
                                    coload::vision::image_extensions.end());
  auto index = coload::vision::index_folder(args.root, folder_options);
  if (args.limit && *args.limit < static_cast<std::int64_t>(index.samples.size())) {
    index.samples.resize(static_cast<std::size_t>(*args.limit));
    index.targets.resize(static_cast<std::size_t>(*args.limit));
  }
  const auto classes = static_cast<std::int64_t>(index.classes.size());
  const auto images = static_cast<std::int64_t>(index.samples.size());

  coload::vision::ImagePipeline::Transform transform = coload::vision::TrainTransform{};
  if (args.eval) transform = coload::vision::EvalTransform{};
  auto loader = coload::make_data_loader(
      coload::vision::ImagePipeline(std::move(index), transform),
      {.batch_size = args.batch_size,
       .shuffle = !args.eval,
       .num_workers = static_cast<int>(args.workers),
       .seed = static_cast<std::uint64_t>(args.seed),
       .executor = args.executor == "processes" ? coload::Executor::processes
                                                : coload::Executor::threads});

  if (!args.json) {
    std::printf("%s: %lld images in %lld classes; %s transform, batch %lld, ", args.root.c_str(),
                static_cast<long long>(images), static_cast<long long>(classes),
                args.eval ? "eval" : "train", static_cast<long long>(args.batch_size));
    if (args.workers == 0) {
      std::printf("no workers (decoding on the loader's thread)\n");
    } else {
      std::printf("%lld worker %s\n", static_cast<long long>(args.workers),
                  args.executor == "processes" ? "processes" : "threads");
    }
    std::fflush(stdout);
  }

  std::int64_t first_epoch = 0;
  if (!args.resume_file.empty()) {
    loader.load_state(args.resume_file);
    first_epoch = loader.state().epoch;
  }

  Classifier classifier(classes);
  for (std::int64_t e = first_epoch; e < args.epochs; ++e) {
    const EpochStats s = run_epoch(loader, classifier, e, images, args);
    if (args.json) {
      std::printf(
          "{\"epoch\": %lld, \"images\": %lld, \"seconds\": %.4f, \"images_per_s\": %.1f, "
          "\"wait_seconds\": %.4f, \"loss\": %.4f, \"accuracy\": %.4f, "
          "\"digest\": \"%016llx\"}\n",
          static_cast<long long>(e), static_cast<long long>(s.images), s.seconds,
          s.images_per_s(), s.wait_seconds, s.mean_loss(), s.accuracy(),
          static_cast<unsigned long long>(s.digest.value()));
    } else {
      std::printf(
          "epoch %lld  %lld images  %.2f s  %.1f images/s  waited %.2f s (%.0f%%)  "
          "loss %.4f  accuracy %.1f%%\n",
          static_cast<long long>(e), static_cast<long long>(s.images), s.seconds,
          s.images_per_s(), s.wait_seconds, s.seconds > 0 ? 100 * s.wait_seconds / s.seconds : 0,
          s.mean_loss(), 100 * s.accuracy());
    }
    // Flushed per epoch so a harness reading a pipe sees each line as it happens.
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  // FolderError (a missing or empty root, named), or a WorkerError naming the file that failed.
  std::fprintf(stderr, "image_folder: %s\n", e.what());
  return 1;
}
