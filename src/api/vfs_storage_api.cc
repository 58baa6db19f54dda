#include "api/vfs_storage_api.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/archive_writer.h"
#include "api/range.h"
#include "common/dir_reader.h"
#include "common/fd.h"
#include "common/path.h"
#include "volume/posix_files.h"

namespace sluice::api {

namespace {

// Bounds on one listing or archive: a walk holds one open directory per level, so the depth
// bounds descriptors and memory; the entry count bounds the time a request may take.
constexpr size_t kMaxDepth = 256;
constexpr uint64_t kMaxEntries = 1000000;
// Request bodies are one short JSON object.
constexpr uint64_t kBodyLimit = 64 << 10;
// Bounds on the configured download-chunk-size, used as the TAR writer's read size (files are
// sent zero-copy and need none).
constexpr uint64_t kMinChunk = 16 << 10, kMaxChunk = 8 << 20;

using Storages = std::map<std::string, VfsStorageConfig, std::less<>>;

// Seconds as Python's os.stat_result.st_mtime computes them (sec + nsec * 1e-9), so that the
// floats match the reference's to the last bit.
double Seconds(const struct timespec& ts) {
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The reference's StorageNotFoundError, whose error code the shared ErrorResponse has no
// subject for.
HttpResponse StorageNotFound(std::string_view name) {
  HttpResponse r = HttpResponse::Json(
      404, {{"type", "https://api.backend.ai/probs/storage/object-not-found"},
            {"title", "Storage Config Not Found"},
            {"status", 404},
            {"msg", fmt::format("No VFS storage configuration found for: {}", name)},
            {"error_code", "storage_read_not-found"}});
  r.content_type = "application/problem+json";
  return r;
}

// str(pathlib.PurePosixPath(p)). The reference prints a listed entry's path as
// str(Path(directory) / relative), from the request's string, so the prefix is normalized the
// way pathlib does it: empty and "." components dropped (so a trailing slash too), exactly two
// leading slashes kept (POSIX leaves "//" implementation-defined), "" and "." giving ".".
std::string PythonPath(std::string_view p) {
  size_t lead = 0;
  while (lead < p.size() && p[lead] == '/') ++lead;
  std::string out = lead == 0 ? "" : lead == 2 ? "//" : "/";
  bool first = true;
  size_t pos = lead;
  while (pos < p.size()) {
    size_t end = p.find('/', pos);
    if (end == std::string_view::npos) end = p.size();
    std::string_view comp = p.substr(pos, end - pos);
    pos = end + 1;
    if (comp.empty() || comp == ".") continue;
    if (!first) out += '/';
    out += comp;
    first = false;
  }
  if (out.empty()) out = ".";
  return out;
}

// Path(parent) / name, for a parent already in PythonPath form.
std::string PythonChild(const std::string& parent, std::string_view name) {
  if (parent == ".") return std::string(name);
  std::string s = parent;
  if (s.back() != '/') s += '/';
  s += name;
  return s;
}

std::string RelChild(const std::string& rel, std::string_view name) {
  return rel.empty() ? std::string(name) : fmt::format("{}/{}", rel, name);
}

// Extension-based types for the file names artifact trees hold; the rest is octet-stream. A
// name's extension is what follows its last dot, unless that dot leads the name (pathlib's
// suffix).
std::string_view GuessContentType(std::string_view name) {
  static const std::map<std::string, std::string_view, std::less<>> kTypes = {
      {"json", "application/json"}, {"txt", "text/plain"},          {"md", "text/markdown"},
      {"csv", "text/csv"},          {"html", "text/html"},          {"htm", "text/html"},
      {"xml", "application/xml"},   {"yaml", "application/yaml"},   {"yml", "application/yaml"},
      {"py", "text/x-python"},      {"tar", "application/x-tar"},   {"gz", "application/gzip"},
      {"tgz", "application/gzip"},  {"bz2", "application/x-bzip2"}, {"xz", "application/x-xz"},
      {"zst", "application/zstd"},  {"zip", "application/zip"},     {"pdf", "application/pdf"},
      {"png", "image/png"},         {"jpg", "image/jpeg"},          {"jpeg", "image/jpeg"},
      {"gif", "image/gif"},         {"svg", "image/svg+xml"},
  };
  constexpr std::string_view kDefault = "application/octet-stream";
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == name.size()) return kDefault;
  std::string ext(name.substr(dot + 1));
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto it = kTypes.find(ext);
  return it == kTypes.end() ? kDefault : it->second;
}

// What every route starts from: the storage, its base directory, and the request's path split
// beneath it.
struct Target {
  const VfsStorageConfig* storage = nullptr;
  UniqueFd base;                   // the base directory (O_PATH)
  std::string raw;                 // the path as sent
  std::vector<std::string> parts;  // its components below the base
  std::string rel;                 // the same joined ("" for the base itself)
  UniqueFd fd;                     // what it reaches (O_PATH), symbolic links followed
  struct stat st {};
};

// Fills `t` from the request, or returns the answer that refuses it. Unlike the reference,
// which refuses "" (ValueError, then 500), "" names the base as "/" and "." do; a leading "/"
// is relative to the base as there. Backslashes stay part of names (the reference turns them
// into separators).
std::optional<HttpResponse> Resolve(const Storages& storages, const HttpRequest& req,
                                    const std::string& key, Target& t) {
  auto params = Params::From(req);
  if (!params.ok()) return ErrorResponse(params.status());
  auto raw = params->Str(key);
  if (!raw.ok()) return ErrorResponse(raw.status());
  t.raw = std::move(raw).value();
  const std::string_view name = req.Param("storage_name");
  auto it = storages.find(name);
  if (it == storages.end()) return StorageNotFound(name);
  t.storage = &it->second;

  std::string_view sent = t.raw;
  sent.remove_prefix(std::min(sent.size(), sent.find_first_not_of('/')));
  auto parts = SplitRelPath(sent);
  if (!parts.ok())
    return ErrorResponse(Status(Code::kInvalidPath, fmt::format("invalid path '{}': {}", t.raw,
                                                                parts.status().message())),
                         {t.raw});
  t.parts = std::move(parts).value();
  t.rel = t.parts.empty() ? std::string() : JoinComponents(t.parts, t.parts.size());

  auto base = OpenDirPath(t.storage->base_path);
  if (!base.ok())
    return ErrorResponse(
        Status(Code::kUnavailable,
               fmt::format("VFS storage '{}' is unavailable: {}", name, base.status().message()),
               base.status().sys_errno()));
  t.base = std::move(base).value();

  auto fd = OpenBeneath(t.base.get(), t.rel, O_PATH);
  if (!fd.ok()) {
    const Status& s = fd.status();
    // (ELOOP, a loop of links, is not an escape: answered as OpenBeneath words it, below.)
    if (s.code() == Code::kInvalidPath && s.sys_errno() != ELOOP)
      return ErrorResponse(
          Status(Code::kInvalidPath,
                 fmt::format("'{}' resolves outside VFS storage '{}'", t.raw, name), s.sys_errno()),
          {t.raw});
    // A missing component, or one that is not a directory, both mean "no such path".
    if (s.code() == Code::kNotFound || s.sys_errno() == ENOTDIR)
      return ErrorResponse(
          Status(Code::kNotFound,
                 fmt::format("'{}' does not exist in VFS storage '{}'", t.raw, name), ENOENT),
          {t.raw});
    return FileError(s, {t.raw});
  }
  t.fd = std::move(fd).value();
  if (::fstat(t.fd.get(), &t.st) != 0)
    return FileError(Status::FromErrno(errno, fmt::format("stat '{}'", t.raw)), {t.raw});
  return std::nullopt;
}

// A problem answer for a walk that ended part way: the body is cut short (the client sees a
// broken chunked body, never a wrong one), so it is only logged.
Status WalkFailed(const std::string& label, Status st) {
  spdlog::warn("{}: cut short: {}", label, st.message());
  return st;
}

// What a walk may not read (permission: a root-owned `lost+found` at a file system's root, a
// colleague's private directory) is left out, and the walk goes on: one such entry would
// otherwise cut off every listing and archive above it, after their 200. An unreadable
// directory is still listed (or archived, empty); logged, the first five per walk, then a count.
class Unreadable {
 public:
  explicit Unreadable(std::string label) : label_(std::move(label)) {}
  // True (logged) when `err` says this process may not read `path`.
  bool Skip(int err, std::string_view path, std::string_view what) {
    if (err != EACCES && err != EPERM) return false;
    if (++n_ <= 5) spdlog::warn("{}: {} '{}' left out: {}", label_, what, path, std::strerror(err));
    return true;
  }
  void Done() const {
    if (n_ > 5) spdlog::warn("{}: {} unreadable entries left out in all", label_, n_);
  }

