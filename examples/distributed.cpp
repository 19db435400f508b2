// examples/distributed: data-parallel loading under PyTorch's own launcher. Each process
// (rank) loads its shard of the dataset through a DistributedSampler, then the ranks check
// together, through libtorch's c10d (ProcessGroupGloo), that every epoch covered the dataset.
//
//   python3 -m torch.distributed.run --nproc_per_node=2 --no_python --redirects 1 --tee 1
//       build/examples/distributed [ROOT] [--epochs 3] [--workers 2] [--batch-size 32]
//       [--samples 1001] [--limit N] [--seed 0] [--break-coverage]
//
// (`--redirects 1 --tee 1`: Debian's torchrun 1.13 on Python 3.11 cannot parse its own default
// `--redirects 0`; `--no_python` runs a binary.) With ROOT, an image folder as torchvision's
// ImageFolder reads it, decoded with the train transform; without it, an in-memory dataset of
// --samples rows. Rank and world size come from torchrun's RANK and WORLD_SIZE
// (coload::distributed_env()); run alone, it is one rank of one.
//
// Every rank counts how often it saw each index in an epoch; the ranks sum the counts
// (all-reduce), and rank 0 compares them with what DistributedSampler promises: every index
// once, and, when the dataset size does not divide by the world size, the first
// `total_size - size` indices of the epoch's order once more (the padding, as PyTorch's
// DistributedSampler adds it). Output: a line per rank with the samples it loaded, a line per
// epoch from rank 0, then `coverage: exactly once` or `coverage: FAILED` with what was missing
// or repeated. --break-coverage makes one rank leave a sample uncounted, to show the check fail.
// With --shards DIR the ranks stream tar shards instead (shards::ShardStream, an iterable
// dataset split over ranks x workers by shard; rank 0 first packs --samples synthetic samples
// into DIR when it holds no shards): every sample must then be seen exactly once, no padding.
// Exit status: 0, 1 when the coverage check fails or on an error, 2 on bad flags.

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "coload/coload.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"

namespace {

struct Args {
  std::optional<std::string> root;
  std::int64_t epochs = 3;
  std::int64_t workers = 2;
  std::int64_t batch_size = 32;
  std::int64_t samples = 1001;  // divides by neither 2 nor 3: the sampler has to pad
  std::optional<std::int64_t> limit;
  std::int64_t seed = 0;
  bool break_coverage = false;
  std::optional<std::string> shards;  // --shards DIR: stream tar shards
};

/// Parses the flags with CLI11: --help lists them; a bad or unknown flag is named, exit 2.
Args parse_args(int argc, char** argv) {
  Args args;
  CLI::App app{"distributed: each torchrun rank loads its DistributedSampler share; the ranks "
               "check together that every sample was seen once per epoch"};
  app.footer(
      "Run it under torchrun, e.g.\n"
      "  /usr/bin/python3 -m torch.distributed.run --nproc_per_node=2 --no_python \\\n"
      "      --redirects 1 --tee 1 build/examples/distributed");
  app.add_option("ROOT", args.root,
                 "a folder of class sub-folders of images; without it, an in-memory dataset of "
                 "--samples rows");
  app.add_option("--epochs", args.epochs, "passes over the data")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--workers", args.workers, "loader worker threads per rank")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1024}))
      ->capture_default_str();
  app.add_option("--batch-size", args.batch_size, "samples per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--samples", args.samples, "size of the in-memory dataset")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--limit", args.limit, "use only the first N images of ROOT")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", args.seed, "seeds the sampler's shuffle")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--break-coverage", args.break_coverage,
               "rank 1 (rank 0 when alone) leaves one sample uncounted, so the coverage check "
               "must fail");
  app.add_option("--shards", args.shards,
                 "stream the tar shards in DIR (rank 0 packs --samples synthetic ones there "
                 "first when it holds none); every sample once, no padding");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return args;
}

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

