#include "api/server.h"

#include <sys/sendfile.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

namespace sluice::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

IoLoops::IoLoops(size_t n) {
  if (n == 0) n = 1;
  for (size_t i = 0; i < n; ++i) {
    ctxs_.push_back(std::make_unique<asio::io_context>(1));
    guards_.emplace_back(asio::make_work_guard(*ctxs_.back()));
  }
}

IoLoops::~IoLoops() {
  Stop();
}

asio::io_context& IoLoops::Next() {
  return *ctxs_[next_.fetch_add(1) % ctxs_.size()];
}

void IoLoops::Start() {
  for (size_t i = 0; i < ctxs_.size(); ++i) {
    threads_.emplace_back([ctx = ctxs_[i].get()] { ctx->run(); });
    pthread_setname_np(threads_.back().native_handle(), fmt::format("loop-{}", i).c_str());
  }
}

void IoLoops::Stop() {
  guards_.clear();
  for (auto& c : ctxs_) c->stop();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

Result<std::shared_ptr<asio::ssl::context>> MakeTlsContext(const std::string& cert,
                                                           const std::string& key) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(cert, ec);
  if (ec)
    return Status(Code::kInvalidArgument,
                  fmt::format("TLS certificate '{}': {}", cert, ec.message()));
  ctx->use_private_key_file(key, asio::ssl::context::pem, ec);
  if (ec)
    return Status(Code::kInvalidArgument,
                  fmt::format("TLS private key '{}': {}", key, ec.message()));
  return ctx;
}

namespace {

// One connection. kTls selects the stream type; everything else is shared.
template <bool kTls>
class Session : public std::enable_shared_from_this<Session<kTls>> {
 public:
  using Stream = std::conditional_t<kTls, beast::ssl_stream<beast::tcp_stream>, beast::tcp_stream>;

  Session(tcp::socket&& sock, std::shared_ptr<HttpServer> srv)
      : stream_(MakeStream(std::move(sock), srv)), srv_(std::move(srv)) {}

