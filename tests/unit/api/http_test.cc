#include "api/http.h"

#include <gtest/gtest.h>

namespace sluice::api {
namespace {

TEST(Http, ParseTarget) {
  std::string path;
  std::map<std::string, std::string> q;
  ParseTarget("/folder/usage?volume=local&vfid=a%2Fb&x=1+2", path, q);
  EXPECT_EQ(path, "/folder/usage");
  EXPECT_EQ(q["volume"], "local");
  EXPECT_EQ(q["vfid"], "a/b");
  EXPECT_EQ(q["x"], "1 2");
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
