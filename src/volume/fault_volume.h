// Fault injection as a decorator, for tests and drills: chosen operations on chosen paths fail
// with a chosen errno (EIO, ENOSPC, EDQUOT...), or are slowed down, so that every API can be
// shown to answer a precise error and lose nothing. Configured per volume:
//
//   [volume.local]
//   faults = [
//     { op = "write", error = "ENOSPC", after = "1m" },  # staged writes past 1 MiB
//     { op = "read", path = "data/*", latency = "200ms" },
//     { op = "open", path = "*.bin", error = "EIO", times = 1 },
//   ]
//
// op: open (files and directories), read, write (staged upload bytes), sync, commit, stat,
// list, mkdir, rename, move, delete, stage (creating and opening staging files), usage,
// fs-usage (statvfs, as health checks see it), vfolder (create, detach, clone), or "*".
// path: a glob (fnmatch) on the vfolder-relative path, for the operations that name one (all
// but write, sync, usage, fs-usage, stage). error: an errno name. latency: slept before the
// operation (an event loop's no-wait read is refused instead, so that the pool takes it).
// after: for read and write, the bytes that go through before the error. times: how often the
// rule fires (default: always). skip: how many matching operations go through first (the
// fourth commit of a path, say, with skip = 3). Files with a read rule are read through ReadAt,
// never sent zero-copy, so that the rule sees every byte.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "volume/forwarding_volume.h"

namespace sluice {

struct FaultRule {
  std::string op;
  std::string path;  // glob; empty matches everything
  int error = 0;     // errno; 0 = no error (latency only)
  std::chrono::milliseconds latency{0};
  uint64_t after = 0;  // read/write: bytes that succeed first
  int64_t times = -1;  // -1: always
  int64_t skip = 0;    // matching operations let through before the rule fires
  std::shared_ptr<std::atomic<int64_t>> fired = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> seen = std::make_shared<std::atomic<int64_t>>(0);
};

// Parses the `faults` array of volume `volume`'s config; kInvalidArgument naming the entry.
Result<std::vector<FaultRule>> ParseFaultRules(const std::string& volume,
                                               const nlohmann::json& faults);

class FaultVolume : public ForwardingVolume {
 public:
  FaultVolume(std::unique_ptr<Volume> inner, std::vector<FaultRule> rules);

  // The rule for `op` on `path` that fires now, if any, its latency slept. For reads and
  // writes of bytes before `end`: an error rule whose `after` lies at or past `end` does not
  // apply yet (and does not count against its `times`).
  const FaultRule* Fire(std::string_view op, std::string_view path, uint64_t end = UINT64_MAX);
  // An error rule for `op` on `path` that would cut a read or write inside [start, end) at its
  // `after`, without firing it (the bytes before the cut go through first).
  const FaultRule* CutInside(std::string_view op, std::string_view path, uint64_t start,
                             uint64_t end) const;
  // The injected failure of `rule` for `op` on `path`.
  static Status Failure(const FaultRule& rule, std::string_view op, std::string_view path);
  // Whether any rule for `op` could apply to `path` (for handles that decide once).
  bool HasRule(std::string_view op, std::string_view path) const;

  Result<FsUsage> GetFsUsage() override;
  HwInfo GetHwInfo() override;
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override;
  Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
               bool exist_ok) override;
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override;
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override;
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override;
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;
  Result<std::string> CreateStaging(const VFolderId& vfid) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(
      const VFolderId& vfid, const std::string& session,
      std::chrono::milliseconds wait = std::chrono::milliseconds(0)) override;

 private:
  Status Check(std::string_view op, std::string_view path = {});

  std::vector<FaultRule> rules_;
};

}  // namespace sluice
