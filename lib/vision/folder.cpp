// vision/folder: indexing a folder of class sub-folders as torchvision does, without its cost.
//
// torchvision lists each class with os.walk (a scandir, a DirEntry object and a str per entry),
// then sorts. Here each folder is read with getdents64 into one buffer, the entry type comes from
// d_type (a stat only for symlinks and filesystems that leave d_type unknown), extensions are
// checked on the raw name before any string is kept, and classes are walked on several threads.
// Reading the folders (getdents64 on ext4 hashes every name into a tree) is about two thirds of
// what is left on one thread, and Python pays it too, so the margin over torchvision comes from
// doing the rest in ~150 ns a file and from walking classes in parallel.

#include "coload/vision/folder.hpp"
#include "coload/core/error.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <ostream>
#include <thread>

namespace coload::vision {
namespace {

// Python's repr() of a str, as OSError's message shows a file name.
std::string py_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

// str() of the OSError Python raises for `path`: "[Errno 2] No such file or directory: 'x'".
FolderError os_error(int err, const std::string& path) {
  return FolderError(
      "[Errno " + std::to_string(err) + "] " + std::strerror(err) + ": " + py_repr(path), err);
}

// os.path.join(a, b) for a relative b.
std::string path_join(const std::string& a, std::string_view b) {
  std::string out;
  out.reserve(a.size() + 1 + b.size());
  out += a;
  if (!out.empty() && out.back() != '/') out += '/';
  out += b;
  return out;
}

bool is_dot_or_dot_dot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Reads every entry of the folder at `path` but "." and "..", calling on_entry(name, d_type).
// Returns 0, or the errno of the failed open or read.
template <class OnEntry>
int list_folder(const std::string& path, std::vector<char>& buffer, OnEntry&& on_entry) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  for (;;) {
    const ssize_t n = ::getdents64(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;
    for (ssize_t offset = 0; offset < n;) {
      const auto* entry = reinterpret_cast<const struct dirent64*>(buffer.data() + offset);
      offset += entry->d_reclen;
      if (is_dot_or_dot_dot(entry->d_name)) continue;
      on_entry(std::string_view(entry->d_name), entry->d_type);
    }
  }
  ::close(fd);
  return err;
}

// Whether `path` (a str built by os.path.join) is a folder, following symlinks: DirEntry.is_dir().
// Returns 1, 0, or -errno for an error other than ENOENT (which Python reads as "not a folder").
int stat_is_folder(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? 0 : -errno;
  return S_ISDIR(st.st_mode) ? 1 : 0;
}

// Whether `name`, lowercased (ASCII), ends with `ext`.
bool ends_with_lowered(std::string_view name, std::string_view ext) {
  if (ext.size() > name.size()) return false;
  const char* tail = name.data() + (name.size() - ext.size());
  for (std::size_t i = 0; i < ext.size(); ++i) {
    char c = tail[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != ext[i]) return false;
  }
  return true;
}

// One walked folder: its path relative to the class folder ("" for the class folder itself,
// "/a/b" below it) and its files, entries [first, first + count) of the class's name list.
struct FolderListing {
  std::string relative;
  std::size_t first = 0;
  std::size_t count = 0;
};

// A file name inside the class's name buffer, with its first 16 bytes as two big-endian numbers
// (zero-padded): comparing those decides most comparisons without reading the buffer.
struct NameRef {
  std::uint64_t prefix;
  std::uint64_t prefix2;
  std::uint32_t offset;  // NOTE: 4 GiB of names in one class folder is ~200 million files
  std::uint32_t size;
};

// Bytes [from, from + 8) of `name` as a big-endian number, zero-padded past its end.
std::uint64_t prefix_key(std::string_view name, std::size_t from) {
  std::uint64_t key = 0;
  const std::size_t end = std::min<std::size_t>(from + 8, name.size());
  for (std::size_t i = from; i < end; ++i) {
    key |= static_cast<std::uint64_t>(static_cast<unsigned char>(name[i])) << (56 - 8 * (i - from));
  }
  return key;
}

// torchvision's extension test, on one name: most of the time the name's tail is lowercased
// once and compared with each extension by memcmp.
class ExtensionFilter {
 public:
  explicit ExtensionFilter(const std::vector<std::string>& extensions) : extensions_(extensions) {
    for (const std::string& ext : extensions) longest_ = std::max(longest_, ext.size());
  }

