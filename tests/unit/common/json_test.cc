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

TEST(Json, TooManyValuesAreRefusedBeforeParsing) {
  EXPECT_EQ(JsonValueBound(R"({"a": [1, 2, "x,y,[{"]})", 100), 5u);
  EXPECT_EQ(JsonValueBound("7", 100), 1u);
  std::string many = "[";
  for (int i = 0; i < 200000; ++i) many += "{},";
  many += "{}]";
  EXPECT_EQ(JsonValueBound(many, 1000), 1001u);  // stops once past the bound
  auto r = ParseJson(many, "the body", kMaxJsonDepth, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "the body holds more than 1000 values");
  EXPECT_TRUE(ParseJson(many, "the body").ok());  // no bound by default
  EXPECT_TRUE(ParseJson("[1,2,3]", "the body", kMaxJsonDepth, 4).ok());
  EXPECT_FALSE(ParseJson("[1,2,3,4]", "the body", kMaxJsonDepth, 4).ok());
}

TEST(Json, InvalidJsonNamesWhat) {
  auto r = ParseJson("{nope", "the token's claims");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "the token's claims is not valid JSON");
}

}  // namespace
}  // namespace sluice
