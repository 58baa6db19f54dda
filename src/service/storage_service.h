// Backend-agnostic use cases of the control plane: volumes, quota scopes, vfolders and file
// operations. Every method may block on the filesystem: callers run them on a worker pool.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "service/bgtask.h"
#include "service/event_bus.h"
#include "service/reservations.h"
#include "service/tokens.h"
#include "volume/noop/noop_volume.h"
#include "volume/volume.h"

namespace sluice {

class StorageService {
 public:
  StorageService(const Config& cfg, std::vector<std::unique_ptr<Volume>> volumes,
                 ThreadPool* task_pool);

  const Config& config() const { return cfg_; }
  BgTaskManager& tasks() { return tasks_; }
  // The client API's session tokens ([storage-proxy] secret and session-expire).
  const TokenService& tokens() const { return tokens_; }
  // Bytes promised to upload sessions, per quota scope (see reservations.h).
  QuotaReservations& reservations() { return reservations_; }
  // Where vfolder clones and deletes report completion (Backend.AI's event bus); null: nowhere.
  // Set before the first request.
  void SetEventBus(EventBus* bus) { events_ = bus; }

  // kNotFound naming the volume when it is not configured.
  // A configured volume, or "noop" (unmanaged vfolders), which is never listed.
  Result<Volume*> GetVolume(const std::string& name) const;
  NoopVolume& noop() { return *noop_; }
  std::vector<Volume*> Volumes() const;

  // --- quota scopes ---
  Status CreateQuotaScope(const std::string& volume, const QuotaScopeId& qsid,
                          std::optional<uint64_t> limit);
  Result<QuotaUsage> DescribeQuotaScope(const std::string& volume, const QuotaScopeId& qsid);
  Status UpdateQuotaScope(const std::string& volume, const QuotaScopeId& qsid, uint64_t limit);
  Status UnsetQuota(const std::string& volume, const QuotaScopeId& qsid);
  Status DeleteQuotaScope(const std::string& volume, const QuotaScopeId& qsid);

  // --- vfolders ---
  Status CreateVFolder(const std::string& volume, const VFolderId& vfid, mode_t mode,
                       std::optional<uint64_t> initial_scope_limit);
  // Detaches the vfolder now and removes its contents in a background task; returns the task id.
  Result<std::string> DeleteVFolder(const std::string& volume, const VFolderId& vfid);
  // Creates the destination now and copies in a background task; a failed copy removes the
  // destination again. Returns the task id.
  Result<std::string> CloneVFolder(const std::string& src_volume, const VFolderId& src,
                                   const std::string& dst_volume, const VFolderId& dst);
  // Deletes files in a background task; returns the task id.
  Result<std::string> DeleteFilesAsync(const std::string& volume, const VFolderId& vfid,
                                       std::vector<std::string> relpaths, bool recursive);
  // Finishes what vfolder tasks cut short by the last stop began, in background tasks, so that
  // the manager hears how each ended (it waits for the event, not the task): a delete's
  // detached tree is removed from the trash and announced; a clone's destination, partly
  // copied, is removed and the clone announced failed. Call once at start.
  void ResumeInterrupted(const std::vector<BgTaskInfo>& tasks);

 private:
  Config cfg_;
  // Sends a completion event, if there is a bus; a lost event is logged (it cannot fail the task).
  void Announce(const BusEvent& e);
  // Detaches and deletes a clone's destination (a clone failed or cut short); logs what stays.
  void RemoveCloneDestination(Volume* dv, const VFolderId& dst);

  std::map<std::string, std::unique_ptr<Volume>> volumes_;
  std::unique_ptr<NoopVolume> noop_;
  TokenService tokens_;
  QuotaReservations reservations_;  // before tasks_: running tasks use it
  EventBus* events_ = nullptr;
  BgTaskManager tasks_;
};

}  // namespace sluice
