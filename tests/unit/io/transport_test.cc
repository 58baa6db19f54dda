// The s3 origin transport (io/s3/transport.h) against a small HTTP server in this process:
// clients share its connections, at most max-connections run at once, a request waits for one
// in order, and one that waits past the queue timeout fails at once without a retry.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/checksum.h"
#include "common/crypto.h"
#include "io/s3/s3_client.h"
#include "io/s3/transport.h"
#include "support/assert_status.h"
#include "support/loopback.h"

namespace sluice::test {
namespace {

using namespace std::chrono_literals;
namespace s3 = io::s3;

// Answers every GET "200 ok" (Range or not) on kept-alive connections, a listing with a
// truncated page that names the same continuation token every time; a GET of a path holding "hang"
// is answered only once Release() is called (or, for "hang-<tag>", Release(tag)). A handler set
// with Handle() answers first: it writes its answer to the connection and returns true.
class TinyHttp {
 public:
  using Handler =
      std::function<bool(const std::string& head, int fd)>;  // head: request and headers
  void Handle(Handler h) {
    std::lock_guard lk(mu_);
    handler_ = std::move(h);
  }
  bool stopping() {
    std::lock_guard lk(mu_);
    return stopping_;
  }
  TinyHttp() {
    listen_ = test::ListenLoopback(&port_);
    accept_ = std::thread([this] {
      for (;;) {
        int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        std::lock_guard lk(mu_);
        if (stopping_) {
          ::close(fd);
          return;
        }
        accepted_++;
        conns_.push_back(fd);
        workers_.emplace_back([this, fd] { Serve(fd); });
      }
    });
  }
  ~TinyHttp() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    ::shutdown(listen_, SHUT_RDWR);
    accept_.join();
    for (auto& t : workers_) t.join();
    for (int fd : conns_) ::close(fd);
    ::close(listen_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int accepted() {
    std::lock_guard lk(mu_);
    return accepted_;
  }
  int hanging() {
    std::lock_guard lk(mu_);
    return hanging_;
  }
  std::vector<std::string> lines() {  // the request lines seen
    std::lock_guard lk(mu_);
    return lines_;
  }
  // The body of the last request whose line holds `part` ("" when none).
  std::string body_of(std::string_view part) {
    std::lock_guard lk(mu_);
    for (auto it = bodies_.rbegin(); it != bodies_.rend(); ++it)
      if (it->first.find(part) != std::string::npos) return it->second;
    return "";
  }
  void Release() {
    std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }
  void Release(const std::string& tag) {
    std::lock_guard lk(mu_);
    released_tags_.push_back("hang-" + tag);
    cv_.notify_all();
  }

 private:
  void Serve(int fd) {
    std::string in;
    char buf[4096];
    for (;;) {
      size_t end;
      while ((end = in.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return;
        in.append(buf, static_cast<size_t>(n));
      }
      const std::string head = in.substr(0, end);
      in.erase(0, end + 4);
      const std::string line = head.substr(0, head.find('\n'));
      std::string lower = head;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (size_t cl = lower.find("content-length:"); cl != std::string::npos) {
        const size_t len = std::strtoul(lower.c_str() + cl + 15, nullptr, 10);
        while (in.size() < len) {  // the body, unread
          ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) return;
          in.append(buf, static_cast<size_t>(n));
        }
        std::lock_guard lk(mu_);
        bodies_.emplace_back(line, in.substr(0, len));
        in.erase(0, len);
      }
      Handler handler;
      {
        std::lock_guard lk(mu_);
        handler = handler_;
      }
      if (handler && handler(head, fd)) continue;
      if (line.find("hang") != std::string::npos) {
        std::unique_lock lk(mu_);
        hanging_++;
        cv_.wait(lk, [&] {
          for (const auto& t : released_tags_)
            if (line.find(t) != std::string::npos) return true;
          return released_ || stopping_;
        });
        hanging_--;
        if (stopping_) return;
      }
      {
        std::lock_guard lk(mu_);
        lines_.push_back(line);
      }
      // A listing answers the same continuation token whatever it is asked with.
      static constexpr std::string_view kList =
          "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>same"
          "</NextContinuationToken><Contents><Key>k</Key><Size>1</Size></Contents>"
          "</ListBucketResult>";
      const std::string body(line.find("list-type=2") != std::string::npos ? kList : "ok");
      const std::string answer =
          "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nETag: \"e\"\r\n\r\n" + body;
      if (::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) < 0) return;
    }
  }

