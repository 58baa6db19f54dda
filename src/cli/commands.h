// The `sluice` command tree (CLI11) and what each command does: requests to the daemon's
// manager-facing API, human tables by default, the daemon's JSON with --json.
#pragma once

namespace sluice::cli {

// Exit statuses scripts can rely on (also listed in `sluice --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // the daemon refused (4xx not listed below), task failed
inline constexpr int kExitUsage = 2;     // bad arguments
inline constexpr int kExitNotFound = 3;  // 404
inline constexpr int kExitConflict = 4;  // 409
inline constexpr int kExitAuth = 5;      // 401 / 403
inline constexpr int kExitUnavailable = 6;  // cannot connect, timeout, 5xx

// The exit status for an HTTP status that is not a success.
int ExitCodeForHttpStatus(unsigned status);

// Parses the arguments, runs the command, prints to stdout / stderr; returns the exit status.
int RunCli(int argc, char** argv);

}  // namespace sluice::cli
