#include "io/s3/transport.h"

#include <curl/curl.h>

#include <algorithm>
#include <condition_variable>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "common/metrics.h"

namespace sluice::io::s3 {

namespace {
CURLM* M(void* multi) {
  return static_cast<CURLM*>(multi);
}
}  // namespace

void CurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One Perform(), on its caller's stack: the loop finishes it under `mu`, and the caller returns
// only once it has seen `done` under the same lock, so the loop never touches a call whose
// caller has gone.
struct Transport::Call {
  CURL* easy = nullptr;
  std::chrono::steady_clock::time_point queued_at;
  int rc = CURLE_OK;
  bool started = false, done = false;
  std::mutex mu;
  std::condition_variable cv;
};

Transport::Transport(TransportOptions opts) : opts_(std::move(opts)) {
  CurlGlobalInit();
  if (opts_.max_connections < 1) opts_.max_connections = 1;
  multi_ = curl_multi_init();
  if (multi_) {
    // Every idle connection stays for the next request; at most max_connections exist, as at
    // most that many requests run.
    curl_multi_setopt(M(multi_), CURLMOPT_MAXCONNECTS, static_cast<long>(opts_.max_connections));
  }
  if (!opts_.volume.empty()) {
    auto& m = Metrics::Global();
    const std::string l = fmt::format("volume=\"{}\"", opts_.volume);
    g_running_ = &m.Gauge("sluice_origin_requests_running",
                          "Requests to an s3 volume's origin being answered now.", l);
    g_queued_ = &m.Gauge("sluice_origin_requests_queued",
                         "Requests to an s3 volume's origin waiting for a connection.", l);
    g_requests_ = &m.Counter("sluice_origin_requests_total",
                             "Requests sent to an s3 volume's origin (every attempt).", l);
    g_connects_ = &m.Counter("sluice_origin_connections_total",
                             "Connections opened to an s3 volume's origin.", l);
    g_timeouts_ =
        &m.Counter("sluice_origin_queue_timeouts_total",
                   "Requests to an s3 volume's origin refused after waiting queue-timeout for "
                   "a connection.",
                   l);
  }
  thread_ = std::thread([this] { Loop(); });
}

Transport::~Transport() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  if (multi_) curl_multi_wakeup(M(multi_));
  if (thread_.joinable()) thread_.join();
  if (multi_) curl_multi_cleanup(M(multi_));
}

Status Transport::Perform(void* easy, int* rc) {
  Call c;
  c.easy = static_cast<CURL*>(easy);
  c.queued_at = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    if (stop_ || !multi_)
      return Status(Code::kUnavailable, "the origin's transport is not running");
    incoming_.push_back(&c);
  }
  n_.queued++;
  if (g_queued_) (*g_queued_)++;
  curl_multi_wakeup(M(multi_));
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

void Transport::Finish(Call* c, int rc, bool started) {
  if (started) {
    n_.running--;
    if (g_running_) (*g_running_)--;
  } else {
    n_.queued--;
    if (g_queued_) (*g_queued_)--;
  }
  std::lock_guard lk(c->mu);
  c->rc = rc;
  c->started = started;
  c->done = true;
  c->cv.notify_one();
}

void Transport::Loop() {
  if (!multi_) return;
  std::vector<Call*> running;  // to abort at a stop
  for (;;) {
    bool stopping;
    {
      std::lock_guard lk(mu_);
      waiting_.insert(waiting_.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
      stopping = stop_;
    }
    if (stopping) {
      for (Call* c : running) {
        curl_multi_remove_handle(M(multi_), c->easy);
        Finish(c, CURLE_ABORTED_BY_CALLBACK, true);
      }
      for (Call* c : waiting_) Finish(c, CURLE_ABORTED_BY_CALLBACK, false);
      waiting_.clear();
      return;
    }
    // Start what the connections allow, in order; refuse what waited too long.
    const auto now = std::chrono::steady_clock::now();
    while (!waiting_.empty() && running_ < opts_.max_connections) {
      Call* c = waiting_.front();
      waiting_.pop_front();
      n_.queued--;
      if (g_queued_) (*g_queued_)--;
      curl_easy_setopt(c->easy, CURLOPT_PRIVATE, c);
      n_.running++;
      if (g_running_) (*g_running_)++;
      if (curl_multi_add_handle(M(multi_), c->easy) != CURLM_OK) {
        Finish(c, CURLE_FAILED_INIT, true);
        continue;
      }
      ++running_;
      running.push_back(c);
      n_.requests++;
      if (g_requests_) (*g_requests_)++;
    }
    while (!waiting_.empty() && now - waiting_.front()->queued_at >= opts_.queue_timeout) {
      Call* c = waiting_.front();
      waiting_.pop_front();
      n_.queue_timeouts++;
      if (g_timeouts_) (*g_timeouts_)++;
      Finish(c, CURLE_OPERATION_TIMEDOUT, false);
    }

    int active = 0;
    curl_multi_perform(M(multi_), &active);
    bool freed = false;
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(M(multi_), &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode result = msg->data.result;
      Call* c = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, reinterpret_cast<char**>(&c));
      long connects = 0;
      if (curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0) {
        n_.connects += static_cast<uint64_t>(connects);
        if (g_connects_) (*g_connects_) += static_cast<uint64_t>(connects);
      }
      curl_multi_remove_handle(M(multi_), easy);
      --running_;
      std::erase(running, c);
      if (c) Finish(c, result, true);
      freed = true;
    }
    if (freed && !waiting_.empty()) continue;  // a connection came free: start the next now
    // Sleep until a socket is ready, a timer of libcurl's is due, a call comes (wakeup), or the
    // first waiting call's time runs out.
    auto wait = std::chrono::milliseconds(1000);
    if (!waiting_.empty())
      wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                            waiting_.front()->queued_at + opts_.queue_timeout - now),
                        std::chrono::milliseconds(1), wait);
    curl_multi_poll(M(multi_), nullptr, 0, static_cast<int>(wait.count()), nullptr);
  }
}

Transport::Stats Transport::stats() const {
  return {n_.running.load(), n_.queued.load(), n_.requests.load(), n_.connects.load(),
          n_.queue_timeouts.load()};
}

}  // namespace sluice::io::s3
