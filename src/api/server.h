// HTTP/1.1 listeners on Boost.Beast: one event loop per thread (IoLoops), connections spread
// over the loops, keep-alive, body limits, timeouts, optional TLS, zero-copy file bodies
// (sendfile) on plain TCP, and a drain mode for graceful shutdown.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "api/http.h"
#include "common/config.h"

namespace sluice::api {

class IoLoops {
 public:
  explicit IoLoops(size_t n);
  ~IoLoops();
  boost::asio::io_context& Next();
  boost::asio::io_context& First() { return *ctxs_.front(); }
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
  uint64_t body_limit = 1 << 20;
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

  Status Listen();  // binds and listens; call once before Start
  void Start();     // begins accepting
  void Stop();      // stops accepting; responses then close their connections

  uint16_t port() const { return port_; }
  const ServerOptions& options() const { return opts_; }
  size_t inflight() const { return inflight_.load(); }
  bool draining() const { return draining_.load(); }
  std::string url() const;

  // Used by sessions.
  const Router& router() const { return *router_; }
  std::atomic<size_t>& inflight_counter() { return inflight_; }

 private:
  void Accept();

  IoLoops& loops_;
  ServerOptions opts_;
  std::shared_ptr<const Router> router_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<size_t> inflight_{0};
  std::atomic<bool> draining_{false};
};

}  // namespace sluice::api
