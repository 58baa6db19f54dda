// The S3 store's shared records as two nodes see them (two stores on one directory): a reload
// that fails part-way keeps what it knew and tries again, a stamp is not trusted while the
// directory has just changed, a record that cannot be read is an error rather than "no such
// bucket", and a bucket name deleted and made again elsewhere is not unbound by a stale node.
#include "service/s3/s3_store.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "support/assert_status.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  char t[] = "/tmp/sluice-s3store-XXXXXX";
  EXPECT_NE(::mkdtemp(t), nullptr);
  return t;
}

// Long enough for a change to be older than RecordDir::Stamp's two seconds.
void Settle() {
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
}

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = TempDir(); }
  void TearDown() override { fs::remove_all(root_); }
  std::unique_ptr<S3Store> Node(const std::string& seal_key = "the seal key of these tests") {
    auto s = S3Store::Open(root_, seal_key);
    EXPECT_OK(s);
    return s.ok() ? std::move(s).value() : nullptr;
  }
  static S3User User(const std::string& id) {
    S3User u;
    u.id = id;
    u.default_volume = "local";
    u.default_scope = "user:11111111111111111111111111111111";
    return u;
  }
  static S3Bucket Bucket(const std::string& name, const std::string& owner, char vf) {
    return S3Bucket{name, "local", "user:11111111111111111111111111111111/" + std::string(32, vf),
                    owner};
  }
  std::string root_;
};

TEST(RecordDirStamp, IsEmptyWhileTheDirectoryJustChanged) {
  const std::string dir = TempDir();
  auto d = RecordDir::Open(dir + "/r");
  ASSERT_OK(d);
  ASSERT_OK(d->Create("a", "{}"));
  auto s = d->Stamp();
  ASSERT_OK(s);
  EXPECT_EQ(*s, "");  // a second change in this clock tick would not move it
  Settle();
  s = d->Stamp();
  ASSERT_OK(s);
  EXPECT_NE(*s, "");
  EXPECT_EQ(*d->Stamp(), *s);  // settled: the same until the next change
  ASSERT_OK(d->Remove("a"));
  EXPECT_EQ(*d->Stamp(), "");
  Settle();
  EXPECT_NE(*d->Stamp(), *s);
  fs::remove_all(dir);
}

// Node B reloads while it is out of descriptors: the listing fails, and the keys it knew stay
// (before, the map was emptied and the new stamp kept, so every key was refused until some node
// changed the directory again). The next refresh loads what it missed.
TEST_F(S3StoreTest, AReloadThatCannotListKeepsWhatItKnewAndTriesAgain) {
  auto a = Node(), b = Node();
  ASSERT_TRUE(a && b);
  ASSERT_OK(a->CreateUser(User("alice")));
  auto k1 = a->CreateKey("alice", std::nullopt, std::nullopt, {}, false);
  ASSERT_OK(k1);
  b->Refresh();
  ASSERT_NE(b->FindKey(k1->access_key), nullptr);
  auto k2 = a->CreateKey("alice", std::nullopt, std::nullopt, {}, false);
  ASSERT_OK(k2);
  Settle();
  {
    struct rlimit old;
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
    const int lowest = ::dup(0);  // the lowest free descriptor: the limit makes it the last
    ASSERT_GE(lowest, 0);
    ::close(lowest);
    struct rlimit low = old;
    low.rlim_cur = static_cast<rlim_t>(lowest);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    b->Refresh();
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  }
  EXPECT_NE(b->FindKey(k1->access_key), nullptr);
  EXPECT_EQ(b->FindKey(k2->access_key), nullptr);  // not read yet
  b->Refresh();
  EXPECT_NE(b->FindKey(k1->access_key), nullptr);
  EXPECT_NE(b->FindKey(k2->access_key), nullptr);
  // A revocation on A, settled or not, is seen by B's next refresh.
  ASSERT_OK(a->RevokeKey(k1->access_key));
  b->Refresh();
  EXPECT_EQ(b->FindKey(k1->access_key), nullptr);
}

