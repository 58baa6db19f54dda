// Resumable uploads (the storage side of tus 1.0.0), backend-agnostic: sessions are the
// staging files of the Volume interface (StagingWriter; on directory volumes
// volume/posix_staging.h says how they lie on disk), this layer keeps the protocol.
//
// The durable offset is what HEAD reports and what PATCH must continue from; bytes past it
// (left by a writer that crashed between two syncs) are cut off when the next writer opens the
// session. One writer at a time (the volume's lock).
//
// Completion: when the durable offset reaches the session's size, the record says so first,
// then the staging file is committed under its final path (parents created beneath the
// vfolder). A session whose record says "size" and whose staging file is gone is complete; one
// whose staging file is still there is finished by the next HEAD or PATCH (a crash between the
// two steps loses nothing).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "service/reservations.h"
#include "service/tokens.h"
#include "volume/ids.h"
#include "volume/volume.h"

namespace sluice {

class StorageService;

// What an upload token names, validated.
struct UploadTarget {
  Volume* volume = nullptr;
  VFolderId vfid;
  std::string session;
  std::vector<std::string> final_parts;  // components of the final path below the vfolder
  uint64_t size = 0;

  std::string final_relpath() const;
};

// Where a session stands.
struct UploadProgress {
  uint64_t offset = 0;  // durable bytes
  uint64_t size = 0;
  bool complete = false;  // renamed into place
};

// Writes one PATCH body into a session. Obtained from UploadService::BeginWrite, which took the
// session's lock; the lock is released by Finish, Abort or destruction.
class UploadWriter {
 public:
  ~UploadWriter();
  UploadWriter(const UploadWriter&) = delete;
  UploadWriter& operator=(const UploadWriter&) = delete;

  // Appends the next piece. kTooLarge when it would run past the session's size (the whole
  // PATCH is then void: Abort rolls back to the offset it started at); filesystem errors
  // (EDQUOT, ENOSPC, EIO) as they come. Syncs and advances the durable offset every kSyncBytes
  // or kSyncInterval.
  Status Write(const char* data, size_t n);
  // The body is complete: sync, advance the durable offset, and rename the file into place
  // when it is whole. Returns the durable offset.
  Result<uint64_t> Finish();
  // The body was cut short (client gone, an error): keep what was received (sync and advance
  // the offset as far as the sync got), then release the lock. After a body that ran past the
  // upload's length, roll back to where the PATCH started instead.
  void Abort();

  uint64_t durable_offset() const { return durable_; }
  uint64_t written_offset() const { return written_; }

  static constexpr uint64_t kSyncBytes = 64ull << 20;
  static constexpr std::chrono::milliseconds kSyncInterval{1000};
  // Writeback is started (sync_file_range) every this many bytes, so that a sync waits only for
  // the tail.
  static constexpr uint64_t kWritebackBytes = 8ull << 20;

 private:
  friend class UploadService;
  UploadWriter() = default;

  Status Sync() { return SyncAt(written_); }
  Status SyncAt(uint64_t offset);  // makes the bytes up to `offset` (<= written_) durable

  UploadTarget target_;
  QuotaReservations* reservations_ = nullptr;
  std::string reservation_key_;
  std::unique_ptr<StagingWriter> staging_;  // holds the session's lock; null once complete
  uint64_t start_ = 0;                      // the offset this PATCH started at
  uint64_t durable_ = 0;
  uint64_t written_ = 0;
  bool overlong_ = false;
  uint64_t writeback_from_ = 0;
  bool quota_checked_ = false;
  std::chrono::steady_clock::time_point last_sync_;
  Status failed_;  // the first write/sync error; no more syncs after it
};

// Refuses `more_bytes` for the writer `key` in vfolder `vfid` of `volume` when they do not fit
// its quota scope's limit, counting what other writers of the scope have reserved (kQuotaExceeded
// saying how much is left); reserves them for `key` when they fit. Shared by every write path
// (tus sessions, S3 objects).
// `what` names the writer in the refusal ("the upload needs N more bytes ..."). kNotFound (and
// nothing reserved) when the vfolder is gone.
Status ReserveScopeQuota(QuotaReservations& reservations, Volume& volume, const VFolderId& vfid,
                         const std::string& key, uint64_t more_bytes,
                         std::string_view what = "the upload");

class UploadService {
 public:
  explicit UploadService(StorageService* svc) : svc_(svc) {}

  // Validates the grant of a verified upload token and the optional `dst_dir` query parameter
  // (a directory below the vfolder that `relpath` is relative to, as in Backend.AI).
  // kInvalidArgument / kInvalidPath for hostile or malformed claims, kNotFound for an unknown
  // volume, kTooLarge for a size over max-upload-size.
  Result<UploadTarget> ResolveGrant(const UploadGrant& grant,
                                    const std::optional<std::string>& dst_dir) const;

  // kTooLarge when an upload of `size` bytes exceeds max-upload-size: the one place it is
  // checked (sessions, tokens).
  Status CheckSize(uint64_t size) const;

  // The manager side: sweeps the vfolder's abandoned sessions, refuses an upload that would not
  // fit the quota scope's limit, and creates the staging file. Returns the session id.
  Result<std::string> CreateSession(Volume& volume, const VFolderId& vfid, std::string_view relpath,
                                    uint64_t size);

  // HEAD: the durable offset. Finishes a session whose bytes are all durable but which was not
  // yet renamed into place (a crash between the two steps). kNotFound for an unknown, expired
  // or vanished session.
  Result<UploadProgress> Query(const UploadTarget& t);

  // PATCH: takes the session's lock (kConflict when another request holds it), checks that
  // `client_offset` is the durable offset (kConflict otherwise; `*current` receives the durable
  // offset whenever it is known), discards bytes past it, checks the quota on the session's
  // first write, and returns a writer positioned at the offset.
  Result<std::unique_ptr<UploadWriter>> BeginWrite(const UploadTarget& t, uint64_t client_offset,
                                                   uint64_t* current);

  using SweepStats = StagingSweep;
  // Removes the staging files, sidecars and leftovers of sessions abandoned for longer than
  // session-expire (plus a grace for clock skew) from one vfolder, or from every vfolder of
  // every volume. Sessions that a writer holds are kept.
  SweepStats SweepVFolder(Volume& volume, const VFolderId& vfid);
  SweepStats SweepAll();

  // Age after which a session's files count as abandoned.
  std::chrono::seconds AbandonAge() const;

  // The key of a session's bytes in QuotaReservations.
  static std::string ReservationKey(const UploadTarget& t);

 private:
  // Refuses `more_bytes` that do not fit the scope's limit, counting what other sessions of the
  // scope have reserved; reserves them for session `t.session` when they fit.
  Status ReserveQuota(const UploadTarget& t, uint64_t more_bytes) const;
  // The session's writer, for a HEAD that finishes it: waits for another writer to let go by
  // polling, outside the volume's operation limit, and one request per session at a time.
  Result<std::unique_ptr<StagingWriter>> TakeToFinish(const UploadTarget& t);

  StorageService* svc_;
  std::mutex finishing_mu_;
  std::set<std::string> finishing_;  // sessions a HEAD waits to finish
};

}  // namespace sluice
