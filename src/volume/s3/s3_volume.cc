#include "volume/s3/s3_volume.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <semaphore>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/crypto.h"
#include "common/json.h"
#include "common/path.h"
#include "common/secrets.h"
#include "volume/forwarding_volume.h"
#include "volume/listed_dir.h"
#include "volume/vfolder_walk.h"

namespace sluice {

namespace s3c = io::s3;
using Clock = std::chrono::system_clock;

namespace {

// A file this small is read whole when opened, so that its reader keeps the version it opened
// even if the origin's object is replaced (larger files fail the read instead).
constexpr uint64_t kReadWholeBelow = 256 << 10;
// Sluice's own records, beside the data: what exists (scopes, vfolders) and what a detach left
// to delete. Small objects with a JSON body, not markers with metadata: an origin that keeps
// objects as files (another Sluice) has directories for "dir/" keys, which carry no metadata
// and vanish once empty.
constexpr const char* kRecords = ".sluice/";
// Object metadata (FileReader::ReadMeta) in the origin's user metadata, base64, with the mtime
// (ns) it was made for. S3 allows 2 KiB of user metadata: a larger blob is not kept.
constexpr const char* kObjectMeta = "sluice-object";
constexpr const char* kMtimeMeta = "sluice-mtime";
constexpr size_t kMaxMetaBlob = 1400;

bool IsNotFound(const Status& st) {
  return st.code() == Code::kNotFound;
}

Clock::time_point TimeOf(std::time_t t) {
  return Clock::from_time_t(t);
}

DirEntry FileEntry(std::string name, const s3c::ObjectInfo& o) {
  DirEntry e;
  e.name = std::move(name);
  e.type = EntryType::kFile;
  e.mode = 0100644;
  e.size = o.size;
  e.created = e.modified = e.changed = TimeOf(o.mtime);
  // Published through Sluice: the mtime its object metadata was made for (HEAD and GET carry
  // it; a listing does not, and shows the origin's Last-Modified).
  if (auto it = o.meta.find(kMtimeMeta); it != o.meta.end())
    e.modified = e.changed = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
        std::chrono::nanoseconds(std::strtoll(it->second.c_str(), nullptr, 10))));
  // As HTTP sends it: the APIs pass it on as the validator. An origin that sends none leaves
  // it empty, so that the validator is made from size and mtime (a `""` would be the same
  // validator for every version, and the cache would serve a replaced object's old blocks).
  if (!o.etag.empty()) e.etag = "\"" + o.etag + "\"";
  // An object has no inode: one from its key, so that what is cached by inode (object
  // metadata) never takes one object for another.
  e.ino = std::hash<std::string>{}(o.key) | 1;
  return e;
}

DirEntry DirEntryOf(std::string name, uint32_t perm = 0755, std::time_t mtime = 0) {
  DirEntry e;
  e.name = std::move(name);
  e.type = EntryType::kDirectory;
  e.mode = 0040000 | perm;
  e.created = e.modified = e.changed = TimeOf(mtime);
  return e;
}

// The name a listed key (or, `prefix`, a common prefix "dir/name/") gives below `dir`, or
// nullopt where there is none (the directory's own marker, "dir//") or none a path could name:
// ".", "..", a NUL, a '/' left by an origin that ignored the delimiter, over NAME_MAX. A foreign
// bucket may hold such keys (S3 keys are any bytes); they are not listed, so that no listing,
// archive or walk hands on a name like "..".
std::optional<std::string> ListedName(std::string_view key, std::string_view dir, bool prefix) {
  if (!key.starts_with(dir)) return std::nullopt;
  std::string_view name = key.substr(dir.size());
  if (prefix) {
    if (!name.ends_with('/')) return std::nullopt;
    name.remove_suffix(1);
  }
  if (name.empty()) return std::nullopt;
  if (Status st = ValidateName(name); !st.ok()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      spdlog::warn("s3 volume: key '{}' is not listed: {} (logged once)", SanitizeUtf8(key),
                   st.message());
    return std::nullopt;
  }
  return std::string(name);
}

// Whether `rel`, a key below a directory's prefix, is a path a listing can name: every
// component as ListedName takes it, the last empty for a directory marker ("a/b/"). A clone
// leaves the others (keys like "x/../y" in a foreign bucket) where they are: copied, they
// would be hidden keys of the copy, counted in its usage and never listed.
bool CopyablePath(std::string_view rel) {
  for (size_t i = 0;;) {
    const size_t slash = rel.find('/', i);
    if (slash == std::string_view::npos) return i == rel.size() || ValidateName(rel.substr(i)).ok();
    if (!ValidateName(rel.substr(i, slash - i)).ok()) return false;
    i = slash + 1;
  }
}

// The first `n` components as a key suffix: "" for none (JoinComponents gives "." there, a
// path, where a key needs nothing).
std::string Join(const std::vector<std::string>& parts, size_t n) {
  return n == 0 ? std::string() : JoinComponents(parts, n);
}

}  // namespace

// ---- options

Result<S3VolumeOptions> S3VolumeOptions::FromConfig(const VolumeConfig& cfg) {
  S3VolumeOptions o;
  o.client.endpoint.clear();
  auto bad = [&](const std::string& key, std::string_view why) {
    return Status(Code::kInvalidArgument,
                  fmt::format("volume.{}.options.{}: {}", cfg.name, key, why));
  };
  std::string creds_file;
  for (const auto& [key, value] : cfg.options.items()) {
    const bool is_str = value.is_string();
    // Numbers may be written bare (max-connections = 32) or quoted.
    const std::string str = is_str                      ? value.get<std::string>()
                            : value.is_number_integer() ? value.dump()
                                                        : std::string();
    if (key == "insecure" || key == "read-only" || key == "read_only") {
      if (!value.is_boolean()) return bad(key, "must be true or false");
      (key == "insecure" ? o.client.insecure : o.read_only) = value.get<bool>();
      continue;
    }
    if (!is_str && !value.is_number_integer()) return bad(key, "must be a string or a number");
    // The value as a whole number in [lo, hi]; nullopt when it is not one.
    auto int_in = [&str](long lo, long hi) -> std::optional<int> {
      char* end = nullptr;
      const long n = std::strtol(str.c_str(), &end, 10);
      if (str.empty() || *end != '\0' || n < lo || n > hi) return std::nullopt;
      return static_cast<int>(n);
    };
    if (key == "endpoint") {
      o.client.endpoint = str;
    } else if (key == "bucket") {
      o.bucket = str;
    } else if (key == "prefix") {
      o.prefix = str;
    } else if (key == "region") {
      o.client.creds.region = str;
    } else if (key == "access-key" || key == "access_key") {
      o.client.creds.access_key = str;
    } else if (key == "secret-key" || key == "secret_key") {
      o.client.creds.secret_key = str;
    } else if (key == "credentials-file" || key == "credentials_file") {
      creds_file = str;
    } else if (key == "ca-file" || key == "ca_file") {
      o.client.ca_file = str;
    } else if (key == "addressing") {
      if (str != "path" && str != "virtual")
        return bad(key, "must be \"path\" (host/bucket/key) or \"virtual\" (bucket.host/key)");
      o.client.virtual_hosted = str == "virtual";
    } else if (key == "capacity") {
      auto size = ParseBinarySize(str);
      if (!size.ok()) return bad(key, size.status().message());
      o.capacity = *size;
    } else if (key == "part-size" || key == "part_size") {
      auto size = ParseBinarySize(str);
      if (!size.ok()) return bad(key, size.status().message());
      // An upload's last part (and a file sent whole) holds up to twice this, less a byte,
      // in one request, which S3 bounds at 5 GiB; the writer holds as much in memory.
      if (*size < (5u << 20) || *size > (2560ULL << 20))
        return bad(key,
                   "must be 5 MiB to 2.5 GiB (its last part holds up to twice that, and S3 "
                   "takes parts of up to 5 GiB)");
      o.part_size = *size;
    } else if (key == "min-speed") {
      auto size = ParseBinarySize(str);
      if (!size.ok()) return bad(key, size.status().message());
      if (*size < 1 || *size > (1u << 30)) return bad(key, "must be 1 byte to 1 GiB a second");
      o.client.min_speed = *size;
    } else if (key == "upload-lock-ttl") {
      auto d = ParseDurationMillis(str);
      if (!d.ok()) return bad(key, d.status().message());
      if (*d < std::chrono::seconds(1) || *d > std::chrono::hours(1))
        return bad(key, "must be 1s to 1h");
      o.upload_lock_ttl = *d;
    } else if (key == "max-copy-size") {
      auto size = ParseBinarySize(str);
      if (!size.ok()) return bad(key, size.status().message());
      if (*size < (5u << 20) || *size > (5ULL << 30))
        return bad(key, "must be 5 MiB to 5 GiB (S3's part sizes)");
      o.max_copy_size = *size;
    } else if (key == "usage-reconcile-interval" || key == "usage-walk-budget") {
      auto d = ParseDurationMillis(str);
      if (!d.ok()) return bad(key, d.status().message());
      if (key == "usage-reconcile-interval") {
        if (d->count() <= 0) return bad(key, "must be positive");
        o.usage_reconcile = *d;
      } else {
        o.usage_walk_budget = *d;
      }
    } else if (key == "vfolder-ttl" || key == "vfolder_ttl" || key == "trash-grace") {
      auto d = ParseDuration(str);
      if (!d.ok()) return bad(key, d.status().message());
      (key == "trash-grace" ? o.trash_grace : o.vfolder_ttl) = *d;
    } else if (key == "connect-timeout" || key == "stall-timeout" || key == "retry-deadline") {
      auto d = ParseDuration(str);
      if (!d.ok()) return bad(key, d.status().message());
      if (d->count() <= 0 && key != "retry-deadline") return bad(key, "must be positive");
      if (*d > std::chrono::hours(24)) return bad(key, "must be at most a day");
      (key == "connect-timeout" ? o.client.connect_timeout
       : key == "stall-timeout" ? o.client.stall_timeout
                                : o.client.retry_deadline) = *d;
    } else if (key == "queue-timeout") {
      auto d = ParseDurationMillis(str);
      if (!d.ok()) return bad(key, d.status().message());
      if (d->count() <= 0 || *d > std::chrono::hours(1))
        return bad(key, "must be over 0 and at most 1h");
      o.queue_timeout = *d;
    } else if (key == "transport-threads") {
      auto n = int_in(0, 64);
      if (!n) return bad(key, "must be 0 (one per four cores) to 64");
      o.transport_threads = *n;
    } else if (key == "max-connections") {
      auto n = int_in(1, 4096);
      if (!n) return bad(key, "must be 1 to 4096");
      o.max_connections = *n;
    } else if (key == "max-attempts") {
      auto n = int_in(1, 20);
      if (!n) return bad(key, "must be 1 to 20");
      o.client.max_attempts = *n;
    } else {
      return bad(key,
                 "unknown key for the s3 backend (known: endpoint, bucket, prefix, region, "
                 "access-key, secret-key, credentials-file, ca-file, insecure, read-only, "
                 "addressing, capacity, vfolder-ttl, part-size, connect-timeout, "
                 "stall-timeout, min-speed, retry-deadline, max-attempts, "
                 "usage-reconcile-interval, "
                 "usage-walk-budget, max-copy-size, upload-lock-ttl, max-connections, "
                 "queue-timeout, transport-threads)");
    }
  }
  if (!creds_file.empty()) {
    // Two lines: the access key, then the secret key (kept out of the config file).
    std::ifstream in(creds_file);
    if (!in) return bad("credentials-file", fmt::format("cannot read '{}'", creds_file));
    std::getline(in, o.client.creds.access_key);
    std::getline(in, o.client.creds.secret_key);
    auto trim = [](std::string& s) {
      while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
    };
    trim(o.client.creds.access_key);
    trim(o.client.creds.secret_key);
  }
  if (o.client.endpoint.empty()) return bad("endpoint", "is required (http[s]://host:port)");
  if (o.bucket.empty()) return bad("bucket", "is required");
  if (o.client.creds.access_key.empty() || o.client.creds.secret_key.empty())
    return bad("access-key", "give access-key and secret-key, or credentials-file");
  if (!o.prefix.empty() && o.prefix.back() != '/') o.prefix += '/';
  if (o.prefix.starts_with('/')) return bad("prefix", "must not begin with '/'");
  if (Status st = s3c::S3Client::Validate(o.client); !st.ok()) return bad("endpoint", st.message());
  return o;
}

// ---- the origin: clients (one per concurrent request, kept for reuse) and shared helpers

class S3Volume::Clients {
 public:
  explicit Clients(s3c::ClientOptions opts) : opts_(std::move(opts)) {}
  class Lease {
   public:
    Lease(Clients* owner, std::unique_ptr<s3c::S3Client> c) : owner_(owner), c_(std::move(c)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (c_) owner_->Return(std::move(c_));
    }
    s3c::S3Client* operator->() { return c_.get(); }

   private:
    Clients* owner_;
    std::unique_ptr<s3c::S3Client> c_;
  };
  Lease Take() {
    std::lock_guard lk(mu_);
    if (idle_.empty()) return Lease(this, std::make_unique<s3c::S3Client>(opts_));
    auto c = std::move(idle_.back());
    idle_.pop_back();
    return Lease(this, std::move(c));
  }

 private:
  void Return(std::unique_ptr<s3c::S3Client> c) {
    std::lock_guard lk(mu_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(c));
  }
  static constexpr size_t kMaxIdle = 64;
  s3c::ClientOptions opts_;
  std::mutex mu_;
  std::vector<std::unique_ptr<s3c::S3Client>> idle_;
};

namespace {

// While one lives, the origin requests its thread makes go through the transport's control
// lane: an upload's lease is renewed ahead of data requests that fill every connection.
class ControlRequests {
 public:
  ControlRequests() : was_(active_) { active_ = true; }
  ~ControlRequests() { active_ = was_; }
  ControlRequests(const ControlRequests&) = delete;
  ControlRequests& operator=(const ControlRequests&) = delete;
  static bool active() { return active_; }

 private:
  bool was_;
  static thread_local bool active_;
};
thread_local bool ControlRequests::active_ = false;

}  // namespace

struct S3Volume::Origin {
  Origin(const S3VolumeOptions& o, std::string volume)
      : opts(WithTransport(o, volume)),
        clients(opts.client),
        control_clients(Control(opts.client)),
        volume(std::move(volume)),
        identity(fmt::format("{}\n{}", opts.client.endpoint, opts.client.creds.access_key)) {}
  // Every client of the volume sends through one transport: shared connections, at most
  // max-connections of them.
  static S3VolumeOptions WithTransport(S3VolumeOptions o, const std::string& volume) {
    o.client.transport = std::make_shared<s3c::Transport>(
        s3c::TransportOptions{o.max_connections, o.queue_timeout, o.transport_threads, volume});
    return o;
  }
  static s3c::ClientOptions Control(s3c::ClientOptions c) {
    c.control = true;
    return c;
  }
  S3VolumeOptions opts;
  Clients clients, control_clients;
  std::string volume;
  std::string identity;  // OriginObject::origin of what the volume reads
  std::mutex mu;
  std::string last_error;  // the last failure to reach the origin, "" after a success
  std::atomic<bool> creds_refused{false};  // the origin refused the credentials last (Note)
  // Operations an S3 origin may not have (GCS's XML API has no DeleteObjects; some gateways no
  // UploadPartCopy): learned from the first NotImplemented, after which the work is done
  // another way and the operation is not asked for again.
  enum class Has { kUnknown, kYes, kNo };
  std::atomic<Has> batch_delete{Has::kUnknown}, part_copy{Has::kUnknown};
  // Parts held in memory at once by copies read and written again (CopyInParts without
  // UploadPartCopy), over every copy of the volume: a clone copies 16 objects at once.
  std::counting_semaphore<> parts_in_memory{4};
  // Learns from `st`, the answer to operation `what` (`has` says whether the origin has it):
  // true when the origin has not (NotImplemented).
  bool Lacks(const Status& st, std::atomic<Has>& has, std::string_view what) {
    if (st.code() != Code::kUnsupported) {
      if (st.ok()) has = Has::kYes;
      return false;
    }
    if (has.exchange(Has::kNo) != Has::kNo)
      spdlog::warn("volume {}: the origin has no {} ({}); done without it from now on", volume,
                   what, st.message());
    return true;
  }

  Clients::Lease Client() {
    return ControlRequests::active() ? control_clients.Take() : clients.Take();
  }
  const std::string& bucket() const { return opts.bucket; }
  // `in`, or the volume's bucket when `in` is empty (reads of a vfolder bound to another).
  std::string_view Bucket(std::string_view in) const { return in.empty() ? bucket() : in; }

