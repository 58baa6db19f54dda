#include "volume/noop/noop_volume.h"

#include <climits>
#include <cstdlib>

#include <fmt/format.h>

#include "common/metrics.h"
#include "volume/posix_volume.h"

namespace sluice {

class NoopVolume::Quota : public QuotaModel {
 public:
  std::string ScopePath(const QuotaScopeId&) const override { return "."; }
  Status CreateScope(const QuotaScopeId&, std::optional<uint64_t>) override { return Status::Ok(); }
  // No scope ever exists here: the reference answers "quota scope not found".
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override {
    return MissingQuotaScope(qsid, kName);
  }
  Status UpdateScope(const QuotaScopeId&, uint64_t) override { return Status::Ok(); }
  Status UnsetQuota(const QuotaScopeId& qsid) override { return MissingQuotaScope(qsid, kName); }
  Status DeleteScope(const QuotaScopeId&) override { return Status::Ok(); }
};

class NoopVolume::FsOp : public FSOpModel {
 public:
  Status CopyTree(const std::string&, const std::string&) override { return Status::Ok(); }
  Status MoveTree(const std::string&, const std::string&) override { return Status::Ok(); }
  Status DeleteTree(const std::string&) override { return Status::Ok(); }
  Result<TreeUsage> ScanTree(const std::string&) override { return TreeUsage{}; }
};

namespace {

// An empty directory: what listing an unmanaged vfolder shows.
class EmptyDir : public DirHandle {
 public:
  EmptyDir() {
    info_.type = EntryType::kDirectory;
    info_.mode = 040755;
  }
  const DirEntry& info() const override { return info_; }
  Result<std::optional<Name>> Next() override { return std::optional<Name>(); }
  Result<DirEntry> StatEntry(const std::string& name) override { return Missing(name); }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    return Missing(name);
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    return Missing(name);
  }

 private:
  static Status Missing(const std::string& name) {
    return Status(Code::kNotFound, fmt::format("'{}' does not exist", name), ENOENT);
  }
  DirEntry info_;
};

Status NoUploads() {
  return Status(Code::kUnsupported,
                "unmanaged vfolders (volume 'noop') take no uploads: write to the directory "
                "itself");
}

std::optional<std::string> Canonical(const std::string& p) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) return std::nullopt;
  return std::string(buf);
}

}  // namespace

// One unmanaged directory, read through the POSIX backend's beneath-the-root opens: every vfolder
// id maps to the directory itself. Only the download path uses it.
class NoopVolume::TreeVolume : public PosixVolume {
 public:
  TreeVolume(const std::string& dir, ThreadPool* scan_pool, QuotaModel* quota)
      : PosixVolume(VolumeConfig{.name = kName, .backend = kName, .path = dir}, scan_pool),
        quota_(quota) {}
  std::set<std::string> capabilities() const override { return {}; }
  QuotaModel& quota() override { return *quota_; }
  std::string VFolderPath(const VFolderId&) const override { return path(); }

 private:
  QuotaModel* quota_;
};

NoopVolume::NoopVolume(std::vector<std::string> unmanaged_roots, ThreadPool* scan_pool)
    : scan_pool_(scan_pool), quota_(std::make_unique<Quota>()), fsop_(std::make_unique<FsOp>()) {
  for (const auto& r : unmanaged_roots)
    if (auto c = Canonical(r)) roots_.push_back(*c);
}

NoopVolume::~NoopVolume() = default;

QuotaModel& NoopVolume::quota() {
  return *quota_;
}
FSOpModel& NoopVolume::fsop() {
  return *fsop_;
}
VolumeIoStats& NoopVolume::io_stats() {
  return Metrics::Global().Volume(kName);
}

Result<std::string> NoopVolume::CheckUnmanaged(const std::string& unmanaged_path) const {
  if (unmanaged_path.empty() || unmanaged_path[0] != '/')
    return Status(Code::kInvalidArgument,
                  fmt::format("unmanaged_path '{}' is not an absolute path", unmanaged_path));
  auto canon = Canonical(unmanaged_path);
  if (!canon)
    return Status(Code::kNotFound,
                  fmt::format("unmanaged_path '{}' does not exist", unmanaged_path), ENOENT);
  for (const auto& root : roots_) {
    if (*canon == root ||
        (canon->rfind(root, 0) == 0 && (root == "/" || (*canon)[root.size()] == '/')))
      return *canon;
  }
  return Status(Code::kPermissionDenied,
                fmt::format("unmanaged_path '{}' is not under any of [sluice] unmanaged-roots; "
                            "the operator must allow it there",
                            unmanaged_path));
}

Result<Volume*> NoopVolume::Tree(const std::string& canonical) {
  std::lock_guard lk(mu_);
  auto& v = trees_[canonical];
  if (!v) v = std::make_unique<TreeVolume>(canonical, scan_pool_, quota_.get());
  return v.get();
}

Result<std::shared_ptr<FileReader>> NoopVolume::OpenReader(const VFolderId&,
                                                           std::string_view relpath, Lookup,
                                                           const LookupHint*) {
  return Status(Code::kNotFound, fmt::format("'{}' does not exist", relpath), ENOENT);
}

Result<DirEntry> NoopVolume::Stat(const VFolderId&, std::string_view relpath) {
  if (!relpath.empty() && relpath != ".")
    return Status(Code::kNotFound, fmt::format("'{}' does not exist", relpath), ENOENT);
  return EmptyDir().info();
}

Result<std::unique_ptr<DirHandle>> NoopVolume::OpenDir(const VFolderId&, std::string_view) {
  return std::unique_ptr<DirHandle>(std::make_unique<EmptyDir>());
}

Result<std::string> NoopVolume::CreateStaging(const VFolderId&) {
  return NoUploads();
}
Result<StagingState> NoopVolume::InspectStaging(const VFolderId&, const std::string&) {
  return NoUploads();
}
Result<std::unique_ptr<StagingWriter>> NoopVolume::OpenStaging(const VFolderId&, const std::string&,
                                                               std::chrono::milliseconds) {
  return NoUploads();
}

}  // namespace sluice
