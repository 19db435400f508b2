// HttpClient's loop: libcurl's multi_socket interface on an asio::io_context. curl says which
// sockets it waits on (CURLMOPT_SOCKETFUNCTION) and when it wants to be called regardless
// (CURLMOPT_TIMERFUNCTION); the io_context waits on those sockets and that timer beside the
// loader's other work, and calls curl_multi_socket_action when one is ready. So the transfers of
// a loader need no thread of their own: they run on its driver, as io_uring's completions do.

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include "coload/io/http.hpp"
#include "http_detail.hpp"

namespace coload::io {

namespace {

using Driver = HttpClient::Driver;

int on_socket(CURL*, curl_socket_t fd, int what, void* user, void*) {
  auto* d = static_cast<Driver*>(user);
  if (what == CURL_POLL_REMOVE) {
    const auto it = d->sockets.find(fd);
    if (it != d->sockets.end()) {
      it->second->gone = true;
      it->second->sd.release();  // ends its waits; curl closes the socket itself
      d->sockets.erase(it);
    }
    return 0;
  }
  try {
    auto& s = d->sockets[fd];
    if (!s) s = std::make_shared<Driver::Socket>(*d->ctx, fd);
    s->want = what;
    d->arm(s);
  } catch (...) {
    // No watch to be had (epoll_ctl's ENOSPC or ENOMEM, bad_alloc): not unwound through
    // libcurl, nor told with -1 (which marks the whole multi handle dead, every transfer
    // aborted for good). The transfer sees no readiness and ends by its stall timeout, retried
    // as one. The socket stays curl's (released, not closed), and no null entry is left for
    // close_socket to find.
    if (const auto it = d->sockets.find(fd); it != d->sockets.end()) {
      if (it->second) {
        it->second->gone = true;
        it->second->sd.release();
      }
      d->sockets.erase(it);
    }
  }
  return 0;
}

}  // namespace

// curl closes its sockets through here (CURLOPT_CLOSESOCKETFUNCTION), so that the io_context
// lets go of one while its number is still its own. curl may report a socket gone
// (CURL_POLL_REMOVE) only after closing it, and by then the number may name another file
// (an io_uring eventfd on the same io_context, whose wait that deregistration would drop).
int close_socket(void* user, curl_socket_t fd) {
  auto* d = static_cast<Driver*>(user);
  const auto it = d->sockets.find(fd);
  if (it != d->sockets.end()) {
    it->second->gone = true;
    it->second->sd.release();
    d->sockets.erase(it);
  }
  return ::close(fd);
}

namespace {

int on_timer_of(CURLM*, long ms, void* user) {
  auto* d = static_cast<Driver*>(user);
  if (!d->timer) return 0;  // closing
  d->timer->cancel();
  if (ms < 0) return 0;
  // Even a timeout of 0 waits for a handler of its own: curl must not be called back from
  // inside this callback. It is a post, not the timer: curl asks for 0 for every GET added,
  // and arming the timer re-programs the reactor's timerfd each time (18% of the driver's CPU
  // in the train rows over nginx). A timeout above 0 moves the timer each time curl tells
  // one: curl tells a timeout only when it changes and counts on a call at the last one (a
  // timer kept armed for an earlier one, which calls curl early, slowed streams fourfold).
  if (ms == 0) {
    if (*d->timeout_posted == 0) {
      *d->timeout_posted = 1;
      asio::post(*d->ctx, [d, posted = d->timeout_posted] {
        if (*posted < 0) return;  // the driver closed: `d` may be gone
        *posted = 0;
        if (!d->closing) d->action(CURL_SOCKET_TIMEOUT, 0);
      });
    }
    return 0;
  }
  d->timer->expires_after(std::chrono::milliseconds(ms));
  d->timer->async_wait([d](const asio::error_code& ec) {
    if (!ec && !d->closing) d->action(CURL_SOCKET_TIMEOUT, 0);
  });
  return 0;
}

int on_timer(CURLM* multi, long ms, void* user) {
  try {
    return on_timer_of(multi, ms, user);
  } catch (...) {
    // Not unwound through libcurl (a post's or the timer's bad_alloc): curl is asked again
    // at its next socket event; -1 would mark the multi handle dead.
    return 0;
  }
}

/// Whether `fd` has bytes to read now. Asio waits edge-triggered (epoll's EPOLLET): a socket
/// curl left bytes in would not be reported again until more arrive.
bool readable(curl_socket_t fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace

bool Driver::post(std::function<void()> f) {
  std::lock_guard lock(mutex);
  if (closed) return false;
  asio::post(*ctx, std::move(f));
  return true;
}

bool Driver::post_start(const std::shared_ptr<BodyStream::Transfer>& t) {
  std::lock_guard lock(mutex);
  if (closed) return false;
  starting.push_back(t);
  asio::post(*ctx, [this, t] {
    {
      std::lock_guard lock(mutex);
      std::erase(starting, t);
    }
    if (!closing) launch(t);  // else close() failed it
  });
  return true;
}

void Driver::open() {
  multi = curl_multi_init();
  if (!multi) throw RuntimeError("curl_multi_init failed");
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, on_timer);
  curl_multi_setopt(multi, CURLMOPT_TIMERDATA, this);
  // Connections kept open after use, for the next request to the same host. curl's default
  // is 4 per easy handle added *now*, so at the tail of a batch of ranged GETs, with few
  // handles left, it closed the idle ones, and the next batch connected afresh (47
  // connections for 120 GETs, at most 32 at once, in the keep-alive test). Transfers are not
  // limited per host: a reader may hold a paused transfer while it waits for another.
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 256L);
  timer = std::make_unique<asio::steady_timer>(*ctx);
  timeout_posted = std::make_shared<int>(0);
  // Each driver its own draws: clients in one process back off at different times.
  jitter.seed(static_cast<unsigned>(::getpid()) ^
              static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(this) >> 4) ^ 0x5eed);
}

