// tools/bench/vision/crop_decode: where the classic train transform's CPU goes over JPEGs with
// restart markers (coload-shard --fast-crop's), against a bare full decode of the same files.
//
//   crop_decode ROOT [--limit 300] [--rounds 5] [--restart-mcus 2] [--only VARIANT] [--check]
//
// Reads up to --limit JPEGs of the ImageFolder ROOT into memory, adds restart markers to each as
// `coload-shard --fast-crop --restart-mcus N` does (add_restart_markers) and records their
// layouts as a shard's index does. Then, on this one thread, per round and per image (the crop
// and flip TrainTransform draws from the image's own Rng, so every variant sees the same crops):
//   full        decode_into at scale 1 with coload's Huffman decoder off (TurboJPEG's whole
//               decode): the peers bench's decode_full row, per image
//   train_plain TrainTransform over the original file (the region decoder)
//   train_fast  TrainTransform over the marked file with its layout as the shard pipeline
//               hands it (detail::ScopedRestartHint): coload_shards_fast's transform
//   decode_fast only the decode part of train_fast (detail::decode_crop_source)
//   resample    only the rest of train_fast: resample + normalise of the decoded crop source
//               (from a copy of decode_fast's output)
//   resample_only  the same without the normalise (the rows are dropped)
//   sample_fast train_fast with the per-sample work before it, as the shard pipeline calls it:
//               the header read (peek) and the crop and flip drawn from the sample's Rng
//   train_libjpeg  train_plain with coload's Huffman decoder off (detail::set_scan_decoder):
//               the original file's entropy data decoded by libjpeg-turbo, as before 2026-11-29
//   decode_plain   only the decode part of train_plain (coload's Huffman decoder)
//   decode_libjpeg only the decode part of train_libjpeg
//   full_coload decode_into at scale 1 as it runs: the whole scan through coload's decoder
//   full_marked decode_into of the marked file with coload's Huffman decoder off (TurboJPEG,
//               libjpeg-turbo's slow path for files with restart markers)
//   full_marked_coload  decode_into of the marked file as it runs: its intervals through
//               coload's decoder (a --fast-crop member decoded whole: EvalTransform, a recipe
//               led by RandomCrop or CenterCrop)
//   decode_single  decode_plain with the Huffman decoder taking one MCU row at a time
//               (detail::set_paired_rows(false)), not two rows together from their checkpoints
//               (a whole decode has no checkpoints: full_coload is one row at a time already)
// The figure is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per image, the median of the
// rounds; the rounds interleave the variants so that a loaded machine slows them alike. The
// ratios to `full` are the (target: train_fast <= 0.7x full). --check first compares
// train_fast's floats with train_plain's for every image and counts the crops decoded from
// their intervals (a fallback to the plain decode would be exact too, but slow).

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "coload/dataset/sample_context.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/transforms.hpp"
#include "vision/fused.hpp"
#include "vision/jpeg_restart.hpp"
#include "vision/restart_entropy.hpp"

namespace vision = coload::vision;
namespace detail = coload::vision::detail;

