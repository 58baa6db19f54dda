#include "common/status.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, FromErrnoMapsCodes) {
  EXPECT_EQ(Status::FromErrno(ENOENT, "open x").code(), Code::kNotFound);
  EXPECT_EQ(Status::FromErrno(EDQUOT, "write").code(), Code::kQuotaExceeded);
  EXPECT_EQ(Status::FromErrno(EEXIST, "mkdir").code(), Code::kAlreadyExists);
  Status s = Status::FromErrno(EACCES, "open y");
  EXPECT_EQ(s.sys_errno(), EACCES);
  EXPECT_NE(s.message().find("open y"), std::string::npos);
}

TEST(Status, TableHasHttpAndS3) {
  EXPECT_EQ(CodeHttpStatus(Code::kNotFound), 404);
  EXPECT_EQ(CodeHttpStatus(Code::kAlreadyExists), 409);
  EXPECT_EQ(CodeHttpStatus(Code::kInvalidPath), 400);
  EXPECT_EQ(CodeHttpStatus(Code::kUnauthenticated), 403);
  EXPECT_EQ(CodeS3Error(Code::kNotFound), "NoSuchKey");
  EXPECT_EQ(CodeName(Code::kNotFound), "NotFound");
  EXPECT_EQ(CodeErrno(Code::kQuotaExceeded), EDQUOT);
}

TEST(Result, ValueOrStatus) {
  Result<int> r = 5;
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  Result<int> e = Status(Code::kInternal, "boom");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "boom");
}

Result<int> Twice(Result<int> in) {
  SLUICE_ASSIGN_OR_RETURN(int v, std::move(in));
  return v * 2;
}

TEST(Result, AssignOrReturnPropagates) {
  EXPECT_EQ(*Twice(21), 42);
  EXPECT_EQ(Twice(Status(Code::kNotFound, "x")).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace sluice
