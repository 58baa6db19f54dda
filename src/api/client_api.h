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

// Registered by download_api.cc and upload_api.cc.
void AddDownloadRoutes(Router& router, StorageService* service);
void AddUploadRoutes(Router& router, StorageService* service);

}  // namespace sluice::api
