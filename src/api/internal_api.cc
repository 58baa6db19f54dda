#include "api/internal_api.h"

#include "common/metrics.h"

namespace sluice::api {

std::shared_ptr<Router> MakeInternalRouter(ThreadPool* io_pool, const HealthSource& health) {
  auto router = std::make_shared<Router>("internal", io_pool);
  AddHealthRoutes(*router, health, "internal");
  router->Add(http::verb::get, "/metrics",
              Route{.handler =
                        [](const HttpRequest&) {
                          return HttpResponse::Text(200, Metrics::Global().RenderPrometheus(),
                                                    "text/plain; version=0.0.4; charset=utf-8");
                        },
                    .blocking = false,
                    .body_limit = 0});
  return router;
}

}  // namespace sluice::api
