// The data-path handles of directory-backed volumes (PosixVolume and its subclasses): files
// and directories opened by descriptor, read with pread / preadv2(RWF_NOWAIT), their children
// opened relative to them without following symbolic links.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>

#include "common/dir_reader.h"
#include "common/fd.h"
#include "volume/volume.h"

namespace sluice {

// The attributes of `name` in `dirfd` (AT_SYMLINK_NOFOLLOW; "" with AT_EMPTY_PATH describes
// dirfd itself), link target included. With `dont_sync` (event loops) a network file system's
// cached attributes are used as they are. Without `birth_time` (readers need only size, type
// and mtime: on ext4 the birth time costs a lookup per call), `created` is the ctime.
Result<DirEntry> StatAt(int dirfd, const std::string& name, bool dont_sync = false,
                        bool birth_time = true);

// The object metadata attribute (kObjectMetaAttr) of the file open at `fd`, or of entry `name`
// of the directory open at `fd` (a symbolic link is not followed) when `name` is not empty:
// "" when there is none or the file system keeps no user attributes.
Result<std::string> ReadObjectMeta(int fd, const std::string& name);
// Sets it on the file open at `fd`; kUnsupported where the file system keeps no user attributes.
Status WriteObjectMeta(int fd, std::string_view meta);

class PosixFileReader : public FileReader {
 public:
  PosixFileReader(UniqueFd fd, DirEntry info) : fd_(std::move(fd)), info_(std::move(info)) {}
  const DirEntry& info() const override { return info_; }
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override;
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override;
  int native_fd() const override { return fd_.get(); }
  Result<std::string> ReadMeta() override;

  // A regular file opened from `fd` (O_RDONLY): its attributes are read now. kInvalidArgument
  // (EISDIR for a directory) when it is not a regular file; `shown` names it in errors.
  static Result<std::shared_ptr<FileReader>> FromFd(UniqueFd fd, std::string_view shown,
                                                    bool dont_sync = false);

 private:
  UniqueFd fd_;
  DirEntry info_;
};

class PosixDirHandle : public DirHandle {
 public:
  // `fd`: the directory (any descriptor of it).
  static Result<std::unique_ptr<DirHandle>> FromFd(UniqueFd fd, std::string_view shown);

  const DirEntry& info() const override { return info_; }
  Result<std::optional<Name>> Next() override;
  Result<DirEntry> StatEntry(const std::string& name) override;
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override;
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override;
  Result<std::string> EntryMeta(const std::string& name) override;

 private:
  PosixDirHandle(DirReader reader, DirEntry info)
      : reader_(std::move(reader)), info_(std::move(info)) {}
  int fd() const { return reader_.fd(); }
  DirReader reader_;  // one descriptor per open directory: the reader's, for *at calls too
  DirEntry info_;
};

}  // namespace sluice
