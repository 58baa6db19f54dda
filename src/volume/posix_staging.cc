#include "volume/posix_staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/dir_reader.h"
#include "common/fs_util.h"
#include "common/json.h"
#include "common/path.h"
#include "common/secrets.h"
#include "volume/posix_files.h"

namespace sluice {

namespace {

constexpr const char* kRecordSuffix = ".offset";
constexpr const char* kSpareSuffix = ".offset.tmp";  // the spare record (WriteRecordAtomic)
constexpr size_t kRecordSize = 64;  // fixed, so records overwrite each other in place

Status NoStaging(const std::string& session) {
  return Status(Code::kNotFound, fmt::format("upload session {} has no staging file", session));
}

struct Record {
  uint64_t offset = 0;
  bool quota_checked = false;
};

// Opens a record file only if it is a regular one. `.upload` lies in the vfolder, which its
// users write: a FIFO made there would hold a plain open until someone opened its other end
// (a thread of the pool per request, and the janitor's sweep, for good). O_NONBLOCK makes
// such an open return at once; it changes nothing for a regular file.
Result<UniqueFd> OpenRecordFile(int updir, const std::string& name, int flags,
                                std::string_view what) {
  int fd = ::openat(updir, name.c_str(), flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, std::string(what));
  UniqueFd f(fd);
  struct stat sb;
  if (::fstat(f.get(), &sb) != 0) return Status::FromErrno(errno, std::string(what));
  if (!S_ISREG(sb.st_mode))
    return Status(Code::kIoError, fmt::format("{}: '{}' is not a regular file", what, name));
  return f;
}

// The record of `session`, or nullopt when there is none.
Result<std::optional<Record>> ReadRecord(int updir, const std::string& session) {
  std::string name = session + kRecordSuffix;
  auto opened = OpenRecordFile(updir, name, O_RDONLY,
                               fmt::format("read upload offset of session {}", session));
  if (!opened.ok()) {
    if (opened.status().sys_errno() == ENOENT) return std::optional<Record>();
    return opened.status();
  }
  UniqueFd f = std::move(opened).value();
  char buf[512];
  size_t got = 0;
  for (;;) {
    ssize_t n = ::read(f.get(), buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return Status::FromErrno(errno, fmt::format("read upload offset of session {}", session));
    if (n == 0 || got + static_cast<size_t>(n) == sizeof(buf)) {
      got += static_cast<size_t>(n);
      break;
    }
    got += static_cast<size_t>(n);
  }
  auto parsed = ParseJson(std::string_view(buf, got), "upload offset file");
  nlohmann::json j = parsed.ok() ? std::move(parsed).value() : nlohmann::json();
  // (The record lies in the vfolder, which its users can write: any shape may be found.)
  if (!j.is_object() || !j.contains("offset") || !j["offset"].is_number_unsigned() ||
      (j.contains("quota_checked") && !j["quota_checked"].is_boolean()))
    return Status(Code::kIoError,
                  fmt::format("the offset file of upload session {} is corrupt", session));
  Record r;
  r.offset = j["offset"].get<uint64_t>();
  r.quota_checked = j.value("quota_checked", false);
  return std::optional<Record>(r);
}

// Writes the fixed-size record `body` at the start of `name` in `updir` (created when missing)
// and syncs it. Overwriting the same bytes of an existing file allocates nothing on filesystems
// that write in place, so it still works when the quota or the disk is full.
Status WriteRecordFile(int updir, const std::string& name, const std::string& body) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd f,
                          OpenRecordFile(updir, name, O_WRONLY | O_CREAT, "write upload offset"));
  size_t done = 0;
  while (done < body.size()) {
    ssize_t n = ::pwrite(f.get(), body.data() + done, body.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write upload offset");
    done += static_cast<size_t>(n);
  }
  struct stat sb;
  // A longer file (an older, variable-size record) is cut to the record; shrinking allocates
  // nothing.
  if (::fstat(f.get(), &sb) == 0 && static_cast<size_t>(sb.st_size) > body.size() &&
      ::ftruncate(f.get(), static_cast<off_t>(body.size())) != 0)
    return Status::FromErrno(errno, "write upload offset");
  if (::fsync(f.get()) != 0) return Status::FromErrno(errno, "sync upload offset");
  return Status::Ok();
}

// Replaces the record atomically. It is written into the spare `.offset.tmp`, synced, and
// swapped with `.offset` (RENAME_EXCHANGE), so the spare then holds the previous record and the
// next update overwrites it in place: after the first two updates, recording a new offset needs
// no new inode or block, and works while the scope's quota or the disk is full (the bytes
// synced in a PATCH that ran into EDQUOT/ENOSPC still count). Where the exchange is not
// supported, the spare is renamed over the record instead.
Status WriteRecord(int updir, const std::string& session, const Record& r) {
  std::string tmp = session + kSpareSuffix;
  std::string name = session + kRecordSuffix;
  std::string body =
      nlohmann::json{{"offset", r.offset}, {"quota_checked", r.quota_checked}}.dump();
  body.resize(std::max<size_t>(body.size(), kRecordSize - 1), ' ');
  body += '\n';
  SLUICE_RETURN_IF_ERROR(WriteRecordFile(updir, tmp, body));
  // The directory is synced after each rename: the record's new name is what survives a crash.
  if (::renameat2(updir, tmp.c_str(), updir, name.c_str(), RENAME_EXCHANGE) == 0) {
    if (::fsync(updir) != 0) return Status::FromErrno(errno, "sync upload offset");
    return Status::Ok();
  }
  if (errno != ENOENT && errno != EINVAL && errno != ENOSYS)
    return Status::FromErrno(errno, "swap upload offset into place");
  // The first record (none yet), or no exchange on this filesystem.
  if (::renameat(updir, tmp.c_str(), updir, name.c_str()) != 0)
    return Status::FromErrno(errno, "rename upload offset into place");
  if (::fsync(updir) != 0) return Status::FromErrno(errno, "sync upload offset");
  // Make the spare now, while there is room, so later updates allocate nothing.
  (void)WriteRecordFile(updir, tmp, body);
  return Status::Ok();
}

// A non-blocking OFD write lock on the whole file: true when taken, false when another open
// file holds it.
Result<bool> TryLock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  for (;;) {
    if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    return Status::FromErrno(errno, "lock upload staging file");
  }
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// The vfolder's staging directory (readable, so that it can be listed and fsync'ed).
Result<UniqueFd> OpenStagingDir(int root, const std::string& session) {
  auto d = OpenBeneath(root, kStagingDirName, O_RDONLY | O_DIRECTORY);
  if (!d.ok() && (d.status().code() == Code::kNotFound || d.status().sys_errno() == ENOTDIR))
    return NoStaging(session);
  return d;
}

class PosixStagingWriter : public StagingWriter {
 public:
  PosixStagingWriter(UniqueFd root, UniqueFd updir, UniqueFd file, std::string session,
                     StagingState state, StagingAccount account)
      : root_(std::move(root)),
        updir_(std::move(updir)),
        fd_(std::move(file)),
        session_(std::move(session)),
        state_(state),
        account_(std::move(account)) {}

