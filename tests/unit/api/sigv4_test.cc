// SigV4 against the worked examples of the Amazon S3 API reference ("Signature Calculations for
// the Authorization Header" and "Query String Authentication").
#include "api/s3/sigv4.h"

#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/crypto.h"
#include "io/s3/s3_client.h"

namespace sluice::api::s3 {
namespace {

constexpr const char* kAk = "AKIAIOSFODNN7EXAMPLE";
constexpr const char* kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::time_t At(const char* amz) {
  return *ParseAmzDate(amz);
}

std::string Sign(const http::request_header<>& h, const SigV4Auth& a, std::string_view path,
                 std::string_view query) {
  std::string cr = CanonicalRequest(h, std::string(h.method_string()), path, query, a);
  return SignatureOf(SigningKey(kSecret, a.date, a.region, a.service), StringToSign(a, cr));
}

TEST(SigV4, HeaderExampleGetObject) {
  http::request_header<> h;
  h.method(http::verb::get);
  h.target("/test.txt");
  h.set("Host", "examplebucket.s3.amazonaws.com");
  h.set("Range", "bytes=0-9");
  h.set("x-amz-content-sha256", kEmpty);
  h.set("x-amz-date", "20130524T000000Z");
  h.set("Authorization",
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  std::optional<S3Error> err;
  auto a = ParseSigV4(h, "/test.txt", At("20130524T000100Z"), &err);
  ASSERT_TRUE(a) << (err ? err->message : "");
  EXPECT_EQ(a->access_key, kAk);
  EXPECT_EQ(a->scope(), "20130524/us-east-1/s3/aws4_request");
  EXPECT_EQ(Sign(h, *a, "/test.txt", ""), a->signature);
  // Any change to what is signed changes the signature.
  h.set("Range", "bytes=0-10");
  EXPECT_NE(Sign(h, *a, "/test.txt", ""), a->signature);
}

TEST(SigV4, PresignedExample) {
  http::request_header<> h;
  h.method(http::verb::get);
  h.set("Host", "examplebucket.s3.amazonaws.com");
  std::string q =
      "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-"
      "east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-"
      "SignedHeaders=host&X-Amz-Signature="
      "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
  std::string target = "/test.txt?" + q;
  h.target(target);
  std::optional<S3Error> err;
  auto a = ParseSigV4(h, target, At("20130524T010000Z"), &err);
  ASSERT_TRUE(a) << (err ? err->message : "");
  EXPECT_TRUE(a->presigned);
  EXPECT_EQ(a->payload_hash, kUnsignedPayload);
  EXPECT_EQ(Sign(h, *a, "/test.txt", q), a->signature);
  // Past its expiry it is refused before any signature is computed.
  EXPECT_FALSE(ParseSigV4(h, target, At("20130525T000001Z"), &err));
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, "AccessDenied");
}

TEST(SigV4, ChunkSignatureExample) {
  // "Signature Calculations for the Authorization Header: Transferring Payload in Multiple
  // Chunks": the seed signature and the first 64 KiB chunk of 'a'.
  SigV4Auth a;
  a.amz_date = "20130524T000000Z";
  a.date = "20130524";
  a.region = "us-east-1";
  a.service = "s3";
  std::string key = SigningKey(kSecret, a.date, a.region, a.service);
  std::string chunk(65536, 'a');
  std::string sts =
      ChunkStringToSign(a, "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
                        HexEncode(Sha256(chunk)));
  EXPECT_EQ(SignatureOf(key, sts),
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648");
}

TEST(SigV4, RefusesMalformedAndSkewed) {
  std::optional<S3Error> err;
  http::request_header<> h;
  h.method(http::verb::get);
  h.set("Host", "h");
  EXPECT_FALSE(ParseSigV4(h, "/", 0, &err));
  EXPECT_FALSE(err);  // anonymous
  h.set("Authorization", "AWS4-HMAC-SHA256 Credential=AK/2013/us-east-1/s3/aws4_request");
  EXPECT_FALSE(ParseSigV4(h, "/", 0, &err));
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, "AuthorizationHeaderMalformed");
  h.set("Authorization",
        "AWS4-HMAC-SHA256 Credential=AK/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" +
            std::string(64, 'a'));
  h.set("x-amz-date", "20130524T000000Z");
  h.set("x-amz-content-sha256", kEmpty);
  EXPECT_FALSE(ParseSigV4(h, "/", At("20130524T001600Z"), &err));
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, "RequestTimeTooSkewed");
  EXPECT_TRUE(ParseSigV4(h, "/", At("20130524T001400Z"), &err));
  h.set("x-amz-date", "2013-05-24");
  EXPECT_FALSE(ParseSigV4(h, "/", At("20130524T000000Z"), &err));
  h.set("x-amz-date", "20130524T000000Z");
  h.erase("x-amz-content-sha256");
  EXPECT_FALSE(ParseSigV4(h, "/", At("20130524T000000Z"), &err));
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, "InvalidRequest");
}

