// The tar format, the index and the writer: round trips, archives GNU tar and Python's tarfile
// wrote, and every malformed shard.

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "coload/shards/index.hpp"
#include "coload/shards/tar.hpp"
#include "coload/shards/writer.hpp"
#include "shards_test_support.hpp"

namespace fs = std::filesystem;
namespace shards = coload::shards;
using shards_test::bytes_of;
using shards_test::read_bytes;
using shards_test::TempDir;
using shards_test::write_bytes;

namespace {

std::string run_python(const std::string& script, const std::string& args = "") {
  const std::string cmd = "/usr/bin/python3 -c '" + script + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  INFO(out);
  REQUIRE(rc == 0);
  return out;
}

// Sets a header's size field (octal) and fixes its checksum.
void set_size(std::vector<std::byte>& tar, std::size_t header, const char* octal11) {
  std::memcpy(&tar[header + 124], octal11, 11);
  shards_test::fix_checksum(tar, header);
}

std::vector<std::byte> small_archive() {
  std::vector<std::byte> tar;
  const std::string a = "hello", b = "1";
  shards::append_tar_header(tar, "s0.txt", a.size());
  tar.insert(tar.end(), bytes_of(a).begin(), bytes_of(a).end());
  tar.resize(1024);
  shards::append_tar_header(tar, "s0.cls", b.size());
  tar.insert(tar.end(), bytes_of(b).begin(), bytes_of(b).end());
  tar.resize(2048 + 1024);  // two zero blocks
  return tar;
}

}  // namespace

