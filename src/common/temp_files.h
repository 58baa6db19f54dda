// Temporary files a command made and has not yet renamed into place or removed (a download's
// `.sluice-NAME.RANDOM`, say): removed when the process is interrupted before it gets there,
// so that Ctrl-C leaves no hidden, preallocated file behind for a later `sync` to upload.
#pragma once

#include <string>

namespace sluice::temp_files {

// `path` is ours until Forget(path): renamed into place, or removed.
void Track(const std::string& path);
void Forget(const std::string& path);

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, so in every thread started after
// it (call it first thing in main), and starts a thread that waits for them: it removes the
// tracked files, then dies of the signal as the process would have without it.
void RemoveOnSignals();

}  // namespace sluice::temp_files
