#include "api/client_api.h"

namespace sluice::api {

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
