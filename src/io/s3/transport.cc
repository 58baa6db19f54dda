#include "io/s3/transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/metrics.h"

namespace sluice::io::s3 {

void CurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One Perform(), on its caller's stack: a loop finishes it under `mu`, and the caller returns
// only once it has seen `done` under the same lock, so no loop touches a call whose caller has
// gone.
struct Transport::Call {
  CURL* easy = nullptr;
  bool control = false;
  std::chrono::steady_clock::time_point queued_at;
  int rc = CURLE_OK;
  bool started = false, done = false;
  std::mutex mu;
  std::condition_variable cv;
};

// One multi handle and the thread that drives it. The calls waiting for a connection are the
// transport's, shared: whichever loop has a connection free takes the next, so that a call
// never waits behind one loop's long transfers while another's connections are idle.
class Transport::Loop {
 public:
  Loop(Transport* t, int limit) : t_(t), limit_(limit) {
    multi_ = curl_multi_init();
    if (multi_) {
      // Every idle connection stays for the next request; HTTP/1.1 only (no multiplexing).
      curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, static_cast<long>(limit_ + kControlReserve));
      curl_multi_setopt(multi_, CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_NOTHING));
      free_ = limit_;  // a loop without a multi handle never runs: nothing is promised to it
    }
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (...) {
      if (multi_) curl_multi_cleanup(multi_);
      throw;
    }
  }
  ~Loop() {
    {
      // Set here too: loops are destroyed without ~Transport when its constructor throws.
      std::lock_guard lk(t_->mu_);
      t_->stop_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
    if (multi_) curl_multi_cleanup(multi_);
  }
  bool ok() const { return multi_ != nullptr; }
  void Wake() {
    if (multi_) curl_multi_wakeup(multi_);
  }
  // Data connections free when the loop last took calls, less those promised since to calls
  // that woke it (under the transport's mu_).
  int free_locked() const { return free_; }
  void promise_locked() { --free_; }

 private:
  void Run();
  bool Start(Call* c);  // false: it could not start (finished with an error)

  Transport* t_;
  const int limit_;
  CURLM* multi_ = nullptr;
  std::vector<Call*> running_;  // the loop's own
  int free_ = 0;                // t_->mu_ (set before the loop is shared)
  std::thread thread_;          // last: starts once the rest is set
};

bool Transport::Loop::Start(Call* c) {
  Figures& n = t_->n_;
  n.running++;
  if (n.g_running) (*n.g_running)++;
  curl_easy_setopt(c->easy, CURLOPT_PRIVATE, c);
  if (curl_multi_add_handle(multi_, c->easy) != CURLM_OK) {
    t_->Finish(c, CURLE_FAILED_INIT, true);
    return false;
  }
  running_.push_back(c);
  n.requests++;
  if (n.g_requests) (*n.g_requests)++;
  return true;
}

void Transport::Loop::Run() {
  if (!multi_) return;
  Figures& n = t_->n_;
  const auto queue_timeout = t_->opts_.queue_timeout;
  std::vector<Call*> take;
  for (;;) {
    // Take what this loop's free connections allow, control first, in order; refuse what
    // waited too long (any loop may).
    bool stopping;
    auto wait = std::chrono::milliseconds(1000);
    {
      std::lock_guard lk(t_->mu_);
      stopping = t_->stop_;
      const auto now = std::chrono::steady_clock::now();
      size_t busy = running_.size();
      for (auto* q : {&t_->control_waiting_, &t_->waiting_}) {
        const size_t cap = static_cast<size_t>(limit_) +
                           (q == &t_->control_waiting_ ? static_cast<size_t>(kControlReserve) : 0);
        while (!stopping && !q->empty() && busy < cap) {
          take.push_back(q->front());
          q->pop_front();
          ++busy;
        }
        while (!q->empty() && now - q->front()->queued_at >= queue_timeout) {
          Call* c = q->front();
          q->pop_front();
          n.queue_timeouts++;
          if (n.g_timeouts) (*n.g_timeouts)++;
          t_->Finish(c, CURLE_OPERATION_TIMEDOUT, false);
        }
        if (!q->empty())
          wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                                q->front()->queued_at + queue_timeout - now),
                            std::chrono::milliseconds(1), wait);
      }
      // Published under the lock, so that a call queued after this look is seen by the Perform
      // that queues it (it wakes this loop), and one queued before was taken here.
      free_ = std::max(0, limit_ - static_cast<int>(busy));
    }
    bool unused = false;  // a call that could not start left its connection free
    for (Call* c : take) {
      n.queued--;
      if (n.g_queued) (*n.g_queued)--;
      unused |= !Start(c);
    }
    take.clear();
    if (stopping) {
      for (Call* c : running_) {
        curl_multi_remove_handle(multi_, c->easy);
        t_->Finish(c, CURLE_ABORTED_BY_CALLBACK, true);
      }
      return;
    }

    int active = 0;
    curl_multi_perform(multi_, &active);
    bool freed = false;
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode result = msg->data.result;  // read before the handle is removed
      Call* c = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, reinterpret_cast<char**>(&c));
      long connects = 0;
      if (curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0) {
        n.connects += static_cast<uint64_t>(connects);
        if (n.g_connects) (*n.g_connects) += static_cast<uint64_t>(connects);
      }
      curl_multi_remove_handle(multi_, easy);
      std::erase(running_, c);
      if (c) t_->Finish(c, result, true);
      freed = true;
    }
    if (freed || unused) continue;  // a connection came free: take the next waiting call
    // Sleep until a socket is ready, a timer of libcurl's is due, a call comes (wakeup), or
    // the first waiting call's time runs out.
    curl_multi_poll(multi_, nullptr, 0, static_cast<int>(wait.count()), nullptr);
  }
}

