// Shards by URL against nginx on 127.0.0.1 and a fault-injecting proxy in front of it
// (serve.py, started once for the whole executable): every sample exactly once and the epoch's
// bytes equal to the local folder's, under each fault, or the named error.

#define DOCTEST_CONFIG_IMPLEMENT
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "coload/core/warning.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/io/http.hpp"
#include "coload/io/reader.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/index.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"
#include "remote_support.hpp"
#include "serve.hpp"
#include "shards_test_support.hpp"

// After the coload headers: libtorch's glog defines a CHECK of its own, which doctest's replaces.
#include <doctest/doctest.h>

using namespace remote_test;

namespace {

// Runs `body` in a forked child and gives the status it exits with (its return; 4 where it
// threw, rather than go on running the parent's later tests), or -1 where it did not exit (a
// hang ends in alarm()'s SIGALRM, which the parent sees, never a hung test).
template <class Body>
int in_forked_child(Body body) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(30);
    try {
      ::_exit(body());
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_SUITE("shards") {

TEST_CASE("brace patterns expand as WebDataset's do, and bad ones are named") {
  CHECK((shards::expand_braces("s-{0..2}.tar") ==
         std::vector<std::string>{"s-0.tar", "s-1.tar", "s-2.tar"}));
  CHECK((shards::expand_braces("t-{000008..000010}.tar") ==
         std::vector<std::string>{"t-000008.tar", "t-000009.tar", "t-000010.tar"}));
  CHECK((shards::expand_braces("{a,b}-{1..2}") ==
         std::vector<std::string>{"a-1", "a-2", "b-1", "b-2"}));
  CHECK(shards::expand_braces("plain.tar") == std::vector<std::string>{"plain.tar"});
  // Padded to the wider end when either end has a leading zero, as bash and braceexpand do:
  // coload padded only by the left end ({1..010} gave s-1 .. s-10, names nothing serves).
  CHECK((shards::expand_braces("s-{1..010}.tar").front() == "s-001.tar"));
  CHECK((shards::expand_braces("s-{1..010}.tar").back() == "s-010.tar"));
  CHECK((shards::expand_braces("{08..100}").front() == "008"));
  CHECK((shards::expand_braces("{08..100}").back() == "100"));
  CHECK((shards::expand_braces("{0..10}").front() == "0"));  // "0" alone is no leading zero
  CHECK((shards::expand_braces("{9..10}") == std::vector<std::string>{"9", "10"}));
  CHECK_THROWS_WITH_AS(shards::expand_braces("x-{1..3.tar"), doctest::Contains("is not closed"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(shards::expand_braces("x-{5..3}.tar"), doctest::Contains("goes down"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(shards::expand_braces("x-{0..9999999}.tar"),
                       doctest::Contains("x-{0..9999999}.tar"), InvalidArgument);
  // Groups do not nest, and a '}' must close one: both named, not read as names.
  CHECK_THROWS_WITH_AS(shards::expand_braces("s-{a,{b,c}}.tar"),
                       "brace pattern 's-{a,{b,c}}.tar': '{' at 5 is inside another group "
                       "(groups do not nest; write each name's groups side by side)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(shards::expand_braces("s-{0..1}}.tar"),
                       "brace pattern 's-{0..1}}.tar': '}' at 8 closes no '{'", InvalidArgument);
  CHECK_THROWS_WITH_AS(shards::expand_braces("s-}{0..1}.tar"),
                       "brace pattern 's-}{0..1}.tar': '}' at 2 closes no '{'", InvalidArgument);
}

TEST_CASE("a folder URL, a brace pattern and file:// stream the local epoch, sample for sample") {
  const std::size_t n = shards::find_shards(*root / "shards").size();
  REQUIRE(n >= 8);
  const WorkerInfo info{.id = 1, .num_workers = 2, .seed = 5};
  const auto local = local_epoch(info);
  REQUIRE(local.size() > 40);

  shards::ShardStream folder(url("ok"), stream_options());
  CHECK(folder.dataset().shards().size() == n);
  CHECK(folder.dataset().shards()[0].path == url("ok") + "shard-000000.tar");
  CHECK(folder.total_samples() == total);
  CHECK(epoch(folder, info) == local);

  char last[16];
  std::snprintf(last, sizeof last, "%06zu", n - 1);
  // nginx directly, no proxy.
  const std::string direct = "http://127.0.0.1:" + std::to_string(server->nginx) +
                             "/shards/shard-{000000.." + last + "}.tar";
  shards::ShardStream braces(direct, stream_options());
  CHECK(epoch(braces, info) == local);

  shards::ShardStream file("file://" + (*root / "shards").string(), stream_options());
  CHECK(epoch(file, info) == local);

  // A scheme in any case is that scheme (RFC 3986 3.1): not a local path of that name.
  const std::string shouted = "HTTP://127.0.0.1:" + std::to_string(server->nginx) + "/shards/";
  shards::ShardStream upper(shouted, stream_options());
  CHECK(upper.dataset().shards().size() == n);
  CHECK(epoch(upper, info) == local);
  CHECK(shards::ShardDataset(shouted).read(3).key == shards::ShardDataset(*root / "shards").read(3).key);
  shards::ShardStream file_upper("File://" + (*root / "shards").string(), stream_options());
  CHECK(file_upper.dataset().shards()[0].path == (*root / "shards" / "shard-000000.tar").string());
  CHECK(epoch(file_upper, info) == local);

  // A query (a token, a presigned URL's) stays the query of every name derived: the folder's
  // list, each shard and its index. nginx ignores it.
  shards::ShardStream query(url("ok") + "?token=a%2Fb", stream_options());
  CHECK(query.dataset().shards()[0].path == url("ok") + "shard-000000.tar?token=a%2Fb");
  CHECK(epoch(query, info) == local);
  const shards::ShardDataset one(url("ok") + "shard-000001.tar?token=x#frag");
  CHECK(one.shards().size() == 1);
  CHECK(one.size() == static_cast<Index>(one.shards()[0].samples.size()));
  CHECK(one.read(0).key == shards::ShardDataset((*root / "shards" / "shard-000001.tar").string())
                              .read(0).key);

  // file:// URLs are percent-decoded paths, in a list of names too; a local brace pattern
  // names local shards.
  const fs::path spaced = *root / "my shards";
  if (!fs::exists(spaced)) fs::copy(*root / "shards", spaced);
  shards::ShardStream decoded("file://" + (*root).string() + "/my%20shards", stream_options());
  CHECK(epoch(decoded, info) == local);
  std::vector<std::string> listed;
  for (const auto& p : shards::find_shards(spaced)) listed.push_back("file://localhost" + p);
  CHECK(listed[0].find(' ') != std::string::npos);
  const shards::ShardDataset by_list(listed);
  CHECK(by_list.size() == static_cast<Index>(total));
  const std::string local_pattern = (spaced / "shard-{000000..").string() + last + "}.tar";
  shards::ShardStream local_braces(local_pattern, stream_options());
  CHECK(epoch(local_braces, info) == local);
  CHECK_THROWS_WITH_AS(shards::ShardDataset("file://" + (*root).string() + "/my%2shards"),
                       doctest::Contains("is not followed by two hex digits"), InvalidArgument);
  // The position is the '%''s in the URL, with or without "localhost" (which it left out).
  for (const std::string host : {"", "localhost"}) {
    const std::string bad = "file://" + host + (*root).string() + "/my%zz";
    CHECK_THROWS_WITH_AS(shards::ShardDataset{bad},
                         doctest::Contains(("'%' at " + std::to_string(bad.find('%')) + " is not").c_str()),
                         InvalidArgument);
  }
  for (const char* bad : {"%00", "%2F", "%2f"}) {
    CHECK_THROWS_WITH_AS(shards::ShardDataset("file://" + (*root).string() + "/my" + bad + "shards"),
                         doctest::Contains((std::string(bad) + " at ").c_str()), InvalidArgument);
  }

  // shards.txt lists file names, which the folder URL's shards are named by, encoded.
  {
    const fs::path odd = *root / "odd names";
    if (!fs::exists(odd)) write_shards(odd, 0, {.shard_size = 60000, .prefix = "a b#%é-"});
    shards::ShardStream named(url("ok", "odd%20names/"), stream_options());
    CHECK(named.dataset().shards()[0].path == url("ok", "odd%20names/") + "a%20b%23%25%C3%A9-000000.tar");
    CHECK(epoch(named, info) == local);
  }

  // What coload-shard writes beside its shards (classes.txt), by path, pattern or URL.
  {
    std::ofstream(*root / "shards" / "classes.txt") << "cat\ndog\n";
  }
  for (const std::string& where :
       {(*root / "shards").string(), (*root / "shards" / "shard-000000.tar").string(),
        "file://" + (*root / "shards").string(), url("ok"), url("ok") + "?token=1",
        url("ok") + "shard-{000000..000002}.tar", url("ok") + "shard-000003.tar?t=2",
        (*root).string() + "/{shards,nothing}/shard-{000000..000002}.tar"}) {
    CAPTURE(where);
    CHECK(shards::read_beside_shards(where, "classes.txt") == "cat\ndog\n");
  }
  CHECK(shards::read_beside_shards(url("ok"), "absent.txt") == std::nullopt);
  CHECK(shards::read_beside_shards((*root / "shards").string(), "absent.txt") == std::nullopt);
  // An empty root is the working folder, not the file system's root.
  REQUIRE(fs::current_path() != "/");
  CHECK(shards::read_beside_shards("", "proc/version") == std::nullopt);
  CHECK_THROWS_WITH_AS((void)shards::read_beside_shards(url("ok"), "classes.txt", 4),
                       doctest::Contains("classes.txt"), io::HttpError);
  fs::remove(*root / "shards" / "classes.txt");
}

TEST_CASE("ranks x workers over URLs: every sample exactly once, as from the folder") {
  shards::ShardStream remote(url("ok"), stream_options(16 << 10));
  std::multiset<std::string> seen, local;
  for (int rank = 0; rank < 2; ++rank) {
    for (int id = 0; id < 2; ++id) {
      const WorkerInfo info{.id = id, .num_workers = 2, .seed = 9u + static_cast<unsigned>(id),
                            .rank = rank, .world_size = 2};
      const auto got = epoch(remote, info);
      CHECK(got == local_epoch(info));
      seen.insert(got.begin(), got.end());
    }
  }
  CHECK(seen.size() == static_cast<std::size_t>(total));
  CHECK(std::set<std::string>(seen.begin(), seen.end()).size() == static_cast<std::size_t>(total));
}

TEST_CASE("map-style by URL: each sample one ranged GET, the same bytes as the folder") {
  const shards::ShardDataset local(*root / "shards");
  const shards::ShardDataset remote(url("ok"));
  REQUIRE(remote.size() == local.size());
  for (Index i = 0; i < remote.size(); i += 7) {
    const auto a = local.read(i), b = remote.read(i);
    CHECK(b.key == a.key);
    CHECK(b.text("bin") == a.text("bin"));
    CHECK(b.text("id") == std::to_string(i));
  }
  CHECK(remote.read(-1).text("id") == std::to_string(total - 1));
}

TEST_CASE("map-style batches by URL: neighbours in a shard share one ranged GET") {
  const std::string mode = "ok,batch";
  const auto requests = [&] { return requests_made(mode); };
  const shards::ShardDataset remote(url(mode));
  const int after_index = requests();  // shards.txt and one .idx a shard
  CHECK(after_index == 1 + static_cast<int>(remote.shards().size()));
  const std::size_t last = remote.shards().size() - 1;
  const Index far = remote.offsets()[last];  // the last shard's first sample
  // Shard 0's samples 1 and 3..5 (5 twice) lie within 64 KiB of each other; the last shard's
  // first two are another run.
  const std::vector<Index> indices{5, 3, far + 1, 4, far, 5, 1};
  const auto got = remote.read_batch(indices, 64 << 10);
  REQUIRE(got.size() == indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    CHECK(got[k].text("id") == std::to_string(indices[k]));
    CHECK(got[k].text("bin") == payload(indices[k]));
  }
  CHECK(requests() - after_index == 2);  // {1, 3, 4, 5, 5} and {far, far + 1}
  // With no gap allowed (a sample's tar headers lie between it and the next), each sample
  // is a GET of its own; the repeated one shares its own.
  const int before = requests();
  remote.read_batch(indices, 0);
  CHECK(requests() - before == 6);
  // Any gap allowed (the largest): one GET a shard, not a wrapped sum that joined none.
  const int any = requests();
  CHECK(remote.read_batch(indices, ~std::uint64_t{0})[2].text("bin") == payload(far + 1));
  CHECK(requests() - any == 2);
}

namespace {
// get_async(i) run as the loader's inline driver runs it: this thread runs the io_context's
// handlers (the curl sockets' and timer's among them) until the sample is there.
shards::ShardSample get_on(asio::io_context& ctx, const shards::ShardDataset& ds, io::Reader& r,
                           Index i) {
  SampleContext sc;
  sc.index = i;
  sc.io = &r;
  ctx.restart();  // run_one() stops the io_context when it runs out of work
  return sync_wait_pumping(ds.get_async(i, sc), [&] { ctx.run_one(); });
}
}  // namespace

TEST_CASE("get_async by URL: the GETs run on the reader's io_context, with no thread of their own") {
  const shards::ShardDataset local(*root / "shards");
  int nonce = 0;
  // Faults too: a retry's backoff is a timer on the same io_context.
  for (const char* mode : {"ok", "reset1", "503x2", "short1,all", "lat30"}) {
    CAPTURE(mode);
    const shards::ShardDataset remote(url(std::string(mode) + ",a" + std::to_string(nonce++)));
    asio::io_context ctx;
    {
      io::Reader reader(ctx);
      const std::size_t before = threads_now();
      for (Index i : {Index{0}, Index{1}, Index{61}, Index{total - 1}}) {
        const auto s = get_on(ctx, remote, reader, i);
        CHECK(s.key == local.read(i).key);
        CHECK(s.text("bin") == payload(i));
        CHECK(s.text("id") == std::to_string(i));
      }
      CHECK(threads_now() == before);  // curl ran on this thread, between ctx's handlers
    }
  }
  // The blocking calls refuse to wait for the io_context they run on, naming why.
  asio::io_context ctx;
  std::string refused;
  asio::post(ctx, [&] {
    try {
      (void)io::HttpClient::on(ctx)->get(url("ok") + "shards.txt");
    } catch (const LogicError& e) {
      refused = e.what();
    }
  });
  ctx.run();
  CHECK(refused.find("HttpClient::get waits for the io_context it is called on") !=
        std::string::npos);
  // prefetch_async checks the group it is given before it looks up a sample: one of two
  // shards' samples, or a slot past the indices, is refused by name (no GET is made).
  const shards::ShardDataset remote(url("ok"));
  io::Reader reader(ctx);
  const std::vector<Index> indices{0, remote.offsets()[remote.shards().size() - 1]};
  CHECK_THROWS_WITH_AS(sync_wait(remote.prefetch_async(reader, indices, {0, 1}, 0)),
                       doctest::Contains("more than one shard"), InvalidArgument);
  CHECK_THROWS_WITH_AS(sync_wait(remote.prefetch_async(reader, indices, {0, 2}, 0)),
                       doctest::Contains("the group names slot 2 of 2 indices"), InvalidArgument);
}

TEST_CASE("a multi-range GET: a part shorter than its Content-Range says is not taken") {
  // Three samples of the first shard, one prefetch group, each case with and without its
  // fault; `kept` is which samples the cut answer still gives (the rest are fetched alone).
  struct Case {
    const char* fault;  // the proxy's token
    const char* tag;    // a nonce of the case's own (its request counts)
    std::vector<Index> indices;
    std::uint64_t gap;
    std::vector<bool> kept;
  };
  const Case cases[] = {
      // Samples 1, 3 and 5, not neighbours: one GET of three ranges, whose answer's first part
      // the proxy cuts 10 bytes short (the Content-Length stays true). Its count is then made
      // up of the delimiter and the next part's headers: the part is given back, and the
      // answer read no further.
      {"shortpart", "parts", {1, 3, 5}, 0, {false, false, false}},
      // The last part, samples 4 and 5 as one range (less than `gap` apart), cut 100 bytes
      // short inside sample 4: the body ends inside the part, the closing delimiter taken as
      // its bytes. Sample 4 would be whole but shifted: the part is given back; sample 0 (the
      // first part, its delimiter after it) stays.
      {"shortlast", "last", {0, 4, 5}, 2048, {true, false, false}},
  };
  for (const Case& c : cases) {
    for (const bool cut : {false, true}) {
      const std::string mode = std::string(cut ? c.fault : "ok") + "," + c.tag;
      CAPTURE(mode);
      const shards::ShardDataset remote(url(mode));
      asio::io_context ctx;
      io::Reader reader(ctx);
      const auto got = sync_wait_pumping(
          remote.prefetch_async(reader, c.indices, {0, 1, 2}, c.gap), [&] { ctx.run_one(); });
      REQUIRE(got.size() == 3);
      for (std::size_t k = 0; k < 3; ++k) {
        CAPTURE(k);
        CHECK(got[k].has_value() == (!cut || c.kept[k]));
        if (got[k]) CHECK(got[k]->text("bin") == payload(c.indices[k]));
      }
    }
  }
}

TEST_CASE("get_async by URL: a shard that fails for good is a named error; a 404 at once") {
  const shards::ShardDataset remote(url("always503,on000001"));
  asio::io_context ctx;
  io::Reader reader(ctx);
  const Index far = remote.offsets()[1];  // shard 1's first sample
  CHECK(get_on(ctx, remote, reader, 0).text("bin") == payload(0));
  try {
    (void)get_on(ctx, remote, reader, far);
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 503);
    CHECK(e.attempts() == io::RetryOptions{}.attempts);
    CHECK(e.url() == url("always503,on000001") + "shard-000001.tar");
  }
  CHECK(get_on(ctx, remote, reader, far - 1).text("bin") == payload(far - 1));  // the rest reads
}

TEST_CASE("the LRU cache: later epochs read from disk, within the byte bound, entries verified") {
  const std::string mode = "ok,cache";
  const auto requests = [&] { return requests_made(mode); };
  shards_test::TempDir cache;
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 1ull << 30;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  const auto local = local_epoch(info);
  shards::ShardStream remote(url(mode), o);
  const std::size_t n = remote.dataset().shards().size();
  const int before = requests();
  CHECK(epoch(remote, info) == local);
  CHECK(requests() - before == static_cast<int>(n));  // one GET a shard
  const auto entries = [&] {
    std::vector<std::uint64_t> sizes;
    for (const auto& e : fs::directory_iterator(cache.path)) sizes.push_back(e.file_size());
    return sizes;
  };
  CHECK(entries().size() == n);
  // The second epoch (another order) reads every shard from the cache: no request.
  const int cached = requests();
  CHECK(epoch(remote, WorkerInfo{.id = 0, .num_workers = 1, .seed = 22}) ==
        local_epoch(WorkerInfo{.id = 0, .num_workers = 1, .seed = 22}));
  CHECK(requests() == cached);
  // Map-style reads use it too.
  const shards::ShardDataset ds(url(mode), o.shards);
  const int indexed = requests();
  for (Index i = 0; i < total; i += 11) CHECK(ds.read(i).text("bin") == payload(i));
  // read_local: a cached sample as read() gives it; nothing for a sample only on its server,
  // and no request for it either (its caller fetches it without holding the thread).
  const auto got = ds.read_local(5);
  REQUIRE(got);
  CHECK(got->text("bin") == payload(5));
  CHECK(requests() == indexed);
  const shards::ShardDataset uncached(url(mode), stream_options().shards);
  const int before_local = requests();
  CHECK_FALSE(uncached.read_local(5));
  CHECK(requests() == before_local);
  // An entry of the wrong size (torn, or the shard changed) is not used: that shard is fetched
  // again, and the epoch is still the local one.
  const fs::path some = fs::directory_iterator(cache.path)->path();
  fs::resize_file(some, fs::file_size(some) - 100);
  const int torn = requests();
  CHECK(epoch(remote, info) == local);
  CHECK(requests() - torn == 1);
  // A bound of two shards' bytes: never more than that on disk, the latest entries kept. The
  // folder also holds the user's own files, which eviction leaves alone (it removed every
  // .tar file in the folder, oldest first), and the unfinished entry of a writer killed
  // mid-shard, which counted for nothing and stayed for ever: it goes.
  shards_test::TempDir small;
  o.shards.cache_dir = small.path.string();
  o.shards.cache_bytes = 2 * 60000;
  const std::string mine(300000, 'm');
  std::ofstream(small.path / "mine.tar", std::ios::binary) << mine;
  std::ofstream(small.path / "0123456789abcdef.tar", std::ios::binary) << mine;
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  REQUIRE(gone > 0);
  ::waitpid(gone, nullptr, 0);
  const fs::path stale = small.path / ("0123456789abcdef-shard-000000.tar.coload-part." +
                                       std::to_string(gone) + ".1");
  std::ofstream(stale, std::ios::binary) << std::string(50000, 's');
  // A writer is known alive by the lock it holds on its file, not by its pid: one named with
  // a living pid (ours) whose lock no one holds is as abandoned; one whose lock is held stays.
  const std::string own = std::to_string(::getpid());
  const fs::path unheld = small.path / ("0123456789abcdef-shard-000001.tar.coload-part." + own + ".1");
  const fs::path held = small.path / ("0123456789abcdef-shard-000002.tar.coload-part." + own + ".2");
  std::ofstream(unheld, std::ios::binary) << std::string(20000, 'u');
  std::ofstream(held, std::ios::binary) << std::string(10000, 'h');
  const int held_fd = ::open(held.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held_fd >= 0);
  REQUIRE(::flock(held_fd, LOCK_EX) == 0);
  shards::ShardStream bounded(url(mode), o);
  CHECK(epoch(bounded, info) == local);
  CHECK_FALSE(fs::exists(unheld));
  CHECK(fs::exists(held));
  ::close(held_fd);
  std::uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(small.path)) {
    const std::string name = e.path().filename().string();
    if (name != "mine.tar" && name != "0123456789abcdef.tar") bytes += e.file_size();
  }
  CHECK(bytes <= o.shards.cache_bytes);
  CHECK(bytes > 0);
  CHECK_FALSE(fs::exists(stale));
  for (const char* name : {"mine.tar", "0123456789abcdef.tar"}) {
    CAPTURE(name);
    std::ifstream in(small.path / name, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == mine);
  }
}

TEST_CASE("shard URLs with a long token in their query are cached: the entry's name leaves the query out") {
  // The name kept the URL's last part whole, query included: a token of 300 bytes made it
  // longer than a file name may be, and the cache refused every shard ("is not used").
  const std::string mode = "ok,longtoken";
  const auto requests = [&] { return requests_made(mode); };
  shards_test::TempDir cache;
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 1ull << 30;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  shards::ShardStream remote(url(mode) + "?token=" + std::string(300, 't'), o);
  const std::size_t n = remote.dataset().shards().size();
  CHECK(epoch(remote, info) == local_epoch(info));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(cache.path)) names.insert(e.path().filename());
  CHECK(names.size() == n);
  for (const auto& name : names) {
    CAPTURE(name);
    CHECK(name.size() == 17 + std::string("shard-000000.tar").size());
    CHECK(name.find('?') == std::string::npos);
  }
  // The second epoch reads every shard from disk.
  const int cached = requests();
  CHECK(epoch(remote, WorkerInfo{.id = 0, .num_workers = 1, .seed = 22}) ==
        local_epoch(WorkerInfo{.id = 0, .num_workers = 1, .seed = 22}));
  CHECK(requests() == cached);
}

TEST_CASE("the cache's bound holds while shards download: room is made as a fetch starts, the unfinished entry counted whole") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  const auto local = local_epoch(info);
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_bytes = 2 * 60000;  // two shards' bytes
  // The cache's files now: their bytes, and each unfinished one ("<entry>.coload-part.<pid>.<n>")
  // checked to have its entry's full size (its shard's bytes up to the last sample's end, and
  // the 16-byte trailer that records their checksum).
  struct Seen {
    std::uint64_t bytes = 0;
    std::size_t parts = 0, short_parts = 0;
  };
  const auto look = [](const fs::path& dir, const shards::ShardStream& stream) {
    Seen seen;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      seen.bytes += e.file_size();
      const auto part = name.find(".coload-part.");
      if (part == std::string::npos) continue;
      ++seen.parts;
      const std::string shard_name = name.substr(17, part - 17);  // after "<16 hex digits>-"
      for (const auto& shard : stream.dataset().shards()) {
        if (shard.path.ends_with("/" + shard_name) &&
            e.file_size() != shard.samples.back().end + 16) {
          ++seen.short_parts;
        }
      }
    }
    return seen;
  };
  // Looked at each time a sample comes: an epoch streams a shard while the next one's GET
  // runs, so two are downloading at a time, beside the entries committed so far.
  shards_test::TempDir cache;
  o.shards.cache_dir = cache.path.string();
  shards::ShardStream stream(url("ok,bound1"), o);
  std::vector<std::string> got;
  std::uint64_t most = 0;
  std::size_t parts = 0, short_parts = 0;
  for (int round = 0; round < 2; ++round) {
    got.clear();
    for (auto& s : stream.samples(info)) {
      got.push_back(s.key + '\0' + s.text("id") + '\0' + s.text("bin"));
      const Seen seen = look(cache.path, stream);
      most = std::max(most, seen.bytes);
      parts += seen.parts;
      short_parts += seen.short_parts;
    }
    CHECK(got == local);
  }
  CHECK(most <= o.shards.cache_bytes);
  CHECK(parts > 0);
  CHECK(short_parts == 0);
  const Seen after = look(cache.path, stream);
  CHECK(after.parts == 0);
  CHECK(after.bytes > 0);  // the last shards' entries are kept
  CHECK(after.bytes <= o.shards.cache_bytes);

  // Another writer's unfinished entry (its lock held) takes most of the bound: no shard has
  // room beside it, so none is cached (before, each was committed past the bound), and the
  // epoch is read from the server as it would be without a cache.
  shards_test::TempDir crowded;
  o.shards.cache_dir = crowded.path.string();
  const fs::path other =
      crowded.path / ("0123456789abcdef-other.tar.coload-part." + std::to_string(::getpid()) + ".1");
  std::ofstream(other, std::ios::binary) << std::string(100000, 'o');
  const int held = ::open(other.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  shards::ShardStream beside(url("ok,bound2"), o);
  CHECK(epoch(beside, info) == local);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(crowded.path)) {
    names.push_back(e.path().filename().string());
  }
  CHECK(names == std::vector<std::string>{other.filename().string()});
  // Its writer gone (the lock let go of), the part is taken for abandoned and removed, and
  // the next epoch caches shards again.
  ::close(held);
  CHECK(epoch(beside, info) == local);
  CHECK_FALSE(fs::exists(other));
  const Seen kept = look(crowded.path, beside);
  CHECK(kept.bytes > 0);
  CHECK(kept.bytes <= o.shards.cache_bytes);
}

TEST_CASE("a stale index evicts nothing: a cache entry's room is made once the server has confirmed the shard's size") {
  // Shards indexed, then written again shorter: every GET's answer disagrees with the index.
  // Before, each shard's entry made its room (the index's size) before the answer came, so
  // the cache's entries were evicted for shards that were then never kept.
  Warnings warned;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  const fs::path folder = *root / "stale";
  write_shards(folder);
  shards_test::TempDir cache;
  shards::ShardStreamOptions o = stream_options();
  o.skip_failed_shards = true;
  o.shards.retry = {.attempts = 2, .backoff = std::chrono::milliseconds(1)};
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 2 * 60000;  // two shards' bytes
  const auto entries = [&] {
    std::vector<std::pair<std::string, std::uintmax_t>> out;
    for (const auto& e : fs::directory_iterator(cache.path)) {
      out.emplace_back(e.path().filename().string(), e.file_size());
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  // The cache holds the last shards of a good epoch.
  shards::ShardStream good(url("ok,stale"), o);
  CHECK(epoch(good, info) == local_epoch(info));
  const auto kept = entries();
  REQUIRE(!kept.empty());
  // Streamed, and read map-style with the cache filler behind the reads.
  shards::ShardStream stream(url("ok,stale", "stale/"), o);
  const shards::ShardDataset ds(url("ok,stale", "stale/"), o.shards);
  const std::size_t n = stream.dataset().shards().size();
  for (const auto& shard : stream.dataset().shards()) {
    const fs::path file = folder / fs::path(shard.path).filename();
    fs::resize_file(file, fs::file_size(file) / 2);
  }
  for (Index i = 0; i < total; i += 10) CHECK_THROWS_AS((void)ds.read(i), io::HttpError);
  ds.cache_wait();
  CHECK(entries() == kept);
  CHECK(epoch(stream, info).empty());
  CHECK(stream.skipped_samples() == static_cast<std::int64_t>(total));
  CHECK(entries() == kept);
  CHECK(warned.messages().size() >= n);
}

TEST_CASE("a ShardStream's cached copy that fails mid-shard: the shard is read on from its URL, nothing lost") {
  Warnings warned;
  // One shard of all the samples (about 550 KB), read in 64 KiB chunks: the copy is cut while
  // the stream is inside it.
  const fs::path dir = *root / "one";
  if (!fs::exists(dir / "shard-000000.tar")) write_shards(dir, 0, {.shard_size = 1 << 20});
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 5};
  shards::ShardStreamOptions o = stream_options();
  o.read_size = 64 << 10;
  shards::ShardStream local(dir, o);
  const auto expected = epoch(local, info);
  REQUIRE(expected.size() == static_cast<std::size_t>(total));
  shards_test::TempDir cache;
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 1ull << 30;
  const std::string mode = "ok,cachefails";
  shards::ShardStream remote(url(mode, "one/"), o);
  CHECK(epoch(remote, info) == expected);  // fills the cache
  REQUIRE(std::distance(fs::directory_iterator(cache.path), fs::directory_iterator{}) == 1);
  const fs::path entry = fs::directory_iterator(cache.path)->path();
  REQUIRE(fs::file_size(entry) > 400000);
  // The next epoch reads the copy; after its first sample the copy is cut to 100 KB (as a
  // disk's fault, or another process, might leave it). The rest comes from the server, with
  // one GET from the sample that failed, and a warning naming the copy and the URL.
  const int before = requests_made(mode);
  std::vector<std::string> got;
  for (auto& x : remote.samples(info)) {
    got.push_back(x.key + '\0' + x.text("id") + '\0' + x.text("bin"));
    if (got.size() == 1) fs::resize_file(entry, 100000);
  }
  CHECK(got == expected);
  CHECK(requests_made(mode) - before == 1);
  REQUIRE(warned.messages().size() == 1);
  CHECK(warned.messages()[0].find("the cached copy '" + entry.string() + "' of shard '" +
                         url(mode, "one/") + "shard-000000.tar' failed (") != std::string::npos);
  CHECK(warned.messages()[0].find("the shard ends inside the sample") != std::string::npos);
  CHECK(warned.messages()[0].find("): the shard is read from its URL from byte ") != std::string::npos);
  CHECK_FALSE(fs::exists(entry));  // given up: removed from the cache
  // The copy of the wrong size is not used again: the next epoch fetches the shard whole,
  // and caches it anew.
  warned.clear();
  CHECK(epoch(remote, info) == expected);
  CHECK(requests_made(mode) - before == 2);
  CHECK(warned.messages().empty());
  CHECK(fs::file_size(entry) > 400000);
}

TEST_CASE("map-style reads fill the cache behind them: a later epoch reads from disk") {
  const std::string mode = "ok,fill";
  const auto requests = [&] { return requests_made(mode); };
  const auto files = [](const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  shards_test::TempDir cache;
  shards::ShardOptions o;
  o.cache_dir = cache.path.string();
  o.cache_bytes = 1ull << 30;
  const shards::ShardDataset ds(url(mode), o);
  const std::size_t n = ds.shards().size();
  const int indexed = requests();
  // The first epoch's samples by ranged GETs (sync, and on a loader's io_context), each shard
  // also fetched whole, once, behind them.
  asio::io_context ctx;
  io::Reader reader(ctx);
  for (Index i = 0; i < total; i += 2) CHECK(ds.read(i).text("bin") == payload(i));
  for (Index i = 1; i < total; i += 2) CHECK(get_on(ctx, ds, reader, i).text("bin") == payload(i));
  ds.cache_wait();
  CHECK(ds.cache_wait_for(std::chrono::milliseconds(0)));
  CHECK(requests() - indexed <= static_cast<int>(total + n));
  const auto entries = files(cache.path);
  CHECK(entries.size() == n);
  for (const auto& name : entries) CHECK(name.find(".coload-part") == std::string::npos);
  // The next epoch: every sample from disk, no request.
  const int filled = requests();
  for (Index i = 0; i < total; ++i) CHECK(ds.read(i).text("bin") == payload(i));
  for (Index i = 0; i < total; i += 7) CHECK(get_on(ctx, ds, reader, i).text("bin") == payload(i));
  const std::vector<Index> batch{3, total - 1, 4, 5};
  CHECK(ds.remote_groups(batch).empty());  // cached: no multi-range GET
  const auto from_disk = ds.read_batch(batch);
  for (std::size_t k = 0; k < batch.size(); ++k) {
    CHECK(from_disk[k].text("bin") == payload(batch[k]));
  }
  CHECK(requests() == filled);
  // read_batch fills it too: the shards of a batch are fetched whole behind it.
  {
    shards_test::TempDir other;
    auto fill = o;
    fill.cache_dir = other.path.string();
    const shards::ShardDataset batched(url(mode), fill);
    const auto got = batched.read_batch(batch);
    for (std::size_t k = 0; k < batch.size(); ++k) CHECK(got[k].text("bin") == payload(batch[k]));
    batched.cache_wait();
    CHECK(files(other.path).size() == 2);  // shard 0 and the last
  }
  // A bound the dataset's shards do not fit: map-style reads fill nothing (each epoch would
  // fetch shards twice, only to evict them).
  shards_test::TempDir small;
  o.cache_dir = small.path.string();
  o.cache_bytes = 60000;
  const shards::ShardDataset unfilled(url(mode), o);
  for (Index i = 0; i < total; i += 5) CHECK(unfilled.read(i).text("bin") == payload(i));
  unfilled.cache_wait();
  CHECK(unfilled.cache_wait_for(std::chrono::milliseconds(0)));  // it has nothing to fill
  CHECK(files(small.path).empty());
  // A dataset let go of while a shard is fetched over a slow link (50 KiB/s): the fetch is
  // cancelled (the destructor does not wait out the link), and leaves no part file.
  shards_test::TempDir slow;
  o.cache_dir = slow.path.string();
  o.cache_bytes = 1ull << 30;
  {
    const shards::ShardDataset ds_slow(url("bw50,slowfill"), o);
    CHECK(ds_slow.read(0).text("bin") == payload(0));
    // Its shard (60 KB at 50 KiB/s) is not in within these bounds.
    CHECK_FALSE(ds_slow.cache_wait_for(std::chrono::milliseconds(0)));
    CHECK_FALSE(ds_slow.cache_wait_for(std::chrono::milliseconds(20)));
  }
  for (const auto& name : files(slow.path)) CHECK(name.find(".coload-part") == std::string::npos);
  // A forked child that lets go of the last copy of a dataset whose fetch thread waits for
  // work (the parent's thread, not in the child) does not wait for it: glibc's condition
  // variable would, for ever.
  shards_test::TempDir fresh;
  o.cache_dir = fresh.path.string();
  auto owned = std::make_unique<shards::ShardDataset>(url(mode), o);
  CHECK(owned->read(0).text("bin") == payload(0));
  owned->cache_wait();
  CHECK(in_forked_child([&] {
    // A process worker's reads: still read, by ranged GET, but not fetched whole (the thread
    // is the parent's), and a warning says so once. (Not under TSan, which cannot start the
    // HTTP client's thread in a child forked from a threaded process.)
    int warned = 1;
    bool read = true;
#if !defined(__SANITIZE_THREAD__)
    warned = 0;
    set_warning_handler([&](const std::string& w) {
      warned += w.find("is not filled behind reads in worker processes") != std::string::npos
                    ? 1 : 100;
    });
    read = owned->read(total - 1).text("bin") == payload(total - 1) &&
           owned->read(total - 2).text("bin") == payload(total - 2);
#endif
    owned.reset();
    return !read ? 2 : warned != 1 ? 3 : 0;
  }) == 0);
  CHECK(files(fresh.path).size() == 1);  // shard 0, fetched whole by the parent; none by the child
}

TEST_CASE("cache_fill queues every shard: one GET a shard, then every read from disk; a forked child's reads warn of nothing") {
  const std::string mode = "ok,fillall";
  const auto requests = [&] { return requests_made(mode); };
  shards_test::TempDir cache;
  shards::ShardOptions o;
  o.cache_dir = cache.path.string();
  o.cache_bytes = 1ull << 30;
  const shards::ShardDataset ds(url(mode), o);
  const int n = static_cast<int>(ds.shards().size());
  const int before = requests();
  ds.cache_fill();
  ds.cache_wait();
  CHECK(requests() - before == n);  // one GET a shard, no sample read
  CHECK(std::distance(fs::directory_iterator(cache.path), fs::directory_iterator{}) == n);
  const int filled = requests();
  for (Index i = 0; i < total; ++i) CHECK(ds.read(i).text("bin") == payload(i));
  ds.cache_fill();  // asked before: nothing fetched again
  ds.cache_wait();
  CHECK(requests() == filled);
  // A bound the shards do not fit: no filler, so nothing queued, nothing fetched.
  shards_test::TempDir small;
  o.cache_dir = small.path.string();
  o.cache_bytes = 60000;
  const shards::ShardDataset unfilled(url(mode), o);
  const int indexed = requests();  // its shard list and indices
  unfilled.cache_fill();
  CHECK(unfilled.cache_wait_for(std::chrono::milliseconds(0)));
  CHECK(fs::is_empty(small.path));
  CHECK(requests() == indexed);
  // Worker processes: the parent queues every shard before forking (a slow link, so the fill
  // is still going when the child reads by URL); the child's reads fill nothing, and say
  // nothing of it. (Not under TSan, which cannot start the HTTP client's thread in a child of
  // a threaded process.)
  shards_test::TempDir forked;
  o.cache_dir = forked.path.string();
  o.cache_bytes = 1ull << 30;
  auto slow = std::make_unique<shards::ShardDataset>(url("bw50,fillfork"), o);
  slow->cache_fill();
  CHECK(in_forked_child([&] {
    int warned = 0;
    bool read = true;
#if !defined(__SANITIZE_THREAD__)
    set_warning_handler([&](const std::string&) { ++warned; });
    read = slow->read(total - 1).text("bin") == payload(total - 1);
#endif
    slow.reset();
    return !read ? 2 : warned != 0 ? 3 : 0;
  }) == 0);
  slow.reset();  // cancels the fills in flight
}

TEST_CASE("two datasets on a cache folder too small for both: the filler evicts no entry used since its dataset was made") {
  // Train and validation sets (here the same shards under two URLs) sharing one folder that
  // holds either but not both. Before, the second one's filler evicted the first's entries:
  // the first's whole fetches were wasted, and its reads went by ranged GETs from then on.
  const std::string ma = "ok,pair-a", mb = "ok,pair-b";
  shards_test::TempDir cache;
  shards::ShardOptions o;
  o.cache_dir = cache.path.string();
  const shards::ShardDataset probe(url(ma));
  std::uint64_t one = 0;
  for (const auto& shard : probe.shards()) one += shard.samples.back().end;
  o.cache_bytes = one + one / 4;
  const shards::ShardDataset a(url(ma), o), b(url(mb), o);
  const std::size_t n = a.shards().size();
  const auto read_all = [&](const shards::ShardDataset& ds) {
    for (Index i = 0; i < total; ++i) CHECK(ds.read(i).text("bin") == payload(i));
    ds.cache_wait();
  };
  const auto count = [&](const shards::ShardDataset& ds, const std::string& mode) {
    const int before = requests_made(mode);
    read_all(ds);
    return requests_made(mode) - before;
  };
  const auto entries = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(cache.path)) {
      names.insert(e.path().filename().string());
      CHECK(e.path().filename().string().find(".coload-") == std::string::npos);
    }
    return names;
  };
  // a's first epoch fills the folder with its shards; b's fills only the room left beside
  // them (a quarter of a's bytes), evicting none of a's, which a read after b was made.
  read_all(a);
  const auto of_a = entries();
  CHECK(of_a.size() == n);
  read_all(b);
  const auto both = entries();
  CHECK(std::includes(both.begin(), both.end(), of_a.begin(), of_a.end()));
  CHECK(both.size() > n);  // some of b's fit beside them
  CHECK(both.size() < 2 * n);
  // Later epochs: a from disk; b from disk where it was cached, else by its samples' GETs,
  // as many each epoch (nothing fetched whole again); the folder as it was.
  const int b_reads = count(b, mb);
  CHECK(b_reads > 0);
  CHECK(b_reads < static_cast<int>(total));
  for (int epoch = 0; epoch < 2; ++epoch) {
    CHECK(count(a, ma) == 0);
    CHECK(count(b, mb) == b_reads);
    CHECK(entries() == both);
  }
  // A dataset made long after a and b last used their entries (their atimes set back a
  // minute, as if) may evict them: all its shards are cached, least recently used first, and
  // its next epoch reads from disk.
  for (const auto& name : entries()) {
    struct timespec back {};
    ::clock_gettime(CLOCK_REALTIME, &back);
    back.tv_sec -= 60;
    const struct timespec times[2] = {back, {0, UTIME_OMIT}};
    REQUIRE(::utimensat(AT_FDCWD, (cache.path / name).c_str(), times, 0) == 0);
  }
  const std::string mc = "ok,pair-c";
  const shards::ShardDataset c(url(mc), o);
  read_all(c);
  CHECK(count(c, mc) == 0);
  const auto after = entries();
  std::uint64_t bytes = 0;
  for (const auto& name : after) bytes += fs::file_size(cache.path / name);
  CHECK(bytes <= o.cache_bytes);
}

TEST_CASE("the cache filler: a failed fetch is asked again by a later read, three fetches at most") {
  // "whole": the 503s go to the filler's GETs of whole shards only; the samples' ranged GETs
  // pass. One attempt a fetch, so each 503 fails one.
  const auto entries = [](const fs::path& dir) {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      CHECK(e.path().filename().string().find(".coload-part") == std::string::npos);
      ++n;
    }
    return n;
  };
  shards::ShardOptions o;
  o.cache_bytes = 1ull << 30;
  o.retry = {.attempts = 1};
  // Two failed fetches, then the third (the third read's) keeps the shard.
  {
    shards_test::TempDir cache;
    o.cache_dir = cache.path.string();
    const shards::ShardDataset ds(url("503x2,whole,refill"), o);
    REQUIRE(ds.shards()[0].samples.size() >= 4);
    for (Index i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(ds.read(i).text("bin") == payload(i));
      ds.cache_wait();
      CHECK(entries(cache.path) == (i < 2 ? 0u : 1u));
    }
    CHECK(ds.read(3).text("bin") == payload(3));  // from the entry
  }
  // Failing for good: three fetches, then reads alone (one request each).
  {
    shards_test::TempDir cache;
    o.cache_dir = cache.path.string();
    const std::string mode = "503x99,whole,giveup";
    const shards::ShardDataset ds(url(mode), o);
    std::vector<int> made;
    for (Index i = 0; i < 4; ++i) {
      const int before = requests_made(mode);
      CHECK(ds.read(i).text("bin") == payload(i));
      ds.cache_wait();
      made.push_back(requests_made(mode) - before);
    }
    // The first read also asks the shard's size (a request of its own, or not, by sample).
    CHECK(made[1] == 2);  // its sample, and the second fetch
    CHECK(made[2] == 2);
    CHECK(made[3] == 1);  // its sample alone: no fourth fetch
    CHECK(entries(cache.path) == 0u);
  }
}

