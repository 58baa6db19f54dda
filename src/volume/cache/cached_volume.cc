#include "volume/cache/cached_volume.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/config.h"
#include "common/crypto.h"
#include "common/fd.h"
#include "common/fs_util.h"
#include "common/metrics.h"
#include "common/path.h"
#include "common/secrets.h"
#include "volume/listed_dir.h"
#include "volume/posix_files.h"

namespace sluice {

namespace {

using Steady = std::chrono::steady_clock;

std::string MetaKey(const VFolderId& vfid, const std::vector<std::string>& parts) {
  return vfid.ToString() + '\0' +
         (parts.empty() ? std::string() : JoinComponents(parts, parts.size()));
}

// What names this version of the file: the origin's entity tag, or inode, size, mtime and
// ctime. (The ctime since 2026-12-05: a file rewritten in place at the same size with its mtime
// put back, as `cp -p`, `rsync --inplace -t` and `tar -x` do, kept its old validator, and blocks
// of both versions were served as one.)
std::string ValidatorOf(const DirEntry& e) {
  if (!e.etag.empty()) return e.etag;
  auto ns = [](auto t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  return fmt::format("{}-{}-{}-{}", e.ino, e.size, ns(e.modified), ns(e.changed));
}

// Staging (tus sessions, S3 multipart parts) is read once, by the commit, and must be read as
// it is now (another node may have added a part): never through the cache. Read from the
// volume below, a part keeps its descriptor, so a Complete reflinks where the volume can.
bool IsStaging(const std::vector<std::string>& parts) {
  return !parts.empty() && parts.front() == kStagingDirName;
}
bool IsStaging(std::string_view relpath) {
  auto parts = SplitRelPath(relpath);
  return parts.ok() && IsStaging(*parts);
}

std::string Sha256Hex(std::string_view s) {
  return HexEncode(Sha256(s));
}

// A file version read through the cache, block by block.
class CachedReader : public FileReader, public std::enable_shared_from_this<CachedReader> {
 public:
  CachedReader(CachedVolume* v, VFolderId vfid, std::string rel, DirEntry info, std::string meta,
               std::shared_ptr<FileReader> inner)
      : v_(v),
        vfid_(std::move(vfid)),
        rel_(std::move(rel)),
        info_(std::move(info)),
        meta_(std::move(meta)),
        validator_(ValidatorOf(info_)),
        inner_(std::move(inner)) {}
  const DirEntry& info() const override { return info_; }
  Result<std::string> ReadMeta() override { return meta_; }
  // From the block in memory only (the one read last); anything else may wait on a disk or
  // the origin.
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    const uint64_t bs = v_->options().block_size;
    if (offset >= info_.size || n == 0) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(n, info_.size - offset));
    std::shared_ptr<const std::string> block;
    {
      std::unique_lock lk(mu_, std::try_to_lock);  // an event loop never waits here
      if (lk && last_ && last_index_ == offset / bs) block = last_;
    }
    const uint64_t first = offset / bs * bs;
    if (!block || block->size() < offset - first + 1)
      return Status(Code::kUnavailable, "not in memory", EAGAIN);
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, block->size() - (offset - first)));
    std::memcpy(buf, block->data() + (offset - first), k);
    return k;
  }

  // A block held and verified is sent straight from its file: no copy, no checksum again.
  Extent LocalExtent(uint64_t offset) override {
    const uint64_t size = info_.size, bs = v_->options().block_size;
    if (offset >= size) return {};
    const uint64_t index = offset / bs, first = index * bs, len = std::min(bs, size - first);
    std::unique_lock lk(mu_, std::try_to_lock);  // an event loop never waits here
    if (!lk) return {};
    if (ext_.fd() < 0 || ext_index_ != index) {
      BlockStore::OpenBlock b = v_->store().OpenVerified(Id(index), len);
      if (b.fd() < 0) return {};
      v_->CountHit();
      ext_ = std::move(b);
      ext_index_ = index;
      next_ = index + 1;  // a sequential reader, as far as read-ahead is concerned
    }
    return {ext_.fd(), BlockStore::kDataOffset + (offset - first), first + len - offset};
  }

  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    const uint64_t size = info_.size, bs = v_->options().block_size;
    if (offset >= size || n == 0) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(n, size - offset));
    size_t done = 0;
    while (done < n) {
      const uint64_t at = offset + done, index = at / bs, first = index * bs;
      const uint64_t len = std::min(bs, size - first);
      SLUICE_ASSIGN_OR_RETURN(auto block, BlockAt(index, first, len));
      if (block->size() != len)
        return Status(Code::kIoError, fmt::format("'{}': block {} holds {} of {} bytes", rel_,
                                                  index, block->size(), len));
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n - done, first + len - at));
      std::memcpy(buf + done, block->data() + (at - first), k);
      done += k;
    }
    return done;
  }

  // The object below, the version this reader opened, so that a copy of it on the origin (a
  // CopyObject through the cache) reads nothing back. Of a file past S3's smallest part only
  // (smaller ones are read and written anyway), opened below if need be: asked by writers,
  // which run on worker pools, never by an event loop.
  const OriginObject* origin_object() const override {
    if (info_.size < kMinOriginPart) return nullptr;
    auto r = const_cast<CachedReader*>(this)->Inner();
    return r.ok() ? (*r)->origin_object() : nullptr;
  }

  // Every block into the cache (an operator's warm); `*bytes` grows as they land.
  Status Warm(std::atomic<uint64_t>* bytes) {
    const uint64_t size = info_.size, bs = v_->options().block_size;
    for (uint64_t first = 0; first < size; first += bs) {
      const uint64_t len = std::min(bs, size - first);
      SLUICE_ASSIGN_OR_RETURN(auto block,
                              v_->Block(
                                  Id(first / bs), [&] { return Fetch(first, len, /*wait=*/true); },
                                  CachedVolume::Asker::kWarm));
      *bytes += block->size();
    }
    return Status::Ok();
  }
  uint64_t Evict() {
    const uint64_t bs = v_->options().block_size;
    uint64_t n = 0;
    for (uint64_t index = 0; index * bs < info_.size; ++index) n += v_->store().Evict(Id(index));
    return n;
  }

 private:
  // The block, from the one this reader used last (sequential reads come in pieces smaller
  // than a block), the cache, or the volume below.
  Result<std::shared_ptr<const std::string>> BlockAt(uint64_t index, uint64_t first, uint64_t len) {
    {
      std::lock_guard lk(mu_);
      if (last_ && last_index_ == index) return last_;
    }
    ReadAhead(index);
    // A block read ahead but not kept is held here: looked for once this miss leads the
    // block's flight, so that a read-ahead fetch of it that ended just before is found.
    auto block = v_->Block(
        Id(index), [&] { return Fetch(first, len); }, CachedVolume::Asker::kReader, nullptr,
        [&]() -> std::shared_ptr<const std::string> {
          std::lock_guard lk(mu_);
          auto it = ahead_held_.find(index);
          return it == ahead_held_.end() ? nullptr : it->second;
        });
    std::lock_guard lk(mu_);
    ahead_held_.erase(ahead_held_.begin(), ahead_held_.upper_bound(index));
    if (!block.ok()) return block.status();
    last_ = *block;
    last_index_ = index;
    return last_;
  }
  std::string Id(uint64_t index) const { return v_->BlockId(vfid_, rel_, validator_, index); }
  // A reader that moves on to the next block is sequential: the blocks after it are fetched
  // from the origin now, in parallel, so that they are cached (or in flight) when it gets there.
  void ReadAhead(uint64_t index) {
    const uint64_t bs = v_->options().block_size, ahead = v_->options().read_ahead;
    const uint64_t blocks = (info_.size + bs - 1) / bs;
    uint64_t from, to;
    {
      std::lock_guard lk(mu_);
      const bool sequential = index == 0 ? next_ == 0 : index == next_;
      next_ = index + 1;
      if (!sequential || ahead == 0) return;
      from = std::max(index + 1, ahead_until_);
      to = std::min(blocks, index + 1 + ahead);
      if (from >= to) return;
      ahead_until_ = to;
    }
    for (uint64_t i = from; i < to; ++i) {
      std::string id = Id(i);
      if (v_->store().Has(id)) continue;
      const uint64_t first = i * bs, len = std::min(bs, info_.size - first);
      // A queued fetch does not keep its reader (and the block it holds) alive: one gone by
      // the time the fetch's turn comes (a one-byte read, say) has nothing to read ahead for.
      v_->Ahead([weak = weak_from_this(), id = std::move(id), first, len, bs] {
        auto self = weak.lock();
        if (!self) return;
        // Held for the reader as soon as it is fetched, and let go once the cache keeps it: one
        // not kept (second-miss admission, the disk at its floor) would otherwise be fetched
        // again when the reader gets there.
        const uint64_t index = first / bs;
        {
          std::lock_guard lk(self->mu_);
          if (index < self->next_) return;  // the reader got there first: it fetched the block
        }
        auto got = self->v_->Block(
            id, [&] { return self->Fetch(first, len); }, CachedVolume::Asker::kReadAhead,
            [&](const std::shared_ptr<const std::string>& b) { self->HoldAhead(index, b); });
        if (got.ok() && self->v_->store().Has(id)) self->LetGoAhead(index);
      });
    }
  }
  // A block read ahead that the cache did not keep, for this reader's read of it: only the
  // one it reads now and the `read-ahead` blocks after it.
  void HoldAhead(uint64_t index, std::shared_ptr<const std::string> block) {
    std::lock_guard lk(mu_);
    // From the block the reader is reading now (next_ moves before it looks for it here) to
    // the last read ahead of it.
    const uint64_t from = next_ > 0 ? next_ - 1 : 0, end = next_ + v_->options().read_ahead;
    ahead_held_.erase(ahead_held_.begin(), ahead_held_.lower_bound(from));
    ahead_held_.erase(ahead_held_.lower_bound(end), ahead_held_.end());
    if (index >= from && index < end) ahead_held_[index] = std::move(block);
  }
  void LetGoAhead(uint64_t index) {
    std::lock_guard lk(mu_);
    ahead_held_.erase(index);
  }
  // Bytes [first, first+len) of this version from the volume below.
  // `wait`: an operator's warm waits for the origin whatever its state; readers and read-ahead
  // do not wait for a silent one.
  Result<std::string> Fetch(uint64_t first, uint64_t len, bool wait = false) {
    // A silent origin would hold this read until the s3 client's stall timeout: a prompt 503
    // instead, while a probe (at most two at once) finds out when it answers again.
    if (!wait && v_->ProbeIfSilent(vfid_, rel_))
      return Status(Code::kUnavailable,
                    fmt::format("'{}': not cached, and the origin is not answering", rel_));
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<FileReader> r, Inner());
    std::string out(static_cast<size_t>(len), '\0');
    size_t got = 0;
    while (got < out.size()) {
      SLUICE_ASSIGN_OR_RETURN(size_t k, r->ReadAt(first + got, out.data() + got, out.size() - got));
      if (k == 0) return Status(Code::kConflict, fmt::format("'{}' shrank while being read", rel_));
      got += k;
    }
    // A local file rewritten in place (same inode and size: open with O_TRUNC, then write, as
    // checkpoint writers do) changes under an open descriptor: bytes read now may be the new
    // version's, never to be kept under this one's blocks. (A write updates the mtime before
    // its bytes land, so bytes read before this stat are this version's if it is unchanged.)
    // Origins with entity tags are read with If-Match instead.
    if (int fd = r->native_fd(); fd >= 0) {
      auto now = StatAt(fd, "");
      if (!now.ok() || now->size != info_.size || now->modified != info_.modified ||
          now->changed != info_.changed) {
        v_->Invalidate(vfid_, {rel_});
        return Status(Code::kConflict, fmt::format("'{}' changed while it was read", rel_));
      }
    }
    v_->OriginAnswered();
    return out;
  }

  // The file below, opened at the first need when the open was cached: the version this
  // reader opened, or kConflict.
  Result<std::shared_ptr<FileReader>> Inner() {
    {
      std::lock_guard lk(mu_);
      if (inner_) return inner_;
    }
    // Opened at the origin without the lock: event loops take it (LocalExtent) and must not
    // wait on a network round trip.
    auto opened = v_->inner().OpenReader(vfid_, rel_);
    if (!opened.ok()) return opened.status();
    if (ValidatorOf((*opened)->info()) != validator_ || (*opened)->info().size != info_.size) {
      v_->Invalidate(vfid_, {rel_});
      return Status(Code::kConflict, fmt::format("'{}' changed since it was opened", rel_));
    }
    std::lock_guard lk(mu_);
    if (!inner_) inner_ = std::move(opened).value();
    return inner_;
  }

  CachedVolume* v_;
  VFolderId vfid_;
  std::string rel_;
  DirEntry info_;
  std::string meta_;  // the object metadata stored with it, as read when first opened
  std::string validator_;
  std::mutex mu_;
  std::shared_ptr<FileReader> inner_;  // opened at the first miss when the open was cached
  std::shared_ptr<const std::string> last_;
  uint64_t last_index_ = 0;
  BlockStore::OpenBlock ext_;  // the block file LocalExtent answered last
  uint64_t ext_index_ = 0;
  uint64_t next_ = 0;         // the block a sequential reader reads next
  uint64_t ahead_until_ = 0;  // blocks before this one were read ahead
  std::map<uint64_t, std::shared_ptr<const std::string>> ahead_held_;  // see HoldAhead
};

