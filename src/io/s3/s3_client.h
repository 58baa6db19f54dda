// A synchronous S3 client over libcurl: SigV4 from io/s3/sigv4.h (the server's own
// canonicalization), requests moved by a shared Transport (libcurl's multi interface, its
// connections shared by every client of an s3 volume) or, without one, by the client itself
// with one connection of its own kept alive (the CLI's workers), retries with full-jitter backoff
// on transport failures, 5xx, SlowDown and RequestTimeout, and S3 error XML turned into Status.
// Object bodies stream from a file descriptor or to a sink; nothing is held whole in memory.
// Not thread-safe: one client per thread (the CLI's workers each own one).
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "io/s3/sigv4.h"

namespace sluice::io::s3 {

class Transport;

struct ClientOptions {
  std::string endpoint = "http://127.0.0.1:6024";  // scheme://host[:port][/base]
  Credentials creds;
  bool insecure = false;  // https: skip certificate and host name checks
  std::string ca_file;    // https: trust these certificates (PEM) instead of the system's
  std::chrono::milliseconds connect_timeout{10000};
  // A transfer that moves no byte for this long is abandoned (and retried, or resumed where
  // it stopped); one bringing object data to a sink (a GET), once it moves fewer than
  // min_speed bytes a second for this long: an origin that trickles would otherwise hold its
  // caller (and the cache readers joined to its block) for hours.
  std::chrono::milliseconds stall_timeout{60000};
  uint64_t min_speed = 64 << 10;
  int max_attempts = 5;  // per request, the first included
  // A request's deadline for retries: no attempt starts later than this after its first one
  // (each attempt is bounded by stall_timeout while it moves bytes).
  std::chrono::milliseconds retry_deadline{30000};
  std::chrono::milliseconds backoff{100};  // first retry's ceiling, doubled per attempt
  std::chrono::milliseconds max_backoff{5000};
  bool checksums = true;  // send x-amz-checksum-crc32c with every upload (Sluice, AWS)
  // Virtual-hosted addressing: the bucket in the host name (bucket.host/key), as AWS and GCS
  // prefer; path style (host/bucket/key) otherwise, as Sluice, RGW and MinIO take by default.
  bool virtual_hosted = false;
  // Requests go through this loop and its shared connections (io/s3/transport.h); without
  // one, each client performs its own on the calling thread.
  std::shared_ptr<Transport> transport;
  bool control = false;  // through the transport's control lane (upload leases)
};

struct BucketInfo {
  std::string name;
  std::time_t created = 0;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // quotes stripped
  std::time_t mtime = 0;
  std::string content_type;
  // User metadata (x-amz-meta-*), names lower case without the prefix: HEAD and GET only.
  std::map<std::string, std::string> meta;
};

// User metadata to store with an object (x-amz-meta-<name>).
using UserMeta = std::map<std::string, std::string>;

struct ListPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> prefixes;  // common prefixes, with a delimiter
  std::string next_token;             // empty at the end
};

struct ListRequest {
  std::string prefix, delimiter, continuation, start_after;
  std::string end_key;  // Sluice extension: nothing after it
  // Not sent: the greatest name (key or common prefix) of the pages before. ListObjects
  // refuses a page that lists one not after it, or after start_after, or outside the prefix,
  // or out of order: an origin's listing must advance, or a loop over it would not end.
  std::string after;
  int empty_pages = 0;  // not sent: pages in a row that listed nothing
  int max_keys = 1000;

  // Readies the request for the page after `page`: false when that was the last. An error
  // when the origin's pages go on listing nothing (a loop of tokens would never end).
  Result<bool> Advance(const ListPage& page);
};

// One range of a split listing (Sluice extension): keys in (start_after, end_key]; empty
// bounds are open.
struct KeyRange {
  std::string start_after, end_key;
  uint64_t estimated = 0;
};

struct PartInfo {
  int number = 0;
  uint64_t size = 0;
  std::string etag;    // quotes stripped
  std::string crc32c;  // base64, when the part was uploaded with it
};

struct MultipartInfo {
  std::string key, upload_id;
  std::time_t initiated = 0;
};

// The most parts a multipart upload may have (S3's limit).
inline constexpr int kMaxParts = 10000;

// Receives a body piece by piece; an error stops the transfer.
using Sink = std::function<Status(std::string_view)>;

// Where a request body comes from: bytes in memory, or a range of a file.
struct Body {
  std::string_view data;
  int fd = -1;
  uint64_t offset = 0, length = 0;
  uint64_t size() const { return fd >= 0 ? length : data.size(); }
};

class S3Client {
 public:
  explicit S3Client(ClientOptions opts);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Bad endpoint, credentials missing: an error before any request.
  static Status Validate(const ClientOptions& opts);