  // Remembers whether the origin answered, for GetHwInfo. The origin refusing this volume's
  // own credentials (a key revoked or rotated, a session token expired: kUnauthenticated) is
  // not the caller's lack of permission: the caller gets a 503 that says so, and the volume is
  // degraded until the origin accepts them again. An AccessDenied stays what it is: it may be
  // about one object or another bucket (a policy, an archived object), not the volume.
  template <typename T>
  T Note(T r) {
    const Status& st = StatusOf(r);
    // A HEAD's 403 has no body to say why: once the origin has said it refuses the
    // credentials, a 403 is taken to say so again, until a request succeeds.
    if (st.code() == Code::kUnauthenticated ||
        (st.code() == Code::kPermissionDenied && creds_refused.load())) {
      creds_refused = true;
      Status refused(
          Code::kUnavailable,
          fmt::format("the origin refuses volume {}'s credentials: {}", volume, st.message()));
      std::lock_guard lk(mu);
      last_error = refused.message();
      return T(std::move(refused));
    }
    // The volume's bucket gone (deleted behind it) is the volume's failure, not a missing
    // file or vfolder (another bucket, bound or named to bind, stays a 404): a 503, and the volume
    // degraded, until it is back.
    if (s3c::IsNoSuchBucket(st, bucket())) {
      Status gone(Code::kUnavailable, fmt::format("volume {}: the origin has no such bucket: {}",
                                                  volume, st.message()));
      std::lock_guard lk(mu);
      last_error = gone.message();
      return T(std::move(gone));
    }
    std::lock_guard lk(mu);
    if (st.code() == Code::kUnavailable) {
      last_error = "the origin does not answer: " + st.message();
    } else if (st.code() != Code::kPermissionDenied) {  // that one says nothing of the volume
      last_error.clear();
      creds_refused = false;
    }
    return r;
  }
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static Status StatusOf(const Result<T>& r) {
    return r.status();
  }

  Result<std::optional<s3c::ObjectInfo>> HeadOpt(const std::string& key, std::string_view in = {}) {
    auto r = Note(Client()->Head(Bucket(in), key));
    if (!r.ok()) {
      if (IsNotFound(r.status())) return std::optional<s3c::ObjectInfo>();
      return r.status();
    }
    return std::optional<s3c::ObjectInfo>(std::move(r).value());
  }

  // Whether any key other than `dir` itself (its marker) lies below `dir` ("a/b/").
  // Pages are followed: an origin may end a page short (even empty) and say it is truncated.
  Result<bool> HasChildren(const std::string& dir, std::string_view in = {}) {
    s3c::ListRequest lr;
    lr.prefix = dir;
    lr.max_keys = 2;
    bool found = false;
    const Status kFound(Code::kAlreadyExists, "found");  // ends the listing early
    Status st = Note(Client()->ForEachPage(Bucket(in), lr, [&](s3c::ListPage& page) {
      for (const auto& o : page.objects)
        if (o.key != dir) found = true;
      if (!page.prefixes.empty()) found = true;
      return found ? kFound : Status::Ok();
    }));
    if (found) return true;
    SLUICE_RETURN_IF_ERROR(st);
    return false;
  }

  // Every key below `prefix`, page after page.
  Status ForEachKey(const std::string& prefix,
                    const std::function<Status(const s3c::ObjectInfo&)>& fn,
                    std::string_view in = {}) {
    s3c::ListRequest lr;
    lr.prefix = prefix;
    return Note(Client()->ForEachPage(Bucket(in), lr, [&](s3c::ListPage& page) {
      for (const auto& o : page.objects) SLUICE_RETURN_IF_ERROR(fn(o));
      return Status::Ok();
    }));
  }

  // What the keys below `root` (ending in '/') hold: their bytes, and the files and the
  // directories (with a marker, or implied by a key below them) as entries.
  Result<TreeUsage> MeasureTree(const std::string& root, std::string_view in = {}) {
    TreeUsage u;
    std::set<std::string> dirs;
    SLUICE_RETURN_IF_ERROR(ForEachKey(
        root,
        [&](const s3c::ObjectInfo& o) {
          std::string rel = o.key.substr(root.size());
          if (rel.empty()) return Status::Ok();
          if (rel.back() == '/')
            rel.pop_back();  // a directory marker
          else {
            u.file_count += 1;
            u.used_bytes += o.size;
          }
          for (size_t slash = rel.find('/'); slash != std::string::npos;
               slash = rel.find('/', slash + 1))
            dirs.insert(rel.substr(0, slash));
          if (o.key.back() == '/') dirs.insert(rel);
          return Status::Ok();
        },
        in));
    u.file_count += dirs.size();
    return u;
  }

  // fn(0) .. fn(n - 1) on up to `workers` threads (origin requests wait on the network, not
  // on this machine); the first error stops the rest and is the answer.
  static Status ParallelFor(size_t n, size_t workers, const std::function<Status(size_t)>& fn) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    Status first = Status::Ok();
    auto run = [&] {
      for (size_t i; !failed && (i = next++) < n;) {
        Status st = fn(i);
        if (st.ok()) continue;
        std::lock_guard lk(mu);
        if (first.ok()) first = st;
        failed = true;
      }
    };
    std::vector<std::thread> ts;
    for (size_t k = 1; k < std::min(workers, n); ++k) ts.emplace_back(run);
    run();
    for (auto& t : ts) t.join();
    return first;
  }

  // Deletes every key below `prefix` (DeleteObjects batches of 1000, 4 at once); refusals are
  // errors. `bytes`: what the keys held.
  // Deleted as they are listed, 4000 at a time (keys already listed do not move a listing's
  // continuation), so that a prefix of any size costs bounded memory.
  Status DeletePrefix(const std::string& prefix, uint64_t* bytes = nullptr) {
    std::vector<std::string> keys;
    uint64_t held = 0;
    Status st = ForEachKey(prefix, [&](const s3c::ObjectInfo& o) {
      keys.push_back(o.key);
      held += o.size;
      if (keys.size() < 4000) return Status::Ok();
      Status d = DeleteKeys(keys);
      keys.clear();
      return d;
    });
    if (st.ok()) st = DeleteKeys(keys);
    if (bytes) *bytes = held;
    return st;
  }

  // Deletes `keys` (DeleteObjects batches of 1000, 4 at once; one DELETE each on an origin
  // without DeleteObjects); refusals are errors.
  Status DeleteKeys(const std::vector<std::string>& keys) {
    if (batch_delete == Has::kNo) return DeleteEach(keys);
    return ParallelFor((keys.size() + 999) / 1000, 4, [&](size_t b) {
      std::vector<std::string> batch(keys.begin() + b * 1000,
                                     keys.begin() + std::min(keys.size(), b * 1000 + 1000));
      auto failed = Note(Client()->DeleteMany(bucket(), batch));
      if (Lacks(failed.status(), batch_delete, "DeleteObjects")) return DeleteEach(batch);
      if (!failed.ok()) return failed.status();
      if (!failed->empty())
        return Status(Code::kIoError, fmt::format("the origin refused to delete {} keys: {}",
                                                  failed->size(), failed->front().message()));
      return Status::Ok();
    });
  }

  // One DELETE per key, 16 at once; a key already gone is deleted.
  Status DeleteEach(const std::vector<std::string>& keys) {
    return ParallelFor(keys.size(), 16, [&](size_t i) { return DeleteKey(keys[i]); });
  }
  // One DELETE; a key already gone is deleted.
  Status DeleteKey(const std::string& key) {
    Status st = Note(Client()->Delete(bucket(), key));
    return IsNotFound(st) ? Status::Ok() : st;
  }

  // Server-side copies of every key below `from` (in bucket `from_bucket`, "" for the
  // volume's) to the same name below `to` in the volume's bucket, 16 at once (`skip_from`: not
  // the key `from` itself, a marker the target has its own of).
  // `copied` (optional): the keys copied.
  // `named_only`: keys no path names are left out (a clone of a bound foreign prefix: copied,
  // they would be hidden keys of the copy), and so is the staging directory; a move takes every
  // key, as it deletes them after.
  Status CopyPrefix(const std::string& from, const std::string& to, bool skip_from,
                    std::string_view from_bucket = {}, std::vector<std::string>* copied = nullptr,
                    bool named_only = false) {
    s3c::ListRequest lr;
    lr.prefix = from;
    return Note(Client()->ForEachPage(Bucket(from_bucket), lr, [&](s3c::ListPage& page) {
      const auto& objs = page.objects;
      auto wanted = [&](const s3c::ObjectInfo& o) {
        if (skip_from && o.key == from) return false;
        // A clone leaves the multipart uploads in progress behind, as a posix clone does
        // (before 2026-12-05 the copy listed, and counted, the source's parts).
        if (named_only && std::string_view(o.key)
                              .substr(from.size())
                              .starts_with(std::string(kStagingDirName) + "/"))
          return false;
        if (!named_only || o.key.size() == from.size() ||
            CopyablePath(std::string_view(o.key).substr(from.size())))
          return true;
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true))
          spdlog::warn("s3 volume {}: key '{}' is not copied: no path names it (logged once)",
                       volume, SanitizeUtf8(o.key));
        return false;
      };
      SLUICE_RETURN_IF_ERROR(ParallelFor(objs.size(), 16, [&](size_t i) {
        if (!wanted(objs[i])) return Status::Ok();
        return CopyObject(from_bucket, objs[i].key, to + objs[i].key.substr(from.size()),
                          objs[i].size);
      }));
      if (copied)
        for (const auto& o : objs)
          if (wanted(o)) copied->push_back(o.key);
      return Status::Ok();
    }));
  }

  // A server-side copy of `src_key` (`size` bytes, in bucket `from`: "" for the volume's) to
  // `dst_key` of the volume's bucket, its metadata copied or `replace`d: one CopyObject up to
  // max-copy-size, else a multipart upload of its parts (CopyInParts). `etag`, when given, gets
  // the new object's entity tag where the answer names it (the single copy), "" otherwise.
  Status CopyObject(std::string_view from, const std::string& src_key, const std::string& dst_key,
                    uint64_t size, const s3c::UserMeta* replace = nullptr,
                    std::string* etag = nullptr, std::string_view if_match = {}) {
    if (etag) etag->clear();
    if (size <= opts.max_copy_size) {
      auto copied =
          Note(Client()->Copy(bucket(), src_key, dst_key, replace, Bucket(from), if_match));
      if (copied.ok() && etag) *etag = *copied;
      return copied.status();
    }
    // The source's HEAD first: a multipart upload takes the metadata at its creation, and
    // every part is copied only from the version it described.
    SLUICE_ASSIGN_OR_RETURN(auto head, Note(Client()->Head(Bucket(from), src_key)));
    if (!if_match.empty() && head.etag != if_match)
      return Status(Code::kConflict,
                    fmt::format("s3://{}/{} changed before it was copied", Bucket(from), src_key));
    const bool on_origin = part_copy != Has::kNo;
    Status st = CopyInParts(from, src_key, dst_key, head, replace, on_origin);
    if (on_origin && part_copy == Has::kNo && st.code() == Code::kUnsupported)
      st = CopyInParts(from, src_key, dst_key, head, replace, false);
    return st;
  }

  // A multipart upload of `head`'s object as `dst_key`. `on_origin`: UploadPartCopy parts of
  // max-copy-size, 8 at once. Otherwise (an origin without UploadPartCopy) each part is read and
  // uploaded again: part-size up to 64 MiB (more where 10,000 parts would not hold the object),
  // each held in memory while it is sent, 4 at once in the whole volume.
  Status CopyInParts(std::string_view from, const std::string& src_key, const std::string& dst_key,
                     const s3c::ObjectInfo& head, const s3c::UserMeta* replace, bool on_origin) {
    const uint64_t size = head.size;
    const uint64_t part = on_origin ? opts.max_copy_size
                                    : std::max(std::min<uint64_t>(opts.part_size, 64 << 20),
                                               (size + s3c::kMaxParts - 1) / s3c::kMaxParts);
    const size_t n = static_cast<size_t>((size + part - 1) / part);
    if (n > static_cast<size_t>(s3c::kMaxParts))
      return Status(Code::kTooLarge,
                    fmt::format("copy of s3://{}/{}: {} bytes is more than {} "
                                "parts of max-copy-size ({} bytes)",
                                Bucket(from), src_key, size, s3c::kMaxParts, part));
    const s3c::UserMeta& meta = replace ? *replace : head.meta;
    const std::string type = replace ? std::string() : head.content_type;
    SLUICE_ASSIGN_OR_RETURN(std::string id,
                            Note(Client()->CreateMultipart(bucket(), dst_key, type, meta)));
    std::vector<s3c::PartInfo> parts(n);
    Status st = ParallelFor(n, on_origin ? 8 : 4, [&](size_t i) {
      const uint64_t first = i * part, last = std::min(size, first + part) - 1;
      const int number = static_cast<int>(i + 1);
      auto& p = parts[i];
      if (on_origin) {
        auto copied = Note(Client()->CopyPart(bucket(), dst_key, id, number, Bucket(from), src_key,
                                              first, last, head.etag, &p.crc32c));
        (void)Lacks(copied.status(), part_copy, "UploadPartCopy");
        SLUICE_ASSIGN_OR_RETURN(p.etag, std::move(copied));
      } else {
        parts_in_memory.acquire();
        struct Release {
          std::counting_semaphore<>& s;
          ~Release() { s.release(); }
        } release{parts_in_memory};
        std::string bytes;
        bytes.reserve(static_cast<size_t>(last - first + 1));
        SLUICE_RETURN_IF_ERROR(Note(Client()->Get(
                                        Bucket(from), src_key,
                                        [&](std::string_view piece) {
                                          bytes.append(piece);
                                          return Status::Ok();
                                        },
                                        std::make_pair(first, last - first + 1), head.etag))
                                   .status());
        if (bytes.size() != last - first + 1)
          return Status(Code::kIoError,
                        fmt::format("copy of s3://{}/{}: bytes {}-{} came back as {} bytes",
                                    Bucket(from), src_key, first, last, bytes.size()));
        SLUICE_ASSIGN_OR_RETURN(p.etag, Note(Client()->UploadPart(bucket(), dst_key, id, number,
                                                                  s3c::Body{bytes}, &p.crc32c)));
      }
      p.number = number;
      p.size = last - first + 1;
      return Status::Ok();
    });
    if (st.ok()) st = CompleteUpload(dst_key, id, parts);
    if (!st.ok()) (void)Note(Client()->AbortMultipart(bucket(), dst_key, id));
    return st;
  }

  // Completes the multipart upload `id` of `key` from `parts`. A Complete whose answer was lost
  // is retried, and the retry finds the upload gone (NoSuchUpload): the object there with the
  // parts' size is then the completed upload, not a failure.
  Status CompleteUpload(const std::string& key, const std::string& id,
                        const std::vector<s3c::PartInfo>& parts) {
    Status st = Note(Client()->CompleteMultipart(bucket(), key, id, parts)).status();
    if (st.ok() || st.code() != Code::kNotFound) return st;
    uint64_t size = 0;
    for (const auto& p : parts) size += p.size;
    auto there = Note(Client()->Head(bucket(), key));
    if (!there.ok() || there->size != size) return st;
    // And the ETag these parts make ("-N"; with MD5 part ETags, the MD5 of them): an object of
    // the same size that was there before (an upload aborted meanwhile) is not this upload.
    if (!there->etag.ends_with(fmt::format("-{}", parts.size()))) return st;
    std::vector<std::string> md5s;
    for (const auto& p : parts) {
      auto raw = HexDecode(p.etag);
      if (!raw.ok() || raw->size() != 16) return Status::Ok();  // not MD5s: the count must do
      md5s.push_back(std::move(raw).value());
    }
    return there->etag == MultipartETag(md5s) ? Status::Ok() : st;
  }

  // The entries directly below `dir` ("" or "a/b/"), sorted by name (the origin's order puts a
  // directory "a" after "a-b", as its prefix is "a/"). A name that is both an object and a
  // prefix lists as the directory.
  Result<std::vector<DirEntry>> ListLevel(const std::string& dir, std::string_view in = {}) {
    std::map<std::string, DirEntry> out;
    s3c::ListRequest lr;
    lr.prefix = dir;
    lr.delimiter = "/";
    SLUICE_RETURN_IF_ERROR(Note(Client()->ForEachPage(Bucket(in), lr, [&](s3c::ListPage& page) {
      for (const auto& o : page.objects)
        if (auto name = ListedName(o.key, dir, false)) out.emplace(*name, FileEntry(*name, o));
      for (const auto& p : page.prefixes)
        if (auto name = ListedName(p, dir, true)) out.insert_or_assign(*name, DirEntryOf(*name));
      return Status::Ok();
    })));
    std::vector<DirEntry> v;
    v.reserve(out.size());
    for (auto& [n, e] : out) v.push_back(std::move(e));
    return v;
  }

  // One page of a listing of bucket `in` (the volume's own when empty).
  Result<s3c::ListPage> ListOnce(std::string_view in, const s3c::ListRequest& lr) {
    return Note(Client()->ListObjects(Bucket(in), lr));
  }

  // A record's JSON and attributes; nullopt when there is none. Records are small; an upload
  // session's lists its parts (about 90 bytes each, 10,000 at most): kMaxSessionRecord.
  // `*unreadable` is set when the object is there but is no record (not a JSON object).
  Result<std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>> GetRecord(
      const std::string& key, size_t limit = 64 << 10, bool* unreadable = nullptr) {
    std::string body;
    auto got = Note(Client()->Get(bucket(), key, [&](std::string_view p) {
      body.append(p);
      return body.size() > limit
                 ? Status(Code::kTooLarge, fmt::format("a record over {} KiB", limit >> 10))
                 : Status::Ok();
    }));
    if (!got.ok()) {
      if (IsNotFound(got.status()))
        return std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>();
      return got.status();
    }
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (unreadable) *unreadable = true;
      return Status(Code::kIoError,
                    fmt::format("s3://{}/{} is not a Sluice record", bucket(), key));
    }
    return std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>(
        std::make_pair(std::move(j), std::move(got).value()));
  }
  Status PutRecord(const std::string& key, const nlohmann::json& j) {
    if (opts.read_only) return Status(Code::kPermissionDenied, "the volume is read-only");
    std::string text;
    try {
      text = j.dump();
    } catch (const nlohmann::json::exception& e) {  // a string from the origin that is no text
      return Status(Code::kUnavailable, fmt::format("the record s3://{}/{} cannot be written: {}",
                                                    bucket(), key, e.what()));
    }
    return Note(Client()->Put(bucket(), key, s3c::Body{text}, "application/json")).status();
  }
  std::string RecordKey(std::string_view what) const {
    return opts.prefix + kRecords + std::string(what);
  }

  // Puts the zero-byte marker "<dir>/" (with `meta`).
  Status PutMarker(const std::string& dir_key, const s3c::UserMeta& meta = {}) {
    return Note(Client()->Put(bucket(), dir_key, s3c::Body{}, {}, meta)).status();
  }
};

