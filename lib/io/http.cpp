// HttpClient's transfers: each BodyStream's Transfer holds the bytes received ahead of its
// reader, the byte reached, and the count of faults in a row; a fault is retried from the byte
// reached after a backoff. The loop that drives them is http_driver.cpp's.

#include "coload/io/http.hpp"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <asio/post.hpp>

#include "http_detail.hpp"

namespace coload::io {

using http_detail::block_size;
using http_detail::Clock;
using http_detail::to_end;

Scheme scheme_of(std::string_view name) noexcept {
  const auto is = [name](std::string_view scheme) {
    if (name.size() < scheme.size() + 3 || name.substr(scheme.size(), 3) != "://") return false;
    for (std::size_t i = 0; i < scheme.size(); ++i) {
      const char c = name[i];
      if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != scheme[i]) return false;
    }
    return true;
  };
  if (is("http")) return Scheme::http;
  if (is("https")) return Scheme::https;
  if (is("s3")) return Scheme::s3;
  if (is("file")) return Scheme::file;
  return Scheme::none;
}

bool is_url(std::string_view name) noexcept { return scheme_of(name) != Scheme::none; }

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The file of CA certificates an HTTPS answer to `url` is checked against, in place of the
// system's (as botocore's AWS_CA_BUNDLE and requests' REQUESTS_CA_BUNDLE replace them), and the
// variable that named it: CURL_CA_BUNDLE, the name curl's tool reads; for s3:// URLs
// AWS_CA_BUNDLE first, as botocore reads it. Neither set: none (libcurl's own, the system's).
std::pair<const char*, std::string> ca_bundle(std::string_view url) {
  if (scheme_of(url) == Scheme::s3) {
    if (std::string v = env("AWS_CA_BUNDLE"); !v.empty()) return {"AWS_CA_BUNDLE", std::move(v)};
  }
  if (std::string v = env("CURL_CA_BUNDLE"); !v.empty()) return {"CURL_CA_BUNDLE", std::move(v)};
  return {nullptr, {}};
}

// An s3:// URL's bucket must be a bucket's name: S3's rules, and the legacy names of
// us-east-1 (upper case, '_'), are 1-255 of A-Z a-z 0-9 . - _, a letter or digit at each end,
// no ".." Anything else could name another host or path once put in the URL: "s3://evil?x/key"
// was sent, signed, to host "evil"; "s3://a@host/k" to host "host"; "s3://../k" (path-style,
// the path taken as it is) above an endpoint's path.
void check_s3_url(std::string_view url) {
  const std::string_view rest = url.substr(std::min<std::size_t>(url.size(), 5));
  const std::string_view bucket = rest.substr(0, rest.find('/'));
  if (bucket.empty()) {
    throw InvalidArgument("'" + std::string(url) + "' names no bucket (s3://bucket/key)");
  }
  const auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  const bool named =
      bucket.size() <= 255 && alnum(bucket.front()) && alnum(bucket.back()) &&
      bucket.find("..") == std::string_view::npos &&
      std::all_of(bucket.begin(), bucket.end(),
                  [&](char c) { return alnum(c) || c == '.' || c == '-' || c == '_'; });
  if (!named) {
    throw InvalidArgument("'" + std::string(url) + "': '" + std::string(bucket) +
                          "' is no S3 bucket name (1-255 letters, digits, '.', '-' and '_', a "
                          "letter or digit at each end)");
  }
}

/// How an s3:// URL is fetched: the HTTP(S) URL and its signing, from the standard AWS
/// variables (read at each attempt, so a rotated session token is picked up).
struct S3Target {
  std::string url, region, sigv4, userpwd, token;
};

// An S3 key as its URL's path carries it: every byte but A-Z a-z 0-9 - . _ ~ and '/'
// percent-encoded, as SigV4's canonical URI has it (an s3:// URL names the key itself, as the
// AWS CLI takes it: "a b=c" is that key, and "a%20b" a key with a '%'). libcurl 7.88 signs the
// path as it is given, so it must be given encoded.
S3Target resolve_s3(std::string_view url) {
  const std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  const std::string key =
      percent_encode(slash == std::string::npos ? "" : rest.substr(slash + 1), "-._~/");
  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty()) region = "us-east-1";
  std::string endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  S3Target t;
  t.region = region;
  if (!endpoint.empty()) {
    // A custom endpoint (MinIO, moto, a proxy): path-style, as such servers expect.
    if (endpoint.back() == '/') endpoint.pop_back();
    t.url = endpoint + "/" + bucket + "/" + key;
  } else if (bucket.find('.') != std::string::npos) {
    // A bucket named with dots is not covered by the certificate of *.s3.<region>.amazonaws.com
    // (one label): path-style, as the AWS SDKs fall back to.
    t.url = "https://s3." + region + ".amazonaws.com/" + bucket + "/" + key;
  } else {
    t.url = "https://" + bucket + ".s3." + region + ".amazonaws.com/" + key;
  }
  const std::string id = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (!id.empty() && !secret.empty()) {
    t.sigv4 = "aws:amz:" + region + ":s3";
    t.userpwd = id + ":" + secret;
    t.token = env("AWS_SESSION_TOKEN");
  }
  return t;
}

}  // namespace

