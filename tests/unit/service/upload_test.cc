#include "service/upload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/jwt.h"
#include "service/storage_service.h"
#include "volume/forwarding_volume.h"
#include "volume/registry.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class UploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-upload-XXXXXX";
    base_ = mkdtemp(tmpl);
    fs::create_directories(base_ + "/vol");
    Config cfg;
    cfg.secret = "upload-test-secret";
    cfg.session_expire = std::chrono::seconds(100);
    VolumeConfig vc;
    vc.name = "local";
    vc.backend = "vfs";
    vc.path = base_ + "/vol";
    cfg.volumes.push_back(vc);
    std::vector<std::unique_ptr<Volume>> vols;
    vols.push_back(VolumeRegistry::Builtin().Create(vc, VolumeDeps{&scan_}).value());
    ASSERT_TRUE(vols.back()->Init().ok());
    svc_ = std::make_unique<StorageService>(cfg, std::move(vols), &tasks_);
    vfid_ = VFolderId::Parse(
                "user:11111111111111111111111111111111/"
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
                .value();
    ASSERT_TRUE(svc_->CreateVFolder("local", vfid_, 0755, std::nullopt).ok());
    up_ = std::make_unique<UploadService>(svc_.get());
  }
  void TearDown() override {
    up_.reset();
    svc_.reset();
    fs::remove_all(base_);
  }
  Volume* vol() { return svc_->GetVolume("local").value(); }

  // What the client API does with an upload token carrying `claims`: verify, then resolve.
  Result<UploadTarget> ResolveClaims(nlohmann::json claims, std::optional<std::string> dst_dir) {
    claims["op"] = "upload";
    auto grant = svc_->tokens().VerifyUpload(JwtEncode(claims, svc_->config().secret));
    if (!grant.ok()) return grant.status();
    return up_->ResolveGrant(*grant, dst_dir);
  }
  fs::path vf() { return vol()->VFolderPath(vfid_); }

  // A new session and the target its token would name.
  UploadTarget Session(const std::string& rel, uint64_t size) {
    auto s = up_->CreateSession(*vol(), vfid_, rel, size);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    nlohmann::json claims = {{"volume", "local"},
                             {"vfid", vfid_.ToString()},
                             {"relpath", rel},
                             {"session", s.ok() ? *s : ""},
                             {"size", size}};
    auto t = ResolveClaims(claims, std::nullopt);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : UploadTarget{};
  }

  std::string base_;
  ThreadPool scan_{"scan", 2};
  ThreadPool tasks_{"task", 2};
  std::unique_ptr<StorageService> svc_;
  std::unique_ptr<UploadService> up_;
  VFolderId vfid_;
};

TEST_F(UploadTest, WritesResumesAndRenamesIntoPlace) {
  UploadTarget t = Session("a/b/file.bin", 10);
  uint64_t cur = 0;
  auto w = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Write("01234", 5).ok());
  auto off = (*w)->Finish();
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, 5u);
  EXPECT_EQ(up_->Query(t)->offset, 5u);
  EXPECT_FALSE(fs::exists(vf() / "a"));

  auto wrong = up_->BeginWrite(t, 4, &cur);
  EXPECT_EQ(wrong.status().code(), Code::kConflict);
  EXPECT_EQ(cur, 5u);

  w = up_->BeginWrite(t, 5, &cur);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Write("56789x", 6).code(), Code::kTooLarge);
  (*w)->Abort();
  EXPECT_EQ(up_->Query(t)->offset, 5u);  // the over-long PATCH counts for nothing

  w = up_->BeginWrite(t, 5, &cur);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write("56789", 5).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadAll(vf() / "a/b/file.bin"), "0123456789");
  auto q = up_->Query(t);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->complete);
  EXPECT_EQ(q->offset, 10u);
}

// A volume whose first InspectStaging runs `between` after reading the session's record and
// before looking for its staging file, as a HEAD racing the last PATCH would.
class RacedInspect : public ForwardingVolume {
 public:
  RacedInspect(std::unique_ptr<Volume> inner, std::function<void()> between)
      : ForwardingVolume(std::move(inner)), between_(std::move(between)) {}
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override {
    auto st = ForwardingVolume::InspectStaging(vfid, session);
    if (!between_ || !st.ok()) return st;
    std::exchange(between_, nullptr)();
    auto now = ForwardingVolume::InspectStaging(vfid, session);  // the staging file's part
    if (!now.ok()) return now;
    st->staged = now->staged;
    st->staged_size = now->staged_size;
    return st;
  }

 private:
  std::function<void()> between_;
};