// Writes go through; what they replace is dropped once they land, and what they wrote is kept
// (ingest on write) when this node saw every byte of it.
class IngestingWriter : public ForwardingStagingWriter {
  // The path a commit lands on ("": none given, the whole vfolder).
  static std::string Target(const std::vector<std::string>& parts) {
    return parts.empty() ? std::string() : JoinComponents(parts, parts.size());
  }

 public:
  IngestingWriter(std::unique_ptr<StagingWriter> inner, CachedVolume* v, VFolderId vfid,
                  std::string session, std::shared_ptr<CachedVolume::Spool> spool)
      : ForwardingStagingWriter(std::move(inner)),
        v_(v),
        vfid_(std::move(vfid)),
        session_(std::move(session)),
        spool_(std::move(spool)) {}
  ~IngestingWriter() override {
    if (spool_) v_->ReturnSpool(vfid_, session_, std::move(spool_));  // for the next PATCH
  }
  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    Status st = ForwardingStagingWriter::WriteAt(offset, data, n, written);
    if (spool_ && *written > 0) v_->Spooled(*spool_, offset, data, *written);
    return st;
  }
  Status Rollback(uint64_t offset, bool quota_checked) override {
    Status st = ForwardingStagingWriter::Rollback(offset, quota_checked);
    if (spool_) st.ok() ? v_->CutSpool(*spool_, offset) : v_->DropSpool(*spool_);
    return st;
  }
  // A multipart part: its Complete reads it (and the cache keeps the object it makes), never
  // a reader, so its bytes are not spooled.
  void ReadOnceByAnother() override {
    if (spool_) v_->DropSpool(*spool_, /*quietly=*/true);
    ForwardingStagingWriter::ReadOnceByAnother();
  }
  // Local files are still copied without the bytes passing through here, and then read into
  // the spool (from the page cache: they were just written); anything else was copied
  // through memory anyway, and is now spooled on the way. Bytes the origin copies itself (an
  // s3 volume's UploadPartCopy) pass through no spool: the file is fetched back once it
  // landed instead (CachedVolume::Refill).
  Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) override {
    if (!spool_) return ForwardingStagingWriter::CopyFrom(src, src_offset, n, at);
    if (inner_->CopiesOnOrigin(src)) {
      v_->DropSpool(*spool_, /*quietly=*/true);
      refill_ = true;
      return ForwardingStagingWriter::CopyFrom(src, src_offset, n, at);
    }
    if (src.native_fd() < 0) return StagingWriter::CopyFrom(src, src_offset, n, at);
    SLUICE_RETURN_IF_ERROR(ForwardingStagingWriter::CopyFrom(src, src_offset, n, at));
    std::string buf(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)), '\0');
    for (uint64_t done = 0; done < n;) {
      auto got = src.ReadAt(src_offset + done, buf.data(),
                            static_cast<size_t>(std::min<uint64_t>(buf.size(), n - done)));
      if (!got.ok() || *got == 0) {
        v_->DropSpool(*spool_);
        break;
      }
      v_->Spooled(*spool_, at + done, buf.data(), *got);
      done += *got;
    }
    return Status::Ok();
  }
  Status Commit(const std::vector<std::string>& parts) override {
    return Landing(ForwardingStagingWriter::Commit(parts), parts);
  }
  Status Publish(const std::vector<std::string>& parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool durable) override {
    return Landing(ForwardingStagingWriter::Publish(parts, meta, durable), parts);
  }

 private:
  Status Landing(Status st, const std::vector<std::string>& parts) {
    const std::string target = Target(parts);
    v_->Invalidate(vfid_, {target});
    if (spool_) {
      auto spool = std::move(spool_);
      // A commit into staging (a multipart part: said ReadOnceByAnother) is never read
      // through the cache: its spool goes quietly.
      if (IsStaging(parts)) return st;
      if (st.ok() && !target.empty() && refill_)
        v_->Refill(vfid_, target, Landed());
      else if (st.ok() && !target.empty())
        v_->Ingest(vfid_, target, std::move(spool), Landed(), v_->Gen(vfid_));
      else
        v_->DropSpool(*spool);
    }
    return st;
  }
  CachedVolume* v_;
  VFolderId vfid_;
  std::string session_;
  std::shared_ptr<CachedVolume::Spool> spool_;  // none: this node does not keep what it writes
  bool refill_ = false;  // bytes were copied on the origin: fetched back once landed
};

}  // namespace

