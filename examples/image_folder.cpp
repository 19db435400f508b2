// examples/image_folder: coload's main job. An ImageNet-style input pipeline over a folder of
// JPEGs (read through io_uring, decoded and augmented on workers, collated into batches) feeding
// a tiny classifier.
//
//   image_folder ROOT [--batch-size 64] [--workers 2] [--executor threads|processes]
//                [--epochs 1] [--seed 0] [--val-fraction 0.2] [--limit N] [--json]
//                [--hashes] [--state FILE] [--resume FILE] [--trace FILE] [--recipe NAME]
//   image_folder --shards DIR|URL [--cache-dir DIR] [--cache-mib 10240] [the same options]
//
// ROOT holds one sub-folder per class, as torchvision's ImageFolder reads it. A fraction of
// the images (--val-fraction, default 0.2; 0 turns it off) is held out as a validation split
// with random_split seeded by --seed. Each epoch trains on the rest with the standard train
// transform (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize) in shuffled
// order, then evaluates the model on the validation split with the eval transform (Resize(256),
// CenterCrop(224), ToTensor, Normalize) in order. Per epoch it prints the images, seconds,
// images/s, the seconds the consumer spent blocked waiting for a batch, the mean loss, the
// training accuracy and the validation accuracy, then the loader's verdict on where the time
// went (DataLoader::metrics().report()); while an epoch runs a progress bar goes to
// With --shards DIR the images come from tar shards (as coload-shard packs a folder: WebDataset
// layout, the label in each sample's cls field, the class names in DIR/classes.txt) instead
// of ROOT, read with one ranged read per sample; that path trains on every image (no
// validation split: --val-fraction and --limit apply to ROOT). With --cache-dir, shards named
// by URL are also kept on local disk (at most --cache-mib), so later epochs and runs read them
// from there.
// stderr with the percent done, the elapsed time and the ETA, as tqdm shows them (a line every
// few seconds when stderr is not a terminal). With --json, stdout is
// exactly one JSON object per epoch, one per line:
//   {"epoch": 0, "images": 480, "seconds": 0.41, "images_per_s": 1170.7,
//    "wait_seconds": 0.01, "loss": 2.1, "accuracy": 0.31, "val_images": 120,
//    "val_accuracy": 0.42, "digest": "9f0c...", "verdict": "input-bound: ...",
//    "metrics": {"seconds": ..., "stages": {"read": {...}, "decode": {...}, ...}, ...}}
// where "metrics" is the training loader's Metrics::to_json() for the epoch (per stage: count,
// seconds, p50/p95/p99 in ms; per worker its busy fraction; the consumer's wait fraction).
// "digest" hashes every training batch of the epoch in delivery order (coload::Digest), so two
// runs can be compared from the command line; --hashes also prints, after each batch, a line
// `batch <epoch> <n> <hex>` with that batch's hash (n counts the epoch's batches from 0).
// --state FILE saves the training loader's state after every batch (before its hash line);
// --resume FILE starts the training loader from such a state (the model starts afresh: only
// the data resumes). --trace FILE writes a Chrome trace of the training loader (open it in
// Perfetto or chrome://tracing): a track per worker, a span per sample's read, decode and
// transform, each batch's collate, hand-off and the trainer's waits.
// Exit status: 0, 1 on an error (a missing or empty ROOT, an unreadable image), 2 on bad flags
// (an unknown flag is named).

#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "coload/coload.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/shard_pipeline.hpp"

#include <nlohmann/json.hpp>

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
  double val_fraction = 0.2;
  std::optional<std::int64_t> limit;
  bool json = false;
  bool hashes = false;
  std::string state_file;
  std::string resume_file;
  std::string shards;  // --shards DIR: train from tar shards instead of ROOT
  std::string cache_dir;  // --cache-dir DIR: keep shards named by URL there
  std::uint64_t cache_mib = 10240;  // --cache-mib N: its bound
  std::string trace;   // --trace FILE: the training loader's Chrome trace
  std::string recipe;  // --recipe NAME: a preset's train and eval recipes (vision::presets)
};

/// The train (or eval) transform: the fixed TrainTransform/EvalTransform, or the recipes of the
/// preset that --recipe names.
coload::vision::FusedTransform transform_of(const Args& args, bool train) {
  namespace vision = coload::vision;
  if (args.recipe.empty()) {
    return train ? vision::FusedTransform{vision::TrainTransform{}}
                 : vision::FusedTransform{vision::EvalTransform{}};
  }
  return train ? vision::presets::train(args.recipe) : vision::presets::eval(args.recipe);
}

