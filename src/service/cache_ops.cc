#include "service/cache_ops.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/path.h"
#include "volume/vfolder_walk.h"

namespace sluice {

namespace {

using FileFn = std::function<Status(const std::string& rel, const DirEntry& e)>;

// Every regular file under `path` (a directory or a file), with its attributes.
Status WalkFiles(Volume& v, const VFolderId& vfid, std::string_view path, const FileFn& fn) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(path));
  const std::string rel = parts.empty() ? std::string() : JoinComponents(parts, parts.size());
  if (!rel.empty()) {
    SLUICE_ASSIGN_OR_RETURN(DirEntry e, v.Stat(vfid, rel));
    if (e.type == EntryType::kFile) return fn(rel, e);
    if (e.type != EntryType::kDirectory)
      return Status(Code::kInvalidArgument,
                    fmt::format("'{}' is neither a file nor a directory", rel));
  }
  SLUICE_ASSIGN_OR_RETURN(auto d, v.OpenDir(vfid, rel));
  return WalkVFolderTree(
      *d, rel, rel.empty(), [&](const std::string& child, const DirHandle::Name& n, DirHandle& in) {
        if (n.type != EntryType::kFile) return Status::Ok();
        auto e = in.StatEntry(n.name);
        if (!e.ok())  // gone meanwhile: skipped
          return e.status().code() == Code::kNotFound ? Status::Ok() : e.status();
        return fn(child, *e);
      });
}

}  // namespace

Result<CachedVolume*> CacheOf(Volume* v) {
  if (auto* c = dynamic_cast<CachedVolume*>(v)) return c;
  return Status(Code::kInvalidArgument,
                fmt::format("volume '{}' has no SSD cache (configure [volume.{}.cache])", v->name(),
                            v->name()));
}

nlohmann::json CacheStatsJson(CachedVolume& c) {
  const CachedVolume::Stats s = c.stats();
  const CacheOptions& o = c.options();
  const uint64_t lookups = s.hits + s.misses;
  // Per block: the hash-map node with its key, size, links and counter, and the bucket
  // (measured by bench/cache_policy.cc: about 110 bytes).
  constexpr uint64_t kIndexBytesPerBlock = 110;
  return {{"volume", c.name()},
          {"path", o.path},
          {"max_size", o.max_size},
          {"min_free", o.min_free},
          {"block_size", o.block_size},
          {"ttl_ms", o.ttl.count()},
          {"admission", o.second_miss ? "second-miss" : "first-miss"},
          {"eviction", o.eviction == EvictionPolicy::kLru ? "lru" : "s3-fifo"},
          {"serve_stale", o.serve_stale},
          {"revalidate_timeout_ms", o.revalidate_timeout.count()},
          {"blocks", s.store.blocks},
          {"bytes", s.store.bytes},
          {"hits", s.hits},
          {"misses", s.misses},
          {"hit_ratio", lookups ? double(s.hits) / double(lookups) : 0.0},
          {"read_ahead_blocks", s.read_ahead},
          {"origin_bytes", s.origin_bytes},
          {"fill_bytes", s.store.filled_bytes},
          {"evictions", s.store.evictions},
          {"admission_rejects", s.admission_rejects},
          {"torn_blocks", s.store.torn},
          {"stale_opens", s.stale_served},
          {"origin_silent", s.origin_silent},
          {"max_listing", o.max_listing},
          {"listings", s.listings},
          {"listing_entries", s.listed_entries},
          {"listings_passed", s.listings_passed},
          {"ingest", o.ingest},
          {"ingested_blocks", s.ingested},
          {"ingested_bytes", s.ingested_bytes},
          {"ingests_dropped", s.ingests_dropped},
          {"index_bytes_estimate", s.store.blocks * kIndexBytesPerBlock}};
}

nlohmann::json WarmProgress::ToJson() const {
  return {{"files_found", files_found.load()}, {"files_done", files_done.load()},
          {"bytes_found", bytes_found.load()}, {"bytes_done", bytes_done.load()},
          {"errors", errors.load()},           {"listed", listed.load()}};
}

Status WarmTree(CachedVolume& c, const VFolderId& vfid, std::string_view path,
                WarmProgress* progress, const std::function<void()>& tick, size_t parallel) {
  // The walk feeds a bounded queue; `parallel` workers read files from it.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> queue;
  bool walked = false;
  Status first_error, stop;  // a file's error; an error that ends the warm
  const size_t kQueueMax = 4096;
  auto worker = [&] {
    for (;;) {
      std::string rel;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return !queue.empty() || walked || !stop.ok(); });
        if (queue.empty() || !stop.ok()) return;
        rel = std::move(queue.front());
        queue.pop_front();
      }
      cv.notify_all();  // room for the walk
      auto r = c.Warm(vfid, rel, &progress->bytes_done);
      std::lock_guard lk(mu);
      if (r.ok()) {
        progress->files_done++;
        continue;
      }
      progress->errors++;
      if (r.status().code() == Code::kUnavailable) {
        stop = r.status();
        cv.notify_all();
        return;
      }
      if (first_error.ok())
        first_error = Status(r.status().code(), fmt::format("'{}': {}", rel, r.status().message()));
    }
  };
  std::vector<std::thread> workers;
  for (size_t i = 0; i < std::max<size_t>(1, parallel); ++i) workers.emplace_back(worker);
  std::mutex tick_mu;
  std::condition_variable tick_cv;
  bool done = false;
  std::thread ticker([&] {
    std::unique_lock lk(tick_mu);
    while (!tick_cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return done; })) {
      lk.unlock();
      tick();
      lk.lock();
    }
  });
  Status walk = WalkFiles(c, vfid, path, [&](const std::string& rel, const DirEntry& e) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return queue.size() < kQueueMax || !stop.ok(); });
    if (!stop.ok()) return stop;
    queue.push_back(rel);
    progress->files_found++;
    progress->bytes_found += e.size;
    cv.notify_all();
    return Status::Ok();
  });
  {
    std::lock_guard lk(mu);
    walked = true;
    if (!walk.ok() && stop.ok()) stop = walk;
  }
  progress->listed = walk.ok();
  cv.notify_all();
  for (auto& t : workers) t.join();
  {
    std::lock_guard lk(tick_mu);
    done = true;
  }
  tick_cv.notify_all();
  ticker.join();
  tick();
  if (!stop.ok()) return stop;
  if (!first_error.ok())
    return Status(
        first_error.code(),
        fmt::format("{} of {} files could not be read into the cache; the first: {}",
                    progress->errors.load(), progress->files_found.load(), first_error.message()));
  return Status::Ok();
}

Result<nlohmann::json> EvictTree(CachedVolume& c, const VFolderId& vfid, std::string_view path) {
  uint64_t files = 0, blocks = 0;
  SLUICE_RETURN_IF_ERROR(WalkFiles(c, vfid, path, [&](const std::string& rel, const DirEntry&) {
    auto n = c.Evict(vfid, rel);
    if (!n.ok()) return n.status().code() == Code::kNotFound ? Status::Ok() : n.status();
    files++;
    blocks += *n;
    return Status::Ok();
  }));
  return nlohmann::json{{"files", files}, {"blocks", blocks}};
}

}  // namespace sluice
