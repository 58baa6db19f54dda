// libsluice's transfer engine, the body of `sluice s3 cp | sync | ls | rm | get-batch`:
// copies between local files and S3 keys with N workers (each owning one S3 client and its
// connection), large files as multipart uploads of parallel parts and as parallel ranged GETs.
// Uploads resume: a multipart upload's id is kept in a state file until it completes, and the
// same command run again reuses every part the server already holds whose size and CRC32C
// match the local bytes. Downloads land in a temporary file renamed into place when complete,
// so a destination is never partial. Progress is a set of counters a caller may poll.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "io/s3/s3_client.h"

namespace sluice::client {

// "s3://bucket/key/prefix" (the key may be empty).
struct S3Url {
  std::string bucket, key;
  static bool Is(std::string_view s) { return s.rfind("s3://", 0) == 0; }
  static Result<S3Url> Parse(std::string_view s);
  std::string ToString() const { return "s3://" + bucket + "/" + key; }
};

struct TransferOptions {
  io::s3::ClientOptions s3;
  int jobs = 8;                              // parallel requests
  uint64_t multipart_threshold = 64u << 20;  // files at least this big go in parts
  uint64_t part_size = 16u << 20;            // grown when a file would need over 10,000 parts
  bool resume = true;                        // keep and reuse multipart state
  std::string state_dir;        // default: $XDG_CACHE_HOME or ~/.cache, /sluice/uploads
  bool dry_run = false;         // say what would be done, do nothing
  bool delete_extra = false;    // sync: remove what the source does not have
  bool exclude_markers = true;  // downloads: "dir/" keys become directories
  // One line per action ("upload: a -> s3://b/a") and per failure, from any worker.
  std::function<void(const std::string&)> say;
};

// What a run is doing, updated by the workers as bytes move; read from any thread.
struct TransferStats {
  std::atomic<uint64_t> bytes_total{0}, bytes_done{0};
  std::atomic<uint64_t> files_total{0}, files_done{0}, files_failed{0}, files_skipped{0};
  std::atomic<uint64_t> parts_reused{0}, retries{0};
  std::atomic<bool> planning{true};        // still listing / walking
  std::atomic<bool> stdout_closed{false};  // a write to stdout found its reader gone (EPIPE)
};

struct TransferResult {
  std::vector<std::string> errors;  // one per failed file
  std::vector<Code> codes;          // each failure's cause (kIoError for a local one)
  bool ok() const { return errors.empty(); }
  // The code every failure shares (kOk when none failed, kInternal when they differ).
  Code SharedCode() const;
};

class Transfer {
 public:
  explicit Transfer(TransferOptions opts);

  // cp: local file or directory (with `recursive`) to S3, S3 key or prefix to local; "-" is
  // stdin (uploaded as it is read: one PUT, or a multipart upload once it passes a part) or
  // stdout (one object, streamed).
  Result<TransferResult> Copy(std::string_view src, std::string_view dst, bool recursive);
  // sync: copies what is missing, of another size, or newer at the source; with delete_extra
  // removes what the destination holds and the source does not.
  Result<TransferResult> Sync(std::string_view src, std::string_view dst);
  // rm: one key, or every key under a prefix (batched DeleteObjects, in parallel).
  Result<TransferResult> Remove(const S3Url& url, bool recursive);

  // Replaces TransferOptions::say (a caller that draws progress wraps it).
  void set_say(std::function<void(const std::string&)> say) { opts_.say = std::move(say); }
  TransferStats& stats() { return stats_; }
  const TransferOptions& options() const { return opts_; }

 private:
  struct Job;
  struct Unit;
  static Job& AddUpload(std::deque<Job>& jobs, std::string local, std::string bucket,
                        std::string key, uint64_t size, std::time_t mtime);
  static Job& AddDownload(std::deque<Job>& jobs, std::string bucket, const io::s3::ObjectInfo& o,
                          std::string local);
  // Runs the jobs with `workers` threads (0: TransferOptions::jobs).
  Result<TransferResult> Run(std::deque<Job>& jobs, int workers = 0);
  void Work(std::deque<Job>& jobs, std::vector<Unit>& units, std::atomic<size_t>& next);
  Status RunUnit(io::s3::S3Client& c, Job& job, const Unit& u);
  Status StartUpload(io::s3::S3Client& c, Job& job);
  Status FinishUpload(io::s3::S3Client& c, Job& job);
  Status FinishDownload(Job& job);
  Result<TransferResult> UploadStream(int fd, const S3Url& to);
  std::string StatePath(const Job& job) const;
  uint64_t PartSizeFor(uint64_t size) const;

  TransferOptions opts_;
  TransferStats stats_;
  std::atomic<bool> no_batch_delete_{false};  // the server answered DeleteObjects NotImplemented
  std::mutex say_mu_;
  void Say(const std::string& line);
};

// Lists `prefix` of `bucket`, every key (recursive) or one level (delimiter "/"), calling
// `on_object` / `on_prefix` in key order. With jobs > 1 and a recursive listing, the key space
// is split (Sluice's list-split) and the ranges listed in parallel, output still in order.
Status ListKeys(const io::s3::ClientOptions& opts, const S3Url& url, bool recursive, int jobs,
                const std::function<void(const io::s3::ObjectInfo&)>& on_object,
                const std::function<void(const std::string&)>& on_prefix);

struct BatchGetOptions {
  bool continue_on_error = false;
  std::string output;       // TAR file, "-" for stdout (when extract_dir is empty)
  std::string extract_dir;  // extract the entries here instead
};

struct BatchGetResult {
  uint64_t bytes = 0;           // TAR bytes received
  uint64_t entries = 0;         // objects received whole (extracted in extract mode)
  uint64_t placeholders = 0;    // entries standing for items that failed
  uint64_t ok = 0, errors = 0;  // from the manifest, which every whole stream ends with
};

// Whether `path` names this process's stdout: "-", or the file fd 1 is (/dev/stdout, say).
bool IsStdout(const std::string& path);

// Whether an existing destination is not a regular file or directory (/dev/null, a FIFO, a
// terminal): it is written in place, since a temporary renamed over it would put a file where
// the device was (run as root, over /dev/null itself).
bool WrittenInPlace(const std::string& dst);
// A temporary file next to `dst` (".sluice-NAME.RANDOM", tracked by common/temp_files until
// renamed into place or dropped), so the rename that publishes it stays on one file system;
// or, with `in_place` (decided for a destination the user named: one found in a tree is
// replaced like any other file), `dst` itself or stdout, with no temporary name. The
// descriptor and the temporary's name ("" in place).
Result<std::pair<int, std::string>> OpenTemp(const std::string& dst, bool in_place);
// Removes a temporary file that will not be renamed into place.
void DropTemp(const std::string& tmp);

// Sluice's batch get of `keys` in `bucket` (an item's own "bucket/key" when it starts with
// "s3://"), streamed to a TAR file or extracted as it arrives; either way the stream's
// entries are checked and its manifest read (errors > 0: some item failed).
Result<BatchGetResult> BatchGet(const io::s3::ClientOptions& opts, const std::string& bucket,
                                const std::vector<std::string>& keys, const BatchGetOptions& bo,
                                TransferStats* stats);

}  // namespace sluice::client
