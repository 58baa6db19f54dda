// Typed configuration. Sluice reads Backend.AI's storage-proxy.toml (kebab-case or snake_case
// keys) plus its own [sluice] section. Sections Sluice has no use for are accepted with a
// warning; unknown keys and bad values inside the sections it uses fail with a message that
// names the key.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace sluice {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port", "[v6]:port"
};

struct ListenerConfig {
  HostPort addr;
  bool ssl_enabled = false;
  std::string ssl_cert;
  std::string ssl_privkey;
};

struct VolumeConfig {
  std::string name;
  std::string backend;
  std::string path;
  std::string fsprefix;
  nlohmann::json options = nlohmann::json::object();
  // Fault injection rules (volume/fault_volume.h): tests and drills only.
  nlohmann::json faults = nlohmann::json::array();
  // [volume.NAME.cache]: the SSD read cache in front of the volume (volume/cache); null: none.
  nlohmann::json cache;
  // Operations that may block on the volume's storage running at once (MetricsVolume's
  // bulkhead); 0: the daemon's default, half of io-threads-max and at least 64.
  int max_operations = 0;
  // Whether `path` names a directory of this host: not for the in-memory backend, nor for one
  // whose data is in an S3 origin (its path is only a label, such as "s3://bucket/prefix").
  bool local_path() const { return backend != "mem" && backend != "s3"; }
};

// [etcd]: where Backend.AI keeps its shared configuration (the event bus's Redis address among
// it), as the reference storage proxy reads it.
struct EtcdConfig {
  std::string ns = "local";      // `namespace`: keys live under /sorna/<namespace>/
  std::optional<HostPort> addr;  // absent: no etcd
  std::string user;
  std::string password;
};

// [events]: Backend.AI's event bus (anycast entries on a Redis stream), for the completion
// events the manager waits on. The Redis address comes from `redis-addr`, else from etcd.
struct EventsConfig {
  bool enabled = true;
  std::optional<HostPort> redis_addr;
  std::string redis_password;
  int redis_db = 4;                    // REDIS_STREAM_DB
  std::string stream = "events";       // the anycast stream key
  std::string source = "storage";      // AGENTID_STORAGE
  std::chrono::seconds retry_max{30};  // longest wait between delivery attempts
};

// [artifact-storages.<name>] with type = "vfs_storage": a directory tree the manager's artifact
// features list and download through /v1/storages/vfs/<name>/...
struct VfsStorageConfig {
  std::string name;
  std::string base_path;  // absolute; `subpath` already appended
  uint64_t download_chunk_size = 65536;
};

// [api.s3]: the S3 listener (on in the embedded default; off unless configured otherwise).
struct S3Config {
  bool enabled = false;
  ListenerConfig listener{{"127.0.0.1", 6024}, false, "", ""};
  std::string region = "us-east-1";
  // Users, keys and bucket names, shared by every node serving the same volumes. Empty: the
  // ".sluice/s3" directory of the first directory-backed volume.
  std::string state_path;
  std::string seal_key;  // seals secrets at rest; generated under state_dir when empty
  bool durable = true;   // fsync every object before answering its write
  std::chrono::milliseconds refresh{1000};  // how often other nodes' changes are looked for
  // Multipart uploads initiated longer ago are removed with their parts (by the janitor).
  std::chrono::seconds multipart_expiry{7 * 86400};
  // Multipart uploads in progress a bucket may hold: listing them reads each one's record,
  // so without a bound one user could make every listing (and the sweep) read millions.
  size_t max_multipart_uploads = 10000;
  // Buckets one user may own through CreateBucket (each is a vfolder, and a record every node
  // keeps in memory).
  size_t max_buckets = 1000;
  // A copy or a Complete still running after this long answers 200 at once and keeps the
  // connection alive with a space this often until its result (as S3 does); 0: off.
  std::chrono::seconds keepalive{5};
  // Virtual-hosted addressing: "<bucket>.<domain>" in Host names the bucket. Empty: path style
  // only.
  std::string domain;
};

struct Config {
  // [storage-proxy]
  std::string node_id = "sluice-local";
  int num_proc = 0;  // 0: one event loop per core
  std::string pid_file;
  uint64_t scandir_limit = 1000;
  uint64_t max_upload_size = 100ULL << 30;
  std::string secret;  // token (JWT) secret; generated under state_dir when empty
  std::chrono::seconds session_expire{86400};
  std::string user;   // name or numeric id; drop privileges to it after binding
  std::string group;  // name or numeric id
  bool allow_auto_quota_scope_creation = true;

  // [api.client] / [api.manager]
  ListenerConfig client{{"127.0.0.1", 6021}, false, "", ""};
  ListenerConfig manager{{"127.0.0.1", 6022}, false, "", ""};
  HostPort internal{"127.0.0.1", 6023};  // [api.manager] internal-addr: health, metrics
  std::string announce_addr;
  std::string manager_secret;  // generated under state_dir when empty

  // [sluice]
  std::string state_dir = "./var";
  size_t io_threads = 8;        // blocking filesystem work on behalf of requests
  size_t io_threads_max = 256;  // ... and how far that pool grows while every thread is busy
  size_t task_threads = 4;      // background tasks (delete, clone)
  size_t scan_threads = 8;      // parallel tree walks
  std::string log_level = "info";
  uint64_t max_request_body = 1 << 20;
  uint64_t max_buffered_request_bodies = 64 << 20;
  size_t max_connections = 10000;
  std::chrono::seconds request_timeout{60};
  std::chrono::seconds keepalive_timeout{75};
  std::chrono::seconds drain_timeout{30};

  // Directories whose trees unmanaged vfolders (volume "noop") may be downloaded from.
  std::vector<std::string> unmanaged_roots;

  std::vector<VolumeConfig> volumes;
  EtcdConfig etcd;
  EventsConfig events;
  std::vector<VfsStorageConfig> vfs_storages;
  S3Config s3;

  // Filled while parsing: notes for the operator (ignored sections, unused keys).
  std::vector<std::string> warnings;
  bool embedded_default = false;
};

// Parses TOML text. `origin` names the source in messages.
Result<Config> ParseConfig(std::string_view toml_text, std::string_view origin = "config");
Result<Config> LoadConfigFile(const std::string& path);

// The configuration used when sluiced runs without --config: state under `state_dir`, one
// vfs volume named "local" at <state_dir>/volumes/local, loopback listeners.
Config EmbeddedDefaultConfig(const std::string& state_dir = "./var");

// A commented sample configuration (what `sluiced --dump-default-config` prints).
std::string DefaultConfigToml();

// "100g", "1.5 GiB", "4096" -> bytes.
Result<uint64_t> ParseBinarySize(std::string_view s);
// "1d", "12h", "30m", "45s", "1w", "90" -> seconds.
Result<std::chrono::seconds> ParseDuration(std::string_view s);
// The same, and sub-second durations as "250ms".
Result<std::chrono::milliseconds> ParseDurationMillis(std::string_view s);

}  // namespace sluice
