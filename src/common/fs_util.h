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

// fsync of the directory `path`: a name made, renamed or removed in it survives a power loss
// once this returns Ok.
Status SyncDir(const std::string& path);

// mkdir that treats an existing directory as success.
Status EnsureDir(const std::string& path, mode_t mode);

// renameat2(RENAME_NOREPLACE) with the same return convention (0, or -1 and errno; EEXIST when
// the target exists). Filesystems that do not support the flag (FUSE clients such as ceph-fuse
// answer EINVAL) get, for a file, a hard link (which fails on an existing name too: atomic) and
// the old name's removal; for a directory, a check for the target followed by a plain renameat:
// not atomic against a concurrent creator of the same name, which Sluice's own callers rule out
// (random or locked names).
int RenameNoReplace(int olddirfd, const char* oldpath, int newdirfd, const char* newpath);

}  // namespace sluice
