#include "api/http.h"

#include <gtest/gtest.h>

#include <cctype>
#include <random>
#include <string>

namespace sluice::api {
namespace {

// The straightforward decoder PercentDecode must agree with.
std::string NaivePercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += c == '+' && plus_is_space ? ' ' : c;
    }
  }
  return out;
}

TEST(Http, PercentDecode) {
  EXPECT_EQ(PercentDecode("a%41%4a%4A+b", true), "aAJJ b");
  EXPECT_EQ(PercentDecode("a+b", false), "a+b");
  EXPECT_EQ(PercentDecode("%2B%2b", true), "++");
  EXPECT_EQ(PercentDecode("%", true), "%");
  EXPECT_EQ(PercentDecode("%4", true), "%4");
  EXPECT_EQ(PercentDecode("%zz%", true), "%zz%");
  EXPECT_EQ(PercentDecode("%00", true), std::string(1, '\0'));
  std::mt19937 rng(7);
  const std::string alphabet = "%+a4Fz";
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 12, ' ');
    for (auto& c : s) c = alphabet[rng() % alphabet.size()];
    for (bool plus : {false, true})
      EXPECT_EQ(PercentDecode(s, plus), NaivePercentDecode(s, plus)) << s;
  }
}

TEST(Http, ParseTarget) {
  std::string path;
  std::map<std::string, std::string> q;
  ParseTarget("/folder/usage?volume=local&vfid=a%2Fb&x=1+2", path, q);
  EXPECT_EQ(path, "/folder/usage");
  EXPECT_EQ(q["volume"], "local");
  EXPECT_EQ(q["vfid"], "a/b");
  EXPECT_EQ(q["x"], "1 2");
  // A listener's skipped prefix (the S3 listener's presigned parameters) never reaches handlers.
  std::map<std::string, std::string> s3q;
  ParseTarget("/b/k?X-Amz-Date=1&X%2DAmz-Signature=2&x-amz-x=3&uploads", path, s3q, "X-Amz-");
  EXPECT_EQ(s3q, (std::map<std::string, std::string>{{"uploads", ""}, {"x-amz-x", "3"}}));
}

TEST(Http, ParamsMergeBodyOverQuery) {
  HttpRequest req;
  req.query["volume"] = "fromquery";
  req.query["recursive"] = "true";
  req.msg.body() = R"({"volume": "frombody", "mode": 493})";
  auto p = Params::From(req);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->Str("volume"), "frombody");
  EXPECT_TRUE(*p->Bool("recursive", false));
  EXPECT_EQ(**p->OptUint("mode"), 493u);
  EXPECT_EQ(p->Str("missing").status().code(), Code::kInvalidArgument);
}

TEST(Http, ParamsRejectBadBodies) {
  HttpRequest req;
  req.msg.body() = "{not json";
  EXPECT_FALSE(Params::From(req).ok());
  req.msg.body() = "[1,2]";
  EXPECT_FALSE(Params::From(req).ok());
  req.msg.body() = R"({"relpaths": [1]})";
  EXPECT_FALSE(Params::From(req)->StrList("relpaths").ok());
}

TEST(Http, ErrorResponseIsProblemJson) {
  auto r = ErrorResponse(Status(Code::kInvalidPath, "bad", EXDEV), {"../x"});
  EXPECT_EQ(r.status, 400u);
  EXPECT_EQ(r.content_type, "application/problem+json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["msg"], "bad");
  EXPECT_EQ(j["errno"], EXDEV);
  EXPECT_EQ(j["paths"][0], "../x");
}

}  // namespace
}  // namespace sluice::api
