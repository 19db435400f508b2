// tools/bench/peers/coload_peer: coload's side of tools/bench/peers (and the bare-decode floor),
// speaking the peers protocol (see peers.py):
//
//   coload_peer ROOT --mode threads|processes|decode|entropy|shards [--epochs 3] [--workers 2] [--batch-size 64]
//               [--prefetch-factor 2] [--trace PATH] [--recipe NAME]
//
// threads / processes: coload::vision::ImagePipeline(ROOT, TrainTransform{}) (RandomResizedCrop
//   224, flip, ToTensor, Normalize), or with --recipe the preset's train Recipe, through make_data_loader({.batch_size, .shuffle = true,
//   .num_workers, .persistent_workers = true, .executor}). Time to first batch is from before
//   the pipeline is constructed (folder indexed) to the first batch in hand; the rest of that
//   epoch is the warm-up. --trace writes the loader's Chrome trace (LoaderOptions::trace): a
//   track per worker with each image's read, decode and transform, to see where a first batch
//   or an epoch's tail spends its time.
// shards: ROOT is a folder of tar shards (coload-shard's, plain or --fast-crop), read through
//   coload::vision::ShardImagePipeline with the same transform, loader and worker threads.
// decode: every file read and decoded full-size to RGB by TurboJPEG (tjDecompress2, flags 0:
//   accurate IDCT and fancy upsampling, as Pillow and coload) on `workers` threads; no resize,
//   no tensor. The CPU floor of a loader that decodes whole images.
// entropy: every file read and only its Huffman data decoded, through libjpeg's
//   jpeg_skip_scanlines over every whole iMCU row (8 or 16 pixel rows) but the last:
//   libjpeg-turbo entropy-decodes skipped iMCU rows and discards their coefficients, with no
//   IDCT, upsampling or colour conversion. The last 1-16 rows are not decoded at all, so this
//   is slightly less than a whole file's entropy decoding. What no crop can skip of the rows
//   above its bottom in a JPEG without restart markers; the part of coload's CPU per image that
//   a faster libjpeg would have to shrink.
//
// On stdout: "@start" before the loader is constructed, "@first" with its first batch in hand,
// "@mark" before the first timed epoch and after each one (the bench samples the process tree's
// CPU at each), then one JSON line {"images", "epoch_seconds", "first_batch_s",
// "version"}; on failure {"error": ...} and exit 1.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <turbojpeg.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>

#include <csetjmp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "coload/loader/data_loader.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/shard_pipeline.hpp"
#include "coload/vision/recipe.hpp"
#include "coload/vision/transforms.hpp"

#ifndef COLOAD_PEER_VERSION
#error "COLOAD_PEER_VERSION (coload's version) must be defined by the build"
#endif

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void mark(const char* what = "mark") {
  std::printf("@%s\n", what);
  std::fflush(stdout);
}

