#include "volume/ids.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(Ids, QuotaScope) {
  auto q = QuotaScopeId::Parse("user:0123456789ABCDEF0123456789abcdef");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->type, QuotaScopeType::kUser);
  EXPECT_EQ(q->hex, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(q->ToString(), "user:01234567-89ab-cdef-0123-456789abcdef");
  auto d = QuotaScopeId::Parse("project:01234567-89ab-cdef-0123-456789abcdef");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->type, QuotaScopeType::kProject);
  EXPECT_EQ(d->hex, q->hex);
}

TEST(Ids, QuotaScopeRejects) {
  EXPECT_FALSE(QuotaScopeId::Parse("group:0123456789abcdef0123456789abcdef").ok());
  EXPECT_FALSE(QuotaScopeId::Parse("user:xyz").ok());
  EXPECT_FALSE(QuotaScopeId::Parse("0123456789abcdef0123456789abcdef").ok());
  EXPECT_FALSE(QuotaScopeId::Parse("user:../../etc/passwd/aaaaaaaaaaaaaaaa").ok());
}

TEST(Ids, VFolder) {
  auto v =
      VFolderId::Parse("user:0123456789abcdef0123456789abcdef/fedcba9876543210fedcba9876543210");
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->scope.has_value());
  EXPECT_EQ(v->hex, "fedcba9876543210fedcba9876543210");
  auto legacy = VFolderId::Parse("fedcba98-7654-3210-fedc-ba9876543210");
  ASSERT_TRUE(legacy.ok());
  EXPECT_FALSE(legacy->scope.has_value());
  EXPECT_EQ(legacy->ToString(), "fedcba9876543210fedcba9876543210");
  EXPECT_FALSE(VFolderId::Parse("user:0123456789abcdef0123456789abcdef/..").ok());
  EXPECT_FALSE(VFolderId::Parse("").ok());
}

}  // namespace
}  // namespace sluice