namespace {

class S3Reader : public FileReader {
 public:
  S3Reader(std::shared_ptr<S3Volume::Origin> o, std::string bucket, std::string key, DirEntry info,
           std::string head, std::string meta)
      : origin_(std::move(o)),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        info_(std::move(info)),
        head_(std::move(head)),
        meta_(std::move(meta)) {
    std::string_view etag(info_.etag);
    if (etag.size() >= 2) etag = etag.substr(1, etag.size() - 2);
    object_ = {origin_->identity, bucket_, key_, std::string(etag)};
  }
  const DirEntry& info() const override { return info_; }
  const OriginObject* origin_object() const override { return &object_; }
  Result<std::string> ReadMeta() override { return meta_; }
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    if (offset >= info_.size || n == 0) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(n, info_.size - offset));
    if (offset + n <= head_.size()) {
      std::memcpy(buf, head_.data() + offset, n);
      return n;
    }
    size_t got = 0;
    auto sink = [&](std::string_view piece) {
      size_t k = std::min(piece.size(), n - got);
      std::memcpy(buf + got, piece.data(), k);
      got += k;
      return Status::Ok();
    };
    // Pinned to the version opened: a replaced object fails the read (412), never mixes.
    auto r = origin_->Note(origin_->Client()->Get(
        bucket_, key_, sink, std::make_pair(offset, uint64_t{n}), object_.etag));
    auto changed = [&] {
      return Status(Code::kConflict,
                    fmt::format("'{}' changed on the origin since it was opened", info_.name));
    };
    if (!r.ok()) {
      if (r.status().code() == Code::kConflict || IsNotFound(r.status())) return changed();
      return r.status();
    }
    // Pinned by what the answer says too: an origin that sends no ETag (nothing to pin with
    // If-Match) or ignores If-Match still names the object's size in each answer, and another
    // size or ETag is another version (before, its bytes were served after the old one's).
    if ((r->size != 0 && r->size != info_.size) ||
        (!object_.etag.empty() && !r->etag.empty() && r->etag != object_.etag))
      return changed();
    return got;
  }
  // Bytes read at open never wait.
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    if (offset >= info_.size) return size_t{0};
    if (offset + std::min<uint64_t>(n, info_.size - offset) <= head_.size())
      return ReadAt(offset, buf, n);
    return FileReader::ReadAtNoWait(offset, buf, n);
  }

 private:
  std::shared_ptr<S3Volume::Origin> origin_;
  std::string bucket_;
  std::string key_;
  DirEntry info_;
  std::string head_;  // the first bytes (all of a small file), read at open
  std::string meta_;  // the object metadata Sluice published with it, "" for none
  OriginObject object_;
};

std::string MetaOf(const s3c::ObjectInfo& o) {
  auto it = o.meta.find(kObjectMeta);
  if (it == o.meta.end()) return {};
  auto blob = Base64Decode(it->second);
  return blob.ok() ? *blob : std::string();
}

// A directory as listed when opened (volume/listed_dir.h); object metadata from a HEAD.
class S3Dir : public ListedDir {
 public:
  S3Dir(S3Volume* v, VFolderId vfid, std::string rel, std::shared_ptr<const S3Volume::Level> l)
      : ListedDir(v, std::move(vfid), std::move(rel), l, &l->info, &l->entries), s3_(v) {}
  Result<std::string> EntryMeta(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return s3_->ObjectMetaOf(vfid_, Child(name));
  }

 private:
  S3Volume* s3_;
};

// A directory read in key order straight from the origin, whose delimiter listings are in that
// order, a page as the caller reads on: a listing that pages through a level of millions of
// keys asks the origin for what each of its pages needs, not for the whole level each time.
class S3OrderedDir : public ByPathDir {
 public:
  S3OrderedDir(S3Volume* v, std::shared_ptr<S3Volume::Origin> o, VFolderId vfid, std::string rel,
               DirEntry info, S3Volume::Location at, const ListFrom& from)
      : ByPathDir(v, std::move(vfid), std::move(rel)),
        s3_(v),
        o_(std::move(o)),
        info_(std::move(info)),
        bucket_(std::move(at.bucket)),
        dir_(std::move(at.key)),
        after_(from.after) {
    lr_.prefix = dir_ + std::string(from.prefix);
    lr_.delimiter = "/";
    // The origin starts after a key: the one `after` names in this directory (up to its '/'
    // when it lies below a subdirectory, which must come again); what is between is dropped
    // by ListKeyFrom.
    if (!after_.empty()) lr_.start_after = dir_ + after_.substr(0, after_.find('/'));
  }
  const DirEntry& info() const override { return info_; }
  bool KeyOrdered() const override { return true; }
  Result<std::optional<Name>> Next() override {
    while (next_ >= page_.size()) {
      if (done_) return std::optional<Name>();
      SLUICE_RETURN_IF_ERROR(Fill());
    }
    const DirEntry& e = page_[next_++];
    return std::optional<Name>(Name{e.name, e.type});
  }
  // What the origin's page said (no request), else the volume.
  Result<DirEntry> StatEntry(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    for (size_t i = next_; i-- > 0;)
      if (page_[i].name == name) return page_[i];
    return v_->Stat(vfid_, Child(name));
  }
  Result<std::string> EntryMeta(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return s3_->ObjectMetaOf(vfid_, Child(name));
  }

 private:
  // The origin's next page, its objects and common prefixes merged in key order.
  Status Fill() {
    SLUICE_ASSIGN_OR_RETURN(auto p, o_->ListOnce(bucket_, lr_));
    page_.clear();
    next_ = 0;
    auto obj = p.objects.begin();
    auto pre = p.prefixes.begin();
    while (obj != p.objects.end() || pre != p.prefixes.end()) {
      const bool take_obj = pre == p.prefixes.end() || (obj != p.objects.end() && obj->key < *pre);
      const std::string& key = take_obj ? obj->key : *pre;
      std::string_view rel = std::string_view(key).substr(std::min(key.size(), dir_.size()));
      if (auto name = ListedName(key, dir_, !take_obj); name && ListKeyFrom(rel, after_))
        page_.push_back(take_obj ? FileEntry(std::move(*name), *obj)
                                 : DirEntryOf(std::move(*name)));
      if (take_obj)
        ++obj;
      else
        ++pre;
    }
    SLUICE_ASSIGN_OR_RETURN(bool more, lr_.Advance(p));
    done_ = !more;
    return Status::Ok();
  }

  S3Volume* s3_;
  std::shared_ptr<S3Volume::Origin> o_;
  DirEntry info_;
  std::string bucket_, dir_, after_;
  s3c::ListRequest lr_;
  std::vector<DirEntry> page_;
  size_t next_ = 0;
  bool done_ = false;
};

std::string ScopeRecord(const S3Volume::Origin& o, const QuotaScopeId& qs) {
  return o.RecordKey("scopes/" + qs.hex);
}

std::string VFolderRecord(const S3Volume::Origin& o, const VFolderId& vf) {
  return o.RecordKey(fmt::format("vfolders/{}/{}", vf.scope ? vf.scope->hex : "legacy", vf.hex));
}

class S3Quota : public QuotaModel {
 public:
  // Scope usage is the figure `usage` keeps for the scope's keys.
  S3Quota(std::shared_ptr<S3Volume::Origin> o, UsageTracker* usage)
      : o_(std::move(o)), usage_(usage) {}
  std::string ScopePath(const QuotaScopeId& qs) const override {
    return fmt::format("s3://{}/{}", o_->bucket(), Data(qs));
  }
  Status CreateScope(const QuotaScopeId& qs, std::optional<uint64_t> limit) override {
    SLUICE_ASSIGN_OR_RETURN(auto m, o_->HeadOpt(ScopeRecord(*o_, qs)));
    if (m) return ExistingQuotaScope(qs);
    return Put(qs, limit);
  }
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qs) override {
    QuotaUsage q;
    SLUICE_ASSIGN_OR_RETURN(q.limit_bytes, ScopeLimit(qs));
    SLUICE_ASSIGN_OR_RETURN(auto u, usage_->Get(ScopePath(qs)));
    q.used_bytes = u.used_bytes;
    return q;
  }
  // The scope's record alone: no listing of its data.
  Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qs) override {
    SLUICE_ASSIGN_OR_RETURN(auto rec, o_->GetRecord(ScopeRecord(*o_, qs)));
    if (!rec) return MissingQuotaScope(qs, o_->volume);
    if (const auto& j = rec->first; j.contains("limit") && j["limit"].is_number_unsigned())
      return std::optional<uint64_t>(j["limit"].get<uint64_t>());
    return std::optional<uint64_t>();
  }
  Status UpdateScope(const QuotaScopeId& qs, uint64_t limit) override { return Put(qs, limit); }
  Status UnsetQuota(const QuotaScopeId& qs) override {
    SLUICE_ASSIGN_OR_RETURN(auto m, o_->HeadOpt(ScopeRecord(*o_, qs)));
    if (!m) return MissingQuotaScope(qs, o_->volume);
    return Put(qs, std::nullopt);
  }
  Status DeleteScope(const QuotaScopeId& qs) override {
    SLUICE_ASSIGN_OR_RETURN(auto m, o_->HeadOpt(ScopeRecord(*o_, qs)));
    if (!m) return MissingQuotaScope(qs, o_->volume);
    SLUICE_ASSIGN_OR_RETURN(bool used, o_->HasChildren(o_->RecordKey("vfolders/" + qs.hex + "/")));
    if (used) return QuotaScopeNotEmpty(qs);
    SLUICE_RETURN_IF_ERROR(o_->Note(o_->Client()->Delete(o_->bucket(), ScopeRecord(*o_, qs))));
    usage_->Forget(ScopePath(qs));
    return Status::Ok();
  }

 private:
  std::string Data(const QuotaScopeId& qs) const { return o_->opts.prefix + qs.hex + "/"; }
  Status Put(const QuotaScopeId& qs, std::optional<uint64_t> limit) {
    nlohmann::json j = nlohmann::json::object();
    if (limit) j["limit"] = *limit;
    return o_->PutRecord(ScopeRecord(*o_, qs), j);
  }
  std::shared_ptr<S3Volume::Origin> o_;
  UsageTracker* usage_;
};

// Tree operations on "s3://<bucket>/<key prefix>" paths (ScopePath, VFolderPath, detached
// vfolders).
class S3FsOp : public FSOpModel {
 public:
  // `usage`: the figures a deleted tree leaves stale.
  S3FsOp(std::shared_ptr<S3Volume::Origin> o, UsageTracker* usage)
      : o_(std::move(o)), usage_(usage) {}
  Status CopyTree(const std::string& src, const std::string& dst) override {
    SLUICE_ASSIGN_OR_RETURN(std::string from, KeyOf(src));
    SLUICE_ASSIGN_OR_RETURN(std::string to, KeyOf(dst));
    return o_->CopyPrefix(from, to, false);
  }
  Status MoveTree(const std::string& src, const std::string& dst) override {
    SLUICE_RETURN_IF_ERROR(CopyTree(src, dst));
    return DeleteTree(src);
  }
  Status DeleteTree(const std::string& path) override {
    SLUICE_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    SLUICE_RETURN_IF_ERROR(o_->DeletePrefix(key));
    // A detached vfolder's keys counted in its scope until now: "<prefix><scope>/..." is
    // measured again.
    const std::string rest = key.substr(o_->opts.prefix.size());
    if (const size_t slash = rest.find('/'); slash == 32 && IsLowerHex(rest.substr(0, 32), 32, 32))
      usage_->Forget(
          fmt::format("s3://{}/{}{}/", o_->bucket(), o_->opts.prefix, rest.substr(0, 32)));
    // A detached vfolder's trash record goes last: a crash before it leaves the record for
    // EmptyTrash to finish the deletion. After the first pass it stays, marked, for a second
    // one past trash-grace (EmptyTrash): a write in flight when the vfolder went may land
    // after this listing, and its key would otherwise stay, counted in the scope, for good.
    const std::string trash = TrashRecord(*o_, key);
    SLUICE_ASSIGN_OR_RETURN(auto rec, o_->GetRecord(trash));
    if (!rec) return Status::Ok();
    if (!rec->first.contains("swept"))
      return o_->PutRecord(trash, {{"delete", key}, {"swept", true}});
    // Marked by another first pass that ran beside this one (the delete's task and a janitor
    // round): the second pass is still to come.
    if (SweptRecently(*o_, rec->second)) return Status::Ok();
    return o_->DeleteKey(trash);
  }
  Result<TreeUsage> ScanTree(const std::string& path) override {
    SLUICE_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    return o_->MeasureTree(key);
  }

  // A trash record marked swept within trash-grace (by its Last-Modified: the origin's clock,
  // one for every node, against this node's).
  static bool SweptRecently(const S3Volume::Origin& o, const s3c::ObjectInfo& rec) {
    return Clock::now() - TimeOf(rec.mtime) < o.opts.trash_grace;
  }
  static std::string TrashRecord(const S3Volume::Origin& o, const std::string& vf_key) {
    std::string name = vf_key.substr(o.opts.prefix.size());
    std::replace(name.begin(), name.end(), '/', '_');
    return o.RecordKey("trash/" + name);
  }

 private:
  Result<std::string> KeyOf(const std::string& path) const {
    std::string head = fmt::format("s3://{}/", o_->bucket());
    if (!path.starts_with(head) || path.size() == head.size())
      return Status(Code::kInvalidArgument,
                    fmt::format("'{}' is not a path of this volume ({}...)", path, head));
    std::string key = path.substr(head.size());
    if (key.back() != '/') key += '/';
    if (!key.starts_with(o_->opts.prefix) || key.find("/../") != std::string::npos)
      return Status(Code::kInvalidArgument, fmt::format("'{}' is outside the volume", path));
    return key;
  }
  std::shared_ptr<S3Volume::Origin> o_;
  UsageTracker* usage_;
};

}  // namespace

// ---- the volume

S3Volume::S3Volume(VolumeConfig cfg, S3VolumeOptions opts)
    : cfg_(std::move(cfg)),
      opts_(std::move(opts)),
      io_stats_(&Metrics::Global().Volume(cfg_.name)),
      origin_(std::make_shared<Origin>(opts_, cfg_.name)),
      usage_(std::make_unique<UsageTracker>([this](const std::string& p) { return Measure(p); },
                                            opts_.usage_reconcile, opts_.usage_walk_budget)) {
  quota_ = std::make_unique<S3Quota>(origin_, usage_.get());
  fsop_ = std::make_unique<S3FsOp>(origin_, usage_.get());
}

S3Volume::~S3Volume() {
  {
    std::lock_guard lk(held_mu_);
    stopping_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::set<std::string> S3Volume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric};
}

