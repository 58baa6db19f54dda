// A volume whose data lives in an S3-compatible origin (`backend = "s3"`): Ceph RGW, another
// Sluice, AWS. The layout is the file system's, as keys: a quota scope is the prefix
// "<prefix><scope hex>/", a vfolder "<scope hex>/<h[0:2]>/<h[2:4]>/<h[4:]>/" below it, and a
// file the key of its path below that. Scopes, vfolders and directories made through Sluice are
// zero-byte markers ("<dir>/"; scope limits and vfolder modes in their user metadata); a
// directory also exists while any key lies below it, so prefixes written by other tools are
// directories too.
//
// What holds (docs/s3-volumes.md): reads are ranged GETs pinned to the ETag seen when the file
// was opened (a file replaced on the origin mid-read fails the read, never mixes versions; a
// small file is read whole at open); a listing is the origin's delimiter listing; rename and
// move are copies then deletes, not atomic; usage is measured by listing; uploads are origin
// multipart uploads with a durable tail (one writer per session per node); vfolder copies from
// other volumes upload every file.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "io/s3/s3_client.h"
#include "io/s3/transport.h"
#include "volume/usage_tracker.h"
#include "volume/volume.h"

namespace sluice {

struct S3VolumeOptions {
  io::s3::ClientOptions client;
  std::string bucket;
  std::string prefix;  // "" or ending in '/'
  bool read_only = false;
  // Uploads go to the origin in parts of this size (so at most 10,000 x part-size bytes per
  // file), each writer holding up to about two parts in memory.
  uint64_t part_size = 16ULL << 20;
  uint64_t capacity = 1ULL << 50;  // what GetFsUsage reports: an origin has no fixed size
  // Objects up to this size are copied with one CopyObject (AWS takes up to 5 GiB); larger
  // ones as a multipart upload of UploadPartCopy parts of this size.
  uint64_t max_copy_size = 5ULL << 30;
  // How long an upload session's writer holds its lease across nodes without renewing it: a
  // node that dies holding one delays the session's next writer by this much.
  std::chrono::milliseconds upload_lock_ttl{30000};
  // How long a vfolder seen on the origin is taken to exist without asking again: what another
  // node's deletion of a vfolder may take to show here.
  std::chrono::milliseconds vfolder_ttl{5000};
  // A deleted vfolder's prefix is deleted a second time this long after the first: a write
  // that passed its check before the delete (another node's within vfolder-ttl, a long commit
  // copy) may land after the first pass listed the prefix.
  std::chrono::milliseconds trash_grace{600000};
  // Maintained usage (see usage_tracker.h): how old a figure may get before a background
  // listing re-measures it, and how fast a listing must be for its tree to be listed on every
  // read instead (exact, and what other nodes wrote counts at once).
  std::chrono::milliseconds usage_reconcile{60000};
  std::chrono::microseconds usage_walk_budget{10000};
  // Requests to the origin at once (one connection each, shared by every request of this
  // volume), and how long one waits for a connection before it fails (503): an origin that
  // stops answering holds at most max-connections of the node's threads for its stall timeout.
  int max_connections = 64;
  std::chrono::milliseconds queue_timeout{10000};
  int transport_threads = 0;  // the transport's loops; 0: one per four cores (1 to 8)

  // From [volume.NAME.options]: endpoint, bucket, prefix, region, access-key, secret-key or
  // credentials-file, ca-file, insecure, read-only, addressing ("path" or "virtual"),
  // capacity, vfolder-ttl, part-size, connect-timeout, stall-timeout, min-speed, retry-deadline,
  // max-attempts, usage-reconcile-interval, usage-walk-budget, max-copy-size, upload-lock-ttl,
  // max-connections, queue-timeout, transport-threads.
  static Result<S3VolumeOptions> FromConfig(const VolumeConfig& cfg);
};

class S3Volume : public Volume {
 public:
  S3Volume(VolumeConfig cfg, S3VolumeOptions opts);
  ~S3Volume() override;

  const std::string& name() const override { return cfg_.name; }
  const std::string& backend() const override { return cfg_.backend; }
  const std::string& path() const override { return cfg_.path; }
  const std::string& fsprefix() const override { return cfg_.fsprefix; }
  std::set<std::string> capabilities() const override;
  // Sessions are staged under the volume's own records, outside every vfolder's keys.
  bool StagingCounted() const override { return false; }
  Status CheckStagedSize(uint64_t size) const override;
  Status Init() override;
  Status EmptyTrash() override;
  void Shutdown() override;
  QuotaModel& quota() override { return *quota_; }
  FSOpModel& fsop() override { return *fsop_; }
  VolumeIoStats& io_stats() override { return *io_stats_; }
  int layout_version() const override { return 3; }