Result<CacheOptions> CacheOptions::FromJson(const std::string& volume, const nlohmann::json& j) {
  CacheOptions o;
  auto bad = [&](const std::string& key, std::string_view why) {
    return Status(Code::kInvalidArgument, fmt::format("volume.{}.cache.{}: {}", volume, key, why));
  };
  if (!j.is_object()) return bad("", "must be a table");
  for (const auto& [key, value] : j.items()) {
    if (key == "serve-stale" || key == "serve_stale" || key == "ingest") {
      if (!value.is_boolean()) return bad(key, "must be true or false");
      (key == "ingest" ? o.ingest : o.serve_stale) = value.get<bool>();
      continue;
    }
    if (key == "revalidate-timeout" || key == "revalidate_timeout") {
      auto d = value.is_string() ? ParseDurationMillis(value.get<std::string>())
                                 : Result<std::chrono::milliseconds>(
                                       Status(Code::kInvalidArgument, "must be a duration"));
      if (!d.ok()) return bad(key, d.status().message());
      if (d->count() <= 0 || *d > std::chrono::minutes(10))
        return bad(key, "must be more than 0 and at most 10 minutes");
      o.revalidate_timeout = *d;
      continue;
    }
    if (key == "max-listing" || key == "max_listing") {
      // A TOML integer, or a string of digits as the other counts take.
      uint64_t n = 0;
      bool ok = value.is_number_integer() && value.get<int64_t>() >= 0;
      if (ok) {
        n = value.get<uint64_t>();
      } else if (value.is_string()) {
        const std::string v = value.get<std::string>();
        char* end = nullptr;
        errno = 0;
        n = std::strtoull(v.c_str(), &end, 10);
        ok = !v.empty() && std::isdigit(static_cast<unsigned char>(v[0])) && *end == '\0' &&
             errno == 0;
      }
      if (!ok || n == 0 || n > (uint64_t{1} << 26))
        return bad(key, "must be a number of entries, 1 to 67108864");
      o.max_listing = n;
      continue;
    }
    if (!value.is_string()) return bad(key, "must be a string");
    const std::string v = value.get<std::string>();
    const std::string& name = key;  // a lambda may not capture a structured binding (clang 14)
    auto size = [&](uint64_t* out) -> Status {
      auto s = ParseBinarySize(v);
      if (!s.ok()) return bad(name, s.status().message());
      *out = *s;
      return Status::Ok();
    };
    if (key == "path") {
      o.path = v;
    } else if (key == "max-size" || key == "max_size") {
      SLUICE_RETURN_IF_ERROR(size(&o.max_size));
    } else if (key == "min-free" || key == "min_free") {
      SLUICE_RETURN_IF_ERROR(size(&o.min_free));
    } else if (key == "block-size" || key == "block_size") {
      SLUICE_RETURN_IF_ERROR(size(&o.block_size));
      if (o.block_size < 4096 || o.block_size > (256u << 20))
        return bad(key, "must be 4 KiB to 256 MiB");
    } else if (key == "ttl") {
      auto d = ParseDuration(v);
      if (!d.ok()) return bad(key, d.status().message());
      if (*d > std::chrono::hours(24 * 365)) return bad(key, "must be at most a year");
      o.ttl = *d;
    } else if (key == "admission") {
      if (v != "first-miss" && v != "second-miss")
        return bad(key, "must be \"first-miss\" or \"second-miss\"");
      o.second_miss = v == "second-miss";
    } else if (key == "read-ahead" || key == "read_ahead" || key == "fetch-threads" ||
               key == "fetch_threads") {
      char* end = nullptr;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      const bool threads = key.starts_with("fetch");
      if (v.empty() || *end != '\0' || n > (threads ? 256u : 64u) || (threads && n == 0))
        return bad(key, threads ? "must be a number of threads, 1 to 256"
                                : "must be a number of blocks, 0 to 64");
      (threads ? o.fetch_threads : o.read_ahead) = static_cast<uint32_t>(n);
    } else if (key == "eviction") {
      if (v != "s3-fifo" && v != "lru") return bad(key, "must be \"s3-fifo\" or \"lru\"");
      o.eviction = v == "lru" ? EvictionPolicy::kLru : EvictionPolicy::kS3Fifo;
    } else {
      return bad(key,
                 "unknown key (known: path, max-size, min-free, block-size, ttl, admission, "
                 "eviction, serve-stale, revalidate-timeout, read-ahead, fetch-threads, "
                 "max-listing, ingest)");
    }
  }
  if (o.path.empty()) return bad("path", "is required (a directory on a local disk)");
  return o;
}

struct CachedVolume::Flight {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Result<std::shared_ptr<const std::string>> result{Status(Code::kInternal, "not fetched")};
};

CachedVolume::CachedVolume(std::unique_ptr<Volume> inner, CacheOptions opts,
                           std::unique_ptr<BlockStore> store)
    : ForwardingVolume(std::move(inner)), opts_(std::move(opts)), store_(std::move(store)) {
  auto& m = Metrics::Global();
  const std::string l = fmt::format("volume=\"{}\"", name());
  g_hits_ = &m.Counter("sluice_cache_hits_total", "Blocks read from the SSD cache.", l);
  g_misses_ = &m.Counter("sluice_cache_misses_total",
                         "Blocks a reader asked for that the SSD cache did not hold.", l);
  g_read_ahead_ = &m.Counter("sluice_cache_read_ahead_total",
                             "Blocks fetched from the origin ahead of a sequential reader.", l);
  g_origin_bytes_ = &m.Counter("sluice_cache_origin_bytes_total",
                               "Bytes the SSD cache read from the volume below it.", l);
  g_rejects_ = &m.Counter("sluice_cache_admission_rejects_total",
                          "Blocks read but not kept (admission policy, disk space).", l);
  g_silent_ = &m.Gauge("sluice_cache_origin_silent",
                       "1 while the origin counts as silent: a revalidation went unanswered "
                       "for revalidate-timeout and none has answered since.",
                       l);
  g_silent_->store(0);
  g_stale_ = &m.Counter(
      "sluice_cache_stale_opens_total",
      "Files opened, stat'ed or listed from expired attributes or listings while the origin "
      "did not answer (unreachable, or not within revalidate-timeout).",
      l);
  g_evictions_ = &m.Counter("sluice_cache_evictions_total",
                            "Blocks dropped to make room, or by an operator's evict.", l);
  g_fill_bytes_ =
      &m.Counter("sluice_cache_fill_bytes_total", "Bytes written into the SSD cache.", l);
  g_ingest_bytes_ = &m.Counter("sluice_cache_ingest_bytes_total",
                               "Bytes written through this node and kept in the SSD cache as "
                               "written (ingest on write).",
                               l);
  g_bytes_ = &m.Gauge("sluice_cache_bytes", "Bytes of blocks the SSD cache holds.", l);
  g_blocks_ = &m.Gauge("sluice_cache_blocks", "Blocks the SSD cache holds.", l);
  PublishStore();
  LoadJournal();
  LoadListings();
  if (opts_.read_ahead > 0)
    ahead_ = std::make_unique<ThreadPool>("cache-ahead", opts_.fetch_threads, 4096);
  // Round trips stuck on an origin that answers nothing hold these threads, not the callers'.
  if (opts_.serve_stale) revalidate_ = std::make_unique<ThreadPool>("cache-reval", 8, 4096);
}

template <typename T>
Result<T> CachedVolume::Revalidate(const std::string& key, std::function<Result<T>()> ask,
                                   bool probe) {
  if (!revalidate_) return ask();
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Result<T> result{Status(Code::kInternal, "not asked")};
  };
  // An origin known silent (a round trip given up on, none answered since) is not waited for
  // at all, and is asked again by at most kProbes round trips at once: an epoch over
  // thousands of files then runs from the cache at its own speed instead of waiting
  // revalidate-timeout per file, and the origin does not get a queue of thousands of
  // requests the moment it comes back. Callers asking for the same thing join one round trip.
  const bool silent = probe || silent_.load();  // a probe never waits, whatever the state
  std::shared_ptr<Pending> p;
  {
    std::lock_guard lk(mu_);
    if (auto it = revalidating_.find(key); it != revalidating_.end())
      p = std::static_pointer_cast<Pending>(it->second);
  }
  if (!p) {
    // A slot first (checked and taken at once: concurrent callers cannot all pass the limit).
    const int limit = silent ? kProbes : kMaxOutstanding;
    int now = outstanding_.load();
    do {
      if (now >= limit)
        return Status(Code::kUnavailable, silent ? "the origin is not answering"
                                                 : "the origin's revalidations are backed up");
    } while (!outstanding_.compare_exchange_weak(now, now + 1));
    p = std::make_shared<Pending>();
    bool leader;
    {
      std::lock_guard lk(mu_);
      auto [it, fresh] = revalidating_.try_emplace(key, p);
      leader = fresh;
      if (!fresh) p = std::static_pointer_cast<Pending>(it->second);
    }
    if (!leader) {
      outstanding_--;  // joined another caller's round trip
    } else {
      const auto timeout = opts_.revalidate_timeout;
      auto done = [this, key, p, timeout](Result<T> r, std::chrono::nanoseconds took) {
        {
          std::lock_guard lk(mu_);
          if (auto it = revalidating_.find(key); it != revalidating_.end() && it->second == p)
            revalidating_.erase(it);
        }
        outstanding_--;
        std::lock_guard lk(p->mu);
        // An answer, or a prompt failure, ends the silence; a round trip that ran out its own
        // timeouts on a silent origin does not, nor one that found no free connection to it
        // (EBUSY: the origin said nothing). (Under p->mu: a waiter giving up on this one sets
        // it again only before.)
        const bool unsent = !r.ok() && r.status().busy();
        if (!unsent && (took < timeout || r.ok() || r.status().code() != Code::kUnavailable))
          SetSilent(false);
        p->result = std::move(r);
        p->done = true;
        p->cv.notify_all();
      };
      const bool queued = revalidate_->Submit([this, key, ask = std::move(ask), done] {
        if (stopping_)
          return done(Status(Code::kUnavailable, "the node is stopping"),
                      std::chrono::nanoseconds::max());
        const auto t0 = Steady::now();
        // (Answered however the ask ends, or its key would stay taken and every caller of it
        // wait out the timeout, then call the origin silent.)
        Result<T> r = Status(Code::kInternal, "");
        try {
          r = ask();
        } catch (const std::exception& e) {
          r = Status(Code::kInternal, fmt::format("revalidation of {}: {}", key, e.what()));
        }
        done(std::move(r), Steady::now() - t0);
      });
      if (!queued)
        done(Status(Code::kUnavailable, "the origin's revalidations are backed up"),
             std::chrono::nanoseconds::max());
    }
  }
  std::unique_lock lk(p->mu);
  if (!p->cv.wait_for(lk, silent ? std::chrono::milliseconds(0) : opts_.revalidate_timeout,
                      [&] { return p->done; })) {
    if (!silent) SetSilent(true);  // only a caller that waited it out says so
    return Status(Code::kUnavailable, fmt::format("the origin did not answer within {} ms",
                                                  opts_.revalidate_timeout.count()));
  }
  return p->result;  // a copy: callers that joined share it
}

bool CachedVolume::Ahead(std::function<void()> fn) {
  if (!ahead_) return false;
  return ahead_->Submit([this, fn = std::move(fn)] {
    if (!stopping_) fn();  // a stopping daemon does not fetch what no one will read
  });
}

void CachedVolume::PublishStore() {
  // The store's counts since open, and this volume's store lives as long as the process.
  const BlockStore::Stats s = store_->stats();
  g_evictions_->store(s.evictions);
  g_fill_bytes_->store(s.filled_bytes);
  g_bytes_->store(static_cast<int64_t>(s.bytes));
  g_blocks_->store(static_cast<int64_t>(s.blocks));
}

