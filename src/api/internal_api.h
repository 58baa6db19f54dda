// The router of the internal listener: health and Prometheus /metrics.
#pragma once

#include <memory>

#include "api/manager_api.h"

namespace sluice::api {

std::shared_ptr<Router> MakeInternalRouter(ThreadPool* io_pool, const HealthSource& health);

}  // namespace sluice::api
