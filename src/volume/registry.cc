#include "volume/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "volume/btrfs/btrfs_volume.h"
#include "volume/cache/cached_volume.h"
#include "volume/cephfs/cephfs_volume.h"
#include "volume/fault_volume.h"
#include "volume/mem/mem_volume.h"
#include "volume/metrics_volume.h"
#include "volume/s3/s3_volume.h"
#include "volume/vfs/vfs_volume.h"
#include "volume/xfs/xfs_volume.h"

namespace sluice {

namespace {

// A duration option: "90s", "5m", a number of seconds; sub-second values as "250ms".
Result<std::chrono::milliseconds> OptionDuration(const VolumeConfig& cfg, const std::string& key,
                                                 const nlohmann::json& value,
                                                 bool zero_ok = false) {
  auto bad = [&](std::string_view why) {
    return Status(Code::kInvalidArgument, fmt::format("volume.{}.options.{}: {} (got {})", cfg.name,
                                                      key, why, value.dump()));
  };
  std::chrono::milliseconds out{0};
  if (value.is_number_unsigned()) {
    out = std::chrono::seconds(value.get<uint64_t>());
  } else if (value.is_string()) {
    auto d = ParseDurationMillis(value.get<std::string>());
    if (!d.ok()) return bad(d.status().message());
    out = *d;
  } else {
    return bad("expected a duration such as \"60s\"");
  }
  if (out.count() < 0 || (out.count() == 0 && !zero_ok)) return bad("must be more than zero");
  return out;
}

}  // namespace

VolumeRegistry& VolumeRegistry::Builtin() {
  static VolumeRegistry* r = [] {
    auto* reg = new VolumeRegistry();
    reg->Register(
        "vfs",
        [](const VolumeConfig& cfg, const VolumeDeps& deps) -> Result<std::unique_ptr<Volume>> {
          auto reconcile = VfsVolume::kDefaultReconcileAfter;
          std::chrono::microseconds budget = VfsVolume::kDefaultWalkBudget;
          for (const auto& [key, value] : cfg.options.items()) {
            if (key == "usage-reconcile-interval" || key == "usage_reconcile_interval") {
              SLUICE_ASSIGN_OR_RETURN(reconcile, OptionDuration(cfg, key, value, false));
            } else if (key == "usage-walk-budget" || key == "usage_walk_budget") {
              SLUICE_ASSIGN_OR_RETURN(budget, OptionDuration(cfg, key, value, true));
            } else {
              return Status(Code::kInvalidArgument,
                            fmt::format("volume.{}.options: unknown key '{}' for the vfs backend "
                                        "(known: usage-reconcile-interval, usage-walk-budget)",
                                        cfg.name, key));
            }
          }
          return std::unique_ptr<Volume>(new VfsVolume(cfg, deps.scan_pool, reconcile, budget));
        });
    reg->Register(
        "btrfs",
        [](const VolumeConfig& cfg, const VolumeDeps& deps) -> Result<std::unique_ptr<Volume>> {
          if (!cfg.options.empty())
            return Status(
                Code::kInvalidArgument,
                fmt::format("volume.{}.options: the btrfs backend takes no options (got {})",
                            cfg.name, cfg.options.dump()));
          return std::unique_ptr<Volume>(new BtrfsVolume(cfg, deps.scan_pool));
        });
    reg->Register(
        "cephfs",
        [](const VolumeConfig& cfg, const VolumeDeps& deps) -> Result<std::unique_ptr<Volume>> {
          auto window = CephfsVolume::kDefaultPendingWindow;
          for (const auto& [key, value] : cfg.options.items()) {
            if (key != "pending-write-window" && key != "pending_write_window")
              return Status(Code::kInvalidArgument,
                            fmt::format("volume.{}.options: unknown key '{}' for the cephfs "
                                        "backend (known: pending-write-window)",
                                        cfg.name, key));
            SLUICE_ASSIGN_OR_RETURN(window, OptionDuration(cfg, key, value, true));
          }
          return std::unique_ptr<Volume>(new CephfsVolume(cfg, deps.scan_pool, window));
        });
    reg->Register(
        "mem", [](const VolumeConfig& cfg, const VolumeDeps&) -> Result<std::unique_ptr<Volume>> {
          uint64_t capacity = 1ull << 30;
          for (const auto& [key, value] : cfg.options.items()) {
            auto size = value.is_string() ? ParseBinarySize(value.get<std::string>())
                                          : Result<uint64_t>(Status(Code::kInvalidArgument, ""));
            if (key != "capacity" || !size.ok())
              return Status(Code::kInvalidArgument,
                            fmt::format("volume.{}.options: the mem backend takes capacity = "
                                        "\"<size>\" (got {} = {})",
                                        cfg.name, key, value.dump()));
            capacity = *size;
          }
          return std::unique_ptr<Volume>(new MemVolume(cfg, capacity));
        });
    reg->Register(
        "s3", [](const VolumeConfig& cfg, const VolumeDeps&) -> Result<std::unique_ptr<Volume>> {
          SLUICE_ASSIGN_OR_RETURN(auto opts, S3VolumeOptions::FromConfig(cfg));
          return std::unique_ptr<Volume>(new S3Volume(cfg, std::move(opts)));
        });
    // Project quotas; one class for both filesystems.
    for (auto [backend, kind] :
         {std::pair{"xfs", XfsVolume::Kind::kXfs}, std::pair{"ext4", XfsVolume::Kind::kExt4}}) {
      reg->Register(
          backend,
          [backend = std::string(backend), kind = kind](
              const VolumeConfig& cfg, const VolumeDeps& deps) -> Result<std::unique_ptr<Volume>> {
            if (!cfg.options.empty())
              return Status(
                  Code::kInvalidArgument,
                  fmt::format("volume.{}.options: the {} backend takes no options (got {})",
                              cfg.name, backend, cfg.options.dump()));
            return std::unique_ptr<Volume>(new XfsVolume(cfg, deps.scan_pool, kind));
          });
    }
    return reg;
  }();
  return *r;
}

void VolumeRegistry::Register(const std::string& backend, VolumeFactory factory) {
  factories_[backend] = std::move(factory);
}

std::vector<std::string> VolumeRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : factories_) out.push_back(k);
  return out;
}