/// Seconds as m:ss (or h:mm:ss), as tqdm shows elapsed time and the ETA.
std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  }
  return text;
}

/// A 64-bit hash as 16 hex digits.
std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse_args(int argc, char** argv) {
  Args args;
  CLI::App app{"image_folder: an ImageNet-style input pipeline over a folder of JPEGs, "
               "feeding a tiny classifier"};
  app.add_option("ROOT", args.root,
                 "a folder of class sub-folders of images (torchvision's ImageFolder)");
  // NOTE: ROOT is checked after parsing, so that an unknown flag is named before it.
  app.add_option("--batch-size", args.batch_size, "images per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // A count an int holds: 4294967296 was cast to 0 workers.
  app.add_option("--workers", args.workers,
                 "loader workers; 0 decodes on the loader's own thread")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1024}))
      ->capture_default_str();
  app.add_option("--executor", args.executor, "where the workers run")
      ->check(CLI::IsMember({"threads", "processes"}))
      ->capture_default_str();
  app.add_option("--epochs", args.epochs, "passes over the data")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", args.seed,
                 "seeds the split, the shuffle, every crop and flip, and the model")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--val-fraction", args.val_fraction,
                 "held out for validation (eval transform); 0: no validation")
      ->check(CLI::Validator(
          [](std::string& s) {
            // CLI11's Range lets "nan" through (its comparisons are false).
            return std::isfinite(std::strtod(s.c_str(), nullptr))
                       ? std::string()
                       : "Value " + s + " is not a finite number";
          },
          "FINITE"))
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--limit", args.limit, "use only the first N images of the folder")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", args.json, "stdout: one JSON object per epoch (and --hashes lines)");
  app.add_flag("--hashes", args.hashes,
               "after each training batch: batch <epoch> <n> <hash of its bytes>");
  app.add_option("--state", args.state_file,
                 "save the training loader's state to FILE after every batch");
  app.add_option("--resume", args.resume_file,
                 "start from a state saved with --state (--epochs counts from 0)");
  app.add_option("--shards", args.shards,
                 "train from the tar shards in DIR (coload-shard's output) instead of ROOT; DIR "
                 "may be one shard, a brace pattern (shard-{000000..000009}.tar), or a URL of "
                 "one: http(s)://host/folder, s3://bucket/prefix, file:///folder");
  app.add_option("--cache-dir", args.cache_dir,
                 "with --shards URL: keep the shards on local disk in DIR, so that later epochs "
                 "read them from there (ShardOptions::cache_dir)");
  app.add_option("--cache-mib", args.cache_mib, "the --cache-dir's bound, in MiB")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--recipe", args.recipe,
                 "train and evaluate with a preset's recipes (vision::presets) instead of the "
                 "fixed TrainTransform and EvalTransform")
      ->check(CLI::IsMember(coload::vision::presets::names()));
  app.add_option("--trace", args.trace,
                 "write a Chrome trace of the training loader to FILE (Perfetto opens it)");
  try {
    app.parse(argc, argv);
    if (args.root.empty() == args.shards.empty()) {
      throw CLI::ValidationError("ROOT/--shards", "give either ROOT or --shards DIR, not both");
    }
    if (!args.cache_dir.empty() && args.shards.empty()) {
      throw CLI::ValidationError("--cache-dir", "keeps shards named by URL: give --shards URL");
    }
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
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
    // A recipe's MixUp or CutMix makes the labels soft ([N, classes] probabilities, which
    // cross_entropy takes as they are): an image counts as right where the model picks the
    // class with the largest share.
    const auto hard = labels.dim() == 2 ? labels.argmax(1) : labels;
    const auto correct = logits.argmax(1).eq(hard).sum().item<std::int64_t>();
    return {loss.item<double>(), correct};
  }

  /// How many images of a batch the model gets right, without training on them.
  std::int64_t evaluate(const at::Tensor& images, const at::Tensor& labels) {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto correct = model->forward(images).argmax(1).eq(labels).sum().item<std::int64_t>();
    model->train();
    return correct;
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
  std::int64_t val_images = 0;
  std::int64_t val_correct = 0;
  coload::Metrics metrics;  // the training loader's, for the epoch

  double images_per_s() const { return seconds > 0 ? static_cast<double>(images) / seconds : 0; }
  double mean_loss() const { return images ? loss_sum / static_cast<double>(images) : 0; }
  double accuracy() const {
    return images ? static_cast<double>(correct) / static_cast<double>(images) : 0;
  }
  double val_accuracy() const {
    return val_images ? static_cast<double>(val_correct) / static_cast<double>(val_images) : 0;
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
    const double done = static_cast<double>(s.images) / static_cast<double>(std::max<std::int64_t>(total_, 1));
    const std::string eta =
        rate > 0 ? clock_text(static_cast<double>(std::max<std::int64_t>(total_ - s.images, 0)) / rate)
                 : std::string("?");
    if (tty_) {
      // Redrawing costs a write per batch; ten times a second is plenty for the eye.
      if (s.images < total_ && now - last_ < std::chrono::milliseconds(100)) return;
      constexpr int kWidth = 30;
      const auto filled = static_cast<int>(kWidth * s.images / std::max<std::int64_t>(total_, 1));
      std::string bar(static_cast<std::size_t>(filled), '=');
      if (filled < kWidth) bar += '>';
      bar.resize(kWidth, ' ');
      std::fprintf(stderr,
                   "\repoch %lld %3.0f%% [%s] %lld/%lld [%s<%s, %.0f images/s]  loss %.4f\x1b[K",
                   static_cast<long long>(epoch_), 100 * done, bar.c_str(),
                   static_cast<long long>(s.images), static_cast<long long>(total_),
                   clock_text(elapsed).c_str(), eta.c_str(), rate, s.mean_loss());
    } else {
      if (now - last_ < std::chrono::seconds(5)) return;
      std::fprintf(stderr,
                   "epoch %lld: %.0f%% %lld/%lld images  elapsed %s  ETA %s  %.0f images/s  "
                   "loss %.4f\n",
                   static_cast<long long>(epoch_), 100 * done, static_cast<long long>(s.images),
                   static_cast<long long>(total_), clock_text(elapsed).c_str(), eta.c_str(), rate,
                   s.mean_loss());
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
  stats.metrics = loader.metrics();
  progress.finish();
  return stats;
}

/// One epoch's line: a JSON object with --json, else a line for people. Validation figures
/// only where there is a validation split.
void print_epoch(const Args& args, std::int64_t e, const EpochStats& s, bool with_val) {
  if (args.json) {
    nlohmann::ordered_json line{{"epoch", e},
                                {"images", s.images},
                                {"seconds", s.seconds},
                                {"images_per_s", s.images_per_s()},
                                {"wait_seconds", s.wait_seconds},
                                {"loss", s.mean_loss()},
                                {"accuracy", s.accuracy()}};
    if (with_val) {
      line["val_images"] = s.val_images;
      line["val_accuracy"] = s.val_accuracy();
    }
    line["digest"] = hex64(s.digest.value());
    line["verdict"] = s.metrics.report();
    line["metrics"] = nlohmann::ordered_json::parse(s.metrics.to_json());
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("epoch %lld  %lld images  %.2f s  %.1f images/s  waited %.2f s (%.0f%%)  "
                "loss %.4f  accuracy %.1f%%",
                static_cast<long long>(e), static_cast<long long>(s.images), s.seconds,
                s.images_per_s(), s.wait_seconds,
                s.seconds > 0 ? 100 * s.wait_seconds / s.seconds : 0, s.mean_loss(),
                100 * s.accuracy());
    if (with_val) std::printf("  val accuracy %.1f%%", 100 * s.val_accuracy());
    std::printf("\n  %s\n", s.metrics.report().c_str());
  }
}

/// --shards DIR: the same training loop over tar shards (ShardImagePipeline: one ranged read
/// per sample through the loader's reader, the same fused transforms, labels from cls).
int train_from_shards(const Args& args) {
  std::vector<std::string> class_names;
  {
    // DIR may be a URL (http://host/shards) or a brace pattern: classes.txt is read from
    // beside the shards, as their list and indices are.
    const auto text = coload::shards::read_beside_shards(args.shards, "classes.txt");
    std::istringstream in(text.value_or(""));
    for (std::string line; std::getline(in, line);) class_names.push_back(line);
  }
  if (args.limit) throw std::runtime_error("--limit does not apply to --shards (pack fewer images)");
  if (class_names.empty()) {
    throw std::runtime_error("--shards " + args.shards +
                             ": no classes.txt there (coload-shard writes it beside the shards)");
  }
  const auto classes = static_cast<std::int64_t>(class_names.size());
  // The class count for a recipe's MixUp/CutMix (--recipe resnet50): shards carry none.
  coload::shards::ShardOptions shard_options;
  shard_options.cache_dir = args.cache_dir;
  shard_options.cache_bytes = args.cache_dir.empty() ? 0 : args.cache_mib << 20;
  coload::vision::ShardImagePipeline pipeline(
      coload::shards::ShardDataset(args.shards, shard_options), transform_of(args, true), {},
      static_cast<int>(classes));
  const std::int64_t images = pipeline.size();
  // Worker processes' reads do not fill the cache (its fetch thread is this process's): every
  // shard is queued for it here instead, each epoch (a failed fetch is asked again).
  const coload::shards::ShardDataset shard_data = pipeline.shards();
  const bool fill = args.executor == "processes";
  if (fill) shard_data.cache_fill();
  auto loader = coload::make_data_loader(
      std::move(pipeline),
      {.batch_size = args.batch_size,
       .shuffle = true,
       .num_workers = static_cast<int>(args.workers),
       .seed = static_cast<std::uint64_t>(args.seed),
       .executor = args.executor == "processes" ? coload::Executor::processes
                                                : coload::Executor::threads,
       .trace = args.trace});
  if (!args.json) {
    std::printf("%s: %lld images in %lld classes from shards; train transform, batch %lld, %lld "
                "workers\n",
                args.shards.c_str(), static_cast<long long>(images),
                static_cast<long long>(classes),
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
    if (fill && e > first_epoch) shard_data.cache_fill();
    const EpochStats s = run_epoch(loader, classifier, e, images, args);
    print_epoch(args, e, s, false);
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

  // The validation split: random_split with the seed, as torch.utils.data.random_split with
  // torch.Generator().manual_seed(seed). Training reads its part with the train transform;
  // validation reads the other part, through a second pipeline over the same index, with the
  // eval transform.
  using Pipeline = coload::vision::ImagePipeline;
  auto train_pipeline = Pipeline(index, transform_of(args, true));
  auto eval_pipeline = std::make_shared<Pipeline>(std::move(index), transform_of(args, false));
  const auto val_images =
      static_cast<std::int64_t>(static_cast<double>(images) * args.val_fraction);
  auto split = coload::random_split(std::move(train_pipeline),
                                    {images - val_images, val_images},
                                    coload::make_generator(static_cast<std::uint64_t>(args.seed)));
  coload::Subset<Pipeline> val_split(eval_pipeline, split[1].indices());
  const auto train_images = split[0].size();

  const auto executor =
      args.executor == "processes" ? coload::Executor::processes : coload::Executor::threads;
  auto loader = coload::make_data_loader(std::move(split[0]),
                                         {.batch_size = args.batch_size,
                                          .shuffle = true,
                                          .num_workers = static_cast<int>(args.workers),
                                          .seed = static_cast<std::uint64_t>(args.seed),
                                          .executor = executor,
                                          .trace = args.trace});
  auto val_loader = coload::make_data_loader(std::move(val_split),
                                             {.batch_size = args.batch_size,
                                              .num_workers = static_cast<int>(args.workers),
                                              .seed = static_cast<std::uint64_t>(args.seed),
                                              .executor = executor});

  if (!args.json) {
    std::printf("%s: %lld images in %lld classes (%lld train, %lld validation); batch %lld, ",
                args.root.c_str(), static_cast<long long>(images),
                static_cast<long long>(classes), static_cast<long long>(train_images),
                static_cast<long long>(val_images), static_cast<long long>(args.batch_size));
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
    EpochStats s = run_epoch(loader, classifier, e, train_images, args);
    if (val_images > 0) {
      for (auto& [batch_images, labels] : val_loader) {
        s.val_correct += classifier.evaluate(batch_images, labels);
        s.val_images += batch_images.size(0);
      }
    }
    print_epoch(args, e, s, val_images > 0);
    // Flushed per epoch so a harness reading a pipe sees each line as it happens.
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  // FolderError (a missing or empty root, named), or a WorkerError naming the file that failed.
  std::fprintf(stderr, "image_folder: %s\n", e.what());
  return 1;
}