Status S3Volume::Init() {
  // Wrong credentials, a missing bucket or a certificate not trusted stop the start; an origin
  // that does not answer yet does not (every request says so until it does).
  s3c::ListRequest lr;
  lr.prefix = opts_.prefix;
  lr.max_keys = 1;
  auto page = origin_->Client()->ListObjects(opts_.bucket, lr);
  if (page.ok() || page.status().code() == Code::kUnavailable) (void)origin_->Note(page.status());
  if (page.ok()) return Status::Ok();
  if (page.status().code() == Code::kUnavailable && !s3c::IsUntrustedCertificate(page.status())) {
    spdlog::warn("volume {}: the origin {} does not answer yet: {}", cfg_.name,
                 opts_.client.endpoint, page.status().message());
    return Status::Ok();
  }
  return Status(page.status().code(),
                fmt::format("origin {} bucket '{}': {}", opts_.client.endpoint, opts_.bucket,
                            page.status().message()));
}

// The record of the vfolder whose data prefix is `data` ("<prefix>[<scope>/]<ab>/<cd>/<rest>/").
std::string S3Volume::VFolderRecordOfData(const std::string& data) const {
  std::vector<std::string> parts;
  std::string_view rest = std::string_view(data).substr(opts_.prefix.size());
  for (size_t slash; (slash = rest.find('/')) != std::string_view::npos;
       rest.remove_prefix(slash + 1))
    parts.emplace_back(rest.substr(0, slash));
  const bool scoped = parts.size() >= 4;
  const size_t at = scoped ? parts.size() - 3 : 0;
  return origin_->RecordKey(fmt::format("vfolders/{}/{}{}{}", scoped ? parts[0] : "legacy",
                                        parts[at], parts[at + 1], parts[at + 2]));
}

Status S3Volume::EmptyTrash() {
  std::vector<std::string> records;
  SLUICE_RETURN_IF_ERROR(
      origin_->ForEachKey(origin_->RecordKey("trash/"), [&](const s3c::ObjectInfo& o) {
        records.push_back(o.key);
        return Status::Ok();
      }));
  for (const auto& key : records) {
    auto rec = origin_->GetRecord(key);
    if (!rec.ok() || !*rec || !(*rec)->first.contains("delete")) continue;
    const bool swept = (*rec)->first.contains("swept");
    // Deleted once already: the second pass waits out the grace.
    if (swept && S3FsOp::SweptRecently(*origin_, (*rec)->second)) continue;
    const auto& what = (*rec)->first["delete"];
    if (!what.is_string()) continue;
    std::string data = what.get<std::string>();
    // Only a vfolder's data prefix of this volume ("[<scope>/]<ab>/<cd>/<rest>/" below its
    // own prefix), never its records.
    if (!data.starts_with(opts_.prefix) || data.starts_with(origin_->RecordKey("")) ||
        std::count(data.begin() + opts_.prefix.size(), data.end(), '/') < 3)
      continue;
    if (swept) {
      // The same vfolder made again since (a first pass that marked the record after
      // CreateVFolder removed it): its keys are the new vfolder's, and only the record goes.
      auto again = origin_->HeadOpt(VFolderRecordOfData(data));
      if (!again.ok()) return again.status();
      if (*again) {
        SLUICE_RETURN_IF_ERROR(origin_->DeleteKey(key));
        continue;
      }
    }
    SLUICE_RETURN_IF_ERROR(fsop_->DeleteTree(fmt::format("s3://{}/{}", opts_.bucket, data)));
  }
  return Status::Ok();
}

std::optional<S3Volume::Binding> S3Volume::BoundTo(const VFolderId& vfid) const {
  std::lock_guard lk(bound_mu_);
  auto it = bound_.find(vfid.ToString());
  if (it == bound_.end()) return std::nullopt;
  return it->second;
}

S3Volume::Binding S3Volume::ParseBinding(std::string_view bound) {
  if (!bound.starts_with("s3://")) return {"", std::string(bound)};
  bound.remove_prefix(5);
  const size_t slash = bound.find('/');
  return {std::string(bound.substr(0, slash)),
          slash == std::string_view::npos ? std::string() : std::string(bound.substr(slash + 1))};
}

S3Volume::Location S3Volume::Locate(const VFolderId& vfid, std::string_view relpath) const {
  if (auto b = BoundTo(vfid))
    return {b->bucket.empty() ? opts_.bucket : b->bucket, b->prefix + std::string(relpath)};
  return {opts_.bucket, LayoutKey(vfid, relpath)};
}

std::string S3Volume::LayoutKey(const VFolderId& vfid, std::string_view relpath) const {
  const std::string& h = vfid.hex;
  std::string key = opts_.prefix;
  if (vfid.scope) key += vfid.scope->hex + "/";
  key += fmt::format("{}/{}/{}/", h.substr(0, 2), h.substr(2, 2), h.substr(4));
  key.append(relpath);
  return key;
}

std::string S3Volume::VFolderPath(const VFolderId& vfid) const {
  Location at = Locate(vfid, "");
  if (!at.key.empty()) at.key.pop_back();
  return fmt::format("s3://{}/{}", at.bucket, at.key);
}

Result<std::vector<std::string>> S3Volume::Parts(std::string_view relpath) const {
  return SplitRelPath(relpath);
}

Status S3Volume::Writable() const {
  if (opts_.read_only)
    return Status(Code::kPermissionDenied, fmt::format("volume {} is read-only", cfg_.name));
  return Status::Ok();
}

Status S3Volume::WritableVFolder(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Writable());
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  if (auto b = BoundTo(vfid))
    return Status(
        Code::kPermissionDenied,
        fmt::format("vfolder {} is {} bound read-only", vfid.ToString(), VFolderPath(vfid)), EROFS);
  return Status::Ok();
}

void S3Volume::NoteRecord(const VFolderId& vfid, const nlohmann::json& j) {
  const bool bound = j.contains("bound") && j["bound"].is_string();
  bool full = false;
  {
    std::lock_guard lk(bound_mu_);
    if (!bound) {
      bound_.erase(vfid.ToString());
      return;
    }
    full = bound_.size() > 100000;
    if (full) bound_.clear();
    bound_[vfid.ToString()] = ParseBinding(j["bound"].get<std::string>());
  }
  if (full) {  // the vfolders seen live must be asked again: their bindings are forgotten
    std::lock_guard lk(mu_);
    live_.clear();
  }
}

Status S3Volume::Live(const VFolderId& vfid) {
  const std::string key = VFolderRecord(*origin_, vfid);
  const auto now = std::chrono::steady_clock::now();
  uint64_t detaches;
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(key);
    if (it != live_.end() && it->second > now) return Status::Ok();
    detaches = detaches_;
  }
  // The record, not just its existence: a bound vfolder's names its prefix.
  SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(key));
  if (!rec) return MissingVFolder(vfid, cfg_.name);
  NoteRecord(vfid, rec->first);  // before it is marked live: a binding is known by then
  std::lock_guard lk(mu_);
  // A detach on this node while the record was read: this call saw it live, but the next
  // asks the origin again.
  if (detaches != detaches_) return Status::Ok();
  if (live_.size() > 100000) live_.clear();
  live_[key] = now + opts_.vfolder_ttl;
  return Status::Ok();
}

Status S3Volume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                               std::optional<uint64_t> initial_limit) {
  if (mode & ~07777u)
    return Status(Code::kInvalidArgument, fmt::format("mode {:o} is not a permission mode", mode));
  SLUICE_RETURN_IF_ERROR(Writable());
  if (vfid.scope) {
    SLUICE_ASSIGN_OR_RETURN(auto scope, origin_->HeadOpt(ScopeRecord(*origin_, *vfid.scope)));
    if (!scope) {
      if (!auto_scope) return MissingQuotaScope(*vfid.scope, cfg_.name);
      Status s = quota_->CreateScope(*vfid.scope, initial_limit);
      if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
    }
  }
  const std::string key = VFolderRecord(*origin_, vfid);
  SLUICE_ASSIGN_OR_RETURN(auto there, origin_->HeadOpt(key));
  if (there)
    return Status(Code::kAlreadyExists,
                  fmt::format("vfolder {} already exists on volume {}", vfid.ToString(), cfg_.name),
                  EEXIST);
  // The same id deleted within trash-grace: what its deletion has yet to remove (a second
  // pass) goes now, before the new vfolder holds anything that pass would take.
  const std::string data = LayoutKey(vfid, "");
  const std::string trash = S3FsOp::TrashRecord(*origin_, data);
  SLUICE_ASSIGN_OR_RETURN(auto trashed, origin_->HeadOpt(trash));
  if (trashed) {
    SLUICE_RETURN_IF_ERROR(origin_->DeletePrefix(data));
    SLUICE_RETURN_IF_ERROR(origin_->DeleteKey(trash));
  }
  SLUICE_RETURN_IF_ERROR(origin_->PutRecord(key, {{"mode", mode}}));
  usage_->Set(VFolderPath(vfid), TreeUsage{});
  std::lock_guard lk(mu_);
  live_[key] = std::chrono::steady_clock::now() + opts_.vfolder_ttl;
  return Status::Ok();
}

Result<std::string> S3Volume::DetachVFolder(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Writable());
  const std::string key = VFolderRecord(*origin_, vfid);
  SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(key));
  if (!rec) return MissingVFolder(vfid, cfg_.name);
  if (const auto& j = rec->first; j.contains("bound")) {
    // A binding: its record goes, the data it named stays where it was. What is left to
    // delete is the vfolder's own prefix, which a bound vfolder never writes to.
    std::string own = LayoutKey(vfid, "");
    own.pop_back();
    const std::string path = fmt::format("s3://{}/{}", opts_.bucket, own);
    SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key)));
    {
      std::lock_guard lk(mu_);
      live_.erase(key);
      ++detaches_;
    }
    usage_->Forget(VFolderPath(vfid));
    std::lock_guard lk(bound_mu_);
    bound_.erase(vfid.ToString());
    return path;
  }
  // The trash record first (what EmptyTrash finishes after a crash), then the vfolder's: the
  // vfolder is gone for every node once its record is (within vfolder-ttl for those that saw
  // it).
  const std::string data = LayoutKey(vfid, "");
  SLUICE_RETURN_IF_ERROR(
      origin_->PutRecord(S3FsOp::TrashRecord(*origin_, data), {{"delete", data}}));
  SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key)));
  {
    std::lock_guard lk(mu_);
    live_.erase(key);
    ++detaches_;
  }
  // Its keys count in the scope until they are deleted in the background: measured again.
  usage_->Forget(VFolderPath(vfid));
  if (vfid.scope) usage_->Forget(quota_->ScopePath(*vfid.scope));
  return VFolderPath(vfid);
}

Status S3Volume::CheckVFolder(const VFolderId& vfid) {
  return Live(vfid);
}

Status S3Volume::BindVFolder(const VFolderId& vfid, const std::string& what) {
  SLUICE_RETURN_IF_ERROR(Writable());
  const std::string records = origin_->RecordKey("");
  auto bad = [&](std::string_view why) {
    return Status(Code::kInvalidArgument, fmt::format("prefix '{}': {}", what, why));
  };
  // "s3://BUCKET[/PREFIX/]": another bucket of the origin, whole or in part.
  Binding asked = ParseBinding(what);
  std::string &bucket = asked.bucket, &prefix = asked.prefix;
  if (!bucket.empty()) {
    const bool name_ok =
        bucket.size() >= 3 && bucket.size() <= 63 &&
        std::all_of(bucket.begin(), bucket.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
        });
    if (!name_ok)
      return bad(
          "names no bucket (s3://BUCKET[/PREFIX/], a bucket of 3 to 63 "
          "lower-case letters, digits, '-' and '.')");
    if (bucket == opts_.bucket) bucket.clear();  // the volume's own: its rules below
  }
  const bool other = !bucket.empty();
  if ((!other && prefix.empty()) || (!prefix.empty() && prefix.back() != '/') ||
      prefix.starts_with('/'))
    return bad(other ? "must be a directory of keys: ending in '/', not starting with it"
                     : "must name a directory of keys: not empty, ending in '/', not starting "
                       "with it (s3://BUCKET/ binds another bucket whole)");
  if (prefix.size() > 1024 || prefix.find("//") != std::string::npos ||
      prefix.find('\0') != std::string::npos)
    return bad("is not a key prefix (over 1024 bytes, an empty component or a NUL)");
  if (!other && (prefix.starts_with(records) || records.starts_with(prefix)))
    return bad(fmt::format("holds or is inside this volume's records ({})", records));
  // Nor the vfolders' own keys: another tenant's data is never bound.
  if (other) {
    // Another bucket holds no vfolder of this volume.
  } else if (!opts_.prefix.empty()) {
    if (prefix.starts_with(opts_.prefix) || opts_.prefix.starts_with(prefix))
      return bad(fmt::format("overlaps this volume's vfolders ({})", opts_.prefix));
  } else {
    const std::string first = prefix.substr(0, prefix.find('/'));
    auto hex = [](const std::string& c) {
      return std::all_of(c.begin(), c.end(), [](char ch) { return std::isxdigit(ch) != 0; });
    };
    if ((first.size() == 32 || first.size() == 2) && hex(first))
      return bad("overlaps this volume's vfolders (a scope or vfolder directory at the root)");
  }
  SLUICE_ASSIGN_OR_RETURN(bool data, origin_->HasChildren(prefix, bucket));
  if (!data)
    return Status(Code::kNotFound,
                  fmt::format("there is nothing under s3://{}/{}", origin_->Bucket(bucket), prefix),
                  ENOENT);
  const std::string key = VFolderRecord(*origin_, vfid);
  SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(key));
  if (rec) {
    if (rec->first.contains("bound"))
      return Status(Code::kAlreadyExists,
                    fmt::format("vfolder {} is bound already", vfid.ToString()), EEXIST);
    SLUICE_ASSIGN_OR_RETURN(bool used, origin_->HasChildren(LayoutKey(vfid, "")));
    SLUICE_ASSIGN_OR_RETURN(bool uploading, origin_->HasChildren(StagingKey(vfid, "")));
    if (used || uploading)
      return Status(Code::kConflict,
                    fmt::format("vfolder {} holds files or uploads: only a new or empty "
                                "vfolder is bound",
                                vfid.ToString()),
                    ENOTEMPTY);
  } else {
    SLUICE_RETURN_IF_ERROR(CreateVFolder(vfid, 0555, true, std::nullopt));
  }
  const std::string bound = other ? fmt::format("s3://{}/{}", bucket, prefix) : prefix;
  SLUICE_RETURN_IF_ERROR(origin_->PutRecord(key, {{"mode", 0555}, {"bound", bound}}));
  {
    std::lock_guard lk(bound_mu_);
    bound_[vfid.ToString()] = Binding{bucket, prefix};
  }
  std::lock_guard lk(mu_);
  live_[key] = std::chrono::steady_clock::now() + opts_.vfolder_ttl;
  return Status::Ok();
}

Result<TreeUsage> S3Volume::Measure(const std::string& path) {
  // "s3://BUCKET/KEY": a vfolder's path (VFolderPath) or a scope's (ScopePath).
  constexpr std::string_view kScheme = "s3://";
  const size_t slash = path.find('/', kScheme.size());
  if (!path.starts_with(kScheme) || slash == std::string::npos)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not an s3:// path", path));
  const std::string bucket = path.substr(kScheme.size(), slash - kScheme.size());
  std::string root = path.substr(slash + 1);
  if (!root.empty() && root.back() != '/') root += '/';
  return origin_->MeasureTree(root, bucket == opts_.bucket ? std::string_view() : bucket);
}

// Maintained: measured by a listing once, then kept current by this node's writes and
// re-measured in the background (and on every read while a listing is fast: small trees).
Result<TreeUsage> S3Volume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  return usage_->Get(VFolderPath(vfid));
}

Result<TreeUsage> S3Volume::GetFreshUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  return usage_->Reconcile(VFolderPath(vfid));
}

void S3Volume::Account(const VFolderId& vfid, int64_t bytes, int64_t entries) {
  usage_->Add(VFolderPath(vfid), bytes, entries);
  if (vfid.scope) usage_->Add(quota_->ScopePath(*vfid.scope), bytes, entries);
}

Result<uint64_t> S3Volume::GetUsedBytes(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(auto u, GetUsage(vfid));
  return u.used_bytes;
}

Result<FsUsage> S3Volume::GetFsUsage() {
  // An origin has no size to report: the configured capacity, nothing measured as used.
  FsUsage f;
  f.capacity_bytes = opts_.capacity;
  f.available_bytes = opts_.capacity;
  return f;
}

