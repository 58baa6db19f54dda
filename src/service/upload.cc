#include "service/upload.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/dir_reader.h"
#include "common/json.h"
#include "common/path.h"
#include "service/storage_service.h"
#include "volume/posix_volume.h"

namespace sluice {

namespace {

constexpr const char* kSidecarSuffix = ".offset";
constexpr const char* kSidecarTmpSuffix = ".offset.tmp";  // the spare record (WriteSidecar)
constexpr size_t kSidecarRecordSize = 64;  // fixed, so records overwrite each other in place
// How long HEAD waits for a writer that is renaming a whole upload into place.
constexpr auto kFinalizeWait = std::chrono::seconds(5);

bool IsHex(std::string_view s, size_t min_len, size_t max_len) {
  if (s.size() < min_len || s.size() > max_len) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Session ids are what PosixVolume::PrepareUpload makes: lower-case hex.
bool ValidSession(std::string_view s) {
  return IsHex(s, 16, 64);
}

Status NoSession(const std::string& session) {
  return Status(
      Code::kNotFound,
      fmt::format("upload session {} does not exist (expired, removed or never created)", session));
}

struct Sidecar {
  uint64_t offset = 0;
  bool quota_checked = false;
};

// The sidecar of `session`, or nullopt when there is none.
Result<std::optional<Sidecar>> ReadSidecar(int updir, const std::string& session) {
  std::string name = session + kSidecarSuffix;
  int fd = ::openat(updir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<Sidecar>();
    return Status::FromErrno(errno, fmt::format("read upload offset of session {}", session));
  }
  UniqueFd f(fd);
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
  if (!j.is_object() || !j.contains("offset") || !j["offset"].is_number_unsigned())
    return Status(Code::kIoError,
                  fmt::format("the offset file of upload session {} is corrupt", session));
  Sidecar s;
  s.offset = j["offset"].get<uint64_t>();
  s.quota_checked = j.value("quota_checked", false);
  return std::optional<Sidecar>(s);
}

// Writes the fixed-size record `body` at the start of `name` in `updir` (created when missing)
// and syncs it. Overwriting the same bytes of an existing file allocates nothing on filesystems
// that write in place, so it still works when the quota or the disk is full.
Status WriteRecord(int updir, const std::string& name, const std::string& body) {
  int fd = ::openat(updir, name.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "write upload offset");
  UniqueFd f(fd);
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

// Replaces the sidecar atomically. The record is written into the spare file `.offset.tmp`,
// synced, and swapped with `.offset` (RENAME_EXCHANGE), so the spare then holds the previous
// record and the next update overwrites it in place: after the first two updates, recording a
// new offset needs no new inode or block, and works while the scope's quota or the disk is full
// (the bytes synced in a PATCH that ran into EDQUOT/ENOSPC still count). Where the exchange is
// not supported, the spare is renamed over the sidecar instead.
Status WriteSidecar(int updir, const std::string& session, const Sidecar& s) {
  std::string tmp = session + kSidecarTmpSuffix;
  std::string name = session + kSidecarSuffix;
  std::string body =
      nlohmann::json{{"offset", s.offset}, {"quota_checked", s.quota_checked}}.dump();
  body.resize(std::max<size_t>(body.size(), kSidecarRecordSize - 1), ' ');
  body += '\n';
  SLUICE_RETURN_IF_ERROR(WriteRecord(updir, tmp, body));
  if (::renameat2(updir, tmp.c_str(), updir, name.c_str(), RENAME_EXCHANGE) == 0)
    return Status::Ok();
  if (errno != ENOENT && errno != EINVAL && errno != ENOSYS)
    return Status::FromErrno(errno, "swap upload offset into place");
  // The first record (no sidecar yet), or no exchange on this filesystem.
  if (::renameat(updir, tmp.c_str(), updir, name.c_str()) != 0)
    return Status::FromErrno(errno, "rename upload offset into place");
  // Make the spare now, while there is room, so later updates allocate nothing.
  (void)WriteRecord(updir, tmp, body);
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

// The vfolder's directory, opened O_PATH without following a symlink at its last component.
Result<UniqueFd> OpenVFolder(Volume& v, const VFolderId& vfid) {
  std::string p = v.VFolderPath(vfid);
  int fd = ::open(p.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return Status(Code::kNotFound, fmt::format("vfolder {} does not exist on volume {}",
                                                 vfid.ToString(), v.name()));
    return Status::FromErrno(errno, fmt::format("open vfolder {}", vfid.ToString()));
  }
  return UniqueFd(fd);
}

// The vfolder's staging directory (readable, so that it can be listed and fsync'ed).
Result<UniqueFd> OpenUploadDir(int root, const std::string& session) {
  auto d = OpenBeneath(root, UploadService::kUploadDir, O_RDONLY | O_DIRECTORY);
  if (!d.ok() && (d.status().code() == Code::kNotFound || d.status().sys_errno() == ENOTDIR))
    return NoSession(session);
  return d;
}

// Keys of QuotaReservations: the scope on its volume, the session in its vfolder.
std::string ScopeKey(const UploadTarget& t) {
  return QuotaReservations::ScopeKey(t.volume->name(),
                                     t.vfid.scope ? t.vfid.scope->hex : std::string());
}
std::string SessionKey(const std::string& vfolder_path, const std::string& session) {
  return vfolder_path + "/" + session;
}
std::string SessionKey(const UploadTarget& t) {
  return SessionKey(t.volume->VFolderPath(t.vfid), t.session);
}

uint64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

// Renames the whole staging file onto its final path: parents are created beneath the vfolder
// (a symlink out of it is refused), an existing file is replaced atomically, an existing
// directory is refused.
Status Finalize(const UploadTarget& t, int root, int updir) {
  const auto& parts = t.final_parts;
  auto open_dir = [&](size_t n, int flags) -> Result<UniqueFd> {
    std::string rel = JoinComponents(parts, n);
    auto d = OpenBeneath(root, rel, flags | O_DIRECTORY);
    if (!d.ok() && d.status().sys_errno() == ENOTDIR)
      return Status(Code::kConflict, fmt::format("'{}' exists and is not a directory", rel),
                    ENOTDIR);
    return d;
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(UniqueFd dir, open_dir(i, O_PATH));
    if (::mkdirat(dir.get(), parts[i].c_str(), 0755) == 0)
      t.volume->AccountWrite(t.vfid, 0, 1);
    else if (errno != EEXIST)
      return Status::FromErrno(errno,
                               fmt::format("create directory '{}'", JoinComponents(parts, i + 1)));
  }
  auto parent = open_dir(parts.size() - 1, O_RDONLY);
  if (!parent.ok()) return parent.status();
  const std::string& name = parts.back();
  struct stat replaced;
  bool replaces = ::fstatat(parent->get(), name.c_str(), &replaced, AT_SYMLINK_NOFOLLOW) == 0 &&
                  !S_ISDIR(replaced.st_mode);
  if (::renameat(updir, t.session.c_str(), parent->get(), name.c_str()) != 0) {
    int err = errno;
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST)
      return Status(
          Code::kConflict,
          fmt::format("'{}' is a directory; the upload cannot replace it", t.final_relpath()), err);
    return Status::FromErrno(err, fmt::format("move upload into place at '{}'", t.final_relpath()));
  }
  if (replaces) t.volume->AccountWrite(t.vfid, -static_cast<int64_t>(replaced.st_size), -1);
  // The new name and the removed staging name survive a power loss.
  ::fsync(parent->get());
  ::fsync(updir);
  return Status::Ok();
}

}  // namespace

std::string UploadTarget::final_relpath() const {
  return JoinComponents(final_parts, final_parts.size());
}

// ------------------------------------------------------------------------------ UploadWriter

UploadWriter::~UploadWriter() {
  Release();
}

void UploadWriter::Release() {
  fd_.reset();  // closing the file releases its OFD lock
  updir_.reset();
  root_.reset();
}

Status UploadWriter::Sync() {
  if (!failed_.ok()) return failed_;
  if (written_ == durable_) return Status::Ok();
  if (::fdatasync(fd_.get()) != 0) {
    // After a failed fsync the kernel may have dropped the dirty pages: nothing written by this
    // writer since the last good sync may ever count as durable.
    int err = errno;
    failed_ = Status::FromErrno(
        err, fmt::format("sync upload at offset {}; {} bytes are durable", written_, durable_));
    return failed_;
  }
  Status st = WriteSidecar(updir_.get(), target_.session, Sidecar{written_, quota_checked_});
  if (!st.ok()) {
    failed_ = st.WithContext(fmt::format("upload {} bytes are durable", durable_));
    return failed_;
  }
  durable_ = written_;
  if (reservations_) reservations_->Shrink(reservation_key_, target_.size - durable_);
  writeback_from_ = std::max(writeback_from_, durable_);
  last_sync_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

Status UploadWriter::Write(const char* data, size_t n) {
  if (!failed_.ok()) return failed_;
  if (n > target_.size - written_) {
    overlong_ = true;
    return Status(Code::kTooLarge,
                  fmt::format("the body runs past the upload's length: {} bytes at offset {} "
                              "exceed Upload-Length {}",
                              n, written_, target_.size));
  }
  if (n == 0) return Status::Ok();
  auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd_.get(), data + done, n - done, static_cast<off_t>(written_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      written_ += done;
      target_.volume->io_stats().AddWrite(done, MicrosSince(t0));
      target_.volume->AccountWrite(target_.vfid, static_cast<int64_t>(done), 0);
      std::string what;
      if (err == EDQUOT)
        what = "the disk quota is exhausted";
      else if (err == ENOSPC)
        what = "the volume is out of space";
      else
        what = std::strerror(err);
      return Status(CodeFromErrno(err),
                    fmt::format("{} while writing the upload at offset {}; what was synced "
                                "before stays (HEAD reports the offset) and the upload can resume "
                                "from there once there is room",
                                what, written_),
                    err);
    }
    done += static_cast<size_t>(w);
  }
  written_ += n;
  target_.volume->io_stats().AddWrite(n, MicrosSince(t0));
  target_.volume->AccountWrite(target_.vfid, static_cast<int64_t>(n), 0);
  if (written_ - writeback_from_ >= kWritebackBytes) {
    // Start writeback now so that the next sync waits only for the tail.
    ::sync_file_range(fd_.get(), static_cast<off_t>(writeback_from_),
                      static_cast<off_t>(written_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
    writeback_from_ = written_;
  }
  if (written_ - durable_ >= kSyncBytes ||
      std::chrono::steady_clock::now() - last_sync_ >= kSyncInterval)
    return Sync();
  return Status::Ok();
}

Result<uint64_t> UploadWriter::Finish() {
  if (!fd_.valid()) return durable_;  // a completed session: nothing to write
  Status st = Sync();
  if (st.ok() && durable_ == target_.size) {
    st = Finalize(target_, root_.get(), updir_.get());
    if (st.ok() && reservations_) reservations_->Release(reservation_key_);
  }
  Release();
  if (!st.ok()) return st;
  return durable_;
}

void UploadWriter::Abort() {
  if (fd_.valid() && overlong_) {
    // The body was longer than the upload: none of it counts.
    Status st = Status::Ok();
    if (durable_ != start_)
      st = WriteSidecar(updir_.get(), target_.session, Sidecar{start_, quota_checked_});
    if (st.ok()) {
      target_.volume->AccountWrite(target_.vfid, -static_cast<int64_t>(written_ - start_), 0);
      durable_ = written_ = start_;
      if (::ftruncate(fd_.get(), static_cast<off_t>(start_)) != 0)
        spdlog::warn("upload {}: truncate after an over-long PATCH: {}", target_.session,
                     std::strerror(errno));
    } else {
      spdlog::warn("upload {}: rolling back an over-long PATCH failed: {}", target_.session,
                   st.ToString());
    }
  } else if (fd_.valid() && failed_.ok()) {
    Status st = Sync();
    if (!st.ok())
      spdlog::warn("upload {}: keeping {} durable bytes of an interrupted PATCH failed: {}",
                   target_.session, durable_, st.ToString());
  }
  Release();
}

// ----------------------------------------------------------------------------- UploadService

std::chrono::seconds UploadService::AbandonAge() const {
  auto expire = svc_->config().session_expire;
  return expire + std::min(expire, std::chrono::seconds(60));
}

Result<UploadTarget> UploadService::ResolveClaims(const nlohmann::json& claims,
                                                  const std::optional<std::string>& dst_dir) const {
  auto str = [&](const char* key) -> Result<std::string> {
    auto it = claims.find(key);
    if (it == claims.end() || !it->is_string())
      return Status(Code::kInvalidArgument,
                    fmt::format("upload token: claim '{}' is missing or not a string", key));
    return it->get<std::string>();
  };
  UploadTarget t;
  SLUICE_ASSIGN_OR_RETURN(std::string vol, str("volume"));
  SLUICE_ASSIGN_OR_RETURN(std::string vfid, str("vfid"));
  SLUICE_ASSIGN_OR_RETURN(std::string rel, str("relpath"));
  SLUICE_ASSIGN_OR_RETURN(t.session, str("session"));
  auto size = claims.find("size");
  if (size == claims.end() || !size->is_number_integer() ||
      (!size->is_number_unsigned() && size->get<int64_t>() < 0))
    return Status(Code::kInvalidArgument,
                  "upload token: claim 'size' is missing or not a non-negative integer");
  t.size = size->is_number_unsigned() ? size->get<uint64_t>()
                                      : static_cast<uint64_t>(size->get<int64_t>());
  if (!ValidSession(t.session))
    return Status(Code::kInvalidArgument, "upload token: claim 'session' is not a session id");
  auto parsed = VFolderId::Parse(vfid);
  if (!parsed.ok()) return parsed.status().WithContext("upload token: claim 'vfid'");
  t.vfid = std::move(parsed).value();
  std::vector<std::string> parts;
  if (dst_dir) {
    auto d = SplitRelPath(*dst_dir);
    if (!d.ok()) return d.status().WithContext("dst_dir");
    parts = std::move(d).value();
  }
  auto r = SplitRelPath(rel);
  if (!r.ok()) return r.status().WithContext("upload token: claim 'relpath'");
  if (r->empty())
    return Status(Code::kInvalidPath, "upload token: claim 'relpath' does not name a file");
  parts.insert(parts.end(), r->begin(), r->end());
  if (parts.front() == kUploadDir)
    return Status(Code::kInvalidPath,
                  fmt::format("uploads cannot go into the staging directory '{}'", kUploadDir));
  t.final_parts = std::move(parts);
  if (t.final_relpath().size() >= PATH_MAX)
    return Status(Code::kInvalidPath, "the upload's path is too long");
  SLUICE_ASSIGN_OR_RETURN(t.volume, svc_->GetVolume(vol));
  return t;
}

Status UploadService::ReserveQuota(const UploadTarget& t, uint64_t more_bytes) const {
  if (!t.vfid.scope) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(QuotaUsage q, t.volume->quota().DescribeScope(*t.vfid.scope));
  if (!q.limit_bytes) return Status::Ok();
  uint64_t limit = *q.limit_bytes;
  return svc_->reservations().Reserve(
      ScopeKey(t), SessionKey(t), more_bytes, [&](uint64_t others) -> Status {
        uint64_t committed = q.used_bytes + others;
        uint64_t room = limit > committed ? limit - committed : 0;
        if (more_bytes <= room) return Status::Ok();
        std::string pending =
            others ? fmt::format(", {} more promised to other uploads in progress", others) : "";
        return Status(
            Code::kQuotaExceeded,
            fmt::format("the upload needs {} more bytes but quota scope {} has {} left "
                        "({} of {} bytes used{})",
                        more_bytes, t.vfid.scope->ToString(), room, q.used_bytes, limit, pending),
            EDQUOT);
      });
}

Result<std::string> UploadService::CreateSession(Volume& volume, const VFolderId& vfid,
                                                 std::string_view relpath, uint64_t size) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "relpath must name a file");
  if (parts.front() == kUploadDir)
    return Status(Code::kInvalidPath,
                  fmt::format("uploads cannot go into the staging directory '{}'", kUploadDir));
  if (size > svc_->config().max_upload_size)
    return Status(Code::kTooLarge, fmt::format("upload of {} bytes exceeds max-upload-size ({} "
                                               "bytes)",
                                               size, svc_->config().max_upload_size));
  SLUICE_RETURN_IF_ERROR(volume.CheckVFolder(vfid));
  SweepVFolder(volume, vfid);
  UploadTarget t;
  t.volume = &volume;
  t.vfid = vfid;
  t.final_parts = std::move(parts);
  t.size = size;
  auto session = volume.PrepareUpload(vfid);
  // A sweep elsewhere may have removed an empty staging directory meanwhile: try once more.
  if (!session.ok()) session = volume.PrepareUpload(vfid);
  if (!session.ok()) return session;
  t.session = *session;
  Status quota = ReserveQuota(t, size);
  if (!quota.ok()) {
    std::string staging = fmt::format("{}/{}/{}", volume.VFolderPath(vfid), kUploadDir, t.session);
    if (::unlink(staging.c_str()) == 0) volume.AccountWrite(vfid, 0, -1);
    return quota;
  }
  return session;
}

Result<UploadProgress> UploadService::Query(const UploadTarget& t) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolder(*t.volume, t.vfid));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd updir, OpenUploadDir(root.get(), t.session));
  SLUICE_ASSIGN_OR_RETURN(auto sc, ReadSidecar(updir.get(), t.session));
  UploadProgress p;
  p.size = t.size;
  p.offset = sc ? sc->offset : 0;
  struct stat sb;
  if (::fstatat(updir.get(), t.session.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return Status::FromErrno(errno, "stat upload staging file");
    // No staging file: complete when the sidecar says every byte arrived, otherwise gone.
    if (sc && sc->offset == t.size) {
      p.complete = true;
      return p;
    }
    return NoSession(t.session);
  }
  if (!S_ISREG(sb.st_mode))
    return Status(
        Code::kConflict,
        fmt::format("the staging file of upload session {} is not a regular file", t.session));
  if (p.offset > t.size)
    return Status(Code::kIoError, fmt::format("upload session {} records offset {} past its "
                                              "length {}",
                                              t.session, p.offset, t.size));
  if (p.offset < t.size) return p;

  // Every byte is durable but the file was not renamed into place yet: a writer is doing it
  // now, or one crashed in between. Take the lock and finish.
  int fd = ::openat(updir.get(), t.session.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Query(t);  // finished meanwhile
    return Status::FromErrno(errno, "open upload staging file");
  }
  UniqueFd f(fd);
  auto deadline = std::chrono::steady_clock::now() + kFinalizeWait;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(bool locked, TryLock(f.get()));
    if (locked) break;
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(Code::kConflict,
                    fmt::format("upload session {} is being completed by another request; "
                                "retry",
                                t.session));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  struct stat held, named;
  if (::fstat(f.get(), &held) != 0) return Status::FromErrno(errno, "stat upload staging file");
  if (::fstatat(updir.get(), t.session.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
      !SameFile(held, named)) {
    f.reset();
    return Query(t);  // the holder finished (or the sweeper removed it): look again
  }
  SLUICE_ASSIGN_OR_RETURN(sc, ReadSidecar(updir.get(), t.session));
  if (!sc || sc->offset != t.size) return NoSession(t.session);  // cannot happen under the lock
  SLUICE_RETURN_IF_ERROR(Finalize(t, root.get(), updir.get()));
  svc_->reservations().Release(SessionKey(t));
  p.complete = true;
  return p;
}

Result<std::unique_ptr<UploadWriter>> UploadService::BeginWrite(const UploadTarget& t,
                                                                uint64_t client_offset,
                                                                uint64_t* current) {
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, OpenVFolder(*t.volume, t.vfid));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd updir, OpenUploadDir(root.get(), t.session));
  std::unique_ptr<UploadWriter> w(new UploadWriter());
  w->target_ = t;
  int fd = ::openat(updir.get(), t.session.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err != ENOENT && err != ELOOP) return Status::FromErrno(err, "open upload staging file");
    SLUICE_ASSIGN_OR_RETURN(auto sc, ReadSidecar(updir.get(), t.session));
    if (err == ENOENT && sc && sc->offset == t.size) {
      // Complete already: only an empty PATCH at the end is in order.
      *current = t.size;
      if (client_offset != t.size)
        return Status(Code::kConflict,
                      fmt::format("Upload-Offset is {} but the upload is complete at {}",
                                  client_offset, t.size));
      w->durable_ = w->written_ = t.size;
      return w;
    }
    return NoSession(t.session);
  }
  UniqueFd f(fd);
  struct stat held;
  if (::fstat(f.get(), &held) != 0) return Status::FromErrno(errno, "stat upload staging file");
  if (!S_ISREG(held.st_mode)) return NoSession(t.session);
  SLUICE_ASSIGN_OR_RETURN(bool locked, TryLock(f.get()));
  if (!locked)
    return Status(Code::kConflict,
                  fmt::format("another request is writing to upload session {}; one writer at a "
                              "time",
                              t.session));
  // The name may have been swept or completed between open and lock.
  struct stat named;
  if (::fstatat(updir.get(), t.session.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
      !SameFile(held, named))
    return NoSession(t.session);
  SLUICE_ASSIGN_OR_RETURN(auto sc, ReadSidecar(updir.get(), t.session));
  uint64_t durable = sc ? sc->offset : 0;
  *current = durable;
  if (durable > t.size)
    return Status(Code::kIoError, fmt::format("upload session {} records offset {} past its "
                                              "length {}",
                                              t.session, durable, t.size));
  if (static_cast<uint64_t>(held.st_size) < durable)
    return Status(Code::kIoError,
                  fmt::format("the staging file of upload session {} holds {} bytes, fewer than "
                              "its durable offset {}; the upload must start over",
                              t.session, held.st_size, durable));
  if (client_offset != durable)
    return Status(Code::kConflict,
                  fmt::format("Upload-Offset is {} but the upload continues at offset {}",
                              client_offset, durable));
  // Bytes past the durable offset were left by a writer that died before syncing them.
  if (static_cast<uint64_t>(held.st_size) > durable) {
    if (::ftruncate(f.get(), static_cast<off_t>(durable)) != 0)
      return Status::FromErrno(errno, "truncate upload staging file to its durable offset");
    t.volume->AccountWrite(t.vfid, -static_cast<int64_t>(held.st_size - durable), 0);
  }
  // The session's bytes were reserved when it was created. Its first write checks again (the
  // scope may have filled behind Sluice's back since), and so does a session found after a
  // restart or made by another process (reservations live in this process's memory).
  w->reservations_ = &svc_->reservations();
  w->reservation_key_ = SessionKey(t);
  w->quota_checked_ = sc && sc->quota_checked;
  if (durable < t.size && (!w->quota_checked_ || !w->reservations_->Has(w->reservation_key_))) {
    SLUICE_RETURN_IF_ERROR(ReserveQuota(t, t.size - durable));
    w->quota_checked_ = true;
  }
  // Refuse early what the final rename would refuse anyway.
  auto existing = OpenBeneath(root.get(), t.final_relpath(), O_PATH | O_NOFOLLOW);
  if (existing.ok()) {
    struct stat eb;
    if (::fstat(existing->get(), &eb) == 0 && S_ISDIR(eb.st_mode))
      return Status(
          Code::kConflict,
          fmt::format("'{}' is a directory; the upload cannot replace it", t.final_relpath()),
          EISDIR);
  } else if (existing.status().code() == Code::kInvalidPath) {
    return existing.status();
  } else if (existing.status().sys_errno() == ENOTDIR) {
    return Status(Code::kConflict,
                  fmt::format("a parent of '{}' is not a directory", t.final_relpath()), ENOTDIR);
  }
  w->root_ = std::move(root);
  w->updir_ = std::move(updir);
  w->fd_ = std::move(f);
  w->start_ = w->durable_ = w->written_ = w->writeback_from_ = durable;
  w->last_sync_ = std::chrono::steady_clock::now();
  return w;
}

