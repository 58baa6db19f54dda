// The client-facing listener (Backend.AI storage-proxy compatible): token downloads and
// archives (download_api.cc), tus uploads (upload_api.cc), status and health, CORS.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/manager_api.h"

namespace sluice::api {

std::shared_ptr<Router> MakeClientRouter(StorageService* service, ThreadPool* io_pool,
                                         const HealthSource& health);

// The claims of the `token` query parameter, verified with [storage-proxy] secret: signature,
// expiry, and `claim` == `value` (op == "download", say). A missing, forged, expired or wrongly
// scoped token is kUnauthenticated with a message that says which.
Result<nlohmann::json> VerifySessionToken(const HttpRequest& req, const std::string& secret,
                                          std::string_view claim, std::string_view value);

// Registered by download_api.cc and upload_api.cc.
void AddDownloadRoutes(Router& router, StorageService* service);
void AddUploadRoutes(Router& router, StorageService* service);

}  // namespace sluice::api