TEST_CASE("the cache filler fetches again a copy found bad, and one whose commit the folder's lock stopped") {
  Warnings warned{true};
  // The cache's files, parts apart.
  const auto entries = [](const fs::path& dir) {
    std::vector<fs::path> kept;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().find(".coload-") == std::string::npos) {
        kept.push_back(e.path());
      }
    }
    return kept;
  };
  shards::ShardOptions o;
  o.cache_bytes = 1ull << 30;
  // A copy cut short on disk since it was kept: the read that finds it removes it and reads
  // by URL, and the filler fetches the shard again (it had been asked for once, and stayed
  // uncached for the dataset's life).
  {
    shards_test::TempDir cache;
    o.cache_dir = cache.path.string();
    const std::string mode = "ok,badcopy";
    const shards::ShardDataset ds(url(mode), o);
    CHECK(ds.read(0).text("bin") == payload(0));
    ds.cache_wait();
    auto kept = entries(cache.path);
    REQUIRE(kept.size() == 1);
    const auto size = fs::file_size(kept[0]);
    fs::resize_file(kept[0], size - 1);
    CHECK(ds.read(1).text("bin") == payload(1));
    ds.cache_wait();
    kept = entries(cache.path);
    REQUIRE(kept.size() == 1);
    CHECK(fs::file_size(kept[0]) == size);
    const int before = requests_made(mode);
    CHECK(ds.read(2).text("bin") == payload(2));  // from the new copy
    CHECK(requests_made(mode) == before);
  }
  // The folder's lock held by another process from after the fetch began until past its end
  // (60 KB at 50 KiB/s): the commit gives up (said once), and a later read asks again.
  {
    shards_test::TempDir cache;
    o.cache_dir = cache.path.string();
    const shards::ShardDataset ds(url("bw50,commitlock"), o);
    CHECK(ds.read(0).text("bin") == payload(0));
    // A part with its full size has had its room made (under the folder's lock, which the
    // flock below then waits for): what the lock stops now is the commit.
    const auto part = [&] {
      for (const auto& e : fs::directory_iterator(cache.path)) {
        std::error_code ec;  // a part renamed meanwhile has no size
        const auto size = e.file_size(ec);
        if (e.path().filename().string().find(".coload-part") != std::string::npos && !ec &&
            size > 0) {
          return true;
        }
      }
      return false;
    };
    for (int i = 0; i < 500 && !part(); ++i) ds.cache_wait_for(std::chrono::milliseconds(10));
    REQUIRE(part());
    const int lock_fd = ::open(cache.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(lock_fd >= 0);
    REQUIRE(::flock(lock_fd, LOCK_EX) == 0);
    ds.cache_wait();
    CHECK(entries(cache.path).empty());
    CHECK_FALSE(part());
    ::close(lock_fd);
    REQUIRE(warned.messages().size() == 1);
    CHECK(warned.messages()[0].find("stayed locked by another process") != std::string::npos);
    CHECK(ds.read(1).text("bin") == payload(1));
    ds.cache_wait();
    const auto kept = entries(cache.path);
    REQUIRE(kept.size() == 1);
    CHECK(kept[0].filename().string().ends_with("-shard-000000.tar"));
  }
}