  const StagingState& state() const override { return state_; }

  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    size_t done = 0;
    Status st;
    while (done < n) {
      ssize_t w = ::pwrite(fd_.get(), data + done, n - done, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        st = Status::FromErrno(errno, "write upload");
        break;
      }
      done += static_cast<size_t>(w);
    }
    if (done && offset + done > size_) {
      Account(static_cast<int64_t>(offset + done - size_), 0);
      size_ = offset + done;
    }
    *written = done;
    return st;
  }

  void Writeback(uint64_t from, uint64_t to) override {
    ::sync_file_range(fd_.get(), static_cast<off_t>(from), static_cast<off_t>(to - from),
                      SYNC_FILE_RANGE_WRITE);
  }

  Status Sync(uint64_t offset, bool quota_checked) override {
    if (::fdatasync(fd_.get()) != 0) return Status::FromErrno(errno, "sync upload");
    return WriteRecord(updir_.get(), session_, Record{offset, quota_checked});
  }

  Status Rollback(uint64_t offset, bool quota_checked) override {
    SLUICE_RETURN_IF_ERROR(WriteRecord(updir_.get(), session_, Record{offset, quota_checked}));
    if (::ftruncate(fd_.get(), static_cast<off_t>(offset)) != 0)
      return Status::FromErrno(errno, "truncate upload");
    if (size_ > offset) Account(-static_cast<int64_t>(size_ - offset), 0);
    size_ = offset;
    return Status::Ok();
  }

