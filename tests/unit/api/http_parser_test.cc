#include "api/http_parser.h"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <random>
#include <string>

namespace sluice::api {
namespace {

struct Fed {
  boost::system::error_code ec;
  size_t used = 0;
};

// Feeds `bytes` to the parser in pieces of `step` (the way they may arrive from a socket),
// keeping what it did not consume, until it stops asking for more.
Fed Feed(RequestParser& p, const std::string& bytes, size_t step = 1 << 20) {
  std::string pending;
  size_t at = 0;
  Fed f;
  for (;;) {
    if (at < bytes.size()) {
      size_t n = std::min(step, bytes.size() - at);
      pending.append(bytes, at, n);
      at += n;
    }
    size_t used = p.put(boost::asio::buffer(pending), f.ec);
    f.used += used;
    pending.erase(0, used);
    const bool more = at < bytes.size();
    if (f.ec == http::error::need_more && more) {
      f.ec = {};
      continue;
    }
    if (f.ec || p.is_done()) return f;
    if (!more && (used == 0 || pending.empty())) return f;  // nothing left to feed
  }
}

Status FailureOf(const std::string& bytes, const ParserLimits& lim = {}, bool string_body = true) {
  RequestParser p(lim);
  std::string body;
  p.eager(true);
  if (string_body) p.BodyToString(&body, 1 << 20);
  Fed f = Feed(p, bytes);
  if (!f.ec && p.is_done()) return Status::Ok();
  if (!f.ec) return Status(Code::kInternal, "incomplete");
  return ParseFailureStatus(f.ec, 1 << 20);
}

TEST(RequestParser, ParsesHeaderThenStringBody) {
  for (size_t step : {1, 3, 7, 1000}) {
    RequestParser p;
    std::string req =
        "POST /folder/create?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
    boost::system::error_code ec;
    std::string pending;
    size_t at = 0;
    // The header first: the body mode is chosen only once it is in.
    while (!p.is_header_done()) {
      pending.append(req, at, std::min(step, req.size() - at));
      at = std::min(req.size(), at + step);
      pending.erase(0, p.put(boost::asio::buffer(pending), ec));
      if (ec == http::error::need_more) ec = {};
      ASSERT_FALSE(ec) << ec.message();
    }
    EXPECT_EQ(p.header().method(), http::verb::post);
    EXPECT_EQ(p.header().target(), "/folder/create?x=1");
    EXPECT_EQ(p.header()["Host"], "a");
    std::string body;
    p.BodyToString(&body, 100);
    pending.append(req, at, std::string::npos);
    Fed f = Feed(p, pending, step);
    EXPECT_FALSE(f.ec) << f.ec.message();
    EXPECT_TRUE(p.is_done());
    EXPECT_EQ(body, "hello");
  }
}

TEST(RequestParser, ChunkedBodyIntoBufferAsksForMoreRoom) {
  RequestParser p;
  p.eager(true);
  std::string req =
      "PATCH /upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: ok\r\n\r\n";
  char small[4];
  p.BodyToBuffer(small, sizeof(small));
  boost::system::error_code ec;
  size_t used = p.put(boost::asio::buffer(req), ec);
  // The header is consumed; the body stops when the 4 bytes are full.
  std::string got;
  std::string rest = req.substr(used);
  for (int guard = 0; guard < 100 && !p.is_done(); ++guard) {
    if (ec == http::error::need_buffer || p.buffer_left() == 0) {
      got.append(small, sizeof(small) - p.buffer_left());
      p.BodyToBuffer(small, sizeof(small));
    }
    ec = {};
    used = p.put(boost::asio::buffer(rest), ec);
    rest.erase(0, used);
  }
  got.append(small, sizeof(small) - p.buffer_left());
  EXPECT_TRUE(p.is_done());
  EXPECT_EQ(got, "hello world");
}

TEST(RequestParser, LongTargetIs414) {
  ParserLimits lim;
  Status st = FailureOf("GET /" + std::string(lim.request_target, 'a') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(st.code(), Code::kUriTooLong);
  EXPECT_EQ(CodeHttpStatus(st.code()), 414);
  EXPECT_TRUE(
      FailureOf("GET /" + std::string(lim.request_target - 1, 'a') + " HTTP/1.1\r\n\r\n").ok());
}

TEST(RequestParser, HeaderBlockAndFieldCountAre431) {
  std::string big = "GET / HTTP/1.1\r\nX-Big: " + std::string(20 << 10, 'v') + "\r\n\r\n";
  EXPECT_EQ(CodeHttpStatus(FailureOf(big).code()), 431);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 101; ++i) many += "X-F" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(CodeHttpStatus(FailureOf(many + "\r\n").code()), 431);
}

// The header block's limit holds across pieces: each ending just after a field (and one byte
// of the next name) gave Beast's own limit a fresh allowance per piece, so 99 fields of 4 KB
// (400 KB held) went through.
TEST(RequestParser, TheHeaderLimitHoldsAcrossPieces) {
  RequestParser p(ParserLimits{});
  std::string pending = "GET / HTTP/1.1\r\nX";
  boost::beast::error_code ec;
  int fed = 0;
  for (; fed < 99 && !ec; ++fed) {
    pending.erase(0, p.put(boost::asio::buffer(pending), ec));
    if (ec == http::error::need_more) ec = {};
    if (ec) break;
    pending += "-" + std::to_string(fed) + ": " + std::string(4000, 'v') + "\r\nX";
  }
  EXPECT_EQ(ec, http::error::header_limit) << ec.message() << " after " << fed << " pieces";
  EXPECT_LE(fed, 6);
  EXPECT_EQ(CodeHttpStatus(ParseFailureStatus(ec, 0).code()), 431);
}

// Beast's own parser throws std::length_error on a trailer field over 64 KiB; this one answers.
TEST(RequestParser, HugeTrailerFieldIs431NotAnException) {
  std::string req = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-T: " +
                    std::string(70 << 10, 't') + "\r\n\r\n";
  Status st;
  EXPECT_NO_THROW(st = FailureOf(req));
  EXPECT_EQ(CodeHttpStatus(st.code()), 431);
  // Many small trailer fields too.
  std::string many = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
  for (int i = 0; i < 40; ++i) many += "T" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(CodeHttpStatus(FailureOf(many + "\r\n").code()), 431);
  // Within the limits a trailer is fine (and dropped).
  EXPECT_TRUE(
      FailureOf("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: v\r\n\r\n").ok());
}

TEST(RequestParser, LongChunkExtensionIs400) {
  std::string req =
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=" + std::string(2 << 10, 'e') +
      "\r\nabc\r\n0\r\n\r\n";
  Status st;
  EXPECT_NO_THROW(st = FailureOf(req));
  EXPECT_EQ(CodeHttpStatus(st.code()), 400);
  EXPECT_NE(st.message().find("chunk extension"), std::string::npos) << st.message();
}

TEST(RequestParser, TransferCodingsOtherThanChunkedAre501) {
  for (const char* te : {"gzip, chunked", "gzip", "chunked, chunked", "deflate"}) {
    Status st =
        FailureOf(std::string("POST / HTTP/1.1\r\nTransfer-Encoding: ") + te + "\r\n\r\n0\r\n\r\n");
    EXPECT_EQ(CodeHttpStatus(st.code()), 501) << te << ": " << st.ToString();
  }
  EXPECT_TRUE(FailureOf("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n").ok());
}

TEST(RequestParser, BodyLimitDecidedFromContentLengthAndFromChunks) {
  RequestParser p;
  p.eager(true);
  std::string body;
  p.BodyToString(&body, 10);
  boost::system::error_code ec;
  std::string req = "POST / HTTP/1.1\r\nContent-Length: 50000000000\r\n\r\nx";
  p.put(boost::asio::buffer(req), ec);
  EXPECT_EQ(CodeHttpStatus(ParseFailureStatus(ec, 10).code()), 413);
  EXPECT_LT(body.capacity(), 1000u);  // nothing reserved for the declared length

  RequestParser c;
  c.eager(true);
  std::string cbody;
  c.BodyToString(&cbody, 10);
  ec = {};
  std::string chunked =
      "POST / HTTP/1.1\r\nTransfer-Encoding: "
      "chunked\r\n\r\n6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n";
  Fed f = Feed(c, chunked);
  EXPECT_EQ(CodeHttpStatus(ParseFailureStatus(f.ec, 10).code()), 413);
}

TEST(RequestParser, BodyBeforeAModeIsRefused) {
  RequestParser p;
  p.eager(true);
  boost::system::error_code ec;
  std::string req = "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
  p.put(boost::asio::buffer(req), ec);
  EXPECT_EQ(ec, make_error_code(ParseError::kUnexpectedBody)) << ec.message();
}

// Random splits and random bytes: never an exception, always an answer.
TEST(RequestParser, RandomInputNeverThrows) {
  std::mt19937 rng(11);
  using namespace std::string_literals;
  const std::string pieces[] = {"GET ",
                                "POST ",
                                "/",
                                "a",
                                " HTTP/1.1\r\n",
                                "\r\n",
                                "Transfer-Encoding: chunked\r\n",
                                "Content-Length: 3\r\n",
                                "0\r\n",
                                "3;x=y\r\nabc\r\n",
                                "X: y\r\n",
                                ":",
                                "\xff",
                                "\0"s};  // a NUL byte (a plain "\0" would be empty)
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    int n = static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) s += pieces[rng() % std::size(pieces)];
    EXPECT_NO_THROW((void)FailureOf(s, {}, rng() % 2 == 0)) << s;
  }
}

}  // namespace
}  // namespace sluice::api
