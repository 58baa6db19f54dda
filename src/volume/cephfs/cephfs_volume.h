// The cephfs backend (`backend = "cephfs"`): the volume path is a CephFS mount (kernel client or
// ceph-fuse).
//   <mount>/<scope hex>                  a directory per quota scope; its limit is the
//                                        ceph.quota.max_bytes xattr (0 or absent: no limit)
//   <mount>/<scope hex>/<ab>/<cd>/<rest> a vfolder (a plain directory)
// Usage is O(1): the MDS keeps recursive statistics per directory (ceph.dir.rbytes,
// ceph.dir.rentries). They lag writes by seconds, and CephFS enforces quotas lazily (clients
// learn of a full scope at their next cap update), so bytes written through Sluice are also
// kept here for a while (the pending-write window) and counted on top of ceph.dir.rbytes when
// Sluice checks a limit: an upload cannot overshoot because the MDS has not caught up yet.
//
// Options ([volume.NAME.options]):
//   pending-write-window  how long bytes written through Sluice count on top of rbytes in
//                         limit checks (duration, default "30s"; the measured rbytes lag is
//                         in docs/decisions.md)
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "volume/posix_volume.h"

namespace sluice {

class CephfsVolume;

class CephfsQuotaModel : public QuotaModel {
 public:
  explicit CephfsQuotaModel(CephfsVolume* vol) : vol_(vol) {}

  std::string ScopePath(const QuotaScopeId& qsid) const override;
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) override;
  // used_bytes: ceph.dir.rbytes plus what Sluice wrote in the pending-write window.
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override;
  Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qsid) override;
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) override;
  Status UnsetQuota(const QuotaScopeId& qsid) override;
  Status DeleteScope(const QuotaScopeId& qsid) override;

 private:
  Status SetLimit(const QuotaScopeId& qsid, uint64_t limit_bytes) const;

  CephfsVolume* vol_;
};

class CephfsVolume : public PosixVolume {
 public:
  CephfsVolume(VolumeConfig cfg, ThreadPool* scan_pool,
               std::chrono::milliseconds pending_window = kDefaultPendingWindow);

  std::set<std::string> capabilities() const override;
  // Refuses a path that is not on CephFS (no ceph.dir.rbytes).
  Status Init() override;
  QuotaModel& quota() override { return quota_; }
  HwInfo GetHwInfo() override;
  // From the MDS's recursive statistics: no walk.
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  void AccountWrite(const VFolderId& vfid, int64_t bytes, int64_t entries) override;

  // Bytes written through Sluice into the scope within the pending-write window.
  uint64_t PendingBytes(const std::string& scope_hex);

  static constexpr std::chrono::milliseconds kDefaultPendingWindow{30'000};

 private:
  friend class CephfsQuotaModel;
  using Clock = std::chrono::steady_clock;
  CephfsQuotaModel quota_;
  std::chrono::milliseconds pending_window_;
  std::mutex pending_mu_;
  std::map<std::string, std::deque<std::pair<Clock::time_point, uint64_t>>> pending_;
};

}  // namespace sluice
