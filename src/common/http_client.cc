#include "common/http_client.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif

namespace sluice::net {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr const char* kAuthHeader = "X-BackendAI-Storage-Auth-Token";
constexpr size_t kChunk = 256 * 1024;

bool IsIpLiteral(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

Result<Endpoint> Endpoint::Parse(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return Status(Code::kInvalidArgument, fmt::format("invalid endpoint '{}': {}", url, why));
  };
  Endpoint e;
  std::string_view rest = url;
  size_t sep = rest.find("://");
  if (sep != std::string_view::npos) {
    std::string scheme(rest.substr(0, sep));
    for (auto& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (scheme == "https") {
      e.tls = true;
    } else if (scheme != "http") {
      return bad("the scheme must be http or https");
    }
    rest = rest.substr(sep + 3);
  }
  if (rest.find_first_of("?#@ \t\r\n") != std::string_view::npos)
    return bad("expected scheme://host[:port][/prefix]");
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    e.base_path = std::string(rest.substr(slash));
    while (!e.base_path.empty() && e.base_path.back() == '/') e.base_path.pop_back();
  }
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unterminated '[' in the host");
    e.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':' after ']'");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    size_t colon = authority.find(':');
    if (colon != std::string_view::npos) {
      if (authority.find(':', colon + 1) != std::string_view::npos)
        return bad("write IPv6 addresses in brackets: http://[::1]:6022");
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
    e.host = std::string(authority.substr(0, colon));
  }
  if (e.host.empty()) return bad("no host");
  if (port.empty()) {
    e.port = e.tls ? "443" : "80";
  } else {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        }))
      return bad("the port must be a number");
    int n = std::stoi(std::string(port));
    if (n < 1 || n > 65535) return bad("the port must be between 1 and 65535");
    e.port = std::to_string(n);
  }
  return e;
}

std::string Endpoint::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return fmt::format("{}://{}:{}{}", tls ? "https" : "http", h, port, base_path);
}

// One connection to the daemon, plain or TLS. Operations are asynchronous under the hood so
// that every step has a deadline; each runs the private io_context to completion.
class Client::Conn {
 public:
  explicit Conn(const ClientOptions& opts) : opts_(opts) {}
  ~Conn() { Close(); }

  bool open() const { return tcp_ != nullptr || tls_ != nullptr; }

  void Close() {
    beast::error_code ec;
    if (tls_) beast::get_lowest_layer(*tls_).socket().close(ec);
    if (tcp_) tcp_->socket().close(ec);
    tls_.reset();
    tcp_.reset();
    buf_.consume(buf_.size());
  }

