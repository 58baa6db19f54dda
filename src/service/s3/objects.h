// Objects are files: S3 keys map to paths inside a bucket's vfolder (the same path-safety rules
// as every other route), object metadata lives in an extended attribute of the file, and writes
// go through the volume's staging files, published atomically with their metadata.
//
// Collisions between keys and the file tree (docs/s3.md):
//   - a key whose parent is a file cannot be written: kConflict with ENOTDIR (ObjectParentIsFile)
//   - a key that names a directory cannot be written: kConflict with EISDIR; reading it is
//     NoSuchKey
//   - "dir/" (a key ending in '/') names the directory: a zero-byte PUT creates it, GET/HEAD of an
//     existing directory answer an empty object, DELETE removes it when empty; empty directories
//     list as "dir/" keys
//   - deleting an object removes the directories it leaves empty, as S3 has no empty prefixes
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/crypto.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "service/reservations.h"
#include "volume/key_order.h"
#include "volume/volume.h"

namespace sluice {

// The standard headers stored with an object and given back on GET/HEAD.
inline constexpr std::string_view kStoredHeaders[] = {
    "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires"};

// What is stored with an object (JSON in kObjectMetaAttr).
struct ObjectMeta {
  std::string etag;          // hex MD5, or "<hex>-<parts>" for multipart; no quotes
  std::string content_type;  // as given; "" = binary/octet-stream
  std::map<std::string, std::string> headers;    // Cache-Control, Content-Disposition, ...
  std::map<std::string, std::string> user;       // x-amz-meta-* (names lower case, no prefix)
  std::map<std::string, std::string> checksums;  // "CRC32" ... -> base64
  // The file as it was when published: metadata is trusted only while these still hold, so a
  // file rewritten in place behind Sluice's back never shows a stale MD5.
  uint64_t size = 0;
  int64_t mtime_ns = 0;

  std::string Encode() const;
  // nullopt when `blob` is empty, malformed, or describes another version of the file. The
  // blob is an extended attribute anyone who writes the vfolder can set: what it holds becomes
  // response headers, so only the shapes Sluice writes are taken (an ETag of hex digits, known
  // header names, token names, values without control bytes).
  static std::optional<ObjectMeta> Decode(std::string_view blob, const DirEntry& file);
};

// A directory's marker ("d/"), listed or read: the MD5 of nothing.
inline constexpr const char* kMarkerETag = "\"d41d8cd98f00b204e9800998ecf8427e\"";

int64_t MtimeNs(const DirEntry& e);
// No control byte but tab: what becomes a response header cannot split it (CR, LF) or end it.
bool HeaderValueSafe(std::string_view v);
// The entity tag S3 clients see, quoted: the stored MD5 when valid, otherwise a validator from
// inode, size and mtime ("<ino>-<size>-<mtime>" in hex, never 32 hex digits, so no client takes
// it for an MD5).
std::string ObjectETag(const DirEntry& e, const std::optional<ObjectMeta>& meta);
std::string ObjectETag(const DirEntry& e, const ObjectMeta* meta);

// Key -> path components below the vfolder. kInvalidArgument for what no file tree can hold
// ("", "..", ".", "//", NUL, over 1024 bytes: kUriTooLong), kPermissionDenied for the staging
// directory. A trailing '/' (a directory marker) is allowed and dropped.
Result<std::vector<std::string>> KeyParts(std::string_view key);
// The same checks, answering the key as a path below the vfolder (a view of `key` without its
// trailing '/'), without splitting it.
Result<std::string_view> KeyPath(std::string_view key);

struct ListQuery {
  std::string prefix;
  std::string delimiter;
  std::string after;  // exclusive: keys (and common prefixes) after this one
  // Inclusive: no key (or common prefix) after this one; a bounded listing, one of the ranges
  // SplitKeys answers.
  std::optional<std::string> end;
  size_t max_keys = 1000;
  bool want_etag = true;  // read each object's metadata attribute for its ETag
};

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::chrono::system_clock::time_point modified;
  std::string etag;  // quoted
};

struct ListPage {
  // In key order, merged: `is_prefix` entries are common prefixes.
  struct Item {
    bool is_prefix = false;
    ListedObject object;  // key only for a prefix
  };
  std::vector<Item> items;
  bool truncated = false;
};

// Lists a bucket's keys in byte order, walking only the directories that can hold keys in the
// page (those on the path of `after` and after it, below the prefix's directory).
class ObjectMetaCache;
// `cache` (optional): each object's metadata is looked up there first, and remembered there.
// `names` (optional): the sorted names of large directories, kept for the next page.
Result<ListPage> ListObjects(Volume& v, const VFolderId& vfid, const ListQuery& q,
                             ObjectMetaCache* cache = nullptr, KeyOrderCache* names = nullptr);

