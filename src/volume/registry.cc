#include "volume/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "volume/btrfs/btrfs_volume.h"
#include "volume/vfs/vfs_volume.h"
#include "volume/xfs/xfs_volume.h"

namespace sluice {

VolumeRegistry& VolumeRegistry::Builtin() {
  static VolumeRegistry* r = [] {
    auto* reg = new VolumeRegistry();
    reg->Register(
        "vfs",
        [](const VolumeConfig& cfg, const VolumeDeps& deps) -> Result<std::unique_ptr<Volume>> {
          if (!cfg.options.empty())
            return Status(
                Code::kInvalidArgument,
                fmt::format("volume.{}.options: the vfs backend takes no options (got {})",
                            cfg.name, cfg.options.dump()));
          return std::unique_ptr<Volume>(new VfsVolume(cfg, deps.scan_pool));
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

}  // namespace sluice
