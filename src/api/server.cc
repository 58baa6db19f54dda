#include "api/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>

#include "api/connection.h"
#include "api/response_head.h"
#include "common/log.h"
#include "common/metrics.h"

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
    threads_.emplace_back([ctx = ctxs_[i].get()] {
      // The last line of defence: an exception out of a completion handler unwinds that
      // handler (and the connection it held, which closes) and ends run(); the loop goes on
      // with every other connection. Known causes are refused before they throw.
      static LogLimiter limiter(std::chrono::seconds(10));
      static auto& caught = Metrics::Global().Counter(
          "sluice_loop_exceptions_total",
          "Exceptions that escaped a connection's handler on an event loop (the connection "
          "was closed).",
          "");
      for (;;) {
        try {
          ctx->run();
          return;
        } catch (const std::exception& e) {
          caught.fetch_add(1, std::memory_order_relaxed);
          uint64_t held_back = 0;
          if (limiter.Allow(&held_back))
            spdlog::error(
                "event loop: a connection failed with an exception: {} ({} more not "
                "logged)",
                e.what(), held_back);
        }
      }
    });
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

using Clock = std::chrono::steady_clock;
using Timer =
    asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, asio::io_context::executor_type>;

constexpr auto kFirstBackoff = std::chrono::milliseconds(10);
constexpr auto kMaxBackoff = std::chrono::seconds(1);

bool IsFdExhaustion(const beast::error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE ||
         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

// Errors that concern one connection that was on its way in, not the listener.
bool IsTransient(const beast::error_code& ec) {
  return ec == asio::error::connection_aborted || ec.value() == EPROTO || ec.value() == EPERM ||
         ec.value() == ENETDOWN || ec.value() == EHOSTUNREACH || ec.value() == ENETUNREACH ||
         ec.value() == ENOPROTOOPT || ec.value() == EOPNOTSUPP;
}

}  // namespace

struct HttpServer::Acceptor {
  explicit Acceptor(asio::io_context& ctx) : acceptor(ctx), backoff_timer(ctx.get_executor()) {}
  tcp::acceptor acceptor;
  Timer backoff_timer;
  std::chrono::milliseconds backoff{0};
  LogLimiter log_limiter{std::chrono::seconds(10)};
};

HttpServer::HttpServer(IoLoops& loops, ServerOptions opts, std::shared_ptr<const Router> router)
    : loops_(loops), opts_(std::move(opts)), router_(std::move(router)) {
  auto& m = Metrics::Global();
  const std::string l = fmt::format("listener=\"{}\"", opts_.name);
  const char* shed_help =
      "Connections and requests refused before being served (503): over the connection limit, "
      "out of file descriptors, over the request-body budget.";
  shed_limit_ = &m.Counter("sluice_http_shed_total", shed_help, l + ",reason=\"connections\"");
  shed_fds_ = &m.Counter("sluice_http_shed_total", shed_help, l + ",reason=\"fds\"");
  shed_budget_ = &m.Counter("sluice_http_shed_total", shed_help, l + ",reason=\"body-budget\"");
  accept_errors_ = &m.Counter("sluice_http_accept_errors_total",
                              "Failed accepts (descriptors exhausted, network errors).", l);
  open_gauge_ = &m.Gauge("sluice_http_connections", "Open connections being served.", l);
  cold_reads_ = &m.Counter("sluice_http_cold_reads_total",
                           "Response body pieces read on the I/O pool because they were not in "
                           "the page cache (event loops never wait on a disk).",
                           l);
}

