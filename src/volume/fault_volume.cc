#include "volume/fault_volume.h"

#include <fnmatch.h>

#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "common/config.h"

namespace sluice {

namespace {

const std::set<std::string, std::less<>> kOps = {
    "open",   "read", "write",  "sync",  "commit", "stat",     "list",    "mkdir",
    "rename", "move", "delete", "stage", "usage",  "fs-usage", "vfolder", "*"};

struct ErrnoName {
  const char* name;
  int value;
};
constexpr ErrnoName kErrnos[] = {
    {"EIO", EIO},           {"ENOSPC", ENOSPC},       {"EDQUOT", EDQUOT},
    {"EACCES", EACCES},     {"EPERM", EPERM},         {"EROFS", EROFS},
    {"ENOENT", ENOENT},     {"EEXIST", EEXIST},       {"ENOTEMPTY", ENOTEMPTY},
    {"ENOTDIR", ENOTDIR},   {"EISDIR", EISDIR},       {"EBUSY", EBUSY},
    {"EAGAIN", EAGAIN},     {"ETIMEDOUT", ETIMEDOUT}, {"ESTALE", ESTALE},
    {"ENOTCONN", ENOTCONN}, {"EFBIG", EFBIG},         {"ENAMETOOLONG", ENAMETOOLONG},
    {"EINVAL", EINVAL},     {"EMFILE", EMFILE},       {"ENOMEM", ENOMEM},
};

std::string Join(std::string_view dir, std::string_view name) {
  if (dir.empty() || dir == ".") return std::string(name);
  return fmt::format("{}/{}", dir, name);
}

class FaultReader : public ForwardingFileReader {
 public:
  FaultReader(std::shared_ptr<FileReader> inner, FaultVolume* vol, std::string path)
      : ForwardingFileReader(std::move(inner)),
        vol_(vol),
        path_(std::move(path)),
        ruled_(vol->HasRule("read", path_)) {}
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    if (!ruled_) return inner_->ReadAt(offset, buf, n);
    // A read across the cut is short: the bytes before it, then the error on the next read.
    if (const FaultRule* r = vol_->CutInside("read", path_, offset, offset + n))
      return inner_->ReadAt(offset, buf, static_cast<size_t>(r->after - offset));
    if (const FaultRule* r = vol_->Fire("read", path_, offset + n); r && r->error)
      return FaultVolume::Failure(*r, "read", path_);
    return inner_->ReadAt(offset, buf, n);
  }
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    // A slow or failing read is the pool's to make.
    if (ruled_) return Status(Code::kUnavailable, "fault rules apply: read on the pool", EAGAIN);
    return inner_->ReadAtNoWait(offset, buf, n);
  }
  // Files with read rules are never sent zero-copy: every byte goes through ReadAt.
  int native_fd() const override { return ruled_ ? -1 : inner_->native_fd(); }
  Extent LocalExtent(uint64_t offset) override {
    return ruled_ ? Extent{} : inner_->LocalExtent(offset);
  }
  // Nor copied on the origin, which the rules would not see.
  const OriginObject* origin_object() const override {
    return ruled_ ? nullptr : inner_->origin_object();
  }

 private:
  FaultVolume* vol_;
  std::string path_;
  bool ruled_;
};

class FaultDir : public ForwardingDirHandle {
 public:
  FaultDir(std::unique_ptr<DirHandle> inner, FaultVolume* vol, std::string path)
      : ForwardingDirHandle(std::move(inner)), vol_(vol), path_(std::move(path)) {}
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    std::string p = Join(path_, name);
    if (const FaultRule* r = vol_->Fire("open", p); r && r->error)
      return FaultVolume::Failure(*r, "open", p);
    SLUICE_ASSIGN_OR_RETURN(auto f, inner_->OpenFile(name));
    return std::shared_ptr<FileReader>(std::make_shared<FaultReader>(std::move(f), vol_, p));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    return Sub(name, [&] { return inner_->OpenSubdir(name); });
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdirFrom(const std::string& name,
                                                    const ListFrom& from) override {
    return Sub(name, [&] { return inner_->OpenSubdirFrom(name, from); });
  }

