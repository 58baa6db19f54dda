#include "service/task_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "service/bgtask.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TaskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-tasks-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/tasks.db";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<TaskStore> Open() {
    auto s = TaskStore::Open(path_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::string dir_, path_;
};

TEST_F(TaskStoreTest, HistorySurvivesARestart) {
  const auto before = std::chrono::system_clock::now() - 1s;
  std::string ok_id, bad_id;
  {
    ThreadPool pool("t", 2);
    BgTaskManager m(&pool);
    ASSERT_TRUE(m.Persist(Open()).ok());
    auto ok = m.Start("vfolder-clone", {{"src", "a"}, {"n", 3}}, [] { return Status::Ok(); });
    auto bad =
        m.Start("vfolder-delete", {}, [] { return Status(Code::kNoSpace, "disk full", ENOSPC); });
    ASSERT_TRUE(ok.ok() && bad.ok());
    ok_id = *ok;
    bad_id = *bad;
    ASSERT_TRUE(m.WaitIdle(10s));
  }
  ThreadPool pool("t", 1);
  BgTaskManager m(&pool);
  ASSERT_TRUE(m.Persist(Open()).ok());
  EXPECT_EQ(m.List().size(), 2u);
  auto a = m.Get(ok_id);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->state, TaskState::kCompleted);
  EXPECT_EQ(a->kind, "vfolder-clone");
  EXPECT_EQ(a->params, (nlohmann::json{{"src", "a"}, {"n", 3}}));
  EXPECT_GE(a->created, before);
  EXPECT_GE(a->started, a->created);
  EXPECT_GE(a->finished, a->started);
  auto b = m.Get(bad_id);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->state, TaskState::kFailed);
  EXPECT_EQ(b->error.code(), Code::kNoSpace);
  EXPECT_EQ(b->error.message(), "disk full");
  EXPECT_EQ(b->error.sys_errno(), ENOSPC);
  EXPECT_EQ(b->ToJson()["error"]["msg"], "disk full");
}

// What was pending or running when the process went away is failed "interrupted" at the next
// open, once and for good.
TEST_F(TaskStoreTest, TasksCutShortAreFailedInterrupted) {
  auto store = Open();
  ASSERT_TRUE(store);
  BgTaskInfo running, pending, done;
  running.id = "r";
  running.kind = "vfolder-clone";
  running.state = TaskState::kRunning;
  running.created = running.started = std::chrono::system_clock::now() - 10s;
  pending.id = "p";
  pending.kind = "file-delete";
  pending.created = std::chrono::system_clock::now() - 5s;
  done = running;
  done.id = "d";
  done.state = TaskState::kCompleted;
  done.finished = done.started + 1s;
  for (const auto& t : {running, pending, done}) ASSERT_TRUE(store->Put(t).ok());
  store.reset();
  for (int open = 0; open < 2; ++open) {
    auto again = Open();
    ASSERT_TRUE(again);
    auto all = again->LoadAfterRestart();
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    ASSERT_EQ(all->size(), 3u);
    for (const auto& t : *all) {
      if (t.id == "d") {
        EXPECT_EQ(t.state, TaskState::kCompleted);
        continue;
      }
      EXPECT_EQ(t.state, TaskState::kFailed) << t.id;
      EXPECT_NE(t.error.message().find("interrupted"), std::string::npos) << t.error.message();
      EXPECT_EQ(t.error.sys_errno(), EINTR);
      EXPECT_GE(t.finished, t.created);
      EXPECT_GE(t.started, t.created);
    }
  }
}