TEST(SigV4, UriEncode) {
  EXPECT_EQ(UriEncode("a b/c+d~_.-é", true), "a%20b/c%2Bd~_.-%C3%A9");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
}

// The canonical query: every pair decoded and encoded again the S3 way, sorted by name and then
// value ('+' is a plus, a malformed escape stays as it came), a presigned URL's signature left
// out; header names matched whatever their case, values trimmed and runs of blanks collapsed.
TEST(SigV4, CanonicalQueryAndHeaders) {
  http::request_header<> h;
  h.method(http::verb::get);
  h.set("HOST", "example.com");
  h.set("X-Amz-Meta-A", "  one   two ");
  SigV4Auth a;
  a.signed_headers = {"host", "x-amz-meta-a"};
  a.payload_hash = "UNSIGNED-PAYLOAD";
  const std::string query = "b=2&a=%2f&a=1&c&&d=x+y&e=%7E~&f=%zz&X-Amz-Signature=ab";
  const std::string tail =
      "\nhost:example.com\nx-amz-meta-a:one two\n\nhost;x-amz-meta-a\n"
      "UNSIGNED-PAYLOAD";
  EXPECT_EQ(CanonicalRequest(h, "GET", "/k ey", query, a),
            "GET\n/k%20ey\nX-Amz-Signature=ab&a=%2F&a=1&b=2&c=&d=x%20y&e=~~&f=%25zz" + tail);
  a.presigned = true;
  std::string appended = "prefix";
  AppendCanonicalRequest(appended, h, "GET", "/k ey", query, a);
  EXPECT_EQ(appended, "prefixGET\n/k%20ey\na=%2F&a=1&b=2&c=&d=x%20y&e=~~&f=%25zz" + tail);
  // Matching signatures, checked without allocating, agree with the string-returning path.
  std::string key = SigningKey(kSecret, "20130524", "us-east-1", "s3");
  a.amz_date = "20130524T000000Z";
  a.date = "20130524";
  a.region = "us-east-1";
  a.service = "s3";
  std::string cr = CanonicalRequest(h, "GET", "/k", "", a);
  std::string sig = SignatureOf(key, StringToSign(a, cr));
  EXPECT_TRUE(SignatureMatches(key, a, cr, sig));
  sig[5] = sig[5] == '0' ? '1' : '0';
  EXPECT_FALSE(SignatureMatches(key, a, cr, sig));
  EXPECT_FALSE(SignatureMatches(key, a, cr, sig.substr(1)));
}

TEST(Crypto, SealBindsKeyAndContext) {
  std::string key(32, 'k');
  std::string sealed = *Seal(key, "secret", "ctx");
  EXPECT_EQ(*Unseal(key, sealed, "ctx"), "secret");
  EXPECT_NE(sealed.substr(0, 12), Seal(key, "secret", "ctx")->substr(0, 12));  // fresh nonces
  EXPECT_FALSE(Seal("short", "secret", "ctx").ok());
  EXPECT_FALSE(Unseal(key, sealed, "other").ok());
  EXPECT_FALSE(Unseal(std::string(32, 'x'), sealed, "ctx").ok());
  sealed[14] ^= 1;
  EXPECT_FALSE(Unseal(key, sealed, "ctx").ok());
}