// Reads the whole file at `path` into `buf`; throws naming the path.
void read_file(const std::string& path, std::vector<unsigned char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": fstat: " + std::strerror(err));
  }
  buf.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw std::runtime_error(path + ": read: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

struct JpegErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Entropy-decodes all of `jpeg` but its last iMCU row (see the file's comment); returns
// libjpeg's message on an error, nullptr otherwise. NOTE: nothing with a destructor lives in this frame,
// which longjmp leaves.
const char* entropy_decode(const unsigned char* jpeg, unsigned long size, JpegErrors& err) {
  jpeg_decompress_struct cinfo{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return err.message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, jpeg, size);
  jpeg_read_header(&cinfo, TRUE);
  // NOTE: without fancy upsampling there are no context rows, and jpeg_skip_scanlines then
  // skips whole iMCU rows by entropy decoding alone; with them it decodes the last iMCU row it
  // skips in full, to discard it. A skip that reaches the image's end decodes nothing.
  cinfo.do_fancy_upsampling = FALSE;
  jpeg_start_decompress(&cinfo);
  const JDIMENSION imcu_rows = static_cast<JDIMENSION>(cinfo.max_v_samp_factor) * DCTSIZE;
  const JDIMENSION whole = (cinfo.output_height - 1) / imcu_rows * imcu_rows;
  if (whole > 0) jpeg_skip_scanlines(&cinfo, whole);
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return nullptr;
}

// One pass of the bare decode (or, with `entropy_only`, of the entropy decoding) on `threads`
// threads taking files from a shared counter; the first error stops every thread and is
// rethrown with its path.
std::int64_t decode_pass(const std::vector<std::string>& files, int threads, bool entropy_only) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::vector<std::string> errors(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tjhandle h = tjInitDecompress();
      try {
        if (!h) throw std::runtime_error(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
        std::vector<unsigned char> jpeg, rgb;
        for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < files.size();) {
          read_file(files[i], jpeg);
          if (entropy_only) {
            JpegErrors err{};
            if (const char* what = entropy_decode(jpeg.data(), jpeg.size(), err)) {
              throw std::runtime_error(files[i] + ": " + what);
            }
            done.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          int w = 0, hgt = 0, subsamp = 0, cs = 0;
          const auto size = static_cast<unsigned long>(jpeg.size());
          if (tjDecompressHeader3(h, jpeg.data(), size, &w, &hgt, &subsamp, &cs) != 0) {
            throw std::runtime_error(files[i] + ": " + tjGetErrorStr2(h));
          }
          rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(hgt) * 3);
          if (tjDecompress2(h, jpeg.data(), size, rgb.data(), w, 0, hgt, TJPF_RGB, 0) != 0 &&
              tjGetErrorCode(h) == TJERR_FATAL) {
            throw std::runtime_error(files[i] + ": " + tjGetErrorStr2(h));
          }
          done.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
        next.store(files.size());
      }
      if (h) tjDestroy(h);
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  return done.load();
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, mode = "threads";
  int epochs = 3, workers = 2, prefetch = 2;
  std::int64_t batch_size = 64;
  std::string trace;
  std::string recipe;
  CLI::App app{"coload_peer: coload's ImagePipeline (threads or processes), a bare TurboJPEG "
               "decode or a bare entropy decode, timed for tools/bench/peers"};
  app.add_option("ROOT", root, "an ImageFolder tree")->required();
  app.add_option("--mode", mode, "what to run")
      ->check(CLI::IsMember({"threads", "processes", "decode", "entropy", "shards"}))
      ->capture_default_str();
  app.add_option("--epochs", epochs, "timed epochs after the warm-up")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--workers", workers, "worker threads or processes")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--prefetch-factor", prefetch, "batches in flight per worker")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch size")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--trace", trace, "write the loader's Chrome trace here (threads, processes)");
  app.add_option("--recipe", recipe, "run the preset's train Recipe instead of TrainTransform")
      ->check(CLI::IsMember(coload::vision::presets::names()));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  nlohmann::ordered_json out;
  out["version"] = std::string("coload ") + COLOAD_PEER_VERSION;
  try {
    // The consumer only counts batches: ATen's intra-op pool would only compete with workers.
    at::set_num_threads(1);
    std::vector<double> seconds;
    std::int64_t images = 0;
    if (mode == "decode" || mode == "entropy") {
      const bool entropy_only = mode == "entropy";
      // Indexed as ImageFolder indexes (the pipeline's own index; nothing decoded here).
      const coload::vision::ImagePipeline index(root, coload::vision::TrainTransform{});
      std::vector<std::string> files;
      for (const auto& s : index.index().samples) files.push_back(s.path);
      images = static_cast<std::int64_t>(files.size());
      decode_pass(files, workers, entropy_only);  // warm-up
      out["first_batch_s"] = nullptr;  // no loader, no batch
      mark();
      for (int e = 0; e < epochs; ++e) {
        const auto t1 = Clock::now();
        if (decode_pass(files, workers, entropy_only) != images) {
          throw std::runtime_error(mode + ": files lost");
        }
        seconds.push_back(since(t1));
        mark();
      }
    } else {
      mark("start");
      const auto t0 = Clock::now();
      const auto transform = recipe.empty()
                                 ? coload::vision::FusedTransform{coload::vision::TrainTransform{}}
                                 : coload::vision::presets::train(recipe);
      const std::int64_t side =
          recipe.empty() ? 224 : coload::vision::presets::train(recipe).output_height();
      // One loop for a folder's pipeline and a shards' one (--mode shards).
      auto run = [&](auto& pipeline) {
        const double indexed_s = since(t0);
        auto loader = coload::make_data_loader(
            pipeline, {.batch_size = batch_size, .shuffle = true, .num_workers = workers,
                       .prefetch_factor = prefetch, .persistent_workers = true, .seed = 0,
                       .executor = mode == "processes" ? coload::Executor::processes
                                                       : coload::Executor::threads,
                       .trace = trace});
        images = pipeline.size();
        const double constructed_s = since(t0);
        // On stderr (the bench shows it only on failure): where the first batch's time goes.
        std::fprintf(stderr, "coload_peer: folder indexed %.3f s, loader constructed %.3f s\n",
                     indexed_s, constructed_s);
        auto epoch = [&](bool first) {
          std::int64_t n = 0;
          for (auto&& [x, y] : loader) {
            // The side is the transform's (224; 176 for the resnet50 preset's training crop).
            if (x.dim() != 4 || x.size(2) != side || y.size(0) != x.size(0)) {
              throw std::runtime_error("unexpected batch shape");
            }
            if (first && n == 0) {
              out["first_batch_s"] = since(t0);
              mark("first");
            }
            n += x.size(0);
          }
          if (n != images) {
            throw std::runtime_error("an epoch delivered " + std::to_string(n) + " of " +
                                     std::to_string(images) + " images");
          }
        };
        epoch(true);
        mark();
        for (int e = 0; e < epochs; ++e) {
          const auto t1 = Clock::now();
          epoch(false);
          seconds.push_back(since(t1));
          mark();
        }
      };
      if (mode == "shards") {
        // A recipe's MixUp/CutMix needs the class count: coload-shard's classes.txt, a line each.
        int classes = 0;
        std::istringstream names(
            coload::shards::read_beside_shards(root, "classes.txt").value_or(""));
        for (std::string line; std::getline(names, line);) ++classes;
        coload::vision::ShardImagePipeline pipeline(coload::shards::ShardDataset(root), transform,
                                                    {}, classes);
        run(pipeline);
      } else {
        coload::vision::ImagePipeline pipeline(root, transform);
        run(pipeline);
      }
    }
    out["images"] = images;
    out["epoch_seconds"] = seconds;
  } catch (const std::exception& e) {
    nlohmann::ordered_json err;
    err["error"] = std::string("coload_peer --mode ") + mode + ": " + e.what();
    std::printf("%s\n", err.dump().c_str());
    return 1;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