  Status Publish(const std::vector<std::string>& parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool durable) override {
    if (meta) {
      SLUICE_ASSIGN_OR_RETURN(DirEntry now, StatAt(fd_.get(), "", false, false));
      std::string blob = meta(now);
      if (!blob.empty()) {
        Status st = WriteObjectMeta(fd_.get(), blob);
        if (st.code() == Code::kUnsupported) {
          static std::atomic<bool> warned{false};
          if (!warned.exchange(true))
            spdlog::warn("object metadata is not kept on this volume: {}", st.message());
        } else if (!st.ok()) {
          return st;
        }
      }
    }
    if (durable && ::fdatasync(fd_.get()) != 0) return Status::FromErrno(errno, "sync object");
    return Commit(parts);
  }

  Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) override {
    int in = src.native_fd();
    while (in >= 0 && n > 0) {
      loff_t from = static_cast<loff_t>(src_offset), to = static_cast<loff_t>(at);
      ssize_t c = ::copy_file_range(in, &from, fd_.get(), &to, n, 0);
      if (c < 0 && errno == EINTR) continue;
      if (c < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                    errno == EBADF))
        break;  // not between these two files: copy through memory
      if (c < 0) return Status::FromErrno(errno, "copy into upload");
      if (c == 0) return Status(Code::kIoError, "the source ended early", EIO);
      if (at + static_cast<uint64_t>(c) > size_) {
        Account(static_cast<int64_t>(at + static_cast<uint64_t>(c) - size_), 0);
        size_ = at + static_cast<uint64_t>(c);
      }
      src_offset += static_cast<uint64_t>(c);
      at += static_cast<uint64_t>(c);
      n -= static_cast<uint64_t>(c);
    }
    return n == 0 ? Status::Ok() : StagingWriter::CopyFrom(src, src_offset, n, at);
  }

  Status Commit(const std::vector<std::string>& parts) override {
    const std::string final_rel = JoinComponents(parts, parts.size());
    auto open_dir = [&](size_t n, int flags) -> Result<UniqueFd> {
      std::string rel = JoinComponents(parts, n);
      auto d = OpenBeneath(root_.get(), rel, flags | O_DIRECTORY);
      if (!d.ok() && d.status().sys_errno() == ENOTDIR)
        return Status(Code::kConflict, fmt::format("'{}' exists and is not a directory", rel),
                      ENOTDIR);
      return d;
    };
    // A directory on the way may be removed between its mkdir and the rename into it (a
    // delete of its last object removes it): the rename finds it gone, and the way is made
    // again.
    for (int attempt = 0;; ++attempt) {
      Status placed = Place(parts, final_rel, open_dir);
      if (placed.sys_errno() == ENOENT && attempt < 3) continue;
      if (placed.ok()) {
        // The renamed file's times as it stands now (the rename moved its ctime).
        auto now = StatAt(fd_.get(), "", false, false);
        if (now.ok()) landed_ = std::move(now).value();
      }
      return placed;
    }
  }

  template <typename OpenDir>
  Status Place(const std::vector<std::string>& parts, const std::string& final_rel,
               OpenDir& open_dir) {
    std::vector<size_t> made;  // levels that got a new directory (their entries need syncing)
    // Into the staging directory only as itself (S3 multipart parts live below it, spelled so;
    // the APIs refuse that spelling from clients): a symlink in the vfolder ("lnk" -> ".")
    // would make "lnk/.upload/<session>" another upload's staging file.
    struct stat staging;
    if (::fstat(updir_.get(), &staging) != 0) return Status::FromErrno(errno, "stat staging");
    auto not_staging = [&](int dir, size_t level) -> Status {
      if (level == 1 && parts[0] == kStagingDirName) return Status::Ok();
      struct stat sb;
      if (::fstat(dir, &sb) != 0) return Status::FromErrno(errno, "stat upload directory");
      if (sb.st_dev == staging.st_dev && sb.st_ino == staging.st_ino)
        return Status(Code::kInvalidPath,
                      fmt::format("'{}' is the upload staging directory; uploads cannot go there",
                                  JoinComponents(parts, level)));
      return Status::Ok();
    };
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, open_dir(i, O_PATH));
      SLUICE_RETURN_IF_ERROR(not_staging(dir.get(), i));
      if (::mkdirat(dir.get(), parts[i].c_str(), 0755) == 0) {
        Account(0, 1);
        made.push_back(i);
      } else if (errno != EEXIST)
        return Status::FromErrno(
            errno, fmt::format("create directory '{}'", JoinComponents(parts, i + 1)));
    }
    SLUICE_ASSIGN_OR_RETURN(UniqueFd parent, open_dir(parts.size() - 1, O_RDONLY));
    SLUICE_RETURN_IF_ERROR(not_staging(parent.get(), parts.size() - 1));
    const std::string& name = parts.back();
    struct stat replaced;
    bool replaces = ::fstatat(parent.get(), name.c_str(), &replaced, AT_SYMLINK_NOFOLLOW) == 0 &&
                    !S_ISDIR(replaced.st_mode);
    // Staged privately (0600); published with the mode an ordinary file gets (Backend.AI's
    // uploads land 0644), so that the session containers reading the vfolder can open it.
    if (::fchmod(fd_.get(), 0644) != 0) return Status::FromErrno(errno, "set upload mode");
    if (no_replace_) {
      if (replaces)
        return Status(Code::kAlreadyExists, fmt::format("'{}' exists", final_rel), EEXIST);
      SLUICE_RETURN_IF_ERROR(CommitNoReplace(parent.get(), name, final_rel));
    } else if (::renameat(updir_.get(), session_.c_str(), parent.get(), name.c_str()) != 0) {
      int err = errno;
      if (err == EISDIR || err == ENOTEMPTY || err == EEXIST)
        return Status(Code::kConflict,
                      fmt::format("'{}' is a directory; the upload cannot replace it", final_rel),
                      err);
      return Status::FromErrno(err, fmt::format("move upload into place at '{}'", final_rel));
    }
    if (replaces) Account(-static_cast<int64_t>(replaced.st_size), -1);
    // The new name and the removed staging name survive a power loss; a write is not answered
    // as durable when they may not (EINVAL: a file system that cannot sync a directory).
    for (int d : {parent.get(), updir_.get()})
      if (::fsync(d) != 0 && errno != EINVAL)
        return Status::FromErrno(errno, fmt::format("sync the directory of '{}'", final_rel));
    // So do the directories made on the way: each new one's entry in the level above (before
    // 2026-12-03 only the last parent was synced, and a file answered as complete could lose
    // the directories leading to it).
    for (size_t i : made) {
      SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, open_dir(i, O_RDONLY));
      if (::fsync(dir.get()) != 0 && errno != EINVAL)
        return Status::FromErrno(errno, fmt::format("sync the directory of '{}'", final_rel));
    }
    return Status::Ok();
  }

  bool RefuseReplace() override {
    no_replace_ = true;
    return true;
  }
  std::optional<DirEntry> Landed() const override { return landed_; }

 private:
  std::optional<DirEntry> landed_;
  // The staging file onto `name` in `parent` only if nothing is there, in one step (the shared
  // RenameNoReplace: atomic for a file wherever a hard link is).
  Status CommitNoReplace(int parent, const std::string& name, const std::string& rel) {
    if (RenameNoReplace(updir_.get(), session_.c_str(), parent, name.c_str()) == 0)
      return Status::Ok();
    int err = errno;
    if (err == EEXIST) return Status(Code::kAlreadyExists, fmt::format("'{}' exists", rel), EEXIST);
    if (err == EISDIR || err == ENOTEMPTY)
      return Status(Code::kConflict,
                    fmt::format("'{}' is a directory; the upload cannot replace it", rel), err);
    return Status::FromErrno(err, fmt::format("move upload into place at '{}'", rel));
  }

  void Account(int64_t bytes, int64_t entries) {
    if (account_) account_(bytes, entries);
  }
  bool no_replace_ = false;

  UniqueFd root_;   // the vfolder (O_PATH)
  UniqueFd updir_;  // .upload (O_RDONLY directory)
  UniqueFd fd_;     // the staging file, locked while it is open
  std::string session_;
  StagingState state_;
  StagingAccount account_;
  uint64_t size_ = state_.staged_size;
};

