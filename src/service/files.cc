#include "service/files.h"

#include <fmt/format.h>

#include "common/path.h"

namespace sluice {

Result<std::vector<FileService::ItemResult>> FileService::Mkdir(
    const RequestContext& ctx, Volume& v, const VFolderId& vfid,
    const std::vector<std::string>& paths, bool parents, bool exist_ok) {
  if (paths.empty() || paths.size() > kMaxMkdirBatch)
    return Status(Code::kInvalidArgument, fmt::format("relpath must name 1 to {} paths (got {})",
                                                      kMaxMkdirBatch, paths.size()));
  // Hostile paths (as text or through a symlink out) refuse the whole request before anything
  // is created.
  for (const auto& rel : paths) {
    Status s = v.ValidatePath(vfid, rel);
    if (!s.ok()) return s.WithContext(fmt::format("'{}'", rel));
  }
  std::vector<ItemResult> out;
  // Once the client has gone or the deadline has passed, the rest are not made; each answer
  // still says what happened to its path (the first ones exist).
  for (const auto& rel : paths) {
    Status stop = ctx.Check();
    out.push_back({rel, stop.ok() ? v.Mkdir(vfid, rel, parents, exist_ok) : stop});
  }
  return out;
}

Result<std::unique_ptr<DirHandle>> FileService::List(const RequestContext&, Volume& v,
                                                     const VFolderId& vfid,
                                                     std::string_view relpath) {
  return v.OpenDir(vfid, relpath);
}

Status FileService::Rename(const RequestContext&, Volume& v, const VFolderId& vfid,
                           std::string_view relpath, std::string_view new_name) {
  return v.Rename(vfid, relpath, new_name);
}

Status FileService::Move(const RequestContext&, Volume& v, const VFolderId& vfid,
                         std::string_view src, std::string_view dst) {
  return v.Move(vfid, src, dst);
}

Result<std::shared_ptr<FileReader>> FileService::Fetch(const RequestContext&, Volume& v,
                                                       const VFolderId& vfid,
                                                       std::string_view relpath) {
  return v.OpenReader(vfid, relpath);
}

Status FileService::Delete(const RequestContext&, Volume& v, const VFolderId& vfid,
                           const std::vector<std::string>& paths, bool recursive) {
  return v.DeleteFiles(vfid, paths, recursive);
}

Result<std::string> FileService::DeleteAsync(const RequestContext&, Volume& v,
                                             const VFolderId& vfid, std::vector<std::string> paths,
                                             bool recursive) {
  for (const auto& rel : paths) {
    Status s = v.ValidatePath(vfid, rel);
    if (!s.ok()) return s.WithContext(fmt::format("'{}'", rel));
  }
  return svc_->DeleteFilesAsync(v.name(), vfid, std::move(paths), recursive);
}

Result<std::string> FileService::DownloadToken(const RequestContext&, Volume& v,
                                               const VFolderId& vfid, const std::string& relpath,
                                               bool archive,
                                               const std::optional<std::string>& unmanaged_path) {
  DownloadGrant g;
  g.volume = v.name();
  g.vfid = vfid.ToString();
  g.relpath = relpath;
  g.archive = archive;
  Volume* where = &v;
  if (&v == &svc_->noop()) {
    if (!unmanaged_path)
      return Status(Code::kInvalidArgument,
                    "volume 'noop' serves unmanaged vfolders: unmanaged_path is required");
    SLUICE_ASSIGN_OR_RETURN(g.unmanaged_path, svc_->noop().CheckUnmanaged(*unmanaged_path));
    SLUICE_ASSIGN_OR_RETURN(where, svc_->noop().Tree(*g.unmanaged_path));
  } else if (unmanaged_path) {
    return Status(Code::kInvalidArgument,
                  fmt::format("unmanaged_path is for volume 'noop'; volume '{}' serves its "
                              "vfolders' own files",
                              v.name()));
  }
  // The path must exist now; the client API checks it again when the token is used.
  SLUICE_RETURN_IF_ERROR(where->Stat(vfid, relpath).status());
  return svc_->tokens().Issue(g);
}

Result<std::string> FileService::ArchiveToken(const RequestContext&, Volume& v,
                                              const VFolderId& vfid,
                                              const std::vector<std::string>& files,
                                              std::optional<std::string> filename) {
  if (files.empty()) return Status(Code::kInvalidArgument, "parameter 'files' must not be empty");
  for (const auto& f : files) {
    SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(f));
    if (parts.empty())
      return Status(Code::kInvalidPath,
                    fmt::format("'files' must name paths inside the vfolder (got '{}')", f));
  }
  SLUICE_RETURN_IF_ERROR(v.CheckVFolder(vfid));
  ArchiveGrant g;
  g.volume = v.name();
  g.vfid = vfid.ToString();
  g.files = files;
  g.filename = std::move(filename);
  return svc_->tokens().Issue(g);
}

Result<std::string> FileService::UploadToken(const RequestContext&, Volume& v,
                                             const VFolderId& vfid, const std::string& relpath,
                                             uint64_t size) {
  SLUICE_ASSIGN_OR_RETURN(std::string session, uploads_.CreateSession(v, vfid, relpath, size));
  UploadGrant g;
  g.volume = v.name();
  g.vfid = vfid.ToString();
  g.relpath = relpath;
  g.size = size;
  g.session = std::move(session);
  return svc_->tokens().Issue(g);
}

}  // namespace sluice
