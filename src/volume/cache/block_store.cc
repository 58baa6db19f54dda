#include "volume/cache/block_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/checksum.h"
#include "common/fd.h"
#include "common/fs_util.h"
#include "common/secrets.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[4] = {'S', 'L', 'C', 'B'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = BlockStore::kDataOffset;  // magic, version, length (u64), CRC32C
                                                     // (u32); little-endian

// The keys Close() recorded as checked, if the last process closed the store cleanly; the
// record is removed (and the removal made durable) before anything else happens.
std::set<BlockIndex::Key> TakeCleanRecord(const std::string& dir) {
  std::set<BlockIndex::Key> keys;
  const std::string path = fmt::format("{}/{}", dir, BlockStore::kCleanRecord);
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return keys;
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Gone for good before it is believed, or not believed at all.
  if (::unlink(path.c_str()) != 0 || !SyncDir(dir).ok()) {
    spdlog::warn(
        "cache {}: the record of its clean close could not be removed: every block is "
        "checked",
        dir);
    return keys;
  }
  // "SLCC", the count (u64), the keys, the CRC32C of all that (u32).
  uint64_t n = 0;
  if (text.size() < 16 || text.compare(0, 4, "SLCC") != 0) return keys;
  std::memcpy(&n, text.data() + 4, 8);
  if (n > (text.size() - 16) / 32 || text.size() != 12 + 32 * n + 4) return keys;
  uint32_t crc;
  std::memcpy(&crc, text.data() + text.size() - 4, 4);
  if (Crc32c(text.data(), text.size() - 4) != crc) {
    spdlog::warn("cache {}: the record of its clean close is damaged: every block is checked", dir);
    return keys;
  }
  for (uint64_t i = 0; i < n; ++i) {
    BlockIndex::Key k;
    std::memcpy(k.data(), text.data() + 12 + 32 * i, 32);
    keys.insert(k);
  }
  return keys;
}

}  // namespace