/// The store the ranks meet at. torchrun's static rendezvous (its default) runs a TCPStore in
/// the launcher and says so with TORCHELASTIC_USE_AGENT_STORE=True: every rank is a client,
/// under the prefix torch.distributed uses for this restart. Otherwise (e.g. --rdzv_backend
/// c10d) rank 0 serves the store at MASTER_ADDR:MASTER_PORT, as init_process_group does.
/// A single process without torchrun needs no network at all.
c10::intrusive_ptr<c10d::Store> make_store(const coload::DistributedEnv& env) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (env.world_size == 1 && (addr == nullptr || port == nullptr)) {
    return c10::make_intrusive<c10d::HashStore>();
  }
  if (addr == nullptr || port == nullptr) {
    throw std::runtime_error("WORLD_SIZE=" + std::to_string(env.world_size) +
                             " but MASTER_ADDR or MASTER_PORT is unset: run under torchrun");
  }
  c10d::TCPStoreOptions options;
  // A port, whole: stoi took "29500x" for 29500 and "70000" wrapped to 4464.
  std::uint16_t port_number = 0;
  const std::string_view port_text(port);
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port_number);
  if (ec != std::errc{} || end != port_text.data() + port_text.size() || port_number == 0) {
    throw std::runtime_error("MASTER_PORT='" + std::string(port_text) +
                             "' is not a port number (1-65535)");
  }
  options.port = port_number;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.timeout = std::chrono::seconds(60);
  if (env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True") {
    options.isServer = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + env_or("TORCHELASTIC_RESTART_COUNT", "0"), std::move(store));
  }
  options.isServer = env.rank == 0;
  options.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>(addr, options);
}

/// The Gloo process group over `store`, on the interface GLOO_SOCKET_IFNAME names (as
/// torch.distributed reads it) or the one this host's name resolves to.
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_process_group(
    const coload::DistributedEnv& env, const c10::intrusive_ptr<c10d::Store>& store) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
  options->devices.push_back(ifname.empty()
                                 ? c10d::ProcessGroupGloo::createDefaultDevice()
                                 : c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, options);
}

/// Any map-style dataset, with each sample's index carried along into the batch so the
/// training loop can count what it was given.
template <class D>
struct Indexed {
  D dataset;

  std::int64_t size() const { return dataset.size(); }
  auto get(coload::Index index, coload::SampleContext& ctx) const {
    if constexpr (coload::ContextualGet<const D>) {
      return std::make_pair(dataset.get(index, ctx), index);
    } else {
      return std::make_pair(dataset.get(index), index);
    }
  }
};

/// How many times each index must be seen in `epoch` when the ranks together load one
/// DistributedSampler epoch: once each, plus the padding. PyTorch's sampler pads its order
/// (randperm(size) from a generator seeded with seed + epoch) by repeating it from the start up
/// to total_size; computed here from ATen directly, not from coload's sampler.
at::Tensor expected_counts(std::int64_t size, std::int64_t world_size, std::uint64_t seed,
                           std::int64_t epoch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<std::uint64_t>(epoch));
  const at::Tensor order = at::randperm(size, gen, at::TensorOptions().dtype(at::kLong));
  const std::int64_t total = (size + world_size - 1) / world_size * world_size;
  at::Tensor expected = at::ones({size}, at::kLong);
  const auto* o = order.data_ptr<std::int64_t>();
  auto* e = expected.data_ptr<std::int64_t>();
  for (std::int64_t k = 0; k < total - size; ++k) ++e[o[k % size]];
  return expected;
}

/// Compares one epoch's summed counts with what was expected: an empty string when they agree,
/// otherwise what was missing or repeated (the first few indices of each).
std::string compare_counts(const at::Tensor& seen, const at::Tensor& expected) {
  constexpr int kShown = 8;
  const auto* s = seen.data_ptr<std::int64_t>();
  const auto* e = expected.data_ptr<std::int64_t>();
  std::string missing, repeated;
  std::int64_t n_missing = 0, n_repeated = 0;
  for (std::int64_t i = 0; i < seen.numel(); ++i) {
    if (s[i] == e[i]) continue;
    const std::string what = " " + std::to_string(i) + " (seen " + std::to_string(s[i]) +
                             ", expected " + std::to_string(e[i]) + ")";
    if (s[i] < e[i]) {
      if (n_missing++ < kShown) missing += what;
    } else {
      if (n_repeated++ < kShown) repeated += what;
    }
  }
  std::string out;
  if (n_missing) {
    out += std::to_string(n_missing) + " missing:" + missing + (n_missing > kShown ? " ..." : "");
  }
  if (n_repeated) {
    out += std::string(out.empty() ? "" : "; ") + std::to_string(n_repeated) +
           " repeated beyond the padding:" + repeated + (n_repeated > kShown ? " ..." : "");
  }
  return out;
}

/// The indices the padding repeats, for rank 0's epoch line.
std::string padded_indices(const at::Tensor& expected) {
  std::string out;
  const auto* e = expected.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    if (e[i] > 1) out += " " + std::to_string(i) + (e[i] > 2 ? "x" + std::to_string(e[i]) : "");
  }
  return out;
}

