#include "service/tokens.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/jwt.h"

namespace sluice {

namespace {

int64_t Expiry(std::chrono::seconds lifetime) {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch() + lifetime)
      .count();
}

// The claims of a verified token whose `claim` is `value`.
Result<nlohmann::json> Verify(std::string_view token, const std::string& secret,
                              std::string_view claim, std::string_view value) {
  if (token.empty()) return Status(Code::kUnauthenticated, "missing 'token' query parameter");
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json claims, JwtDecode(token, secret));
  auto c = claims.find(std::string(claim));
  if (c == claims.end() || !c->is_string() || c->get<std::string>() != value)
    return Status(Code::kUnauthenticated,
                  fmt::format("token is not valid here: it is not a '{}' token", value));
  return claims;
}

// `what` names the token in the error ("download token").
Result<std::string> StrClaim(const nlohmann::json& claims, const char* key, std::string_view what) {
  auto it = claims.find(key);
  if (it == claims.end() || !it->is_string())
    return Status(Code::kInvalidArgument,
                  fmt::format("{}: claim '{}' is missing or not a string", what, key));
  return it->get<std::string>();
}

std::optional<double> Exp(const nlohmann::json& claims) {
  if (auto e = claims.find("exp"); e != claims.end() && e->is_number()) return e->get<double>();
  return std::nullopt;
}

}  // namespace

std::string TokenService::Issue(const DownloadGrant& g) const {
  nlohmann::json claims = {{"op", "download"},     {"volume", g.volume},
                           {"vfid", g.vfid},       {"relpath", g.relpath},
                           {"archive", g.archive}, {"exp", Expiry(lifetime_)}};
  if (g.unmanaged_path) claims["unmanaged_path"] = *g.unmanaged_path;
  return JwtEncode(claims, secret_);
}

std::string TokenService::Issue(const ArchiveGrant& g) const {
  nlohmann::json claims = {{"operation", "download"},
                           {"volume", g.volume},
                           {"virtual_folder_id", g.vfid},
                           {"files", g.files},
                           {"exp", Expiry(lifetime_)}};
  if (g.filename) claims["filename"] = *g.filename;
  return JwtEncode(claims, secret_);
}

std::string TokenService::Issue(const UploadGrant& g) const {
  return JwtEncode({{"op", "upload"},
                    {"volume", g.volume},
                    {"vfid", g.vfid},
                    {"relpath", g.relpath},
                    {"size", g.size},
                    {"session", g.session},
                    {"exp", Expiry(lifetime_)}},
                   secret_);
}

Result<DownloadGrant> TokenService::VerifyDownload(std::string_view token) const {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json claims, Verify(token, secret_, "op", "download"));
  DownloadGrant g;
  SLUICE_ASSIGN_OR_RETURN(g.volume, StrClaim(claims, "volume", "download token"));
  SLUICE_ASSIGN_OR_RETURN(g.vfid, StrClaim(claims, "vfid", "download token"));
  SLUICE_ASSIGN_OR_RETURN(g.relpath, StrClaim(claims, "relpath", "download token"));
  if (auto a = claims.find("archive"); a != claims.end() && a->is_boolean() && a->get<bool>())
    g.archive = true;
  if (auto u = claims.find("unmanaged_path"); u != claims.end() && !u->is_null()) {
    if (!u->is_string())
      return Status(Code::kInvalidArgument,
                    "download token: claim 'unmanaged_path' is not a string");
    g.unmanaged_path = u->get<std::string>();
  }
  g.exp = Exp(claims);
  return g;
}

Result<ArchiveGrant> TokenService::VerifyArchive(std::string_view token) const {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json claims, Verify(token, secret_, "operation", "download"));
  ArchiveGrant g;
  SLUICE_ASSIGN_OR_RETURN(g.volume, StrClaim(claims, "volume", "archive token"));
  SLUICE_ASSIGN_OR_RETURN(g.vfid, StrClaim(claims, "virtual_folder_id", "archive token"));
  auto files = claims.find("files");
  if (files == claims.end() || !files->is_array() || files->empty())
    return Status(Code::kInvalidArgument,
                  "archive token: claim 'files' is missing or not a non-empty list of paths");
  for (const auto& f : *files) {
    if (!f.is_string())
      return Status(Code::kInvalidArgument, "the token's 'files' must be a list of strings");
    g.files.push_back(f.get<std::string>());
  }
  if (auto fn = claims.find("filename"); fn != claims.end() && fn->is_string())
    g.filename = fn->get<std::string>();
  g.exp = Exp(claims);
  return g;
}

Result<UploadGrant> TokenService::VerifyUpload(std::string_view token) const {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json claims, Verify(token, secret_, "op", "upload"));
  auto str = [&](const char* key) { return StrClaim(claims, key, "upload token"); };
  UploadGrant g;
  SLUICE_ASSIGN_OR_RETURN(g.volume, str("volume"));
  SLUICE_ASSIGN_OR_RETURN(g.vfid, str("vfid"));
  SLUICE_ASSIGN_OR_RETURN(g.relpath, str("relpath"));
  SLUICE_ASSIGN_OR_RETURN(g.session, str("session"));
  auto size = claims.find("size");
  if (size == claims.end() || !size->is_number_integer() ||
      (!size->is_number_unsigned() && size->get<int64_t>() < 0))
    return Status(Code::kInvalidArgument,
                  "upload token: claim 'size' is missing or not a non-negative integer");
  g.size = size->is_number_unsigned() ? size->get<uint64_t>()
                                      : static_cast<uint64_t>(size->get<int64_t>());
  g.exp = Exp(claims);
  return g;
}

}  // namespace sluice
