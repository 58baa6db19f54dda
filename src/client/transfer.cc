#include "client/transfer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/crypto.h"
#include "common/fd.h"
#include "common/temp_files.h"

namespace sluice::client {

namespace fs = std::filesystem;
using io::s3::Body;
using io::s3::ObjectInfo;
using io::s3::PartInfo;
using io::s3::S3Client;
using json = nlohmann::json;

namespace {

constexpr int kMaxParts = 10000;
constexpr size_t kDeleteBatch = 1000;
// Listing pages the ranges listed in parallel hold together before their turn to be printed
// comes (a page of 1,000 keys is about 250 KB).
constexpr size_t kPagesAhead = 128;

Status Errno(std::string_view what, const std::string& path) {
  return Status::FromErrno(errno, fmt::format("{} '{}'", what, path));
}

// `rel` (a key below the prefix) as a relative local path; refuses what would leave the
// destination: a hostile or odd server can answer any key.
Result<std::string> SafeRelative(std::string_view rel) {
  if (rel.empty() || rel.front() == '/' || rel.find('\0') != std::string_view::npos)
    return Status(Code::kInvalidPath, fmt::format("key part '{}' is not a relative path", rel));
  std::string_view r = rel;
  while (!r.empty()) {
    size_t s = r.find('/');
    std::string_view part = r.substr(0, s);
    if (part == "." || part == ".." || (part.empty() && s != std::string_view::npos))
      return Status(Code::kInvalidPath,
                    fmt::format("key part '{}' would leave the destination", rel));
    if (s == std::string_view::npos) break;
    r.remove_prefix(s + 1);
  }
  return std::string(rel);
}

// Makes (with `make`; else only looks at what exists) the directories `rel` names below
// `root`, one component at a time, and refuses one on the way that is a symlink or not a
// directory: what goes below a local symlink (to a directory elsewhere, say) would land where
// it points. `root` itself is the user's to name, and may be one.
Status DirsBelow(const std::string& root, std::string_view rel, bool make) {
  std::string path = root.empty() ? "." : root;
  if (make) {
    std::error_code ec;
    fs::create_directories(path, ec);  // an error shows at the first component
  }
  while (!rel.empty()) {
    size_t s = rel.find('/');
    if (path.back() != '/') path += '/';
    path += rel.substr(0, s);
    rel = s == std::string_view::npos ? std::string_view() : rel.substr(s + 1);
    struct stat sb {};
    if (::lstat(path.c_str(), &sb) != 0) {
      if (errno != ENOENT) return Errno("cannot use", path);
      if (!make) return Status::Ok();  // nothing there yet: made when its first file comes
      if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST) return Errno("create", path);
      if (::lstat(path.c_str(), &sb) != 0) return Errno("cannot use", path);
    }
    if (!S_ISDIR(sb.st_mode))
      return Status(Code::kInvalidPath, fmt::format("'{}' is {}", path,
                                                    S_ISLNK(sb.st_mode) ? "a symlink (not followed)"
                                                                        : "not a directory"));
  }
  return Status::Ok();
}

// A tree's file `rel` below `root` (cp -r, sync down): its directories as DirsBelow, and its own
// name no symlink either (replacing one would drop the link the user put there; sync skips
// it).
Status TreeFile(const std::string& root, std::string_view rel, bool make) {
  size_t s = rel.rfind('/');
  SLUICE_RETURN_IF_ERROR(
      DirsBelow(root, s == std::string_view::npos ? std::string_view() : rel.substr(0, s), make));
  std::string path = (fs::path(root) / rel).string();
  struct stat sb {};
  if (::lstat(path.c_str(), &sb) == 0 && S_ISLNK(sb.st_mode))
    return Status(Code::kInvalidPath, fmt::format("'{}' is a symlink (not followed)", path));
  return Status::Ok();
}

std::string JoinKey(const std::string& prefix, std::string_view rel) {
  if (prefix.empty() || prefix.back() == '/') return prefix + std::string(rel);
  return prefix + "/" + std::string(rel);
}

// The listing prefix of a "directory" named by a URL: "a/b" lists "a/b/".
std::string DirPrefix(const std::string& key) {
  return key.empty() || key.back() == '/' ? key : key + "/";
}

std::string BaseName(std::string_view key) {
  while (!key.empty() && key.back() == '/') key.remove_suffix(1);
  size_t s = key.rfind('/');
  return std::string(s == std::string_view::npos ? key : key.substr(s + 1));
}

std::string RandomSuffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

// A failure's code as the exit status tells it: the server's or the connection's; a local
// file's error (an errno: EACCES on a directory is not refused credentials) is an I/O error.
Code CauseOf(const Status& st) {
  return st.has_sys_errno() && st.code() != Code::kUnavailable ? Code::kIoError : st.code();
}

Status WriteAll(int fd, std::string_view data, uint64_t* off) {
  while (!data.empty()) {
    ssize_t n = off ? ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(*off))
                    : ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      // A non-blocking stdout (left so by the process that started this one) that is full:
      // waited for. Failed instead, the GET would be resumed and resend what was written.
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd p {
          fd, POLLOUT, 0
        };
        if (::poll(&p, 1, -1) >= 0 || errno == EINTR) continue;
      }
      return Status::FromErrno(errno, "write");
    }
    data.remove_prefix(static_cast<size_t>(n));
    if (off) *off += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// `.sluice-NAME.<16 hex digits>`: a download's temporary file, which only a kill -9 leaves
// behind (preallocated at the object's size, mostly zeros): never uploaded as an object.
bool IsLeftoverTemp(const std::string& name) {
  constexpr size_t kHex = 16;
  if (!name.starts_with(".sluice-") || name.size() < 8 + 1 + kHex + 1) return false;
  if (name[name.size() - kHex - 1] != '.') return false;
  return std::all_of(name.end() - kHex, name.end(), [](char c) {
    return std::isdigit((unsigned char)c) || (c >= 'a' && c <= 'f');
  });
}

struct LocalFile {
  std::string rel, path;
  uint64_t size = 0;
  std::time_t mtime = 0;
};

// Regular files below `root`, symlinks not followed; what is neither file nor directory is
// reported through `skip` and its relative path added to `skipped` (when given).
Result<std::vector<LocalFile>> WalkLocal(const std::string& root,
                                         const std::function<void(const std::string&)>& skip,
                                         std::set<std::string>* skipped = nullptr) {
  std::vector<LocalFile> out;
  std::error_code ec;
  // Paths relative to the root by their text (fs::relative would resolve a symlink entry to
  // its target's path, and costs a stat of every component).
  fs::path base = fs::path(root).lexically_normal();
  if (!base.has_filename() && base.has_parent_path()) base = base.parent_path();
  auto rel_of = [&](const fs::path& p) {
    return p.lexically_normal().lexically_relative(base).generic_string();
  };
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec)  // (by its errno: a tree that is not there is kNotFound, one not readable is not)
    return Status(CodeFromErrno(ec.value()),
                  fmt::format("cannot read '{}': {}", root, ec.message()), ec.value());
  for (; it != end; it.increment(ec)) {
    if (ec) return Status(Code::kIoError, fmt::format("walking '{}': {}", root, ec.message()));
    const auto& e = *it;
    // Only a file gone since its directory was read may be passed over: one that cannot be
    // looked at (a directory readable but not searchable: EACCES) fails the walk, as a
    // directory that cannot be read does. Left out, it read as absent, and `sync --delete`
    // deleted its objects.
    auto unseen = [&](int err) -> Status {
      return Status(CodeFromErrno(err),
                    fmt::format("cannot stat '{}': {}", e.path().string(), std::strerror(err)),
                    err);
    };
    auto st = e.symlink_status(ec);
    if (ec) {
      if (ec.value() == ENOENT) continue;
      return unseen(ec.value());
    }
    if (fs::is_directory(st)) continue;
    std::string path = e.path().string();
    if (IsLeftoverTemp(e.path().filename().string())) {
      // (Not in `skipped`: a sync down with --delete removes it, as it has no object.)
      if (skip) skip(fmt::format("skip: '{}' is a download's leftover temporary file", path));
      continue;
    }
    if (!fs::is_regular_file(st)) {
      if (skip)
        skip(fmt::format("skip: '{}' is {}", path,
                         fs::is_symlink(st) ? "a symlink (not followed)" : "not a regular file"));
      if (skipped) skipped->insert(rel_of(e.path()));
      continue;
    }
    struct stat sb {};
    if (::lstat(path.c_str(), &sb) != 0) {
      if (errno == ENOENT) continue;  // gone meanwhile
      return unseen(errno);
    }
    LocalFile f;
    f.rel = rel_of(e.path());
    f.path = path;
    f.size = static_cast<uint64_t>(sb.st_size);
    f.mtime = sb.st_mtime;
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(),
            [](const LocalFile& a, const LocalFile& b) { return a.rel < b.rel; });
  return out;
}

}  // namespace

