// coload-shard: packs an ImageFolder into tar shards (WebDataset layout) with their index files.
//
//   coload-shard ROOT OUTDIR [--shard-size 64MiB] [--seed N] [--fast-crop [--restart-mcus 2]]
//
// Sample k of the folder (torchvision's order) becomes members "<k, 9 digits>.<ext>" (the image
// file's bytes, its extension lowercased) and "<k>.cls" (the class index as text). With --seed
// the samples are written in a shuffled order drawn from N. OUTDIR/classes.txt lists the class
// folders, one a line, in class-index order.
//
// With --fast-crop each baseline JPEG is transcoded losslessly (its DCT coefficients kept, so its
// pixels are unchanged) with a restart marker every few MCUs, which the index records: a crop
// of it then decodes only the intervals that cover it. Progressive, arithmetic-coded and
// already-marked files are stored as they are.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "coload/shards/writer.hpp"
#include "coload/vision/folder.hpp"
#include "vision/jpeg_restart.hpp"

namespace {

// "64MiB", "1GiB", "500KB", "4096": bytes.
std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw CLI::ValidationError("--shard-size", "not a size: '" + text + "'");
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::pair<const char*, double> units[] = {
      {"", 1},         {"b", 1},         {"k", 1024},         {"kib", 1024},
      {"kb", 1e3},     {"m", 1 << 20},   {"mib", 1 << 20},    {"mb", 1e6},
      {"g", 1 << 30},  {"gib", 1 << 30}, {"gb", 1e9}};
  for (const auto& [name, scale] : units) {
    // Below 2^64 bytes: "inf" and 1e20 parse, and their cast is undefined.
    if (unit == name && value > 0 && value * scale < 0x1p64) {
      return static_cast<std::uint64_t>(value * scale);
    }
  }
  throw CLI::ValidationError("--shard-size", "not a size: '" + text + "' (e.g. 64MiB)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Packs an ImageFolder into tar shards in the WebDataset layout."};
  std::string root, outdir, shard_size = "64MiB";
  std::optional<std::uint64_t> seed;
  bool fast_crop = false;
  // NOTE: 2 MCUs (32 pixels of a 4:2:0 image) a restart interval, measured on the peers bench's
  // 1000 generated 500x375-ish photos (classic recipe, CPU ms/image; JPEG bytes against the
  // originals, Huffman tables optimised in every case): 1 MCU 0.60 ms, -0.8%; 2 MCUs 0.61 ms,
  // -1.5%; 4 MCUs 0.62 ms, -2.1%; 8 MCUs 0.64 ms, -2.4%; a row 0.73 ms, -3.8%; plain shards
  // 0.79 ms. Past 2 the crop's columns cost more than the markers save in bytes.
  int restart_mcus = 2;
  app.add_option("ROOT", root, "the image folder (one sub-folder per class)")->required();
  app.add_option("OUTDIR", outdir, "where the shards and their index files go")->required();
  app.add_option("--shard-size", shard_size, "target size of a shard (default 64MiB)");
  app.add_option("--seed", seed, "write the samples in an order shuffled with this seed");
  app.add_flag("--fast-crop", fast_crop,
               "add restart markers to baseline JPEGs (lossless) so that crops decode only "
               "what they cover");
  app.add_option("--restart-mcus", restart_mcus,
                 "MCUs a restart interval with --fast-crop, at most (default 2; the largest "
                 "divisor of an image's MCUs per row not above it)")
      ->check(CLI::Range(1, 65535));
  CLI11_PARSE(app, argc, argv);
  try {
    const std::uint64_t bytes = parse_size(shard_size);
    coload::vision::FolderOptions options;
    options.extensions.emplace(coload::vision::image_extensions.begin(),
                               coload::vision::image_extensions.end());
    const auto index = coload::vision::index_folder(root, options);
    coload::shards::Writer writer(outdir, {.shard_size = bytes});
    std::uint64_t total = 0, written = 0;
    std::vector<std::byte> marked;
    std::vector<std::int64_t> outcomes(6);
    const auto shards = coload::shards::pack(
        static_cast<std::int64_t>(index.samples.size()), seed, writer,
        [&](std::int64_t k, coload::shards::Writer& w) {
          const auto& s = index.samples[static_cast<std::size_t>(k)];
          std::ifstream in(s.path, std::ios::binary);
          const std::string data((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
          if (!in.good() && !in.eof()) throw std::runtime_error("cannot read '" + s.path + "'");
          // After the file name's last dot: a file named ".jpg" has no extension() (a dot
          // file), but torchvision's suffix test takes it, as index_folder does.
          const std::string file = std::filesystem::path(s.path).filename().string();
          std::string ext = file.substr(file.rfind('.') + 1);
          std::transform(ext.begin(), ext.end(), ext.begin(),
                         [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
          char key[32];
          std::snprintf(key, sizeof key, "%09lld", static_cast<long long>(k));
          const std::string cls = std::to_string(s.class_index);
          std::span<const std::byte> image{reinterpret_cast<const std::byte*>(data.data()),
                                           data.size()};
          if (fast_crop && (ext == "jpg" || ext == "jpeg")) {
            const auto outcome =
                coload::vision::detail::add_restart_markers(image, restart_mcus, marked);
            ++outcomes[static_cast<std::size_t>(outcome)];
            if (outcome == coload::vision::detail::RestartOutcome::marked) image = marked;
          }
          const coload::shards::WriteField fields[] = {
              {ext, image},
              {"cls", {reinterpret_cast<const std::byte*>(cls.data()), cls.size()}}};
          w.write(key, fields);
          total += data.size();
          written += image.size();
        });
    std::ofstream classes(std::filesystem::path(outdir) / "classes.txt");
    for (const auto& c : index.classes) classes << c << '\n';
    if (!classes.flush()) throw std::runtime_error("cannot write '" + outdir + "/classes.txt'");
    std::cout << "packed " << index.samples.size() << " images (" << total / (1 << 20)
              << " MiB) of " << index.classes.size() << " classes into " << shards.size()
              << " shards in " << outdir << '\n';
    if (fast_crop) {
      using coload::vision::detail::RestartOutcome;
      std::cout << "--fast-crop: JPEG bytes " << total << " -> " << written << " ("
                << (total ? 100.0 * (static_cast<double>(written) / static_cast<double>(total) - 1)
                          : 0.0)
                << "%)";
      for (const auto o : {RestartOutcome::marked, RestartOutcome::progressive,
                           RestartOutcome::arithmetic, RestartOutcome::already_marked,
                           RestartOutcome::other, RestartOutcome::not_jpeg}) {
        if (outcomes[static_cast<std::size_t>(o)] > 0) {
          std::cout << "; " << to_string(o) << " " << outcomes[static_cast<std::size_t>(o)];
        }
      }
      std::cout << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "coload-shard: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