  Status Connect() {
    Close();
    const Endpoint& ep = opts_.endpoint;
    tcp::resolver resolver(ioc_);
    beast::error_code ec;
    auto results = resolver.resolve(ep.host, ep.port, ec);
    if (ec)
      return Status(Code::kUnavailable,
                    fmt::format("cannot resolve '{}': {}", ep.host, ec.message()));
    if (ep.tls) {
      SLUICE_RETURN_IF_ERROR(InitTls());
      tls_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc_, *ssl_ctx_);
    } else {
      tcp_ = std::make_unique<beast::tcp_stream>(ioc_);
    }
    beast::tcp_stream& low = tls_ ? beast::get_lowest_layer(*tls_) : *tcp_;
    low.expires_after(opts_.timeout);
    ec = Run([&](auto handler) { low.async_connect(results, std::move(handler)); });
    if (ec) {
      Close();
      return TransportError("cannot connect to", ec);
    }
    if (tls_) {
      if (!IsIpLiteral(ep.host)) SSL_set_tlsext_host_name(tls_->native_handle(), ep.host.c_str());
      if (!opts_.insecure) tls_->set_verify_callback(ssl::host_name_verification(ep.host));
      low.expires_after(opts_.timeout);
      ec = Run([&](auto handler) {
        tls_->async_handshake(ssl::stream_base::client, std::move(handler));
      });
      if (ec) {
        long verify = SSL_get_verify_result(tls_->native_handle());
        Status st = TransportError("TLS handshake failed with", ec);
        // The host name check is our verify callback: a refusal there has no code of its own.
        std::string why = verify == X509_V_ERR_UNSPECIFIED
                              ? fmt::format("the certificate is not for '{}'", ep.host)
                              : std::string(X509_verify_cert_error_string(verify));
        if (verify != X509_V_OK)
          st = Status(Code::kUnavailable,
                      fmt::format("{} ({}; --insecure skips the check)", st.message(), why));
        Close();
        return st;
      }
    }
    return Status::Ok();
  }

  // Sends `req` and reads the answer. `answered` tells whether any of the answer arrived (a
  // request that failed before that may be retried on a fresh connection).
  Result<HttpAnswer> RoundTrip(http::request<http::string_body>& req, const BodySink* sink,
                               bool* answered) {
    if (tls_) return RoundTripOn(*tls_, req, sink, answered);
    return RoundTripOn(*tcp_, req, sink, answered);
  }

 private:
  Status InitTls() {
    if (ssl_ctx_) return Status::Ok();
    try {
      auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
      if (opts_.insecure) {
        ctx->set_verify_mode(ssl::verify_none);
      } else {
        ctx->set_default_verify_paths();
        ctx->set_verify_mode(ssl::verify_peer);
      }
      ssl_ctx_ = std::move(ctx);
    } catch (const std::exception& e) {
      return Status(Code::kUnavailable, fmt::format("cannot set up TLS: {}", e.what()));
    }
    return Status::Ok();
  }

  Status TransportError(std::string_view what, const beast::error_code& ec) const {
    std::string where = opts_.endpoint.ToString();
    if (ec == beast::error::timeout) {
      double secs = std::chrono::duration<double>(opts_.timeout).count();
      return Status(Code::kUnavailable,
                    fmt::format("timed out after {:g}s: {} {}", secs, what, where));
    }
    return Status(Code::kUnavailable, fmt::format("{} {}: {}", what, where, ec.message()));
  }

  // Starts one asynchronous operation and runs the loop until it completes (its deadline is set
  // on the stream beforehand).
  template <typename Start>
  beast::error_code Run(Start&& start) {
    beast::error_code result = net::error::operation_aborted;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    return result;
  }

  template <typename Stream>
  Result<HttpAnswer> RoundTripOn(Stream& s, http::request<http::string_body>& req,
                                 const BodySink* sink, bool* answered) {
    auto& low = beast::get_lowest_layer(s);
    low.expires_after(opts_.timeout);
    beast::error_code ec =
        Run([&](auto handler) { http::async_write(s, req, std::move(handler)); });
    if (ec) return TransportError("cannot send the request to", ec);

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    low.expires_after(opts_.timeout);
    ec = Run([&](auto handler) { http::async_read_header(s, buf_, parser, std::move(handler)); });
    // A request that timed out waiting was received and may be running (a slow clone, a
    // delete): it counts as answered, never sent again. Only a connection found closed is.
    if (ec) *answered = ec == beast::error::timeout;
    if (ec) return TransportError("no answer from", ec);
    *answered = true;

    HttpAnswer a;
    a.status = parser.get().result_int();
    a.content_type = std::string(parser.get()[http::field::content_type]);
    const bool to_sink = sink != nullptr && a.ok();
    std::vector<char> chunk(kChunk);
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      low.expires_after(opts_.timeout);
      ec = Run([&](auto handler) { http::async_read(s, buf_, parser, std::move(handler)); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return TransportError("the answer was cut short by", ec);
      size_t n = chunk.size() - parser.get().body().size;
      if (n == 0) continue;
      if (to_sink) {
        Status st = (*sink)(std::string_view(chunk.data(), n));
        if (!st.ok()) return st;
        a.streamed_bytes += n;
      } else {
        a.body.append(chunk.data(), n);
      }
    }
    if (!parser.get().keep_alive()) Close();
    return a;
  }

  const ClientOptions& opts_;
  net::io_context ioc_;
  std::unique_ptr<ssl::context> ssl_ctx_;
  std::unique_ptr<beast::tcp_stream> tcp_;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buf_;
};

Client::Client(ClientOptions opts) : opts_(std::move(opts)), conn_(std::make_unique<Conn>(opts_)) {}

Client::~Client() = default;

Result<HttpAnswer> Client::Request(http::verb verb, std::string_view path,
                                   const nlohmann::json& body) {
  return Exchange(verb, path, body, nullptr);
}

Result<HttpAnswer> Client::Stream(http::verb verb, std::string_view path,
                                  const nlohmann::json& body, const BodySink& sink) {
  return Exchange(verb, path, body, &sink);
}

Result<HttpAnswer> Client::Exchange(http::verb verb, std::string_view path,
                                    const nlohmann::json& body, const BodySink* sink) {
  try {
    const Endpoint& ep = opts_.endpoint;
    http::request<http::string_body> req{verb, ep.base_path + std::string(path), 11};
    std::string host = ep.host.find(':') != std::string::npos ? "[" + ep.host + "]" : ep.host;
    if (ep.port != (ep.tls ? "443" : "80")) host += ":" + ep.port;
    req.set(http::field::host, host);
    req.set(http::field::user_agent, "sluice/" SLUICE_VERSION);
    req.set(http::field::accept, "application/json, */*");
    if (!opts_.token.empty()) req.set(kAuthHeader, opts_.token);
    for (const auto& [name, value] : opts_.headers) req.set(name, value);
    if (!body.is_null()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    req.keep_alive(true);
    req.prepare_payload();

    // A kept-alive connection the daemon has closed in the meantime fails before any answer
    // arrives: retry once on a fresh one (not a request that timed out: RoundTripOn).
    for (int attempt = 0;; ++attempt) {
      bool reused = conn_->open();
      if (!reused) SLUICE_RETURN_IF_ERROR(conn_->Connect());
      bool answered = false;
      Result<HttpAnswer> r = conn_->RoundTrip(req, sink, &answered);
      if (r.ok()) return r;
      conn_->Close();
      if (!reused || answered || attempt > 0) return r;
    }
  } catch (const std::exception& e) {
    conn_->Close();
    return Status(Code::kUnavailable, fmt::format("request failed: {}", e.what()));
  }
}

}  // namespace sluice::net