Result<S3Url> S3Url::Parse(std::string_view s) {
  if (!Is(s)) return Status(Code::kInvalidArgument, fmt::format("'{}' is not an s3:// URL", s));
  s.remove_prefix(5);
  size_t slash = s.find('/');
  S3Url u;
  u.bucket = std::string(s.substr(0, slash));
  if (slash != std::string_view::npos) u.key = std::string(s.substr(slash + 1));
  if (u.bucket.empty())
    return Status(Code::kInvalidArgument, "the URL names no bucket (s3://BUCKET/KEY)");
  return u;
}

struct Transfer::Job {
  enum Kind { kUpload, kDownload, kDelete } kind = kUpload;
  std::string local, bucket, key;
  // A tree's file (cp -r, sync): `local` is root/rel, written through no symlink below root.
  std::string root, rel;
  uint64_t size = 0;
  std::time_t mtime = 0;  // the source's
  std::string etag;       // a download's object version
  std::vector<std::string> delete_keys;
  bool some_deleted = false;  // the delete was answered, key by key
  // In parts (multipart upload, or parallel ranged GETs), else one unit.
  bool in_parts = false;
  uint64_t part_size = 0;
  int nparts = 1;
  std::mutex mu;
  bool started = false;
  Status start_status;
  std::string upload_id, tmp;
  // Written where it is named, in one stream (the one destination of `cp s3://b/k DST` when it
  // is stdout, a device or a FIFO): no temporary, no parts, no rename.
  bool in_place = false;
  int fd = -1;
  struct stat opened {};             // an upload's source as it was when opened
  std::map<int, PartInfo> existing;  // parts the server already had (resume)
  std::vector<PartInfo> parts;
  std::atomic<int> left{1};
  std::atomic<bool> failed{false};
  std::string error;
  Code code = Code::kOk;  // the failure's

  std::string Remote() const { return "s3://" + bucket + "/" + key; }
};

Transfer::Job& Transfer::AddUpload(std::deque<Job>& jobs, std::string local, std::string bucket,
                                   std::string key, uint64_t size, std::time_t mtime) {
  Job& j = jobs.emplace_back();
  j.kind = Job::kUpload;
  j.local = std::move(local);
  j.bucket = std::move(bucket);
  j.key = std::move(key);
  j.size = size;
  j.mtime = mtime;
  return j;
}

Transfer::Job& Transfer::AddDownload(std::deque<Job>& jobs, std::string bucket, const ObjectInfo& o,
                                     std::string local) {
  Job& j = jobs.emplace_back();
  j.kind = Job::kDownload;
  j.bucket = std::move(bucket);
  j.key = o.key;
  j.local = std::move(local);
  j.size = o.size;
  j.mtime = o.mtime;
  j.etag = o.etag;
  return j;
}

struct Transfer::Unit {
  size_t job;
  int part;  // 0-based; -1 for the whole file
};

Transfer::Transfer(TransferOptions opts) : opts_(std::move(opts)) {
  if (opts_.jobs < 1) opts_.jobs = 1;
  if (opts_.part_size < (5u << 20)) opts_.part_size = 5u << 20;
  if (opts_.state_dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::string base = xdg && *xdg ? xdg : std::string(home && *home ? home : "/tmp") + "/.cache";
    opts_.state_dir = base + "/sluice/uploads";
  }
}

void Transfer::Say(const std::string& line) {
  if (!opts_.say) return;
  std::lock_guard<std::mutex> g(say_mu_);
  opts_.say(line);
}

uint64_t Transfer::PartSizeFor(uint64_t size) const {
  uint64_t ps = opts_.part_size;
  while ((size + ps - 1) / ps > kMaxParts) ps *= 2;
  // Doubling may pass S3's largest part (5 GiB) where the fewest parts that hold the file do
  // not: a file over 40 TiB in 16 MiB parts doubled to 8 GiB.
  constexpr uint64_t kMaxPart = 5ULL << 30;
  if (ps > kMaxPart) ps = std::max<uint64_t>((size + kMaxParts - 1) / kMaxParts, opts_.part_size);
  return ps;
}

std::string Transfer::StatePath(const Job& j) const {
  std::string id = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}", opts_.s3.endpoint, j.bucket, j.key,
                               fs::absolute(j.local).string(), j.size, j.mtime, j.part_size);
  return opts_.state_dir + "/" + HexEncode(Sha256(id)).substr(0, 32) + ".json";
}

Status Transfer::StartUpload(S3Client& c, Job& j) {
  j.fd = ::open(j.local.c_str(), O_RDONLY | O_CLOEXEC);
  if (j.fd < 0) return Errno("open", j.local);
  // Its parts are planned from the size seen when the tree was walked: a file that changed
  // since (a sync's listing can take minutes) would go up as a prefix of itself.
  struct stat& sb = j.opened;
  if (::fstat(j.fd, &sb) != 0) return Errno("stat", j.local);
  if (static_cast<uint64_t>(sb.st_size) != j.size || sb.st_mtime != j.mtime)
    return Status(Code::kConflict,
                  fmt::format("{} changed since it was listed ({} bytes then, {} now)", j.local,
                              j.size, sb.st_size));
  std::string state = StatePath(j);
  if (opts_.resume) {
    std::ifstream in(state);
    json st = json::parse(in, nullptr, false);
    if (st.is_object() && st.value("upload_id", "") != "") {
      auto parts = c.ListParts(j.bucket, j.key, st["upload_id"].get<std::string>());
      if (parts.ok()) {
        j.upload_id = st["upload_id"].get<std::string>();
        for (auto& p : *parts) j.existing[p.number] = p;
        Say(fmt::format("resume: {} ({} of {} parts already uploaded)", j.Remote(),
                        j.existing.size(), j.nparts));
      } else if (parts.status().code() != Code::kNotFound) {
        return parts.status();
      }
    }
  }
  if (j.upload_id.empty()) {
    SLUICE_ASSIGN_OR_RETURN(j.upload_id, c.CreateMultipart(j.bucket, j.key));
    if (opts_.resume) {
      std::error_code ec;
      fs::create_directories(opts_.state_dir, ec);
      json st = {{"upload_id", j.upload_id}, {"bucket", j.bucket}, {"key", j.key},
                 {"source", j.local},        {"size", j.size},     {"part_size", j.part_size}};
      // Written whole then renamed, so a kill leaves the old state or the new one.
      std::string tmp = state + ".tmp";
      std::ofstream out(tmp, std::ios::trunc);
      out << st.dump(-1, ' ', false, json::error_handler_t::replace);  // a path not UTF-8
      out.close();
      if (!out || ::rename(tmp.c_str(), state.c_str()) != 0)
        Say(fmt::format("warning: cannot keep resume state in {} (the upload still runs)",
                        opts_.state_dir));
    }
  }
  return Status::Ok();
}

Status Transfer::FinishUpload(S3Client& c, Job& j) {
  // Its parts were read over minutes, each checked against itself only: a file written
  // meanwhile (a log, a database, an image being saved) would complete as a splice of two
  // states. Any change since it was opened (its ctime moves with every write) completes
  // nothing; the parts go, as they hold the old bytes.
  struct stat now {};
  if (::fstat(j.fd, &now) != 0) return Errno("stat", j.local);
  auto same = [](const timespec& a, const timespec& b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
  };
  if (now.st_size != j.opened.st_size || !same(now.st_mtim, j.opened.st_mtim) ||
      !same(now.st_ctim, j.opened.st_ctim)) {
    // (The state goes only with the upload: one whose abort failed is resumed, its parts
    // checked by CRC32C, or swept by the server.)
    if (c.AbortMultipart(j.bucket, j.key, j.upload_id).ok()) {
      ::unlink(StatePath(j).c_str());
      j.upload_id.clear();
    }
    return Status(Code::kConflict,
                  fmt::format("{} changed while it was uploaded; the upload was not completed "
                              "(run it again)",
                              j.local));
  }
  std::sort(j.parts.begin(), j.parts.end(),
            [](const PartInfo& a, const PartInfo& b) { return a.number < b.number; });
  auto r = c.CompleteMultipart(j.bucket, j.key, j.upload_id, j.parts);
  if (!r.ok()) return r.status();
  ::unlink(StatePath(j).c_str());
  return Status::Ok();
}

