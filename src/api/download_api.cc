// Client-facing downloads (Backend.AI storage-proxy compatible):
//
//   GET|HEAD /download?token=…[&archive=true][&no_cache=true]
//     claims {op: "download", volume, vfid, relpath, archive?, exp}. A regular file is sent
//     zero-copy (sendfile) with Range / If-Range / If-None-Match support; a directory with
//     archive=true (query or claim) streams as a ZIP of its contents.
//   GET|HEAD /download-archive?token=…
//     claims {operation: "download", volume, virtual_folder_id, files[], filename?, exp}: one ZIP
//     of the named files and directories, names relative to the vfolder root.
//
// Files and directories are opened through the Volume interface (readers, directory handles),
// which resolves every path beneath the vfolder; nothing here touches the file system itself
// or writes to the volume.
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>
#include <set>
#include <variant>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/client_api.h"
#include "api/range.h"
#include "api/zip_stream.h"
#include "common/path.h"
#include "common/token_cache.h"

namespace sluice::api {

namespace {

// Query flags as Backend.AI reads them (trafaret ToBool); a bare `?no_cache` means true.
Result<bool> QueryBool(const HttpRequest& req, const char* key) {
  auto it = req.query.find(key);
  if (it == req.query.end()) return false;
  std::string v = it->second;
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v.empty() || v == "1" || v == "true" || v == "t" || v == "yes" || v == "y" || v == "on")
    return true;
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n" || v == "off") return false;
  return Status(Code::kInvalidArgument,
                fmt::format("query parameter '{}' must be true or false", key));
}

Result<VFolderId> ParseTokenVFolderId(const std::string& text) {
  auto vfid = VFolderId::Parse(text);
  if (!vfid.ok())
    return Status(Code::kInvalidArgument,
                  fmt::format("the token's vfolder id is malformed: {}", vfid.status().message()));
  return vfid;
}

// A strong validator from the version a reader saw: the backend's own entity tag, or
// "<ino>-<size>-<mtime ns>" in hex (quotes included) written into `buf` (kMaxETagSize bytes).
std::string_view ETagOf(const DirEntry& e, char* buf) {
  if (!e.etag.empty()) return e.etag;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(e.modified.time_since_epoch());
  return MakeETag(e.ino, e.size, static_cast<uint64_t>(ns.count()), buf);
}

std::time_t MtimeOf(const DirEntry& e) {
  return std::chrono::system_clock::to_time_t(
      std::chrono::time_point_cast<std::chrono::seconds>(e.modified));
}

std::string RandomBoundary() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("sluice-{:016x}{:016x}", rng(), rng());
}

// The body of a multipart/byteranges answer: each part's header, then its bytes read with pread.
class MultipartBody {
 public:
  MultipartBody(std::shared_ptr<FileReader> file, uint64_t size, std::vector<ByteRange> ranges,
                std::string boundary)
      : file_(std::move(file)),
        size_(size),
        ranges_(std::move(ranges)),
        boundary_(std::move(boundary)) {}

  Result<size_t> Fill(char* buf, size_t cap) {
    size_t n = 0;
    while (n < cap) {
      if (pending_pos_ < pending_.size()) {
        size_t k = std::min(cap - n, pending_.size() - pending_pos_);
        std::memcpy(buf + n, pending_.data() + pending_pos_, k);
        pending_pos_ += k;
        n += k;
        continue;
      }
      if (part_ == ranges_.size()) {
        if (closed_) break;
        SetPending(fmt::format("\r\n--{}--\r\n", boundary_));
        closed_ = true;
        continue;
      }
      const ByteRange& r = ranges_[part_];
      if (!part_started_) {
        SetPending(
            fmt::format("{}--{}\r\nContent-Type: application/octet-stream\r\n"
                        "Content-Range: bytes {}-{}/{}\r\n\r\n",
                        part_ == 0 ? "" : "\r\n", boundary_, r.first, r.last(), size_));
        part_started_ = true;
        done_in_part_ = 0;
        continue;
      }
      size_t want = static_cast<size_t>(std::min<uint64_t>(cap - n, r.length - done_in_part_));
      auto got = file_->ReadAt(r.first + done_in_part_, buf + n, want);
      if (!got.ok()) return got.status().WithContext("read for a byte range");
      if (*got == 0) return Status(Code::kIoError, "the file shrank while being sent");
      n += *got;
      done_in_part_ += *got;
      if (done_in_part_ == r.length) {
        ++part_;
        part_started_ = false;
      }
    }
    return n;
  }