  void Run() {
    asio::dispatch(Tcp().get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Tcp().expires_after(self->srv_->options().request_timeout);
        self->stream_.async_handshake(asio::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return;  // failed handshakes just close
          self->Read();
        });
      } else {
        self->Read();
      }
    });
  }

 private:
  static Stream MakeStream(tcp::socket&& sock, const std::shared_ptr<HttpServer>& srv) {
    if constexpr (kTls)
      return Stream(beast::tcp_stream(std::move(sock)), *srv->options().tls);
    else
      return Stream(std::move(sock));
  }

  beast::tcp_stream& Tcp() {
    if constexpr (kTls)
      return beast::get_lowest_layer(stream_);
    else
      return stream_;
  }

  void Read() {
    parser_.emplace();
    parser_->body_limit(srv_->options().body_limit);
    Tcp().expires_after(first_ ? srv_->options().request_timeout
                               : srv_->options().keepalive_timeout);
    first_ = false;
    http::async_read(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
      return Close();
    if (ec) {
      // Malformed or oversized request: answer once, then close.
      keep_alive_ = false;
      Status st = ec == http::error::body_limit
                      ? Status(Code::kTooLarge, fmt::format("request body exceeds {} bytes",
                                                            srv_->options().body_limit))
                      : Status(Code::kInvalidArgument,
                               fmt::format("malformed HTTP request: {}", ec.message()));
      is_head_ = false;
      version_ = 11;
      srv_->inflight_counter()++;
      return Write(ErrorResponse(st));
    }
    auto req = std::make_shared<HttpRequest>();
    req->msg = parser_->release();
    ParseTarget(req->msg.target(), req->path, req->query);
    beast::error_code rec;
    auto ep = Tcp().socket().remote_endpoint(rec);
    if (!rec) req->remote = ep.address().to_string();
    keep_alive_ = req->msg.keep_alive();
    version_ = req->msg.version();
    is_head_ = req->msg.method() == http::verb::head;
    srv_->inflight_counter()++;
    // Nothing may time out while a handler works on the request.
    Tcp().expires_never();
    srv_->router().Dispatch(req, [self = this->shared_from_this()](HttpResponse res) {
      asio::post(self->Tcp().get_executor(),
                 [self, res = std::move(res)]() mutable { self->Write(std::move(res)); });
    });
  }

  template <typename Msg>
  void FillHeaders(Msg& m, const HttpResponse& r) {
    m.set(http::field::server, "sluice");
    if (!r.content_type.empty()) m.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) m.insert(k, v);
    m.keep_alive(keep_alive_ && !srv_->draining());
  }

  void Write(HttpResponse r) {
    Tcp().expires_after(srv_->options().request_timeout);
    if (r.file && !is_head_) return WriteFile(std::move(r));
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), version_);
    FillHeaders(*res, r);
    if (r.file) {
      res->content_length(r.file_length);  // HEAD of a file: its length, no body
    } else {
      res->body() = std::move(r.body);
      res->prepare_payload();
      if (is_head_) res->body().clear();
    }
    bool close = !res->keep_alive();
    if (is_head_) {
      auto sr = std::make_shared<http::response_serializer<http::string_body>>(*res);
      http::async_write_header(stream_, *sr,
                               [self = this->shared_from_this(), res, sr, close](
                                   beast::error_code ec, size_t) { self->AfterWrite(ec, close); });
      return;
    }
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, close](beast::error_code ec, size_t) {
                        self->AfterWrite(ec, close);
                      });
  }

  void WriteFile(HttpResponse r) {
    auto head = std::make_shared<http::response<http::empty_body>>(
        static_cast<http::status>(r.status), version_);
    FillHeaders(*head, r);
    head->content_length(r.file_length);
    bool close = !head->keep_alive();
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    file_ = r.file;
    file_off_ = r.file_offset;
    file_left_ = r.file_length;
    http::async_write_header(
        stream_, *sr,
        [self = this->shared_from_this(), head, sr, close](beast::error_code ec, size_t) {
          if (ec) return self->AfterWrite(ec, true);
          self->SendFileBody(close);
        });
  }

  void SendFileBody(bool close) {
    if constexpr (!kTls) {
      // Zero-copy: the kernel moves page-cache pages straight to the socket.
      auto& sock = Tcp().socket();
      sock.native_non_blocking(true);
      while (file_left_ > 0) {
        off_t off = static_cast<off_t>(file_off_);
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(file_left_, 16u << 20));
        ssize_t n = ::sendfile(sock.native_handle(), file_->get(), &off, chunk);
        if (n > 0) {
          file_off_ += static_cast<uint64_t>(n);
          file_left_ -= static_cast<uint64_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          sock.async_wait(tcp::socket::wait_write,
                          [self = this->shared_from_this(), close](beast::error_code ec) {
                            if (ec) return self->AfterWrite(ec, true);
                            self->SendFileBody(close);
                          });
          return;
        }
        // The file shrank under us or the peer went away: the length promised cannot be kept.
        return AfterWrite(beast::error_code(n < 0 ? errno : EIO, beast::system_category()), true);
      }
      file_.reset();
      AfterWrite({}, close);
    } else {
      if (file_left_ == 0) {
        file_.reset();
        return AfterWrite({}, close);
      }
      if (chunk_.empty()) chunk_.resize(256 << 10);
      size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, chunk_.size()));
      ssize_t n = ::pread(file_->get(), chunk_.data(), want, static_cast<off_t>(file_off_));
      if (n <= 0) return AfterWrite(beast::error_code(EIO, beast::system_category()), true);
      file_off_ += static_cast<uint64_t>(n);
      file_left_ -= static_cast<uint64_t>(n);
      asio::async_write(stream_, asio::buffer(chunk_.data(), static_cast<size_t>(n)),
                        [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                          if (ec) return self->AfterWrite(ec, true);
                          self->SendFileBody(close);
                        });
    }
  }

  void AfterWrite(beast::error_code ec, bool close) {
    srv_->inflight_counter()--;
    if (ec || close || srv_->draining()) return Close();
    Read();
  }

  void Close() {
    beast::error_code ec;
    if constexpr (kTls) {
      Tcp().expires_after(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
        beast::error_code ec2;
        self->Tcp().socket().close(ec2);
      });
    } else {
      Tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  Stream stream_;
  std::shared_ptr<HttpServer> srv_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool first_ = true;
  bool keep_alive_ = true;
  bool is_head_ = false;
  unsigned version_ = 11;
  std::shared_ptr<UniqueFd> file_;
  uint64_t file_off_ = 0, file_left_ = 0;
  std::vector<char> chunk_;
};

}  // namespace

HttpServer::HttpServer(IoLoops& loops, ServerOptions opts, std::shared_ptr<const Router> router)
    : loops_(loops), opts_(std::move(opts)), router_(std::move(router)), acceptor_(loops.First()) {}

std::string HttpServer::url() const {
  HostPort hp = opts_.addr;
  hp.port = port_;
  return fmt::format("{}://{}", opts_.tls ? "https" : "http", hp.ToString());
}

Status HttpServer::Listen() {
  beast::error_code ec;
  auto addr = asio::ip::make_address(opts_.addr.host, ec);
  if (ec)
    return Status(Code::kInvalidArgument, fmt::format("{} listener: '{}' is not an IP address",
                                                      opts_.name, opts_.addr.host));
  tcp::endpoint ep(addr, opts_.addr.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Status(Code::kUnavailable, fmt::format("{} listener: cannot listen on {}: {}",
                                                  opts_.name, opts_.addr.ToString(), ec.message()));
  port_ = acceptor_.local_endpoint().port();
  return Status::Ok();
}

void HttpServer::Start() {
  Accept();
}

void HttpServer::Accept() {
  acceptor_.async_accept(
      loops_.Next(), [self = shared_from_this()](beast::error_code ec, tcp::socket sock) {
        if (ec) {
          if (ec == asio::error::operation_aborted || !self->acceptor_.is_open()) return;
          spdlog::warn("{} listener: accept failed: {}", self->opts_.name, ec.message());
        } else {
          sock.set_option(tcp::no_delay(true), ec);
          if (self->opts_.tls)
            std::make_shared<Session<true>>(std::move(sock), self)->Run();
          else
            std::make_shared<Session<false>>(std::move(sock), self)->Run();
        }
        self->Accept();
      });
}

void HttpServer::Stop() {
  draining_ = true;
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    beast::error_code ec;
    self->acceptor_.close(ec);
  });
}

}  // namespace sluice::api
