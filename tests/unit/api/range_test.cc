// Range, validator and Content-Disposition parsing: they read untrusted request headers.
#include "api/range.h"

#include <gtest/gtest.h>

#include <ctime>
#include <random>

namespace sluice::api {
namespace {

using Kind = RangeRequest::Kind;

std::vector<ByteRange> R(std::initializer_list<std::pair<uint64_t, uint64_t>> firsts_lasts) {
  std::vector<ByteRange> out;
  for (auto [a, b] : firsts_lasts) out.push_back({a, b - a + 1});
  return out;
}

TEST(ParseRange, SingleForms) {
  auto r = ParseRange("bytes=0-99", 1000);
  ASSERT_EQ(r.kind, Kind::kSatisfiable);
  EXPECT_EQ(r.ranges, R({{0, 99}}));
  EXPECT_EQ(ParseRange("bytes=500-", 1000).ranges, R({{500, 999}}));
  EXPECT_EQ(ParseRange("bytes=-100", 1000).ranges, R({{900, 999}}));
  // Clamped to the representation.
  EXPECT_EQ(ParseRange("bytes=900-5000", 1000).ranges, R({{900, 999}}));
  EXPECT_EQ(ParseRange("bytes=-5000", 1000).ranges, R({{0, 999}}));
  EXPECT_EQ(ParseRange("bytes=999-999", 1000).ranges, R({{999, 999}}));
  // Unit is case-insensitive; whitespace around elements is allowed.
  EXPECT_EQ(ParseRange("Bytes= 1-2 ,", 10).ranges, R({{1, 2}}));
  EXPECT_EQ(ParseRange("  bytes=1-2\t", 10).ranges, R({{1, 2}}));
}

TEST(ParseRange, MultipleRangesKeepOrderUnlessTheyOverlap) {
  auto r = ParseRange("bytes=500-599, 0-9", 1000);
  ASSERT_EQ(r.kind, Kind::kSatisfiable);
  EXPECT_EQ(r.ranges, R({{500, 599}, {0, 9}}));
  // Overlapping and adjacent ranges are sorted and coalesced.
  EXPECT_EQ(ParseRange("bytes=10-19,0-10", 1000).ranges, R({{0, 19}}));
  EXPECT_EQ(ParseRange("bytes=20-29,0-9,10-15", 1000).ranges, R({{0, 15}, {20, 29}}));
  EXPECT_EQ(ParseRange("bytes=0-,0-,0-", 100).ranges, R({{0, 99}}));
  // Unsatisfiable members are dropped when another is satisfiable.
  EXPECT_EQ(ParseRange("bytes=2000-3000,1-1", 1000).ranges, R({{1, 1}}));
  EXPECT_EQ(ParseRange("bytes=-0,1-1", 1000).ranges, R({{1, 1}}));
}

TEST(ParseRange, Unsatisfiable) {
  EXPECT_EQ(ParseRange("bytes=1000-", 1000).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=1000-2000", 1000).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=-0", 1000).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=5000-6000, 7000-", 1000).kind, Kind::kUnsatisfiable);
  // A first-pos beyond 2^64 is well-formed, just beyond the file.
  EXPECT_EQ(ParseRange("bytes=99999999999999999999999-", 1000).kind, Kind::kUnsatisfiable);
}

TEST(ParseRange, MalformedIsIgnored) {
  for (const char* h : {"",
                        "bytes",
                        "bytes=",
                        "bytes=,",
                        "bytes= , ",
                        "items=0-1",
                        "bytes0-1",
                        "bytes=a-b",
                        "bytes=1",
                        "bytes=--1",
                        "bytes=5-1",
                        "bytes=1-2-3",
                        "bytes=-",
                        "bytes=+1-2",
                        "bytes=1-+2",
                        "bytes=0x10-20",
                        "bytes=1 -2",
                        "bytes=0-1,x",
                        "bytes=0-1;2-3",
                        "bytes=-1-2",
                        "bytes=\xff-1"}) {
    EXPECT_EQ(ParseRange(h, 1000).kind, Kind::kIgnore) << "'" << h << "'";
  }
  // A zero-length file has no byte range to send: the header is ignored.
  EXPECT_EQ(ParseRange("bytes=0-", 0).kind, Kind::kIgnore);
  EXPECT_EQ(ParseRange("bytes=-5", 0).kind, Kind::kIgnore);
}

TEST(ParseRange, TooManyRangesAreIgnored) {
  std::string h = "bytes=";
  for (int i = 0; i < 65; ++i) h += std::to_string(i * 10) + "-" + std::to_string(i * 10) + ",";
  EXPECT_EQ(ParseRange(h, 100000).kind, Kind::kIgnore);
  EXPECT_EQ(ParseRange(h, 100000, 100).kind, Kind::kSatisfiable);
  EXPECT_EQ(ParseRange(h, 100000, 100).ranges.size(), 65u);
}

TEST(ParseRange, HugeValuesSaturate) {
  auto r = ParseRange("bytes=0-99999999999999999999999999", 10);
  ASSERT_EQ(r.kind, Kind::kSatisfiable);
  EXPECT_EQ(r.ranges, R({{0, 9}}));
  r = ParseRange("bytes=-99999999999999999999999999", 10);
  EXPECT_EQ(r.ranges, R({{0, 9}}));
}

// The hand-written formatter agrees with the C library's calendar, leap days and centuries
// included, and round-trips through the parser.
TEST(HttpDate, FormatMatchesGmtime) {
  std::mt19937_64 rng(11);
  std::vector<std::time_t> times = {0,          86399,      951782400,  951868800,
                                    4107542399, 4107542400, 1796083200, 253402300799};
  for (int i = 0; i < 20000; ++i) times.push_back(static_cast<std::time_t>(rng() % 253402300800));
  for (std::time_t t : times) {
    struct tm tm {};
    gmtime_r(&t, &tm);
    char want[64];
    std::strftime(want, sizeof(want), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    ASSERT_EQ(FormatHttpDate(t), want) << t;
    ASSERT_EQ(ParseHttpDate(want), t) << want;
  }
}

TEST(HttpDate, FormatAndParseAllThreeForms) {
  EXPECT_EQ(FormatHttpDate(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(ParseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
  EXPECT_EQ(ParseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT"), 784111777);
  EXPECT_EQ(ParseHttpDate("Sun Nov  6 08:49:37 1994"), 784111777);
  EXPECT_EQ(ParseHttpDate(" Sun, 06 Nov 1994 08:49:37 GMT "), 784111777);
  for (const char* bad : {"", "yesterday", "Sun, 06 Nov 1994 08:49:37 PST",
                          "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:49:37 GMT",
                          "Sun, 06 Nov 1994 08:49:37 GMT trailing", "\"abc\"", "W/\"abc\""})
    EXPECT_FALSE(ParseHttpDate(bad).has_value()) << bad;
}

TEST(Validators, ETagAndIfRange) {
  struct stat st {};
  st.st_ino = 0x1234;
  st.st_size = 4096;
  st.st_mtim.tv_sec = 1;
  st.st_mtim.tv_nsec = 5;
  std::string etag = MakeETag(st);
  EXPECT_EQ(etag, "\"1234-1000-3b9aca05\"");
  st.st_mtim.tv_nsec = 6;
  EXPECT_NE(MakeETag(st), etag);

  time_t mtime = 784111777;
  EXPECT_TRUE(IfRangeMatches(etag, etag, mtime));
  EXPECT_FALSE(IfRangeMatches("W/" + etag, etag, mtime));  // weak never matches
  EXPECT_FALSE(IfRangeMatches("\"other\"", etag, mtime));
  EXPECT_TRUE(IfRangeMatches("Sun, 06 Nov 1994 08:49:37 GMT", etag, mtime));
  EXPECT_FALSE(IfRangeMatches("Sun, 06 Nov 1994 08:49:38 GMT", etag, mtime));
  EXPECT_FALSE(IfRangeMatches("garbage", etag, mtime));
  EXPECT_TRUE(IfRangeMatches("1234-1000-3b9aca05", etag, mtime));  // sent without quotes
  EXPECT_FALSE(IfRangeMatches("W/1234-1000-3b9aca05", etag, mtime));
  EXPECT_FALSE(IfRangeMatches("", etag, mtime));

  EXPECT_TRUE(IfNoneMatchMatches("*", etag));
  EXPECT_TRUE(IfNoneMatchMatches(etag, etag));
  EXPECT_TRUE(IfNoneMatchMatches("\"a\", W/" + etag, etag));  // weak comparison
  EXPECT_FALSE(IfNoneMatchMatches("\"a\", \"b\"", etag));
  EXPECT_FALSE(IfNoneMatchMatches("", etag));
}

TEST(ContentDisposition, AsciiAndUtf8Names) {
  EXPECT_EQ(ContentDisposition("report.txt"),
            "attachment; filename=\"report.txt\"; filename*=UTF-8''report.txt");
  EXPECT_EQ(ContentDisposition("a b\"c\\.txt"),
            "attachment; filename=\"a b\\\"c\\\\.txt\"; filename*=UTF-8''a%20b%22c%5C.txt");
  // Korean "데이터.csv": non-ASCII dropped from the plain form, percent-encoded in filename*.
  EXPECT_EQ(ContentDisposition("\xeb\x8d\xb0\xec\x9d\xb4\xed\x84\xb0.csv"),
            "attachment; filename=\".csv\"; filename*=UTF-8''%EB%8D%B0%EC%9D%B4%ED%84%B0.csv");
  EXPECT_EQ(ContentDisposition("\xeb\x8d\xb0"),
            "attachment; filename=\"download\"; filename*=UTF-8''%EB%8D%B0");
  // Control characters never reach the header (no header injection).
  std::string h = ContentDisposition("a\r\nSet-Cookie: x=1");
  EXPECT_EQ(h.find('\r'), std::string::npos);
  EXPECT_EQ(h.find('\n'), std::string::npos);
  EXPECT_NE(h.find("filename*=UTF-8''a%0D%0ASet-Cookie%3A%20x%3D1"), std::string::npos);
}

}  // namespace
}  // namespace sluice::api
