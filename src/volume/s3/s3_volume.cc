#include "volume/s3/s3_volume.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/path.h"
#include "volume/forwarding_volume.h"

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
  e.etag = o.etag;
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

std::string LastOf(const std::vector<std::string>& parts) {
  return parts.empty() ? std::string() : parts.back();
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
    const std::string str = is_str ? value.get<std::string>() : std::string();
    if (key == "insecure" || key == "read-only" || key == "read_only") {
      if (!value.is_boolean()) return bad(key, "must be true or false");
      (key == "insecure" ? o.client.insecure : o.read_only) = value.get<bool>();
      continue;
    }
    if (!is_str) return bad(key, "must be a string");
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
    } else if (key == "capacity") {
      auto size = ParseBinarySize(str);
      if (!size.ok()) return bad(key, size.status().message());
      o.capacity = *size;
    } else if (key == "vfolder-ttl" || key == "vfolder_ttl") {
      auto d = ParseDuration(str);
      if (!d.ok()) return bad(key, d.status().message());
      o.vfolder_ttl = *d;
    } else {
      return bad(key,
                 "unknown key for the s3 backend (known: endpoint, bucket, prefix, region, "
                 "access-key, secret-key, credentials-file, ca-file, insecure, read-only, "
                 "capacity, vfolder-ttl)");
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

struct S3Volume::Origin {
  Origin(const S3VolumeOptions& o, std::string volume)
      : opts(o), clients(o.client), volume(std::move(volume)) {}
  S3VolumeOptions opts;
  Clients clients;
  std::string volume;
  std::mutex mu;
  std::string last_error;  // the last failure to reach the origin, "" after a success

  Clients::Lease Client() { return clients.Take(); }
  const std::string& bucket() const { return opts.bucket; }

  // Remembers whether the origin answered, for GetHwInfo.
  template <typename T>
  T Note(T r) {
    const Status& st = StatusOf(r);
    std::lock_guard lk(mu);
    if (st.code() == Code::kUnavailable)
      last_error = st.message();
    else
      last_error.clear();
    return r;
  }
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static Status StatusOf(const Result<T>& r) {
    return r.status();
  }

  Result<std::optional<s3c::ObjectInfo>> HeadOpt(const std::string& key) {
    auto r = Note(Client()->Head(bucket(), key));
    if (!r.ok()) {
      if (IsNotFound(r.status())) return std::optional<s3c::ObjectInfo>();
      return r.status();
    }
    return std::optional<s3c::ObjectInfo>(std::move(r).value());
  }

  // Whether any key other than `dir` itself (its marker) lies below `dir` ("a/b/").
  Result<bool> HasChildren(const std::string& dir) {
    s3c::ListRequest lr;
    lr.prefix = dir;
    lr.max_keys = 2;
    auto page = Note(Client()->ListObjects(bucket(), lr));
    if (!page.ok()) return page.status();
    for (const auto& o : page->objects)
      if (o.key != dir) return true;
    return !page->prefixes.empty();
  }

  // Every key below `prefix`, page after page.
  Status ForEachKey(const std::string& prefix,
                    const std::function<Status(const s3c::ObjectInfo&)>& fn) {
    s3c::ListRequest lr;
    lr.prefix = prefix;
    for (;;) {
      auto page = Note(Client()->ListObjects(bucket(), lr));
      if (!page.ok()) return page.status();
      for (const auto& o : page->objects) SLUICE_RETURN_IF_ERROR(fn(o));
      if (page->next_token.empty()) return Status::Ok();
      lr.continuation = page->next_token;
    }
  }

  // Deletes every key below `prefix` (batches of 1000); refusals are errors.
  Status DeletePrefix(const std::string& prefix) {
    std::vector<std::string> keys;
    SLUICE_RETURN_IF_ERROR(ForEachKey(prefix, [&](const s3c::ObjectInfo& o) {
      keys.push_back(o.key);
      return Status::Ok();
    }));
    for (size_t i = 0; i < keys.size(); i += 1000) {
      std::vector<std::string> batch(keys.begin() + i,
                                     keys.begin() + std::min(keys.size(), i + 1000));
      auto failed = Note(Client()->DeleteMany(bucket(), batch));
      if (!failed.ok()) return failed.status();
      if (!failed->empty())
        return Status(Code::kIoError, fmt::format("the origin refused to delete {} keys: {}",
                                                  failed->size(), failed->front()));
    }
    return Status::Ok();
  }

  // The entries directly below `dir` ("" or "a/b/"), sorted by name (the origin's order puts a
  // directory "a" after "a-b", as its prefix is "a/"). A name that is both an object and a
  // prefix lists as the directory.
  Result<std::vector<DirEntry>> ListLevel(const std::string& dir) {
    std::map<std::string, DirEntry> out;
    s3c::ListRequest lr;
    lr.prefix = dir;
    lr.delimiter = "/";
    for (;;) {
      auto page = Note(Client()->ListObjects(bucket(), lr));
      if (!page.ok()) return page.status();
      for (const auto& o : page->objects) {
        if (o.key.size() <= dir.size()) continue;  // the directory's own marker
        std::string name = o.key.substr(dir.size());
        out.emplace(name, FileEntry(name, o));
      }
      for (const auto& p : page->prefixes) {
        if (p.size() <= dir.size() + 1) continue;  // "dir//": no name
        std::string name = p.substr(dir.size(), p.size() - dir.size() - 1);
        out.insert_or_assign(name, DirEntryOf(name));
      }
      if (page->next_token.empty()) break;
      lr.continuation = page->next_token;
    }
    std::vector<DirEntry> v;
    v.reserve(out.size());
    for (auto& [n, e] : out) v.push_back(std::move(e));
    return v;
  }

  // A record's JSON and attributes; nullopt when there is none.
  Result<std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>> GetRecord(
      const std::string& key) {
    std::string body;
    auto got = Note(Client()->Get(bucket(), key, [&](std::string_view p) {
      body.append(p);
      return body.size() > (64 << 10) ? Status(Code::kTooLarge, "a record over 64 KiB")
                                      : Status::Ok();
    }));
    if (!got.ok()) {
      if (IsNotFound(got.status()))
        return std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>();
      return got.status();
    }
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status(Code::kIoError,
                    fmt::format("s3://{}/{} is not a Sluice record", bucket(), key));
    return std::optional<std::pair<nlohmann::json, s3c::ObjectInfo>>(
        std::make_pair(std::move(j), std::move(got).value()));
  }
  Status PutRecord(const std::string& key, const nlohmann::json& j) {
    if (opts.read_only) return Status(Code::kPermissionDenied, "the volume is read-only");
    std::string text = j.dump();
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
  S3Reader(std::shared_ptr<S3Volume::Origin> o, std::string key, DirEntry info, std::string head)
      : origin_(std::move(o)),
        key_(std::move(key)),
        info_(std::move(info)),
        head_(std::move(head)) {}
  const DirEntry& info() const override { return info_; }
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
    auto r = origin_->Note(origin_->Client()->Get(origin_->bucket(), key_, sink,
                                                  std::make_pair(offset, uint64_t{n}), info_.etag));
    if (!r.ok()) {
      if (r.status().code() == Code::kConflict || IsNotFound(r.status()))
        return Status(Code::kConflict,
                      fmt::format("'{}' changed on the origin since it was opened", info_.name));
      return r.status();
    }
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
  std::string key_;
  DirEntry info_;
  std::string head_;  // the first bytes (all of a small file), read at open
};

// A directory as listed when opened; entries are described and opened through the volume.
class S3Dir : public DirHandle {
 public:
  S3Dir(S3Volume* v, VFolderId vfid, std::string rel, DirEntry info, std::vector<DirEntry> entries)
      : v_(v),
        vfid_(std::move(vfid)),
        rel_(std::move(rel)),
        info_(std::move(info)),
        entries_(std::move(entries)) {}
  const DirEntry& info() const override { return info_; }
  Result<std::optional<Name>> Next() override {
    if (next_ >= entries_.size()) return std::optional<Name>();
    const DirEntry& e = entries_[next_++];
    return std::optional<Name>(Name{e.name, e.type});
  }
  Result<DirEntry> StatEntry(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->Stat(vfid_, Child(name));
  }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->OpenReader(vfid_, Child(name));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->OpenDir(vfid_, Child(name));
  }

 private:
  std::string Child(const std::string& name) const {
    return rel_.empty() ? name : rel_ + "/" + name;
  }
  S3Volume* v_;
  VFolderId vfid_;
  std::string rel_;
  DirEntry info_;
  std::vector<DirEntry> entries_;
  size_t next_ = 0;
};

std::string ScopeRecord(const S3Volume::Origin& o, const QuotaScopeId& qs) {
  return o.RecordKey("scopes/" + qs.hex);
}

std::string VFolderRecord(const S3Volume::Origin& o, const VFolderId& vf) {
  return o.RecordKey(fmt::format("vfolders/{}/{}", vf.scope ? vf.scope->hex : "legacy", vf.hex));
}

class S3Quota : public QuotaModel {
 public:
  explicit S3Quota(std::shared_ptr<S3Volume::Origin> o) : o_(std::move(o)) {}
  std::string ScopePath(const QuotaScopeId& qs) const override {
    return fmt::format("s3://{}/{}", o_->bucket(), Data(qs));
  }
  Status CreateScope(const QuotaScopeId& qs, std::optional<uint64_t> limit) override {
    SLUICE_ASSIGN_OR_RETURN(auto m, o_->HeadOpt(ScopeRecord(*o_, qs)));
    if (m) return ExistingQuotaScope(qs);
    return Put(qs, limit);
  }
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qs) override {
    SLUICE_ASSIGN_OR_RETURN(auto rec, o_->GetRecord(ScopeRecord(*o_, qs)));
    if (!rec) return MissingQuotaScope(qs, o_->volume);
    QuotaUsage q;
    if (const auto& j = rec->first; j.contains("limit") && j["limit"].is_number_unsigned())
      q.limit_bytes = j["limit"].get<uint64_t>();
    SLUICE_RETURN_IF_ERROR(o_->ForEachKey(Data(qs), [&](const s3c::ObjectInfo& obj) {
      q.used_bytes += obj.size;
      return Status::Ok();
    }));
    return q;
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
    return o_->Note(o_->Client()->Delete(o_->bucket(), ScopeRecord(*o_, qs)));
  }

 private:
  std::string Data(const QuotaScopeId& qs) const { return o_->opts.prefix + qs.hex + "/"; }
  Status Put(const QuotaScopeId& qs, std::optional<uint64_t> limit) {
    nlohmann::json j = nlohmann::json::object();
    if (limit) j["limit"] = *limit;
    return o_->PutRecord(ScopeRecord(*o_, qs), j);
  }
  std::shared_ptr<S3Volume::Origin> o_;
};