std::string CachedVolume::BlockId(const VFolderId& vfid, const std::string& rel,
                                  const std::string& validator, uint64_t index) const {
  // The block size too: after a restart with another one, block N holds other bytes (and
  // a length that may pass for the new one's).
  return Sha256Hex(fmt::format("{}\n{}\n{}\n{}\n{}\n{}", name(), vfid.ToString(), rel, validator,
                               opts_.block_size, index));
}

Result<uint64_t> CachedVolume::Warm(const VFolderId& vfid, std::string_view relpath,
                                    std::atomic<uint64_t>* bytes) {
  SLUICE_ASSIGN_OR_RETURN(auto r, OpenReader(vfid, relpath));
  SLUICE_RETURN_IF_ERROR(static_cast<CachedReader&>(*r).Warm(bytes));
  return r->size();
}

Result<uint64_t> CachedVolume::Evict(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  SLUICE_ASSIGN_OR_RETURN(auto r, OpenReader(vfid, relpath));
  const uint64_t n = static_cast<CachedReader&>(*r).Evict();
  Journal({{"k", MetaKey(vfid, parts)}}, [&] {
    std::lock_guard lk(mu_);
    meta_.erase(MetaKey(vfid, parts));
  });
  PublishStore();
  return n;
}

uint64_t CachedVolume::EvictAll() {
  const uint64_t n = store_->EvictAll();
  // Emptied by a swap: the entries are freed after the lock is let go, so that opens on the
  // event loops, which take it, do not wait for millions of frees.
  decltype(meta_) meta;
  decltype(dirs_) dirs;
  decltype(large_dirs_) large;
  Journal({{"all", true}}, [&] {
    std::lock_guard lk(mu_);
    all_gen_ = ++next_gen_;
    meta.swap(meta_);
    dirs.swap(dirs_);
    listed_entries_ = 0;
    large.swap(large_dirs_);
  });
  PublishStore();
  return n;
}

CachedVolume::~CachedVolume() {
  StopBackground();
}

void CachedVolume::StopBackground() {
  stopping_ = true;
  if (ahead_) ahead_->Shutdown();
  if (revalidate_) revalidate_->Shutdown();
}

std::unique_ptr<Volume> CachedVolume::ReleaseOrigin() {
  StopBackground();
  return TakeInner();
}

void CachedVolume::Shutdown() {
  stopping_ = true;  // read-ahead not begun is dropped
  // Neither running read-aheads nor revalidations are waited for: one stuck on an origin
  // that answers nothing would hold the stop until its stall timeout, and a stop that takes
  // that long is killed before it records a clean shutdown and the listings. The store
  // refuses their blocks once closed; the destructor joins them.
  store_->Close();
  SaveListings();
  ForwardingVolume::Shutdown();
}

bool CachedVolume::ProbeIfSilent(const VFolderId& vfid, const std::string& rel) {
  if (!silent_) return false;
  // A stat as the probe: small, and any answer ends the silence. Never waited for here.
  (void)Revalidate<DirEntry>(
      fmt::format("p\n{}\n{}", vfid.ToString(), rel),
      [this, vfid, rel] { return ForwardingVolume::Stat(vfid, rel); }, /*probe=*/true);
  return silent_;
}

bool CachedVolume::ServeStale(const Status& st) {
  if (st.code() != Code::kUnavailable || !opts_.serve_stale) return false;
  n_.stale++;
  (*g_stale_)++;
  return true;
}

void CachedVolume::OriginAnswered() {
  if (silent_) SetSilent(false);
}

void CachedVolume::SetSilent(bool silent) {
  if (silent_.exchange(silent) == silent) return;
  g_silent_->store(silent ? 1 : 0);
  if (silent)
    spdlog::warn("cache {}: the origin did not answer within {} ms; serving what is cached", name(),
                 opts_.revalidate_timeout.count());
  else
    spdlog::info("cache {}: the origin answers again", name());
}

CachedVolume::Stats CachedVolume::stats() const {
  Stats s;
  s.origin_silent = silent_;
  s.hits = n_.hits;
  s.misses = n_.misses;
  s.origin_bytes = n_.origin_bytes;
  s.admission_rejects = n_.rejects;
  s.stale_served = n_.stale;
  s.store = store_->stats();
  s.listings_passed = passed_;
  s.ingested = n_.ingested;
  s.ingested_bytes = n_.ingested_bytes;
  s.ingests_dropped = n_.ingests_dropped;
  s.read_ahead = n_.read_ahead;
  std::lock_guard lk(mu_);
  s.listings = dirs_.size();
  s.listed_entries = listed_entries_;
  return s;
}

HwInfo CachedVolume::GetHwInfo() {
  HwInfo h = ForwardingVolume::GetHwInfo();
  Stats s = stats();
  h.metadata["cache-path"] = opts_.path;
  h.metadata["cache-bytes"] = std::to_string(s.store.bytes);
  h.metadata["cache-blocks"] = std::to_string(s.store.blocks);
  h.metadata["cache-hits"] = std::to_string(s.hits);
  h.metadata["cache-misses"] = std::to_string(s.misses);
  return h;
}

namespace {

nlohmann::json EntryJson(const DirEntry& e) {
  auto ns = [](auto t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  nlohmann::json j = {{"name", e.name},
                      {"type", static_cast<int>(e.type)},
                      {"mode", e.mode},
                      {"size", e.size},
                      {"created", ns(e.created)},
                      {"modified", ns(e.modified)},
                      {"changed", ns(e.changed)},
                      {"ino", e.ino},
                      {"dev", e.dev},
                      {"etag", e.etag}};
  if (e.symlink_target) j["symlink_target"] = *e.symlink_target;
  return j;
}

std::optional<DirEntry> EntryFromJson(const nlohmann::json& j) {
  try {
    DirEntry e;
    auto at = [&](const char* k) {
      return std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(j.at(k).get<int64_t>())));
    };
    e.name = j.at("name").get<std::string>();
    e.type = static_cast<EntryType>(j.at("type").get<int>());
    e.mode = j.at("mode").get<uint32_t>();
    e.size = j.at("size").get<uint64_t>();
    e.created = at("created");
    e.modified = at("modified");
    e.changed = at("changed");
    e.ino = j.at("ino").get<uint64_t>();
    e.dev = j.value("dev", uint64_t{0});  // (kept since 2026-12-07)
    e.etag = j.at("etag").get<std::string>();
    if (j.contains("symlink_target")) e.symlink_target = j["symlink_target"].get<std::string>();
    return e;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<CachedVolume::Meta> CachedVolume::FindMeta(const VFolderId& vfid,
                                                         const std::string& rel) {
  std::lock_guard lk(mu_);
  auto it = meta_.find(vfid.ToString() + '\0' + rel);
  if (it == meta_.end()) return std::nullopt;
  return it->second;
}

namespace {

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void CachedVolume::Journal(const nlohmann::json& record, const std::function<void()>& apply) {
  JournalIf(record, [&] {
    if (apply) apply();
    return true;
  });
}

void CachedVolume::JournalIf(const nlohmann::json& record, const std::function<bool()>& apply) {
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  // The change to memory and its line in the journal in one order for every writer: replay
  // ends where memory is.
  std::lock_guard lk(journal_mu_);
  if (!apply()) return;
  if (journal_.get() < 0) return;
  if (journal_bytes_ > std::max(kJournalCompactAt, 2 * journal_compacted_)) CompactJournal();
  // One append per record: a crash tears at most the last line, which replay skips.
  const ssize_t n = ::write(journal_.get(), line.data(), line.size());
  if (n == static_cast<ssize_t>(line.size())) {
    journal_bytes_ += line.size();
    return;
  }
  // A line that did not land (a full disk): the journal no longer says what memory does, and
  // replay would bring back what this line dropped (a file deleted or replaced through this
  // node, served from its old attributes after a restart). It starts over empty, which frees
  // its space; what it held is asked of the origin again after a restart.
  const int err = n < 0 ? errno : ENOSPC;
  if (::ftruncate(journal_.get(), 0) != 0) {
    ::unlink((opts_.path + "/attributes.log").c_str());  // then not kept across restarts
    journal_.reset();
  }
  journal_bytes_ = journal_compacted_ = 0;
  spdlog::warn(
      "cache {}: a line of the attributes journal was not written ({}); it starts over "
      "empty",
      name(), std::strerror(err));
}

uint64_t CachedVolume::GenLocked(const std::string& vfid) const {
  auto it = vf_gen_.find(vfid);
  return std::max(all_gen_, it == vf_gen_.end() ? 0 : it->second);
}

uint64_t CachedVolume::Gen(const VFolderId& vfid) {
  std::lock_guard lk(mu_);
  return GenLocked(vfid.ToString());
}

void CachedVolume::KeepMeta(const VFolderId& vfid, const std::string& rel, Meta m, uint64_t gen) {
  const std::string key = vfid.ToString() + '\0' + rel;
  nlohmann::json j = {
      {"k", key},
      // When the question was asked (a late answer is not made younger by a restart).
      {"f",
       WallNs() -
           std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now() - m.fetched).count()},
      {"e", EntryJson(m.entry)},
      {"m", Base64Encode(m.meta)}};
  auto apply = [&] {
    decltype(meta_) full;  // (freed after the lock is let go)
    std::lock_guard lk(mu_);
    if (GenLocked(vfid.ToString()) != gen) return false;  // a write since: maybe older than it
    if (auto it = meta_.find(key); it != meta_.end() && it->second.fetched > m.fetched)
      return false;                                 // a younger answer is there (this one was late)
    if (meta_.size() > kMaxMeta) full.swap(meta_);  // bounded: a full table starts over
    meta_[key] = std::move(m);
    return true;
  };
  if (store_->HasRoom(4096))
    JournalIf(j, apply);
  else
    apply();  // not on a disk at its floor: memory keeps them
}

namespace {
constexpr const char* kListingsFile = "listings.json";
constexpr size_t kMaxKeptEntries = size_t{1} << 20;  // a few hundred MB of JSON at most
}  // namespace

void CachedVolume::SaveListings() {
  std::vector<std::pair<std::string, std::shared_ptr<const Listing>>> fresh;
  const auto steady = Steady::now();
  uint64_t gen;
  {
    std::lock_guard lk(mu_);
    gen = next_gen_;
    for (const auto& [k, l] : dirs_)
      if (steady - l->fetched < opts_.ttl) fresh.emplace_back(k, l);
  }
  const int64_t now = WallNs();
  std::string out;
  size_t entries = 0;
  for (const auto& [k, l] : fresh) {
    if ((entries += l->entries.size()) > kMaxKeptEntries) break;
    nlohmann::json j = {
        {"k", k},
        {"f",
         now - std::chrono::duration_cast<std::chrono::nanoseconds>(steady - l->fetched).count()},
        {"i", EntryJson(l->info)}};
    auto& es = j["e"] = nlohmann::json::array();
    for (const auto& e : l->entries) es.push_back(EntryJson(e));
    try {
      out += j.dump();
      out += '\n';
    } catch (const nlohmann::json::exception&) {
      // A name that is not UTF-8 cannot be written as JSON: that listing is asked again.
    }
  }
  const std::string path = fmt::format("{}/{}", opts_.path, kListingsFile);
  // (Up to hundreds of MB: like a block, only where the disk keeps min-free after it; before
  // 2026-12-06 it was written whatever the floor.)
  if (!store_->HasRoom(out.size())) {
    spdlog::warn(
        "cache {}: its listings are not kept for the next start: {} bytes would take "
        "the cache disk below min-free",
        name(), out.size());
    return;
  }
  if (Status st = WriteFileAtomic(path, out); !st.ok())
    spdlog::warn("cache {}: its listings are not kept for the next start: {}", name(),
                 st.message());
  // A write through the node since the snapshot (a task that outlived the drain) invalidated
  // listings it may hold, and its unlink may have come before the file: the file goes.
  std::lock_guard lk(mu_);
  if (next_gen_ != gen) ::unlink(path.c_str());
}

void CachedVolume::LoadListings() {
  const std::string path = fmt::format("{}/{}", opts_.path, kListingsFile);
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  ::unlink(path.c_str());  // once: what changes from now on is this process's to track
  const int64_t now = WallNs();
  const auto steady = Steady::now();
  std::string line;
  size_t kept = 0;
  std::lock_guard lk(mu_);
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("k") || !j["k"].is_string() ||
        !j.contains("f") || !j["f"].is_number_integer() || !j.contains("i") || !j.contains("e") ||
        !j["e"].is_array())
      continue;
    const auto age = std::chrono::nanoseconds(std::max<int64_t>(0, now - j["f"].get<int64_t>()));
    if (age >= opts_.ttl) continue;
    auto info = EntryFromJson(j["i"]);
    if (!info) continue;
    auto l = std::make_shared<Listing>();
    l->info = std::move(*info);
    bool ok = true;
    for (const auto& e : j["e"]) {
      auto entry = EntryFromJson(e);
      if (!(ok = entry.has_value())) break;
      l->entries.push_back(std::move(*entry));
    }
    if (!ok ||
        !std::is_sorted(l->entries.begin(), l->entries.end(),
                        [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; }))
      continue;
    l->fetched = steady - std::chrono::duration_cast<Steady::duration>(age);
    if (l->entries.size() > opts_.max_listing) continue;  // max-listing lowered since
    KeepListingLocked(j["k"].get<std::string>(), std::move(l));
    ++kept;
  }
  if (kept) spdlog::info("cache {}: {} directory listings kept from the last run", name(), kept);
}