 private:
  std::string label_;
  uint64_t n_ = 0;
};

// The body of /files: {"files": [...]}, the tree below one directory depth first, pre-order,
// in directory order (as the reference's scandir walk), one entry at a time so that memory
// stays flat whatever the tree's size.
//
// Directories are entered by descriptor without following symbolic links (a directory swapped
// for a link mid-walk is passed over). A symbolic link is listed as the regular file it leads
// to, with that file's size and times, when it resolves beneath the base: the reference stats
// through links, the manager downloads each listed file by its path (which follows the link
// the same way), and model trees such as Hugging Face's cache link snapshot files to blobs. A
// link that dangles, escapes the base, or leads to a directory or anything else is left out
// and never descended into (the reference descends, with no guard against loops). Special
// files (FIFOs, sockets, devices) are left out too: they have nothing to download.
class ListingBody {
 public:
  ListingBody(std::string label, UniqueFd base, DirReader root, std::string rel, std::string shown)
      : label_(std::move(label)), base_(std::move(base)), skipped_(label_) {
    stack_.push_back(Frame{std::move(root), std::move(rel), std::move(shown)});
  }

  Result<size_t> Fill(char* buf, size_t cap) {
    if (failed_) return Status(Code::kInternal, fmt::format("{} already failed", label_));
    size_t n = 0;
    while (n < cap) {
      if (pos_ < pending_.size()) {
        size_t k = std::min(cap - n, pending_.size() - pos_);
        std::memcpy(buf + n, pending_.data() + pos_, k);
        pos_ += k;
        n += k;
        continue;
      }
      pending_.clear();
      pos_ = 0;
      if (done_) break;
      if (!started_) {
        started_ = true;
        pending_ = "{\"files\":[";
        continue;
      }
      if (Status s = NextItem(); !s.ok()) {
        failed_ = true;
        return WalkFailed(label_, std::move(s));
      }
    }
    return n;
  }

