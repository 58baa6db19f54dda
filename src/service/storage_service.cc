#include "service/storage_service.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "service/upload.h"

namespace sluice {

StorageService::StorageService(const Config& cfg, std::vector<std::unique_ptr<Volume>> volumes,
                               ThreadPool* task_pool)
    : cfg_(cfg),
      noop_(std::make_unique<NoopVolume>(cfg.unmanaged_roots, task_pool)),
      tokens_(cfg.secret, cfg.session_expire),
      tasks_(task_pool) {
  for (auto& v : volumes) {
    std::string n = v->name();
    volumes_.emplace(std::move(n), std::move(v));
  }
}

Result<Volume*> StorageService::GetVolume(const std::string& name) const {
  auto it = volumes_.find(name);
  if (it == volumes_.end() && name == NoopVolume::kName) return noop_.get();
  if (it == volumes_.end())
    return Status(Code::kNotFound, fmt::format("volume '{}' is not configured", name))
        .About(Subject::kVolume);
  return it->second.get();
}

std::vector<Volume*> StorageService::Volumes() const {
  std::vector<Volume*> out;
  for (const auto& [k, v] : volumes_) out.push_back(v.get());
  return out;
}

Status StorageService::CreateQuotaScope(const std::string& volume, const QuotaScopeId& qsid,
                                        std::optional<uint64_t> limit) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->quota().CreateScope(qsid, limit);
}

Result<QuotaUsage> StorageService::DescribeQuotaScope(const std::string& volume,
                                                      const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->quota().DescribeScope(qsid);
}

Status StorageService::UpdateQuotaScope(const std::string& volume, const QuotaScopeId& qsid,
                                        uint64_t limit) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->quota().UpdateScope(qsid, limit);
}

Status StorageService::UnsetQuota(const std::string& volume, const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->quota().UnsetQuota(qsid);
}

Status StorageService::DeleteQuotaScope(const std::string& volume, const QuotaScopeId& qsid) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->quota().DeleteScope(qsid);
}

Status StorageService::CreateVFolder(const std::string& volume, const VFolderId& vfid, mode_t mode,
                                     std::optional<uint64_t> initial_scope_limit) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  return v->CreateVFolder(vfid, mode, cfg_.allow_auto_quota_scope_creation, initial_scope_limit);
}

Result<std::string> StorageService::DeleteVFolder(const std::string& volume,
                                                  const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  SLUICE_ASSIGN_OR_RETURN(std::string detached, v->DetachVFolder(vfid));
  spdlog::info("vfolder {} on {} detached to {}", vfid.ToString(), volume, detached);
  // Its upload sessions went with it (into the trash): what they reserved is released.
  reservations_.ReleaseVFolder(v->name(), vfid.hex);
  return tasks_.Start("vfolder-delete", {{"volume", volume}, {"vfid", vfid.ToString()}},
                      [this, v, detached, vfid] {
                        Status st = v->fsop().DeleteTree(detached);
                        Announce(st.ok() ? VFolderDeletionSuccess(vfid.ToString())
                                         : VFolderDeletionFailure(vfid.ToString(), st.message()));
                        return st;
                      });
}

void StorageService::Announce(const BusEvent& e) {
  if (!events_) return;
  Status s = events_->Publish(e);
  if (!s.ok()) spdlog::error("event {} {} is lost: {}", e.name, e.payload.dump(), s.ToString());
}