// Split listing: key ranges that hold about the same number of keys each, so that N workers can
// list a large bucket in parallel (ListObjectsV2 with start-after and end-key). The ranges
// partition the key space below the prefix whatever the estimate: range i is (start_after,
// end_key], the first without a start, the last without an end.
struct SplitQuery {
  std::string prefix;
  size_t parts = 1;
  // Directory entries read at most: directories past it are estimated from those read, not
  // walked (names only, from readdir: no stat, no attribute). 0: SplitBudget(parts).
  size_t budget = 0;
};

// The default budget: enough names for ranges of many units each (2048 a part, at least 8192),
// and no more (at most 200,000). Reading every name of a large bucket would make the split the
// parallel listing's longest serial step (100,000 keys: 65 ms of a 400 ms listing).
size_t SplitBudget(size_t parts);

struct KeyRange {
  std::optional<std::string> start_after;
  std::optional<std::string> end_key;
  uint64_t estimated = 0;  // keys in the range
};

struct SplitResult {
  std::vector<KeyRange> ranges;
  uint64_t estimated = 0;  // keys below the prefix
  bool exact = true;       // every name was read and kept: the counts are exact
  size_t names_kept = 0;   // keys held to make the cuts (a few budgets at most)
};

Result<SplitResult> SplitKeys(Volume& v, const VFolderId& vfid, const SplitQuery& q);

// One object being written: bytes go to a staging file, the MD5 (and, when asked, SHA-256) are
// computed on the way, and Finish publishes the file with its metadata at once.
class ObjectWriter {
 public:
  ~ObjectWriter();
  Status Write(const char* data, size_t n);
  uint64_t written() const { return written_; }
  // Hex digests of what was written (valid after Finish or at any time before it).
  const std::string& md5_raw() const { return md5_raw_; }
  const std::string& sha256_raw() const { return sha256_raw_; }
  // Computes the digests; called before Publish so the caller can check them.
  void Digest();
  // Appends `n` bytes of `src` from its start (copy_file_range where the volume can); the MD5
  // is not updated (assembled objects carry the multipart ETag).
  Status CopyFrom(FileReader& src, uint64_t n);
  // Publishes with `meta` (its etag, when empty, is the MD5; size and mtime are filled in here).
  Status Publish(ObjectMeta meta, bool durable);
  // The publish must not replace an existing object (If-None-Match: *); false when the volume
  // cannot make that atomic (see StagingWriter::RefuseReplace).
  bool RefuseReplace() { return staging_ && staging_->RefuseReplace(); }
  // Publishes with the metadata blob `blob` returns for the file as it is.
  Status PublishWith(const std::function<std::string(const DirEntry&)>& blob, bool durable);
  // Discards the staging file (a failed or abandoned write): nothing becomes visible.
  void Abort();

 private:
  friend class ObjectStore;
  ObjectWriter() = default;
  Volume* volume_ = nullptr;
  VFolderId vfid_;
  std::string session_;
  std::vector<std::string> parts_;
  QuotaReservations* reservations_ = nullptr;
  std::shared_mutex* gate_ = nullptr;  // ObjectStore::HoldVFolder's, held shared to publish
  std::string reservation_key_;
  uint64_t reserved_ = 0;
  // Runs once the file is in place, with the metadata blob it was published with; an error is
  // the write's answer (a part whose upload ended meanwhile: taken back).
  std::function<Status(const std::string& blob)> after_publish_;
  std::unique_ptr<StagingWriter> staging_;
  sluice::Digest md5_{sluice::Digest::Algo::kMd5};
  std::optional<sluice::Digest> sha256_;
  std::string md5_raw_, sha256_raw_;
  uint64_t written_ = 0;
  bool copied_ = false;  // some bytes came by CopyFrom (not hashed)
  bool done_ = false;
};

// A multipart upload in progress: staged in the vfolder as .upload/mp-<id>/ (the record
// "upload", parts "p00001"...), so that any node serving the volume can take it on.
struct MultipartUpload {
  std::string id;  // 32 lower-case hex digits
  std::string key;
  ObjectMeta meta;  // what the object will carry
  std::chrono::system_clock::time_point initiated;
  // The object's checksum, when CreateMultipartUpload asked for one: the algorithm ("CRC32",
  // ...; "" for none) and how the parts' checksums make it ("COMPOSITE" or "FULL_OBJECT").
  std::string checksum_algo;
  std::string checksum_type;
};