TEST_CASE("one writer a cache entry: a second dataset on the folder does not fetch a shard the first is fetching") {
  // Ranks on one node share a cache folder and each read every shard: each fills behind its
  // reads, and without a lock an entry would be fetched whole once a rank.
  const std::string mode = "bw50,writer1";
  const auto requests = [&] { return requests_made(mode); };
  shards_test::TempDir cache;
  shards::ShardOptions o;
  o.cache_dir = cache.path.string();
  o.cache_bytes = 1ull << 30;
  // What a read of sample 0 asks, uncached.
  const shards::ShardDataset plain(url(mode));
  int before = requests();
  CHECK(plain.read(0).text("bin") == payload(0));
  const int read = requests() - before;
  // Two datasets (as two ranks) read it, each with a filler: the shard's whole GET (60 KB at
  // 50 KiB/s, over a second) is made once; the other's filler finds its fetch lock held.
  const shards::ShardDataset first(url(mode), o), second(url(mode), o);
  before = requests();
  CHECK(first.read(0).text("bin") == payload(0));
  CHECK(second.read(0).text("bin") == payload(0));
  first.cache_wait();
  second.cache_wait();
  CHECK(requests() - before == 2 * read + 1);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(cache.path)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() == 1);  // its writer removed its lock file (.coload-fetch-<entry>)
  CHECK(names[0].ends_with("-shard-000000.tar"));
  // Both read it from disk now.
  before = requests();
  CHECK(first.read(1).text("bin") == payload(1));
  CHECK(second.read(2).text("bin") == payload(2));
  CHECK(requests() == before);

  // A writer that gives up (its dataset let go of mid-fetch): the other, which found the
  // entry's lock held, still wants the shard, and fetches it once the lock is free.
  shards_test::TempDir again;
  o.cache_dir = again.path.string();
  const std::string mode2 = "bw50,writer2";
  auto holder = std::make_unique<shards::ShardDataset>(url(mode2), o);
  const shards::ShardDataset waiter(url(mode2), o);
  CHECK(holder->read(0).text("bin") == payload(0));
  // The holder's filler has the lock once its file is there (it is made to be locked).
  const auto locked = [&] {
    for (const auto& e : fs::directory_iterator(again.path)) {
      if (e.path().filename().string().starts_with(".coload-fetch-")) return true;
    }
    return false;
  };
  for (int i = 0; i < 500 && !locked(); ++i) holder->cache_wait_for(std::chrono::milliseconds(10));
  REQUIRE(locked());
  CHECK(waiter.read(0).text("bin") == payload(0));
  CHECK_FALSE(waiter.cache_wait_for(std::chrono::milliseconds(0)));  // it waits for the shard
  holder.reset();  // cancels its fetch, and lets go of the lock
  waiter.cache_wait();
  std::size_t kept = 0;
  for (const auto& e : fs::directory_iterator(again.path)) {
    CHECK(e.path().filename().string().ends_with("-shard-000000.tar"));
    ++kept;
  }
  CHECK(kept == 1);
}