std::string percent_encode(std::string_view bytes, std::string_view keep) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size());
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        keep.find(ch) != std::string_view::npos) {
      out += ch;
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string s3_http_url(std::string_view url) {
  if (scheme_of(url) != Scheme::s3) {
    throw InvalidArgument("'" + std::string(url) + "' is not an s3:// URL");
  }
  check_s3_url(url);
  return resolve_s3(url).url;
}

void validate(const RetryOptions& retry, std::string_view name) {
  const auto bad = [&](const char* field, long long value, const char* must) {
    throw InvalidArgument(std::string(name) + "." + field + " is " + std::to_string(value) +
                          "; it must be " + must);
  };
  if (retry.attempts < 1) bad("attempts", retry.attempts, "at least 1");
  if (retry.backoff.count() < 0) bad("backoff", retry.backoff.count(), "at least 0 ms");
  if (retry.max_backoff < retry.backoff) {
    bad("max_backoff", retry.max_backoff.count(),
        ("at least backoff (" + std::to_string(retry.backoff.count()) + " ms)").c_str());
  }
  if (retry.max_backoff > std::chrono::hours(1)) {
    bad("max_backoff", retry.max_backoff.count(), "at most an hour (3600000 ms)");
  }
  if (retry.connect_timeout.count() <= 0) {
    bad("connect_timeout", retry.connect_timeout.count(), "above 0 ms");
  }
  // curl takes both as a long (ms, s): a value it cannot hold is refused rather than cut.
  if (retry.connect_timeout.count() > std::numeric_limits<long>::max()) {
    bad("connect_timeout", retry.connect_timeout.count(), "at most LONG_MAX ms");
  }
  if (retry.stall.count() <= 0) bad("stall", retry.stall.count(), "above 0 s");
  if (retry.stall.count() > std::numeric_limits<long>::max()) {
    bad("stall", retry.stall.count(), "at most LONG_MAX s");
  }
}

HttpError::HttpError(std::string url, long status, int attempts, const std::string& what)
    : std::runtime_error(what), url_(std::move(url)), status_(status), attempts_(attempts) {}

void BodyStream::Transfer::append(const std::byte* p, std::size_t n) {
  buffered += n;
  driver->add_held(n);
  while (n > 0) {
    if (blocks.empty() || blocks.back().size() == blocks.back().capacity()) {
      std::vector<std::byte> b;
      if (!spare.empty()) {
        b = std::move(spare.back());
        spare.pop_back();
        b.clear();
      }
      // No bigger than the rest of the range (a small ranged read needs no 1 MiB block).
      b.reserve(static_cast<std::size_t>(
          std::min<std::uint64_t>(block_size, std::max<std::uint64_t>(n, end - reached))));
      blocks.push_back(std::move(b));
    }
    std::vector<std::byte>& last = blocks.back();
    const std::size_t take = std::min(n, last.capacity() - last.size());
    last.insert(last.end(), p, p + take);
    p += take;
    n -= take;
  }
}

void BodyStream::Transfer::wake_locked(bool force) {
  if (!waiter || !(force || done || buffered >= want)) return;
  const std::coroutine_handle<> h = std::exchange(waiter, nullptr);
  // Closing (the io_context is going away, or the client's own loop ends): no handler of it
  // runs any more, and resuming here, inside its teardown, would run the coroutine on in a
  // half-destroyed loop. A waiter inside sync_wait goes on on its own thread, which is blocked
  // on it and has no other way out; any other stays suspended, and its owner destroys it.
  if (driver->closing) {
    if (resume_queue) resume_queue->post(h);
    return;
  }
  resuming = h;
  // Resumed in a handler of its own, never inside curl's callback; the handler resumes only
  // what `resuming` still holds, so a wait withdrawn meanwhile (the frame destroyed) is not.
  asio::post(*driver->ctx, [t = shared_from_this()] {
    std::coroutine_handle<> r;
    detail::ResumeQueue* queue = nullptr;
    {
      std::lock_guard lock(t->mutex);
      r = std::exchange(t->resuming, nullptr);
      queue = t->resume_queue;
    }
    // A waiter that was inside sync_wait goes on on that thread (a plain loop over a stream
    // parses on its own thread, not on the client's); others go on here.
    if (r) detail::resume_on(queue, r);
  });
}

std::size_t BodyStream::Transfer::take(std::byte* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n && buffered > 0) {
    std::vector<std::byte>& b = blocks.front();
    const std::size_t k = std::min(n - got, b.size() - front);
    if (dst) std::memcpy(dst + got, b.data() + front, k);
    got += k;
    front += k;
    buffered -= k;
    driver->held.fetch_sub(k, std::memory_order_relaxed);
    if (front == b.size()) {
      if (spare.size() < 2) spare.push_back(std::move(b));
      blocks.pop_front();
      front = 0;
    }
  }
  return got;
}