  int listen_ = -1, port_ = 0;
  std::thread accept_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> conns_;
  std::vector<std::thread> workers_;
  std::vector<std::string> released_tags_, lines_;
  std::vector<std::pair<std::string, std::string>> bodies_;  // request line, body
  Handler handler_;
  int accepted_ = 0, hanging_ = 0;
  bool released_ = false, stopping_ = false;
};

s3::ClientOptions Options(const TinyHttp& server, std::shared_ptr<s3::Transport> t,
                          bool control = false) {
  s3::ClientOptions o;
  o.control = control;
  o.endpoint = server.url();
  o.creds = {"ak", "sk", "us-east-1"};
  o.stall_timeout = 30s;
  o.transport = std::move(t);
  return o;
}

Result<std::string> Fetch(s3::S3Client& c, std::string_view key) {
  std::string body;
  auto r = c.Get("b", key, [&](std::string_view p) {
    body.append(p);
    return Status::Ok();
  });
  if (!r.ok()) return r.status();
  return body;
}

// The body, or the error in brackets (what a failed expectation prints).
std::string Body(s3::S3Client& c, std::string_view key) {
  auto r = Fetch(c, key);
  return r.ok() ? *r : "<" + r.status().message() + ">";
}

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Eight clients, one connection each when alone, send 200 requests through a transport of
// `loops` loops that allows four connections.
void EightClientsShareFourConnections(int loops) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{4, 10s, loops, ""});
  ASSERT_EQ(t->loops(), loops);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      s3::S3Client c(Options(server, t));
      for (int k = 0; k < 25; ++k) ok += Body(c, "obj") == "ok";
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 200);
  EXPECT_LE(server.accepted(), 4);
  EXPECT_GE(server.accepted(), 1);
  auto s = t->stats();
  EXPECT_EQ(s.requests, 200u);
  EXPECT_EQ(s.connects, static_cast<uint64_t>(server.accepted()));
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queued, 0);
}

TEST(Transport, ClientsShareItsConnections) {
  EightClientsShareFourConnections(1);
}

TEST(Transport, ARequestPastTheQueueTimeoutFailsWithoutARetry) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{2, 300ms, 1, ""});
  std::vector<std::thread> stuck;
  std::atomic<int> stuck_ok{0};
  for (int i = 0; i < 2; ++i)
    stuck.emplace_back([&] {
      s3::S3Client c(Options(server, t));
      stuck_ok += Body(c, "hang") == "ok";
    });
  ASSERT_TRUE(WaitFor([&] { return server.hanging() == 2; }));

  s3::S3Client c(Options(server, t));
  const auto start = std::chrono::steady_clock::now();
  auto r = Fetch(c, "obj");
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().sys_errno(), EBUSY);
  EXPECT_NE(r.status().message().find("no connection to the origin came free"), std::string::npos)
      << r.status().message();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);  // one wait, not the retry deadline's worth
  EXPECT_EQ(c.retries(), 0u);
  EXPECT_EQ(t->stats().queue_timeouts, 1u);
  EXPECT_EQ(t->stats().running, 2);

  server.Release();
  for (auto& th : stuck) th.join();
  EXPECT_EQ(stuck_ok.load(), 2);
  EXPECT_EQ(Body(c, "obj"), "ok");  // the connections serve again
  EXPECT_LE(server.accepted(), 2);
}

