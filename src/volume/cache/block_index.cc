#include "volume/cache/block_index.h"

#include <algorithm>

#include <cstring>

namespace sluice {

namespace {

constexpr uint8_t kMaxFreq = 3;  // S3-FIFO's two-bit counter

uint64_t Fingerprint(const BlockIndex::Key& k) {
  uint64_t fp;
  std::memcpy(&fp, k.data() + 8, sizeof fp);  // not the bytes the hash map buckets by
  return fp;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::optional<BlockIndex::Key> BlockIndex::ParseKey(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Key k;
  for (size_t i = 0; i < k.size(); ++i) {
    int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    k[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return k;
}

std::string BlockIndex::KeyHex(const Key& k) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < k.size(); ++i) {
    s[2 * i] = kDigits[k[i] >> 4];
    s[2 * i + 1] = kDigits[k[i] & 15];
  }
  return s;
}

size_t BlockIndex::KeyHash::operator()(const Key& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof h);
  return h;
}

void BlockIndex::List::PushFront(Entry* e) {
  e->second.prev = nullptr;
  e->second.next = head;
  if (head) head->second.prev = e;
  head = e;
  if (!tail) tail = e;
  bytes += e->second.size;
}

void BlockIndex::List::Unlink(Entry* e) {
  Node& n = e->second;
  (n.prev ? n.prev->second.next : head) = n.next;
  (n.next ? n.next->second.prev : tail) = n.prev;
  n.prev = n.next = nullptr;
  bytes -= n.size;
}

BlockIndex::BlockIndex(EvictionPolicy policy, uint64_t capacity_bytes)
    : policy_(policy), capacity_(capacity_bytes) {}

bool BlockIndex::Touch(const Key& k) {
  auto it = map_.find(k);
  if (it == map_.end()) return false;
  Entry* e = &*it;
  if (policy_ == EvictionPolicy::kLru) {
    main_.Unlink(e);
    main_.PushFront(e);
  } else if (e->second.freq < kMaxFreq) {
    e->second.freq++;
  }
  return true;
}

void BlockIndex::Insert(const Key& k, uint64_t size, bool warm, bool verified) {
  auto [it, fresh] = map_.try_emplace(k);
  if (!fresh) return;
  Entry* e = &*it;
  e->second.size = size;
  e->second.verified = verified;
  bool to_main = policy_ == EvictionPolicy::kLru || warm;
  if (!to_main) {
    auto g = ghost_.find(Fingerprint(k));
    if (g != ghost_.end()) {
      to_main = true;
      ghost_.erase(g);  // its entry in ghost_order_ is now stale and skipped
    }
  }
  e->second.in_main = to_main;
  ListOf(e).PushFront(e);
}

bool BlockIndex::Verified(const Key& k) const {
  auto it = map_.find(k);
  return it != map_.end() && it->second.verified;
}

void BlockIndex::SetVerified(const Key& k) {
  if (auto it = map_.find(k); it != map_.end()) it->second.verified = true;
}

std::vector<BlockIndex::Key> BlockIndex::VerifiedKeys() const {
  std::vector<Key> out;
  for (const auto& [k, n] : map_)
    if (n.verified) out.push_back(k);
  return out;
}

void BlockIndex::Drop(Entry* e) {
  ListOf(e).Unlink(e);
  map_.erase(e->first);
}

bool BlockIndex::Remove(const Key& k) {
  auto it = map_.find(k);
  if (it == map_.end()) return false;
  Drop(&*it);
  return true;
}

void BlockIndex::Ghost(const Key& k, uint64_t size) {
  const uint64_t fp = Fingerprint(k);
  ghost_[fp] = ++ghost_seq_;
  ghost_order_.push_back({fp, size, ghost_seq_});
  ghost_bytes_ += size;
  const uint64_t limit = capacity_ - capacity_ / 10;  // as much as the main queue holds
  const size_t entries = std::max<size_t>(map_.size(), 4096);
  while ((ghost_bytes_ > limit || ghost_order_.size() > entries) && !ghost_order_.empty()) {
    const GhostEntry& g = ghost_order_.front();
    if (auto it = ghost_.find(g.fp); it != ghost_.end() && it->second == g.seq) ghost_.erase(it);
    ghost_bytes_ -= g.size;
    ghost_order_.pop_front();
  }
}

std::optional<BlockIndex::Key> BlockIndex::Evict(uint64_t* size) {
  if (map_.empty()) return std::nullopt;
  if (policy_ == EvictionPolicy::kLru) {
    Key k = main_.tail->first;
    if (size) *size = main_.tail->second.size;
    Drop(main_.tail);
    return k;
  }
  for (;;) {
    // The small queue gives up its oldest while it holds its tenth (or the main one is empty).
    if (small_.tail && (small_.bytes >= capacity_ / 10 || !main_.tail)) {
      Entry* e = small_.tail;
      small_.Unlink(e);
      if (e->second.freq > 0) {  // read again while in the small queue: it stays
        e->second.freq = 0;
        e->second.in_main = true;
        main_.PushFront(e);
        continue;
      }
      Key k = e->first;
      if (size) *size = e->second.size;
      Ghost(k, e->second.size);
      map_.erase(k);
      return k;
    }
    Entry* e = main_.tail;
    main_.Unlink(e);
    if (e->second.freq > 0) {  // read since its last lap: another one
      e->second.freq--;
      main_.PushFront(e);
      continue;
    }
    Key k = e->first;
    if (size) *size = e->second.size;
    map_.erase(k);
    return k;
  }
}

bool MissFilter::SecondMiss(const BlockIndex::Key& k) {
  uint64_t fp;
  std::memcpy(&fp, k.data() + 8, sizeof fp);
  if (seen_.erase(fp)) return true;
  seen_[fp] = ++seq_;
  order_.emplace_back(fp, seq_);
  while (order_.size() > capacity_) {
    auto [old, at] = order_.front();
    if (auto it = seen_.find(old); it != seen_.end() && it->second == at) seen_.erase(it);
    order_.pop_front();
  }
  return false;
}

}  // namespace sluice