Result<std::string> StorageService::CloneVFolder(const std::string& src_volume,
                                                 const VFolderId& src,
                                                 const std::string& dst_volume,
                                                 const VFolderId& dst) {
  SLUICE_ASSIGN_OR_RETURN(Volume * sv, GetVolume(src_volume));
  SLUICE_ASSIGN_OR_RETURN(Volume * dv, GetVolume(dst_volume));
  SLUICE_RETURN_IF_ERROR(sv->CheckVFolder(src));
  if (src_volume == dst_volume && src == dst)
    return Status(Code::kInvalidArgument, "source and destination of a clone are the same vfolder");
  mode_t mode = 0755;
  if (auto root = sv->Stat(src, ""); root.ok()) mode = root->mode & 07777;
  // Destination scope is created on demand, as Backend.AI does for clones.
  SLUICE_RETURN_IF_ERROR(dv->CreateVFolder(dst, mode, true, std::nullopt));
  nlohmann::json params = {{"src_volume", src_volume},
                           {"src_vfid", src.ToString()},
                           {"dst_volume", dst_volume},
                           {"dst_vfid", dst.ToString()}};
  auto task = [this, sv, dv, src, dst, task_params = params](
                  const BgTaskManager::Report&,
                  const BgTaskManager::Checkpoint& checkpoint) -> Status {
    auto copy = [&]() -> Status {
      // Unmanaged vfolders are not copied, whatever the destination (as the reference).
      if (sv == noop_.get())
        return Status(Code::kUnsupported,
                      fmt::format("volume {} cannot copy from volume {} (unmanaged vfolders)",
                                  dv->name(), sv->name()));
      // The copy walks the whole tree anyway: a fresh figure costs little more.
      SLUICE_ASSIGN_OR_RETURN(TreeUsage need, sv->GetFreshUsage(src));
      SLUICE_ASSIGN_OR_RETURN(FsUsage fs, dv->GetFsUsage());
      if (need.used_bytes > fs.available_bytes)
        return Status(Code::kNoSpace,
                      fmt::format("clone needs {} bytes; volume {} has {} available",
                                  need.used_bytes, dv->name(), fs.available_bytes));
      // The copy's bytes are promised in the scope until they count as used (the backend adds
      // them when the copy ends), as an upload's are: uploads and clones that start meanwhile
      // count them. A delete of the destination releases them too (its vfolder's key).
      const std::string key =
          dst.scope ? QuotaReservations::SessionKey(dv->name(), dst.scope->hex, dst.hex, "clone")
                    : "";
      SLUICE_RETURN_IF_ERROR(
          ReserveScopeQuota(reservations_, *dv, dst, key, need.used_bytes, "the clone"));
      // Within one volume the backend may clone faster (snapshot, reflink).
      Status st = dv->CopyVFolderFrom(*sv, src, dst, need);
      if (dst.scope) reservations_.Release(key);
      return st;
    };
    Status st = copy();
    if (st.ok()) {
      // Recorded before it is announced: a restart that finds the task cut short after this
      // keeps the clone (and announces it again) instead of removing one the manager may have
      // heard succeed. A record that cannot be written is announced all the same.
      nlohmann::json done = task_params;
      done["copied"] = true;
      if (Status cp = checkpoint(std::move(done)); !cp.ok())
        spdlog::warn("clone {} -> {}: its completion is not recorded: {}", src.ToString(),
                     dst.ToString(), cp.ToString());
      Announce(VFolderCloneSuccess(src.ToString(), dst.ToString()));
    }
    if (!st.ok()) {
      RemoveCloneDestination(dv, dst);  // nothing half-copied stays visible
      st = st.WithContext(fmt::format("clone {} -> {}", src.ToString(), dst.ToString()));
      Announce(VFolderCloneFailure(src.ToString(), dst.ToString(), st.message()));
      return st;
    }
    return Status::Ok();
  };
  auto id = tasks_.Start("vfolder-clone", std::move(params),
                         BgTaskManager::CheckpointingFn(std::move(task)));
  if (!id.ok()) RemoveCloneDestination(dv, dst);
  return id;
}

void StorageService::RemoveCloneDestination(Volume* dv, const VFolderId& dst) {
  auto detached = dv->DetachVFolder(dst);
  Status st = detached.ok() ? dv->fsop().DeleteTree(*detached) : detached.status();
  if (!st.ok() && st.code() != Code::kNotFound)
    spdlog::error("clone cleanup of {} failed: {}", dst.ToString(), st.ToString());
}