  // Whether folder + "/" + name, lowercased, ends with one of the extensions.
  bool accepts(const std::string& folder, std::string_view name) const {
    if (longest_ <= kTail && name.size() >= longest_) {
      char tail[kTail];
      const char* from = name.data() + (name.size() - longest_);
      for (std::size_t i = 0; i < longest_; ++i) {
        const char c = from[i];
        tail[i] = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
      }
      for (const std::string& ext : extensions_) {
        if (std::memcmp(tail + (longest_ - ext.size()), ext.data(), ext.size()) == 0) return true;
      }
      return false;
    }
    // NOTE: an extension longer than the name (never an image one) is tested on the joined
    // path, as torchvision tests it; the others on the name, which is the same thing.
    for (const std::string& ext : extensions_) {
      if (ext.size() <= name.size()) {
        if (ends_with_lowered(name, ext)) return true;
      } else {
        std::string path = folder + '/';
        path += name;
        if (ends_with_lowered(path, ext)) return true;
      }
    }
    return false;
  }

 private:
  static constexpr std::size_t kTail = 32;
  const std::vector<std::string>& extensions_;
  std::size_t longest_ = 0;
};

// Python's ', '.join(items).
std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// What a walking thread reuses from class to class.
struct WalkScratch {
  // NOTE: 64 KiB holds about 2,000 entries of ImageNet-like names: two or three getdents64
  // calls for a class folder.
  std::vector<char> dirents = std::vector<char>(64 * 1024);
  std::vector<FolderListing> listings;
  std::vector<std::string> pending;
  std::vector<std::string> subfolders;
  std::vector<NameRef> sorted;
  std::string path;
};

// One class after the walk: its kept file names in sample order, by folder. The samples' paths
// are made from it once every class is walked, straight into their place in the sample list.
struct ClassWalk {
  // The kept names end to end; `refs` point into it (sorting moves NameRefs, not strings).
  std::string names;
  std::vector<NameRef> refs;
  // Each walked folder's path, and the end of its files in `refs`, in sample order.
  std::vector<std::string> folders;
  std::vector<std::size_t> folder_ends;
  std::exception_ptr error;
};

// Walks one class folder as sorted(os.walk(class_dir, followlinks=True)) does, each folder's
// files sorted and filtered by the options.
void walk_class(const std::string& class_dir, const FolderOptions& options,
                const ExtensionFilter* extensions, WalkScratch& scratch, ClassWalk& walk) {
  std::string& names = walk.names;
  std::vector<NameRef>& refs = walk.refs;
  std::vector<FolderListing>& listings = scratch.listings;
  std::vector<std::string>& pending = scratch.pending;
  std::vector<std::string>& subfolders = scratch.subfolders;
  listings.clear();
  pending.clear();
  // NOTE: folders are opened and stat'ed by their full path, as os.walk opens them, not with
  // openat from the parent: a symlink cycle then ends where Python's ends (ELOOP after 40 links
  // in one path, or ENAMETOOLONG) instead of running until the descriptors run out.
  pending.emplace_back();
  while (!pending.empty()) {
    FolderListing listing{std::move(pending.back()), refs.size(), 0};
    pending.pop_back();
    const std::string folder = class_dir + listing.relative;
    const std::size_t names_before = names.size();
    subfolders.clear();
    const int err =
        list_folder(folder, scratch.dirents, [&](std::string_view name, unsigned char type) {
          bool is_folder = type == DT_DIR;
          if (type == DT_LNK || type == DT_UNKNOWN) {
            // os.walk files whatever is_dir() fails on (dangling symlinks, loops) as a non-folder.
            is_folder = stat_is_folder(path_join(folder, name)) == 1;
          }
          if (is_folder) {
            subfolders.emplace_back(name);
          } else if (!extensions || extensions->accepts(folder, name)) {
            refs.push_back(NameRef{prefix_key(name, 0), prefix_key(name, 8),
                                   static_cast<std::uint32_t>(names.size()),
                                   static_cast<std::uint32_t>(name.size())});
            names.append(name);
          }
        });
    if (err != 0) {
      // os.walk(onerror=None) skips a folder it cannot list, with its sub-folders.
      refs.resize(listing.first);
      names.resize(names_before);
      continue;
    }
    listing.count = refs.size() - listing.first;
    for (const std::string& sub : subfolders) {
      std::string relative = listing.relative;
      relative += '/';
      relative += sub;
      pending.push_back(std::move(relative));
    }
    listings.push_back(std::move(listing));
  }

  // sorted() over os.walk's (root, dirs, files) tuples orders folders by their path string, so
  // "a-b" comes before "a/x": not the order of a depth-first walk over sorted names.
  std::sort(listings.begin(), listings.end(),
            [](const FolderListing& a, const FolderListing& b) { return a.relative < b.relative; });
  const auto name_of = [&](const NameRef& r) {
    return std::string_view(names.data() + r.offset, r.size);
  };
  // Python orders str by code point: the byte order of UTF-8, which string_view compares.
  // Names hold no NUL byte, so zero padding orders a short name before its extensions.
  const auto name_less = [&](const NameRef& a, const NameRef& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    if (a.prefix2 != b.prefix2) return a.prefix2 < b.prefix2;
    const std::string_view x = name_of(a);
    const std::string_view y = name_of(b);
    return x.substr(std::min<std::size_t>(16, x.size())) <
           y.substr(std::min<std::size_t>(16, y.size()));
  };
  // Lay the refs out in sample order: folder by folder, each folder's names sorted.
  std::vector<NameRef>& sorted = scratch.sorted;
  sorted.clear();
  sorted.reserve(refs.size());
  walk.folders.reserve(listings.size());
  walk.folder_ends.reserve(listings.size());
  for (const FolderListing& listing : listings) {
    const auto first = refs.begin() + static_cast<std::ptrdiff_t>(listing.first);
    const auto last = first + static_cast<std::ptrdiff_t>(listing.count);
    std::sort(first, last, name_less);
    std::string folder = class_dir + listing.relative;
    for (auto it = first; it != last; ++it) {
      if (options.is_valid_file) {
        std::string& path = scratch.path;
        path.assign(folder);
        path += '/';
        path += name_of(*it);
        if (!options.is_valid_file(path)) continue;
      }
      sorted.push_back(*it);
    }
    walk.folders.push_back(std::move(folder));
    walk.folder_ends.push_back(sorted.size());
  }
  refs.swap(sorted);
}

// Writes the samples of a walked class into `out` (its place in the sample list).
void place_class(const ClassWalk& walk, std::int64_t class_index, FolderSample* out) {
  std::size_t r = 0;
  for (std::size_t f = 0; f < walk.folders.size(); ++f) {
    const std::string& folder = walk.folders[f];
    for (; r < walk.folder_ends[f]; ++r, ++out) {
      const NameRef& ref = walk.refs[r];
      std::string& path = out->path;
      path.reserve(folder.size() + 1 + ref.size);
      path += folder;
      path += '/';
      path.append(walk.names, ref.offset, ref.size);
      out->class_index = class_index;
    }
  }
}

// Runs fn(i) for i in [0, count) on `threads` threads (the caller's among them), each taking
// the next i; fn gets its thread's WalkScratch.
template <class Fn>
void for_each_parallel(std::size_t threads, std::size_t count, Fn&& fn) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    WalkScratch scratch;
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      fn(i, scratch);
    }
  };
  threads = std::min(threads, count);
  if (threads <= 1) {
    work();
    return;
  }
  std::vector<std::jthread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
}

