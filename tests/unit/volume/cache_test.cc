// The SSD read cache (volume/cache) over an in-memory volume playing the origin: what reaches
// the origin is counted, and the origin can be taken down. Blocks are served within the TTL
// without it, survive a restart, are checked against torn writes, stay within their size
// bound, are fetched once for concurrent readers, and never mix versions of a file.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "service/cache_ops.h"
#include "support/assert_status.h"
#include "volume/cache/cached_volume.h"
#include "volume/mem/mem_volume.h"
#include "volume/registry.h"

namespace sluice::test {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;

class CountingReader : public ForwardingFileReader {
 public:
  CountingReader(std::shared_ptr<FileReader> inner, std::atomic<int>* reads,
                 const std::atomic<bool>* down, std::function<void()> hold)
      : ForwardingFileReader(std::move(inner)),
        reads_(reads),
        down_(down),
        hold_(std::move(hold)) {}
  std::atomic<int>* throws = nullptr;  // reads that throw, when above 0
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    if (*down_) return Status(Code::kUnavailable, "the origin is down");
    if (throws && throws->fetch_sub(1) > 0) throw std::bad_alloc();
    ++*reads_;
    hold_();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // an origin takes its time
    return ForwardingFileReader::ReadAt(offset, buf, n);
  }

 private:
  std::atomic<int>* reads_;
  const std::atomic<bool>* down_;
  std::function<void()> hold_;
};

// An origin's directory that counts the entries it yields.
class CountingDir : public ForwardingDirHandle {
 public:
  CountingDir(std::unique_ptr<DirHandle> inner, std::atomic<int>* yielded)
      : ForwardingDirHandle(std::move(inner)), yielded_(yielded) {}
  Result<std::optional<Name>> Next() override {
    auto n = inner_->Next();
    if (n.ok() && *n) ++*yielded_;
    return n;
  }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    return Status(Code::kInternal, "opened past the cache");
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    return Status(Code::kInternal, "opened past the cache");
  }

 private:
  std::atomic<int>* yielded_;
};

// The origin: counts opens and block reads; `down` makes it unreachable; Hang(true) makes it
// answer nothing (opens hold once they have read the file's attributes, listings before they
// start) until Hang(false).
class Origin : public ForwardingVolume {
 public:
  using ForwardingVolume::ForwardingVolume;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view rel,
                                                 Lookup lookup, const LookupHint* hint) override {
    if (down) return Status(Code::kUnavailable, "the origin is down");
    if (auto fn = std::exchange(before_open, nullptr)) fn();
    ++opens;
    SLUICE_ASSIGN_OR_RETURN(auto r, ForwardingVolume::OpenReader(vfid, rel, lookup, hint));
    Hold();
    if (down) return Status(Code::kUnavailable, "the origin is down");  // went down meanwhile
    ++opened;
    auto counting = std::make_shared<CountingReader>(r, &reads, &down, [this] { HoldRead(); });
    counting->throws = &throwing_reads;
    return std::shared_ptr<FileReader>(std::move(counting));
  }
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid, std::string_view rel) override {
    if (down) return Status(Code::kUnavailable, "the origin is down");
    Hold();
    ++lists;
    return ForwardingVolume::OpenDir(vfid, rel);
  }
  // Counted as a listing too; the in-memory volume lists in no key order, so through OpenDir.
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view rel,
                                                 const ListFrom& from) override {
    SLUICE_ASSIGN_OR_RETURN(auto d, OpenDir(vfid, rel));
    return std::unique_ptr<DirHandle>(new CountingDir(std::move(d), &listed));
  }
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view rel) override {
    if (down) return Status(Code::kUnavailable, "the origin is down");
    Hold();
    ++stats;
    return ForwardingVolume::Stat(vfid, rel);
  }
  void Hang(bool on) {
    std::lock_guard lk(hang_mu_);
    hang_ = on;
    hang_cv_.notify_all();
  }
  // Block reads (opened files' ReadAt) hold too, once they have counted themselves.
  void HangReads(bool on) {
    std::lock_guard lk(hang_mu_);
    hang_reads_ = on;
    hang_cv_.notify_all();
  }
  std::atomic<int> opens{0}, opened{0}, reads{0}, lists{0}, stats{0};
  std::atomic<int> listed{0};  // entries the origin's listings yielded
  std::atomic<bool> down{false};
  std::atomic<int> throwing_reads{0};  // the next reads throw bad_alloc (a buffer not had)
  std::function<void()> before_open;   // run once, by the next open (not thread-safe)

 private:
  void Hold() {
    std::unique_lock lk(hang_mu_);
    hang_cv_.wait(lk, [&] { return !hang_; });
  }
  void HoldRead() {
    std::unique_lock lk(hang_mu_);
    hang_cv_.wait(lk, [&] { return !hang_reads_; });
  }
  std::mutex hang_mu_;
  std::condition_variable hang_cv_;
  bool hang_ = false, hang_reads_ = false;
};

// Lets a hung origin go after 60 s whatever happens (a test that waited for it then fails on
// `released` rather than hanging).
class Watchdog {
 public:
  explicit Watchdog(Origin* o)
      : t_([this, o] {
          for (int i = 0; i < 6000 && !done_; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          if (!done_) released = true;  // its time ran out, not Stop()
          o->Hang(false);
          o->HangReads(false);
        }) {}
  ~Watchdog() { Stop(); }
  // Lets the origin go now.
  void Stop() {
    done_ = true;
    if (t_.joinable()) t_.join();
  }
  std::atomic<bool> released{false};

 private:
  std::atomic<bool> done_{false};
  std::thread t_;  // last: started once the flags exist
};

class Cache : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-cache-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    VolumeConfig c;
    c.name = "cached";
    c.backend = "mem";
    c.path = "mem";
    auto origin = std::make_unique<Origin>(std::make_unique<MemVolume>(c, 1ULL << 30));
    origin_ = origin.get();
    inner_ = std::move(origin);
    vf_ = VFolderId::Parse(
              "user:11111111111111111111111111111111/"
              "abcdef0123456789abcdef0123456789")
              .value();
    ASSERT_OK(inner_->CreateVFolder(vf_, 0755, true, std::nullopt));
    opts_.path = dir_ + "/blocks";
    opts_.block_size = kMiB;
    opts_.min_free = 0;
    opts_.read_ahead = 0;  // tests that count origin reads set it
  }
  void TearDown() override {
    cache_.reset();
    fs::remove_all(dir_);
  }
  // (Re)starts the cache over the same origin and block directory.
  void Start() {
    std::unique_ptr<Volume> inner;
    if (cache_)
      inner = std::move(ReleaseInner());
    else
      inner = std::move(inner_);
    auto store = BlockStore::Open(opts_.StoreOptions());
    ASSERT_OK(store);
    cache_ = std::make_unique<CachedVolume>(std::move(inner), opts_, std::move(store).value());
  }
  std::unique_ptr<Volume> ReleaseInner() {
    auto v = cache_->ReleaseOrigin();
    cache_.reset();
    return v;
  }
  void Put(const std::string& rel, const std::string& data) {
    ASSERT_OK(dynamic_cast<MemVolume&>(ForwardingVolume::Innermost(cache_ ? *cache_ : *inner_))
                  .PutFile(vf_, rel, data));
  }
  std::string ReadAll(const std::string& rel, Status* st = nullptr) {
    auto f = cache_->OpenReader(vf_, rel);
    if (!f.ok()) {
      if (st) *st = f.status();
      return {};
    }
    std::string out((*f)->size(), '\0');
    size_t done = 0;
    while (done < out.size()) {
      auto n = (*f)->ReadAt(done, out.data() + done, out.size() - done);
      if (!n.ok()) {
        if (st) *st = n.status();
        return {};
      }
      if (*n == 0) break;
      done += *n;
    }
    return out;
  }
  // Writes `data` to `rel` through the cache as a tus upload does: one session, `pieces`
  // writers (one per PATCH) each syncing what it wrote, then the commit. `first` bytes are
  // written by the volume below instead (another node began the session).
  Status Upload(const std::string& rel, const std::string& data, int pieces = 1, size_t first = 0) {
    SLUICE_ASSIGN_OR_RETURN(std::string session, cache_->CreateStaging(vf_));
    if (first > 0) {
      SLUICE_ASSIGN_OR_RETURN(auto w, cache_->inner().OpenStaging(vf_, session));
      size_t n = 0;
      SLUICE_RETURN_IF_ERROR(w->WriteAt(0, data.data(), first, &n));
      SLUICE_RETURN_IF_ERROR(w->Sync(first, true));
    }
    const size_t piece = (data.size() - first + pieces - 1) / pieces;
    for (size_t at = first; at < data.size() || (at == 0 && data.empty());) {
      SLUICE_ASSIGN_OR_RETURN(auto w,
                              cache_->OpenStaging(vf_, session, std::chrono::milliseconds(0)));
      const size_t k = std::min(piece, data.size() - at);
      size_t n = 0;
      SLUICE_RETURN_IF_ERROR(w->WriteAt(at, data.data() + at, k, &n));
      SLUICE_RETURN_IF_ERROR(w->Sync(at + k, true));
      at += k;
      if (at == data.size()) {
        auto parts = SplitRelPath(rel);
        SLUICE_RETURN_IF_ERROR(parts.status());
        return w->Commit(*parts);
      }
    }
    return Status::Ok();
  }
  // A cache on `tmpfs` (a SmallTmpfs) that keeps attributes for an hour, with file "a" read
  // once (its attributes journaled, its block kept).
  template <typename Tmpfs>
  void JournalOn(const Tmpfs& tmpfs) {
    ASSERT_TRUE(tmpfs.mounted) << std::strerror(errno);
    opts_.path = tmpfs.dir + "/cache";
    opts_.ttl = std::chrono::hours(1);
    Start();
    Put("a", "alpha");
    EXPECT_EQ(ReadAll("a"), "alpha");
  }
  // About `bytes` of journal lines like the first of `log`, for keys x0, x1, ... of vf_, each
  // twice (a compaction keeps half).
  std::string JournalPadding(const std::string& log, size_t bytes) {
    std::string line;
    {
      std::ifstream in(log);
      std::getline(in, line);
    }
    auto j = nlohmann::json::parse(line);
    std::string lines;
    for (int i = 0; lines.size() < bytes; ++i) {
      j["k"] = vf_.ToString() + std::string(1, '\0') + fmt::format("x{}", i);
      lines += j.dump() + "\n" + j.dump() + "\n";
    }
    return lines;
  }
  // Waits up to 2 s for read-ahead to hold `n` blocks.
  void WaitForBlocks(uint64_t n) {
    for (int i = 0; i < 200 && cache_->stats().store.blocks < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  static std::string Bytes(size_t n, unsigned seed) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7919) >> 3);
    return s;
  }

  std::string dir_;
  CacheOptions opts_;
  std::unique_ptr<Volume> inner_;
  Origin* origin_ = nullptr;
  std::unique_ptr<CachedVolume> cache_;
  VFolderId vf_;
};

