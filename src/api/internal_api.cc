#include "api/internal_api.h"

#include "common/metrics.h"

namespace sluice::api {

std::shared_ptr<Router> MakeInternalRouter(ThreadPool* io_pool, const HealthSource& health) {
  auto router = std::make_shared<Router>("internal", io_pool);
  AddHealthRoutes(*router, health, "internal");
  router->Add(http::verb::get, "/metrics",
              Route{"/metrics",
                    [](const HttpRequest&) {
                      return HttpResponse::Text(200, Metrics::Global().RenderPrometheus(),
                                                "text/plain; version=0.0.4; charset=utf-8");
                    },
                    false, false});
  return router;
}

std::shared_ptr<Router> MakeClientRouter(ThreadPool* io_pool, const HealthSource& health) {
  auto router = std::make_shared<Router>("client", io_pool);
  AddHealthRoutes(*router, health, "client-facing");
  router->AddDefaultHeader("Access-Control-Allow-Origin", "*");
  router->AddDefaultHeader("Access-Control-Expose-Headers",
                           "Content-Disposition, Content-Length, Content-Range, Upload-Offset, "
                           "Upload-Length, Tus-Resumable, Tus-Version, Tus-Max-Size, Location");
  return router;
}

}  // namespace sluice::api
