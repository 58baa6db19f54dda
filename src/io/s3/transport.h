// The daemon's link to an S3 origin: libcurl's multi interface on one thread of its own, which
// moves the bytes of every request to that origin (an s3 volume's, shared by all its clients).
//
// - Connections are shared: any request reuses any idle connection to the origin, and at most
//   `max_connections` requests run at once (one connection each, HTTP/1.1). The rest wait in a
//   queue, in order; one that cannot start within `queue_timeout` fails at once (kUnavailable,
//   errno EBUSY, not retried) instead of holding its caller's thread behind requests an origin
//   has stopped answering.
// - Callers stay synchronous (the Volume interface is): Perform() hands an easy handle to the
//   loop and sleeps until its transfer ends. The handle's callbacks run on the loop's thread,
//   so they must be quick (copies into memory, reads of local files).
// - Requests queued and running, and connections made, are Prometheus figures per volume.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"

namespace sluice::io::s3 {

struct TransportOptions {
  int max_connections = 64;
  // How long a request may wait for one of the connections before it fails.
  std::chrono::milliseconds queue_timeout{10000};
  // Names the Prometheus figures (`volume="..."`); none when empty.
  std::string volume;
};

// curl_global_init, once per process (S3Client and Transport call it).
void CurlGlobalInit();

class Transport {
 public:
  explicit Transport(TransportOptions opts);
  ~Transport();  // every caller has returned: callers hold the clients that hold this
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Runs the transfer set up on `easy` (a CURL*) to its end; its libcurl result goes to `*rc`.
  // Not OK only when it could not start: the queue wait ran out, or the loop is down.
  Status Perform(void* easy, int* rc);

  struct Stats {
    int64_t running = 0, queued = 0;
    uint64_t requests = 0, connects = 0, queue_timeouts = 0;
  };
  Stats stats() const;
  const TransportOptions& options() const { return opts_; }

 private:
  struct Call;
  void Loop();
  void Finish(Call* c, int rc, bool started);

  TransportOptions opts_;
  void* multi_ = nullptr;
  std::mutex mu_;
  std::deque<Call*> incoming_;  // handed over by Perform, taken by the loop; mu_
  bool stop_ = false;           // mu_
  // The loop's own (no lock): calls waiting for a connection, and how many run.
  std::deque<Call*> waiting_;
  int running_ = 0;
  struct Figures {
    std::atomic<int64_t> running{0}, queued{0};
    std::atomic<uint64_t> requests{0}, connects{0}, queue_timeouts{0};
  } n_;
  std::atomic<int64_t>*g_running_ = nullptr, *g_queued_ = nullptr;
  std::atomic<uint64_t>*g_requests_ = nullptr, *g_connects_ = nullptr, *g_timeouts_ = nullptr;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace sluice::io::s3