TEST_F(UploadTest, AQueryRacingTheLastWriteAnswersComplete) {
  UploadTarget t = Session("raced.bin", 10);
  auto patch = [&](uint64_t at, const char* data) {  // one whole PATCH
    uint64_t cur = 0;
    auto w = up_->BeginWrite(t, at, &cur);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write(data, std::strlen(data)).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  };
  patch(0, "01234");
  VolumeConfig vc;
  vc.name = "local";
  vc.backend = "vfs";
  vc.path = base_ + "/vol";
  auto same = VolumeRegistry::Builtin().Create(vc, VolumeDeps{&scan_});
  ASSERT_TRUE(same.ok());
  ASSERT_TRUE((*same)->Init().ok());
  // The last PATCH, committed in between.
  RacedInspect raced(std::move(same).value(), [&] { patch(5, "56789"); });
  UploadTarget through = t;
  through.volume = &raced;
  auto q = up_->Query(through);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_TRUE(q->complete);
  EXPECT_EQ(q->offset, 10u);
  EXPECT_EQ(ReadAll(vf() / "raced.bin"), "0123456789");
}

TEST_F(UploadTest, OneWriterAtATime) {
  UploadTarget t = Session("f", 4);
  uint64_t cur = 0;
  auto first = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(first.ok());
  // OFD locks conflict between open files, even within one process.
  auto second = up_->BeginWrite(t, 0, &cur);
  EXPECT_EQ(second.status().code(), Code::kConflict);
  (*first)->Abort();
  auto third = up_->BeginWrite(t, 0, &cur);
  EXPECT_TRUE(third.ok());
}

TEST_F(UploadTest, InterruptedWriteKeepsWhatArrived) {
  UploadTarget t = Session("f", 100);
  uint64_t cur = 0;
  auto w = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write("abcdef", 6).ok());
  (*w)->Abort();
  EXPECT_EQ(up_->Query(t)->offset, 6u);
}

TEST_F(UploadTest, AnOverlongPatchLeavesTheReservationWhole) {
  // A PATCH that syncs on its way (here after the sync interval) and then runs past the
  // upload's length is rolled back whole: the bytes it wrote are to come again, so the
  // reservation it shrank grows back to them.
  ASSERT_TRUE(vol()->quota().UpdateScope(*vfid_.scope, 1000).ok());  // reserved when limited
  UploadTarget t = Session("f", 100);
  const std::string scope = QuotaReservations::ScopeKey("local", vfid_.scope->hex);
  uint64_t cur = 0;
  auto w = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(svc_->reservations().Reserved(scope), 100u);
  ASSERT_TRUE((*w)->Write(std::string(40, 'a').data(), 40).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE((*w)->Write(std::string(40, 'b').data(), 40).ok());  // syncs: 20 left
  EXPECT_EQ(svc_->reservations().Reserved(scope), 20u);
  EXPECT_EQ((*w)->Write(std::string(40, 'c').data(), 40).code(), Code::kTooLarge);
  (*w)->Abort();
  EXPECT_EQ(up_->Query(t)->offset, 0u);
  EXPECT_EQ(svc_->reservations().Reserved(scope), 100u);
}

TEST_F(UploadTest, DiscardsBytesPastTheDurableOffset) {
  UploadTarget t = Session("f", 6);
  fs::path stage = vf() / ".upload" / t.session;
  {
    std::ofstream out(stage, std::ios::binary);
    out << "abcGARBAGE";
  }
  {
    std::ofstream out(stage.string() + ".offset");
    out << R"({"offset": 3})";
  }
  uint64_t cur = 0;
  auto w = up_->BeginWrite(t, 3, &cur);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(fs::file_size(stage), 3u);
  ASSERT_TRUE((*w)->Write("def", 3).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadAll(vf() / "f"), "abcdef");
}

TEST_F(UploadTest, RefusesHostileClaims) {
  auto s = up_->CreateSession(*vol(), vfid_, "ok", 1);
  ASSERT_TRUE(s.ok());
  nlohmann::json base = {{"volume", "local"},
                         {"vfid", vfid_.ToString()},
                         {"relpath", "ok"},
                         {"session", *s},
                         {"size", 1}};
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"relpath", "../x"},
                                                           {"relpath", "/x"},
                                                           {"relpath", ".upload/x"},
                                                           {"relpath", ""},
                                                           {"session", "../x"},
                                                           {"session", "ab"},
                                                           {"size", -1},
                                                           {"size", "1"},
                                                           {"vfid", "nope"}}) {
    nlohmann::json c = base;
    c[k] = v;
    auto t = ResolveClaims(c, std::nullopt);
    EXPECT_FALSE(t.ok()) << k << "=" << v.dump();
    EXPECT_EQ(CodeHttpStatus(t.status().code()), 400) << k << "=" << v.dump();
  }
  EXPECT_EQ(ResolveClaims(base, std::string("../..")).status().code(), Code::kInvalidPath);
  nlohmann::json c = base;
  c["volume"] = "nope";
  EXPECT_EQ(ResolveClaims(c, std::nullopt).status().code(), Code::kNotFound);
}