// Two processes share a state directory: one starting leaves the other's running task alone
// (its owner lock is held) and can still answer for it; once that process dies without a
// clean close (kill -9: its lock is released, its lock file stays), the task is interrupted.
TEST_F(TaskStoreTest, APeersRunningTaskIsLeftAloneUntilItsProcessDies) {
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto s = TaskStore::Open(path_);
    BgTaskInfo t;
    t.id = "peer";
    t.kind = "vfolder-clone";
    t.state = TaskState::kRunning;
    t.created = t.started = std::chrono::system_clock::now();
    bool ok = s.ok() && (*s)->Put(t).ok();
    char c = ok ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    (void)!read(go[0], &c, 1);
    _exit(0);  // no destructors: the lock file stays, the lock goes with the process
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  {
    auto store = Open();
    ASSERT_TRUE(store);
    auto all = store->LoadAfterRestart();
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_TRUE(all->empty());  // only finished tasks are loaded
    auto peer = store->Get("peer");
    ASSERT_TRUE(peer.ok() && peer->has_value());
    EXPECT_EQ((*peer)->state, TaskState::kRunning);
  }
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto store = Open();
  ASSERT_TRUE(store);
  auto all = store->LoadAfterRestart();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(all->front().id, "peer");
  EXPECT_EQ(all->front().state, TaskState::kFailed);
  EXPECT_EQ(all->front().error.sys_errno(), EINTR);
  // The dead owner's lock file is gone; the live store's own is there.
  size_t locks = 0;
  for (const auto& e : fs::directory_iterator(path_ + ".owners")) locks += e.is_regular_file();
  EXPECT_EQ(locks, 1u);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
}

// Owner files of processes that ended without closing their store (sluiced exits with _Exit) are
// swept at the next start; a locked one (a live peer) stays.
TEST_F(TaskStoreTest, OwnerFilesOfEndedProcessesAreSwept) {
  ASSERT_TRUE(Open());  // creates the owners directory; closed cleanly
  const std::string owners = path_ + ".owners";
  std::ofstream(owners + "/ended");
  int live = ::open((owners + "/live").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(live, 0);
  ASSERT_EQ(flock(live, LOCK_EX | LOCK_NB), 0);
  auto store = Open();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->LoadAfterRestart().ok());
  EXPECT_FALSE(fs::exists(owners + "/ended"));
  EXPECT_TRUE(fs::exists(owners + "/live"));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(owners)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);  // "live" and the open store's own
  ::close(live);
}

TEST_F(TaskStoreTest, PrunedTasksLeaveTheStore) {
  std::vector<std::string> ids;
  {
    ThreadPool pool("t", 1);
    BgTaskManager m(&pool, /*keep_finished=*/3);
    ASSERT_TRUE(m.Persist(Open()).ok());
    for (int i = 0; i < 5; ++i) {
      auto id = m.Start("file-delete", {{"i", i}}, [] { return Status::Ok(); });
      ASSERT_TRUE(id.ok());
      ids.push_back(*id);
      ASSERT_TRUE(m.WaitIdle(10s));
    }
  }
  ThreadPool pool("t", 1);
  BgTaskManager m(&pool, /*keep_finished=*/100);
  ASSERT_TRUE(m.Persist(Open()).ok());
  EXPECT_EQ(m.List().size(), 3u);
  EXPECT_FALSE(m.Get(ids[0]).has_value());
  EXPECT_FALSE(m.Get(ids[1]).has_value());
  for (size_t i = 2; i < 5; ++i) EXPECT_TRUE(m.Get(ids[i]).has_value()) << i;
}

TEST_F(TaskStoreTest, AFileThatIsNotADatabaseIsMovedAside) {
  std::string junk(8192, 'x');
  std::ofstream(path_) << junk;
  auto store = Open();
  ASSERT_TRUE(store);
  BgTaskInfo t;
  t.id = "t";
  t.kind = "k";
  t.state = TaskState::kCompleted;
  ASSERT_TRUE(store->Put(t).ok());
  auto all = store->LoadAfterRestart();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 1u);
  int aside = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    std::string name = e.path().filename().string();
    if (name.rfind("tasks.db.corrupt-", 0) != 0) continue;
    ++aside;
    std::ifstream in(e.path());
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), junk);
  }
  EXPECT_EQ(aside, 1);
}

}  // namespace
}  // namespace sluice