 private:
  struct Frame {
    DirReader dir;
    std::string rel;    // below the base, for resolving links
    std::string shown;  // the `path` prefix of its entries
  };

  Status Emit(std::string_view name, const std::string& path, const struct stat& st, bool dir) {
    if (++count_ > kMaxEntries)
      return Status(Code::kTooLarge, fmt::format("{}: more than {} entries", label_, kMaxEntries));
    nlohmann::ordered_json item = {
        {"name", std::string(name)},
        {"type", dir ? "directory" : "file"},
        {"size", dir ? nlohmann::ordered_json(nullptr)
                     : nlohmann::ordered_json(static_cast<uint64_t>(st.st_size))},
        {"modified", Seconds(st.st_mtim)},
        {"created", Seconds(st.st_ctim)},
        {"path", path}};
    if (count_ > 1) pending_ += ',';
    // Names that are not UTF-8 cannot be JSON strings: their bad bytes become U+FFFD.
    pending_ += item.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return Status::Ok();
  }

  // The regular file a symbolic link leads to beneath the base, if it does.
  std::optional<struct stat> FollowLink(const std::string& rel) {
    auto fd = OpenBeneath(base_.get(), rel, O_PATH);
    struct stat st {};
    if (!fd.ok() || ::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return st;
  }

  Status NextItem() {
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      SLUICE_ASSIGN_OR_RETURN(auto e, f.dir.Next());
      if (!e) {
        stack_.pop_back();
        continue;
      }
      std::string name(e->name);
      std::string path = PythonChild(f.shown, name);
      struct stat st {};
      if (::fstatat(f.dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed meanwhile
        if (skipped_.Skip(errno, path, "entry")) continue;
        return Status::FromErrno(errno, fmt::format("stat '{}'", path));
      }
      if (S_ISREG(st.st_mode)) return Emit(name, path, st, false);
      if (S_ISLNK(st.st_mode)) {
        if (auto target = FollowLink(RelChild(f.rel, name)))
          return Emit(name, path, *target, false);
        continue;
      }
      if (!S_ISDIR(st.st_mode)) continue;
      if (stack_.size() >= kMaxDepth)
        return Status(Code::kTooLarge,
                      fmt::format("'{}' is nested deeper than {} levels", path, kMaxDepth));
      auto sub = DirReader::OpenAt(f.dir.fd(), name, path);
      if (!sub.ok()) {
        int err = sub.status().sys_errno();
        if (err == ENOENT || err == ENOTDIR || err == ELOOP) continue;  // removed or replaced
        if (skipped_.Skip(err, path, "the contents of")) return Emit(name, path, st, true);
        return sub.status();
      }
      struct stat now {};
      if (::fstat(sub->fd(), &now) != 0)
        return Status::FromErrno(errno, fmt::format("stat '{}'", path));
      if (now.st_dev != st.st_dev || now.st_ino != st.st_ino) continue;  // replaced meanwhile
      SLUICE_RETURN_IF_ERROR(Emit(name, path, now, true));
      std::string rel = RelChild(f.rel, name);  // `f` dies with the push below
      stack_.push_back(Frame{std::move(sub).value(), std::move(rel), std::move(path)});
      return Status::Ok();
    }
    pending_ = "]}";
    done_ = true;
    skipped_.Done();
    return Status::Ok();
  }

  std::string label_;
  UniqueFd base_;
  Unreadable skipped_;
  std::vector<Frame> stack_;
  uint64_t count_ = 0;
  std::string pending_;
  size_t pos_ = 0;
  bool started_ = false, done_ = false, failed_ = false;
};

// An uncompressed TAR of a directory's contents as Python's tar.add(dir, arcname=".") makes
// it: "." first, then "./name" entries, depth first. Written into a buffer (api/archive_writer.h)
// as the client reads, never to a temporary file (the reference builds one first). Directories are
// entered without following links; symbolic links are stored as links, with their targets as they
// are (never followed); special files are left out. Entries come in directory order (tarfile sorts
// each directory's names, which would take memory growing with a directory's size), and hard links
// are stored as separate copies. Non-ASCII names go into PAX headers (as raw bytes with
// hdrcharset=BINARY when they are not UTF-8, which tarfile decodes with the file system encoding).
class TarBody {
 public:
  TarBody(std::string label, DirReader root, const struct stat& root_st, size_t chunk)
      : label_(std::move(label)), root_st_(root_st), chunk_(chunk), skipped_(label_) {
    stack_.push_back(Frame{std::move(root), "./"});
  }
  ~TarBody() {
    if (used_ && tar_.closed())
      spdlog::info("{}: sent, {} entries ({} bytes of file data)", label_, entries_, bytes_read_);
  }
  TarBody(const TarBody&) = delete;
  TarBody& operator=(const TarBody&) = delete;

