// Backend.AI's VFS artifact storages on the manager-facing listener (the reference's
// storage/api/v1/storages/vfs_storage.py, mounted at /v1/storages/vfs):
//
//   GET  /v1/storages/vfs/{storage_name}/files     {"directory"}  the tree below it, recursive
//   POST /v1/storages/vfs/{storage_name}/download  {"filepath"}   a file, or a directory as TAR
//   GET  /v1/storages/vfs/{storage_name}/meta      {"filepath"}   one path's attributes
//
// Parameters travel in a JSON body, also on GET. Every path is resolved beneath the storage's
// base directory (openat2 RESOLVE_BENEATH): symbolic links are followed only while they stay
// inside it. The reference's upload and delete routes are not served.
#pragma once

#include <vector>

#include "api/http.h"
#include "common/config.h"

namespace sluice::api {

// Adds the routes above to `group` (the manager-token group). The storages are copied.
void AddVfsStorageRoutes(RouteGroup& group, const std::vector<VfsStorageConfig>& storages);

}  // namespace sluice::api
