// The volume decorators over the in-memory volume: what they forward, count and inject.
#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "support/assert_status.h"
#include "volume/fault_volume.h"
#include "volume/mem/mem_volume.h"
#include "volume/metrics_volume.h"
#include "volume/registry.h"

namespace sluice {
namespace {

class DecoratorTest : public ::testing::Test {
 protected:
  static std::unique_ptr<Volume> Mem(const std::string& name) {
    VolumeConfig c;
    c.name = name;
    c.backend = "mem";
    c.path = "mem";
    return std::make_unique<MemVolume>(c, 1 << 20);
  }
  static MemVolume& MemOf(Volume& v) {
    return dynamic_cast<MemVolume&>(ForwardingVolume::Innermost(v));
  }
  void MakeVFolder(Volume& v) { ASSERT_OK(v.CreateVFolder(vf_, 0755, true, std::nullopt)); }
  VFolderId vf_ = VFolderId::Parse(
                      "user:11111111111111111111111111111111/"
                      "abcdef0123456789abcdef0123456789")
                      .value();
};

TEST_F(DecoratorTest, MetricsCountOperationsAndBytesWithoutChangingResults) {
  MetricsVolume v(Mem("metered"));
  MakeVFolder(v);
  ASSERT_OK(MemOf(v).PutFile(vf_, "f", std::string(1000, 'x')));
  auto before = v.io_stats().read_bytes.load();
  auto f = v.OpenReader(vf_, "f");
  ASSERT_OK(f);
  char buf[600];
  ASSERT_EQ(*(*f)->ReadAt(0, buf, sizeof buf), 600u);
  (*f)->CountSent(400);  // the rest, sent zero-copy
  EXPECT_EQ(v.io_stats().read_bytes.load() - before, 1000u);
  EXPECT_ERROR(v.OpenReader(vf_, "missing"), Code::kNotFound);
  auto session = v.CreateStaging(vf_);
  ASSERT_OK(session);
  auto w = v.OpenStaging(vf_, *session);
  ASSERT_OK(w);
  size_t written = 0;
  ASSERT_OK((*w)->WriteAt(0, "abc", 3, &written));
  EXPECT_EQ(v.io_stats().write_bytes.load(), 3u);
  std::string text = Metrics::Global().RenderPrometheus();
  EXPECT_NE(text.find("sluice_volume_operations_total{volume=\"metered\",op=\"open\","
                      "result=\"ok\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sluice_volume_operations_total{volume=\"metered\",op=\"open\","
                      "result=\"error\"} 1\n"),
            std::string::npos);
}

TEST_F(DecoratorTest, FaultRulesParseWithClearErrors) {
  auto ok = ParseFaultRules("v", nlohmann::json::parse(R"([
      {"op": "write", "error": "ENOSPC", "after": "1k"},
      {"op": "read", "path": "slow/*", "latency": "20ms", "times": 2}])"));
  ASSERT_OK(ok);
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].error, ENOSPC);
  EXPECT_EQ((*ok)[0].after, 1024u);
  EXPECT_EQ((*ok)[1].latency, std::chrono::milliseconds(20));
  for (const char* bad : {R"([{"op": "explode", "error": "EIO"}])", R"([{"op": "read"}])",
                          R"([{"op": "read", "error": "EWHATEVER"}])",
                          R"([{"op": "read", "error": "EIO", "colour": "red"}])", R"({"op": 1})"}) {
    auto r = ParseFaultRules("v", nlohmann::json::parse(bad));
    ASSERT_ERROR(r, Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("volume.v.faults"), std::string::npos)
        << r.status().message();
  }
}

TEST_F(DecoratorTest, FaultsFailChosenOperationsAndPathsOnly) {
  auto rules = ParseFaultRules("v", nlohmann::json::parse(R"([
      {"op": "open", "path": "bad/*", "error": "EIO"},
      {"op": "write", "error": "ENOSPC", "after": 5},
      {"op": "mkdir", "error": "EACCES", "times": 1}])"));
  ASSERT_OK(rules);
  FaultVolume v(Mem("faulty"), std::move(rules).value());
  MakeVFolder(v);
  ASSERT_OK(MemOf(v).PutFile(vf_, "bad/f", "x"));
  ASSERT_OK(MemOf(v).PutFile(vf_, "good/f", "y"));
  auto bad = v.OpenReader(vf_, "bad/f");
  ASSERT_ERROR(bad, Code::kIoError);
  EXPECT_EQ(bad.status().sys_errno(), EIO);
  EXPECT_NE(bad.status().message().find("injected fault"), std::string::npos);
  EXPECT_OK(v.OpenReader(vf_, "good/f"));
  // Through a directory handle too.
  auto dir = v.OpenDir(vf_, "bad");
  ASSERT_OK(dir);
  EXPECT_ERROR((*dir)->OpenFile("f"), Code::kIoError);
  // An event loop's lookup of a ruled path goes to the pool, never sleeps or fails there.
  EXPECT_ERROR(v.OpenReader(vf_, "bad/f", Lookup::kCachedOnly), Code::kUnavailable);
  // Writes: what fits before the fault goes through.
  auto session = v.CreateStaging(vf_);
  ASSERT_OK(session);
  auto w = v.OpenStaging(vf_, *session);
  ASSERT_OK(w);
  size_t written = 0;
  Status st = (*w)->WriteAt(0, "0123456789", 10, &written);
  EXPECT_EQ(st.code(), Code::kNoSpace);
  EXPECT_EQ(written, 5u);
  // `times`: once, then through.
  EXPECT_ERROR(v.Mkdir(vf_, "d", true, false), Code::kPermissionDenied);
  EXPECT_OK(v.Mkdir(vf_, "d", true, false));
}

