// The SSD read cache's blocks on a local disk: one file per block (a 20-byte header with the
// data's length and CRC32C, then the data), written to a temporary name and renamed into place,
// so that a block torn by a crash is detected by its checksum and dropped, never served. An
// in-memory index (BlockIndex: about 100 bytes per block) picks what to evict (LRU or S3-FIFO)
// to keep their total size under `max_bytes` and the disk's free space above `min_free`. At
// open, the blocks already there are indexed (oldest written first out): the cache is warm
// after a restart. A block found at open is checked (read whole) before it is first sent
// from its file, unless the store was closed cleanly: Close() makes every block durable and
// records those checked or written since open, which the next Open() trusts (once: the record
// goes as it is read, so a crash after never leans on it).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "volume/cache/block_index.h"

namespace sluice {

struct BlockStoreOptions {
  std::string dir;
  uint64_t max_bytes = 10ULL << 30;
  uint64_t min_free = 1ULL << 30;
  EvictionPolicy policy = EvictionPolicy::kS3Fifo;
};

// Blocks readers hold open, and how often; its own lock (taken after BlockStore's).
struct BlockPins {
  void Pin(const BlockIndex::Key& k);
  void Unpin(const BlockIndex::Key& k);
  bool Held(const BlockIndex::Key& k) const;
  std::vector<BlockIndex::Key> HeldKeys() const;

 private:
  mutable std::mutex mu_;
  std::map<BlockIndex::Key, uint32_t> held_;
};

class BlockStore {
 public:
  static Result<std::unique_ptr<BlockStore>> Open(BlockStoreOptions opts);

  // The block `id` (64 lower-case hex digits), or nullopt: missing, or torn (then removed).
  std::optional<std::string> Get(const std::string& id);
  // Stores the block, evicting the least recently used ones to stay within the limits. false:
  // not stored (the disk is too full even with the cache empty, or the write failed).
  bool Put(const std::string& id, std::string_view data);
  // A block's file held open for zero-copy sends. While it is open its disk space stays taken,
  // evicted or not, so Put counts an evicted block as space given back only when no reader
  // holds it (else the free-space floor could be passed by a block per open reader).
  class OpenBlock {
   public:
    OpenBlock() = default;
    OpenBlock(OpenBlock&& o) noexcept { *this = std::move(o); }
    OpenBlock& operator=(OpenBlock&& o) noexcept;
    ~OpenBlock() { Close(); }
    int fd() const { return fd_.get(); }
    void Close();

   private:
    friend class BlockStore;
    std::shared_ptr<BlockPins> pins_;  // shared: a reader may outlive the store
    BlockIndex::Key key_{};
    UniqueFd fd_;
  };
  // The block's file, open, when it is held and its checksum was checked since this process
  // indexed it (its data starts at kDataOffset and is `len` bytes); counted as an access. fd()
  // -1 otherwise: Get() reads and checks it. For zero-copy sends.
  OpenBlock OpenVerified(const std::string& id, uint64_t len);
  static constexpr uint64_t kDataOffset = 20;
  // Whether `bytes` more on the cache's disk keep it above its free-space floor.
  bool HasRoom(uint64_t bytes) const;
  // Whether the block is held (not counted as an access).
  bool Has(const std::string& id) const;
  // Drops the block if it is there (an operator's evict); true if it was.
  bool Evict(const std::string& id);
  // Drops every block; how many there were.
  uint64_t EvictAll();
  // The process exits cleanly: no more blocks are stored; the ones there are made durable
  // (syncfs) and the verified ones recorded for the next Open().
  void Close();
  // The record Close() writes, in the store's directory.
  static constexpr const char* kCleanRecord = "clean";
  // The file a store holds an exclusive flock on while it is open, in its directory.
  static constexpr const char* kLockFile = "lock";

  struct Stats {
    uint64_t blocks = 0, bytes = 0, evictions = 0, torn = 0, rejected = 0;
    uint64_t filled_bytes = 0;  // data written into blocks since open
  };
  Stats stats() const;
  const BlockStoreOptions& options() const { return opts_; }

 private:
  explicit BlockStore(BlockStoreOptions opts)
      : opts_(std::move(opts)),
        index_(opts_.policy, opts_.max_bytes),
        pins_(std::make_shared<BlockPins>()) {}
  std::string PathOf(const std::string& id) const;
  std::string PathOf(const BlockIndex::Key& k) const { return PathOf(BlockIndex::KeyHex(k)); }
  // The policy's victim, out of the index (its size in `*size`); mu_ held. Unlink() it after.
  std::optional<BlockIndex::Key> EvictOne(uint64_t* size = nullptr);
  // Removes evicted blocks' files (mu_ not held), then lets their keys be stored again.
  void Unlink(const std::vector<BlockIndex::Key>& keys);
  void Drop(const BlockIndex::Key& k);        // from the index and the disk; mu_ held
  std::optional<uint64_t> FreeBytes() const;  // nullopt when statvfs fails
  // Inodes free to the cache, and the floor kept (1% of them, at most kMinFreeInodes); nullopt
  // where the file system has no fixed number.
  struct Inodes {
    uint64_t free, floor;
  };
  std::optional<Inodes> FreeInodes() const;
  static constexpr uint64_t kMinFreeInodes = 1024;
  enum class Written { kFailed, kNew, kThere };  // kThere: another writer's file was there
  Written WriteBlock(const std::string& id, const char* head, std::string_view data);

  BlockStoreOptions opts_;
  mutable std::mutex mu_;
  BlockIndex index_;
  Stats stats_;
  // Blocks being written now: their bytes, and what they take on the disk.
  uint64_t reserved_ = 0, reserved_disk_ = 0, reserved_files_ = 0;
  // What the writes that ended took on the disk, ever (Put's free-space sample is corrected by
  // what ended after it was taken). Read outside mu_, written under it.
  std::atomic<uint64_t> written_disk_{0};
  bool closed_ = false;
  std::shared_ptr<BlockPins> pins_;  // blocks readers hold open (OpenBlock)
  // Blocks evicted whose files are not unlinked yet (mu_): a Put of one meanwhile would find
  // the old file there, index it, and then lose it to the unlink.
  std::set<BlockIndex::Key> unlinking_;
  UniqueFd dir_fd_;   // the store's directory, open since Open (syncfs reports what failed since)
  UniqueFd lock_fd_;  // flock'ed: one store per directory
  // What `n` bytes take on a disk: whole 4 KiB blocks.
  static uint64_t DiskBytes(uint64_t n) { return (n + 4095) / 4096 * 4096; }
};

}  // namespace sluice