  Result<size_t> Read(char* buf, size_t cap) {
    used_ = true;
    if (failed_) return Status(Code::kInternal, fmt::format("{} already failed", label_));
    while (tar_.pending() < cap && !tar_.closed()) {
      if (Status s = Step(); !s.ok()) {
        failed_ = true;
        return WalkFailed(label_, std::move(s));
      }
    }
    return tar_.Take(buf, cap);
  }

 private:
  struct Frame {
    DirReader dir;
    std::string prefix;  // archive name of the directory plus '/'
  };

  Status Start() {
    SLUICE_RETURN_IF_ERROR(tar_.Open());
    return Header(".", root_st_, nullptr);
  }

  // `link`: a symbolic link's target.
  Status Header(const std::string& name, const struct stat& st, const char* link) {
    if (++entries_ > kMaxEntries)
      return Status(Code::kTooLarge, fmt::format("more than {} entries", kMaxEntries));
    ArchiveWriter::Entry e;
    e.name = name;
    e.type = S_ISDIR(st.st_mode)   ? EntryType::kDirectory
             : S_ISLNK(st.st_mode) ? EntryType::kSymlink
                                   : EntryType::kFile;
    e.perm = st.st_mode & 07777;
    e.uid = st.st_uid;
    e.gid = st.st_gid;
    e.size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    e.mtime_s = st.st_mtim.tv_sec;
    e.mtime_ns = st.st_mtim.tv_nsec;
    if (link) e.link = link;
    return tar_.Header(e);
  }

