// S3 listings checked against what they must be: the oracle (every key, filtered and rolled up
// in byte order) and a pager over ListObjects (each page resuming after the last key of the one
// before), for the listing tests of the volume and service suites.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "service/s3/objects.h"
#include "support/assert_status.h"
#include "volume/key_order.h"

namespace sluice::test {

// S3's listing of `keys` (every key of the vfolder, sorted) for `q`, whole: what paging
// through ListObjects must give.
inline std::vector<std::string> ExpectedListing(const std::vector<std::string>& keys,
                                                const ListQuery& q) {
  std::vector<std::string> out;
  std::string last_prefix;
  for (const auto& k : keys) {
    if (!k.starts_with(q.prefix) || k <= q.after || (q.end && k > *q.end)) continue;
    size_t at = q.delimiter.empty() ? std::string::npos : k.find(q.delimiter, q.prefix.size());
    if (at == std::string::npos) {
      out.push_back(k);
      continue;
    }
    std::string cp = k.substr(0, at + q.delimiter.size());
    if (cp != last_prefix && cp > q.after && (!q.end || cp <= *q.end)) out.push_back(cp);
    last_prefix = cp;
  }
  return out;
}

// Pages through ListObjects, each page resuming after the last key of the one before.
inline std::vector<std::string> Paged(Volume& v, const VFolderId& vf, ListQuery q,
                                      KeyOrderCache* names = nullptr) {
  std::vector<std::string> out;
  for (int pages = 0; pages < 10000; ++pages) {
    auto p = ListObjects(v, vf, q, nullptr, names);
    EXPECT_OK(p);
    if (!p.ok()) break;
    for (const auto& it : p->items) out.push_back(it.object.key);
    if (!p->truncated) break;
    EXPECT_FALSE(p->items.empty());
    q.after = p->items.back().object.key;
  }
  return out;
}

}  // namespace sluice::test
