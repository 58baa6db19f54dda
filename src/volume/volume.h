// The three interfaces every storage backend implements. New storage is added by implementing
// them and registering a factory under the backend name used in config (see registry.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "common/metrics.h"
#include "common/path.h"
#include "common/status.h"
#include "volume/ids.h"

namespace sluice {

// Capability names as Backend.AI reports them in GET /volumes.
inline constexpr const char* kCapVFolder = "vfolder";
inline constexpr const char* kCapQuota = "quota";
inline constexpr const char* kCapMetric = "metric";
inline constexpr const char* kCapFastScan = "fast-scan";
inline constexpr const char* kCapFastSize = "fast-size";
inline constexpr const char* kCapFastFsSize = "fast-fs-size";
inline constexpr const char* kCapFastClone = "fast-clone";

struct QuotaUsage {
  uint64_t used_bytes = 0;
  std::optional<uint64_t> limit_bytes;
};

struct TreeUsage {
  uint64_t file_count = 0;  // every entry below the root: files, directories, symlinks
  uint64_t used_bytes = 0;  // apparent size of the non-directory entries
  // When the figure was last measured on disk, for figures that are maintained rather than
  // measured per request (vfs); unset means "measured just now" (a walk, kernel counters).
  std::optional<std::chrono::system_clock::time_point> measured_at;
};

struct FsUsage {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t available_bytes = 0;
};

enum class EntryType { kFile, kDirectory, kSymlink, kOther };
std::string_view EntryTypeName(EntryType t);

struct DirEntry {
  std::string name;
  EntryType type = EntryType::kOther;
  uint32_t mode = 0;
  uint64_t size = 0;
  std::chrono::system_clock::time_point created;
  std::chrono::system_clock::time_point modified;
  // The last change to the inode (data, attributes, extended attributes, links): what caches
  // of anything stored with a file are checked against.
  std::chrono::system_clock::time_point changed;
  std::optional<std::string> symlink_target;
  // What identifies this version of the content, with size and modified: the inode where the
  // backend has one, and the backend's own entity tag where it keeps one (an origin's ETag).
  // The API derives validators (ETag, Last-Modified) from these.
  uint64_t ino = 0;
  // The device the inode is on, where the backend has one: btrfs subvolumes (each vfolder
  // one) number their inodes alike, so an inode is a file only with its device.
  uint64_t dev = 0;
  std::string etag;
};

// An object of an S3 origin as the reader that reads it names it, so that a writer on that
// origin has it copy the bytes (UploadPartCopy) instead of reading them.
struct OriginObject {
  // Who can copy it: the origin's endpoint and the access key the opening volume reads it
  // with (two volumes on one origin with the same key copy each other's objects there).
  std::string origin;
  std::string bucket, key;
  std::string etag;  // the version opened, unquoted ("": the origin sends none); copies pin it
};
// S3's smallest part (all but an upload's last): a piece shorter than this is never copied on
// the origin, but read and written.
inline constexpr uint64_t kMinOriginPart = 5 << 20;

// An open file of a volume: its attributes when opened, and its bytes.
class FileReader {
 public:
  virtual ~FileReader() = default;
  virtual const DirEntry& info() const = 0;
  uint64_t size() const { return info().size; }
  // Reads up to `n` bytes at `offset`; fewer only at the end of the file (0 there). Blocks.
  virtual Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) = 0;
  // The same, from what is in memory now: kUnavailable (EAGAIN) when some of it would have to
  // come from a device or an origin. For event loops, which must never wait.
  virtual Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) {
    return Status(Code::kUnavailable, "this file cannot be read without waiting", EAGAIN);
  }
  // The file's descriptor where its data is a local file, for zero-copy sends (sendfile) and
  // page-cache probes; -1 otherwise (a remote object).
  virtual int native_fd() const { return -1; }
  // Where the bytes at `offset` lie in a local file, for zero-copy sends (sendfile) and
  // page-cache probes: a descriptor, the offset in it, and how many bytes from there; fd -1
  // when they are in none (a remote object, a cached block not verified yet). Never waits on
  // an origin: event loops ask. The descriptor stays valid until the next call on this reader.
  struct Extent {
    int fd = -1;
    uint64_t fd_offset = 0;
    uint64_t length = 0;
  };
  virtual Extent LocalExtent(uint64_t offset) {
    const int fd = native_fd();
    if (fd < 0 || offset >= size()) return {};
    return {fd, offset, size() - offset};
  }
  // Bytes of this file sent from native_fd() without ReadAt (zero-copy), for accounting.
  virtual void CountSent(uint64_t bytes) {}
  // The origin object this reader reads where it reads one as it is (an s3 volume's file, no
  // cache or fault rules between); nullptr otherwise.
  virtual const OriginObject* origin_object() const { return nullptr; }
  // The object metadata stored with the file (kObjectMetaAttr), "" when it has none or the
  // volume keeps none.
  virtual Result<std::string> ReadMeta() { return std::string(); }
};

