// Sluice's batch get: many objects (each optionally a byte range of one) as one TAR stream in
// the order they were asked for, assembled as the client reads it: one object's bytes at a time
// in memory, never the batch. With continue-on-error, an item that cannot be read becomes an
// empty placeholder entry ("__404__/<name>" for a missing object, "__error__/<name>" for any
// other failure) and the batch goes on; without it, the first such item ends the stream cut
// short (or, when it is the first, is the request's answer). A last entry, "__manifest__.json",
// gives every item's outcome in request order. AIStore's GetBatch is the model.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/archive_writer.h"
#include "api/s3/s3_bodies.h"
#include "api/s3/sigv4.h"
#include "service/s3/objects.h"

namespace sluice::api::s3 {

struct BatchItem {
  std::string bucket;
  std::string key;
  std::string name;    // in the archive: "<bucket>/<key>"
  std::string opaque;  // echoed in the manifest
  std::string range;   // "bytes=first-last" or ""
  Volume* volume = nullptr;
  VFolderId vfid;
  std::optional<S3Error> refused;  // decided before streaming: no access to the bucket, say
};

inline constexpr size_t kMaxBatchBuckets = 1000;  // distinct buckets one batch reads from
inline constexpr const char* kBatchManifestName = "__manifest__.json";

class BatchGetStream {
 public:
  BatchGetStream(ObjectStore* objects, std::vector<BatchItem> items, bool continue_on_error,
                 bool manifest, std::string label);
  ~BatchGetStream();

  // Begins the archive up to the first item's data: an error here (without continue-on-error)
  // is what the request answers, as nothing has been sent yet.
  std::optional<S3Error> Prepare();
  // Fills up to `cap` bytes of `buf`; 0 at the end. An error cuts the response short.
  Result<size_t> Read(char* buf, size_t cap);

 private:
  Status Step();
  Status StartItem();
  Status FileData();
  Status Failed(const S3Error& e);
  Status WriteManifest();
  void ManifestItem(std::string& text, size_t i) const;  // item i's record, ',' before it

  ObjectStore* objects_;
  std::vector<BatchItem> items_;
  bool continue_on_error_, manifest_;
  std::string label_;
  ArchiveWriter tar_{ArchiveWriter::Format::kTar, 0};
  size_t next_ = 0;
  std::shared_ptr<FileReader> file_;
  uint64_t file_off_ = 0, file_left_ = 0;
  // Per item, for the manifest: what became of it (no allocation for an item served whole).
  struct Outcome {
    unsigned status = 0;
    uint64_t size = 0;
    uint64_t range_first = 0, range_total = 0;  // a range: its start and the object's size
    std::string code, message;                  // an error
  };
  std::vector<Outcome> outcomes_;
  Outcome* Record();  // this item's outcome, when a manifest is kept
  bool manifest_started_ = false, manifest_written_ = false;
  size_t manifest_next_ = 0;     // the next item the manifest names
  Status failure_;               // the step that cut the stream
  std::optional<S3Error> stop_;  // the item that ended a batch without continue-on-error
  uint64_t ok_ = 0, errors_ = 0, bytes_ = 0;
};

}  // namespace sluice::api::s3