 private:
  void SetPending(std::string s) {
    pending_ = std::move(s);
    pending_pos_ = 0;
  }

  std::shared_ptr<FileReader> file_;
  uint64_t size_;
  std::vector<ByteRange> ranges_;
  std::string boundary_;
  std::string pending_;
  size_t pending_pos_ = 0;
  size_t part_ = 0;
  bool part_started_ = false;
  bool closed_ = false;
  uint64_t done_in_part_ = 0;
};

// A problem+json answer with a status the Status table does not have (416).
HttpResponse Problem(unsigned status, const std::string& title, const std::string& msg) {
  HttpResponse r =
      HttpResponse::Json(status, {{"type", "https://api.backend.ai/probs/storage/" + title},
                                  {"title", title},
                                  {"status", status},
                                  {"msg", msg}});
  r.content_type = "application/problem+json";
  return r;
}

HttpResponse ServeFile(const HttpRequest& req, std::shared_ptr<FileReader> file,
                       const std::string& disposition, bool no_cache) {
  const DirEntry& st = file->info();
  const uint64_t size = st.size;
  const std::time_t mtime = MtimeOf(st);
  char etag_buf[kMaxETagSize], date_buf[kHttpDateSize];
  const std::string_view etag = ETagOf(st, etag_buf);
  // The header lines every answer here carries, formatted in one piece: this runs for every
  // small file.
  std::string lines;
  lines.reserve(160 + disposition.size());
  auto line = [&lines](std::string_view name, std::string_view value) {
    lines.append(name).append(": ").append(value).append("\r\n");
  };
  line("Accept-Ranges", "bytes");
  line("ETag", etag);
  line("Last-Modified", FormatHttpDate(mtime, date_buf));
  if (no_cache) line("Cache-Control", "no-store");
  const auto& h = req.msg;

  // A cached copy that is still current needs no body (RFC 9110 §13.1.2, §13.1.3).
  bool not_modified = false;
  if (auto inm = h.find(http::field::if_none_match); inm != h.end()) {
    not_modified = IfNoneMatchMatches(inm->value(), etag);
  } else if (auto ims = h.find(http::field::if_modified_since); ims != h.end()) {
    auto t = ParseHttpDate(ims->value());
    not_modified = t && mtime <= *t;
  }
  if (not_modified) {
    HttpResponse r;
    r.status = 304;
    r.content_type.clear();
    r.header_lines = std::move(lines);
    return r;
  }

  RangeRequest rr;
  if (auto range = h.find(http::field::range); range != h.end()) {
    rr = ParseRange(range->value(), size);
    auto if_range = h.find(http::field::if_range);
    if (if_range != h.end() && !IfRangeMatches(if_range->value(), etag, mtime))
      rr = RangeRequest{};  // the client's copy is stale: send the whole file
  }
  if (rr.kind == RangeRequest::Kind::kUnsatisfiable) {
    HttpResponse r = Problem(416, "range-not-satisfiable",
                             fmt::format("no requested range overlaps the file's {} bytes", size));
    line("Content-Range", fmt::format("bytes */{}", size));
    r.header_lines = std::move(lines);
    return r;
  }

  HttpResponse r;
  r.content_type = "application/octet-stream";
  line("Content-Disposition", disposition);
  uint64_t sent = size;
  if (rr.kind == RangeRequest::Kind::kSatisfiable && rr.ranges.size() == 1) {
    const ByteRange& br = rr.ranges.front();
    r.status = 206;
    line("Content-Range", fmt::format("bytes {}-{}/{}", br.first, br.last(), size));
    r.file = std::move(file);
    r.file_offset = br.first;
    r.file_length = br.length;
    sent = br.length;
  } else if (rr.kind == RangeRequest::Kind::kSatisfiable) {
    r.status = 206;
    std::string boundary = RandomBoundary();
    r.content_type = "multipart/byteranges; boundary=" + boundary;
    sent = 0;
    for (const auto& br : rr.ranges) sent += br.length;
    auto body = std::make_shared<MultipartBody>(std::move(file), size, std::move(rr.ranges),
                                                std::move(boundary));
    r.generator = [body](char* buf, size_t cap) { return body->Fill(buf, cap); };
  } else {
    r.status = 200;
    r.file = std::move(file);
    r.file_offset = 0;
    r.file_length = size;
  }
  r.header_lines = std::move(lines);
  return r;
}

