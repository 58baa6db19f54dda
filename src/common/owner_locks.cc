#include "common/owner_locks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/dir_reader.h"
#include "common/secrets.h"

namespace sluice {

Result<std::unique_ptr<OwnerLocks>> OwnerLocks::Open(std::string dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::FromErrno(errno, fmt::format("create '{}'", dir));
  std::string self = RandomHexString(16);
  std::string file = dir + "/" + self;
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("create '{}'", file));
  UniqueFd lock(fd);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::FromErrno(errno, fmt::format("lock '{}'", file));
  return std::unique_ptr<OwnerLocks>(
      new OwnerLocks(std::move(dir), std::move(self), std::move(lock)));
}

OwnerLocks::~OwnerLocks() {
  ::unlink((dir_ + "/" + self_).c_str());
}

std::vector<std::string> OwnerLocks::Others() const {
  std::vector<std::string> out;
  int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return out;
  UniqueFd dir(fd);
  auto entries = ReadDirEntries(dir.get(), dir_);
  if (!entries.ok()) return out;
  for (auto& e : *entries)
    if (e.name != self_) out.push_back(std::move(e.name));
  return out;
}

Result<std::optional<OwnerLocks::Claim>> OwnerLocks::ClaimIfGone(const std::string& id) const {
  Claim c;
  if (id.empty()) return std::optional<Claim>(std::move(c));  // records from before owners
  c.file = dir_ + "/" + id;
  int fd = ::open(c.file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<Claim>(std::move(c));  // closed cleanly, or swept
    spdlog::warn("cannot check owner '{}': {}", c.file, std::strerror(errno));
    return std::optional<Claim>();
  }
  c.fd.reset(fd);
  if (::flock(c.fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return std::optional<Claim>();  // alive
    return Status::FromErrno(errno, fmt::format("lock '{}'", c.file));
  }
  return std::optional<Claim>(std::move(c));
}

void OwnerLocks::Claim::Done() {
  if (fd.valid()) ::unlink(file.c_str());
  fd.reset();
}

Result<UniqueFd> LockFileExclusive(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("lock '{}'", path));
  UniqueFd lock(fd);
  if (::flock(lock.get(), LOCK_EX) != 0)
    return Status::FromErrno(errno, fmt::format("lock '{}'", path));
  return lock;
}

Status MoveDatabaseAside(const std::string& path, const std::string& aside) {
  if (std::rename(path.c_str(), aside.c_str()) != 0)
    return Status::FromErrno(errno, fmt::format("move '{}' aside", path));
  std::rename((path + "-wal").c_str(), (aside + "-wal").c_str());  // it goes with its file
  std::remove((path + "-shm").c_str());
  return Status::Ok();
}

}  // namespace sluice