void Driver::arm(const std::shared_ptr<Socket>& s) {
  if ((s->want & CURL_POLL_IN) && !s->reading) {
    s->reading = true;
    s->sd.async_wait(asio::posix::descriptor_base::wait_read,
                     [this, s](const asio::error_code& ec) {
                       s->reading = false;
                       if (ec || s->gone) return;  // released: `this` may be closing
                       action(s->fd, CURL_CSELECT_IN);
                       if (s->gone) return;
                       if ((s->want & CURL_POLL_IN) && readable(s->fd)) {
                         // Bytes left behind: no new edge will come for them.
                         s->reading = true;
                         asio::post(*ctx, [this, s] {
                           s->reading = false;
                           if (s->gone) return;
                           action(s->fd, CURL_CSELECT_IN);
                           if (!s->gone) arm(s);
                         });
                         return;
                       }
                       arm(s);
                     });
  }
  if ((s->want & CURL_POLL_OUT) && !s->writing) {
    s->writing = true;
    s->sd.async_wait(asio::posix::descriptor_base::wait_write,
                     [this, s](const asio::error_code& ec) {
                       s->writing = false;
                       if (ec || s->gone) return;
                       action(s->fd, CURL_CSELECT_OUT);
                       if (!s->gone) arm(s);
                     });
  }
}

void Driver::action(curl_socket_t fd, int flags) {
  int active = 0;
  curl_multi_socket_action(multi, fd, flags, &active);
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
    if (m->msg == CURLMSG_DONE) finished(m->easy_handle, m->data.result);
  }
}

void Driver::close() {
  std::vector<std::shared_ptr<BodyStream::Transfer>> unstarted;
  {
    std::lock_guard lock(mutex);
    closed = true;
    unstarted.swap(starting);
  }
  closing = true;
  // Whatever is still running, waiting or not started fails, so no reader waits forever. A
  // start not run yet never runs: its io_context is being destroyed, or its loop stops right
  // after this (and the handler would find `closing`).
  for (auto& t : unstarted) fail(*t, "cannot read '" + t->url + "': the HTTP client was closed");
  while (!running.empty()) {
    auto t = running.begin()->second;
    drop(*t);
    fail(*t, "cannot read '" + t->url + "': the HTTP client was closed");
  }
  for (auto& t : waiting) {
    t->backoff.reset();
    fail(*t, "cannot read '" + t->url + "': the HTTP client was closed");
  }
  waiting.clear();
  for (CURL* easy : idle) curl_easy_cleanup(easy);
  idle.clear();
  if (multi) curl_multi_cleanup(std::exchange(multi, nullptr));
  // Nothing bound to the io_context outlives this: the client may outlive the io_context.
  for (auto& [fd, s] : sockets) {
    s->gone = true;
    s->sd.release();
  }
  sockets.clear();
  timer.reset();
  *timeout_posted = -1;
}

// A transfer's ends: done (the reader woken), failed for good, or let go of.
void HttpClient::Driver::complete(BodyStream::Transfer& t) {
  {
    std::lock_guard lock(t.mutex);
    t.done = true;
    // A cancelled transfer's waiter was withdrawn with its BodyStream (the frame went away).
    t.wake_locked(true);
  }
  t.arrived.notify_all();
}

void HttpClient::Driver::fail(BodyStream::Transfer& t, const std::string& why) {
  {
    std::lock_guard lock(t.mutex);
    t.failed = true;
    t.error_status = t.status;
    t.error_attempts = t.attempts;
    t.error_what = why;
  }
  complete(t);
}

void HttpClient::Driver::drop(BodyStream::Transfer& t) {
  if (!t.easy) return;
  curl_multi_remove_handle(multi, t.easy);
  CURL* easy = std::exchange(t.easy, nullptr);
  if (!closing && idle.size() < http_detail::max_idle) {
    curl_easy_reset(easy);  // lets go of this transfer's pointers (headers, buffers, callbacks)
    idle.push_back(easy);
  } else {
    curl_easy_cleanup(easy);
  }
  curl_slist_free_all(std::exchange(t.headers, nullptr));
  running.erase(easy);  // may free t: last
}

