// Assertions on Status and Result<T> that print the status when they fail (instead of a bare
// "false"), as 3FS's GtestHelpers do:
//   ASSERT_OK(vol->Mkdir(...));           EXPECT_OK(result_of_something);
//   ASSERT_ERROR(vol->Stat(...), Code::kNotFound);
#pragma once

#include <gtest/gtest.h>

#include "common/status.h"

namespace sluice::test {

inline const Status& StatusOf(const Status& s) {
  return s;
}
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

inline ::testing::AssertionResult IsOk(const char* expr, const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " failed: " << s.ToString();
}

inline ::testing::AssertionResult HasCode(const char* expr, const char*, const Status& s,
                                          Code want) {
  if (s.code() == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << ": expected " << CodeName(want) << ", got "
                                       << (s.ok() ? std::string("OK") : s.ToString());
}

}  // namespace sluice::test

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::sluice::test::IsOk, ::sluice::test::StatusOf(expr))
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::sluice::test::IsOk, ::sluice::test::StatusOf(expr))
#define EXPECT_ERROR(expr, code) \
  EXPECT_PRED_FORMAT2(::sluice::test::HasCode, ::sluice::test::StatusOf(expr), code)
#define ASSERT_ERROR(expr, code) \
  ASSERT_PRED_FORMAT2(::sluice::test::HasCode, ::sluice::test::StatusOf(expr), code)
