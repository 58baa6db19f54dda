#include "api/server.h"

#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include "api/range.h"
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

using Clock = std::chrono::steady_clock;
// Sockets and timers bound to one io_context: no type-erased executor on the hot path.
using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
using Timer =
    asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, asio::io_context::executor_type>;

// How often a session with a pending deadline looks at it: timeouts fire up to this late.
Clock::duration TickFor(const ServerOptions& o) {
  auto shortest = std::min(o.request_timeout, o.keepalive_timeout);
  return std::clamp<Clock::duration>(shortest / 4, std::chrono::milliseconds(10),
                                     std::chrono::seconds(1));
}

// The Date field every response carries (RFC 9110 §6.6.1), formatted once a second per thread.
std::string_view CurrentHttpDate() {
  thread_local std::time_t formatted = -1;
  thread_local char buf[kHttpDateSize];
  std::time_t now = std::time(nullptr);
  if (now != formatted) {
    FormatHttpDate(now, buf);
    formatted = now;
  }
  return {buf, kHttpDateSize};
}

void AppendNumber(std::string& out, uint64_t n) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), n);
  out.append(buf, end);
}

// One connection. kTls selects the stream type; everything else is shared.
//
// Every request's headers are read first. A request without a body goes to Router::Dispatch at
// once; a streaming route (uploads) then gets its body piece by piece through a BodySink on the
// worker pool, with back-pressure: the next piece is read only after the previous one is
// consumed. Any other route gets its body buffered (up to the listener's body limit) first.
//
// Timeouts: each wait on the client has a deadline (ExpireAfter). Rather than arming a timer for
// every read and write, one timer per session ticks while a deadline is pending and closes the
// socket once it has passed, which fails the pending operation.
template <bool kTls>
class Session : public std::enable_shared_from_this<Session<kTls>> {
 public:
  using Stream = std::conditional_t<kTls, beast::ssl_stream<Socket>, Socket>;

  Session(Socket&& sock, std::shared_ptr<HttpServer> srv)
      : stream_(MakeStream(std::move(sock), srv)),
        timer_(Sock().get_executor()),
        srv_(std::move(srv)),
        tick_(TickFor(srv_->options())) {}

