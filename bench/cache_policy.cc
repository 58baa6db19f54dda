// Replays access traces against the SSD cache's index (src/volume/cache/block_index.h, the code
// the cache runs) and prints hit ratios for each eviction policy, with and without second-miss
// admission; then the index's memory per block, measured with mallinfo2.
//
//   build/release/bin/bench_cache_policy [--quick]
//
// Traces (blocks of one size; the cache holds `cache` of them):
//   zipf a=X        skewed reads of 100,000 blocks (Zipf, exponent X)
//   epochs shuffled a dataset read in a new random order each epoch (training with shuffling);
//                   hit ratio of epochs 2-5
//   epochs in order the same, in the same order every epoch (a loop larger than the cache)
//   hot + scan      Zipf reads of 10,000 hot blocks with a one-pass scan of fresh blocks mixed in
//                   (every third read); hit ratio of the hot reads
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "volume/cache/block_index.h"

using sluice::BlockIndex;
using sluice::EvictionPolicy;
using sluice::MissFilter;

namespace {

BlockIndex::Key KeyOf(uint64_t id) {
  BlockIndex::Key k;
  uint64_t x = id + 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < k.size(); i += 8) {  // splitmix64: uniform bytes, as SHA-256 gives
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(k.data() + i, &z, 8);
  }
  return k;
}

// One cache as BlockStore::Put runs it: a miss is admitted (or not), then room is made.
struct Cache {
  Cache(EvictionPolicy p, uint64_t blocks, bool second_miss)
      : index(p, blocks), capacity(blocks), filter(second_miss ? new MissFilter() : nullptr) {}
  ~Cache() { delete filter; }
  bool Access(uint64_t id) {
    const auto k = KeyOf(id);
    if (index.Touch(k)) return true;
    if (filter && !filter->SecondMiss(k)) return false;
    while (index.bytes() + 1 > capacity && index.Evict()) {
    }
    index.Insert(k, 1);
    return false;
  }
  BlockIndex index;
  uint64_t capacity;
  MissFilter* filter;
};

class Zipf {
 public:
  Zipf(uint64_t n, double a) : cdf_(n) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(double(i + 1), a);
    for (auto& c : cdf_) c /= sum;
  }
  uint64_t operator()(std::mt19937_64& rng) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
  }

 private:
  std::vector<double> cdf_;
};

struct Variant {
  const char* name;
  EvictionPolicy policy;
  bool second_miss;
};
constexpr Variant kVariants[] = {{"lru", EvictionPolicy::kLru, false},
                                 {"s3-fifo", EvictionPolicy::kS3Fifo, false},
                                 {"lru+2nd-miss", EvictionPolicy::kLru, true},
                                 {"s3-fifo+2nd-miss", EvictionPolicy::kS3Fifo, true}};

// A trace: feeds ids to `access`, which answers hit or miss; returns the hit ratio it counts.
using Trace = std::function<double(const std::function<bool(uint64_t)>& access)>;

void Row(const std::string& name, uint64_t cache_blocks, const Trace& trace) {
  std::printf("%-34s %9llu", name.c_str(), static_cast<unsigned long long>(cache_blocks));
  for (const auto& v : kVariants) {
    Cache c(v.policy, cache_blocks, v.second_miss);
    const double r = trace([&](uint64_t id) { return c.Access(id); });
    std::printf(" %16.1f%%", 100 * r);
  }
  std::printf("\n");
}

// Small chunks and large (mmapped) ones alike: the hash map's bucket array is one large one.
size_t HeapInUse() {
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const uint64_t reads = quick ? 200000 : 2000000;
  std::printf("hit ratio per eviction policy (block-granular traces; cache = blocks held)\n");
  std::printf("%-34s %9s", "trace", "cache");
  for (const auto& v : kVariants) std::printf(" %17s", v.name);
  std::printf("\n");

  for (double a : {0.8, 1.0}) {
    Zipf z(100000, a);
    for (uint64_t cache : {1000, 10000}) {
      Row("zipf a=" + std::to_string(a).substr(0, 3) + " (100k blocks)", cache, [&](auto access) {
        std::mt19937_64 rng(42);
        uint64_t hits = 0;
        for (uint64_t i = 0; i < reads; ++i) hits += access(z(rng));
        return double(hits) / reads;
      });
    }
  }

  const uint64_t dataset = 10000;
  for (bool shuffled : {true, false}) {
    for (uint64_t cache : {5000, 9000, 11000}) {
      Row(std::string("epochs ") + (shuffled ? "shuffled" : "in order") + " (10k blocks)", cache,
          [&](auto access) {
            std::mt19937_64 rng(7);
            std::vector<uint64_t> order(dataset);
            for (uint64_t i = 0; i < dataset; ++i) order[i] = i;
            uint64_t hits = 0, counted = 0;
            for (int epoch = 1; epoch <= 5; ++epoch) {
              if (shuffled) std::shuffle(order.begin(), order.end(), rng);
              for (uint64_t id : order) {
                const bool hit = access(id);
                if (epoch > 1) hits += hit, counted++;
              }
            }
            return double(hits) / counted;
          });
    }
  }

  Zipf hot(10000, 1.0);
  for (uint64_t cache : {1000, 5000}) {
    Row("hot + scan (10k hot, 1/3 scan)", cache, [&](auto access) {
      std::mt19937_64 rng(3);
      uint64_t hits = 0, counted = 0, fresh = 1ULL << 40;
      for (uint64_t i = 0; i < reads; ++i) {
        if (i % 3 == 2) {
          access(fresh++);  // read once, never again
        } else {
          hits += access(hot(rng));
          counted++;
        }
      }
      return double(hits) / counted;
    });
  }

  // The index's memory: what the heap grows by per block indexed (hash-map node, links, key),
  // and S3-FIFO's ghost list per evicted block remembered.
  const uint64_t n = quick ? 100000 : 1000000;
  for (const auto& v : {kVariants[0], kVariants[1]}) {
    const size_t before = HeapInUse();
    auto* idx = new BlockIndex(v.policy, n);
    for (uint64_t i = 0; i < n; ++i) idx->Insert(KeyOf(i), 1);
    const size_t full = HeapInUse();
    std::printf("index memory, %s: %.1f bytes per block (%llu blocks)\n", v.name,
                double(full - before) / n, static_cast<unsigned long long>(n));
    if (v.policy == EvictionPolicy::kS3Fifo) {
      // Every block out through the small queue: each leaves a ghost entry.
      for (uint64_t i = 0; i < n / 2; ++i) idx->Evict();
      const size_t half = HeapInUse();
      std::printf("  after evicting half: %.1f bytes per block still indexed, ghosts included\n",
                  double(half - before) / (n / 2));
    }
    delete idx;
  }
  return 0;
}