void StorageService::ResumeInterrupted(const std::vector<BgTaskInfo>& tasks) {
  for (const auto& t : tasks) {
    auto str = [&](const char* k) {
      auto it = t.params.find(k);
      return it != t.params.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    Result<std::string> id = std::string();
    if (t.kind == "vfolder-delete") {
      auto v = GetVolume(str("volume"));
      auto vfid = VFolderId::Parse(str("vfid"));
      if (!v.ok() || !vfid.ok()) continue;
      spdlog::info(
          "bgtask {}: the delete of vfolder {} was cut short by the last stop; its "
          "trash is emptied now",
          t.id, vfid->ToString());
      id = tasks_.Start("vfolder-delete", t.params, [this, v = *v, vfid = *vfid]() -> Status {
        // The janitor empties the same trash meanwhile: a removal that lost a race to it is
        // done when a second look finds nothing left to fail on. Only this vfolder's: another
        // that cannot go is not this delete's failure (before 2026-12-03 it was announced so).
        Status st;
        for (int attempt = 0; attempt < 3; ++attempt) {
          st = v->EmptyTrashOf(vfid);
          if (st.ok()) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        Announce(st.ok() ? VFolderDeletionSuccess(vfid.ToString())
                         : VFolderDeletionFailure(vfid.ToString(), st.message()));
        return st;
      });
    } else if (t.kind == "vfolder-clone") {
      auto dv = GetVolume(str("dst_volume"));
      auto src = VFolderId::Parse(str("src_vfid"));
      auto dst = VFolderId::Parse(str("dst_vfid"));
      if (!dv.ok() || !src.ok() || !dst.ok()) continue;
      if (t.params.value("copied", false)) {
        // Its copy had ended (and was recorded so) when the stop came: the clone stands, and
        // its success is announced again (it may not have gone out).
        spdlog::info(
            "bgtask {}: the clone {} -> {} had finished copying before the last stop; "
            "it stands",
            t.id, src->ToString(), dst->ToString());
        id = tasks_.Start("vfolder-clone", t.params, [this, src = *src, dst = *dst] {
          Announce(VFolderCloneSuccess(src.ToString(), dst.ToString()));
          return Status::Ok();
        });
      } else {
        spdlog::info(
            "bgtask {}: the clone {} -> {} was cut short by the last stop; its "
            "destination is removed",
            t.id, src->ToString(), dst->ToString());
        id = tasks_.Start("vfolder-clone", t.params, [this, dv = *dv, src = *src, dst = *dst] {
          RemoveCloneDestination(dv, dst);
          const std::string why = "interrupted: sluiced stopped before the clone finished";
          Announce(VFolderCloneFailure(src.ToString(), dst.ToString(), why));
          return Status(Code::kUnavailable, why, EINTR);
        });
      }
    }
    if (!id.ok()) spdlog::error("bgtask {}: cannot be resumed: {}", t.id, id.status().ToString());
  }
}

Result<std::string> StorageService::DeleteFilesAsync(const std::string& volume,
                                                     const VFolderId& vfid,
                                                     std::vector<std::string> relpaths,
                                                     bool recursive) {
  SLUICE_ASSIGN_OR_RETURN(Volume * v, GetVolume(volume));
  SLUICE_RETURN_IF_ERROR(v->CheckVFolder(vfid));
  // The task's record (kept in memory and in the history, 10,000 tasks deep) names the first
  // paths and counts the rest: a request of 200,000 paths would otherwise keep them all.
  constexpr size_t kShown = 100;
  nlohmann::json shown = nlohmann::json::array();
  for (size_t i = 0; i < relpaths.size() && i < kShown; ++i) shown.push_back(relpaths[i]);
  nlohmann::json params = {{"volume", volume},
                           {"vfid", vfid.ToString()},
                           {"relpaths", std::move(shown)},
                           {"relpath_count", relpaths.size()},
                           {"recursive", recursive}};
  return tasks_.Start("file-delete", std::move(params),
                      [v, vfid, relpaths = std::move(relpaths), recursive] {
                        return v->DeleteFiles(vfid, relpaths, recursive);
                      });
}

}  // namespace sluice