namespace {
// All of `data` to `fd` (a single write stops short of 2 GiB).
bool WriteFully(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}
}  // namespace

void CachedVolume::LoadJournal() {
  const std::string path = opts_.path + "/attributes.log";
  std::ifstream in(path, std::ios::binary);
  std::string line;
  const int64_t now = WallNs();
  const auto steady = Steady::now();
  uint64_t whole = 0;         // the bytes up to the last line's newline
  bool tail_torn = false;     // a last line without its newline, and not a record
  bool tail_unended = false;  // a last line without its newline
  while (in && std::getline(in, line)) {
    const bool ended = !in.eof();  // (getline stopped at a newline, not at the end)
    if (ended) whole += line.size() + 1;
    tail_unended = !ended && !line.empty();
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {  // a line torn by a crash
      tail_torn = tail_unended;
      continue;
    }
    // Fields of the wrong type (a disk that corrupted a line into other JSON) skip their line;
    // they must not fail every start.
    try {
      ReplayJournalLine(j, now, steady);
    } catch (const nlohmann::json::exception&) {
      tail_torn = tail_unended;
    }
  }
  journal_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (journal_.get() < 0) {
    spdlog::warn("cache {}: {}: {}; attributes are not kept across restarts", name(), path,
                 std::strerror(errno));
    return;
  }
  // A last line cut by a crash goes before anything is appended (one that is whole but lacks
  // its newline gets it): appended to, it would swallow the next line, and that one may drop a
  // file's attributes, synced before its write was answered. The compaction below would also
  // rewrite the log without it, but it is skipped when the cache disk is at min-free.
  if (tail_torn ? ::ftruncate(journal_.get(), static_cast<off_t>(whole)) != 0
                : tail_unended && !WriteFully(journal_.get(), "\n")) {
    spdlog::warn(
        "cache {}: {}: cannot end its last line ({}); attributes are not kept across "
        "restarts",
        name(), path, std::strerror(errno));
    ::unlink(path.c_str());  // replayed at the next start, it would bring back what it held
    journal_.reset();
    return;
  }
  struct stat st;
  journal_bytes_ = ::fstat(journal_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  std::lock_guard lk(journal_mu_);
  CompactJournal();  // what replay kept, and nothing else
}

void CachedVolume::ReplayJournalLine(const nlohmann::json& j, int64_t now,
                                     Steady::time_point steady) {
  if (j.contains("all")) {
    meta_.clear();
  } else if (j.contains("p") && j["p"].is_string()) {  // a vfolder's, dropped
    const std::string prefix = j["p"].get<std::string>();
    for (auto it = meta_.lower_bound(prefix); it != meta_.end() && it->first.starts_with(prefix);)
      it = meta_.erase(it);
  } else if (j.contains("k") && j["k"].is_string()) {
    const std::string key = j["k"].get<std::string>();
    if (!j.contains("e")) {  // one file's, dropped
      meta_.erase(key);
      return;
    }
    auto entry = EntryFromJson(j["e"]);
    auto meta = Base64Decode(j.value("m", ""));
    if (!entry || !meta.ok() || !j.contains("f") || !j["f"].is_number_integer()) return;
    // Its age on the wall clock, as the same age on this process's steady one.
    const auto age = std::chrono::nanoseconds(std::max<int64_t>(0, now - j["f"].get<int64_t>()));
    if (meta_.size() > kMaxMeta) meta_.clear();
    meta_[key] = {std::move(*entry), std::move(meta).value(),
                  steady - std::chrono::duration_cast<Steady::duration>(age)};
  }
}

void CachedVolume::CompactJournal() {
  // journal_mu_ held. The live records, written aside and renamed over the log.
  const std::string path = opts_.path + "/attributes.log";
  const std::string tmp = fmt::format("{}/tmp/attributes-{}", opts_.path, RandomHexString(8));
  std::string out;
  // In pieces, each under mu_ (which opens on the event loops wait for), resumed by key: the
  // journal's writers wait on journal_mu_, and what changes meta_ without them (an attribute
  // kept in memory only) may or may not be in the copy, as it is not in the journal.
  const auto steady = Steady::now();
  const int64_t now = WallNs();
  std::string last;
  for (bool first = true, more = true; more; first = false) {
    std::lock_guard lk(mu_);
    auto it = first ? meta_.begin() : meta_.upper_bound(last);
    for (int n = 0; it != meta_.end() && n < 4096; ++it, ++n) {
      const auto& [key, m] = *it;
      const int64_t fetched =
          now - std::chrono::duration_cast<std::chrono::nanoseconds>(steady - m.fetched).count();
      out +=
          nlohmann::json{
              {"k", key}, {"f", fetched}, {"e", EntryJson(m.entry)}, {"m", Base64Encode(m.meta)}}
              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      out += '\n';
      last = key;
    }
    more = it != meta_.end();
  }
  // The copy lies beside the log until it replaces it: not below the disk's floor. A
  // compaction that cannot be made is tried again once the log has doubled, not at every line.
  auto failed = [&] {
    ::unlink(tmp.c_str());
    journal_compacted_ = journal_bytes_;
    spdlog::warn(
        "cache {}: the attributes journal ({} bytes) could not be compacted into {} "
        "bytes ({}); tried again at twice its size",
        name(), journal_bytes_, out.size(),
        store_->HasRoom(out.size()) ? std::strerror(errno) : "no room above min-free");
  };
  if (!store_->HasRoom(out.size())) return failed();
  // Opened for appending from the start, so that once renamed it is the journal: no reopen
  // after the rename (one that failed, before 2026-12-06, left lines going to the old log,
  // unlinked, and a restart replayed the copy without the drops they recorded).
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600));
  if (fd.get() < 0 || !WriteFully(fd.get(), out) || ::rename(tmp.c_str(), path.c_str()) != 0)
    return failed();
  journal_ = std::move(fd);
  journal_bytes_ = journal_compacted_ = out.size();
}