// Tree operations on "s3://<bucket>/<key prefix>" paths (ScopePath, VFolderPath, detached
// vfolders).
class S3FsOp : public FSOpModel {
 public:
  explicit S3FsOp(std::shared_ptr<S3Volume::Origin> o) : o_(std::move(o)) {}
  Status CopyTree(const std::string& src, const std::string& dst) override {
    SLUICE_ASSIGN_OR_RETURN(std::string from, KeyOf(src));
    SLUICE_ASSIGN_OR_RETURN(std::string to, KeyOf(dst));
    return o_->ForEachKey(from, [&](const s3c::ObjectInfo& obj) {
      return o_->Note(o_->Client()->Copy(o_->bucket(), obj.key, to + obj.key.substr(from.size())))
          .status();
    });
  }
  Status MoveTree(const std::string& src, const std::string& dst) override {
    SLUICE_RETURN_IF_ERROR(CopyTree(src, dst));
    return DeleteTree(src);
  }
  Status DeleteTree(const std::string& path) override {
    SLUICE_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    SLUICE_RETURN_IF_ERROR(o_->DeletePrefix(key));
    // A detached vfolder's trash record goes last: a crash before it leaves the record for
    // EmptyTrash to finish the deletion.
    auto st = o_->Note(o_->Client()->Delete(o_->bucket(), TrashRecord(*o_, key)));
    return st.ok() || IsNotFound(st) ? Status::Ok() : st;
  }
  Result<TreeUsage> ScanTree(const std::string& path) override {
    SLUICE_ASSIGN_OR_RETURN(std::string key, KeyOf(path));
    TreeUsage u;
    SLUICE_RETURN_IF_ERROR(o_->ForEachKey(key, [&](const s3c::ObjectInfo& obj) {
      if (obj.key.size() > key.size()) u.file_count += 1;
      u.used_bytes += obj.size;
      return Status::Ok();
    }));
    return u;
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
};

}  // namespace