TEST_F(Cache, WithinTheTtlTheOriginIsNotAsked) {
  Start();
  const std::string data = Bytes(10 * kMiB + 5, 1);
  Put("model.bin", data);
  EXPECT_EQ(ReadAll("model.bin"), data);
  EXPECT_EQ(origin_->opens, 1);
  EXPECT_EQ(origin_->reads, 11);  // one origin read per block
  EXPECT_EQ(ReadAll("model.bin"), data);
  EXPECT_EQ(origin_->opens, 1);  // the attributes too came from the cache
  EXPECT_EQ(origin_->reads, 11);
  auto s = cache_->stats();
  EXPECT_EQ(s.misses, 11u);
  EXPECT_EQ(s.hits, 11u);
  EXPECT_EQ(s.origin_bytes, data.size());
  EXPECT_EQ(s.store.bytes, data.size());
  EXPECT_EQ(s.store.blocks, 11u);
}

TEST_F(Cache, ARangedReadCachesWhatWasRead) {
  Start();
  const std::string data = Bytes(20 * kMiB, 2);
  Put("big", data);
  auto f = cache_->OpenReader(vf_, "big");
  ASSERT_OK(f);
  std::string buf(kMiB, '\0');
  ASSERT_EQ(*(*f)->ReadAt(5 * kMiB + kMiB / 2, buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, data.substr(5 * kMiB + kMiB / 2, kMiB));
  EXPECT_EQ(cache_->stats().store.blocks, 2u);  // blocks 5 and 6, not the file
}

TEST_F(Cache, ConcurrentMissesMakeOneOriginReadPerBlock) {
  Start();
  const std::string data = Bytes(4 * kMiB, 3);
  Put("cold", data);
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int i = 0; i < 64; ++i) ts.emplace_back([&] { good += ReadAll("cold") == data; });
  for (auto& t : ts) t.join();
  EXPECT_EQ(good, 64);
  EXPECT_EQ(origin_->reads, 4);
}

// A fetch that throws (bad_alloc of the block's buffer) is the reader's error, and leaves no
// flight behind: the next reader of the block fetches it (before, the exception left the
// flight listed and unanswered, and every later reader of the block waited on it for good).
TEST_F(Cache, AFetchThatThrowsLeavesNoFlightBehind) {
  Start();
  const std::string data = Bytes(kMiB / 2, 4);
  Put("f", data);
  origin_->throwing_reads = 1;
  Status st;
  EXPECT_NO_THROW(EXPECT_EQ(ReadAll("f", &st), "")) << st.ToString();
  EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
  EXPECT_EQ(ReadAll("f"), data);
}

// A restart with another block size: block N of a file is other bytes now, and must not be
// taken from the blocks of the old size (before: 2-4 MiB answered with the old 1-2 MiB block,
// whose length passed for the new one's, and the first block failed on its length for good).
TEST_F(Cache, ABlockSizeChangedAcrossARestartServesTheRightBytes) {
  Start();
  const std::string data = Bytes(3 * kMiB, 9);
  Put("f", data);
  EXPECT_EQ(ReadAll("f"), data);
  opts_.block_size = 2 * kMiB;
  Start();
  auto f = cache_->OpenReader(vf_, "f");
  ASSERT_OK(f);
  std::string buf(kMiB, '\0');
  auto n = (*f)->ReadAt(2 * kMiB, buf.data(), buf.size());
  ASSERT_OK(n);
  ASSERT_EQ(*n, buf.size());
  EXPECT_TRUE(buf == data.substr(2 * kMiB)) << "bytes of another block";
  Status st;
  EXPECT_TRUE(ReadAll("f", &st) == data) << st.ToString();
}

// A vfs volume in a temporary directory, as the origin behind a cache: one vfolder, whose
// file "ckpt" is at `path`.
class CacheOverFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/sluice-cache-files-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir = tmpl;
    VolumeConfig cfg;
    cfg.name = "files";
    cfg.backend = "vfs";
    cfg.path = dir + "/vol";
    fs::create_directories(cfg.path);
    auto v = VolumeRegistry::Builtin().Create(cfg, VolumeDeps{&pool});
    ASSERT_OK(v);
    made = std::move(v).value();
    ASSERT_OK(made->Init());
    ASSERT_OK(made->CreateVFolder(vf, 0755, true, std::nullopt));
    path = made->MountPath(vf, "").value() + "/ckpt";
  }
  void TearDown() override { fs::remove_all(dir); }
  // 1 MiB blocks beside the volume, no read-ahead.
  CacheOptions Options(std::chrono::milliseconds ttl) const {
    CacheOptions opts;
    opts.path = dir + "/blocks";
    opts.block_size = kMiB;
    opts.min_free = 0;
    opts.read_ahead = 0;
    opts.ttl = ttl;
    return opts;
  }
  // Reads all of `r` (`size` bytes) through its ReadAt.
  static std::string ReadAll(FileReader& r, size_t size) {
    std::string all(size, '\0');
    size_t done = 0;
    while (done < all.size()) {
      auto n = r.ReadAt(done, all.data() + done, all.size() - done);
      if (!n.ok() || *n == 0) return all.substr(0, done);
      done += *n;
    }
    return all;
  }

  ThreadPool pool{"scan", 2};
  std::string dir, path;
  std::unique_ptr<Volume> made;
  const VFolderId vf =
      VFolderId::Parse("user:11111111111111111111111111111111/abcdef0123456789abcdef0123456789")
          .value();
};

// Over a file system: a file uploaded through the cache, its parts copied in with
// copy_file_range (a multipart Complete), is kept as written under the version the rename
// made: read afterwards with no origin read at all.
TEST_F(CacheOverFiles, AnUploadAssembledFromLocalPartsIsIngested) {
  const std::string data(3 * kMiB / 2, 'p');
  std::ofstream(path, std::ios::binary) << data;  // the "part"
  CacheOptions opts = Options(std::chrono::milliseconds(3600000));
  auto store = BlockStore::Open(opts.StoreOptions());
  ASSERT_OK(store);
  CachedVolume cache(std::move(made), opts, std::move(store).value());
  auto part = cache.inner().OpenReader(vf, "ckpt");
  ASSERT_OK(part);
  ASSERT_GE((*part)->native_fd(), 0);
  auto session = cache.CreateStaging(vf);
  ASSERT_OK(session);
  {
    auto w = cache.OpenStaging(vf, *session, std::chrono::milliseconds(0));
    ASSERT_OK(w);
    ASSERT_OK((*w)->CopyFrom(**part, 0, data.size(), 0));
    ASSERT_OK((*w)->Publish({"out", "model"}, nullptr, true));
  }
  EXPECT_EQ(cache.stats().ingested, 2u);
  auto r = cache.OpenReader(vf, "out/model");
  ASSERT_OK(r);
  EXPECT_TRUE(ReadAll(**r, data.size()) == data);
  auto s = cache.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 0u);
}

// A cache in front of a shared file system (a vfs volume here): a file rewritten in place
// (same inode, same size) while a reader has it open is not cached as the old version (before,
// the reader's next block came from the new bytes and was kept under the old version's key,
// so every later reader got the old first block and the new second one, a mix of the two).
TEST_F(CacheOverFiles, AFileRewrittenInPlaceIsNeverMixedWithItsOldVersion) {
  std::string v1(2 * kMiB, 'a'), v2(2 * kMiB, 'b');
  std::ofstream(path, std::ios::binary) << v1;
  CacheOptions opts = Options(std::chrono::milliseconds(60000));
  auto store = BlockStore::Open(opts.StoreOptions());
  ASSERT_OK(store);
  {
    CachedVolume cache(std::move(made), opts, std::move(store).value());
    auto r = cache.OpenReader(vf, "ckpt");
    ASSERT_OK(r);
    std::string buf(kMiB, '\0');
    ASSERT_OK((*r)->ReadAt(0, buf.data(), buf.size()));
    EXPECT_TRUE(buf == v1.substr(0, kMiB));
    {  // rewritten in place, its mtime moved on (a write's, however coarse the clock)
      std::ofstream(path, std::ios::binary | std::ios::trunc) << v2;
      struct timespec later[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 10, 0}};
      ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), later, 0), 0);
    }
    auto second = (*r)->ReadAt(kMiB, buf.data(), buf.size());
    if (second.ok()) {
      EXPECT_TRUE(buf == v1.substr(kMiB)) << "a block of the new version";
    }
    auto again = cache.OpenReader(vf, "ckpt");
    ASSERT_OK(again);
    std::string all = ReadAll(**again, 2 * kMiB);
    ASSERT_EQ(all.size(), 2 * kMiB);
    EXPECT_TRUE(all == v2) << "first byte " << all.front() << ", last " << all.back();
  }
}

// `cp -p`, `rsync --inplace -t`, `tar -x`: the same inode rewritten at the same size, its mtime
// put back. Only the ctime tells the versions apart; before 2026-12-05 the validator left it
// out, and the old version's cached block was served with the new one's next block.
TEST_F(CacheOverFiles, AFileRewrittenWithItsMtimePutBackIsNeverMixed) {
  std::string v1(2 * kMiB, 'a'), v2(2 * kMiB, 'b');
  std::ofstream(path, std::ios::binary) << v1;
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  CacheOptions opts = Options(std::chrono::milliseconds(0));  // every open asks the origin again
  auto store = BlockStore::Open(opts.StoreOptions());
  ASSERT_OK(store);
  {
    CachedVolume cache(std::move(made), opts, std::move(store).value());
    {
      auto r = cache.OpenReader(vf, "ckpt");
      ASSERT_OK(r);
      std::string buf(kMiB, '\0');
      ASSERT_OK((*r)->ReadAt(0, buf.data(), buf.size()));  // block 0 cached
      EXPECT_TRUE(buf == v1.substr(0, kMiB));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a ctime of its own
    std::ofstream(path, std::ios::binary | std::ios::in | std::ios::out) << v2;
    struct timespec back[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), back, 0), 0);
    struct stat after;
    ASSERT_EQ(::stat(path.c_str(), &after), 0);
    ASSERT_EQ(after.st_ino, before.st_ino);
    ASSERT_EQ(after.st_size, before.st_size);
    ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    auto again = cache.OpenReader(vf, "ckpt");
    ASSERT_OK(again);
    std::string all = ReadAll(**again, 2 * kMiB);
    ASSERT_EQ(all.size(), 2 * kMiB);
    EXPECT_TRUE(all == v2) << "first byte " << all.front() << ", last " << all.back();
  }
}

