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
  // Whether the keys in memory were seen current on disk within the key staleness (a
  // directory that could not be listed or read leaves them as they were): callers refuse
  // requests while they are not, rather than honour keys revoked on another node meanwhile.
  bool KeysCurrent() const;
  // How long keys may go unconfirmed before KeysCurrent says no (default: 30 s, and at least
  // 10 refresh intervals once started).
  void set_key_staleness(std::chrono::milliseconds d) { key_staleness_ms_ = d.count(); }
  // How often Refresh reads every record whatever the stamps say (default: a minute).
  void set_full_reload(std::chrono::milliseconds d) { full_reload_ms_ = d.count(); }

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
  // How many buckets `user` owns (as loaded here).
  size_t BucketsOf(const std::string& user) const;

  // Reloads what changed on disk since the last look, and every directory at least once a
  // minute whatever its stamp says (a node's clock ahead of the file server's, or attributes an
  // NFS client cached, can hide a change from the stamp).
  void Refresh();
  // Refreshes every `interval` in a thread until Stop().
  void Start(std::chrono::milliseconds interval);
  void Stop();

 private:
  S3Store(RecordDir users, RecordDir keys, RecordDir buckets, std::string seal_key);
  // One directory's records as loaded, shared between snapshots until it changes.
  template <typename T>
  struct Records {
    std::map<std::string, T> items;
    std::string stamp;  // the directory's at the last whole reload ("": reload at the next look)
    std::chrono::steady_clock::time_point loaded;  // of the last whole reload
  };
  struct Snapshot {
    std::shared_ptr<const Records<S3User>> users = std::make_shared<Records<S3User>>();
    std::shared_ptr<const Records<std::shared_ptr<const S3Key>>> keys =
        std::make_shared<Records<std::shared_ptr<const S3Key>>>();
    std::shared_ptr<const Records<S3Bucket>> buckets = std::make_shared<Records<S3Bucket>>();
  };
  enum class Dir { kUsers, kKeys, kBuckets };
  std::shared_ptr<const Snapshot> snap() const;
  void Publish(std::shared_ptr<const Snapshot> next);
  Result<S3User> LoadUser(const std::string& id) const;
  Result<std::shared_ptr<const S3Key>> LoadKey(const std::string& ak) const;
  Result<S3Bucket> LoadBucket(const std::string& name) const;
  // After this node changed one record: that record re-read into memory, not its whole
  // directory (a reload per change costs every record for each one).
  void Reread(Dir dir, const std::string& name);

  RecordDir users_, keys_, buckets_;
  std::string seal_key_;  // 32 bytes
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> snap_;
  std::atomic<uint64_t> generation_{0};
  std::mutex refresh_mu_;  // one reload at a time
  // steady_clock nanoseconds when the keys were last seen current on disk.
  std::atomic<int64_t> keys_checked_ns_{0};
  std::atomic<int64_t> key_staleness_ms_{30000};
  std::atomic<int64_t> full_reload_ms_{60000};

  std::mutex run_mu_;
  std::condition_variable run_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sluice
