// The S3 request bodies Sluice parses (api/s3/s3_bodies.h), the first byte choosing which:
// nothing may crash, and what is accepted keeps the documented bounds.
#include <cstdlib>
#include <string>

#include "api/s3/s3_bodies.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::api::s3;
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0:
      if (auto r = ParseDeleteObjects(body); r.ok())
        if (r->keys.empty() || r->keys.size() > kMaxDeleteKeys) std::abort();
      break;
    case 1:
      if (auto r = ParseCompleteMultipart(body); r.ok()) {
        if (r->empty()) std::abort();
        for (const auto& p : *r)
          if (p.number < 0 || p.number > 99999 || (!p.md5.empty() && p.md5.size() != 16))
            std::abort();
      }
      break;
    case 2:
      (void)CheckCreateBucketConfiguration(body);
      break;
    default:
      if (auto r = ParseBatchRequest(body, "default"); r.ok()) {
        if (r->items.empty() || r->items.size() > kMaxBatchItems) std::abort();
        for (const auto& it : r->items)
          if (it.key.empty() || it.bucket.empty() || it.opaque.size() > kMaxBatchOpaque)
            std::abort();
      }
  }
  return 0;
}
