// The generic backend: any directory. Quota scopes are directories; a scope's limit is stored
// beside its vfolders and enforced by Sluice on writes that go through it.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "volume/posix_volume.h"

namespace sluice {

class VfsQuotaModel : public QuotaModel {
 public:
  VfsQuotaModel(std::string mount, FSOpModel* fsop) : mount_(std::move(mount)), fsop_(fsop) {}

  std::string ScopePath(const QuotaScopeId& qsid) const override;
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) override;
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override;
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) override;
  Status UnsetQuota(const QuotaScopeId& qsid) override;
  Status DeleteScope(const QuotaScopeId& qsid) override;

  // The file in the scope directory that holds the limit.
  static constexpr const char* kLimitFile = ".sluice-quota.json";

 private:
  Status CheckScope(const QuotaScopeId& qsid) const;
  Status WriteLimit(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes);
  Result<std::optional<uint64_t>> ReadLimit(const QuotaScopeId& qsid) const;

  std::string mount_;
  FSOpModel* fsop_;
};

class VfsVolume : public PosixVolume {
 public:
  VfsVolume(VolumeConfig cfg, ThreadPool* scan_pool);
  std::set<std::string> capabilities() const override;
  QuotaModel& quota() override { return quota_; }

  // A tree walk per request, but requests for a vfolder whose walk is already running share
  // that walk's result instead of starting another (a burst of N requests costs one walk).
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;

 private:
  VfsQuotaModel quota_;
  std::mutex scans_mu_;
  std::map<std::string, std::shared_future<Result<TreeUsage>>> scans_;
};

}  // namespace sluice