TEST_F(S3StoreTest, ARecordThatCannotBeReadIsNotAMissingBucket) {
  auto a = Node();
  ASSERT_TRUE(a);
  fs::create_directory(root_ + "/buckets/broken.json");  // opens, then fails to read (EISDIR)
  auto b = a->FindBucket("broken");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().code(), Code::kNotFound) << b.status().ToString();
  EXPECT_ERROR(a->FindBucket("absent"), Code::kNotFound);
}

// Node B still maps "data" to alice's vfolder when A has deleted it and bob has made it again:
// B's delete of alice's bucket must not unbind bob's.
TEST_F(S3StoreTest, AStaleNodeDoesNotUnbindANameMadeAgain) {
  auto a = Node(), b = Node();
  ASSERT_TRUE(a && b);
  ASSERT_OK(a->CreateUser(User("alice")));
  ASSERT_OK(a->CreateUser(User("bob")));
  ASSERT_OK(a->BindBucket(Bucket("data", "alice", 'a')));
  b->Refresh();
  auto seen = b->FindBucket("data");
  ASSERT_OK(seen);
  ASSERT_OK(a->UnbindBucket("data", seen->vfid));
  ASSERT_OK(a->BindBucket(Bucket("data", "bob", 'b')));
  EXPECT_ERROR(b->UnbindBucket("data", seen->vfid), Code::kNotFound);
  auto now = a->FindBucket("data");
  ASSERT_OK(now);
  EXPECT_EQ(now->owner, "bob");
  ASSERT_OK(b->UnbindBucket("data"));  // an operator's unbind by name alone
  a->Refresh();
  EXPECT_ERROR(a->FindBucket("data"), Code::kNotFound);
}

// Node A still knows carol when B deletes her: A's new key or bucket for her is undone (before,
// it outlived her, and a user later made with her id inherited it).
TEST_F(S3StoreTest, NothingIsLinkedForAUserDeletedOnAnotherNode) {
  auto a = Node(), b = Node();
  ASSERT_TRUE(a && b);
  ASSERT_OK(a->CreateUser(User("carol")));
  b->Refresh();
  ASSERT_OK(b->DeleteUser("carol"));
  EXPECT_ERROR(a->CreateKey("carol", std::nullopt, std::nullopt, {}, false), Code::kNotFound);
  EXPECT_ERROR(a->BindBucket(Bucket("carols", "carol", 'c')), Code::kNotFound);
  b->Refresh();
  EXPECT_TRUE(b->Keys().empty());
  EXPECT_TRUE(b->Buckets().empty());
  // A user with keys is not deleted, and stays whole.
  ASSERT_OK(a->CreateUser(User("dave")));
  ASSERT_OK(a->CreateKey("dave", std::nullopt, std::nullopt, {}, false));
  b->Refresh();
  EXPECT_ERROR(b->DeleteUser("dave"), Code::kConflict);
  EXPECT_OK(a->GetUser("dave"));
}

