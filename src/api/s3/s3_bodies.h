// The request bodies of the S3 API that Sluice parses itself: the XML of DeleteObjects and
// CompleteMultipartUpload, and the JSON of batch get. Pure functions of the body (no volume,
// no grant), so that unit tests and the fuzz target (fuzz/fuzz_s3body.cc) call them directly.
// Bodies are bounded by their routes (s3_api.cc); what is inside them is bounded here.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sluice::api::s3 {

inline constexpr size_t kMaxDeleteKeys = 1000;
inline constexpr size_t kMaxBatchItems = 100000;
inline constexpr size_t kMaxBatchOpaque = 1024;
inline constexpr size_t kMaxBatchKey = 1024;   // bytes, as S3 bounds a key
inline constexpr size_t kMaxBatchBucket = 63;  // bytes, as S3 bounds a bucket name

// DeleteObjects: <Delete><Quiet>?<Object><Key>...</Key></Object>...</Delete>, 1 to 1000 keys.
// kInvalidArgument (S3's MalformedXML) otherwise. A key with what this server does not do (a
// version other than "null", a conditional delete's ETag / LastModifiedTime / Size) is listed
// in `refused` with S3's code and message, to be answered as that key's <Error>, not deleted.
struct DeleteRequest {
  struct Refusal {
    std::string code, message;
  };
  bool quiet = false;
  std::vector<std::string> keys;
  std::map<size_t, Refusal> refused;  // by index in `keys`
};
Result<DeleteRequest> ParseDeleteObjects(std::string_view body);

// CompleteMultipartUpload: the parts as the client lists them, in its order (the order is
// checked against the upload, not here). A part's ETag that is not a quoted or bare MD5 in hex
// becomes an empty md5, which matches no part (InvalidPart, as AWS answers). kInvalidArgument
// (MalformedXML) for a body that is not such a list, or lists no part.
struct CompletePart {
  int number = 0;
  std::string md5;                               // raw, 16 bytes, or "" (matches nothing)
  std::map<std::string, std::string> checksums;  // ChecksumKey -> base64, as listed
};
Result<std::vector<CompletePart>> ParseCompleteMultipart(std::string_view body);

// CreateBucket's optional body: a <CreateBucketConfiguration> document, or kInvalidArgument.
Status CheckCreateBucketConfiguration(std::string_view body);

// Batch get: {"items": [{"key", "bucket"?, "range"?, "opaque"?}, ...], "continue-on-error"?,
// "manifest"?}. Items without a bucket take `default_bucket` (POST /bucket?batch-get).
// kInvalidArgument with a message that names the item and the field otherwise.
struct BatchSpec {
  std::string bucket, key, range, opaque;
};
struct BatchRequest {
  std::vector<BatchSpec> items;
  bool continue_on_error = false;
  bool manifest = true;
};
Result<BatchRequest> ParseBatchRequest(std::string_view body, std::string_view default_bucket);

}  // namespace sluice::api::s3