// Owns one archive being streamed; says how it went when the response is done with it.
struct ArchiveJob {
  ArchiveJob(Volume* v, VFolderId vfid, std::vector<ZipSource> sources, std::string label)
      : volume(v), label(label), stream(v, std::move(vfid), std::move(sources), label) {}
  ~ArchiveJob() {
    if (!used) return;  // HEAD, or the client left before the first byte
    if (stream.finished())
      spdlog::info("archive {}: sent, {} files ({} bytes of file data)", label,
                   stream.files_written(), stream.bytes_read());
    else
      spdlog::warn("archive {}: cut short after {} files", label, stream.files_written());
  }
  Volume* volume;
  std::string label;
  ZipStream stream;
  bool used = false;
};

HttpResponse ServeArchive(Volume* volume, const VFolderId& vfid, std::vector<ZipSource> sources,
                          const std::string& filename, std::string label, bool no_cache) {
  HttpResponse r;
  r.status = 200;
  r.content_type = "application/zip";
  r.headers.emplace_back("Content-Disposition", ContentDisposition(filename));
  if (no_cache) r.headers.emplace_back("Cache-Control", "no-store");
  auto job = std::make_shared<ArchiveJob>(volume, vfid, std::move(sources), std::move(label));
  r.generator = [job](char* buf, size_t cap) {
    job->used = true;
    return job->stream.Read(buf, cap);
  };
  return r;
}

// What the vfolder root's upload staging directory answers a download: partial uploads and
// their records are no one's files yet.
Status UploadStaging() {
  return Status(Code::kNotFound,
                fmt::format("{} holds uploads in progress, not files to download", kStagingDirName),
                ENOENT);
}

HttpResponse NotInFolder(const std::string& rel, const VFolderId& vfid, const Status& why) {
  return ErrorResponse(Status(Code::kNotFound,
                              fmt::format("'{}' is not a file in vfolder {}: {}", rel,
                                          vfid.ToString(), why.message()),
                              why.has_sys_errno() ? why.sys_errno() : ENOENT),
                       {rel});
}

// What a verified /download token grants, derived from its claims once and then cached by the
// token's text: every check here depends on the token alone, so a repeat download with the same
// token (a data loader reading a dataset, say) skips them along with the HMAC and JSON parse.
// Errors found here are kept too and answered in the same order as for a fresh token.
struct ServedDownload {
  std::string volume;
  std::string rel;
  Result<VFolderId> vfid = Status(Code::kInternal, "unset");
  Result<std::vector<std::string>> parts = Status(Code::kInternal, "unset");  // of rel
  bool archive = false;                                                       // the `archive` claim
  // Where the files are: the token's volume (or why not).
  Result<Volume*> volume_of = Status(Code::kInternal, "unset");
  // An unmanaged vfolder's directory, as the token names it: resolved (realpath, which may
  // wait on a disk) at each request, on the worker pool, into a tree of volume "noop".
  std::optional<std::string> unmanaged;
  std::string disposition;  // Content-Disposition for the file's name
  // The volume's own shortcut to the file (PrepareLookup), for the volume it was made by.
  const Volume* hint_volume = nullptr;
  std::shared_ptr<const LookupHint> hint;
};

using GrantCache = VerifiedTokenCache<ServedDownload>;

// 16 Ki verified tokens, a few hundred bytes each: a dataset's worth of per-file tokens.
constexpr size_t kGrantCacheSize = 16384;

// The authenticator of /download: the grant of the request's token (verified, or found in the
// cache), put in the request's context; or the answer that refuses it.
std::optional<HttpResponse> AuthenticateDownload(StorageService* svc, GrantCache& cache,
                                                 HttpRequest& req) {
  auto tok = req.query.find("token");
  const double now = static_cast<double>(std::time(nullptr));
  GrantCache::Ref ref;
  if (tok != req.query.end()) ref = cache.Find(tok->second, now);
  if (!ref) {
    auto grant = svc->tokens().VerifyDownload(tok == req.query.end() ? "" : tok->second);
    if (!grant.ok()) return ErrorResponse(grant.status());
    ServedDownload g;
    g.volume = grant->volume;
    g.vfid = ParseTokenVFolderId(grant->vfid);
    g.rel = grant->relpath;
    g.archive = grant->archive;
    g.volume_of = svc->GetVolume(g.volume);
    if (grant->unmanaged_path && g.volume_of.ok()) {
      if (*g.volume_of != &svc->noop())
        g.volume_of =
            Status(Code::kInvalidArgument, "the token's unmanaged_path is for volume 'noop' only");
      else
        g.unmanaged = grant->unmanaged_path;
    }
    g.parts = SplitRelPath(g.rel);
    if (g.parts.ok() && !g.unmanaged && !g.parts->empty() && g.parts->front() == kStagingDirName)
      g.parts = UploadStaging();
    if (g.parts.ok() && g.vfid.ok()) {
      g.disposition = ContentDisposition(g.parts->empty() ? g.vfid->hex : g.parts->back());
      if (g.volume_of.ok() && !g.unmanaged && !g.parts->empty()) {
        g.hint_volume = *g.volume_of;
        g.hint = (*g.volume_of)->PrepareLookup(*g.vfid, g.rel);
      }
    }
    ref = cache.Insert(tok->second, std::move(g), grant->exp);
  }
  req.ctx.principal.kind = "token";
  req.ctx.principal.grant = std::make_shared<const GrantCache::Ref>(std::move(ref));
  return std::nullopt;
}

