#pragma once
// Reads by URL (http://, https://, s3://, file://) through libcurl's multi interface, whose
// sockets and timer an asio::io_context waits on: a loader's driver (HttpClient::on), or the
// client's own, run by one thread of its own (not a thread per request). Faults are retried with
// exponential backoff and jitter, and a body resumes from the byte it reached (Range).

#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/coro/task.hpp"

namespace asio {
class io_context;
}  // namespace asio

namespace coload::io {

/// The schemes of the URLs coload reads through HttpClient.
enum class Scheme { none, file, http, https, s3 };

/// The scheme `name` begins with, matched without regard to case as RFC 3986 (3.1) has it
/// ("HTTP://host/x" is http, as curl and Python's urllib take it); `none` where it names none of
/// them (a local path).
Scheme scheme_of(std::string_view name) noexcept;

/// Whether `name` is a URL coload reads through HttpClient ("http://", "https://", "s3://",
/// "file://", in any case): whether scheme_of(name) is not `none`.
///
/// `s3://bucket/key` is fetched from `$AWS_ENDPOINT_URL_S3` or `$AWS_ENDPOINT_URL` when set
/// (path-style: `<endpoint>/bucket/key`), otherwise from
/// `https://bucket.s3.<region>.amazonaws.com/key`, the region from `$AWS_REGION` or
/// `$AWS_DEFAULT_REGION` (default us-east-1); it is signed with SigV4 (libcurl's) with
/// `$AWS_ACCESS_KEY_ID`, `$AWS_SECRET_ACCESS_KEY` and `$AWS_SESSION_TOKEN` when they are set,
/// and sent unsigned (a public bucket) when they are not.
bool is_url(std::string_view name) noexcept;

/// `bytes` percent-encoded: every byte but A-Z, a-z, 0-9 and those in `keep` as %XX (upper-case
/// hex). With the default, what SigV4 leaves of an S3 key besides its '/'.
std::string percent_encode(std::string_view bytes, std::string_view keep = "-._~");

/// The http(s) URL the s3:// URL `url` is fetched from (as is_url says), its key
/// percent-encoded: an s3:// URL names the key itself, as the AWS CLI takes it
/// (`s3://b/split=a b/x.tar` is the key "split=a b/x.tar"). A bucket named with dots goes
/// path-style to `https://s3.<region>.amazonaws.com/bucket/key` (its name would not match the
/// virtual host's certificate). InvalidArgument when `url` is not an s3:// URL or names no
/// bucket.
std::string s3_http_url(std::string_view url);

/// How faults are retried, for one request (ShardOptions::retry for a shard's). A reset
/// connection, a timeout, a 429 or 5xx and a body cut short are retried, from the byte
/// reached, and so are S3's passing 400s (an <Error> whose Code is RequestTimeout, SlowDown or
/// a throttling code, as botocore retries them); a host name not resolved is tried once more
/// (a resolver's passing fault); another 4xx (403, 404), and a 3xx with no Location to follow,
/// fail at once. An error answer's S3-style <Error> Code and Message are quoted in the error.
struct RetryOptions {
  /// Tries in a row that deliver no byte before the transfer fails (at least 1): an attempt
  /// that moved the body forward starts the count again, so a long body over a flaky link
  /// still completes.
  int attempts = 6;
  /// The wait before the second try (at least 0); it doubles each try up to `max_backoff`
  /// (at least `backoff`, at most an hour), and each wait is drawn from [wait/2, wait] (jitter, so that many
  /// readers failing together do not return together).
  std::chrono::milliseconds backoff{50};
  std::chrono::milliseconds max_backoff{4000};
  /// The most a connection may take to open (above 0).
  std::chrono::milliseconds connect_timeout{10000};
  /// A transfer that receives nothing for this long (while not paused by its reader) is a
  /// fault (above 0).
  std::chrono::seconds stall{30};
};

/// Checks `retry`: InvalidArgument naming the option (`name` + "." + field, e.g.
/// "ShardOptions::retry.attempts"), its value and what it must be.
void validate(const RetryOptions& retry, std::string_view name = "RetryOptions");

/// A transfer that failed for good: its URL, the last HTTP status (0 when none came, e.g. a
/// reset connection) and how many attempts were made.
class HttpError : public std::runtime_error, public Error {
 public:
  HttpError(std::string url, long status, int attempts, const std::string& what);
  const char* what() const noexcept override { return std::runtime_error::what(); }
  const std::string& url() const noexcept { return url_; }
  long status() const noexcept { return status_; }
  int attempts() const noexcept { return attempts_; }