TEST_CASE("a cache that cannot keep shards says so once; a folder locked by a stopped process stops no transfer") {
  Warnings warned{true};
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  const auto local = local_epoch(info);
  shards_test::TempDir tmp;
  const fs::path file = tmp.path / "a-file";
  std::ofstream(file) << "x";
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_bytes = 1ull << 30;
  // A file for a folder: refused when the dataset is made.
  o.shards.cache_dir = file.string();
  CHECK_THROWS_WITH_AS(shards::ShardStream(url("ok,c1"), o),
                       ("ShardOptions::cache_dir '" + file.string() + "' is not a folder").c_str(),
                       InvalidArgument);
  // A folder that cannot be made: the epoch from the server, and one warning naming it.
  o.shards.cache_dir = (file / "sub").string();
  shards::ShardStream unmade(url("ok,c2"), o);
  CHECK(epoch(unmade, info) == local);
  CHECK(epoch(unmade, info) == local);
  REQUIRE(warned.messages().size() == 1);
  CHECK(warned.messages()[0].find("the shard cache '" + (file / "sub").string() +
                         "' is not used: cannot create the folder: Not a directory") !=
        std::string::npos);
  // The folder's lock held throughout (as by a process stopped while it committed): each
  // commit gives up after a while rather than wait, and says so once; nothing is cached.
  warned.clear();
  const fs::path dir = tmp.path / "cache";
  fs::create_directories(dir);
  const int lock_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(lock_fd >= 0);
  REQUIRE(::flock(lock_fd, LOCK_EX) == 0);
  o.shards.cache_dir = dir.string();
  shards::ShardStream locked(url("ok,c3"), o);
  CHECK(epoch(locked, info) == local);
  REQUIRE(warned.messages().size() == 1);
  CHECK(warned.messages()[0].find("the shard cache '" + dir.string() +
                         "' stayed locked by another process") != std::string::npos);
  CHECK(fs::is_empty(dir));
  ::close(lock_fd);
  CHECK(epoch(locked, info) == local);  // unlocked: now kept
  CHECK(static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), {})) ==
        locked.dataset().shards().size());
}