HwInfo S3Volume::GetHwInfo() {
  HwInfo h;
  h.metadata = {{"endpoint", opts_.client.endpoint},
                {"bucket", opts_.bucket},
                {"prefix", opts_.prefix},
                {"read-only", opts_.read_only ? "true" : "false"}};
  // The transport's figures (also in /metrics), for operators without Prometheus.
  const auto t = origin_->opts.client.transport->stats();
  h.metadata["origin-requests-running"] = std::to_string(t.running);
  h.metadata["origin-requests-queued"] = std::to_string(t.queued);
  h.metadata["origin-connections-opened"] = std::to_string(t.connects);
  h.metadata["origin-max-connections"] = std::to_string(opts_.max_connections);
  std::lock_guard lk(origin_->mu);
  // Degraded, not unavailable: the node still serves its other volumes, and what a cache in
  // front of this one holds; a probe must not take it out of a load balancer for an origin.
  if (!origin_->last_error.empty()) {
    h.status = "degraded";
    h.status_info = origin_->last_error;
  }
  return h;
}

Result<std::string> S3Volume::MountPath(const VFolderId&, std::string_view) {
  return Status(Code::kUnsupported,
                fmt::format("volume {} keeps its data in an S3 origin: there is no path to mount "
                            "(read it through Sluice's APIs)",
                            cfg_.name));
}

Status S3Volume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                 const TreeUsage& size) {
  SLUICE_RETURN_IF_ERROR(Writable());
  SLUICE_RETURN_IF_ERROR(WritableVFolder(dst));
  Status copied = CopyTreeIn(from, src, dst);
  // What was copied counts, also in part: the figure may run high until it is measured again,
  // never low.
  Account(dst, static_cast<int64_t>(size.used_bytes), static_cast<int64_t>(size.file_count));
  return copied;
}

Status S3Volume::CopyTreeIn(Volume& from, const VFolderId& src, const VFolderId& dst) {
  if (&ForwardingVolume::Innermost(from) == this) {
    SLUICE_RETURN_IF_ERROR(Live(src));  // a bound vfolder copies into a writable one
    const Location from = Locate(src, "");
    return origin_->CopyPrefix(from.key, LayoutKey(dst, ""), true, from.bucket, nullptr,
                               /*named_only=*/true);
  }
  // From another volume: every directory as a marker, every file uploaded (8 at a time).
  std::vector<std::string> dirs;
  std::vector<std::string> files;
  uint64_t skipped = 0;
  SLUICE_ASSIGN_OR_RETURN(auto root, from.OpenDir(src, ""));
  SLUICE_RETURN_IF_ERROR(WalkVFolderTree(
      *root, "", true, [&](const std::string& rel, const DirHandle::Name& n, DirHandle&) {
        if (n.type == EntryType::kDirectory)
          dirs.push_back(rel);
        else if (n.type == EntryType::kFile)
          files.push_back(rel);
        else
          skipped++;  // symbolic links and the like: an origin has no such thing
        return Status::Ok();
      }));
  if (skipped)
    spdlog::warn("volume {}: copying {} from {}: {} entries neither files nor directories left out",
                 cfg_.name, src.ToString(), from.name(), skipped);
  SLUICE_RETURN_IF_ERROR(Origin::ParallelFor(dirs.size(), 16, [&](size_t i) {
    return origin_->PutMarker(LayoutKey(dst, dirs[i]) + "/");
  }));
  return Origin::ParallelFor(files.size(), 8, [&](size_t i) {
    return CopyFileIn(from, src, files[i], LayoutKey(dst, files[i]));
  });
}

Status S3Volume::CopyFileIn(Volume& from, const VFolderId& src, const std::string& rel,
                            const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(auto r, from.OpenReader(src, rel));
  s3c::UserMeta user;
  if (auto blob = r->ReadMeta(); blob.ok() && !blob->empty() && blob->size() <= kMaxMetaBlob) {
    user[kObjectMeta] = Base64Encode(*blob);
    user[kMtimeMeta] = std::to_string(
        std::chrono::duration_cast<std::chrono::nanoseconds>(r->info().modified.time_since_epoch())
            .count());
  }
  auto& o = *origin_;
  const uint64_t size = r->size();
  const int fd = r->native_fd();  // a local file is sent from its descriptor
  std::string buf;
  auto body = [&](uint64_t off, uint64_t len) -> Result<s3c::Body> {
    if (fd >= 0) return s3c::Body{{}, fd, off, len};
    buf.resize(static_cast<size_t>(len));
    for (size_t got = 0; got < buf.size();) {
      SLUICE_ASSIGN_OR_RETURN(size_t k, r->ReadAt(off + got, buf.data() + got, buf.size() - got));
      if (k == 0)
        return Status(Code::kConflict, fmt::format("'{}' shrank while being copied", rel));
      got += k;
    }
    return s3c::Body{buf};
  };
  if (size <= opts_.part_size) {
    SLUICE_ASSIGN_OR_RETURN(auto b, body(0, size));
    return o.Note(o.Client()->Put(o.bucket(), key, b, {}, user)).status();
  }
  // Parts of part-size, or larger where 10,000 of them would not hold the file.
  const uint64_t part =
      std::max(opts_.part_size, (size + s3c::kMaxParts - 1) / s3c::kMaxParts + 4095) / 4096 * 4096;
  SLUICE_ASSIGN_OR_RETURN(std::string id,
                          o.Note(o.Client()->CreateMultipart(o.bucket(), key, {}, user)));
  auto abort = [&](Status st) {
    (void)o.Client()->AbortMultipart(o.bucket(), key, id);
    return st;
  };
  std::vector<s3c::PartInfo> parts;
  for (uint64_t off = 0; off < size; off += part) {
    const uint64_t len = std::min(part, size - off);
    auto b = body(off, len);
    if (!b.ok()) return abort(b.status());
    std::string crc;
    auto etag = o.Note(
        o.Client()->UploadPart(o.bucket(), key, id, static_cast<int>(parts.size() + 1), *b, &crc));
    if (!etag.ok()) return abort(etag.status());
    parts.push_back({static_cast<int>(parts.size() + 1), len, *etag, crc});
  }
  if (Status done = o.CompleteUpload(key, id, parts); !done.ok()) return abort(done);
  return Status::Ok();
}

Status S3Volume::ValidatePath(const VFolderId&, std::string_view relpath) {
  return Parts(relpath).status();
}

Result<DirEntry> S3Volume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  const std::string rel = Join(parts, parts.size());
  if (parts.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(VFolderRecord(*origin_, vfid)));
    if (!rec) return MissingVFolder(vfid, cfg_.name);
    NoteRecord(vfid, rec->first);
    uint32_t perm = 0755;
    if (const auto& j = rec->first; j.contains("mode") && j["mode"].is_number_unsigned())
      perm = j["mode"].get<uint32_t>() & 07777;
    return DirEntryOf("", perm, rec->second.mtime);
  }
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  const auto [in, key] = Locate(vfid, rel);
  SLUICE_ASSIGN_OR_RETURN(auto f, origin_->HeadOpt(key, in));
  if (f) return FileEntry(parts.back(), *f);
  SLUICE_ASSIGN_OR_RETURN(auto marker, origin_->HeadOpt(key + "/", in));
  if (marker) return DirEntryOf(parts.back(), 0755, marker->mtime);
  SLUICE_ASSIGN_OR_RETURN(bool children, origin_->HasChildren(key + "/", in));
  if (children) return DirEntryOf(parts.back());
  return Status(Code::kNotFound, fmt::format("'{}' does not exist", rel), ENOENT);
}

Result<std::string> S3Volume::ObjectMetaOf(const VFolderId& vfid, const std::string& rel) {
  const Location at = Locate(vfid, rel);
  SLUICE_ASSIGN_OR_RETURN(auto o, origin_->HeadOpt(at.key, at.bucket));
  return o ? MetaOf(*o) : std::string();
}

Result<std::shared_ptr<FileReader>> S3Volume::OpenReader(const VFolderId& vfid,
                                                         std::string_view relpath, Lookup lookup,
                                                         const LookupHint*) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  if (lookup == Lookup::kCachedOnly)
    return Status(Code::kUnavailable, "an s3 volume's files are on the origin", EAGAIN);
  if (parts.empty())
    return Status(Code::kInvalidArgument, "the vfolder root is a directory", EISDIR);
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  const std::string rel = Join(parts, parts.size());
  const auto [in, key] = Locate(vfid, rel);
  // One ranged GET answers the attributes and the first bytes (all of a small file).
  std::string head;
  auto got = origin_->Note(origin_->Client()->Get(
      in, key,
      [&](std::string_view p) {
        head.append(p.substr(0, kReadWholeBelow - std::min<size_t>(head.size(), kReadWholeBelow)));
        return Status::Ok();
      },
      std::make_pair(uint64_t{0}, kReadWholeBelow)));
  if (!got.ok() && got.status().code() == Code::kInvalidArgument) {
    // An empty object has no byte 0 to range over (416): its HEAD says so. (Not after other
    // failures: an origin that is down or refuses the credentials says nothing more to a HEAD,
    // whose answer has no body to tell why.)
    auto h = origin_->HeadOpt(key, in);
    if (h.ok() && *h && (*h)->size == 0) got = Result<s3c::ObjectInfo>(**h);
  }
  if (got.ok())
    return std::shared_ptr<FileReader>(std::make_shared<S3Reader>(
        origin_, in, key, FileEntry(parts.back(), *got), std::move(head), MetaOf(*got)));
  if (!IsNotFound(got.status())) return got.status();
  auto dir = Stat(vfid, rel);
  if (dir.ok() && dir->type == EntryType::kDirectory)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is a directory", rel), EISDIR);
  return Status(Code::kNotFound, fmt::format("'{}' does not exist", rel), ENOENT);
}

Result<std::pair<S3Volume::Level, S3Volume::Location>> S3Volume::LocateDir(
    const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  Level l;
  l.rel = Join(parts, parts.size());
  SLUICE_ASSIGN_OR_RETURN(l.info, Stat(vfid, l.rel));
  Location at = Locate(vfid, l.rel);
  if (l.info.type != EntryType::kDirectory) {
    // A key that is also a prefix (a foreign bucket's "x" beside "x/y") is listed as a
    // directory (ListLevel), so it is walked as one.
    SLUICE_ASSIGN_OR_RETURN(bool children, origin_->HasChildren(at.key + "/", at.bucket));
    if (!children)
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", l.rel), ENOTDIR);
    l.info = DirEntryOf(parts.back());
  }
  if (!l.rel.empty()) at.key += '/';
  return std::pair{std::move(l), std::move(at)};
}

Result<S3Volume::Level> S3Volume::ReadLevel(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto d, LocateDir(vfid, relpath));
  SLUICE_ASSIGN_OR_RETURN(d.first.entries, origin_->ListLevel(d.second.key, d.second.bucket));
  return std::move(d.first);
}

Result<std::unique_ptr<DirHandle>> S3Volume::OpenDir(const VFolderId& vfid,
                                                     std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(Level l, ReadLevel(vfid, relpath));
  auto shared = std::make_shared<const Level>(std::move(l));
  return std::unique_ptr<DirHandle>(new S3Dir(this, vfid, shared->rel, shared));
}

Result<std::unique_ptr<DirHandle>> S3Volume::OpenDirFrom(const VFolderId& vfid,
                                                         std::string_view relpath,
                                                         const ListFrom& from) {
  SLUICE_ASSIGN_OR_RETURN(auto d, LocateDir(vfid, relpath));
  return std::unique_ptr<DirHandle>(new S3OrderedDir(this, origin_, vfid, std::move(d.first.rel),
                                                     std::move(d.first.info), std::move(d.second),
                                                     from));
}

Result<std::vector<DirEntry>> S3Volume::ListSorted(const VFolderId& vfid, std::string_view relpath,
                                                   std::string_view start_after, size_t max) {
  // The whole level, then the page: the origin's order is not the names' order (see ListLevel).
  SLUICE_ASSIGN_OR_RETURN(Level l, ReadLevel(vfid, relpath));
  std::vector<DirEntry> page;
  for (auto& e : l.entries) {
    if (page.size() >= max) break;
    if (e.name > start_after) page.push_back(std::move(e));
  }
  return page;
}

Status S3Volume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                       bool exist_ok) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  if (parts.empty()) return Status(Code::kAlreadyExists, "the vfolder root already exists");
  SLUICE_RETURN_IF_ERROR(WritableVFolder(vfid));
  // Every directory made gets its marker, so that it outlives what is put in it, as on a file
  // system.
  std::vector<std::string> make;
  for (size_t i = 1; i <= parts.size(); ++i) {
    const std::string here = Join(parts, i);
    auto e = Stat(vfid, here);
    if (e.ok()) {
      if (e->type != EntryType::kDirectory)
        return Status(Code::kAlreadyExists, fmt::format("'{}' exists and is not a directory", here),
                      EEXIST);
      if (i == parts.size() && !exist_ok)
        return Status(Code::kAlreadyExists, fmt::format("'{}' already exists", here), EEXIST);
      continue;
    }
    if (!IsNotFound(e.status())) return e.status();
    if (i < parts.size() && !parents)
      return Status(Code::kNotFound, fmt::format("'{}' does not exist", here), ENOENT);
    make.push_back(LayoutKey(vfid, here) + "/");
  }
  for (const auto& m : make) {
    SLUICE_RETURN_IF_ERROR(origin_->PutMarker(m));
    Account(vfid, 0, 1);
  }
  return Status::Ok();
}

// The parent of `parts` keeps existing once it goes (a marker where it had none), as a
// directory does on a file system.
Status S3Volume::KeepParent(const VFolderId& vfid, const std::vector<std::string>& parts) {
  if (parts.size() < 2) return Status::Ok();
  const std::string parent = LayoutKey(vfid, Join(parts, parts.size() - 1)) + "/";
  SLUICE_ASSIGN_OR_RETURN(auto pm, origin_->HeadOpt(parent));
  return pm ? Status::Ok() : origin_->PutMarker(parent);
}

Status S3Volume::MoveEntry(const VFolderId& vfid, const std::vector<std::string>& src,
                           const std::vector<std::string>& dst) {
  const std::string from = Join(src, src.size());
  SLUICE_ASSIGN_OR_RETURN(DirEntry e, Stat(vfid, from));
  SLUICE_RETURN_IF_ERROR(KeepParent(vfid, src));
  const std::string skey = LayoutKey(vfid, from);
  const std::string dkey = LayoutKey(vfid, Join(dst, dst.size()));
  if (e.type != EntryType::kDirectory) {
    // The version stat'ed is the one copied, and the one deleted: a source written again
    // meanwhile is kept (the copy holds the version before), not lost.
    const std::string pinned =
        e.etag.size() >= 2 ? e.etag.substr(1, e.etag.size() - 2) : std::string();
    SLUICE_RETURN_IF_ERROR(origin_->CopyObject({}, skey, dkey, e.size, nullptr, nullptr, pinned));
    if (!pinned.empty()) {
      SLUICE_ASSIGN_OR_RETURN(auto now, origin_->HeadOpt(skey));
      if (now && now->etag != pinned) {
        Account(vfid, static_cast<int64_t>(e.size), 1);
        return Status(Code::kConflict,
                      fmt::format("'{}' was written while it was moved: it is kept, and the "
                                  "destination holds the version before",
                                  from));
      }
    }
    Status st = origin_->Note(origin_->Client()->Delete(opts_.bucket, skey));
    // Both are there now: the copy counts.
    if (!st.ok()) Account(vfid, static_cast<int64_t>(e.size), 1);
    return st;
  }
  // A directory: every key copied, then the keys copied deleted (not atomic: a crash in
  // between leaves both, never neither). Only those: a key written below the source meanwhile
  // stays there rather than go uncopied. Stopped part way, it leaves some keys twice: how
  // many is not known here, so the usage figures are measured again.
  std::vector<std::string> copied;
  Status st = origin_->CopyPrefix(skey + "/", dkey + "/", false, {}, &copied);
  if (st.ok()) {
    auto marker = origin_->HeadOpt(dkey + "/");
    st = !marker.ok() ? marker.status() : *marker ? Status::Ok() : origin_->PutMarker(dkey + "/");
  }
  if (st.ok()) st = origin_->DeleteKeys(copied);
  if (!st.ok()) {
    usage_->Remeasure(VFolderPath(vfid));
    if (vfid.scope) usage_->Remeasure(quota_->ScopePath(*vfid.scope));
  }
  return st;
}

Status S3Volume::Rename(const VFolderId& vfid, std::string_view relpath,
                        std::string_view new_name) {
  SLUICE_RETURN_IF_ERROR(ValidateName(new_name));
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be renamed");
  std::vector<std::string> to = parts;
  to.back() = std::string(new_name);
  // A rename never moves into a directory of the new name, as Move does: the name is taken
  // (its own name too, as renameat2's RENAME_NOREPLACE says on a file system).
  if (Stat(vfid, Join(to, to.size())).ok())
    return Status::FromErrno(EEXIST, fmt::format("rename '{}' to '{}'", relpath, new_name));
  return Move(vfid, relpath, Join(to, to.size()));
}