// One /download request. With Lookup::kCachedOnly (on an event loop) it answers only what needs
// no I/O, token errors and regular files whose whole path is in the dentry cache, and returns
// nullopt for everything else, which the worker pool then answers with Lookup::kMayBlock.
std::optional<HttpResponse> Download(StorageService* svc, const HttpRequest& req, Lookup lookup) {
  const bool inline_only = lookup == Lookup::kCachedOnly;
  const ServedDownload& g = **static_cast<const GrantCache::Ref*>(req.ctx.principal.grant.get());
  // A cached grant is seldom in the CPU caches (one of many tokens): start fetching what the
  // file's answer needs while the query is checked.
  __builtin_prefetch(g.hint.get());
  __builtin_prefetch(g.disposition.data());
  const std::string& rel = g.rel;
  API_ASSIGN_OR_RESPOND(bool archive, QueryBool(req, "archive"));
  API_ASSIGN_OR_RESPOND(bool no_cache, QueryBool(req, "no_cache"));
  archive = archive || g.archive;
  if (req.query.count("dst_dir"))
    return ErrorResponse(Status(Code::kInvalidArgument,
                                "dst_dir is not supported: the token names the file to download"));
  if (!g.vfid.ok()) return ErrorResponse(g.vfid.status());
  if (!g.volume_of.ok()) return ErrorResponse(g.volume_of.status());
  Volume* volume = *g.volume_of;
  if (g.unmanaged) {
    if (inline_only) return std::nullopt;
    auto canon = svc->noop().CheckUnmanaged(*g.unmanaged);
    if (!canon.ok()) return ErrorResponse(canon.status());
    API_ASSIGN_OR_RESPOND(volume, svc->noop().Tree(*canon));
  }
  const VFolderId& vfid = *g.vfid;
  // Escapes (.., absolute paths, symlinks out) answer like a missing file (the contract's 404).
  if (!g.parts.ok()) return NotInFolder(rel, vfid, g.parts.status());
  auto file =
      volume->OpenReader(vfid, rel, lookup, g.hint_volume == volume ? g.hint.get() : nullptr);
  if (file.ok()) return ServeFile(req, std::move(file).value(), g.disposition, no_cache);
  if (inline_only) return std::nullopt;  // the pool looks again, and may block
  const Status& why = file.status();
  if (why.sys_errno() != EISDIR) {
    Code c = why.code();
    if (c == Code::kInvalidPath || c == Code::kNotFound || why.sys_errno() == ENOTDIR)
      return NotInFolder(rel, vfid, why);
    return ErrorResponse(why, {rel});
  }
  if (!archive)
    return ErrorResponse(Status(Code::kInvalidArgument,
                                fmt::format("'{}' is a directory: add archive=true to download it "
                                            "as a ZIP archive",
                                            rel),
                                EISDIR),
                         {rel});
  API_ASSIGN_OR_RESPOND(std::unique_ptr<DirHandle> dir, volume->OpenDir(vfid, rel));
  // The vfolder root's upload staging directory holds partial uploads: never archived.
  bool is_root = g.parts->empty();
  if (auto root = volume->Stat(vfid, ""); root.ok() && root->ino != 0)
    is_root = root->ino == dir->info().ino;
  std::vector<ZipSource> sources(1);
  ArchiveMember m;
  m.info = dir->info();
  m.dir = std::move(dir);
  sources[0].member = std::move(m);
  sources[0].rel = JoinComponents(*g.parts, g.parts->size());
  sources[0].skip_upload_dir = is_root;
  const std::string name = g.parts->empty() ? vfid.hex : g.parts->back();
  return ServeArchive(volume, vfid, std::move(sources), name + ".zip",
                      fmt::format("{}:{}:{}", g.volume, vfid.ToString(), rel), no_cache);
}

