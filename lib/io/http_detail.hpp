#pragma once
// The parts of HttpClient shared by http.cpp (transfers: requests, responses, retries) and
// http_driver.cpp (the loop: libcurl's sockets and timer on an asio::io_context).

#include <curl/curl.h>

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "coload/coro/sync_wait.hpp"
#include "coload/io/http.hpp"

namespace coload::io {

namespace http_detail {
constexpr std::uint64_t to_end = std::numeric_limits<std::uint64_t>::max();
constexpr std::size_t block_size = 1 << 20;
constexpr std::size_t max_idle = 64;  // easy handles kept for reuse
using Clock = std::chrono::steady_clock;
}  // namespace http_detail

/// A multi-range read's state (HttpClient::get_ranges_async): its parts, what each has
/// received, and where the answer's parser stands. The loop's alone while the transfer runs;
/// `filled` is written under the transfer's mutex, read by the caller once it is done.
struct ScatterState {
  std::vector<RangePart> parts;       // by begin, disjoint
  std::vector<std::size_t> slot;      // each part's position in the caller's list
  std::vector<std::uint64_t> filled;  // bytes of each part written, from its begin
  std::string ranges;                 // the Range header's value: "a-b,c-d"
  std::string boundary;               // a multipart/byteranges answer's (Content-Type)
  std::string head;                   // a part's header block as far as it arrived
  std::uint64_t offset = 0;           // the body's next byte is this byte of the URL
  std::uint64_t left = 0;             // bytes of the part being received still to come
  bool multipart = false;
  // A multipart answer's parts taken so far, and `filled` as it was before the last one: a
  // part is only as good as the delimiter after it (see on_scatter).
  std::size_t parts_taken = 0;
  std::vector<std::uint64_t> before;
};

struct BodyStream::Transfer : std::enable_shared_from_this<BodyStream::Transfer> {
  // Set before the transfer starts; read-only after.
  HttpClient::Driver* driver = nullptr;
  std::string url;
  std::uint64_t begin = 0, end = http_detail::to_end;  // end: to_end reads to the body's end
  std::size_t window = 0;                 // 0: no bound (get)
  std::uint64_t size = 0;                 // the body's size when known (0: not checked)
  std::uint64_t limit = http_detail::to_end;  // get(): the most bytes accepted
  // get_range: the bytes go straight to sink + (offset - begin), under `mutex`, and `buffered`
  // counts them (no block, no second copy); the caller's memory, written only while the
  // transfer is not cancelled.
  std::byte* sink = nullptr;
  // get_ranges_async: its parts' memory, written as sink's is; one attempt, no retry.
  std::unique_ptr<ScatterState> scatter;
  RetryOptions retry;

  // The loop's alone (the io_context's thread).
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;  // this attempt's extra headers (s3://), freed with `easy`
  std::uint64_t reached = 0;        // the next byte of the body wanted
  std::uint64_t attempt_start = 0;  // reached when this attempt began
  std::uint64_t skip = 0;           // bytes of this response before `reached` (a 200 to a Range)
  // This response's Content-Range: its first and last byte, the whole size.
  std::int64_t range_start = -1, range_last = -1, range_total = -1;
  std::int64_t unsatisfied_total = -1;  // a 416's "Content-Range: bytes */TOTAL"
  bool checked = false;  // this response's status and range checked
  long status = 0;
  int attempts = 0, failures = 0;  // in all; in a row without a byte gained
  int resolve_failures = 0;         // host names not resolved, in a row
  std::string fatal;               // why the response cannot be used (no retry)
  // A 4xx or 5xx answer's first bytes (up to error_body_limit): an S3 or S3-like server's
  // <Error> there says its Code and Message, which the error names and retryable() reads.
  std::string error_body;
  bool error_answer = false;  // this response is one (its body goes to error_body)
  // The body's version: the ETag (else Last-Modified) of the response whose bytes came first,
  // sent as If-Range when a later attempt resumes, and compared with each later response's, so
  // that bytes of two versions of an object are never joined.
  // A version given by the caller (HttpClient::stream's) is set before the transfer starts,
  // and `pinned` says so: the first response is then compared with it too.
  std::string etag, modified;
  bool pinned = false;
  std::string response_etag, response_modified;  // this response's, as far as it came
  char errbuf[CURL_ERROR_SIZE] = {};
  std::unique_ptr<asio::steady_timer> backoff;  // the wait before the next attempt

  // Shared with the reader, under `mutex`.
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::vector<std::byte>> blocks;
  std::size_t front = 0;     // bytes of blocks.front() already read
  std::size_t buffered = 0;  // bytes received and not yet read
  std::vector<std::vector<std::byte>> spare;
  bool paused = false, done = false, cancelled = false;
  // A coroutine waiting (BodyStream::Wait) until `want` bytes are held or the transfer is
  // done; once they are, it moves to `resuming` and a handler posted on the io_context resumes
  // it from there, unless the wait was withdrawn first (its Wait destroyed: the frame went
  // away), which empties `resuming`: that is the token the handler checks.
  std::coroutine_handle<> waiter;
  std::size_t want = 0;
  std::coroutine_handle<> resuming;
  // The sync_wait the waiter's thread was inside (it resumes there), or nullptr.
  detail::ResumeQueue* resume_queue = nullptr;
  // Why it failed for good: the reader throws an HttpError made on its own thread from these
  // (an exception_ptr made here and dropped there has its count in uninstrumented libstdc++,
  // which TSan reports as a race on the exception's frees).
  bool failed = false;
  long error_status = 0;
  int error_attempts = 0;
  std::string error_what;

