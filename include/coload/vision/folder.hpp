#pragma once
// DatasetFolder and ImageFolder: a folder of class sub-folders as a map-style dataset, indexed
// exactly as torchvision 0.14's DatasetFolder/ImageFolder index it.

#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/core/index.hpp"

namespace coload {
// NOTE: declared, not included: coload/dataset/sample_context.hpp brings ATen's Generator, and
// indexing needs none of ATen. A loader taking SampleContext& includes it itself.
struct SampleContext;
}  // namespace coload

namespace coload::vision {

/// torchvision's IMG_EXTENSIONS: the extensions ImageFolder accepts (compared case-insensitively).
inline constexpr std::array<std::string_view, 9> image_extensions = {
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};

/// Raised where torchvision raises FileNotFoundError (or another OSError) while indexing: a
/// missing or unreadable root, a root without class folders, a class without a valid file.
/// `what()` is torchvision's message, word for word.
class FolderError : public std::runtime_error, public Error {
 public:
  /// An error with torchvision's message and the errno behind it (0 when none).
  FolderError(const std::string& message, int error_number)
      : std::runtime_error(message), error_number_(error_number) {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
  /// The errno of the failed system call, or 0 for torchvision's own checks.
  int error_number() const noexcept { return error_number_; }

 private:
  int error_number_;
};

/// How a folder is indexed.
///
/// Exactly one of `extensions` and `is_valid_file` must be set (std::invalid_argument with
/// torchvision's message otherwise), except for ImageFolder, which uses `image_extensions` when
/// neither is.
struct FolderOptions {
  /// Accepted endings of a file's path, compared with the path lowercased (ASCII): give them
  /// lowercase, as torchvision expects. An empty vector accepts nothing.
  std::optional<std::vector<std::string>> extensions{};
  /// Accepts or rejects a file given its full path. May be called from several threads at
  /// once, in no particular order (set `num_threads = 1` to call it from the caller's thread,
  /// in sample order).
  std::function<bool(const std::string& path)> is_valid_file{};
  /// Keeps class folders without a valid file as classes with no samples, instead of raising.
  bool allow_empty = false;
  /// Threads that walk class folders; 0 picks up to 8 from the hardware.
  int num_threads = 0;
};

/// One sample of a folder: a file's path and its class index.
struct FolderSample {
  /// The path as torchvision builds it: root joined with the class folder and sub-folders.
  std::string path;
  /// The class index (`class_to_idx[class folder]`).
  std::int64_t class_index = 0;

  friend bool operator==(const FolderSample&, const FolderSample&) = default;
};

/// Prints a sample as torchvision's tuple prints: `('path', 2)`.
std::ostream& operator<<(std::ostream& out, const FolderSample& sample);

/// What indexing a folder finds: torchvision DatasetFolder's attributes.
struct FolderIndex {
  /// The root, with a leading `~` expanded as os.path.expanduser does.
  std::string root;
  /// Class folder names, sorted.
  std::vector<std::string> classes;
  /// Class folder name to class index.
  std::map<std::string, std::int64_t> class_to_idx;
  /// Every valid file, class by class in sorted order, each class walked in torchvision's order.
  std::vector<FolderSample> samples;
  /// The class index of each sample.
  std::vector<std::int64_t> targets;
};

/// The class folders of `root` (sub-folders, symlinks to folders included), sorted, and their
/// indices: torchvision's `find_classes`. Throws FolderError when `root` cannot be listed or has
/// no class folder.
std::pair<std::vector<std::string>, std::map<std::string, std::int64_t>> find_classes(
    const std::filesystem::path& root);

/// The samples of `root` for the classes of `class_to_idx`: torchvision's `make_dataset`.
///
/// Each class folder is walked as `sorted(os.walk(dir, followlinks=True))` walks it: folders
/// (symlinked ones too) in order of their path, files of one folder by name; anything that is
/// not a folder (a symlink to a file, a dangling symlink, a FIFO) counts as a file. Folders that
/// cannot be listed are skipped. Throws std::invalid_argument when `class_to_idx` is empty or the
/// options set both or neither of extensions and is_valid_file, and FolderError naming the
/// classes without a valid file unless `options.allow_empty`.
std::vector<FolderSample> make_dataset(const std::filesystem::path& root,
                                       const std::map<std::string, std::int64_t>& class_to_idx,
                                       const FolderOptions& options);

/// Indexes `root`: `find_classes`, then `make_dataset` (what DatasetFolder's constructor does).
FolderIndex index_folder(const std::filesystem::path& root, const FolderOptions& options);

/// `os.path.expanduser`: a leading `~` or `~user` replaced by that home folder.
std::string expand_user(const std::string& path);

/// Whether `path`, lowercased (ASCII), ends with one of `extensions`: torchvision's
/// `has_file_allowed_extension`.
bool has_file_allowed_extension(std::string_view path, const std::vector<std::string>& extensions);

namespace detail {
/// `index` wrapped like a Python list index; std::out_of_range when outside [-size, size).
Index checked_folder_index(Index index, std::int64_t size);
}  // namespace detail

/// A loader of DatasetFolder: called as `loader(path, ctx)` or `loader(path)` through a const
/// reference, possibly from several worker threads at once.
template <class L>
concept FolderLoader = std::invocable<const L&, const std::string&, SampleContext&> ||
    std::invocable<const L&, const std::string&>;

namespace detail {
template <class L>
auto folder_sample_probe() {
  if constexpr (std::invocable<const L&, const std::string&, SampleContext&>) {
    return std::type_identity<
        std::remove_cvref_t<std::invoke_result_t<const L&, const std::string&, SampleContext&>>>{};
  } else {
    return std::type_identity<
        std::remove_cvref_t<std::invoke_result_t<const L&, const std::string&>>>{};
  }
}
}  // namespace detail

/// A folder of class sub-folders as a map-style dataset: torchvision's DatasetFolder.
///
/// Sample `i` is `(loader(samples()[i].path, ctx), samples()[i].class_index)`. The loader does
/// the reading, decoding and transforming; it receives the sample's SampleContext (its per-sample
/// Rng) when it accepts one. The index is shared between copies, so copying a dataset (a replica
/// per worker) copies only the loader.
template <FolderLoader Loader>
class DatasetFolder {
 public:
  /// The loader's result.
  using sample_type = typename decltype(detail::folder_sample_probe<Loader>())::type;

