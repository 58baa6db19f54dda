#include "api/server.h"

#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include "common/clock.h"

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

constexpr size_t kIoChunk = 256 << 10;
// A lingering close reads and discards at most this much, for at most this long.
constexpr size_t kLingerBytes = 64 << 20;
constexpr auto kLingerTime = std::chrono::seconds(10);

// One connection. kTls selects the stream type; everything else is shared.
//
// Every request's headers are read first. A streaming route (uploads) then gets its body piece
// by piece through a BodySink on the worker pool, with back-pressure: the next piece is read
// only after the previous one is consumed. Any other route gets its body buffered (up to the
// listener's body limit) and goes through Router::Dispatch.
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
          self->ReadHeader();
        });
      } else {
        self->ReadHeader();
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

  const Router& router() const { return srv_->router(); }

  static bool IsDisconnect(const beast::error_code& ec) {
    return ec == http::error::end_of_stream || ec == beast::error::timeout ||
           ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
           ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
           ec == http::error::partial_message;
  }

  void ReadHeader() {
    hparser_.emplace();
    hparser_->header_limit(16 << 10);
    // Limits apply once the route is known. (Beast 1.74 compares lengths against an empty
    // optional as "greater", so "no limit" must be spelled as the largest value.)
    hparser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    Tcp().expires_after(first_ ? srv_->options().request_timeout
                               : srv_->options().keepalive_timeout);
    first_ = false;
    http::async_read_header(
        stream_, buf_, *hparser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Answers a request that could not be read, then closes.
  void RefuseMalformed(const Status& st) {
    keep_alive_ = false;
    is_head_ = false;
    version_ = 11;
    srv_->inflight_counter()++;
    started_ = MonotonicSeconds();
    route_name_ = "malformed";
    HttpResponse r = ErrorResponse(st);
    router().Decorate(r);
    Write(std::move(r));
  }

  void OnHeader(beast::error_code ec) {
    if (IsDisconnect(ec)) return Close();
    if (ec)
      return RefuseMalformed(
          Status(Code::kInvalidArgument, fmt::format("malformed HTTP request: {}", ec.message())));
    auto& hdr = hparser_->get();
    keep_alive_ = hdr.keep_alive();
    version_ = hdr.version();
    is_head_ = hdr.method() == http::verb::head;
    std::string path;
    std::map<std::string, std::string> query;
    ParseTarget(hdr.target(), path, query);
    if (!router().IsStreaming(hdr.method(), path)) {
      sparser_.emplace(std::move(*hparser_));
      sparser_->body_limit(srv_->options().body_limit);
      http::async_read(
          stream_, buf_, *sparser_,
          [self = this->shared_from_this()](beast::error_code ec2, size_t) { self->OnRead(ec2); });
      return;
    }
    auto req = std::make_shared<HttpRequest>();
    req->msg.base() = hdr.base();
    req->path = std::move(path);
    req->query = std::move(query);
    beast::error_code rec;
    auto ep = Tcp().socket().remote_endpoint(rec);
    if (!rec) req->remote = ep.address().to_string();
    srv_->inflight_counter()++;
    started_ = MonotonicSeconds();
    method_ = std::string(hdr.method_string());
    route_name_ = req->path;
    expect_continue_ = beast::iequals(hdr[http::field::expect], "100-continue");
    Tcp().expires_never();
    router().OpenStream(req, [self = this->shared_from_this()](StreamStart start) {
      auto holder = std::make_shared<StreamStart>(std::move(start));
      asio::post(self->Tcp().get_executor(),
                 [self, holder] { self->OnStreamStart(std::move(*holder)); });
    });
  }

  void OnStreamStart(StreamStart start) {
    if (auto* res = std::get_if<HttpResponse>(&start)) {
      // The body was not read: the connection cannot carry another request after it.
      if (!hparser_->is_done()) {
        keep_alive_ = false;
        linger_ = true;
      }
      return Write(std::move(*res));
    }
    sink_ = std::move(std::get<std::unique_ptr<BodySink>>(start));
    bparser_.emplace(std::move(*hparser_));
    bparser_->body_limit(
        std::numeric_limits<std::uint64_t>::max());  // the sink enforces its limits
    if (expect_continue_ && !bparser_->is_done()) {
      auto cont =
          std::make_shared<http::response<http::empty_body>>(http::status::continue_, version_);
      http::async_write(stream_, *cont,
                        [self = this->shared_from_this(), cont](beast::error_code ec, size_t) {
                          if (ec) return self->AbortStream(ec);
                          self->ReadBodyPiece();
                        });
      return;
    }
    ReadBodyPiece();
  }

  void ReadBodyPiece() {
    if (bparser_->is_done()) return piece_len_ ? SubmitPiece() : FinishStream();
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    // Socket reads go through buf_: give it room for large reads (Beast sizes a read by the
    // buffer's free capacity, and the header alone left it at a few hundred bytes).
    buf_.reserve(kIoChunk);
    bparser_->get().body().data = io_buf_.data() + piece_len_;
    bparser_->get().body().size = io_buf_.size() - piece_len_;
    Tcp().expires_after(srv_->options().request_timeout);
    http::async_read_some(
        stream_, buf_, *bparser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBodyPiece(ec); });
  }

  void OnBodyPiece(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return AbortStream(ec);
    piece_len_ = io_buf_.size() - bparser_->get().body().size;
    if (piece_len_ == 0) return ReadBodyPiece();
    // Gather more while more is at hand, so that the sink gets large pieces (each one is a hop
    // to the pool); what has arrived is handed over as soon as the socket runs dry.
    // (Bytes left in buf_ do not count: they may be chunk framing that cannot be parsed until
    // more arrives.)
    beast::error_code aec;
    bool more_now = Tcp().socket().available(aec) > 0;
    if (!bparser_->is_done() && more_now && piece_len_ < io_buf_.size() / 2) return ReadBodyPiece();
    SubmitPiece();
  }

  // Hands the gathered piece of the body to the sink on the pool; reading resumes after it.
  void SubmitPiece() {
    size_t got = piece_len_;
    Tcp().expires_never();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, got] {
      Status st = self->sink_->Write(self->io_buf_.data(), got);
      asio::post(self->Tcp().get_executor(), [self, st] {
        self->piece_len_ = 0;
        if (!st.ok()) {
          self->keep_alive_ = self->bparser_->is_done() && self->keep_alive_;
          self->linger_ = !self->bparser_->is_done();
          return self->EndStream(ErrorResponse(st));
        }
        self->ReadBodyPiece();
      });
    });
    if (!queued) {
      keep_alive_ = false;
      linger_ = !bparser_->is_done();
      EndStream(ErrorResponse(Status(Code::kUnavailable, "server is overloaded; retry later")));
    }
  }

  void FinishStream() {
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self] {
      auto res = std::make_shared<HttpResponse>(self->sink_->Finish());
      asio::post(self->Tcp().get_executor(), [self, res] { self->EndStream(std::move(*res)); });
    });
    if (!queued) {
      keep_alive_ = false;
      EndStream(ErrorResponse(Status(Code::kUnavailable, "server is overloaded; retry later")));
    }
  }

  // Ends a streamed request with `res`; a sink that did not finish is told why first, so that
  // the client sees the answer only once the sink has settled (an upload's offset advanced and
  // its lock released, say).
  void EndStream(HttpResponse res) {
    router().Decorate(res);
    std::shared_ptr<BodySink> sink(std::move(sink_));
    if (res.status >= 300 && sink) {
      Status why(Code::kInternal, fmt::format("request ended with HTTP {}", res.status));
      auto self = this->shared_from_this();
      auto held = std::make_shared<HttpResponse>(std::move(res));
      bool queued = router().pool()->Submit([self, sink, why, held] {
        sink->Abort(why);
        asio::post(self->Tcp().get_executor(), [self, held] { self->Write(std::move(*held)); });
      });
      if (queued) return;
      sink->Abort(why);  // the pool is full: settle here rather than not at all
      res = std::move(*held);
    }
    Write(std::move(res));
  }

  // The connection failed mid-body: tell the sink (on the pool), count the request, close.
  void AbortStream(beast::error_code ec) {
    std::shared_ptr<BodySink> sink(std::move(sink_));
    Status why(Code::kUnavailable, fmt::format("connection lost: {}", ec.message()));
    if (sink && !router().pool()->Submit([sink, why] { sink->Abort(why); })) sink->Abort(why);
    router().Observe(method_, route_name_, 499, started_);
    srv_->inflight_counter()--;
    Close();
  }

  void OnRead(beast::error_code ec) {
    if (IsDisconnect(ec)) return Close();
    if (ec) {
      // Malformed or oversized request: answer once, then close.
      return RefuseMalformed(
          ec == http::error::body_limit
              ? Status(Code::kTooLarge,
                       fmt::format("request body exceeds {} bytes", srv_->options().body_limit))
              : Status(Code::kInvalidArgument,
                       fmt::format("malformed HTTP request: {}", ec.message())));
    }
    auto req = std::make_shared<HttpRequest>();
    req->msg = sparser_->release();
    ParseTarget(req->msg.target(), req->path, req->query);
    beast::error_code rec;
    auto ep = Tcp().socket().remote_endpoint(rec);
    if (!rec) req->remote = ep.address().to_string();
    keep_alive_ = req->msg.keep_alive();
    version_ = req->msg.version();
    is_head_ = req->msg.method() == http::verb::head;
    srv_->inflight_counter()++;
    route_name_.clear();  // Dispatch records its own metrics
    // Nothing may time out while a handler works on the request.
    Tcp().expires_never();
    router().Dispatch(req, [self = this->shared_from_this()](HttpResponse res) {
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
    if (!route_name_.empty()) router().Observe(method_, route_name_, r.status, started_);
    route_name_.clear();
    Tcp().expires_after(srv_->options().request_timeout);
    if (r.file && !is_head_) return WriteFile(std::move(r));
    if (r.generator && !is_head_) return WriteGenerated(std::move(r));
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), version_);
    FillHeaders(*res, r);
    if (r.file) {
      res->content_length(r.file_length);  // HEAD of a file: its length, no body
    } else if (r.generator) {
      res->chunked(version_ >= 11);
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

  // Writes the header of a response whose body follows separately, then calls `next`.
  template <typename Next>
  void WriteHeadThen(const std::shared_ptr<http::response<http::empty_body>>& head, Next next) {
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    http::async_write_header(
        stream_, *sr,
        [self = this->shared_from_this(), head, sr, next](beast::error_code ec, size_t) {
          if (ec) return self->AfterWrite(ec, true);
          next();
        });
  }

  void WriteFile(HttpResponse r) {
    auto head = std::make_shared<http::response<http::empty_body>>(
        static_cast<http::status>(r.status), version_);
    FillHeaders(*head, r);
    head->content_length(r.file_length);
    bool close = !head->keep_alive();
    file_ = r.file;
    file_off_ = r.file_offset;
    file_left_ = r.file_length;
    if constexpr (!kTls) {
      // The header goes out with MSG_MORE so that it shares a segment with the first bytes of
      // the file (one packet for a small file instead of two). What the socket does not take at
      // once is written asynchronously before the body.
      head_text_ = fmt::format("HTTP/{}.{} {} {}\r\n", version_ / 10, version_ % 10,
                               head->result_int(), std::string_view(head->reason()));
      for (const auto& f : *head)
        head_text_ += fmt::format("{}: {}\r\n", std::string_view(f.name_string()),
                                  std::string_view(f.value()));
      head_text_ += "\r\n";
      auto& sock = Tcp().socket();
      sock.native_non_blocking(true);
      ssize_t n = ::send(sock.native_handle(), head_text_.data(), head_text_.size(),
                         (file_left_ > 0 ? MSG_MORE : 0) | MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        return AfterWrite(beast::error_code(errno, beast::system_category()), true);
      size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
      if (sent == head_text_.size()) return SendFileBody(close);
      asio::async_write(stream_, asio::buffer(head_text_.data() + sent, head_text_.size() - sent),
                        [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                          if (ec) return self->AfterWrite(ec, true);
                          self->SendFileBody(close);
                        });
      return;
    }
    WriteHeadThen(head, [self = this->shared_from_this(), close] { self->SendFileBody(close); });
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
      if (io_buf_.empty()) io_buf_.resize(kIoChunk);
      size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, io_buf_.size()));
      ssize_t n = ::pread(file_->get(), io_buf_.data(), want, static_cast<off_t>(file_off_));
      if (n <= 0) return AfterWrite(beast::error_code(EIO, beast::system_category()), true);
      file_off_ += static_cast<uint64_t>(n);
      file_left_ -= static_cast<uint64_t>(n);
      asio::async_write(stream_, asio::buffer(io_buf_.data(), static_cast<size_t>(n)),
                        [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                          if (ec) return self->AfterWrite(ec, true);
                          self->SendFileBody(close);
                        });
    }
  }

  void WriteGenerated(HttpResponse r) {
    auto head = std::make_shared<http::response<http::empty_body>>(
        static_cast<http::status>(r.status), version_);
    FillHeaders(*head, r);
    chunked_ = version_ >= 11;
    if (chunked_)
      head->chunked(true);
    else
      head->keep_alive(false);  // HTTP/1.0: the end of the body is the end of the connection
    bool close = !head->keep_alive();
    gen_ = std::move(r.generator);
    WriteHeadThen(head, [self = this->shared_from_this(), close] { self->GeneratePiece(close); });
  }

  // Runs the generator on the pool, then sends what it produced as one chunk.
  void GeneratePiece(bool close) {
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    Tcp().expires_never();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, close] {
      auto n = self->gen_(self->io_buf_.data(), self->io_buf_.size());
      asio::post(self->Tcp().get_executor(), [self, close, n] { self->SendPiece(n, close); });
    });
    if (!queued) AfterWrite(beast::error_code(EAGAIN, beast::system_category()), true);
  }

  void SendPiece(const Result<size_t>& n, bool close) {
    if (!n.ok()) {
      spdlog::warn("{} listener: response body failed midway: {}", srv_->options().name,
                   n.status().ToString());
      return AfterWrite(beast::error_code(EIO, beast::system_category()), true);
    }
    Tcp().expires_after(srv_->options().request_timeout);
    auto self = this->shared_from_this();
    if (*n == 0) {
      gen_ = nullptr;
      if (!chunked_) return AfterWrite({}, true);
      asio::async_write(
          stream_, asio::buffer("0\r\n\r\n", 5),
          [self, close](beast::error_code ec, size_t) { self->AfterWrite(ec, close); });
      return;
    }
    chunk_head_ = fmt::format("{:x}\r\n", *n);
    std::vector<asio::const_buffer> bufs;
    if (chunked_) bufs.push_back(asio::buffer(chunk_head_));
    bufs.push_back(asio::buffer(io_buf_.data(), *n));
    if (chunked_) bufs.push_back(asio::buffer("\r\n", 2));
    asio::async_write(stream_, bufs, [self, close](beast::error_code ec, size_t) {
      if (ec) return self->AfterWrite(ec, true);
      self->GeneratePiece(close);
    });
  }

  void AfterWrite(beast::error_code ec, bool close) {
    srv_->inflight_counter()--;
    gen_ = nullptr;
    file_.reset();
    if (linger_ && !ec) return LingerClose();
    if (ec || close || srv_->draining()) return Close();
    ReadHeader();
  }

  // The answer went out before the request body was read (a refused upload): keep reading and
  // discarding what the client still sends, for a while, before closing. Closing a socket with
  // unread data resets the connection, and a client still busy sending its body would see the
  // reset instead of the answer (a lingering close).
  void LingerClose() {
    linger_ = false;
    if constexpr (!kTls) {
      beast::error_code ec;
      Tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
    }
    linger_left_ = kLingerBytes;
    Tcp().expires_after(kLingerTime);
    LingerRead();
  }

  void LingerRead() {
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    buf_.consume(buf_.size());
    stream_.async_read_some(asio::buffer(io_buf_),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec || n >= self->linger_left_) return self->Close();
                              self->linger_left_ -= n;
                              self->LingerRead();
                            });
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
  std::optional<http::request_parser<http::empty_body>> hparser_;
  std::optional<http::request_parser<http::string_body>> sparser_;
  std::optional<http::request_parser<http::buffer_body>> bparser_;
  bool first_ = true;
  bool keep_alive_ = true;
  bool is_head_ = false;
  bool expect_continue_ = false;
  bool linger_ = false;   // the request body was left unread: linger before closing
  size_t piece_len_ = 0;  // bytes of the request body gathered in io_buf_
  size_t linger_left_ = 0;
  bool chunked_ = true;
  unsigned version_ = 11;
  // Streaming requests record their own metrics.
  std::string method_;
  std::string route_name_;
  double started_ = 0;
  std::unique_ptr<BodySink> sink_;
  std::shared_ptr<UniqueFd> file_;
  uint64_t file_off_ = 0, file_left_ = 0;
  std::function<Result<size_t>(char*, size_t)> gen_;
  std::string chunk_head_;
  std::string head_text_;  // the header of a file response, sent ahead of sendfile
  std::vector<char> io_buf_;
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
