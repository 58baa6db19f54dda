#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "service/bgtask.h"
#include "service/event_bus.h"
#include "service/storage_service.h"
#include "service/upload.h"
#include "volume/fault_volume.h"
#include "volume/registry.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

BgTaskInfo WaitDone(BgTaskManager& m, const std::string& id) {
  for (int i = 0; i < 2000; ++i) {
    auto t = m.Get(id);
    if (t && (t->state == TaskState::kCompleted || t->state == TaskState::kFailed)) return *t;
    std::this_thread::sleep_for(5ms);
  }
  ADD_FAILURE() << "task " << id << " did not finish";
  return {};
}

TEST(BgTask, ReportsCompletionAndFailure) {
  ThreadPool pool("t", 2);
  BgTaskManager m(&pool);
  auto ok = m.Start("ok", {{"x", 1}}, [] { return Status::Ok(); });
  auto bad = m.Start("bad", {}, [] { return Status(Code::kNoSpace, "disk full", ENOSPC); });
  ASSERT_TRUE(ok.ok() && bad.ok());
  EXPECT_EQ(WaitDone(m, *ok).state, TaskState::kCompleted);
  BgTaskInfo b = WaitDone(m, *bad);
  EXPECT_EQ(b.state, TaskState::kFailed);
  auto j = b.ToJson();
  EXPECT_EQ(j["status"], "failed");
  EXPECT_EQ(j["error"]["msg"], "disk full");
  EXPECT_EQ(j["error"]["errno"], ENOSPC);
  EXPECT_FALSE(m.Get("no-such-task").has_value());
  EXPECT_EQ(m.List().size(), 2u);
  EXPECT_TRUE(m.WaitIdle(1s));
}

TEST(BgTask, ExceptionsBecomeFailures) {
  ThreadPool pool("t", 1);
  BgTaskManager m(&pool);
  auto id = m.Start("throws", {}, []() -> Status { throw std::runtime_error("boom"); });
  ASSERT_TRUE(id.ok());
  BgTaskInfo t = WaitDone(m, *id);
  EXPECT_EQ(t.state, TaskState::kFailed);
  EXPECT_NE(t.error.message().find("boom"), std::string::npos);
}

TEST(BgTask, KeepsABoundedHistory) {
  ThreadPool pool("t", 1);
  BgTaskManager m(&pool, 3);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(*m.Start("n", {}, [] { return Status::Ok(); }));
  ASSERT_TRUE(m.WaitIdle(5s));
  EXPECT_EQ(m.List().size(), 3u);
  EXPECT_FALSE(m.Get(ids.front()).has_value());
  EXPECT_TRUE(m.Get(ids.back()).has_value());
}

TEST(BgTask, RefusedWhenThePoolIsShutDown) {
  ThreadPool pool("t", 1);
  BgTaskManager m(&pool);
  pool.Shutdown();
  auto id = m.Start("late", {}, [] { return Status::Ok(); });
  EXPECT_EQ(id.status().code(), Code::kUnavailable);
  EXPECT_TRUE(m.List().empty());
}

// A failure event can quote a file's name that is not UTF-8 (a clone or delete refused on it):
// it is kept, with U+FFFD for the bad bytes, instead of throwing out of the task and leaving
// the manager waiting on a vfolder that never leaves CLONING or DELETE_ONGOING.
TEST(EventOutbox, KeepsEventsThatQuoteNamesWhichAreNotUtf8) {
  char tmpl[] = "/tmp/sluice-outbox-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    auto box = EventOutbox::Open(dir + "/events.db");
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    BusEvent e = VFolderCloneFailure("user:a/b", "user:a/c", "open 'x\xff\xfe': Permission denied");
    EXPECT_EQ(e.payload["message"], "open 'x\xef\xbf\xbd\xef\xbf\xbd': Permission denied");
    EXPECT_EQ(e.args.back(), e.payload["message"]);
    ASSERT_TRUE((*box)->Append(e).ok());
    auto rows = (*box)->Oldest(10);
    ASSERT_TRUE(rows.ok());
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_EQ((*rows)[0].event.name, "vfolder_clone_failure");
    EXPECT_EQ((*rows)[0].event.payload["message"], e.payload["message"]);
  }
  fs::remove_all(dir);
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-svc-XXXXXX";
    base_ = mkdtemp(tmpl);
    fs::create_directories(base_ + "/vol");
    Serve({});
    src_ = VFolderId::Parse(
               "user:11111111111111111111111111111111/"
               "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
               .value();
    dst_ = VFolderId::Parse(
               "user:22222222222222222222222222222222/"
               "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
               .value();
  }
  void TearDown() override {
    svc_.reset();
    fs::remove_all(base_);
  }
  Volume* vol() { return svc_->GetVolume("local").value(); }
  // (Re)starts the service on one vfs volume "local" under base_, with these faults injected.
  void Serve(std::vector<FaultRule> faults) {
    svc_.reset();
    Config cfg;
    VolumeConfig vc;
    vc.name = "local";
    vc.backend = "vfs";
    vc.path = base_ + "/vol";
    cfg.volumes.push_back(vc);
    auto v = VolumeRegistry::Builtin().Create(vc, VolumeDeps{&scan_}).value();
    ASSERT_TRUE(v->Init().ok());
    if (!faults.empty()) v = std::make_unique<FaultVolume>(std::move(v), std::move(faults));
    std::vector<std::unique_ptr<Volume>> vols;
    vols.push_back(std::move(v));
    svc_ = std::make_unique<StorageService>(cfg, std::move(vols), &tasks_);
  }

  std::string base_;
  ThreadPool scan_{"scan", 2};
  ThreadPool tasks_{"task", 2};
  std::unique_ptr<StorageService> svc_;
  VFolderId src_, dst_;
};