void CachedVolume::Invalidate(const VFolderId& vfid, const std::vector<std::string>& paths) {
  const std::string prefix = vfid.ToString() + '\0';
  // The keys dropped: each path's, and those below it. (Before 2026-12-05 any write dropped the
  // whole vfolder's attributes, and with the origin down right after an unrelated upload every
  // cached file of the vfolder answered 503.)
  std::vector<std::string> roots;
  for (const auto& p : paths) {
    auto parts = SplitRelPath(p);
    if (!parts.ok() || parts->empty()) {
      roots.clear();
      break;
    }
    roots.push_back(prefix + JoinComponents(*parts, parts->size()));
  }
  if (roots.empty()) roots.push_back(prefix);
  std::vector<decltype(meta_)::node_type> gone;
  Freed freed;
  auto drop = [&](const std::string& root) {
    // (A root names a file or a directory: its key, and keys below it; "a" is not "ab".)
    auto below = [&](const std::string& k) {
      return root == prefix ? k.starts_with(prefix)
                            : k == root || (k.starts_with(root) && k[root.size()] == '/');
    };
    for (auto it = meta_.lower_bound(root); it != meta_.end() && it->first.starts_with(root);) {
      if (below(it->first))
        gone.push_back(meta_.extract(it++));
      else
        ++it;
    }
  };
  for (const auto& root : roots)
    Journal({{"p", root}}, [&] {
      std::lock_guard lk(mu_);
      if (vf_gen_.size() > (1u << 16)) {  // bounded: every vfolder counts as written
        vf_gen_.clear();
        all_gen_ = ++next_gen_;
      }
      vf_gen_[vfid.ToString()] = ++next_gen_;
      // Unlinked here, freed after the lock is let go (as in EvictAll).
      drop(root);
      for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && it->first.starts_with(prefix);)
        DropListingLocked(it++, &freed);
      // (Directories found too large stay so: what is listed from the origin is always fresh.)
    });
  SyncJournal();
  // A write after Shutdown kept the listings (a background task that outlived the drain):
  // the kept file would serve the listing from before it at the next start.
  if (stopping_) ::unlink(fmt::format("{}/{}", opts_.path, kListingsFile).c_str());
}

void CachedVolume::SyncJournal() {
  std::lock_guard lk(journal_mu_);
  if (journal_.get() >= 0 && ::fdatasync(journal_.get()) != 0)
    spdlog::warn("cache {}: the attributes journal could not be synced ({})", name(),
                 std::strerror(errno));
}

std::optional<std::pair<DirEntry, bool>> CachedVolume::Known(
    const VFolderId& vfid, const std::vector<std::string>& parts) {
  const auto now = Steady::now();
  if (!parts.empty())
    if (auto m = FindMeta(vfid, JoinComponents(parts, parts.size())))
      return std::pair{m->entry, now - m->fetched < opts_.ttl};
  std::lock_guard lk(mu_);
  if (auto it = dirs_.find(MetaKey(vfid, parts)); it != dirs_.end())
    return std::pair{it->second->info, now - it->second->fetched < opts_.ttl};
  if (parts.empty()) return std::nullopt;
  std::vector<std::string> parent(parts.begin(), parts.end() - 1);
  auto it = dirs_.find(MetaKey(vfid, parent));
  if (it == dirs_.end()) return std::nullopt;
  const auto& es = it->second->entries;  // by name
  auto e = std::lower_bound(es.begin(), es.end(), parts.back(),
                            [](const DirEntry& a, const std::string& n) { return a.name < n; });
  if (e == es.end() || e->name != parts.back()) return std::nullopt;
  return std::pair{*e, now - it->second->fetched < opts_.ttl};
}

Result<DirEntry> CachedVolume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (IsStaging(parts)) return ForwardingVolume::Stat(vfid, relpath);
  auto known = Known(vfid, parts);
  if (known && known->second) {
    DirEntry e = known->first;
    if (!parts.empty()) e.name = parts.back();
    return e;
  }
  auto stat = [this, vfid, rel = std::string(relpath)] {
    return ForwardingVolume::Stat(vfid, rel);
  };
  // (Its answer is not kept: a file's attributes are kept with its object metadata, which a
  // stat does not read. An open or a listing keeps them.)
  auto r =
      known ? Revalidate<DirEntry>(fmt::format("s\n{}\n{}", MetaKey(vfid, parts), Gen(vfid)), stat)
            : stat();
  if (!r.ok() && known && ServeStale(r.status())) {
    DirEntry e = known->first;
    if (!parts.empty()) e.name = parts.back();
    return e;
  }
  return r;
}

void CachedVolume::KeepListingLocked(const std::string& key, std::shared_ptr<const Listing> l,
                                     Freed* freed) {
  if (auto it = dirs_.find(key); it != dirs_.end()) DropListingLocked(it, freed);
  listed_entries_ += l->entries.size();
  dirs_.emplace(key, std::move(l));
  // Bounded by count and by entries: past either, the oldest listings go, down to 7/8 of
  // both, in one sort of the table (not a scan of it per listing dropped).
  const size_t max_dirs = 1u << 16;
  const uint64_t max_entries = opts_.ListedEntriesBound();
  if (dirs_.size() <= max_dirs && listed_entries_ <= max_entries) return;
  std::vector<std::pair<Steady::time_point, std::string>> by_age;
  by_age.reserve(dirs_.size());
  for (const auto& [k, kept] : dirs_) by_age.emplace_back(kept->fetched, k);
  std::sort(by_age.begin(), by_age.end());
  for (const auto& [fetched, k] : by_age) {
    if (dirs_.size() <= max_dirs / 8 * 7 && listed_entries_ <= max_entries / 8 * 7) break;
    DropListingLocked(dirs_.find(k), freed);
  }
}

void CachedVolume::DropListingLocked(
    std::map<std::string, std::shared_ptr<const Listing>>::iterator it, Freed* freed) {
  listed_entries_ -= it->second->entries.size();
  if (freed) freed->push_back(std::move(it->second));
  dirs_.erase(it);
}

Result<std::pair<std::shared_ptr<const CachedVolume::Listing>, std::string>> CachedVolume::Listed(
    const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  const std::string key = MetaKey(vfid, parts);
  const std::string rel = parts.empty() ? std::string() : JoinComponents(parts, parts.size());
  std::shared_ptr<const Listing> l, stale;
  {
    std::lock_guard lk(mu_);
    if (auto it = dirs_.find(key); it != dirs_.end())
      (Steady::now() - it->second->fetched < opts_.ttl ? l : stale) = it->second;
    if (auto it = large_dirs_.find(key); !l && it != large_dirs_.end()) {
      if (Steady::now() - it->second < opts_.ttl)
        return std::pair<std::shared_ptr<const Listing>, std::string>(nullptr, rel);
      large_dirs_.erase(it);
    }
  }
  if (!l) {
    const uint64_t gen = Gen(vfid);
    auto list = [this, vfid, rel, key, gen]() -> Result<std::shared_ptr<const Listing>> {
      const auto asked = Steady::now();
      // In key order where the origin lists so (an s3 volume, page by page): a directory
      // found too large has cost max-listing entries, not the whole level.
      SLUICE_ASSIGN_OR_RETURN(auto d, ForwardingVolume::OpenDirFrom(vfid, rel, ListFrom{}));
      auto fresh = std::make_shared<Listing>();
      fresh->info = d->info();
      for (;;) {
        SLUICE_ASSIGN_OR_RETURN(auto n, d->Next());
        if (!n) break;
        if (fresh->entries.size() >= opts_.max_listing) {  // listed from the origin instead
          OriginAnswered();
          Freed freed;
          std::lock_guard lk(mu_);
          if (auto it = dirs_.find(key); it != dirs_.end()) DropListingLocked(it, &freed);
          if (large_dirs_.size() >= (1u << 16)) large_dirs_.clear();
          large_dirs_[key] = asked;
          return std::shared_ptr<const Listing>();
        }
        auto e = d->StatEntry(n->name);
        if (!e.ok()) {
          if (e.status().code() == Code::kNotFound) continue;  // gone meanwhile
          return e.status();
        }
        fresh->entries.push_back(std::move(e).value());
      }
      // By name; a name that is both a file and a directory (an origin's "x" and "x/...") is
      // the directory, as the origin's own listing of the level has it.
      auto& es = fresh->entries;
      std::sort(es.begin(), es.end(), [](const DirEntry& a, const DirEntry& b) {
        if (a.name != b.name) return a.name < b.name;
        return a.type == EntryType::kDirectory && b.type != EntryType::kDirectory;
      });
      es.erase(std::unique(es.begin(), es.end(),
                           [](const DirEntry& a, const DirEntry& b) { return a.name == b.name; }),
               es.end());
      OriginAnswered();
      fresh->fetched = asked;  // as old as the question: a late answer is not made younger
      Freed freed;
      std::lock_guard lk(mu_);
      auto kept = dirs_.find(key);
      // Not kept over a write since (it may predate it), nor over a younger answer.
      if (GenLocked(vfid.ToString()) == gen &&
          (kept == dirs_.end() || kept->second->fetched <= asked))
        KeepListingLocked(key, fresh, &freed);
      large_dirs_.erase(key);
      return std::shared_ptr<const Listing>(fresh);
    };
    // Keyed with the vfolder's generation: no caller after a write joins a round trip asked
    // before it.
    auto r =
        stale ? Revalidate<std::shared_ptr<const Listing>>(fmt::format("l\n{}\n{}", key, gen), list)
              : list();
    if (r.ok()) {
      l = std::move(r).value();
    } else if (stale && ServeStale(r.status())) {  // the listing the origin gave last
      l = std::move(stale);
    } else {
      return r.status();
    }
  }
  return std::pair{std::move(l), std::move(rel)};
}

std::shared_ptr<const KeyOrderedNames> CachedVolume::Listing::KeyOrder() const {
  std::call_once(key_order_once, [this] {
    auto names = std::make_shared<KeyOrderedNames>();
    names->reserve(entries.size());
    for (const auto& e : entries) names->push_back({e.name, e.type});
    SortByKey(*names);
    key_order = std::move(names);
  });
  return key_order;
}