Status S3Volume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  SLUICE_ASSIGN_OR_RETURN(auto sp, Parts(src));
  SLUICE_ASSIGN_OR_RETURN(auto dp, Parts(dst));
  if (sp.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be moved");
  // Not onto itself, nor into itself.
  if (dp.size() >= sp.size() && std::equal(sp.begin(), sp.end(), dp.begin()))
    return Status(Code::kInvalidArgument, "a directory cannot move into itself", EINVAL);
  SLUICE_RETURN_IF_ERROR(WritableVFolder(vfid));
  SLUICE_RETURN_IF_ERROR(Stat(vfid, Join(sp, sp.size())).status());
  // Moving onto an existing directory moves into it, as mv does.
  std::vector<std::string> to = dp;
  auto target = Stat(vfid, Join(dp, dp.size()));
  if (target.ok() && target->type == EntryType::kDirectory) {
    to.push_back(sp.back());
  } else {
    if (dp.empty()) return Status(Code::kInvalidPath, "the destination is the vfolder root");
    if (dp.size() > 1) {
      SLUICE_ASSIGN_OR_RETURN(DirEntry parent, Stat(vfid, Join(dp, dp.size() - 1)));
      if (parent.type != EntryType::kDirectory)
        return Status(Code::kInvalidArgument, "the destination's parent is not a directory",
                      ENOTDIR);
    }
  }
  auto there = Stat(vfid, Join(to, to.size()));
  if (there.ok()) return Status::FromErrno(EEXIST, fmt::format("move '{}' to '{}'", src, dst));
  if (!IsNotFound(there.status())) return there.status();
  if (to.size() > sp.size() && std::equal(sp.begin(), sp.end(), to.begin()))
    return Status(Code::kInvalidArgument, "a directory cannot move into itself", EINVAL);
  return MoveEntry(vfid, sp, to);
}

Status S3Volume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                             bool recursive) {
  std::vector<std::vector<std::string>> all;
  for (const auto& rel : relpaths) {
    SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(rel));
    if (parts.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be deleted");
    all.push_back(std::move(parts));
  }
  // Each path once, and none below another (a recursive delete takes it): a delete of the
  // origin's keys cannot say whether they were there, so a path deleted twice would leave
  // the usage figure short by its size twice, and a child deleted after its directory would
  // bring the directory's marker back (KeepParent).
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  if (recursive) {  // sorted, what lies below a path comes right after it
    std::vector<std::vector<std::string>> top;
    for (auto& p : all)
      if (top.empty() || top.back().size() >= p.size() ||
          !std::equal(top.back().begin(), top.back().end(), p.begin()))
        top.push_back(std::move(p));
    all = std::move(top);
  }
  SLUICE_RETURN_IF_ERROR(WritableVFolder(vfid));
  std::vector<DirEntry> what;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string rel = Join(all[i], all[i].size());
    auto e = Stat(vfid, rel);
    if (!e.ok()) {
      if (IsNotFound(e.status()))
        return Status(Code::kNotFound, fmt::format("delete '{}': does not exist", rel), ENOENT);
      return e.status();
    }
    if (e->type == EntryType::kDirectory && !recursive) {
      // (Writable: never bound, its own layout.)
      SLUICE_ASSIGN_OR_RETURN(bool children, origin_->HasChildren(LayoutKey(vfid, rel) + "/"));
      if (children)
        return Status(
            Code::kNotEmpty,
            fmt::format("directory '{}' is not empty; pass recursive=true to delete it", rel),
            ENOTEMPTY);
    }
    what.push_back(std::move(e).value());
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& parts = all[i];
    SLUICE_RETURN_IF_ERROR(KeepParent(vfid, parts));
    const std::string key = LayoutKey(vfid, Join(parts, parts.size()));
    if (what[i].type == EntryType::kDirectory && !recursive) {
      // Found empty above: its marker alone. (Listing again and deleting what is below, as a
      // recursive delete does, would take a key written there since, where rmdir would fail.)
      SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key + "/")));
      Account(vfid, 0, -1);
    } else if (what[i].type == EntryType::kDirectory) {
      // Its bytes are known from the listing that deleted them; the entries below it (some
      // only implied by keys) are left to the next measure.
      uint64_t bytes = 0;
      SLUICE_RETURN_IF_ERROR(origin_->DeletePrefix(key + "/", &bytes));
      Account(vfid, -static_cast<int64_t>(bytes), -1);
    } else {
      SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key)));
      Account(vfid, -static_cast<int64_t>(what[i].size), -1);
    }
  }
  return Status::Ok();
}

// ---- uploads: staging as an origin multipart upload (docs/s3-volumes.md)
//
// A session is a record (JSON: the multipart upload's id, the parts sent, the durable offset),
// the parts themselves (fixed size, so part N always holds the same bytes) and a tail object
// with the durable bytes past the last part. Sync sends the full parts below the offset, then
// the tail, then the record; what came after the last record never counts. Commit completes
// the upload into a staging object and copies it onto the target server-side.

namespace {

// A session's record lists its parts: 10,000 of them take about 1 MB. (Before 2026-12-05 every
// record was read up to 64 KiB, and a session of more than about 745 parts, 11.6 GiB in 16 MiB
// parts, could no longer be resumed, inspected or swept.)
constexpr size_t kMaxSessionRecord = 4 << 20;

struct SessionRecord {
  std::string vfid, upload;
  std::vector<s3c::PartInfo> parts;
  uint64_t durable = 0;
  bool quota_checked = false, staged = true, recorded = false;
  // The tail (the durable bytes past the parts) is "<record>.tail.<where it starts>": a Sync
  // that sent parts writes its tail under a new key, so the one this record names stays as it
  // was should the record not land. (Sessions begun before: "<record>.tail".)
  bool tail_keyed = false;

  uint64_t parts_bytes() const {
    uint64_t n = 0;
    for (const auto& p : parts) n += p.size;
    return n;
  }
  std::string TailKey(const std::string& record) const {
    return tail_keyed ? fmt::format("{}.tail.{}", record, parts_bytes()) : record + ".tail";
  }
  nlohmann::json ToJson() const {
    nlohmann::json ps = nlohmann::json::array();
    for (const auto& p : parts)
      ps.push_back({{"n", p.number}, {"etag", p.etag}, {"size", p.size}, {"crc32c", p.crc32c}});
    return {{"vfid", vfid},
            {"upload", upload},
            {"parts", ps},
            {"durable", durable},
            {"quota_checked", quota_checked},
            {"staged", staged},
            {"recorded", recorded},
            {"tail_keyed", tail_keyed}};
  }
  static Result<SessionRecord> FromJson(const nlohmann::json& j) {
    SessionRecord r;
    try {
      r.vfid = j.at("vfid").get<std::string>();
      r.upload = j.at("upload").get<std::string>();
      r.durable = j.at("durable").get<uint64_t>();
      r.quota_checked = j.at("quota_checked").get<bool>();
      r.staged = j.at("staged").get<bool>();
      r.recorded = j.at("recorded").get<bool>();
      r.tail_keyed = j.value("tail_keyed", false);
      for (const auto& p : j.at("parts"))
        r.parts.push_back({p.at("n").get<int>(), p.at("size").get<uint64_t>(),
                           p.at("etag").get<std::string>(), p.value("crc32c", std::string())});
    } catch (const nlohmann::json::exception& e) {
      return Status(Code::kIoError, fmt::format("an upload record is malformed: {}", e.what()));
    }
    return r;
  }
};

}  // namespace

std::string S3Volume::StagingKey(const VFolderId& vfid, std::string_view session) const {
  return origin_->RecordKey(
      fmt::format("staging/{}/{}/{}", vfid.scope ? vfid.scope->hex : "legacy", vfid.hex, session));
}