// The extended attribute that holds an object's metadata (S3 headers, checksums, ETag) with its
// file: set before the file is published, so it appears atomically with the data.
inline constexpr const char* kObjectMetaAttr = "user.sluice.object";
inline constexpr size_t kMaxObjectMeta = 16 << 10;

// Where a listing in key order starts (Volume::OpenDirFrom): S3's order, in which a directory's
// name sorts as if followed by '/'. Entries whose names start with `prefix`, from the first whose
// key sorts after `after`, or is a directory's key that prefixes it (the directory `after` lies
// in, or names: "d/" holds keys after "d/").
// `prefix` holds no '/': those entries are one run in key order.
struct ListFrom {
  std::string_view prefix;
  std::string_view after;
};

// An entry's key in a listing: its name, with '/' after a directory's.
inline std::string ListKey(std::string_view name, bool is_dir) {
  std::string k(name);
  if (is_dir) k += '/';
  return k;
}

// Whether an entry with `key` belongs in a listing that resumes after `after` (see ListFrom).
inline bool ListKeyFrom(std::string_view key, std::string_view after) {
  return key > after || (!key.empty() && key.back() == '/' && after.starts_with(key));
}

// An open directory of a volume: its entries in directory order, and its children opened
// relative to it (never following a symbolic link), so that a walk never resolves a path.
class DirHandle {
 public:
  virtual ~DirHandle() = default;
  virtual const DirEntry& info() const = 0;  // the directory itself
  struct Name {
    std::string name;
    EntryType type = EntryType::kOther;
  };
  // The next entry; nullopt at the end.
  virtual Result<std::optional<Name>> Next() = 0;
  // The attributes of entry `name` (a symbolic link is described, not followed).
  virtual Result<DirEntry> StatEntry(const std::string& name) = 0;
  // kInvalidPath for a symbolic link, kInvalidArgument for anything but a regular file.
  virtual Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) = 0;
  // kInvalidPath for a symbolic link, kInvalidArgument (ENOTDIR) for a non-directory.
  virtual Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) = 0;
  // The object metadata of entry `name` (see FileReader::ReadMeta) without opening it.
  virtual Result<std::string> EntryMeta(const std::string& name) { return std::string(); }
  // True when Next() yields only what the ListFrom it was opened with selects, in key order
  // (see Volume::OpenDirFrom).
  virtual bool KeyOrdered() const { return false; }
  // Subdirectory `name` opened as Volume::OpenDirFrom opens a directory.
  virtual Result<std::unique_ptr<DirHandle>> OpenSubdirFrom(const std::string& name,
                                                            const ListFrom& from) {
    return OpenSubdir(name);
  }
};

// The name reserved in every vfolder's root for upload staging: never a target of uploads,
// never archived.
inline constexpr const char* kStagingDirName = ".upload";

// Where an upload session stands on its volume.
struct StagingState {
  bool staged = false;         // the staging file is there: the session is in progress
  bool recorded = false;       // an offset record is there
  uint64_t durable = 0;        // bytes recorded as durable
  bool quota_checked = false;  // a writer checked the session against its scope's quota
  uint64_t staged_size = 0;    // bytes in the staging file (more than durable after a crash)
};

