// Administration of S3 users, access keys and bucket names on the manager API (manager token):
//   POST   /s3/users              {id, display_name?, volume?, quota_scope?}
//   GET    /s3/users
//   DELETE /s3/users/{id}
//   POST   /s3/keys               {user, access_key?, secret_key?, buckets?, read_only?}
//                                 -> the key with its secret (shown this once)
//   GET    /s3/keys               (no secrets)
//   DELETE /s3/keys/{access_key}
//   POST   /s3/buckets            {name, volume, vfid, owner}: binds a name to a vfolder
//   GET    /s3/buckets
//   DELETE /s3/buckets/{name}     unbinds; the vfolder stays
#pragma once

#include "api/http.h"

namespace sluice {
class StorageService;
class S3Store;
}  // namespace sluice

namespace sluice::api {

void AddS3AdminRoutes(RouteGroup& group, StorageService* service, S3Store* store);

}  // namespace sluice::api