bool OlderThan(const struct stat& sb, std::chrono::seconds age) {
  return std::chrono::system_clock::now() - UnixTime(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec) > age;
}

// Removes abandoned sessions from the staging directory `updir`.
StagingSweep SweepDir(int updir, const std::string& where, std::chrono::seconds age,
                      const std::function<void(const std::string&)>& on_removed) {
  StagingSweep stats;
  auto entries = ReadDirEntries(updir, where);
  if (!entries.ok()) return stats;
  std::vector<std::string> names;
  for (auto& e : *entries) names.push_back(std::move(e.name));

  // Only staging files count: they are what the volume accounted (CreateStagingAt, writes);
  // records and spares never were.
  auto remove = [&](const std::string& name, bool counted) {
    struct stat gone;
    bool sized = counted && ::fstatat(updir, name.c_str(), &gone, AT_SYMLINK_NOFOLLOW) == 0;
    if (::unlinkat(updir, name.c_str(), 0) == 0) {
      if (!counted) return;
      ++stats.removed;
      if (sized) stats.removed_bytes += static_cast<uint64_t>(gone.st_size);
    } else if (errno != ENOENT) {
      spdlog::warn("upload sweep: cannot remove {}/{}: {}", where, name, std::strerror(errno));
    }
  };

  // Staging files first: a locked one is alive whatever its age, and so are its records.
  std::vector<std::string> live;
  for (const auto& name : names) {
    if (!IsUploadSessionId(name)) continue;
    struct stat sb;
    if (::fstatat(updir, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(sb.st_mode))
      continue;
    bool old = OlderThan(sb, age);
    UniqueFd held_lock;
    if (S_ISREG(sb.st_mode)) {
      if (!old) {
        live.push_back(name);
        continue;
      }
      int fd = ::openat(updir, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      held_lock.reset(fd);
      auto locked = TryLock(held_lock.get());
      if (!locked.ok() || !*locked) {
        ++stats.kept_locked;
        live.push_back(name);
        continue;
      }
      struct stat held, named;
      if (::fstat(held_lock.get(), &held) != 0 ||
          ::fstatat(updir, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
          !SameFile(held, named))
        continue;
    } else if (!old) {
      continue;
    }
    spdlog::info("upload sweep: removing abandoned upload session {}/{}", where, name);
    if (on_removed) on_removed(name);
    remove(name, true);
    remove(name + kRecordSuffix, false);
    remove(name + kSpareSuffix, false);
  }
  // Then whatever else is old: records of completed sessions, leftovers.
  for (const auto& name : names) {
    if (IsUploadSessionId(name)) continue;
    std::string base = name.substr(0, name.find('.'));
    if (std::find(live.begin(), live.end(), base) != live.end()) continue;
    struct stat sb;
    if (::fstatat(updir, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(sb.st_mode))
      continue;
    if (OlderThan(sb, age)) remove(name, false);
  }
  return stats;
}

}  // namespace

Result<std::string> CreateStagingAt(int root, const StagingAccount& account) {
  if (::mkdirat(root, kStagingDirName, 0700) == 0) {
    if (account) account(0, 1);
    // Its entry in the vfolder survives a power loss, or so would no offset synced in it.
    UniqueFd r(::openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (r.get() < 0 || (::fsync(r.get()) != 0 && errno != EINVAL))
      return Status::FromErrno(errno, "sync the vfolder after creating its staging directory");
  } else if (errno != EEXIST) {
    return Status::FromErrno(errno, "create upload staging directory");
  }
  int dfd = ::openat(root, kStagingDirName, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return Status(Code::kInvalidPath,
                  fmt::format("'{}' in the vfolder is not a directory", kStagingDirName), errno);
  UniqueFd dir(dfd);
  std::string session = RandomHexString(16);
  int fd = ::openat(dir.get(), session.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create upload staging file");
  ::close(fd);
  if (account) account(0, 1);
  return session;
}

Status DiscardStagingAt(int root, const std::string& session, const StagingAccount& account) {
  if (!IsUploadSessionId(session))
    return Status(Code::kInvalidArgument, "not an upload session id");
  SLUICE_ASSIGN_OR_RETURN(UniqueFd updir, OpenStagingDir(root, session));
  // Its bytes were counted as they were written: they go from the figure with it.
  struct stat gone {};
  bool sized = ::fstatat(updir.get(), session.c_str(), &gone, AT_SYMLINK_NOFOLLOW) == 0;
  if (::unlinkat(updir.get(), session.c_str(), 0) != 0)
    return Status::FromErrno(errno, fmt::format("remove upload session {}", session));
  if (account) account(sized ? -static_cast<int64_t>(gone.st_size) : 0, -1);
  return Status::Ok();
}

Result<StagingState> InspectStagingAt(int root, const std::string& session) {
  if (!IsUploadSessionId(session))
    return Status(Code::kInvalidArgument, "not an upload session id");
  SLUICE_ASSIGN_OR_RETURN(UniqueFd updir, OpenStagingDir(root, session));
  SLUICE_ASSIGN_OR_RETURN(auto rec, ReadRecord(updir.get(), session));
  StagingState s;
  if (rec) {
    s.recorded = true;
    s.durable = rec->offset;
    s.quota_checked = rec->quota_checked;
  }
  struct stat sb;
  if (::fstatat(updir.get(), session.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return Status::FromErrno(errno, "stat upload staging file");
    if (!rec) return NoStaging(session);
    return s;
  }
  if (!S_ISREG(sb.st_mode))
    return Status(
        Code::kConflict,
        fmt::format("the staging file of upload session {} is not a regular file", session));
  s.staged = true;
  s.staged_size = static_cast<uint64_t>(sb.st_size);
  return s;
}

Result<std::unique_ptr<StagingWriter>> OpenStagingAt(UniqueFd root, const std::string& session,
                                                     std::chrono::milliseconds wait,
                                                     StagingAccount account) {
  if (!IsUploadSessionId(session))
    return Status(Code::kInvalidArgument, "not an upload session id");
  SLUICE_ASSIGN_OR_RETURN(UniqueFd updir, OpenStagingDir(root.get(), session));
  int fd = ::openat(updir.get(), session.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP) return NoStaging(session);
    return Status::FromErrno(errno, "open upload staging file");
  }
  UniqueFd f(fd);
  struct stat held;
  if (::fstat(f.get(), &held) != 0) return Status::FromErrno(errno, "stat upload staging file");
  if (!S_ISREG(held.st_mode)) return NoStaging(session);
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(bool locked, TryLock(f.get()));
    if (locked) break;
    if (std::chrono::steady_clock::now() >= deadline) return UploadWriterBusy(session);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The name may have been swept or completed between open and lock.
  struct stat named;
  if (::fstatat(updir.get(), session.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
      !SameFile(held, named))
    return NoStaging(session);
  if (::fstat(f.get(), &held) != 0) return Status::FromErrno(errno, "stat upload staging file");
  SLUICE_ASSIGN_OR_RETURN(auto rec, ReadRecord(updir.get(), session));
  StagingState s;
  s.staged = true;
  s.recorded = rec.has_value();
  s.durable = rec ? rec->offset : 0;
  s.quota_checked = rec && rec->quota_checked;
  s.staged_size = static_cast<uint64_t>(held.st_size);
  if (s.staged_size < s.durable)
    return Status(Code::kIoError,
                  fmt::format("the staging file of upload session {} holds {} bytes, fewer than "
                              "its durable offset {}; the upload must start over",
                              session, s.staged_size, s.durable));
  // Bytes past the durable offset were left by a writer that died before syncing them.
  if (s.staged_size > s.durable) {
    if (::ftruncate(f.get(), static_cast<off_t>(s.durable)) != 0)
      return Status::FromErrno(errno, "truncate upload staging file to its durable offset");
    if (account) account(-static_cast<int64_t>(s.staged_size - s.durable), 0);
    s.staged_size = s.durable;
  }
  return std::unique_ptr<StagingWriter>(new PosixStagingWriter(
      std::move(root), std::move(updir), std::move(f), session, s, std::move(account)));
}

StagingSweep SweepStagingAt(int vfdir, const std::string& where, std::chrono::seconds age,
                            const std::function<void(const std::string&)>& removed,
                            const StagingAccount& account) {
  StagingSweep stats;
  auto updir = OpenBeneath(vfdir, kStagingDirName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (!updir.ok()) return stats;
  stats = SweepDir(updir->get(), where + "/" + kStagingDirName, age, removed);
  int64_t entries = -static_cast<int64_t>(stats.removed);
  struct stat sb;
  // rmdir refuses a directory that is not empty; an old mtime means no session came or went
  // lately.
  if (::fstat(updir->get(), &sb) == 0 && OlderThan(sb, age) &&
      ::unlinkat(vfdir, kStagingDirName, AT_REMOVEDIR) == 0)
    --entries;
  if (account && entries) account(-static_cast<int64_t>(stats.removed_bytes), entries);
  return stats;
}

}  // namespace sluice