HttpServer::~HttpServer() = default;

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
  auto first = std::make_unique<Acceptor>(loops_.At(0));
  auto& a = first->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Status(Code::kUnavailable, fmt::format("{} listener: cannot listen on {}: {}",
                                                  opts_.name, opts_.addr.ToString(), ec.message()));
  port_ = a.local_endpoint().port();
  // Every loop accepts from the same listening socket (a descriptor of its own onto it), so
  // that a busy loop never holds up new connections: the first loop free takes each one.
  const int fd = a.native_handle();
  acceptors_.push_back(std::move(first));
  for (size_t i = 1; i < loops_.size(); ++i) {
    int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
      return Status::FromErrno(errno, fmt::format("{} listener: dup listening socket", opts_.name));
    auto more = std::make_unique<Acceptor>(loops_.At(i));
    more->acceptor.assign(ep.protocol(), dup, ec);
    if (ec) {
      ::close(dup);
      return Status(Code::kUnavailable, fmt::format("{} listener: {}", opts_.name, ec.message()));
    }
    acceptors_.push_back(std::move(more));
  }
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return Status::Ok();
}

void HttpServer::Start() {
  for (size_t i = 0; i < acceptors_.size(); ++i)
    asio::post(acceptors_[i]->acceptor.get_executor(),
               [self = shared_from_this(), i] { self->Accept(i); });
}

std::shared_ptr<void> HttpServer::ReserveBody(uint64_t bytes) {
  uint64_t cur = buffered_.load(std::memory_order_relaxed);
  do {
    if (bytes > opts_.body_budget || cur > opts_.body_budget - bytes) {
      shed_budget_->fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
  } while (!buffered_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  // The lease's pointer is never dereferenced: it only carries the release.
  return std::shared_ptr<void>(this, [self = shared_from_this(), bytes](void*) {
    self->buffered_.fetch_sub(bytes, std::memory_order_relaxed);
  });
}

namespace {

// The answer to a connection that will not be served: the usual problem+json 503, made by the
// same writer as every other answer.
std::string ShedResponse(const char* reason) {
  HttpResponse r = ErrorResponse(Status(
      Code::kUnavailable, fmt::format("the server is at its limit ({}); retry shortly", reason)));
  HeadOptions o;
  o.keep_alive = false;
  o.length = r.body.size();
  std::string out;
  FormatResponseHead(out, r, o);
  return out + r.body;
}

// A shed connection that can afford a descriptor for a moment (over the connection limit):
// answered, then read and discarded for up to a second before closing, so that the client's
// request arriving after the answer does not turn the close into a reset that destroys it.
class Shedding : public std::enable_shared_from_this<Shedding> {
 public:
  Shedding(Socket&& sock, const char* reason, std::shared_ptr<std::atomic<size_t>> live)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        resp_(ShedResponse(reason)),
        live_(std::move(live)) {}
  ~Shedding() { live_->fetch_sub(1, std::memory_order_relaxed); }
  // Starts on the socket's own loop (the accepting loop is another one).
  void Run() {
    asio::dispatch(sock_.get_executor(), [self = shared_from_this()] { self->Start(); });
  }

 private:
  void Start() {
    timer_.expires_after(std::chrono::seconds(1));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->sock_.close(ec);
    });
    asio::async_write(sock_, asio::buffer(resp_),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Done();
                        self->sock_.shutdown(tcp::socket::shutdown_send, ec);
                        self->Drain();
                      });
  }

  void Drain() {
    sock_.async_read_some(asio::buffer(buf_),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->left_ -= std::min(self->left_, n);
                            if (ec || self->left_ == 0) return self->Done();
                            self->Drain();
                          });
  }
  void Done() {
    beast::error_code ec;
    timer_.cancel();
    sock_.close(ec);
  }
  Socket sock_;
  Timer timer_;
  std::string resp_;
  std::array<char, 4096> buf_;
  size_t left_ = 64 << 10;
  std::shared_ptr<std::atomic<size_t>> live_;
};

// At most this many shed connections linger at once; more are closed at once.
constexpr size_t kMaxLingeringSheds = 256;

}  // namespace

