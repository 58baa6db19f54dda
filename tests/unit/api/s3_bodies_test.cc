// The S3 request bodies Sluice parses: what each accepts, and a precise refusal otherwise.
#include "api/s3/s3_bodies.h"

#include <gtest/gtest.h>

#include "support/assert_status.h"

namespace sluice::api::s3 {
namespace {

TEST(S3Bodies, DeleteObjects) {
  auto r = ParseDeleteObjects(
      "<Delete><Quiet>true</Quiet><Object><Key>a/b</Key></Object>"
      "<Object><Key>c &amp; d</Key><VersionId>null</VersionId></Object></Delete>");
  ASSERT_OK(r);
  EXPECT_TRUE(r->quiet);
  EXPECT_EQ(r->keys, (std::vector<std::string>{"a/b", "c & d"}));
  EXPECT_FALSE(ParseDeleteObjects("<Delete><Object><Key>k</Key></Object></Delete>")->quiet);
  for (const char* bad :
       {"", "not xml", "<Delete/>", "<Other><Object><Key>k</Key></Object></Other>",
        "<Delete><Object><VersionId>x</VersionId></Object></Delete>",
        "<Delete><Object><Key>k</Key></Object>"})
    EXPECT_ERROR(ParseDeleteObjects(bad), Code::kInvalidArgument) << bad;
  std::string many = "<Delete>";
  for (int i = 0; i < 1001; ++i) many += "<Object><Key>k</Key></Object>";
  EXPECT_ERROR(ParseDeleteObjects(many + "</Delete>"), Code::kInvalidArgument);
}

TEST(S3Bodies, CompleteMultipart) {
  const std::string md5(16, '\xab');
  auto r = ParseCompleteMultipart(
      "<CompleteMultipartUpload><Part><PartNumber>2</PartNumber>"
      "<ETag>\"abababababababababababababababab\"</ETag><ChecksumCRC32>AAAAAA==</ChecksumCRC32>"
      "</Part><Part><PartNumber>00001</PartNumber><ETag>not-an-md5</ETag></Part>"
      "</CompleteMultipartUpload>");
  ASSERT_OK(r);
  ASSERT_EQ(r->size(), 2u);  // in the client's order
  EXPECT_EQ((*r)[0].number, 2);
  EXPECT_EQ((*r)[0].md5, md5);
  EXPECT_EQ((*r)[0].checksums, (std::map<std::string, std::string>{{"crc32", "AAAAAA=="}}));
  EXPECT_EQ((*r)[1].number, 1);
  EXPECT_EQ((*r)[1].md5, "");  // matches no part: InvalidPart
  for (const char* bad :
       {"", "<CompleteMultipartUpload/>",
        "<Complete><Part><PartNumber>1</PartNumber></Part></Complete>",
        "<CompleteMultipartUpload><Part><ETag>x</ETag></Part></CompleteMultipartUpload>",
        "<CompleteMultipartUpload><Part><PartNumber>-1</PartNumber></Part></"
        "CompleteMultipartUpload>",
        "<CompleteMultipartUpload><Part><PartNumber>123456</PartNumber></Part>"
        "</CompleteMultipartUpload>"})
    EXPECT_ERROR(ParseCompleteMultipart(bad), Code::kInvalidArgument) << bad;
}

TEST(S3Bodies, CreateBucketConfiguration) {
  EXPECT_OK(CheckCreateBucketConfiguration(
      "<CreateBucketConfiguration><LocationConstraint>eu</LocationConstraint>"
      "</CreateBucketConfiguration>"));
  EXPECT_ERROR(CheckCreateBucketConfiguration("<Other/>"), Code::kInvalidArgument);
  EXPECT_ERROR(CheckCreateBucketConfiguration("<CreateBucketConfiguration>"),
               Code::kInvalidArgument);
}

TEST(S3Bodies, BatchRequest) {
  auto r = ParseBatchRequest(
      R"({"items": [{"key": "a"}, {"bucket": "b2", "key": "k", "range": "bytes=0-9",
           "opaque": "7"}], "continue-on-error": true, "manifest": false})",
      "b1");
  ASSERT_OK(r);
  EXPECT_TRUE(r->continue_on_error);
  EXPECT_FALSE(r->manifest);
  ASSERT_EQ(r->items.size(), 2u);
  EXPECT_EQ(r->items[0].bucket, "b1");
  EXPECT_EQ(r->items[0].key, "a");
  EXPECT_EQ(r->items[1].bucket, "b2");
  EXPECT_EQ(r->items[1].range, "bytes=0-9");
  EXPECT_EQ(r->items[1].opaque, "7");
  const std::pair<const char*, const char*> refused[] = {
      {"[]", "\"items\" array"},
      {R"({"items": []})", "1 to 100000 items"},
      {R"({"items": [{"key": "a"}], "extra": 1})", "unknown field 'extra'"},
      {R"({"items": [{"key": "a"}], "manifest": "yes"})", "'manifest' must be true or false"},
      {R"({"items": [7]})", "item 0 is not an object"},
      {R"({"items": [{"key": "a"}, {"key": 5}]})", "item 1: 'key' must be a string"},
      {R"({"items": [{"key": "a", "size": "1"}]})", "item 0: unknown field 'size'"},
      {R"({"items": [{"bucket": "b"}]})", "item 0 has no key"},
      {R"({"items": [{"key": "a", "range": "0-9"}]})", "range must be"},
      {R"({"items": [{"key": "a", "range": "bytes=0-1,4-5"}]})", "range must be one"},
      {R"({"items": [{"key": "a", "range": "bytes=x-y"}]})", "range must be one"},
      {R"({"items": [{"key": "a", "range": "bytes=9-2"}]})", "range must be one"},
      {R"({"items": [{"key": "a", "range": "bytes=-"}]})", "range must be one"},
  };
  for (const auto& [body, why] : refused) {
    auto bad = ParseBatchRequest(body, "b1");
    ASSERT_ERROR(bad, Code::kInvalidArgument) << body;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << bad.status().ToString();
  }
  auto nobucket = ParseBatchRequest(R"({"items": [{"key": "a"}]})", "");
  ASSERT_ERROR(nobucket, Code::kInvalidArgument);
  EXPECT_NE(nobucket.status().message().find("names no bucket"), std::string::npos);
  const std::string opaque(1025, 'o');
  EXPECT_ERROR(ParseBatchRequest(R"({"items": [{"key": "a", "opaque": ")" + opaque + "\"}]}", "b"),
               Code::kInvalidArgument);
  // S3's bounds on a key (1024 bytes) and a bucket name (63): at the bound taken, past it not.
  const std::string key(1024, 'k'), bucket(63, 'b');
  auto one = [](const std::string& k) { return R"({"items": [{"key": ")" + k + R"("}]})"; };
  EXPECT_OK(ParseBatchRequest(one(key), bucket));
  auto long_key = ParseBatchRequest(one(key + "k"), "b");
  ASSERT_ERROR(long_key, Code::kInvalidArgument);
  EXPECT_NE(long_key.status().message().find("item 0: the key is over 1024 bytes"),
            std::string::npos);
  EXPECT_ERROR(ParseBatchRequest(one("a"), bucket + "b"), Code::kInvalidArgument);
  // Values past what 100,000 items can hold are refused before any document is built.
  std::string empties = R"({"items": [)";
  for (size_t i = 0; i < kMaxBatchItems * 7; ++i) empties += "{},";
  empties += "{}]}";
  auto many = ParseBatchRequest(empties, "b");
  ASSERT_ERROR(many, Code::kInvalidArgument);
  EXPECT_NE(many.status().message().find("holds more than"), std::string::npos)
      << many.status().ToString();
}

}  // namespace
}  // namespace sluice::api::s3
