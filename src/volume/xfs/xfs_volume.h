// The xfs and ext4 backends (`backend = "xfs"`, `backend = "ext4"`): project quotas.
//   <mount>/<scope hex>                  a directory per quota scope, with a project id and
//                                        FS_XFLAG_PROJINHERIT (everything made below inherits it)
//   <mount>/<scope hex>/.sluice-project-id  that id, in decimal
//   <mount>/<scope hex>/<ab>/<cd>/<rest> a vfolder (a plain directory)
//   <mount>/.sluice-project-ids          the next project id to hand out (under flock)
// Limits and usage come from quotactl(2) on the project quota of the filesystem's block device.
// When the kernel does not account project quotas (no quota support built in, or the filesystem
// mounted without prjquota) the volume still works, reports itself degraded with the reason, uses
// tree walks for usage and refuses limits with kUnsupported. Clones reflink each file (FICLONE,
// through PosixFSOpModel::CopyTree); the copies inherit the destination scope's project id.
#pragma once

#include <mutex>
#include <string>

#include "volume/posix_volume.h"
#include "volume/xfs/xfs_fs.h"

namespace sluice {

class XfsVolume;

class XfsQuotaModel : public QuotaModel {
 public:
  explicit XfsQuotaModel(XfsVolume* vol) : vol_(vol) {}

  std::string ScopePath(const QuotaScopeId& qsid) const override;
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) override;
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override;
  Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qsid) override;
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) override;
  Status UnsetQuota(const QuotaScopeId& qsid) override;
  Status DeleteScope(const QuotaScopeId& qsid) override;

  // The project id of an existing scope. A scope directory without the id file (made by hand or
  // by an interrupted create) is adopted: it gets a new id, set on it and everything in it.
  Result<uint32_t> ScopeProject(const QuotaScopeId& qsid);

  // The file in the scope directory that holds the scope's project id.
  static constexpr const char* kProjectIdFile = ".sluice-project-id";

 private:
  Result<std::optional<uint32_t>> ReadIdFile(const QuotaScopeId& qsid) const;
  Status WriteIdFile(const QuotaScopeId& qsid, uint32_t id) const;

  XfsVolume* vol_;
  std::mutex mu_;  // scope create / adopt / delete
};

class XfsVolume : public PosixVolume {
 public:
  enum class Kind { kXfs, kExt4 };
  XfsVolume(VolumeConfig cfg, ThreadPool* scan_pool, Kind kind);

  std::set<std::string> capabilities() const override;
  Status Init() override;
  QuotaModel& quota() override { return quota_; }
  HwInfo GetHwInfo() override;
  // A vfolder in a scope made elsewhere adopts that scope first, so the vfolder carries its id.
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;

  // Whether the kernel enforces project quota limits here (known after Init).
  bool limits_enforced() const { return quota_state_.enforcing && quota_state_.accounting; }
  // Why limits are not enforced ("" when they are).
  const std::string& degraded_reason() const { return degraded_reason_; }
  bool reflink() const { return reflink_; }
  const std::string& device() const { return device_; }

  // <mount>/.sluice-project-ids: the next id to hand out.
  std::string ProjectCounterFile() const;
  // A project id no scope of this volume has had yet.
  Result<uint32_t> AllocateProjectId();

  // Project ids start here, above the small ids that /etc/projects setups use by hand.
  static constexpr uint32_t kFirstProjectId = 1000000;

 private:
  friend class XfsQuotaModel;
  Status RefuseLimit(const QuotaScopeId& qsid) const;
  std::string_view FsName() const { return kind_ == Kind::kXfs ? "XFS" : "ext4"; }

  Kind kind_;
  XfsQuotaModel quota_;
  std::string device_;
  xfs::QuotaState quota_state_;
  std::string degraded_reason_;
  bool reflink_ = false;
  bool projects_ = true;  // project ids can be set (not on ext4 without the project feature)
  std::mutex counter_mu_;
};

}  // namespace sluice
