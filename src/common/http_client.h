// A small synchronous HTTP/1.1 client (the CLI's link to the manager-facing API, the daemon's to
// etcd's JSON gateway): keep-alive, http and https (certificate checks on unless `insecure`), a
// timeout on every network operation, the Backend.AI auth header and JSON bodies (GET
// included). Failures are values, never exceptions.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "common/status.h"

namespace sluice::net {

// "http://host:port/prefix" split into parts. The scheme defaults to http, the port to the
// scheme's (80 / 443); IPv6 hosts are written in brackets.
struct Endpoint {
  bool tls = false;
  std::string host;
  std::string port;
  std::string base_path;  // no trailing slash; "" for the root

  static Result<Endpoint> Parse(std::string_view url);
  std::string ToString() const;
};

struct ClientOptions {
  Endpoint endpoint;
  std::string token;  // sent as X-BackendAI-Storage-Auth-Token when not empty
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every request
  std::chrono::milliseconds timeout{30000};
  bool insecure = false;  // https: skip certificate and host name checks
};

// What the daemon answered. `body` holds the whole body unless it was streamed to a sink.
struct HttpAnswer {
  unsigned status = 0;
  std::string content_type;
  std::string body;
  uint64_t streamed_bytes = 0;

  bool ok() const { return status >= 200 && status < 300; }
};

// Receives the body of a successful (2xx) answer piece by piece; a non-OK status aborts the
// transfer and becomes the request's result.
using BodySink = std::function<Status(std::string_view)>;

class Client {
 public:
  explicit Client(ClientOptions opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends `body` (a JSON value; null sends no body) to `path`. Transport failures (cannot
  // connect, timeout, TLS, malformed answer) come back as kUnavailable; any HTTP answer, 4xx and
  // 5xx included, is a successful result.
  Result<HttpAnswer> Request(boost::beast::http::verb verb, std::string_view path,
                             const nlohmann::json& body = nullptr);
  // Same, but the body of a 2xx answer goes to `sink` instead of memory.
  Result<HttpAnswer> Stream(boost::beast::http::verb verb, std::string_view path,
                            const nlohmann::json& body, const BodySink& sink);

  const ClientOptions& options() const { return opts_; }

 private:
  class Conn;
  Result<HttpAnswer> Exchange(boost::beast::http::verb verb, std::string_view path,
                              const nlohmann::json& body, const BodySink* sink);

  ClientOptions opts_;
  std::unique_ptr<Conn> conn_;
};

}  // namespace sluice::net
