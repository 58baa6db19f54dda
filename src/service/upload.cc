#include "service/upload.h"

#include <limits.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/path.h"
#include "service/storage_service.h"

namespace sluice {

namespace {

// How HEAD waits for a writer that is committing a whole upload.
constexpr auto kFinalizeWait = std::chrono::seconds(5);

Status NoSession(const std::string& session) {
  return Status(
      Code::kNotFound,
      fmt::format("upload session {} does not exist (expired, removed or never created)", session));
}

}  // namespace

std::string UploadTarget::final_relpath() const {
  return JoinComponents(final_parts, final_parts.size());
}

std::string UploadService::ReservationKey(const UploadTarget& t) {
  return QuotaReservations::SessionKey(
      t.volume->name(), t.vfid.scope ? t.vfid.scope->hex : std::string(), t.vfid.hex, t.session);
}

// ------------------------------------------------------------------------------ UploadWriter

UploadWriter::~UploadWriter() = default;

Status UploadWriter::SyncAt(uint64_t offset) {
  if (!failed_.ok()) return failed_;
  if (offset <= durable_) return Status::Ok();
  Status st = staging_->Sync(offset, quota_checked_);
  if (!st.ok()) {
    // After a failed sync the kernel may have dropped the dirty pages: nothing written by this
    // writer since the last good sync may ever count as durable.
    failed_ = st.WithContext(
        fmt::format("sync upload at offset {}; {} bytes are durable", offset, durable_));
    return failed_;
  }
  durable_ = offset;
  if (reservations_ && target_.volume->StagingCounted())
    reservations_->Shrink(reservation_key_, target_.size - durable_);
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
  size_t done = 0;
  Status st = staging_->WriteAt(written_, data, n, &done);
  written_ += done;
  if (!st.ok()) {
    int err = st.sys_errno();
    std::string what;
    if (err == EDQUOT)
      what = "the disk quota is exhausted";
    else if (err == ENOSPC)
      what = "the volume is out of space";
    else
      what = st.message();
    return Status(st.code(),
                  fmt::format("{} while writing the upload at offset {}; what was synced "
                              "before stays (HEAD reports the offset) and the upload can resume "
                              "from there once there is room",
                              what, written_),
                  err);
  }
  if (written_ - writeback_from_ >= kWritebackBytes) {
    // Start writeback now so that the next sync waits only for the tail.
    staging_->Writeback(writeback_from_, written_);
    writeback_from_ = written_;
  }
  // Where the staging wants its syncs at boundaries (s3: whole parts), at the last one passed;
  // before 2026-12-06 an s3 session's tail (up to two parts) was sent again every second.
  if (const uint64_t granule = staging_->SyncGranule(); granule > 0)
    return SyncAt(written_ / granule * granule);
  if (written_ - durable_ >= kSyncBytes ||
      std::chrono::steady_clock::now() - last_sync_ >= kSyncInterval)
    return Sync();
  return Status::Ok();
}

Result<uint64_t> UploadWriter::Finish() {
  if (!staging_) return durable_;  // a completed session: nothing to write
  Status st = Sync();
  // The record says the session is complete once the file is committed (HEAD, a retried
  // PATCH): an upload whose bytes needed no sync (an empty file) writes it first.
  if (st.ok() && durable_ == target_.size && !staging_->state().recorded)
    st = staging_->Sync(durable_, quota_checked_);
  if (st.ok() && durable_ == target_.size) {
    st = staging_->Commit(target_.final_parts);
    if (st.ok() && reservations_) reservations_->Release(reservation_key_);
  }
  staging_.reset();  // releases the lock
  if (!st.ok()) return st;
  return durable_;
}

void UploadWriter::Abort() {
  if (staging_ && overlong_) {
    // The body was longer than the upload: none of it counts.
    Status st = staging_->Rollback(start_, quota_checked_);
    if (st.ok()) {
      durable_ = written_ = start_;
      // A sync on the way shrank the reservation to what was left then; the rolled-back bytes
      // are to come again.
      if (reservations_) reservations_->GrowBack(reservation_key_, target_.size - start_);
    } else {
      spdlog::warn("upload {}: rolling back an over-long PATCH failed: {}", target_.session,
                   st.ToString());
    }
  } else if (staging_ && failed_.ok()) {
    Status st = Sync();
    if (!st.ok())
      spdlog::warn("upload {}: keeping {} durable bytes of an interrupted PATCH failed: {}",
                   target_.session, durable_, st.ToString());
  }
  staging_.reset();
}

// ----------------------------------------------------------------------------- UploadService

std::chrono::seconds UploadService::AbandonAge() const {
  auto expire = svc_->config().session_expire;
  return expire + std::min(expire, std::chrono::seconds(60));
}

Status UploadService::CheckSize(uint64_t size) const {
  if (size > svc_->config().max_upload_size)
    return Status(Code::kTooLarge, fmt::format("upload of {} bytes exceeds max-upload-size ({} "
                                               "bytes)",
                                               size, svc_->config().max_upload_size));
  return Status::Ok();
}

Result<UploadTarget> UploadService::ResolveGrant(const UploadGrant& g,
                                                 const std::optional<std::string>& dst_dir) const {
  UploadTarget t;
  t.session = g.session;
  t.size = g.size;
  if (!IsUploadSessionId(t.session))
    return Status(Code::kInvalidArgument, "upload token: claim 'session' is not a session id");
  auto parsed = VFolderId::Parse(g.vfid);
  if (!parsed.ok()) return parsed.status().WithContext("upload token: claim 'vfid'");
  t.vfid = std::move(parsed).value();
  std::vector<std::string> parts;
  if (dst_dir) {
    auto d = SplitRelPath(*dst_dir);
    if (!d.ok()) return d.status().WithContext("dst_dir");
    parts = std::move(d).value();
  }
  auto r = SplitRelPath(g.relpath);
  if (!r.ok()) return r.status().WithContext("upload token: claim 'relpath'");
  if (r->empty())
    return Status(Code::kInvalidPath, "upload token: claim 'relpath' does not name a file");
  parts.insert(parts.end(), r->begin(), r->end());
  if (parts.front() == kStagingDirName)
    return Status(
        Code::kInvalidPath,
        fmt::format("uploads cannot go into the staging directory '{}'", kStagingDirName));
  t.final_parts = std::move(parts);
  if (t.final_relpath().size() >= PATH_MAX)
    return Status(Code::kInvalidPath, "the upload's path is too long");
  SLUICE_ASSIGN_OR_RETURN(t.volume, svc_->GetVolume(g.volume));
  SLUICE_RETURN_IF_ERROR(CheckSize(t.size));
  return t;
}

Status ReserveScopeQuota(QuotaReservations& reservations, Volume& volume, const VFolderId& vfid,
                         const std::string& key, uint64_t more_bytes, std::string_view what) {
  if (!vfid.scope) return Status::Ok();
  // A scope without a limit has nothing to check: its usage is not measured.
  SLUICE_ASSIGN_OR_RETURN(auto has_limit, volume.quota().ScopeLimit(*vfid.scope));
  if (!has_limit) return Status::Ok();
  const std::string scope = QuotaReservations::ScopeKey(volume.name(), vfid.scope->hex);
  auto attempt = [&]() -> Status {
    const uint64_t moved = reservations.Moved(scope);  // before the usage figure is read
    SLUICE_ASSIGN_OR_RETURN(QuotaUsage q, volume.quota().DescribeScope(*vfid.scope));
    if (!q.limit_bytes) return Status::Ok();
    const uint64_t limit = *q.limit_bytes;
    return reservations.Reserve(scope, key, more_bytes, moved, [&](uint64_t others) -> Status {
      uint64_t committed = q.used_bytes + others;
      uint64_t room = limit > committed ? limit - committed : 0;
      if (more_bytes <= room) return Status::Ok();
      std::string pending =
          others ? fmt::format(", {} more promised to other uploads in progress", others) : "";
      return Status(
          Code::kQuotaExceeded,
          fmt::format("{} needs {} more bytes but quota scope {} has {} left "
                      "({} of {} bytes used{})",
                      what, more_bytes, vfid.scope->ToString(), room, q.used_bytes, limit, pending),
          EDQUOT);
    });
  };
  Status st = attempt();
  // Before refusing for what other writers were promised: those finished through another
  // node stop counting, and the scope is asked again (its usage holds their bytes now).
  if (st.code() == Code::kQuotaExceeded && reservations.Prune(scope) > 0) st = attempt();
  if (!st.ok()) return st;
  // Deleting a vfolder detaches it, then releases its reservations: one made after that
  // release (its caller checked the vfolder before the delete) finds it gone here, and goes.
  if (Status live = volume.CheckVFolder(vfid); live.code() == Code::kNotFound) {
    reservations.Release(key);
    return live;
  }
  return Status::Ok();
}

Status UploadService::ReserveQuota(const UploadTarget& t, uint64_t more_bytes) const {
  const std::string key = ReservationKey(t);
  SLUICE_RETURN_IF_ERROR(
      ReserveScopeQuota(svc_->reservations(), *t.volume, t.vfid, key, more_bytes));
  // The session may be finished or swept through another node sharing the volume, which
  // cannot release what this one reserved: it is finished once its staging file is gone.
  svc_->reservations().SetAlive(key, [v = t.volume, vfid = t.vfid, session = t.session] {
    auto s = v->InspectStaging(vfid, session);
    if (s.ok()) return s->staged;
    return s.status().code() != Code::kNotFound;  // unsure: kept
  });
  return Status::Ok();
}

Result<std::string> UploadService::CreateSession(Volume& volume, const VFolderId& vfid,
                                                 std::string_view relpath, uint64_t size) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "relpath must name a file");
  if (parts.front() == kStagingDirName)
    return Status(
        Code::kInvalidPath,
        fmt::format("uploads cannot go into the staging directory '{}'", kStagingDirName));
  SLUICE_RETURN_IF_ERROR(CheckSize(size));
  SLUICE_RETURN_IF_ERROR(volume.CheckStagedSize(size));
  SLUICE_RETURN_IF_ERROR(volume.CheckVFolder(vfid));
  SweepVFolder(volume, vfid);
  UploadTarget t;
  t.volume = &volume;
  t.vfid = vfid;
  t.final_parts = std::move(parts);
  t.size = size;
  auto session = volume.CreateStaging(vfid);
  // A sweep elsewhere may have removed an empty staging directory meanwhile: try once more.
  if (!session.ok()) session = volume.CreateStaging(vfid);
  if (!session.ok()) return session;
  t.session = *session;
  Status quota = ReserveQuota(t, size);
  if (!quota.ok()) {
    Status gone = volume.DiscardStaging(vfid, t.session);
    if (!gone.ok())
      spdlog::warn(
          "upload session {} refused, but its staging file stays (the sweep removes it): "
          "{}",
          t.session, gone.ToString());
    return quota;
  }
  return session;
}