Status Transfer::FinishDownload(Job& j) {
  const bool in_place = j.tmp.empty();  // a device or a pipe (OpenTemp)
  struct timespec ts[2] = {{j.mtime, 0}, {j.mtime, 0}};
  if (!in_place && j.mtime > 0 && ::futimens(j.fd, ts) != 0) return Errno("set the time of", j.tmp);
  // A file written in parts was preallocated at its size: renamed before its bytes reach the
  // disk, a crash could leave the name with the object's size and mtime over zeros, which
  // `sync` would take for up to date ever after. Its bytes are flushed first (a cost small
  // beside the transfer of a file that large; small files are not flushed, as other tools do
  // not).
  if (!in_place && j.in_parts && ::fdatasync(j.fd) != 0) return Errno("flush", j.tmp);
  if (::close(j.fd) != 0) {
    j.fd = -1;
    return Errno("close", in_place ? j.local : j.tmp);
  }
  j.fd = -1;
  if (in_place) return Status::Ok();
  if (::rename(j.tmp.c_str(), j.local.c_str()) != 0) return Errno("rename into", j.local);
  temp_files::Forget(j.tmp);
  j.tmp.clear();
  return Status::Ok();
}

void DropTemp(const std::string& tmp) {
  ::unlink(tmp.c_str());
  temp_files::Forget(tmp);
}

bool WrittenInPlace(const std::string& dst) {
  struct stat sb {};
  return ::stat(dst.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode);
}

namespace {
// "-" is stdout; it and devices get one stream, written as it comes.
bool InPlace(const std::string& dst) {
  return IsStdout(dst) || WrittenInPlace(dst);
}
}  // namespace

