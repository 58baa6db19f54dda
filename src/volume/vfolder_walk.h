// A depth-first walk of a vfolder's tree through DirHandles (any backend): every entry with its
// path relative to the walk's start, directories before what they hold. The upload staging
// directory at the vfolder root is left out; a directory gone between its listing and its
// opening is skipped.
#pragma once

#include <functional>
#include <string>

#include "volume/volume.h"

namespace sluice {

using VisitEntry =
    std::function<Status(const std::string& rel, const DirHandle::Name& n, DirHandle& parent)>;

inline Status WalkVFolderTree(DirHandle& d, const std::string& rel, bool at_root,
                              const VisitEntry& visit) {
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto n, d.Next());
    if (!n) return Status::Ok();
    if (at_root && n->name == kStagingDirName) continue;
    const std::string child = rel.empty() ? n->name : rel + "/" + n->name;
    SLUICE_RETURN_IF_ERROR(visit(child, *n, d));
    if (n->type != EntryType::kDirectory) continue;
    auto sub = d.OpenSubdir(n->name);
    if (!sub.ok()) {
      if (sub.status().code() == Code::kNotFound) continue;
      return sub.status();
    }
    SLUICE_RETURN_IF_ERROR(WalkVFolderTree(**sub, child, false, visit));
  }
}

}  // namespace sluice
