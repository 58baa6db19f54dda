// A bounded cache of tokens that passed verification, keyed by their exact text. A token is
// immutable and signed, so what was derived from it once (its checked claims) holds for every
// later use until it expires; a hit skips the base64 decoding, the HMAC and the JSON parse.
// Only successfully verified tokens go in, so every failure is still diagnosed in full.
//
// Laid out for lookups that miss the CPU caches (many tokens used at random): a hit reads one
// slot of an open-addressing table, then one block holding the entry's reference count, value
// and token text together.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice {

template <typename T>
class VerifiedTokenCache {
  struct Entry;

 public:
  // A counted reference to a cached value; it stays valid after the entry is evicted.
  class Ref {
   public:
    Ref() = default;
    Ref(const Ref& o) : e_(o.e_) { Acquire(e_); }
    Ref(Ref&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    Ref& operator=(Ref o) noexcept {
      std::swap(e_, o.e_);
      return *this;
    }
    ~Ref() { Release(e_); }
    explicit operator bool() const { return e_ != nullptr; }
    const T& operator*() const { return e_->value; }
    const T* operator->() const { return &e_->value; }

   private:
    friend class VerifiedTokenCache;
    explicit Ref(Entry* e) : e_(e) { Acquire(e_); }
    struct Adopt {};
    Ref(Entry* e, Adopt) : e_(e) {}  // takes over a reference
    Entry* e_ = nullptr;
  };

  // At most `capacity` entries, the oldest replaced first; 0 disables the cache.
  explicit VerifiedTokenCache(size_t capacity) {
    size_t per_shard = (capacity + kShards - 1) / kShards;
    for (auto& s : shards_) {
      s.capacity = per_shard;
      // Open addressing at most half full: a lookup reads one or two slots, then the entry.
      if (per_shard) s.slots.resize(std::bit_ceil(2 * per_shard));
    }
  }
  ~VerifiedTokenCache() {
    for (auto& s : shards_)
      for (Entry* e : s.ring) Release(e);
  }
  VerifiedTokenCache(const VerifiedTokenCache&) = delete;
  VerifiedTokenCache& operator=(const VerifiedTokenCache&) = delete;

  // The value stored for `token`, or null when absent or expired at `now` (seconds since the
  // epoch; a token expires when exp <= now, as JwtDecode has it).
  Ref Find(std::string_view token, double now) {
    const size_t h = Hash(token);
    Shard& s = ShardFor(h);
    std::lock_guard lk(s.mu);
    size_t i = s.Lookup(token, h);
    if (i == kNone) return Ref();
    Entry* e = s.slots[i].entry;
    if (e->exp && *e->exp <= now) {
      s.Erase(i);  // the ring still owns it until its turn comes
      return Ref();
    }
    return Ref(e);
  }

  // Remembers a verified token's value; `exp` is its expiry claim, if it has one. Returns the
  // value now cached for the token.
  Ref Insert(std::string_view token, T value, std::optional<double> exp) {
    Ref fresh(Entry::Make(token, exp, std::move(value)), typename Ref::Adopt{});
    const size_t h = Hash(token);
    Shard& s = ShardFor(h);
    if (s.capacity == 0) return fresh;
    std::lock_guard lk(s.mu);
    if (size_t i = s.Lookup(token, h); i != kNone) return Ref(s.slots[i].entry);
    // A ring in insertion order bounds the size; it holds one reference to each entry.
    Entry* e = fresh.e_;
    Acquire(e);
    if (s.ring.size() < s.capacity) {
      s.ring.push_back(e);
    } else {
      Entry*& oldest = s.ring[s.next];
      if (size_t i = s.Lookup(oldest->token(), Hash(oldest->token()));
          i != kNone && s.slots[i].entry == oldest)
        s.Erase(i);
      Release(oldest);
      oldest = e;
      s.next = (s.next + 1) % s.capacity;
    }
    size_t mask = s.slots.size() - 1;
    size_t i = h & mask;
    while (s.slots[i].entry) i = (i + 1) & mask;
    s.slots[i] = Slot{h, e};
    return fresh;
  }

 private:
  static constexpr size_t kShards = 16;  // loop threads and workers rarely meet on one lock
  static constexpr size_t kNone = ~size_t{0};

  // One allocation: the header and value, then the token's bytes.
  struct Entry {
    std::atomic<size_t> refs{1};
    size_t len = 0;
    std::optional<double> exp;
    T value;

    Entry(size_t n, std::optional<double> x, T v) : len(n), exp(x), value(std::move(v)) {}
    char* text() { return reinterpret_cast<char*>(this + 1); }
    std::string_view token() const { return {reinterpret_cast<const char*>(this + 1), len}; }

    static Entry* Make(std::string_view token, std::optional<double> exp, T value) {
      void* p = ::operator new (sizeof(Entry) + token.size(), std::align_val_t{alignof(Entry)});
      auto* e = new (p) Entry(token.size(), exp, std::move(value));
      std::memcpy(e->text(), token.data(), token.size());
      return e;
    }
  };

  static void Acquire(Entry* e) {
    if (e) e->refs.fetch_add(1, std::memory_order_relaxed);
  }
  static void Release(Entry* e) {
    if (e && e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      e->~Entry();
      ::operator delete (e, std::align_val_t{alignof(Entry)});
    }
  }

  struct Slot {
    size_t hash = 0;
    Entry* entry = nullptr;  // null: free
  };
  struct alignas(64) Shard {  // its own cache lines: shards are locked from several threads
    std::mutex mu;
    size_t capacity = 0;
    std::vector<Slot> slots;   // linear probing, no tombstones
    std::vector<Entry*> ring;  // insertion order, the oldest at `next`; one reference each
    size_t next = 0;

    size_t Lookup(std::string_view token, size_t h) const {
      if (slots.empty()) return kNone;
      size_t mask = slots.size() - 1;
      for (size_t i = h & mask; slots[i].entry; i = (i + 1) & mask) {
        if (slots[i].hash != h) continue;
        // Likely a hit, on an entry seldom in the CPU caches: fetch all its lines at once
        // rather than one miss after another as the comparison walks the token.
        const char* p = reinterpret_cast<const char*>(slots[i].entry);
        const char* end = reinterpret_cast<const char*>(slots[i].entry + 1) + token.size();
        for (; p < end; p += 64) __builtin_prefetch(p);
        if (slots[i].entry->token() == token) return i;
      }
      return kNone;
    }

    // Backward-shift deletion keeps every probe sequence unbroken.
    void Erase(size_t i) {
      size_t mask = slots.size() - 1;
      for (size_t j = (i + 1) & mask; slots[j].entry; j = (j + 1) & mask) {
        size_t home = slots[j].hash & mask;
        // Move j into the hole at i unless its home lies cyclically in (i, j].
        if (((j - home) & mask) >= ((j - i) & mask)) {
          slots[i] = slots[j];
          i = j;
        }
      }
      slots[i] = Slot{};
    }
  };

  static size_t Hash(std::string_view token) { return std::hash<std::string_view>{}(token); }
  // The high bits pick the shard; the low ones the slot within it.
  Shard& ShardFor(size_t h) { return shards_[(h >> 56) % kShards]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace sluice