// The staging file of an upload session, opened by its one writer: the lock is held for as
// long as this object lives, and dies with the process that holds it.
class StagingWriter {
 public:
  virtual ~StagingWriter() = default;
  // As found when opened, after bytes past the durable offset were cut off.
  virtual const StagingState& state() const = 0;
  // Writes `n` bytes at `offset`; `*written` receives how many went in, also on an error.
  virtual Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) = 0;
  // Starts writing [from, to) back so that the next Sync waits only for what follows.
  virtual void Writeback(uint64_t from, uint64_t to) {}
  // Where a long write is best synced: 0, anywhere (a local file: every second or so); else
  // at multiples of this offset only (s3: a part boundary, where a sync sends whole parts and
  // an empty tail, rather than the bytes past the last part again each time).
  virtual uint64_t SyncGranule() const { return 0; }
  // Makes the bytes up to `offset` durable, then records `offset` (and `quota_checked`).
  virtual Status Sync(uint64_t offset, bool quota_checked) = 0;
  // Records `offset` (at most the durable offset) and cuts the file there: what came after
  // it never counts.
  virtual Status Rollback(uint64_t offset, bool quota_checked) = 0;
  // Renames the whole file onto `final_parts` below the vfolder: parents are created (beneath
  // the vfolder: a symlink out is refused), an existing file is replaced atomically, a
  // directory is refused (kConflict).
  virtual Status Commit(const std::vector<std::string>& final_parts) = 0;
  // Makes the next Commit or Publish refuse to replace an existing entry, atomically with the
  // rename (kAlreadyExists; S3's If-None-Match: *). false: this volume cannot make that
  // atomic, and the caller's own check before it is all there is.
  virtual bool RefuseReplace() { return false; }
  // For objects written whole (S3): attaches the metadata `meta` returns for the file as it now
  // is (size, mtime), makes the bytes durable when `durable`, then commits as Commit does. No
  // offset record is written. Volumes that cannot keep metadata publish the bytes alone.
  virtual Status Publish(const std::vector<std::string>& final_parts,
                         const std::function<std::string(const DirEntry&)>& meta, bool durable) {
    return Commit(final_parts);
  }
  // Writes [src_offset, src_offset + n) of `src` at `at`, without the bytes passing through user
  // space where both are local files (copy_file_range: a reflink on btrfs and XFS); read and
  // written otherwise.
  virtual Status CopyFrom(FileReader& src, uint64_t src_offset, uint64_t n, uint64_t at);
  // True where CopyFrom(src, ...) has the origin copy src's bytes itself, the reader's
  // origin_object() being on this volume's origin, read with its key (an s3 volume:
  // UploadPartCopy): little of them, or none, passes through this process.
  virtual bool CopiesOnOrigin(const FileReader& src) const { return false; }
  // After a Commit or Publish that succeeded: the new file's entry as a Stat shows it now (a
  // local file's inode, size and times; an object's entity tag and size), so that a cache
  // keeps the bytes it saw written (ingest on write) only under the version they made, and
  // only while the volume still shows that version. nullopt where the volume cannot tell.
  virtual std::optional<DirEntry> Landed() const { return std::nullopt; }
  // Says, before the first write, that the file will be read once, by the commit of another
  // (an S3 multipart part): a decorator need not keep its bytes (the cache's ingest spool).
  virtual void ReadOnceByAnother() {}
};

struct StagingSweep {
  uint64_t removed = 0;        // sessions removed (their records go with them, uncounted)
  uint64_t removed_bytes = 0;  // what their staging files held
  uint64_t kept_locked = 0;    // old sessions kept because a writer holds them
};
// Called for each session a sweep removes: its vfolder (scope hex, "" for a legacy vfolder;
// vfolder hex) and session id.
using StagingRemoved = std::function<void(
    const std::string& scope_hex, const std::string& vfolder_hex, const std::string& session)>;

// A volume's precomputed route to a path it will be asked to open again and again (the file of
// a download token): opaque to callers, given back to the volume that made it.
struct LookupHint {
  virtual ~LookupHint() = default;
};

struct HwInfo {
  std::string status = "healthy";  // healthy | degraded | unavailable
  std::string status_info;         // why, when not healthy
  // Strings only: Backend.AI's manager type-checks it as Dict[str, str].
  std::map<std::string, std::string> metadata;
};

