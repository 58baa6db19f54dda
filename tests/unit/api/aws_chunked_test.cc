// The aws-chunked decoder's limits, in the unsigned mode (the signed chains are checked by the
// integration tests against real SDKs).
#include "api/s3/aws_chunked.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sluice::api::s3
