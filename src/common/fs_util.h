// Small filesystem helpers shared by the backends.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace sluice {

// Replaces `path` with `body` atomically: a staging file beside it, fsync, rename. A crash
// leaves the old content or the new one, never a torn file.
Status WriteFileAtomic(const std::string& path, std::string_view body, mode_t mode = 0600);

// mkdir that treats an existing directory as success.
Status EnsureDir(const std::string& path, mode_t mode);

}  // namespace sluice