Result<UploadProgress> UploadService::Query(const UploadTarget& t) {
  for (int attempt = 0;; ++attempt) {
    auto st = t.volume->InspectStaging(t.vfid, t.session);
    if (!st.ok()) {
      if (st.status().code() == Code::kNotFound) return NoSession(t.session);
      return st.status();
    }
    UploadProgress p;
    p.size = t.size;
    p.offset = st->durable;
    if (!st->staged) {
      // No staging file: complete when the record says every byte arrived, otherwise gone.
      if (st->recorded && st->durable == t.size) {
        p.complete = true;
        return p;
      }
      // Or the record was read before the last PATCH recorded its bytes, and the file looked
      // for after that PATCH committed it: the record, read again, says complete.
      if (attempt < 3) continue;
      return NoSession(t.session);
    }
    if (p.offset > t.size)
      return Status(Code::kIoError, fmt::format("upload session {} records offset {} past its "
                                                "length {}",
                                                t.session, p.offset, t.size));
    if (p.offset < t.size) return p;

    // Every byte is durable but the file was not committed yet: a writer is doing it now, or
    // one crashed in between. Take the writer's place and finish.
    auto w = TakeToFinish(t);
    if (!w.ok()) {
      // Finished (or swept) meanwhile: look again.
      if (w.status().code() == Code::kNotFound && attempt < 3) continue;
      if (w.status().code() == Code::kConflict)
        return Status(Code::kConflict,
                      fmt::format("upload session {} is being completed by another request; "
                                  "retry",
                                  t.session));
      return w.status();
    }
    // The writer that held the session rolled back (an over-long body after the last sync
    // reached the length): the session goes on from its offset now. (Before 2026-12-03 this
    // answered 404, which a tus client takes for an upload gone, and starts over.)
    if ((*w)->state().durable < t.size) {
      p.offset = (*w)->state().durable;
      return p;
    }
    if ((*w)->state().durable != t.size) return NoSession(t.session);  // cannot happen
    if (!(*w)->state().recorded)  // an empty file: recorded complete before it is committed
      SLUICE_RETURN_IF_ERROR((*w)->Sync(t.size, (*w)->state().quota_checked));
    SLUICE_RETURN_IF_ERROR((*w)->Commit(t.final_parts));
    svc_->reservations().Release(ReservationKey(t));
    p.complete = true;
    return p;
  }
}

