// An archive stream written by libarchive into memory and handed out piece by piece as a
// response body asks for it: never built whole, never on disk. TAR is POSIX pax, restricted
// (ustar headers, pax headers only for what ustar cannot hold, such as long or non-ASCII
// names), uncompressed; ZIP is deflated, with UTF-8 names (invalid sequences replaced).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "volume/volume.h"

struct archive;
struct archive_entry;

namespace sluice::api {

class ArchiveWriter {
 public:
  struct Entry {
    std::string name;
    EntryType type = EntryType::kFile;  // kFile, kDirectory or kSymlink
    uint32_t perm = 0644;
    uint64_t size = 0;  // of a regular file
    int64_t mtime_s = 0;
    int64_t mtime_ns = 0;
    uint32_t uid = 0, gid = 0;
    std::string link;  // a symbolic link's target
  };

  enum class Format { kTar, kZip };
  // `block_bytes`: libarchive pads its output to blocks of this size (10240 as tar(1) and
  // Python's tarfile do); 0 hands every byte out as it is written.
  explicit ArchiveWriter(Format format = Format::kTar, size_t block_bytes = 10240)
      : format_(format), block_bytes_(block_bytes) {}
  ~ArchiveWriter();
  ArchiveWriter(const ArchiveWriter&) = delete;
  ArchiveWriter& operator=(const ArchiveWriter&) = delete;

  Status Open();
  bool opened() const { return ar_ != nullptr; }
  Status Header(const Entry& e);
  Status Data(const char* data, size_t n);
  Status FinishEntry(std::string_view name);
  // Writes the end of the archive. A writer destroyed before Close leaves the stream cut short
  // (nothing claims it ended).
  Status Close();
  bool closed() const { return closed_; }

  // Archive bytes written and not yet taken.
  size_t pending() const { return out_.size() - out_pos_; }
  // Moves up to `cap` pending bytes to `buf`.
  size_t Take(char* buf, size_t cap);

 private:
  static long OnWrite(struct archive* a, void* self, const void* buf, size_t n);
  Status Error(std::string_view what) const;

  Format format_;
  size_t block_bytes_;
  struct archive* ar_ = nullptr;
  struct archive_entry* entry_ = nullptr;
  std::string out_;
  size_t out_pos_ = 0;
  bool closed_ = false;
};

// Bytes that are not valid UTF-8 become U+FFFD, so that every reader can decode a ZIP's names.
std::string SanitizeUtf8(std::string_view s);

}  // namespace sluice::api