namespace {

/// A URL's scheme, host and port ("http://host:8080"): what servers are remembered by.
std::string origin_of(const std::string& url) {
  const auto scheme = url.find("://");
  return url.substr(0, url.find('/', scheme == std::string::npos ? 0 : scheme + 3));
}

/// `line` lower-cased, for matching header names.
std::string lower(std::string_view line) {
  std::string out(line);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

/// A multi-range answer's Content-Type: its boundary, or "" (not multipart/byteranges).
std::string byteranges_boundary(std::string_view line) {
  const std::string low = lower(line);
  if (low.rfind("content-type:", 0) != 0 || low.find("multipart/byteranges") == std::string::npos) {
    return "";
  }
  const auto at = low.find("boundary=");
  if (at == std::string::npos) return "";
  std::string_view b = line.substr(at + 9);
  while (!b.empty() && (b.back() == '\r' || b.back() == '\n' || b.back() == ' ')) b.remove_suffix(1);
  if (const auto semi = b.find(';'); semi != std::string_view::npos) b = b.substr(0, semi);
  if (b.size() >= 2 && b.front() == '"' && b.back() == '"') b = b.substr(1, b.size() - 2);
  return std::string(b);
}

/// The value of header `line` if it is header `name` (lower case, with its colon), trimmed;
/// nullopt when it is another header.
std::optional<std::string> header_value(std::string_view line, std::string_view name) {
  if (line.size() < name.size() || lower(line.substr(0, name.size())) != name) return std::nullopt;
  std::string_view v = line.substr(name.size());
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  return std::string(v);
}

/// A Content-Range value (a header's or a multipart part's, lower case) "bytes FIRST-LAST/TOTAL"
/// or, the whole length unknown, "bytes FIRST-LAST/*"; nullopt for another form or LAST before
/// FIRST.
struct ContentRange {
  std::uint64_t first, last;
  std::optional<std::uint64_t> total;
};
std::optional<ContentRange> parse_content_range(const std::string& value) {
  unsigned long long a = 0, b = 0, total = 0;
  int star = -1;
  const int got = std::sscanf(value.c_str(), " bytes %llu-%llu/%llu", &a, &b, &total);
  if (got == 2) std::sscanf(value.c_str(), " bytes %*u-%*u/*%n", &star);
  if ((got != 3 && star < 0) || b < a) return std::nullopt;
  return ContentRange{a, b, got == 3 ? std::optional<std::uint64_t>(total) : std::nullopt};
}

/// What a callback that threw (bad_alloc, mostly) leaves for finished(): the transfer fails at
/// once with it, rather than the exception unwinding through libcurl's C frames.
void fail_in_callback(BodyStream::Transfer& t, const char* which) noexcept {
  try {
    try {
      throw;
    } catch (const std::exception& e) {
      t.fatal = std::string(which) + " failed: " + e.what();
    } catch (...) {
      t.fatal = std::string(which) + " failed";
    }
  } catch (...) {
    t.fatal = "out of memory";  // short enough for the string's own buffer
  }
}

std::size_t on_header_of(char* p, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<BodyStream::Transfer*>(user);
  std::string_view line(p, size * n);
  if (line.starts_with("HTTP/")) {
    t->response_etag.clear();  // a new response (after a redirect or a 100): its own headers
    t->response_modified.clear();
    t->range_start = t->range_last = t->range_total = t->unsatisfied_total = -1;
  } else if (auto v = header_value(line, "etag:")) {
    t->response_etag = std::move(*v);
  } else if (auto m = header_value(line, "last-modified:")) {
    t->response_modified = std::move(*m);
  }
  if (t->scatter) {
    if (line.starts_with("HTTP/")) {
      t->scatter->boundary.clear();  // a new response (after a redirect): its own headers
    } else if (std::string b = byteranges_boundary(line); !b.empty()) {
      t->scatter->boundary = std::move(b);
    }
  }
  if (auto v = header_value(line, "content-range:")) {
    const std::string value = lower(*v);
    unsigned long long total = 0;
    if (const auto r = parse_content_range(value)) {
      t->range_start = static_cast<std::int64_t>(r->first);
      t->range_last = static_cast<std::int64_t>(r->last);
      t->range_total = r->total ? static_cast<std::int64_t>(*r->total) : -1;
    } else if (std::sscanf(value.c_str(), " bytes */%llu", &total) == 1) {
      t->unsatisfied_total = static_cast<std::int64_t>(total);
    }
  }
  return size * n;
}

/// Writes `n` bytes that are bytes [at, at + n) of the URL into the parts they belong to.
/// A part takes only bytes that continue it: a gap leaves it short, for the caller to fetch.
void scatter_write(ScatterState& s, std::uint64_t at, const char* p, std::size_t n) {
  auto it = std::upper_bound(s.parts.begin(), s.parts.end(), at,
                             [](std::uint64_t v, const RangePart& r) { return v < r.end; });
  for (; it != s.parts.end() && it->begin < at + n; ++it) {
    std::uint64_t& filled = s.filled[static_cast<std::size_t>(it - s.parts.begin())];
    const std::uint64_t next = it->begin + filled;
    const std::uint64_t to = std::min<std::uint64_t>(at + n, it->end);
    if (at > next || next >= to) continue;
    std::memcpy(it->dst + filled, p + (next - at), static_cast<std::size_t>(to - next));
    filled += to - next;
  }
}

/// One part's header block of a multipart/byteranges body, up to its blank line: the part's
/// first byte and size from its Content-Range, or false when it is not one of ours.
bool parse_part_head(const ScatterState& s, std::string_view head, std::uint64_t size,
                     std::uint64_t* first, std::uint64_t* count) {
  if (head.find("--" + s.boundary) == std::string_view::npos) return false;
  const std::string low = lower(head);
  const auto at = low.find("content-range:");
  if (at == std::string::npos) return false;
  const auto r = parse_content_range(low.substr(at + 14, 80));
  if (!r) return false;
  if (size && r->total != size) return false;  // changed since indexed: the caller's GET says so
  *first = r->first;
  *count = r->last - r->first + 1;
  return true;
}

/// Whether the bytes after the last part taken (`after`: the next header block, or what came of
/// the closing delimiter) begin with the delimiter, as they must when the part was as long as
/// its Content-Range said. Before the first part, a preamble may come first.
bool part_delimited(const ScatterState& s, std::string_view after) {
  return s.parts_taken == 0 || after.starts_with("\r\n--" + s.boundary);
}

/// The last part taken gives back what it was given: it was shorter than its Content-Range
/// said, so the delimiter and the next part's headers were taken in its place (the caller
/// fetches it again).
void drop_undelimited_part(ScatterState& s) {
  if (s.parts_taken > 0) s.filled = s.before;
}

/// on_body for get_ranges_async: the answer's parts scattered to the caller's memory. Any
/// answer it cannot use ends the transfer (the caller fetches what is missing).
std::size_t on_scatter(BodyStream::Transfer& t, const char* p, std::size_t bytes) {
  constexpr std::size_t head_limit = 16 << 10;  // a part's headers: a few lines
  ScatterState& s = *t.scatter;
  if (!t.checked) {
    t.checked = true;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &t.status);
    if (t.status == 200) {
      // Several ranges answered with the whole body: this server is asked one range a GET.
      const std::string origin = origin_of(t.url);
      std::lock_guard lock(t.driver->origins_mutex);
      if (std::find(t.driver->whole_body_origins.begin(), t.driver->whole_body_origins.end(),
                    origin) == t.driver->whole_body_origins.end()) {
        t.driver->whole_body_origins.push_back(origin);
      }
      return 0;
    }
    if (t.status != 206) return 0;
    if (!s.boundary.empty()) {
      s.multipart = true;
    } else if (t.range_start >= 0 &&
               (!t.size || (t.range_total >= 0 &&
                            static_cast<std::uint64_t>(t.range_total) == t.size))) {
      s.offset = static_cast<std::uint64_t>(t.range_start);  // one range over all the parts
      s.left = to_end;
    } else {
      return 0;
    }
  }
  std::lock_guard lock(t.mutex);
  if (t.cancelled) return 0;  // the parts' memory may be gone
  std::size_t i = 0;
  while (i < bytes) {
    if (s.left > 0) {
      const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - i, s.left));
      scatter_write(s, s.offset, p + i, k);
      s.offset += k;
      if (s.left != to_end) s.left -= k;
      i += k;
      continue;
    }
    // Between parts: "\r\n--boundary\r\n" and the part's headers, up to a blank line.
    const std::size_t had = s.head.size();
    const std::size_t k = std::min(bytes - i, head_limit - had);
    s.head.append(p + i, k);
    const auto blank = s.head.find("\r\n\r\n", had >= 3 ? had - 3 : 0);
    if (blank == std::string::npos) {
      if (s.head.size() >= head_limit) {
        if (!part_delimited(s, s.head)) drop_undelimited_part(s);
        return 0;
      }
      i += k;  // the closing boundary ends here too: it has no blank line
      continue;
    }
    i += blank + 4 - had;
    const std::string_view head = std::string_view(s.head).substr(0, blank);
    if (!part_delimited(s, head)) {
      drop_undelimited_part(s);
      return 0;
    }
    std::uint64_t first = 0, count = 0;
    if (!parse_part_head(s, head, t.size, &first, &count)) return 0;
    s.before = s.filled;
    ++s.parts_taken;
    s.offset = first;
    s.left = count;
    s.head.clear();
  }
  return bytes;
}

/// A final answer that is not the object's bytes: a redirect curl could not follow (no
/// Location: S3's answer from another region than the bucket's), or another status outside
/// 2xx below 400 (4xx and 5xx fail by their status, in finished()). Sets `fatal`.
bool not_a_body(BodyStream::Transfer& t) {
  if (t.status >= 200 && t.status < 300) return false;
  t.fatal = "the server answered HTTP " + std::to_string(t.status) +
            (t.status >= 300 && t.status < 400 ? " with no Location to follow" : "") +
            ", not the object";
  return true;
}

/// A response's first body bytes: true when they are of the version whose bytes were taken
/// before, or when nothing was taken yet (the response's version is then the transfer's). Else
/// `fatal` says how the object changed: resuming would join two versions' bytes.
bool same_version(BodyStream::Transfer& t) {
  if (t.reached == t.begin && !t.pinned) {
    t.etag = t.response_etag;
    t.modified = t.response_modified;
    return true;
  }
  // Each validator both responses carry is compared: a weak ETag may stay the same over a
  // change that Last-Modified shows.
  const auto differ = [&](const std::string& before, const std::string& now, const char* name) {
    if (before.empty() || now.empty() || before == now) return false;
    t.fatal = std::string("it changed while it was read (") + name + " " + before +
              " before byte " + std::to_string(t.reached) + ", " + now + " now)";
    return true;
  };
  return !differ(t.etag, t.response_etag, "ETag") &&
         !differ(t.modified, t.response_modified, "Last-Modified");
}

/// The most of an error answer's body kept: an S3 <Error> is a few hundred bytes.
constexpr std::size_t error_body_limit = 4 << 10;