Result<std::unique_ptr<Volume>> VolumeRegistry::Create(const VolumeConfig& cfg,
                                                       const VolumeDeps& deps) const {
  auto it = factories_.find(cfg.backend);
  if (it == factories_.end())
    return Status(Code::kInvalidArgument,
                  fmt::format("volume.{}.backend = \"{}\" is not available in this build; known "
                              "backends: {}",
                              cfg.name, cfg.backend, fmt::join(Names(), ", ")));
  return it->second(cfg, deps);
}

Result<std::unique_ptr<Volume>> VolumeRegistry::CreateServed(const VolumeConfig& cfg,
                                                             const VolumeDeps& deps,
                                                             bool open_cache) const {
  SLUICE_ASSIGN_OR_RETURN(auto rules, ParseFaultRules(cfg.name, cfg.faults));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Volume> v, Create(cfg, deps));
  if (!rules.empty()) v = std::make_unique<FaultVolume>(std::move(v), std::move(rules));
  v = std::make_unique<MetricsVolume>(
      std::move(v), cfg.max_operations > 0 ? cfg.max_operations : deps.max_operations);
  if (cfg.cache.is_null()) return v;
  // Cache(Metrics(volume)): the metrics count what reaches the volume below the cache.
  SLUICE_ASSIGN_OR_RETURN(CacheOptions co, CacheOptions::FromJson(cfg.name, cfg.cache));
  if (!open_cache) return v;
  SLUICE_ASSIGN_OR_RETURN(auto store, BlockStore::Open(co.StoreOptions()));
  return std::unique_ptr<Volume>(
      std::make_unique<CachedVolume>(std::move(v), std::move(co), std::move(store)));
}

}  // namespace sluice