TEST_CASE("an index that claims a sample of a TiB is answered by the server's size: a named "
          "HttpError, never a buffer of what the index claims") {
  // A real shard of about 60 kB beside an index that says it is 1 TiB, its one sample nearly
  // all of it. The index parses (it agrees with itself); only the server knows better.
  const fs::path dir = *root / "liar";
  fs::create_directories(dir);
  fs::copy_file(*root / "shards" / "shard-000000.tar", dir / "liar.tar",
                fs::copy_options::overwrite_existing);
  shards::ShardIndex lie;
  lie.file_size = std::uint64_t{1} << 40;
  lie.mtime_ns = 1;
  lie.samples.push_back({"s0", 0, 1, 512, lie.file_size - 1024});
  lie.members.push_back({"bin", 512, lie.file_size - 1536});
  std::ofstream(dir / "liar.tar.idx", std::ios::binary) << shards::format_index(lie);
  const std::string shard = "http://127.0.0.1:" + std::to_string(server->nginx) + "/liar/liar.tar";
  const auto names_the_lie = [&](const std::string& what) {
    INFO(what);
    CHECK(what.find(shard) != std::string::npos);
    CHECK(what.find("the server has " + std::to_string(fs::file_size(dir / "liar.tar")) +
                    " bytes, the index was made of 1099511627776") != std::string::npos);
  };
  const shards::ShardDataset ds(shard);
  REQUIRE(ds.size() == 1);
  try {
    (void)ds.read(0);
    FAIL("read a sample of 1 TiB");
  } catch (const io::HttpError& e) {
    names_the_lie(e.what());
  }
  shards::ShardStream stream(shard, stream_options());
  try {
    for (auto& s : stream.samples(WorkerInfo{.id = 0, .num_workers = 1, .seed = 1})) (void)s;
    FAIL("streamed a sample of 1 TiB");
  } catch (const io::HttpError& e) {
    names_the_lie(e.what());
  }
  // Two such samples as one multi-range group (a loader's batch): the group gives both up,
  // as it gives up any fault, and each sample's own read names the lie (with on_error = skip,
  // the batch's other samples are not lost with them).
  lie.samples = {{"s0", 0, 1, 512, lie.file_size / 2}, {"s1", 1, 1, lie.file_size / 2 + 512, lie.file_size - 1024}};
  lie.members = {{"bin", 512, lie.file_size / 2 - 512}, {"bin", lie.file_size / 2 + 512, lie.file_size / 2 - 1536}};
  fs::copy_file(*root / "shards" / "shard-000000.tar", dir / "two.tar",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "two.tar.idx", std::ios::binary) << shards::format_index(lie);
  const std::string two = "http://127.0.0.1:" + std::to_string(server->nginx) + "/liar/two.tar";
  const shards::ShardDataset pair(two);
  REQUIRE(pair.size() == 2);
  const std::vector<Index> both{0, 1};
  const auto groups = pair.remote_groups(both);
  REQUIRE(groups.size() == 1);
  asio::io_context ctx;
  io::Reader reader(ctx);
  ctx.restart();
  const auto got = sync_wait_pumping(pair.prefetch_async(reader, both, groups[0]),
                                     [&] { ctx.run_one(); });
  CHECK(got.size() == 2);
  CHECK_FALSE(got[0].has_value());
  CHECK_FALSE(got[1].has_value());
  try {
    (void)get_on(ctx, pair, reader, 1);
    FAIL("read a sample of half a TiB");
  } catch (const io::HttpError& e) {
    CHECK(std::string(e.what()).find(two) != std::string::npos);
  }
}

TEST_CASE("a cache entry is for one version of its shard: one rewritten to the same size is fetched again") {
  const std::string mode = "ok,version";
  const auto requests = [&] { return requests_made(mode); };
  const fs::path folder = *root / "versioned";
  write_shards(folder);
  shards_test::TempDir cache;
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 1ull << 30;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 21};
  const auto bins = [&](shards::ShardStream& stream, int version) {
    std::size_t good = 0;
    for (auto& s : stream.samples(info)) {
      good += s.text("bin") == payload(std::stoll(s.text("id")), version);
    }
    return good;
  };
  std::vector<std::uintmax_t> sizes;
  {
    shards::ShardStream first(url(mode, "versioned/"), o);
    CHECK(bins(first, 0) == static_cast<std::size_t>(total));
    for (const auto& s : first.dataset().shards()) sizes.push_back(fs::file_size(folder / fs::path(s.path).filename()));
  }
  // The shards are written again, every byte changed but none of their sizes.
  fs::remove_all(folder);
  write_shards(folder, 1);
  shards::ShardStream second(url(mode, "versioned/"), o);
  std::vector<std::uintmax_t> now;
  for (const auto& s : second.dataset().shards()) now.push_back(fs::file_size(folder / fs::path(s.path).filename()));
  REQUIRE(now == sizes);
  const int before = requests();
  CHECK(bins(second, 1) == static_cast<std::size_t>(total));  // not one stale sample
  CHECK(requests() - before == static_cast<int>(now.size()));  // each shard fetched again
  // And the new entries serve the next epoch.
  const int cached = requests();
  CHECK(bins(second, 1) == static_cast<std::size_t>(total));
  CHECK(requests() == cached);
}

TEST_CASE("exact resume by URL: a state taken mid-shard continues with nothing lost or repeated") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 3};
  const auto whole = local_epoch(info);
  shards::ShardStream first(url("ok"), stream_options());
  std::vector<std::string> got;
  std::string state;
  for (auto& s : first.samples(info)) {
    got.push_back(s.key + '\0' + s.text("id") + '\0' + s.text("bin"));
    if (got.size() == 50) {
      state = first.state();
      break;
    }
  }
  shards::ShardStream second(url("ok"), stream_options());
  second.load_state(state);
  // A stream of another epoch refuses the state, and keeps it for the stream it is of.
  CHECK_THROWS_WITH_AS(epoch(second, WorkerInfo{.id = 0, .num_workers = 1, .seed = 4}),
                       doctest::Contains("in another epoch or split"), InvalidArgument);
  const auto rest = epoch(second, info);
  auto all = got;
  all.insert(all.end(), rest.begin(), rest.end());
  CHECK(all == whole);
  // The state names the shards by name, size and samples: the same shards read from their
  // folder resume it alike.
  shards::ShardStream from_folder(*root / "shards", stream_options());
  from_folder.load_state(state);
  CHECK(epoch(from_folder, info) == rest);

  // The state's shuffle buffer holds samples of a shard that now fails for good: with
  // skip_failed_shards they are counted as skipped with the rest of that shard, and every
  // other sample comes once.
  std::istringstream fields(state);
  std::string word;
  for (int k = 0; k < 11; ++k) fields >> word;  // "shard-stream 2", the shards, 7 numbers, g
  const Index buffered = std::stoll(word);
  const auto& failing = second.dataset().shards()[second.dataset().locate(buffered).shard];
  const std::string name = fs::path(failing.path).stem().string();  // shard-00000k
  auto o = stream_options();
  o.skip_failed_shards = true;
  o.shards.retry = {.attempts = 2, .backoff = std::chrono::milliseconds(1)};
  shards::ShardStream third(url("always503,on" + name), o);
  third.load_state(state);
  std::set<std::string> seen(got.begin(), got.end());
  for (const auto& x : epoch(third, info)) CHECK(seen.insert(x).second);
  const Index from = third.dataset().offsets()[second.dataset().locate(buffered).shard];
  std::int64_t lost = 0;
  for (const auto& x : whole) {
    const Index id = std::stoll(x.substr(x.find('\0') + 1));
    const bool of_failing = id >= from && id < from + static_cast<Index>(failing.samples.size());
    if (!seen.count(x)) {
      CHECK(of_failing);
      ++lost;
    }
  }
  CHECK(lost > 0);
  CHECK(third.skipped_samples() == lost);
}

TEST_CASE("two streams of one ShardStream at once: each its own position") {
  // Two loops over one replica, interleaved (or an abandoned epoch's stream still running
  // beside the next): neither moves the other, and state() is the later one's.
  const WorkerInfo a{.id = 0, .num_workers = 1, .seed = 5}, b{.id = 0, .num_workers = 1, .seed = 6};
  shards::ShardStream remote(url("ok"), stream_options());
  auto one = remote.samples(a);
  auto two = remote.samples(b);
  std::vector<std::string> got_a, got_b;
  auto it_a = one.begin(), it_b = two.begin();
  while (it_a != one.end() || it_b != two.end()) {
    if (it_a != one.end()) got_a.push_back((*it_a).key), ++it_a;
    if (it_b != two.end()) got_b.push_back((*it_b).key), ++it_b;
  }
  const auto keys = [](const WorkerInfo& info) {
    std::vector<std::string> out;
    for (const auto& x : local_epoch(info)) out.push_back(x.substr(0, x.find('\0')));
    return out;
  };
  CHECK(got_a == keys(a));
  CHECK(got_b == keys(b));
  std::istringstream state(remote.state());
  std::string magic, version, shards, seed;
  state >> magic >> version >> shards >> seed;
  CHECK(magic + ' ' + version == "shard-stream 2");
  CHECK(seed == std::to_string(b.seed));
}

TEST_CASE("faults are retried from the byte reached: each gives the local epoch exactly") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const auto local = local_epoch(info);
  // Each mode names a fault the proxy puts on the first requests of every shard; "all" puts
  // it on the index files too. The last token is a nonce: each case counts requests afresh.
  const char* modes[] = {"lat30",       "reset1",       "reset3,all",  "503x2",
                         "503x1,all",   "short1",       "short2,all",  "lie1",
                         "lielong1",    "lie1,reset1",  "bw4000",      "s3timeout2",
                         "503x2,bigbody"};
  int nonce = 0;
  // Over HTTPS too: a TLS stream cut short or reset fails as curl's TLS layer says it.
  const ScopedEnv ca("CURL_CA_BUNDLE", COLOAD_TLS_CERT);
  for (const bool tls : {false, true}) {
    for (const char* mode : modes) {
      CAPTURE(tls);
      CAPTURE(mode);
      const std::string m = std::string(mode) + ",n" + std::to_string(nonce++);
      const auto at = [&](const std::string& mode) { return tls ? tls_url(mode) : url(mode); };
      shards::ShardStream remote(at(m), stream_options(16 << 10));
      CHECK(epoch(remote, info) == local);
      // Map-style reads through the same faults.
      const shards::ShardDataset ds(at(m + "m"));
      for (Index i : {Index{0}, Index{61}, Index{total - 1}}) {
        CHECK(ds.read(i).text("bin") == payload(i));
      }
    }
  }
  // A body read to its end (an index) is reset, and its resumed 206 then ends early, as its
  // Content-Length said: the Content-Range's whole size says it is not all, so it is resumed
  // again, and none of it lost.
  const fs::path idx = *root / "shards" / "shard-000000.tar.idx";
  std::ifstream in(idx, std::ios::binary);
  const std::string want(std::istreambuf_iterator<char>(in), {});
  REQUIRE(want.size() > 100);
  CHECK(io::HttpClient::shared()->get(url("reset1,lie2,all,whole") + "shard-000000.tar.idx") ==
        want);
  // Its 200 claims 1000 bytes more than it sends: the resumed request, from its last byte,
  // gets 416 "bytes */N" with N the bytes reached, which says it was all there.
  CHECK(io::HttpClient::shared()->get(url("lielong1,all,whole") + "shard-000000.tar.idx") == want);
}

TEST_CASE("a body resumed after a fault asks for its first version (If-Range); one that changed "
          "meanwhile is a named error, its versions never joined") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const auto count = [](const std::string& what, const std::string& mode) {
    return std::stoi(io::HttpClient::shared()->get(
        "http://127.0.0.1:" + std::to_string(server->proxy) + "/" + what + "/" + mode));
  };
  // Unchanged: each shard's GET, reset halfway, resumes with If-Range and gets the rest.
  {
    const std::string mode = "reset1,ifr";
    shards::ShardStream remote(url(mode), stream_options(16 << 10));
    CHECK(epoch(remote, info) == local_epoch(info));
    const int shard_count = static_cast<int>(remote.dataset().shards().size());
    CHECK(count("ifrange", mode) == shard_count);
  }
  // Replaced between the two GETs: a server that honours If-Range answers the whole new
  // object (200); one that ignores it, the rest of the new one (206). Either is refused.
  for (const std::string mode : {"reset1,changed1", "reset1,changed1,noifrange"}) {
    CAPTURE(mode);
    shards::ShardStream remote(url(mode), {.shuffle_shards = false, .read_ahead = 16 << 10});
    std::size_t got = 0;
    try {
      for (auto& s : remote.samples(info)) {
        CHECK(s.text("bin") == payload(std::stoll(s.text("id"))));
        ++got;
      }
      FAIL("the stream ended without an error");
    } catch (const io::HttpError& e) {
      const std::string what = e.what();
      CHECK(e.url() == url(mode) + "shard-000000.tar");
      CHECK(e.attempts() == 2);
      CHECK(what.find("it changed while it was read (ETag \"") != std::string::npos);
      CHECK(what.find("\"replaced-") != std::string::npos);
      CHECK(got < remote.dataset().shards()[0].samples.size());
    }
    // Shard 0's, and the next shard's where read-ahead had begun it (the proxy counts each
    // before it strips it).
    CHECK(count("ifrange", mode) >= 1);
  }
  // A shard without an index whose 200 ended early ("lie": its Content-Length says half) is
  // asked for again from the byte reached, by a request of its own: that one asks for the
  // first one's version too.
  {
    const std::string mode = "lie1,ifr2";
    shards::ShardStream remote(url(mode, "noindex/"), stream_options(16 << 10));
    CHECK(epoch(remote, info) == local_epoch(info));
    CHECK(count("ifrange", mode) == static_cast<int>(remote.dataset().shards().size()));
  }
  {
    const std::string mode = "lie1,changed1,ifr3";
    shards::ShardStream remote(url(mode, "noindex/"),
                               {.shuffle_shards = false, .read_ahead = 16 << 10});
    try {
      for (auto& s : remote.samples(info)) CHECK(s.text("bin") == payload(std::stoll(s.text("id"))));
      FAIL("the stream ended without an error");
    } catch (const io::HttpError& e) {
      const std::string what = e.what();
      CHECK(e.url() == url(mode, "noindex/") + "shard-000000.tar");
      CHECK(e.attempts() == 1);
      CHECK(what.find("it changed while it was read (ETag \"") != std::string::npos);
      CHECK(what.find("\"replaced-") != std::string::npos);
    }
  }
}