Result<std::pair<int, std::string>> OpenTemp(const std::string& dst, bool in_place) {
  if (in_place && IsStdout(dst)) {  // "-", or /dev/stdout even when it is a regular file
    int fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return Errno("write to", "stdout");
    return std::make_pair(fd, std::string());
  }
  if (in_place) {
    int fd = ::open(dst.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", dst);
    return std::make_pair(fd, std::string());
  }
  fs::path p(dst);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  // The name cut to 200 bytes: the temporary's 25 more must not pass NAME_MAX (255) where the
  // file's own name does not.
  std::string tmp = (p.has_parent_path() ? p.parent_path().string() + "/" : std::string()) +
                    ".sluice-" + p.filename().string().substr(0, 200) + "." + RandomSuffix();
  // Ours until renamed into place or removed (DropTemp); a Ctrl-C meanwhile removes it.
  int fd = temp_files::Create(tmp, O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  return std::make_pair(fd, tmp);
}

Status Transfer::RunUnit(S3Client& c, Job& j, const Unit& u) {
  if (j.kind == Job::kDelete) {
    auto batch = no_batch_delete_
                     ? Result<std::vector<Status>>(Status(Code::kUnsupported, "DeleteObjects"))
                     : c.DeleteMany(j.bucket, j.delete_keys);
    if (!batch.ok() && batch.status().code() == Code::kUnsupported) {
      // A server without DeleteObjects (GCS's XML API, for one): a DELETE per key.
      if (!no_batch_delete_.exchange(true))
        Say("the server has no DeleteObjects (" + batch.status().message() +
            "): deleting one key at a time");
      std::vector<Status> refused;
      for (size_t i = 0; i < j.delete_keys.size(); ++i) {
        Status st = c.Delete(j.bucket, j.delete_keys[i]);
        if (st.ok() || st.code() == Code::kNotFound) continue;
        if (st.code() != Code::kUnavailable && st.code() != Code::kUnauthenticated) {
          refused.push_back(st.WithContext(j.delete_keys[i]));
          continue;
        }
        // The server gone or the credentials refused: that is about every key left, which is
        // not tried (nor said) one by one. Nothing deleted yet: the request failed whole.
        if (i == 0) return st;
        const size_t left = j.delete_keys.size() - i;
        j.some_deleted = true;
        for (const auto& f : refused) Say("delete failed: " + f.message());
        Say(fmt::format("delete failed: {} key{} from s3://{}/{}: {}", left, left == 1 ? "" : "s",
                        j.bucket, j.delete_keys[i], st.message()));
        stats_.files_done += i - refused.size();
        stats_.files_failed += refused.size() + left;
        return st;
      }
      batch = std::move(refused);
    }
    SLUICE_ASSIGN_OR_RETURN(auto failed, std::move(batch));
    j.some_deleted = true;  // each key's failure, if any, is said here
    for (const auto& f : failed) Say("delete failed: " + f.message());
    stats_.files_done += j.delete_keys.size() - failed.size();
    stats_.files_failed += failed.size();
    if (failed.empty()) return Status::Ok();
    // Keys refused for one reason say it by the exit status (5: the credentials may not
    // delete them), as a request refused whole does; mixed reasons are a plain failure.
    const bool agree = std::all_of(failed.begin(), failed.end(), [&](const Status& f) {
      return f.code() == failed.front().code();
    });
    return Status(agree ? failed.front().code() : Code::kIoError,
                  fmt::format("{} keys not deleted", failed.size()));
  }
  // A tree's directories are made one by one as its files come, each checked as it is used
  // (not only when the run was planned).
  auto open_temp = [&]() -> Result<std::pair<int, std::string>> {
    if (!j.root.empty()) SLUICE_RETURN_IF_ERROR(TreeFile(j.root, j.rel, true));
    return OpenTemp(j.local, j.in_place);
  };
  if (!j.in_parts) {
    if (j.kind == Job::kUpload) {
      UniqueFd fd(::open(j.local.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) return Errno("open", j.local);
      struct stat sb {};
      if (::fstat(fd.get(), &sb) != 0) return Errno("stat", j.local);
      uint64_t size = static_cast<uint64_t>(sb.st_size);
      auto r = c.Put(j.bucket, j.key, Body{{}, fd.get(), 0, size});
      if (!r.ok()) return r.status();
      stats_.bytes_done += size;
      return Status::Ok();
    }
    SLUICE_ASSIGN_OR_RETURN(auto tf, open_temp());
    j.fd = tf.first;
    j.tmp = tf.second;
    auto r = c.Get(j.bucket, j.key, [&](std::string_view d) {
      stats_.bytes_done += d.size();
      Status st = WriteAll(j.fd, d, nullptr);
      if (st.sys_errno() == EPIPE && IsStdout(j.local)) stats_.stdout_closed = true;
      return st;
    });
    if (!r.ok()) return r.status();
    j.mtime = r->mtime;
    return FinishDownload(j);
  }
  // One part of a large file.
  {
    std::lock_guard<std::mutex> g(j.mu);
    if (!j.started) {
      j.started = true;
      if (j.kind == Job::kUpload) {
        j.start_status = StartUpload(c, j);
      } else {
        auto tf = open_temp();
        if (!tf.ok()) {
          j.start_status = tf.status();
        } else {
          j.fd = tf->first;
          j.tmp = tf->second;
          if (::ftruncate(j.fd, static_cast<off_t>(j.size)) != 0)
            j.start_status = Errno("size", j.tmp);
        }
      }
    }
    if (!j.start_status.ok()) return j.start_status;
  }
  uint64_t off = static_cast<uint64_t>(u.part) * j.part_size;
  uint64_t len = std::min(j.part_size, j.size - off);
  if (j.kind == Job::kDownload) {
    uint64_t at = off;
    auto r = c.Get(
        j.bucket, j.key,
        [&](std::string_view d) {
          stats_.bytes_done += d.size();
          return WriteAll(j.fd, d, &at);
        },
        std::make_pair(off, len), j.etag);
    return r.status();
  }
  PartInfo p;
  p.number = u.part + 1;
  p.size = len;
  auto ex = j.existing.find(p.number);  // read-only once started
  if (ex != j.existing.end() && ex->second.size == len) {
    SLUICE_ASSIGN_OR_RETURN(std::string crc, io::s3::FileCrc32c(j.fd, off, len));
    if (!ex->second.crc32c.empty() && ex->second.crc32c == crc) {
      p.etag = ex->second.etag;
      p.crc32c = crc;
      stats_.parts_reused++;
      stats_.bytes_done += len;
      std::lock_guard<std::mutex> g(j.mu);
      j.parts.push_back(std::move(p));
      return Status::Ok();
    }
  }
  std::string crc;
  SLUICE_ASSIGN_OR_RETURN(
      p.etag, c.UploadPart(j.bucket, j.key, j.upload_id, p.number, Body{{}, j.fd, off, len}, &crc));
  p.crc32c = crc;
  stats_.bytes_done += len;
  std::lock_guard<std::mutex> g(j.mu);
  j.parts.push_back(std::move(p));
  return Status::Ok();
}

void Transfer::Work(std::deque<Job>& jobs, std::vector<Unit>& units, std::atomic<size_t>& next) {
  S3Client c(opts_.s3);
  for (;;) {
    size_t i = next.fetch_add(1);
    if (i >= units.size()) break;
    const Unit& u = units[i];
    Job& j = jobs[u.job];
    Status st;
    try {
      if (!j.failed) st = RunUnit(c, j, u);
    } catch (const std::exception& e) {  // on a worker thread: nothing above would catch it
      st = Status(Code::kInternal, e.what());
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> g(j.mu);
      if (!j.failed.exchange(true)) {
        j.error = st.message();
        j.code = CauseOf(st);
      }
    }
    if (j.left.fetch_sub(1) != 1) continue;
    // The last unit of its job: finish it.
    if (!j.failed && j.in_parts) {
      Status fin = j.kind == Job::kUpload ? FinishUpload(c, j) : FinishDownload(j);
      if (!fin.ok()) {
        j.failed = true;
        j.error = fin.message();
        j.code = CauseOf(fin);
      }
    }
    if (j.fd >= 0) {
      ::close(j.fd);
      j.fd = -1;
    }
    if (!j.tmp.empty()) DropTemp(j.tmp);  // a download that failed
    if (j.kind == Job::kDelete) {
      if (!j.failed) {
        for (const auto& k : j.delete_keys) Say(fmt::format("delete: s3://{}/{}", j.bucket, k));
      } else if (!j.some_deleted) {  // the request failed whole: no key was deleted
        stats_.files_failed += j.delete_keys.size();
        Say(fmt::format("failed: delete of {} key{} in s3://{} (s3://{}/{}{}): {}",
                        j.delete_keys.size(), j.delete_keys.size() == 1 ? "" : "s", j.bucket,
                        j.bucket, j.delete_keys.front(), j.delete_keys.size() > 1 ? ", ..." : "",
                        j.error));
      }
      continue;
    }
    if (j.failed && j.kind == Job::kUpload && j.in_parts && !j.upload_id.empty() && !opts_.resume)
      (void)c.AbortMultipart(j.bucket, j.key, j.upload_id);  // no resuming: its parts go
    if (j.failed && stats_.stdout_closed && IsStdout(j.local)) {
      stats_.files_failed++;  // its reader went away: nothing to say to it (see stdout_closed)
    } else if (j.failed) {
      stats_.files_failed++;
      std::string line = fmt::format("failed: {} {} {}: {}", j.local,
                                     j.kind == Job::kUpload ? "->" : "<-", j.Remote(), j.error);
      if (j.kind == Job::kUpload && j.in_parts && !j.upload_id.empty() && opts_.resume)
        line += " (run the same command again to resume the upload)";
      Say(line);
    } else {
      stats_.files_done++;
      Say(j.kind == Job::kUpload ? fmt::format("upload: {} -> {}", j.local, j.Remote())
                                 : fmt::format("download: {} -> {}", j.Remote(), j.local));
    }
  }
  stats_.retries += c.retries();
}

Code TransferResult::SharedCode() const {
  if (errors.empty()) return Code::kOk;
  if (codes.size() != errors.size()) return Code::kInternal;
  for (Code c : codes)
    if (c != codes.front()) return Code::kInternal;
  return codes.front();
}

Result<TransferResult> Transfer::Run(std::deque<Job>& jobs, int workers) {
  std::vector<Unit> units;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    // Parts are written at their offsets: not into a pipe or a device (Job::in_place).
    if (j.kind != Job::kDelete && j.size >= opts_.multipart_threshold && j.size > 0 &&
        !j.in_place) {
      j.in_parts = true;
      j.part_size = PartSizeFor(j.size);
      j.nparts = static_cast<int>((j.size + j.part_size - 1) / j.part_size);
    }
    j.left = j.nparts;
    if (j.in_parts)
      for (int p = 0; p < j.nparts; ++p) units.push_back({i, p});
    else
      units.push_back({i, -1});
    if (j.kind != Job::kDelete) {
      stats_.files_total++;
      stats_.bytes_total += j.size;
    } else {
      stats_.files_total += j.delete_keys.size();
    }
    if (opts_.dry_run) {
      if (j.kind == Job::kUpload)
        Say(fmt::format("(dry run) upload: {} -> {}", j.local, j.Remote()));
      if (j.kind == Job::kDownload)
        Say(fmt::format("(dry run) download: {} -> {}", j.Remote(), j.local));
      for (const auto& k : j.delete_keys)
        Say(fmt::format("(dry run) delete: s3://{}/{}", j.bucket, k));
    }
  }
  stats_.planning = false;
  TransferResult res;
  if (opts_.dry_run) return res;
  std::atomic<size_t> next{0};
  int n = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(workers > 0 ? workers : opts_.jobs), units.size()));
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) threads.emplace_back([&] { Work(jobs, units, next); });
  for (auto& t : threads) t.join();
  for (auto& j : jobs)
    if (j.failed) {
      res.errors.push_back(j.kind == Job::kDelete
                               ? fmt::format("delete in s3://{}: {}", j.bucket, j.error)
                               : fmt::format("{}: {}", j.Remote(), j.error));
      res.codes.push_back(j.code);
    }
  return res;
}

namespace {
// Reads up to `n` bytes (fewer only at the end of the stream).
Result<size_t> ReadFull(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("read", "stdin");
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}
}  // namespace

bool IsStdout(const std::string& path) {
  if (path == "-") return true;
  struct stat named {};
  struct stat out {};
  return ::stat(path.c_str(), &named) == 0 && ::fstat(STDOUT_FILENO, &out) == 0 &&
         named.st_dev == out.st_dev && named.st_ino == out.st_ino;
}

Result<TransferResult> Transfer::UploadStream(int fd, const S3Url& to) {
  if (to.key.empty() || to.key.back() == '/')
    return Status(Code::kInvalidArgument, "name the object for stdin: s3://BUCKET/KEY");
  stats_.files_total = 1;
  stats_.planning = false;
  const std::string remote = to.ToString();
  if (opts_.dry_run) {
    Say(fmt::format("(dry run) upload: - -> {}", remote));
    return TransferResult{};
  }
  S3Client c(opts_.s3);
  std::string buf(opts_.part_size, '\0');
  SLUICE_ASSIGN_OR_RETURN(size_t n, ReadFull(fd, buf.data(), buf.size()));
  if (n < buf.size()) {  // all of it in the first part: one PUT
    SLUICE_RETURN_IF_ERROR(
        c.Put(to.bucket, to.key, Body{std::string_view(buf.data(), n)}).status());
    stats_.bytes_done += n;
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::string id, c.CreateMultipart(to.bucket, to.key));
    std::vector<PartInfo> parts;
    Status st;
    while (st.ok() && n > 0) {
      if (parts.size() == static_cast<size_t>(kMaxParts)) {
        st = Status(Code::kInvalidArgument,
                    fmt::format("stdin is longer than {} parts (of {} bytes, doubling every "
                                "1,000): give a larger --part-size",
                                kMaxParts, opts_.part_size));
        break;
      }
      PartInfo p;
      p.number = static_cast<int>(parts.size()) + 1;
      p.size = n;
      auto etag = c.UploadPart(to.bucket, to.key, id, p.number,
                               Body{std::string_view(buf.data(), n)}, &p.crc32c);
      if (!etag.ok()) {
        st = etag.status();
        break;
      }
      p.etag = std::move(*etag);
      parts.push_back(std::move(p));
      stats_.bytes_done += n;
      // A stream's length is not known: every 1000 parts the part size doubles (S3 takes parts
      // of any sizes from 5 MiB to 5 GiB): 10,000 parts of 16 MiB would stop a stream at 156 GiB.
      if (parts.size() % 1000 == 0 && buf.size() * 2 <= (5ULL << 30)) buf.resize(buf.size() * 2);
      auto next = ReadFull(fd, buf.data(), buf.size());
      if (next.ok())
        n = *next;
      else
        st = next.status();
    }
    if (st.ok()) st = c.CompleteMultipart(to.bucket, to.key, id, parts).status();
    if (!st.ok()) {
      // Nothing to resume from a stream: the parts go.
      (void)c.AbortMultipart(to.bucket, to.key, id);
      return st;
    }
  }
  stats_.files_done++;
  Say(fmt::format("upload: - -> {}", remote));
  return TransferResult{};
}