void HttpServer::Shed(int fd, const char* reason) {
  // Best effort and never blocking: the client learns why instead of seeing a reset.
  const std::string resp = ShedResponse(reason);
  char drain[4096];
  (void)::recv(fd, drain, sizeof(drain), MSG_DONTWAIT);  // what already came, so close sends FIN
  (void)::send(fd, resp.data(), resp.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

void HttpServer::Accept(size_t i) {
  Acceptor& a = *acceptors_[i];
  // Accepted straight onto the loop that will serve it: round robin keeps the loops balanced.
  auto sock = std::make_shared<Socket>(loops_.Next().get_executor());
  a.acceptor.async_accept(*sock, [self = shared_from_this(), sock, i](beast::error_code ec) {
    Acceptor& a = *self->acceptors_[i];
    if (ec) {
      if (ec == asio::error::operation_aborted || !a.acceptor.is_open()) return;
      return self->OnAcceptError(i, ec);
    }
    a.backoff = std::chrono::milliseconds(0);
    if (self->spare_missing_.load(std::memory_order_relaxed)) {
      std::lock_guard lk(self->spare_mu_);
      self->RefillSpare();
    }
    if (self->connections_.fetch_add(1, std::memory_order_relaxed) >= self->opts_.max_connections) {
      self->connections_.fetch_sub(1, std::memory_order_relaxed);
      self->shed_limit_->fetch_add(1, std::memory_order_relaxed);
      if (self->shedding_->fetch_add(1, std::memory_order_relaxed) < kMaxLingeringSheds) {
        std::make_shared<Shedding>(std::move(*sock), "connection limit", self->shedding_)->Run();
      } else {
        self->shedding_->fetch_sub(1, std::memory_order_relaxed);
        self->Shed(sock->release(ec), "connection limit");
      }
    } else {
      self->open_gauge_->fetch_add(1, std::memory_order_relaxed);
      sock->set_option(tcp::no_delay(true), ec);
      ServeConnection(std::move(*sock), self);
    }
    self->Accept(i);
  });
}

void HttpServer::RefillSpare() {
  if (!spare_fd_.valid()) spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  spare_missing_.store(!spare_fd_.valid(), std::memory_order_relaxed);
}

void HttpServer::OnAcceptError(size_t i, const beast::error_code& ec) {
  Acceptor& a = *acceptors_[i];
  accept_errors_->fetch_add(1, std::memory_order_relaxed);
  uint64_t held_back = 0;
  if (a.log_limiter.Allow(&held_back))
    spdlog::warn("{} listener: accept failed: {} ({} more like it not logged)", opts_.name,
                 ec.message(), held_back);
  if (IsTransient(ec)) return Accept(i);
  if (IsFdExhaustion(ec)) {
    // Free the spare descriptor to answer the connection at the head of the queue; it would
    // otherwise wait, unanswered, until its client gives up.
    std::lock_guard lk(spare_mu_);
    if (spare_fd_.valid()) {
      spare_fd_.reset();
      int fd = ::accept4(a.acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        shed_fds_->fetch_add(1, std::memory_order_relaxed);
        Shed(fd, "out of file descriptors");
      }
    }
    RefillSpare();
  }
  // Back off instead of retrying at once: the condition lasts until connections close.
  a.backoff = a.backoff.count() == 0
                  ? kFirstBackoff
                  : std::min<std::chrono::milliseconds>(a.backoff * 2, kMaxBackoff);
  a.backoff_timer.expires_after(a.backoff);
  a.backoff_timer.async_wait([self = shared_from_this(), i](beast::error_code tec) {
    if (tec || !self->acceptors_[i]->acceptor.is_open()) return;
    self->Accept(i);
  });
}

void HttpServer::Stop() {
  draining_ = true;
  for (auto& a : acceptors_)
    asio::post(a->acceptor.get_executor(), [self = shared_from_this(), acc = a.get()] {
      beast::error_code ec;
      acc->acceptor.close(ec);
      acc->backoff_timer.cancel();
    });
}

}  // namespace sluice::api
