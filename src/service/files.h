// The file operations of the manager API, backend-agnostic: what a handler asks for once it has
// parsed the request, through the Volume interface. Batches are validated whole before anything
// changes; tokens for the client API are issued here (TokenService) for paths checked to exist.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/request_context.h"
#include "service/storage_service.h"
#include "service/upload.h"

namespace sluice {

class FileService {
 public:
  explicit FileService(StorageService* svc) : svc_(svc), uploads_(svc) {}

  // Most paths one mkdir request may create.
  static constexpr size_t kMaxMkdirBatch = 50;

  struct ItemResult {
    std::string item;
    Status status;
  };
  // Every path is validated first (a hostile one refuses the whole batch, kInvalidPath, before
  // anything is created); then each is created, with its own outcome.
  Result<std::vector<ItemResult>> Mkdir(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                                        const std::vector<std::string>& paths, bool parents,
                                        bool exist_ok);
  // The directory, opened: the caller streams its entries.
  Result<std::unique_ptr<DirHandle>> List(const RequestContext& ctx, Volume& v,
                                          const VFolderId& vfid, std::string_view relpath);
  Status Rename(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                std::string_view relpath, std::string_view new_name);
  Status Move(const RequestContext& ctx, Volume& v, const VFolderId& vfid, std::string_view src,
              std::string_view dst);
  Result<std::shared_ptr<FileReader>> Fetch(const RequestContext& ctx, Volume& v,
                                            const VFolderId& vfid, std::string_view relpath);
  Status Delete(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                const std::vector<std::string>& paths, bool recursive);
  // Validates every path now, deletes in a background task; returns the task id.
  Result<std::string> DeleteAsync(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                                  std::vector<std::string> paths, bool recursive);

  // Tokens for the client API.
  Result<std::string> DownloadToken(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                                    const std::string& relpath, bool archive,
                                    const std::optional<std::string>& unmanaged_path);
  Result<std::string> ArchiveToken(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                                   const std::vector<std::string>& files,
                                   std::optional<std::string> filename);
  // Sweeps the vfolder's abandoned sessions, checks the size and the quota scope's room,
  // creates the staging file and returns the token of the new session.
  Result<std::string> UploadToken(const RequestContext& ctx, Volume& v, const VFolderId& vfid,
                                  const std::string& relpath, uint64_t size);

 private:
  StorageService* svc_;
  UploadService uploads_;
};

}  // namespace sluice