  Status FinishEntry(const std::string& name) { return tar_.FinishEntry(name); }

  Status FileData() {
    size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, chunk_));
    SLUICE_ASSIGN_OR_RETURN(char* at, tar_.ReserveData(want));
    ssize_t n;
    do {
      n = ::pread(file_.get(), at, want, static_cast<off_t>(file_off_));
    } while (n < 0 && errno == EINTR);
    tar_.CommitData(want, n > 0 ? static_cast<size_t>(n) : 0);
    if (n < 0) return Status::FromErrno(errno, fmt::format("read '{}'", file_name_));
    // The header promised the size seen when the file was opened.
    if (n == 0)
      return Status(Code::kIoError, fmt::format("'{}' shrank while being archived", file_name_));
    bytes_read_ += static_cast<uint64_t>(n);
    file_off_ += static_cast<uint64_t>(n);
    file_left_ -= static_cast<uint64_t>(n);
    if (file_left_ > 0) return Status::Ok();
    file_.reset();
    return FinishEntry(file_name_);
  }

  Status NextEntry() {
    Frame& f = stack_.back();
    SLUICE_ASSIGN_OR_RETURN(auto e, f.dir.Next());
    if (!e) {
      stack_.pop_back();
      return Status::Ok();
    }
    std::string name(e->name);
    std::string arcname = f.prefix + name;
    const int dfd = f.dir.fd();
    struct stat st {};
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return Status::Ok();  // removed meanwhile
      if (skipped_.Skip(errno, arcname, "entry")) return Status::Ok();
      return Status::FromErrno(errno, fmt::format("stat '{}'", arcname));
    }
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX + 1];
      ssize_t n = ::readlinkat(dfd, name.c_str(), target, PATH_MAX);
      if (n < 0) {
        if (errno == ENOENT || errno == EINVAL) return Status::Ok();  // removed or replaced
        if (skipped_.Skip(errno, arcname, "link")) return Status::Ok();
        return Status::FromErrno(errno, fmt::format("readlink '{}'", arcname));
      }
      target[n] = '\0';
      SLUICE_RETURN_IF_ERROR(Header(arcname, st, target));
      return FinishEntry(arcname);
    }
    if (S_ISDIR(st.st_mode)) {
      if (stack_.size() >= kMaxDepth)
        return Status(Code::kTooLarge,
                      fmt::format("'{}' is nested deeper than {} levels", arcname, kMaxDepth));
      auto sub = DirReader::OpenAt(dfd, name, arcname);
      if (!sub.ok()) {
        int err = sub.status().sys_errno();
        if (err == ENOENT || err == ENOTDIR || err == ELOOP) return Status::Ok();  // replaced
        if (skipped_.Skip(err, arcname, "the contents of")) {
          SLUICE_RETURN_IF_ERROR(Header(arcname, st, nullptr));
          return FinishEntry(arcname);
        }
        return sub.status();
      }
      struct stat now {};
      if (::fstat(sub->fd(), &now) != 0)
        return Status::FromErrno(errno, fmt::format("stat '{}'", arcname));
      if (now.st_dev != st.st_dev || now.st_ino != st.st_ino) return Status::Ok();
      SLUICE_RETURN_IF_ERROR(Header(arcname, now, nullptr));
      SLUICE_RETURN_IF_ERROR(FinishEntry(arcname));
      std::string prefix = arcname + "/";  // `f` dies with the push below
      stack_.push_back(Frame{std::move(sub).value(), std::move(prefix)});
      return Status::Ok();
    }
    if (!S_ISREG(st.st_mode)) return Status::Ok();  // FIFOs, sockets, devices
    // O_NONBLOCK: a file swapped for a FIFO must not wait for a writer.
    int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ELOOP) return Status::Ok();  // removed or replaced
      if (skipped_.Skip(errno, arcname, "file")) return Status::Ok();
      return Status::FromErrno(errno, fmt::format("open '{}'", arcname));
    }
    UniqueFd file(fd);
    if (::fstat(file.get(), &st) != 0)
      return Status::FromErrno(errno, fmt::format("stat '{}'", arcname));
    if (!S_ISREG(st.st_mode)) return Status::Ok();
    SLUICE_RETURN_IF_ERROR(Header(arcname, st, nullptr));
    if (st.st_size == 0) return FinishEntry(arcname);
    file_ = std::move(file);
    file_name_ = std::move(arcname);
    file_off_ = 0;
    file_left_ = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }

  Status Step() {
    if (!tar_.opened()) return Start();
    if (file_.valid()) return FileData();
    if (!stack_.empty()) return NextEntry();
    skipped_.Done();
    return tar_.Close();
  }

  std::string label_;
  struct stat root_st_;
  ArchiveWriter tar_;
  std::vector<Frame> stack_;
  UniqueFd file_;  // the file whose data is being written
  std::string file_name_;
  uint64_t file_off_ = 0, file_left_ = 0;
  size_t chunk_;  // file data read at a time, straight into the archive
  bool failed_ = false, used_ = false;
  uint64_t entries_ = 0, bytes_read_ = 0;
  Unreadable skipped_;
};

