// vision tests: DatasetFolder/ImageFolder indexing, checked against torchvision 0.14.

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/vision/folder.hpp"
#include "image_test_support.hpp"

namespace fs = std::filesystem;
using coload::vision::DatasetFolder;
using coload::vision::FolderError;
using coload::vision::FolderIndex;
using coload::vision::FolderOptions;
using coload::vision::FolderSample;
using coload::vision::ImageFolder;
using coload::vision::index_folder;

namespace {

constexpr const char* kPython = "/usr/bin/python3";

// A fresh folder under /tmp, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string name = (fs::temp_directory_path() / "coload_folder_XXXXXX").string();
    REQUIRE(::mkdtemp(name.data()) != nullptr);
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Creates an empty file (and its parent folders).
void touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream{path};
  REQUIRE(fs::exists(path));
}

// Runs a shell command; its exit status and stdout.
std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const coload::testing::Need& torchvision() { return coload::vision::test::torchvision_reference(); }
/// Whether a case may compare with torchvision here. Where it is missing but asked for
/// (COLOAD_REQUIRE_REFERENCES, as tools/test sets it), the case fails naming why, rather than
/// leaving its comparison out.
bool have_torchvision() {
  const coload::testing::Need& need = torchvision();
  if (!need.met() && need.required()) {
    FAIL_CHECK(need.missing() << " (" << std::string(need.env()) << " asks for it)");
  }
  return need.met();
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// torchvision.datasets.ImageFolder(root) (a loader that opens nothing), in the listing format
// below: "C\tclass" per class, "S\ttarget\tpath" per sample, or "E\tType\tmessage".
std::string torchvision_listing(const TempDir& tmp, const fs::path& root) {
  const fs::path script = tmp.path / "list_folder.py";
  std::ofstream{script} << R"(import sys
from torchvision.datasets import ImageFolder
try:
    ds = ImageFolder(sys.argv[1], loader=lambda p: p)
except Exception as e:
    print("E", type(e).__name__, e, sep="\t")
    sys.exit(0)
for c in ds.classes:
    print("C", c, sep="\t")
for p, t in ds.samples:
    print("S", t, p, sep="\t")
)";
  auto [rc, out] =
      run(std::string(kPython) + " " + quoted(script.string()) + " " + quoted(root.string()));
  REQUIRE(rc == 0);
  return out;
}

std::string listing(const FolderIndex& index) {
  std::string out;
  for (const auto& c : index.classes) out += "C\t" + c + "\n";
  for (const auto& s : index.samples) {
    out += "S\t" + std::to_string(s.class_index) + "\t" + s.path + "\n";
  }
  return out;
}

// coload's ImageFolder indexing of root in the same format, errors included.
std::string coload_listing(const fs::path& root) {
  try {
    return listing(index_folder(
        root, {.extensions = std::vector<std::string>(coload::vision::image_extensions.begin(),
                                                      coload::vision::image_extensions.end())}));
  } catch (const FolderError& e) {
    // The OSError subclass Python raises for the errno.
    const char* type = e.error_number() == ENOTDIR                           ? "NotADirectoryError"
                       : e.error_number() == EACCES                          ? "PermissionError"
                       : e.error_number() == 0 || e.error_number() == ENOENT ? "FileNotFoundError"
                                                                             : "OSError";
    return std::string("E\t") + type + "\t" + e.what() + "\n";
  }
}

FolderOptions image_options() {
  return {.extensions = std::vector<std::string>(coload::vision::image_extensions.begin(),
                                                 coload::vision::image_extensions.end())};
}

// The awkward folder of the parity test: nested and symlinked folders, symlinked and dangling
// files, mixed-case extensions, non-image and hidden files, a folder named like an image.
fs::path make_awkward_tree(const TempDir& tmp) {
  const fs::path root = tmp.path / "root";
  const fs::path outside = tmp.path / "outside";
  for (const char* f : {"o1.jpg", "o2.txt", "nested/o3.tif"}) touch(outside / f);
  for (const char* f : {"a.jpg", "B.JPG", "c.Png", "d.jpeg", "Z.webp", "notes.txt", ".hidden.jpg",
                        "sub/x.jpg", "sub/deeper/y.PNG", "sub-b/z.jpg", "sub.jpg/inner.bmp"}) {
    touch(root / "cat" / f);
  }
  for (const char* f : {"10.jpg", "9.jpg", "README", "UPPER.JPEG", "img.tiff"}) {
    touch(root / "dog" / f);
  }
  for (const char* f : {"b.ppm", "b.pgm"}) touch(root / "bird house" / f);
  touch(root / ".hidden_class/h.jpg");
  touch(root / "toplevel.jpg");
  fs::create_directory_symlink("../../outside", root / "cat/linked");
  fs::create_symlink("../dog/10.jpg", root / "cat/alias.jpg");
  fs::create_symlink("does-not-exist", root / "cat/broken.jpg");
  fs::create_directory_symlink("dog", root / "link_class");
  fs::create_symlink("nowhere", root / "broken_class");
  return root;
}