/// What an error answer's body says, where it is an S3-style <Error> (S3, MinIO, GCS's XML
/// API, R2, a presigned URL's): its Code and its Message, XML's five entities and ASCII
/// character references decoded (MinIO writes ' as &#39;), control bytes as spaces, each
/// bounded. Empty where it has no <Code>.
struct ServerError {
  std::string code, message;
};

ServerError server_error(std::string_view body) {
  const auto element = [&](std::string_view name) {
    const std::string open = "<" + std::string(name) + ">", close = "</" + std::string(name) + ">";
    const auto a = body.find(open);
    if (a == std::string_view::npos) return std::string();
    const auto from = a + open.size();
    const auto b = body.find(close, from);
    // A body cut at error_body_limit may end inside the element: what came of it.
    const std::string_view raw = body.substr(from, b == std::string_view::npos ? b : b - from);
    constexpr std::size_t most = 300;  // AWS's AccessDenied names the policy's principal
    std::string out;
    std::size_t i = 0;
    for (; i < raw.size() && out.size() < most; ++i) {
      static constexpr std::pair<std::string_view, char> entities[] = {
          {"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&apos;", '\''}};
      bool decoded = false;
      for (const auto& [entity, ch] : entities) {
        if (raw.substr(i, entity.size()) == entity) {
          out += ch;
          i += entity.size() - 1;
          decoded = true;
          break;
        }
      }
      if (!decoded && raw.substr(i, 2) == "&#") {
        const bool hex = raw.substr(i + 2, 1) == "x";
        const auto digits = i + 2 + (hex ? 1 : 0);
        unsigned value = 0;
        const auto [end, ec] = std::from_chars(raw.data() + digits, raw.data() + raw.size(),
                                               value, hex ? 16 : 10);
        if (ec == std::errc() && end < raw.data() + raw.size() && *end == ';' &&
            value >= 0x20 && value < 0x7f) {
          out += static_cast<char>(value);
          i = static_cast<std::size_t>(end - raw.data());
          decoded = true;
        }
      }
      if (decoded) continue;
      const auto c = static_cast<unsigned char>(raw[i]);
      if (c < 0x80) {
        out += c < 0x20 || c == 0x7f ? ' ' : raw[i];
        continue;
      }
      // UTF-8 whole characters only (the message becomes a Python str): a byte that begins
      // none (Latin-1 text) is '?', and a character the bound would cut is left out.
      const std::size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                              : c >= 0xe0 && c <= 0xef ? 3
                              : c >= 0xf0 && c <= 0xf4 ? 4
                                                       : 0;
      bool whole = len > 0 && i + len <= raw.size();
      for (std::size_t k = 1; whole && k < len; ++k) {
        whole = (static_cast<unsigned char>(raw[i + k]) & 0xc0) == 0x80;
      }
      if (!whole) {
        out += '?';
      } else if (out.size() + len > most) {
        break;
      } else {
        out.append(raw.substr(i, len));
        i += len - 1;
      }
    }
    if (i < raw.size()) out += "...";
    return out;
  };
  ServerError e{element("Code"), element("Message")};
  if (e.code.empty()) e.message.clear();
  return e;
}

