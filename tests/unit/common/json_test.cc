#include "common/json.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice {
namespace {

TEST(Json, NestingDepthSkipsStrings) {
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": "[[[[{{{"}]})"), 3u);
  EXPECT_EQ(JsonNestingDepth(R"(["\"[[[[", ["x"]])"), 2u);
  EXPECT_EQ(JsonNestingDepth(R"("\\" [[ )"), 2u);  // an escaped backslash ends the string
  EXPECT_EQ(JsonNestingDepth("42"), 0u);
}

TEST(Json, TooDeepIsRefusedBeforeParsing) {
  std::string deep;
  for (int i = 0; i < 60000; ++i) deep += "{\"a\":";
  deep += "1";
  for (int i = 0; i < 60000; ++i) deep += "}";
  auto r = ParseJson(deep, "request body");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("deeper than 400"), std::string::npos);

  std::string ok;
  for (size_t i = 0; i < kMaxJsonDepth; ++i) ok += "[";
  for (size_t i = 0; i < kMaxJsonDepth; ++i) ok += "]";
  EXPECT_TRUE(ParseJson(ok, "body").ok());
  EXPECT_FALSE(ParseJson("[" + ok + "]", "body").ok());
}

TEST(Json, InvalidJsonNamesWhat) {
  auto r = ParseJson("{nope", "the token's claims");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "the token's claims is not valid JSON");
}

}  // namespace
}  // namespace sluice
