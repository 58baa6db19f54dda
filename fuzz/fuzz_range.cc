// Range, If-Range and date headers: every satisfiable range must lie inside the file.
#include <cstdlib>
#include <string>

#include "api/range.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint64_t file_size = (static_cast<uint64_t>(data[0]) << 8 | data[1]) * 37;
  std::string h(reinterpret_cast<const char*>(data + 2), size - 2);
  auto r = sluice::api::ParseRange(h, file_size);
  using Kind = sluice::api::RangeRequest::Kind;
  if (r.kind == Kind::kSatisfiable) {
    if (r.ranges.empty() || r.ranges.size() > sluice::api::kMaxRanges) std::abort();
    for (const auto& br : r.ranges)
      if (br.length == 0 || br.first >= file_size || br.last() >= file_size) std::abort();
  } else if (!r.ranges.empty()) {
    std::abort();
  }
  (void)sluice::api::ParseHttpDate(h);
  (void)sluice::api::IfRangeMatches(h, "\"1-2-3\"", 0);
  (void)sluice::api::IfNoneMatchMatches(h, "\"1-2-3\"");
  (void)sluice::api::ContentDisposition(h);
  return 0;
}