// Upload staging (tus sessions, S3 multipart parts) is read from the volume below as it is now:
// never kept (a part is read once, by its Complete) and never stale (another node's new part).
// Ingest on write: a file written through this node is kept as it was written, so its first
// read needs no origin (served here with the origin down). Before, every new version was
// fetched back from the origin at its first read.
TEST_F(Cache, AFileWrittenThroughTheNodeIsCachedAsWritten) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  const std::string data = Bytes(3 * kMiB + 17, 3), small = "a small object";
  ASSERT_OK(Upload("out/ckpt", data, /*pieces=*/3));  // spooled on the cache disk
  ASSERT_OK(Upload("out/small", small));              // in memory
  auto s = cache_->stats();
  EXPECT_EQ(s.ingested, 5u);
  EXPECT_EQ(s.ingested_bytes, data.size() + small.size());
  EXPECT_EQ(s.ingests_dropped, 0u);
  origin_->down = true;
  EXPECT_TRUE(ReadAll("out/ckpt") == data);
  EXPECT_EQ(ReadAll("out/small"), small);
  s = cache_->stats();
  EXPECT_EQ(s.hits, 5u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(origin_->reads, 0);
}

// A PATCH cut back to its durable offset (unsynced bytes dropped) and written on with other
// bytes: what is kept is what was committed.
TEST_F(Cache, ASessionCutBackIsIngestedAsCommitted) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  const std::string data = Bytes(2 * kMiB, 4);
  auto session = cache_->CreateStaging(vf_);
  ASSERT_OK(session);
  {
    auto w = cache_->OpenStaging(vf_, *session, std::chrono::milliseconds(0));
    ASSERT_OK(w);
    size_t n = 0;
    ASSERT_OK((*w)->WriteAt(0, data.data(), kMiB, &n));
    ASSERT_OK((*w)->Sync(kMiB, true));
    const std::string junk(kMiB, 'j');  // never synced: cut off at the next open
    ASSERT_OK((*w)->WriteAt(kMiB, junk.data(), junk.size(), &n));
  }
  auto w = cache_->OpenStaging(vf_, *session, std::chrono::milliseconds(0));
  ASSERT_OK(w);
  EXPECT_EQ((*w)->state().staged_size, kMiB);
  size_t n = 0;
  ASSERT_OK((*w)->WriteAt(kMiB, data.data() + kMiB, kMiB, &n));
  ASSERT_OK((*w)->Sync(2 * kMiB, true));
  ASSERT_OK((*w)->Commit({"f"}));
  w->reset();
  EXPECT_EQ(cache_->stats().ingested, 2u);
  origin_->down = true;
  EXPECT_TRUE(ReadAll("f") == data);
}

// Bytes this node did not see (a session another node began), or a version replaced at the
// origin before the ingest looked (another node's write right after this one): nothing is
// kept, and reads get the origin's bytes.
TEST_F(Cache, WhatTheNodeDidNotSeeOrNoLongerThereIsNotIngested) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  const std::string data = Bytes(2 * kMiB + 3, 5), other = Bytes(2 * kMiB + 3, 6);
  ASSERT_OK(Upload("begun-elsewhere", data, 1, /*first=*/kMiB));
  EXPECT_EQ(cache_->stats().ingested, 0u);
  EXPECT_TRUE(ReadAll("begun-elsewhere") == data);
  origin_->before_open = [&] { Put("replaced", other); };
  ASSERT_OK(Upload("replaced", data));
  EXPECT_EQ(cache_->stats().ingested, 0u);
  EXPECT_EQ(cache_->stats().ingests_dropped, 1u);  // (the first had no spool to drop)
  EXPECT_TRUE(ReadAll("replaced") == other);
}

// A file assembled by copies (a multipart Complete, a CopyObject) is kept too.
TEST_F(Cache, ACopiedFileIsIngested) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  const std::string data = Bytes(kMiB + 100, 7);
  Put("part", data);
  auto src = cache_->inner().OpenReader(vf_, "part");
  ASSERT_OK(src);
  auto session = cache_->CreateStaging(vf_);
  ASSERT_OK(session);
  auto w = cache_->OpenStaging(vf_, *session, std::chrono::milliseconds(0));
  ASSERT_OK(w);
  ASSERT_OK((*w)->CopyFrom(**src, 0, 100, 0));
  ASSERT_OK((*w)->CopyFrom(**src, 100, data.size() - 100, 100));
  ASSERT_OK((*w)->Publish({"whole"}, nullptr, true));
  w->reset();
  EXPECT_EQ(cache_->stats().ingested, 2u);
  origin_->down = true;
  EXPECT_TRUE(ReadAll("whole") == data);
}

TEST_F(Cache, IngestCanBeTurnedOff) {
  opts_.ingest = false;
  Start();
  ASSERT_OK(Upload("f", "bytes"));
  EXPECT_EQ(cache_->stats().ingested, 0u);
  EXPECT_EQ(ReadAll("f"), "bytes");
  EXPECT_EQ(cache_->stats().misses, 1u);
}

// A multipart part's writer says ReadOnceByAnother before it writes: nothing of it is spooled
// (before, its bytes went to the cache disk as well, and were dropped at its commit). Here it is
// committed where a reader could read it, so a spool kept would show as blocks ingested.
TEST_F(Cache, AWriterReadOnceByAnotherSpoolsNothing) {
  Start();
  auto session = cache_->CreateStaging(vf_);
  ASSERT_OK(session);
  const std::string data = Bytes(2 * kMiB, 3);
  {
    auto w = cache_->OpenStaging(vf_, *session, std::chrono::milliseconds(0));
    ASSERT_OK(w);
    (*w)->ReadOnceByAnother();
    size_t n = 0;
    ASSERT_OK((*w)->WriteAt(0, data.data(), data.size(), &n));
    ASSERT_OK((*w)->Sync(data.size(), true));
    ASSERT_OK((*w)->Commit({"part"}));
  }
  auto s = cache_->stats();
  EXPECT_EQ(s.ingested, 0u);
  EXPECT_EQ(s.ingests_dropped, 0u);  // not counted as a drop: never to be kept
  EXPECT_EQ(ReadAll("part"), data);
  EXPECT_EQ(cache_->stats().misses, 2u);
}

TEST_F(Cache, StagingIsNeverCached) {
  opts_.ttl = std::chrono::milliseconds(60000);
  Start();
  Put(".upload/mp-1/p00001", Bytes(2 * kMiB, 7));
  EXPECT_EQ(ReadAll(".upload/mp-1/p00001"), Bytes(2 * kMiB, 7));
  Put(".upload/mp-1/p00001", Bytes(2 * kMiB, 8));  // within the TTL
  EXPECT_EQ(ReadAll(".upload/mp-1/p00001"), Bytes(2 * kMiB, 8));
  Put(".upload/mp-1/p00002", "x");
  auto st = cache_->Stat(vf_, ".upload/mp-1/p00002");
  ASSERT_OK(st);
  EXPECT_EQ(st->size, 1u);
  auto s = cache_->stats();
  EXPECT_EQ(s.misses + s.hits, 0u);
  EXPECT_EQ(s.store.blocks, 0u);
}

TEST_F(Cache, WarmAfterARestartAndTornBlocksAreDropped) {
  Start();
  const std::string data = Bytes(3 * kMiB, 4);
  Put("f", data);
  EXPECT_EQ(ReadAll("f"), data);
  Start();  // a new process: the attributes and the blocks are on disk
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(origin_->reads, 3);
  EXPECT_EQ(origin_->opens, 1);  // within the TTL: not even the attributes asked again
  EXPECT_EQ(cache_->stats().hits, 3u);
  // Past the TTL with the origin down, a new process still serves what it had.
  opts_.ttl = std::chrono::milliseconds(0);
  Start();
  origin_->down = true;
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(cache_->stats().stale_served, 1u);
  origin_->down = false;
  opts_.ttl = std::chrono::milliseconds(60000);
  // A block torn by a crash: its checksum no longer matches. It is fetched again, never served.
  int torn = 0;
  for (auto& sub : fs::recursive_directory_iterator(opts_.path)) {
    if (!sub.is_regular_file() || torn || sub.path().parent_path().filename().string().size() != 2)
      continue;
    std::fstream io(sub.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);
    io.put('\x5a' ^ static_cast<char>(io.peek()));
    ++torn;
  }
  ASSERT_EQ(torn, 1);
  Start();
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(cache_->stats().store.torn, 1u);
  EXPECT_EQ(origin_->reads, 4);
}

TEST_F(Cache, StaysWithinItsSize) {
  opts_.max_size = 3 * kMiB;
  Start();
  const std::string data = Bytes(8 * kMiB, 5);
  Put("f", data);
  EXPECT_EQ(ReadAll("f"), data);
  auto s = cache_->stats();
  EXPECT_LE(s.store.bytes, 3 * kMiB);
  EXPECT_EQ(s.store.evictions, 5u);
  uint64_t on_disk = 0;
  for (auto& e : fs::recursive_directory_iterator(opts_.path))
    if (e.is_regular_file() && e.path().parent_path().filename().string().size() == 2)
      on_disk += e.file_size();
  EXPECT_LE(on_disk, 3 * kMiB + 3 * 20);  // the blocks and their 20-byte headers
}

TEST_F(Cache, OriginDownServesWhatIsCached) {
  opts_.ttl = std::chrono::milliseconds(0);  // every open asks the origin
  Start();
  const std::string data = Bytes(2 * kMiB, 6), other = Bytes(kMiB, 7);
  Put("cached", data);
  Put("never-read", other);
  EXPECT_EQ(ReadAll("cached"), data);
  origin_->down = true;
  EXPECT_EQ(ReadAll("cached"), data);
  EXPECT_EQ(cache_->stats().stale_served, 1u);
  Status st;
  EXPECT_EQ(ReadAll("never-read", &st), "");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  // Without serve-stale, a file whose attributes expired is not served.
  opts_.serve_stale = false;
  Start();
  origin_->down = true;
  EXPECT_EQ(ReadAll("cached", &st), "");
  EXPECT_EQ(st.code(), Code::kUnavailable);
}