/// A response's status, range, length and version, checked before its first body byte is
/// taken: false (and `fatal` set) when it cannot be used.
bool usable_response(BodyStream::Transfer& t, bool http) {
  if (http && not_a_body(t)) return false;
  if (http && t.status == 206) {
    if (t.range_start != static_cast<std::int64_t>(t.reached)) {
      t.fatal =
          "asked for bytes from " + std::to_string(t.reached) +
          (t.range_start < 0 ? ", the server's 206 has no Content-Range it can use"
                             : ", the server sent a range from " + std::to_string(t.range_start));
      return false;
    }
    if (t.size && t.range_total < 0) {
      // Nothing checks the index against the shard (nor an index's claimed sizes before
      // they are allocated): refused.
      t.fatal =
          "the server's 206 does not say the whole size (Content-Range bytes N-M/*), "
          "so the index's " +
          std::to_string(t.size) + " bytes cannot be checked";
      return false;
    }
    if (t.size && static_cast<std::uint64_t>(t.range_total) != t.size) {
      t.fatal = "the server has " + std::to_string(t.range_total) +
                " bytes, the index was made of " + std::to_string(t.size) +
                " (the shard changed since it was indexed)";
      return false;
    }
  } else if (http) {
    // A 200 sends the whole body from its start (a server that ignores Range): its length
    // must be the index's, or nothing checked the index (nor its claimed sizes).
    curl_off_t length = -1;
    curl_easy_getinfo(t.easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    if (t.size && static_cast<std::uint64_t>(length) != t.size) {
      t.fatal = length < 0 ? "the server's " + std::to_string(t.status) +
                                 " does not say its length, so the index's " +
                                 std::to_string(t.size) + " bytes cannot be checked"
                           : "the server has " + std::to_string(length) +
                                 " bytes, the index was made of " + std::to_string(t.size) +
                                 " (the shard changed since it was indexed)";
      return false;
    }
    t.skip = t.reached;
  }
  return !http || same_version(t);
}

std::size_t on_header(char* p, std::size_t size, std::size_t n, void* user) {
  try {
    return on_header_of(p, size, n, user);
  } catch (...) {
    fail_in_callback(*static_cast<BodyStream::Transfer*>(user), "reading a response header");
    return 0;
  }
}

std::size_t on_body_of(char* p, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<BodyStream::Transfer*>(user);
  const std::size_t bytes = size * n;
  if (t->scatter) return on_scatter(*t, p, bytes);
  if (!t->checked) {
    t->checked = true;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    const bool http = scheme_of(t->url) != Scheme::file;  // s3:// is HTTP too
    // An error's body says why (an S3 <Error>): kept, bounded, and never taken as the object.
    t->error_answer = http && t->status >= 400;
    if (!t->error_answer && !usable_response(*t, http)) return 0;
  }
  if (t->error_answer) {
    const std::size_t k = std::min(bytes, error_body_limit - t->error_body.size());
    t->error_body.append(p, k);
    // Read no further than the bound, nor past the <Error>'s end where more is to come than a
    // line's end (its Content-Length says so, or it has none): a body whose end never comes (a
    // proxy's answer that hangs) would cost the stall timeout. finished() sees the status.
    if (t->error_body.find("</Error>") != std::string::npos) {
      curl_off_t length = -1;
      curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      if (length < 0 || static_cast<std::uint64_t>(length) > t->error_body.size() + 2) return 0;
    }
    return k == bytes ? bytes : 0;
  }
  {
    std::lock_guard lock(t->mutex);
    if (t->cancelled) return 0;
    if (t->window && t->buffered >= t->window) {
      t->paused = true;
      return CURL_WRITEFUNC_PAUSE;  // libcurl keeps these bytes and gives them again on resume
    }
  }
  std::size_t used = static_cast<std::size_t>(std::min<std::uint64_t>(t->skip, bytes));
  t->skip -= used;
  const std::size_t take =
      static_cast<std::size_t>(std::min<std::uint64_t>(bytes - used, t->end - t->reached));
  if (take > 0) {
    if (t->reached + take > t->limit) {
      t->fatal = "the body is larger than " + std::to_string(t->limit) + " bytes";
      return 0;
    }
    {
      std::lock_guard lock(t->mutex);
      // Checked under the same lock as the copy: a cancelled get_range's memory may be gone,
      // and a stream let go of has given back the count of the bytes it held.
      if (t->cancelled) return 0;
      if (t->sink) {
        std::memcpy(t->sink + (t->reached - t->begin), p + used, take);
        t->buffered += take;
      } else {
        t->append(reinterpret_cast<const std::byte*>(p + used), take);
      }
      t->wake_locked(false);
    }
    t->reached += take;
    t->arrived.notify_all();
  }
  // Bytes past the range wanted (a 200 to a Range: the whole body comes): stop here, and
  // finished() sees the range complete. A 206 ends with the range itself: its last bytes are
  // taken whole, so the transfer ends cleanly and curl keeps the connection for the next
  // request (stopping it there aborted it, and each ranged GET paid a new connection).
  return bytes - used > take ? 0 : bytes;
}

std::size_t on_body(char* p, std::size_t size, std::size_t n, void* user) {
  try {
    return on_body_of(p, size, n, user);
  } catch (...) {
    fail_in_callback(*static_cast<BodyStream::Transfer*>(user), "receiving the body");
    return 0;
  }
}

/// `code`: an S3-style error's Code. S3 answers a request it gave up waiting on with 400
/// RequestTimeout, and throttles some APIs with 400 codes; both pass, as botocore retries them.
bool retryable(CURLcode result, long status, std::string_view code) {
  switch (result) {
    case CURLE_HTTP_RETURNED_ERROR:
      return status == 408 || status == 429 || status >= 500 || code == "RequestTimeout" ||
             code == "SlowDown" || code.find("Throttl") != std::string_view::npos;
    case CURLE_OK:  // a body shorter than asked for (a Content-Length that lied)
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

void HttpClient::Driver::launch(const std::shared_ptr<BodyStream::Transfer>& t) {
  CURL* easy = nullptr;
  if (!idle.empty()) {
    easy = idle.back();  // reset when it was put back
    idle.pop_back();
  } else {
    easy = curl_easy_init();
  }
  if (!easy) {
    fail(*t, "cannot read '" + t->url + "': curl_easy_init failed");
    return;
  }
  t->easy = easy;
  t->attempt_start = t->reached;
  t->skip = 0;
  t->range_start = t->range_last = t->range_total = t->unsatisfied_total = -1;
  t->checked = false;
  t->status = 0;
  t->fatal.clear();
  t->error_body.clear();
  t->error_answer = false;
  t->errbuf[0] = '\0';
  ++t->attempts;
  if (scheme_of(t->url) == Scheme::s3) {
    // Signed with SigV4 by libcurl itself; the payload hash header S3 requires is the hash of
    // the empty body of a GET. Without credentials the request goes unsigned (a public bucket).
    const S3Target s3 = resolve_s3(t->url);
    curl_easy_setopt(easy, CURLOPT_URL, s3.url.c_str());
    curl_easy_setopt(easy, CURLOPT_PATH_AS_IS, 1L);  // a key's "./" and "../" are its own
    if (!s3.sigv4.empty()) {
      curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, s3.sigv4.c_str());
      curl_easy_setopt(easy, CURLOPT_USERPWD, s3.userpwd.c_str());
      t->headers = curl_slist_append(
          t->headers, "x-amz-content-sha256: "
                      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
      if (!s3.token.empty()) {
        t->headers = curl_slist_append(t->headers, ("x-amz-security-token: " + s3.token).c_str());
      }
    }
  } else {
    curl_easy_setopt(easy, CURLOPT_URL, t->url.c_str());
  }
  if (const auto [name, file] = ca_bundle(t->url); name) {
    curl_easy_setopt(easy, CURLOPT_CAINFO, file.c_str());  // copied by curl
    // Those alone: Debian's libcurl also looks in /etc/ssl/certs (its CA path) by default.
    curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
  }
  // A resumed body asks for the rest of the version it began with: a server whose object
  // changed answers the whole new one (200), which same_version() refuses. RFC 9110 lets a
  // client send neither a weak ETag there nor a date when it has an ETag: with a weak one,
  // none is sent, and same_version() alone compares the validators.
  t->response_etag.clear();
  t->response_modified.clear();
  if (!t->scatter && (t->reached > t->begin || t->pinned)) {
    const std::string& v = !t->etag.empty() ? t->etag : t->modified;
    if (!v.empty() && !v.starts_with("W/")) {
      t->headers = curl_slist_append(t->headers, ("If-Range: " + v).c_str());
    }
  }
  if (t->headers) curl_easy_setopt(easy, CURLOPT_HTTPHEADER, t->headers);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, t.get());
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, this);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, t->errbuf);
  // Not CURLOPT_FAILONERROR: an error's body is read (on_body keeps its first bytes) for what
  // it says; finished() fails the answer by its status.
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
  // Debian's libcurl 7.88 follows without end (the limit of 30 came in 8.3), and to ftp://: a
  // server redirecting to itself would be asked again until the stall timeout, then retried.
  // CURLE_TOO_MANY_REDIRECTS is not retryable: it fails at once, naming the URL.
  curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, 256L << 10);
  // A windowed stream over HTTP/1.1: a paused HTTP/2 stream may go on receiving up to its
  // flow-control window inside libcurl (MiBs a stream, outside read_ahead_bytes()), where a
  // paused HTTP/1.1 transfer stops reading its socket.
  if (t->window) curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long{CURL_HTTP_VERSION_1_1});
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(t->retry.connect_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME, static_cast<long>(t->retry.stall.count()));
  // Identity encoding: byte offsets are offsets of the file itself.
  curl_easy_setopt(easy, CURLOPT_HTTP_CONTENT_DECODING, 0L);
  std::string range;
  if (t->scatter) {
    range = t->scatter->ranges;
  } else if (t->end != to_end) {
    range = std::to_string(t->reached) + "-" + std::to_string(t->end - 1);
  } else if (t->reached > 0) {
    range = std::to_string(t->reached) + "-";
  }
  if (!range.empty()) curl_easy_setopt(easy, CURLOPT_RANGE, range.c_str());  // copied by curl
  running.emplace(easy, t);
  curl_multi_add_handle(multi, easy);
}