namespace {

// A directory too large to keep, read from the origin; its children open through the cache.
class PassedDir : public ByPathDir {
 public:
  PassedDir(Volume* cache, VFolderId vfid, std::string rel, std::unique_ptr<DirHandle> origin)
      : ByPathDir(cache, std::move(vfid), std::move(rel)), origin_(std::move(origin)) {}
  const DirEntry& info() const override { return origin_->info(); }
  Result<std::optional<Name>> Next() override { return origin_->Next(); }
  Result<DirEntry> StatEntry(const std::string& name) override { return origin_->StatEntry(name); }
  bool KeyOrdered() const override { return origin_->KeyOrdered(); }

 private:
  std::unique_ptr<DirHandle> origin_;
};

}  // namespace

Result<std::unique_ptr<DirHandle>> CachedVolume::OpenDir(const VFolderId& vfid,
                                                         std::string_view relpath) {
  if (IsStaging(relpath)) return ForwardingVolume::OpenDir(vfid, relpath);
  return OpenListed(vfid, relpath, nullptr);
}

Result<std::unique_ptr<DirHandle>> CachedVolume::OpenDirFrom(const VFolderId& vfid,
                                                             std::string_view relpath,
                                                             const ListFrom& from) {
  if (IsStaging(relpath)) return ForwardingVolume::OpenDirFrom(vfid, relpath, from);
  return OpenListed(vfid, relpath, &from);
}

Result<std::unique_ptr<DirHandle>> CachedVolume::OpenListed(const VFolderId& vfid,
                                                            std::string_view relpath,
                                                            const ListFrom* from) {
  SLUICE_ASSIGN_OR_RETURN(auto l, Listed(vfid, relpath));
  auto& [listing, rel] = l;
  if (!listing) {  // too large to keep: from the origin, in key order where it lists so
    passed_++;
    SLUICE_ASSIGN_OR_RETURN(auto d,
                            ForwardingVolume::OpenDirFrom(vfid, rel, from ? *from : ListFrom{}));
    return std::unique_ptr<DirHandle>(new PassedDir(this, vfid, rel, std::move(d)));
  }
  // Children open through the cache, described from the listing.
  std::unique_ptr<DirHandle> dir(
      new ListedDir(this, vfid, rel, listing, &listing->info, &listing->entries));
  if (!from) return dir;
  // The kept listing in key order: a page of a listing of a large directory costs its entries.
  return KeyOrderedView(std::move(dir), listing->KeyOrder(), *from);
}

bool CachedVolume::Admit(const std::string& id) {
  if (!opts_.second_miss) return true;
  auto k = BlockIndex::ParseKey(id);
  std::lock_guard lk(mu_);
  return k && second_miss_.SecondMiss(*k);
}

Result<std::shared_ptr<const std::string>> CachedVolume::Block(
    const std::string& id, const std::function<Result<std::string>()>& fetch, Asker asker,
    const std::function<void(const std::shared_ptr<const std::string>&)>& fetched,
    const std::function<std::shared_ptr<const std::string>()>& held) {
  const bool reader = asker == Asker::kReader, wait = asker == Asker::kWarm;
  if (auto hit = store_->Get(id)) {
    if (reader) CountHit();
    return std::make_shared<const std::string>(std::move(*hit));
  }
  std::shared_ptr<Flight> f;
  bool leader = false;
  {
    std::lock_guard lk(mu_);
    auto& slot = flights_[id];
    if (!slot) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    f = slot;
  }
  if (!leader) {  // another reader is fetching this block: its answer is ours
    std::unique_lock lk(f->mu);
    // A fetch begun before the origin fell silent holds until the s3 client's stall timeout.
    // Its followers have no cached answer to fall back on, but need not wait that long: once
    // the origin counts as silent they get what a new miss gets then, a prompt 503 (the fetch
    // goes on, and keeps the block if it lands).
    while (!f->cv.wait_for(lk, kJoinedCheck, [&] { return f->done; }))
      if (!wait && silent_)
        return Status(Code::kUnavailable, "not cached, and the origin is not answering");
    if (f->result.ok() && reader) CountHit();  // waited for, but not another origin read
    return f->result;
  }
  Result<std::shared_ptr<const std::string>> result{Status(Code::kInternal, "")};
  bool answered = false;
  auto answer = [&] {  // the joined readers get `result`
    {
      std::lock_guard lk(f->mu);
      f->result = result;
      f->done = true;
    }
    f->cv.notify_all();
    answered = true;
  };
  // However the fetch ends (an exception too: bad_alloc of a block's buffer, say), the flight
  // is unlisted and its readers answered below; else they, and every later miss of the block,
  // would wait on it for good.
  try {
    // The miss above may have raced a leader that stored the block and left just before this
    // flight began: look again now that no one else can start fetching it.
    if (auto hit = store_->Get(id)) {
      if (reader) CountHit();
      result = std::make_shared<const std::string>(std::move(*hit));
    } else if (auto h = held ? held() : nullptr) {
      if (reader) CountHit();
      result = std::move(h);
    } else {
      if (reader) {
        n_.misses++;
        (*g_misses_)++;
      } else if (asker == Asker::kReadAhead) {
        n_.read_ahead++;
        (*g_read_ahead_)++;
      }
      auto got = fetch();
      if (!got.ok()) {
        result = got.status();
      } else {
        n_.origin_bytes += got->size();
        (*g_origin_bytes_) += got->size();
        result = std::make_shared<const std::string>(std::move(got).value());
        // The joined readers have the bytes before the block's disk write, not after it (since
        // 2026-12-06); the flight stays listed until the write ends, so that a reader arriving
        // meanwhile joins it rather than fetching the block again.
        answer();
        if (fetched) fetched(*result);
        if (!(asker == Asker::kWarm || Admit(id)) || !store_->Put(id, **result)) {
          n_.rejects++;
          (*g_rejects_)++;
        }
        PublishStore();
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("cache {}: block {}: {}", name(), id, e.what());
    if (!answered) result = Status(Code::kInternal, fmt::format("block {}: {}", id, e.what()));
  }
  {
    std::lock_guard lk(mu_);
    flights_.erase(id);
  }
  if (!answered) answer();
  return result;
}

Result<std::shared_ptr<FileReader>> CachedVolume::OpenReader(const VFolderId& vfid,
                                                             std::string_view relpath,
                                                             Lookup lookup,
                                                             const LookupHint* hint) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (IsStaging(parts)) return ForwardingVolume::OpenReader(vfid, relpath, lookup, hint);
  const std::string key = MetaKey(vfid, parts);
  const std::string rel = parts.empty() ? std::string() : JoinComponents(parts, parts.size());
  std::optional<Meta> known = FindMeta(vfid, rel);
  // Within the TTL an open needs nothing but memory: an event loop may take it too.
  if (known && Steady::now() - known->fetched < opts_.ttl)
    return std::shared_ptr<FileReader>(
        std::make_shared<CachedReader>(this, vfid, rel, known->entry, known->meta, nullptr));
  if (lookup == Lookup::kCachedOnly)
    return Status(Code::kUnavailable, "the file's attributes are not cached", EAGAIN);
  // The open at the origin keeps what it finds, also when its caller has stopped waiting.
  // Callers that join one open share its answer; the first takes its reader.
  struct Opened {
    std::shared_ptr<FileReader> reader;
    std::atomic<bool> taken{false};
    DirEntry entry;
    std::string meta;
  };
  const uint64_t gen = Gen(vfid);
  auto open = [this, vfid, rel, key, lookup, hint = known ? nullptr : hint,
               gen]() -> Result<std::shared_ptr<Opened>> {
    const auto asked = Steady::now();
    auto r = inner().OpenReader(vfid, rel, lookup, hint);
    if (!r.ok()) {
      if (r.status().code() == Code::kNotFound) {
        Journal({{"k", key}}, [&] {
          std::lock_guard lk(mu_);
          meta_.erase(key);
        });
      }
      return r.status();
    }
    auto o = std::make_shared<Opened>();
    o->entry = (*r)->info();
    auto blob = (*r)->ReadMeta();
    o->meta = blob.ok() ? std::move(blob).value() : std::string();
    OriginAnswered();
    KeepMeta(vfid, rel, {o->entry, o->meta, asked}, gen);
    o->reader = std::move(r).value();
    return o;
  };
  auto r = known ? Revalidate<std::shared_ptr<Opened>>(fmt::format("o\n{}\n{}", key, gen), open)
                 : open();
  if (!r.ok()) {
    if (known && ServeStale(r.status()))
      return std::shared_ptr<FileReader>(
          std::make_shared<CachedReader>(this, vfid, rel, known->entry, known->meta, nullptr));
    return r.status();
  }
  Opened& o = **r;
  return std::shared_ptr<FileReader>(std::make_shared<CachedReader>(
      this, vfid, rel, o.entry, o.meta, o.taken.exchange(true) ? nullptr : o.reader));
}

// ---- writes: through to the volume below, then the vfolder's cached attributes dropped

Result<std::string> CachedVolume::DetachVFolder(const VFolderId& vfid) {
  auto r = ForwardingVolume::DetachVFolder(vfid);
  Invalidate(vfid);
  return r;
}

Status CachedVolume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                     const TreeUsage& size) {
  Status st = ForwardingVolume::CopyVFolderFrom(from, src, dst, size);
  Invalidate(dst);
  return st;
}

Status CachedVolume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                           bool exist_ok) {
  Status st = ForwardingVolume::Mkdir(vfid, relpath, parents, exist_ok);
  Invalidate(vfid, {std::string(relpath)});
  return st;
}

Status CachedVolume::Rename(const VFolderId& vfid, std::string_view relpath,
                            std::string_view new_name) {
  Status st = ForwardingVolume::Rename(vfid, relpath, new_name);
  // The old name and the new one, next to it (by the path's components, as the volume reads
  // it: "d/f/" renames d/f to d/<new_name>). A path that does not split: the whole vfolder.
  auto parts = SplitRelPath(relpath);
  if (!parts.ok() || parts->empty()) {
    Invalidate(vfid, {});
    return st;
  }
  parts->back() = std::string(new_name);
  Invalidate(vfid, {std::string(relpath), JoinComponents(*parts, parts->size())});
  return st;
}