class S3Volume::Writer : public StagingWriter {
 public:
  // `held`: the session's lease, held (renewed) since it was taken.
  Writer(S3Volume* v, VFolderId vfid, std::string session, std::shared_ptr<HeldLease> held,
         SessionRecord rec, std::string tail)
      : v_(v),
        vfid_(std::move(vfid)),
        session_(std::move(session)),
        key_(v_->StagingKey(vfid_, session_)),
        held_(std::move(held)),
        rec_(std::move(rec)),
        buf_(std::move(tail)) {
    state_ = {true, rec_.recorded, rec_.durable, rec_.quota_checked, rec_.durable};
  }
  ~Writer() override {
    copies_.clear();  // waits for copies in flight: none outlives the session's lock
    v_->Unhold(held_);
    v_->Unlock(session_);
  }
  const StagingState& state() const override { return state_; }

  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    *written = 0;
    SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));  // a request, once a third of its time is up
    const uint64_t base = Base();
    if (offset < base || offset > base + buf_.size())
      return Status(Code::kInvalidArgument,
                    fmt::format("upload {}: a write at {} (bytes {} to {} may be written)",
                                session_, offset, base, base + buf_.size()));
    const size_t at = static_cast<size_t>(offset - base);
    if (buf_.size() < at + n) buf_.resize(at + n);
    std::memcpy(buf_.data() + at, data, n);
    *written = n;
    // Memory stays near two parts whatever the syncs: full parts go out ahead of them (they
    // count once a sync records them).
    const uint64_t part = v_->opts_.part_size;
    while (buf_.size() >= 2 * part) SLUICE_RETURN_IF_ERROR(SendFront(part));
    return Status::Ok();
  }

  uint64_t SyncGranule() const override { return v_->opts_.part_size; }
  std::optional<DirEntry> Landed() const override { return landed_; }

  bool CopiesOnOrigin(const FileReader& src) const override {
    if (v_->origin_->part_copy == Origin::Has::kNo) return false;  // (before a cache opens one)
    const OriginObject* o = src.origin_object();
    return o && o->origin == v_->origin_->identity;
  }
  // An object of this origin is copied by the origin (UploadPartCopy into the session's upload,
  // pinned to the version opened): a multipart Complete or a CopyObject sends no byte of it
  // through here. Parts but the last are at least S3's smallest, so what is buffered is topped
  // up to that and sent first, and a piece too short to be a part is read and written instead.
  Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at) override {
    if (!CopiesOnOrigin(src) || at != Base() + buf_.size())
      return StagingWriter::CopyFrom(src, src_offset, n, at);
    const OriginObject from = *src.origin_object();
    if (!buf_.empty()) {
      const uint64_t k = buf_.size() < kMinPart ? std::min(n, kMinPart - buf_.size()) : 0;
      SLUICE_RETURN_IF_ERROR(StagingWriter::CopyFrom(src, src_offset, k, at));
      src_offset += k;
      n -= k;
      if (n == 0) return Status::Ok();
      SLUICE_RETURN_IF_ERROR(SendFront(buf_.size()));
    }
    if (n < kMinPart) return StagingWriter::CopyFrom(src, src_offset, n, Base());
    // Pieces of max-copy-size; the remainder joins the last one rather than be a short part.
    const uint64_t piece = std::clamp(v_->opts_.max_copy_size, kMinPart, kMaxPart - kMinPart);
    while (n > 0) {
      const uint64_t len = n < piece + kMinPart ? n : piece;
      Status st = CopyPart(from, src_offset, len);
      // The origin has no UploadPartCopy (learned from this, its first): read and written.
      if (st.code() == Code::kUnsupported && v_->origin_->part_copy == Origin::Has::kNo)
        return StagingWriter::CopyFrom(src, src_offset, n, Base());
      SLUICE_RETURN_IF_ERROR(st);
      src_offset += len;
      n -= len;
    }
    return Status::Ok();
  }

  Status Sync(uint64_t offset, bool quota_checked) override {
    SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));
    const uint64_t base = Base();
    if (offset < std::max(rec_.durable, base) || offset > base + buf_.size())
      return Status(
          Code::kInvalidArgument,
          fmt::format("upload {}: cannot sync at {} (bytes {} to {} are written)", session_, offset,
                      std::max(rec_.durable, base), base + buf_.size()));
    // Full parts below the offset go to the origin's multipart upload, the rest as the tail.
    const uint64_t part = v_->opts_.part_size;
    while (buf_.size() >= part && Base() + part <= offset) SLUICE_RETURN_IF_ERROR(SendFront(part));
    SLUICE_RETURN_IF_ERROR(PutTail(offset - Base()));
    return Record(offset, quota_checked);
  }

  Status Rollback(uint64_t offset, bool quota_checked) override {
    const uint64_t base = Base();
    if (offset > rec_.durable)
      return Status(Code::kInvalidArgument,
                    fmt::format("upload {}: cannot roll back to {}, past the durable offset {}",
                                session_, offset, rec_.durable));
    if (offset < base)
      return Status(Code::kUnsupported,
                    fmt::format("upload {}: cannot cut at {}, inside parts already sent to the "
                                "origin (up to {})",
                                session_, offset, base));
    buf_.resize(static_cast<size_t>(offset - base));
    SLUICE_RETURN_IF_ERROR(PutTail(buf_.size()));
    return Record(offset, quota_checked);
  }

  Status Commit(const std::vector<std::string>& final_parts) override {
    return Publish(final_parts, nullptr, true);
  }

  // Origin writes are durable when answered: `durable` changes nothing.
  Status Publish(const std::vector<std::string>& final_parts,
                 const std::function<std::string(const DirEntry&)>& meta, bool) override {
    if (final_parts.empty()) return Status(Code::kInvalidPath, "an upload needs a file name");
    SLUICE_RETURN_IF_ERROR(v_->WritableVFolder(vfid_));  // bound read-only since it began?
    SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));
    const std::string rel = Join(final_parts, final_parts.size());
    // Nothing may stand in the way: a file where a directory goes, a directory at the target.
    for (size_t i = 1; i < final_parts.size(); ++i) {
      auto e = v_->Stat(vfid_, Join(final_parts, i));
      if (e.ok() && e->type != EntryType::kDirectory)
        return Status(Code::kConflict,
                      fmt::format("'{}' exists and is not a directory", Join(final_parts, i)),
                      ENOTDIR);
      if (!e.ok() && !IsNotFound(e.status())) return e.status();
    }
    auto there = v_->Stat(vfid_, rel);
    if (there.ok() && there->type == EntryType::kDirectory)
      return Status(Code::kConflict,
                    fmt::format("'{}' is a directory; the upload cannot replace it", rel), EISDIR);
    if (!there.ok() && !IsNotFound(there.status())) return there.status();
    auto& o = *v_->origin_;
    const std::string target = v_->LayoutKey(vfid_, rel);
    const uint64_t total = Base() + buf_.size();
    s3c::UserMeta user;
    if (meta) {
      DirEntry as;
      as.name = final_parts.back();
      as.type = EntryType::kFile;
      as.size = total;
      as.modified = as.changed = Clock::now();
      std::string blob = meta(as);
      if (blob.size() <= kMaxMetaBlob) {
        user[kObjectMeta] = Base64Encode(blob);
        user[kMtimeMeta] = std::to_string(
            std::chrono::duration_cast<std::chrono::nanoseconds>(as.modified.time_since_epoch())
                .count());
      } else {
        spdlog::info("volume {}: '{}' keeps no object metadata ({} bytes; the origin takes {})",
                     v_->cfg_.name, rel, blob.size(), kMaxMetaBlob);
      }
    }
    landed_.reset();
    std::string etag;  // the new object's, where the origin's answer names it
    if (rec_.parts.empty() && pending_.empty()) {  // one PUT
      SLUICE_ASSIGN_OR_RETURN(
          etag, o.Note(o.Client()->Put(o.bucket(), target, s3c::Body{buf_}, {}, user)));
      // A multipart upload begun for this session whose first part failed: nothing of it is
      // used, and the record about to be written no longer names it for a sweep.
      if (!rec_.upload.empty())
        (void)o.Note(o.Client()->AbortMultipart(o.bucket(), key_ + ".data", rec_.upload));
    } else {
      if (!buf_.empty()) {
        Status sent = SendFront(buf_.size());
        // A Publish retried after its copy onto the target failed: the last part went out
        // and the upload was completed into `.data`, but the record still names the tail (a
        // new writer, rebuilt from it, sends it again). The upload is gone; `.data` with every
        // byte is what it made.
        if (sent.code() == Code::kNotFound) {
          auto data = o.HeadOpt(key_ + ".data");
          if (data.ok() && *data && (*data)->size == total) data_complete_ = true;
        }
        if (!sent.ok() && !data_complete_) return sent;
      }
      SLUICE_RETURN_IF_ERROR(RunCopies());
      std::vector<s3c::PartInfo> all = rec_.parts;
      all.insert(all.end(), pending_.begin(), pending_.end());
      SLUICE_RETURN_IF_ERROR(CompleteData(all));
      // Server-side, onto the target (in parts past max-copy-size; see docs/s3-volumes.md).
      SLUICE_RETURN_IF_ERROR(o.CopyObject({}, key_ + ".data", target, total, &user, &etag));
    }
    if (!etag.empty()) {  // described as a Stat of it would be
      s3c::ObjectInfo made;
      made.key = target;
      made.size = total;
      made.etag = etag;
      made.meta = user;
      landed_ = FileEntry(final_parts.back(), made);
    }
    const bool had_data = !rec_.upload.empty();
    v_->Account(vfid_, static_cast<int64_t>(total) - (there.ok() ? int64_t(there->size) : 0),
                there.ok() ? 0 : 1);
    rec_.staged = false;  // the record stays: the session reads as complete
    rec_.parts.clear();
    pending_.clear();
    rec_.upload.clear();
    buf_.clear();
    Status recorded = Record(std::max(total, rec_.durable), rec_.quota_checked, /*leased=*/false);
    if (!recorded.ok()) {
      // The file is in place: a record still saying the session is open (its tail gone) would
      // fail every resume until the sweep. The session goes instead; the commit stands.
      spdlog::warn(
          "volume {}: upload {} committed '{}', but its record was not updated ({}); "
          "the session is removed",
          v_->cfg_.name, session_, rel, recorded.message());
      (void)o.Note(o.Client()->Delete(o.bucket(), key_));
    }
    // What the session staged goes once the record says it is complete: a crash before that
    // leaves the record naming `.data` and the tail, and the retried commit copies again from
    // them. (Before 2026-12-05 they went first, and such a retry answered 404.)
    if (had_data) (void)o.Note(o.Client()->Delete(o.bucket(), key_ + ".data"));
    (void)o.DeletePrefix(key_ + ".tail");  // every tail, named or left
    return Status::Ok();
  }

 private:
  // Completes the session's `.data` upload from `parts`, once: a Publish retried after the copy
  // onto the target failed, or a Complete whose answer was lost and retried, finds the upload
  // gone (NoSuchUpload); `.data` there with the parts' size is then the completed upload.
  Status CompleteData(const std::vector<s3c::PartInfo>& parts) {
    if (data_complete_) return Status::Ok();
    Status st = v_->origin_->CompleteUpload(key_ + ".data", rec_.upload, parts);
    if (st.ok()) data_complete_ = true;
    return st;
  }
  bool data_complete_ = false;
  std::optional<DirEntry> landed_;  // what the last Publish made, when its answer said

  // Where buf_ begins: the bytes in parts sent, recorded or not.
  uint64_t Base() const { return rec_.parts_bytes() + Bytes(pending_); }
  static uint64_t Bytes(const std::vector<s3c::PartInfo>& ps) {
    uint64_t n = 0;
    for (const auto& p : ps) n += p.size;
    return n;
  }
  // Sends the first `n` bytes of buf_ as the next part (in a session written by WriteAt, as tus
  // uploads are, fixed-size but the last: part N always holds the same bytes, so one sent again
  // after a crash replaces itself; CopyFrom, for writers that never resume, makes others).
  Status SendFront(uint64_t n) {
    SLUICE_ASSIGN_OR_RETURN(const int number, NextPart());
    auto& o = *v_->origin_;
    std::string_view bytes = std::string_view(buf_).substr(0, static_cast<size_t>(n));
    std::string crc;
    SLUICE_ASSIGN_OR_RETURN(std::string etag,
                            o.Note(o.Client()->UploadPart(o.bucket(), key_ + ".data", rec_.upload,
                                                          number, s3c::Body{bytes}, &crc)));
    pending_.push_back({number, bytes.size(), etag, crc});
    buf_.erase(0, static_cast<size_t>(n));
    return Status::Ok();
  }
  // Bytes [first, first + len) of `from` as the next part, copied on the origin. A Complete
  // hands its parts over one by one, each copy a round trip that waits on the origin: so each
  // runs on a thread of its own from when it is numbered and placed, at most kCopiesAtOnce at
  // once, while the caller goes on to its next part. Its ETag is taken before a record or the
  // Complete names it (RunCopies).
  Status CopyPart(const OriginObject& from, uint64_t first, uint64_t len) {
    // Learned since CopiesOnOrigin said yes (another writer's refused copy): read and written.
    if (v_->origin_->part_copy == Origin::Has::kNo)
      return Status(Code::kUnsupported, "the origin has no UploadPartCopy");
    SLUICE_ASSIGN_OR_RETURN(const int number, NextPart());
    while (copies_.size() >= kCopiesAtOnce) SLUICE_RETURN_IF_ERROR(SettleOldest());
    pending_.push_back({number, len, "", ""});
    auto copy = [o = v_->origin_, key = key_ + ".data", upload = rec_.upload, number, from, first,
                 len]() -> Result<s3c::PartInfo> {
      s3c::PartInfo p{number, len, "", ""};
      auto etag =
          o->Note(o->Client()->CopyPart(o->bucket(), key, upload, number, from.bucket, from.key,
                                        first, first + len - 1, from.etag, &p.crc32c));
      (void)o->Lacks(etag.status(), o->part_copy, "UploadPartCopy");
      if (!etag.ok() && etag.status().code() == Code::kConflict)
        return Status(Code::kConflict,
                      fmt::format("s3://{}/{} changed on the origin while being copied",
                                  from.bucket, from.key));
      if (!etag.ok()) return etag.status();
      p.etag = std::move(etag).value();
      return p;
    };
    if (v_->origin_->part_copy != Origin::Has::kYes) {
      // Until the origin has copied one, each copy is waited for: an origin without
      // UploadPartCopy refuses it, and the part is then given back (its number too) to be read
      // and written instead.
      auto p = copy();
      if (!p.ok()) pending_.pop_back();
      if (p.ok()) pending_.back() = std::move(p).value();
      return p.status();
    }
    copies_.push_back({pending_.size() - 1, std::async(std::launch::async, std::move(copy))});
    return Status::Ok();
  }
  // Waits for the oldest copy in flight and fills in its part; the first failure stays the
  // answer (the part it left without an ETag is never named).
  Status SettleOldest() {
    QueuedCopy c = std::move(copies_.front());
    copies_.pop_front();
    auto p = c.done.get();
    if (!p.ok() && copy_failed_.ok()) copy_failed_ = p.status();
    if (p.ok()) pending_[c.slot] = std::move(p).value();
    return copy_failed_;
  }
  Status RunCopies() {
    while (!copies_.empty()) SLUICE_RETURN_IF_ERROR(SettleOldest());
    return copy_failed_;
  }
  struct QueuedCopy {
    size_t slot;  // its part in pending_
    std::future<Result<s3c::PartInfo>> done;
  };
  static constexpr size_t kCopiesAtOnce = 8;
  std::deque<QueuedCopy> copies_;  // in flight, oldest first (their futures wait when freed)
  Status copy_failed_;
  // The number the next part gets, the session's origin upload created first if need be.
  Result<int> NextPart() {
    SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));
    auto& o = *v_->origin_;
    if (rec_.upload.empty()) {
      SLUICE_ASSIGN_OR_RETURN(rec_.upload,
                              o.Note(o.Client()->CreateMultipart(o.bucket(), key_ + ".data")));
      // Recorded at once, so that a sweep can abort it whatever happens next; an upload the
      // record could not name is aborted now, since nothing would ever find it again. Only
      // once the record is read back without it: a write whose answer was lost may have
      // landed, and a resumed writer would then send its parts to an upload aborted here.
      if (Status named = o.PutRecord(key_, rec_.ToJson()); !named.ok()) {
        auto now = o.GetRecord(key_, kMaxSessionRecord);
        if (!now.ok()) return named;  // not known: the upload stays, for the sweep
        auto back = *now ? SessionRecord::FromJson((*now)->first)
                         : Result<SessionRecord>(Status(Code::kNotFound, "no record"));
        if (!back.ok() || back->upload != rec_.upload) {
          (void)o.Note(o.Client()->AbortMultipart(o.bucket(), key_ + ".data", rec_.upload));
          rec_.upload.clear();
          return named;
        }
      }
    }
    const int number = static_cast<int>(rec_.parts.size() + pending_.size()) + 1;
    if (number > s3c::kMaxParts)
      return Status(Code::kTooLarge, fmt::format("upload {}: more than {} parts of {} bytes",
                                                 session_, s3c::kMaxParts, v_->opts_.part_size));
    return number;
  }
  static constexpr uint64_t kMinPart = kMinOriginPart, kMaxPart = 5ULL << 30;  // S3's part sizes
  Status PutTail(uint64_t n) {
    SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));
    auto& o = *v_->origin_;
    return o
        .Note(o.Client()->Put(o.bucket(), fmt::format("{}.tail.{}", key_, Base()),
                              s3c::Body{std::string_view(buf_).substr(0, static_cast<size_t>(n))}))
        .status();
  }
  // Records `durable` with every part sent so far (all below it: syncs come at what was
  // written, rollbacks never below what was sent).
  // `leased`: false for the record of a commit that already went out (Publish checked first).
  Status Record(uint64_t durable, bool quota_checked, bool leased = true) {
    if (leased) SLUICE_RETURN_IF_ERROR(v_->KeepLease(*held_));
    SLUICE_RETURN_IF_ERROR(RunCopies());  // a part is recorded with its ETag
    const std::string named = rec_.TailKey(key_);
    // Nothing changes here until the record is written: a sync that failed claims nothing.
    SessionRecord next = rec_;
    next.parts.insert(next.parts.end(), pending_.begin(), pending_.end());
    next.durable = durable;
    next.quota_checked = quota_checked;
    next.recorded = true;
    next.tail_keyed = true;
    SLUICE_RETURN_IF_ERROR(v_->origin_->PutRecord(key_, next.ToJson()));
    rec_ = std::move(next);
    pending_.clear();
    state_.durable = durable;
    state_.quota_checked = quota_checked;
    state_.recorded = true;
    // The tail the record named before, now that it names another (a failure leaves it to the
    // session's end, which removes every tail).
    if (rec_.staged && rec_.TailKey(key_) != named)
      (void)v_->origin_->Note(v_->origin_->Client()->Delete(v_->origin_->bucket(), named));
    return Status::Ok();
  }

  S3Volume* v_;
  VFolderId vfid_;
  std::string session_, key_;
  std::shared_ptr<HeldLease> held_;     // renewed by the volume's heartbeat while this lives
  SessionRecord rec_;                   // as last recorded: parts all below its durable offset
  std::vector<s3c::PartInfo> pending_;  // parts sent since
  std::string buf_;                     // the bytes past the last part sent
  StagingState state_;
};

// ---- a session's lease across nodes (docs/s3-volumes.md, "Uploads")
//
// Generations of "<record>.lock.<n>" (n: ten digits), each made only if absent (If-None-Match:
// *), so that of two nodes that find the newest one expired or released only one makes the
// next. The newest says who holds the session: {"nonce", "holder", "expires" (Unix ms),
// "released"}. Its writer renews it as it writes; a writer that finds a newer generation has
// lost it and stops.

namespace {

constexpr std::string_view kLockInfix = ".lock.";

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string LeaseBody(const std::string& nonce, std::chrono::milliseconds ttl, bool released) {
  static const std::string holder = [] {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return fmt::format("{}:{}", host, ::getpid());
  }();
  return nlohmann::json{{"nonce", nonce},
                        {"holder", holder},
                        {"expires", UnixMillis() + ttl.count()},
                        {"released", released}}
      .dump();
}

struct LeaseState {
  std::vector<std::string> keys;  // every generation there
  std::string newest, nonce;      // the newest generation, and who made it
  uint64_t generation = 0;
  bool held = false;  // neither released nor expired
};

// `ttl`: what an expiry may be past the generation's Last-Modified (a holder whose clock runs
// ahead holds it no longer than that).
Result<LeaseState> ReadLease(S3Volume::Origin& o, const std::string& record,
                             std::chrono::milliseconds ttl) {
  LeaseState st;
  const std::string prefix = record + std::string(kLockInfix);
  SLUICE_RETURN_IF_ERROR(o.ForEachKey(prefix, [&](const s3c::ObjectInfo& obj) {
    const std::string digits = obj.key.substr(prefix.size());
    if (digits.size() != 10 || digits.find_first_not_of("0123456789") != std::string::npos)
      return Status::Ok();
    st.keys.push_back(obj.key);
    if (const uint64_t g = std::stoull(digits); g > st.generation) {
      st.generation = g;
      st.newest = obj.key;
    }
    return Status::Ok();
  }));
  if (st.newest.empty()) return st;
  auto rec = o.GetRecord(st.newest);
  if (!rec.ok()) {
    // Not JSON (or too long): no lease anyone holds. The origin's failures stay errors.
    if (rec.status().code() == Code::kIoError || rec.status().code() == Code::kTooLarge) return st;
    return rec.status();
  }
  if (!*rec) return st;  // removed meanwhile (the session ended): free
  const auto& j = (*rec)->first;
  auto field = [&](const char* name) { return j.contains(name) ? &j[name] : nullptr; };
  if (auto* n = field("nonce"); n && n->is_string()) st.nonce = n->get<std::string>();
  const auto* released = field("released");
  const auto* expires = field("expires");
  if (!released || !released->is_boolean() || !expires || !expires->is_number_integer()) return st;
  int64_t until = expires->get<int64_t>();
  if (const std::time_t m = (*rec)->second.mtime; m > 0)
    until = std::min(until, int64_t(m + 1) * 1000 + ttl.count());
  st.held = !released->get<bool>() && until > UnixMillis();
  return st;
}

}  // namespace

Result<bool> S3Volume::ConditionalCreates() {
  {
    std::lock_guard lk(mu_);
    if (conditional_) return *conditional_;
  }
  // The same new key twice: the second must be refused (412). An origin that refuses the
  // header (501) takes no conditions either.
  const std::string probe = origin_->RecordKey("probe/" + RandomHexString(8));
  // Only a clear answer is kept: the second PUT taken (the condition ignored), refused with 412
  // (honoured), or the header refused as not implemented; anything else is asked again.
  auto first = origin_->Note(origin_->Client()->PutIfAbsent(opts_.bucket, probe, "{}"));
  bool honoured = false;
  if (first.ok() || first.status().code() == Code::kConflict) {  // a retry found the first
    auto second = origin_->Note(origin_->Client()->PutIfAbsent(opts_.bucket, probe, "{}"));
    (void)origin_->Note(origin_->Client()->Delete(opts_.bucket, probe));
    if (!second.ok() && second.status().code() != Code::kConflict) return second.status();
    honoured = !second.ok();
  } else if (first.status().code() != Code::kUnsupported) {
    return first.status();
  }
  if (!honoured)
    spdlog::warn(
        "volume {}: the origin {} ignores If-None-Match on PUT: an upload session's "
        "writer is one per node, not one across nodes",
        cfg_.name, opts_.client.endpoint);
  std::lock_guard lk(mu_);
  conditional_ = honoured;
  return honoured;
}

Result<std::optional<S3Volume::Lease>> S3Volume::MakeLease(const std::string& record, uint64_t n,
                                                           const std::string& nonce) {
  ControlRequests control;  // leases go ahead of data
  Lease l{fmt::format("{}{}{:010}", record, kLockInfix, n), nonce,
          std::chrono::steady_clock::now()};
  auto made = origin_->Note(origin_->Client()->PutIfAbsent(
      opts_.bucket, l.key, LeaseBody(l.nonce, opts_.upload_lock_ttl, false)));
  // Whether the generation is this writer's (its nonce): another's may have been made first.
  auto ours = [&]() -> Result<bool> {
    SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(l.key));
    const auto* n = rec && rec->first.contains("nonce") ? &rec->first["nonce"] : nullptr;
    return n && n->is_string() && n->get<std::string>() == l.nonce;
  };
  // Made (maybe) and then an error: the generation goes again, so that it holds nothing; only
  // if it is this writer's (a PUT that failed here may have lost to another writer's, which
  // must stay: deleting it would let a third writer in beside that one).
  auto drop = [&](Status st) {
    if (auto mine = ours(); mine.ok() && *mine)
      (void)origin_->Note(origin_->Client()->Delete(opts_.bucket, l.key));
    return st;
  };
  if (!made.ok()) {
    if (made.status().code() != Code::kConflict) return drop(made.status());
    // Another writer made it first, or this one did and a retry of its PUT found it.
    SLUICE_ASSIGN_OR_RETURN(bool mine, ours());
    if (!mine) return std::optional<Lease>();
  }
  // The newest? A generation removed after it was read can be made again by a writer that read
  // the generations before: a newer one then says it lost.
  auto st = ReadLease(*origin_, record, opts_.upload_lock_ttl);
  if (!st.ok()) return drop(st.status());
  if (st->newest != l.key || st->nonce != l.nonce) {
    (void)drop(Status::Ok());
    return std::optional<Lease>();
  }
  // The older generations go: the newest alone says who holds the session.
  for (const auto& k : st->keys)
    if (k != l.key) (void)origin_->Note(origin_->Client()->Delete(opts_.bucket, k));
  return std::optional<Lease>(std::move(l));
}

