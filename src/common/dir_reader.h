// Reading directories by descriptor: one RAII reader instead of a hand-written
// opendir/readdir/closedir loop at every site.
#pragma once

#include <dirent.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sluice {

struct RawDirEntry {
  std::string name;
  unsigned char type = DT_UNKNOWN;  // d_type: DT_DIR, DT_REG, DT_LNK, ... or DT_UNKNOWN
};

// The entries of one open directory, "." and ".." left out, in the order the file system gives
// them. Reads through a descriptor of its own (the directory opened again), so the caller's
// descriptor (O_PATH ones too), its offset and its lifetime are untouched.
class DirReader {
 public:
  // `what` names the directory in error messages.
  static Result<DirReader> Open(int dirfd, std::string_view what);
  // Opens `name` below `parent` without following a symbolic link (O_NOFOLLOW | O_DIRECTORY).
  static Result<DirReader> OpenAt(int parent, const std::string& name, std::string_view what);

  DirReader(DirReader&& o) noexcept : dir_(o.dir_), what_(std::move(o.what_)) { o.dir_ = nullptr; }
  DirReader& operator=(DirReader&& o) noexcept;
  DirReader(const DirReader&) = delete;
  DirReader& operator=(const DirReader&) = delete;
  ~DirReader();

  // The next entry; nullopt at the end. The name stays valid until the next call.
  struct Ref {
    std::string_view name;
    unsigned char type;
    ino_t ino;
  };
  Result<std::optional<Ref>> Next();
  // Whether anything but "." and ".." is left.
  Result<bool> Empty();
  // The reader's own descriptor on the directory (for *at calls on its entries).
  int fd() const;

 private:
  DirReader(DIR* d, std::string what) : dir_(d), what_(std::move(what)) {}
  DIR* dir_ = nullptr;
  std::string what_;
};

// Every entry of the directory open at `dirfd`.
Result<std::vector<RawDirEntry>> ReadDirEntries(int dirfd, std::string_view what);

}  // namespace sluice