void Transport::Finish(Call* c, int rc, bool started) {
  if (started) {
    n_.running--;
    if (n_.g_running) (*n_.g_running)--;
  } else {
    n_.queued--;
    if (n_.g_queued) (*n_.g_queued)--;
  }
  std::lock_guard lk(c->mu);
  c->rc = rc;
  c->started = started;
  c->done = true;
  c->cv.notify_one();
}

Transport::Transport(TransportOptions opts) : opts_(std::move(opts)) {
  CurlGlobalInit();
  opts_.max_connections = std::max(opts_.max_connections, 1);
  if (opts_.threads <= 0)
    opts_.threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8);
  opts_.threads = std::min(opts_.threads, opts_.max_connections);
  if (!opts_.volume.empty()) {
    auto& m = Metrics::Global();
    const std::string l = fmt::format("volume=\"{}\"", opts_.volume);
    n_.g_running = &m.Gauge("sluice_origin_requests_running",
                            "Requests to an s3 volume's origin being answered now.", l);
    n_.g_queued = &m.Gauge("sluice_origin_requests_queued",
                           "Requests to an s3 volume's origin waiting for a connection.", l);
    n_.g_requests = &m.Counter("sluice_origin_requests_total",
                               "Requests sent to an s3 volume's origin (every attempt).", l);
    n_.g_connects = &m.Counter("sluice_origin_connections_total",
                               "Connections opened to an s3 volume's origin.", l);
    n_.g_timeouts =
        &m.Counter("sluice_origin_queue_timeouts_total",
                   "Requests to an s3 volume's origin refused after waiting queue-timeout for "
                   "a connection.",
                   l);
  }
  // The limit in shares, as even as they go.
  for (int i = 0; i < opts_.threads; ++i)
    loops_.push_back(
        std::make_unique<Loop>(this, opts_.max_connections / opts_.threads +
                                         (i < opts_.max_connections % opts_.threads ? 1 : 0)));
}

Transport::~Transport() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  loops_.clear();  // each loop aborts what it runs and joins its thread
  // Nothing waits now (callers hold the clients that hold this); if something did, it ends.
  for (auto* q : {&control_waiting_, &waiting_}) {
    for (Call* c : *q) Finish(c, CURLE_ABORTED_BY_CALLBACK, false);
    q->clear();
  }
}

Status Transport::Perform(void* easy, int* rc, bool control) {
  Call c;
  c.easy = static_cast<CURL*>(easy);
  c.control = control;
  c.queued_at = std::chrono::steady_clock::now();
  Loop* wake = nullptr;
  {
    std::lock_guard lk(mu_);
    if (stop_ || !loops_.front()->ok())
      return Status(Code::kUnavailable, "the origin's transport is not running");
    n_.queued++;
    if (n_.g_queued) (*n_.g_queued)++;
    auto& q = control ? control_waiting_ : waiting_;
    q.push_back(&c);
    // The loop with the most free connections takes it. With none free, the loop that frees
    // one takes it; the first loop is woken anyway when the queue was empty, so that it
    // sleeps no longer than this call's queue timeout.
    int most = 0;
    for (const auto& l : loops_)
      if (l->free_locked() > most) {
        most = l->free_locked();
        wake = l.get();
      }
    if (wake) wake->promise_locked();  // the next call goes to another loop with room
    if (!wake && (control || q.size() == 1)) wake = loops_.front().get();
  }
  if (control)
    for (const auto& l : loops_) l->Wake();  // any loop's reserve takes it
  else if (wake)
    wake->Wake();
  std::unique_lock lk(c.mu);
  c.cv.wait(lk, [&] { return c.done; });
  if (!c.started && c.rc == CURLE_ABORTED_BY_CALLBACK)
    return Status(Code::kUnavailable, "the origin's transport stopped");
  if (!c.started)
    return Status::Busy(
        fmt::format("no connection to the origin came free within {} ms ({} requests "
                    "in flight, the most max-connections allows)",
                    opts_.queue_timeout.count(), opts_.max_connections));
  *rc = c.rc;
  return Status::Ok();
}

Transport::Stats Transport::stats() const {
  return {n_.running.load(), n_.queued.load(), n_.requests.load(), n_.connects.load(),
          n_.queue_timeouts.load()};
}

}  // namespace sluice::io::s3