// ---- the volume

S3Volume::S3Volume(VolumeConfig cfg, S3VolumeOptions opts)
    : cfg_(std::move(cfg)),
      opts_(std::move(opts)),
      io_stats_(&Metrics::Global().Volume(cfg_.name)),
      origin_(std::make_shared<Origin>(opts_, cfg_.name)) {
  quota_ = std::make_unique<S3Quota>(origin_);
  fsop_ = std::make_unique<S3FsOp>(origin_);
}

S3Volume::~S3Volume() = default;

std::set<std::string> S3Volume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric};
}

Status S3Volume::Init() {
  // Wrong credentials or a missing bucket stop the start; an origin that does not answer yet
  // does not (every request says so until it does).
  s3c::ListRequest lr;
  lr.prefix = opts_.prefix;
  lr.max_keys = 1;
  auto page = origin_->Note(origin_->Client()->ListObjects(opts_.bucket, lr));
  if (page.ok()) return Status::Ok();
  if (page.status().code() == Code::kUnavailable) {
    spdlog::warn("volume {}: the origin {} does not answer yet: {}", cfg_.name,
                 opts_.client.endpoint, page.status().message());
    return Status::Ok();
  }
  return Status(page.status().code(),
                fmt::format("origin {} bucket '{}': {}", opts_.client.endpoint, opts_.bucket,
                            page.status().message()));
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
    const auto& what = (*rec)->first["delete"];
    if (!what.is_string()) continue;
    std::string data = what.get<std::string>();
    // Only a vfolder's prefix of this volume (four levels below its own prefix).
    if (!data.starts_with(opts_.prefix) ||
        std::count(data.begin() + opts_.prefix.size(), data.end(), '/') < 3)
      continue;
    SLUICE_RETURN_IF_ERROR(fsop_->DeleteTree(fmt::format("s3://{}/{}", opts_.bucket, data)));
  }
  return Status::Ok();
}