  [[noreturn]] void rethrow() const {
    throw HttpError(url, error_status, error_attempts, error_what);
  }
  /// Appends received bytes (the loop's thread, under `mutex`).
  void append(const std::byte* p, std::size_t n);
  /// Moves up to `n` buffered bytes to `dst` (nullptr drops them); under `mutex`.
  std::size_t take(std::byte* dst, std::size_t n);
  /// Under `mutex`, on the loop's thread: when a waiter is satisfied (or `force`), posts its
  /// resumption; while the client closes there is no later turn, and it is dropped instead
  /// (its owner destroys the frame).
  void wake_locked(bool force);
};

/// The loop: one curl multi handle whose sockets and timer are waited on by an io_context,
/// either one the client was given (a loader's driver) or its own, run by a thread of its own.
/// Every member below `mutex`'s group is touched only on the io_context's thread.
struct HttpClient::Driver {
  asio::io_context* ctx = nullptr;
  std::unique_ptr<asio::io_context> own;  // with `thread`, when the client has no io_context
  std::thread thread;
  CURLM* multi = nullptr;

  // Posting onto the io_context from any thread; `closed` once it must no longer be touched.
  std::mutex mutex;
  bool closed = false;
  // Transfers whose start is posted and has not run yet: an io_context destroyed meanwhile
  // destroys that handler unrun, and close() fails them instead (their readers would wait).
  std::vector<std::shared_ptr<BodyStream::Transfer>> starting;
  // The client was destroyed on the loop's own thread (which cannot join itself): the thread
  // deletes the driver once its loop returns. Only that thread touches it.
  bool orphaned = false;

  struct Socket {
    explicit Socket(asio::io_context& ctx, curl_socket_t fd) : sd(ctx, fd), fd(fd) {}
    asio::posix::stream_descriptor sd;  // curl's socket: released, never closed, by us
    curl_socket_t fd;
    int want = 0;  // CURL_POLL_IN / OUT / INOUT
    bool reading = false, writing = false, gone = false;
  };
  std::unordered_map<curl_socket_t, std::shared_ptr<Socket>> sockets;
  std::unique_ptr<asio::steady_timer> timer;  // curl's timeout (CURLMOPT_TIMERFUNCTION)
  // A timeout of 0 posted (1), none (0), or the driver closed (-1): shared with the handler,
  // which may run after the driver is gone.
  std::shared_ptr<int> timeout_posted = std::make_shared<int>(0);
  std::unordered_map<CURL*, std::shared_ptr<BodyStream::Transfer>> running;
  // Easy handles of finished transfers, reset, for the next ones: a fresh handle costs its
  // allocation and curl's receive buffer's pages each time (a ranged GET a sample).
  std::vector<CURL*> idle;

  // The bytes received into transfers' blocks and not yet read (a get_range's, written into
  // its caller's memory, are not), now and at most since the last reset: what read-ahead
  // holds. From any thread.
  std::atomic<std::size_t> held{0}, held_peak{0};
  void add_held(std::size_t n) noexcept {
    const std::size_t now = held.fetch_add(n, std::memory_order_relaxed) + n;
    std::size_t peak = held_peak.load(std::memory_order_relaxed);
    while (now > peak && !held_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  std::vector<std::shared_ptr<BodyStream::Transfer>> waiting;  // in backoff
  // Servers ("scheme://host:port") that answered a multi-range request with the whole body:
  // get_ranges_async asks them no more. From any thread, under `origins_mutex`.
  std::mutex origins_mutex;
  std::vector<std::string> whole_body_origins;
  std::minstd_rand jitter;
  bool closing = false;

  /// Runs `f` on the io_context, later, from any thread; false once closed.
  bool post(std::function<void()> f);
  /// Posts `t`'s first attempt (launch) from any thread, kept in `starting` until it runs;
  /// false once closed.
  bool post_start(const std::shared_ptr<BodyStream::Transfer>& t);
  void open();   // the multi handle and its callbacks
  void close();  // on the io_context: every transfer fails, curl lets go of every socket
  void action(curl_socket_t fd, int flags);  // curl_multi_socket_action, then finished ones
  void arm(const std::shared_ptr<Socket>& s);
  void launch(const std::shared_ptr<BodyStream::Transfer>& t);
  void finished(CURL* easy, CURLcode result);
  void fail(BodyStream::Transfer& t, const std::string& why);
  void complete(BodyStream::Transfer& t);  // done: wake the reader, resume the waiter
  void cancel(const std::shared_ptr<BodyStream::Transfer>& t);
  void drop(BodyStream::Transfer& t);
};

/// CURLOPT_CLOSESOCKETFUNCTION of every transfer (`user`: its Driver), in http_driver.cpp.
int close_socket(void* user, curl_socket_t fd);

}  // namespace coload::io
