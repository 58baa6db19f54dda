#include "api/connection.h"

#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include "api/http_parser.h"
#include "api/response_head.h"
#include "api/server.h"
#include "common/clock.h"
#include "common/residency.h"
#include "volume/volume.h"

namespace sluice::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kIoChunk = 256 << 10;
// Unparsed bytes a connection may hold: room for one large read of an upload body. Framing that
// does not fit (a chunk line or trailer that never ends) is refused with 431.
constexpr size_t kMaxBuffered = 2 * kIoChunk;
// sendfile moves at most this much per call, so that one large file does not hold the loop.
constexpr uint64_t kSendfileChunk = 16 << 20;
// File bodies up to this size are read and sent with their header in one send (SendSmallFile).
constexpr size_t kSmallBody = 16 << 10;
// A lingering close reads and discards at most this much, for at most this long.
constexpr size_t kLingerBytes = 64 << 20;
constexpr auto kLingerTime = std::chrono::seconds(10);

// A request body's sink or a generated body runs on the pool, where an exception has nowhere
// to go but std::terminate: it ends its request as an internal error instead.
template <typename F>
auto Guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    spdlog::error("{}: unexpected exception: {}", what, e.what());
    return Status(Code::kInternal, fmt::format("internal error: {}", e.what()));
  }
}

using Clock = std::chrono::steady_clock;
using Timer =
    asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, asio::io_context::executor_type>;

// How often a connection with a pending deadline looks at it: timeouts fire up to this late.
Clock::duration TickFor(const ServerOptions& o) {
  auto shortest = std::min(o.request_timeout, o.keepalive_timeout);
  return std::clamp<Clock::duration>(shortest / 4, std::chrono::milliseconds(10),
                                     std::chrono::seconds(1));
}

// Where lingering closes put what they discard: shared by the connections of a loop thread
// (the bytes are never looked at), so that a thousand refused uploads cost no buffers.
char* DiscardBuffer() {
  thread_local std::array<char, 16 << 10> buf;
  return buf.data();
}