std::string S3Volume::ObjectKey(const VFolderId& vfid, std::string_view relpath) const {
  const std::string& h = vfid.hex;
  std::string key = opts_.prefix;
  if (vfid.scope) key += vfid.scope->hex + "/";
  key += fmt::format("{}/{}/{}/", h.substr(0, 2), h.substr(2, 2), h.substr(4));
  key.append(relpath);
  return key;
}

std::string S3Volume::VFolderPath(const VFolderId& vfid) const {
  std::string k = ObjectKey(vfid, "");
  k.pop_back();
  return fmt::format("s3://{}/{}", opts_.bucket, k);
}

Result<std::vector<std::string>> S3Volume::Parts(std::string_view relpath) const {
  return SplitRelPath(relpath);
}

Status S3Volume::Writable() const {
  if (opts_.read_only)
    return Status(Code::kPermissionDenied, fmt::format("volume {} is read-only", cfg_.name));
  return Status::Ok();
}

Status S3Volume::Live(const VFolderId& vfid) {
  const std::string key = VFolderRecord(*origin_, vfid);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(key);
    if (it != live_.end() && it->second > now) return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(auto m, origin_->HeadOpt(key));
  if (!m) return MissingVFolder(vfid, cfg_.name);
  std::lock_guard lk(mu_);
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
  SLUICE_RETURN_IF_ERROR(origin_->PutRecord(key, {{"mode", mode}}));
  std::lock_guard lk(mu_);
  live_[key] = std::chrono::steady_clock::now() + opts_.vfolder_ttl;
  return Status::Ok();
}

Result<std::string> S3Volume::DetachVFolder(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(Writable());
  const std::string key = VFolderRecord(*origin_, vfid);
  SLUICE_ASSIGN_OR_RETURN(auto m, origin_->HeadOpt(key));
  if (!m) return MissingVFolder(vfid, cfg_.name);
  // The trash record first (what EmptyTrash finishes after a crash), then the vfolder's: the
  // vfolder is gone for every node once its record is (within vfolder-ttl for those that saw
  // it).
  const std::string data = ObjectKey(vfid, "");
  SLUICE_RETURN_IF_ERROR(
      origin_->PutRecord(S3FsOp::TrashRecord(*origin_, data), {{"delete", data}}));
  SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key)));
  {
    std::lock_guard lk(mu_);
    live_.erase(key);
  }
  return VFolderPath(vfid);
}

