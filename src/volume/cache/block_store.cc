#include "volume/cache/block_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/checksum.h"
#include "common/fd.h"
#include "common/secrets.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[4] = {'S', 'L', 'C', 'B'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 20;  // magic, version, length (u64), CRC32C (u32); little-endian

bool IsId(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

Result<std::unique_ptr<BlockStore>> BlockStore::Open(BlockStoreOptions opts) {
  std::error_code ec;
  fs::create_directories(fs::path(opts.dir) / "tmp", ec);
  if (ec)
    return Status(Code::kIoError, fmt::format("cache directory '{}': {}", opts.dir, ec.message()));
  // What a crash left half-written is never a block.
  for (auto& e : fs::directory_iterator(fs::path(opts.dir) / "tmp", ec)) fs::remove(e.path(), ec);
  std::unique_ptr<BlockStore> s(new BlockStore(std::move(opts)));
  struct Found {
    std::string id;
    uint64_t size;
    int64_t mtime;
  };
  std::vector<Found> found;
  for (auto& sub : fs::directory_iterator(s->opts_.dir, ec)) {
    if (!sub.is_directory() || sub.path().filename() == "tmp") continue;
    for (auto& f : fs::directory_iterator(sub.path(), ec)) {
      std::string id = f.path().filename().string();
      struct stat st;
      if (!IsId(id) || ::stat(f.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) < kHeader)
        continue;
      found.push_back({id, static_cast<uint64_t>(st.st_size) - kHeader, st.st_mtim.tv_sec});
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard lk(s->mu_);
  for (const auto& f : found) s->Index(f.id, f.size);  // the newest ends first
  while (s->stats_.bytes > s->opts_.max_bytes && !s->lru_.empty()) s->EvictOne();
  return s;
}

std::string BlockStore::PathOf(const std::string& id) const {
  return fmt::format("{}/{}/{}", opts_.dir, id.substr(0, 2), id);
}

void BlockStore::Index(const std::string& id, uint64_t size) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.at);
    return;
  }
  lru_.push_front(id);
  index_[id] = {size, lru_.begin()};
  stats_.bytes += size;
  stats_.blocks += 1;
}

void BlockStore::Drop(const std::string& id) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    stats_.bytes -= it->second.size;
    stats_.blocks -= 1;
    lru_.erase(it->second.at);
    index_.erase(it);
  }
  ::unlink(PathOf(id).c_str());
}

void BlockStore::EvictOne() {
  Drop(std::string(lru_.back()));  // a copy: Drop erases the list node the name is in
  stats_.evictions += 1;
}

uint64_t BlockStore::FreeBytes() const {
  struct statvfs sv;
  if (::statvfs(opts_.dir.c_str(), &sv) != 0) return 0;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

std::optional<std::string> BlockStore::Get(const std::string& id) {
  {
    std::lock_guard lk(mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return std::nullopt;
    lru_.splice(lru_.begin(), lru_, it->second.at);
  }
  UniqueFd fd(::open(PathOf(id).c_str(), O_RDONLY | O_CLOEXEC));
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
  if (good) return data;
  spdlog::warn("cache {}: block {} is torn or unreadable: dropped", opts_.dir, id);
  std::lock_guard lk(mu_);
  Drop(id);
  stats_.torn += 1;
  return std::nullopt;
}

bool BlockStore::Put(const std::string& id, std::string_view data) {
  if (!IsId(id)) return false;
  {
    std::lock_guard lk(mu_);
    if (index_.count(id)) {
      Index(id, data.size());
      return true;
    }
    // Room first: within the size limit, and never the disk below its free-space floor.
    while (!lru_.empty() && stats_.bytes + data.size() > opts_.max_bytes) EvictOne();
    while (!lru_.empty() && FreeBytes() < opts_.min_free + data.size() + kHeader) EvictOne();
    if (data.size() > opts_.max_bytes || FreeBytes() < opts_.min_free + data.size() + kHeader) {
      stats_.rejected += 1;
      return false;
    }
  }
  char head[kHeader];
  std::memcpy(head, kMagic, 4);
  const uint32_t version = kVersion, crc = Crc32c(data.data(), data.size());
  const uint64_t len = data.size();
  std::memcpy(head + 4, &version, 4);
  std::memcpy(head + 8, &len, 8);
  std::memcpy(head + 16, &crc, 4);
  const std::string tmp = fmt::format("{}/tmp/{}", opts_.dir, RandomHexString(8));
  bool ok = false;
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() >= 0) {
      ok = ::write(fd.get(), head, kHeader) == static_cast<ssize_t>(kHeader);
      size_t done = 0;
      while (ok && done < data.size()) {
        ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
        ok = n > 0;
        if (ok) done += static_cast<size_t>(n);
      }
    }
  }
  std::error_code ec;
  if (ok) fs::create_directories(fmt::format("{}/{}", opts_.dir, id.substr(0, 2)), ec);
  // No fsync: a block a crash tears fails its checksum and is fetched again.
  ok = ok && ::rename(tmp.c_str(), PathOf(id).c_str()) == 0;
  if (!ok) {
    ::unlink(tmp.c_str());
    std::lock_guard lk(mu_);
    stats_.rejected += 1;
    return false;
  }
  std::lock_guard lk(mu_);
  Index(id, data.size());
  return true;
}

BlockStore::Stats BlockStore::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace sluice