namespace {

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

struct Item {
  std::vector<std::byte> plain;
  std::vector<std::byte> marked;
  coload::shards::RestartIndex layout;
  vision::TrainParams params;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string root;
  int limit = 300;
  int rounds = 5;
  int restart_mcus = 2;
  std::string only;
  CLI::App app{"CPU per image of the train transform over restart-marked JPEGs, by part"};
  app.add_option("root", root, "an ImageFolder tree of JPEGs")->required();
  app.add_option("--limit", limit, "images read")->capture_default_str();
  app.add_option("--rounds", rounds, "rounds (median)")->capture_default_str();
  app.add_option("--restart-mcus", restart_mcus, "as coload-shard's")->capture_default_str();
  app.add_option("--only", only, "run this variant alone (for a profiler)");
  bool check = false;
  app.add_flag("--check", check, "compare train_fast with train_plain on every image first");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  vision::FolderOptions options;
  options.extensions.emplace(vision::image_extensions.begin(), vision::image_extensions.end());
  const vision::FolderIndex index = vision::index_folder(root, options);
  const vision::TrainTransform train{};
  std::vector<Item> items;
  std::size_t plain_bytes = 0, marked_bytes = 0;
  for (std::size_t i = 0; i < index.samples.size() && static_cast<int>(items.size()) < limit; ++i) {
    Item item;
    item.plain = read_file(index.samples[i].path);
    if (detail::add_restart_markers(item.plain, restart_mcus, item.marked) !=
        detail::RestartOutcome::marked) {
      continue;
    }
    const auto layout = detail::scan_restart_layout(item.marked);
    if (!layout) continue;
    item.layout = *layout;
    coload::Rng rng = coload::Rng::for_sample(0, 0, static_cast<coload::Index>(i));
    at::Generator gen = rng.torch_generator();
    item.params = train.sample(vision::peek(item.plain), gen);
    plain_bytes += item.plain.size();
    marked_bytes += item.marked.size();
    items.push_back(std::move(item));
  }
  if (items.empty()) {
    std::fprintf(stderr, "crop_decode: no baseline JPEGs under %s\n", root.c_str());
    return 1;
  }
  const int n = static_cast<int>(items.size());
  const int s = train.size;
  std::vector<float> dst(static_cast<std::size_t>(3) * s * s);
  std::vector<std::uint8_t> pixels, whole;
  std::vector<std::uint8_t> copy;
  const std::string shard = "bench";
  const char* names[] = {
      "full",          "train_plain", "train_fast",         "decode_fast",  "resample",
      "resample_only", "sample_fast", "train_libjpeg",      "decode_plain", "decode_libjpeg",
      "full_coload",   "full_marked", "full_marked_coload", "decode_single"};
  constexpr int variants = 14;
  std::vector<double> times[variants];
  int scaled = 0;
  for (const Item& item : items) scaled += item.params.scale_denominator > 1;
  if (check) {
    std::vector<float> want(dst.size());
    int differing = 0;
    const std::uint64_t before = detail::restart_region_decodes();
    for (const Item& item : items) {
      const detail::ScopedRestartHint hint(
          {item.marked.data(), item.marked.size(), &item.layout, &shard, &shard});
      train.apply(item.plain, item.params, want.data());
      train.apply(item.marked, item.params, dst.data());
      differing += std::memcmp(want.data(), dst.data(), dst.size() * sizeof(float)) != 0;
    }
    std::printf("check: %d of %d images differ; %llu crops decoded from their intervals\n",
                differing, n,
                static_cast<unsigned long long>(detail::restart_region_decodes() - before));
    // And the plain files through coload's Huffman decoder against libjpeg's.
    int differing_plain = 0;
    const std::uint64_t scans = detail::scan_region_decodes();
    for (const Item& item : items) {
      {
        const detail::ScopedScanDecoder libjpeg_only(false);
        train.apply(item.plain, item.params, want.data());
      }
      train.apply(item.plain, item.params, dst.data());
      differing_plain += std::memcmp(want.data(), dst.data(), dst.size() * sizeof(float)) != 0;
    }
    std::printf("check: %d of %d plain images differ from libjpeg's decode; %llu crops through "
                "coload's Huffman decoder\n",
                differing_plain, n,
                static_cast<unsigned long long>(detail::scan_region_decodes() - scans));
    // And the marked files decoded whole: through coload's decoder, interval by interval,
    // against TurboJPEG's.
    int differing_whole = 0;
    const std::uint64_t wholes = detail::scan_region_decodes();
    std::vector<std::uint8_t> reference;
    for (const Item& item : items) {
      vision::ImageView want_image;
      {
        const detail::ScopedScanDecoder libjpeg_only(false);
        want_image = vision::decode_into(item.marked, reference, 1);
      }
      const vision::ImageView got = vision::decode_into(item.marked, whole, 1);
      const auto bytes = static_cast<std::size_t>(want_image.stride) * want_image.height;
      differing_whole += got.width != want_image.width || got.height != want_image.height ||
                         got.stride != want_image.stride ||
                         std::memcmp(got.data, want_image.data, bytes) != 0;
    }
    std::printf("check: %d of %d marked images decoded whole differ from TurboJPEG's; %llu "
                "through coload's Huffman decoder\n",
                differing_whole, n,
                static_cast<unsigned long long>(detail::scan_region_decodes() - wholes));
    if (differing > 0 || differing_plain > 0 || differing_whole > 0) return 1;
  }
  for (int r = 0; r < rounds; ++r) {
    for (int v = 0; v < variants; ++v) {
      if (!only.empty() && only != names[v]) {
        times[v].push_back(1);
        continue;
      }
      double spent = 0;
      // The libjpeg variants decode plain files without coload's Huffman decoder.
      const bool libjpeg = v == 0 || v == 7 || v == 9 || v == 11;
      const detail::ScopedScanDecoder scan_decoder(!libjpeg);
      // decode_single decodes one row at a time, not two together.
      detail::set_paired_rows(v != 13);
      for (const Item& item : items) {
        const detail::ScopedRestartHint hint(
            {item.marked.data(), item.marked.size(), &item.layout, &shard, &shard});
        if (v == 6) {
          coload::Rng rng = coload::Rng::for_sample(0, 0, static_cast<coload::Index>(&item - items.data()));
          const double t0 = thread_seconds();
          train(item.marked, rng, dst.data());
          spent += thread_seconds() - t0;
          continue;
        }
        if (v == 4 || v == 5) {
          // Decode outside the clock, copy the source, then time the rest on the copy.
          detail::CropSource src = detail::decode_crop_source(
              item.marked, item.params.box, s, s, item.params.scale_denominator, pixels);
          copy.assign(src.image.data,
                      src.image.data + src.image.stride * static_cast<std::ptrdiff_t>(src.image.height));
          src.image.data = copy.data();
          const vision::TrainTransform& t = train;
          const detail::NormalizeTable table(t.mean, t.std_dev);
          const double t0 = thread_seconds();
          if (v == 4) {
            detail::resample<3>(src.image, src.ax, src.ay, [&](int y, const std::uint8_t* row) {
              detail::normalize_row(table, row, s, s, y, item.params.flip, dst.data());
            });
          } else {
            detail::resample<3>(src.image, src.ax, src.ay, [&](int y, const std::uint8_t* row) {
              asm volatile("" : : "r"(row) : "memory");
              (void)y;
            });
          }
          spent += thread_seconds() - t0;
          continue;
        }
        const double t0 = thread_seconds();
        switch (v) {
          case 0: vision::decode_into(item.plain, whole, 1); break;
          case 1: train.apply(item.plain, item.params, dst.data()); break;
          case 2: train.apply(item.marked, item.params, dst.data()); break;
          case 3:
            detail::decode_crop_source(item.marked, item.params.box, s, s,
                                       item.params.scale_denominator, pixels);
            break;
          case 7: train.apply(item.plain, item.params, dst.data()); break;
          case 10:
            vision::decode_into(item.plain, whole, 1);
            break;
          case 11:
          case 12: vision::decode_into(item.marked, whole, 1); break;
          case 8:
          case 9:
          case 13:
            detail::decode_crop_source(item.plain, item.params.box, s, s,
                                       item.params.scale_denominator, pixels);
            break;
          default: break;
        }
        spent += thread_seconds() - t0;
      }
      times[v].push_back(spent * 1e3 / n);
    }
  }
  std::printf("crop_decode: %d images of %s, restart every %d MCUs (%+.2f%% bytes), %d at a DCT "
              "scale; thread CPU ms/image, median of %d rounds\n",
              n, root.c_str(), restart_mcus,
              100.0 * (static_cast<double>(marked_bytes) / static_cast<double>(plain_bytes) - 1),
              scaled, rounds);
  const double full = median(times[0]);
  for (int v = 0; v < variants; ++v) {
    const double m = median(times[v]);
    std::printf("  %-12s %7.3f ms  %5.3fx full\n", names[v], m, m / full);
  }
  return 0;
}