TEST(Transport, AWaitingRequestStartsWhenAConnectionFrees) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{1, 10s, 1, ""});
  std::atomic<bool> second_done{false};
  std::thread first([&] {
    s3::S3Client c(Options(server, t));
    EXPECT_EQ(Body(c, "hang"), "ok");
  });
  ASSERT_TRUE(WaitFor([&] { return server.hanging() == 1; }));
  std::thread second([&] {
    s3::S3Client c(Options(server, t));
    EXPECT_EQ(Body(c, "obj"), "ok");
    second_done = true;
  });
  ASSERT_TRUE(WaitFor([&] { return t->stats().queued == 1; }));
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(second_done.load());  // it waits for the one connection
  server.Release();
  first.join();
  second.join();
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(t->stats().requests, 2u);
}

// Several loops share the work and the limit: still at most max-connections connections, and
// no more loops than connections.
TEST(Transport, LoopsShareTheLimit) {
  EightClientsShareFourConnections(2);
  EXPECT_EQ(s3::Transport(s3::TransportOptions{1, 1s, 4, ""}).loops(), 1);
}

// The queue is the transport's, not a loop's: a waiting request starts on whichever loop
// frees a connection first.
TEST(Transport, AWaitingRequestTakesTheFirstConnectionThatFrees) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{2, 10s, 2, ""});
  std::vector<std::thread> hung;
  for (const char* key : {"hang-a", "hang-b"})
    hung.emplace_back([&, key] {
      s3::S3Client c(Options(server, t));
      EXPECT_EQ(Body(c, key), "ok");
    });
  ASSERT_TRUE(WaitFor([&] { return server.hanging() == 2; }));  // one on each loop
  std::atomic<bool> done{false};
  std::thread waiting([&] {
    s3::S3Client c(Options(server, t));
    EXPECT_EQ(Body(c, "obj"), "ok");
    done = true;
  });
  ASSERT_TRUE(WaitFor([&] { return t->stats().queued == 1; }));
  server.Release("a");  // a's loop frees its connection; b's still hangs
  EXPECT_TRUE(WaitFor([&] { return done.load(); }, 5s));
  EXPECT_EQ(server.hanging(), 1);  // the other still holds: the request did not wait for it
  server.Release();
  for (auto& th : hung) th.join();
  waiting.join();
  EXPECT_EQ(t->stats().queue_timeouts, 0u);
}

// Calls that arrive together go to different loops with room: neither waits in the queue for
// the other's loop (which would leave it there until its queue timeout).
TEST(Transport, CallsArrivingTogetherSpreadOverTheLoopsWithRoom) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{2, 1s, 2, ""});
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> hung;
    const std::string tags[] = {std::to_string(round) + "x", std::to_string(round) + "y"};
    for (const auto& tag : tags)
      hung.emplace_back([&, tag] {
        s3::S3Client c(Options(server, t));
        EXPECT_EQ(Body(c, "hang-" + tag), "ok");
      });
    EXPECT_TRUE(WaitFor([&] { return server.hanging() == 2; }, 5s)) << "round " << round;
    for (const auto& tag : tags) server.Release(tag);
    for (auto& th : hung) th.join();
  }
  EXPECT_EQ(t->stats().queue_timeouts, 0u);
}

// A control request (an upload's lease) is not queued behind data requests that hold every
// connection: it goes first and may use a connection beyond the limit.
TEST(Transport, ControlRequestsPassDataThatFillsTheConnections) {
  TinyHttp server;
  auto t = std::make_shared<s3::Transport>(s3::TransportOptions{1, 300ms, 1, ""});
  std::thread stuck([&] {
    s3::S3Client c(Options(server, t));
    EXPECT_EQ(Body(c, "hang"), "ok");
  });
  ASSERT_TRUE(WaitFor([&] { return server.hanging() == 1; }));
  s3::S3Client data(Options(server, t));
  EXPECT_NE(Body(data, "obj"), "ok");  // no connection for data: refused after 300 ms
  s3::S3Client control(Options(server, t, /*control=*/true));
  EXPECT_EQ(Body(control, "obj"), "ok");
  EXPECT_EQ(Body(control, "obj"), "ok");
  server.Release();
  stuck.join();
  EXPECT_EQ(server.accepted(), 2);
  EXPECT_EQ(t->stats().queue_timeouts, 1u);
}

}  // namespace
}  // namespace sluice::test