// Stat of "slow" holds until Release(): storage that stops answering.
class HoldingVolume : public ForwardingVolume {
 public:
  using ForwardingVolume::ForwardingVolume;
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view rel) override {
    if (rel == "slow") {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return released_; });
    }
    return ForwardingVolume::Stat(vfid, rel);
  }
  void Release() {
    std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// The bulkhead: while max-operations calls hold, the next call that starts something (a stat,
// an open, a vfolder check) is refused at once with EBUSY; calls that go on with what was
// admitted (an open reader's reads, a directory's opens) are counted but never refused, nor
// are event loops' cached-only lookups; once the held calls return, calls go through.
TEST_F(DecoratorTest, MetricsVolumeAdmitsAtMostMaxOperations) {
  auto holding = std::make_unique<HoldingVolume>(Mem("bulkhead"));
  HoldingVolume* hold = holding.get();
  MetricsVolume v(std::move(holding), 2);
  MakeVFolder(v);
  ASSERT_OK(MemOf(v).PutFile(vf_, "slow", "s"));
  ASSERT_OK(MemOf(v).PutFile(vf_, "dir/f", "0123456789"));
  auto reader = v.OpenReader(vf_, "dir/f");
  ASSERT_OK(reader);
  auto dir = v.OpenDir(vf_, "dir");
  ASSERT_OK(dir);
  std::vector<std::thread> held;
  for (int i = 0; i < 2; ++i) held.emplace_back([&] { EXPECT_OK(v.Stat(vf_, "slow")); });
  for (int i = 0; i < 5000 && v.running() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(v.running(), 2);
  auto refused = v.Stat(vf_, "dir/f");
  ASSERT_ERROR(refused, Code::kUnavailable);
  EXPECT_EQ(refused.status().sys_errno(), EBUSY);
  EXPECT_NE(refused.status().message().find("max-operations"), std::string::npos);
  EXPECT_ERROR(v.OpenReader(vf_, "dir/f"), Code::kUnavailable);
  EXPECT_ERROR(v.CheckVFolder(vf_), Code::kUnavailable);
  EXPECT_OK(v.OpenReader(vf_, "dir/f", Lookup::kCachedOnly));  // never blocks: not counted
  char buf[4];
  EXPECT_EQ(*(*reader)->ReadAt(0, buf, sizeof buf), 4u);  // a stream goes on
  EXPECT_OK((*dir)->OpenFile("f"));
  EXPECT_EQ(v.running(), 2);
  hold->Release();
  for (auto& t : held) t.join();
  EXPECT_EQ(v.running(), 0);
  EXPECT_OK(v.Stat(vf_, "dir/f"));
  EXPECT_OK(v.CheckVFolder(vf_));
}

TEST_F(DecoratorTest, ByteRangeFaultsCountOnlyWhenTheyCut) {
  auto rules = ParseFaultRules("v", nlohmann::json::parse(R"([
      {"op": "write", "error": "ENOSPC", "after": 8, "times": 1},
      {"op": "read", "path": "f", "error": "EIO", "after": 6, "times": 1}])"));
  ASSERT_OK(rules);
  FaultVolume v(Mem("cut"), std::move(rules).value());
  MakeVFolder(v);
  // Writes below the cut neither fail nor use up the rule's one firing.
  auto session = v.CreateStaging(vf_);
  ASSERT_OK(session);
  auto w = v.OpenStaging(vf_, *session);
  ASSERT_OK(w);
  size_t written = 0;
  ASSERT_OK((*w)->WriteAt(0, "0123", 4, &written));
  ASSERT_OK((*w)->WriteAt(4, "45", 2, &written));
  Status st = (*w)->WriteAt(6, "6789", 4, &written);
  EXPECT_EQ(st.code(), Code::kNoSpace);
  EXPECT_EQ(written, 2u);
  ASSERT_OK((*w)->WriteAt(8, "89", 2, &written));  // fired once: through
  // A read across the cut is short, the next one fails, then the file reads whole.
  ASSERT_OK(MemOf(v).PutFile(vf_, "f", "abcdefghij"));
  auto r = v.OpenReader(vf_, "f");
  ASSERT_OK(r);
  char buf[16];
  auto n = (*r)->ReadAt(0, buf, sizeof buf);
  ASSERT_OK(n);
  EXPECT_EQ(std::string(buf, *n), "abcdef");
  EXPECT_ERROR((*r)->ReadAt(6, buf, sizeof buf), Code::kIoError);
  n = (*r)->ReadAt(0, buf, sizeof buf);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 10u);
}

TEST_F(DecoratorTest, TheDaemonsVolumeIsMeteredAndFaultedFromConfig) {
  VolumeConfig c;
  c.name = "served";
  c.backend = "mem";
  c.path = "mem";
  c.faults = nlohmann::json::parse(R"([{"op": "fs-usage", "error": "EIO"}])");
  auto v = VolumeRegistry::Builtin().CreateServed(c, VolumeDeps{});
  ASSERT_OK(v);
  EXPECT_NE(dynamic_cast<MetricsVolume*>(v->get()), nullptr);
  EXPECT_ERROR((*v)->GetFsUsage(), Code::kIoError);
  EXPECT_NE(dynamic_cast<MemVolume*>(&ForwardingVolume::Innermost(**v)), nullptr);
  c.faults = nlohmann::json::parse(R"([{"op": "nope"}])");
  EXPECT_ERROR(VolumeRegistry::Builtin().CreateServed(c, VolumeDeps{}), Code::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