Status CachedVolume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  Status st = ForwardingVolume::Move(vfid, src, dst);
  Invalidate(vfid, {std::string(src), std::string(dst)});  // (what lands inside dst is below it)
  return st;
}

Status CachedVolume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                                 bool recursive) {
  Status st = ForwardingVolume::DeleteFiles(vfid, relpaths, recursive);
  Invalidate(vfid, relpaths);
  return st;
}

Result<std::unique_ptr<StagingWriter>> CachedVolume::OpenStaging(const VFolderId& vfid,
                                                                 const std::string& session,
                                                                 std::chrono::milliseconds wait) {
  SLUICE_ASSIGN_OR_RETURN(auto w, ForwardingVolume::OpenStaging(vfid, session, wait));
  auto spool = opts_.ingest ? TakeSpool(vfid, session, w->state().staged_size) : nullptr;
  return std::unique_ptr<StagingWriter>(
      new IngestingWriter(std::move(w), this, vfid, session, std::move(spool)));
}

Status CachedVolume::DiscardStaging(const VFolderId& vfid, const std::string& session) {
  std::shared_ptr<Spool> gone;  // freed after the lock is let go
  {
    std::lock_guard lk(mu_);
    gone = UnlistSpool(vfid, session);
  }
  return ForwardingVolume::DiscardStaging(vfid, session);
}

// ---- ingest on write

struct CachedVolume::Spool {
  // Bytes [0, size) of the session as written through this node: in `mem` up to kInMemory
  // (a small object never costs an inode on the cache disk), else in `fd`.
  static constexpr uint64_t kInMemory = 256 << 10;
  std::string mem;
  UniqueFd fd;
  uint64_t size = 0;  // counted in CachedVolume::spooled_
  bool ok = true;
  Steady::time_point returned;
  std::atomic<uint64_t>* spooled = nullptr;
  ~Spool() {
    if (spooled) *spooled -= size;
  }
  Result<std::string> Read(uint64_t off, uint64_t len) const {
    if (off + len > size) return Status(Code::kInternal, "read past the spool");
    if (fd.get() < 0) return mem.substr(static_cast<size_t>(off), static_cast<size_t>(len));
    std::string out(static_cast<size_t>(len), '\0');
    for (size_t got = 0; got < out.size();) {
      ssize_t k =
          ::pread(fd.get(), out.data() + got, out.size() - got, static_cast<off_t>(off + got));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return Status::FromErrno(k < 0 ? errno : EIO, "read the ingest spool");
      got += static_cast<size_t>(k);
    }
    return out;
  }
};

std::shared_ptr<CachedVolume::Spool> CachedVolume::TakeSpool(const VFolderId& vfid,
                                                             const std::string& session,
                                                             uint64_t staged_size) {
  std::shared_ptr<Spool> s;
  {
    std::lock_guard lk(mu_);
    s = UnlistSpool(vfid, session);
  }
  if (s && s->ok && staged_size <= s->size) {
    CutSpool(*s, staged_size);  // a PATCH cut back to its durable offset, say
    if (s->ok) return s;
  }
  if (staged_size > 0) return nullptr;  // bytes another node (or an earlier process) wrote
  s = std::make_shared<Spool>();
  s->spooled = &spooled_;
  return s;
}

void CachedVolume::ReturnSpool(const VFolderId& vfid, const std::string& session,
                               std::shared_ptr<Spool> s) {
  if (!s->ok || stopping_) return;
  s->returned = Steady::now();
  std::shared_ptr<Spool> dropped;  // freed after the lock is let go
  std::lock_guard lk(mu_);
  if (spools_.size() >= kMaxSpools) {
    auto oldest = std::min_element(spools_.begin(), spools_.end(), [](auto& a, auto& b) {
      return a.second->returned < b.second->returned;
    });
    dropped = std::move(oldest->second);
    spools_.erase(oldest);
    n_.ingests_dropped++;
  }
  spools_[SpoolKey(vfid, session)] = std::move(s);
}

std::shared_ptr<CachedVolume::Spool> CachedVolume::UnlistSpool(const VFolderId& vfid,
                                                               const std::string& session) {
  auto it = spools_.find(SpoolKey(vfid, session));
  if (it == spools_.end()) return nullptr;
  auto s = std::move(it->second);
  spools_.erase(it);
  return s;
}

void CachedVolume::DropSpool(Spool& s, bool quietly) {
  if (!s.ok) return;
  s.ok = false;
  spooled_ -= s.size;
  s.size = 0;
  s.mem = std::string();
  s.fd.reset();
  if (!quietly) n_.ingests_dropped++;
}

void CachedVolume::CutSpool(Spool& s, uint64_t offset) {
  if (!s.ok || offset >= s.size) return;
  if (s.fd.get() >= 0 ? ::ftruncate(s.fd.get(), static_cast<off_t>(offset)) != 0
                      : (s.mem.resize(static_cast<size_t>(offset)), false))
    return DropSpool(s);
  spooled_ -= s.size - offset;
  s.size = offset;
}

void CachedVolume::Spooled(Spool& s, uint64_t offset, const char* data, size_t n) {
  if (!s.ok) return;
  if (offset > s.size) return DropSpool(s);  // a gap: bytes this node did not see
  const uint64_t end = offset + n, grow = end > s.size ? end - s.size : 0;
  // Spooled files wait on the cache disk beside the blocks (their blocks are written from
  // them): bounded together, and never past the disk's floor.
  if (grow > 0 &&
      (spooled_ + grow > opts_.max_size / 4 || (end > Spool::kInMemory && !store_->HasRoom(grow))))
    return DropSpool(s);
  if (s.fd.get() < 0 && end > Spool::kInMemory) {
    UniqueFd fd(::open(opts_.path.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (fd.get() < 0 || !WriteFully(fd.get(), s.mem)) return DropSpool(s);
    s.fd = std::move(fd);
    s.mem = std::string();
  }
  if (s.fd.get() < 0) {
    if (s.mem.size() < end) s.mem.resize(static_cast<size_t>(end));
    std::memcpy(s.mem.data() + offset, data, n);
  } else {
    for (size_t done = 0; done < n;) {
      ssize_t k = ::pwrite(s.fd.get(), data + done, n - done, static_cast<off_t>(offset + done));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return DropSpool(s);
      done += static_cast<size_t>(k);
    }
  }
  s.size += grow;
  spooled_ += grow;
}

namespace {

// Whether two entries name one version of a file: the same entity tag, or (none on either)
// the same validator.
bool SameVersion(const DirEntry& a, const DirEntry& b) {
  if (a.size != b.size || a.etag.empty() != b.etag.empty()) return false;
  return ValidatorOf(a) == ValidatorOf(b);
}

}  // namespace

void CachedVolume::Ingest(const VFolderId& vfid, const std::string& rel, std::shared_ptr<Spool> s,
                          const std::optional<DirEntry>& landed, uint64_t gen) {
  // Not where the volume cannot say which version the commit made, nor for what this node
  // did not see whole (a spool given up, or one shorter than the file).
  if (!s->ok || !landed || landed->size != s->size) return DropSpool(*s);
  KeepInBackground(
      [this, vfid, rel, s, entry = *landed, gen] { IngestNow(vfid, rel, *s, entry, gen); });
}

void CachedVolume::KeepInBackground(std::function<void()> task) {
  if (!ahead_) return task();
  if (!Ahead(std::move(task)))
    n_.ingests_dropped++;  // the pool is backed up: the file is cached at its first read
}

void CachedVolume::Refill(const VFolderId& vfid, const std::string& rel,
                          const std::optional<DirEntry>& landed) {
  // Bounded as a spool is: a file larger than spools may grow is cached as it is read.
  if (!landed || landed->size > opts_.max_size / 4) {
    n_.ingests_dropped++;
    return;
  }
  KeepInBackground([this, vfid, rel, entry = *landed] {
    auto r = OpenReader(vfid, rel);
    if (!r.ok() || !SameVersion(entry, (*r)->info())) {
      n_.ingests_dropped++;
      return;
    }
    std::atomic<uint64_t> bytes{0};
    Status st = static_cast<CachedReader&>(**r).Warm(&bytes);
    const uint64_t bs = opts_.block_size;
    n_.ingested += (bytes + bs - 1) / bs;
    n_.ingested_bytes += bytes;
    (*g_ingest_bytes_) += bytes;
    if (!st.ok()) n_.ingests_dropped++;
  });
}

void CachedVolume::IngestNow(const VFolderId& vfid, const std::string& rel, const Spool& s,
                             const DirEntry& landed, uint64_t gen) {
  // The origin's version now: another node may have written the file since this commit, and
  // these bytes are only ever kept under the version they made.
  const auto asked = Steady::now();
  auto r = inner().OpenReader(vfid, rel);
  if (!r.ok() || !SameVersion(landed, (*r)->info())) {
    n_.ingests_dropped++;
    return;
  }
  const DirEntry now = (*r)->info();
  auto blob = (*r)->ReadMeta();
  OriginAnswered();
  KeepMeta(vfid, rel, {now, blob.ok() ? std::move(blob).value() : std::string(), asked}, gen);
  const std::string validator = ValidatorOf(now);
  const uint64_t bs = opts_.block_size;
  for (uint64_t first = 0; first < now.size; first += bs) {
    const uint64_t len = std::min(bs, now.size - first);
    const std::string id = BlockId(vfid, rel, validator, first / bs);
    if (store_->Has(id)) continue;  // read meanwhile
    auto data = s.Read(first, len);
    if (!data.ok() || !store_->Put(id, *data)) {
      n_.ingests_dropped++;
      break;  // the disk is full, or failed: the rest is cached as it is read
    }
    n_.ingested++;
    n_.ingested_bytes += len;
    (*g_ingest_bytes_) += len;
  }
  PublishStore();
}

}  // namespace sluice
