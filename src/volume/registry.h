// Backends register a factory under the name used in config (`backend = "vfs"`).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/thread_pool.h"
#include "volume/volume.h"

namespace sluice {

struct VolumeDeps {
  ThreadPool* scan_pool = nullptr;
  // The bulkhead of a volume whose config sets no max-operations (MetricsVolume); 0: none.
  int max_operations = 0;
};

using VolumeFactory =
    std::function<Result<std::unique_ptr<Volume>>(const VolumeConfig&, const VolumeDeps&)>;

class VolumeRegistry {
 public:
  // The registry with every backend built into this binary.
  static VolumeRegistry& Builtin();

  void Register(const std::string& backend, VolumeFactory factory);
  std::vector<std::string> Names() const;
  // Creates (does not Init) a volume; kInvalidArgument naming the known backends otherwise.
  Result<std::unique_ptr<Volume>> Create(const VolumeConfig& cfg, const VolumeDeps& deps) const;
  // Creates a volume as the daemon serves it: the backend, under fault injection when the
  // config has faults, under metrics always, under its SSD cache when it has one. Without
  // `open_cache` (a config check, maybe beside the running daemon) the cache's options are
  // checked and its directory left alone: opening it would take it from the daemon.
  Result<std::unique_ptr<Volume>> CreateServed(const VolumeConfig& cfg, const VolumeDeps& deps,
                                               bool open_cache = true) const;

 private:
  std::map<std::string, VolumeFactory> factories_;
};

}  // namespace sluice
