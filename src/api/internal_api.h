// Routers of the internal listener (health, Prometheus /metrics) and of the client-facing
// listener (downloads and uploads come with the client data API; today it answers status and
// health, with CORS).
#pragma once

#include <memory>

#include "api/manager_api.h"

namespace sluice::api {

std::shared_ptr<Router> MakeInternalRouter(ThreadPool* io_pool, const HealthSource& health);
std::shared_ptr<Router> MakeClientRouter(ThreadPool* io_pool, const HealthSource& health);

}  // namespace sluice::api