namespace sluice::test {
namespace {

// What a broken origin or proxy answers is caught: a range ignored (a 200 with more than was
// asked for, from offset 0 too), a listing that does not advance. And a key's "." and ".."
// segments are sent as signed, not resolved away by libcurl.
TEST(S3Client, AnswersThatDoNotFitTheRequestAreRefused) {
  TinyHttp server;
  s3::S3Client c(Options(server, nullptr));
  std::string got;
  auto sink = [&](std::string_view p) {
    got.append(p);
    return Status::Ok();
  };
  auto one = c.Get("b", "obj", sink, std::make_pair(uint64_t{0}, uint64_t{1}));
  EXPECT_ERROR(one, Code::kIoError);
  EXPECT_NE(one.status().message().find("not the range asked for"), std::string::npos)
      << one.status().ToString();
  EXPECT_EQ(got, "");
  got.clear();
  ASSERT_OK(c.Get("b", "obj", sink, std::make_pair(uint64_t{0}, uint64_t{2})));  // all of it
  EXPECT_EQ(got, "ok");

  s3::ListRequest lr;
  auto first = c.ListObjects("b", lr);
  ASSERT_OK(first);
  EXPECT_EQ(first->next_token, "same");
  lr.continuation = first->next_token;
  auto again = c.ListObjects("b", lr);
  EXPECT_ERROR(again, Code::kUnavailable);
  EXPECT_NE(again.status().message().find("does not advance"), std::string::npos);

  EXPECT_EQ(Body(c, "a/../x/./y"), "ok");
  bool seen = false;
  for (const auto& line : server.lines()) seen |= line.starts_with("GET /b/a/../x/./y ");
  EXPECT_TRUE(seen) << "the path was not sent as signed";
}

// Sends `body` as a 200 answer with an ETag.
bool Answer200(int fd, std::string_view body) {
  const std::string a = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nETag: \"e\"\r\n\r\n" + std::string(body);
  ::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
  return true;
}

// S3 answers a copy or a Complete that fails after its 200 went out with an <Error> body, and a
// gateway may answer 200 with an error page of its own: neither is a result. Before, such a
// listing read as an empty, complete one and such a delete as one that failed nothing.
TEST(S3Client, A200WhoseBodyIsNotTheResultIsAnError) {
  TinyHttp server;
  std::atomic<int> lists{0}, copies{0};
  constexpr std::string_view kInternal =
      "<Error><Code>InternalError</Code><Message>try again</Message></Error>";
  server.Handle([&](const std::string& line, int fd) {  // line: the head, request line first
    if (line.find("prefix=foreign") != std::string::npos)
      return Answer200(fd, "<ListAllMyBucketsResult></ListAllMyBucketsResult>");
    if (line.find("list-type=2") != std::string::npos)
      return Answer200(fd, ++lists <= 2 ? kInternal
                                        : "<ListBucketResult><Contents><Key>k</Key><Size>1"
                                          "</Size></Contents></ListBucketResult>");
    if (line.find("?delete") != std::string::npos)
      return Answer200(fd, "<Error><Code>AccessDenied</Code><Message>no</Message></Error>");
    if (line.starts_with("PUT /b/dst"))
      return Answer200(fd, ++copies == 1 ? kInternal
                                         : "<CopyObjectResult><ETag>\"abc\"</ETag>"
                                           "</CopyObjectResult>");
    return false;
  });
  s3::S3Client c(Options(server, nullptr));
  auto page = c.ListObjects("b", {});  // retried past the two InternalErrors
  ASSERT_OK(page);
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "k");
  EXPECT_EQ(lists.load(), 3);

