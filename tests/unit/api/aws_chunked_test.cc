// The aws-chunked decoder: its limits in the unsigned mode, and the signed chain against
// EncodeSignedAwsChunked (the integration tests check it against real SDKs too).
#include "api/s3/aws_chunked.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace sluice::api::s3 {
namespace {

std::optional<S3Error> Decode(std::string_view body, std::optional<uint64_t> declared,
                              std::string* out) {
  AwsChunkedDecoder::Options o;
  o.decoded_length = declared;
  AwsChunkedDecoder d(o);
  Status out_error;
  auto e = d.Feed(
      body.data(), body.size(),
      [&](const char* p, size_t n) {
        out->append(p, n);
        return Status::Ok();
      },
      &out_error);
  if (e) return e;
  return d.Finish();
}

TEST(AwsChunked, DecodesWhatWasDeclared) {
  std::string out;
  EXPECT_FALSE(Decode("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 5, &out).has_value());
  EXPECT_EQ(out, "abcde");
}

TEST(AwsChunked, AChunkSizeThatWouldWrapIsRefused) {
  // After a first chunk, a size near 2^64 wrapped the sum it was checked with: both limits
  // (the declared length, 5 GiB) passed, and the body streamed on.
  std::string out;
  auto e = Decode("1\r\na\r\nffffffffffffffff\r\n", 10, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "IncompleteBody");
  e = Decode("1\r\na\r\nffffffffffffffff\r\n", std::nullopt, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "EntityTooLarge");
  e = Decode("4\r\nabcd\r\n", 3, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "IncompleteBody");
}

// A signed decode: what it refused with, else nullopt with the data and trailers it passed.
struct Signed {
  AwsChunkedDecoder::Options o;
  Signed(bool trailer) {
    o.signed_chunks = true;
    o.trailer = trailer;
    o.announced = "x-amz-checksum-crc32";
    o.auth.amz_date = "20261206T000000Z";
    o.auth.date = "20261206";
    o.auth.region = "us-east-1";
    o.auth.service = "s3";
    o.auth.signature = std::string(64, 'c');
    o.signing_key = std::string(32, 'k');
  }
  std::optional<S3Error> Decode(std::string_view body, size_t piece, std::string* out,
                                std::map<std::string, std::string>* trailers = nullptr) const {
    AwsChunkedDecoder d(o);
    Status out_error;
    for (size_t i = 0; i < body.size(); i += piece) {
      auto e = d.Feed(
          body.data() + i, std::min(piece, body.size() - i),
          [&](const char* p, size_t n) {
            out->append(p, n);
            return Status::Ok();
          },
          &out_error);
      if (e) return e;
    }
    if (auto e = d.Finish()) return e;
    if (trailers) *trailers = d.trailers();
    return std::nullopt;
  }
};

TEST(AwsChunked, ASignedChainDecodesToWhatWasSigned) {
  std::string a(AwsChunkedDecoder::kMinChunk + 5, 'a'), b(AwsChunkedDecoder::kMinChunk, 'b');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 31);
  const std::map<std::string, std::string> sent = {{"x-amz-checksum-crc32", "AAAAAA=="}};
  for (bool trailer : {false, true}) {
    Signed s(trailer);
    const std::string body = EncodeSignedAwsChunked(s.o.auth, s.o.signing_key, {a, b, "tail"},
                                                    trailer ? sent : decltype(sent){});
    for (size_t piece : {body.size(), size_t{1}, size_t{7}, size_t{4096}}) {
      std::string out;
      std::map<std::string, std::string> got;
      auto e = s.Decode(body, piece, &out, &got);
      ASSERT_FALSE(e.has_value()) << e->code << ": " << e->message;
      EXPECT_TRUE(out == a + b + "tail");
      EXPECT_EQ(got, trailer ? sent : decltype(sent){});
    }
  }
}

// Whatever byte of a signed body is changed, the decode is refused or passes exactly what was
// signed: the chunk signatures cover the data, their chain the order, the trailer's its fields.
TEST(AwsChunked, NoChangeToASignedBodyPassesOtherBytes) {
  std::string a(AwsChunkedDecoder::kMinChunk, 'a'), b(AwsChunkedDecoder::kMinChunk + 1, 'b');
  const std::string want = a + b + "z";
  // With a trailer, its signature chains from the last chunk's too: without one, the chunks'
  // own signatures are all there is.
  for (bool trailer : {false, true}) {
    const std::map<std::string, std::string> sent =
        trailer ? std::map<std::string, std::string>{{"x-amz-checksum-crc32", "sOO8/Q=="}}
                : std::map<std::string, std::string>{};
    Signed s(trailer);
    const std::string body = EncodeSignedAwsChunked(s.o.auth, s.o.signing_key, {a, b, "z"}, sent);
    std::vector<bool> is_data(body.size());
    for (size_t pos = 0;
         std::string_view c : {std::string_view(a), std::string_view(b), std::string_view("z")}) {
      const size_t from = body.find("\r\n", pos) + 2;
      std::fill_n(is_data.begin() + from, c.size(), true);
      pos = from + c.size() + 2;
    }
    size_t refused = 0, data_refused = 0, data_tried = 0;
    for (size_t at = 0; at < body.size(); ++at) {
      const bool in_data = is_data[at];
      if (in_data && at % 509 != 0) continue;  // a sample of the data; every framing byte
      for (unsigned char mask : {0x01, 0x20, 0x80}) {
        std::string changed = body;
        changed[at] = static_cast<char>(changed[at] ^ mask);
        std::string out;
        std::map<std::string, std::string> got;
        auto e = s.Decode(changed, 4096, &out, &got);
        if (e) {
          ++refused;
          if (in_data) ++data_refused;
        } else {
          EXPECT_TRUE(out == want) << "byte " << at << " ^ " << int(mask) << " passed other data";
          EXPECT_EQ(got, sent) << "byte " << at << " ^ " << int(mask);
        }
        if (in_data) ++data_tried;
      }
    }
    EXPECT_EQ(data_refused, data_tried);  // a changed data byte never passes
    EXPECT_GT(refused, body.size() / 509);
  }

  // Chunks swapped, one left out, one sent twice: the chain breaks.
  std::string out;
  const std::map<std::string, std::string> sent = {{"x-amz-checksum-crc32", "sOO8/Q=="}};
  Signed s(true);
  const std::string body = EncodeSignedAwsChunked(s.o.auth, s.o.signing_key, {a, b, "z"}, sent);
  const std::string swapped = EncodeSignedAwsChunked(s.o.auth, s.o.signing_key, {b, a, "z"}, sent);
  const std::string first = body.substr(0, body.find("\r\n", body.find("\r\n") + 2) + 2);
  const std::string rest = body.substr(first.size());
  for (const std::string& bad :
       {swapped.substr(0, swapped.find("\r\n", swapped.find("\r\n") + 2) + 2) + rest, rest,
        first + first + rest}) {
    auto e = s.Decode(bad, 4096, &out);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, "SignatureDoesNotMatch") << e->message;
  }
  // A trailer changed, or its signature left out.
  std::string other = body;
  other.replace(other.find("sOO8/Q=="), 8, "AAAAAA==");
  auto e = s.Decode(other, 4096, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "SignatureDoesNotMatch");
  other = body.substr(0, body.find("x-amz-trailer-signature")) + "\r\n";
  e = s.Decode(other, 4096, &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("lacks x-amz-trailer-signature"), std::string::npos) << e->message;
}

}  // namespace
}  // namespace sluice::api::s3
