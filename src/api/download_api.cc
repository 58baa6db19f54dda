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
// Every path is resolved beneath the vfolder root fd (openat2 RESOLVE_BENEATH); nothing here
// writes to the volume.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <random>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/client_api.h"
#include "api/range.h"
#include "api/zip_stream.h"
#include "common/path.h"

namespace sluice::api {

namespace {

#define DL_ASSIGN_OR_RESPOND(lhs, expr)                          \
  auto SLUICE_CONCAT(_r_, __LINE__) = (expr);                    \
  if (!SLUICE_CONCAT(_r_, __LINE__).ok())                        \
    return ErrorResponse(SLUICE_CONCAT(_r_, __LINE__).status()); \
  lhs = std::move(SLUICE_CONCAT(_r_, __LINE__)).value()

Result<std::string> StrClaim(const nlohmann::json& claims, const char* key) {
  auto it = claims.find(key);
  if (it == claims.end() || !it->is_string())
    return Status(Code::kInvalidArgument,
                  fmt::format("the token has no claim '{}' (a string)", key));
  return it->get<std::string>();
}

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

struct Folder {
  Volume* volume = nullptr;
  VFolderId vfid;
  std::shared_ptr<UniqueFd> root;  // O_PATH
};

Result<Folder> OpenFolder(StorageService* svc, const std::string& volume,
                          const std::string& vfid_text, Lookup lookup = Lookup::kMayBlock) {
  Folder f;
  auto vfid = VFolderId::Parse(vfid_text);
  if (!vfid.ok())
    return Status(Code::kInvalidArgument,
                  fmt::format("the token's vfolder id is malformed: {}", vfid.status().message()));
  f.vfid = std::move(vfid).value();
  SLUICE_ASSIGN_OR_RETURN(f.volume, svc->GetVolume(volume));
  SLUICE_ASSIGN_OR_RETURN(UniqueFd root, f.volume->OpenVFolderRoot(f.vfid, lookup));
  f.root = std::make_shared<UniqueFd>(std::move(root));
  return f;
}

std::string RandomBoundary() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("sluice-{:016x}{:016x}", rng(), rng());
}

// The body of a multipart/byteranges answer: each part's header, then its bytes read with pread.
class MultipartBody {
 public:
  MultipartBody(std::shared_ptr<UniqueFd> file, uint64_t size, std::vector<ByteRange> ranges,
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
      ssize_t got =
          ::pread(file_->get(), buf + n, want, static_cast<off_t>(r.first + done_in_part_));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Status::FromErrno(errno, "read for a byte range");
      if (got == 0) return Status(Code::kIoError, "the file shrank while being sent");
      n += static_cast<size_t>(got);
      done_in_part_ += static_cast<uint64_t>(got);
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

  std::shared_ptr<UniqueFd> file_;
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

HttpResponse ServeFile(const HttpRequest& req, Volume* volume, UniqueFd fd, const struct stat& st,
                       const std::string& name, bool no_cache) {
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const std::string etag = MakeETag(st);
  std::vector<std::pair<std::string, std::string>> headers = {
      {"Accept-Ranges", "bytes"},
      {"ETag", etag},
      {"Last-Modified", FormatHttpDate(st.st_mtim.tv_sec)}};
  if (no_cache) headers.emplace_back("Cache-Control", "no-store");
  const auto& h = req.msg;

  // A cached copy that is still current needs no body (RFC 9110 §13.1.2, §13.1.3).
  bool not_modified = false;
  if (auto inm = h.find(http::field::if_none_match); inm != h.end()) {
    not_modified = IfNoneMatchMatches(inm->value(), etag);
  } else if (auto ims = h.find(http::field::if_modified_since); ims != h.end()) {
    auto t = ParseHttpDate(ims->value());
    not_modified = t && st.st_mtim.tv_sec <= *t;
  }
  if (not_modified) {
    HttpResponse r;
    r.status = 304;
    r.content_type.clear();
    r.headers = std::move(headers);
    return r;
  }

  RangeRequest rr;
  if (auto range = h.find(http::field::range); range != h.end()) {
    rr = ParseRange(range->value(), size);
    auto if_range = h.find(http::field::if_range);
    if (if_range != h.end() && !IfRangeMatches(if_range->value(), etag, st.st_mtim.tv_sec))
      rr = RangeRequest{};  // the client's copy is stale: send the whole file
  }
  if (rr.kind == RangeRequest::Kind::kUnsatisfiable) {
    HttpResponse r = Problem(416, "range-not-satisfiable",
                             fmt::format("no requested range overlaps the file's {} bytes", size));
    r.headers = std::move(headers);
    r.headers.emplace_back("Content-Range", fmt::format("bytes */{}", size));
    return r;
  }

  HttpResponse r;
  r.content_type = "application/octet-stream";
  r.headers = std::move(headers);
  r.headers.emplace_back("Content-Disposition", ContentDisposition(name));
  auto file = std::make_shared<UniqueFd>(std::move(fd));
  uint64_t sent = size;
  if (rr.kind == RangeRequest::Kind::kSatisfiable && rr.ranges.size() == 1) {
    const ByteRange& br = rr.ranges.front();
    r.status = 206;
    r.headers.emplace_back("Content-Range",
                           fmt::format("bytes {}-{}/{}", br.first, br.last(), size));
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
  if (h.method() != http::verb::head) volume->io_stats().AddRead(sent, 0);
  return r;
}

// Owns one archive being streamed; says how it went when the response is done with it.
struct ArchiveJob {
  ArchiveJob(Volume* v, std::shared_ptr<UniqueFd> root, std::vector<ZipSource> sources,
             std::string label)
      : volume(v), label(label), stream(std::move(root), std::move(sources), label) {}
  ~ArchiveJob() {
    if (!used) return;  // HEAD, or the client left before the first byte
    if (stream.bytes_read() > 0) volume->io_stats().AddRead(stream.bytes_read(), 0);
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

HttpResponse ServeArchive(Volume* volume, std::shared_ptr<UniqueFd> root,
                          std::vector<ZipSource> sources, const std::string& filename,
                          std::string label, bool no_cache) {
  HttpResponse r;
  r.status = 200;
  r.content_type = "application/zip";
  r.headers.emplace_back("Content-Disposition", ContentDisposition(filename));
  if (no_cache) r.headers.emplace_back("Cache-Control", "no-store");
  auto job =
      std::make_shared<ArchiveJob>(volume, std::move(root), std::move(sources), std::move(label));
  r.generator = [job](char* buf, size_t cap) {
    job->used = true;
    return job->stream.Read(buf, cap);
  };
  return r;
}

// fstat, or on an event loop statx(AT_STATX_DONT_SYNC): the attributes the kernel has, without
// asking a network filesystem's server again.
bool StatOpenFile(int fd, Lookup lookup, struct stat* st) {
  if (lookup == Lookup::kMayBlock) return ::fstat(fd, st) == 0;
  struct statx sx;
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_BASIC_STATS, &sx) != 0)
    return false;
  *st = {};
  st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  st->st_ino = sx.stx_ino;
  st->st_mode = sx.stx_mode;
  st->st_size = static_cast<off_t>(sx.stx_size);
  st->st_mtim.tv_sec = sx.stx_mtime.tv_sec;
  st->st_mtim.tv_nsec = sx.stx_mtime.tv_nsec;
  return true;
}

HttpResponse NotInFolder(const std::string& rel, const VFolderId& vfid, const Status& why) {
  return ErrorResponse(Status(Code::kNotFound,
                              fmt::format("'{}' is not a file in vfolder {}: {}", rel,
                                          vfid.ToString(), why.message()),
                              why.has_sys_errno() ? why.sys_errno() : ENOENT),
                       {rel});
}

// One /download request. With Lookup::kCachedOnly (on an event loop) it answers only what needs
// no I/O, token errors and regular files whose whole path is in the dentry cache, and returns
// nullopt for everything else, which the worker pool then answers with Lookup::kMayBlock.
std::optional<HttpResponse> Download(StorageService* svc, const HttpRequest& req, Lookup lookup) {
  const bool inline_only = lookup == Lookup::kCachedOnly;
  DL_ASSIGN_OR_RESPOND(nlohmann::json claims,
                       VerifySessionToken(req, svc->config().secret, "op", "download"));
  DL_ASSIGN_OR_RESPOND(std::string volume, StrClaim(claims, "volume"));
  DL_ASSIGN_OR_RESPOND(std::string vfid_text, StrClaim(claims, "vfid"));
  DL_ASSIGN_OR_RESPOND(std::string rel, StrClaim(claims, "relpath"));
  DL_ASSIGN_OR_RESPOND(bool archive, QueryBool(req, "archive"));
  DL_ASSIGN_OR_RESPOND(bool no_cache, QueryBool(req, "no_cache"));
  if (auto a = claims.find("archive"); a != claims.end() && a->is_boolean() && a->get<bool>())
    archive = true;
  if (req.query.count("dst_dir"))
    return ErrorResponse(Status(Code::kInvalidArgument,
                                "dst_dir is not supported: the token names the file to download"));
  if (claims.contains("unmanaged_path") && !claims["unmanaged_path"].is_null())
    return ErrorResponse(Status(Code::kInvalidArgument,
                                "unmanaged_path is not supported: downloads stay inside "
                                "vfolders"));
  auto folder = OpenFolder(svc, volume, vfid_text, lookup);
  if (!folder.ok() && inline_only) return std::nullopt;
  if (!folder.ok()) return ErrorResponse(folder.status());
  Folder f = std::move(folder).value();

  // Escapes (.., absolute paths, symlinks out) answer like a missing file (the contract's 404).
  auto parts = SplitRelPath(rel);
  if (!parts.ok()) return NotInFolder(rel, f.vfid, parts.status());
  auto fd = OpenBeneath(f.root->get(), rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, lookup);
  if (!fd.ok() && inline_only) return std::nullopt;
  if (!fd.ok()) {
    Code c = fd.status().code();
    if (c == Code::kInvalidPath || c == Code::kNotFound || fd.status().sys_errno() == ENOTDIR)
      return NotInFolder(rel, f.vfid, fd.status());
    return ErrorResponse(fd.status(), {rel});
  }
  struct stat st;
  if (!StatOpenFile(fd->get(), lookup, &st)) {
    if (inline_only) return std::nullopt;
    return ErrorResponse(Status::FromErrno(errno, fmt::format("stat '{}'", rel)), {rel});
  }
  std::string name = parts->empty() ? f.vfid.hex : parts->back();

  if (S_ISREG(st.st_mode))
    return ServeFile(req, f.volume, std::move(fd).value(), st, name, no_cache);
  if (inline_only) return std::nullopt;
  if (!S_ISDIR(st.st_mode))
    return ErrorResponse(
        Status(Code::kInvalidArgument, fmt::format("'{}' is not a regular file", rel)), {rel});
  if (!archive)
    return ErrorResponse(Status(Code::kInvalidArgument,
                                fmt::format("'{}' is a directory: add archive=true to download it "
                                            "as a ZIP archive",
                                            rel),
                                EISDIR),
                         {rel});
  // The vfolder root's upload staging directory holds partial uploads: never archived.
  struct stat root_st;
  bool is_root = ::fstat(f.root->get(), &root_st) == 0 && root_st.st_dev == st.st_dev &&
                 root_st.st_ino == st.st_ino;
  std::vector<ZipSource> sources(1);
  sources[0].member.fd = std::move(fd).value();
  sources[0].member.st = st;
  sources[0].skip_upload_dir = is_root;
  return ServeArchive(f.volume, f.root, std::move(sources), name + ".zip",
                      fmt::format("{}:{}:{}", volume, f.vfid.ToString(), rel), no_cache);
}

HttpResponse DownloadArchive(StorageService* svc, const HttpRequest& req) {
  DL_ASSIGN_OR_RESPOND(nlohmann::json claims,
                       VerifySessionToken(req, svc->config().secret, "operation", "download"));
  DL_ASSIGN_OR_RESPOND(std::string volume, StrClaim(claims, "volume"));
  DL_ASSIGN_OR_RESPOND(std::string vfid_text, StrClaim(claims, "virtual_folder_id"));
  DL_ASSIGN_OR_RESPOND(bool no_cache, QueryBool(req, "no_cache"));
  auto files_it = claims.find("files");
  if (files_it == claims.end() || !files_it->is_array() || files_it->empty())
    return ErrorResponse(Status(Code::kInvalidArgument,
                                "the token has no claim 'files' (a non-empty list of paths)"));
  std::optional<std::string> filename;
  if (auto fn = claims.find("filename"); fn != claims.end() && fn->is_string())
    filename = fn->get<std::string>();
  DL_ASSIGN_OR_RESPOND(Folder f, OpenFolder(svc, volume, vfid_text));

  // Every named path is checked before the first byte goes out: escapes, symlinks and special
  // files are refused (400), missing ones are 404.
  struct Member {
    std::string rel;
    bool dir;
  };
  std::vector<Member> members;
  std::set<std::string> seen, dirs;
  for (const auto& item : *files_it) {
    if (!item.is_string())
      return ErrorResponse(
          Status(Code::kInvalidArgument, "the token's 'files' must be a list of strings"));
    std::string raw = item.get<std::string>();
    auto parts = SplitRelPath(raw);
    if (!parts.ok())
      return ErrorResponse(Status(Code::kInvalidPath, fmt::format("path escapes the vfolder: {}",
                                                                  parts.status().message())),
                           {raw});
    if (parts->empty())
      return ErrorResponse(
          Status(Code::kInvalidPath, "'files' must name paths inside the vfolder, not its root"),
          {raw});
    std::string norm = JoinComponents(*parts, parts->size());
    auto m = OpenArchiveMember(f.root->get(), norm);
    if (!m.ok()) {
      if (m.status().code() == Code::kNotFound)
        return ErrorResponse(
            Status(Code::kNotFound, fmt::format("file not found: '{}'", raw), ENOENT), {raw});
      return ErrorResponse(m.status(), {raw});
    }
    if (!seen.insert(norm).second) continue;
    bool dir = S_ISDIR(m->st.st_mode);
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
  return ServeArchive(f.volume, f.root, std::move(sources), zip_name,
                      fmt::format("{}:{}:[{} paths]", volume, f.vfid.ToString(), members.size()),
                      no_cache);
}

}  // namespace

void AddDownloadRoutes(Router& router, StorageService* service) {
  auto download = [service](const HttpRequest& req) {
    return *Download(service, req, Lookup::kMayBlock);
  };
  auto archive = [service](const HttpRequest& req) { return DownloadArchive(service, req); };
  for (auto verb : {http::verb::get, http::verb::head}) {
    Route route{"/download", download, /*blocking=*/true, /*needs_auth=*/false};
    // Most downloads are files whose path the kernel has cached: they are answered on the event
    // loop, without a round trip through the worker pool.
    route.try_inline = [service](const HttpRequest& req) {
      return Download(service, req, Lookup::kCachedOnly);
    };
    router.Add(verb, "/download", std::move(route));
    router.Add(verb, "/download-archive",
               Route{"/download-archive", archive, /*blocking=*/true,
                     /*needs_auth=*/false});
  }
}

}  // namespace sluice::api
