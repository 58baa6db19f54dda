// Identifiers of quota scopes and vfolders, as Backend.AI spells them:
//   quota scope id  "user:<uuid>" | "project:<uuid>"
//   vfolder id      "<quota scope id>/<uuid>" (layout v3) | "<uuid>" (legacy, layout v2)
// A uuid may be given dashed or as 32 hex digits; paths always use 32 lower-case hex digits.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sluice {

enum class QuotaScopeType { kUser, kProject };

struct QuotaScopeId {
  QuotaScopeType type = QuotaScopeType::kUser;
  std::string hex;  // 32 lower-case hex digits

  static Result<QuotaScopeId> Parse(std::string_view s);
  std::string ToString() const;  // "user:<dashed uuid>"
  bool operator==(const QuotaScopeId&) const = default;
};

struct VFolderId {
  std::optional<QuotaScopeId> scope;  // absent for legacy ids
  std::string hex;                    // 32 lower-case hex digits

  static Result<VFolderId> Parse(std::string_view s);
  std::string ToString() const;
  bool operator==(const VFolderId&) const = default;
};

// "0123...ef" or "01234567-89ab-..." -> 32 lower-case hex digits.
Result<std::string> NormalizeUuidHex(std::string_view s);
std::string DashedUuid(std::string_view hex32);

// Whether `s` is `min_len` to `max_len` lower-case hex digits (the names of the layout's
// directories, session ids).
bool IsLowerHex(std::string_view s, size_t min_len, size_t max_len);
// Upload session ids, as volumes make them (Volume::CreateStaging): 16 to 64 lower-case hex
// digits, so that one is always a plain file name.
bool IsUploadSessionId(std::string_view s);
// What a second writer of upload session `session` is told (kConflict).
Status UploadWriterBusy(const std::string& session);

// The errors every backend answers about scopes and vfolders, tagged with their subject.
Status MissingQuotaScope(const QuotaScopeId& qsid, std::string_view volume);
Status ExistingQuotaScope(const QuotaScopeId& qsid);
Status QuotaScopeNotEmpty(const QuotaScopeId& qsid);
Status MissingVFolder(const VFolderId& vfid, std::string_view volume);
Status ExistingVFolder(const VFolderId& vfid, std::string_view volume);

}  // namespace sluice