// A bucket record of any shape (the store is shared: another version, a hand edit) is skipped,
// never thrown from a reload. Before, a non-boolean "owns_vfolder" ended every node at start.
TEST_F(S3StoreTest, ABucketRecordOfTheWrongShapeIsSkipped) {
  {
    auto a = Node();
    ASSERT_TRUE(a);
    ASSERT_OK(a->CreateUser(User("alice")));
    ASSERT_OK(a->BindBucket(Bucket("good", "alice", 'g')));
  }
  std::FILE* f = std::fopen((root_ + "/buckets/odd.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"name":"odd","volume":"local","vfid":"x","owner":"alice","created":1,)"
             R"("owns_vfolder":"yes"})",
             f);
  std::fclose(f);
  auto b = Node();
  ASSERT_TRUE(b);
  ASSERT_EQ(b->Buckets().size(), 1u);
  EXPECT_EQ(b->Buckets()[0].name, "good");
  EXPECT_FALSE(b->FindBucket("odd").ok());
}

// A node whose seal key differs cannot unseal alice's key, and does not see it: her delete is
// still refused while the key's record is there, and a key whose user is gone authenticates
// nothing. Before, the other node deleted her and the key went on working where it unseals.
TEST_F(S3StoreTest, AUserIsNotDeletedUnderAKeyThisNodeCannotUnseal) {
  auto a = Node();
  ASSERT_TRUE(a);
  ASSERT_OK(a->CreateUser(User("alice")));
  auto k = a->CreateKey("alice", std::nullopt, std::nullopt, {}, false);
  ASSERT_OK(k);
  auto other = Node("another node's seal key");
  ASSERT_TRUE(other);
  EXPECT_TRUE(other->Keys().empty());
  EXPECT_ERROR(other->DeleteUser("alice"), Code::kConflict);
  EXPECT_OK(a->GetUser("alice"));
  ASSERT_NE(a->FindKey(k->access_key), nullptr);
  fs::remove(root_ + "/users/alice.json");  // gone by hand, or by a node of an older version
  a->Refresh();
  EXPECT_EQ(a->FindKey(k->access_key), nullptr);
}

// Node B cannot list the keys directory (its export went away: here a file stands in its
// place). It keeps the keys it knew but stops vouching for them once the staleness passed, so
// the API refuses requests rather than honour a key revoked elsewhere meanwhile; once it reads
// the directory again, the keys are current and the revocation is seen.
TEST_F(S3StoreTest, KeysNotSeenOnDiskForTooLongAreNotCurrent) {
  auto a = Node(), b = Node();
  ASSERT_TRUE(a && b);
  b->set_key_staleness(std::chrono::milliseconds(1000));
  ASSERT_OK(a->CreateUser(User("alice")));
  auto k = a->CreateKey("alice", std::nullopt, std::nullopt, {}, false);
  ASSERT_OK(k);
  b->Refresh();
  ASSERT_NE(b->FindKey(k->access_key), nullptr);
  EXPECT_TRUE(b->KeysCurrent());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(b->KeysCurrent());  // nobody looked: a stopped refresh fails closed too
  b->Refresh();
  EXPECT_TRUE(b->KeysCurrent());

  ASSERT_OK(a->RevokeKey(k->access_key));
  fs::rename(root_ + "/keys", root_ + "/keys.away");
  {
    std::FILE* f = std::fopen((root_ + "/keys").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  b->Refresh();
  EXPECT_NE(b->FindKey(k->access_key), nullptr);  // kept: the listing failed
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  b->Refresh();
  EXPECT_FALSE(b->KeysCurrent());
  fs::remove(root_ + "/keys");
  fs::rename(root_ + "/keys.away", root_ + "/keys");
  b->Refresh();
  EXPECT_TRUE(b->KeysCurrent());
  EXPECT_EQ(b->FindKey(k->access_key), nullptr);
}

// A record replaced in place leaves its directory's stamp as it was (so would a change the
// stamp's clock check missed): the periodic whole reload picks it up.
TEST_F(S3StoreTest, AChangeTheStampMissesIsPickedUpByTheWholeReload) {
  auto a = Node(), b = Node();
  ASSERT_TRUE(a && b);
  ASSERT_OK(a->CreateUser(User("alice")));
  auto k = a->CreateKey("alice", std::nullopt, std::nullopt, {}, false);
  ASSERT_OK(k);
  Settle();
  b->Refresh();
  ASSERT_NE(b->FindKey(k->access_key), nullptr);
  ASSERT_FALSE(b->FindKey(k->access_key)->read_only);
  const std::string file = root_ + "/keys/" + k->access_key + ".json";
  std::string text;
  {
    std::FILE* f = std::fopen(file.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    text.assign(buf, std::fread(buf, 1, sizeof buf, f));
    std::fclose(f);
  }
  const auto at = text.find("\"read_only\":false");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 17, "\"read_only\":true");
  {
    std::FILE* f = std::fopen(file.c_str(), "w");  // in place: the directory does not change
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  b->Refresh();
  EXPECT_FALSE(b->FindKey(k->access_key)->read_only);  // the stamp says nothing changed
  b->set_full_reload(std::chrono::milliseconds(0));
  b->Refresh();
  EXPECT_TRUE(b->FindKey(k->access_key)->read_only);
}

}  // namespace
}  // namespace sluice