TEST_F(UploadTest, QuotaIsReservedAtCreationAndCheckedAgainAfterARestart) {
  ASSERT_TRUE(vol()->quota().UpdateScope(*vfid_.scope, 1000).ok());
  EXPECT_EQ(up_->CreateSession(*vol(), vfid_, "big", 1001).status().code(), Code::kQuotaExceeded);
  UploadTarget t = Session("f", 600);
  // 600 bytes are promised to the first session: a second one of 500 does not fit, although
  // nothing is written yet.
  auto second = up_->CreateSession(*vol(), vfid_, "g", 500);
  EXPECT_EQ(second.status().code(), Code::kQuotaExceeded);
  EXPECT_NE(second.status().message().find("promised to other uploads"), std::string::npos)
      << second.status().ToString();
  // A refused session leaves no staging file behind.
  size_t staged = 0;
  for (auto& e : fs::directory_iterator(vf() / ".upload")) staged += e.path().extension() == "";
  EXPECT_EQ(staged, 1u);
  EXPECT_TRUE(up_->CreateSession(*vol(), vfid_, "g", 400).ok());

  // After a restart (reservations are in memory) the session is checked again before it
  // writes: the disk filled up meanwhile behind Sluice's back.
  svc_->reservations().Release(UploadService::ReservationKey(t));
  {
    std::ofstream out(vf() / "filler", std::ios::binary);
    out << std::string(500, 'x');
  }
  ASSERT_TRUE(vol()->GetFreshUsage(vfid_).ok());
  uint64_t cur = 0;
  EXPECT_EQ(up_->BeginWrite(t, 0, &cur).status().code(), Code::kQuotaExceeded);
  fs::remove(vf() / "filler");
  ASSERT_TRUE(vol()->GetFreshUsage(vfid_).ok());
  auto w = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Write(std::string(600, 'a').data(), 600).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  // Complete: its reservation is released, and its bytes count as used.
  EXPECT_EQ(svc_->reservations().Reserved(QuotaReservations::ScopeKey("local", vfid_.scope->hex)),
            400u);
  uint64_t used = vol()->quota().DescribeScope(*vfid_.scope)->used_bytes;
  EXPECT_GE(used, 600u);
  EXPECT_LT(used, 800u);  // plus the completed session's offset record and its spare
  // Deleting the vfolder releases what its sessions still held (the 400 of "g"): before, that
  // counted against the scope until the process restarted.
  ASSERT_TRUE(svc_->DeleteVFolder("local", vfid_).ok());
  EXPECT_EQ(svc_->reservations().Reserved(QuotaReservations::ScopeKey("local", vfid_.scope->hex)),
            0u);
  // A session that opened its staging file before the delete and reserves after it (a first
  // PATCH, a CreateSession between its staging file and its check) keeps nothing either:
  // before, its reservation was made again after the delete had released them all.
  Status late =
      ReserveScopeQuota(svc_->reservations(), *vol(), vfid_, UploadService::ReservationKey(t), 100);
  EXPECT_EQ(late.code(), Code::kNotFound) << late.ToString();
  EXPECT_EQ(svc_->reservations().Reserved(QuotaReservations::ScopeKey("local", vfid_.scope->hex)),
            0u);
  // The trash is emptied by a background task: done before the fixture removes the volume.
  EXPECT_TRUE(svc_->tasks().WaitIdle(std::chrono::seconds(30)));
}

// A check compares a usage figure read before its lock with the reservations under it: what
// other sessions wrote (or gave up) in between left their reservations but may be missing from
// that figure, so it counts as theirs still.
TEST(QuotaReservations, BytesThatMovedSinceTheUsageWasReadStillCount) {
  QuotaReservations r;
  const std::string scope = QuotaReservations::ScopeKey("local", "s");
  auto fits = [](uint64_t) { return Status::Ok(); };
  ASSERT_TRUE(r.Reserve(scope, "a", 100, r.Moved(scope), fits).ok());
  ASSERT_TRUE(r.Reserve(scope, "b", 50, r.Moved(scope), fits).ok());
  const uint64_t before = r.Moved(scope);  // the usage figure is read now
  r.Shrink("a", 40);                       // "a" wrote 60 bytes meanwhile
  r.Release("b");                          // "b" finished: its 50 are on disk
  uint64_t seen = 0;
  auto look = [&](uint64_t others) {
    seen = others;
    return Status::Ok();
  };
  ASSERT_TRUE(r.Reserve(scope, "c", 10, before, look).ok());
  EXPECT_EQ(seen, 40u + 60u + 50u);
  // A check whose figure was read after those moves counts only what is still promised.
  ASSERT_TRUE(r.Reserve(scope, "d", 10, r.Moved(scope), look).ok());
  EXPECT_EQ(seen, 40u + 10u);
  EXPECT_EQ(r.Reserved(scope), 60u);
  r.ReleaseVFolder("local", "vf");  // no such vfolder: nothing moves
  EXPECT_EQ(r.Moved(scope), before + 110u);
}