Result<std::unique_ptr<StagingWriter>> UploadService::TakeToFinish(const UploadTarget& t) {
  // Before 2026-12-07 the wait was the volume's (OpenStaging's `wait`), inside its operation
  // limit: HEADs of one session whose PATCH held it could take every slot for 5 s, and the
  // volume answered 503 to everyone else.
  const std::string key = t.vfid.hex + "/" + t.session;
  {
    std::lock_guard lk(finishing_mu_);
    if (!finishing_.insert(key).second)
      return Status(Code::kConflict, "another request is waiting to complete the session");
  }
  struct Unlist {
    UploadService* s;
    const std::string& key;
    ~Unlist() {
      std::lock_guard lk(s->finishing_mu_);
      s->finishing_.erase(key);
    }
  } unlist{this, key};
  const auto deadline = std::chrono::steady_clock::now() + kFinalizeWait;
  for (;;) {
    auto w = t.volume->OpenStaging(t.vfid, t.session);
    if (w.ok() || w.status().code() != Code::kConflict ||
        std::chrono::steady_clock::now() >= deadline)
      return w;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<std::unique_ptr<UploadWriter>> UploadService::BeginWrite(const UploadTarget& t,
                                                                uint64_t client_offset,
                                                                uint64_t* current) {
  std::unique_ptr<UploadWriter> w(new UploadWriter());
  w->target_ = t;
  auto staging = t.volume->OpenStaging(t.vfid, t.session);
  if (!staging.ok()) {
    if (staging.status().code() != Code::kNotFound) return staging.status();
    auto st = t.volume->InspectStaging(t.vfid, t.session);
    if (st.ok() && !st->staged && st->recorded && st->durable == t.size) {
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
  const StagingState& state = (*staging)->state();
  uint64_t durable = state.durable;
  *current = durable;
  if (durable > t.size)
    return Status(Code::kIoError, fmt::format("upload session {} records offset {} past its "
                                              "length {}",
                                              t.session, durable, t.size));
  if (client_offset != durable)
    return Status(Code::kConflict,
                  fmt::format("Upload-Offset is {} but the upload continues at offset {}",
                              client_offset, durable));
  // The session's bytes were reserved when it was created. Its first write checks again (the
  // scope may have filled behind Sluice's back since), and so does a session found after a
  // restart or made by another process (reservations live in this process's memory).
  w->reservations_ = &svc_->reservations();
  w->reservation_key_ = ReservationKey(t);
  w->quota_checked_ = state.quota_checked;
  if (durable < t.size && (!w->quota_checked_ || !w->reservations_->Has(w->reservation_key_))) {
    SLUICE_RETURN_IF_ERROR(ReserveQuota(t, t.size - (t.volume->StagingCounted() ? durable : 0)));
    w->quota_checked_ = true;
  }
  // Refuse early what the commit would refuse anyway.
  auto existing = t.volume->Stat(t.vfid, t.final_relpath());
  if (existing.ok()) {
    if (existing->type == EntryType::kDirectory)
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
  w->staging_ = std::move(staging).value();
  w->start_ = w->durable_ = w->written_ = w->writeback_from_ = durable;
  w->last_sync_ = std::chrono::steady_clock::now();
  return w;
}

// ------------------------------------------------------------------------------------ sweeps

UploadService::SweepStats UploadService::SweepVFolder(Volume& volume, const VFolderId& vfid) {
  return volume.SweepStaging(
      vfid, AbandonAge(),
      [&](const std::string& scope_hex, const std::string& vf_hex, const std::string& session) {
        svc_->reservations().Release(
            QuotaReservations::SessionKey(volume.name(), scope_hex, vf_hex, session));
      });
}

UploadService::SweepStats UploadService::SweepAll() {
  SweepStats total;
  for (Volume* v : svc_->Volumes()) {
    SweepStats s = v->SweepStaging(
        std::nullopt, AbandonAge(),
        [&](const std::string& scope_hex, const std::string& vf_hex, const std::string& session) {
          svc_->reservations().Release(
              QuotaReservations::SessionKey(v->name(), scope_hex, vf_hex, session));
        });
    total.removed += s.removed;
    total.removed_bytes += s.removed_bytes;
    total.kept_locked += s.kept_locked;
  }
  if (total.removed)
    spdlog::info("upload sweep: removed {} files of abandoned upload sessions", total.removed);
  // Sessions this node reserved for that were finished or swept through another node.
  if (size_t n = svc_->reservations().Prune())
    spdlog::info(
        "upload sweep: released the quota reservations of {} upload sessions "
        "finished through another node",
        n);
  return total;
}

}  // namespace sluice