std::string Label(const Target& t, std::string_view what) {
  return fmt::format("vfs storage {} {} '{}'", t.storage->name, what, t.raw);
}

HttpResponse ListFiles(const Storages& storages, const HttpRequest& req) {
  Target t;
  if (auto refused = Resolve(storages, req, "directory", t)) return std::move(*refused);
  if (!S_ISDIR(t.st.st_mode))
    return ErrorResponse(
        Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", t.raw), ENOTDIR),
        {t.raw});
  auto root = DirReader::Open(t.fd.get(), t.raw);
  if (!root.ok()) return FileError(root.status(), {t.raw});
  auto body = std::make_shared<ListingBody>(Label(t, "listing"), std::move(t.base),
                                            std::move(root).value(), t.rel, PythonPath(t.raw));
  HttpResponse r;
  r.status = 200;
  r.content_type = "application/json";
  r.generator = [body](char* buf, size_t cap) { return body->Fill(buf, cap); };
  return r;
}

HttpResponse Download(const Storages& storages, const HttpRequest& req) {
  Target t;
  if (auto refused = Resolve(storages, req, "filepath", t)) return std::move(*refused);
  if (S_ISDIR(t.st.st_mode)) {
    auto root = DirReader::Open(t.fd.get(), t.raw);
    if (!root.ok()) return FileError(root.status(), {t.raw});
    const uint64_t chunk = std::clamp(t.storage->download_chunk_size, kMinChunk, kMaxChunk);
    auto body = std::make_shared<TarBody>(Label(t, "archive"), std::move(root).value(), t.st,
                                          static_cast<size_t>(chunk));
    HttpResponse r;
    r.status = 200;
    r.content_type = "application/x-tar";
    const std::string& name = t.parts.empty() ? t.storage->name : t.parts.back();
    r.headers.emplace_back("Content-Disposition", ContentDisposition(name + ".tar"));
    r.generator = [body](char* buf, size_t cap) { return body->Read(buf, cap); };
    return r;
  }
  if (!S_ISREG(t.st.st_mode))
    return ErrorResponse(
        Status(Code::kInvalidArgument,
               fmt::format("'{}' is neither a regular file nor a directory", t.raw)),
        {t.raw});
  // Opened again for reading, now that it is known to be a regular file (an O_RDONLY open of a
  // device or FIFO could block or have effects); it must still be the same file.
  auto fd = OpenBeneath(t.base.get(), t.rel, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!fd.ok()) return FileError(fd.status(), {t.raw});
  auto file = PosixFileReader::FromFd(std::move(fd).value(), t.raw);
  if (!file.ok()) return FileError(file.status(), {t.raw});
  if ((*file)->info().ino != t.st.st_ino)
    return ErrorResponse(
        Status(Code::kConflict, fmt::format("'{}' was replaced while being opened", t.raw)),
        {t.raw});
  const std::string& name = t.parts.back();
  HttpResponse r;
  r.status = 200;
  r.content_type = std::string(GuessContentType(name));
  r.headers.emplace_back("Content-Disposition", ContentDisposition(name));
  r.file_length = (*file)->size();
  r.file = std::move(file).value();
  return r;
}