void HttpClient::Driver::finished(CURL* easy, CURLcode result) {
  const auto it = running.find(easy);
  if (it == running.end()) return;
  std::shared_ptr<BodyStream::Transfer> keep = it->second;
  BodyStream::Transfer& t = *keep;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &t.status);
  drop(t);
  bool cancelled = false;
  {
    std::lock_guard lock(t.mutex);
    cancelled = t.cancelled;
  }
  if (cancelled) return;
  if (t.scatter) {
    // One attempt: what arrived is the caller's, and it fetches the rest itself. A multipart
    // answer's last part counts once the closing delimiter after it has come: a body that ends
    // inside a part may have given it other bytes (a delimiter, the next part's headers) where
    // the server sent fewer than its Content-Range said.
    ScatterState& s = *t.scatter;
    if (s.multipart && (s.left != 0 || !part_delimited(s, s.head))) {
      std::lock_guard lock(t.mutex);
      drop_undelimited_part(s);
    }
    this->complete(t);
    return;
  }
  const bool http = scheme_of(t.url) != Scheme::file;
  // A 4xx or 5xx answer (its body kept, or cut short, or none) fails by its status, as curl's
  // FAILONERROR would have failed it.
  if (http && t.status >= 400) result = CURLE_HTTP_RETURNED_ERROR;
  // A non-2xx final answer with no body reached on_body's check: it is refused here.
  if (result == CURLE_OK && t.fatal.empty() && http) not_a_body(t);
  // To the body's end: where a 206 said the whole size, only all of it is the end (a body
  // that ends early, as its Content-Length said, is resumed).
  const bool sized = t.status == 206 && t.range_total >= 0;
  // A resumed attempt asked from the byte reached, and the server says that is its whole size
  // (416 "bytes */N"): all of it had come (a 200 whose Content-Length said more than it sent).
  const bool past_end = t.status == 416 && t.unsatisfied_total >= 0 &&
                        static_cast<std::uint64_t>(t.unsatisfied_total) == t.reached &&
                        t.reached > t.begin;
  const bool complete =
      t.end != to_end
          ? t.reached >= t.end
          : sized ? t.reached >= static_cast<std::uint64_t>(t.range_total)
                  : result == CURLE_OK || past_end;
  if (complete && t.fatal.empty()) {
    this->complete(t);
    return;
  }
  // A 206 that ended where it said, short of what was asked, having brought bytes: a server
  // that caps the bytes it answers at once. The next piece is asked for at once, costing no
  // attempt (each must bring bytes: the pieces end). Asked for a bounded range, the answer's
  // body must have reached the last byte its Content-Range named: one cut short of that is a
  // fault, retried after a backoff.
  const bool ended_where_said =
      t.range_last >= 0 && t.reached == static_cast<std::uint64_t>(t.range_last) + 1;
  const bool capped = t.end == to_end || ended_where_said;
  if (sized && capped && result == CURLE_OK && t.fatal.empty() && t.reached > t.attempt_start &&
      !closing) {
    t.failures = 0;
    launch(keep);
    return;
  }
  if (t.reached > t.attempt_start) t.failures = 0;
  ++t.failures;
  const ServerError said = server_error(t.error_body);
  std::string why;
  if (!t.fatal.empty()) {
    why = t.fatal;
  } else if (result == CURLE_HTTP_RETURNED_ERROR) {
    why = "HTTP " + std::to_string(t.status);
    if (!said.code.empty()) {
      why += " (the server says " + said.code + (said.message.empty() ? "" : ": " + said.message) +
             ")";
    }
  } else if (result == CURLE_OK) {
    why = "the body ended at byte " + std::to_string(t.reached) +
          (t.end != to_end ? " of " + std::to_string(t.end)
           : sized         ? " of " + std::to_string(t.range_total)
                           : std::string()) +
          " (HTTP " + std::to_string(t.status) + ")";
  } else {
    why = curl_easy_strerror(result);
    if (t.errbuf[0]) why += std::string(" (") + t.errbuf + ")";
    if (result == CURLE_PEER_FAILED_VERIFICATION || result == CURLE_SSL_CACERT_BADFILE) {
      // Where the trusted CAs came from, and how to name others (the failure may be another's:
      // a name the certificate does not hold, an expired one).
      const auto [name, file] = ca_bundle(t.url);
      why += name ? std::string("; the CA certificates trusted: those in '") + file + "' (" +
                        name + ")"
                  : std::string("; the CA certificates trusted: the system's (CURL_CA_BUNDLE, "
                                "or AWS_CA_BUNDLE for s3:// URLs, names a file of others)");
    }
  }
  if (scheme_of(t.url) == Scheme::s3) {
    // What was asked of whom: the endpoint and the signing come from the environment.
    const S3Target s3 = resolve_s3(t.url);
    why += " (GET " + s3.url +
           (s3.sigv4.empty() ? ", sent unsigned: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                               "are not both set)"
                             : ", signed for region " + s3.region + ")");
  }
  const std::string where = "cannot read '" + t.url + "': " + why + "; " +
                            std::to_string(t.attempts) +
                            (t.attempts == 1 ? " attempt" : " attempts") + ", at byte " +
                            std::to_string(t.reached);
  // A host name not resolved may be a resolver's passing fault (botocore retries it): one more
  // try, not the whole budget, since a resolver that times out costs up to connect_timeout a
  // try, and a mistyped name should fail soon.
  // Counted in a row: a stream's later attempt (after a reset, or a capped 206) gets its one
  // more try too.
  t.resolve_failures = result == CURLE_COULDNT_RESOLVE_HOST ? t.resolve_failures + 1 : 0;
  const bool resolve_again = t.resolve_failures == 1;
  if (!t.fatal.empty() || !(retryable(result, t.status, said.code) || resolve_again) ||
      t.failures >= t.retry.attempts) {
    fail(t, where);
    return;
  }
  // Doubled per failure in a row up to the cap (both at most an hour: no overflow).
  auto wait = t.retry.backoff;
  for (int k = 1; k < t.failures && wait < t.retry.max_backoff; ++k) wait *= 2;
  wait = std::min(wait, t.retry.max_backoff);
  const auto ms = static_cast<long long>(wait.count());
  const auto drawn = std::uniform_int_distribution<long long>(ms / 2, std::max(ms, 1LL))(jitter);
  t.backoff = std::make_unique<asio::steady_timer>(*ctx, std::chrono::milliseconds(drawn));
  waiting.push_back(keep);
  t.backoff->async_wait([this, w = std::weak_ptr(keep)](const asio::error_code& ec) {
    // Cancelled (the reader let go, or the client closed) ends the wait with an error; the
    // transfer is then no longer waiting.
    const auto t = w.lock();
    if (ec || !t || closing) return;
    // Fired, then cancelled before this ran (the reader let go): not waiting any more.
    if (std::erase(waiting, t) == 0) return;
    t->backoff.reset();
    launch(t);
  });
}

std::shared_ptr<BodyStream::Transfer> HttpClient::start(const std::string& url,
                                                        std::uint64_t begin, std::uint64_t end,
                                                        std::size_t window, std::uint64_t size,
                                                        const RetryOptions& retry,
                                                        std::uint64_t limit, std::byte* sink) {
  auto t = prepare(url, begin, end, window, size, retry, limit, sink);
  launch(t);
  return t;
}

std::shared_ptr<BodyStream::Transfer> HttpClient::prepare(const std::string& url,
                                                          std::uint64_t begin, std::uint64_t end,
                                                          std::size_t window, std::uint64_t size,
                                                          const RetryOptions& retry,
                                                          std::uint64_t limit, std::byte* sink) {
  validate(retry);
  if (scheme_of(url) == Scheme::s3) check_s3_url(url);
  // Every field the loop reads is set here, before the loop can see the transfer.
  auto t = std::make_shared<BodyStream::Transfer>();
  t->driver = driver_.get();
  t->retry = retry;
  t->url = url;
  t->limit = limit;
  t->begin = t->reached = begin;
  t->end = end;
  t->window = window;
  t->size = size;
  t->sink = sink;
  return t;
}