  s3::ListRequest foreign;
  foreign.prefix = "foreign";
  auto other = c.ListObjects("b", foreign);
  EXPECT_ERROR(other, Code::kUnavailable);
  EXPECT_NE(other.status().message().find("not <ListBucketResult>"), std::string::npos)
      << other.status().ToString();

  auto del = c.DeleteMany("b", {"k"});
  ASSERT_FALSE(del.ok()) << "an error answer read as a delete that failed nothing";
  EXPECT_NE(del.status().message().find("AccessDenied"), std::string::npos)
      << del.status().ToString();

  auto copied = c.Copy("b", "src", "dst", nullptr);
  ASSERT_OK(copied);
  EXPECT_EQ(*copied, "abc");
  EXPECT_EQ(copies.load(), 2);
}

// A 206 that covers less than was asked for, short of the object's end, is an error, not a
// short read taken for the whole range (a download then landed with zeros where the rest
// belonged). One that stops at the object's end is the range asked for past it.
TEST(S3Client, ARangeAnsweredShortIsAnError) {
  TinyHttp server;
  server.Handle([&](const std::string& head, int fd) {
    const bool past = head.find("GET /b/past") != std::string::npos;
    const std::string a =
        std::string("HTTP/1.1 206 Partial Content\r\nContent-Length: 4\r\n") +
        (past ? "Content-Range: bytes 0-3/4\r\n" : "Content-Range: bytes 0-3/100\r\n") +
        "ETag: \"e\"\r\n\r\nabcd";
    ::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
    return true;
  });
  s3::S3Client c(Options(server, nullptr));
  std::string got;
  auto sink = [&](std::string_view p) {
    got.append(p);
    return Status::Ok();
  };
  auto shorter = c.Get("b", "short", sink, std::make_pair(uint64_t{0}, uint64_t{10}));
  EXPECT_ERROR(shorter, Code::kIoError);
  EXPECT_NE(shorter.status().message().find("ended at byte 4 of 10"), std::string::npos)
      << shorter.status().ToString();
  got.clear();
  ASSERT_OK(c.Get("b", "past", sink, std::make_pair(uint64_t{0}, uint64_t{10})));
  EXPECT_EQ(got, "abcd");
}

// What a listing's callers do with its names (cut the prefix off, copy, delete, page on until
// the end) needs them below the prefix and advancing. Before, a key shorter than the prefix
// threw std::out_of_range on an s3 volume's threads (the process ended), and tokens that go
// round (A, B, A) were followed forever, the keys kept meanwhile.
TEST(S3Client, AListingThatDoesNotAdvanceIsAnError) {
  TinyHttp server;
  std::atomic<int> empties{0};
  server.Handle([&](const std::string& head, int fd) {
    const std::string line = head.substr(0, head.find('\n'));
    if (line.find("list-type=2") == std::string::npos) return false;
    auto page = [&](std::string_view inner, std::string_view token = {}) {
      std::string body = "<ListBucketResult>";
      if (!token.empty())
        body += fmt::format(
            "<IsTruncated>true</IsTruncated><NextContinuationToken>{}"
            "</NextContinuationToken>",
            token);
      return Answer200(fd, body + std::string(inner) + "</ListBucketResult>");
    };
    auto key = [](std::string_view k) {
      return fmt::format("<Contents><Key>{}</Key><Size>1</Size></Contents>", k);
    };
    const bool at_a = line.find("continuation-token=A") != std::string::npos;
    if (line.find("prefix=pre") != std::string::npos) return page(key("p"));
    if (line.find("prefix=ord") != std::string::npos) return page(key("ordb") + key("orda"));
    if (line.find("prefix=cyc") != std::string::npos)  // A, B, A...: the same keys again
      return at_a ? page(key("cyc2"), "B") : page(key("cyc1"), "A");
    if (line.find("prefix=emp") != std::string::npos) {
      ++empties;
      return page("", at_a ? "B" : "A");
    }
    // A common prefix may sort before start-after and hold keys after it.
    return page("<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>" + key("c"));
  });
  s3::S3Client c(Options(server, nullptr));
  auto all = [&](std::string prefix) {
    s3::ListRequest lr;
    lr.prefix = std::move(prefix);
    int pages = 0;
    Status st = c.ForEachPage("b", lr, [&](s3::ListPage&) {
      ++pages;
      return Status::Ok();
    });
    return std::pair{st, pages};
  };
  auto [outside, n1] = all("pre");
  EXPECT_ERROR(outside, Code::kUnavailable);
  EXPECT_NE(outside.message().find("not below the prefix"), std::string::npos)
      << outside.ToString();
  auto [unordered, n2] = all("ord");
  EXPECT_ERROR(unordered, Code::kUnavailable);
  EXPECT_NE(unordered.message().find("out of order"), std::string::npos) << unordered.ToString();
  auto [cycle, n3] = all("cyc");
  EXPECT_ERROR(cycle, Code::kUnavailable);
  EXPECT_EQ(n3, 2) << "the third page (the first again) was taken";
  auto [empty, n4] = all("emp");
  EXPECT_ERROR(empty, Code::kUnavailable);
  EXPECT_NE(empty.message().find("does not advance"), std::string::npos) << empty.ToString();
  EXPECT_LE(empties.load(), 1002);

  s3::ListRequest lr;
  lr.delimiter = "/";
  lr.start_after = "a/b";
  auto page = c.ListObjects("b", lr);
  ASSERT_OK(page);
  EXPECT_EQ(page->prefixes, std::vector<std::string>{"a/"});
  lr.start_after = "b";  // now "a/" cannot hold anything after it
  EXPECT_ERROR(c.ListObjects("b", lr), Code::kUnavailable);
}

// A split listing's ranges must partition the keys below the prefix: ranges that skip a piece,
// overlap, repeat a boundary (a range from a key to itself) or leave the prefix are refused
// (the CLI then lists sequentially), and a chain that holds is taken.
TEST(S3Client, SplitRangesThatDoNotChainAreRefused) {
  TinyHttp server;
  server.Handle([&](const std::string& head, int fd) {
    const std::string line = head.substr(0, head.find('\n'));
    if (line.find("list-split") == std::string::npos) return false;
    auto range = [](std::string_view after, std::string_view end) {
      std::string r = "<Range>";
      if (!after.empty()) r += fmt::format("<StartAfter>{}</StartAfter>", after);
      if (!end.empty()) r += fmt::format("<EndKey>{}</EndKey>", end);
      return r + "<EstimatedKeyCount>1</EstimatedKeyCount></Range>";
    };
    std::string body;
    if (line.find("prefix=good") != std::string::npos)
      body = range("", "good/b") + range("good/b", "good/d") + range("good/d", "");
    else if (line.find("prefix=gap") != std::string::npos)
      body = range("", "gap/b") + range("gap/c", "");
    else if (line.find("prefix=open") != std::string::npos)
      body = range("", "open/b") + range("open/b", "");  // fine, then a start on the first:
    else if (line.find("prefix=first") != std::string::npos)
      body = range("first/a", "first/b") + range("first/b", "");
    else if (line.find("prefix=self") != std::string::npos)
      body = range("", "self/b") + range("self/b", "self/b") + range("self/b", "");
    else if (line.find("prefix=out") != std::string::npos)
      body = range("", "other/b") + range("other/b", "");
    else  // the last range with an end: keys past it lost
      body = range("", "end/b") + range("end/b", "end/c");
    return Answer200(fd, "<ListSplitResult>" + body + "</ListSplitResult>");
  });
  s3::S3Client c(Options(server, nullptr));
  auto good = c.ListSplit("b", "good/", 3);
  ASSERT_OK(good);
  EXPECT_EQ(good->size(), 3u);
  ASSERT_OK(c.ListSplit("b", "open/", 2));
  for (const char* bad : {"gap/", "first/", "self/", "out/", "end/"})
    EXPECT_ERROR(c.ListSplit("b", bad, 3), Code::kUnavailable) << bad;
}

// An origin that sends a byte now and then never stalls outright; it is abandoned once it moves
// fewer than min_speed bytes a second for the stall timeout, and each resume likewise.
TEST(S3Client, AnOriginThatTricklesIsAbandoned) {
  TinyHttp server;
  std::atomic<int> trickles{0}, cut{0};
  server.Handle([&](const std::string& req, int fd) {
    if (req.find("trickle") == std::string::npos) return false;
    ++trickles;
    constexpr size_t kSize = 100000;
    size_t from = 0;  // a resume asks "Range: bytes=N-"
    if (size_t r = req.find("Range: bytes="); r != std::string::npos)
      from = std::strtoul(req.c_str() + r + 13, nullptr, 10);
    const std::string head =
        from == 0
            ? fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"e\"\r\n\r\n", kSize)
            : fmt::format(
                  "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {}-{}/{}\r\n"
                  "Content-Length: {}\r\nETag: \"e\"\r\n\r\n",
                  from, kSize - 1, kSize, kSize - from);
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    // 160 bytes a second, for at most 15 s (then the connection ends short).
    for (int i = 0; i < 150 && !server.stopping(); ++i) {
      if (::send(fd, "0123456789abcdef", 16, MSG_NOSIGNAL) < 0) {
        ++cut;
        return true;
      }
      std::this_thread::sleep_for(100ms);
    }
    ::shutdown(fd, SHUT_RDWR);
    return true;
  });
  auto o = Options(server, nullptr);
  o.stall_timeout = 1s;
  o.min_speed = 4096;
  o.max_attempts = 2;
  s3::S3Client c(o);
  auto r = Fetch(c, "trickle");
  EXPECT_ERROR(r, Code::kUnavailable);
  // Every answer was cut by the client, not ended by the origin.
  EXPECT_TRUE(WaitFor([&] { return cut.load() == trickles.load(); }, 5s))
      << cut.load() << " of " << trickles.load() << " trickles cut by the client";
  EXPECT_GE(trickles.load(), 2);  // resumed where it stopped, then given up
}

}  // namespace
}  // namespace sluice::test