// Quota scopes: a directory per scope holding its vfolders, with an optional byte limit.
class QuotaModel {
 public:
  virtual ~QuotaModel() = default;
  virtual std::string ScopePath(const QuotaScopeId& qsid) const = 0;
  // kAlreadyExists when present.
  virtual Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit_bytes) = 0;
  // kNotFound when missing.
  virtual Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) = 0;
  // The limit alone (nullopt: none), for writes that check it before they measure usage: a
  // scope's usage can cost a walk (vfs, stale figures) or a listing (s3), its limit a record.
  virtual Result<std::optional<uint64_t>> ScopeLimit(const QuotaScopeId& qsid) {
    SLUICE_ASSIGN_OR_RETURN(QuotaUsage u, DescribeScope(qsid));
    return u.limit_bytes;
  }
  // Sets the limit; creates the scope when missing.
  virtual Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit_bytes) = 0;
  // Lifts the limit and keeps the scope; kNotFound when missing.
  virtual Status UnsetQuota(const QuotaScopeId& qsid) = 0;
  // kNotEmpty while vfolders remain; kNotFound when missing.
  virtual Status DeleteScope(const QuotaScopeId& qsid) = 0;
};

// Tree operations. They block, so callers run them on worker pools, never on event loops.
class FSOpModel {
 public:
  virtual ~FSOpModel() = default;
  // Copies the tree at `src` into a new or empty directory `dst`; reflinks where possible.
  virtual Status CopyTree(const std::string& src, const std::string& dst) = 0;
  virtual Status MoveTree(const std::string& src, const std::string& dst) = 0;
  virtual Status DeleteTree(const std::string& path) = 0;
  virtual Result<TreeUsage> ScanTree(const std::string& path) = 0;
};

class Volume {
 public:
  virtual ~Volume() = default;

  virtual const std::string& name() const = 0;
  virtual const std::string& backend() const = 0;
  virtual const std::string& path() const = 0;
  virtual const std::string& fsprefix() const = 0;
  virtual std::set<std::string> capabilities() const = 0;

  // Prepares the volume (layout version). Called once at start.
  virtual Status Init() = 0;
  // Removes what deletes cut short by a crash left behind. Called at start and periodically, off
  // the request path; a failure is logged and retried, never fatal.
  virtual Status EmptyTrash() { return Status::Ok(); }
  // What one vfolder's delete left there (a resumed delete answers for its own vfolder, not
  // for others that cannot go); by default the whole trash.
  virtual Status EmptyTrashOf(const VFolderId& /*vfid*/) { return EmptyTrash(); }
  // The process is about to exit cleanly (no request in flight): what the volume keeps for its
  // next start goes to disk. The volume is not used after it.
  virtual void Shutdown() {}

  virtual QuotaModel& quota() = 0;
  virtual FSOpModel& fsop() = 0;
  virtual VolumeIoStats& io_stats() = 0;

  // Layout version in use (2 or 3).
  virtual int layout_version() const = 0;