std::vector<FolderSample> expected_awkward_samples(const std::string& r) {
  return {
      {r + "/.hidden_class/h.jpg", 0},
      {r + "/bird house/b.pgm", 1},
      {r + "/bird house/b.ppm", 1},
      {r + "/cat/.hidden.jpg", 2},
      {r + "/cat/B.JPG", 2},
      {r + "/cat/Z.webp", 2},
      {r + "/cat/a.jpg", 2},
      {r + "/cat/alias.jpg", 2},
      {r + "/cat/broken.jpg", 2},  // dangling: os.walk lists it as a file
      {r + "/cat/c.Png", 2},
      {r + "/cat/d.jpeg", 2},
      {r + "/cat/linked/o1.jpg", 2},
      {r + "/cat/linked/nested/o3.tif", 2},
      {r + "/cat/sub/x.jpg", 2},
      {r + "/cat/sub-b/z.jpg", 2},  // "sub-b" < "sub.jpg" < "sub/deeper" as strings
      {r + "/cat/sub.jpg/inner.bmp", 2},
      {r + "/cat/sub/deeper/y.PNG", 2},
      {r + "/dog/10.jpg", 3},
      {r + "/dog/9.jpg", 3},
      {r + "/dog/UPPER.JPEG", 3},
      {r + "/dog/img.tiff", 3},
      {r + "/link_class/10.jpg", 4},
      {r + "/link_class/9.jpg", 4},
      {r + "/link_class/UPPER.JPEG", 4},
      {r + "/link_class/img.tiff", 4},
  };
}

// A loader that reads nothing: the sample is the path and the context's index.
struct PathLoader {
  std::pair<std::string, coload::Index> operator()(const std::string& path,
                                                   coload::SampleContext& ctx) const {
    return {path, ctx.index};
  }
};

}  // namespace