 private:
  std::string url_;
  long status_;
  int attempts_;
};

class HttpClient;

/// The version of a URL's body a read took its bytes from: the validators (ETag, else
/// Last-Modified) of the response its bytes came from; empty when the server sent none.
struct BodyVersion {
  std::string etag, last_modified;
  bool empty() const noexcept { return etag.empty() && last_modified.empty(); }
};

/// One range of a multi-range read (HttpClient::get_ranges_async): bytes [begin, end) of the
/// URL, written to `dst`.
struct RangePart {
  std::uint64_t begin = 0, end = 0;
  std::byte* dst = nullptr;
};

/// The bytes [begin, end) of one URL, arriving in order; at most `window` bytes are held
/// received ahead of the reader (the transfer is paused beyond it). Destroying it cancels the
/// transfer. One reader at a time: a thread (read, read_up_to, skip), or a coroutine
/// (wait_for, read_async, skip_async), which waits without holding its thread.
class BodyStream {
 public:
  ~BodyStream();
  BodyStream(const BodyStream&) = delete;
  BodyStream& operator=(const BodyStream&) = delete;

  /// Copies the next `n` bytes to `dst`, waiting for them. Throws HttpError when the transfer
  /// failed for good, or when the body ends before them. On the io_context of a client made
  /// by HttpClient::on, which it would wait for, a wait is refused (LogicError).
  void read(std::byte* dst, std::size_t n);
  /// Copies up to `n` bytes to `dst` (nullptr drops them), fewer only where the body ends;
  /// returns how many. Throws HttpError when the transfer failed for good.
  std::size_t read_up_to(std::byte* dst, std::size_t n);
  /// Skips the next `n` bytes.
  void skip(std::uint64_t n);
  /// Ends the transfer early, from any thread: once the bytes already held are read, a read
  /// (one waiting now, a thread's or a coroutine's, or a later one) throws HttpError "...:
  /// cancelled". For a reader that must be stopped from elsewhere (a background fetch at
  /// shutdown).
  void cancel();

  class Wait;
  /// Awaitable for a coroutine: ready once `n` bytes (at most the window's worth) are held
  /// received ahead of the reader, or the body has ended or failed. While it waits no thread
  /// is held; it goes on in a handler of the client's io_context (HttpClient::on's: the
  /// loader's driver), or at once when the bytes are already here. A coroutine destroyed while
  /// it waits is never resumed (the wait is withdrawn with it); destroy it on the io_context's
  /// thread, or while nothing runs the io_context. When the io_context is destroyed first, the
  /// waiting coroutine is not resumed either: its owner destroys it.
  Wait wait_for(std::size_t n) noexcept;
  /// read_up_to for a coroutine: waits (as wait_for) whenever the bytes held run out.
  Task<std::size_t> read_async(std::byte* dst, std::size_t n);
  /// skip for a coroutine.
  Task<void> skip_async(std::uint64_t n);
  /// The bytes received and not yet read: what the next read takes without waiting.
  std::size_t available() const;
  /// The offset in the URL's body of the next byte read() returns.
  std::uint64_t position() const noexcept { return position_; }
  /// The URL.
  const std::string& url() const noexcept;
  /// The version its bytes are of, once the body has ended (a read returned fewer bytes than
  /// asked): pass it to a later HttpClient::stream of the same URL that goes on from there,
  /// so the two are never of different versions. Empty before the end, and for file://.
  BodyVersion version() const;

  struct Transfer;

 private:
  friend class HttpClient;
  BodyStream(std::shared_ptr<HttpClient> client, std::shared_ptr<Transfer> transfer,
             std::uint64_t begin);
  /// Up to `n` bytes held now (waiting first for one when `wait`); 0 at the body's end.
  std::size_t take(std::byte* dst, std::size_t n, bool wait);
  std::shared_ptr<HttpClient> client_;
  std::shared_ptr<Transfer> transfer_;
  std::uint64_t position_;
};

/// What BodyStream::wait_for returns: co_await it (once).
class BodyStream::Wait {
 public:
  Wait(const Wait&) = delete;
  Wait& operator=(const Wait&) = delete;
  /// Withdraws a wait still registered or a resumption still posted (the awaiting coroutine
  /// is being destroyed), so that nothing resumes its frame afterwards.
  ~Wait();
  bool await_ready() const;
  bool await_suspend(std::coroutine_handle<> h);
  void await_resume() const noexcept {}

 private:
  friend class BodyStream;
  Wait(std::shared_ptr<Transfer> t, std::size_t n) noexcept : t_(std::move(t)), n_(n) {}
  std::shared_ptr<Transfer> t_;
  std::size_t n_;
  std::coroutine_handle<> h_;  // set while registered
};

/// A libcurl multi handle and the io_context that drives it. Thread-safe.
class HttpClient : public std::enable_shared_from_this<HttpClient> {
 public:
  /// A client with an io_context of its own, run by a thread of its own.
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// The process's client with default options, made on first use and made afresh in a
  /// forked child (the parent's driver thread does not exist there).
  static std::shared_ptr<HttpClient> shared();
  /// The client driven by `ctx` (a loader's driver), made on first use (from any thread) and
  /// closed when `ctx` is destroyed (what is still in flight then fails, naming the URL; a
  /// coroutine still waiting is not resumed: its owner destroys it). Its transfers run
  /// between ctx's other handlers: no thread of their own. Its blocking calls (get,
  /// get_range, a BodyStream's read) refuse to wait on ctx's thread, which they would wait
  /// for: co_await get_range_async or a BodyStream's read_async there.
  static std::shared_ptr<HttpClient> on(asio::io_context& ctx);