struct UploadedPart {
  int number = 0;
  uint64_t size = 0;
  std::string md5;  // raw
  std::chrono::system_clock::time_point modified;
  std::map<std::string, std::string> checksums;  // as ObjectMeta::checksums
};

inline constexpr int kMaxPartNumber = 10000;

// Object metadata by file version, so that GET, HEAD and listings need not read a file's
// extended attribute again (and an event loop can answer them with no I/O at all). An entry is
// a file's: its inode with its device and vfolder (btrfs gives each vfolder a subvolume, whose
// inodes are numbered like the others'), and holds while the file's size, mtime and ctime are
// those it was read with: writing the file or any of its attributes moves ctime, which nobody
// can set back. A backend's own entity tag (an origin's ETag: its objects have no ctime) is
// part of the version too. Bounded: slots of 64 bytes (the metadata apart when a file has any),
// 2^18 of them for a dataset of a quarter million objects, 16 MB once every shard is in use; a
// new entry whose slots are all taken replaces one of them.
class ObjectMetaCache {
 public:
  explicit ObjectMetaCache(size_t capacity = 1 << 18);
  ~ObjectMetaCache();
  // Found: what the file carries (null inside for none).
  std::optional<std::shared_ptr<const ObjectMeta>> Find(const Volume* v, const VFolderId& vfid,
                                                        const DirEntry& e) const;
  void Put(const Volume* v, const VFolderId& vfid, const DirEntry& e,
           const std::optional<ObjectMeta>& meta);

 private:
  // Small, so that a lookup touches one cache line of its node (the metadata lives apart).
  struct Entry {
    uint64_t size;
    int64_t mtime_ns;
    uint64_t stamp;  // ctime, with the entity tag's hash folded in
    std::shared_ptr<const ObjectMeta> meta;
  };
  struct Key;
  struct Shard;
  static constexpr size_t kShards = 16;
  size_t per_shard_;
  std::unique_ptr<Shard[]> shards_;
  Shard& ShardOf(const Key& k) const;
};

class ObjectStore {
 public:
  // `background` (optional) removes completed uploads' parts after Complete answers.
  explicit ObjectStore(QuotaReservations* reservations, ThreadPool* background = nullptr)
      : reservations_(reservations),
        background_(background),
        gates_(std::make_unique<std::shared_mutex[]>(kGates)),
        meta_cache_(std::make_shared<ObjectMetaCache>()),
        key_order_cache_(std::make_shared<KeyOrderCache>()) {}

  // A Complete or an Abort claims its upload (see ClaimUpload); a claim not heard of for this
  // long (a Complete gives a sign of life between parts) was cut short by a crash or a
  // restart, and the upload is given back to the next request that asks for it. 15 minutes.
  void SetClaimLease(std::chrono::milliseconds lease) { claim_lease_ = lease; }

  // --- multipart uploads ---
  Result<MultipartUpload> CreateMultipart(Volume& v, const VFolderId& vfid, std::string_view key,
                                          ObjectMeta meta, std::string checksum_algo = "",
                                          std::string checksum_type = "");
  // kNotFound (NoSuchUpload) when there is no such upload (never begun, completed or aborted).
  Result<MultipartUpload> GetMultipart(Volume& v, const VFolderId& vfid, std::string_view id);
  Result<std::unique_ptr<ObjectWriter>> BeginPart(Volume& v, const VFolderId& vfid,
                                                  const MultipartUpload& u, int part,
                                                  std::optional<uint64_t> size, bool want_sha256);
  // In part-number order.
  Result<std::vector<UploadedPart>> ListParts(Volume& v, const VFolderId& vfid,
                                              const MultipartUpload& u);
  // Assembles `parts` (checked by the caller: ascending, present, sized) into the object, without
  // the bytes passing through user space where the volume allows, publishes it with the
  // multipart ETag ("<md5 of the part MD5s>-<count>") and removes the upload. Returns the ETag.
  // The upload ends with the removal of its record (one file: NoSuchUpload from then on, to
  // every node); its parts are removed afterwards, on the background pool when there is one
  // (freeing them is what a Complete spends its time on where they were reflinked), by the
  // sweep when a crash comes between.
  // `checksums` (the object's, from MultipartChecksum) replace those of the upload's metadata.
  // `refuse_replace` (If-None-Match: *): kAlreadyExists, the upload given back, when the key
  // is there (checked by the publish itself where the volume can: of two racing writers, one
  // wins).
  Result<std::string> CompleteMultipart(Volume& v, const VFolderId& vfid, const MultipartUpload& u,
                                        const std::vector<UploadedPart>& parts,
                                        std::map<std::string, std::string> checksums, bool durable,
                                        bool refuse_replace = false);
  Status AbortMultipart(Volume& v, const VFolderId& vfid, const MultipartUpload& u);
  // Every upload in progress in the vfolder, by key then initiation (without their object
  // metadata, which listing them does not need).
  Result<std::vector<MultipartUpload>> ListMultipart(Volume& v, const VFolderId& vfid);
  // How many uploads the vfolder holds in progress (names only: no record read).
  Result<size_t> CountMultipart(Volume& v, const VFolderId& vfid);
  // Uploads initiated longer than `age` ago, removed; returns how many. Also removes what
  // completed uploads left (parts without a record) once older than `age` or an hour.
  size_t SweepMultipart(Volume& v, const VFolderId& vfid, std::chrono::seconds age);