// The client's signer (io/s3/sigv4.h) against the server's parser and checker: what one signs
// the other accepts, and a changed byte anywhere signed is refused.
TEST(SigV4, ClientSignatureVerifiesOnTheServer) {
  io::s3::Credentials creds{kAk, kSecret, "eu-west-2"};
  const std::time_t now = At("20261201T211529Z");
  auto signed_request = [&](std::string_view key, std::string_view raw_query) {
    http::request_header<> h;
    h.method(http::verb::put);
    h.set("Host", "127.0.0.1:6024");
    h.set("Content-Type", "application/octet-stream");
    h.set("x-amz-checksum-crc32c", "yZRlqg==");
    h.set("Range", "bytes=0-1");  // not signed by the client: no effect
    std::string path = "/bucket/" + std::string(key);
    io::s3::SignRequest(h, "PUT", path, raw_query, kUnsignedPayload, creds, now);
    return h;
  };
  auto verifies = [&](const http::request_header<>& h, std::string_view path,
                      std::string_view raw_query) {
    std::optional<S3Error> err;
    std::string target = UriEncode(path, true);
    if (!raw_query.empty()) target += "?" + std::string(raw_query);
    auto a = ParseSigV4(h, target, now + 30, &err);
    if (!a) return false;
    std::string cr = CanonicalRequest(h, "PUT", path, raw_query, *a);
    std::string key = SigningKey(kSecret, a->date, a->region, a->service);
    return SignatureOf(key, StringToSign(*a, cr)) == a->signature;
  };
  std::string key = "data set/ünï código+x=1&y";
  std::string q = "partNumber=3&uploadId=" + UriEncode("a/b+c", false);
  auto h = signed_request(key, q);
  EXPECT_NE(std::string(h[http::field::authorization])
                .find("SignedHeaders=content-type;host;"
                      "x-amz-checksum-crc32c;"
                      "x-amz-content-sha256;x-amz-date"),
            std::string::npos);
  EXPECT_TRUE(verifies(h, "/bucket/" + key, q));
  EXPECT_FALSE(verifies(h, "/bucket/" + key + "x", q));
  EXPECT_FALSE(verifies(h, "/bucket/" + key, "partNumber=4&uploadId=a%2Fb%2Bc"));
  auto h2 = h;
  h2.set("x-amz-checksum-crc32c", "AAAAAA==");
  EXPECT_FALSE(verifies(h2, "/bucket/" + key, q));
  auto h3 = h;
  h3.set("Range", "bytes=5-9");
  EXPECT_TRUE(verifies(h3, "/bucket/" + key, q));
}

TEST(SigV4, Iso8601Times) {
  EXPECT_EQ(io::s3::ParseIso8601("2013-05-24T00:00:00.000Z"), At("20130524T000000Z"));
  EXPECT_EQ(io::s3::ParseIso8601("2026-12-01T21:15:29Z"), At("20261201T211529Z"));
  EXPECT_EQ(io::s3::ParseIso8601("2026-12-01 21:15:29Z"), 0);
  EXPECT_EQ(io::s3::ParseIso8601("20x6-12-01T21:15:29Z"), 0);
  EXPECT_EQ(io::s3::ParseIso8601(""), 0);
}

TEST(SigV4, DatesAreWhatTimegmMakesOfThem) {
  // The parser's own arithmetic against the C library, over 400 years of days (leap years
  // and centuries), every field's limits, and days past a month's end.
  std::mt19937 rng(20261202);
  for (int i = 0; i < 20000; ++i) {
    struct tm tm {};
    tm.tm_year = static_cast<int>(rng() % 400) + 1970 - 1900;
    tm.tm_mon = static_cast<int>(rng() % 12);
    // Dates the calendar has (ParseAmzDate refuses the others, unlike timegm).
    const int y = tm.tm_year + 1900;
    const int feb = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 ? 29 : 28;
    const int days[] = {31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    tm.tm_mday = static_cast<int>(rng() % static_cast<unsigned>(days[tm.tm_mon])) + 1;
    tm.tm_hour = static_cast<int>(rng() % 24);
    tm.tm_min = static_cast<int>(rng() % 60);
    tm.tm_sec = static_cast<int>(rng() % 60);
    std::string amz = fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}Z", tm.tm_year + 1900,
                                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    std::string iso =
        fmt::format("{}-{}-{}T{}:{}:{}Z", amz.substr(0, 4), amz.substr(4, 2), amz.substr(6, 2),
                    amz.substr(9, 2), amz.substr(11, 2), amz.substr(13, 2));
    std::time_t want = timegm(&tm);
    ASSERT_EQ(ParseAmzDate(amz), want) << amz;
    ASSERT_EQ(io::s3::ParseIso8601(iso), want) << iso;
  }
  for (const char* bad :
       {"20261301T000000Z", "20261200T000000Z", "20261232T000000Z", "20261201T240000Z",
        "20261201T006000Z", "20261201T000061Z", "20261131T235959Z", "20230229T000000Z",
        "21000229T000000Z", "20261201T000060Z", "2026120T1000000Z", "20261201T000000",
        "20261201t000000Z"})
    EXPECT_FALSE(ParseAmzDate(bad).has_value()) << bad;
  EXPECT_TRUE(ParseAmzDate("20240229T000000Z").has_value());
  EXPECT_TRUE(ParseAmzDate("20000229T235959Z").has_value());
}

TEST(SigV4, AmzDateRoundTrip) {
  EXPECT_EQ(io::s3::FormatAmzDate(At("20130524T000000Z")), "20130524T000000Z");
  EXPECT_EQ(io::s3::FormatAmzDate(At("20261231T235959Z")), "20261231T235959Z");
}

}  // namespace
}  // namespace sluice::api::s3