Result<TransferResult> Transfer::Copy(std::string_view src, std::string_view dst, bool recursive) {
  std::deque<Job> jobs;
  bool src_s3 = S3Url::Is(src), dst_s3 = S3Url::Is(dst);
  if (src_s3 == dst_s3)
    return Status(Code::kInvalidArgument,
                  src_s3 ? "copy between two s3:// locations is not supported: one side must be "
                           "a local path"
                         : "one side must be an s3:// URL");
  if (dst_s3) {
    SLUICE_ASSIGN_OR_RETURN(S3Url to, S3Url::Parse(dst));
    if (src == "-") return UploadStream(STDIN_FILENO, to);
    std::string from(src);
    struct stat sb {};
    if (::stat(from.c_str(), &sb) != 0) return Errno("cannot read", from);
    if (S_ISDIR(sb.st_mode)) {
      if (!recursive)
        return Status(Code::kInvalidArgument,
                      fmt::format("'{}' is a directory: use --recursive", from));
      SLUICE_ASSIGN_OR_RETURN(auto files, WalkLocal(from, [&](const std::string& l) {
                                Say(l);
                                stats_.files_skipped++;
                              }));
      for (auto& f : files)
        AddUpload(jobs, f.path, to.bucket, JoinKey(to.key, f.rel), f.size, f.mtime);
    } else if (S_ISREG(sb.st_mode)) {
      AddUpload(jobs, from, to.bucket,
                to.key.empty() || to.key.back() == '/' ? to.key + BaseName(from) : to.key,
                static_cast<uint64_t>(sb.st_size), sb.st_mtime);
    } else {
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a regular file", from));
    }
    return Run(jobs);
  }
  SLUICE_ASSIGN_OR_RETURN(S3Url from, S3Url::Parse(src));
  std::string to(dst);
  if (!recursive) {
    if (from.key.empty() || from.key.back() == '/')
      return Status(Code::kInvalidArgument,
                    fmt::format("'{}' names no object: use --recursive for a prefix", src));
    S3Client c(opts_.s3);
    SLUICE_ASSIGN_OR_RETURN(ObjectInfo info, c.Head(from.bucket, from.key));
    struct stat sb {};
    bool to_dir = !IsStdout(to) && ((!to.empty() && to.back() == '/') ||
                                    (::stat(to.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)));
    info.key = from.key;
    Job& j = AddDownload(jobs, from.bucket, info,
                         to_dir ? (fs::path(to) / BaseName(from.key)).string() : to);
    j.in_place = !to_dir && InPlace(to);
    return Run(jobs);
  }
  if (IsStdout(to)) return Status(Code::kInvalidArgument, "a prefix cannot go to stdout");
  std::string prefix = DirPrefix(from.key);
  std::vector<ObjectInfo> objects;
  SLUICE_RETURN_IF_ERROR(ListKeys(
      opts_.s3, S3Url{from.bucket, prefix}, true, opts_.jobs,
      [&](const ObjectInfo& o) { objects.push_back(o); }, nullptr));
  for (auto& o : objects) {
    if (o.key.size() <= prefix.size()) continue;  // the prefix's own marker
    std::string_view rest = std::string_view(o.key).substr(prefix.size());
    bool marker = rest.back() == '/';
    auto rel = SafeRelative(marker ? rest.substr(0, rest.size() - 1) : rest);
    if (!rel.ok()) {
      Say(fmt::format("skip: s3://{}/{}: {}", from.bucket, o.key, rel.status().message()));
      stats_.files_skipped++;
      continue;
    }
    // Nothing is written through a symlink in the destination (to a directory elsewhere,
    // say), as sync does not; an error of another kind fails the file when it runs.
    Status below = marker ? DirsBelow(to, *rel, !opts_.dry_run) : TreeFile(to, *rel, false);
    if (below.code() == Code::kInvalidPath) {
      Say(fmt::format("skip: s3://{}/{}: {}", from.bucket, o.key, below.message()));
      stats_.files_skipped++;
      continue;
    }
    if (marker) continue;  // a "dir/" marker: the directory, made now
    Job& j = AddDownload(jobs, from.bucket, o, (fs::path(to) / *rel).string());
    j.root = to;
    j.rel = *rel;
  }
  return Run(jobs);
}

namespace {
// Whether `rel` is one of `names` or below one ("a/b/c" is below "a/b").
bool Under(const std::set<std::string>& names, const std::string& rel) {
  for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
    if (names.count(rel.substr(0, slash))) return true;
  return names.count(rel) > 0;
}
}  // namespace

Result<TransferResult> Transfer::Sync(std::string_view src, std::string_view dst) {
  bool src_s3 = S3Url::Is(src), dst_s3 = S3Url::Is(dst);
  if (src_s3 == dst_s3)
    return Status(Code::kInvalidArgument, "sync needs one local directory and one s3:// prefix");
  std::string local(src_s3 ? dst : src);
  SLUICE_ASSIGN_OR_RETURN(S3Url remote, S3Url::Parse(src_s3 ? src : dst));
  std::string prefix = DirPrefix(remote.key);
  struct stat sb {};
  bool have_local = ::stat(local.c_str(), &sb) == 0;
  if (have_local && !S_ISDIR(sb.st_mode))
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", local));
  if (!have_local && !src_s3) return Errno("cannot read", local);

  std::vector<LocalFile> files;
  std::set<std::string> skipped;  // local entries not copied: their objects are not extra
  if (have_local) {
    std::function<void(const std::string&)> skip;
    if (!src_s3)
      skip = [&](const std::string& l) {
        Say(l);
        stats_.files_skipped++;
      };
    SLUICE_ASSIGN_OR_RETURN(files, WalkLocal(local, skip, &skipped));
  }
  std::map<std::string, ObjectInfo> objects;
  SLUICE_RETURN_IF_ERROR(ListKeys(
      opts_.s3, S3Url{remote.bucket, prefix}, true, opts_.jobs,
      [&](const ObjectInfo& o) {
        if (o.key.size() > prefix.size() && o.key.back() != '/')
          objects.emplace(o.key.substr(prefix.size()), o);
      },
      nullptr));
  std::map<std::string, const LocalFile*> by_rel;
  for (const auto& f : files) by_rel.emplace(f.rel, &f);

  std::deque<Job> jobs;
  if (!src_s3) {
    for (const auto& f : files) {
      auto it = objects.find(f.rel);
      if (it != objects.end() && it->second.size == f.size && it->second.mtime > 0 &&
          f.mtime <= it->second.mtime) {
        stats_.files_skipped++;
        continue;
      }
      AddUpload(jobs, f.path, remote.bucket, prefix + f.rel, f.size, f.mtime);
    }
    if (opts_.delete_extra) {
      Job* batch = nullptr;
      for (const auto& [rel, o] : objects) {
        // A local symlink is skipped, not absent: the objects of its name and below it stay.
        if (by_rel.count(rel) || Under(skipped, rel)) continue;
        if (!batch || batch->delete_keys.size() >= kDeleteBatch) {
          batch = &jobs.emplace_back();
          batch->kind = Job::kDelete;
          batch->bucket = remote.bucket;
        }
        batch->delete_keys.push_back(o.key);
      }
    }
    return Run(jobs);
  }
  for (const auto& [rel, o] : objects) {
    auto safe = SafeRelative(rel);
    if (!safe.ok()) {
      Say(fmt::format("skip: s3://{}/{}: {}", remote.bucket, o.key, safe.status().message()));
      stats_.files_skipped++;
      continue;
    }
    // Not written through a local symlink (to a directory elsewhere, say): never followed.
    if (Under(skipped, rel)) {
      Say(
          fmt::format("skip: s3://{}/{}: a local name on its path is not a directory (a "
                      "symlink is not followed)",
                      remote.bucket, o.key));
      stats_.files_skipped++;
      continue;
    }
    auto it = by_rel.find(rel);
    // (An object whose time could not be read, 0, is never taken for unchanged: every object
    // of a server whose Last-Modified it cannot parse would be skipped forever.)
    if (it != by_rel.end() && it->second->size == o.size && o.mtime > 0 &&
        o.mtime <= it->second->mtime) {
      stats_.files_skipped++;
      continue;
    }
    Job& j = AddDownload(jobs, remote.bucket, o, (fs::path(local) / rel).string());
    j.root = local;
    j.rel = rel;
  }
  std::vector<std::string> undeleted;  // failures of the run, as a transfer's are
  if (opts_.delete_extra) {
    for (const auto& f : files) {
      if (objects.count(f.rel)) continue;
      if (opts_.dry_run) {
        Say(fmt::format("(dry run) delete: {}", f.path));
      } else if (::unlink(f.path.c_str()) == 0) {
        Say(fmt::format("delete: {}", f.path));
      } else {
        std::string why = std::strerror(errno);
        Say(fmt::format("delete failed: {}: {}", f.path, why));
        undeleted.push_back(fmt::format("{}: not deleted: {}", f.path, why));
        stats_.files_failed++;
      }
    }
  }
  SLUICE_ASSIGN_OR_RETURN(TransferResult res, Run(jobs));
  for (auto& e : undeleted) {
    res.errors.push_back(std::move(e));
    res.codes.push_back(Code::kIoError);
  }
  return res;
}

