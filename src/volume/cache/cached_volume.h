// The SSD read cache, a decorator over any volume (`[volume.NAME.cache]`): an s3 volume, or a
// shared file system with a node-local SSD in front. Files are cached in blocks (block-size,
// default 4 MiB), so a ranged read of a large model caches what was read. Each block is named
// by the file's validator (the origin's ETag, or inode, size and mtime), so a changed file
// never meets its old blocks.
//
// - Freshness: a file's attributes are kept for `ttl` after they were fetched: within it, opens
//   and cached blocks need no origin round trip; after it, the next open asks the origin again.
//   Writes through this node (uploads, deletes, renames, mkdir) drop what the vfolder had.
// - Admission: first-miss (every block read is kept) or second-miss (a block is kept the second
//   time it misses, from a bounded ghost list of recent misses).
// - Single flight: concurrent misses on one block make one origin read.
// - Origin down: with serve-stale (the default), a file whose attributes expired is still served
//   from its cached blocks; what is not cached fails with kUnavailable (HTTP 503).
// - A reader is pinned to the version it opened: a block it misses is fetched from the origin
//   only if the origin still has that version (kConflict otherwise).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "common/thread_pool.h"
#include "volume/cache/block_store.h"
#include "volume/forwarding_volume.h"
#include "volume/key_order.h"

namespace sluice {

struct CacheOptions {
  std::string path;
  uint64_t max_size = 10ULL << 30;
  uint64_t min_free = 1ULL << 30;
  uint64_t block_size = 4ULL << 20;
  std::chrono::milliseconds ttl{60000};
  bool second_miss = false;
  bool serve_stale = true;
  // With serve-stale, how long an origin round trip that could be answered from what is cached
  // (attributes or a listing past the TTL) is waited for: past it the cached answer is served and
  // the round trip goes on in the background, keeping what it finds. An origin that accepts
  // connections and answers nothing (a partition, a stopped process) would otherwise hold each
  // such request until its stall timeout.
  std::chrono::milliseconds revalidate_timeout{2000};
  EvictionPolicy eviction = EvictionPolicy::kS3Fifo;
  uint32_t read_ahead = 4;      // blocks fetched ahead of a sequential reader (0: none)
  uint32_t fetch_threads = 16;  // origin fetches ahead of readers, at most, at once
  // Entries of one directory kept as a listing, at most: a larger directory is listed from the
  // origin page by page, as the caller reads on (what one page of a listing of a level of
  // millions of keys costs at the origin is that page, not the level). All listings kept hold
  // at most max(1 Mi, 2 x max-listing) entries, the oldest dropped first.
  uint64_t max_listing = 100000;
  uint64_t max_listed_entries = 1 << 20;  // not read from the config (tests lower it)
  // Ingest on write: a file written through this node whole, from its first byte on (an S3
  // PutObject or multipart Complete, a tus upload over one or more PATCHes on this node), is
  // kept in the cache as written, once the origin shows the version it made: its first read
  // is a hit. Files larger than a quarter of max-size are not (nor is more than that spooled
  // at once).
  bool ingest = true;
  uint64_t ListedEntriesBound() const { return std::max(max_listed_entries, 2 * max_listing); }

  // From the volume's `cache` table: path (required), max-size, min-free, block-size, ttl,
  // admission ("first-miss" | "second-miss"), eviction ("s3-fifo" | "lru"), serve-stale,
  // revalidate-timeout, read-ahead (blocks), fetch-threads, max-listing (entries), ingest.
  static Result<CacheOptions> FromJson(const std::string& volume, const nlohmann::json& j);
  BlockStoreOptions StoreOptions() const { return {path, max_size, min_free, eviction}; }
};

class CachedVolume : public ForwardingVolume {
 public:
  CachedVolume(std::unique_ptr<Volume> inner, CacheOptions opts, std::unique_ptr<BlockStore> store);
  ~CachedVolume() override;
  // Read-ahead stops; the blocks are made durable and recorded as checked (BlockStore::Close);
  // the directory listings still fresh are kept for the next start (listings.json).
  void Shutdown() override;

  // Stops read-ahead and waits for the origin round trips in flight (as the destructor does),
  // then hands over the volume below: a cache restarted over the same origin (tests) must not
  // leave a round trip using a volume it no longer has.
  std::unique_ptr<Volume> ReleaseOrigin();

