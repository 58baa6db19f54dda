// An archive stream written into memory and handed out piece by piece as a response body asks
// for it: never built whole, never on disk. TAR is POSIX pax, restricted (ustar headers, pax
// headers only for what ustar cannot hold, such as long or non-ASCII names), uncompressed, and
// written here: libarchive's pax writer clones and converts every entry, which cost a batch get
// of small objects a fifth of its CPU time, while a ustar header is a fixed 512-byte record.
// ZIP is libarchive's, deflated, with UTF-8 names (invalid sequences replaced).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "volume/volume.h"

struct archive;
struct archive_entry;

namespace sluice::api {

// The longest entry name (bytes, as written: invalid UTF-8 replaced) a ZIP takes. The format
// holds 65,535; libarchive 3.6 writes each central-directory record into a fixed 64 KiB buffer
// without a check, so a longer name corrupts its heap. Half of it, with room for the record.
inline constexpr size_t kMaxZipEntryName = 32768;

class ArchiveWriter {
 public:
  struct Entry {
    std::string name;
    EntryType type = EntryType::kFile;  // kFile, kDirectory or kSymlink
    uint32_t perm = 0644;
    uint64_t size = 0;    // of a regular file
    int64_t mtime_s = 0;  // floored: before 1970 too, mtime_ns is in [0, 1e9)
    int64_t mtime_ns = 0;
    uint32_t uid = 0, gid = 0;
    std::string link;  // a symbolic link's target
  };

  enum class Format { kTar, kZip };
  // `block_bytes`: the output is padded to blocks of this size (10240 as tar(1) and
  // Python's tarfile do); 0 hands every byte out as it is written.
  explicit ArchiveWriter(Format format = Format::kTar, size_t block_bytes = 10240)
      : format_(format), block_bytes_(block_bytes) {}
  ~ArchiveWriter();
  ArchiveWriter(const ArchiveWriter&) = delete;
  ArchiveWriter& operator=(const ArchiveWriter&) = delete;

  Status Open();
  bool opened() const { return opened_; }
  // ZIP: kInvalidArgument for a name longer than kMaxZipEntryName.
  Status Header(const Entry& e);
  Status Data(const char* data, size_t n);
  // TAR only: room for up to `n` bytes of the current entry's data, written in place (read
  // from a file straight into the archive, not through another buffer), then CommitData with
  // the count written. At most what the entry still needs.
  Result<char*> ReserveData(size_t n);
  void CommitData(size_t reserved, size_t written);
  Status FinishEntry(std::string_view name);
  // Writes the end of the archive. A writer destroyed before Close leaves the stream cut short
  // (nothing claims it ended).
  Status Close();
  bool closed() const { return closed_; }

  // TAR only: where the archive stands, and a return to it, so that an entry whose data turned
  // out unreadable before any of it was taken is taken back whole. Rollback is false (and
  // changes nothing) when bytes past the mark were taken meanwhile.
  struct Mark {
    uint64_t written, entry_left;
  };
  Mark mark() const { return {written_, entry_left_}; }
  bool Rollback(const Mark& m);

  // Archive bytes written and not yet taken.
  size_t pending() const { return out_.size() - out_pos_; }
  // Moves up to `cap` pending bytes to `buf`.
  size_t Take(char* buf, size_t cap);

 private:
  static long OnWrite(struct archive* a, void* self, const void* buf, size_t n);
  Status Error(std::string_view what) const;
  Status TarHeader(const Entry& e);
  void TarRecord(char type, std::string_view name, std::string_view link, uint64_t size,
                 const Entry& e);

  Format format_;
  size_t block_bytes_;
  struct archive* ar_ = nullptr;
  struct archive_entry* entry_ = nullptr;
  std::string out_;
  size_t out_pos_ = 0;
  uint64_t entry_left_ = 0;  // TAR: data bytes the current entry's header promised, not yet given
  uint64_t written_ = 0;     // TAR: archive bytes so far (for the last block's padding)
  bool opened_ = false, closed_ = false;
};

}  // namespace sluice::api
