// The SSD cache's index of blocks and its eviction policy, apart from the disk, so that the
// policy replays traces in bench/cache_policy.cc exactly as it runs in the cache.
//
// Two policies, chosen per volume (`eviction`), measured against each other in
// docs/cache.md:
// - LRU: one recency list; a hit moves the block to the front.
// - S3-FIFO (Yang et al., SOSP '23): a small FIFO queue (a tenth of the capacity) that new
//   blocks enter, a main FIFO queue, and a ghost list of blocks evicted from the small queue.
//   A block read again while in the small queue moves to the main queue when it leaves; one
//   in the ghost list enters the main queue directly; the main queue gives blocks read since
//   they were last at its tail another lap. A hit is a counter increment, with no list
//   moves: one scan passes through the small queue without flushing the main one.
//
// An entry costs about 100 bytes: the 32-byte binary id, the size, two list links and a
// counter in a hash-map node (measured by bench/cache_policy.cc).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sluice {

enum class EvictionPolicy { kLru, kS3Fifo };

class BlockIndex {
 public:
  using Key = std::array<unsigned char, 32>;
  // 64 lower-case hex digits to a key; nullopt when it is not one.
  static std::optional<Key> ParseKey(std::string_view hex);
  static std::string KeyHex(const Key& k);

  BlockIndex(EvictionPolicy policy, uint64_t capacity_bytes);

  // Counts an access to a block; false when it is not indexed.
  bool Touch(const Key& k);
  bool Contains(const Key& k) const { return map_.count(k) != 0; }
  // The block's size; nullopt when it is not indexed.
  std::optional<uint64_t> SizeOf(const Key& k) const {
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    return it->second.size;
  }
  // Indexes a block that is not there. `warm`: one found on disk at start, already admitted
  // once (S3-FIFO puts it in the main queue).
  void Insert(const Key& k, uint64_t size, bool warm = false, bool verified = false);
  // The block to evict next, taken out of the index; nullopt when the index is empty.
  std::optional<Key> Evict(uint64_t* size = nullptr);
  // Takes a block out (a torn one, an explicit evict); false when it was not there.
  bool Remove(const Key& k);
  // Whether the block's checksum was checked since this process indexed it (blocks it wrote
  // are): a verified block may be sent straight from its file. false when not indexed.
  bool Verified(const Key& k) const;
  void SetVerified(const Key& k);
  // Every verified block's key.
  std::vector<Key> VerifiedKeys() const;

  uint64_t bytes() const { return small_.bytes + main_.bytes; }
  uint64_t blocks() const { return map_.size(); }
  size_t ghosts() const { return ghost_order_.size(); }
  EvictionPolicy policy() const { return policy_; }

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const;  // the key is a SHA-256: its first bytes will do
  };
  struct Node;
  using Entry = std::pair<const Key, Node>;
  struct Node {
    uint64_t size = 0;
    Entry* prev = nullptr;
    Entry* next = nullptr;
    uint8_t freq = 0;
    bool in_main = false;
    bool verified = false;
  };
  struct List {  // intrusive, through the map's nodes; head is the newest
    Entry* head = nullptr;
    Entry* tail = nullptr;
    uint64_t bytes = 0;
    void PushFront(Entry* e);
    void Unlink(Entry* e);
  };
  List& ListOf(Entry* e) { return e->second.in_main ? main_ : small_; }
  void Drop(Entry* e);  // unlinks and erases
  void Ghost(const Key& k, uint64_t size);

  EvictionPolicy policy_;
  uint64_t capacity_;
  std::unordered_map<Key, Node, KeyHash> map_;
  List small_, main_;  // LRU uses main_ alone, most recently used first
  // S3-FIFO's ghost list: 8-byte fingerprints of blocks evicted from the small queue, as many
  // bytes' worth as the main queue may hold and as many entries as the index holds (at least
  // 4096), oldest first out: tiny objects would otherwise keep millions of ghosts.
  struct GhostEntry {
    uint64_t fp, size, seq;
  };
  std::deque<GhostEntry> ghost_order_;
  std::unordered_map<uint64_t, uint64_t> ghost_;  // fingerprint -> its newest seq
  uint64_t ghost_bytes_ = 0, ghost_seq_ = 0;
};

// Second-miss admission: true the second time a block misses within the last `capacity`
// misses (a bounded ghost list of fingerprints), so one scan does not flush the cache.
class MissFilter {
 public:
  explicit MissFilter(size_t capacity = 1 << 16) : capacity_(capacity) {}
  bool SecondMiss(const BlockIndex::Key& k);

 private:
  size_t capacity_;
  // Each fingerprint's latest first miss: an older entry of `order_` that ages out leaves a
  // newer miss of the same block alone (before 2026-12-05 it erased it).
  std::unordered_map<uint64_t, uint64_t> seen_;
  std::deque<std::pair<uint64_t, uint64_t>> order_;  // fingerprint, sequence
  uint64_t seq_ = 0;
};

}  // namespace sluice
