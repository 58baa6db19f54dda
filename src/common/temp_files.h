// Temporary files a command made and has not yet renamed into place or removed (a download's
// `.sluice-NAME.RANDOM`, say): removed when the process is interrupted before it gets there,
// so that Ctrl-C leaves no hidden, preallocated file behind for a later `sync` to upload.
#pragma once

#include <sys/types.h>

#include <string>

namespace sluice::temp_files {

// Creates `path` (open(2) with O_CREAT | O_EXCL and `flags`), ours until Forget(path):
// renamed into place, or removed. Created and tracked at once, so that a signal between the
// two cannot leave it. The descriptor, or -1 with errno.
int Create(const std::string& path, int flags, mode_t mode);
void Forget(const std::string& path);

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, so in every thread started after
// it (call it first thing in main), and starts a thread that waits for them: it removes the
// tracked files, then dies of the signal as the process would have without it.
void RemoveOnSignals();

}  // namespace sluice::temp_files