TEST_F(ServiceTest, UnknownVolumeIsNotFound) {
  EXPECT_EQ(svc_->GetVolume("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(svc_->CreateVFolder("nope", src_, 0755, std::nullopt).code(), Code::kNotFound);
}

TEST_F(ServiceTest, DeleteDetachesAtOnceAndRemovesInTheBackground) {
  ASSERT_TRUE(svc_->CreateVFolder("local", src_, 0755, std::nullopt).ok());
  std::ofstream(vol()->VFolderPath(src_) + "/f") << "data";
  auto id = svc_->DeleteVFolder("local", src_);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(vol()->CheckVFolder(src_).code(), Code::kNotFound);
  EXPECT_EQ(WaitDone(svc_->tasks(), *id).state, TaskState::kCompleted);
  EXPECT_TRUE(fs::is_empty(base_ + "/vol/.sluice-trash"));
  EXPECT_EQ(svc_->DeleteVFolder("local", src_).status().code(), Code::kNotFound);
}

TEST_F(ServiceTest, CloneCopiesAndKeepsTheMode) {
  ASSERT_TRUE(svc_->CreateVFolder("local", src_, 0750, std::nullopt).ok());
  std::ofstream(vol()->VFolderPath(src_) + "/f") << "payload";
  // An upload in progress in the source is the source's: the clone has none (before, the copy
  // took it along, counted against the clone's quota).
  fs::create_directories(vol()->VFolderPath(src_) + "/.upload");
  std::ofstream(vol()->VFolderPath(src_) + "/.upload/session") << "half an upload";
  auto id = svc_->CloneVFolder("local", src_, "local", dst_);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(WaitDone(svc_->tasks(), *id).state, TaskState::kCompleted);
  EXPECT_FALSE(fs::exists(vol()->VFolderPath(dst_) + "/.upload"));
  EXPECT_TRUE(fs::exists(vol()->VFolderPath(src_) + "/.upload/session"));
  std::ifstream in(vol()->VFolderPath(dst_) + "/f");
  std::string got((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(got, "payload");
  struct stat sb;
  ASSERT_EQ(::stat(vol()->VFolderPath(dst_).c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0750u);
  // A second clone onto the same destination is a conflict, known before any task starts.
  EXPECT_EQ(svc_->CloneVFolder("local", src_, "local", dst_).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(svc_->CloneVFolder("local", src_, "local", src_).status().code(),
            Code::kInvalidArgument);
}

// A clone's bytes count against the destination scope while it copies, as an upload's do:
// before, an upload (or another clone) that started meanwhile saw neither the copy's bytes
// (added when it ends) nor a reservation, and both fit a limit that held one.
TEST_F(ServiceTest, ACloneHoldsItsBytesInTheScopeWhileItCopies) {
  FaultRule slow;  // vfolder creates, detaches and clones take their time
  slow.op = "vfolder";
  slow.latency = 600ms;
  Serve({slow});
  ASSERT_TRUE(svc_->CreateVFolder("local", src_, 0755, std::nullopt).ok());
  std::ofstream(vol()->VFolderPath(src_) + "/f") << std::string(6000, 'x');
  ASSERT_TRUE(vol()->quota().CreateScope(*dst_.scope, 10000).ok());
  const VFolderId other = VFolderId::Parse(
                              "user:22222222222222222222222222222222/"
                              "cccccccccccccccccccccccccccccccc")
                              .value();
  ASSERT_TRUE(svc_->CreateVFolder("local", other, 0755, std::nullopt).ok());
  const std::string scope = QuotaReservations::ScopeKey("local", dst_.scope->hex);
  auto id = svc_->CloneVFolder("local", src_, "local", dst_);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  bool held = false;
  for (int i = 0; i < 400 && !held; ++i) {
    held = svc_->reservations().Reserved(scope) >= 6000;
    if (!held) std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(held) << "the clone reserved nothing";
  UploadService up(svc_.get());
  auto refused = up.CreateSession(*vol(), other, "g", 6000);
  EXPECT_EQ(refused.status().code(), Code::kQuotaExceeded) << refused.status().ToString();
  EXPECT_EQ(WaitDone(svc_->tasks(), *id).state, TaskState::kCompleted);
  EXPECT_EQ(svc_->reservations().Reserved(scope), 0u);  // counted as used now
  EXPECT_EQ(up.CreateSession(*vol(), other, "g", 6000).status().code(), Code::kQuotaExceeded);
  EXPECT_TRUE(up.CreateSession(*vol(), other, "g", 3000).ok());
}

TEST_F(ServiceTest, FailedCloneLeavesNoDestination) {
  ASSERT_TRUE(svc_->CreateVFolder("local", src_, 0755, std::nullopt).ok());
  std::ofstream(vol()->VFolderPath(src_) + "/big") << std::string(10000, 'x');
  ASSERT_TRUE(svc_->CreateQuotaScope("local", *dst_.scope, 100).ok());
  auto id = svc_->CloneVFolder("local", src_, "local", dst_);
  ASSERT_TRUE(id.ok());
  BgTaskInfo t = WaitDone(svc_->tasks(), *id);
  EXPECT_EQ(t.state, TaskState::kFailed);
  EXPECT_EQ(t.error.code(), Code::kQuotaExceeded);
  EXPECT_EQ(vol()->CheckVFolder(dst_).code(), Code::kNotFound);
}

TEST_F(ServiceTest, CloneOfAMissingSourceIsNotFound) {
  EXPECT_EQ(svc_->CloneVFolder("local", src_, "local", dst_).status().code(), Code::kNotFound);
  EXPECT_EQ(vol()->CheckVFolder(dst_).code(), Code::kNotFound);
}

}  // namespace
}  // namespace sluice