  // Starts writing `key`; `size` (when known) is reserved against the quota scope at once.
  Result<std::unique_ptr<ObjectWriter>> BeginPut(Volume& v, const VFolderId& vfid,
                                                 std::string_view key, std::optional<uint64_t> size,
                                                 bool want_sha256);
  // The directory marker "dir/": creates the directory (and its parents).
  Status PutDirectory(Volume& v, const VFolderId& vfid, std::string_view key);

  struct Opened {
    std::shared_ptr<FileReader> file;  // null for a directory marker
    DirEntry entry;
    std::optional<ObjectMeta> meta;
  };
  // kNotFound (NoSuchKey) for anything that is not an object. `want_meta`: read the stored
  // metadata too (one more attribute read).
  Result<Opened> Open(Volume& v, const VFolderId& vfid, std::string_view key,
                      bool want_meta = true);
  // The same on an event loop: no I/O at all, kUnavailable where Open would need some (the
  // path or the metadata not in memory, a directory marker).
  Result<Opened> OpenCached(Volume& v, const VFolderId& vfid, std::string_view key);
  // A page of a listing (ListObjects, with this store's metadata cache).
  Result<ListPage> List(Volume& v, const VFolderId& vfid, const ListQuery& q);
  // Deleting a missing key succeeds (as S3 does).
  Status Delete(Volume& v, const VFolderId& vfid, std::string_view key);
  // Whether the vfolder holds any object (staging excluded).
  Result<bool> Empty(Volume& v, const VFolderId& vfid);
  // Held while a bucket is found empty and its vfolder deleted (DeleteBucket). Every publish
  // holds it shared and checks first that the vfolder is still there, so an object this node
  // publishes is either in the vfolder before the emptiness check (BucketNotEmpty) or refused
  // (kNotFound), never published into a vfolder on its way out while its client hears 200.
  // (Striped: a delete holds the publishes of a few other buckets for as long.)
  std::unique_lock<std::shared_mutex> HoldVFolder(const Volume& v, const VFolderId& vfid);

 private:
  Result<std::unique_ptr<ObjectWriter>> BeginWrite(Volume& v, const VFolderId& vfid,
                                                   std::vector<std::string> parts,
                                                   std::optional<uint64_t> size, bool want_sha256);
  Result<Opened> OpenWith(Volume& v, const VFolderId& vfid, std::string_view key, bool want_meta,
                          Lookup lookup);
  // Makes this request the one that ends upload `id` (Complete or Abort): NoSuchUpload when
  // it is gone or another request is ending it.
  Status ClaimUpload(Volume& v, const VFolderId& vfid, const std::string& id);
  // Whether upload `id` is claimed by a request silent for longer than the claim lease.
  bool ClaimLapsed(Volume& v, const VFolderId& vfid, std::string_view id);
  // A claim's sign of life (its failure is logged: the claim then lapses sooner).
  void Beat(Volume& v, const VFolderId& vfid, std::string_view id);

  std::shared_mutex& GateOf(const Volume& v, const VFolderId& vfid);

  static constexpr size_t kGates = 64;
  std::chrono::milliseconds claim_lease_{std::chrono::minutes(15)};
  QuotaReservations* reservations_;
  ThreadPool* background_;
  std::unique_ptr<std::shared_mutex[]> gates_;
  std::shared_ptr<ObjectMetaCache> meta_cache_;
  std::shared_ptr<KeyOrderCache> key_order_cache_;
};

// The object checksum (base64) of an upload made of `parts`, each of which must carry a checksum
// of the upload's algorithm: COMPOSITE is the checksum of the parts' raw checksums followed by
// "-<count>"; FULL_OBJECT (CRCs only) combines the parts' CRCs as if the data were read once.
// kInvalidArgument names a part without one.
Result<std::string> MultipartChecksum(const MultipartUpload& u,
                                      const std::vector<UploadedPart>& parts);

}  // namespace sluice
