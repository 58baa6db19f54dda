// The SSD read cache's blocks on a local disk: one file per block (a 20-byte header with the
// data's length and CRC32C, then the data), written to a temporary name and renamed into place,
// so that a block torn by a crash is detected by its checksum and dropped, never served. An
// in-memory index (about 200 bytes per block: the 64-character id, a list node and a hash-map
// node) keeps the blocks in least-recently-used order and their total size under `max_bytes`,
// and the disk's free space above `min_free`. At open, the blocks already there are indexed
// (oldest written first out): the cache is warm after a restart.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"

namespace sluice {

struct BlockStoreOptions {
  std::string dir;
  uint64_t max_bytes = 10ULL << 30;
  uint64_t min_free = 1ULL << 30;
};

class BlockStore {
 public:
  static Result<std::unique_ptr<BlockStore>> Open(BlockStoreOptions opts);

  // The block `id` (64 lower-case hex digits), or nullopt: missing, or torn (then removed).
  std::optional<std::string> Get(const std::string& id);
  // Stores the block, evicting the least recently used ones to stay within the limits. false:
  // not stored (the disk is too full even with the cache empty, or the write failed).
  bool Put(const std::string& id, std::string_view data);

  struct Stats {
    uint64_t blocks = 0, bytes = 0, evictions = 0, torn = 0, rejected = 0;
  };
  Stats stats() const;
  const BlockStoreOptions& options() const { return opts_; }

 private:
  explicit BlockStore(BlockStoreOptions opts) : opts_(std::move(opts)) {}
  std::string PathOf(const std::string& id) const;
  void Index(const std::string& id, uint64_t size);  // as the most recently used; mu_ held
  void EvictOne();                                   // mu_ held
  void Drop(const std::string& id);                  // from the index and the disk; mu_ held
  uint64_t FreeBytes() const;

  BlockStoreOptions opts_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recently used first
  struct Entry {
    uint64_t size;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, Entry> index_;
  Stats stats_;
};

}  // namespace sluice