Status S3Volume::CheckVFolder(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(auto m, origin_->HeadOpt(VFolderRecord(*origin_, vfid)));
  return m ? Status::Ok() : MissingVFolder(vfid, cfg_.name);
}

Result<TreeUsage> S3Volume::GetUsage(const VFolderId& vfid) {
  SLUICE_RETURN_IF_ERROR(CheckVFolder(vfid));
  const std::string root = ObjectKey(vfid, "");
  TreeUsage u;
  std::set<std::string> dirs;
  SLUICE_RETURN_IF_ERROR(origin_->ForEachKey(root, [&](const s3c::ObjectInfo& o) {
    std::string rel = o.key.substr(root.size());
    if (rel.empty()) return Status::Ok();
    if (rel.back() == '/')
      rel.pop_back();  // a directory marker
    else {
      u.file_count += 1;
      u.used_bytes += o.size;
    }
    for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
      dirs.insert(rel.substr(0, slash));
    if (o.key.back() == '/') dirs.insert(rel);
    return Status::Ok();
  }));
  u.file_count += dirs.size();
  return u;
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
  std::lock_guard lk(origin_->mu);
  if (!origin_->last_error.empty()) {
    h.status = "unavailable";
    h.status_info = "the origin does not answer: " + origin_->last_error;
  }
  return h;
}

Result<std::string> S3Volume::MountPath(const VFolderId&, std::string_view) {
  return Status(Code::kUnsupported,
                fmt::format("volume {} keeps its data in an S3 origin: there is no path to mount "
                            "(read it through Sluice's APIs)",
                            cfg_.name));
}

Status S3Volume::CopyPrefix(const std::string& from, const std::string& to) {
  return origin_->ForEachKey(from, [&](const s3c::ObjectInfo& o) {
    if (o.key == from) return Status::Ok();  // the root marker: the target has its own
    return origin_
        ->Note(origin_->Client()->Copy(opts_.bucket, o.key, to + o.key.substr(from.size())))
        .status();
  });
}

Status S3Volume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                 const TreeUsage&) {
  SLUICE_RETURN_IF_ERROR(Writable());
  if (&ForwardingVolume::Innermost(from) != this)
    return Status(
        Code::kUnsupported,
        fmt::format("volume {} copies vfolders between its own prefixes only", cfg_.name));
  SLUICE_RETURN_IF_ERROR(Live(src));
  SLUICE_RETURN_IF_ERROR(Live(dst));
  return CopyPrefix(ObjectKey(src, ""), ObjectKey(dst, ""));
}

Status S3Volume::ValidatePath(const VFolderId&, std::string_view relpath) {
  return Parts(relpath).status();
}

Result<DirEntry> S3Volume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  const std::string rel = JoinComponents(parts, parts.size());
  if (parts.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auto rec, origin_->GetRecord(VFolderRecord(*origin_, vfid)));
    if (!rec) return MissingVFolder(vfid, cfg_.name);
    uint32_t perm = 0755;
    if (const auto& j = rec->first; j.contains("mode") && j["mode"].is_number_unsigned())
      perm = j["mode"].get<uint32_t>() & 07777;
    return DirEntryOf("", perm, rec->second.mtime);
  }
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  const std::string key = ObjectKey(vfid, rel);
  SLUICE_ASSIGN_OR_RETURN(auto f, origin_->HeadOpt(key));
  if (f) return FileEntry(parts.back(), *f);
  SLUICE_ASSIGN_OR_RETURN(auto marker, origin_->HeadOpt(key + "/"));
  if (marker) return DirEntryOf(parts.back(), 0755, marker->mtime);
  SLUICE_ASSIGN_OR_RETURN(bool children, origin_->HasChildren(key + "/"));
  if (children) return DirEntryOf(parts.back());
  return Status(Code::kNotFound, fmt::format("'{}' does not exist", rel), ENOENT);
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
  const std::string rel = JoinComponents(parts, parts.size());
  const std::string key = ObjectKey(vfid, rel);
  // One ranged GET answers the attributes and the first bytes (all of a small file).
  std::string head;
  auto got = origin_->Note(origin_->Client()->Get(
      opts_.bucket, key,
      [&](std::string_view p) {
        head.append(p.substr(0, kReadWholeBelow - std::min<size_t>(head.size(), kReadWholeBelow)));
        return Status::Ok();
      },
      std::make_pair(uint64_t{0}, kReadWholeBelow)));
  if (!got.ok() && !IsNotFound(got.status())) {
    // An empty object has no byte 0 to range over (416): its HEAD says so.
    auto h = origin_->HeadOpt(key);
    if (h.ok() && *h && (*h)->size == 0) got = Result<s3c::ObjectInfo>(**h);
  }
  if (got.ok())
    return std::shared_ptr<FileReader>(
        std::make_shared<S3Reader>(origin_, key, FileEntry(parts.back(), *got), std::move(head)));
  if (!IsNotFound(got.status())) return got.status();
  auto dir = Stat(vfid, rel);
  if (dir.ok() && dir->type == EntryType::kDirectory)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is a directory", rel), EISDIR);
  return Status(Code::kNotFound, fmt::format("'{}' does not exist", rel), ENOENT);
}