namespace sluice::test {
namespace {

// An upload created with a checksum algorithm (CreateMultipart sends CRC32C) takes, on AWS, no
// Complete that does not name every part's checksum. Parts sent from memory carry theirs (before,
// only parts sent from a file did), a copied part keeps the one its answer names, and a part the
// caller has none for takes the origin's from ListParts.
TEST(S3Client, EveryPartOfAnUploadNamesItsChecksumInTheComplete) {
  TinyHttp server;
  std::mutex mu;
  std::vector<std::string> heads;
  server.Handle([&](const std::string& head, int fd) {
    {
      std::lock_guard lk(mu);
      heads.push_back(head);
    }
    const std::string line = head.substr(0, head.find('\n'));
    if (line.starts_with("POST") && line.find("uploads") != std::string::npos)
      return Answer200(fd,
                       "<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                       "</InitiateMultipartUploadResult>");
    if (line.starts_with("PUT") && head.find("x-amz-copy-source") != std::string::npos)
      return Answer200(fd,
                       "<CopyPartResult><ETag>\"c\"</ETag><ChecksumCRC32C>copied=="
                       "</ChecksumCRC32C></CopyPartResult>");
    if (line.starts_with("GET") && line.find("uploadId=u1") != std::string::npos)
      return Answer200(fd,
                       "<ListPartsResult><Part><PartNumber>1</PartNumber><ETag>\"e\"</ETag>"
                       "<Size>5</Size><ChecksumCRC32C>listed==</ChecksumCRC32C></Part>"
                       "<IsTruncated>false</IsTruncated></ListPartsResult>");
    if (line.starts_with("POST") && line.find("uploadId=u1") != std::string::npos)
      return Answer200(fd,
                       "<CompleteMultipartUploadResult><ETag>\"m-3\"</ETag>"
                       "</CompleteMultipartUploadResult>");
    return false;
  });
  s3::S3Client c(Options(server, nullptr));
  auto id = c.CreateMultipart("b", "k");
  ASSERT_OK(id);
  EXPECT_EQ(*id, "u1");
  std::string crc;
  ASSERT_OK(c.UploadPart("b", "k", *id, 2, s3::Body{"hello"}, &crc));
  const std::string want = Base64Encode(CrcBytes(ChecksumAlgo::kCrc32c, Crc32c("hello", 5)));
  EXPECT_EQ(crc, want);
  {
    std::lock_guard lk(mu);
    bool sent = false;
    for (const auto& h : heads)
      sent |= h.starts_with("PUT") && h.find("x-amz-checksum-crc32c: " + want) != std::string::npos;
    EXPECT_TRUE(sent) << "a part sent from memory carried no checksum";
  }
  std::string copied;
  ASSERT_OK(c.CopyPart("b", "k", *id, 3, "b", "src", 0, 4, "e", &copied));
  EXPECT_EQ(copied, "copied==");
  // Part 1 has no checksum here (a session recorded before they were kept): the origin's.
  ASSERT_OK(
      c.CompleteMultipart("b", "k", *id, {{1, 5, "e", ""}, {2, 5, "e", crc}, {3, 5, "c", copied}}));
  const std::string xml = server.body_of("POST /b/k?uploadId=u1");
  EXPECT_NE(xml.find("<PartNumber>1</PartNumber><ETag>\"e\"</ETag><ChecksumCRC32C>listed=="),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<PartNumber>2</PartNumber><ETag>\"e\"</ETag><ChecksumCRC32C>" + want),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<PartNumber>3</PartNumber><ETag>\"c\"</ETag><ChecksumCRC32C>copied=="),
            std::string::npos)
      << xml;
}

}  // namespace
}  // namespace sluice::test