// An origin that answers nothing (a partition, a stopped process) is waited for only
// `revalidate-timeout` when the cache has an answer: the file's attributes and its blocks, a
// directory's listing. The round trip goes on and keeps what it finds for the next reader.
TEST_F(Cache, AnOriginThatAnswersNothingIsWaitedForBriefly) {
  opts_.ttl = std::chrono::milliseconds(3000);
  opts_.revalidate_timeout = std::chrono::milliseconds(100);
  Start();
  const std::string data = Bytes(2 * kMiB, 6);
  Put("dir/cached", data);
  EXPECT_EQ(ReadAll("dir/cached"), data);
  ASSERT_OK(cache_->OpenDir(vf_, "dir"));
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));  // past the TTL
  origin_->Hang(true);
  Watchdog watchdog(origin_);
  EXPECT_EQ(ReadAll("dir/cached"), data);
  auto listed = cache_->OpenDir(vf_, "dir");
  ASSERT_OK(listed);
  auto first = (*listed)->Next();
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->name, "cached");
  EXPECT_FALSE(watchdog.released) << "the cache waited for an origin that answered nothing";
  EXPECT_EQ(cache_->stats().stale_served, 2u);
  const int opens = origin_->opened;
  watchdog.Stop();  // lets the origin go
  // The open that was given up on finishes now and keeps the attributes it read: the next
  // reader needs nothing from the origin.
  for (int i = 0; i < 500 && origin_->opened == opens; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->opened, opens + 1);
  auto fresh = [&] { return cache_->OpenReader(vf_, "dir/cached", Lookup::kCachedOnly).ok(); };
  for (int i = 0; i < 500 && !fresh(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fresh());
  const int asked = origin_->opens;
  EXPECT_EQ(ReadAll("dir/cached"), data);
  EXPECT_EQ(origin_->opens, asked);
}

// Once a round trip has been given up on, the origin counts as silent until one answers:
// the next files are served from the cache without waiting, and at most two round trips are
// in the air (not one per file, all sent the moment the origin is back).
TEST_F(Cache, ASilentOriginIsNotWaitedForFileAfterFile) {
  opts_.ttl = std::chrono::milliseconds(0);
  opts_.revalidate_timeout = std::chrono::milliseconds(1000);  // only the first read waits
  Start();
  std::vector<std::string> data;
  for (int i = 0; i < 20; ++i) {
    data.push_back(Bytes(4096 + i, 20 + i));
    Put(fmt::format("f{}", i), data.back());
    ASSERT_EQ(ReadAll(fmt::format("f{}", i)), data.back());
  }
  // Quiet first: an open still on its way back (a read's revalidation) would land after the
  // hang began, counted by neither `before` nor `sent`.
  for (int i = 0; i < 500 && origin_->opened != origin_->opens; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->opened, origin_->opens);
  const int before = origin_->opens;
  origin_->Hang(true);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ReadAll(fmt::format("f{}", i)), data[i]);
  EXPECT_EQ(cache_->stats().stale_served, 20u);
  // A round trip a read starts in the background may leave just after the read answered:
  // counted once they have had the time to.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int sent = origin_->opens - before;
  EXPECT_GE(sent, 1);
  EXPECT_LE(sent, 2);
  const int landed = origin_->opened;
  origin_->Hang(false);
  for (int i = 0; i < 1000 && origin_->opened < landed + sent; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->opened, landed + sent);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(origin_->opens - before, sent);  // nothing queued behind them
  // Answering again: the next open waits for the origin's answer, as always.
  const int answered = origin_->opened;
  EXPECT_EQ(ReadAll("f0"), data[0]);
  EXPECT_EQ(origin_->opened, answered + 1);
}