void HttpClient::Driver::cancel(const std::shared_ptr<BodyStream::Transfer>& t) {
  drop(*t);
  t->backoff.reset();  // its wait ends as cancelled
  std::erase(waiting, t);
}

std::size_t HttpClient::read_ahead_bytes() const noexcept {
  return driver_->held.load(std::memory_order_relaxed);
}

std::size_t HttpClient::read_ahead_peak(bool reset) noexcept {
  const std::size_t peak = driver_->held_peak.load(std::memory_order_relaxed);
  if (reset) driver_->held_peak.store(read_ahead_bytes(), std::memory_order_relaxed);
  return peak;
}

/// Keeps the client of one io_context (HttpClient::on) and closes it when the io_context is
/// destroyed, before the io_context's own parts go (a service made after them is shut down
/// first). Closing fails what is in flight without resuming any waiting coroutine: nothing
/// may run on in a loop being torn down.
struct HttpClient::Service : asio::io_context::service {
  static asio::io_context::id id;
  explicit Service(asio::io_context& ctx) : asio::io_context::service(ctx) {}
  void shutdown() override {
    std::shared_ptr<HttpClient> c;
    {
      std::lock_guard lock(mutex);
      c = client;
    }
    if (c) c->driver_->close();
  }
  std::mutex mutex;  // on() may be called from any thread
  std::shared_ptr<HttpClient> client;
};

asio::io_context::id HttpClient::Service::id;

namespace {
void global_init() {
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (global != CURLE_OK) throw RuntimeError("curl_global_init failed");
}
}  // namespace

HttpClient::HttpClient() : driver_(std::make_unique<Driver>()) {
  global_init();
  Driver& d = *driver_;
  d.own = std::make_unique<asio::io_context>(1);
  d.ctx = d.own.get();
  d.open();
  d.thread = std::thread([&d] {
    {
      auto work = asio::make_work_guard(*d.ctx);
      d.ctx->run();  // until the destructor's close()
    }
    if (d.orphaned) {
      // The client went on this thread (see ~HttpClient): its driver is this thread's to free.
      d.own.reset();
      delete &d;
    }
  });
}

HttpClient::HttpClient(asio::io_context& ctx) : driver_(std::make_unique<Driver>()) {
  global_init();
  driver_->ctx = &ctx;
  driver_->open();
}

HttpClient::~HttpClient() {
  Driver& d = *driver_;
  if (!d.own) return;  // on(): closed with its io_context, by Service::shutdown
  if (std::this_thread::get_id() == d.thread.get_id()) {
    // The last owner let go on the loop's own thread (a coroutine the loop resumed dropped
    // its stream): the thread cannot join itself. It closes now, leaves its loop once this
    // handler returns, and frees the driver then.
    d.close();
    d.ctx->stop();
    d.orphaned = true;
    d.thread.detach();
    (void)driver_.release();
    return;
  }
  d.post([&d] {
    d.close();
    d.ctx->stop();
  });
  d.thread.join();
  d.own.reset();  // handlers not run (a posted resume) go with it, before the driver
}

std::shared_ptr<HttpClient> HttpClient::on(asio::io_context& ctx) {
  // The services our sockets and timer use exist before ours: an io_context shuts its services
  // down newest first, so ours closes the client while they are still whole.
  {
    asio::steady_timer timer(ctx);
    asio::posix::stream_descriptor descriptor(ctx);
  }
  Service& service = asio::use_service<Service>(ctx);  // thread-safe in Asio
  std::lock_guard lock(service.mutex);
  // Made here, on any thread: what it sets up is first used by a handler posted to ctx.
  if (!service.client) service.client.reset(new HttpClient(ctx));
  return service.client;
}

namespace {
// shared()'s lock. A fork waits for it, as for cache.cpp's and warning.cpp's locks: a child
// forked while another thread held it would wait for it for ever at its first shared() (a
// dataset's cache_fill starts the filler thread, whose first step is shared(), right before
// a loader forks its workers). Held, it guards only the making of a client, which takes no
// other lock a fork waits for.
std::mutex shared_mutex;
void lock_shared_for_fork() { shared_mutex.lock(); }
void unlock_shared_after_fork() { shared_mutex.unlock(); }
[[maybe_unused]] const int shared_fork_handlers =
    ::pthread_atfork(lock_shared_for_fork, unlock_shared_after_fork, unlock_shared_after_fork);
}  // namespace

std::shared_ptr<HttpClient> HttpClient::shared() {
  static std::shared_ptr<HttpClient> client;
  static pid_t owner = 0;
  std::lock_guard lock(shared_mutex);
  if (client && owner != ::getpid()) {
    // A forked child: the parent's loop thread is not here, so its client can be neither
    // used nor destroyed (the destructor would join a thread that does not exist). Kept.
    static auto* orphans = new std::vector<std::shared_ptr<HttpClient>>;
    orphans->push_back(std::move(client));
  }
  if (!client) {
    client = std::make_shared<HttpClient>();
    owner = ::getpid();
  }
  return client;
}

}  // namespace coload::io