namespace sluice::test {
namespace {

// A clock too far off the origin's, or a region it does not serve, refuses every request the
// client signs: the credentials' failure (a volume then reads degraded, the CLI exits 5), not a
// permission on one object (403) nor the caller's bad input (400).
TEST(S3Client, ASkewedClockOrAWrongRegionRefusesTheCredentials) {
  TinyHttp server;
  server.Handle([&](const std::string& head, int fd) {
    const bool skew = head.find("skew") != std::string::npos;
    const std::string body =
        skew ? "<Error><Code>RequestTimeTooSkewed</Code><Message>The difference between the "
               "request time and the server's time is too large.</Message></Error>"
             : "<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' "
               "is wrong; expecting 'eu-west-1'</Message></Error>";
    const std::string a =
        fmt::format("HTTP/1.1 {}\r\nContent-Length: {}\r\n\r\n{}",
                    skew ? "403 Forbidden" : "400 Bad Request", body.size(), body);
    ::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
    return true;
  });
  s3::S3Client c(Options(server, nullptr));
  for (const char* key : {"skew", "region"}) {
    auto r = Fetch(c, key);
    EXPECT_ERROR(r, Code::kUnauthenticated);
    EXPECT_NE(r.status().message().find(std::string(key) == "skew" ? "RequestTimeTooSkewed"
                                                                   : "expecting 'eu-west-1'"),
              std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace sluice::test
