// HTTP/1.1 listeners on Boost.Beast: one event loop per thread (IoLoops). Every loop accepts
// (the listening socket is shared), connections are spread over the loops, capped per listener
// and shed politely beyond the cap or when file descriptors run out. Connections themselves are
// connection.h. A drain mode for graceful shutdown.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "api/http.h"
#include "api/http_parser.h"
#include "common/config.h"
#include "common/fd.h"

namespace sluice::api {

class IoLoops {
 public:
  explicit IoLoops(size_t n);
  ~IoLoops();
  boost::asio::io_context& Next();
  boost::asio::io_context& At(size_t i) { return *ctxs_[i]; }
  void Start();
  void Stop();  // stops every loop and joins the threads
  size_t size() const { return ctxs_.size(); }

 private:
  using Guard = boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;
  std::vector<std::unique_ptr<boost::asio::io_context>> ctxs_;
  std::vector<Guard> guards_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> next_{0};
};

struct ServerOptions {
  std::string name;  // "manager", "client", "internal": logs and metrics
  HostPort addr;
  uint64_t body_limit = 1 << 20;  // a route's default max request body
  // Request bodies buffered at once on this listener, all connections together: past it a
  // request is refused 503 before its body is read.
  uint64_t body_budget = 64 << 20;
  size_t max_connections = 10000;  // open connections; more are answered 503 and closed
  ParserLimits parser_limits;
  std::chrono::seconds request_timeout{60};
  std::chrono::seconds keepalive_timeout{75};
  std::shared_ptr<boost::asio::ssl::context> tls;  // null: plain HTTP
};

// Builds a TLS context from PEM certificate chain and private key files.
Result<std::shared_ptr<boost::asio::ssl::context>> MakeTlsContext(const std::string& cert,
                                                                  const std::string& key);

class HttpServer : public std::enable_shared_from_this<HttpServer> {
 public:
  HttpServer(IoLoops& loops, ServerOptions opts, std::shared_ptr<const Router> router);
  ~HttpServer();

  Status Listen();  // binds and listens; call once before Start
  void Start();     // begins accepting
  void Stop();      // stops accepting; responses then close their connections

  uint16_t port() const { return port_; }
  const ServerOptions& options() const { return opts_; }
  size_t inflight() const { return inflight_.load(); }
  bool draining() const { return draining_.load(); }
  std::string url() const;

  // Used by connections.
  const Router& router() const { return *router_; }
  std::atomic<size_t>& inflight_counter() { return inflight_; }
  void ConnectionClosed() {
    connections_.fetch_sub(1, std::memory_order_relaxed);
    open_gauge_->fetch_sub(1, std::memory_order_relaxed);
  }
  // Takes `bytes` of the body budget: held while the returned lease lives; null when the budget
  // is spent (the request is then refused without reading its body).
  std::shared_ptr<void> ReserveBody(uint64_t bytes);
  // Counts a response body piece read on the I/O pool because it was not in the page cache.
  void CountColdRead() { cold_reads_->fetch_add(1, std::memory_order_relaxed); }

 private:
  struct Acceptor;
  void Accept(size_t i);
  void OnAcceptError(size_t i, const boost::system::error_code& ec);
  // Answers a connection that will not be served (503, Connection: close) and closes it.
  void Shed(int fd, const char* reason);

  IoLoops& loops_;
  ServerOptions opts_;
  std::shared_ptr<const Router> router_;
  std::vector<std::unique_ptr<Acceptor>> acceptors_;  // one per loop, sharing one socket
  uint16_t port_ = 0;
  std::atomic<size_t> inflight_{0};
  std::atomic<size_t> connections_{0};
  std::atomic<uint64_t> buffered_{0};
  // Shed connections lingering until their client has read the 503.
  std::shared_ptr<std::atomic<size_t>> shedding_ = std::make_shared<std::atomic<size_t>>(0);
  std::atomic<bool> draining_{false};
  // Kept open to be closed when accept fails for want of descriptors: it frees one, so that
  // the connection at the head of the queue can be answered instead of left hanging.
  std::mutex spare_mu_;
  UniqueFd spare_fd_;
  std::atomic<bool> spare_missing_{false};  // set when re-opening the spare failed
  void RefillSpare();                       // under spare_mu_
  std::atomic<uint64_t>* shed_limit_;
  std::atomic<uint64_t>* shed_fds_;
  std::atomic<uint64_t>* shed_budget_;
  std::atomic<uint64_t>* accept_errors_;
  std::atomic<uint64_t>* cold_reads_;
  std::atomic<int64_t>* open_gauge_;
};

}  // namespace sluice::api
