// S3 users, access keys and bucket names: the state every sluiced serving the same volumes must
// share. It lives in a RecordDir on shared storage (one record per user, key and bucket), so a
// bucket created or a key revoked on one node holds on the others once they reload (every
// `refresh` interval, one stat per directory). Secrets are sealed (AES-256-GCM) with the
// configured seal key, bound to their access key.
//
// Lookups on the request path (FindKey: on the event loop) read only memory; FindBucket reads
// the one record on a miss, so a bucket made on another node a moment ago is found at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/record_dir.h"
#include "common/status.h"

namespace sluice {

struct S3User {
  std::string id;
  std::string display_name;
  std::string default_volume;  // where CreateBucket makes the vfolder
  std::string default_scope;   // its quota scope ("user:<uuid>")
  int64_t created = 0;         // unix seconds
  nlohmann::json ToJson() const;
  static Result<S3User> FromJson(const nlohmann::json& j);
};

struct S3Key {
  std::string access_key;
  std::string secret_key;  // in memory only; sealed on disk
  std::string user;
  std::vector<std::string> buckets;  // empty: every bucket the user owns
  bool read_only = false;
  int64_t created = 0;
  // Without the secret: what listings show.
  nlohmann::json ToPublicJson() const;
  bool MayUse(const std::string& bucket) const;
};

struct S3Bucket {
  std::string name;
  std::string volume;
  std::string vfid;  // Backend.AI vfolder id
  std::string owner;
  int64_t created = 0;
  bool owns_vfolder = false;  // made by CreateBucket: DeleteBucket deletes the vfolder too
  nlohmann::json ToJson() const;
  static Result<S3Bucket> FromJson(const nlohmann::json& j);
};

// S3's bucket-naming rules (3-63 characters of lower-case letters, digits, '.' and '-', ...):
// kInvalidArgument with the rule broken.
Status CheckBucketName(std::string_view name);

class S3Store {
 public:
  // `root`: the shared directory (users/, keys/, buckets/ below it); `seal_key`: any string,
  // the same on every node.
  static Result<std::unique_ptr<S3Store>> Open(const std::string& root,
                                               const std::string& seal_key);
  ~S3Store();

  // --- users ---
  Status CreateUser(S3User u);  // kAlreadyExists
  Result<S3User> GetUser(const std::string& id) const;
  std::vector<S3User> Users() const;
  // kConflict while the user still has keys or buckets.
  Status DeleteUser(const std::string& id);

  // --- keys ---
  // A new key for `user`; `access_key` / `secret_key` import an existing pair (both or neither).
  Result<S3Key> CreateKey(const std::string& user, std::optional<std::string> access_key,
                          std::optional<std::string> secret_key, std::vector<std::string> buckets,
                          bool read_only);
  Status RevokeKey(const std::string& access_key);  // kNotFound
  std::vector<S3Key> Keys() const;
  // Memory only, never blocks: null when unknown (or revoked and reloaded).
  std::shared_ptr<const S3Key> FindKey(const std::string& access_key) const;

  // --- buckets ---
  Status BindBucket(S3Bucket b);  // kAlreadyExists
  // kNotFound when no such bucket (on any node).
  Result<S3Bucket> FindBucket(const std::string& name);
  // Memory only, never blocks: nullopt when not loaded here (FindBucket may still find it).
  std::optional<S3Bucket> FindCachedBucket(const std::string& name) const;
  // Moves whenever what is loaded changes: what callers derived from it is stale once it does.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // kNotFound when there is no such bucket, or (with `expected_vfid`) when the name is bound
  // to another vfolder now.
  Status UnbindBucket(const std::string& name, const std::string& expected_vfid = {});
  std::vector<S3Bucket> Buckets() const;
  // Whether some bucket name is bound to this vfolder (as loaded here).
  bool Serves(const std::string& volume, const std::string& vfid) const;

  // Reloads what changed on disk since the last look.
  void Refresh();
  // Refreshes every `interval` in a thread until Stop().
  void Start(std::chrono::milliseconds interval);
  void Stop();

 private:
  S3Store(RecordDir users, RecordDir keys, RecordDir buckets, std::string seal_key);
  struct Snapshot {
    std::map<std::string, S3User> users;
    std::map<std::string, std::shared_ptr<const S3Key>> keys;
    std::map<std::string, S3Bucket> buckets;
    std::string users_stamp, keys_stamp, buckets_stamp;
  };
  std::shared_ptr<const Snapshot> snap() const;
  Result<std::shared_ptr<const S3Key>> LoadKey(const std::string& ak) const;

  RecordDir users_, keys_, buckets_;
  std::string seal_key_;  // 32 bytes
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> snap_;
  std::atomic<uint64_t> generation_{0};
  std::mutex refresh_mu_;  // one reload at a time

  std::mutex run_mu_;
  std::condition_variable run_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sluice
