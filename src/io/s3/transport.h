// The daemon's link to an S3 origin: libcurl's multi interface on loop threads of its own,
// which move the bytes of every request to that origin (an s3 volume's, shared by all its
// clients).
//
// - Connections are shared: any request reuses an idle connection of its loop, and at most
//   `max_connections` data requests run at once (one connection each: HTTP/1.1, so that one
//   slow transfer never holds up others on a shared HTTP/2 connection). The rest wait in a
//   queue, in order; one that cannot start within `queue_timeout` fails at once (kUnavailable,
//   errno EBUSY, not retried) instead of holding its caller's thread behind requests an origin
//   has stopped answering.
// - Control requests (upload leases, whose renewals must not starve behind data) go first in
//   the queue and may use kControlReserve connections beyond the limit.
// - Several loops (`threads`) share the work, each with its own connections and its share of
//   the limit: one loop does a request's TLS and copies, and a core does only so much of that.
//   The queue is shared: a request wakes the loop with the most free connections, and
//   whichever loop frees a connection first takes the next waiting one.
// - Callers stay synchronous (the Volume interface is): Perform() hands an easy handle to a
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
#include <vector>

#include "common/status.h"

namespace sluice::io::s3 {

struct TransportOptions {
  int max_connections = 64;
  // How long a request may wait for one of the connections before it fails.
  std::chrono::milliseconds queue_timeout{10000};
  // Loop threads; 0: one per four cores, 1 to 8.
  int threads = 0;
  // Names the Prometheus figures (`volume="..."`); none when empty.
  std::string volume;
};

// curl_global_init, once per process (S3Client and Transport call it).
void CurlGlobalInit();

class Transport {
 public:
  static constexpr int kControlReserve = 2;  // per loop

  explicit Transport(TransportOptions opts);
  ~Transport();  // every caller has returned: callers hold the clients that hold this
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Runs the transfer set up on `easy` (a CURL*) to its end; its libcurl result goes to `*rc`.
  // Not OK only when it could not start: the queue wait ran out, or the loop is down.
  Status Perform(void* easy, int* rc, bool control = false);

  struct Stats {
    int64_t running = 0, queued = 0;
    uint64_t requests = 0, connects = 0, queue_timeouts = 0;
  };
  Stats stats() const;
  const TransportOptions& options() const { return opts_; }
  int loops() const { return static_cast<int>(loops_.size()); }

 private:
  struct Call;
  class Loop;
  // Ends a call: `started` (its transfer ran, `rc` its result) or refused before it began.
  void Finish(Call* c, int rc, bool started);
  struct Figures {
    std::atomic<int64_t> running{0}, queued{0};
    std::atomic<uint64_t> requests{0}, connects{0}, queue_timeouts{0};
    // The process's Prometheus series for the volume (null without a name).
    std::atomic<int64_t>*g_running = nullptr, *g_queued = nullptr;
    std::atomic<uint64_t>*g_requests = nullptr, *g_connects = nullptr, *g_timeouts = nullptr;
  };

  TransportOptions opts_;
  Figures n_;
  std::mutex mu_;
  bool stop_ = false;                            // mu_
  std::deque<Call*> waiting_, control_waiting_;  // calls waiting for a connection; mu_
  std::vector<std::unique_ptr<Loop>> loops_;     // last: stopped first
};

}  // namespace sluice::io::s3