 private:
  template <typename Open>
  Result<std::unique_ptr<DirHandle>> Sub(const std::string& name, Open open) {
    std::string p = Join(path_, name);
    if (const FaultRule* r = vol_->Fire("open", p); r && r->error)
      return FaultVolume::Failure(*r, "open", p);
    SLUICE_ASSIGN_OR_RETURN(auto d, open());
    return std::unique_ptr<DirHandle>(new FaultDir(std::move(d), vol_, p));
  }

  FaultVolume* vol_;
  std::string path_;
};

class FaultWriter : public ForwardingStagingWriter {
 public:
  FaultWriter(std::unique_ptr<StagingWriter> inner, FaultVolume* vol)
      : ForwardingStagingWriter(std::move(inner)), vol_(vol) {}
  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    *written = 0;
    const FaultRule* r = vol_->Fire("write", "", offset + n);
    if (!r || !r->error) return inner_->WriteAt(offset, data, n, written);
    // What fits before the fault goes through, as a device that fills up part way.
    if (r->after > offset) {
      Status st = inner_->WriteAt(offset, data, static_cast<size_t>(r->after - offset), written);
      if (!st.ok()) return st;
    }
    return FaultVolume::Failure(*r, "write", "");
  }
  Status Sync(uint64_t offset, bool quota_checked) override {
    if (const FaultRule* r = vol_->Fire("sync", ""); r && r->error)
      return FaultVolume::Failure(*r, "sync", "");
    return inner_->Sync(offset, quota_checked);
  }
  Status Commit(const std::vector<std::string>& final_parts) override {
    std::string p;
    for (const auto& part : final_parts) p = Join(p, part);
    if (const FaultRule* r = vol_->Fire("commit", p); r && r->error)
      return FaultVolume::Failure(*r, "commit", p);
    return inner_->Commit(final_parts);
  }
  Status Publish(const std::vector<std::string>& final_parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool durable) override {
    std::string p;
    for (const auto& part : final_parts) p = Join(p, part);
    if (durable)
      if (const FaultRule* r = vol_->Fire("sync", ""); r && r->error)
        return FaultVolume::Failure(*r, "sync", "");
    if (const FaultRule* r = vol_->Fire("commit", p); r && r->error)
      return FaultVolume::Failure(*r, "commit", p);
    return inner_->Publish(final_parts, meta, durable);
  }

 private:
  FaultVolume* vol_;
};

}  // namespace

Result<std::vector<FaultRule>> ParseFaultRules(const std::string& volume,
                                               const nlohmann::json& faults) {
  std::vector<FaultRule> out;
  if (faults.is_null()) return out;
  if (!faults.is_array())
    return Status(Code::kInvalidArgument,
                  fmt::format("volume.{}.faults must be an array of tables", volume));
  for (size_t i = 0; i < faults.size(); ++i) {
    const auto& f = faults[i];
    auto bad = [&](std::string_view why) {
      return Status(Code::kInvalidArgument,
                    fmt::format("volume.{}.faults[{}]: {}", volume, i, why));
    };
    if (!f.is_object()) return bad("must be a table such as { op = \"write\", error = \"EIO\" }");
    FaultRule r;
    for (const auto& [key, value] : f.items()) {
      if (key == "op") {
        if (!value.is_string() || !kOps.count(value.get<std::string>()))
          return bad(fmt::format("op must be one of {}", fmt::join(kOps, ", ")));
        r.op = value.get<std::string>();
      } else if (key == "path") {
        if (!value.is_string()) return bad("path must be a glob string");
        r.path = value.get<std::string>();
      } else if (key == "error") {
        std::string name = value.is_string() ? value.get<std::string>() : "";
        for (const auto& e : kErrnos)
          if (name == e.name) r.error = e.value;
        if (!r.error)
          return bad(fmt::format("error must be an errno name such as EIO (got {})", value.dump()));
      } else if (key == "latency") {
        std::string s = value.is_string() ? value.get<std::string>() : "";
        if (s.size() > 2 && s.ends_with("ms") &&
            s.find_first_not_of("0123456789") == s.size() - 2) {
          r.latency = std::chrono::milliseconds(std::stoull(s.substr(0, s.size() - 2)));
        } else {
          auto d = ParseDuration(s);
          if (!d.ok()) return bad("latency must be a duration such as \"200ms\" or \"2s\"");
          r.latency = *d;
        }
      } else if (key == "after") {
        if (value.is_number_integer() && value.get<int64_t>() >= 0) {
          r.after = value.get<uint64_t>();
        } else {
          auto n = ParseBinarySize(value.is_string() ? value.get<std::string>() : "");
          if (!n.ok()) return bad("after must be a size such as \"1m\"");
          r.after = *n;
        }
      } else if (key == "times" || key == "skip") {
        // TOML integers are signed.
        if (!value.is_number_integer() || value.get<int64_t>() < 0)
          return bad(fmt::format("{} must be a count (0 or more)", key));
        (key == "times" ? r.times : r.skip) = value.get<int64_t>();
      } else {
        return bad(fmt::format(
            "unknown key '{}' (known: op, path, error, latency, after, times, skip)", key));
      }
    }
    if (r.op.empty()) return bad("op is required");
    if (!r.error && r.latency.count() == 0) return bad("give an error, a latency or both");
    out.push_back(std::move(r));
  }
  return out;
}

