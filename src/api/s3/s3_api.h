// The S3 listener: buckets are vfolders, objects are files (service/s3/). Path-style
// addressing; every request signed with SigV4 (header or presigned URL) by a key of
// service/s3/s3_store.h. docs/s3.md lists the operations and the differences from AWS.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "api/http.h"

namespace sluice {
class StorageService;
class S3Store;
}  // namespace sluice

namespace sluice::api {

struct S3Options {
  std::string region = "us-east-1";
  bool durable = true;  // fsync objects before answering a write
  std::string domain;   // virtual-hosted buckets: "<bucket>.<domain>" in Host; "" for none
  size_t max_multipart_uploads = 10000;  // in progress, per bucket
  size_t max_buckets = 1000;             // a user may own through CreateBucket
  // A copy or a Complete still running after this long answers 200 and sends a space this
  // often until its result (s3_api.cc, KeepingAlive); 0: answered when done.
  std::chrono::milliseconds keepalive{5000};
};

std::shared_ptr<Router> MakeS3Router(StorageService* service, S3Store* store, ThreadPool* io_pool,
                                     S3Options options);

}  // namespace sluice::api