Result<TransferResult> Transfer::Remove(const S3Url& url, bool recursive) {
  std::deque<Job> jobs;
  // Keys in DeleteObjects batches of up to `per` keys each.
  auto batches = [&](const std::vector<std::string>& ks, size_t per) {
    for (size_t i = 0; i < ks.size(); i += per) {
      Job& j = jobs.emplace_back();
      j.kind = Job::kDelete;
      j.bucket = url.bucket;
      j.delete_keys.assign(ks.begin() + static_cast<long>(i),
                           ks.begin() + static_cast<long>(std::min(ks.size(), i + per)));
    }
  };
  if (!recursive) {
    if (url.key.empty())
      return Status(Code::kInvalidArgument, "name a key, or use --recursive for a prefix");
    batches({url.key}, 1);
    return Run(jobs);
  }
  std::string prefix = DirPrefix(url.key);
  std::vector<std::string> keys, markers;
  SLUICE_RETURN_IF_ERROR(ListKeys(
      opts_.s3, S3Url{url.bucket, prefix}, true, opts_.jobs,
      [&](const ObjectInfo& o) { (o.key.back() == '/' ? markers : keys).push_back(o.key); },
      nullptr));
  // As `rm -r NAME` removes a file NAME, the object the prefix names goes too (and alone, when
  // nothing is below it: before, `rm -r` of a plain object deleted nothing and said nothing).
  if (!url.key.empty() && url.key.back() != '/') {
    S3Client c(opts_.s3);
    auto head = c.Head(url.bucket, url.key);
    if (head.ok())
      keys.push_back(url.key);
    else if (head.status().code() != Code::kNotFound)
      return head.status();
  }
  if (keys.empty() && markers.empty()) {
    Say(fmt::format("nothing to delete under s3://{}/{}", url.bucket, prefix));
    return TransferResult{};
  }
  batches(keys, kDeleteBatch);
  SLUICE_ASSIGN_OR_RETURN(TransferResult res, Run(jobs));
  if (markers.empty() || !res.ok()) return res;
  // Directory markers last, deepest first, one at a time: a directory goes once what it held is
  // gone.
  std::sort(markers.begin(), markers.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  jobs.clear();
  batches(markers, 1);
  return Run(jobs, 1);
}

Status ListKeys(const io::s3::ClientOptions& opts, const S3Url& url, bool recursive, int jobs,
                const std::function<void(const ObjectInfo&)>& on_object,
                const std::function<void(const std::string&)>& on_prefix) {
  S3Client c(opts);
  using Page = std::vector<ObjectInfo>;
  // Lists one key range page by page, handing each page over whole.
  auto list_range = [&](S3Client& cl, const io::s3::KeyRange& r,
                        const std::function<void(Page &&)>& each) -> Status {
    io::s3::ListRequest req;
    req.prefix = url.key;
    req.delimiter = recursive ? "" : "/";
    req.start_after = r.start_after;
    req.end_key = r.end_key;
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(auto page, cl.ListObjects(url.bucket, req));
      for (const auto& p : page.prefixes)
        if (on_prefix) on_prefix(p);
      // A server that ignores end-key (not Sluice) still stops at the range's end.
      auto past = r.end_key.empty()
                      ? page.objects.end()
                      : std::find_if(page.objects.begin(), page.objects.end(),
                                     [&](const ObjectInfo& o) { return o.key > r.end_key; });
      const bool ended = past != page.objects.end();
      SLUICE_ASSIGN_OR_RETURN(bool more, req.Advance(page));
      page.objects.erase(past, page.objects.end());
      if (!page.objects.empty()) each(std::move(page.objects));
      if (ended || !more) return Status::Ok();
      req.start_after.clear();
    }
  };
  auto print = [&](Page&& page) {
    for (const auto& o : page) on_object(o);
  };
  std::vector<io::s3::KeyRange> ranges;
  if (recursive && jobs > 1) {
    auto split = c.ListSplit(url.bucket, url.key, jobs);
    // Other S3 servers do not split (they answer a plain listing, or refuse the parameter):
    // one sequential listing then. A missing bucket or a refused key is the listing's answer.
    Code code = split.status().code();
    if (code == Code::kNotFound || code == Code::kPermissionDenied ||
        code == Code::kUnauthenticated)
      return split.status();
    if (split.ok()) ranges = std::move(*split);
  }
  if (ranges.size() <= 1) return list_range(c, io::s3::KeyRange{}, print);
  // Workers list the ranges, each taking the next one free, and hand over every page as it
  // comes; this thread prints them in key order: the first range not yet printed as its pages
  // arrive, the ones after it when their turn comes. Printing overlaps the listing, and no
  // worker is slowed by it.
  struct RangeState {
    std::deque<Page> pages;
    bool done = false;
    Status status;
  };
  std::vector<RangeState> state(ranges.size());
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  size_t printing = 0, buffered = 0;  // under mu: the range printed, the pages held
  auto worker = [&] {
    S3Client cl(opts);
    for (size_t i; !stop && (i = next.fetch_add(1)) < ranges.size();) {
      Status st = list_range(cl, ranges[i], [&](Page&& page) {
        std::unique_lock<std::mutex> g(mu);
        // Ranges ahead of the one printed hold at most kPagesAhead pages together, then wait
        // for their turn: memory stays bounded, not the bucket (before, 7/8 of it with 8
        // workers); the range printed never waits.
        cv.wait(g, [&] { return stop || i == printing || buffered < kPagesAhead; });
        state[i].pages.push_back(std::move(page));
        ++buffered;
        cv.notify_all();
      });
      std::lock_guard<std::mutex> g(mu);
      state[i].status = std::move(st);
      state[i].done = true;
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(jobs, static_cast<int>(ranges.size())); ++t)
    threads.emplace_back(worker);
  Status st;
  for (size_t i = 0; st.ok() && i < ranges.size();) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return !state[i].pages.empty() || state[i].done; });
    if (state[i].pages.empty()) {  // done, and every page printed
      st = state[i].status;
      printing = ++i;
      cv.notify_all();  // its worker, if it waits, goes on
      continue;
    }
    Page page = std::move(state[i].pages.front());
    state[i].pages.pop_front();
    --buffered;
    cv.notify_all();  // room for the workers
    g.unlock();
    print(std::move(page));
  }
  {
    std::lock_guard<std::mutex> g(mu);
    stop = !st.ok();
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  return st;
}