Result<S3Volume::Level> S3Volume::ReadLevel(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  Level l;
  l.rel = JoinComponents(parts, parts.size());
  SLUICE_ASSIGN_OR_RETURN(l.info, Stat(vfid, l.rel));
  if (l.info.type != EntryType::kDirectory)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", l.rel), ENOTDIR);
  std::string dir = ObjectKey(vfid, l.rel);
  if (!l.rel.empty()) dir += '/';
  SLUICE_ASSIGN_OR_RETURN(l.entries, origin_->ListLevel(dir));
  return l;
}

Result<std::unique_ptr<DirHandle>> S3Volume::OpenDir(const VFolderId& vfid,
                                                     std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(Level l, ReadLevel(vfid, relpath));
  return std::unique_ptr<DirHandle>(
      new S3Dir(this, vfid, std::move(l.rel), std::move(l.info), std::move(l.entries)));
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
  SLUICE_RETURN_IF_ERROR(Writable());
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  // Every directory made gets its marker, so that it outlives what is put in it, as on a file
  // system.
  std::vector<std::string> make;
  for (size_t i = 1; i <= parts.size(); ++i) {
    const std::string here = JoinComponents(parts, i);
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
    make.push_back(ObjectKey(vfid, here) + "/");
  }
  for (const auto& m : make) SLUICE_RETURN_IF_ERROR(origin_->PutMarker(m));
  return Status::Ok();
}

// The parent of `parts` keeps existing once it goes (a marker where it had none), as a
// directory does on a file system.
Status S3Volume::KeepParent(const VFolderId& vfid, const std::vector<std::string>& parts) {
  if (parts.size() < 2) return Status::Ok();
  const std::string parent = ObjectKey(vfid, JoinComponents(parts, parts.size() - 1)) + "/";
  SLUICE_ASSIGN_OR_RETURN(auto pm, origin_->HeadOpt(parent));
  return pm ? Status::Ok() : origin_->PutMarker(parent);
}

Status S3Volume::MoveEntry(const VFolderId& vfid, const std::vector<std::string>& src,
                           const std::vector<std::string>& dst) {
  const std::string from = JoinComponents(src, src.size());
  SLUICE_ASSIGN_OR_RETURN(DirEntry e, Stat(vfid, from));
  SLUICE_RETURN_IF_ERROR(KeepParent(vfid, src));
  const std::string skey = ObjectKey(vfid, from);
  const std::string dkey = ObjectKey(vfid, JoinComponents(dst, dst.size()));
  if (e.type != EntryType::kDirectory) {
    SLUICE_RETURN_IF_ERROR(
        origin_->Note(origin_->Client()->Copy(opts_.bucket, skey, dkey)).status());
    return origin_->Note(origin_->Client()->Delete(opts_.bucket, skey));
  }
  // A directory: every key copied, then every key deleted (not atomic: a crash in between
  // leaves both, never neither).
  SLUICE_RETURN_IF_ERROR(origin_->ForEachKey(skey + "/", [&](const s3c::ObjectInfo& o) {
    return origin_
        ->Note(origin_->Client()->Copy(opts_.bucket, o.key, dkey + o.key.substr(skey.size())))
        .status();
  }));
  SLUICE_ASSIGN_OR_RETURN(auto marker, origin_->HeadOpt(dkey + "/"));
  if (!marker) SLUICE_RETURN_IF_ERROR(origin_->PutMarker(dkey + "/"));
  return origin_->DeletePrefix(skey + "/");
}