HttpResponse DownloadArchive(StorageService* svc, const HttpRequest& req) {
  const auto& grant = *static_cast<const ArchiveGrant*>(req.ctx.principal.grant.get());
  const std::string& volume = grant.volume;
  API_ASSIGN_OR_RESPOND(bool no_cache, QueryBool(req, "no_cache"));
  const std::optional<std::string>& filename = grant.filename;
  API_ASSIGN_OR_RESPOND(VFolderId vfid, ParseTokenVFolderId(grant.vfid));
  API_ASSIGN_OR_RESPOND(Volume * v, svc->GetVolume(volume));
  if (Status st = v->CheckVFolder(vfid); !st.ok()) return ErrorResponse(st);

  // Every named path is checked before the first byte goes out: escapes, symlinks and special
  // files are refused (400), missing ones are 404.
  struct Member {
    std::string rel;
    bool dir;
  };
  std::vector<Member> members;
  std::set<std::string> seen, dirs;
  for (const std::string& raw : grant.files) {
    auto parts = SplitRelPath(raw);
    if (!parts.ok())
      return ErrorResponse(Status(Code::kInvalidPath, fmt::format("path escapes the vfolder: {}",
                                                                  parts.status().message())),
                           {raw});
    if (parts->empty())
      return ErrorResponse(
          Status(Code::kInvalidPath, "'files' must name paths inside the vfolder, not its root"),
          {raw});
    if (parts->front() == kStagingDirName) return ErrorResponse(UploadStaging(), {raw});
    std::string norm = JoinComponents(*parts, parts->size());
    auto m = OpenArchiveMember(*v, vfid, norm);
    if (!m.ok()) {
      if (m.status().code() == Code::kNotFound)
        return ErrorResponse(
            Status(Code::kNotFound, fmt::format("file not found: '{}'", raw), ENOENT), {raw});
      return ErrorResponse(m.status(), {raw});
    }
    if (!seen.insert(norm).second) continue;
    bool dir = m->is_dir();
    if (dir) dirs.insert(norm);
    members.push_back({norm, dir});
  }
  // A path inside a listed directory comes with that directory: listing it again would put
  // the same name twice in the archive.
  std::vector<ZipSource> sources;
  for (auto& m : members) {
    bool covered = false;
    for (size_t p = m.rel.find('/'); p != std::string::npos && !covered; p = m.rel.find('/', p + 1))
      covered = dirs.count(m.rel.substr(0, p)) > 0;
    if (covered) continue;
    ZipSource s;
    s.arcname = m.rel;
    s.rel = m.rel;
    sources.push_back(std::move(s));
  }
  std::string zip_name;
  if (filename && !filename->empty())
    zip_name = *filename;
  else if (members.size() == 1)
    zip_name = members.front().rel.substr(members.front().rel.rfind('/') + 1) + ".zip";
  else
    zip_name = "archive.zip";
  return ServeArchive(v, vfid, std::move(sources), zip_name,
                      fmt::format("{}:{}:[{} paths]", volume, vfid.ToString(), members.size()),
                      no_cache);
}

}  // namespace

void AddDownloadRoutes(Router& router, StorageService* service) {
  // One cache per router: a token verified with this service's secret is valid only here.
  auto cache = std::make_shared<GrantCache>(kGrantCacheSize);
  RouteGroup files = router.Group(
      [service, cache](HttpRequest& req) { return AuthenticateDownload(service, *cache, req); });
  RouteGroup archives = router.Group([service](HttpRequest& req) -> std::optional<HttpResponse> {
    auto tok = req.query.find("token");
    auto grant = service->tokens().VerifyArchive(tok == req.query.end() ? "" : tok->second);
    if (!grant.ok()) return ErrorResponse(grant.status());
    req.ctx.principal.kind = "token";
    req.ctx.principal.grant = std::make_shared<const ArchiveGrant>(std::move(grant).value());
    return std::nullopt;
  });
  for (auto verb : {http::verb::get, http::verb::head}) {
    Route route{.handler =
                    [service](const HttpRequest& req) {
                      return *Download(service, req, Lookup::kMayBlock);
                    },
                .body_limit = 0};
    // Most downloads are files whose path the kernel has cached: they are answered on the event
    // loop, without a round trip through the worker pool.
    route.try_inline = [service](const HttpRequest& req) {
      return Download(service, req, Lookup::kCachedOnly);
    };
    files.Add(verb, "/download", std::move(route));
    archives.Add(
        verb, "/download-archive",
        Route{
            .handler = [service](const HttpRequest& req) { return DownloadArchive(service, req); },
            .body_limit = 0});
  }
}

}  // namespace sluice::api