// ------------------------------------------------------------------------------------ sweeps

namespace {

bool OlderThan(const struct stat& sb, std::chrono::seconds age) {
  auto mtime = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(sb.st_mtim.tv_sec) + std::chrono::nanoseconds(sb.st_mtim.tv_nsec)));
  return std::chrono::system_clock::now() - mtime > age;
}

// Removes abandoned sessions from the staging directory `updir`.
UploadService::SweepStats SweepUploadDir(int updir, const std::string& vfolder,
                                         std::chrono::seconds age, QuotaReservations* res) {
  UploadService::SweepStats stats;
  std::string where = vfolder + "/" + UploadService::kUploadDir;
  auto entries = ReadDirEntries(updir, where);
  if (!entries.ok()) return stats;
  std::vector<std::string> names;
  for (auto& e : *entries) names.push_back(std::move(e.name));

  auto remove = [&](const std::string& name) {
    struct stat gone;
    bool sized = ::fstatat(updir, name.c_str(), &gone, AT_SYMLINK_NOFOLLOW) == 0;
    if (::unlinkat(updir, name.c_str(), 0) == 0) {
      ++stats.removed;
      if (sized) stats.removed_bytes += static_cast<uint64_t>(gone.st_size);
    } else if (errno != ENOENT) {
      spdlog::warn("upload sweep: cannot remove {}/{}: {}", where, name, std::strerror(errno));
    }
  };

  // Staging files first: a locked one is alive whatever its age, and so are its sidecars.
  std::vector<std::string> live;
  for (const auto& name : names) {
    if (!ValidSession(name)) continue;
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
    if (res) res->Release(SessionKey(vfolder, name));
    remove(name);
    remove(name + kSidecarSuffix);
    remove(name + kSidecarTmpSuffix);
  }
  // Then whatever else is old: sidecars of completed sessions, leftovers.
  for (const auto& name : names) {
    if (ValidSession(name)) continue;
    std::string base = name.substr(0, name.find('.'));
    if (std::find(live.begin(), live.end(), base) != live.end()) continue;
    struct stat sb;
    if (::fstatat(updir, name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(sb.st_mode))
      continue;
    if (OlderThan(sb, age)) remove(name);
  }
  return stats;
}

// Sweeps the staging directory of the vfolder open at `vfdir`, and removes the directory once
// it is empty and old.
UploadService::SweepStats SweepVFolderDir(int vfdir, const std::string& where,
                                          std::chrono::seconds age, QuotaReservations* res) {
  UploadService::SweepStats stats;
  auto updir = OpenBeneath(vfdir, UploadService::kUploadDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (!updir.ok()) return stats;
  stats = SweepUploadDir(updir->get(), where, age, res);
  struct stat sb;
  // rmdir refuses a directory that is not empty; an old mtime means no session came or went
  // lately.
  if (::fstat(updir->get(), &sb) == 0 && OlderThan(sb, age))
    ::unlinkat(vfdir, UploadService::kUploadDir, AT_REMOVEDIR);
  return stats;
}

// Calls `fn(fd, name)` for each subdirectory of `dirfd` whose name passes `accept`.
template <typename Accept, typename Fn>
void ForEachSubdir(int dirfd, Accept accept, Fn fn) {
  auto entries = ReadDirEntries(dirfd, ".");
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    const std::string& n = e.name;
    if (!accept(std::string_view(n))) continue;
    int fd = ::openat(dirfd, n.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    UniqueFd f(fd);
    fn(f.get(), n);
  }
}

}  // namespace

UploadService::SweepStats UploadService::SweepVFolder(Volume& volume, const VFolderId& vfid) {
  auto root = OpenVFolder(volume, vfid);
  if (!root.ok()) return {};
  SweepStats st =
      SweepVFolderDir(root->get(), volume.VFolderPath(vfid), AbandonAge(), &svc_->reservations());
  if (st.removed) {
    // Staging files and sidecars (entries are approximate: a staging dir may go too; the next
    // reconcile of a maintained figure corrects that).
    volume.AccountWrite(vfid, -static_cast<int64_t>(st.removed_bytes),
                        -static_cast<int64_t>(st.removed));
  }
  return st;
}

UploadService::SweepStats UploadService::SweepAll() {
  SweepStats total;
  auto age = AbandonAge();
  auto add = [&](const SweepStats& s) {
    total.removed += s.removed;
    total.removed_bytes += s.removed_bytes;
    total.kept_locked += s.kept_locked;
  };
  for (Volume* v : svc_->Volumes()) {
    // The walk knows the directory layout of PosixVolume (v3 scope dirs and legacy v2 paths).
    if (!dynamic_cast<PosixVolume*>(v)) continue;
    auto mount = OpenDirPath(v->path());
    if (!mount.ok()) continue;
    auto hex = [](size_t n) { return [n](std::string_view s) { return IsHex(s, n, n); }; };
    // <ab>/<cd>/<rest> below `base`.
    auto walk_hash = [&](int base, const std::string& where) {
      ForEachSubdir(base, hex(2), [&](int ab, const std::string& abn) {
        ForEachSubdir(ab, hex(2), [&](int cd, const std::string& cdn) {
          ForEachSubdir(cd, hex(28), [&](int vf, const std::string& rest) {
            // Usage figures of these vfolders catch up with their next reconcile.
            add(SweepVFolderDir(vf, fmt::format("{}/{}/{}/{}", where, abn, cdn, rest), age,
                                &svc_->reservations()));
          });
        });
      });
    };
    walk_hash(mount->get(), v->path());  // legacy (v2) vfolders
    ForEachSubdir(mount->get(), hex(32), [&](int scope, const std::string& sn) {
      walk_hash(scope, v->path() + "/" + sn);
    });
  }
  if (total.removed)
    spdlog::info("upload sweep: removed {} files of abandoned upload sessions", total.removed);
  return total;
}

// ------------------------------------------------------------------------------ UploadJanitor

}  // namespace sluice