Status S3Volume::Rename(const VFolderId& vfid, std::string_view relpath,
                        std::string_view new_name) {
  SLUICE_RETURN_IF_ERROR(ValidateName(new_name));
  SLUICE_ASSIGN_OR_RETURN(auto parts, Parts(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be renamed");
  std::vector<std::string> to = parts;
  to.back() = std::string(new_name);
  return Move(vfid, relpath, JoinComponents(to, to.size()));
}

Status S3Volume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  SLUICE_ASSIGN_OR_RETURN(auto sp, Parts(src));
  SLUICE_ASSIGN_OR_RETURN(auto dp, Parts(dst));
  if (sp.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be moved");
  SLUICE_RETURN_IF_ERROR(Writable());
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  SLUICE_RETURN_IF_ERROR(Stat(vfid, JoinComponents(sp, sp.size())).status());
  // Moving onto an existing directory moves into it, as mv does.
  std::vector<std::string> to = dp;
  auto target = Stat(vfid, JoinComponents(dp, dp.size()));
  if (target.ok() && target->type == EntryType::kDirectory) {
    to.push_back(sp.back());
  } else {
    if (dp.empty()) return Status(Code::kInvalidPath, "the destination is the vfolder root");
    if (dp.size() > 1) {
      SLUICE_ASSIGN_OR_RETURN(DirEntry parent, Stat(vfid, JoinComponents(dp, dp.size() - 1)));
      if (parent.type != EntryType::kDirectory)
        return Status(Code::kInvalidArgument, "the destination's parent is not a directory",
                      ENOTDIR);
    }
  }
  auto there = Stat(vfid, JoinComponents(to, to.size()));
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
  SLUICE_RETURN_IF_ERROR(Writable());
  SLUICE_RETURN_IF_ERROR(Live(vfid));
  std::vector<DirEntry> what;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string rel = JoinComponents(all[i], all[i].size());
    auto e = Stat(vfid, rel);
    if (!e.ok()) {
      if (IsNotFound(e.status()))
        return Status(Code::kNotFound, fmt::format("delete '{}': does not exist", rel), ENOENT);
      return e.status();
    }
    if (e->type == EntryType::kDirectory && !recursive) {
      SLUICE_ASSIGN_OR_RETURN(bool children, origin_->HasChildren(ObjectKey(vfid, rel) + "/"));
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
    const std::string key = ObjectKey(vfid, JoinComponents(parts, parts.size()));
    if (what[i].type == EntryType::kDirectory)
      SLUICE_RETURN_IF_ERROR(origin_->DeletePrefix(key + "/"));
    else
      SLUICE_RETURN_IF_ERROR(origin_->Note(origin_->Client()->Delete(opts_.bucket, key)));
  }
  return Status::Ok();
}

// ---- uploads: not yet (docs/s3-volumes.md)

namespace {
Status NoUploads(const std::string& volume) {
  return Status(Code::kUnsupported,
                fmt::format("volume {} (s3) does not take uploads yet; read and manage files "
                            "through it, write them to the origin directly",
                            volume));
}
}  // namespace

Result<std::string> S3Volume::CreateStaging(const VFolderId&) {
  return NoUploads(cfg_.name);
}
Status S3Volume::DiscardStaging(const VFolderId&, const std::string&) {
  return NoUploads(cfg_.name);
}
Result<StagingState> S3Volume::InspectStaging(const VFolderId&, const std::string&) {
  return NoUploads(cfg_.name);
}
Result<std::unique_ptr<StagingWriter>> S3Volume::OpenStaging(const VFolderId&, const std::string&,
                                                             std::chrono::milliseconds) {
  return NoUploads(cfg_.name);
}
StagingSweep S3Volume::SweepStaging(const std::optional<VFolderId>&, std::chrono::seconds,
                                    const StagingRemoved&) {
  return {};
}

}  // namespace sluice
