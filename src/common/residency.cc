#include "common/residency.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace sluice {

namespace {

// cachestat(2): Linux 6.5, the same number on every architecture's generic table. Debian 12's
// headers predate it.
constexpr long kSysCachestat = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

std::atomic<bool> g_no_cachestat{false};

}  // namespace

Residency ProbeResidency(int fd, uint64_t off, uint64_t len) {
  if (len == 0) return Residency::kResident;
  if (g_no_cachestat.load(std::memory_order_relaxed)) return Residency::kUnknown;
  CachestatRange range{off, len};
  Cachestat cs{};
  if (::syscall(kSysCachestat, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS) g_no_cachestat.store(true, std::memory_order_relaxed);
    return Residency::kUnknown;  // (EOPNOTSUPP: a file without a page cache, e.g. hugetlbfs)
  }
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (off + len - 1) / page - off / page + 1;
  return cs.nr_cache >= pages ? Residency::kResident : Residency::kCold;
}

}  // namespace sluice
