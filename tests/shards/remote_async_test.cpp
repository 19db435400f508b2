// Shards by URL read without holding a thread: a ShardStream's waits go on in the handlers of
// the loader's driver (its io_context), a loader streaming by URL gives the local epoch's
// batches exactly, and the HTTP client's completion path withdraws a wait whose coroutine
// goes away (its frame destroyed, or its io_context destroyed first). Part of
// shards_remote_test (remote_test.cpp starts the servers).

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <exception>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "coload/core/warning.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/io/http.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/shards/index.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"
#include "coload/vision/shard_pipeline.hpp"
#include "coload/vision/transforms.hpp"
#include "../vision/image_test_support.hpp"
#include "remote_support.hpp"

// After the coload headers: libtorch's glog defines a CHECK of its own, which doctest's replaces.
#include <doctest/doctest.h>

using namespace remote_test;

namespace {

// A coroutine the test owns: it starts at once, and its frame stays until the test drops it,
// suspended or finished: what resumes it, and when, is what the cases check.
struct Owned {
  struct promise_type {
    Owned get_return_object() noexcept {
      return Owned{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    std::suspend_always final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() noexcept { error = std::current_exception(); }
    std::exception_ptr error;
  };
  explicit Owned(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
  Owned(Owned&& o) noexcept : handle(std::exchange(o.handle, {})) {}
  Owned(const Owned&) = delete;
  ~Owned() {
    if (handle) handle.destroy();
  }
  bool done() const noexcept { return handle.done(); }
  std::coroutine_handle<promise_type> handle;
};

// Awaits `task`; `resumed` says whether it ever came back (with its value or its error).
Owned await_then(Task<void> task, bool& resumed) {
  try {
    co_await std::move(task);
  } catch (...) {
  }
  resumed = true;
}

// A coroutine that tells `done` once it is suspended at its end, so that another thread may
// then destroy its frame (Owned's `done()` would have to be polled).
struct Signalled {
  struct promise_type {
    std::promise<std::string>* done = nullptr;
    std::string said;
    Signalled get_return_object() noexcept {
      return Signalled{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never initial_suspend() const noexcept { return {}; }
    auto final_suspend() const noexcept {
      struct Tell {
        bool await_ready() const noexcept { return false; }
        void await_suspend(std::coroutine_handle<promise_type> h) const noexcept {
          // Nothing of the frame is touched after this: its owner may destroy it at once.
          if (auto* done = h.promise().done) done->set_value(h.promise().said);
        }
        void await_resume() const noexcept {}
      };
      return Tell{};
    }
    void return_void() const noexcept {}
    void unhandled_exception() noexcept {
      try {
        throw;
      } catch (const std::exception& e) {
        said = std::string("threw: ") + e.what();
      }
    }
  };
  // `co_await Signalled::Promise{}` gives the coroutine its own promise, without suspending.
  struct Promise {
    promise_type* p = nullptr;
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<promise_type> h) noexcept {
      p = &h.promise();
      return false;
    }
    promise_type& await_resume() const noexcept { return *p; }
  };
  explicit Signalled(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
  Signalled(Signalled&& o) noexcept : handle(std::exchange(o.handle, {})) {}
  ~Signalled() {
    if (handle) handle.destroy();
  }
  std::coroutine_handle<promise_type> handle;
};

// Awaits `n` bytes of `body`, so that the client's own loop thread resumes it (no sync_wait);
// there, tries a blocking get_range (which must be refused), then drops the stream and with it
// the client's last owner. Says the refusal's message and the thread it ran on.
Signalled read_then_drop_client(std::unique_ptr<io::BodyStream> body,
                                std::shared_ptr<io::HttpClient> client, std::string url,
                                std::size_t n, std::promise<std::string>& done) {
  Signalled::promise_type& me = co_await Signalled::Promise{};
  me.done = &done;
  std::vector<std::byte> buf(n);
  const std::size_t got = co_await body->read_async(buf.data(), n);
  std::string said = "read " + std::to_string(got);
  try {
    client->get_range(url, 0, 16, buf.data());
    said += "; get_range was not refused";
  } catch (const LogicError& e) {
    said += std::string("; refused: ") + e.what();
  }
  body.reset();
  client.reset();  // the last owner: the client goes on its own loop's thread
  std::ostringstream id;
  id << std::this_thread::get_id();
  said += "; on thread " + id.str();
  me.said = said;
}

// Reads `body` to its end as a coroutine: a little under half of `window` at a time, each
// after a wait for a whole window's worth; `finished` once it has.
Owned read_in_steps(io::BodyStream& body, std::size_t window, std::vector<std::byte>& got,
                    bool& finished) {
  std::vector<std::byte> step(window);
  for (;;) {
    co_await body.wait_for(window);
    const std::size_t k = co_await body.read_async(step.data(), window / 2 - 1);
    if (k == 0) break;
    got.insert(got.end(), step.begin(), step.begin() + static_cast<std::ptrdiff_t>(k));
  }
  finished = true;
}

// Waits for `n` bytes of `body`.
Owned wait_then(io::BodyStream& body, std::size_t n, bool& resumed) {
  co_await body.wait_for(n);
  resumed = true;
}

// Every sample of `stream` (each checked), noting whether a next() is pending.
Owned drain(shards::ShardStream& stream, WorkerInfo info, std::vector<std::string>& out,
            bool& waiting, bool& done) {
  auto gen = stream.stream(info);
  for (;;) {
    waiting = true;
    shards::ShardSample* s = co_await gen.next();
    waiting = false;
    if (!s) break;
    if (s->text("bin") != payload(std::stoll(s->text("id")))) {
      throw std::runtime_error("sample " + s->key + " came back altered");
    }
    out.push_back(s->key + '\0' + s->text("id") + '\0' + s->text("bin"));
  }
  done = true;
}

// The ids a loader over `data` delivers, in order; `threads` counts this process's threads
// while the first batch is in hand.
template <class D>
std::vector<std::int64_t> loader_ids(const D& data, int workers, Executor executor,
                                     std::size_t* threads = nullptr) {
  auto loader = make_data_loader(
      data, LoaderOptions<CheckedIds>{.batch_size = 8, .num_workers = workers, .seed = 9,
                                      .executor = executor});
  std::vector<std::int64_t> out;
  for (auto& b : loader) {
    if (threads && out.empty()) *threads = threads_now();
    const at::Tensor t = b.contiguous();
    out.insert(out.end(), t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel());
  }
  return out;
}

}  // namespace

TEST_SUITE("shards") {

TEST_CASE("a stream by URL on a driver holds no thread while it waits: the driver runs other handlers meanwhile") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const auto local = local_epoch(info);
  const std::size_t before = threads_now();
  asio::io_context ctx;
  // Slow: every shard waits 20 ms for its answer and comes at 1 MiB/s.
  shards::ShardStream remote(url("lat20,bw1000,d1"), stream_options(16 << 10));
  remote.set_driver(ctx);
  std::vector<std::string> got;
  bool waiting = false, done = false;
  int ticks = 0, ticks_waiting = 0;
  std::size_t during = 0;
  // A heartbeat on the same io_context: it can beat while the stream waits only if the wait
  // holds no thread (a blocking read on this io_context's own thread would be refused).
  asio::steady_timer beat(ctx);
  std::function<void()> arm = [&] {
    beat.expires_after(std::chrono::milliseconds(2));
    beat.async_wait([&](const asio::error_code& ec) {
      if (ec || done) return;
      ++ticks;
      if (waiting) ++ticks_waiting;
      if (ticks == 20) during = threads_now();
      arm();
    });
  };
  std::optional<Owned> reader;
  asio::post(ctx, [&] { reader.emplace(drain(remote, info, got, waiting, done)); });
  arm();
  while (!done && ctx.run_one() > 0) {
    if (reader && reader->handle.promise().error) break;
  }
  REQUIRE(reader);
  if (auto e = reader->handle.promise().error) std::rethrow_exception(e);
  CHECK(done);
  CHECK(got == local);
  CHECK(ticks_waiting > 10);  // the thread ran the heartbeat while samples were awaited
  CHECK(ticks >= ticks_waiting);
  CHECK(during == before);  // no thread of the client's own
}

TEST_CASE("a loader streaming shards by URL gives the local epoch's batches exactly, with every placement and under faults") {
  // The process's shared client (its loop thread) first: a stream by URL fetches its index
  // through it, and the thread counts below are of the loaders, whichever case ran before.
  io::HttpClient::shared();
  const shards::ShardStream local(*root / "shards", {.shuffle_buffer = 5});
  struct Case {
    int workers;
    Executor executor;
  };
  int nonce = 0;
  // NOTE: processes not under TSan, which cannot follow a forked child of a multi-threaded
  // process that starts threads (the child's HTTP client and reads ahead do).
  const std::vector<Case> cases{Case{0, Executor::threads}, Case{2, Executor::threads},
#if !defined(__SANITIZE_THREAD__)
                                Case{2, Executor::processes}
#endif
  };
  for (const Case c : cases) {
    std::size_t local_threads = 0;
    const auto expected = loader_ids(local, c.workers, c.executor, &local_threads);
    REQUIRE(expected.size() == static_cast<std::size_t>(total));
    for (const char* mode : {"ok", "reset1", "503x1,lat10", "lie1"}) {
      CAPTURE(c.workers);
      CAPTURE(static_cast<int>(c.executor));
      CAPTURE(mode);
      const shards::ShardStream remote(url(std::string(mode) + ",p" + std::to_string(nonce++)),
                                       {.shuffle_buffer = 5, .read_ahead = 64 << 10});
      std::size_t threads = 0;
      CHECK(loader_ids(remote, c.workers, c.executor, &threads) == expected);
      // No more threads than over the folder (whose reader has a helper thread of its own):
      // the transfers run on the loader's driver.
      if (c.executor == Executor::threads) CHECK(threads <= local_threads);
    }
  }
}

TEST_CASE("https: shards stream and read by sample over TLS, checked against the CA certificates CURL_CA_BUNDLE names; an untrusted server fails at once, naming the URL and the variable") {
  REQUIRE(server->nginx_https > 0);
  // serve.py's nginx over HTTPS, its certificate self-signed for 127.0.0.1.
  const std::string base = "https://127.0.0.1:" + std::to_string(server->nginx_https) + "/shards/";
  const shards::ShardStream local(*root / "shards", {.shuffle_buffer = 5});
  const shards::ShardDataset local_map(*root / "shards");
  std::vector<Executor> executors{Executor::threads};
#if !defined(__SANITIZE_THREAD__)
  executors.push_back(Executor::processes);  // a forked worker's own client, over TLS too
#endif
  {
    const ScopedEnv ca("CURL_CA_BUNDLE", COLOAD_TLS_CERT);
    const ScopedEnv aws("AWS_CA_BUNDLE", "/nonexistent/aws-ca.pem");  // s3:// URLs' alone
    const shards::ShardStream remote(base, {.shuffle_buffer = 5, .read_ahead = 64 << 10});
    const shards::ShardDataset remote_map(base);
    for (const Executor executor : executors) {
      CAPTURE(static_cast<int>(executor));
      const auto streamed = loader_ids(remote, 2, executor);
      CHECK(streamed.size() == static_cast<std::size_t>(total));
      CHECK(streamed == loader_ids(local, 2, executor));
      CHECK(loader_ids(remote_map, 2, executor) == loader_ids(local_map, 2, executor));
    }
    CHECK(remote_map.read(7).text("bin") == payload(7));  // on this thread's own client
  }
  {
    // s3:// at an HTTPS endpoint (nginx, the bucket its folder "shards", unsigned): the CAs of
    // AWS_CA_BUNDLE, CURL_CA_BUNDLE's not looked at.
    const ScopedEnv endpoint("AWS_ENDPOINT_URL_S3",
                             ("https://127.0.0.1:" + std::to_string(server->nginx_https)).c_str());
    const ScopedEnv id("AWS_ACCESS_KEY_ID", nullptr), secret("AWS_SECRET_ACCESS_KEY", nullptr);
    const ScopedEnv ca("CURL_CA_BUNDLE", "/nonexistent/ca.pem");
    {
      const ScopedEnv aws("AWS_CA_BUNDLE", COLOAD_TLS_CERT);
      CHECK(loader_ids(shards::ShardDataset("s3://shards/"), 2, Executor::threads) ==
            loader_ids(local_map, 2, Executor::threads));
    }
    const ScopedEnv aws("AWS_CA_BUNDLE", nullptr);
    try {
      const shards::ShardDataset remote("s3://shards/");
      FAIL("an HTTPS endpoint whose certificate is not trusted was read");
    } catch (const io::HttpError& e) {
      CHECK(e.attempts() == 1);
      CHECK(std::string(e.what()).find("; the CA certificates trusted: those in "
                                       "'/nonexistent/ca.pem' (CURL_CA_BUNDLE)") !=
            std::string::npos);
    }
  }
  // Not trusted: the error names the URL, where the CAs came from and how to name others, and
  // the certificate is not retried.
  for (const char* file : {static_cast<const char*>(nullptr), "/nonexistent/ca.pem"}) {
    CAPTURE(file ? file : "(unset)");
    const ScopedEnv ca("CURL_CA_BUNDLE", file);
    try {
      const shards::ShardDataset remote(base);
      FAIL("an HTTPS server whose certificate is not trusted was read");
    } catch (const io::HttpError& e) {
      const std::string what = e.what();
      CHECK(e.url().starts_with(base));
      CHECK(e.status() == 0);
      CHECK(e.attempts() == 1);
      CHECK(what.starts_with("cannot read '" + base));
      CHECK(what.find(file ? "; the CA certificates trusted: those in '/nonexistent/ca.pem' "
                             "(CURL_CA_BUNDLE)"
                           : "; the CA certificates trusted: the system's (CURL_CA_BUNDLE, or "
                             "AWS_CA_BUNDLE for s3:// URLs, names a file of others)") !=
            std::string::npos);
    }
  }
}

TEST_CASE("a loader destroyed mid-stream with transfers in flight returns and leaves no thread behind") {
  io::HttpClient::shared();  // its loop thread stays (the streams' indexes come through it)
  const std::size_t before = threads_now();
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    // Slow enough that the epoch is far from over: each shard 50 ms away, 256 KiB/s.
    const shards::ShardStream remote(url("lat50,bw256,k" + std::to_string(workers)),
                                     {.shuffle_buffer = 5, .read_ahead = 32 << 10});
    std::int64_t seen = 0;
    {
      auto loader = make_data_loader(
          remote, LoaderOptions<CheckedIds>{.batch_size = 4, .num_workers = workers, .seed = 1});
      for (auto& b : loader) {
        seen += b.numel();
        if (seen >= 8) break;
      }
    }  // destroyed here, with each worker's stream waiting for bytes
    CHECK(seen >= 8);
    // Joined, not left to a detached thread after the destructor's grace period.
    CHECK(threads_now() == before);
  }
}

TEST_CASE("an io_context destroyed while get_range_async waits: the coroutine is not resumed, and its owner frees it") {
  const shards::ShardDataset ds(*root / "shards");
  const auto& shard = ds.shards()[0];
  std::vector<std::byte> dst(static_cast<std::size_t>(shard.samples[0].end));
  bool resumed = false;
  auto ctx = std::make_unique<asio::io_context>();
  {
    auto client = io::HttpClient::on(*ctx);
    // The proxy answers after 3 s: the GET is in flight for the whole case.
    Owned waiting = await_then(client->get_range_async(url("lat3000,g1") + "shard-000000.tar", 0,
                                                       dst.size(), dst.data()),
                               resumed);
    ctx->run_for(std::chrono::milliseconds(100));
    CHECK_FALSE(resumed);
    ctx.reset();  // closes the client: the transfer fails; nothing runs on in the teardown
    CHECK_FALSE(resumed);
    CHECK_FALSE(waiting.done());
  }  // its owner frees the frame (and with it the body and the client)
  CHECK_FALSE(resumed);
}

TEST_CASE("a transfer whose start was still queued when its io_context went fails its readers: "
          "a thread's read and a coroutine's wait in sync_wait end with the client's error") {
  // The io_context is never run: each stream's start stays a posted handler, which the
  // io_context's destruction destroys unrun. Before, close() failed only the running and the
  // waiting transfers, and both readers below waited for ever.
  const std::string shard = url("ok") + "shard-000000.tar";
  SUBCASE("a thread reading after the io_context went") {
    auto ctx = std::make_unique<asio::io_context>();
    auto body = io::HttpClient::on(*ctx)->stream(shard, 0, 4096, 1 << 16);
    ctx.reset();
    std::promise<std::string> said;
    auto told = said.get_future();
    std::thread reader([&] {
      std::vector<std::byte> buf(4096);
      try {
        said.set_value("read " + std::to_string(body->read_up_to(buf.data(), buf.size())));
      } catch (const io::HttpError& e) {
        said.set_value(e.what());
      }
    });
    // A bound on the test, not a synchronisation: a reader that waits for ever is the failure.
    if (told.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      reader.detach();
      (void)body.release();  // the hung thread still uses it
      FAIL("the read still waits 30 s after its io_context went");
    }
    reader.join();
    const std::string what = told.get();
    CHECK(what.find("cannot read '" + shard + "': the HTTP client was closed") !=
          std::string::npos);
  }
  SUBCASE("a coroutine inside sync_wait when the io_context goes") {
    auto ctx = std::make_unique<asio::io_context>();
    auto body = io::HttpClient::on(*ctx)->stream(shard, 0, 4096, 1 << 16);
    std::vector<std::byte> buf(4096);
    int pumps = 0;
    std::string what;
    try {
      // The pump runs when the read waits with nothing to resume: the wait is registered.
      sync_wait_pumping(body->read_async(buf.data(), buf.size()), [&] {
        if (++pumps == 1) {
          ctx.reset();  // closes the client: the wait must end on this thread
        } else if (pumps > 1000) {
          throw std::runtime_error("the wait was not resumed after its io_context went");
        }
      });
      what = "the read returned";
    } catch (const std::exception& e) {
      what = e.what();
    }
    CHECK(pumps == 1);
    CHECK(what.find("cannot read '" + shard + "': the HTTP client was closed") !=
          std::string::npos);
  }
}

TEST_CASE("a read past a body's end names the URL, the answer's HTTP status and the attempts") {
  // Before, BodyStream::read and skip threw with status 0 and 0 attempts.
  const std::string shard = url("ok") + "shard-000000.tar";
  auto client = std::make_shared<io::HttpClient>();
  const std::uint64_t size = client->get(shard).size();
  REQUIRE(size > 0);
  for (const bool skip : {false, true}) {
    CAPTURE(skip);
    auto body = client->stream(shard, 0, ~std::uint64_t{0}, 1 << 16);
    std::vector<std::byte> bytes(size + 1);
    try {
      if (skip) {
        sync_wait(body->skip_async(size + 1));
      } else {
        body->read(bytes.data(), bytes.size());
      }
      FAIL("a read past the end returned");
    } catch (const io::HttpError& e) {
      CHECK(e.url() == shard);
      CHECK(e.status() == 200);
      CHECK(e.attempts() == 1);
      CHECK(std::string(e.what()) == "cannot read '" + shard + "': the body ended at byte " +
                                         std::to_string(size) +
                                         ", before the bytes wanted (HTTP 200, 1 attempt)");
    }
  }
}

TEST_CASE("an s3:// URL whose bucket is no bucket name is refused before any request") {
  // Put in the URL, it named another host: s3://evil?x/key was sent, signed, to host "evil".
  for (const char* bad : {"s3://evil?x/key", "s3://2130706433:8000#/key", "s3://a@evil/k",
                          "s3://b%2e/k", "s3://../k", "s3://./k", "s3://a..b/k", "s3://-a/k"}) {
    CAPTURE(bad);
    const std::string bucket = std::string(bad).substr(5, std::string(bad).find('/', 5) - 5);
    const std::string said = "'" + std::string(bad) + "': '" + bucket +
                             "' is no S3 bucket name (1-255 letters, digits, '.', '-' and "
                             "'_', a letter or digit at each end)";
    CHECK_THROWS_WITH_AS((void)io::s3_http_url(bad), said.c_str(), coload::InvalidArgument);
    CHECK_THROWS_WITH_AS((void)io::HttpClient::shared()->get(bad), said.c_str(),
                         coload::InvalidArgument);
  }
  CHECK_THROWS_WITH_AS((void)io::HttpClient::shared()->get("s3:///k"),
                       "'s3:///k' names no bucket (s3://bucket/key)", coload::InvalidArgument);
  // S3's names and the legacy ones (upper case, '_') pass.
  CHECK(io::s3_http_url("s3://Legacy_Bucket-1.x/k").ends_with("/Legacy_Bucket-1.x/k"));
}

TEST_CASE("a client with its own loop whose last owner lets go on that loop's thread closes "
          "and frees itself there; a blocking call on that thread is refused, not a wait for "
          "itself") {
  // A coroutine outside sync_wait is resumed on the client's own loop thread. Before, a
  // blocking get_range there waited for the loop it blocked, and ~HttpClient joined its own
  // thread (std::terminate).
  // The answer comes 300 ms after the request (the proxy's delay), so that the coroutine waits
  // for its bytes and the loop resumes it: without the delay, under TSan the bytes were there
  // once before the coroutine asked (CI, session 47), and read_async returned on this thread.
  const std::string shard = url("lat300,own-loop") + "shard-000000.tar";
  auto client = std::make_shared<io::HttpClient>();
  auto body = client->stream(shard, 0, 1000, 1 << 16);
  std::promise<std::string> done;
  auto told = done.get_future();
  Signalled reader = read_then_drop_client(std::move(body), std::move(client), shard, 1000, done);
  // A bound on the test, not a synchronisation.
  if (told.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    (void)reader.handle;
    reader.handle = {};  // still running on the stuck loop: not ours to destroy
    FAIL("the coroutine did not finish within 30 s");
  }
  const std::string said = told.get();
  std::ostringstream here;
  here << std::this_thread::get_id();
  INFO(said);
  const std::string refused =
      "read 1000; refused: HttpClient::get_range waits for the io_context it is called on";
  CHECK(said.rfind(refused, 0) == 0);
  CHECK(said.find("; on thread ") != std::string::npos);
  CHECK(said.find("; on thread " + here.str()) == std::string::npos);
}

TEST_CASE("a stream from a server that ignores ranges ends when the bytes past its range are "
          "the ones its pause held back: a read past the end returns the range, exactly") {
  // The proxy drops the Range header, so nginx sends the whole shard (200) and the client
  // skips to the range's start and stops at its end. With a 4 KiB window the transfer pauses
  // before nearly every chunk; the chunk with the range's end then comes back when a read
  // resumes it, inside curl_easy_pause, whose callback refuses the bytes past the end, and
  // curl_easy_pause returns that error (a temporary trace saw it in 3 of these 4 streams).
  // The transfer must end there: the read below asks for one byte past the end.
  const std::vector<std::byte> file = shards_test::read_bytes(*root / "shards" / "shard-000000.tar");
  REQUIRE(file.size() > 45000);
  for (const std::uint64_t begin : {std::uint64_t{1000}, std::uint64_t{1001}}) {
    for (const std::uint64_t end : {std::uint64_t{41000}, std::uint64_t{43333}}) {
      CAPTURE(begin);
      CAPTURE(end);
      auto client = std::make_shared<io::HttpClient>();
      auto body = client->stream(url("norange") + "shard-000000.tar", begin, end, 4096);
      std::promise<std::size_t> got;
      auto told = got.get_future();
      std::vector<std::byte> buf(static_cast<std::size_t>(end - begin) + 1);
      std::thread reader([&] {
        std::size_t n = 0;
        while (n < buf.size()) {
          const std::size_t k =
              body->read_up_to(buf.data() + n, std::min<std::size_t>(3000, buf.size() - n));
          if (k == 0) break;  // the range's end
          n += k;
        }
        got.set_value(n);
      });
      if (told.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
        reader.detach();
        (void)body.release();
        (void)new std::shared_ptr<io::HttpClient>(std::move(client));
        FAIL("the read to the range's end still waits after 30 s");
      }
      reader.join();
      REQUIRE(told.get() == end - begin);
      CHECK(std::equal(buf.begin(), buf.end() - 1, file.begin() + static_cast<std::ptrdiff_t>(begin)));
    }
  }
}

TEST_CASE("a coroutine waiting for more bytes than a paused stream holds gets them: the wait "
          "resumes the transfer, which paused at its window and which a read resumes only below "
          "half of it") {
  // 2 MiB from nginx through a window of 64 KiB. The reader takes just under half a window,
  // then waits for a whole one: each time the transfer is paused, one of its waits finds
  // between half a window and a window held. It used to wait there for ever (the read-ahead
  // case below hung 1 run in 6-20 so).
  const fs::path dir = *root / "pause";
  fs::create_directories(dir);
  std::vector<std::byte> file(2 << 20);
  for (std::size_t i = 0; i < file.size(); ++i) file[i] = static_cast<std::byte>((i * 131) >> 7);
  std::ofstream(dir / "body.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  constexpr std::size_t window = 1 << 16;
  asio::io_context ctx;
  auto client = io::HttpClient::on(ctx);
  auto body = client->stream("http://127.0.0.1:" + std::to_string(server->nginx) + "/pause/body.bin",
                             0, file.size(), window);
  std::vector<std::byte> got;
  bool finished = false;
  Owned reader = read_in_steps(*body, window, got, finished);
  // A bound on the test, not a synchronisation: curl's own timers keep the loop turning while
  // a hung reader waits, so without it the loop would not end.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    ctx.run_one_for(std::chrono::milliseconds(100));
  }
  REQUIRE(finished);
  REQUIRE_FALSE(reader.handle.promise().error);
  CHECK(got.size() == file.size());
  CHECK(std::equal(got.begin(), got.end(), file.begin(), file.end()));
}

TEST_CASE("a coroutine destroyed after its resumption was posted is never resumed") {
  const shards::ShardDataset ds(*root / "shards");
  const std::vector<std::byte> file = shards_test::read_bytes(*root / "shards" / "shard-000000.tar");
  const std::size_t n = 4096;
  REQUIRE(file.size() > n);
  asio::io_context ctx;
  auto client = io::HttpClient::on(ctx);
  auto body = client->stream(url("ok,w1") + "shard-000000.tar", 0, n, 1 << 20);
  bool resumed = false;
  {
    Owned waiting = wait_then(*body, n, resumed);
    CHECK_FALSE(resumed);
    // One handler at a time until the bytes are here: the one that appended the last of them
    // posted the resumption, which has not run yet.
    while (body->available() < n && ctx.run_one() > 0) {
    }
    REQUIRE(body->available() == n);
    CHECK_FALSE(resumed);
  }  // destroyed with its resumption posted: the wait is withdrawn
  ctx.restart();
  ctx.poll();  // runs the posted handler, which finds nothing to resume
  CHECK_FALSE(resumed);
  std::vector<std::byte> got(n);
  CHECK(body->read_up_to(got.data(), n) == n);  // the bytes stay readable
  CHECK(std::equal(got.begin(), got.end(), file.begin()));
}

TEST_CASE("shards without an index: a state inside one resumes exactly; a later epoch's failure counts the samples it held") {
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 11};
  const shards::ShardStreamOptions plain{.shuffle_shards = true, .read_ahead = 64 << 10};
  shards::ShardStream whole_stream(url("ok,x1", "noindex/"), plain);
  const auto whole = epoch(whole_stream, info);
  REQUIRE(whole.size() == static_cast<std::size_t>(total));
  for (std::size_t cut : {std::size_t{5}, std::size_t{17}, std::size_t{61}}) {
    CAPTURE(cut);
    shards::ShardStream first(url("ok,x2", "noindex/"), plain);
    std::vector<std::string> got;
    std::string state;
    {
      auto gen = first.samples(info);
      auto it = gen.begin();
      // Takes `cut` samples and asks for no more before state(), as the loader does.
      for (std::size_t k = 0; k < cut; ++k) {
        if (k > 0) ++it;
        got.push_back((*it).key + '\0' + (*it).text("id") + '\0' + (*it).text("bin"));
      }
      state = first.state();
    }
    shards::ShardStream second(url("ok,x2", "noindex/"), plain);
    second.load_state(state);  // inside a shard without an index: accepted
    const auto rest = epoch(second, info);
    got.insert(got.end(), rest.begin(), rest.end());
    CHECK(got == whole);
  }
  // Shard 2 answers its first request (the first epoch) and then fails for good: in the
  // second epoch its samples, known from the first, are counted as skipped.
  const shards::ShardDataset indexed(*root / "shards");
  const std::int64_t first = indexed.offsets()[2], n = indexed.offsets()[3] - first;
  using std::chrono::milliseconds;
  shards::ShardStream failing(
      url("from1,always503,on000002", "noindex/"),
      {.shards = {.retry = {.attempts = 2, .backoff = milliseconds(1), .max_backoff = milliseconds(1)}},
       .shuffle_shards = false,
       .skip_failed_shards = true});
  CHECK(failing.total_samples() == 0);
  CHECK(epoch(failing, info).size() == static_cast<std::size_t>(total));
  CHECK(failing.total_samples() == total);
  CHECK(failing.skipped_samples() == 0);
  std::set<std::int64_t> ids;
  for (auto& s : failing.samples(info)) ids.insert(std::stoll(s.text("id")));
  CHECK(failing.skipped_samples() == n);
  CHECK(ids.size() == static_cast<std::size_t>(total - n));
  for (std::int64_t i = first; i < first + n; ++i) CHECK(ids.count(i) == 0);
}

TEST_CASE("ranged GETs keep their connection: map-style reads of N samples over one host open far fewer than N") {
  // The proxy counts the client connections that carried a request of a mode, and keeps a
  // connection open after each response, as nginx does.
  const auto count = [](const std::string& what, const std::string& mode) {
    return std::stoi(io::HttpClient::shared()->get(
        "http://127.0.0.1:" + std::to_string(server->proxy) + "/" + what + "/" + mode));
  };
  // One read after another through the process's client: shards.txt, the indices and every
  // sample over the one connection (at most two, should curl find one of its pool closed).
  // Over HTTPS too: a TLS connection kept is a handshake saved.
  const ScopedEnv ca("CURL_CA_BUNDLE", COLOAD_TLS_CERT);
  int shards_n = 0;
  for (const bool tls : {false, true}) {
    CAPTURE(tls);
    const std::string mode = tls ? "ok,keep1s" : "ok,keep1";
    const shards::ShardDataset remote(tls ? tls_url(mode) : url(mode));
    shards_n = static_cast<int>(remote.shards().size());
    int reads = 0;
    for (Index i = 0; i < total; i += 3, ++reads) CHECK(remote.read(i).text("bin") == payload(i));
    CHECK(count("count", mode) == 1 + shards_n + reads);
    const int serial = count("connections", mode);
    CAPTURE(serial);
    CHECK(serial >= 1);
    CHECK(serial <= 2);
  }
  // A loader's batches (2 workers, 8 samples a batch, each sample its own GET on the driver):
  // connections are opened for the GETs in flight together, and then reused.
  const shards::ShardDataset batched(url("ok,keep2"));
  auto loader = make_data_loader(
      batched, LoaderOptions<CheckedIds>{.batch_size = 8, .shuffle = true, .num_workers = 2,
                                         .seed = 3});
  std::vector<std::int64_t> ids = all_ids(loader);
  std::sort(ids.begin(), ids.end());
  REQUIRE(ids.size() == static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) CHECK(ids[static_cast<std::size_t>(i)] == i);
  CHECK(count("count", "ok,keep2") == 1 + shards_n + static_cast<int>(total));
  const int parallel = count("connections", "ok,keep2");
  CAPTURE(parallel);
  CHECK(parallel <= static_cast<int>(total) / 3);
}

TEST_CASE("a stream's read-ahead holds at most its budget: the client's bytes held never exceed read_ahead plus a receive buffer a transfer") {
  // Shards of 2 MiB (8 samples of 256 KiB): the next shard's GET starts while this one is
  // read, and without the bound would hold all of it.
  const fs::path dir = *root / "big";
  {
    shards::Writer writer(dir, {.shard_size = 2 << 20});
    for (int i = 0; i < 24; ++i) {
      std::string bin(256 << 10, '\0');
      for (std::size_t k = 0; k < bin.size(); ++k) bin[k] = static_cast<char>((i * 131 + k * 7) & 0xff);
      const std::string id = std::to_string(i);
      const shards::WriteField fields[] = {{"id", shards_test::bytes_of(id)},
                                           {"bin", shards_test::bytes_of(bin)}};
      char key[16];
      std::snprintf(key, sizeof key, "b%05d", i);
      writer.write(key, fields);
    }
    writer.finish();
  }
  const std::string nginx = "http://127.0.0.1:" + std::to_string(server->nginx) + "/big/";
  constexpr std::size_t read_ahead = 1 << 20, receive_buffer = 256 << 10;
  shards::ShardStream stream(nginx, {.shuffle_shards = false, .read_ahead = read_ahead});
  REQUIRE(stream.dataset().shards().size() >= 3);
  const auto client = io::HttpClient::shared();
  client->read_ahead_peak(true);
  std::size_t n = 0, bytes = 0;
  for (auto& s : stream.samples(WorkerInfo{.id = 0, .num_workers = 1})) {
    bytes += s.field("bin").size();
    ++n;
  }
  CHECK(n == 24);
  CHECK(bytes == 24u * (256 << 10));
  const std::size_t peak = client->read_ahead_peak();
  CAPTURE(peak);
  CHECK(peak <= read_ahead + 2 * receive_buffer);
  CHECK(peak >= read_ahead / 2);  // the read-ahead was used: the count sees it
  CHECK(client->read_ahead_bytes() == 0);  // every byte held was read or let go
}


TEST_CASE("a cache entry is checked against its index's checksum: one altered at the same size is fetched again, with one warning naming it and the URL") {
  const std::string mode = "ok,checksum";
  const auto requests = [&] { return requests_made(mode); };
  // Writer's indexes record XXH3-64 of each shard's bytes up to its last sample's end.
  const shards::ShardDataset local(*root / "shards");
  for (const auto& s : local.shards()) {
    REQUIRE(s.checksum.has_value());
    const std::string bytes = shards_test::read_text(s.path).substr(0, s.samples.back().end);
    CHECK(*s.checksum == XXH3_64bits(bytes.data(), bytes.size()));
    CHECK(shards_test::read_text(shards::index_path(s.path)).starts_with("coload-shard-index\t3\n"));
  }
  Warnings warned;
  shards_test::TempDir cache;
  shards::ShardStreamOptions o = stream_options();
  o.shards.cache_dir = cache.path.string();
  o.shards.cache_bytes = 1ull << 30;
  const WorkerInfo info{.id = 0, .num_workers = 1, .seed = 31};
  const auto want = local_epoch(info);
  // An entry's name ends with its shard's file name.
  const auto shard_of = [&](const fs::path& entry) {
    const std::string name = entry.filename().string();
    const auto it = std::find_if(local.shards().begin(), local.shards().end(), [&](const auto& s) {
      return name.ends_with("-" + fs::path(s.path).filename().string());
    });
    REQUIRE(it != local.shards().end());
    return it - local.shards().begin();
  };
  const auto alter = [&](const fs::path& entry) {
    // The first byte of the shard's last field (a sample's "bin"), flipped in place: the size
    // stays the index's, and without the check that sample would come back altered.
    const auto at = static_cast<std::streamoff>(local.shards()[shard_of(entry)].members.back().offset);
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(at);
    f.put(c);
  };
  std::size_t n = 0;
  {
    shards::ShardStream remote(url(mode), o);
    n = remote.dataset().shards().size();
    int before = requests();
    CHECK(epoch(remote, info) == want);
    CHECK(requests() - before == static_cast<int>(n));
    before = requests();
    CHECK(epoch(remote, info) == want);  // every entry verified, and used
    CHECK(requests() == before);
    CHECK(warned.messages().empty());
    // Altered while this stream uses the cache: its mtime changed, so it is hashed again.
    const fs::path first = fs::directory_iterator(cache.path)->path();
    alter(first);
    before = requests();
    CHECK(epoch(remote, info) == want);  // not one altered sample
    CHECK(requests() - before == 1);     // that shard alone fetched again
    REQUIRE(warned.messages().size() == 1);
    CHECK(warned.messages()[0].find(first.string()) != std::string::npos);
    CHECK(warned.messages()[0].find(url(mode)) != std::string::npos);
    CHECK(warned.messages()[0].find("checksum") != std::string::npos);
  }
  // A new dataset checks each entry before its first use: map-style reads of a shard whose
  // entry was altered meanwhile come from the server, right, and the entry is fetched again
  // whole behind them.
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(cache.path)) entries.push_back(e.path());
  REQUIRE(entries.size() == n);
  alter(entries.back());
  const shards::ShardDataset ds(url(mode), o.shards);
  int before = requests();
  for (Index i = 0; i < total; ++i) CHECK(ds.read(i).text("bin") == payload(i));
  // Ranged GETs for the altered shard's samples until its new entry is in (one GET of the
  // whole shard); every other sample from the cache.
  ds.cache_wait();
  const int altered =
      static_cast<int>(ds.shards()[static_cast<std::size_t>(shard_of(entries.back()))].samples.size());
  CHECK(requests() - before >= 2);
  CHECK(requests() - before <= altered + 1);
  CHECK(warned.messages().size() == 2);
  before = requests();
  for (Index i = 0; i < total; ++i) CHECK(ds.read(i).text("bin") == payload(i));
  CHECK(requests() == before);  // the new entry verified and used
  CHECK(warned.messages().size() == 2);
  // An index without a checksum (version 1, from before; or one built from a tar) still works:
  // entries checked by the checksum they were written with, in their trailer.
  const fs::path old = *root / "old-index";
  write_shards(old);
  const shards::ShardDataset written(old);
  for (const auto& s : written.shards()) {
    shards::ShardIndex v1 = s;
    v1.checksum.reset();
    std::ofstream(shards::index_path(s.path), std::ios::trunc) << shards::format_index(v1);
  }
  shards::ShardStream plain(url(mode, "old-index/"), o);
  CHECK_FALSE(plain.dataset().shards()[0].checksum.has_value());
  before = requests();
  CHECK(epoch(plain, info) == want);
  CHECK(requests() - before == static_cast<int>(n));
  before = requests();
  CHECK(epoch(plain, info) == want);
  CHECK(requests() == before);
  CHECK(warned.messages().size() == 2);
  // Each entry: the shard's bytes up to its last sample's end, then "coload\x01\n" and their
  // XXH3-64, little-endian.
  std::vector<fs::path> plain_entries;
  for (const auto& e : fs::directory_iterator(cache.path)) {
    if (std::find(entries.begin(), entries.end(), e.path()) != entries.end()) continue;
    plain_entries.push_back(e.path());
    const std::string text = shards_test::read_text(e.path());
    const shards::ShardIndex& s = written.shards()[static_cast<std::size_t>(shard_of(e.path()))];
    REQUIRE(text.size() == s.samples.back().end + 16);
    CHECK(text.substr(0, s.samples.back().end) ==
          shards_test::read_text(s.path).substr(0, s.samples.back().end));
    CHECK(text.substr(s.samples.back().end, 8) == std::string("coload\x01\n", 8));
    std::uint64_t sum = 0;
    for (int k = 7; k >= 0; --k) {
      sum = (sum << 8) | static_cast<unsigned char>(text[s.samples.back().end + 8 + k]);
    }
    CHECK(sum == XXH3_64bits(text.data(), s.samples.back().end));
  }
  REQUIRE(plain_entries.size() == n);
  // One altered at the same size: fetched again, with a warning naming it.
  alter(plain_entries.front());
  before = requests();
  CHECK(epoch(plain, info) == want);
  CHECK(requests() - before == 1);
  REQUIRE(warned.messages().size() == 3);
  CHECK(warned.messages()[2].find(plain_entries.front().string()) != std::string::npos);
  CHECK(warned.messages()[2].find("does not match the checksum it was written with") !=
        std::string::npos);
  // One whose bytes never reached the disk (a crash after the rename): its size all there, its
  // bytes and trailer zeros. Before the trailer, it passed as the shard.
  fs::resize_file(plain_entries.back(), 0);
  fs::resize_file(plain_entries.back(),
                  written.shards()[static_cast<std::size_t>(shard_of(plain_entries.back()))]
                          .samples.back()
                          .end +
                      16);
  before = requests();
  CHECK(epoch(plain, info) == want);
  CHECK(requests() - before == 1);
  REQUIRE(warned.messages().size() == 4);
  CHECK(warned.messages()[3].find(plain_entries.back().string()) != std::string::npos);
  CHECK(warned.messages()[3].find("has no checksum after its bytes") != std::string::npos);
}

TEST_CASE("get_ranges_async: several ranges of one URL with one GET, neighbours as one range; a fault leaves parts short, never wrong") {
  const fs::path file = *root / "shards" / "shard-000000.tar";
  std::ifstream in(file, std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::uint64_t size = whole.size();
  REQUIRE(size > 4000);
  // Out of order; the second and fourth are neighbours (one range asked), the third ends the
  // file, the last is empty.
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> wants{
      {1000, 1500}, {10, 110}, {size - 200, size}, {110, 300}, {2000, 2000}};
  std::vector<std::string> got;
  const auto run = [&](io::HttpClient& client, const std::string& where) {
    got.assign(wants.size(), std::string());
    std::vector<io::RangePart> parts;
    for (std::size_t k = 0; k < wants.size(); ++k) {
      got[k].assign(wants[k].second - wants[k].first, '\xee');
      parts.push_back({wants[k].first, wants[k].second, reinterpret_cast<std::byte*>(got[k].data())});
    }
    return sync_wait(client.get_ranges_async(where, parts, size, 0));
  };
  const auto expect = [&](std::size_t k) {
    return whole.substr(wants[k].first, wants[k].second - wants[k].first);
  };
  auto client = std::make_shared<io::HttpClient>();
  // nginx's multipart answer; and a server that answers one range covering them all (onerange):
  // each part cut out of it.
  for (const std::string mode : {"ok,ranges", "onerange,ranges"}) {
    CAPTURE(mode);
    const auto filled = run(*client, url(mode) + "shard-000000.tar");
    for (std::size_t k = 0; k < wants.size(); ++k) {
      CAPTURE(k);
      CHECK(filled[k] == wants[k].second - wants[k].first);
      CHECK(got[k] == expect(k));
    }
    CHECK(requests_made(mode) == 1);
  }
  // Each fault: one attempt (no retry), and a part holds exactly the bytes it says it has.
  for (const char* fault : {"reset1", "short1", "lie1", "503x1", "lielong1"}) {
    const std::string mode = std::string(fault) + ",ranges";
    CAPTURE(mode);
    const auto filled = run(*client, url(mode) + "shard-000000.tar");
    bool short_one = false;
    for (std::size_t k = 0; k < wants.size(); ++k) {
      CAPTURE(k);
      REQUIRE(filled[k] <= got[k].size());
      CHECK(got[k].substr(0, filled[k]) == expect(k).substr(0, filled[k]));
      short_one = short_one || filled[k] < got[k].size();
    }
    // lielong sends every byte (it only claims more): nothing is missing there.
    CHECK(short_one == (std::string(fault) != "lielong1"));
    CHECK(requests_made(mode) == 1);
  }
  // Overlapping parts are the caller's mistake.
  std::string a(100, '\0'), b(100, '\0');
  CHECK_THROWS_AS(sync_wait(client->get_ranges_async(
                      url("ok,ranges") + "shard-000000.tar",
                      {{0, 100, reinterpret_cast<std::byte*>(a.data())},
                       {50, 150, reinterpret_cast<std::byte*>(b.data())}})),
                  InvalidArgument);
  // s3:// (S3 answers one range a GET): nothing asked, nothing filled.
  CHECK(run(*client, "s3://no-such-bucket/shard-000000.tar") ==
        std::vector<std::uint64_t>(wants.size(), 0));
  // A server that answers several ranges with the whole body: nothing filled, and the client
  // asks that server (host and port) no more: one request in all.
  const std::vector<std::uint64_t> none(wants.size(), 0);
  CHECK(run(*client, url("norange,ranges") + "shard-000000.tar") == none);
  CHECK(run(*client, url("norange,ranges") + "shard-000000.tar") == none);
  CHECK(requests_made("norange,ranges") == 1);
  CHECK(run(*client, url("ok,ranges2") + "shard-000000.tar") == none);
  CHECK(requests_made("ok,ranges2") == 0);
}

TEST_CASE("image batches by URL: a batch's samples of one shard come a few to a GET, and the batches are the folder's, under faults and from a server that ignores ranges") {
  constexpr int images = 48;
  const fs::path dir = *root / "images";
  if (!fs::exists(dir)) {
    shards::Writer writer(dir, {.shard_size = 40000});
    for (int i = 0; i < images; ++i) {
      const auto jpg = vision::test::synthetic_jpeg(40 + i % 7 * 8, 36 + i % 5 * 8,
                                                    static_cast<std::uint32_t>(i));
      const std::string cls = std::to_string(i % 3);
      const shards::WriteField fields[] = {{"jpg", jpg}, {"cls", shards_test::bytes_of(cls)}};
      char key[16];
      std::snprintf(key, sizeof key, "img%03d", i);
      writer.write(key, fields);
    }
    writer.finish();
  }
  const shards::ShardDataset local(dir);
  REQUIRE(local.size() == images);
  REQUIRE(local.shards().size() >= 2);
  // The label is the sample's index: each batch says which samples it holds.
  const vision::ShardImagePipeline::Label label = [](const shards::ShardSample& s) {
    return static_cast<std::int64_t>(std::stoi(s.key.substr(3)));
  };
  struct Epoch {
    std::vector<at::Tensor> batches;
    std::vector<std::vector<std::int64_t>> ids;
  };
  const auto run = [&](const shards::ShardDataset& data, Executor executor) {
    vision::ShardImagePipeline pipe(data, vision::TrainTransform{.size = 24}, label);
    auto loader = make_data_loader(pipe, LoaderOptions<>{.batch_size = 20, .shuffle = true,
                                                         .num_workers = 2, .seed = 5,
                                                         .executor = executor});
    Epoch e;
    for (auto& [batch, labels] : loader) {
      e.batches.push_back(batch.clone());
      const at::Tensor l = labels.contiguous();
      e.ids.emplace_back(l.data_ptr<std::int64_t>(), l.data_ptr<std::int64_t>() + l.numel());
    }
    return e;
  };
  const auto same = [](const Epoch& a, const Epoch& b) {
    if (a.ids != b.ids || a.batches.size() != b.batches.size()) return false;
    for (std::size_t k = 0; k < a.batches.size(); ++k) {
      if (!a.batches[k].equal(b.batches[k])) return false;
    }
    return true;
  };
  const Epoch want = run(local, Executor::threads);
  REQUIRE(want.ids.size() == 3);
  // A batch's samples of one shard, at most 8 a GET: what the requests must number.
  int gets = 0;
  for (const auto& batch : want.ids) {
    std::map<std::size_t, int> per_shard;
    for (const std::int64_t i : batch) ++per_shard[local.locate(i).shard];
    for (const auto& [shard, n] : per_shard) gets += (n + 7) / 8;
  }
  CAPTURE(gets);
  CHECK(gets < images / 2);
  struct Case {
    const char* mode;
    Executor executor;
  };
  for (const Case c : {Case{"ok,img", Executor::threads}, Case{"ok,imgp", Executor::processes},
                       Case{"reset1,img", Executor::threads}, Case{"short1,img", Executor::threads},
                       Case{"lie1,img", Executor::threads}, Case{"503x1,img", Executor::threads},
                       Case{"norange,img", Executor::threads}}) {
    CAPTURE(c.mode);
    const shards::ShardDataset remote(url(c.mode, "images/"));
    const int before = requests_made(c.mode);
    CHECK(same(run(remote, c.executor), want));
    if (std::string(c.mode).rfind("ok,", 0) == 0) CHECK(requests_made(c.mode) - before == gets);
  }
}

}  // TEST_SUITE
