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

// One multi handle and the thread that drives it.
class Transport::Loop {
 public:
  Loop(Transport* t, int limit) : t_(t), limit_(limit) {
    multi_ = curl_multi_init();
    if (multi_) {
      // Every idle connection stays for the next request; HTTP/1.1 only (no multiplexing).
      curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, static_cast<long>(limit_ + kControlReserve));
      curl_multi_setopt(multi_, CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_NOTHING));
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Loop() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    if (multi_) curl_multi_wakeup(multi_);
    if (thread_.joinable()) thread_.join();
    if (multi_) curl_multi_cleanup(multi_);
  }
  // False when the loop is not running.
  bool Submit(Call* c) {
    {
      std::lock_guard lk(mu_);
      if (stop_ || !multi_) return false;
      incoming_.push_back(c);
    }
    load_++;
    curl_multi_wakeup(multi_);
    return true;
  }
  int load() const { return load_.load(std::memory_order_relaxed); }

 private:
  void Run();
  void Start(Call* c);
  void Finish(Call* c, int rc, bool started);
  // Refuses the calls of `q` that waited past the queue timeout.
  void Expire(std::deque<Call*>& q, std::chrono::steady_clock::time_point now);

  Transport* t_;
  const int limit_;
  CURLM* multi_ = nullptr;
  std::mutex mu_;
  std::deque<Call*> incoming_;  // handed over by Submit, taken by the loop; mu_
  bool stop_ = false;           // mu_
  std::atomic<int> load_{0};    // calls submitted and not finished
  // The loop's own (no lock): calls waiting for a connection, control first, and those running.
  std::deque<Call*> waiting_, control_waiting_;
  std::vector<Call*> running_;
  std::thread thread_;  // last: starts once the rest is set
};

void Transport::Loop::Start(Call* c) {
  Figures& n = t_->n_;
  n.queued--;
  if (n.g_queued) (*n.g_queued)--;
  n.running++;
  if (n.g_running) (*n.g_running)++;
  curl_easy_setopt(c->easy, CURLOPT_PRIVATE, c);
  if (curl_multi_add_handle(multi_, c->easy) != CURLM_OK) {
    Finish(c, CURLE_FAILED_INIT, true);
    return;
  }
  running_.push_back(c);
  n.requests++;
  if (n.g_requests) (*n.g_requests)++;
}

void Transport::Loop::Finish(Call* c, int rc, bool started) {
  Figures& n = t_->n_;
  if (started) {
    n.running--;
    if (n.g_running) (*n.g_running)--;
  } else {
    n.queued--;
    if (n.g_queued) (*n.g_queued)--;
  }
  load_--;
  std::lock_guard lk(c->mu);
  c->rc = rc;
  c->started = started;
  c->done = true;
  c->cv.notify_one();
}

void Transport::Loop::Expire(std::deque<Call*>& q, std::chrono::steady_clock::time_point now) {
  Figures& n = t_->n_;
  while (!q.empty() && now - q.front()->queued_at >= t_->opts_.queue_timeout) {
    Call* c = q.front();
    q.pop_front();
    n.queue_timeouts++;
    if (n.g_timeouts) (*n.g_timeouts)++;
    Finish(c, CURLE_OPERATION_TIMEDOUT, false);
  }
}

void Transport::Loop::Run() {
  if (!multi_) return;
  Figures& n = t_->n_;
  const auto queue_timeout = t_->opts_.queue_timeout;
  for (;;) {
    bool stopping;
    {
      std::lock_guard lk(mu_);
      for (Call* c : incoming_) (c->control ? control_waiting_ : waiting_).push_back(c);
      incoming_.clear();
      stopping = stop_;
    }
    if (stopping) {
      for (Call* c : running_) {
        curl_multi_remove_handle(multi_, c->easy);
        Finish(c, CURLE_ABORTED_BY_CALLBACK, true);
      }
      for (auto* q : {&control_waiting_, &waiting_}) {
        for (Call* c : *q) Finish(c, CURLE_ABORTED_BY_CALLBACK, false);
        q->clear();
      }
      return;
    }
    // Start what the connections allow, control first, in order; refuse what waited too long.
    while (!control_waiting_.empty() &&
           static_cast<int>(running_.size()) < limit_ + kControlReserve) {
      Call* c = control_waiting_.front();
      control_waiting_.pop_front();
      Start(c);
    }
    while (!waiting_.empty() && static_cast<int>(running_.size()) < limit_) {
      Call* c = waiting_.front();
      waiting_.pop_front();
      Start(c);
    }
    Expire(control_waiting_, std::chrono::steady_clock::now());
    Expire(waiting_, std::chrono::steady_clock::now());

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
      if (c) Finish(c, result, true);
      freed = true;
    }
    if (freed && !(waiting_.empty() && control_waiting_.empty()))
      continue;  // a connection came free: start the next now
    // Sleep until a socket is ready, a timer of libcurl's is due, a call comes (wakeup), or
    // the first waiting call's time runs out.
    auto wait = std::chrono::milliseconds(1000);
    const auto now = std::chrono::steady_clock::now();
    for (auto* q : {&control_waiting_, &waiting_})
      if (!q->empty())
        wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                              q->front()->queued_at + queue_timeout - now),
                          std::chrono::milliseconds(1), wait);
    curl_multi_poll(multi_, nullptr, 0, static_cast<int>(wait.count()), nullptr);
  }
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

Transport::~Transport() = default;  // each loop stops and joins its thread

Status Transport::Perform(void* easy, int* rc, bool control) {
  Call c;
  c.easy = static_cast<CURL*>(easy);
  c.control = control;
  c.queued_at = std::chrono::steady_clock::now();
  Loop* loop = loops_.front().get();
  for (const auto& l : loops_)
    if (l->load() < loop->load()) loop = l.get();
  n_.queued++;
  if (n_.g_queued) (*n_.g_queued)++;
  if (!loop->Submit(&c)) {
    n_.queued--;
    if (n_.g_queued) (*n_.g_queued)--;
    return Status(Code::kUnavailable, "the origin's transport is not running");
  }
  std::unique_lock lk(c.mu);
  c.cv.wait(lk, [&] { return c.done; });
  if (!c.started && c.rc == CURLE_ABORTED_BY_CALLBACK)
    return Status(Code::kUnavailable, "the origin's transport stopped");
  if (!c.started)
    return Status(Code::kUnavailable,
                  fmt::format("no connection to the origin came free within {} ms ({} requests "
                              "in flight, the most max-connections allows)",
                              opts_.queue_timeout.count(), opts_.max_connections),
                  EBUSY);
  *rc = c.rc;
  return Status::Ok();
}

Transport::Stats Transport::stats() const {
  return {n_.running.load(), n_.queued.load(), n_.requests.load(), n_.connects.load(),
          n_.queue_timeouts.load()};
}

}  // namespace sluice::io::s3