  void Run() {
    asio::dispatch(Sock().get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->ExpireAfter(self->srv_->options().request_timeout);
        self->stream_.async_handshake(asio::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->StopTimer();  // failed handshakes just close
          self->ReadHeader();
        });
      } else {
        // Once per connection: the response writes below use send and sendfile directly.
        beast::error_code ec;
        self->Sock().native_non_blocking(true, ec);
        self->ReadHeader();
      }
    });
  }

 private:
  static Stream MakeStream(Socket&& sock, const std::shared_ptr<HttpServer>& srv) {
    if constexpr (kTls)
      return Stream(std::move(sock), *srv->options().tls);
    else
      return Stream(std::move(sock));
  }

  Socket& Sock() { return beast::get_lowest_layer(stream_); }

  const Router& router() const { return srv_->router(); }

  static bool IsDisconnect(const beast::error_code& ec) {
    return ec == http::error::end_of_stream || ec == beast::error::timeout ||
           ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
           ec == asio::error::eof || ec == asio::error::bad_descriptor ||
           ec == asio::ssl::error::stream_truncated || ec == http::error::partial_message;
  }

  // The operation about to start must finish within `d`.
  void ExpireAfter(Clock::duration d) {
    deadline_ = Clock::now() + d;
    if (!ticking_ && !stopped_) Tick();
  }

  // What runs next has no deadline (a handler at work, a wait that must not time out).
  void ExpireNever() { deadline_ = Clock::time_point::max(); }

  void Tick() {
    ticking_ = true;
    timer_.expires_after(tick_);
    timer_.async_wait(
        [self = this->shared_from_this()](beast::error_code ec) { self->OnTick(ec); });
  }

  void OnTick(beast::error_code ec) {
    ticking_ = false;
    if (ec || stopped_ || deadline_ == Clock::time_point::max()) return;
    if (Clock::now() < deadline_) return Tick();
    deadline_ = Clock::time_point::max();
    beast::error_code ignored;
    Sock().close(ignored);  // the pending operation completes with an error
  }

  // No more deadlines: lets the session go once its last operation is done.
  void StopTimer() {
    stopped_ = true;
    timer_.cancel();
  }

  // Where a request being handled came from (see chain_).
  enum class Chain { kNone, kRecv, kBuffer };

  void ReadHeader() {
    cors_ = false;  // until a header with Origin is read
    hparser_.emplace();
    hparser_->header_limit(16 << 10);
    // Limits apply once the route is known. (Beast 1.74 compares lengths against an empty
    // optional as "greater", so "no limit" must be spelled as the largest value.)
    hparser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    ExpireAfter(first_ ? srv_->options().request_timeout : srv_->options().keepalive_timeout);
    first_ = false;
    if constexpr (!kTls) {
      if (buf_.size() == 0 && chain_ == Chain::kRecv && !recv_filled_) {
        // Nothing buffered, and the last request was read and answered without the loop
        // polling in between: any data that arrives later is reported after this wait is
        // queued, so waiting first is safe. It replaces the recv that would fail with EAGAIN
        // (Asio re-arms the descriptor instead, at about the same cost) and ends the call
        // chain, so a client that keeps sending cannot make it recurse. (Not when the last recv
        // filled its buffer: more may be waiting, with no new edge to report it.)
        Sock().async_wait(tcp::socket::wait_read,
                          [self = this->shared_from_this()](beast::error_code ec) {
                            if (ec) return self->OnHeader(ec);
                            self->RecvHeader();
                          });
        return;
      }
      if (chain_ != Chain::kNone) {  // pipelined requests: a new turn of the loop, not recursion
        asio::post(Sock().get_executor(),
                   [self = this->shared_from_this()] { self->ParseOrRecvHeader(); });
        return;
      }
      return ParseOrRecvHeader();
    }
    http::async_read_header(
        stream_, buf_, *hparser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Plain TCP reads request headers itself (recv, then Beast's parser on the bytes): the request
  // is answered in the same turn of the loop as the recv that brought it, without the composed
  // operations and the post of Beast's asynchronous read.
  void ParseOrRecvHeader() {
    if (buf_.size() > 0) {
      beast::error_code ec;
      size_t used = hparser_->put(buf_.data(), ec);
      buf_.consume(used);
      if (ec != http::error::need_more) return HandleHeader(Chain::kBuffer, ec);
    }
    RecvHeader();
  }

  void RecvHeader() {
    for (;;) {
      auto space = buf_.prepare(std::max<size_t>(4096, buf_.capacity() - buf_.size()));
      ssize_t n = ::recv(Sock().native_handle(), space.data(), space.size(), MSG_DONTWAIT);
      recv_filled_ = n == static_cast<ssize_t>(space.size());
      if (n > 0) {
        buf_.commit(static_cast<size_t>(n));
        beast::error_code ec;
        size_t used = hparser_->put(buf_.data(), ec);
        buf_.consume(used);
        if (ec == http::error::need_more) continue;
        return HandleHeader(Chain::kRecv, ec);
      }
      if (n == 0)  // the peer closed: between requests that ends the connection
        return OnHeader(hparser_->got_some() || buf_.size() > 0 ? http::error::partial_message
                                                                : http::error::end_of_stream);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return OnHeader(beast::error_code(errno, beast::system_category()));
      // No data yet: this wait is queued before the loop next polls, so no edge is missed.
      Sock().async_wait(tcp::socket::wait_read,
                        [self = this->shared_from_this()](beast::error_code ec) {
                          if (ec) return self->OnHeader(ec);
                          self->RecvHeader();
                        });
      return;
    }
  }

  void HandleHeader(Chain chain, beast::error_code ec) {
    chain_ = chain;
    OnHeader(ec);
    chain_ = Chain::kNone;
  }

  // Answers a request that could not be read, then closes.
  void RefuseMalformed(const Status& st) {
    keep_alive_ = false;
    is_head_ = false;
    version_ = 11;
    srv_->inflight_counter()++;
    started_ = MonotonicSeconds();
    route_name_ = "malformed";
    Write(ErrorResponse(st));
  }

  const std::string& Remote() {
    if (remote_.empty()) {
      beast::error_code ec;
      auto ep = Sock().remote_endpoint(ec);
      if (!ec) remote_ = ep.address().to_string();
    }
    return remote_;
  }

  void OnHeader(beast::error_code ec) {
    if (IsDisconnect(ec)) return Close();
    if (ec)
      return RefuseMalformed(
          Status(Code::kInvalidArgument, fmt::format("malformed HTTP request: {}", ec.message())));
    auto& hdr = hparser_->get();
    keep_alive_ = hdr.keep_alive();
    version_ = hdr.version();
    cors_ = hdr.find(http::field::origin) != hdr.end();
    is_head_ = hdr.method() == http::verb::head;
    auto req = std::make_shared<HttpRequest>();
    ParseTarget(hdr.target(), req->path, req->query);
    if (!router().IsStreaming(hdr.method(), req->path)) {
      if (hparser_->is_done()) {  // no body (a GET): nothing more to read
        req->msg = http::request<http::string_body>(std::move(hparser_->release().base()));
        return Dispatch(std::move(req));
      }
      pending_ = std::move(req);
      sparser_.emplace(std::move(*hparser_));
      sparser_->body_limit(srv_->options().body_limit);
      http::async_read(
          stream_, buf_, *sparser_,
          [self = this->shared_from_this()](beast::error_code ec2, size_t) { self->OnRead(ec2); });
      return;
    }
    req->msg.base() = hdr.base();
    req->remote = Remote();
    srv_->inflight_counter()++;
    started_ = MonotonicSeconds();
    method_ = std::string(hdr.method_string());
    route_name_ = req->path;
    expect_continue_ = beast::iequals(hdr[http::field::expect], "100-continue");
    ExpireNever();
    router().OpenStream(req, [self = this->shared_from_this()](StreamStart start) {
      auto holder = std::make_shared<StreamStart>(std::move(start));
      asio::post(self->Sock().get_executor(),
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
      ExpireAfter(srv_->options().request_timeout);
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
    ExpireAfter(srv_->options().request_timeout);
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
    bool more_now = Sock().available(aec) > 0;
    if (!bparser_->is_done() && more_now && piece_len_ < io_buf_.size() / 2) return ReadBodyPiece();
    SubmitPiece();
  }

  // Hands the gathered piece of the body to the sink on the pool; reading resumes after it.
  void SubmitPiece() {
    size_t got = piece_len_;
    ExpireNever();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, got] {
      Status st = self->sink_->Write(self->io_buf_.data(), got);
      asio::post(self->Sock().get_executor(), [self, st] {
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
    ExpireNever();  // the sink may take a while to settle (a sync): no deadline on the client
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self] {
      auto res = std::make_shared<HttpResponse>(self->sink_->Finish());
      asio::post(self->Sock().get_executor(), [self, res] { self->EndStream(std::move(*res)); });
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
    ExpireNever();  // aborting the sink may take a while too
    std::shared_ptr<BodySink> sink(std::move(sink_));
    if (res.status >= 300 && sink) {
      Status why(Code::kInternal, fmt::format("request ended with HTTP {}", res.status));
      auto self = this->shared_from_this();
      auto held = std::make_shared<HttpResponse>(std::move(res));
      bool queued = router().pool()->Submit([self, sink, why, held] {
        sink->Abort(why);
        asio::post(self->Sock().get_executor(), [self, held] { self->Write(std::move(*held)); });
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
    auto req = std::move(pending_);
    req->msg = sparser_->release();
    Dispatch(std::move(req));
  }

  void Dispatch(std::shared_ptr<HttpRequest> req) {
    req->remote = Remote();
    srv_->inflight_counter()++;
    route_name_.clear();  // Dispatch records its own metrics
    // Nothing may time out while a handler works on the request.
    ExpireNever();
    // A response given before Dispatch returns (a non-blocking route, or a download answered on
    // the event loop) is written right after it, without a trip through the loop's queue. The
    // session keeps itself alive meanwhile through busy_, so that the callback captures only
    // `this` and fits in std::function without an allocation.
    busy_ = this->shared_from_this();
    dispatching_ = true;
    router().Dispatch(std::move(req), [this](HttpResponse res) {
      auto ex = Sock().get_executor();
      if (ex.running_in_this_thread() && dispatching_) {
        answered_.emplace(std::move(res));
        return;
      }
      asio::post(ex, [self = std::move(busy_), res = std::move(res)]() mutable {
        self->Write(std::move(res));
      });
    });
    dispatching_ = false;
    if (answered_) {
      auto self = std::move(busy_);
      HttpResponse res = std::move(*answered_);
      answered_.reset();
      Write(std::move(res));
    }
  }

  // How a response's body is delimited.
  enum class Framing {
    kNone,        // no body (HEAD of a streamed body on HTTP/1.0, 1xx/204/304)
    kLength,      // Content-Length
    kChunked,     // Transfer-Encoding: chunked
    kUntilClose,  // the end of the connection ends the body (HTTP/1.0 streams)
  };

  // Builds the response header in head_ by hand (Beast's serializer would first copy every
  // field into a list of its own); returns whether the connection stays open after it.
  bool FormatHead(const HttpResponse& r, Framing framing, uint64_t length) {
    const bool keep = keep_alive_ && !srv_->draining() && framing != Framing::kUntilClose;
    head_.clear();
    head_ += "HTTP/";
    head_ += static_cast<char>('0' + version_ / 10 % 10);
    head_ += '.';
    head_ += static_cast<char>('0' + version_ % 10);
    head_ += ' ';
    AppendNumber(head_, r.status);
    head_ += ' ';
    head_ += std::string_view(http::obsolete_reason(static_cast<http::status>(r.status)));
    head_ += "\r\nServer: sluice\r\nDate: ";
    head_ += CurrentHttpDate();
    head_ += "\r\n";
    auto field = [this](std::string_view k, std::string_view v) {
      head_ += k;
      head_ += ": ";
      head_ += v;
      head_ += "\r\n";
    };
    if (!r.content_type.empty()) field("Content-Type", r.content_type);
    for (const auto& [k, v] : r.headers) field(k, v);
    head_ += r.header_lines;
    if (!router().cors_headers().empty()) {
      // The answer differs with and without Origin: caches must keep them apart.
      head_ += "Vary: Origin\r\n";
      if (cors_)
        for (const auto& [k, v] : router().cors_headers()) field(k, v);
    }
    if (framing == Framing::kLength) {
      head_ += "Content-Length: ";
      AppendNumber(head_, length);
      head_ += "\r\n";
    } else if (framing == Framing::kChunked) {
      head_ += "Transfer-Encoding: chunked\r\n";
    }
    if (version_ >= 11 && !keep) head_ += "Connection: close\r\n";
    if (version_ < 11 && keep) head_ += "Connection: keep-alive\r\n";
    head_ += "\r\n";
    return keep;
  }

  void Write(HttpResponse r) {
    if (!route_name_.empty()) router().Observe(method_, route_name_, r.status, started_);
    route_name_.clear();
    ExpireAfter(srv_->options().request_timeout);
    if (r.file) {
      bool keep = FormatHead(r, Framing::kLength, r.file_length);
      if (!is_head_) return WriteFile(std::move(r), !keep);
      return WriteHead(!keep);
    }
    if (r.generator) {
      Framing f =
          version_ >= 11 ? Framing::kChunked : (is_head_ ? Framing::kNone : Framing::kUntilClose);
      bool keep = FormatHead(r, f, 0);
      if (is_head_) return WriteHead(!keep);
      chunked_ = f == Framing::kChunked;
      gen_ = std::move(r.generator);
      WriteHeadThen(
          [self = this->shared_from_this(), close = !keep] { self->GeneratePiece(close); });
      return;
    }
    // 1xx, 204 and 304 have no body and no Content-Length (RFC 9110 §8.6).
    bool bodiless = r.status < 200 || r.status == 204 || r.status == 304;
    bool keep = FormatHead(r, bodiless ? Framing::kNone : Framing::kLength, r.body.size());
    if (is_head_ || bodiless) return WriteHead(!keep);
    body_ = std::move(r.body);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(head_), asio::buffer(body_)};
    asio::async_write(
        stream_, bufs,
        [self = this->shared_from_this(), close = !keep](beast::error_code ec, size_t) {
          self->body_.clear();
          self->AfterWrite(ec, close);
        });
  }

  // Writes head_ alone: the whole response.
  void WriteHead(bool close) {
    asio::async_write(stream_, asio::buffer(head_),
                      [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                        self->AfterWrite(ec, close);
                      });
  }

  // Writes head_, then calls `next` for the body.
  template <typename Next>
  void WriteHeadThen(Next next) {
    asio::async_write(stream_, asio::buffer(head_),
                      [self = this->shared_from_this(), next](beast::error_code ec, size_t) {
                        if (ec) return self->AfterWrite(ec, true);
                        next();
                      });
  }

  void WriteFile(HttpResponse r, bool close) {
    file_ = std::move(r.file);
    file_off_ = r.file_offset;
    file_left_ = r.file_length;
    if constexpr (!kTls) {
      // The header goes out with MSG_MORE so that it shares a segment with the first bytes of
      // the file (one packet for a small file instead of two). What the socket does not take at
      // once is written asynchronously before the body.
      ssize_t n = ::send(Sock().native_handle(), head_.data(), head_.size(),
                         (file_left_ > 0 ? MSG_MORE : 0) | MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        return AfterWrite(beast::error_code(errno, beast::system_category()), true);
      size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
      if (sent == head_.size()) return SendFileBody(close);
      asio::async_write(stream_, asio::buffer(head_.data() + sent, head_.size() - sent),
                        [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                          if (ec) return self->AfterWrite(ec, true);
                          self->SendFileBody(close);
                        });
      return;
    }
    WriteHeadThen([self = this->shared_from_this(), close] { self->SendFileBody(close); });
  }

  void SendFileBody(bool close) {
    if constexpr (!kTls) {
      // Zero-copy: the kernel moves page-cache pages straight to the socket (non-blocking since
      // Run).
      while (file_left_ > 0) {
        off_t off = static_cast<off_t>(file_off_);
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(file_left_, 16u << 20));
        ssize_t n = ::sendfile(Sock().native_handle(), file_->get(), &off, chunk);
        if (n > 0) {
          file_off_ += static_cast<uint64_t>(n);
          file_left_ -= static_cast<uint64_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          // A slow reader: it has request_timeout to take more, each time it takes some.
          ExpireAfter(srv_->options().request_timeout);
          Sock().async_wait(tcp::socket::wait_write,
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
      ExpireAfter(srv_->options().request_timeout);
      asio::async_write(stream_, asio::buffer(io_buf_.data(), static_cast<size_t>(n)),
                        [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                          if (ec) return self->AfterWrite(ec, true);
                          self->SendFileBody(close);
                        });
    }
  }

  // Runs the generator on the pool, then sends what it produced as one chunk.
  void GeneratePiece(bool close) {
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    ExpireNever();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, close] {
      auto n = self->gen_(self->io_buf_.data(), self->io_buf_.size());
      asio::post(self->Sock().get_executor(), [self, close, n] { self->SendPiece(n, close); });
    });
    if (!queued) AfterWrite(beast::error_code(EAGAIN, beast::system_category()), true);
  }

  void SendPiece(const Result<size_t>& n, bool close) {
    if (!n.ok()) {
      spdlog::warn("{} listener: response body failed midway: {}", srv_->options().name,
                   n.status().ToString());
      return AfterWrite(beast::error_code(EIO, beast::system_category()), true);
    }
    ExpireAfter(srv_->options().request_timeout);
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
      Sock().shutdown(tcp::socket::shutdown_send, ec);
    }
    linger_left_ = kLingerBytes;
    ExpireAfter(kLingerTime);
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
      ExpireAfter(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
        beast::error_code ec2;
        self->Sock().close(ec2);
        self->StopTimer();
      });
    } else {
      Sock().shutdown(tcp::socket::shutdown_send, ec);
      StopTimer();
    }
  }

  Stream stream_;
  Timer timer_;
  std::shared_ptr<HttpServer> srv_;
  const Clock::duration tick_;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool ticking_ = false;
  bool stopped_ = false;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::empty_body>> hparser_;
  std::optional<http::request_parser<http::string_body>> sparser_;
  std::optional<http::request_parser<http::buffer_body>> bparser_;
  std::shared_ptr<HttpRequest> pending_;  // a request whose body is being read
  std::shared_ptr<Session> busy_;         // this session, while Router::Dispatch has its request
  bool dispatching_ = false;
  std::optional<HttpResponse> answered_;  // given while dispatching_
  std::string remote_;                    // the peer's address, looked up once
  // Where the request being handled in the current call came from, while that call lasts:
  // kRecv means the loop has not polled since the recv that brought it.
  Chain chain_ = Chain::kNone;
  bool first_ = true;
  bool keep_alive_ = true;
  bool is_head_ = false;
  bool cors_ = false;         // the request carries Origin: the answer gets the CORS headers
  bool recv_filled_ = false;  // the last header recv filled its buffer
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
  std::string head_;  // the response header being written
  std::string body_;  // a response body being written
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
  // The connection is accepted straight onto the event loop that will serve it.
  auto sock = std::make_shared<Socket>(loops_.Next().get_executor());
  acceptor_.async_accept(*sock, [self = shared_from_this(), sock](beast::error_code ec) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !self->acceptor_.is_open()) return;
      spdlog::warn("{} listener: accept failed: {}", self->opts_.name, ec.message());
    } else {
      sock->set_option(tcp::no_delay(true), ec);
      if (self->opts_.tls)
        std::make_shared<Session<true>>(std::move(*sock), self)->Run();
      else
        std::make_shared<Session<false>>(std::move(*sock), self)->Run();
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
