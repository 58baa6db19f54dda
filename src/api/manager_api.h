// The manager-facing API (Backend.AI storage-proxy compatible) and the health routes that the
// manager and internal listeners share.
#pragma once

#include <functional>
#include <memory>

#include "api/http.h"
#include "service/health.h"
#include "service/storage_service.h"

namespace sluice {
class S3Store;
}

namespace sluice::api {

// Health of the node, as the probes report it.
struct HealthSource {
  const HealthMonitor* monitor = nullptr;
  std::string node_id;
  std::function<bool()> draining;  // true once shutdown began
};

// Adds GET /, /status, /health, /livez, /readyz (no auth) to `router`.
void AddHealthRoutes(Router& router, const HealthSource& src, const std::string& api_type);

// The manager API's authenticator: `header` must carry `secret`.
Authenticator ManagerTokenAuth(std::string header, std::string secret);

// Builds the manager API router; every route except the health routes needs the manager token.
// With `s3` (the S3 listener is on), the S3 administration routes (s3/s3_admin_api.h) too.
std::shared_ptr<Router> MakeManagerRouter(StorageService* service, ThreadPool* io_pool,
                                          const std::string& manager_secret,
                                          const HealthSource& health, S3Store* s3 = nullptr);

std::string SluiceVersion();

}  // namespace sluice::api
