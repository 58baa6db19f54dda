// The session tokens the manager API hands out and the client API takes: HS256 JWTs made with
// [storage-proxy] secret that expire after session-expire, with Backend.AI's claim names. Each
// kind is a typed grant here; nothing else reads or writes claims.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sluice {

// /download: one file or directory ({op: "download", volume, vfid, relpath, archive?}).
struct DownloadGrant {
  std::string volume;
  std::string vfid;
  std::string relpath;
  bool archive = false;
  // An unmanaged vfolder's directory (volume "noop"), canonical, checked against the allowed
  // roots when issued and again when used.
  std::optional<std::string> unmanaged_path;
  std::optional<double> exp;
};

// /download-archive: named paths as one ZIP ({operation: "download", volume,
// virtual_folder_id, files[], filename?}).
struct ArchiveGrant {
  std::string volume;
  std::string vfid;
  std::vector<std::string> files;
  std::optional<std::string> filename;
  std::optional<double> exp;
};

// /upload: one tus session ({op: "upload", volume, vfid, relpath, size, session}).
struct UploadGrant {
  std::string volume;
  std::string vfid;
  std::string relpath;
  uint64_t size = 0;
  std::string session;
  std::optional<double> exp;
};

class TokenService {
 public:
  TokenService(std::string secret, std::chrono::seconds lifetime)
      : secret_(std::move(secret)), lifetime_(lifetime) {}

  // Tokens valid for `lifetime` from now.
  std::string Issue(const DownloadGrant& g) const;
  std::string Issue(const ArchiveGrant& g) const;
  std::string Issue(const UploadGrant& g) const;

  // A missing, forged, expired or wrongly scoped token is kUnauthenticated with a message that
  // says which; a verified token whose claims are missing or malformed is kInvalidArgument.
  Result<DownloadGrant> VerifyDownload(std::string_view token) const;
  Result<ArchiveGrant> VerifyArchive(std::string_view token) const;
  Result<UploadGrant> VerifyUpload(std::string_view token) const;

 private:
  std::string secret_;
  std::chrono::seconds lifetime_;
};

}  // namespace sluice
