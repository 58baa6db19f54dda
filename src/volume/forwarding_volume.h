// The base of volume decorators (as RocksDB's FileSystemWrapper): every call goes to the
// wrapped volume; a decorator overrides only what it changes (metrics_volume.h,
// fault_volume.h, later the SSD read cache).
#pragma once

#include <memory>

#include "volume/volume.h"

namespace sluice {

class ForwardingVolume : public Volume {
 public:
  explicit ForwardingVolume(std::unique_ptr<Volume> inner) : inner_(std::move(inner)) {}

  Volume& inner() { return *inner_; }
  const Volume& inner() const { return *inner_; }
  // Gives the wrapped volume back, leaving this decorator empty (a decorator restarted over the
  // same volume: the cache's restart tests).
  std::unique_ptr<Volume> TakeInner() { return std::move(inner_); }
  // The volume below every decorator.
  static Volume& Innermost(Volume& v) {
    Volume* cur = &v;
    while (auto* f = dynamic_cast<ForwardingVolume*>(cur)) cur = f->inner_.get();
    return *cur;
  }

  const std::string& name() const override { return inner_->name(); }
  const std::string& backend() const override { return inner_->backend(); }
  const std::string& path() const override { return inner_->path(); }
  const std::string& fsprefix() const override { return inner_->fsprefix(); }
  std::set<std::string> capabilities() const override { return inner_->capabilities(); }
  Status Init() override { return inner_->Init(); }
  Status EmptyTrash() override { return inner_->EmptyTrash(); }
  Status EmptyTrashOf(const VFolderId& vfid) override { return inner_->EmptyTrashOf(vfid); }
  void Shutdown() override { inner_->Shutdown(); }
  QuotaModel& quota() override { return inner_->quota(); }
  FSOpModel& fsop() override { return inner_->fsop(); }
  VolumeIoStats& io_stats() override { return inner_->io_stats(); }
  int layout_version() const override { return inner_->layout_version(); }

  std::string VFolderPath(const VFolderId& vfid) const override {
    return inner_->VFolderPath(vfid);
  }
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override {
    return inner_->CreateVFolder(vfid, mode, auto_scope, initial_limit);
  }
  Result<std::string> DetachVFolder(const VFolderId& vfid) override {
    return inner_->DetachVFolder(vfid);
  }
  Status CheckVFolder(const VFolderId& vfid) override { return inner_->CheckVFolder(vfid); }
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override { return inner_->GetUsage(vfid); }
  Result<uint64_t> GetUsedBytes(const VFolderId& vfid) override {
    return inner_->GetUsedBytes(vfid);
  }
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override {
    return inner_->GetFreshUsage(vfid);
  }
  Result<FsUsage> GetFsUsage() override { return inner_->GetFsUsage(); }
  HwInfo GetHwInfo() override { return inner_->GetHwInfo(); }
  Result<std::string> MountPath(const VFolderId& vfid, std::string_view subpath) override {
    return inner_->MountPath(vfid, subpath);
  }
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override {
    return inner_->CopyVFolderFrom(from, src, dst, size);
  }

  Status ValidatePath(const VFolderId& vfid, std::string_view relpath) override {
    return inner_->ValidatePath(vfid, relpath);
  }
  Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
               bool exist_ok) override {
    return inner_->Mkdir(vfid, relpath, parents, exist_ok);
  }
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override {
    return inner_->Rename(vfid, relpath, new_name);
  }
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override {
    return inner_->Move(vfid, src, dst);
  }
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override {
    return inner_->DeleteFiles(vfid, relpaths, recursive);
  }

  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override {
    return inner_->OpenReader(vfid, relpath, lookup, hint);
  }
  std::shared_ptr<const LookupHint> PrepareLookup(const VFolderId& vfid,
                                                  std::string_view relpath) const override {
    return inner_->PrepareLookup(vfid, relpath);
  }
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override {
    return inner_->Stat(vfid, relpath);
  }
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override {
    return inner_->OpenDir(vfid, relpath);
  }
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override {
    return inner_->OpenDirFrom(vfid, relpath, from);
  }
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override {
    return inner_->ListSorted(vfid, relpath, start_after, max);
  }