TEST_SUITE("vision") {
  TEST_CASE("index_folder lists classes and samples in torchvision's order") {
    TempDir tmp;
    const fs::path root = make_awkward_tree(tmp);
    const FolderIndex index = index_folder(root, image_options());
    CHECK(index.root == root.string());
    CHECK(index.classes ==
          std::vector<std::string>{".hidden_class", "bird house", "cat", "dog", "link_class"});
    CHECK(index.class_to_idx ==
          std::map<std::string, std::int64_t>{
              {".hidden_class", 0}, {"bird house", 1}, {"cat", 2}, {"dog", 3}, {"link_class", 4}});
    CHECK(index.samples == expected_awkward_samples(root.string()));
    REQUIRE(index.targets.size() == index.samples.size());
    for (std::size_t i = 0; i < index.samples.size(); ++i) {
      CHECK(index.targets[i] == index.samples[i].class_index);
    }
  }

  TEST_CASE("index_folder equals torchvision.datasets.ImageFolder on an awkward folder" * coload::testing::needs(torchvision())) {
    coload::testing::require(torchvision());
    TempDir tmp;
    const fs::path root = make_awkward_tree(tmp);
    const std::string theirs = torchvision_listing(tmp, root);
    CHECK(theirs.find("S\t") != std::string::npos);
    CHECK(coload_listing(root) == theirs);
    // A trailing slash on the root changes how torchvision joins paths; so must it ours.
    CHECK(coload_listing(root.string() + "/") == torchvision_listing(tmp, root.string() + "/"));
  }

  TEST_CASE("a symlink cycle ends where os.walk's does" * coload::testing::needs(torchvision())) {
    coload::testing::require(torchvision());
    TempDir tmp;
    const fs::path root = tmp.path / "root";
    touch(root / "a/x.jpg");
    touch(root / "a/sub/y.png");
    fs::create_directory_symlink(".", root / "a/sub/again");
    const std::string ours = coload_listing(root);
    CHECK(ours == torchvision_listing(tmp, root));
    // Python stops after 40 symlinks in one path: y.png appears once per level.
    std::size_t count = 0;
    for (std::size_t at = 0; (at = ours.find("y.png", at)) != std::string::npos; ++at) ++count;
    CHECK(count == 41);
  }

  TEST_CASE("the walk is the same on one thread and on many") {
    TempDir tmp;
    for (int c = 0; c < 17; ++c) {
      for (int i = 0; i < 5; ++i) {
        // NOTE: appended, not "c" + std::to_string(...): GCC 12 warns falsely on the latter.
        std::string folder = "c";
        folder += std::to_string(100 + c);
        touch(tmp.path / folder / (i % 2 ? "s1" : "s0") / (std::to_string(i) + ".jpg"));
      }
    }
    FolderOptions one = image_options();
    one.num_threads = 1;
    FolderOptions many = image_options();
    many.num_threads = 6;
    const FolderIndex a = index_folder(tmp.path, one);
    const FolderIndex b = index_folder(tmp.path, many);
    CHECK(a.samples.size() == 17 * 5);
    CHECK(a.samples == b.samples);
    CHECK(a.classes == b.classes);
    CHECK(a.targets == b.targets);
    CHECK(coload::vision::make_dataset(tmp.path, a.class_to_idx, many) == a.samples);
  }

  TEST_CASE("a missing root is named in the error, as Python's FileNotFoundError names it") {
    TempDir tmp;
    const fs::path root = tmp.path / "missing";
    const std::string message = "[Errno 2] No such file or directory: '" + root.string() + "'";
    try {
      index_folder(root, image_options());
      FAIL("no error");
    } catch (const FolderError& e) {
      CHECK(std::string(e.what()) == message);
      CHECK(e.error_number() == ENOENT);
    }
    if (have_torchvision()) {
      CHECK(torchvision_listing(tmp, root) == "E\tFileNotFoundError\t" + message + "\n");
    }
  }

  TEST_CASE("a root that is a file, or has no class folder, is an error naming it") {
    TempDir tmp;
    touch(tmp.path / "root/file.jpg");
    fs::create_symlink("nowhere", tmp.path / "root/dangling");
    CHECK_THROWS_WITH_AS(
        index_folder(tmp.path / "root", image_options()),
        ("Couldn't find any class folder in " + (tmp.path / "root").string() + ".").c_str(),
        FolderError);
    CHECK_THROWS_WITH_AS(
        index_folder(tmp.path / "root/file.jpg", image_options()),
        ("[Errno 20] Not a directory: '" + (tmp.path / "root/file.jpg").string() + "'").c_str(),
        FolderError);
    if (have_torchvision()) {
      CHECK(coload_listing(tmp.path / "root") == torchvision_listing(tmp, tmp.path / "root"));
      CHECK(coload_listing(tmp.path / "root/file.jpg") ==
            torchvision_listing(tmp, tmp.path / "root/file.jpg"));
    }
  }

  TEST_CASE("classes without a valid file are an error unless allow_empty") {
    TempDir tmp;
    touch(tmp.path / "a/x.jpg");
    touch(tmp.path / "b/readme.txt");
    fs::create_directory(tmp.path / "c");
    CHECK_THROWS_WITH_AS(index_folder(tmp.path, image_options()),
                         "Found no valid file for the classes b, c. Supported extensions are: "
                         ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp",
                         FolderError);
    if (have_torchvision()) {
      CHECK(coload_listing(tmp.path) == torchvision_listing(tmp, tmp.path));
    }

    FolderOptions predicate{
        .is_valid_file = [](const std::string& p) { return p.ends_with(".jpg"); }};
    // With a predicate torchvision names no extensions but keeps the trailing space.
    CHECK_THROWS_WITH_AS(index_folder(tmp.path, predicate),
                         "Found no valid file for the classes b, c. ", FolderError);

    FolderOptions allow = image_options();
    allow.allow_empty = true;
    const FolderIndex index = index_folder(tmp.path, allow);
    CHECK(index.classes == std::vector<std::string>{"a", "b", "c"});
    CHECK(index.samples == std::vector<FolderSample>{{(tmp.path / "a/x.jpg").string(), 0}});
  }

  TEST_CASE("extensions and is_valid_file: exactly one, with torchvision's ValueError text") {
    TempDir tmp;
    touch(tmp.path / "a/x.jpg");
    const char* message =
        "Both extensions and is_valid_file cannot be None or not None at the same time";
    FolderOptions both = image_options();
    both.is_valid_file = [](const std::string&) { return true; };
    CHECK_THROWS_WITH_AS(index_folder(tmp.path, both), message, std::invalid_argument);
    CHECK_THROWS_WITH_AS(index_folder(tmp.path, FolderOptions{}), message, std::invalid_argument);
    CHECK_THROWS_WITH_AS(coload::vision::make_dataset(tmp.path, {}, image_options()),
                         "'class_to_index' must have at least one entry to collect any samples.",
                         std::invalid_argument);
    // As in torchvision, the root is checked before the options.
    CHECK_THROWS_AS(index_folder(tmp.path / "missing", both), FolderError);
  }

  TEST_CASE("is_valid_file sees full paths in sample order on one thread") {
    TempDir tmp;
    touch(tmp.path / "b/2.txt");
    touch(tmp.path / "b/1.txt");
    touch(tmp.path / "a/sub/3.txt");
    touch(tmp.path / "a/skip.txt");
    std::vector<std::string> seen;
    FolderOptions options{.is_valid_file =
                              [&](const std::string& p) {
                                seen.push_back(p);
                                return !p.ends_with("skip.txt");
                              },
                          .num_threads = 1};
    const FolderIndex index = index_folder(tmp.path, options);
    const std::string r = tmp.path.string();
    CHECK(seen == std::vector<std::string>{r + "/a/skip.txt", r + "/a/sub/3.txt", r + "/b/1.txt",
                                           r + "/b/2.txt"});
    CHECK(index.samples == std::vector<FolderSample>{
                               {r + "/a/sub/3.txt", 0}, {r + "/b/1.txt", 1}, {r + "/b/2.txt", 1}});
  }

  TEST_CASE("extensions compare with the name lowercased, as given") {
    CHECK(coload::vision::has_file_allowed_extension("A.JPG", {".jpg"}));
    CHECK(coload::vision::has_file_allowed_extension("dir/x.Tar.GZ", {".png", ".tar.gz"}));
    CHECK_FALSE(coload::vision::has_file_allowed_extension("a.jpg", {".JPG"}));
    CHECK_FALSE(coload::vision::has_file_allowed_extension("jpg", {".jpg"}));
    CHECK_FALSE(coload::vision::has_file_allowed_extension("a.jpg", {}));
  }

  TEST_CASE("expand_user replaces a leading ~ as os.path.expanduser does") {
    const char* home = std::getenv("HOME");
    REQUIRE(home != nullptr);
    std::string h = home;
    while (h.size() > 1 && h.back() == '/') h.pop_back();
    CHECK(coload::vision::expand_user("~/data") == h + "/data");
    CHECK(coload::vision::expand_user("~") == h);
    CHECK(coload::vision::expand_user("~root/x") == "/root/x");
    CHECK(coload::vision::expand_user("~no_such_user_coload/x") == "~no_such_user_coload/x");
    CHECK(coload::vision::expand_user("/a/~b") == "/a/~b");
  }

  TEST_CASE("DatasetFolder is a map-style dataset whose loader gets the path and the context") {
    TempDir tmp;
    touch(tmp.path / "x/1.npy");
    touch(tmp.path / "x/2.npy");
    touch(tmp.path / "y/3.npy");
    touch(tmp.path / "y/4.txt");
    using Folder = DatasetFolder<PathLoader>;
    static_assert(coload::MapDataset<Folder>);
    static_assert(std::is_same_v<coload::sample_t<Folder>,
                                 std::pair<std::pair<std::string, coload::Index>, std::int64_t>>);
    const Folder folder(tmp.path, PathLoader{}, {.extensions = std::vector<std::string>{".npy"}});
    REQUIRE(folder.size() == 3);
    CHECK(folder.classes() == std::vector<std::string>{"x", "y"});
    CHECK(folder.targets() == std::vector<std::int64_t>{0, 0, 1});
    CHECK(folder.class_to_idx().at("y") == 1);
    coload::SampleContext ctx;
    ctx.index = 2;
    const auto [sample, target] = folder.get(2, ctx);
    CHECK(sample.first == (tmp.path / "y/3.npy").string());
    CHECK(sample.second == 2);
    CHECK(target == 1);
    CHECK(folder.get(-3, ctx).first.first == (tmp.path / "x/1.npy").string());
    CHECK_THROWS_WITH_AS(folder.get(3, ctx), "DatasetFolder index 3 is out of range for 3 samples",
                         std::out_of_range);
    CHECK_THROWS_AS(folder.get(-4, ctx), std::out_of_range);

    // Copies share the index.
    const Folder copy = folder;
    CHECK(&copy.index() == &folder.index());
  }

  TEST_CASE("ImageFolder takes image extensions by default and a path-only loader") {
    TempDir tmp;
    touch(tmp.path / "k/a.PNG");
    touch(tmp.path / "k/b.txt");
    ImageFolder folder(tmp.path, [](const std::string& path) { return path.size(); });
    static_assert(coload::MapDataset<decltype(folder)>);
    REQUIRE(folder.size() == 1);
    CHECK(folder.imgs() == folder.samples());
    coload::SampleContext ctx;
    CHECK(folder.get(0, ctx).first == (tmp.path / "k/a.PNG").string().size());

    ImageFolder only_txt(
        tmp.path, [](const std::string& path) { return path; },
        {.is_valid_file = [](const std::string& p) { return p.ends_with(".txt"); }});
    REQUIRE(only_txt.size() == 1);
    CHECK(only_txt.samples()[0].path == (tmp.path / "k/b.txt").string());
  }
}