// The reference's VFSFileMetaResponse. For a directory, content_length and content_type are
// null (the reference reports the directory's st_size and a type guessed from its name).
HttpResponse Meta(const Storages& storages, const HttpRequest& req) {
  Target t;
  if (auto refused = Resolve(storages, req, "filepath", t)) return std::move(*refused);
  const bool dir = S_ISDIR(t.st.st_mode);
  const std::string_view name = t.parts.empty() ? std::string_view() : t.parts.back();
  nlohmann::ordered_json j = {
      {"filepath", t.raw},
      {"content_length", dir ? nlohmann::ordered_json(nullptr)
                             : nlohmann::ordered_json(static_cast<uint64_t>(t.st.st_size))},
      {"content_type", dir ? nlohmann::ordered_json(nullptr)
                           : nlohmann::ordered_json(std::string(GuessContentType(name)))},
      {"last_modified", Seconds(t.st.st_mtim)},
      {"created", Seconds(t.st.st_ctim)},
      {"is_directory", dir},
      {"metadata",
       {{"mode", fmt::format("0o{:o}", t.st.st_mode)},  // Python's oct(st_mode)
        {"uid", std::to_string(t.st.st_uid)},
        {"gid", std::to_string(t.st.st_gid)}}}};
  return HttpResponse::Text(200, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                            "application/json");
}

}  // namespace

void AddVfsStorageRoutes(RouteGroup& group, const std::vector<VfsStorageConfig>& storages) {
  auto table = std::make_shared<Storages>();
  for (const auto& s : storages) {
    table->emplace(s.name, s);
    // Made when missing, as the reference's VFSStorage does at start: a fresh deployment lists
    // an empty tree (these routes only read) rather than answering 503 until someone makes it.
    std::error_code ec;
    if (std::filesystem::create_directories(s.base_path, ec))
      spdlog::info("vfs storage {}: made its base-path {}", s.name, s.base_path);
    else if (ec)
      spdlog::warn("vfs storage {}: base-path {} is missing and cannot be made: {}", s.name,
                   s.base_path, ec.message());
  }
  auto add = [&](http::verb verb, const char* what,
                 HttpResponse (*fn)(const Storages&, const HttpRequest&)) {
    group.Add(verb, fmt::format("/v1/storages/vfs/{{storage_name}}/{}", what),
              Route{.handler = [table, fn](const HttpRequest& req) { return fn(*table, req); },
                    .body_limit = kBodyLimit});
  };
  add(http::verb::get, "files", &ListFiles);
  add(http::verb::post, "download", &Download);
  add(http::verb::get, "meta", &Meta);
}

}  // namespace sluice::api