  Result<std::vector<BucketInfo>> ListBuckets();
  Result<ListPage> ListObjects(std::string_view bucket, const ListRequest& req);
  // Every page of a listing, in order, to `fn` (its error ends the listing and is the answer).
  Status ForEachPage(std::string_view bucket, ListRequest req,
                     const std::function<Status(ListPage&)>& fn);
  Result<std::vector<KeyRange>> ListSplit(std::string_view bucket, std::string_view prefix,
                                          int parts);
  Result<ObjectInfo> Head(std::string_view bucket, std::string_view key);
  // The object, or bytes [first, first+length) of it, to `sink`. A transfer cut short is
  // resumed where it stopped (a ranged GET with If-Match on the first answer's ETag), so the
  // sink sees every byte once, in order.
  Result<ObjectInfo> Get(std::string_view bucket, std::string_view key, const Sink& sink,
                         std::optional<std::pair<uint64_t, uint64_t>> range = std::nullopt,
                         std::string_view if_match = {});
  // Returns the ETag.
  Result<std::string> Put(std::string_view bucket, std::string_view key, const Body& body,
                          std::string_view content_type = {}, const UserMeta& meta = {});
  // A PUT only if the key is absent (If-None-Match: *): kConflict when it is there (412), on
  // origins that honour the condition (docs/s3-volumes.md).
  Result<std::string> PutIfAbsent(std::string_view bucket, std::string_view key,
                                  std::string_view body);
  // A server-side copy (CopyObject); returns the new object's ETag. The metadata is copied, or
  // replaced by `replace` when given.
  // Server-side copy of `src_key` (in `src_bucket`, or `bucket` when empty) to `dst_key` of
  // `bucket`.
  Result<std::string> Copy(std::string_view bucket, std::string_view src_key,
                           std::string_view dst_key, const UserMeta* replace = nullptr,
                           std::string_view src_bucket = {}, std::string_view if_match = {});
  Status Delete(std::string_view bucket, std::string_view key);
  // Deletes up to 1000 keys in one request; returns each refused one's error ("key: code
  // message"), with the code its S3 error code means.
  Result<std::vector<Status>> DeleteMany(std::string_view bucket,
                                         const std::vector<std::string>& keys);

  Result<std::string> CreateMultipart(std::string_view bucket, std::string_view key,
                                      std::string_view content_type = {},
                                      const UserMeta& meta = {});
  // Returns the part's ETag; `crc32c` (base64) is filled when checksums are on.
  Result<std::string> UploadPart(std::string_view bucket, std::string_view key,
                                 std::string_view upload_id, int number, const Body& body,
                                 std::string* crc32c = nullptr);
  // UploadPartCopy: bytes [first, last] of `src_key` (in `src_bucket`) as part `number`, only
  // while the source's ETag is `if_match` (kConflict once it changed); returns the part's ETag.
  Result<std::string> CopyPart(std::string_view bucket, std::string_view key,
                               std::string_view upload_id, int number, std::string_view src_bucket,
                               std::string_view src_key, uint64_t first, uint64_t last,
                               std::string_view if_match, std::string* crc32c = nullptr);
  // kNotFound when the upload is gone (NoSuchUpload).
  Result<std::vector<PartInfo>> ListParts(std::string_view bucket, std::string_view key,
                                          std::string_view upload_id);
  Result<std::string> CompleteMultipart(std::string_view bucket, std::string_view key,
                                        std::string_view upload_id, std::vector<PartInfo> parts);
  Status AbortMultipart(std::string_view bucket, std::string_view key, std::string_view upload_id);
  Result<std::vector<MultipartInfo>> ListMultipartUploads(std::string_view bucket,
                                                          std::string_view prefix);

  // Sluice's batch get: `request_json` is the body ({"items": [...], ...}); the TAR stream goes
  // to `sink`. An empty bucket posts to "/?batch-get". Not retried once bytes have arrived.
  Status BatchGet(std::string_view bucket, std::string_view request_json, const Sink& sink);

  const ClientOptions& options() const { return opts_; }
  // Requests retried so far (for progress reports and tests).
  uint64_t retries() const { return retries_; }

 private:
  struct Request;
  struct Answer;
  Result<Answer> Send(Request& req);
  Result<Answer> SendOnce(Request& req);
  // Sets the request's path (and bucket) for `key` of `bucket` in this client's addressing; an
  // empty bucket names the service ("/").
  void Address(Request& req, std::string_view bucket, std::string_view key) const;

  ClientOptions opts_;
  std::string scheme_;       // "http://"
  std::string authority_;    // "host:port" as the endpoint names it
  std::string host_header_;  // "host:port"
  std::string base_path_;    // "" or "/prefix"
  void* curl_ = nullptr;
  uint64_t retries_ = 0;
  SigningKeyCache signing_;
};

// The server's TLS certificate is not trusted: kUnavailable (as any failure to connect), never
// retried, and marked with this errno so that a caller can tell it from an origin that is down.
inline constexpr int kUntrustedErrno = EKEYREJECTED;
bool IsUntrustedCertificate(const Status& st);

// The origin answered NoSuchBucket to a request naming `bucket` (a kNotFound whose message is
// the one Send writes for that answer).
bool IsNoSuchBucket(const Status& st, std::string_view bucket);

// CRC32C of bytes [off, off+len) of a file, base64 as S3 sends it.
Result<std::string> FileCrc32c(int fd, uint64_t off, uint64_t len);

// "2026-12-01T21:15:29.000Z" -> time; 0 when malformed.
std::time_t ParseIso8601(std::string_view s);

}  // namespace sluice::io::s3