// make_dataset, and the targets when `targets` is given.
std::vector<FolderSample> collect_samples(const std::filesystem::path& root,
                                          const std::map<std::string, std::int64_t>& class_to_idx,
                                          const FolderOptions& options,
                                          std::vector<std::int64_t>* targets) {
  const std::string directory = expand_user(root.string());
  if (class_to_idx.empty()) {
    throw InvalidArgument("'class_to_index' must have at least one entry to collect any samples.");
  }
  if (options.extensions.has_value() == static_cast<bool>(options.is_valid_file)) {
    throw InvalidArgument(
        "Both extensions and is_valid_file cannot be None or not None at the same time");
  }

  // std::map iterates in sorted key order: torchvision's sorted(class_to_idx.keys()).
  std::vector<std::pair<std::string, std::int64_t>> classes;
  classes.reserve(class_to_idx.size());
  for (const auto& [name, index] : class_to_idx) {
    classes.emplace_back(path_join(directory, name), index);
  }
  std::optional<ExtensionFilter> filter;
  if (options.extensions) filter.emplace(*options.extensions);
  const std::size_t threads =
      options.num_threads > 0 ? static_cast<std::size_t>(options.num_threads)
                              : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);

  // Phase 1: walk every class (listing, filtering, sorting), on all threads.
  std::vector<ClassWalk> walks(classes.size());
  std::atomic<bool> failed{false};
  for_each_parallel(threads, classes.size(), [&](std::size_t i, WalkScratch& scratch) {
    if (failed.load(std::memory_order_relaxed)) return;
    // make_dataset skips a class that is not a folder (it is then reported as empty).
    if (stat_is_folder(classes[i].first) != 1) return;
    try {
      walk_class(classes[i].first, options, filter ? &*filter : nullptr, scratch, walks[i]);
    } catch (...) {
      walks[i].error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  });
  for (const ClassWalk& walk : walks) {
    if (walk.error) std::rethrow_exception(walk.error);
  }

  std::vector<std::size_t> offsets(classes.size() + 1, 0);
  std::vector<std::string> empty_classes;
  auto name = class_to_idx.begin();
  for (std::size_t i = 0; i < walks.size(); ++i, ++name) {
    offsets[i + 1] = offsets[i] + walks[i].refs.size();
    if (walks[i].refs.empty()) empty_classes.push_back(name->first);
  }
  if (!empty_classes.empty() && !options.allow_empty) {
    std::string message = "Found no valid file for the classes " + joined(empty_classes) + ". ";
    if (options.extensions) message += "Supported extensions are: " + joined(*options.extensions);
    throw FolderError(message, 0);
  }

  // Phase 2: every sample's path straight into its place, on all threads.
  // NOTE: no per-class sample vectors to merge afterwards: the only serial step left is sizing
  // the list.
  std::vector<FolderSample> samples(offsets.back());
  if (targets) targets->resize(offsets.back());
  for_each_parallel(threads, classes.size(), [&](std::size_t i, WalkScratch&) {
    place_class(walks[i], classes[i].second, samples.data() + offsets[i]);
    if (targets) {
      std::fill(targets->begin() + static_cast<std::ptrdiff_t>(offsets[i]),
                targets->begin() + static_cast<std::ptrdiff_t>(offsets[i + 1]), classes[i].second);
    }
    walks[i] = ClassWalk{};
  });
  return samples;
}

}  // namespace