  // Each request retries as `retry` says (validated: InvalidArgument naming the option).

  /// The whole body of `url` (an index, a list of shards). HttpError when it fails or is
  /// larger than `limit` bytes.
  std::string get(const std::string& url, std::uint64_t limit = 256 << 20,
                  const RetryOptions& retry = {});
  /// Bytes [begin, end) of `url` into `dst`; `size`, when not 0, is the size the whole body
  /// must have (from an index): a different one is an error naming both.
  void get_range(const std::string& url, std::uint64_t begin, std::uint64_t end, std::byte* dst,
                 std::uint64_t size = 0, const RetryOptions& retry = {});
  /// get_range for a coroutine: it waits without holding its thread and goes on in a handler
  /// of the client's io_context (on()'s: the loader's driver). `dst` must outlive it.
  Task<void> get_range_async(std::string url, std::uint64_t begin, std::uint64_t end,
                             std::byte* dst, std::uint64_t size = 0, RetryOptions retry = {});
  /// Several ranges of `url` with one request where the server allows it: an HTTP(S) GET whose
  /// `Range` header lists them all (ranges at most `gap` bytes apart asked as one), its
  /// multipart/byteranges answer (or one range that covers them) written to each part's
  /// `dst`. One attempt, no retry and no error: it returns how many bytes of each part arrived,
  /// counted from the part's begin (its whole size for a part done), and the caller fetches
  /// what is missing its own way (get_range_async: retries, and the error that names the
  /// URL). s3:// and file:// URLs (S3 answers one range only), and a server that answered a
  /// multi-range request with its whole body (remembered a client, by scheme, host and port),
  /// get nothing: zeros at once. The parts must not overlap (InvalidArgument); each `dst`
  /// must outlive the task.
  Task<std::vector<std::uint64_t>> get_ranges_async(std::string url,
                                                    std::vector<RangePart> parts,
                                                    std::uint64_t size = 0,
                                                    std::uint64_t gap = 0,
                                                    RetryOptions retry = {});
  /// Streams bytes [begin, end) of `url` (see BodyStream); `size` as for get_range. It starts
  /// the transfer and returns without waiting (any thread, ctx's too). A `version` (an earlier
  /// stream's, BodyStream::version) is the one the bytes must be of: it is sent as If-Range,
  /// and a response of another version is an HttpError saying the body changed (as when a
  /// body resumed after a fault changed meanwhile).
  std::unique_ptr<BodyStream> stream(const std::string& url, std::uint64_t begin,
                                     std::uint64_t end, std::size_t window,
                                     std::uint64_t size = 0, const RetryOptions& retry = {},
                                     const BodyVersion& version = {});

  /// The bytes its transfers have received and hold for their readers (a BodyStream's, up to
  /// its window plus one receive buffer of 256 KiB; not get_range's, which go straight to
  /// their destination): what read-ahead costs in memory now.
  std::size_t read_ahead_bytes() const noexcept;
  /// The most read_ahead_bytes() has been since the client was made or the last reset; with
  /// `reset`, starts the count again from now.
  std::size_t read_ahead_peak(bool reset = false) noexcept;

  struct Driver;
  struct Service;

 private:
  friend class BodyStream;
  explicit HttpClient(asio::io_context& ctx);
  void blocking(const char* what) const;
  /// A transfer with these fields, not started yet (launch() starts it).
  std::shared_ptr<BodyStream::Transfer> prepare(const std::string& url, std::uint64_t begin,
                                                std::uint64_t end, std::size_t window,
                                                std::uint64_t size, const RetryOptions& retry,
                                                std::uint64_t limit = ~std::uint64_t{0},
                                                std::byte* sink = nullptr);
  /// Hands `t` to the loop (or fails it at once when the client is closed).
  void launch(const std::shared_ptr<BodyStream::Transfer>& t);
  std::shared_ptr<BodyStream::Transfer> start(const std::string& url, std::uint64_t begin,
                                              std::uint64_t end, std::size_t window,
                                              std::uint64_t size, const RetryOptions& retry,
                                              std::uint64_t limit = ~std::uint64_t{0},
                                              std::byte* sink = nullptr);
  /// get_range's end, its bytes written into its memory by the transfer (Transfer::sink):
  /// returns once all `n` are there (waiting for them when `wait`), or throws its error.
  static void finish_sink(BodyStream::Transfer& t, std::size_t n, bool wait);
  std::unique_ptr<Driver> driver_;
};

}  // namespace coload::io
