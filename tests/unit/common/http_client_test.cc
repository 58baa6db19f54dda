// The synchronous HTTP client (common/http_client.h) against a server in this process that
// answers the first request on a connection and then holds the next one unanswered.
#include "common/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/assert_status.h"
#include "support/loopback.h"

namespace sluice::net {
namespace {

using namespace std::chrono_literals;

// Counts the requests it reads; answers only the first of each connection (keep-alive), the
// rest never, until the test ends.
class HoldingServer {
 public:
  HoldingServer() {
    listen_ = test::ListenLoopback(&port_, 16);
    accept_ = std::thread([this] {
      for (;;) {
        int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        fds_.push_back(fd);
        workers_.emplace_back([this, fd] { Serve(fd); });
      }
    });
  }
  ~HoldingServer() {
    ::shutdown(listen_, SHUT_RDWR);
    accept_.join();
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : workers_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_);
  }
  int port() const { return port_; }
  int requests() const { return requests_; }

 private:
  void Serve(int fd) {
    std::string in;
    char buf[4096];
    for (int n = 0;; ++n) {
      while (in.find("\r\n\r\n") == std::string::npos) {
        ssize_t k = ::recv(fd, buf, sizeof buf, 0);
        if (k <= 0) return;
        in.append(buf, static_cast<size_t>(k));
      }
      in.erase(0, in.find("\r\n\r\n") + 4);  // (no bodies in this test)
      requests_++;
      if (n > 0) continue;  // held: read on, answer nothing
      const std::string a = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
      ::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
    }
  }
  int listen_ = -1, port_ = 0;
  std::thread accept_;
  std::vector<int> fds_;
  std::vector<std::thread> workers_;
  std::atomic<int> requests_{0};
};

// A request on a kept-alive connection that times out waiting for its answer was received, and
// may be running: it is not sent again. Before, it was retried once on a fresh connection, so a
// slow POST (a clone, a delete) ran twice.
TEST(HttpClient, ARequestThatTimedOutIsNotSentAgain) {
  HoldingServer server;
  ClientOptions o;
  o.endpoint.host = "127.0.0.1";
  o.endpoint.port = std::to_string(server.port());
  o.timeout = 300ms;
  Client c(o);
  auto first = c.Request(boost::beast::http::verb::get, "/one", nullptr);
  ASSERT_OK(first);
  EXPECT_EQ(first->status, 200u);
  auto second = c.Request(boost::beast::http::verb::post, "/slow", nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("timed out"), std::string::npos)
      << second.status().ToString();
  std::this_thread::sleep_for(200ms);  // a retry would have arrived by now
  EXPECT_EQ(server.requests(), 2);
}

}  // namespace
}  // namespace sluice::net