Result<std::unique_ptr<BlockStore>> BlockStore::Open(BlockStoreOptions opts) {
  std::error_code ec;
  fs::create_directories(fs::path(opts.dir) / "tmp", ec);
  if (ec)
    return Status(Code::kIoError, fmt::format("cache directory '{}': {}", opts.dir, ec.message()));
  // One cache per directory: a second (another sluiced, or two volumes of one config given the
  // same path) would empty tmp/ under the first's writes, evict its blocks as its own and
  // interleave its journal lines. The lock goes with the process, also at a crash.
  UniqueFd lock(::open(fmt::format("{}/{}", opts.dir, kLockFile).c_str(),
                       O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.get() < 0)
    return Status::FromErrno(errno, fmt::format("cache directory '{}'", opts.dir));
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return errno == EWOULDBLOCK
               ? Status(Code::kConflict,
                        fmt::format("cache directory '{}' is in use by another cache (another "
                                    "sluiced, or another volume configured with the same path)",
                                    opts.dir))
               : Status::FromErrno(errno, fmt::format("cache directory '{}': lock", opts.dir));
  // What a crash left half-written is never a block.
  for (auto& e : fs::directory_iterator(fs::path(opts.dir) / "tmp", ec))
    fs::remove_all(e.path(), ec);
  // The 256 block directories, made once here rather than checked at every write.
  for (int i = 0; i < 256; ++i) {
    fs::create_directories(fs::path(opts.dir) / fmt::format("{:02x}", i), ec);
    if (ec)
      return Status(Code::kIoError,
                    fmt::format("cache directory '{}': {}", opts.dir, ec.message()));
  }
  std::unique_ptr<BlockStore> s(new BlockStore(std::move(opts)));
  s->lock_fd_ = std::move(lock);
  s->dir_fd_ = UniqueFd(::open(s->opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::set<BlockIndex::Key> trusted = TakeCleanRecord(s->opts_.dir);
  struct Found {
    std::string id;
    uint64_t size;
    int64_t mtime;
  };
  std::vector<Found> found;
  for (auto& sub : fs::directory_iterator(s->opts_.dir, ec)) {
    // Blocks are in "<id[0:2]>/"; "tmp/" and "meta/" (CachedVolume's attributes) are not.
    const std::string name = sub.path().filename().string();
    if (!sub.is_directory() || name.size() != 2 || !std::isxdigit(name[0]) ||
        !std::isxdigit(name[1]))
      continue;
    for (auto& f : fs::directory_iterator(sub.path(), ec)) {
      std::string id = f.path().filename().string();
      struct stat st;
      if (!BlockIndex::ParseKey(id) || ::stat(f.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) < kHeader)
        continue;
      found.push_back({id, static_cast<uint64_t>(st.st_size) - kHeader, st.st_mtim.tv_sec});
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::vector<BlockIndex::Key> gone;
  {
    std::lock_guard lk(s->mu_);
    for (const auto& f : found) {  // the newest ends first
      const auto k = *BlockIndex::ParseKey(f.id);
      s->index_.Insert(k, f.size, /*warm=*/true, /*verified=*/trusted.count(k) != 0);
    }
    while (s->index_.bytes() > s->opts_.max_bytes)
      if (auto k = s->EvictOne()) gone.push_back(*k);
  }
  s->Unlink(gone);
  return s;
}

std::string BlockStore::PathOf(const std::string& id) const {
  return fmt::format("{}/{}/{}", opts_.dir, id.substr(0, 2), id);
}

void BlockStore::Drop(const BlockIndex::Key& k) {
  index_.Remove(k);
  ::unlink(PathOf(k).c_str());
}

std::optional<BlockIndex::Key> BlockStore::EvictOne(uint64_t* size) {
  auto k = index_.Evict(size);
  if (k) {
    stats_.evictions += 1;
    unlinking_.insert(*k);
  }
  return k;
}

void BlockStore::Unlink(const std::vector<BlockIndex::Key>& keys) {
  if (keys.empty()) return;
  for (const auto& k : keys) ::unlink(PathOf(k).c_str());
  std::lock_guard lk(mu_);
  for (const auto& k : keys) unlinking_.erase(k);
}

bool BlockStore::Evict(const std::string& id) {
  auto k = BlockIndex::ParseKey(id);
  if (!k) return false;
  {
    std::lock_guard lk(mu_);
    if (!index_.Remove(*k)) return false;
    stats_.evictions += 1;
    unlinking_.insert(*k);
  }
  Unlink({*k});
  return true;
}

uint64_t BlockStore::EvictAll() {
  std::vector<BlockIndex::Key> gone;
  {
    std::lock_guard lk(mu_);
    while (auto k = EvictOne()) gone.push_back(*k);
  }
  Unlink(gone);  // outside the lock: event loops take it (OpenVerified)
  return gone.size();
}

std::optional<uint64_t> BlockStore::FreeBytes() const {
  struct statvfs sv;
  if (::statvfs(opts_.dir.c_str(), &sv) != 0) return std::nullopt;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

std::optional<BlockStore::Inodes> BlockStore::FreeInodes() const {
  struct statvfs sv;
  // (btrfs and others allocate inodes as they go, and report none: no limit to keep.)
  if (::statvfs(opts_.dir.c_str(), &sv) != 0 || sv.f_files == 0) return std::nullopt;
  return Inodes{static_cast<uint64_t>(sv.f_favail),
                std::min<uint64_t>(kMinFreeInodes, sv.f_files / 100)};
}

std::optional<std::string> BlockStore::Get(const std::string& id) {
  auto key = BlockIndex::ParseKey(id);
  if (!key) return std::nullopt;
  {
    std::lock_guard lk(mu_);
    if (!index_.Touch(*key)) return std::nullopt;
  }
  UniqueFd fd(::open(PathOf(id).c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno != ENOENT) {
    // Out of descriptors, say: a miss this time, not a torn block.
    spdlog::warn("cache {}: block {}: {}", opts_.dir, id, std::strerror(errno));
    return std::nullopt;
  }
  if (fd.get() < 0) {
    // Evicted since it was looked up (or removed behind the store's back): a miss, not a torn
    // block; dropped only while still indexed with no file, never a newer copy's entry.
    struct stat st;
    const bool gone = ::stat(PathOf(id).c_str(), &st) != 0;  // (not under the lock)
    std::lock_guard lk(mu_);
    if (gone && !unlinking_.count(*key) && index_.Contains(*key)) index_.Remove(*key);
    return std::nullopt;
  }
  std::string data;
  bool good = false;
  struct stat st;
  char head[kHeader];
  if (fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 &&
      static_cast<uint64_t>(st.st_size) >= kHeader &&
      ::pread(fd.get(), head, kHeader, 0) == static_cast<ssize_t>(kHeader)) {
    uint32_t version, crc;
    uint64_t len;
    std::memcpy(&version, head + 4, 4);
    std::memcpy(&len, head + 8, 8);
    std::memcpy(&crc, head + 16, 4);
    if (std::memcmp(head, kMagic, 4) == 0 && version == kVersion &&
        len == static_cast<uint64_t>(st.st_size) - kHeader) {
      data.resize(static_cast<size_t>(len));  // read straight into the answer
      size_t got = 0;
      while (got < data.size()) {
        ssize_t n = ::pread(fd.get(), data.data() + got, data.size() - got,
                            static_cast<off_t>(kHeader + got));
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      good = got == data.size() && Crc32c(data.data(), data.size()) == crc;
    }
  }
  if (good) {
    std::lock_guard lk(mu_);
    index_.SetVerified(*key);
    return data;
  }
  spdlog::warn("cache {}: block {} is torn or unreadable: dropped", opts_.dir, id);
  std::lock_guard lk(mu_);
  Drop(*key);
  stats_.torn += 1;
  return std::nullopt;
}

bool BlockStore::Has(const std::string& id) const {
  auto key = BlockIndex::ParseKey(id);
  std::lock_guard lk(mu_);
  return key && index_.Contains(*key);
}

void BlockPins::Pin(const BlockIndex::Key& k) {
  std::lock_guard lk(mu_);
  ++held_[k];
}

void BlockPins::Unpin(const BlockIndex::Key& k) {
  std::lock_guard lk(mu_);
  auto it = held_.find(k);
  if (it != held_.end() && --it->second == 0) held_.erase(it);
}

bool BlockPins::Held(const BlockIndex::Key& k) const {
  std::lock_guard lk(mu_);
  return held_.count(k) != 0;
}

std::vector<BlockIndex::Key> BlockPins::HeldKeys() const {
  std::lock_guard lk(mu_);
  std::vector<BlockIndex::Key> out;
  out.reserve(held_.size());
  for (const auto& [k, n] : held_) out.push_back(k);
  return out;
}

BlockStore::OpenBlock& BlockStore::OpenBlock::operator=(OpenBlock&& o) noexcept {
  if (this != &o) {
    Close();
    pins_ = std::move(o.pins_);
    key_ = o.key_;
    fd_ = std::move(o.fd_);
  }
  return *this;
}

void BlockStore::OpenBlock::Close() {
  fd_.reset();  // the space goes back with the last descriptor: closed before it is counted
  if (auto p = std::move(pins_)) p->Unpin(key_);
}

BlockStore::OpenBlock BlockStore::OpenVerified(const std::string& id, uint64_t len) {
  OpenBlock b;
  auto key = BlockIndex::ParseKey(id);
  if (!key) return b;
  {
    std::lock_guard lk(mu_);
    if (!index_.Verified(*key)) return b;
    index_.Touch(*key);
    // Pinned before it is opened: an eviction from now on sees it held.
    pins_->Pin(*key);
  }
  b.pins_ = pins_;
  b.key_ = *key;
  b.fd_ = UniqueFd(::open(PathOf(id).c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (b.fd() < 0 || ::fstat(b.fd(), &st) != 0 || static_cast<uint64_t>(st.st_size) != kHeader + len)
    b.Close();  // evicted meanwhile, or not this block: Get() decides
  return b;
}

namespace {

// All of `head` then `data` to `fd`.
bool WriteAll(int fd, const char* head, std::string_view data) {
  std::array<iovec, 2> iov{iovec{const_cast<char*>(head), kHeader},
                           iovec{const_cast<char*>(data.data()), data.size()}};
  size_t left = kHeader + data.size();
  int first = 0;
  while (left > 0) {
    ssize_t n = ::writev(fd, iov.data() + first, 2 - first);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    left -= static_cast<size_t>(n);
    for (size_t k = static_cast<size_t>(n); k > 0 && first < 2;) {
      const size_t take = std::min(k, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      k -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return true;
}

}  // namespace

BlockStore::Written BlockStore::WriteBlock(const std::string& id, const char* head,
                                           std::string_view data) {
  const std::string path = PathOf(id);
  // An unnamed file in the block's own directory, named once written: no temporary name, no
  // rename across directories (whose locks writers in parallel would queue on).
  const std::string dir = fmt::format("{}/{}", opts_.dir, id.substr(0, 2));
  UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
  if (fd.get() >= 0) {
    if (!WriteAll(fd.get(), head, data)) return Written::kFailed;
    const std::string self = fmt::format("/proc/self/fd/{}", fd.get());
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0)
      return Written::kNew;
    // The same block, there already: its file is whoever wrote it, checked when first read.
    if (errno == EEXIST) return Written::kThere;
    // No /proc to name it through: the way below.
  }
  // Without O_TMPFILE (or /proc): a temporary name under tmp/, renamed into place.
  const std::string tmp = fmt::format("{}/tmp/{}", opts_.dir, RandomHexString(8));
  bool ok = false;
  {
    UniqueFd t(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    ok = t.get() >= 0 && WriteAll(t.get(), head, data);
  }
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
  return ok ? Written::kNew : Written::kFailed;
}

void BlockStore::Close() {
  {
    std::unique_lock lk(mu_);
    closed_ = true;
  }
  // Blocks being written finish first (Put refuses new ones now); the keys are taken before
  // the sync, so that every block they name is on the disk after it.
  std::string text = "SLCC";
  for (int i = 0;; ++i) {
    {
      std::lock_guard lk(mu_);
      if (reserved_ == 0) {
        const auto keys = index_.VerifiedKeys();
        const uint64_t n = keys.size();
        text.append(reinterpret_cast<const char*>(&n), 8);
        for (const auto& k : keys) text.append(reinterpret_cast<const char*>(k.data()), k.size());
        break;
      }
    }
    if (i == 1000) return;  // a write still running after 10 s: nothing is trusted
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int d = dir_fd_.get();
  if (d < 0 || ::syncfs(d) != 0) {
    spdlog::warn("cache {}: syncfs: {}; its blocks are checked at the next start", opts_.dir,
                 std::strerror(errno));
    return;
  }
  const uint32_t crc = Crc32c(text.data(), text.size());
  text.append(reinterpret_cast<const char*>(&crc), 4);
  Status st = WriteFileAtomic(fmt::format("{}/{}", opts_.dir, kCleanRecord), text);
  if (st.ok() && ::fsync(d) != 0) st = Status::FromErrno(errno, "fsync of the cache directory");
  if (!st.ok())
    spdlog::warn("cache {}: the record of its clean close: {}", opts_.dir, st.message());
}

bool BlockStore::HasRoom(uint64_t bytes) const {
  const auto free = FreeBytes();
  std::lock_guard lk(mu_);
  return free && *free >= opts_.min_free + reserved_disk_ + DiskBytes(bytes);
}

bool BlockStore::Put(const std::string& id, std::string_view data) {
  auto key = BlockIndex::ParseKey(id);
  if (!key) return false;
  const uint64_t need = DiskBytes(kHeader + data.size());
  // The disk's free space, and how much more the blocks evicted below give back (they are
  // unlinked after the lock is released: event loops take it). Sampled outside the lock, so
  // the blocks other writers finished since are taken off it: their reservations are gone,
  // and the sample may predate their bytes.
  const uint64_t written_before = written_disk_;
  auto free = FreeBytes();
  const auto inodes = FreeInodes();
  std::vector<BlockIndex::Key> gone;
  bool room;
  {
    std::lock_guard lk(mu_);
    if (closed_) return false;
    if (free) {
      const uint64_t since = written_disk_ - written_before;
      *free = *free > since ? *free - since : 0;
    }
    if (index_.Touch(*key)) return true;
    // Its old file is being unlinked: not stored this time (the reader has the bytes).
    if (unlinking_.count(*key)) {
      stats_.rejected += 1;
      return false;
    }
    // Room first: within the size limit, and never the disk below its free-space floor,
    // counting the blocks other writers are writing now. Nothing is evicted for a block that
    // can never fit, or when the disk's free space is unknown.
    uint64_t freed = 0, freed_files = 0;
    auto over = [&] { return index_.bytes() + reserved_ + data.size() > opts_.max_bytes; };
    auto low = [&] { return *free + freed < opts_.min_free + reserved_disk_ + need; };
    // Out of inodes with bytes to spare (millions of small objects): every block is a file,
    // so each one evicted gives one back (before 2026-12-06 each new block failed to open
    // and was refused, the cache frozen as it was).
    // (Counting the blocks other writers are making now, as for bytes.)
    auto few_files = [&] {
      return inodes && inodes->free + freed_files <= inodes->floor + reserved_files_;
    };
    // Possible at all: within max-size with everything else evicted, and the floor kept with
    // every block's disk space back, counted at least (each block takes its header and data
    // rounded up to 4 KiB pages: at least one page, at least its bytes). An estimate above
    // what eviction gives back evicted the whole cache and then refused the block anyway.
    // Blocks readers hold open give nothing back when evicted (until they close): not room.
    uint64_t held_bytes = 0, held_blocks = 0;
    for (const auto& k : pins_->HeldKeys())
      if (auto size = index_.SizeOf(k)) {
        held_bytes += *size;
        held_blocks++;
      }
    const uint64_t blocks = index_.blocks() - held_blocks;
    const uint64_t evictable =
        std::max(index_.bytes() - held_bytes + blocks * kHeader, blocks * 4096);
    // And the inode floor kept with every block's file back (before 2026-12-07 a disk whose
    // other files took the inodes had the whole cache evicted, then the block refused).
    room = free && data.size() + reserved_ <= opts_.max_bytes &&
           opts_.min_free + reserved_disk_ + need <= *free + evictable &&
           (!inodes || inodes->free + blocks > inodes->floor + reserved_files_);
    while (room && (over() || low() || few_files())) {
      uint64_t size = 0;
      auto k = EvictOne(&size);
      if (!k) break;
      // A block a reader holds open keeps its space until the reader closes it.
      if (!pins_->Held(*k)) {
        freed += DiskBytes(kHeader + size);
        freed_files++;
      }
      gone.push_back(*k);
    }
    room = room && !over() && !low() && !few_files();
    if (room) {
      reserved_ += data.size();
      reserved_disk_ += need;
      reserved_files_ += 1;
    } else {
      stats_.rejected += 1;
    }
  }
  Unlink(gone);
  if (!room) return false;
  char head[kHeader];
  std::memcpy(head, kMagic, 4);
  const uint32_t version = kVersion, crc = Crc32c(data.data(), data.size());
  const uint64_t len = data.size();
  std::memcpy(head + 4, &version, 4);
  std::memcpy(head + 8, &len, 8);
  std::memcpy(head + 16, &crc, 4);
  // No fsync: a block a crash tears fails its checksum and is fetched again.
  const Written w = WriteBlock(id, head, data);
  std::lock_guard lk(mu_);
  reserved_ -= data.size();
  reserved_disk_ -= need;
  reserved_files_ -= 1;
  written_disk_ += need;
  if (w == Written::kFailed) {
    stats_.rejected += 1;
    return false;
  }
  // The file found there (another Put's) may be one evicted meanwhile, about to be unlinked.
  if (w == Written::kThere && unlinking_.count(*key)) {
    stats_.rejected += 1;
    return false;
  }
  if (index_.Contains(*key)) return true;  // the other Put indexed it
  index_.Insert(*key, data.size(), /*warm=*/false, /*verified=*/w == Written::kNew);
  stats_.filled_bytes += data.size();
  return true;
}

BlockStore::Stats BlockStore::stats() const {
  std::lock_guard lk(mu_);
  Stats s = stats_;
  s.blocks = index_.blocks();
  s.bytes = index_.bytes();
  return s;
}

}  // namespace sluice
