#include "common/jwt.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(Base64Url, RoundTrip) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar", "\xff\xfe\x00?>"}) {
    auto d = Base64UrlDecode(Base64UrlEncode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(Base64UrlEncode("\xfb\xff"), "-_8");
  EXPECT_FALSE(Base64UrlDecode("a").ok());
  EXPECT_FALSE(Base64UrlDecode("ab=c").ok());
}

// A token made outside Sluice, with Python's hmac module the way PyJWT makes them
// (jwt.encode({"op": "download"}, "secret", algorithm="HS256")).
TEST(Jwt, VerifiesForeignToken) {
  const char* token =
      "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJvcCI6ImRvd25sb2FkIn0."
      "cIRFg8lvF1DjWAxkvv0MgiwXNsDWkekKuYrmuz0AjOU";
  auto c = JwtDecode(token, "secret");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)["op"], "download");
  EXPECT_EQ(JwtDecode(token, "other").status().code(), Code::kUnauthenticated);
}

TEST(Jwt, RoundTripAndExpiry) {
  nlohmann::json claims = {{"op", "upload"}, {"exp", 2000}};
  std::string t = JwtEncode(claims, "k");
  EXPECT_TRUE(JwtDecode(t, "k", 1999).ok());
  auto expired = JwtDecode(t, "k", 2000);
  ASSERT_FALSE(expired.ok());
  EXPECT_NE(expired.status().message().find("expired"), std::string::npos);
}

TEST(Jwt, RejectsTampering) {
  std::string t = JwtEncode({{"op", "download"}, {"relpath", "a"}}, "k");
  size_t d1 = t.find('.'), d2 = t.rfind('.');
  std::string forged =
      t.substr(0, d1 + 1) + Base64UrlEncode(R"({"op":"download","relpath":"b"})") + t.substr(d2);
  EXPECT_FALSE(JwtDecode(forged, "k").ok());
  std::string none = Base64UrlEncode(R"({"alg":"none"})") + t.substr(d1, d2 - d1) + ".";
  EXPECT_FALSE(JwtDecode(none, "k").ok());
  EXPECT_FALSE(JwtDecode("a.b", "k").ok());
  EXPECT_FALSE(JwtDecode("", "k").ok());
}

}  // namespace
}  // namespace sluice