// X-Request-ID as the client sent it when it is short and plain, so that logs on both sides
// match; anything else is replaced by a generated id.
std::string RequestIdFrom(const http::request_header<>& h) {
  auto it = h.find("X-Request-ID");
  if (it != h.end()) {
    std::string_view v = it->value();
    bool sane = !v.empty() && v.size() <= 64 && std::all_of(v.begin(), v.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
    if (sane) return std::string(v);
  }
  return {};
}

// Every request's header is read first and parsed by RequestParser (limits: http_parser.h). The
// route is found and the request authenticated on the header alone; a refused request is
// answered without its body being read (a lingering close then discards what the client still
// sends). A streaming route (uploads) gets its body piece by piece through a BodySink on the
// worker pool, with back-pressure: the next piece is read only after the previous one is
// consumed. Any other route gets its body buffered first, up to its limit and within the
// listener's body budget.
//
// Timeouts: each wait on the client has a deadline (ExpireAfter). Rather than arming a timer for
// every read and write, one timer per connection ticks while a deadline is pending and closes
// the socket once it has passed, which fails the pending operation.
template <bool kTls>
class Connection : public std::enable_shared_from_this<Connection<kTls>> {
 public:
  using Stream = std::conditional_t<kTls, beast::ssl_stream<Socket>, Socket>;

  Connection(Socket&& sock, std::shared_ptr<HttpServer> srv)
      : stream_(MakeStream(std::move(sock), srv)),
        timer_(Sock().get_executor()),
        srv_(std::move(srv)),
        tick_(TickFor(srv_->options())) {}

  ~Connection() {
    EndRequest();  // a connection dropped mid-request (an exception, a closed loop)
    if (cancel_) cancel_->store(true);
    srv_->ConnectionClosed();
  }

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
  const ServerOptions& opts() const { return srv_->options(); }

  static bool IsDisconnect(const beast::error_code& ec) {
    return ec == http::error::end_of_stream || ec == beast::error::timeout ||
           ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
           ec == asio::error::eof || ec == asio::error::bad_descriptor ||
           ec == asio::error::broken_pipe || ec == asio::error::not_connected ||
           ec == asio::error::connection_aborted || ec == asio::error::network_reset ||
           ec == asio::error::timed_out || ec == asio::error::host_unreachable ||
           ec == asio::error::network_unreachable || ec == asio::ssl::error::stream_truncated ||
           ec == http::error::partial_message;
  }

  // ---- deadlines

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

  // No more deadlines: lets the connection go once its last operation is done.
  void StopTimer() {
    stopped_ = true;
    timer_.cancel();
  }

  // ---- request bookkeeping: every request begun is observed and ended exactly once

  void BeginRequest(http::verb method) {
    in_request_ = true;
    observed_ = false;
    method_ = method;
    srv_->inflight_counter()++;
    started_ = MonotonicSeconds();
  }

  void ObserveOnce(unsigned status) {
    if (!in_request_ || observed_) return;
    observed_ = true;
    router().Observe(method_, route_label_, status, started_);
  }

  void EndRequest() {
    if (!in_request_) return;
    in_request_ = false;
    srv_->inflight_counter()--;
  }

  // ---- reading requests

  void ReadHeader() {
    cors_ = false;  // until a header with Origin is read
    parser_.emplace(opts().parser_limits);
    route_ = nullptr;
    route_label_ = "malformed";
    ExpireAfter(first_ ? opts().request_timeout : opts().keepalive_timeout);
    first_ = false;
    if constexpr (!kTls) {
      if (buf_.size() == 0) return RecvHeader();  // nothing left over from the last read
      if (in_header_call_) {  // pipelined requests: a new turn of the loop, not recursion
        asio::post(Sock().get_executor(),
                   [self = this->shared_from_this()] { self->ParseOrRecvHeader(); });
        return;
      }
      return ParseOrRecvHeader();
    }
    http::async_read_header(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Plain TCP reads request headers itself (a receive, then the parser on the bytes): the
  // request is answered in the same turn of the loop as the receive that brought it, without
  // the composed operations and the post of Beast's asynchronous read.
  void ParseOrRecvHeader() {
    if (buf_.size() > 0) {
      beast::error_code ec;
      size_t used = parser_->put(buf_.data(), ec);
      buf_.consume(used);
      if (ec != http::error::need_more) return HandleHeader(ec);
    }
    RecvHeader();
  }

  // Through Asio's own receive, not recv plus an async_wait (until 2026-12-07): Asio's read
  // tries a recv at once, which in a busy keep-alive connection often finds the next request
  // there already (the answer's client runs on another core), and otherwise fails with EAGAIN
  // and is queued for the next readiness event with no further call; the async_wait re-armed
  // the descriptor with epoll_ctl on every request and always waited for the next poll. (GET
  // benchmark: no epoll_ctl, 0.42 failed recv a request.) Its completion never runs inside
  // the call that started it, so a client that keeps sending cannot make this recurse.
  void RecvHeader() {
    size_t room = buf_.max_size() - buf_.size();
    if (room == 0) return HandleHeader(http::error::buffer_overflow);
    auto space =
        buf_.prepare(std::min(room, std::max<size_t>(4096, buf_.capacity() - buf_.size())));
    Sock().async_read_some(space,
                           [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                             self->OnRecvHeader(ec, n);
                           });
  }

  void OnRecvHeader(beast::error_code ec, size_t n) {
    if (ec == asio::error::eof)  // the peer closed: between requests that ends the connection
      return OnHeader(parser_->got_some() || buf_.size() > 0 ? http::error::partial_message
                                                             : http::error::end_of_stream);
    if (ec) return OnHeader(ec);
    buf_.commit(n);
    size_t used = parser_->put(buf_.data(), ec);
    buf_.consume(used);
    if (ec == http::error::need_more) return RecvHeader();
    HandleHeader(ec);
  }

  void HandleHeader(beast::error_code ec) {
    in_header_call_ = true;
    OnHeader(ec);
    in_header_call_ = false;
  }

  const std::string& Remote() {
    if (remote_.empty()) {
      beast::error_code ec;
      auto ep = Sock().remote_endpoint(ec);
      if (!ec) remote_ = ep.address().to_string();
    }
    return remote_;
  }

  // Answers a request that could not be read, then closes (lingering: the client may still be
  // sending what could not be parsed).
  void RefuseMalformed(const Status& st) {
    if (!in_request_) BeginRequest(parser_ ? parser_->header().method() : http::verb::unknown);
    route_label_ = "malformed";
    keep_alive_ = false;
    is_head_ = false;
    version_ = 11;
    linger_ = true;
    Write(router().Error(st));
  }

  void OnHeader(beast::error_code ec) {
    expect_continue_ = false;  // this request's, once its header is read (not the last one's)
    if (IsDisconnect(ec)) return Close();
    if (ec) return RefuseMalformed(ParseFailureStatus(ec, opts().body_limit));
    auto& hdr = parser_->header();
    keep_alive_ = parser_->keep_alive();
    version_ = hdr.version();
    cors_ = hdr.find(http::field::origin) != hdr.end();
    is_head_ = hdr.method() == http::verb::head;
    BeginRequest(hdr.method());
    auto req = std::make_shared<HttpRequest>();
    ParseTarget(hdr.target(), req->path, req->query, router().query_skip_prefix());
    req->ctx.id = RequestIdFrom(hdr);
    req->msg.base() = std::move(hdr);
    req->remote = Remote();
    req->ctx.deadline = Clock::now() + opts().request_timeout;
    if (!cancel_) cancel_ = std::make_shared<std::atomic<bool>>(false);
    req->ctx.cancelled = cancel_;

    auto match = router().Find(*req);
    route_label_ = match.label;
    if (match.answer) return AnswerEarly(std::move(*match.answer));
    route_ = match.route;
    if (auto refusal = router().Authenticate(*route_, *req))
      return AnswerEarly(std::move(*refusal));

    // An HTTP/1.0 client's expectation is ignored (RFC 9110 §10.1.1).
    expect_continue_ =
        version_ >= 11 && beast::iequals(req->msg[http::field::expect], "100-continue");
    if (route_->stream) {
      ExpireNever();
      router().OpenStream(*route_, req, [self = this->shared_from_this()](StreamStart start) {
        auto holder = std::make_shared<StreamStart>(std::move(start));
        asio::post(self->Sock().get_executor(),
                   [self, holder] { self->OnStreamStart(std::move(*holder)); });
      });
      return;
    }
    if (parser_->is_done()) return Dispatch(std::move(req));

    // A body to buffer: whether it may come is decided before any of it is read.
    const uint64_t limit = route_->body_limit.value_or(opts().body_limit);
    auto declared = parser_->content_length();
    if ((declared && *declared > limit) || limit == 0)
      return AnswerEarly(router().Error(Status(
          Code::kTooLarge,
          limit == 0
              ? fmt::format("{} {} takes no request body", std::string(req->msg.method_string()),
                            route_->name)
              : fmt::format("request body of {} bytes exceeds {} bytes", *declared, limit))));
    req->body_lease = srv_->ReserveBody(declared ? *declared : limit);
    if (!req->body_lease) {
      HttpResponse r = router().Error(
          Status(Code::kUnavailable, "too many request bodies are being received; retry shortly"));
      return AnswerEarly(std::move(r));
    }
    body_limit_ = limit;
    parser_->BodyToString(&req->msg.body(), limit);
    pending_ = std::move(req);
    ContinueThen([this] { ReadBody(); }, [this](beast::error_code) { Close(); });
  }

  // Sends "100 Continue" to a client that waits for it before sending its body, then runs
  // `next`; `fail` when that write fails. (The callbacks run while the write's handler holds the
  // connection.)
  template <typename Next, typename Fail>
  void ContinueThen(Next next, Fail fail) {
    // Sent for an empty body too: botocore, told the final answer without a 100 first, leaves
    // its connection unusable for the next request (which then waits for its read timeout).
    if (!expect_continue_) return next();
    expect_continue_ = false;
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    ExpireAfter(opts().request_timeout);
    asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                      [self = this->shared_from_this(), next, fail](beast::error_code ec, size_t) {
                        if (ec) return fail(ec);
                        next();
                      });
  }

  void ReadBody() {
    ExpireAfter(opts().request_timeout);
    http::async_read(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (IsDisconnect(ec)) {
      pending_.reset();
      return Close();
    }
    if (ec) {
      pending_.reset();
      keep_alive_ = false;
      linger_ = true;
      return Write(router().Error(ParseFailureStatus(ec, body_limit_)));
    }
    Dispatch(std::move(pending_));
  }

  // Answers a request on its header alone. Its body, if any, is never read: the connection
  // cannot carry another request after it, and a lingering close discards what still comes.
  void AnswerEarly(HttpResponse res) {
    if (!parser_->is_done()) {
      keep_alive_ = false;
      linger_ = true;
    } else if (expect_continue_) {
      // An empty body the client still waits to be asked for (botocore's PUT of a "dir/"
      // marker): the 100 first, as for any body, or its connection hangs on the next request.
      auto held = std::make_shared<HttpResponse>(std::move(res));
      return ContinueThen([this, held] { Write(std::move(*held)); },
                          [this](beast::error_code) { Close(); });
    }
    Write(std::move(res));
  }

  void Dispatch(std::shared_ptr<HttpRequest> req) {
    // Nothing may time out while a handler works on the request.
    ExpireNever();
    // A response given before Dispatch returns (a non-blocking route, or a download answered on
    // the event loop) is written right after it, without a trip through the loop's queue. The
    // connection keeps itself alive meanwhile through busy_, so that the callback captures only
    // `this` and fits in std::function without an allocation.
    busy_ = this->shared_from_this();
    dispatching_ = true;
    router().Dispatch(*route_, std::move(req), [this](HttpResponse res) {
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

  // ---- streamed request bodies

  void OnStreamStart(StreamStart start) {
    if (auto* res = std::get_if<HttpResponse>(&start)) return AnswerEarly(std::move(*res));
    sink_ = std::move(std::get<std::unique_ptr<BodySink>>(start));
    ContinueThen([this] { ReadBodyPiece(); }, [this](beast::error_code ec) { AbortStream(ec); });
  }

  void ReadBodyPiece() {
    if (parser_->is_done()) return piece_len_ ? SubmitPiece() : FinishStream();
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    // Socket reads go through buf_: give it room for large reads (Beast sizes a read by the
    // buffer's free capacity, and the header alone left it at a few hundred bytes).
    buf_.reserve(std::min(kIoChunk, buf_.max_size() - buf_.size()));
    parser_->BodyToBuffer(io_buf_.data() + piece_len_, io_buf_.size() - piece_len_);
    ExpireAfter(opts().request_timeout);
    http::async_read_some(
        stream_, buf_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBodyPiece(ec); });
  }

  void OnBodyPiece(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      if (IsDisconnect(ec)) return AbortStream(ec);
      // Bad framing mid-body: the sink settles, the client hears why (lingering: the client
      // may still be sending).
      keep_alive_ = false;
      linger_ = true;
      return FailStream(ParseFailureStatus(ec, 0));
    }
    piece_len_ = io_buf_.size() - parser_->buffer_left();
    if (piece_len_ == 0) return ReadBodyPiece();
    // Gather more while more is at hand, so that the sink gets large pieces (each one is a hop
    // to the pool); what has arrived is handed over as soon as the socket runs dry. Bytes left
    // in buf_ do not count, and in a chunked body neither do fewer than a chunk's framing can
    // take: a read of framing alone would wait for the next chunk with this piece held back
    // (a client pausing between chunks would see no progress).
    beast::error_code aec;
    const size_t at_hand = Sock().available(aec);
    const size_t framing =
        parser_->chunked() ? 2 + 16 + opts().parser_limits.chunk_extension + 2 : 0;
    bool more_now = at_hand > framing;
    if (!parser_->is_done() && more_now && piece_len_ < io_buf_.size() / 2) return ReadBodyPiece();
    SubmitPiece();
  }

  // Hands the gathered piece of the body to the sink on the pool; reading resumes after it.
  void SubmitPiece() {
    size_t got = piece_len_;
    ExpireNever();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, got] {
      Status st =
          Guarded("request body", [&] { return self->sink_->Write(self->io_buf_.data(), got); });
      asio::post(self->Sock().get_executor(), [self, st] {
        self->piece_len_ = 0;
        if (!st.ok()) {
          self->keep_alive_ = self->parser_->is_done() && self->keep_alive_;
          self->linger_ = !self->parser_->is_done();
          return self->FailStream(st);
        }
        self->ReadBodyPiece();
      });
    });
    if (!queued) {
      keep_alive_ = false;
      linger_ = !parser_->is_done();
      FailStream(Status(Code::kUnavailable, "server is overloaded; retry later"));
    }
  }

  void FinishStream() {
    ExpireNever();  // the sink may take a while to settle (a sync): no deadline on the client
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self] {
      auto res =
          std::make_shared<HttpResponse>(self->Settle([&] { return self->sink_->Finish(); }));
      asio::post(self->Sock().get_executor(), [self, res] {
        self->sink_.reset();
        self->Write(std::move(*res));
      });
    });
    if (!queued) {
      keep_alive_ = false;
      FailStream(Status(Code::kUnavailable, "server is overloaded; retry later"));
    }
  }

  // Ends a streamed request with `error`: the sink settles first (an upload's offset advanced
  // and its lock released, say) and then says what the client is told.
  void FailStream(const Status& error) {
    ExpireNever();  // settling may take a while too
    std::shared_ptr<BodySink> sink(std::move(sink_));
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, sink, error] {
      auto res = std::make_shared<HttpResponse>(self->Settle([&] { return sink->Fail(error); }));
      asio::post(self->Sock().get_executor(), [self, res] { self->Write(std::move(*res)); });
    });
    // The pool is full: settle here rather than not at all.
    if (!queued) Write(Settle([&] { return sink->Fail(error); }));
  }

  // The connection failed mid-body: tell the sink (on the pool), count the request, close.
  void AbortStream(beast::error_code ec) {
    std::shared_ptr<BodySink> sink(std::move(sink_));
    Status why(Code::kUnavailable, fmt::format("connection lost: {}", ec.message()));
    auto abort = [sink, why] {
      (void)Guarded("request body", [&] {
        sink->Abort(why);
        return Status::Ok();
      });
    };
    if (sink && !router().pool()->Submit(abort)) abort();
    Close();
  }

  // A sink's last answer (Finish, Fail), or an internal error when it throws.
  template <typename F>
  HttpResponse Settle(F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      spdlog::error("{} listener: request body: unexpected exception: {}", opts().name, e.what());
      keep_alive_ = false;
      return router().Error(Status(Code::kInternal, fmt::format("internal error: {}", e.what())));
    }
  }

  // ---- writing responses

  bool FormatHead(const HttpResponse& r, Framing framing, uint64_t length) {
    HeadOptions o;
    o.version = version_;
    o.keep_alive = keep_alive_ && !srv_->draining() && framing != Framing::kUntilClose;
    o.cors_fields = &router().cors_headers();
    o.cors = cors_;
    o.framing = framing;
    o.length = length;
    FormatResponseHead(head_, r, o);
    return o.keep_alive;
  }

  void Write(HttpResponse r) {
    const bool primed = std::exchange(primed_, false);
    if (!primed && r.file && !is_head_ && r.file_length > 0 && !FirstBytesAtHand(r))
      return ReadFirstThenWrite(std::move(r));
    ObserveOnce(r.status);
    ExpireAfter(opts().request_timeout);
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

  // A file body neither in memory nor in a local file at its start (a block behind an SSD
  // cache that is not cached): its first bytes are read on the pool before the status goes out,
  // so that an origin that does not answer is a 503 with Retry-After, not a 200 cut short.
  // False when it must wait: true for a local file at its start (sent zero-copy), or for bytes
  // in memory, read here into io_buf_ to go out with the head (primed_bytes_).
  bool FirstBytesAtHand(const HttpResponse& r) {
    if constexpr (!kTls) {
      if (r.file->LocalExtent(r.file_offset).fd >= 0) return true;
    }
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(r.file_length, io_buf_.size()));
    auto n = r.file->ReadAtNoWait(r.file_offset, io_buf_.data(), want);
    if (n.ok() && *n > 0) {
      primed_bytes_ = *n;
      return true;
    }
    // Not in memory: read on the pool first. Anything else: the general path answers it.
    return n.ok() || n.status().code() != Code::kUnavailable;
  }
  void ReadFirstThenWrite(HttpResponse r) {
    srv_->CountColdRead();
    ExpireNever();  // the origin, not the client, is slow now
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    auto self = this->shared_from_this();
    auto held = std::make_shared<HttpResponse>(std::move(r));
    bool queued = router().pool()->Submit([self, held] {
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(held->file_length, self->io_buf_.size()));
      auto got = held->file->ReadAt(held->file_offset, self->io_buf_.data(), want);
      Status st = !got.ok()      ? got.status()
                  : *got != want ? Status(Code::kIoError, "the file shrank while being sent")
                                 : Status::Ok();
      asio::post(self->Sock().get_executor(), [self, held, st, want] {
        if (!st.ok()) return self->Write(self->router().Error(st));
        self->primed_ = true;  // the first `want` bytes are in io_buf_: they go with the head
        self->primed_bytes_ = want;
        self->Write(std::move(*held));
      });
    });
    if (!queued)
      Write(router().Error(Status(Code::kUnavailable, "server is overloaded; retry later")));
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

  // ---- file bodies: from the page cache on the loop, the rest read on the I/O pool

  void WriteFile(HttpResponse r, bool close) {
    file_ = std::move(r.file);
    file_off_ = r.file_offset;
    file_left_ = r.file_length;
    resident_until_ = file_off_;
    if (const size_t n = std::exchange(primed_bytes_, 0); n > 0) {  // read before the status
      if constexpr (kTls) {
        // The head, then the bytes: as the rest of the TLS path writes them.
        return WriteHeadThen(
            [self = this->shared_from_this(), n, close] { self->SendBuffered(n, close); });
      } else {
        file_off_ += n;
        file_left_ -= n;
        std::array<asio::const_buffer, 2> bufs{asio::buffer(head_),
                                               asio::buffer(io_buf_.data(), n)};
        asio::async_write(stream_, bufs,
                          [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                            if (ec) return self->AfterWrite(ec, true);
                            self->SendFileBody(close);
                          });
        return;
      }
    }
    if constexpr (!kTls) {
      if (file_left_ > 0 && file_left_ <= kSmallBody && SendSmallFile(close)) return;
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

  // A small file in the page cache goes out with its header in one send, read with RWF_NOWAIT
  // (no probe needed: the read itself refuses to wait on the disk). Two system calls where the
  // zero-copy path takes three (the residency probe, the header, sendfile) for the same packet.
  // False when nothing could be read without waiting: the general path takes over.
  bool SendSmallFile(bool close) {
    thread_local std::array<char, kSmallBody> buf;
    auto n = file_->ReadAtNoWait(file_off_, buf.data(), file_left_);
    if (!n.ok() || *n == 0) return false;  // cold, unreadable or shrunk: the general path says
    const size_t got = *n;
    std::array<iovec, 2> iov{iovec{head_.data(), head_.size()}, iovec{buf.data(), got}};
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    ssize_t sent = ::sendmsg(Sock().native_handle(), &msg,
                             (got < file_left_ ? MSG_MORE : 0) | MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno != EAGAIN && errno != EINTR) {
      AfterWrite(beast::error_code(errno, beast::system_category()), true);
      return true;
    }
    file_off_ += got;
    file_left_ -= got;
    resident_until_ = file_off_;
    const size_t total = head_.size() + got;
    const size_t done = sent > 0 ? static_cast<size_t>(sent) : 0;
    if (done == total) {
      SendFileBody(close);  // the rest of a file read short, or the end of the response
      return true;
    }
    // The socket took only part: the rest is copied (the buffer is the loop's) and written
    // asynchronously.
    body_.clear();
    if (done < head_.size()) body_.append(head_, done);
    const size_t body_done = done > head_.size() ? done - head_.size() : 0;
    body_.append(buf.data() + body_done, got - body_done);
    ExpireAfter(opts().request_timeout);
    asio::async_write(stream_, asio::buffer(body_),
                      [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                        self->body_.clear();
                        if (ec) return self->AfterWrite(ec, true);
                        self->SendFileBody(close);
                      });
    return true;
  }

  // Done with the file body: what went out zero-copy is accounted to the file's volume.
  void ReleaseFile() {
    if (file_ && file_sent_) file_->CountSent(file_sent_);
    file_sent_ = 0;
    file_.reset();
  }

  void SendFileBody(bool close) {
    if (file_left_ == 0) return AfterWrite({}, close);
    if constexpr (!kTls) {
      // Zero-copy for what the page cache holds: the kernel moves its pages straight to the
      // socket (non-blocking since Run). The file's bytes may lie in several local files (an
      // SSD cache's blocks): each extent is sent from its own.
      while (file_left_ > 0) {
        const FileReader::Extent ext = file_->LocalExtent(file_off_);
        if (ext.fd < 0 || ext.length == 0) break;
        const uint64_t chunk = std::min({file_left_, kSendfileChunk, ext.length});
        if (resident_until_ < file_off_ + chunk) {
          Residency res = ProbeResidency(ext.fd, ext.fd_offset, chunk);
          if (res != Residency::kResident) return SendCold(close, res);
          resident_until_ = file_off_ + chunk;
        }
        off_t off = static_cast<off_t>(ext.fd_offset);
        ssize_t n = ::sendfile(Sock().native_handle(), ext.fd, &off, chunk);
        if (n > 0) {
          file_off_ += static_cast<uint64_t>(n);
          file_left_ -= static_cast<uint64_t>(n);
          file_sent_ += static_cast<uint64_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          // A slow reader: it has request_timeout to take more, each time it takes some.
          ExpireAfter(opts().request_timeout);
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
      if (file_left_ == 0) return AfterWrite({}, close);
    }
    // TLS copies anyway, and a file that is not local has no page cache to send from.
    SendCold(close, Residency::kUnknown);
  }

  // Sends the next piece of the file from io_buf_: read here when it is in memory (the page
  // cache: RWF_NOWAIT), else on the I/O pool.
  void SendCold(bool close, Residency residency) {
    if (io_buf_.empty()) io_buf_.resize(kIoChunk);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, io_buf_.size()));
    if (residency != Residency::kCold) {
      auto n = file_->ReadAtNoWait(file_off_, io_buf_.data(), want);
      if (n.ok() && *n > 0) return SendBuffered(*n, close);
      if (n.ok())  // the file shrank: the length promised cannot be kept
        return AfterWrite(beast::error_code(EIO, beast::system_category()), true);
      if (n.status().code() != Code::kUnavailable)
        return AfterWrite(beast::error_code(n.status().sys_errno(), beast::system_category()),
                          true);
      // Not in memory: the pool reads it.
    }
    srv_->CountColdRead();
    ExpireNever();  // the disk, not the client, is slow now
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, want, close] {
      auto got = self->file_->ReadAt(self->file_off_, self->io_buf_.data(), want);
      Status st = !got.ok()      ? got.status()
                  : *got != want ? Status(Code::kIoError, "the file shrank while being sent")
                                 : Status::Ok();
      asio::post(self->Sock().get_executor(), [self, st, want, close] {
        if (!st.ok()) {
          spdlog::warn("{} listener: file body failed midway: {}", self->opts().name,
                       st.ToString());
          return self->AfterWrite(beast::error_code(EIO, beast::system_category()), true);
        }
        self->SendBuffered(want, close);
      });
    });
    if (!queued) AfterWrite(beast::error_code(EAGAIN, beast::system_category()), true);
  }

  void SendBuffered(size_t n, bool close) {
    file_off_ += n;
    file_left_ -= n;
    ExpireAfter(opts().request_timeout);
    asio::async_write(stream_, asio::buffer(io_buf_.data(), n),
                      [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
                        if (ec) return self->AfterWrite(ec, true);
                        self->SendFileBody(close);
                      });
  }

  // ---- generated bodies (archives, multipart ranges, batch gets)

  // Two pieces at most are in hand: the one being sent (io_buf_) and the next, generated on the
  // pool into gen_buf_ meanwhile, so the disk reads and the encoding of a stream overlap its
  // sending (one after the other, a batch get left a core idle). The generator runs for one
  // piece at a time; the connection moves on (AfterWrite) only once neither is in flight.
  void GeneratePiece(bool close) {
    gen_close_ = close;
    gen_failed_ = {};
    gen_ready_.reset();
    Generate();
  }

  void Generate() {
    if (gen_buf_.empty()) gen_buf_.resize(kIoChunk);
    generating_ = true;
    if (!sending_) ExpireNever();
    auto self = this->shared_from_this();
    bool queued = router().pool()->Submit([self, dst = gen_buf_.data(), cap = gen_buf_.size()] {
      Result<size_t> n = Guarded("response body", [&] { return self->gen_(dst, cap); });
      asio::post(self->Sock().get_executor(), [self, n] { self->Generated(n); });
    });
    if (!queued) {
      generating_ = false;
      gen_failed_ = beast::error_code(EAGAIN, beast::system_category());
      if (!sending_) GenFailed(gen_failed_);  // else Sent ends the response
    }
  }

  void Generated(const Result<size_t>& n) {
    generating_ = false;
    if (gen_failed_) return GenFailed(gen_failed_);
    if (sending_) {
      gen_ready_ = n;
      return;
    }
    SendPiece(n);
  }

  // The piece in gen_buf_, with neither a send nor a generation in flight.
  void SendPiece(const Result<size_t>& n) {
    if (!n.ok()) {
      spdlog::warn("{} listener: response body failed midway: {}", opts().name,
                   n.status().ToString());
      return GenFailed(beast::error_code(EIO, beast::system_category()));
    }
    ExpireAfter(opts().request_timeout);
    auto self = this->shared_from_this();
    const bool close = gen_close_;
    if (*n == 0) {
      gen_ = nullptr;
      gen_buf_ = {};  // held only while a generated body goes out
      if (!chunked_) return AfterWrite({}, true);
      asio::async_write(
          stream_, asio::buffer("0\r\n\r\n", 5),
          [self, close](beast::error_code ec, size_t) { self->AfterWrite(ec, close); });
      return;
    }
    std::swap(io_buf_, gen_buf_);
    chunk_head_ = fmt::format("{:x}\r\n", *n);
    // (The write holds a copy of the array; an empty buffer is skipped.)
    std::array<asio::const_buffer, 3> bufs{
        chunked_ ? asio::buffer(chunk_head_) : asio::const_buffer(),
        asio::buffer(io_buf_.data(), *n),
        chunked_ ? asio::buffer("\r\n", 2) : asio::const_buffer()};
    sending_ = true;
    asio::async_write(stream_, bufs, [self](beast::error_code ec, size_t) { self->Sent(ec); });
    Generate();
  }

  void Sent(beast::error_code ec) {
    sending_ = false;
    if (!ec) ec = gen_failed_;
    if (ec) {
      if (generating_) {
        gen_failed_ = ec;  // AfterWrite waits for the generator to give its piece back
        return;
      }
      return GenFailed(ec);
    }
    if (generating_) return ExpireNever();  // the generator, not the client, is slow now
    SendPiece(*std::exchange(gen_ready_, std::nullopt));
  }

  void GenFailed(beast::error_code ec) {
    gen_ready_.reset();
    gen_buf_ = {};
    AfterWrite(ec, true);
  }

  // ---- after a response

  void AfterWrite(beast::error_code ec, bool close) {
    EndRequest();
    gen_ = nullptr;
    ReleaseFile();
    if (linger_ && !ec) return LingerClose();
    if (ec || close || srv_->draining()) return Close();
    ReadHeader();
  }

  // The answer went out before the request was read whole (a refused upload, say): keep reading
  // and discarding what the client still sends, for a while, before closing. Closing a socket
  // with unread data resets the connection, and a client still busy sending its body would see
  // the reset instead of the answer (a lingering close).
  void LingerClose() {
    linger_ = false;
    if constexpr (!kTls) {
      beast::error_code ec;
      Sock().shutdown(tcp::socket::shutdown_send, ec);
    }
    linger_left_ = kLingerBytes;
    ExpireAfter(kLingerTime);
    buf_.consume(buf_.size());
    io_buf_ = {};  // no large buffers held while lingering
    LingerRead();
  }

  void LingerRead() {
    stream_.async_read_some(asio::buffer(DiscardBuffer(), 16 << 10),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec || n >= self->linger_left_) return self->Close();
                              self->linger_left_ -= n;
                              self->LingerRead();
                            });
  }

  void Close() {
    if (in_request_) {
      ObserveOnce(499);  // the client went away before its answer
      EndRequest();
    }
    if (cancel_) cancel_->store(true);
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
  beast::flat_buffer buf_{kMaxBuffered};
  std::optional<RequestParser> parser_;
  const Route* route_ = nullptr;
  std::string_view route_label_ = "malformed";  // the metrics label of the request at hand
  std::shared_ptr<HttpRequest> pending_;        // a request whose body is being read
  uint64_t body_limit_ = 0;                     // of that body
  std::shared_ptr<std::atomic<bool>>
      cancel_;                        // set when the connection goes; its requests share it
  std::shared_ptr<Connection> busy_;  // this connection, while Router::Dispatch has its request
  bool dispatching_ = false;
  std::optional<HttpResponse> answered_;  // given while dispatching_
  std::string remote_;                    // the peer's address, looked up once
  // A request's header is being handled in the current call (HandleHeader): a next request
  // already buffered is read from a new turn of the loop, not by recursion (ReadHeader).
  bool in_header_call_ = false;
  bool first_ = true;
  bool keep_alive_ = true;
  bool is_head_ = false;
  bool primed_ = false;  // the file body's first bytes were read on the pool (ReadFirstThenWrite)
  size_t primed_bytes_ = 0;  // how many, in io_buf_
  bool cors_ = false;        // the request carries Origin: the answer gets the CORS headers
  bool expect_continue_ = false;
  bool linger_ = false;  // the request was left unread: linger before closing
  bool in_request_ = false;
  bool observed_ = false;
  http::verb method_ = http::verb::unknown;
  double started_ = 0;
  size_t piece_len_ = 0;  // bytes of the request body gathered in io_buf_
  size_t linger_left_ = 0;
  bool chunked_ = true;
  unsigned version_ = 11;
  std::unique_ptr<BodySink> sink_;
  std::shared_ptr<FileReader> file_;
  uint64_t file_off_ = 0, file_left_ = 0;
  uint64_t resident_until_ = 0;  // [file_off_, resident_until_) was found in the page cache
  uint64_t file_sent_ = 0;       // bytes of file_ sent zero-copy
  std::function<Result<size_t>(char*, size_t)> gen_;
  std::vector<char> gen_buf_;                // the generated piece that goes out next
  std::optional<Result<size_t>> gen_ready_;  // generated while the piece before was being sent
  beast::error_code gen_failed_;             // the send failed while the generator ran
  bool generating_ = false, sending_ = false, gen_close_ = false;
  std::string chunk_head_;
  std::string head_;  // the response header being written
  std::string body_;  // a response body being written
  std::vector<char> io_buf_;
};

}  // namespace

void ServeConnection(Socket&& sock, std::shared_ptr<HttpServer> srv) {
  // A connection that cannot be set up (out of memory, a TLS context failure) is dropped, never
  // the listener: the counters taken for it are returned here when no Connection took them over.
  std::shared_ptr<void> conn;
  try {
    if (srv->options().tls) {
      auto c = std::make_shared<Connection<true>>(std::move(sock), srv);
      conn = c;
      c->Run();
    } else {
      auto c = std::make_shared<Connection<false>>(std::move(sock), srv);
      conn = c;
      c->Run();
    }
  } catch (const std::exception& e) {
    spdlog::warn("{} listener: dropping a connection: {}", srv->options().name, e.what());
    if (!conn) srv->ConnectionClosed();
  }
}

}  // namespace sluice::api