template <class D>
int run(D dataset, const Args& args, const coload::DistributedEnv& env,
        c10d::ProcessGroupGloo& group) {
  const std::int64_t size = dataset.size();
  // Rank and world size from torchrun's environment. The loader calls set_epoch as each epoch
  // starts; shared here only so this function can ask the sampler its sizes.
  auto sampler = std::make_shared<coload::DistributedSampler>(
      size, std::nullopt, std::nullopt, /*shuffle=*/true, static_cast<std::uint64_t>(args.seed));
  auto loader = coload::make_data_loader(
      Indexed<D>{std::move(dataset)},
      {.batch_size = args.batch_size,
       .sampler = sampler,
       .num_workers = static_cast<int>(args.workers),
       .seed = static_cast<std::uint64_t>(args.seed)});
  if (env.rank == 0) {
    std::printf("%lld samples over %d ranks: %lld per rank per epoch, %lld padded\n",
                static_cast<long long>(size), env.world_size,
                static_cast<long long>(sampler->size()),
                static_cast<long long>(sampler->total_size() - size));
  }

  // The rank that leaves a sample out with --break-coverage.
  const int breaker = env.world_size > 1 ? 1 : 0;
  std::int64_t loaded = 0;
  std::vector<std::string> failures;
  for (std::int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    at::Tensor counts = at::zeros({size}, at::kLong);
    auto* c = counts.data_ptr<std::int64_t>();
    bool drop_next = args.break_coverage && env.rank == breaker && epoch == 0;
    for (auto& batch : loader) {
      // A training step would use batch.first here; this example only counts.
      const at::Tensor indices = batch.second.contiguous();
      const auto* idx = indices.data_ptr<std::int64_t>();
      for (std::int64_t k = 0; k < indices.numel(); ++k) {
        ++loaded;
        if (drop_next) {
          drop_next = false;
          continue;
        }
        ++c[idx[k]];
      }
    }
    if (sampler->epoch() != epoch) {
      throw std::logic_error("the loader ran epoch " + std::to_string(epoch) +
                             " with the sampler set to epoch " +
                             std::to_string(sampler->epoch()));
    }
    std::vector<at::Tensor> tensors(1, counts);
    group.allreduce(tensors)->wait();
    if (env.rank == 0) {
      const at::Tensor expected = expected_counts(size, env.world_size,
                                                  static_cast<std::uint64_t>(args.seed), epoch);
      const std::string wrong = compare_counts(tensors[0], expected);
      if (wrong.empty()) {
        const std::string padded = padded_indices(expected);
        std::printf("epoch %lld: every one of %lld indices seen; padding repeated:%s\n",
                    static_cast<long long>(epoch), static_cast<long long>(size),
                    padded.empty() ? " none" : padded.c_str());
      } else {
        std::printf("epoch %lld: %s\n", static_cast<long long>(epoch), wrong.c_str());
        failures.push_back("epoch " + std::to_string(epoch) + ": " + wrong);
      }
      std::fflush(stdout);
    }
  }
  std::printf("rank %d of %d (local rank %d): loaded %lld samples in %lld epochs\n", env.rank,
              env.world_size, env.local_rank, static_cast<long long>(loaded),
              static_cast<long long>(args.epochs));
  std::fflush(stdout);
  // Nobody leaves (rank 0 may serve the store) before everyone is done.
  group.barrier()->wait();
  if (env.rank != 0) return 0;
  if (failures.empty()) {
    std::printf("coverage: exactly once\n");
    return 0;
  }
  std::printf("coverage: FAILED\n");
  for (const auto& f : failures) std::printf("  %s\n", f.c_str());
  return 1;
}

/// The "id" field of each shard sample, as the batch.
struct ShardIds {
  at::Tensor operator()(std::vector<coload::shards::ShardSample> samples) const {
    std::vector<std::int64_t> ids;
    for (const auto& s : samples) ids.push_back(std::stoll(s.text("id")));
    return at::tensor(ids, at::kLong);
  }
};

/// --shards: rank 0 packs `samples` synthetic samples (fields id and bin) into `dir` unless it
/// holds shards already; small shards, so that every rank and worker gets several.
void pack_synthetic(const std::string& dir, std::int64_t samples) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tar") return;
  }
  coload::shards::Writer writer(dir, {.shard_size = 16 << 10});
  for (std::int64_t i = 0; i < samples; ++i) {
    const std::string id = std::to_string(i), bin(200 + i % 300, static_cast<char>(i));
    const coload::shards::WriteField fields[] = {
        {"id", {reinterpret_cast<const std::byte*>(id.data()), id.size()}},
        {"bin", {reinterpret_cast<const std::byte*>(bin.data()), bin.size()}}};
    writer.write("s" + id, fields);
  }
  writer.finish();
}