// While the origin counts as silent, a block not cached is refused at once (503), not held
// until the origin's stall timeout; it sends a probe (a stat) in the background, whose answer
// ends the silence, and the block is read then.
TEST_F(Cache, ABlockNotCachedIsRefusedAtOnceWhileTheOriginIsSilent) {
  opts_.ttl = std::chrono::milliseconds(3000);
  opts_.revalidate_timeout = std::chrono::milliseconds(200);
  Start();
  const std::string a = Bytes(4096, 40), b = Bytes(2 * kMiB, 41);
  Put("a", a);
  Put("b", b);
  ASSERT_EQ(ReadAll("a"), a);
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));  // a's attributes expire
  ASSERT_OK(cache_->OpenReader(vf_, "b"));  // b's are fresh (none of its blocks cached)
  {
    origin_->Hang(true);
    Watchdog watchdog(origin_);
    EXPECT_TRUE(ReadAll("a") == a);  // waits 200 ms for the origin, then served
    EXPECT_TRUE(cache_->stats().origin_silent);
    origin_->down = true;  // the held open fails once let go: no answer, still silent
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(cache_->stats().origin_silent);
  origin_->down = false;
  const int before = origin_->stats;
  origin_->Hang(true);
  Watchdog watchdog(origin_);
  Status st;
  EXPECT_TRUE(ReadAll("b", &st).empty());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_FALSE(watchdog.released) << "a read waited for an origin that answered nothing";
  // The probe it sent answers once the origin does: heard again, and b is read.
  watchdog.Stop();
  for (int i = 0; i < 500 && cache_->stats().origin_silent; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(cache_->stats().origin_silent);
  EXPECT_EQ(origin_->stats, before + 1);
  EXPECT_TRUE(ReadAll("b") == b);
}

// A reader joined to a block fetch that began before the origin fell silent is not held until
// that fetch gives up: it gets a 503 once the origin counts as silent, as a new miss does. The
// fetch goes on and keeps the block.
TEST_F(Cache, AReaderJoinedToAFetchIsLetGoWhenTheOriginFallsSilent) {
  opts_.ttl = std::chrono::milliseconds(0);
  opts_.revalidate_timeout = std::chrono::milliseconds(200);
  Start();
  const std::string a = Bytes(4096, 50), b = Bytes(kMiB, 51);
  Put("a", a);
  Put("b", b);
  ASSERT_EQ(ReadAll("a"), a);
  auto first = cache_->OpenReader(vf_, "b");
  ASSERT_OK(first);
  origin_->HangReads(true);
  Watchdog watchdog(origin_);
  const int reads = origin_->reads;
  std::string got(b.size(), '\0');
  Result<size_t> led = Status(Code::kInternal, "not read");
  std::thread leader([&] { led = (*first)->ReadAt(0, got.data(), got.size()); });
  for (int i = 0; i < 500 && origin_->reads == reads; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->reads, reads + 1);  // the block's fetch holds at the origin
  auto second = cache_->OpenReader(vf_, "b");
  ASSERT_OK(second);
  std::atomic<bool> joined_done{false};
  Status joined_st;
  std::thread joined([&] {
    std::string buf(b.size(), '\0');
    auto r = (*second)->ReadAt(0, buf.data(), buf.size());
    joined_st = r.status();
    joined_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(joined_done);  // joined to the fetch, which holds
  origin_->Hang(true);        // the origin falls silent: a's revalidation goes unanswered
  EXPECT_TRUE(ReadAll("a") == a);
  ASSERT_TRUE(cache_->stats().origin_silent);
  for (int i = 0; i < 200 && !joined_done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(joined_done) << "a joined reader waited out a fetch from a silent origin";
  watchdog.Stop();  // the origin answers again: the fetch lands and is kept
  leader.join();
  joined.join();
  EXPECT_EQ(joined_st.code(), Code::kUnavailable) << joined_st.ToString();
  EXPECT_FALSE(watchdog.released);
  ASSERT_OK(led);
  EXPECT_EQ(*led, b.size());
  EXPECT_TRUE(got == b);
  EXPECT_EQ(cache_->stats().store.blocks, 2u);  // a's, and b's that the fetch kept
}

// Readers of one stale file while the origin holds share one round trip.
TEST_F(Cache, ReadersOfOneStaleFileShareOneRoundTrip) {
  opts_.ttl = std::chrono::milliseconds(0);
  opts_.revalidate_timeout = std::chrono::milliseconds(300);
  Start();
  const std::string data = Bytes(4096, 30);
  Put("f", data);
  ASSERT_EQ(ReadAll("f"), data);
  const int before = origin_->opens;
  origin_->Hang(true);
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (int i = 0; i < 8; ++i) readers.emplace_back([&] { good += ReadAll("f") == data; });
  for (auto& t : readers) t.join();
  EXPECT_EQ(good, 8);
  origin_->Hang(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(origin_->opens - before, 1);
}

// What a round trip found before a write through this node is not kept after it: the write
// may have replaced it.
TEST_F(Cache, ARevalidationOlderThanAWriteIsNotKept) {
  opts_.ttl = std::chrono::milliseconds(0);
  opts_.revalidate_timeout = std::chrono::milliseconds(100);
  Start();
  const std::string v1 = Bytes(kMiB, 8), v2 = Bytes(kMiB + 7, 9);
  Put("f", v1);
  EXPECT_EQ(ReadAll("f"), v1);
  origin_->Hang(true);          // the next open reads v1's attributes, then holds
  EXPECT_EQ(ReadAll("f"), v1);  // served stale
  Put("f", v2);
  cache_->Invalidate(vf_);  // as a write through this node does
  const int opened = origin_->opened;
  origin_->Hang(false);
  for (int i = 0; i < 500 && origin_->opened == opened; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->opened, opened + 1);  // v1's attributes came back, after the write
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // and were offered to the cache
  origin_->down = true;
  // Nothing of v1 is known any more: with the origin down, nothing to serve.
  Status st;
  EXPECT_EQ(ReadAll("f", &st), "");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  origin_->down = false;
  EXPECT_EQ(ReadAll("f"), v2);
}

TEST_F(Cache, AChangedFileNeverMeetsItsOldBlocks) {
  opts_.ttl = std::chrono::milliseconds(0);
  Start();
  const std::string v1 = Bytes(3 * kMiB, 8), v2 = Bytes(3 * kMiB, 9);
  Put("f", v1);
  auto old_reader = cache_->OpenReader(vf_, "f");
  ASSERT_OK(old_reader);
  EXPECT_EQ(ReadAll("f"), v1);
  Put("f", v2);  // replaced on the origin, behind the cache
  EXPECT_EQ(ReadAll("f"), v2);
  // A reader of the old version keeps the blocks it had; a block of it no longer anywhere
  // cannot be made of the new version.
  std::string buf(kMiB, '\0');
  ASSERT_OK((*old_reader)->ReadAt(0, buf.data(), buf.size()));
  EXPECT_EQ(buf, v1.substr(0, kMiB));
}

TEST_F(Cache, SecondMissAdmission) {
  opts_.second_miss = true;
  Start();
  const std::string data = Bytes(2 * kMiB, 10);
  Put("f", data);
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(cache_->stats().store.blocks, 0u);  // seen once: not kept
  EXPECT_EQ(cache_->stats().admission_rejects, 2u);
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(cache_->stats().store.blocks, 2u);
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(cache_->stats().hits, 2u);
  EXPECT_EQ(origin_->reads, 4);
}

// Read-ahead applies second-miss admission too (before 2026-12-06 it kept every block, so one
// scan of a large file filled the cache), and a block it fetched but the cache did not keep is
// held for its reader, not fetched again.
TEST_F(Cache, ReadAheadAppliesSecondMissAdmission) {
  opts_.second_miss = true;
  opts_.read_ahead = 4;
  Start();
  const std::string data = Bytes(16 * kMiB, 12);
  Put("scan", data);
  EXPECT_EQ(ReadAll("scan"), data);
  EXPECT_EQ(origin_->reads, 16);                // each block once
  EXPECT_EQ(cache_->stats().store.blocks, 0u);  // seen once: not kept
  EXPECT_EQ(ReadAll("scan"), data);
  EXPECT_EQ(origin_->reads, 32);
  WaitForBlocks(16);
  EXPECT_EQ(cache_->stats().store.blocks, 16u);  // seen twice: kept
  EXPECT_EQ(ReadAll("scan"), data);
  EXPECT_EQ(origin_->reads, 32);
}

TEST_F(Cache, WritesThroughThisNodeDropWhatTheyReplace) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  Put("a", "alpha");
  EXPECT_EQ(ReadAll("a"), "alpha");
  ASSERT_OK(cache_->Rename(vf_, "a", "b"));
  Status st;
  EXPECT_EQ(ReadAll("a", &st), "");
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(ReadAll("b"), "alpha");
  ASSERT_OK(cache_->DeleteFiles(vf_, {"b"}, false));
  EXPECT_EQ(ReadAll("b", &st), "");
  EXPECT_EQ(st.code(), Code::kNotFound);
  // A rename of "d/f/" (a trailing slash, as a manager-API relpath may have it) lands on d/g,
  // and drops what the cache knew of d/g (gone below it meanwhile), not of "d/f/g".
  Put("d/f", "first");
  Put("d/g", "gee");
  EXPECT_EQ(ReadAll("d/g"), "gee");
  auto& mem = dynamic_cast<MemVolume&>(ForwardingVolume::Innermost(*cache_));
  ASSERT_OK(mem.DeleteFiles(vf_, {"d/g"}, false));
  ASSERT_OK(cache_->Rename(vf_, "d/f/", "g"));
  EXPECT_EQ(ReadAll("d/g"), "first");
}

// A write through this node drops what it lands on, not the rest of the vfolder: before
// 2026-12-05 one mkdir (or upload) made every cached file of the vfolder ask the origin again,
// and with the origin down they all answered 503.
TEST_F(Cache, AWriteKeepsTheRestOfItsVFolderServable) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  Put("train/a", "alpha");
  Put("train/b", "beta");
  EXPECT_EQ(ReadAll("train/a"), "alpha");
  EXPECT_EQ(ReadAll("train/b"), "beta");
  ASSERT_OK(cache_->Mkdir(vf_, "out", false, false));
  ASSERT_OK(cache_->DeleteFiles(vf_, {"train/b"}, false));
  origin_->down = true;
  EXPECT_EQ(ReadAll("train/a"), "alpha");
  Status st;
  EXPECT_EQ(ReadAll("train/b", &st), "");  // what the write replaced is never served
  EXPECT_FALSE(st.ok());
}

// Attributes are journaled: a restarted node opens without the origin; a write through the
// node drops them for the next start too; a line torn by a crash is skipped.
TEST_F(Cache, AttributesSurviveARestartUntilAWriteDropsThem) {
  opts_.ttl = std::chrono::hours(1);
  Start();
  Put("a", "alpha");
  Put("b", "beta");
  EXPECT_EQ(ReadAll("a"), "alpha");
  EXPECT_EQ(ReadAll("b"), "beta");
  Start();
  EXPECT_EQ(ReadAll("a"), "alpha");
  EXPECT_EQ(origin_->opens, 2);
  // A write elsewhere in the vfolder keeps b's attributes (before 2026-12-05 it dropped the
  // whole vfolder's); one that lands on b drops them, for the next start too.
  ASSERT_OK(cache_->Mkdir(vf_, "d", false, false));
  Start();
  EXPECT_EQ(ReadAll("b"), "beta");
  EXPECT_EQ(origin_->opens, 2);
  ASSERT_OK(cache_->Rename(vf_, "b", "c"));
  ASSERT_OK(cache_->Rename(vf_, "c", "b"));
  {
    std::ofstream torn(opts_.path + "/attributes.log", std::ios::app | std::ios::binary);
    torn << "{\"k\": \"torn";
  }
  Start();
  EXPECT_EQ(ReadAll("b"), "beta");
  EXPECT_EQ(origin_->opens, 3);  // asked again
  Start();
  EXPECT_EQ(ReadAll("b"), "beta");
  EXPECT_EQ(origin_->opens, 3);  // and kept again
  EXPECT_EQ(cache_->EvictAll(), 2u);
  Start();
  EXPECT_EQ(ReadAll("b"), "beta");
  EXPECT_EQ(origin_->opens, 4);  // nothing kept after an evict of everything
}

// Read-ahead waiting for its turn does not keep its reader alive: before, each reader of one
// byte of a cold file stayed in memory, with the block it had read, until the fetches queued
// for it ran (up to 4,096 of them).
TEST_F(Cache, QueuedReadAheadDoesNotKeepItsReader) {
  Start();
  const std::string data = Bytes(5 * kMiB, 4);
  for (int i = 0; i < 8; ++i) Put(fmt::format("f{}", i), data);
  Put("blocker", data);
  char c;
  for (int i = 0; i < 8; ++i) {  // block 0 of each cached
    auto f = cache_->OpenReader(vf_, fmt::format("f{}", i));
    ASSERT_OK(f);
    ASSERT_OK((*f)->ReadAt(0, &c, 1));
  }
  opts_.read_ahead = 4;
  opts_.fetch_threads = 1;
  Start();
  origin_->HangReads(true);
  Watchdog dog(origin_);
  // The one fetch thread holds on the origin; what is read ahead after it waits in the queue.
  const int before = origin_->reads;
  std::thread blocked([&] {
    auto f = cache_->OpenReader(vf_, "blocker");
    if (f.ok()) (void)(*f)->ReadAt(0, &c, 1);
  });
  // Its block 0 and its first block ahead wait on the origin (counted as they start).
  for (int i = 0; i < 500 && origin_->reads < before + 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(origin_->reads, before + 2);
  std::vector<std::weak_ptr<FileReader>> gone;
  for (int i = 0; i < 8; ++i) {
    auto f = cache_->OpenReader(vf_, fmt::format("f{}", i));
    ASSERT_OK(f);
    char one;
    ASSERT_OK((*f)->ReadAt(0, &one, 1));  // from the cache; blocks 1-4 queued
    gone.push_back(*f);
  }
  for (const auto& w : gone) EXPECT_TRUE(w.expired()) << "a reader kept by its read-ahead";
  origin_->HangReads(false);
  dog.Stop();
  blocked.join();
  EXPECT_FALSE(dog.released);
}

// A sequential reader gets the next blocks fetched ahead, in parallel; a reader that jumps
// does not.
TEST_F(Cache, SequentialReadersAreReadAhead) {
  opts_.read_ahead = 4;
  Start();
  const std::string data = Bytes(16 * kMiB, 9);
  Put("seq", data);
  Put("jump", data);
  auto f = cache_->OpenReader(vf_, "seq");
  ASSERT_OK(f);
  std::string buf(kMiB, '\0');
  ASSERT_OK((*f)->ReadAt(0, buf.data(), buf.size()));
  WaitForBlocks(5);
  EXPECT_EQ(cache_->stats().store.blocks, 5u);  // block 0 and the 4 after it
  for (uint64_t off = kMiB; off < 5 * kMiB; off += kMiB) {
    ASSERT_OK((*f)->ReadAt(off, buf.data(), buf.size()));
    EXPECT_EQ(buf, data.substr(off, kMiB));
  }
  WaitForBlocks(9);
  EXPECT_EQ(cache_->stats().store.blocks, 9u);  // reading blocks 1-4 read blocks 5-8 ahead
  EXPECT_EQ(origin_->reads, 9);                 // each block once
  // What the reader saw: block 0 missed, blocks 1-4 read ahead and then hits; blocks 5-8 read
  // ahead, not yet read.
  auto s = cache_->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 4u);
  EXPECT_EQ(s.read_ahead, 8u);
  const uint64_t before = cache_->stats().store.blocks;
  auto j = cache_->OpenReader(vf_, "jump");
  ASSERT_OK(j);
  ASSERT_OK((*j)->ReadAt(7 * kMiB, buf.data(), buf.size()));
  EXPECT_EQ(buf, data.substr(7 * kMiB, kMiB));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cache_->stats().store.blocks, before + 1);
}

// A stop while read-ahead fetches hang on the origin does not wait for them: the clean record
// (and the listings) are written at once (before, the stop waited out the fetches, which a
// silent origin holds until the s3 client's stall timeout).
TEST_F(Cache, AStopDoesNotWaitForReadAheadHeldByTheOrigin) {
  opts_.read_ahead = 4;
  Start();
  const std::string data = Bytes(16 * kMiB, 10);
  Put("seq", data);
  auto f = cache_->OpenReader(vf_, "seq");
  ASSERT_OK(f);
  std::string buf(kMiB, '\0');
  ASSERT_OK((*f)->ReadAt(0, buf.data(), buf.size()));
  WaitForBlocks(5);
  ASSERT_EQ(cache_->stats().store.blocks, 5u);
  origin_->HangReads(true);
  for (uint64_t off = kMiB; off < 5 * kMiB; off += kMiB)
    ASSERT_OK((*f)->ReadAt(off, buf.data(), buf.size()));  // hits; blocks 5-8 are read ahead
  for (int i = 0; i < 200 && origin_->reads < 6; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(origin_->reads, 6);  // at least one held in the origin
  std::atomic<bool> stopped{false};
  std::thread stop([&] {
    cache_->Shutdown();
    stopped = true;
  });
  for (int i = 0; i < 300 && !stopped; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool in_time = stopped;
  origin_->HangReads(false);
  stop.join();
  EXPECT_TRUE(in_time) << "the stop waited for the held read-ahead";
  EXPECT_TRUE(fs::exists(opts_.path + "/" + BlockStore::kCleanRecord));
}

// Blocks held and checked are sent straight from their files (LocalExtent); after a restart a
// block is read and checked once before it is.
TEST_F(Cache, VerifiedBlocksAreLocalExtents) {
  opts_.read_ahead = 0;
  Start();
  const std::string data = Bytes(3 * kMiB + 10, 10);
  Put("f", data);
  auto f = cache_->OpenReader(vf_, "f");
  ASSERT_OK(f);
  EXPECT_EQ((*f)->LocalExtent(0).fd, -1);  // not cached yet
  EXPECT_EQ(ReadAll("f"), data);
  auto check = [&](FileReader& r, uint64_t off) {
    const FileReader::Extent e = r.LocalExtent(off);
    ASSERT_GE(e.fd, 0);
    EXPECT_EQ(e.length, std::min<uint64_t>(kMiB - off % kMiB, data.size() - off));
    std::string got(static_cast<size_t>(e.length), '\0');
    ASSERT_EQ(::pread(e.fd, got.data(), got.size(), static_cast<off_t>(e.fd_offset)),
              static_cast<ssize_t>(got.size()));
    EXPECT_EQ(got, data.substr(off, got.size()));
  };
  for (uint64_t off : {uint64_t{0}, kMiB - 1, 2 * kMiB + 5, 3 * kMiB + 9}) check(**f, off);
  EXPECT_EQ((*f)->LocalExtent(data.size()).fd, -1);
  Start();  // a new process: blocks on disk are checked once before they are sent from disk
  auto g = cache_->OpenReader(vf_, "f");
  ASSERT_OK(g);
  EXPECT_EQ((*g)->LocalExtent(0).fd, -1);
  std::string buf(10, '\0');
  ASSERT_OK((*g)->ReadAt(0, buf.data(), buf.size()));
  check(**g, 7);
  EXPECT_EQ((*g)->LocalExtent(kMiB).fd, -1);  // block 1 not checked yet
  EXPECT_EQ(origin_->reads, 4);               // all from the cache after the first read
}

// After a clean shutdown the blocks checked (or written) before it are sent from disk at once;
// after a crash, or with a damaged record, they are checked first again.
TEST_F(Cache, AfterACleanShutdownCheckedBlocksAreTrusted) {
  Start();
  const std::string data = Bytes(3 * kMiB + 10, 11);
  Put("f", data);
  EXPECT_EQ(ReadAll("f"), data);  // four blocks written
  const std::string record = opts_.path + "/" + BlockStore::kCleanRecord;
  cache_->Shutdown();
  ASSERT_TRUE(fs::exists(record));
  auto sent_from_disk = [&](uint64_t off) {
    auto f = cache_->OpenReader(vf_, "f");
    EXPECT_OK(f);
    return f.ok() && (*f)->LocalExtent(off).fd >= 0;
  };
  Start();
  EXPECT_FALSE(fs::exists(record));  // taken: a crash from here on trusts nothing
  for (uint64_t off : {uint64_t{0}, kMiB, 2 * kMiB, 3 * kMiB}) EXPECT_TRUE(sent_from_disk(off));
  EXPECT_EQ(ReadAll("f"), data);
  EXPECT_EQ(origin_->reads, 4);
  Start();  // no clean shutdown before this start
  EXPECT_FALSE(sent_from_disk(0));
  // A damaged record trusts nothing.
  cache_->Shutdown();
  {
    std::fstream io(record, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(20);
    io.put('\x01' ^ static_cast<char>(io.peek()));
  }
  Start();
  EXPECT_FALSE(fs::exists(record));
  EXPECT_FALSE(sent_from_disk(0));
  EXPECT_EQ(ReadAll("f"), data);  // checked, then served
  EXPECT_EQ(cache_->stats().store.torn, 0u);
  EXPECT_EQ(origin_->reads, 4);
}

// The listings still fresh at a clean shutdown are there after the restart (no origin asked);
// after a crash they are asked again.
TEST_F(Cache, ListingsSurviveACleanShutdown) {
  Start();
  Put("d/a", "1");
  Put("d/b", "22");
  auto names = [&] {
    std::vector<std::string> out;
    auto d = cache_->OpenDir(vf_, "d");
    if (!d.ok()) return std::vector<std::string>{d.status().ToString()};
    for (;;) {
      auto n = (*d)->Next();
      if (!n.ok() || !*n) break;
      out.push_back((*n)->name);
    }
    return out;
  };
  const std::vector<std::string> both{"a", "b"};
  EXPECT_EQ(names(), both);
  EXPECT_EQ(origin_->lists, 1);
  cache_->Shutdown();
  Start();
  origin_->down = true;  // served from the listing kept
  EXPECT_EQ(names(), both);
  EXPECT_EQ(cache_->Stat(vf_, "d/b")->size, 2u);
  origin_->down = false;
  EXPECT_EQ(origin_->lists, 1);
  Start();  // no clean shutdown this time: asked again
  EXPECT_EQ(names(), both);
  EXPECT_EQ(origin_->lists, 2);
  // A write through the node after the listings were kept (a background task that outlived
  // the drain): the next start asks again, and sees it.
  cache_->Shutdown();
  ASSERT_OK(cache_->Mkdir(vf_, "d/late", false, true));
  Start();
  const std::vector<std::string> three{"a", "b", "late"};
  EXPECT_EQ(names(), three);
  EXPECT_EQ(origin_->lists, 3);
}

// The listings kept at a shutdown are a file on the cache disk like a block: not written where
// it would take the disk below min-free (before, they were written whatever the floor).
TEST_F(Cache, ListingsAreNotKeptBelowMinFree) {
  opts_.min_free = 1ULL << 60;  // no disk keeps that free
  Start();
  Put("d/a", "1");
  ASSERT_OK(cache_->OpenDir(vf_, "d"));
  EXPECT_EQ(origin_->lists, 1);
  cache_->Shutdown();
  EXPECT_FALSE(fs::exists(opts_.path + "/listings.json"));
  Start();
  ASSERT_OK(cache_->OpenDir(vf_, "d"));
  EXPECT_EQ(origin_->lists, 2);  // asked again
}

// A directory of more than max-listing entries is not kept: it is listed from the origin,
// which is asked for no more than max-listing entries to find that out, and its files still
// open through the cache. Smaller ones are kept, within a bound of all listings' entries.
TEST_F(Cache, ADirectoryTooLargeToKeepIsListedFromTheOrigin) {
  opts_.max_listing = 10;
  Start();
  for (int i = 0; i < 50; ++i) Put(fmt::format("big/f{:02}", i), fmt::format("{}", i));
  Put("small/a", "1");
  auto names = [&](const std::string& dir, const ListFrom* from) {
    std::vector<std::string> out;
    auto d = from ? cache_->OpenDirFrom(vf_, dir, *from) : cache_->OpenDir(vf_, dir);
    if (!d.ok()) return std::vector<std::string>{d.status().ToString()};
    for (;;) {
      auto n = (*d)->Next();
      if (!n.ok() || !*n) break;
      out.push_back((*n)->name);
      auto e = (*d)->StatEntry((*n)->name);
      EXPECT_TRUE(e.ok() && e->size >= 1) << (*n)->name;
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  std::vector<std::string> all;
  for (int i = 0; i < 50; ++i) all.push_back(fmt::format("f{:02}", i));
  EXPECT_EQ(names("big", nullptr), all);
  // Found too large after max-listing + 1 entries; then listed once more, in full.
  EXPECT_EQ(origin_->listed, 11 + 50);
  auto s = cache_->stats();
  EXPECT_EQ(s.listings, 0u);
  EXPECT_EQ(s.listed_entries, 0u);
  EXPECT_EQ(s.listings_passed, 1u);
  // Within the TTL it is not counted again: each listing asks the origin for what it reads.
  const ListFrom from{"f4", ""};
  EXPECT_EQ(names("big", &from), all);  // the in-memory origin does not select: the caller does
  EXPECT_EQ(origin_->listed, 11 + 100);
  EXPECT_EQ(cache_->stats().listings_passed, 2u);
  // Its files open through the cache.
  EXPECT_EQ(ReadAll("big/f07"), "7");
  EXPECT_EQ(ReadAll("big/f07"), "7");
  EXPECT_EQ(origin_->reads, 1);
  // A small one is kept.
  EXPECT_EQ(names("small", nullptr), std::vector<std::string>{"a"});
  EXPECT_EQ(names("small", nullptr), std::vector<std::string>{"a"});
  EXPECT_EQ(origin_->listed, 11 + 100 + 1);
  s = cache_->stats();
  EXPECT_EQ(s.listings, 1u);
  EXPECT_EQ(s.listed_entries, 1u);
  // A write through this node does not make it counted again (what passes is always fresh).
  ASSERT_OK(cache_->DeleteFiles(vf_, {"big/f00"}, false));
  EXPECT_EQ(names("big", nullptr).size(), 49u);
  EXPECT_EQ(origin_->listed, 11 + 100 + 1 + 49);
}

// All listings kept hold at most max(max_listed_entries, 2 x max-listing) entries: the oldest
// are dropped first.
TEST_F(Cache, ListingsKeptAreBoundedByTheirEntries) {
  opts_.max_listing = 10;
  opts_.max_listed_entries = 20;
  Start();
  for (int d = 0; d < 4; ++d)
    for (int i = 0; i < 6; ++i) Put(fmt::format("d{}/{}", d, i), "");  // four do not fit
  for (int d = 0; d < 4; ++d) {
    ASSERT_OK(cache_->OpenDir(vf_, fmt::format("d{}", d)));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // each younger than the last
  }
  // 24 entries past 20: the oldest go until 7/8 of the bound (17) is left.
  auto s = cache_->stats();
  EXPECT_EQ(s.listings, 2u);
  EXPECT_EQ(s.listed_entries, 12u);
  const int before = origin_->lists;
  ASSERT_OK(cache_->OpenDir(vf_, "d3"));  // the youngest are kept
  ASSERT_OK(cache_->OpenDir(vf_, "d2"));
  EXPECT_EQ(origin_->lists, before);
  ASSERT_OK(cache_->OpenDir(vf_, "d1"));  // the oldest were dropped
  EXPECT_EQ(origin_->lists, before + 1);
  EXPECT_EQ(cache_->stats().listed_entries, 18u);
}

// An operator's warm reads a tree in (whatever the admission policy), and evict drops it.
TEST_F(Cache, WarmAndEvictATree) {
  opts_.second_miss = true;  // a warm keeps blocks anyway
  Start();
  ASSERT_OK(cache_->Mkdir(vf_, "train/shard", true, true));
  const std::string big = Bytes(3 * kMiB + 5, 8);
  Put("train/a", "alpha");
  Put("train/shard/b", big);
  Put("other", "not warmed");
  WarmProgress progress;
  int ticks = 0;
  ASSERT_OK(WarmTree(
      *cache_, vf_, "train", &progress, [&] { ++ticks; }, 2));
  EXPECT_EQ(progress.files_found, 2u);
  EXPECT_EQ(progress.files_done, 2u);
  EXPECT_EQ(progress.bytes_found, big.size() + 5);
  EXPECT_EQ(progress.bytes_done, big.size() + 5);
  EXPECT_TRUE(progress.listed);
  EXPECT_GE(ticks, 1);
  EXPECT_EQ(origin_->reads, 5);  // 1 + 4 blocks
  EXPECT_EQ(cache_->stats().store.blocks, 5u);
  EXPECT_EQ(ReadAll("train/shard/b"), big);
  EXPECT_EQ(ReadAll("train/a"), "alpha");
  EXPECT_EQ(origin_->reads, 5);  // all from the cache

  auto n = EvictTree(*cache_, vf_, "train/shard");
  ASSERT_OK(n);
  EXPECT_EQ((*n)["files"], 1);
  EXPECT_EQ((*n)["blocks"], 4);
  EXPECT_EQ(cache_->stats().store.blocks, 1u);
  EXPECT_EQ(ReadAll("train/shard/b"), big);  // second-miss: read, not kept
  EXPECT_EQ(origin_->reads, 9);
  EXPECT_EQ(cache_->EvictAll(), 1u);
  EXPECT_EQ(cache_->stats().store.blocks, 0u);

  // One file; a path that is not there; a warm through an unreachable origin stops.
  WarmProgress one;
  ASSERT_OK(WarmTree(*cache_, vf_, "other", &one, [] {}));
  EXPECT_EQ(one.files_done, 1u);
  WarmProgress none;
  EXPECT_ERROR(WarmTree(*cache_, vf_, "missing", &none, [] {}), Code::kNotFound);
  EXPECT_ERROR(WarmTree(*cache_, vf_, "../x", &none, [] {}), Code::kInvalidPath);
  origin_->down = true;
  cache_->Invalidate(vf_);  // nothing known: every open must ask the origin
  WarmProgress down;
  EXPECT_ERROR(WarmTree(*cache_, vf_, "train", &down, [] {}), Code::kUnavailable);
}

BlockIndex::Key K(int i) {
  return *BlockIndex::ParseKey(
      fmt::format("{:064x}", static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL));
}

// Free space on the file system holding `dir`.
uint64_t FreeOn(const std::string& dir) {
  struct statvfs sv;
  EXPECT_EQ(::statvfs(dir.c_str(), &sv), 0);
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

// A 16 MiB tmpfs, whose free space is exact, for the block store's floor tests; unmounted and
// removed at the end.
struct SmallTmpfs {
  explicit SmallTmpfs(const char* options = "size=16m") {
    char tmpl[] = "/tmp/sluice-tmpfs-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir = tmpl;
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options) == 0;
  }
  ~SmallTmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
  std::string dir;
  bool mounted = false;
};

BlockStoreOptions StoreOn(const SmallTmpfs& t) {
  BlockStoreOptions o;
  o.dir = t.dir + "/blocks";
  o.max_bytes = 1ULL << 30;
  o.min_free = 0;
  return o;
}

// Fills the file system at `dir` to its last byte (a file "filler" there).
void FillUp(const std::string& dir) {
  UniqueFd fd(::open((dir + "/filler").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_GE(fd.get(), 0);
  const std::string chunk(1 << 16, 'x');
  while (::write(fd.get(), chunk.data(), chunk.size()) > 0) {
  }
  while (::write(fd.get(), "x", 1) > 0) {
  }
}

// A journal line that does not land (a full cache disk) empties the journal: before, the line
// dropping a file deleted through this node was lost, and after a restart the file's old
// attributes came back and its cached blocks were served without asking the origin.
TEST_F(Cache, AJournalLineThatDoesNotLandEmptiesTheJournal) {
  SmallTmpfs tmpfs;
  ASSERT_NO_FATAL_FAILURE(JournalOn(tmpfs));
  // Writes in another vfolder make lines that do not drop a's attributes.
  const auto other = VFolderId::Parse(
                         "user:11111111111111111111111111111111/"
                         "00000000000000000000000000000002")
                         .value();
  ASSERT_OK(cache_->CreateVFolder(other, 0755, true, std::nullopt));
  FillUp(tmpfs.dir);
  // Lines until one does not land (the journal's last page may hold a few more).
  const std::string log = opts_.path + "/attributes.log";
  for (int i = 0; i < 10000; ++i) {
    const auto before = fs::file_size(log);
    ASSERT_OK(cache_->Mkdir(other, fmt::format("d{}", i), false, false));
    if (fs::file_size(log) <= before) break;
  }
  ASSERT_OK(cache_->DeleteFiles(vf_, {"a"}, false));
  fs::remove(tmpfs.dir + "/filler");
  Start();
  Status st;
  EXPECT_EQ(ReadAll("a", &st), "") << "a deleted file's attributes came back";
  EXPECT_EQ(st.code(), Code::kNotFound);
}

// Compacting the journal writes a copy beside it: not when that copy would take the disk
// below min-free (before, it did, and a copy that failed was tried again at every line).
TEST_F(Cache, TheJournalIsNotCompactedBelowMinFree) {
  SmallTmpfs tmpfs;
  ASSERT_NO_FATAL_FAILURE(JournalOn(tmpfs));
  inner_ = ReleaseInner();
  // 10 MiB of lines, each key twice: a compaction would write 5 MiB beside them.
  const std::string log = opts_.path + "/attributes.log";
  {
    std::ofstream out(log, std::ios::app | std::ios::binary);
    out << JournalPadding(log, 10u << 20);
  }
  const auto before = fs::file_size(log);
  opts_.min_free = 4 * kMiB;  // about 6 MiB are free
  Start();
  EXPECT_EQ(fs::file_size(log), before);
  EXPECT_EQ(ReadAll("a"), "alpha");
  EXPECT_EQ(origin_->opens, 1);  // the attributes replayed all the same
}

// A last journal line torn by a crash is cut off before anything is appended: appended to, it
// swallowed the next line, and with the compaction at the start skipped (the cache disk near
// min-free) that line could be the one dropping a file deleted through this node, whose old
// attributes then came back after the next restart. A line whose fields have the wrong type
// is skipped (before, it threw out of the constructor: every start failed).
TEST_F(Cache, ATornLastJournalLineDoesNotSwallowTheNext) {
  SmallTmpfs tmpfs;
  ASSERT_NO_FATAL_FAILURE(JournalOn(tmpfs));
  inner_ = ReleaseInner();
  const std::string log = opts_.path + "/attributes.log";
  {
    std::ofstream out(log, std::ios::app | std::ios::binary);  // too much for a compaction
    out << JournalPadding(log, 10u << 20) << R"({"k": "y", "e": {}, "m": 5, "f": 1})"
        << "\n"
        << R"({"k": "torn)";
  }
  const auto before = fs::file_size(log);
  opts_.min_free = 4 * kMiB;
  Start();
  EXPECT_EQ(fs::file_size(log), before - 11);  // the torn line cut, nothing compacted
  EXPECT_EQ(ReadAll("a"), "alpha");
  ASSERT_OK(cache_->DeleteFiles(vf_, {"a"}, false));
  Start();
  Status st;
  EXPECT_EQ(ReadAll("a", &st), "") << "a deleted file's attributes came back";
  EXPECT_EQ(st.code(), Code::kNotFound);
}

// A block that cannot fit even with the whole cache evicted is refused with nothing evicted
// (before, an estimate of what eviction gives back above what it does emptied a warm cache for
// a block it then refused).
// A directory serves one store at a time (another sluiced, or two volumes given one path):
// the second is refused before it touches anything (tmp/ is where the first writes blocks).
TEST(BlockStore, ADirectoryServesOneStoreAtATime) {
  std::string tmpl = "/tmp/sluice-store-lock-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  BlockStoreOptions o;
  o.dir = tmpl;
  o.min_free = 0;
  {
    auto first = BlockStore::Open(o);
    ASSERT_OK(first);
    std::ofstream(tmpl + "/tmp/being-written") << "x";
    auto second = BlockStore::Open(o);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Code::kConflict);
    EXPECT_NE(second.status().message().find("in use by another cache"), std::string::npos)
        << second.status().message();
    EXPECT_TRUE(fs::exists(tmpl + "/tmp/being-written"));
  }
  EXPECT_OK(BlockStore::Open(o));  // the first one's gone: free again
  fs::remove_all(tmpl);
}

// A cache disk out of inodes with bytes to spare (many small objects): old blocks are evicted
// for new ones, as for bytes (before, every new block failed to open and was refused).
TEST(BlockStore, ACacheDiskOutOfInodesEvictsForNewBlocks) {
  SmallTmpfs tmpfs("size=64m,nr_inodes=400");  // about 140 left once the store's 259 are made
  ASSERT_TRUE(tmpfs.mounted) << std::strerror(errno);
  auto store = BlockStore::Open(StoreOn(tmpfs));
  ASSERT_OK(store);
  auto id = [](int i) { return BlockIndex::KeyHex(K(i)); };
  for (int i = 0; i < 400; ++i)
    ASSERT_TRUE((*store)->Put(id(i), std::string(100, static_cast<char>(i)))) << i;
  struct statvfs sv;
  ASSERT_EQ(::statvfs(tmpfs.dir.c_str(), &sv), 0);
  EXPECT_GE(sv.f_favail, 4u);  // the floor: 1% of them
  const auto st = (*store)->stats();
  EXPECT_GT(st.blocks, 50u);
  EXPECT_LT(st.blocks, 150u);
  EXPECT_GE(st.evictions, 250u);
  EXPECT_EQ((*store)->Get(id(399)), std::string(100, static_cast<char>(399)));
}

// Inodes taken by other files, so that even every block's file back would leave the disk
// below the floor: the block is refused with nothing evicted (before, the whole cache went).
TEST(BlockStore, ABlockNoInodeCanBeFoundForEvictsNothing) {
  SmallTmpfs tmpfs("size=64m,nr_inodes=400");
  ASSERT_TRUE(tmpfs.mounted) << std::strerror(errno);
  auto store = BlockStore::Open(StoreOn(tmpfs));
  ASSERT_OK(store);
  auto id = [](int i) { return BlockIndex::KeyHex(K(i)); };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*store)->Put(id(i), std::string(100, 'b'))) << i;
  // Other files take every inode but one (the floor is 4: 1% of 400).
  const std::string other = tmpfs.dir + "/other";
  ASSERT_EQ(::mkdir(other.c_str(), 0755), 0);
  for (int i = 0;; ++i) {
    struct statvfs sv;
    ASSERT_EQ(::statvfs(tmpfs.dir.c_str(), &sv), 0);
    if (sv.f_favail <= 1) break;
    std::ofstream(other + "/" + std::to_string(i)) << "x";
    ASSERT_LT(i, 1000);
  }
  EXPECT_FALSE((*store)->Put(id(9), std::string(100, 'n')));
  EXPECT_EQ((*store)->stats().blocks, 3u);
  EXPECT_EQ((*store)->Get(id(0)), std::string(100, 'b'));
}

TEST(BlockStore, ABlockThatCannotFitEvictsNothing) {
  SmallTmpfs tmpfs;
  ASSERT_TRUE(tmpfs.mounted) << std::strerror(errno);
  const std::string& dir = tmpfs.dir;
  BlockStoreOptions o = StoreOn(tmpfs);
  const std::string data(kMiB, 'x');
  auto id = [](int i) { return BlockIndex::KeyHex(K(i)); };
  {
    auto first = BlockStore::Open(o);
    ASSERT_OK(first);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*first)->Put(id(i), data)) << i;
    (*first)->Close();
  }
  // Evicting all three (1 MiB and a page each) gives back less than a fourth needs here.
  o.min_free = FreeOn(dir) + 2 * (kMiB + 4096) + 4096;
  auto opened = BlockStore::Open(o);
  ASSERT_OK(opened);
  ASSERT_EQ((*opened)->stats().blocks, 3u);
  EXPECT_FALSE((*opened)->Put(id(9), data));
  EXPECT_EQ((*opened)->stats().blocks, 3u);
}

// An evicted block a reader still holds open keeps its disk space until the reader closes it:
// Put does not count it as room, so the free-space floor holds (on a small tmpfs, whose free
// space is exact). Once the readers close, the same block fits.
TEST(BlockStore, BlocksHeldOpenAreNotCountedAsRoomWhenEvicted) {
  SmallTmpfs tmpfs;
  ASSERT_TRUE(tmpfs.mounted) << std::strerror(errno);
  const std::string& dir = tmpfs.dir;
  BlockStoreOptions o = StoreOn(tmpfs);
  {
    auto probe = BlockStore::Open(o);  // makes the block directories before the floor is set
    ASSERT_OK(probe);
  }
  // Room for three blocks of 1 MiB (each takes 1 MiB and a page with its header), not four.
  o.min_free = FreeOn(dir) - 3 * kMiB - 3 * 4096 - 2048;
  auto opened = BlockStore::Open(o);
  ASSERT_OK(opened);
  BlockStore& store = **opened;
  const std::string data(kMiB, 'x');
  auto id = [](int i) { return BlockIndex::KeyHex(K(i)); };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.Put(id(i), data)) << i;  // the 4th evicts one
  EXPECT_EQ(store.stats().blocks, 3u);
  std::vector<BlockStore::OpenBlock> held;
  for (int i = 0; i < 4; ++i) {
    auto b = store.OpenVerified(id(i), kMiB);
    if (b.fd() >= 0) held.push_back(std::move(b));
  }
  ASSERT_EQ(held.size(), 3u);
  // Every block it could evict is open: no room, the floor kept, and nothing evicted for it
  // (before, all three were, the hottest blocks: those being sent).
  EXPECT_FALSE(store.Put(id(9), data));
  EXPECT_GE(FreeOn(dir), o.min_free);
  EXPECT_EQ(store.stats().blocks, 3u);
  // The readers are done with them: their space is back.
  held.clear();
  EXPECT_TRUE(store.Put(id(9), data));
  EXPECT_GE(FreeOn(dir), o.min_free);
  EXPECT_EQ(store.stats().blocks, 3u);  // one evicted for it
}

TEST(BlockIndex, LruEvictsTheLeastRecentlyUsed) {
  BlockIndex idx(EvictionPolicy::kLru, 3);
  for (int i = 0; i < 3; ++i) idx.Insert(K(i), 1);
  EXPECT_TRUE(idx.Touch(K(0)));
  EXPECT_EQ(idx.Evict(), K(1));
  EXPECT_EQ(idx.Evict(), K(2));
  EXPECT_TRUE(idx.Remove(K(0)));
  EXPECT_FALSE(idx.Remove(K(0)));
  EXPECT_EQ(idx.Evict(), std::nullopt);
  EXPECT_EQ(idx.bytes(), 0u);
}

// A block read again keeps its place while a scan of blocks read once passes through: under
// S3-FIFO the scan leaves by the small queue; under LRU it flushes the hot block.
TEST(BlockIndex, S3FifoKeepsAHotBlockThroughAScan) {
  for (auto policy : {EvictionPolicy::kS3Fifo, EvictionPolicy::kLru}) {
    BlockIndex idx(policy, 20);
    auto access = [&](int i) {
      if (idx.Touch(K(i))) return true;
      while (idx.bytes() + 1 > 20) idx.Evict();
      idx.Insert(K(i), 1);
      return false;
    };
    for (int h = 0; h < 5; ++h) access(h), access(h);  // five hot blocks, read twice
    int hot_hits = 0, scan = 100;
    for (int round = 0; round < 10; ++round) {
      for (int i = 0; i < 25; ++i) access(scan++);  // read once, never again
      for (int h = 0; h < 5; ++h) hot_hits += access(h);
    }
    EXPECT_LE(idx.bytes(), 20u);
    EXPECT_EQ(hot_hits, policy == EvictionPolicy::kS3Fifo ? 50 : 0);
  }
  // A loop one block larger than the cache: LRU misses every time, S3-FIFO keeps most.
  for (auto policy : {EvictionPolicy::kS3Fifo, EvictionPolicy::kLru}) {
    BlockIndex idx(policy, 10);
    int hits = 0;
    for (int lap = 0; lap < 5; ++lap)
      for (int i = 0; i < 11; ++i) {
        if (idx.Touch(K(i))) {
          hits += lap > 0;
          continue;
        }
        while (idx.bytes() + 1 > 10) idx.Evict();
        idx.Insert(K(i), 1);
      }
    if (policy == EvictionPolicy::kLru)
      EXPECT_EQ(hits, 0);
    else
      EXPECT_GT(hits, 20);
  }
}

TEST(BlockIndex, AGhostHitEntersTheMainQueue) {
  BlockIndex idx(EvictionPolicy::kS3Fifo, 10);
  for (int i = 0; i < 10; ++i) idx.Insert(K(i), 1);
  EXPECT_EQ(idx.Evict(), K(0));  // read once: out of the small queue, into the ghost list
  idx.Insert(K(0), 1);           // missed again: straight into the main queue
  for (int i = 1; i < 10; ++i) EXPECT_EQ(idx.Evict(), K(i));
  EXPECT_EQ(idx.Evict(), K(0));
  EXPECT_EQ(BlockIndex::ParseKey("xyz"), std::nullopt);
  EXPECT_EQ(BlockIndex::ParseKey(std::string(64, 'A')), std::nullopt);  // lower-case only
  EXPECT_EQ(BlockIndex::KeyHex(K(7)), fmt::format("{:064x}", 7 * 0x9e3779b97f4a7c15ULL));
}

// The ghost list of tiny blocks is bounded by entries too, not only by their bytes (before,
// 100-byte objects under a 10 GiB limit kept one ghost per block ever evicted).
TEST(BlockIndex, TheGhostListOfTinyBlocksIsBounded) {
  BlockIndex idx(EvictionPolicy::kS3Fifo, 10ULL << 30);
  for (int i = 0; i < 50000; ++i) {
    idx.Insert(K(i), 1);
    if (idx.blocks() > 1000) (void)idx.Evict();
  }
  EXPECT_LE(idx.ghosts(), 4096u);
  EXPECT_GT(idx.ghosts(), 0u);
}

// A block missed, admitted, then missed once more is remembered as a first miss even when its
// older entry in the miss list ages out (before, that entry took the newer miss with it).
TEST(MissFilter, AnAgedOutMissLeavesANewerOneOfTheSameBlock) {
  auto key = [](uint64_t i) {  // the filter keys on bytes 8..16
    return *BlockIndex::ParseKey(
        fmt::format("{:016x}{:016x}{:032x}", 0, i * 0x9e3779b97f4a7c15ULL, 0));
  };
  MissFilter f(2);
  EXPECT_FALSE(f.SecondMiss(key(1)));
  EXPECT_FALSE(f.SecondMiss(key(2)));
  EXPECT_TRUE(f.SecondMiss(key(1)));   // admitted
  EXPECT_FALSE(f.SecondMiss(key(1)));  // a first miss again; its old entry ages out here
  EXPECT_TRUE(f.SecondMiss(key(1)));
  EXPECT_FALSE(f.SecondMiss(key(3)));
  EXPECT_FALSE(f.SecondMiss(key(4)));
  EXPECT_FALSE(f.SecondMiss(key(5)));
  EXPECT_FALSE(f.SecondMiss(key(3)));  // aged out: two other misses since
}

TEST(CacheOptions, ParsesAndRefuses) {
  auto o = CacheOptions::FromJson("v", {{"path", "/c"},
                                        {"max-size", "2g"},
                                        {"block-size", "8m"},
                                        {"ttl", "30s"},
                                        {"admission", "second-miss"},
                                        {"serve-stale", false}});
  ASSERT_OK(o);
  EXPECT_EQ(o->max_size, 2ULL << 30);
  EXPECT_EQ(o->block_size, 8ULL << 20);
  EXPECT_EQ(o->ttl, std::chrono::seconds(30));
  EXPECT_TRUE(o->second_miss);
  EXPECT_FALSE(o->serve_stale);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"max-size", "1g"}}), Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"admission", "lru"}}),
               Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"block-size", "1k"}}),
               Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"size", "1g"}}),
               Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"ttl", "1000000000000d"}}),
               Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"read-ahead", "65"}}),
               Code::kInvalidArgument);
  EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"eviction", "arc"}}),
               Code::kInvalidArgument);
  EXPECT_EQ(CacheOptions::FromJson("v", {{"path", "/c"}, {"max-listing", 500}})->max_listing, 500u);
  EXPECT_EQ(CacheOptions::FromJson("v", {{"path", "/c"}, {"max-listing", "7"}})->max_listing, 7u);
  for (const nlohmann::json& bad : {nlohmann::json(0), nlohmann::json(-3), nlohmann::json("1e3"),
                                    nlohmann::json("-1"), nlohmann::json(1ULL << 40)})
    EXPECT_ERROR(CacheOptions::FromJson("v", {{"path", "/c"}, {"max-listing", bad}}),
                 Code::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::test
