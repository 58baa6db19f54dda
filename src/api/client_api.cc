#include "api/client_api.h"

#include <fmt/format.h>

#include "common/jwt.h"

namespace sluice::api {

Result<nlohmann::json> VerifySessionToken(const HttpRequest& req, const std::string& secret,
                                          std::string_view claim, std::string_view value) {
  auto it = req.query.find("token");
  if (it == req.query.end() || it->second.empty())
    return Status(Code::kUnauthenticated, "missing 'token' query parameter");
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json claims, JwtDecode(it->second, secret));
  auto c = claims.find(std::string(claim));
  if (c == claims.end() || !c->is_string() || c->get<std::string>() != value)
    return Status(Code::kUnauthenticated,
                  fmt::format("token is not valid here: it is not a '{}' token", value));
  return claims;
}

std::shared_ptr<Router> MakeClientRouter(StorageService* service, ThreadPool* io_pool,
                                         const HealthSource& health) {
  auto router = std::make_shared<Router>("client", io_pool);
  AddHealthRoutes(*router, health, "client-facing");
  router->AddCorsHeader("Access-Control-Allow-Origin", "*");
  router->AddCorsHeader("Access-Control-Expose-Headers",
                        "Content-Disposition, Content-Length, Content-Range, Accept-Ranges, "
                        "Upload-Offset, Upload-Length, Tus-Resumable, Tus-Version, "
                        "Tus-Max-Size, Location");
  AddDownloadRoutes(*router, service);
  AddUploadRoutes(*router, service);
  return router;
}

}  // namespace sluice::api
