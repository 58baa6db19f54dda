// Upload staging on directory-backed volumes (PosixVolume and its subclasses). Inside each
// vfolder:
//   .upload/<session>         the staging file: the bytes received so far
//   .upload/<session>.offset  the record: {"offset": N, ...}, N bytes of the staging file are
//                             durable (fdatasync'ed before N was written). Fixed-size, swapped
//                             with a spare (.offset.tmp) by RENAME_EXCHANGE, so recording needs
//                             no new block even when the quota or the disk is full. Missing
//                             means 0.
// One writer at a time: the writer holds an OFD lock (fcntl F_OFD_SETLK) on the staging file
// for as long as it writes. The lock belongs to the open file, so every process on the host
// (and every NFS client, through the server's lock manager) sees it, and it vanishes with the
// process that held it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "volume/volume.h"

namespace sluice {

// How a writer reports what it changed in its vfolder (bytes, entries), for volumes that keep
// usage figures.
using StagingAccount = std::function<void(int64_t bytes, int64_t entries)>;

// Creates an empty staging file in the vfolder open at `root` (O_PATH); returns its session id.
Result<std::string> CreateStagingAt(int root, const StagingAccount& account);
Status DiscardStagingAt(int root, const std::string& session, const StagingAccount& account);
Result<StagingState> InspectStagingAt(int root, const std::string& session);
Result<std::unique_ptr<StagingWriter>> OpenStagingAt(UniqueFd root, const std::string& session,
                                                     std::chrono::milliseconds wait,
                                                     StagingAccount account);
// Sweeps the staging directory of the vfolder open at `vfdir` (and removes the directory once
// it is empty and old). `removed` is called with the session ids removed; what goes is accounted
// through `account`, as CreateStagingAt accounted it.
StagingSweep SweepStagingAt(int vfdir, const std::string& where, std::chrono::seconds age,
                            const std::function<void(const std::string&)>& removed,
                            const StagingAccount& account);

}  // namespace sluice