TEST_SUITE("shards") {

TEST_CASE("header parsing: names, sizes, the end block, and checksums of both signs") {
  std::vector<std::byte> tar = small_archive();
  auto h = shards::parse_tar_header(std::span(tar).subspan(0, 512));
  REQUIRE(h);
  CHECK(h->name == "s0.txt");
  CHECK(h->size == 5);
  CHECK(h->type == shards::TarEntryType::file);
  CHECK_FALSE(shards::parse_tar_header(std::span(tar).subspan(2048, 512)));
  tar[0] = std::byte{'x'};
  CHECK_THROWS_WITH_AS(shards::parse_tar_header(std::span(tar).subspan(0, 512)),
                       doctest::Contains("header checksum mismatch"), shards::TarFormatError);
  CHECK_THROWS_AS(shards::parse_tar_header(std::span(tar).subspan(0, 100)),
                  shards::TarFormatError);
}

TEST_CASE("a long name goes into ustar's prefix, then into a pax header, and reads back") {
  const std::string mid(120, 'd');
  const std::string longer = std::string(300, 'p') + "/x.jpg";
  std::vector<std::byte> tar;
  shards::append_tar_header(tar, mid + "/k.jpg", 3);
  tar.resize(tar.size() + 512);
  shards::append_tar_header(tar, longer, 2);
  tar.resize(tar.size() + 512 + 1024);
  const auto members = shards::list_tar(tar);
  REQUIRE(members.size() == 2);
  CHECK(members[0].name == mid + "/k.jpg");
  CHECK(members[0].offset == 512);
  CHECK(members[1].name == longer);
  CHECK(members[1].size == 2);
  CHECK(members[1].header_offset == 1024);
}

TEST_CASE("WebDataset keys and fields") {
  std::string key, field;
  REQUIRE(shards::split_member_name("a/b.seg.PNG", key, field));
  CHECK(key == "a/b");
  CHECK(field == "seg.png");
  REQUIRE(shards::split_member_name("dir.v1/x.jpg", key, field));
  CHECK(key == "dir.v1/x");
  CHECK(field == "jpg");
  CHECK_FALSE(shards::split_member_name("README", key, field));
  CHECK_FALSE(shards::split_member_name("dir/.hidden", key, field));
  CHECK_FALSE(shards::split_member_name("__meta__", key, field));
  // webdataset skips any name whose first folder is __x__ too (its `__[^/]*__($|/)`).
  CHECK_FALSE(shards::split_member_name("__cache__/000001.jpg", key, field));
  CHECK_FALSE(shards::split_member_name("____/a.jpg", key, field));
  REQUIRE(shards::split_member_name("__a__b/x.jpg", key, field));
  CHECK(key == "__a__b/x");
  REQUIRE(shards::split_member_name("d/__k__/x.jpg", key, field));
  CHECK(key == "d/__k__/x");
  REQUIRE(shards::split_member_name("__k__.jpg", key, field));
  CHECK(key == "__k__");
  CHECK(shards::split_member_name("___/a.jpg", key, field));  // three: no __x__
}

TEST_CASE("the writer's shards round-trip through the index, tar -tf and Python's tarfile") {
  TempDir dir;
  shards::Writer writer(dir.path / "out", {.shard_size = 8192});
  std::vector<std::string> payloads;
  for (int i = 0; i < 7; ++i) {
    payloads.push_back(std::string(static_cast<std::size_t>(1000 + 700 * i), char('a' + i)));
    const std::string cls = std::to_string(i % 3);
    const shards::WriteField fields[] = {{"jpg", bytes_of(payloads.back())},
                                         {"cls", bytes_of(cls)}};
    char key[32];
    std::snprintf(key, sizeof key, "sample%04d", i);
    writer.write(key, fields);
  }
  CHECK_THROWS_AS(writer.write("bad.key", {}), coload::InvalidArgument);
  // What readers would not give back as written is refused when written, naming it: before,
  // "JPG" beside "jpg" failed finish() (no index, no shards.txt), and a key repeated joined
  // two samples into one.
  const std::string one = "1";
  const shards::WriteField jpg_twice[] = {{"jpg", bytes_of(one)}, {"JPG", bytes_of(one)}};
  CHECK_THROWS_WITH_AS(writer.write("sample0007", jpg_twice),
                       "shards::Writer: invalid or repeated field 'JPG' in sample 'sample0007' "
                       "(fields are named without regard to case)",
                       coload::InvalidArgument);
  const shards::WriteField cls_only[] = {{"cls", bytes_of(one)}};
  CHECK_THROWS_WITH_AS(writer.write("sample0006", cls_only),
                       "shards::Writer: key 'sample0006' is the key of the sample before, which "
                       "readers would join it to",
                       coload::InvalidArgument);
  CHECK_THROWS_WITH_AS(writer.write("__cache__/x", cls_only),
                       "shards::Writer: sample '__cache__/x': member '__cache__/x.cls' is one "
                       "readers skip as webdataset's metadata (its first folder, or its name, is "
                       "__x__)",
                       coload::InvalidArgument);
  CHECK_THROWS_WITH_AS(writer.write("empty", {}),
                       "shards::Writer: sample 'empty' has no field", coload::InvalidArgument);
  // A NUL ends a tar name: "a\0b.cls" read back as "a", a member with no field, skipped.
  CHECK_THROWS_WITH_AS(writer.write(std::string_view("a\0b", 3), cls_only),
                       "shards::Writer: the key of the sample after 'sample0006' holds a NUL "
                       "byte, where a tar member's name would end",
                       coload::InvalidArgument);
  const shards::WriteField nul_field[] = {{std::string("c\0ls", 4), bytes_of(one)}};
  CHECK_THROWS_WITH_AS(writer.write("sample0008", nul_field),
                       "shards::Writer: a field name of sample 'sample0008' holds a NUL byte, "
                       "where a tar member's name would end",
                       coload::InvalidArgument);
  CHECK(writer.samples() == 7);
  {
    // "__k__.cls" is no metadata name (its name is not __x__): read back under key "__k__".
    shards::Writer plain(dir.path / "meta");
    plain.write("__k__", cls_only);
    const auto written = plain.finish();
    REQUIRE(written.size() == 1);
    const auto index = shards::build_index(written[0]);
    REQUIRE(index.samples.size() == 1);
    CHECK(index.samples[0].key == "__k__");
  }
  const auto paths = writer.finish();
  REQUIRE(paths.size() >= 3);
  int seen = 0;
  for (const auto& p : paths) {
    CHECK(fs::file_size(p) % 10240 == 0);
    const shards::ShardIndex built = shards::build_index(p);
    shards::ShardIndex loaded = shards::load_index(p, {.write = false});
    // The writer's index file matches a fresh build, which reads no data and so has no checksum.
    CHECK(loaded.checksum.has_value());
    loaded.checksum.reset();
    CHECK(loaded == built);
    for (const auto& s : built.samples) {
      REQUIRE(s.count == 2);
      const auto data = read_bytes(p);
      const auto& jpg = built.members[s.first];
      const auto& cls = built.members[s.first + 1];
      CHECK(jpg.field == "jpg");
      CHECK(cls.field == "cls");
      CHECK(s.key == "sample000" + std::to_string(seen));
      CHECK(std::string(reinterpret_cast<const char*>(data.data() + jpg.offset), jpg.size) ==
            payloads[static_cast<std::size_t>(seen)]);
      CHECK(std::string(reinterpret_cast<const char*>(data.data() + cls.offset), cls.size) ==
            std::to_string(seen % 3));
      ++seen;
    }
  }
  CHECK(seen == 7);
  // tar -tf lists the same members.
  const std::string listed = run_python(
      "import subprocess,sys; print(subprocess.run([\"tar\",\"-tf\",\"" + paths[0] +
      "\"],check=True,capture_output=True,text=True).stdout, end=\"\")");
  CHECK(listed == "sample0000.jpg\nsample0000.cls\nsample0001.jpg\nsample0001.cls\n");
  // Python's tarfile reads every member's bytes back.
  const std::string py = run_python(
      "import tarfile,sys\nn=0\nfor p in sys.argv[1:]:\n  with tarfile.open(p) as t:\n"
      "    for m in t:\n      d=t.extractfile(m).read(); n+=len(d)\nprint(n)",
      [&] {
        std::string a;
        for (const auto& p : paths) a += " '" + p + "'";
        return a;
      }());
  std::size_t total = 0;
  for (int i = 0; i < 7; ++i) total += payloads[static_cast<std::size_t>(i)].size() + 1;
  CHECK(py == std::to_string(total) + "\n");
}

TEST_CASE("shards from Python's tarfile (pax and GNU formats) and GNU tar with long names") {
  TempDir dir;
  const std::string long_dir = std::string(150, 'L');
  const std::string script =
      "import tarfile,io,os\n"
      "d=\"" + dir.path.string() + "\"\n"
      "names=[\"" + long_dir + "/k1.jpg\",\"" + long_dir + "/k1.cls\",\"k2.JPG\",\"k2.cls\","
      "\"k2\",\"\\u00e9t\\u00e9/k3.txt\"]\n"
      "for fmt,name in ((tarfile.PAX_FORMAT,\"pax.tar\"),(tarfile.GNU_FORMAT,\"gnu.tar\")):\n"
      "  with tarfile.open(os.path.join(d,name),\"w\",format=fmt) as t:\n"
      "    t.addfile(tarfile.TarInfo(\"somedir\"))\n"
      "    for i,n in enumerate(names):\n"
      "      data=(n+str(i)).encode()\n"
      "      ti=tarfile.TarInfo(n); ti.size=len(data); t.addfile(ti,io.BytesIO(data))\n";
  run_python(script);
  for (const char* name : {"pax.tar", "gnu.tar"}) {
    CAPTURE(name);
    const auto index = shards::build_index(dir.path / name);
    REQUIRE(index.samples.size() == 3);
    CHECK(index.samples[0].key == long_dir + "/k1");
    CHECK(index.samples[0].count == 2);
    CHECK(index.samples[1].key == "k2");
    CHECK(index.members[index.samples[1].first].field == "jpg");
    CHECK(index.samples[2].key == "\xc3\xa9t\xc3\xa9/k3");
    const auto data = read_bytes(dir.path / name);
    const auto& m = index.members[index.samples[0].first + 1];
    CHECK(std::string(reinterpret_cast<const char*>(data.data() + m.offset), m.size) ==
          long_dir + "/k1.cls1");
  }
  // GNU tar itself, with a name past 100 bytes (a GNU long-name member).
  const fs::path src = dir.path / "src";
  fs::create_directories(src / long_dir);
  write_bytes(src / long_dir / "abc.txt", bytes_of(std::string("gnu tar")));
  const std::string cmd = "cd '" + src.string() + "' && tar --format=gnu -cf '" +
                          (dir.path / "tar.tar").string() + "' " + long_dir + "/abc.txt";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto index = shards::build_index(dir.path / "tar.tar");
  REQUIRE(index.samples.size() == 1);
  CHECK(index.samples[0].key == long_dir + "/abc");
  CHECK(index.members[0].size == 7);
}

TEST_CASE("an extended header between a member's pax header and the member (a pax global header, a GNU long name): read by its own size, as tarfile reads it") {
  // The member's pax header names it and gives its size; a global header ('g', records for
  // the rest of the archive, ignored) of two blocks comes before the member's own header. The
  // pax size is the member's: skipping the global header by it read its second block as a
  // header.
  const std::string path = std::string(120, 'L') + "/k1.txt";
  const auto tar = shards_test::pax_global_between(path, "hello");
  const auto members = shards::list_tar(tar);
  REQUIRE(members.size() == 1);
  CHECK(members[0].name == path);
  CHECK(members[0].size == 5);
  CHECK(members[0].header_offset == 0);  // the pax header's
  CHECK(std::string(reinterpret_cast<const char*>(tar.data() + members[0].offset), 5) == "hello");
  // Python's tarfile reads it the same.
  TempDir dir;
  write_bytes(dir.path / "g.tar", tar);
  const std::string out = run_python(
      "import sys,tarfile\n"
      "t=tarfile.open(sys.argv[1])\n"
      "m=[x for x in t.getmembers() if x.isfile()]\n"
      "print(len(m), len(m[0].name), m[0].size, t.extractfile(m[0]).read().decode())\n",
      (dir.path / "g.tar").string());
  CHECK(out == std::to_string(path.size()).insert(0, "1 ") + " 5 hello\n");

  // The same for a GNU long name between them: read by its own size (14), the pax size (600,
  // two blocks) the member's.
  std::vector<std::byte> gnu;
  const std::string x = shards_test::pax_record("size", "600");
  shards_test::append_typed_header(gnu, "././@PaxHeader", x.size(), 'x');
  shards_test::append_padded(gnu, x);
  shards_test::append_typed_header(gnu, "././@LongLink", 14, 'L');
  shards_test::append_padded(gnu, std::string_view("long/name.txt\0", 14));
  shards_test::append_typed_header(gnu, "short.txt", 0, '0');
  shards_test::append_padded(gnu, std::string(600, 'd'));
  gnu.resize(gnu.size() + 1024);
  const auto named = shards::list_tar(gnu);
  REQUIRE(named.size() == 1);
  CHECK(named[0].name == "long/name.txt");
  CHECK(named[0].size == 600);
  write_bytes(dir.path / "l.tar", gnu);
  CHECK(run_python("import sys,tarfile\n"
                   "m=[x for x in tarfile.open(sys.argv[1]).getmembers() if x.isfile()]\n"
                   "print(len(m), m[0].name, m[0].size)\n",
                   (dir.path / "l.tar").string()) == "1 long/name.txt 600\n");
}

TEST_CASE("malformed shards are named errors: shard, member, offset") {
  TempDir dir;
  const fs::path p = dir.path / "bad.tar";
  auto expect = [&](const std::vector<std::byte>& tar, const std::string& member,
                    std::uint64_t offset, const std::string& problem) {
    write_bytes(p, tar);
    try {
      shards::build_index(p);
      FAIL("no error for: " << problem);
    } catch (const shards::ShardError& e) {
      CAPTURE(e.what());
      CHECK(e.shard() == p.string());
      CHECK(e.member() == member);
      CHECK(e.offset() == offset);
      CHECK(std::string(e.what()).find(problem) != std::string::npos);
      CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
    }
  };
  const std::vector<std::byte> good = small_archive();
  CHECK(shards::list_tar(good).size() == 2);

  auto bad_checksum = good;
  bad_checksum[1024 + 3] = std::byte{'Z'};
  expect(bad_checksum, "", 1024, "header checksum mismatch");

  auto absurd = good;  // claims 8 GiB in a 3 KiB file: an error, not an allocation
  set_size(absurd, 1024, "77777777777");
  expect(absurd, "s0.cls", 1024, "header claims 8589934591 bytes");

  auto not_octal = good;
  set_size(not_octal, 0, "0000000009x");
  expect(not_octal, "", 0, "unreadable size field");

  expect(std::vector<std::byte>(good.begin(), good.begin() + 1024 + 300), "", 1024,
         "truncated header (300 of 512 bytes");
  expect(std::vector<std::byte>(good.begin(), good.begin() + 1024 + 512), "s0.cls", 1024,
         "header claims 1 bytes of data but only 0 remain");
  expect(std::vector<std::byte>(good.begin(), good.begin() + 2048), "", 2048,
         "ends without its end-of-archive block");

  // A pax header above the limit, and a malformed one.
  std::vector<std::byte> pax;
  shards::append_tar_header(pax, std::string(400, 'n') + ".x", 1);
  pax.resize(pax.size() + 512 + 1024);
  write_bytes(p, pax);
  CHECK_NOTHROW(shards::build_index(p));
  CHECK_THROWS_WITH_AS(shards::list_tar(pax, "m", {.max_extended_header = 64}),
                       doctest::Contains("pax header of 412 bytes exceeds the limit of 64"),
                       shards::ShardError);
  auto bad_pax = pax;
  bad_pax[512] = std::byte{'x'};  // the record length is no longer a number
  expect(bad_pax, "", 0, "malformed pax record");

  // A key with a field twice.
  std::vector<std::byte> dup;
  shards::append_tar_header(dup, "k.jpg", 0);
  shards::append_tar_header(dup, "k.JPG", 0);
  dup.resize(dup.size() + 1024);
  expect(dup, "k.JPG", 512, "duplicate field 'jpg' in sample 'k'");
}

TEST_CASE("the index file: rebuilt when the shard changes, ignored when corrupt") {
  TempDir dir;
  const fs::path p = dir.path / "a.tar";
  write_bytes(p, small_archive());
  const auto first = shards::load_index(p);
  REQUIRE(fs::exists(shards::index_path(p)));
  const std::string text = shards_test::read_text(shards::index_path(p));
  CHECK(text.starts_with("coload-shard-index\t1\n3072\t"));
  CHECK(text.ends_with("\n512\t5\ts0\ttxt\n1536\t1\ts0\tcls\n"));
  // A stale index (other mtime) is rebuilt; a corrupt one is too.
  std::ofstream(shards::index_path(p)) << "coload-shard-index\t1\n3072\t1\t2\t1\n0\t99999\ts0\tx\n";
  CHECK(shards::load_index(p) == first);
  CHECK(shards_test::read_text(shards::index_path(p)) == text);
  // Escapes survive the file.
  shards::ShardIndex odd;
  odd.file_size = 100;
  odd.samples.push_back({"a\tb\\c\nd", 0, 1, 0, 10});
  odd.members.push_back({"f\tg", 0, 10});
  shards::ShardIndex back;
  REQUIRE(shards::parse_index(shards::format_index(odd), 100, back));
  CHECK(back == odd);
  CHECK_FALSE(shards::parse_index(shards::format_index(odd), 5, back));  // other shard size
  // Why a text is refused: its line, and what is wrong with it.
  const auto why = [&](const std::string& text, std::uint64_t size) {
    std::string reason;
    CHECK_FALSE(shards::parse_index(text, size, back, &reason));
    return reason;
  };
  CHECK(why(shards::format_index(odd), 5) == "line 2: made for a shard of 100 bytes, not 5");
  CHECK(why("coload-shard-index\t9\n", 100) ==
        "line 1: not 'coload-shard-index' and a version this reader knows (1, 2 or 3)");
  CHECK(why("coload-shard-index\t1\n100\t0\t1\t1\n0\t200\ts0\tx\n", 100) ==
        "line 3: a member of 200 bytes at 0, past the shard's end (100 bytes)");
  CHECK(why("coload-shard-index\t1\n100\t0\t1\t1\n0\t20\ts0\n", 100) ==
        "line 3: a malformed member (offset, size, key, field[, restarts])");
  CHECK(why("coload-shard-index\t1\n100\t0\t2\t1\n0\t20\ts0\tx\n", 100) ==
        "the header says 2 members and 1 samples; it lists 1 and 1");
  CHECK(why("coload-shard-index\t1\n100\t0\t1\t1\n0\t20\ts0\tx", 100) ==
        "line 3: an unfinished last line");
  CHECK(why("coload-shard-index\t1\n", 100) == "line 2: no header line");
  // A checksum makes it version 3, a fifth field of the header line; a malformed one, or one
  // in an earlier version, is not an index.
  odd.checksum = 0x00ab'cdef'0123'4567ULL;
  const std::string v3 = shards::format_index(odd);
  CHECK(v3.starts_with("coload-shard-index\t3\n100\t0\t1\t1\txxh3:00abcdef01234567\n"));
  REQUIRE(shards::parse_index(v3, 100, back));
  CHECK(back == odd);
  const auto edited = [&](std::string from, std::string to) {
    std::string t = v3;
    t.replace(t.find(from), from.size(), to);
    return shards::parse_index(t, 100, back);
  };
  CHECK_FALSE(edited("\t3\n", "\t2\n"));
  CHECK_FALSE(edited("xxh3:00abcdef01234567", "xxh3:00abcdef0123456"));
  CHECK_FALSE(edited("xxh3:00abcdef01234567", "xxh3:00ABCDEF01234567"));
  CHECK_FALSE(edited("xxh3:00abcdef01234567", "md5:00abcdef01234567"));
  CHECK_FALSE(edited("\txxh3:00abcdef01234567", ""));
  // Samples go forward as members do: one that starts before the last one's end is refused
  // (a reader streams the shard in order, and copied from before the bytes it had read).
  shards::ShardIndex two;
  two.file_size = 100;
  two.samples.push_back({"a", 0, 1, 10, 30});
  two.samples.push_back({"b", 1, 1, 30, 40});
  two.members.push_back({"x", 10, 20});
  two.members.push_back({"x", 30, 10});
  REQUIRE(shards::parse_index(shards::format_index(two), 100, back));
  CHECK(back == two);
  two.samples[1].begin = 20;
  two.members[1].offset = 20;
  CHECK(why(shards::format_index(two), 100) == "line 4: sample 'b' begins before the previous one ends");
  two.samples[1].begin = 0;
  two.members[1].offset = 0;
  CHECK_FALSE(shards::parse_index(shards::format_index(two), 100, back));
}

TEST_CASE("a pack that fails leaves none of its shards, index files or shard list") {
  // Before, a sample that threw mid-pack unwound through ~Writer, which finished the open shard
  // and wrote shards.txt: the folder read as a whole dataset of the samples before the fault.
  TempDir dir;
  const auto files = [&](const std::filesystem::path& folder) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto write_sample = [](std::int64_t k, shards::Writer& w) {
    if (k == 9) throw std::runtime_error("cannot read sample 9");
    const std::string data(1500, 'x');
    const shards::WriteField fields[] = {{"jpg", bytes_of(data)}};
    w.write("s" + std::to_string(k), fields);
  };
  {
    std::filesystem::create_directories(dir.path / "out");
    std::ofstream(dir.path / "out" / "classes.txt") << "kept\n";  // not the writer's
    shards::Writer writer(dir.path / "out", {.shard_size = 4096});
    CHECK_THROWS_WITH_AS(shards::pack(12, std::nullopt, writer, write_sample),
                         "cannot read sample 9", std::runtime_error);
    CHECK(writer.finish().empty());
    CHECK_THROWS_AS(writer.write("s20", {}), coload::LogicError);
  }
  CHECK(files(dir.path / "out") == std::vector<std::string>{"classes.txt"});

  // A writer unwound by an exception from its owner's own loop (not pack()'s) abandons too.
  try {
    shards::Writer writer(dir.path / "unwound", {.shard_size = 4096});
    for (std::int64_t k = 0; k < 9; ++k) write_sample(k, writer);
    REQUIRE(files(dir.path / "unwound").size() > 2);  // shards closed, one open
    throw std::runtime_error("unwinding");
  } catch (const std::runtime_error&) {
  }
  CHECK(files(dir.path / "unwound").empty());

  // A finish() that throws (its shard list cannot take its name) abandons as it unwinds.
  std::filesystem::create_directories(dir.path / "stuck" / shards::shard_list_name / "held");
  try {
    shards::Writer writer(dir.path / "stuck", {.shard_size = 4096});
    for (std::int64_t k = 0; k < 9; ++k) write_sample(k, writer);
    writer.finish();
    FAIL("finish() renamed its list over a folder that is not empty");
  } catch (const std::filesystem::filesystem_error&) {
  }
  CHECK(files(dir.path / "stuck") == std::vector<std::string>{std::string(shards::shard_list_name)});

  // Destroyed in the ordinary way, it finishes: every sample, and the shard list; a writer
  // finished already abandons nothing (pack() given one fails at its first write).
  {
    shards::Writer writer(dir.path / "kept", {.shard_size = 4096});
    for (std::int64_t k = 0; k < 9; ++k) write_sample(k, writer);
  }
  {
    shards::Writer writer(dir.path / "kept", {.shard_size = 4096});
    for (std::int64_t k = 0; k < 9; ++k) write_sample(k, writer);
    writer.finish();
    CHECK_THROWS_AS(shards::pack(1, std::nullopt, writer, write_sample), coload::LogicError);
  }
  const auto kept = files(dir.path / "kept");
  CHECK(std::count(kept.begin(), kept.end(), std::string(shards::shard_list_name)) == 1);
  std::int64_t samples = 0;
  for (const auto& name : kept) {
    if (name.ends_with(".tar")) {
      samples += static_cast<std::int64_t>(shards::load_index(dir.path / "kept" / name).samples.size());
    }
  }
  CHECK(samples == 9);
}

TEST_CASE("pack_order is a seeded permutation") {
  const auto plain = shards::pack_order(5, std::nullopt);
  CHECK(plain == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  const auto a = shards::pack_order(100, 7), b = shards::pack_order(100, 7);
  CHECK(a == b);
  CHECK(a != shards::pack_order(100, 8));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == shards::pack_order(100, std::nullopt));
}

}  // TEST_SUITE