TEST_CASE("a shard that keeps failing ends the epoch with an error naming URL, status, attempts and samples") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  shards::ShardStream remote(url("always503"), {.shuffle_shards = false});
  std::size_t got = 0;
  try {
    for (auto& s : remote.samples(info)) {
      (void)s;
      ++got;
    }
    FAIL("the stream ended without an error");
  } catch (const io::HttpError& e) {
    const std::string what = e.what();
    CHECK(got == 0);
    CHECK(e.status() == 503);
    CHECK(e.attempts() == io::RetryOptions{}.attempts);
    CHECK(e.url() == url("always503") + "shard-000000.tar");
    CHECK(what.find("HTTP 503") != std::string::npos);
    CHECK(what.find("6 attempts") != std::string::npos);
    const auto held = remote.dataset().shards()[0].samples.size();
    CHECK(what.find("holds samples 0.." + std::to_string(held - 1) + ", of which 0 were read") !=
          std::string::npos);
  }
}

TEST_CASE("skip_failed_shards: a shard that fails for good is left out and counted, the rest arrive") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  shards::ShardStream remote(url("always503,on000002"),
                             {.shuffle_shards = false, .skip_failed_shards = true});
  const auto& lost = remote.dataset().shards()[2];
  std::set<std::int64_t> ids;
  for (auto& s : remote.samples(info)) ids.insert(std::stoll(s.text("id")));
  const auto first = remote.dataset().offsets()[2];
  const auto n = static_cast<std::int64_t>(lost.samples.size());
  CHECK(remote.skipped_samples() == n);
  CHECK(ids.size() == static_cast<std::size_t>(total - n));
  for (std::int64_t i = 0; i < total; ++i) {
    CHECK(ids.count(i) == (i >= first && i < first + n ? 0u : 1u));
  }
}

TEST_CASE("a loader over a ShardDataset by URL: its GETs on the loader's driver, every sample once") {
  int nonce = 0;
  for (const char* mode : {"ok", "reset1", "503x1"}) {
    for (int workers : {0, 2}) {
      CAPTURE(mode);
      CAPTURE(workers);
      const shards::ShardDataset remote(url(std::string(mode) + ",l" + std::to_string(nonce++)));
      auto loader = make_data_loader(
          remote, LoaderOptions<CheckedIds>{.batch_size = 8, .shuffle = true,
                                            .num_workers = workers, .seed = 5});
      auto ids = all_ids(loader);
      std::sort(ids.begin(), ids.end());
      std::vector<std::int64_t> every(static_cast<std::size_t>(total));
      for (std::int64_t i = 0; i < total; ++i) every[static_cast<std::size_t>(i)] = i;
      CHECK(ids == every);
    }
  }
}

TEST_CASE("a loader's on_error = skip over a ShardStream: a shard that fails for good is skipped and counted by the loader") {
  const std::string u = url("always503,on000002");
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    const shards::ShardStream remote(u, {.shuffle_shards = true, .shuffle_buffer = 5});
    const auto& lost = remote.dataset().shards()[2];
    const auto first = remote.dataset().offsets()[2];
    const auto n = static_cast<std::int64_t>(lost.samples.size());
    {
      auto loader = make_data_loader(
          remote, LoaderOptions<CheckedIds>{.batch_size = 4, .num_workers = workers,
                                            .seed = 3, .on_error = OnError::skip});
      std::vector<std::int64_t> ids = all_ids(loader);
      std::sort(ids.begin(), ids.end());
      std::vector<std::int64_t> rest;
      for (std::int64_t i = 0; i < total; ++i) {
        if (i < first || i >= first + n) rest.push_back(i);
      }
      CHECK(ids == rest);  // every other sample exactly once
      CHECK(loader.skipped() == n);
    }
    // With raise, the epoch ends with the error naming the URL.
    auto loader = make_data_loader(
        remote, LoaderOptions<CheckedIds>{.batch_size = 4, .num_workers = workers, .seed = 3});
    const std::string named = u + "shard-000002.tar";
    CHECK_THROWS_WITH(all_ids(loader), doctest::Contains(named.c_str()));
  }
}

TEST_CASE("retry options: checked when the dataset is made, each error naming the option") {
  using namespace std::chrono_literals;
  struct Case {
    io::RetryOptions retry;
    const char* error;
  };
  const Case cases[] = {
      {{.attempts = 0}, "ShardOptions::retry.attempts is 0; it must be at least 1"},
      {{.backoff = -1ms}, "ShardOptions::retry.backoff is -1; it must be at least 0 ms"},
      {{.backoff = 500ms, .max_backoff = 100ms},
       "ShardOptions::retry.max_backoff is 100; it must be at least backoff (500 ms)"},
      {{.max_backoff = 2h}, "ShardOptions::retry.max_backoff is 7200000; it must be at most an hour"},
      {{.connect_timeout = 0ms}, "ShardOptions::retry.connect_timeout is 0; it must be above 0 ms"},
      {{.stall = -3s}, "ShardOptions::retry.stall is -3; it must be above 0 s"},
  };
  const int before = std::stoi(io::HttpClient::shared()->get(
      "http://127.0.0.1:" + std::to_string(server->proxy) + "/count/ok,checked"));
  for (const Case& c : cases) {
    CAPTURE(c.error);
    CHECK_THROWS_WITH_AS(shards::ShardDataset(url("ok,checked"), {.retry = c.retry}),
                         doctest::Contains(c.error), InvalidArgument);
    CHECK_THROWS_WITH_AS(
        shards::ShardStream(url("ok,checked"), {.shards = {.retry = c.retry}}),
        doctest::Contains(c.error), InvalidArgument);
  }
  // Refused before anything was fetched with them.
  CHECK(std::stoi(io::HttpClient::shared()->get("http://127.0.0.1:" + std::to_string(server->proxy) +
                                                "/count/ok,checked")) == before);
  // The client checks a request's own, under the name RetryOptions.
  CHECK_THROWS_WITH_AS(io::HttpClient::shared()->get(url("ok") + "shards.txt", 1 << 20,
                                                     {.attempts = -2}),
                       doctest::Contains("RetryOptions.attempts is -2"), InvalidArgument);
}

TEST_CASE("retry options: the attempts set are the attempts made") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  // Two 503s on each shard: 2 attempts in a row fail the shard, 3 get every sample.
  const io::RetryOptions two{.attempts = 2, .backoff = std::chrono::milliseconds(1)};
  const io::RetryOptions three{.attempts = 3, .backoff = std::chrono::milliseconds(1)};
  {
    shards::ShardStream remote(url("503x2,r2"), {.shards = {.retry = two}, .shuffle_shards = false});
    try {
      (void)epoch(remote, info);
      FAIL("no error");
    } catch (const io::HttpError& e) {
      CHECK(e.status() == 503);
      CHECK(e.attempts() == 2);
      CHECK(std::string(e.what()).find("2 attempts") != std::string::npos);
    }
    const shards::ShardDataset ds(url("503x2,r2m"), {.retry = two});
    CHECK_THROWS_AS(ds.read(0), io::HttpError);
  }
  // S3's 400 RequestTimeout is retried as a 503 is, and the error says what the server said;
  // a 20 KiB error body is read no further than its first 4 KiB, and the message stays short.
  for (const std::string mode : {"s3timeout2,r2t", "503x2,bigbody,r2b"}) {
    CAPTURE(mode);
    shards::ShardStream remote(url(mode), {.shards = {.retry = two}, .shuffle_shards = false});
    try {
      (void)epoch(remote, info);
      FAIL("no error");
    } catch (const io::HttpError& e) {
      const std::string what = e.what();
      CHECK(e.attempts() == 2);
      if (mode.starts_with("s3timeout")) {
        CHECK(e.status() == 400);
        CHECK(what.find("HTTP 400 (the server says RequestTimeout: Your socket connection to the "
                        "server was not read from or written to within the timeout period.); "
                        "2 attempts") != std::string::npos);
      } else {
        CHECK(e.status() == 503);
        CHECK(what.find("HTTP 503 (the server says SlowDown: Please reduce your request rate. "
                        "xxx") != std::string::npos);
        CHECK(what.size() < 600);
      }
    }
  }
  shards::ShardStream remote(url("503x2,r3"), {.shards = {.retry = three}, .shuffle_shards = false});
  std::vector<std::string> got = epoch(remote, info);
  CHECK(got.size() == static_cast<std::size_t>(total));
  const shards::ShardDataset ds(url("503x2,r3m"), {.retry = three});
  CHECK(ds.read(0).text("bin") == payload(0));
  // Each sample by itself, through the loader's path too.
  asio::io_context ctx;
  io::Reader reader(ctx);
  const shards::ShardDataset failing(url("503x2,r2a"), {.retry = two});
  CHECK_THROWS_AS(get_on(ctx, failing, reader, 0), io::HttpError);
}

TEST_CASE("a server that caps the bytes it answers at once: each piece is asked for at once and costs no attempt") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  // One attempt: a piece taken for a fault would fail the read at once.
  const io::RetryOptions once{.attempts = 1, .backoff = std::chrono::milliseconds(1)};
  // A stream: each shard's GET answered 4 KiB at a time.
  auto options = stream_options();
  options.shards.retry = once;
  shards::ShardStream remote(url("cap4096,rcs"), options);
  CHECK(epoch(remote, info) == local_epoch(info));
  CHECK(requests_made("cap4096,rcs") > 2 * 60000 / 4096);
  // Map-style: each sample's ranged GET answered 1000 bytes at a time, on a thread's own
  // client and on a reader's io_context.
  const std::string mode = "cap1000,rcm";
  const shards::ShardDataset ds(url(mode), {.retry = once});
  asio::io_context ctx;
  io::Reader reader(ctx);
  int pieces = 0;  // the fewest the samples' payloads alone take
  for (std::int64_t i = 0; i < total; ++i) {
    CAPTURE(i);
    CHECK(ds.read(i).text("bin") == payload(i));
    CHECK(get_on(ctx, ds, reader, i).text("bin") == payload(i));
    pieces += 2 * static_cast<int>((payload(i).size() + 999) / 1000);
  }
  CHECK(requests_made(mode) >= pieces);
  // A body that ends early where its Content-Length lied (curl sees no fault) short of its
  // Content-Range's end is still a fault: with one attempt, the error.
  const shards::ShardDataset cut(url("cap1000,lie1,rcx"), {.retry = once});
  try {
    (void)cut.read(total - 1);
    FAIL("a body cut short of its Content-Range was taken");
  } catch (const io::HttpError& e) {
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find("the body ended at byte") != std::string::npos);
  }
}

TEST_CASE("shards without an index stream by their tar headers: the local epoch, under faults too") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const auto local = local_epoch(info);
  int nonce = 0;
  // "nototal": the resumed GETs' 206s do not say the whole size, which these need not know.
  for (const char* mode : {"ok", "reset1", "short1", "lie1", "503x2", "bw4000", "nototal,reset1"}) {
    CAPTURE(mode);
    shards::ShardStream remote(url(std::string(mode) + ",u" + std::to_string(nonce++), "noindex/"),
                               stream_options(16 << 10));
    CHECK(remote.total_samples() == 0);  // not known before they are streamed
    CHECK(epoch(remote, info) == local);
    CHECK(remote.total_samples() == total);  // known once streamed whole
  }
  // Ranks x workers: every sample exactly once.
  std::multiset<std::string> all;
  for (int w = 0; w < 3; ++w) {
    shards::ShardStream remote(url("ok", "noindex/"), stream_options());
    // The loader's worker seeds: the epoch's seed + the worker's id.
    const WorkerInfo mine{.id = w, .num_workers = 3, .seed = 4u + static_cast<unsigned>(w)};
    for (auto& x : epoch(remote, mine)) all.insert(x);
  }
  const auto every = local_epoch(info);
  CHECK(all.size() == every.size());
  CHECK((all == std::multiset<std::string>(every.begin(), every.end())));
}

TEST_CASE("a shard without an index is walked as an indexed one: a pax global header between a member's headers, the dataset's tar limits") {
  // A member named by its pax header, a global header between that and the member's own.
  const std::string path = std::string(120, 'L') + "/k1.txt";
  if (!fs::exists(*root / "paxg")) {
    fs::create_directories(*root / "paxg");
    shards_test::write_bytes(*root / "paxg" / "g-000000.tar",
                             shards_test::pax_global_between(path, "hello"));
  }
  const std::string shard = url("ok", "paxg/") + "g-000000.tar";
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 1};
  const auto read = [&](shards::ShardStream& stream) {
    std::vector<std::string> got;
    for (auto& sample : stream.samples(info)) got.push_back(sample.key + "=" + sample.text("txt"));
    return got;
  };
  shards::ShardStream remote(shard, stream_options());
  CHECK(read(remote) == std::vector<std::string>{std::string(120, 'L') + "/k1=hello"});
  // The dataset's TarLimits, as the index of a local shard is built with: the pax header (over
  // 100 bytes) is refused under a limit of 64, naming it.
  shards::ShardStreamOptions o = stream_options();
  o.shards.index.limits.max_extended_header = 64;
  CHECK_THROWS_WITH_AS(shards::build_index(*root / "paxg" / "g-000000.tar", o.shards.index.limits),
                       doctest::Contains("exceeds the limit of 64"), shards::ShardError);
  shards::ShardStream limited(shard, o);
  CHECK_THROWS_WITH_AS((void)read(limited), doctest::Contains("exceeds the limit of 64"),
                       shards::ShardError);
}