void HttpClient::launch(const std::shared_ptr<BodyStream::Transfer>& t) {
  if (!driver_->post_start(t)) {
    t->done = t->failed = true;
    t->error_what = "cannot read '" + t->url + "': the HTTP client was closed";
  }
}

void HttpClient::blocking(const char* what) const {
  Driver& d = *driver_;
  {
    // Closed: the io_context may be gone, and nothing waits (every transfer has failed).
    std::lock_guard lock(d.mutex);
    if (d.closed) return;
  }
  // The loop runs on this very thread: waiting here would wait for ourselves. The client's own
  // loop thread too: a coroutine it resumed (outside sync_wait) runs there.
  if ((d.own == nullptr && d.ctx->get_executor().running_in_this_thread()) ||
      std::this_thread::get_id() == d.thread.get_id()) {
    throw LogicError(std::string(what) +
                     " waits for the io_context it is called on; co_await get_range_async "
                     "or BodyStream::read_async there");
  }
}

std::unique_ptr<BodyStream> HttpClient::stream(const std::string& url, std::uint64_t begin,
                                               std::uint64_t end, std::size_t window,
                                               std::uint64_t size, const RetryOptions& retry,
                                               const BodyVersion& version) {
  if (end < begin) throw InvalidArgument("HttpClient::stream: end before begin for '" + url + "'");
  auto self = shared_from_this();  // first: a client not held by a shared_ptr starts nothing
  auto t = prepare(url, begin, end, std::max<std::size_t>(window, 1), size, retry);
  t->etag = version.etag;
  t->modified = version.last_modified;
  t->pinned = !version.empty();
  launch(t);
  return std::unique_ptr<BodyStream>(new BodyStream(std::move(self), std::move(t), begin));
}

void HttpClient::get_range(const std::string& url, std::uint64_t begin, std::uint64_t end,
                           std::byte* dst, std::uint64_t size, const RetryOptions& retry) {
  if (end <= begin) return;
  blocking("HttpClient::get_range");
  // No window: a range read is wanted whole, and its reader waits for all of it; its bytes
  // go straight to dst.
  auto self = shared_from_this();  // before the transfer writes to dst
  auto t = start(url, begin, end, 0, size, retry, to_end, dst);
  BodyStream body(std::move(self), t, begin);
  finish_sink(*t, static_cast<std::size_t>(end - begin), true);
}

void HttpClient::finish_sink(BodyStream::Transfer& t, std::size_t n, bool wait) {
  std::unique_lock lock(t.mutex);
  if (wait) t.arrived.wait(lock, [&] { return t.buffered >= n || t.done; });
  if (t.buffered >= n) return;
  if (t.failed) t.rethrow();
  throw HttpError(t.url, t.status, t.attempts,
                  "cannot read '" + t.url + "': the body ended at byte " +
                      std::to_string(t.begin + t.buffered) + ", before the bytes wanted");
}

Task<void> HttpClient::get_range_async(std::string url, std::uint64_t begin, std::uint64_t end,
                                       std::byte* dst, std::uint64_t size, RetryOptions retry) {
  if (end <= begin) co_return;
  auto self = shared_from_this();  // before the transfer writes to dst
  auto t = start(url, begin, end, 0, size, retry, to_end, dst);  // straight to dst
  // Destroyed early (the fetch was dropped), it cancels the transfer and withdraws the wait.
  BodyStream body(std::move(self), t, begin);
  const auto n = static_cast<std::size_t>(end - begin);
  co_await body.wait_for(n);  // no window: done when all of it is here
  finish_sink(*t, n, false);  // or the error, or the body's early end
}

Task<std::vector<std::uint64_t>> HttpClient::get_ranges_async(std::string url,
                                                              std::vector<RangePart> parts,
                                                              std::uint64_t size, std::uint64_t gap,
                                                              RetryOptions retry) {
  std::vector<std::uint64_t> filled(parts.size(), 0);
  auto s = std::make_unique<ScatterState>();
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].end > parts[k].begin) s->slot.push_back(k);
  }
  std::sort(s->slot.begin(), s->slot.end(),
            [&](std::size_t a, std::size_t b) { return parts[a].begin < parts[b].begin; });
  for (const std::size_t k : s->slot) {
    if (!s->parts.empty() && parts[k].begin < s->parts.back().end) {
      throw InvalidArgument("HttpClient::get_ranges_async: the ranges of '" + url +
                            "' overlap at byte " + std::to_string(parts[k].begin));
    }
    s->parts.push_back(parts[k]);
  }
  const Scheme scheme = scheme_of(url);
  const bool http = scheme == Scheme::http || scheme == Scheme::https;
  if (s->parts.empty() || !http) co_return filled;
  {
    const std::string origin = origin_of(url);
    std::lock_guard lock(driver_->origins_mutex);
    const auto& whole = driver_->whole_body_origins;
    if (std::find(whole.begin(), whole.end(), origin) != whole.end()) co_return filled;
  }
  // Neighbours at most `gap` apart are one range: the bytes between come along, dropped.
  std::uint64_t run_begin = s->parts.front().begin, run_end = s->parts.front().end;
  const auto add_run = [&] {
    if (!s->ranges.empty()) s->ranges += ',';
    s->ranges += std::to_string(run_begin) + "-" + std::to_string(run_end - 1);
  };
  for (const RangePart& r : s->parts) {
    if (r.begin > run_end && r.begin - run_end > gap) {  // (run_end + gap may wrap)
      add_run();
      run_begin = r.begin;
    }
    run_end = std::max(run_end, r.end);
  }
  add_run();
  s->filled.assign(s->parts.size(), 0);
  auto self = shared_from_this();  // before the transfer writes to the parts
  auto t = prepare(url, 0, to_end, 0, size, retry);
  t->scatter = std::move(s);
  launch(t);
  // Destroyed early (the batch was dropped), it cancels the transfer and withdraws the wait.
  BodyStream body(std::move(self), t, 0);
  co_await body.wait_for(std::numeric_limits<std::size_t>::max());  // until it is done
  std::lock_guard lock(t->mutex);
  const ScatterState& done = *t->scatter;
  for (std::size_t i = 0; i < done.parts.size(); ++i) filled[done.slot[i]] = done.filled[i];
  co_return filled;
}

std::string HttpClient::get(const std::string& url, std::uint64_t limit,
                            const RetryOptions& retry) {
  blocking("HttpClient::get");
  auto self = shared_from_this();
  auto t = start(url, 0, to_end, 0, 0, retry, limit);
  BodyStream body(std::move(self), t, 0);
  std::unique_lock lock(t->mutex);
  t->arrived.wait(lock, [&] { return t->done; });
  if (t->failed) t->rethrow();
  std::string out(t->buffered, '\0');
  t->take(reinterpret_cast<std::byte*>(out.data()), out.size());
  return out;
}