Result<std::optional<S3Volume::Lease>> S3Volume::TakeLease(const std::string& record) {
  ControlRequests control;  // leases go ahead of data
  SLUICE_ASSIGN_OR_RETURN(bool conditional, ConditionalCreates());
  if (!conditional) return std::optional<Lease>(Lease{});
  SLUICE_ASSIGN_OR_RETURN(LeaseState st, ReadLease(*origin_, record, opts_.upload_lock_ttl));
  if (st.held) return std::optional<Lease>();
  return MakeLease(record, st.generation + 1, RandomHexString(8));
}

namespace {
Status LeaseLost(const std::string& key, std::chrono::milliseconds ttl) {
  const std::string record = key.substr(0, key.rfind(kLockInfix));
  return Status(Code::kConflict,
                fmt::format("upload session {}: another writer took it over after this one's "
                            "lease expired ({:.1f} s without renewal)",
                            record.substr(record.rfind('/') + 1), ttl.count() / 1000.0));
}
}  // namespace

Status S3Volume::KeepLease(Lease& l) {
  ControlRequests control;  // leases go ahead of data
  if (l.key.empty()) return Status::Ok();
  if (l.lost) return LeaseLost(l.key, opts_.upload_lock_ttl);
  const auto now = std::chrono::steady_clock::now();
  const auto age = now - l.renewed;
  if (age < opts_.upload_lock_ttl / 3) return Status::Ok();
  const std::string record = l.key.substr(0, l.key.rfind(kLockInfix));
  if (age < opts_.upload_lock_ttl * 2 / 3) {
    // Every node still sees it live (clocks agreeing within a third of the time), so no other
    // writer can have taken it: renewed in place, one request.
    SLUICE_RETURN_IF_ERROR(
        origin_
            ->Note(origin_->Client()->Put(
                opts_.bucket, l.key, s3c::Body{LeaseBody(l.nonce, opts_.upload_lock_ttl, false)}))
            .status());
    if (std::chrono::steady_clock::now() - l.renewed >= opts_.upload_lock_ttl * 2 / 3) {
      // The PUT landed late: another node may have made the next generation meanwhile (and
      // this PUT made this one again). Still the newest, it is this writer's.
      SLUICE_ASSIGN_OR_RETURN(LeaseState again, ReadLease(*origin_, record, opts_.upload_lock_ttl));
      if (again.newest != l.key || again.nonce != l.nonce) {
        l.lost = true;
        return LeaseLost(l.key, opts_.upload_lock_ttl);
      }
    }
    l.renewed = now;
    return Status::Ok();
  }
  // Late: another node may find it expired and make the next generation; make it first, by
  // the same rule.
  SLUICE_ASSIGN_OR_RETURN(LeaseState st, ReadLease(*origin_, record, opts_.upload_lock_ttl));
  if (st.nonce != l.nonce) {
    l.lost = true;
    return LeaseLost(l.key, opts_.upload_lock_ttl);
  }
  SLUICE_ASSIGN_OR_RETURN(auto next, MakeLease(record, st.generation + 1, l.nonce));
  if (!next) {
    l.lost = true;
    return LeaseLost(l.key, opts_.upload_lock_ttl);
  }
  l = std::move(*next);
  return Status::Ok();
}

Status S3Volume::KeepLease(HeldLease& held) {
  std::lock_guard lk(held.mu);
  if (held.released)
    return Status(Code::kConflict, "the upload's writer let go of its lease (the node stops)");
  return KeepLease(held.lease);
}

void S3Volume::ReleaseLease(const Lease& l) {
  ControlRequests control;  // leases go ahead of data
  if (l.key.empty() || l.lost) return;
  // Kept, released: the newest generation stays, so that its number is not made again.
  (void)origin_->Note(origin_->Client()->Put(
      opts_.bucket, l.key, s3c::Body{LeaseBody(l.nonce, opts_.upload_lock_ttl, true)}));
}

void S3Volume::Shutdown() {
  // The writers' leases go with the process: other nodes need not wait for them to expire.
  std::vector<std::shared_ptr<HeldLease>> held;
  {
    std::lock_guard lk(held_mu_);
    held.assign(held_.begin(), held_.end());
  }
  for (const auto& h : held) Unhold(h);
}

void S3Volume::Hold(const std::shared_ptr<HeldLease>& held) {
  if (held->lease.key.empty()) return;
  std::lock_guard lk(held_mu_);
  held_.insert(held);
  if (!heartbeat_.joinable()) heartbeat_ = std::thread([this] { Heartbeat(); });
}

void S3Volume::Unhold(const std::shared_ptr<HeldLease>& held) {
  {
    std::lock_guard lk(held_mu_);
    held_.erase(held);
  }
  std::lock_guard lk(held->mu);
  if (held->released) return;
  held->released = true;
  ReleaseLease(held->lease);
}

void S3Volume::Heartbeat() {
  std::unique_lock lk(held_mu_);
  while (!stopping_) {
    heartbeat_cv_.wait_for(lk, opts_.upload_lock_ttl / 6);
    if (stopping_) break;
    const std::vector<std::shared_ptr<HeldLease>> now(held_.begin(), held_.end());
    lk.unlock();
    // Several at once: a slow request delays the leases behind it no more than its own.
    (void)Origin::ParallelFor(now.size(), 8, [&](size_t i) {
      const auto& h = now[i];
      std::unique_lock hl(h->mu, std::try_to_lock);
      if (!hl.owns_lock() || h->released) return Status::Ok();  // its writer renews it now
      if (Status st = KeepLease(h->lease); !st.ok() && !h->lease.lost)
        spdlog::warn("volume {}: renewing an upload lease: {}", cfg_.name, st.message());
      return Status::Ok();
    });
    lk.lock();
  }
}

void S3Volume::Unlock(const std::string& session) {
  std::lock_guard lk(mu_);
  writers_.erase(session);
}

Status S3Volume::CheckStagedSize(uint64_t size) const {
  const uint64_t most = static_cast<uint64_t>(s3c::kMaxParts) * opts_.part_size;
  if (size <= most) return Status::Ok();
  return Status(Code::kTooLarge,
                fmt::format("volume '{}' takes uploads of at most {} bytes ({} origin parts of "
                            "part-size {}); this one is {} bytes: raise [volume.{}] part-size",
                            name(), most, s3c::kMaxParts, opts_.part_size, size, name()));
}

Result<std::string> S3Volume::CreateStaging(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(WritableVFolder(vfid));
  std::string session = RandomHexString(16);
  SessionRecord rec;
  rec.vfid = vfid.ToString();
  rec.tail_keyed = true;
  SLUICE_RETURN_IF_ERROR(origin_->PutRecord(StagingKey(vfid, session), rec.ToJson()));
  return session;
}

namespace {
Status NoSession(const std::string& session) {
  return Status(Code::kNotFound, fmt::format("upload session {} has no staging file", session));
}
}  // namespace

// A session's record, checked to belong to `vfid`.
static Result<std::optional<SessionRecord>> LoadSession(S3Volume::Origin& o, const std::string& key,
                                                        const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(auto rec, o.GetRecord(key, kMaxSessionRecord));
  if (!rec) return std::optional<SessionRecord>();
  SLUICE_ASSIGN_OR_RETURN(auto r, SessionRecord::FromJson(rec->first));
  if (r.vfid != vfid.ToString()) return std::optional<SessionRecord>();
  return std::optional<SessionRecord>(std::move(r));
}

// Removes what a session left on the origin: its multipart upload, tail and record.
static Status DropSession(S3Volume::Origin& o, const std::string& key, const SessionRecord& r) {
  if (!r.upload.empty()) {
    auto st = o.Note(o.Client()->AbortMultipart(o.bucket(), key + ".data", r.upload));
    if (!st.ok() && !IsNotFound(st)) return st;
  }
  // ".data": an upload completed by a commit whose copy onto the target then failed. The
  // record goes after what it names: a failure midway leaves it for the next sweep to find
  // (before 2026-12-05 it went first, and tails a failed delete left had nothing naming them).
  SLUICE_RETURN_IF_ERROR(o.DeleteKey(key + ".data"));
  SLUICE_RETURN_IF_ERROR(o.DeletePrefix(key + ".tail"));  // every tail, named or left
  SLUICE_RETURN_IF_ERROR(o.DeleteKey(key));
  return o.DeletePrefix(key + ".lock.");
}

Status S3Volume::DiscardStaging(const VFolderId& vfid, const std::string& session) {
  const std::string key = StagingKey(vfid, session);
  SLUICE_ASSIGN_OR_RETURN(auto r, LoadSession(*origin_, key, vfid));
  if (!r) return Status(Code::kNotFound, fmt::format("no upload session {}", session));
  return DropSession(*origin_, key, *r);
}

Result<StagingState> S3Volume::InspectStaging(const VFolderId& vfid, const std::string& session) {
  SLUICE_ASSIGN_OR_RETURN(auto r, LoadSession(*origin_, StagingKey(vfid, session), vfid));
  if (!r) return NoSession(session);
  return StagingState{r->staged, r->recorded, r->durable, r->quota_checked,
                      r->staged ? r->durable : 0};
}

Result<std::unique_ptr<StagingWriter>> S3Volume::OpenStaging(const VFolderId& vfid,
                                                             const std::string& session,
                                                             std::chrono::milliseconds wait) {
  SLUICE_RETURN_IF_ERROR(WritableVFolder(vfid));
  // One writer per session on this node, then across nodes (its lease on the origin).
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (writers_.insert(session).second) break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return UploadWriterBusy(session);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto fail = [&](Status st) {
    Unlock(session);
    return st;
  };
  const std::string key = StagingKey(vfid, session);
  // No lease for a session that is not there (or is complete).
  if (auto pre = LoadSession(*origin_, key, vfid); !pre.ok())
    return fail(pre.status());
  else if (!*pre || !(*pre)->staged)
    return fail(NoSession(session));
  auto held = std::make_shared<HeldLease>();
  for (;;) {
    auto l = TakeLease(key);
    if (!l.ok()) return fail(l.status());
    if (*l) {
      held->lease = std::move(**l);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return fail(UploadWriterBusy(session));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Hold(held);  // renewed from now on (the tail below may take a while)
  auto fail_leased = [&](Status st) {
    Unhold(held);
    return fail(std::move(st));
  };
  auto r = LoadSession(*origin_, key, vfid);  // again, as its writer now
  if (!r.ok()) return fail_leased(r.status());
  if (!*r || !(*r)->staged) return fail_leased(NoSession(session));
  SessionRecord rec = std::move(**r);
  // The durable bytes past the parts: the tail as last recorded (a longer tail written by a
  // Sync whose record never landed is cut to the record's offset).
  std::string tail;
  const uint64_t want = rec.durable - std::min(rec.durable, rec.parts_bytes());
  if (want > 0) {
    auto got = origin_->Note(origin_->Client()->Get(
        opts_.bucket, rec.TailKey(key),
        [&](std::string_view p) {
          tail.append(
              p.substr(0, static_cast<size_t>(want - std::min<uint64_t>(want, tail.size()))));
          return Status::Ok();
        },
        std::make_pair(uint64_t{0}, want)));
    if (!got.ok()) return fail_leased(got.status());
    if (tail.size() < want)
      return fail_leased(Status(
          Code::kIoError, fmt::format("upload {}: its tail on the origin holds {} of {} bytes",
                                      session, tail.size(), want)));
  }
  return std::unique_ptr<StagingWriter>(
      new Writer(this, vfid, session, std::move(held), std::move(rec), std::move(tail)));
}

StagingSweep S3Volume::SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                                    const StagingRemoved& removed) {
  StagingSweep out;
  std::string prefix = origin_->RecordKey("staging/");
  if (vfid) prefix += fmt::format("{}/{}/", vfid->scope ? vfid->scope->hex : "legacy", vfid->hex);
  std::vector<s3c::ObjectInfo> records, locks;
  Status listed = origin_->ForEachKey(prefix, [&](const s3c::ObjectInfo& o) {
    if (o.key.find(kLockInfix) != std::string::npos)
      locks.push_back(o);
    else if (o.key.substr(o.key.rfind('/') + 1).find('.') == std::string::npos)
      records.push_back(o);  // not a session's tail or data
    return Status::Ok();
  });
  if (!listed.ok()) {
    spdlog::warn("volume {}: upload sweep: {}", cfg_.name, listed.message());
    return out;
  }
  const auto now = Clock::now();
  // Leases left by writers that released them after their session ended.
  std::set<std::string> have;
  for (const auto& r : records) have.insert(r.key);
  for (const auto& l : locks)
    if (!have.count(l.key.substr(0, l.key.rfind(kLockInfix))) && now - TimeOf(l.mtime) > age)
      (void)origin_->Note(origin_->Client()->Delete(opts_.bucket, l.key));
  for (const auto& o : records) {
    // Last-Modified has whole seconds: a session looks up to a second older than it is.
    if (now - TimeOf(o.mtime) <= age) continue;
    // "<scope>/<vfolder>/<session>" below the staging prefix.
    std::string rest = o.key.substr(origin_->RecordKey("staging/").size());
    size_t s1 = rest.find('/'), s2 = rest.find('/', s1 + 1);
    if (s1 == std::string::npos || s2 == std::string::npos) continue;
    const std::string scope = rest.substr(0, s1), vf = rest.substr(s1 + 1, s2 - s1 - 1),
                      session = rest.substr(s2 + 1);
    {
      std::lock_guard lk(mu_);
      if (writers_.count(session)) {
        ++out.kept_locked;
        continue;
      }
    }
    // Its writer's place first, so that no node opens it while it goes.
    auto lease = TakeLease(o.key);
    if (!lease.ok() || !*lease) {
      ++out.kept_locked;  // another node's writer holds it (or it could not be told)
      continue;
    }
    bool unreadable = false;
    auto rec = origin_->GetRecord(o.key, kMaxSessionRecord, &unreadable);
    auto r = !rec.ok() ? Result<SessionRecord>(rec.status())
             : *rec    ? SessionRecord::FromJson((*rec)->first)
                       : Result<SessionRecord>(Status(Code::kNotFound, "no record"));
    if (!r.ok() && (unreadable || (rec.ok() && *rec))) {
      // A record no writer can read (cut short, or not one of ours) would otherwise stay
      // forever; what it staged goes with it, its origin upload by the listing below.
      spdlog::warn("volume {}: upload sweep: removing unreadable session record {} ({})", cfg_.name,
                   o.key, r.status().message());
      SessionRecord unread;
      unread.staged = true;
      r = std::move(unread);
    }
    if (!r.ok() || !DropSession(*origin_, o.key, *r).ok()) {
      ReleaseLease(**lease);  // tried again at the next sweep
      continue;
    }
    have.erase(o.key);
    if (r->staged) {  // an abandoned session; otherwise the record of a finished one goes
      if (removed) removed(scope == "legacy" ? "" : scope, vf, session);
      out.removed += 1;
      out.removed_bytes += r->durable;
    }
  }
  // A sweep of every vfolder only: one of one vfolder runs at each session's creation.
  if (!vfid) AbortUnnamedUploads(prefix, have, age);  // `have` less the records dropped above
  return out;
}

// Origin uploads no session record names: a writer that crashed between creating one and
// recording it, or a record the sweep above found unreadable. Only those older than `age` go,
// so that an upload whose record is being written is never taken.
void S3Volume::AbortUnnamedUploads(const std::string& prefix, const std::set<std::string>& named,
                                   std::chrono::seconds age) {
  auto uploads = origin_->Note(origin_->Client()->ListMultipartUploads(opts_.bucket, prefix));
  if (!uploads.ok()) {
    spdlog::warn("volume {}: upload sweep: {}", cfg_.name, uploads.status().message());
    return;
  }
  const auto now = Clock::now();
  for (const auto& u : *uploads) {
    // (An upload whose start time did not parse is kept.)
    if (!u.key.starts_with(prefix) || !u.key.ends_with(".data") || u.initiated == 0 ||
        now - TimeOf(u.initiated) <= age)
      continue;
    if (named.count(u.key.substr(0, u.key.size() - 5))) continue;
    spdlog::info("volume {}: upload sweep: aborting origin upload {} of {} (no session names it)",
                 cfg_.name, u.upload_id, u.key);
    (void)origin_->Note(origin_->Client()->AbortMultipart(opts_.bucket, u.key, u.upload_id));
  }
}

}  // namespace sluice