TEST_CASE("presigned shard URLs: an index refused (403) to a URL with a query is streamed without it") {
  // "403,all,on.idx": every .idx answered 403, the shards served; a presigned URL's signature
  // would not cover the index beside its shard.
  const std::string mode = "403,all,on.idx";
  std::vector<std::string> names;
  const shards::ShardDataset local(*root / "shards");
  for (const auto& shard : local.shards()) {
    names.push_back(url(mode) + fs::path(shard.path).filename().string() + "?X-Amz-Signature=ab");
  }
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  shards::ShardStream presigned(names, stream_options(16 << 10));
  CHECK(presigned.total_samples() == 0);
  CHECK(epoch(presigned, info) == local_epoch(info));
  // Without a query the 403 is the shard's own answer: at once, naming the index.
  try {
    shards::ShardStream plain(std::vector<std::string>{url(mode) + "shard-000000.tar"});
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 403);
    CHECK(e.url() == url(mode) + "shard-000000.tar.idx");
  }
  // Map-style needs the index, and says so.
  CHECK_THROWS_WITH_AS(shards::ShardDataset{names}, doctest::Contains("it has no index"),
                       io::HttpError);
}

TEST_CASE("shards without an index: map-style says it needs the index; a torn one is named") {
  try {
    const shards::ShardDataset ds(url("ok", "noindex/"));
    FAIL("no error");
  } catch (const io::HttpError& e) {
    const std::string what = e.what();
    CHECK(e.status() == 404);
    CHECK(e.url() == url("ok", "noindex/") + "shard-000000.tar.idx");
    CHECK(what.find("has no index, which a ShardDataset needs") != std::string::npos);
    CHECK(what.find("stream the shards with ShardStream") != std::string::npos);
  }
  // A shard cut short in the middle: the samples before the cut, then the error naming it.
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  shards::ShardStream torn(url("ok", "torn/"), {.shuffle_shards = false});
  std::size_t got = 0;
  try {
    for (auto& x : torn.samples(info)) {
      CHECK(x.text("bin") == payload(std::stoll(x.text("id"))));
      ++got;
    }
    FAIL("no error");
  } catch (const shards::ShardError& e) {
    CHECK(e.shard() == url("ok", "torn/") + "shard-000001.tar");
    CHECK(std::string(e.what()).find("torn") != std::string::npos);
  }
  const shards::ShardDataset indexed(*root / "shards");
  CHECK(got > indexed.shards()[0].samples.size());  // shard 0 whole, then part of shard 1
  CHECK(got < static_cast<std::size_t>(indexed.offsets()[2]));
  // With skip_failed_shards the torn shard's rest is left out with a warning naming it, and
  // every later shard arrives: the samples before the cut, then shards 2.. whole.
  {
    Warnings warned;
    shards::ShardStream skipping(url("ok", "torn/"),
                                 {.shuffle_shards = false, .skip_failed_shards = true});
    std::vector<std::int64_t> ids;
    for (auto& x : skipping.samples(info)) ids.push_back(std::stoll(x.text("id")));
    std::vector<std::int64_t> expected;
    for (std::int64_t i = 0; i < total; ++i) {
      if (i < static_cast<std::int64_t>(got) || i >= indexed.offsets()[2]) expected.push_back(i);
    }
    CHECK(ids == expected);
    CHECK(skipping.skipped_samples() == 0);  // how many the rest held is not known
    REQUIRE(warned.messages().size() == 1);
    INFO(warned.messages()[0]);
    CHECK(warned.messages()[0].find("shard-000001.tar' has no index: " + std::to_string(
                               got - indexed.shards()[0].samples.size()) +
                           " of its samples were read, the rest (how many is not known") !=
          std::string::npos);
  }
  // A state taken among such samples cannot be resumed, and says why.
  shards::ShardStream remote(url("ok", "noindex/"), stream_options());
  auto stream = remote.samples(info);
  auto it = stream.begin();
  for (int k = 0; k < 10; ++k) ++it;
  const std::string state = remote.state();
  shards::ShardStream again(url("ok", "noindex/"), stream_options());
  CHECK_THROWS_WITH_AS(again.load_state(state),
                       doctest::Contains("a shard without an index, which a resume cannot re-read"),
                       InvalidArgument);
}

TEST_CASE("shards without an index: a state taken after a shard's last sample is past that shard") {
  // The last sample goes out once the archive's end is read: a state taken right after it
  // resumes at the next shard, and does not fetch this one again (here it would fail, and the
  // error would call samples lost that were all read).
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const shards::ShardDataset indexed(*root / "shards");
  const shards::ShardStreamOptions o{.shuffle_shards = false};
  for (const std::size_t at : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(at);
    shards::ShardStream first(url("ok", "noindex/"), o);
    std::string state;
    std::int64_t n = 0;
    for (auto& x : first.samples(info)) {
      CHECK(std::stoll(x.text("id")) == n);
      if (++n == indexed.offsets()[at]) {
        state = first.state();
        break;
      }
    }
    std::istringstream fields(state);
    std::string word;
    std::size_t shard_pos = 0, sample = 0;
    for (int k = 0; k < 6; ++k) fields >> word;  // "shard-stream 2", the shards, seed, id, of
    fields >> shard_pos >> sample;
    CHECK(shard_pos == at);
    CHECK(sample == 0);
    auto retry = o;
    retry.shards.retry = {.attempts = 2, .backoff = std::chrono::milliseconds(1)};
    char failing[32];
    std::snprintf(failing, sizeof failing, "always503,on%06zu", at - 1);
    shards::ShardStream second(url(failing, "noindex/"), retry);
    second.load_state(state);
    std::vector<std::int64_t> ids;
    for (auto& x : second.samples(info)) ids.push_back(std::stoll(x.text("id")));
    REQUIRE(!ids.empty());
    CHECK(ids.front() == indexed.offsets()[at]);
    CHECK(ids.back() == total - 1);
    CHECK(ids.size() == static_cast<std::size_t>(total - indexed.offsets()[at]));
  }
  // A position past such a shard's samples is refused: past what an epoch counted, or, before
  // one has, past what any shard could hold (sample -1 would drop the shard's every sample).
  shards::ShardStream fresh(url("ok", "noindex/"), o);
  CHECK_THROWS_WITH_AS(fresh.load_state("shard-stream 1 11 0 1 0 -1 5 0"),
                       doctest::Contains(("at sample 18446744073709551615 of shard '" +
                                          url("ok", "noindex/") +
                                          "shard-000000.tar', which has no index, and no shard "
                                          "holds so many")
                                             .c_str()),
                       InvalidArgument);
  CHECK(epoch(fresh, info).size() == static_cast<std::size_t>(total));
  const std::string held = std::to_string(indexed.shards()[0].samples.size());
  CHECK_THROWS_WITH_AS(
      fresh.load_state("shard-stream 1 11 0 1 0 " + std::to_string(indexed.shards()[0].samples.size() + 1) + " 5 0"),
      doctest::Contains(("which holds " + held).c_str()), InvalidArgument);
  fresh.load_state("shard-stream 1 11 0 1 0 " + held + " 5 0");
}

TEST_CASE("shards without an index: an archive cut where its end block begins, after every sample an earlier epoch counted") {
  Warnings warned;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const shards::ShardDataset indexed(*root / "shards");
  // Shard 1's end-of-archive block begins where its last member's data, padded to 512, ends.
  // The proxy passes shard 1's first GET, and stops every later one at that block.
  const std::uint64_t end_block = (indexed.shards()[1].samples.back().end + 511) / 512 * 512;
  const std::string mode = "cutat" + std::to_string(end_block) + ",on000001,from1";
  shards::ShardStreamOptions o{.shuffle_shards = false};
  o.shards.retry = {.attempts = 2, .backoff = std::chrono::milliseconds(1)};
  shards::ShardStream stream(url(mode, "noindex/"), o);
  const auto ids = [&](shards::ShardStream& s) {
    std::vector<std::int64_t> out;
    for (auto& x : s.samples(info)) out.push_back(std::stoll(x.text("id")));
    return out;
  };
  std::vector<std::int64_t> all(static_cast<std::size_t>(total));
  std::iota(all.begin(), all.end(), 0);
  CHECK(ids(stream) == all);
  const int first = requests_made(mode);
  // The next epochs fail at shard 1's end block, after all its samples: the stream found the
  // block there before, so the last sample is whole (no member of it can follow), and nothing
  // is lost: every sample, no error, no warning. (Before, that sample was called lost.)
  for (int epoch = 0; epoch < 2; ++epoch) {
    CHECK(ids(stream) == all);
    CHECK(warned.messages().empty());
    CHECK(stream.skipped_samples() == 0);
  }
  CHECK(requests_made(mode) - first == 2 * (static_cast<int>(indexed.shards().size()) + 1));
  // A stream that never read that block cannot know the archive ends there (another member
  // of the last sample could follow): the error names the shard and the samples read.
  const std::string held = std::to_string(indexed.shards()[1].samples.size() - 1);
  shards::ShardStream fresh(url(mode, "noindex/"), o);
  CHECK_THROWS_WITH_AS(ids(fresh),
                       doctest::Contains(("shard-000001.tar' has no index: " + held +
                                          " of its samples were read, the rest (how many is not "
                                          "known")
                                             .c_str()),
                       io::HttpError);
}

TEST_CASE("ShardStream::load_state: a position outside its shard is refused, naming it") {
  shards::ShardStream t(url("ok"), stream_options());
  const auto& order_first = t.dataset().shards();
  // Worker shard 0 of 1 at its shard 0 in the epoch of seed 3, which a fresh stream of that
  // epoch begins with: sample -1 (SIZE_MAX once parsed), and one past its end.
  const std::size_t first = [&] {
    shards::ShardStream probe(url("ok"), {.shuffle_shards = true});
    for (auto& x : probe.samples(WorkerInfo{.id = 0, .num_workers = 1, .seed = 3})) {
      return t.dataset().locate(std::stoll(x.text("id"))).shard;
    }
    return std::size_t{0};
  }();
  const std::string held = std::to_string(order_first[first].samples.size());
  CHECK_THROWS_WITH_AS(t.load_state("shard-stream 1 3 0 1 0 -1 5 0"),
                       doctest::Contains(("at sample 18446744073709551615 of shard '" +
                                          order_first[first].path + "', which holds " + held)
                                             .c_str()),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(
      t.load_state("shard-stream 1 3 0 1 0 " + std::to_string(order_first[first].samples.size() + 1) +
                   " 5 0"),
      doctest::Contains(("which holds " + held).c_str()), InvalidArgument);
  CHECK_THROWS_WITH_AS(
      t.load_state("shard-stream 1 3 0 2 " + std::to_string(order_first.size()) + " 0 5 0"),
      doctest::Contains(("at shard " + std::to_string(order_first.size()) +
                         " of a worker shard of " + std::to_string((order_first.size() + 1) / 2))
                            .c_str()),
      InvalidArgument);
  // Its last sample, and the end of the worker shard, are positions.
  t.load_state("shard-stream 1 3 0 1 0 " + held + " 5 0");
  t.load_state("shard-stream 1 3 0 1 " + std::to_string(order_first.size()) + " 0 5 0");
}

TEST_CASE("a loader over shards without an index: every sample once; on_error = skip names a failed one") {
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    const shards::ShardStream remote(url("ok", "noindex/"), stream_options());
    auto loader = make_data_loader(
        remote, LoaderOptions<CheckedIds>{.batch_size = 8, .num_workers = workers, .seed = 2});
    auto ids = all_ids(loader);
    std::sort(ids.begin(), ids.end());
    std::vector<std::int64_t> every(static_cast<std::size_t>(total));
    for (std::int64_t i = 0; i < total; ++i) every[static_cast<std::size_t>(i)] = i;
    CHECK(ids == every);
  }
  const shards::ShardStream failing(url("always503,on000002", "noindex/"), stream_options());
  auto loader = make_data_loader(
      failing, LoaderOptions<CheckedIds>{.batch_size = 8, .seed = 2, .on_error = OnError::skip});
  auto ids = all_ids(loader);
  std::sort(ids.begin(), ids.end());
  const shards::ShardDataset indexed(*root / "shards");
  std::vector<std::int64_t> rest;
  for (std::int64_t i = 0; i < total; ++i) {
    if (i < indexed.offsets()[2] || i >= indexed.offsets()[3]) rest.push_back(i);
  }
  CHECK(ids == rest);
}

