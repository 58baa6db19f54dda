// The sluiced process: turns a Config into running listeners, and drains them on SIGTERM.
#pragma once

#include "common/config.h"

namespace sluice {

// Runs until SIGTERM/SIGINT; returns the process exit code (0 clean, 1 runtime failure,
// 2 bad configuration).
int RunDaemon(Config cfg);

// What --check-config adds to parsing: every volume's backend exists and accepts its options
// (nothing is opened on disk).
Status CheckVolumeConfigs(const Config& cfg);

// Resolves relative paths, creates the state directory and fills empty secrets from
// <state-dir>/secrets (generating them on first start).
Status PrepareConfig(Config& cfg);

}  // namespace sluice