// Reservations of writers found finished (a tus session finished through another node) go;
// those without a way to tell, or still alive, stay, in every scope or in the one asked.
TEST(QuotaReservations, PruneReleasesWritersNoLongerAlive) {
  QuotaReservations r;
  const std::string s1 = QuotaReservations::ScopeKey("local", "s1");
  const std::string s2 = QuotaReservations::ScopeKey("local", "s2");
  auto fits = [](uint64_t) { return Status::Ok(); };
  bool c_alive = true;
  int asked = 0;
  ASSERT_TRUE(r.Reserve(s1, "a", 100, 0, fits).ok());
  ASSERT_TRUE(r.Reserve(s1, "b", 50, 0, fits).ok());  // no SetAlive: never pruned
  ASSERT_TRUE(r.Reserve(s2, "c", 7, 0, fits).ok());
  r.SetAlive("a", [&] { return ++asked, false; });
  r.SetAlive("c", [&] { return ++asked, c_alive; });
  r.SetAlive("nobody", [] { return false; });  // no such reservation: nothing kept
  EXPECT_EQ(r.Prune(s1), 1u);                  // only s1's are asked about: a
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(r.Reserved(s1), 50u);
  EXPECT_EQ(r.Moved(s1), 100u);
  EXPECT_EQ(r.Prune(), 0u);  // c is alive
  EXPECT_EQ(asked, 2);
  c_alive = false;
  EXPECT_EQ(r.Prune(s1), 0u);
  EXPECT_EQ(r.Reserved(s2), 7u);
  EXPECT_EQ(r.Prune(), 1u);
  EXPECT_EQ(r.Reserved(s2), 0u);
  // A reservation made again keeps the way to tell it has; one made anew has none.
  ASSERT_TRUE(r.Reserve(s1, "b", 20, 0, fits).ok());
  ASSERT_TRUE(r.Reserve(s1, "a", 30, 0, fits).ok());
  EXPECT_EQ(r.Prune(), 0u);
  EXPECT_EQ(r.Reserved(s1), 50u);
}

TEST_F(UploadTest, SweepRemovesOldUnlockedSessionsOnly) {
  UploadTarget old_t = Session("old", 10);
  UploadTarget held_t = Session("held", 10);
  UploadTarget young_t = Session("young", 10);
  fs::path up = vf() / ".upload";
  {
    std::ofstream out(up / (old_t.session + ".offset"));
    out << R"({"offset": 0})";
  }
  std::ofstream(up / "leftover.offset.tmp") << "x";
  // Age everything but the young session beyond session-expire plus its grace.
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = ::time(nullptr) - 1000;
  ts[0].tv_nsec = ts[1].tv_nsec = 0;
  for (const auto& n : {old_t.session, old_t.session + ".offset", held_t.session,
                        std::string("leftover.offset.tmp")})
    ASSERT_EQ(::utimensat(AT_FDCWD, (up / n).c_str(), ts, 0), 0) << n;
  uint64_t cur = 0;
  auto w = up_->BeginWrite(held_t, 0, &cur);
  ASSERT_TRUE(w.ok());
  auto stats = up_->SweepAll();
  EXPECT_EQ(stats.kept_locked, 1u);
  EXPECT_FALSE(fs::exists(up / old_t.session));
  EXPECT_FALSE(fs::exists(up / (old_t.session + ".offset")));
  EXPECT_FALSE(fs::exists(up / "leftover.offset.tmp"));
  EXPECT_TRUE(fs::exists(up / held_t.session));
  EXPECT_TRUE(fs::exists(up / young_t.session));
  EXPECT_EQ(up_->Query(old_t).status().code(), Code::kNotFound);
}

TEST_F(UploadTest, FinalizeRefusesASymlinkOutOfTheVfolder) {
  fs::create_directories(base_ + "/outside");
  UploadTarget t = Session("link/x", 3);
  uint64_t cur = 0;
  auto w = up_->BeginWrite(t, 0, &cur);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write("abc", 3).ok());
  fs::create_directory_symlink(base_ + "/outside", vf() / "link");
  auto off = (*w)->Finish();
  EXPECT_EQ(off.status().code(), Code::kInvalidPath);
  EXPECT_TRUE(fs::is_empty(base_ + "/outside"));
  EXPECT_EQ(ReadAll(vf() / ".upload" / t.session), "abc");
}

}  // namespace
}  // namespace sluice