FaultVolume::FaultVolume(std::unique_ptr<Volume> inner, std::vector<FaultRule> rules)
    : ForwardingVolume(std::move(inner)), rules_(std::move(rules)) {}

bool FaultVolume::HasRule(std::string_view op, std::string_view path) const {
  std::string p(path);
  for (const auto& r : rules_)
    if ((r.op == op || r.op == "*") &&
        (r.path.empty() || ::fnmatch(r.path.c_str(), p.c_str(), 0) == 0))
      return true;
  return false;
}

const FaultRule* FaultVolume::Fire(std::string_view op, std::string_view path, uint64_t end) {
  std::string p(path);
  for (auto& r : rules_) {
    if (r.op != op && r.op != "*") continue;
    if (!r.path.empty() && ::fnmatch(r.path.c_str(), p.c_str(), 0) != 0) continue;
    if (r.error && r.after > 0 && end <= r.after) continue;
    if (r.skip > 0 && r.seen->fetch_add(1) < r.skip) continue;
    if (r.times >= 0 && r.fired->fetch_add(1) >= r.times) continue;
    if (r.latency.count() > 0) std::this_thread::sleep_for(r.latency);
    return &r;
  }
  return nullptr;
}

const FaultRule* FaultVolume::CutInside(std::string_view op, std::string_view path, uint64_t start,
                                        uint64_t end) const {
  std::string p(path);
  for (const auto& r : rules_) {
    if (r.op != op && r.op != "*") continue;
    if (!r.path.empty() && ::fnmatch(r.path.c_str(), p.c_str(), 0) != 0) continue;
    if (r.times >= 0 && r.fired->load() >= r.times) continue;
    if (r.error && r.after > start && r.after < end) return &r;
  }
  return nullptr;
}

Status FaultVolume::Failure(const FaultRule& rule, std::string_view op, std::string_view path) {
  return Status::FromErrno(rule.error, path.empty()
                                           ? fmt::format("injected fault: {}", op)
                                           : fmt::format("injected fault: {} '{}'", op, path));
}

Status FaultVolume::Check(std::string_view op, std::string_view path) {
  if (const FaultRule* r = Fire(op, path); r && r->error) return Failure(*r, op, path);
  return Status::Ok();
}

Result<FsUsage> FaultVolume::GetFsUsage() {
  SLUICE_RETURN_IF_ERROR(Check("fs-usage"));
  return ForwardingVolume::GetFsUsage();
}

HwInfo FaultVolume::GetHwInfo() {
  HwInfo h = ForwardingVolume::GetHwInfo();
  h.metadata["fault_injection"] = "on";
  return h;
}

Status FaultVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                  std::optional<uint64_t> initial_limit) {
  SLUICE_RETURN_IF_ERROR(Check("vfolder"));
  return ForwardingVolume::CreateVFolder(vfid, mode, auto_scope, initial_limit);
}

Result<std::string> FaultVolume::DetachVFolder(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Check("vfolder"));
  return ForwardingVolume::DetachVFolder(vfid);
}

Status FaultVolume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                    const TreeUsage& size) {
  SLUICE_RETURN_IF_ERROR(Check("vfolder"));
  return ForwardingVolume::CopyVFolderFrom(from, src, dst, size);
}

