// S3 listings checked against what they must be: the oracle (every key, filtered and rolled up
// in byte order) and a pager over ListObjects (each page resuming after the last key of the one
// before), for the listing tests of the volume and service suites.
#pragma once

#include <algorithm>
#include <map>
#include <random>
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
    if (!k.starts_with(q.prefix) || k <= q.after) continue;
    size_t at = q.delimiter.empty() ? std::string::npos : k.find(q.delimiter, q.prefix.size());
    if (at == std::string::npos) {
      if (!q.end || k <= *q.end) out.push_back(k);
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

// A random tree of names that sort around '/' ("a-", "a.", "a0", "a~"...), with some empty
// directories, made below `root` ("" or "r/") through `file` and `dir` (each given a path);
// returns its keys (files, and "d/" for each empty directory), sorted.
template <typename MakeFile, typename MakeDir>
std::vector<std::string> RandomTree(std::mt19937& rng, const std::string& root, int paths,
                                    MakeFile file, MakeDir dir) {
  const std::string alphabet = "ab-.0~";
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto name = [&] {
    for (;;) {
      std::string s;
      for (size_t n = 1 + pick(3); n > 0; --n) s += alphabet[pick(alphabet.size())];
      if (s != "." && s != "..") return s;
    }
  };
  std::map<std::string, bool> is_dir;  // every path made, below root
  for (int i = 0; i < paths; ++i) {
    const size_t depth = 1 + pick(3);
    const bool empty_dir = pick(6) == 0;
    std::string path;
    bool ok = true;
    for (size_t d = 0; d < depth && ok; ++d) {
      path += (path.empty() ? "" : "/") + name();
      auto it = is_dir.find(path);
      ok = it == is_dir.end() || (it->second && d + 1 < depth);
    }
    if (!ok) continue;
    if (empty_dir)
      dir(root + path);
    else
      file(root + path);
    for (size_t at = path.find('/'); at != std::string::npos; at = path.find('/', at + 1))
      is_dir[path.substr(0, at)] = true;
    is_dir[path] = empty_dir;
  }
  std::vector<std::string> keys;
  for (const auto& [p, d] : is_dir) {
    if (!d) {
      keys.push_back(root + p);
      continue;
    }
    const bool holds = std::any_of(is_dir.begin(), is_dir.end(), [&](const auto& e) {
      return e.first.size() > p.size() && e.first.starts_with(p + "/");
    });
    if (!holds) keys.push_back(root + p + "/");  // an empty directory is its marker
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// A random query over `keys` whose prefix starts with `root`, in pages of one to four keys.
inline ListQuery RandomQuery(std::mt19937& rng, const std::vector<std::string>& keys,
                             const std::string& root) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto some_key = [&] { return keys.empty() ? root : keys[pick(keys.size())]; };
  ListQuery q;
  q.prefix = root;
  if (pick(2)) q.prefix = some_key().substr(0, root.size() + pick(5));
  // Mostly "/", also delimiters inside names, whose common prefixes do not follow directories.
  if (pick(2)) q.delimiter = std::vector<std::string>{"/", "/", "-", ".", "a/"}[pick(5)];
  if (pick(2)) q.after = some_key().substr(0, root.size() + 1 + pick(6));
  // An end key that is a key, or one that is not (a range cut at a key deleted since).
  if (pick(3) == 0) q.end = some_key();
  if (pick(6) == 0) q.end = some_key().substr(0, root.size() + 1 + pick(6));
  q.max_keys = 1 + pick(4);
  q.want_etag = false;
  return q;
}

// What a query was, for a failure's message.
inline std::string Describe(const ListQuery& q) {
  return "prefix '" + q.prefix + "' delimiter '" + q.delimiter + "' after '" + q.after + "' end '" +
         q.end.value_or("") + "' page " + std::to_string(q.max_keys);
}

}  // namespace sluice::test
