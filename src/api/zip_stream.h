// A ZIP archive of files and directory trees inside a vfolder, produced piece by piece as the
// client reads it (libarchive writing into a small buffer), never built in memory or on disk.
//
// Memory does not grow with the data: one read chunk of file data, its compressed form, one
// open directory per level of the walk (at most kMaxOpenZipDirs; the names left in
// shallower ones, within the names' limit below), and the central
// directory that ZIP needs at the end (about 100 bytes per entry and its name: ZipLimits).
// Inside walked directories, symbolic links and special files are skipped (with a log line).
// Everything is read through the Volume interface (directory handles, file readers): any
// backend can be archived.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "volume/volume.h"

namespace sluice::api {

class ArchiveWriter;

// Deepest directory nesting a walk descends into; deeper trees fail the stream.
inline constexpr size_t kMaxZipDepth = 256;
// Directories a walk keeps open at once, at most: past them, the shallowest open one (not the
// one being read) has the names it has left read into memory and its handle closed, and is
// opened again by its path when the walk comes back up to it. A slow client of an archive of
// a deep tree holds that many descriptors, not one per level.
inline constexpr size_t kMaxOpenZipDirs = 16;
// ZIP keeps a central directory at the end, so the writer remembers every entry's name, CRC
// and offset until then (about 100 bytes per entry, and the name): these bound that memory
// (to about 100 MiB for the entries and 64 MiB for their names; names of deep trees are long).
// An archive past either fails the stream with kTooLarge.
inline constexpr uint64_t kMaxZipEntries = 1000000;
inline constexpr uint64_t kMaxZipNameBytes = 64ULL << 20;
struct ZipLimits {
  uint64_t entries = kMaxZipEntries;
  uint64_t name_bytes = kMaxZipNameBytes;  // the names of every entry, added up
};

// A regular file or directory of a vfolder, opened for archiving.
struct ArchiveMember {
  DirEntry info;
  std::shared_ptr<FileReader> file;  // a regular file
  std::unique_ptr<DirHandle> dir;    // or a directory
  bool is_dir() const { return dir != nullptr; }
};

// Opens `rel` of the vfolder for an archive: intermediate components may be symlinks that stay
// inside the vfolder, but the last component must be a regular file or a directory itself.
// kInvalidPath for escapes, symlinks and special files; kNotFound when missing.
Result<ArchiveMember> OpenArchiveMember(Volume& volume, const VFolderId& vfid,
                                        std::string_view rel);

struct ZipSource {
  // Name in the archive: "" puts a directory's contents at the top of the archive.
  std::string arcname;
  // Either an open member or a path of the vfolder to open when its turn comes. `rel` is
  // set with an open member too: a directory is opened again by its path (kMaxOpenZipDirs).
  std::optional<ArchiveMember> member;
  std::string rel;
  // Skip the upload staging directory (".upload") directly inside this directory: set when the
  // source is the vfolder root.
  bool skip_upload_dir = false;
};

class ZipStream {
 public:
  // Sources are paths of `vfid` on `volume`; `label` names the download in log lines.
  ZipStream(Volume* volume, VFolderId vfid, std::vector<ZipSource> sources, std::string label,
            ZipLimits limits = {});
  ~ZipStream();
  ZipStream(const ZipStream&) = delete;
  ZipStream& operator=(const ZipStream&) = delete;

  // Fills up to `cap` bytes of `buf` with the next part of the archive; 0 at the end. After an
  // error the stream is unusable (the response must be cut short).
  Result<size_t> Read(char* buf, size_t cap);

  bool finished() const { return finished_; }
  uint64_t files_written() const { return files_; }
  uint64_t entries_skipped() const { return skipped_; }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Frame;
  Status Start();
  Status Step();
  Status NextFromSource();
  Status NextFromDir();
  Status BeginFile(std::string arcname, ArchiveMember m);
  Status BeginDir(std::string arcname, std::string rel, ArchiveMember m, bool skip_upload_dir);
  Status CloseAShallowerDir();  // past kMaxOpenZipDirs open
  Status Reopen(Frame& f);
  Status WriteHeader(const std::string& arcname, const DirEntry& info);
  Status FileData();
  Status Context(Status st) const;

  Volume* volume_;
  VFolderId vfid_;
  std::vector<ZipSource> sources_;
  std::string label_;
  ZipLimits limits_;
  size_t next_source_ = 0;
  std::unique_ptr<ArchiveWriter> zip_;
  std::vector<Frame> stack_;
  std::shared_ptr<FileReader> file_;  // the file whose data is being written
  std::string file_name_;
  uint64_t file_off_ = 0, file_left_ = 0;
  std::vector<char> in_;
  bool started_ = false, finished_ = false, failed_ = false;
  uint64_t files_ = 0, skipped_ = 0, entries_ = 0, name_bytes_ = 0, bytes_read_ = 0;
  uint64_t held_name_bytes_ = 0;  // names kept in memory for closed directories
  size_t open_dirs_ = 0;
};

}  // namespace sluice::api