/// --shards: every rank streams its shards; together they must see each sample exactly once.
int run_shards(const Args& args, const coload::DistributedEnv& env, c10d::ProcessGroupGloo& group) {
  // The same seed on every rank: the shard order of an epoch comes from the loader's seed.
  coload::shards::ShardStream stream(*args.shards, {.shuffle_buffer = 64});
  const std::int64_t size = stream.total_samples();
  auto loader = coload::make_data_loader(
      std::move(stream), coload::LoaderOptions<ShardIds>{
                             .batch_size = args.batch_size,
                             .num_workers = static_cast<int>(args.workers),
                             .seed = static_cast<std::uint64_t>(args.seed)});
  const int breaker = env.world_size > 1 ? 1 : 0;
  std::int64_t loaded = 0;
  std::vector<std::string> failures;
  for (std::int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    at::Tensor counts = at::zeros({size}, at::kLong);
    auto* c = counts.data_ptr<std::int64_t>();
    bool drop_next = args.break_coverage && env.rank == breaker && epoch == 0;
    for (auto& ids : loader) {
      const auto* idx = ids.data_ptr<std::int64_t>();
      for (std::int64_t k = 0; k < ids.numel(); ++k, ++loaded) {
        if (std::exchange(drop_next, false)) continue;
        // Shards not packed by this example (--shards names a folder that held some) may
        // carry any id: one outside the samples is a failure, not a write past the counts.
        if (idx[k] < 0 || idx[k] >= size) {
          if (failures.size() < 10) {
            failures.push_back("rank " + std::to_string(env.rank) + " epoch " +
                               std::to_string(epoch) + ": a sample has id " +
                               std::to_string(idx[k]) + ", outside 0.." +
                               std::to_string(size - 1));
          }
          continue;
        }
        ++c[idx[k]];
      }
    }
    std::vector<at::Tensor> tensors(1, counts);
    group.allreduce(tensors)->wait();
    if (env.rank == 0) {
      const std::string wrong = compare_counts(tensors[0], at::ones({size}, at::kLong));
      std::printf("epoch %lld: %s\n", static_cast<long long>(epoch),
                  wrong.empty() ? "every shard sample seen once" : wrong.c_str());
      if (!wrong.empty()) failures.push_back("epoch " + std::to_string(epoch) + ": " + wrong);
      std::fflush(stdout);
    }
  }
  std::printf("rank %d of %d (local rank %d): loaded %lld samples in %lld epochs\n", env.rank,
              env.world_size, env.local_rank, static_cast<long long>(loaded),
              static_cast<long long>(args.epochs));
  std::fflush(stdout);
  group.barrier()->wait();
  if (env.rank != 0) {
    // Its own failures (ids outside the samples): rank 0's sums say only what was missed.
    for (const auto& f : failures) std::fprintf(stderr, "%s\n", f.c_str());
    return failures.empty() ? 0 : 1;
  }
  std::printf(failures.empty() ? "coverage: exactly once\n" : "coverage: FAILED\n");
  for (const auto& f : failures) std::printf("  %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  // The ranks share the machine's cores with each other's loader workers.
  at::set_num_threads(1);
  const coload::DistributedEnv env = coload::distributed_env();
  const auto store = make_store(env);
  const auto group = make_process_group(env, store);

  int rc = 0;
  if (args.shards) {
    if (env.rank == 0) pack_synthetic(*args.shards, args.samples);
    group->barrier()->wait();
    rc = run_shards(args, env, *group);
  } else if (args.root) {
    coload::vision::FolderOptions folder_options;
    folder_options.extensions.emplace(coload::vision::image_extensions.begin(),
                                      coload::vision::image_extensions.end());
    auto index = coload::vision::index_folder(*args.root, folder_options);
    if (args.limit && *args.limit < static_cast<std::int64_t>(index.samples.size())) {
      index.samples.resize(static_cast<std::size_t>(*args.limit));
      index.targets.resize(static_cast<std::size_t>(*args.limit));
    }
    rc = run(coload::vision::ImagePipeline(std::move(index), coload::vision::TrainTransform{}),
             args, env, *group);
  } else {
    const at::Tensor rows = at::arange(args.samples, at::kLong);
    rc = run(coload::TensorDataset({rows}), args, env, *group);
  }
  std::fflush(stdout);
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "distributed: %s\n", e.what());
  return 1;
}