namespace {

// A stream's bytes handed from the thread that receives them to the one that walks them, in
// blocks: libcurl gives its write callback 16 KiB at a time, and a pipe between the two cost
// a write and a read of every byte (two copies and two system calls each 16 KiB; without
// them the client's CPU in a batch get of 4 KiB objects fell by about a sixth). At most
// `blocks` full blocks wait for the walk; the receiving side then waits for it, as it did on
// a full pipe.
class StreamHandoff {
 public:
  explicit StreamHandoff(size_t block = 256 << 10, size_t blocks = 4)
      : block_(block), blocks_(blocks) {}

  // Receiving side. `full` sees each block before the walk does (the copy to the output).
  // False once the walk stopped reading.
  template <typename Full>
  bool Put(std::string_view d, Full&& full) {
    // Checked at once, not only when a block fills: a walk that failed early (a bad entry) must
    // not leave the fetch receiving up to a block more from a server trickling it.
    if (stopped_.load(std::memory_order_relaxed)) return false;
    while (!d.empty()) {
      if (fill_.capacity() < block_) fill_.reserve(block_);
      size_t n = std::min(d.size(), block_ - fill_.size());
      fill_.append(d.substr(0, n));
      d.remove_prefix(n);
      if (fill_.size() == block_ && !Hand(full)) return false;
    }
    return true;
  }
  // The last block, then the end. False when the walk stopped first.
  template <typename Full>
  bool Finish(Full&& full) {
    bool ok = fill_.empty() || Hand(full);
    std::lock_guard lk(mu_);
    ended_ = true;
    cv_.notify_all();
    return ok && !stopped_;
  }

  // Walking side: the next block, empty at the end. The one returned before is given back.
  std::string_view Next() {
    std::unique_lock lk(mu_);
    if (reading_) {
      spare_.push_back(std::move(*reading_));
      reading_.reset();
      cv_.notify_all();
    }
    cv_.wait(lk, [&] { return !full_.empty() || ended_; });
    if (full_.empty()) return {};
    reading_ = std::move(full_.front());
    full_.pop_front();
    cv_.notify_all();
    return *reading_;
  }
  // The walk reads no more: the receiving side's next Put returns false.
  void Stop() {
    std::lock_guard lk(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 private:
  template <typename Full>
  bool Hand(Full&& full) {
    if (!full(std::string_view(fill_))) return false;
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return full_.size() < blocks_ || stopped_; });
    if (stopped_) {
      fill_.clear();  // written to the output already: Finish must not write it again
      return false;
    }
    full_.push_back(std::move(fill_));
    cv_.notify_all();
    fill_.clear();
    if (!spare_.empty()) {
      fill_ = std::move(spare_.back());
      spare_.pop_back();
      fill_.clear();
    }
    return true;
  }

