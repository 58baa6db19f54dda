#include "api/tus_headers.h"

#include <gtest/gtest.h>

namespace sluice::api {
namespace {

TEST(TusHeaders, ParseCountTakesDigitsOnly) {
  EXPECT_EQ(*ParseCount("0", "n"), 0u);
  EXPECT_EQ(*ParseCount("007", "n"), 7u);
  EXPECT_EQ(*ParseCount("18446744073709551615", "n"), UINT64_MAX);
  for (const char* bad :
       {"", "18446744073709551616", "+1", "-1", " 1", "1 ", "1a", "0x10", "1.5", "1e3"}) {
    auto r = ParseCount(bad, "Upload-Offset");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("Upload-Offset must be a non-negative decimal integer"),
              std::string::npos);
  }
}

TEST(TusHeaders, SingleHeader) {
  HttpRequest req;
  req.msg.insert("Upload-Offset", " \t42\t ");
  req.msg.insert("Tus-Resumable", "1.0.0");
  req.msg.insert("tus-resumable", "1.0.0");
  auto off = SingleHeader(req, "upload-offset");  // names are case-insensitive
  ASSERT_TRUE(off.ok() && off->has_value());
  EXPECT_EQ(**off, "42");
  auto missing = SingleHeader(req, "Upload-Length");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto twice = SingleHeader(req, "Tus-Resumable");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("appears more than once"), std::string::npos);
  EXPECT_EQ(TrimOws(" \t "), "");
  EXPECT_EQ(TrimOws("a b"), "a b");
}

}  // namespace
}  // namespace sluice::api