  std::string VFolderPath(const VFolderId& vfid) const override;
  Status CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                       std::optional<uint64_t> initial_limit) override;
  Result<std::string> DetachVFolder(const VFolderId& vfid) override;
  Status CheckVFolder(const VFolderId& vfid) override;
  Result<TreeUsage> GetUsage(const VFolderId& vfid) override;
  Result<TreeUsage> GetFreshUsage(const VFolderId& vfid) override;
  Result<uint64_t> GetUsedBytes(const VFolderId& vfid) override;
  Result<FsUsage> GetFsUsage() override;
  HwInfo GetHwInfo() override;
  Result<std::string> MountPath(const VFolderId& vfid, std::string_view subpath) override;
  Status CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                         const TreeUsage& size) override;

  Status ValidatePath(const VFolderId& vfid, std::string_view relpath) override;
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
  Result<DirEntry> Stat(const VFolderId& vfid, std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDir(const VFolderId& vfid,
                                             std::string_view relpath) override;
  Result<std::unique_ptr<DirHandle>> OpenDirFrom(const VFolderId& vfid, std::string_view relpath,
                                                 const ListFrom& from) override;
  Result<std::vector<DirEntry>> ListSorted(const VFolderId& vfid, std::string_view relpath,
                                           std::string_view start_after, size_t max) override;

  Result<std::string> CreateStaging(const VFolderId& vfid) override;
  Status DiscardStaging(const VFolderId& vfid, const std::string& session) override;
  Result<StagingState> InspectStaging(const VFolderId& vfid, const std::string& session) override;
  Result<std::unique_ptr<StagingWriter>> OpenStaging(const VFolderId& vfid,
                                                     const std::string& session,
                                                     std::chrono::milliseconds wait) override;
  StagingSweep SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                            const StagingRemoved& removed) override;

  // Binds a dataset already on the origin as vfolder `vfid`, read-only, served without a copy:
  // `prefix` is a key prefix (ending in '/') of the volume's bucket, or "s3://BUCKET[/PREFIX/]"
  // for another bucket of the same origin, whole or in part. Sluice writes nothing there (the
  // binding is a record in the volume's bucket), so the volume's credentials need only read
  // it. Creates the vfolder (and its quota scope), or binds an existing empty one (one the
  // manager just made). Deleting the vfolder deletes the binding, never the data.
  Status BindVFolder(const VFolderId& vfid, const std::string& prefix);
  struct Binding {
    std::string bucket;  // "" for the volume's own
    std::string prefix;  // "" (a whole bucket) or ending in '/'
  };
  // A binding as its record and BindVFolder write it: "PREFIX/" of the volume's bucket, or
  // "s3://BUCKET/[PREFIX/]" of another (which a node that predates other buckets reads as a
  // prefix no key of its own bucket has).
  static Binding ParseBinding(std::string_view bound);
  // What the vfolder is bound to, if it is a bound one (known once it was seen live).
  std::optional<Binding> BoundTo(const VFolderId& vfid) const;

  // Where `relpath` of the vfolder is on the origin ("" names the vfolder's prefix, with its
  // '/'): the volume's bucket and its layout, or what the vfolder is bound to. One look at the
  // bindings, so that a key is never paired with another binding's bucket.
  struct Location {
    std::string bucket, key;
  };
  Location Locate(const VFolderId& vfid, std::string_view relpath) const;
  // Its key alone (the volume's own bucket unless the vfolder is bound to another).
  std::string ObjectKey(const VFolderId& vfid, std::string_view relpath) const {
    return Locate(vfid, relpath).key;
  }
  // The key in the volume's own layout, whether or not the vfolder is bound elsewhere.
  std::string LayoutKey(const VFolderId& vfid, std::string_view relpath) const;
  const S3VolumeOptions& options() const { return opts_; }
  // The object metadata Sluice published with the file at `rel` ("" for none).
  Result<std::string> ObjectMetaOf(const VFolderId& vfid, const std::string& rel);

  class Clients;  // the origin clients, one per concurrent request (s3_volume.cc)
  struct Origin;  // what the volume's parts share: options, clients, bucket (s3_volume.cc)
  class Writer;   // an upload session's one writer (s3_volume.cc)
  struct Level {  // a directory and what it holds, sorted by name
    std::string rel;
    DirEntry info;
    std::vector<DirEntry> entries;
  };

 private:
  Result<std::vector<std::string>> Parts(std::string_view relpath) const;
  Status Live(const VFolderId& vfid);  // the vfolder exists (cached for vfolder_ttl)
  void NoteRecord(const VFolderId& vfid, const nlohmann::json& record);  // a binding in it
  Status Writable() const;
  // Writable(), the vfolder there, and not bound read-only.
  Status WritableVFolder(const VFolderId& vfid);
  Status MoveEntry(const VFolderId& vfid, const std::vector<std::string>& src,
                   const std::vector<std::string>& dst);
  Status KeepParent(const VFolderId& vfid, const std::vector<std::string>& parts);
  // CopyVFolderFrom's copy: server side within the origin, else uploads.
  Status CopyTreeIn(Volume& from, const VFolderId& src, const VFolderId& dst);
  // File `rel` of vfolder `src` on another volume, uploaded as `key`.
  Status CopyFileIn(Volume& from, const VFolderId& src, const std::string& rel,
                    const std::string& key);
  // The directory at `relpath`: `rel` and `info` of a Level, and where its keys are (`key`
  // ending in '/' below the vfolder's root).
  Result<std::pair<Level, Location>> LocateDir(const VFolderId& vfid, std::string_view relpath);
  Result<Level> ReadLevel(const VFolderId& vfid, std::string_view relpath);
  std::string StagingKey(const VFolderId& vfid, std::string_view session) const;

  void Unlock(const std::string& session);
  // An upload session's lease across nodes: generation `key` ("<record>.lock.<n>"), made by
  // this writer (`nonce`), last renewed at `renewed`. Empty `key`: the origin cannot take
  // conditional creates, and only this node's lock holds.
  struct Lease {
    std::string key, nonce;
    std::chrono::steady_clock::time_point renewed;
    bool lost = false;  // another writer holds the session now
  };
  // A writer's lease, renewed by the heartbeat for as long as the writer lives (a stalled
  // request keeps it, as a lock on a file system would; a node that dies or stalls whole
  // loses it after upload-lock-ttl).
  struct HeldLease {
    std::mutex mu;  // one renewal at a time
    Lease lease;
    bool released = false;
  };
  // One try at the lease of the session recorded at `record`: nullopt while another writer
  // holds it.
  Result<std::optional<Lease>> TakeLease(const std::string& record);
  // Makes generation `n` of `record`'s lease for `nonce`, and checks it is the newest; nullopt
  // when another writer made it, or a newer one.
  Result<std::optional<Lease>> MakeLease(const std::string& record, uint64_t n,
                                         const std::string& nonce);
  // Renews the lease once a third of its time has passed (in place while others still see
  // it live, else as the next generation); kConflict when another writer has it.
  Status KeepLease(Lease& lease);
  Status KeepLease(HeldLease& held);
  void ReleaseLease(const Lease& lease);
  // The heartbeat renews `held` until Unhold (which releases it).
  void Hold(const std::shared_ptr<HeldLease>& held);
  void Unhold(const std::shared_ptr<HeldLease>& held);
  void Heartbeat();
  std::mutex held_mu_;
  std::set<std::shared_ptr<HeldLease>> held_;
  std::condition_variable heartbeat_cv_;
  bool stopping_ = false;  // held_mu_
  std::thread heartbeat_;
  // Whether the origin refuses a PUT with If-None-Match: * of a key that exists (asked until
  // it answers).
  Result<bool> ConditionalCreates();
  std::optional<bool> conditional_;  // mu_
  // A write through this node changed the vfolder (and its scope) by these amounts.
  void Account(const VFolderId& vfid, int64_t bytes, int64_t entries);
  std::string VFolderRecordOfData(const std::string& data) const;
  // Aborts origin uploads under `prefix` older than `age` whose session record is not in `named`.
  void AbortUnnamedUploads(const std::string& prefix, const std::set<std::string>& named,
                           std::chrono::seconds age);
  // Every key below "s3://BUCKET/KEY" listed: the bytes, and the files and directories.
  Result<TreeUsage> Measure(const std::string& path);

  VolumeConfig cfg_;
  S3VolumeOptions opts_;
  VolumeIoStats* io_stats_;
  std::shared_ptr<Origin> origin_;
  // Usage figures of vfolders (VFolderPath) and quota scopes (ScopePath).
  std::unique_ptr<UsageTracker> usage_;
  std::unique_ptr<QuotaModel> quota_;
  std::unique_ptr<FSOpModel> fsop_;
  std::mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> live_;  // vfolder key -> until
  // Counts the vfolders this node detached: Live() keeps what it read only when none was
  // detached while it asked (a record read before a detach would mark a gone vfolder live).
  uint64_t detaches_ = 0;
  std::set<std::string> writers_;  // upload sessions with a writer on this node
  mutable std::mutex bound_mu_;
  std::map<std::string, Binding> bound_;  // vfid -> what it is bound to
};

}  // namespace sluice
