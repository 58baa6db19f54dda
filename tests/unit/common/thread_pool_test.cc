// The I/O pool: a fixed pool runs one task per thread and queues the rest; an elastic one gives a
// task that has waited `grow_after` with every thread busy a thread of its own (so that it does
// not wait behind ones stuck on a volume that does not answer), never past its maximum, and
// lets the added threads go once idle.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace sluice {
namespace {

using namespace std::chrono_literals;

// Tasks that stay running until released.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int inside = 0;
  void Hold() {
    std::unique_lock lk(mu);
    ++inside;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
    --inside;
  }
  bool WaitInside(int n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 10s, [&] { return inside == n; });
  }
  void Open() {
    std::lock_guard lk(mu);
    open = true;
    cv.notify_all();
  }
};

template <typename Pred>
bool Eventually(Pred p) {
  for (int i = 0; i < 1000; ++i) {
    if (p()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return p();
}

TEST(ThreadPool, AFixedPoolQueuesWhatItsThreadsCannotRun) {
  Gate gate;  // before the pool: its threads are joined before the gate goes
  std::atomic<int> quick{0};
  ThreadPool pool("t", 2);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pool.Submit([&] { gate.Hold(); }));
  ASSERT_TRUE(gate.WaitInside(2));
  ASSERT_TRUE(pool.Submit([&] { quick++; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(quick.load(), 0);  // behind the two held tasks
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_EQ(pool.queued(), 1u);
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return quick.load() == 1; }));
}

TEST(ThreadPool, AnElasticPoolRunsNewWorkBesideStuckTasksUpToItsMaximum) {
  Gate gate, again;  // before the pool: its threads are joined before the gates go
  std::atomic<int> quick{0};
  ThreadPool pool("t", 2, 1000, {/*max_threads=*/5, /*grow_after=*/20ms, /*idle_exit=*/100ms});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.Submit([&] { gate.Hold(); }));
  ASSERT_TRUE(gate.WaitInside(4));  // four at once on a pool of two
  EXPECT_EQ(pool.size(), 4u);
  EXPECT_EQ(pool.busy(), 4u);
  // A task beside them runs after `grow_after`, on a fifth thread.
  ASSERT_TRUE(pool.Submit([&] { quick++; }));
  EXPECT_TRUE(Eventually([&] { return quick.load() == 1; }));
  // At the maximum: five held, then the sixth waits.
  ASSERT_TRUE(pool.Submit([&] { gate.Hold(); }));
  ASSERT_TRUE(gate.WaitInside(5));
  ASSERT_TRUE(pool.Submit([&] { quick++; }));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(quick.load(), 1);
  EXPECT_EQ(pool.size(), 5u);
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return quick.load() == 2; }));
  // The added threads go once idle through 100 ms; the pool's two stay.
  EXPECT_TRUE(Eventually([&] { return pool.size() == 2; })) << pool.size();
  // It grows again; then a light load (a short task every 5 ms, each finding idle threads)
  // does not keep the added thread alive.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Submit([&] { again.Hold(); }));
  ASSERT_TRUE(again.WaitInside(3));
  EXPECT_EQ(pool.size(), 3u);
  again.Open();
  bool shrank = false;
  for (int i = 0; i < 1000 && !shrank; ++i) {
    ASSERT_TRUE(pool.Submit([] {}));
    std::this_thread::sleep_for(5ms);
    shrank = pool.size() == 2;
  }
  EXPECT_TRUE(shrank) << pool.size();
}

TEST(ThreadPool, ShutdownFinishesQueuedWorkAndJoinsAddedThreads) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool("t", 1, 1000, {3, 20ms, 10s});
    for (int i = 0; i < 50; ++i)
      ASSERT_TRUE(pool.Submit([&] {
        std::this_thread::sleep_for(1ms);
        ran++;
      }));
    pool.Shutdown();
    EXPECT_EQ(ran.load(), 50);
    EXPECT_EQ(pool.size(), 0u);
    EXPECT_FALSE(pool.Submit([] {}));
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace sluice
