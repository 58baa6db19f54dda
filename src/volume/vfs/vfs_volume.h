// The generic backend: any directory. Quota scopes are directories; a scope's limit is stored
// beside its vfolders and enforced by Sluice on writes that go through it.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "volume/posix_volume.h"
#include "volume/usage_tracker.h"

namespace sluice {

class VfsQuotaModel : public QuotaModel {
 public:
  // Scope usage is the sum of the scope's vfolder figures kept by `usage`.
  VfsQuotaModel(PosixVolume* vol, UsageTracker* usage) : vol_(vol), usage_(usage) {}

  std::string ScopePath(const QuotaScopeId& qsid) const override;
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) override;
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override;
  Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qsid) override;
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) override;
  Status UnsetQuota(const QuotaScopeId& qsid) override;
  Status DeleteScope(const QuotaScopeId& qsid) override;

  // The file in the scope directory that holds the limit.
  static constexpr const char* kLimitFile = ".sluice-quota.json";

 private:
  Status WriteLimit(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes);
  Result<std::optional<uint64_t>> ReadLimit(const QuotaScopeId& qsid) const;

  PosixVolume* vol_;
  UsageTracker* usage_;
};

// Options ([volume.NAME.options]):
//   usage-reconcile-interval  how old a maintained usage figure may get before a background
//                             walk re-measures it (duration, default "60s")
//   usage-walk-budget         a vfolder whose last walk took at most this long is walked on
//                             every usage request, exactly (duration, default "10ms"; "0s"
//                             always uses the maintained figure)
class VfsVolume : public PosixVolume {
 public:
  VfsVolume(VolumeConfig cfg, ThreadPool* scan_pool,
            std::chrono::milliseconds reconcile_after = kDefaultReconcileAfter,
            std::chrono::microseconds walk_budget = kDefaultWalkBudget);
  std::set<std::string> capabilities() const override;
  QuotaModel& quota() override { return quota_; }

  // Maintained figures (see usage_tracker.h): a walk only for the first request after start.
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  // Walks now and replaces the maintained figure.
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override;
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  void AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t entries) override;

  UsageTracker& usage_tracker() { return usage_; }

  static constexpr std::chrono::milliseconds kDefaultReconcileAfter{60'000};
  static constexpr std::chrono::microseconds kDefaultWalkBudget{10'000};

 private:
  UsageTracker usage_;
  VfsQuotaModel quota_;
};

}  // namespace sluice