  /// Indexes `root` with `options` (see index_folder) and keeps `loader`.
  DatasetFolder(const std::filesystem::path& root, Loader loader, const FolderOptions& options)
      : DatasetFolder(index_folder(root, options), std::move(loader)) {}
  /// Uses an index made earlier (shared by several datasets over one folder, say).
  DatasetFolder(FolderIndex index, Loader loader)
      : index_(std::make_shared<const FolderIndex>(std::move(index))), loader_(std::move(loader)) {}

  /// The number of samples.
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(index_->samples.size()); }

  /// Loads sample `index` (negative indices count from the end; std::out_of_range outside).
  std::pair<sample_type, std::int64_t> get(Index index, SampleContext& ctx) const {
    const FolderSample& s =
        index_->samples[static_cast<std::size_t>(detail::checked_folder_index(index, size()))];
    if constexpr (std::invocable<const Loader&, const std::string&, SampleContext&>) {
      return {std::invoke(loader_, s.path, ctx), s.class_index};
    } else {
      return {std::invoke(loader_, s.path), s.class_index};
    }
  }

  /// The root folder (`~` expanded).
  const std::string& root() const noexcept { return index_->root; }
  /// Class names, sorted.
  const std::vector<std::string>& classes() const noexcept { return index_->classes; }
  /// Class name to class index.
  const std::map<std::string, std::int64_t>& class_to_idx() const noexcept {
    return index_->class_to_idx;
  }
  /// Every sample's path and class index, in torchvision's order.
  const std::vector<FolderSample>& samples() const noexcept { return index_->samples; }
  /// Every sample's class index.
  const std::vector<std::int64_t>& targets() const noexcept { return index_->targets; }
  /// The whole index.
  const FolderIndex& index() const noexcept { return *index_; }
  /// The loader.
  const Loader& loader() const noexcept { return loader_; }

 private:
  std::shared_ptr<const FolderIndex> index_;
  Loader loader_;
};

// SEAM (decode): the loader ImageFolder uses when none is given — read, decode to RGB and
// transform. It is defined by the decoding part of the vision module (coload/vision/decode.hpp
// or beside it), not here; include that header to use `ImageFolder(root)` without a loader.
struct DefaultImageLoader;

/// DatasetFolder over image files: torchvision's ImageFolder. Accepts `image_extensions` unless
/// the options give `is_valid_file` (or, beyond torchvision, their own `extensions`).
template <class Loader = DefaultImageLoader>
class ImageFolder : public DatasetFolder<Loader> {
 public:
  /// Indexes `root` and loads images with a default-constructed Loader.
  // NOTE: no requires-clause: class template argument deduction would evaluate it for the
  // (possibly incomplete) DefaultImageLoader even when the caller passes a loader.
  explicit ImageFolder(const std::filesystem::path& root, FolderOptions options = {})
      : ImageFolder(root, Loader{}, std::move(options)) {}
  /// Indexes `root` and loads images with `loader`.
  ImageFolder(const std::filesystem::path& root, Loader loader, FolderOptions options = {})
      : DatasetFolder<Loader>(root, std::move(loader), with_image_extensions(std::move(options))) {}

  /// The samples (torchvision's `imgs`, an alias of `samples`).
  const std::vector<FolderSample>& imgs() const noexcept { return this->samples(); }

 private:
  static FolderOptions with_image_extensions(FolderOptions options) {
    if (!options.extensions && !options.is_valid_file) {
      options.extensions.emplace(image_extensions.begin(), image_extensions.end());
    }
    return options;
  }
};

}  // namespace coload::vision