std::string expand_user(const std::string& path) {
  if (path.empty() || path[0] != '~') return path;
  std::size_t end = path.find('/', 1);
  if (end == std::string::npos) end = path.size();
  std::string home;
  std::vector<char> buf(16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (end == 1) {
    if (const char* env = std::getenv("HOME")) {
      home = env;
    } else {
      if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) != 0 || !found) {
        return path;
      }
      home = found->pw_dir;
    }
  } else {
    const std::string user = path.substr(1, end - 1);
    if (::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found) {
      return path;
    }
    home = found->pw_dir;
  }
  while (!home.empty() && home.back() == '/') home.pop_back();
  std::string out = home + path.substr(end);
  return out.empty() ? std::string("/") : out;
}

bool has_file_allowed_extension(std::string_view path, const std::vector<std::string>& extensions) {
  // NOTE: ASCII lowercasing where Python lowercases all of Unicode; the two differ only for
  // extensions with non-ASCII letters (or a 'k' matched by the Kelvin sign), never for images.
  return std::any_of(extensions.begin(), extensions.end(),
                     [&](const std::string& ext) { return ends_with_lowered(path, ext); });
}

std::pair<std::vector<std::string>, std::map<std::string, std::int64_t>> find_classes(
    const std::filesystem::path& root) {
  const std::string directory = root.string();
  std::vector<std::string> classes;
  std::exception_ptr entry_error;
  std::vector<char> dirents(64 * 1024);
  const int err = list_folder(directory, dirents, [&](std::string_view name, unsigned char type) {
    bool is_folder = type == DT_DIR;
    if (type == DT_LNK || type == DT_UNKNOWN) {
      const std::string path = path_join(directory, name);
      const int r = stat_is_folder(path);
      // find_classes does not catch is_dir()'s errors: only ENOENT reads as "not a folder".
      if (r < 0 && !entry_error) entry_error = std::make_exception_ptr(os_error(-r, path));
      is_folder = r == 1;
    }
    if (is_folder) classes.emplace_back(name);
  });
  if (err != 0) throw os_error(err, directory);
  if (entry_error) std::rethrow_exception(entry_error);
  // Python sorts str by code point, which is the byte order of their UTF-8.
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    throw FolderError("Couldn't find any class folder in " + directory + ".", 0);
  }
  std::map<std::string, std::int64_t> class_to_idx;
  for (std::size_t i = 0; i < classes.size(); ++i) {
    class_to_idx.emplace(classes[i], static_cast<std::int64_t>(i));
  }
  return {std::move(classes), std::move(class_to_idx)};
}

std::vector<FolderSample> make_dataset(const std::filesystem::path& root,
                                       const std::map<std::string, std::int64_t>& class_to_idx,
                                       const FolderOptions& options) {
  return collect_samples(root, class_to_idx, options, nullptr);
}

FolderIndex index_folder(const std::filesystem::path& root, const FolderOptions& options) {
  FolderIndex index;
  index.root = expand_user(root.string());
  std::tie(index.classes, index.class_to_idx) = find_classes(index.root);
  index.samples = collect_samples(index.root, index.class_to_idx, options, &index.targets);
  return index;
}

std::ostream& operator<<(std::ostream& out, const FolderSample& sample) {
  return out << '(' << py_repr(sample.path) << ", " << sample.class_index << ')';
}

namespace detail {
Index checked_folder_index(Index index, std::int64_t size) {
  const Index wrapped = index < 0 ? index + size : index;
  if (wrapped < 0 || wrapped >= size) {
    throw OutOfRange("DatasetFolder index " + std::to_string(index) + " is out of range for " +
                     std::to_string(size) + " samples");
  }
  return wrapped;
}
}  // namespace detail

}  // namespace coload::vision
