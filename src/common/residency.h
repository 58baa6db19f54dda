// Page-cache residency of file ranges: event loops send file data only when it is already in the
// page cache, so that no loop ever waits on a disk; what is not resident is read on the I/O pool
// (FileReader::ReadAt). A cold 300 MB download from a slow disk used to stall every connection
// on its loop.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace sluice {

enum class Residency {
  kResident,  // every page of the range is in the page cache
  kCold,      // some page is not: reading it may wait on the disk
  kUnknown,   // the kernel cannot say (no cachestat): probe by reading with RWF_NOWAIT
};

// Whether [off, off + len) of `fd` is in the page cache: one cachestat(2) call (Linux 6.5+),
// no copy and no I/O.
Residency ProbeResidency(int fd, uint64_t off, uint64_t len);

}  // namespace sluice