  // --- vfolders ---
  // The vfolder's directory on this host (whether or not it exists).
  virtual std::string VFolderPath(const VFolderId& vfid) const = 0;
  // Creates the vfolder; its quota scope is created first when `auto_scope` is set
  // (with `initial_limit`), otherwise a missing scope is kNotFound.
  virtual Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                               std::optional<uint64_t> initial_limit) = 0;
  // Makes the vfolder disappear at once (moves it aside) and returns where its contents now
  // are, for DeleteTree to remove in the background.
  virtual Result<std::string> DetachVFolder(const VFolderId& vfid) = 0;
  virtual Status CheckVFolder(const VFolderId& vfid) = 0;  // kNotFound if missing
  virtual Result<TreeUsage> GetUsage(const VFolderId& vfid) = 0;
  virtual Result<uint64_t> GetUsedBytes(const VFolderId& vfid) = 0;
  // Usage measured now, for callers that cannot use a maintained figure that may lag writes
  // made behind Sluice's back (a clone's space check, an operator asking for it). Backends whose
  // GetUsage is always current answer with it.
  virtual Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) { return GetUsage(vfid); }
  virtual Result<FsUsage> GetFsUsage() = 0;
  virtual HwInfo GetHwInfo() = 0;
  // What a session mounts: the vfolder root's absolute path. `subpath` is only checked to stay
  // inside the vfolder (kInvalidPath otherwise): Backend.AI's manager joins it to the answer.
  virtual Result<std::string> MountPath(const VFolderId& vfid, std::string_view subpath) = 0;
  // Fills the existing, empty vfolder `dst` of this volume with a copy of vfolder `src` of
  // `from` (this volume, or another one), accounting `size` (the source's usage, as the caller
  // measured it to check for space) as written. Within one volume backends
  // use their faster ways (snapshot, reflink). kUnsupported when this volume cannot read
  // `from`'s vfolders.
  virtual Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                 const TreeUsage& size) = 0;

  // --- file operations inside a vfolder; every path is resolved beneath the vfolder root ---
  // kInvalidPath when `relpath` is hostile as text or when the part of it that exists resolves
  // outside the vfolder (a symlink out); lets a batch be refused before anything changes.
  virtual Status ValidatePath(const VFolderId& vfid, std::string_view relpath) = 0;
  virtual Status Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                       bool exist_ok) = 0;
  virtual Status Rename(const VFolderId& vfid, std::string_view relpath,
                        std::string_view new_name) = 0;
  virtual Status Move(const VFolderId& vfid, std::string_view src, std::string_view dst) = 0;

  // --- the data path: what every protocol reads through ---
  // Opens the regular file at `relpath` for reading (symbolic links are followed while they stay
  // inside the vfolder). kNotFound when missing, kInvalidPath when it escapes, kInvalidArgument
  // (EISDIR for a directory) when it is not a regular file. With Lookup::kCachedOnly it does no
  // I/O: kUnavailable when it would need some. `hint` must come from this volume's
  // PrepareLookup for the same vfolder and path.
  virtual Result<std::shared_ptr<FileReader>> OpenReader(const VFolderId& vfid,
                                                         std::string_view relpath,
                                                         Lookup lookup = Lookup::kMayBlock,
                                                         const LookupHint* hint = nullptr) = 0;
  virtual std::shared_ptr<const LookupHint> PrepareLookup(const VFolderId& vfid,
                                                          std::string_view relpath) const {
    return nullptr;
  }
  // The attributes of `relpath` (a symbolic link at its end is described, not followed).
  virtual Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) = 0;
  // Opens the directory at `relpath` (symbolic links followed while they stay inside).
  virtual Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                                     std::string_view relpath) = 0;
  // The directory at `relpath`, for a listing that pages in key order, reached without following
  // a symbolic link (a listing under a prefix lists what the listing of the whole tree does,
  // whose walk follows none). A backend that can (an
  // origin that lists in key order, a kept listing) yields only the entries `from` selects, in
  // key order, reading no more than the caller consumes, and says so with KeyOrdered(); others
  // answer as OpenDir does, and the caller selects and sorts.
  virtual Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid,
                                                         std::string_view relpath,
                                                         const ListFrom& from) {
    return OpenDir(vfid, relpath);
  }
  // Up to `max` entries of the directory at `relpath` whose names sort after `start_after`
  // (byte order), in that order, with their attributes: a listing that pages.
  virtual Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                                   std::string_view start_after, size_t max) = 0;

  // --- uploads: staging files with a durable offset, one writer at a time, atomic commit ---
  // Whether the bytes a session writes count in its vfolder's (and scope's) usage as they
  // land, so that its quota reservation can shrink by them. Where they do not (s3: sessions
  // live outside the vfolder's keys until their commit), a reservation holds a session's
  // whole length until the commit.
  virtual bool StagingCounted() const { return true; }
  // Whether a session of `size` bytes can be committed here, checked before it begins (s3: at
  // most 10,000 origin parts of part-size): kTooLarge saying why, rather than a refusal after
  // the bytes were sent.
  virtual Status CheckStagedSize(uint64_t /*size*/) const { return Status::Ok(); }
  // Creates an empty staging file for a new session; returns the session id.
  virtual Result<std::string> CreateStaging(const VFolderId& vfid) = 0;
  // Removes a session's staging file (a session refused right after creation).
  virtual Status DiscardStaging(const VFolderId& vfid, const std::string& session) = 0;
  // kNotFound when the vfolder has no staging area, or the session neither a file nor a record.
  virtual Result<StagingState> InspectStaging(const VFolderId& vfid,
                                              const std::string& session) = 0;
  // Takes the session's one writer, waiting up to `wait` for another to let go (kConflict
  // after that). kNotFound when there is no staging file (any more).
  virtual Result<std::unique_ptr<StagingWriter>> OpenStaging(
      const VFolderId& vfid, const std::string& session,
      std::chrono::milliseconds wait = std::chrono::milliseconds(0)) = 0;
  // Removes sessions untouched for longer than `age` (and their records) from one vfolder, or
  // from every vfolder of the volume; sessions a writer holds are kept.
  virtual StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                                    const StagingRemoved& removed) = 0;
  // Validates every path first, so one bad path deletes nothing.
  virtual Status DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                             bool recursive) = 0;
};

}  // namespace sluice