  HwInfo GetHwInfo() override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;
  Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
               bool exist_ok) override;
  Status Rename(const VFolderId& vfid, std::string_view relpath,
                std::string_view new_name) override;
  Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) override;
  Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                     bool recursive) override;
  Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid, std::string_view relpath,
                                                 Lookup lookup = Lookup::kMayBlock,
                                                 const LookupHint* hint = nullptr) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(const VFolderId& vfid,
                                                     const std::string& session,
                                                     std::chrono::milliseconds wait) override;
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override;
  // From what the cache knows within the TTL (a file's attributes, a directory's listing, a
  // parent's listing), and from what it knew when the origin does not answer (serve-stale).
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  // A directory's entries (names and attributes) are kept for the TTL too: listings within it
  // need no origin round trip.
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override;
  // A directory of more than max-listing entries is not kept: it is listed from the origin
  // (in key order, a page as the caller reads on, where the origin lists so), its children
  // still opened through the cache.

  struct Stats {
    uint64_t hits = 0, misses = 0, origin_bytes = 0, admission_rejects = 0, stale_served = 0;
    uint64_t read_ahead = 0;     // blocks fetched from the origin ahead of a sequential reader
    bool origin_silent = false;  // see Revalidate
    uint64_t listings = 0, listed_entries = 0;  // directory listings kept, and their entries
    uint64_t listings_passed = 0;               // listings too large to keep, sent to the origin
    uint64_t ingested = 0, ingested_bytes = 0;  // blocks kept as they were written (ingest)
    uint64_t ingests_dropped = 0;  // files written whole whose bytes were not kept (see Ingest)
    BlockStore::Stats store;
  };
  Stats stats() const;
  const CacheOptions& options() const { return opts_; }

  // Operators' commands (service/cache_ops.h walks trees with them).
  // Reads the file's current version into the cache, every block admitted whatever the
  // admission policy; `*bytes` grows as blocks land. The file's size.
  Result<uint64_t> Warm(const VFolderId& vfid, std::string_view relpath,
                        std::atomic<uint64_t>* bytes);
  // Drops the cached blocks of the file's current version and its cached attributes; the
  // number of blocks dropped. (Older versions' blocks are never read again: they age out.)
  Result<uint64_t> Evict(const VFolderId& vfid, std::string_view relpath);
  // Drops every block and every cached attribute; the number of blocks dropped.
  uint64_t EvictAll();

  // Who asks for a block. Only a reader's asking counts as a hit or a miss, so that
  // hits / (hits + misses) is the ratio readers saw: a block read ahead counts as read ahead
  // (and the reader's read of it later as a hit), a warm counts in its task's progress.
  // A warm keeps what it fetches whatever the admission policy (read-ahead applies it, and
  // its reader holds a block read ahead but not kept); a warm that joins another's fetch
  // waits for it even once the origin counts as silent, where the others get kUnavailable.
  enum class Asker { kReader, kReadAhead, kWarm };
  // For readers (cached_volume.cc): block `index` of a file version, from the cache or, once
  // for all concurrent askers, from `fetch`; `fetched` is shown the bytes `fetch` got before
  // they are written into the cache; `held`, asked before `fetch` (by the one asker that would
  // fetch), may have the block already (read ahead, not kept).
  Result<std::shared_ptr<const std::string>> Block(
      const std::string& id, const std::function<Result<std::string>()>& fetch,
      Asker asker = Asker::kReader,
      const std::function<void(const std::shared_ptr<const std::string>&)>& fetched = nullptr,
      const std::function<std::shared_ptr<const std::string>()>& held = nullptr);
  // What names block `index` of a file version on disk.
  std::string BlockId(const VFolderId& vfid, const std::string& rel, const std::string& validator,
                      uint64_t index) const;
  // A write through this node landed on `paths` of the vfolder (each a file, or a directory
  // and everything below it; none: the whole vfolder): what is cached of them is dropped, and
  // every listing of the vfolder. Other files keep their attributes, also for serve-stale.
  // The journal's line is synced before the write is answered: replay must never bring back
  // what it replaced.
  void Invalidate(const VFolderId& vfid, const std::vector<std::string>& paths = {});
  BlockStore& store() { return *store_; }
  void SyncJournal();

  // Ingest on write, for the staging writers (cached_volume.cc). The bytes a session was
  // written with through this node, from its first byte on: in memory while small, else in an
  // unlinked file on the cache disk. A writer takes its session's spool (none: the session
  // holds bytes this node did not see) and gives it back when it closes uncommitted.
  struct Spool;
  std::shared_ptr<Spool> TakeSpool(const VFolderId& vfid, const std::string& session,
                                   uint64_t staged_size);
  void ReturnSpool(const VFolderId& vfid, const std::string& session, std::shared_ptr<Spool> s);
  // Bytes [offset, offset+n) written to the session: spooled, or the spool given up (a gap,
  // past the bound, the cache disk at its floor).
  void Spooled(Spool& s, uint64_t offset, const char* data, size_t n);
  void CutSpool(Spool& s, uint64_t offset);  // the session was cut back to `offset`
  // `quietly`: not counted as an ingest dropped (never to be kept, or kept by a Refill).
  void DropSpool(Spool& s, bool quietly = false);
  // A commit of the spooled session landed on `rel` as `landed` (StagingWriter::Landed): its
  // blocks and attributes are kept once the origin shows that version (in the background
  // where read-ahead has a pool, else now). Written after `gen` (Gen() after the commit's
  // invalidation): a later write through this node keeps its attributes out.
  void Ingest(const VFolderId& vfid, const std::string& rel, std::shared_ptr<Spool> s,
              const std::optional<DirEntry>& landed, uint64_t gen);
  // A commit whose bytes the origin copied itself (StagingWriter::CopiesOnOrigin: none passed
  // through a spool) landed on `rel` as `landed`: fetched back into the cache in the background,
  // as a warm fetches (every block kept), once the origin shows that version, and only when it
  // is no larger than spools may grow.
  void Refill(const VFolderId& vfid, const std::string& rel, const std::optional<DirEntry>& landed);
  uint64_t Gen(const VFolderId& vfid);
  // Runs an ingest's or a refill's `task` on the read-ahead pool (now where there is none); a
  // pool backed up counts an ingest dropped.
  void KeepInBackground(std::function<void()> task);
  // Runs `fn` on the read-ahead pool; false when there is none or it is busy.
  bool Ahead(std::function<void()> fn);
  // Whether the origin counts as silent (see Revalidate); if so, a round trip about `rel`
  // goes out in the background to find out when it answers again (at most two at once).
  bool ProbeIfSilent(const VFolderId& vfid, const std::string& rel);
  // An origin call made directly (not through a revalidation) was answered: no longer silent.
  void OriginAnswered();
  // Whether an origin call that failed with `st` is answered from what is cached instead
  // (serve-stale and the origin unavailable); counted as a stale answer if so.
  bool ServeStale(const Status& st);
  void CountHit() {
    n_.hits++;
    (*g_hits_)++;
  }

 private:
  struct Flight;
  bool Admit(const std::string& id);
  // What the cache knows of `relpath` (`parts`), and whether it is within the TTL.
  std::optional<std::pair<DirEntry, bool>> Known(const VFolderId& vfid,
                                                 const std::vector<std::string>& parts);
  void PublishStore();  // the store's figures to the Prometheus gauges and counters
  // Runs `ask` (an origin round trip) for a caller that has a stale answer to fall back on:
  // on the revalidation pool, waited for up to `revalidate_timeout`; past it (or with the pool
  // full) kUnavailable, and `ask` goes on to keep what it finds for the next caller. Callers
  // with the same `key` share one round trip. Without serve-stale, on the caller's thread.
  template <typename T>
  // `probe`: never waited for, at most kProbes at once, whatever the origin's state.
  Result<T> Revalidate(const std::string& key, std::function<Result<T>()> ask, bool probe = false);
  std::map<std::string, std::shared_ptr<void>> revalidating_;  // key -> its round trip; mu_
  static constexpr int kProbes = 2, kMaxOutstanding = 1024;
  // How often an asker joined to another's block fetch looks whether the origin fell silent.
  static constexpr std::chrono::milliseconds kJoinedCheck{100};
  std::atomic<bool> silent_{false};  // a round trip was given up on; none has answered since
  void SetSilent(bool silent);       // logs the change and keeps the gauge
  // Stops read-ahead and joins the round trips in flight (the destructor, ReleaseOrigin).
  void StopBackground();
  std::atomic<int> outstanding_{0};  // revalidation round trips queued or running

  CacheOptions opts_;
  std::unique_ptr<BlockStore> store_;
  mutable std::mutex mu_;
  struct Meta {
    DirEntry entry;
    std::string meta;  // FileReader::ReadMeta
    std::chrono::steady_clock::time_point fetched;
  };
  // Files' attributes are journaled beside the blocks (<path>/attributes.log, one JSON line
  // per change, replayed and compacted at start), so that a restarted node opens files within
  // the TTL without the origin, and serves them stale after it.
  std::optional<Meta> FindMeta(const VFolderId& vfid, const std::string& rel);
  // Keeps what an origin round trip found, unless a write through this node changed the
  // vfolder since the round trip began (`gen`, from Gen() before it): that answer may predate
  // the write.
  void KeepMeta(const VFolderId& vfid, const std::string& rel, Meta m, uint64_t gen);
  // Which writes through this node the vfolder has seen (Invalidate, EvictAll); mu_ held.
  uint64_t GenLocked(const std::string& vfid) const;
  // Applies `apply` (the change to memory) and appends `record`, in that order, under the
  // journal's lock; JournalIf appends only when `apply` returns true.
  void Journal(const nlohmann::json& record, const std::function<void()>& apply);
  void JournalIf(const nlohmann::json& record, const std::function<bool()>& apply);
  void LoadJournal();
  // One record of the journal replayed into meta_ (it may throw on fields of the wrong type).
  void ReplayJournalLine(const nlohmann::json& j, int64_t now_ns,
                         std::chrono::steady_clock::time_point now);
  // The listings Shutdown kept, taken in once (the file goes as it is read).
  void LoadListings();
  void SaveListings();
  void CompactJournal();  // journal_mu_ held
  static constexpr size_t kMaxMeta = 1 << 20;
  static constexpr uint64_t kJournalCompactAt = 256ULL << 20;
  std::mutex journal_mu_;
  UniqueFd journal_;
  uint64_t journal_bytes_ = 0, journal_compacted_ = 0;  // now, and after the last compaction
  std::map<std::string, Meta> meta_;                    // "<vfid>\0<relpath>"
  struct Listing {
    DirEntry info;
    std::vector<DirEntry> entries;  // by name
    std::chrono::steady_clock::time_point fetched;
    // The names in key order, for listings that page (made on first use).
    std::shared_ptr<const KeyOrderedNames> KeyOrder() const;
    mutable std::once_flag key_order_once;
    mutable std::shared_ptr<const KeyOrderedNames> key_order;
  };
  // The directory's listing: kept, else read and kept. With its path. No listing (nullptr) for
  // a directory of more than max-listing entries: those are listed from the origin.
  Result<std::pair<std::shared_ptr<const Listing>, std::string>> Listed(const VFolderId& vfid,
                                                                        std::string_view relpath);
  // Keeps `l` as the listing of `key`, within the table's bounds; mu_ held.
  // OpenDir (`from` null) or OpenDirFrom.
  Result<std::unique_ptr<DirHandle>> OpenListed(const VFolderId& vfid, std::string_view relpath,
                                                const ListFrom* from);
  // Listings dropped under mu_ go into `*freed` (when given), a vector the caller declared before
  // taking the lock: a listing of a million entries is freed after the lock is let go, not while
  // the event loops' opens wait on it.
  using Freed = std::vector<std::shared_ptr<const Listing>>;
  void KeepListingLocked(const std::string& key, std::shared_ptr<const Listing> l,
                         Freed* freed = nullptr);
  void DropListingLocked(std::map<std::string, std::shared_ptr<const Listing>>::iterator it,
                         Freed* freed = nullptr);
  std::map<std::string, std::shared_ptr<const Listing>> dirs_;  // "<vfid>\0<relpath>"; mu_
  uint64_t listed_entries_ = 0;                                 // in dirs_; mu_
  // Directories found larger than max-listing, and when: listed from the origin within the
  // TTL without being counted again; mu_.
  std::map<std::string, std::chrono::steady_clock::time_point> large_dirs_;
  std::atomic<uint64_t> passed_{0};
  std::map<std::string, std::shared_ptr<Flight>> flights_;
  // Spools of sessions between two writers ("<vfid>\0<session>"; mu_), at most kMaxSpools,
  // the least recently given back dropped first; and the bytes all spools hold, at most a
  // quarter of max-size.
  std::atomic<uint64_t> spooled_{0};  // (before spools_: their destructors count it down)
  std::map<std::string, std::shared_ptr<Spool>> spools_;
  static constexpr size_t kMaxSpools = 64;
  static std::string SpoolKey(const VFolderId& vfid, const std::string& session) {
    return vfid.ToString() + '\0' + session;
  }
  std::shared_ptr<Spool> UnlistSpool(const VFolderId& vfid, const std::string& session);  // mu_
  void IngestNow(const VFolderId& vfid, const std::string& rel, const Spool& s,
                 const DirEntry& landed, uint64_t gen);
  uint64_t next_gen_ = 0, all_gen_ = 0;     // mu_
  std::map<std::string, uint64_t> vf_gen_;  // vfid -> the generation of its last write; mu_
  MissFilter second_miss_;
  // This cache's counts, and the process's Prometheus counters they are added to.
  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, origin_bytes{0}, rejects{0}, stale{0};
    std::atomic<uint64_t> ingested{0}, ingested_bytes{0}, ingests_dropped{0}, read_ahead{0};
  } n_;
  std::atomic<uint64_t>*g_hits_, *g_misses_, *g_origin_bytes_, *g_rejects_, *g_stale_,
      *g_evictions_, *g_fill_bytes_, *g_ingest_bytes_, *g_read_ahead_;
  std::atomic<int64_t>*g_bytes_, *g_blocks_, *g_silent_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ThreadPool> revalidate_;  // origin round trips waited for with a deadline
  std::unique_ptr<ThreadPool> ahead_;       // last: stopped first
};

}  // namespace sluice