  bool StagingCounted() const override { return inner_->StagingCounted(); }
  Status CheckStagedSize(uint64_t size) const override { return inner_->CheckStagedSize(size); }
  Result<std::string> CreateStaging(const VFolderId& vfid) override {
    return inner_->CreateStaging(vfid);
  }
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override {
    return inner_->DiscardStaging(vfid, session);
  }
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override {
    return inner_->InspectStaging(vfid, session);
  }
  Result<std::unique_ptr<StagingWriter>> OpenStaging(
      const VFolderId& vfid, const std::string& session,
      std::chrono::milliseconds wait = std::chrono::milliseconds(0)) override {
    return inner_->OpenStaging(vfid, session, wait);
  }
  StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                            const StagingRemoved& removed) override {
    return inner_->SweepStaging(vfid, age, removed);
  }

 private:
  std::unique_ptr<Volume> inner_;
};

// Forwarding bases for the handles a volume hands out, for decorators that wrap them.
class ForwardingFileReader : public FileReader {
 public:
  explicit ForwardingFileReader(std::shared_ptr<FileReader> inner) : inner_(std::move(inner)) {}
  const DirEntry& info() const override { return inner_->info(); }
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    return inner_->ReadAt(offset, buf, n);
  }
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    return inner_->ReadAtNoWait(offset, buf, n);
  }
  int native_fd() const override { return inner_->native_fd(); }
  Extent LocalExtent(uint64_t offset) override { return inner_->LocalExtent(offset); }
  void CountSent(uint64_t bytes) override { inner_->CountSent(bytes); }
  const OriginObject* origin_object() const override { return inner_->origin_object(); }
  Result<std::string> ReadMeta() override { return inner_->ReadMeta(); }

 protected:
  std::shared_ptr<FileReader> inner_;
};

class ForwardingDirHandle : public DirHandle {
 public:
  explicit ForwardingDirHandle(std::unique_ptr<DirHandle> inner) : inner_(std::move(inner)) {}
  const DirEntry& info() const override { return inner_->info(); }
  Result<std::optional<Name>> Next() override { return inner_->Next(); }
  Result<DirEntry> StatEntry(const std::string& name) override { return inner_->StatEntry(name); }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    return inner_->OpenFile(name);
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    return inner_->OpenSubdir(name);
  }
  Result<std::string> EntryMeta(const std::string& name) override {
    return inner_->EntryMeta(name);
  }
  bool KeyOrdered() const override { return inner_->KeyOrdered(); }
  Result<std::unique_ptr<DirHandle>> OpenSubdirFrom(const std::string& name,
                                                    const ListFrom& from) override {
    return inner_->OpenSubdirFrom(name, from);
  }

 protected:
  std::unique_ptr<DirHandle> inner_;
};

class ForwardingStagingWriter : public StagingWriter {
 public:
  explicit ForwardingStagingWriter(std::unique_ptr<StagingWriter> inner)
      : inner_(std::move(inner)) {}
  const StagingState& state() const override { return inner_->state(); }
  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    return inner_->WriteAt(offset, data, n, written);
  }
  void Writeback(uint64_t from, uint64_t to) override { inner_->Writeback(from, to); }
  uint64_t SyncGranule() const override { return inner_->SyncGranule(); }
  Status Sync(uint64_t offset, bool quota_checked) override {
    return inner_->Sync(offset, quota_checked);
  }
  Status Rollback(uint64_t offset, bool quota_checked) override {
    return inner_->Rollback(offset, quota_checked);
  }
  Status Commit(const std::vector<std::string>& final_parts) override {
    return inner_->Commit(final_parts);
  }
  bool RefuseReplace() override { return inner_->RefuseReplace(); }
  Status Publish(const std::vector<std::string>& final_parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool durable) override {
    return inner_->Publish(final_parts, meta, durable);
  }
  Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) override {
    return inner_->CopyFrom(src, src_offset, n, at);
  }
  bool CopiesOnOrigin(const FileReader& src) const override { return inner_->CopiesOnOrigin(src); }
  std::optional<DirEntry> Landed() const override { return inner_->Landed(); }
  void ReadOnceByAnother() override { inner_->ReadOnceByAnother(); }

 protected:
  std::unique_ptr<StagingWriter> inner_;
};

}  // namespace sluice
