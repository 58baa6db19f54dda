#include "common/token_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace sluice {
namespace {

TEST(TokenCache, FindsWhatWasInsertedByExactText) {
  VerifiedTokenCache<int> c(64);
  EXPECT_FALSE(c.Find("a.b.c", 0));
  EXPECT_EQ(*c.Insert("a.b.c", 7, std::nullopt), 7);
  ASSERT_TRUE(c.Find("a.b.c", 0));
  EXPECT_EQ(*c.Find("a.b.c", 0), 7);
  EXPECT_FALSE(c.Find("a.b.C", 0));
  EXPECT_FALSE(c.Find("a.b.c ", 0));
  EXPECT_FALSE(c.Find("a.b.", 0));
  // A second insert of the same token keeps the first value.
  EXPECT_EQ(*c.Insert("a.b.c", 8, std::nullopt), 7);
}

TEST(TokenCache, ExpiredTokensAreGone) {
  VerifiedTokenCache<int> c(64);
  c.Insert("t", 1, 100.0);
  EXPECT_TRUE(c.Find("t", 99.0));
  EXPECT_FALSE(c.Find("t", 100.0));  // exp <= now is expired
  EXPECT_FALSE(c.Find("t", 50.0));   // and removed
  c.Insert("t", 2, 200.0);
  EXPECT_EQ(*c.Find("t", 150.0), 2);
}

TEST(TokenCache, DisabledCacheKeepsNothing) {
  VerifiedTokenCache<int> c(0);
  EXPECT_EQ(*c.Insert("t", 3, std::nullopt), 3);
  EXPECT_FALSE(c.Find("t", 0));
}

TEST(TokenCache, ValuesOutliveEviction) {
  VerifiedTokenCache<std::string> c(16);  // one entry per shard
  auto v = c.Insert("keep-me", "value", std::nullopt);
  for (int i = 0; i < 1000; ++i) c.Insert("t" + std::to_string(i), "x", std::nullopt);
  EXPECT_EQ(*v, "value");
}

// Against a model: the cache holds at most its capacity, never answers with a wrong value, and
// keeps the most recent insertions of each shard.
TEST(TokenCache, BoundedAndConsistentUnderChurn) {
  const size_t kCapacity = 256;
  VerifiedTokenCache<std::string> c(kCapacity);
  std::mt19937 rng(1);
  std::set<std::string> inserted;
  for (int round = 0; round < 20000; ++round) {
    std::string t = "tok-" + std::to_string(rng() % 2000);
    if (rng() % 3 == 0) {
      c.Insert(t, "v" + t, rng() % 5 == 0 ? std::optional<double>(10.0) : std::nullopt);
      inserted.insert(t);
    }
    if (auto v = c.Find(t, 5.0)) {
      EXPECT_EQ(*v, "v" + t);
    }
  }
  size_t found = 0;
  for (const auto& t : inserted) found += static_cast<bool>(c.Find(t, 5.0));
  EXPECT_LE(found, kCapacity);
  EXPECT_GT(found, kCapacity / 2);
}

TEST(TokenCache, ThreadsShareIt) {
  VerifiedTokenCache<std::string> c(128);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&c, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 20000; ++i) {
        std::string tok = "tok-" + std::to_string(rng() % 500);
        if (auto v = c.Find(tok, 0)) {
          EXPECT_EQ(*v, "v" + tok);
        } else {
          EXPECT_EQ(*c.Insert(tok, "v" + tok, std::nullopt), "v" + tok);
        }
      }
    });
  for (auto& th : threads) th.join();
}

}  // namespace
}  // namespace sluice