namespace {

// Lets a paused transfer receive again. On the loop's thread: curl_easy_pause may deliver the
// bytes it held at once.
void unpause(const std::shared_ptr<BodyStream::Transfer>& t) {
  auto* d = t->driver;
  d->post([d, t] {
    if (!t->easy) return;
    // The bytes curl held back go to on_body inside this call. Where on_body refuses them (a
    // 200 to a Range whose held chunk runs past the range's end, or a cancelled transfer),
    // curl returns the error from here, not through curl_multi_info_read, and an unpause
    // that fails does not ask curl's loop to look at the transfer again (it schedules the
    // handle only on success). Debian's 7.88 still ended such transfers on its next look at
    // their socket; this ends them here, whatever curl then does.
    const CURLcode rc = curl_easy_pause(t->easy, CURLPAUSE_CONT);
    if (rc != CURLE_OK) d->finished(t->easy, rc);
  });
}

}  // namespace

BodyStream::BodyStream(std::shared_ptr<HttpClient> client, std::shared_ptr<Transfer> transfer,
                       std::uint64_t begin)
    : client_(std::move(client)), transfer_(std::move(transfer)), position_(begin) {}

BodyStream::~BodyStream() {
  {
    std::lock_guard lock(transfer_->mutex);
    // A coroutine reading it is going away (get_range_async's frame): neither a wait nor a
    // posted resumption may reach it now.
    transfer_->waiter = nullptr;
    transfer_->resuming = nullptr;
    HttpClient::Driver* d = client_->driver_.get();
    // The bytes it still held are no longer held for a reader (freed with the transfer).
    if (!transfer_->sink) d->held.fetch_sub(transfer_->buffered, std::memory_order_relaxed);
    transfer_->buffered = 0;
    if (transfer_->done) return;
    transfer_->cancelled = true;
  }
  HttpClient::Driver* d = client_->driver_.get();
  d->post([d, t = transfer_] { d->cancel(t); });
}

void BodyStream::cancel() {
  HttpClient::Driver* d = client_->driver_.get();
  // On the loop: the transfer leaves curl (or its backoff wait), and fails as any failure
  // does, waking a reader. A client closed meanwhile has failed it already.
  d->post([d, t = transfer_] {
    {
      std::lock_guard lock(t->mutex);
      if (t->done) return;
    }
    d->cancel(t);
    d->fail(*t, "cannot read '" + t->url + "': cancelled");
  });
}

namespace {

// A read past the body's end: its transfer ended whole (not failed), so its status and
// attempts are final, written by the loop before it set `done` under the mutex taken here.
HttpError ended_before_wanted(BodyStream::Transfer& t, std::uint64_t position) {
  long status = 0;
  int attempts = 0;
  {
    std::lock_guard lock(t.mutex);
    if (t.done) {
      status = t.status;
      attempts = t.attempts;
    }
  }
  return HttpError(t.url, status, attempts,
                   "cannot read '" + t.url + "': the body ended at byte " +
                       std::to_string(position) + ", before the bytes wanted (HTTP " +
                       std::to_string(status) + ", " + std::to_string(attempts) +
                       (attempts == 1 ? " attempt)" : " attempts)"));
}

}  // namespace

void BodyStream::read(std::byte* dst, std::size_t n) {
  if (read_up_to(dst, n) != n) throw ended_before_wanted(*transfer_, position_);
}

std::size_t BodyStream::take(std::byte* dst, std::size_t n, bool wait) {
  Transfer& t = *transfer_;
  std::size_t got = 0;
  bool resume = false;
  {
    std::unique_lock lock(t.mutex);
    if (wait && t.buffered == 0 && !t.done) {
      client_->blocking("BodyStream::read");
      t.arrived.wait(lock, [&] { return t.buffered > 0 || t.done; });
    }
    if (t.buffered == 0) {
      if (t.failed) t.rethrow();
      return 0;  // the body's end (or, without waiting, nothing yet)
    }
    got = t.take(dst, n);
    position_ += got;
    if (t.paused && t.buffered <= t.window / 2) {
      t.paused = false;
      resume = true;
    }
  }
  if (resume) unpause(transfer_);
  return got;
}

std::size_t BodyStream::read_up_to(std::byte* dst, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    const std::size_t got = take(dst ? dst + done : nullptr, n - done, true);
    if (got == 0) break;  // the body's end
    done += got;
  }
  return done;
}

void BodyStream::skip(std::uint64_t n) {
  while (n > 0) {
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1 << 30));
    read(nullptr, k);
    n -= k;
  }
}

const std::string& BodyStream::url() const noexcept { return transfer_->url; }

BodyVersion BodyStream::version() const {
  std::lock_guard lock(transfer_->mutex);
  // Once done (set under the mutex), the loop no longer writes the validators.
  if (!transfer_->done) return {};
  return {transfer_->etag, transfer_->modified};
}

std::size_t BodyStream::available() const {
  std::lock_guard lock(transfer_->mutex);
  return transfer_->buffered;
}

BodyStream::Wait BodyStream::wait_for(std::size_t n) noexcept {
  const std::size_t window = transfer_->window;  // read-only once started
  return Wait(transfer_, window ? std::min(n, window) : n);
}

bool BodyStream::Wait::await_ready() const {
  std::lock_guard lock(t_->mutex);
  return t_->done || t_->buffered >= n_;
}

bool BodyStream::Wait::await_suspend(std::coroutine_handle<> h) {
  std::lock_guard lock(t_->mutex);
  if (t_->done || t_->buffered >= n_) return false;
  t_->waiter = h;
  t_->want = n_;
  t_->resume_queue = detail::current_resume_queue;
  h_ = h;
  // A transfer pauses once it holds `window` bytes, and a reader's take resumes it once fewer
  // than half are left; a wait for more than it holds (at most `window`) between the two would
  // wait for bytes that never come. So the wait resumes it. Posted under the lock: until it is
  // let go, nothing resumes this coroutine, so its BodyStream, and the client with the loop
  // it posts to, are still there. (post takes the driver's lock, and no holder of that lock
  // takes a transfer's.)
  if (t_->paused) {
    t_->paused = false;
    unpause(t_);
  }
  return true;
}

BodyStream::Wait::~Wait() {
  if (!h_) return;
  std::lock_guard lock(t_->mutex);
  if (t_->waiter == h_) t_->waiter = nullptr;
  if (t_->resuming == h_) t_->resuming = nullptr;
}

Task<std::size_t> BodyStream::read_async(std::byte* dst, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    co_await wait_for(n - done);
    const std::size_t got = take(dst ? dst + done : nullptr, n - done, false);
    if (got == 0) break;  // the body's end
    done += got;
  }
  co_return done;
}

Task<void> BodyStream::skip_async(std::uint64_t n) {
  while (n > 0) {
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1 << 30));
    if (co_await read_async(nullptr, k) != k) throw ended_before_wanted(*transfer_, position_);
    n -= k;
  }
}

}  // namespace coload::io
