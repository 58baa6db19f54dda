#include "volume/ids.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace sluice {

Result<std::string> NormalizeUuidHex(std::string_view s) {
  std::string hex;
  hex.reserve(32);
  bool dashed = s.size() == 36;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (dashed && (i == 8 || i == 13 || i == 18 || i == 23)) {
      if (c != '-') break;
      continue;
    }
    if (!std::isxdigit(static_cast<unsigned char>(c))) break;
    hex += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (hex.size() != 32 || (s.size() != 32 && s.size() != 36))
    return Status(Code::kInvalidArgument,
                  fmt::format("'{}' is not a UUID (32 hex digits, dashes optional)", s));
  return hex;
}

std::string DashedUuid(std::string_view h) {
  return fmt::format("{}-{}-{}-{}-{}", h.substr(0, 8), h.substr(8, 4), h.substr(12, 4),
                     h.substr(16, 4), h.substr(20));
}

Result<QuotaScopeId> QuotaScopeId::Parse(std::string_view s) {
  size_t colon = s.find(':');
  if (colon == std::string_view::npos)
    return Status(Code::kInvalidArgument,
                  fmt::format("quota scope id '{}' must look like 'user:<uuid>' or "
                              "'project:<uuid>'",
                              s));
  std::string_view type = s.substr(0, colon);
  QuotaScopeId id;
  if (type == "user") {
    id.type = QuotaScopeType::kUser;
  } else if (type == "project") {
    id.type = QuotaScopeType::kProject;
  } else {
    return Status(Code::kInvalidArgument,
                  fmt::format("quota scope type '{}' must be 'user' or 'project'", type));
  }
  auto hex = NormalizeUuidHex(s.substr(colon + 1));
  if (!hex.ok()) return hex.status().WithContext(fmt::format("quota scope id '{}'", s));
  id.hex = std::move(hex).value();
  return id;
}

std::string QuotaScopeId::ToString() const {
  return fmt::format("{}:{}", type == QuotaScopeType::kUser ? "user" : "project", DashedUuid(hex));
}

Result<VFolderId> VFolderId::Parse(std::string_view s) {
  VFolderId id;
  std::string_view folder = s;
  size_t slash = s.rfind('/');
  if (slash != std::string_view::npos) {
    auto qs = QuotaScopeId::Parse(s.substr(0, slash));
    if (!qs.ok()) return qs.status().WithContext(fmt::format("vfolder id '{}'", s));
    id.scope = std::move(qs).value();
    folder = s.substr(slash + 1);
  }
  auto hex = NormalizeUuidHex(folder);
  if (!hex.ok()) return hex.status().WithContext(fmt::format("vfolder id '{}'", s));
  id.hex = std::move(hex).value();
  return id;
}

std::string VFolderId::ToString() const {
  if (scope) return fmt::format("{}/{}", scope->ToString(), hex);
  return hex;
}

bool IsLowerHex(std::string_view s, size_t min_len, size_t max_len) {
  return s.size() >= min_len && s.size() <= max_len && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsUploadSessionId(std::string_view s) {
  return IsLowerHex(s, 16, 64);
}

Status UploadWriterBusy(const std::string& session) {
  return Status(Code::kConflict,
                fmt::format("another request is writing to upload session {}; one writer at a time",
                            session));
}

Status MissingQuotaScope(const QuotaScopeId& qsid, std::string_view volume) {
  return Status(Code::kNotFound,
                fmt::format("quota scope {} does not exist on volume {}", qsid.ToString(), volume))
      .About(Subject::kQuotaScope);
}

Status ExistingQuotaScope(const QuotaScopeId& qsid) {
  return Status(Code::kAlreadyExists, fmt::format("quota scope {} already exists", qsid.ToString()))
      .About(Subject::kQuotaScope);
}

Status QuotaScopeNotEmpty(const QuotaScopeId& qsid) {
  return Status(
             Code::kNotEmpty,
             fmt::format("quota scope {} still holds vfolders; delete them first", qsid.ToString()))
      .About(Subject::kQuotaScope);
}

Status MissingVFolder(const VFolderId& vfid, std::string_view volume) {
  return Status(Code::kNotFound,
                fmt::format("vfolder {} does not exist on volume {}", vfid.ToString(), volume))
      .About(Subject::kVFolder);
}

Status ExistingVFolder(const VFolderId& vfid, std::string_view volume) {
  return Status(Code::kAlreadyExists,
                fmt::format("vfolder {} already exists on volume {}", vfid.ToString(), volume))
      .About(Subject::kVFolder);
}

}  // namespace sluice