Result<TreeUsage> FaultVolume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Check("usage"));
  return ForwardingVolume::GetUsage(vfid);
}

Result<TreeUsage> FaultVolume::GetFreshUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Check("usage"));
  return ForwardingVolume::GetFreshUsage(vfid);
}

Status FaultVolume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                          bool exist_ok) {
  SLUICE_RETURN_IF_ERROR(Check("mkdir", relpath));
  return ForwardingVolume::Mkdir(vfid, relpath, parents, exist_ok);
}

Status FaultVolume::Rename(const VFolderId& vfid, std::string_view relpath,
                           std::string_view new_name) {
  SLUICE_RETURN_IF_ERROR(Check("rename", relpath));
  return ForwardingVolume::Rename(vfid, relpath, new_name);
}

Status FaultVolume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  SLUICE_RETURN_IF_ERROR(Check("move", src));
  return ForwardingVolume::Move(vfid, src, dst);
}

Status FaultVolume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                                bool recursive) {
  for (const auto& p : relpaths) SLUICE_RETURN_IF_ERROR(Check("delete", p));
  return ForwardingVolume::DeleteFiles(vfid, relpaths, recursive);
}

Result<std::shared_ptr<FileReader>> FaultVolume::OpenReader(const VFolderId& vfid,
                                                            std::string_view relpath, Lookup lookup,
                                                            const LookupHint* hint) {
  // An event loop never sleeps for a rule: the lookup goes to the pool.
  const bool cached = lookup == Lookup::kCachedOnly;
  if (cached && (HasRule("open", relpath) || HasRule("read", relpath)))
    return Status(Code::kUnavailable, "fault rules apply: open on the pool", EAGAIN);
  SLUICE_RETURN_IF_ERROR(Check("open", relpath));
  SLUICE_ASSIGN_OR_RETURN(auto f, ForwardingVolume::OpenReader(vfid, relpath, lookup, hint));
  return std::shared_ptr<FileReader>(
      std::make_shared<FaultReader>(std::move(f), this, std::string(relpath)));
}

Result<DirEntry> FaultVolume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_RETURN_IF_ERROR(Check("stat", relpath));
  return ForwardingVolume::Stat(vfid, relpath);
}

Result<std::unique_ptr<DirHandle>> FaultVolume::OpenDir(const VFolderId& vfid,
                                                        std::string_view relpath) {
  SLUICE_RETURN_IF_ERROR(Check("list", relpath));
  SLUICE_ASSIGN_OR_RETURN(auto d, ForwardingVolume::OpenDir(vfid, relpath));
  return std::unique_ptr<DirHandle>(new FaultDir(std::move(d), this, std::string(relpath)));
}

Result<std::unique_ptr<DirHandle>> FaultVolume::OpenDirFrom(const VFolderId& vfid,
                                                            std::string_view relpath,
                                                            const ListFrom& from) {
  SLUICE_RETURN_IF_ERROR(Check("list", relpath));
  SLUICE_ASSIGN_OR_RETURN(auto d, ForwardingVolume::OpenDirFrom(vfid, relpath, from));
  return std::unique_ptr<DirHandle>(new FaultDir(std::move(d), this, std::string(relpath)));
}

Result<std::vector<DirEntry>> FaultVolume::ListSorted(const VFolderId& vfid,
                                                      std::string_view relpath,
                                                      std::string_view start_after, size_t max) {
  SLUICE_RETURN_IF_ERROR(Check("list", relpath));
  return ForwardingVolume::ListSorted(vfid, relpath, start_after, max);
}

Result<std::string> FaultVolume::CreateStaging(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Check("stage"));
  return ForwardingVolume::CreateStaging(vfid);
}

Result<std::unique_ptr<StagingWriter>> FaultVolume::OpenStaging(const VFolderId& vfid,
                                                                const std::string& session,
                                                                std::chrono::milliseconds wait) {
  SLUICE_RETURN_IF_ERROR(Check("stage"));
  SLUICE_ASSIGN_OR_RETURN(auto w, ForwardingVolume::OpenStaging(vfid, session, wait));
  return std::unique_ptr<StagingWriter>(new FaultWriter(std::move(w), this));
}

}  // namespace sluice
