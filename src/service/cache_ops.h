// Operators' commands on a volume's SSD cache (`[volume.NAME.cache]`): stats, prewarm a
// vfolder or a path in it as a background task with progress, and evict. Behind the manager
// API's /volume/cache routes and `sluice cache`.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "volume/cache/cached_volume.h"

namespace sluice {

// The volume's cache; kInvalidArgument when it has none.
Result<CachedVolume*> CacheOf(Volume* v);

// Options, contents, counters and the index's estimated memory.
nlohmann::json CacheStatsJson(CachedVolume& c);

struct WarmProgress {
  std::atomic<uint64_t> files_found{0}, files_done{0}, bytes_found{0}, bytes_done{0}, errors{0};
  std::atomic<bool> listed{false};  // the walk has found every file
  nlohmann::json ToJson() const;
};

// Reads every file under `path` (a directory, or one file; "" is the vfolder) into the cache,
// `parallel` files at a time, calling `tick` about every half second with the progress. A file
// that cannot be read is counted and skipped, and the warm fails at the end naming the first;
// an unreachable origin stops it at once.
Status WarmTree(CachedVolume& c, const VFolderId& vfid, std::string_view path,
                WarmProgress* progress, const std::function<void()>& tick, size_t parallel = 8);

// Drops the cached blocks of every file under `path`; {"files": n, "blocks": n}.
Result<nlohmann::json> EvictTree(CachedVolume& c, const VFolderId& vfid, std::string_view path);

}  // namespace sluice