  const size_t block_, blocks_;
  std::string fill_;  // the receiving side's, unlocked
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> full_;        // blocks for the walk, in order
  std::vector<std::string> spare_;      // blocks the walk is done with, for reuse
  std::optional<std::string> reading_;  // the block the walk reads now
  bool ended_ = false;
  std::atomic<bool> stopped_ = false;  // set under mu_; read without it by Put
};

la_ssize_t ReadHandoff(struct archive*, void* h, const void** buf) {
  std::string_view b = static_cast<StreamHandoff*>(h)->Next();
  *buf = b.data();
  return static_cast<la_ssize_t>(b.size());
}

// Reads a batch get's TAR stream from `in_stream` to its end: extracts the entries below `dir`
// (refusing names that would leave it), or with `dir` empty only walks them; counts the
// objects received whole and keeps the manifest's text.
Status ReadBatchTar(StreamHandoff& in_stream, const std::string& dir, BatchGetResult* res,
                    std::string* manifest, TransferStats* stats) {
  std::unique_ptr<archive, decltype(&archive_read_free)> in(archive_read_new(), archive_read_free);
  std::unique_ptr<archive, decltype(&archive_write_free)> out(
      dir.empty() ? nullptr : archive_write_disk_new(), archive_write_free);
  archive_read_support_format_tar(in.get());
  // The writer makes the directories (times set at its end); files are written here.
  if (out)
    archive_write_disk_set_options(out.get(), ARCHIVE_EXTRACT_TIME |
                                                  ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                                  ARCHIVE_EXTRACT_SECURE_SYMLINKS);
  if (archive_read_open(in.get(), &in_stream, nullptr, ReadHandoff, nullptr) != ARCHIVE_OK)
    return Status(Code::kUnavailable, fmt::format("batch get: {}", archive_error_string(in.get())));
  auto broke = [&](const std::string& where) {
    const char* why = archive_error_string(in.get());
    return Status(Code::kUnavailable, fmt::format("batch get: the stream broke off{}: {}", where,
                                                  why ? why : "truncated"));
  };
  for (;;) {
    archive_entry* e = nullptr;
    int r = archive_read_next_header(in.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK) return broke("");
    std::string name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    if (name == "__manifest__.json") {
      char buf[65536];
      la_ssize_t n;
      while ((n = archive_read_data(in.get(), buf, sizeof buf)) > 0)
        manifest->append(buf, static_cast<size_t>(n));
      if (n < 0) return broke(" in the manifest");
      continue;
    }
    if (name.rfind("__404__/", 0) == 0 || name.rfind("__error__/", 0) == 0) {
      res->placeholders++;
      if (stats) stats->files_failed++;  // the progress line's (the summary counts again)
      continue;
    }
    if (!out) {
      if (archive_read_data_skip(in.get()) != ARCHIVE_OK)
        return broke(fmt::format(" in '{}'", name));
      res->entries++;
      if (stats) stats->files_done++;
      continue;
    }
    if (name.empty() ||
        !SafeRelative(name.back() == '/' ? name.substr(0, name.size() - 1) : name).ok())
      return Status(Code::kInvalidPath,
                    fmt::format("batch get: entry '{}' would leave '{}'", name, dir));
    // Objects are files (and directories): a link or a device in the stream comes from a
    // server that is not Sluice's batch get, and a hard link's target could name any file
    // (libarchive would link it in, then write the entry's data into it).
    const auto type = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) || (type != AE_IFREG && type != AE_IFDIR))
      return Status(Code::kInvalidArgument,
                    fmt::format("batch get: entry '{}' is {}, not an object; not extracted", name,
                                archive_entry_hardlink(e) ? "a hard link" : "not a regular file"));
    std::string path = dir + "/" + name;
    if (type == AE_IFDIR) {
      archive_entry_set_pathname(e, path.c_str());
      if (archive_write_header(out.get(), e) != ARCHIVE_OK ||
          archive_write_finish_entry(out.get()) != ARCHIVE_OK)
        return Status(Code::kIoError,
                      fmt::format("extract '{}': {}", path, archive_error_string(out.get())));
    } else {
      // Written under a temporary name beside its own and renamed into place whole, as a
      // download is: a stream broken in its data leaves no partial file, and a file already
      // there stays as it was (libarchive's writer, freed mid-entry, would finish the entry:
      // zeros up to its size and the header's time, a file a later sync takes for the object).
      size_t slash = name.rfind('/');
      Status dirs = DirsBelow(dir, slash == std::string::npos ? "" : name.substr(0, slash), true);
      if (!dirs.ok()) return dirs.WithContext(fmt::format("extract '{}'", path));
      SLUICE_ASSIGN_OR_RETURN(auto tf, OpenTemp(path, false));
      UniqueFd file(tf.first);
      const std::string tmp = tf.second;
      auto drop = [&](Status st) {
        file.reset();
        DropTemp(tmp);
        return st;
      };
      const void* block;
      size_t size;
      la_int64_t off;
      while ((r = archive_read_data_block(in.get(), &block, &size, &off)) == ARCHIVE_OK) {
        uint64_t at = static_cast<uint64_t>(off);
        Status w =
            WriteAll(file.get(), std::string_view(static_cast<const char*>(block), size), &at);
        if (!w.ok())
          return drop(Status(Code::kIoError, fmt::format("extract '{}': {}", path, w.message()),
                             w.sys_errno()));
      }
      if (r != ARCHIVE_EOF) return drop(broke(fmt::format(" in '{}'", name)));
      // A sparse entry's hole at its end; the object's time, as a download keeps it.
      struct timespec ts[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                               {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
      if (::ftruncate(file.get(), static_cast<off_t>(archive_entry_size(e))) != 0 ||
          (archive_entry_mtime_is_set(e) && ::futimens(file.get(), ts) != 0))
        return drop(Errno("extract into", tmp));
      if (::close(file.release()) != 0) return drop(Errno("close", tmp));
      if (::rename(tmp.c_str(), path.c_str()) != 0) return drop(Errno("rename into", path));
      temp_files::Forget(tmp);
    }
    res->entries++;
    if (stats) stats->files_done++;
  }
  // What follows the archive's end (padding) is taken too, so that the receiving side never
  // finds the walk stopped, and a TAR file written alongside gets every byte.
  while (!in_stream.Next().empty()) {
  }
  return Status::Ok();
}

// The manifest's top-level "ok" and "errors" (false: it is not a JSON object); everything
// below the top level (its item list) is dropped as it is parsed, never kept.
bool ManifestCounts(const std::string& manifest, uint64_t* ok, uint64_t* errors) {
  const json j = json::parse(
      manifest,
      [](int depth, json::parse_event_t ev, json& v) {
        if (depth > 1) return false;
        return ev != json::parse_event_t::key || v == "ok" || v == "errors";
      },
      /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto count = [&](const char* name, uint64_t* out) {
    if (auto it = j.find(name); it != j.end() && it->is_number_unsigned())
      *out = it->get<uint64_t>();
  };
  count("ok", ok);
  count("errors", errors);
  return true;
}

}  // namespace

Result<BatchGetResult> BatchGet(const io::s3::ClientOptions& opts, const std::string& bucket,
                                const std::vector<std::string>& keys, const BatchGetOptions& bo,
                                TransferStats* stats) {
  if (keys.empty()) return Status(Code::kInvalidArgument, "no keys to get");
  // Written item by item: a document of 100,000 items costs the client more than the stream.
  auto quoted = [](const std::string& v) -> Result<std::string> {
    try {
      return json(v).dump();
    } catch (const json::exception&) {
      return Status(Code::kInvalidArgument, "a key or bucket name that is not UTF-8");
    }
  };
  std::string body = "{\"items\":[";
  body.reserve(keys.size() * 48);
  for (const auto& k : keys) {
    if (body.back() != '[') body += ',';
    if (S3Url::Is(k)) {
      SLUICE_ASSIGN_OR_RETURN(S3Url u, S3Url::Parse(k));
      SLUICE_ASSIGN_OR_RETURN(std::string b, quoted(u.bucket));
      SLUICE_ASSIGN_OR_RETURN(std::string key, quoted(u.key));
      body += "{\"bucket\":" + b + ",\"key\":" + key + '}';
    } else {
      if (bucket.empty())
        return Status(Code::kInvalidArgument,
                      fmt::format("'{}' names no bucket: give s3://BUCKET or s3:// keys", k));
      SLUICE_ASSIGN_OR_RETURN(std::string key, quoted(k));
      body += "{\"key\":" + key + '}';
    }
  }
  body += bo.continue_on_error ? "],\"continue-on-error\":true}" : "],\"continue-on-error\":false}";
  if (stats) {
    stats->files_total = keys.size();
    stats->planning = false;
  }
  S3Client c(opts);
  BatchGetResult res;
  // The stream goes to the TAR file (or stdout) as it comes, block by block, and through a
  // StreamHandoff to ReadBatchTar, which extracts it or only walks it: either way every entry is
  // checked and the manifest read, so the exit status can say whether any item failed.
  int fd = -1;
  std::string tmp;
  if (bo.extract_dir.empty()) {
    fd = STDOUT_FILENO;
    if (!bo.output.empty() && !IsStdout(bo.output)) {
      SLUICE_ASSIGN_OR_RETURN(auto tf, OpenTemp(bo.output, InPlace(bo.output)));
      fd = tf.first;
      tmp = tf.second;
    }
  } else {
    std::error_code ec;
    fs::create_directories(bo.extract_dir, ec);
  }
  // Entries may not be written through symlinks below the directory; the directory's own
  // path may hold some (a scratch disk mounted elsewhere): resolved once here.
  std::string extract_dir = bo.extract_dir;
  if (!extract_dir.empty()) {
    std::error_code ec;
    auto real = fs::canonical(extract_dir, ec);
    if (ec) return Status::FromErrno(ec.value(), fmt::format("cannot use '{}'", extract_dir));
    extract_dir = real.string();
  }
  auto drop_tmp = [&](Status st) {
    if (fd >= 0 && fd != STDOUT_FILENO && ::close(fd) != 0 && st.ok())
      st = Errno("close", tmp.empty() ? bo.output : tmp);
    if (!tmp.empty()) {
      if (st.ok() && ::rename(tmp.c_str(), bo.output.c_str()) != 0)
        st = Errno("rename into", bo.output);
      if (st.ok())
        temp_files::Forget(tmp);
      else
        DropTemp(tmp);
    }
    return st;
  };
  StreamHandoff handoff;
  Status fetch, output;
  bool walk_stopped = false;  // the walk stopped reading: its error is the cause
  const Status not_read(Code::kIoError, "batch get: the stream is no longer read", EPIPE);
  // Each block goes to the TAR file (or stdout) before the walk gets it.
  auto to_output = [&](std::string_view block) {
    if (fd >= 0 && output.ok()) output = WriteAll(fd, block, nullptr);
    return output.ok();
  };
  std::thread reader([&] {
    fetch = c.BatchGet(bucket, body, [&](std::string_view d) {
      res.bytes += d.size();
      if (stats) stats->bytes_done += d.size();
      if (handoff.Put(d, to_output)) return Status::Ok();
      if (!output.ok()) return output;
      walk_stopped = true;
      return not_read;
    });
    if (!handoff.Finish(to_output) && fetch.ok()) {
      walk_stopped = output.ok();
      fetch = output.ok() ? not_read : output;
    }
  });
  std::string manifest;
  Status scan = ReadBatchTar(handoff, extract_dir, &res, &manifest, stats);
  handoff.Stop();  // a failed walk stops the fetch
  reader.join();
  // A fetch stopped by the walk (a malformed stream, a name that would leave the directory, a
  // full disk) fails for the walk's reason; otherwise the fetch's error (the connection, the
  // output) says more than the truncated stream the walk then saw.
  Status st = walk_stopped && !scan.ok() ? scan : !fetch.ok() ? fetch : scan;
  // The manifest's counts. The request asks for one, and a batch get ends every stream it
  // finishes with it, counting every item: a stream that ends at an entry's boundary without
  // it (TAR needs no end blocks; a proxy that closes the connection without framing) or with
  // one that counts fewer items was cut short, and must not pass for a whole batch.
  uint64_t m_ok = 0, m_errors = 0;
  auto whole = [&]() -> Status {
    if (manifest.empty())
      return Status(Code::kUnavailable,
                    fmt::format("batch get: the stream ended without its manifest, after {} of "
                                "{} items: cut short, or not a batch get",
                                res.entries + res.placeholders, keys.size()));
    if (!ManifestCounts(manifest, &m_ok, &m_errors))
      return Status(Code::kUnavailable, "batch get: the stream's manifest is not a JSON object");
    if (m_ok + m_errors != keys.size())
      return Status(Code::kUnavailable,
                    fmt::format("batch get: the stream's manifest counts {} items, not the {} "
                                "asked for",
                                m_ok + m_errors, keys.size()));
    return Status::Ok();
  };
  if (st.ok()) st = whole();
  SLUICE_RETURN_IF_ERROR(drop_tmp(st));
  res.ok = m_ok;
  res.errors = std::max(m_errors, res.placeholders);
  if (!bo.extract_dir.empty())
    std::ofstream(bo.extract_dir + "/__manifest__.json", std::ios::trunc) << manifest;
  if (stats) {
    stats->files_done = res.ok;
    stats->files_failed = res.errors;
  }
  return res;
}

}  // namespace sluice::client