TEST_CASE("403 and 404 fail at once, naming the URL") {
  shards::ShardStream forbidden(url("403"), {.shuffle_shards = false});
  try {
    for (auto& s : forbidden.samples(WorkerInfo{.num_workers = 1})) (void)s;
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 403);
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find(url("403") + "shard-000000.tar") != std::string::npos);
  }
  // An S3-style <Error> body (a presigned URL past its expiry): its Code and Message named;
  // the connection, its body read, kept for the next request.
  const std::string expired = url("expired,all") + "shard-000000.tar.idx";
  for (int k = 0; k < 2; ++k) {
    try {
      (void)io::HttpClient::shared()->get(expired);
      FAIL("no error");
    } catch (const io::HttpError& e) {
      CHECK(e.status() == 403);
      CHECK(e.attempts() == 1);
      CHECK(std::string(e.what()) == "cannot read '" + expired +
                                         "': HTTP 403 (the server says AccessDenied: Request "
                                         "has expired); 1 attempt, at byte 0");
    }
  }
  CHECK(std::stoi(io::HttpClient::shared()->get("http://127.0.0.1:" +
                                                std::to_string(server->proxy) +
                                                "/connections/expired,all")) == 1);
  // A long message is cut at a character's boundary (it becomes a Python str), a byte that is
  // no UTF-8 ('\xe9' of Latin-1) is '?', and the cut says so.
  try {
    (void)io::HttpClient::shared()->get(url("longdenied,all") + "shard-000000.tar.idx");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    const std::string what = e.what();
    std::string accents;
    for (int k = 0; k < 144; ++k) accents += "\u00e9";  // 11 + 288 bytes of 300
    CHECK(what.find("(the server says AccessDenied: User: caf? " + accents + "...); 1 attempt") !=
          std::string::npos);
  }
  // A 400 whose Code is no passing fault fails at once; MinIO's &#39; read as a quote.
  shards::ShardStream region(url("wrongregion"), {.shuffle_shards = false});
  try {
    for (auto& s : region.samples(WorkerInfo{.num_workers = 1})) (void)s;
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 400);
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find(
              "shard-000000.tar': HTTP 400 (the server says AuthorizationHeaderMalformed: The "
              "authorization header is malformed; the region 'us-east-1' is wrong; expecting "
              "'eu-west-1'); 1 attempt") != std::string::npos);
  }
  // A brace pattern naming a shard the server does not have: its index is not found.
  try {
    shards::ShardDataset missing(url("ok", "shards/shard-{000000..000999}.tar"));
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 404);
    CHECK(e.attempts() == 1);
    CHECK(e.url().find(".tar.idx") != std::string::npos);
    CHECK(std::string(e.what()).find("index file") != std::string::npos);
  }
  // A folder URL without shards.txt.
  CHECK_THROWS_WITH_AS(shards::ShardDataset(url("ok", "nothing/")),
                       doctest::Contains("shards.txt"), io::HttpError);
}

TEST_CASE("a redirect with nowhere to go fails at once; a host name not resolved is retried") {
  // 301 with a body and no Location: its body is not the object's bytes.
  try {
    (void)io::HttpClient::shared()->get(url("moved,all") + "shard-000000.tar.idx");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 301);
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find("the server answered HTTP 301 with no Location to follow, "
                                     "not the object") != std::string::npos);
  }
  // A redirect to itself: followed 10 times, then failed at once, naming the URL (Debian's
  // libcurl followed it forever, until the stall timeout, and then retried it).
  try {
    (void)io::HttpClient::shared()->get(url("loop,all") + "shard-000000.tar.idx");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find(url("loop,all") + "shard-000000.tar.idx") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("redirects") != std::string::npos);
  }
  CHECK(requests_made("loop,all") == 11);
  shards::ShardStream moved(url("moved"), {.shuffle_shards = false});
  CHECK_THROWS_WITH_AS(
      [&] { for (auto& s : moved.samples(WorkerInfo{.num_workers = 1})) (void)s; }(),
      doctest::Contains("HTTP 301 with no Location"), io::HttpError);
  // A DNS failure may pass (a resolver's hiccup): tried once more, not the whole budget of
  // attempts (a mistyped name fails soon). ".invalid" never resolves (RFC 6761).
  const io::RetryOptions six{.attempts = 6, .backoff = std::chrono::milliseconds(1),
                             .max_backoff = std::chrono::milliseconds(1)};
  try {
    (void)io::HttpClient::shared()->get("http://coload-test.invalid/x.tar", 1 << 20, six);
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.attempts() == 2);
    CHECK(e.status() == 0);
    CHECK(std::string(e.what()).find("http://coload-test.invalid/x.tar") != std::string::npos);
  }
}

TEST_CASE("an s3:// URL names a key: percent-encoded into its http(s) URL, a dotted bucket path-style") {
  const char* vars[] = {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                        "AWS_DEFAULT_REGION"};
  std::vector<std::optional<std::string>> saved;
  for (const char* v : vars) {
    const char* x = std::getenv(v);
    saved.push_back(x ? std::optional<std::string>(x) : std::nullopt);
    ::unsetenv(v);
  }
  CHECK(io::s3_http_url("s3://bucket/a/b.tar") == "https://bucket.s3.us-east-1.amazonaws.com/a/b.tar");
  CHECK(io::s3_http_url("S3://bucket/a/b.tar") == "https://bucket.s3.us-east-1.amazonaws.com/a/b.tar");
  // Schemes match without regard to case; anything else is a local path.
  using io::Scheme;
  const std::pair<const char*, Scheme> schemes[] = {
      {"http://h/x", Scheme::http},  {"HTTPS://h/x", Scheme::https}, {"hTtP://h", Scheme::http},
      {"s3://b/k", Scheme::s3},      {"S3://b", Scheme::s3},         {"FILE:///x", Scheme::file},
      {"file://", Scheme::file},     {"http:/x", Scheme::none},      {"httpx://h", Scheme::none},
      {"ftp://h/x", Scheme::none},   {"/srv/http://x", Scheme::none}, {"s\x13://b", Scheme::none},
      {"", Scheme::none},            {"http", Scheme::none}};
  for (const auto& [name, scheme] : schemes) {
    CAPTURE(name);
    CHECK(io::scheme_of(name) == scheme);
    CHECK(io::is_url(name) == (scheme != Scheme::none));
  }
  ::setenv("AWS_DEFAULT_REGION", "eu-west-1", 1);
  // Every byte but the unreserved ones and '/', as SigV4's canonical URI has it; a '%' is the
  // key's own.
  CHECK(io::s3_http_url("s3://bucket/split=a b+c,d/k%20~_.-/\xc3\xa9?x#y") ==
        "https://bucket.s3.eu-west-1.amazonaws.com/split%3Da%20b%2Bc%2Cd/k%2520~_.-/%C3%A9%3Fx%23y");
  // A bucket with dots: path-style (the virtual host's certificate would not cover it).
  ::setenv("AWS_REGION", "ap-south-1", 1);
  CHECK(io::s3_http_url("s3://my.data/x.tar") == "https://s3.ap-south-1.amazonaws.com/my.data/x.tar");
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/", 1);
  CHECK(io::s3_http_url("s3://my.data/a b") == "http://127.0.0.1:9/my.data/a%20b");
  ::setenv("AWS_ENDPOINT_URL_S3", "https://s3.example", 1);
  CHECK(io::s3_http_url("s3://b/") == "https://s3.example/b/");
  CHECK_THROWS_WITH_AS((void)io::s3_http_url("https://b/x"), "'https://b/x' is not an s3:// URL",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS((void)io::s3_http_url("s3:///x"), "'s3:///x' names no bucket (s3://bucket/key)",
                       InvalidArgument);
  for (std::size_t i = 0; i < std::size(vars); ++i) {
    if (saved[i]) {
      ::setenv(vars[i], saved[i]->c_str(), 1);
    } else {
      ::unsetenv(vars[i]);
    }
  }
}

TEST_CASE("a shard whose size differs from its index is refused, naming both sizes") {
  // shards/ and changed/ hold the same shard names; changed/ has a longer first shard and
  // the index of the original.
  const WorkerInfo info{.num_workers = 1};
  shards::ShardStream remote(url("ok", "changed/"), {.shuffle_shards = false});
  CHECK_THROWS_WITH_AS(
      [&] { for (auto& s : remote.samples(info)) (void)s; }(),
      doctest::Contains("the shard changed since it was indexed"), io::HttpError);
  // So it is from a server that ignores Range: its 200's length is the shard's.
  shards::ShardStream whole(url("norange", "changed/"), {.shuffle_shards = false});
  CHECK_THROWS_WITH_AS(
      [&] { for (auto& s : whole.samples(info)) (void)s; }(),
      doctest::Contains("the shard changed since it was indexed"), io::HttpError);
  // A server whose 206s do not say the whole size: the index cannot be checked, so it is
  // refused at the first GET, naming the URL, not retried.
  shards::ShardStream unsized(url("nototal"), {.shuffle_shards = false});
  try {
    for (auto& s : unsized.samples(info)) (void)s;
    FAIL("no error");
  } catch (const io::HttpError& e) {
    const std::string what = e.what();
    CHECK(e.attempts() == 1);
    CHECK(what.find(url("nototal") + "shard-000000.tar") != std::string::npos);
    CHECK(what.find("does not say the whole size (Content-Range bytes N-M/*)") !=
          std::string::npos);
  }
  CHECK_THROWS_WITH_AS(shards::ShardDataset(url("nototal,m")).read(3),
                       doctest::Contains("cannot be checked"), io::HttpError);
}

}  // TEST_SUITE

namespace {
shards_test::Server* s3 = nullptr;  // with --s3: moto's server, bucket "coload"
// A folder of the same shards whose name a URL must encode (served as an S3 prefix).
constexpr const char* odd_keys = "split=a b+c,d%e?f#g~";
}

TEST_CASE("s3: shards in a bucket, signed with SigV4, stream and read the local epoch") {
  if (!s3) return;  // run by the "s3" registration only
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(s3->proxy);
  ::setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", s3->key_id.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", s3->key_secret.c_str(), 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  const WorkerInfo info{.id = 1, .num_workers = 2, .seed = 5};
  shards::ShardStream folder("s3://coload/shards", stream_options());
  CHECK(folder.total_samples() == total);
  CHECK(folder.dataset().shards()[0].path == "s3://coload/shards/shard-000000.tar");
  CHECK(epoch(folder, info) == local_epoch(info));
  const shards::ShardDataset ds("s3://coload/shards/shard-{000000..000002}.tar");
  for (Index i = 0; i < ds.size(); i += 5) CHECK(ds.read(i).text("bin") == payload(i));
  // The server checks signatures: a wrong secret is refused (403), at once, naming the URL.
  ::setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
  try {
    shards::ShardDataset wrong("s3://coload/shards/shard-000000.tar");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 403);
    CHECK(e.attempts() == 1);
    CHECK(e.url() == "s3://coload/shards/shard-000000.tar.idx");
    CHECK(std::string(e.what()).find("HTTP 403 (the server says SignatureDoesNotMatch: ") !=
          std::string::npos);
  }
  // Unsigned (no credentials set): the message says so, and names the URL asked.
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  try {
    shards::ShardDataset unsigned_read("s3://coload/shards/shard-000000.tar");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    const std::string what = e.what();
    CHECK(e.status() == 403);
    CHECK(what.find("(GET " + endpoint + "/coload/shards/shard-000000.tar.idx, sent unsigned: "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not both set)") !=
          std::string::npos);
  }
  ::setenv("AWS_SECRET_ACCESS_KEY", s3->key_secret.c_str(), 1);
  // Keys with bytes a URL must encode (S3 keys are names, as the AWS CLI takes them): each
  // signed request names the object itself.
  shards::ShardStream odd("s3://coload/" + std::string(odd_keys), stream_options());
  CHECK(epoch(odd, info) == local_epoch(info));
  const shards::ShardDataset odd_ds("s3://coload/" + std::string(odd_keys) +
                                    "/shard-{000000..000002}.tar");
  for (Index i = 0; i < odd_ds.size(); i += 7) CHECK(odd_ds.read(i).text("bin") == payload(i));
  try {
    shards::ShardDataset missing("s3://coload/none/shard-000000.tar");
    FAIL("no error");
  } catch (const io::HttpError& e) {
    CHECK(e.status() == 404);
    CHECK(e.url() == "s3://coload/none/shard-000000.tar.idx");
    CHECK(std::string(e.what()).find("HTTP 404 (the server says NoSuchKey: ") != std::string::npos);
  }
}

// The HTTP cases by default; with --s3 only the S3 case, against moto (77, meson's skip,
// with the reason, where moto is not installed).
int main(int argc, char** argv) {
  bool with_s3 = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--s3") {
      with_s3 = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  shards_test::TempDir dir;
  fs::path served = dir.path;
  root = &served;
  write_shards(served / "shards");
  fs::create_directories(served / "changed");
  for (const auto& e : fs::directory_iterator(served / "shards")) {
    fs::copy_file(e.path(), served / "changed" / e.path().filename());
  }
  {
    std::ofstream grow(served / "changed" / "shard-000000.tar", std::ios::app | std::ios::binary);
    grow << std::string(1024, '\0');
  }
  if (with_s3) fs::copy(served / "shards", served / odd_keys);
  // The same shards without their indices, and with one torn in the middle of a sample.
  for (const char* folder : {"noindex", "torn"}) {
    fs::create_directories(served / folder);
    for (const auto& e : fs::directory_iterator(served / "shards")) {
      if (e.path().extension() != ".idx") {
        fs::copy_file(e.path(), served / folder / e.path().filename());
      }
    }
  }
  fs::resize_file(served / "torn" / "shard-000001.tar",
                  fs::file_size(served / "torn" / "shard-000001.tar") / 2 + 7);
  shards_test::Server s;
  s.start(with_s3 ? COLOAD_S3_SERVE_SCRIPT : COLOAD_SERVE_SCRIPT, served);
  if (!s.skip.empty()) {
    std::printf("SKIP: %s", s.skip.c_str());
    return 77;  // meson's skip
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  if (with_s3) {
    s3 = &s;
    context.addFilter("test-case", "s3:*");
  } else {
    server = &s;
    context.addFilter("test-case-exclude", "s3:*");
  }
  return context.run();
}
