// Directories listed in key order (see ListFrom) from names read in any order: the sort, a view
// that starts where a page resumes, and the sorted names of large directories kept between the
// pages of a listing.
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "volume/volume.h"

namespace sluice {

using KeyOrderedNames = std::vector<DirHandle::Name>;

// <0, 0, >0 as the key of (an, a_dir) sorts before, with, after that of (bn, b_dir).
int CompareListKeys(std::string_view an, bool a_dir, std::string_view bn, bool b_dir);

// Sorts `names` by key.
void SortByKey(KeyOrderedNames& names);

// `inner`'s entries that `from` selects, taken from `names` (all of them, sorted by key), which
// the view shares; everything else is asked of `inner`.
std::unique_ptr<DirHandle> KeyOrderedView(std::unique_ptr<DirHandle> inner,
                                          std::shared_ptr<const KeyOrderedNames> names,
                                          const ListFrom& from);

// The sorted names of large directories, kept so that each page of a listing of a directory of
// a million entries costs its own entries, not a read and a sort of the whole directory.
// Only directories with an inode (file systems) are kept, identified by inode, modification
// and change times: any change to the directory's entries moves both. A directory changed
// within two seconds of being read is not kept, so that a change in the same tick of the
// file system's clock cannot hide behind an unchanged time. Bounded by the names' bytes,
// least recently used first out.
class KeyOrderCache {
 public:
  static constexpr size_t kMinNames = 1024;  // smaller directories are read again: cheap
  // `settle`: how long before the read a directory must have last changed to be kept.
  explicit KeyOrderCache(size_t max_bytes = size_t{128} << 20,
                         std::chrono::milliseconds settle = std::chrono::seconds(2))
      : max_bytes_(max_bytes), settle_(settle) {}

  // The names kept for directory `id` (volume, vfolder and path), if `info` is the version
  // they were read from.
  std::shared_ptr<const KeyOrderedNames> Find(const std::string& id, const DirEntry& info);
  // Keeps `names` (sorted by key), read from the version `info` describes after `read_at`.
  void Put(const std::string& id, const DirEntry& info,
           std::shared_ptr<const KeyOrderedNames> names,
           std::chrono::system_clock::time_point read_at);
  size_t bytes() const;

 private:
  struct Entry {
    std::string id;
    uint64_t ino;
    std::chrono::system_clock::time_point modified, changed;
    std::shared_ptr<const KeyOrderedNames> names;
    size_t bytes;
  };
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
  size_t max_bytes_;
  std::chrono::milliseconds settle_;
};

}  // namespace sluice
