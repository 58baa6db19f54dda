#include "common/dir_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

namespace sluice {

Result<DirReader> DirReader::Open(int dirfd, std::string_view what) {
  // A fresh open of the same directory (not a dup, whose offset would be shared); works on
  // O_PATH descriptors too.
  return OpenAt(dirfd, ".", what);
}

Result<DirReader> DirReader::OpenAt(int parent, const std::string& name, std::string_view what) {
  int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("open '{}'", what));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, fmt::format("opendir '{}'", what));
  }
  return DirReader(d, std::string(what));
}

DirReader& DirReader::operator=(DirReader&& o) noexcept {
  if (this != &o) {
    if (dir_) ::closedir(dir_);
    dir_ = o.dir_;
    what_ = std::move(o.what_);
    o.dir_ = nullptr;
  }
  return *this;
}

DirReader::~DirReader() {
  if (dir_) ::closedir(dir_);
}

Result<std::optional<DirReader::Ref>> DirReader::Next() {
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(dir_);
    if (!e) {
      if (errno != 0) return Status::FromErrno(errno, fmt::format("readdir '{}'", what_));
      return std::optional<Ref>();
    }
    const char* n = e->d_name;
    if (n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0))) continue;
    return std::optional<Ref>(Ref{n, e->d_type, e->d_ino});
  }
}

Result<bool> DirReader::Empty() {
  SLUICE_ASSIGN_OR_RETURN(auto e, Next());
  return !e.has_value();
}

int DirReader::fd() const {
  return ::dirfd(dir_);
}

Result<std::vector<RawDirEntry>> ReadDirEntries(int dirfd, std::string_view what) {
  SLUICE_ASSIGN_OR_RETURN(DirReader r, DirReader::Open(dirfd, what));
  std::vector<RawDirEntry> out;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto e, r.Next());
    if (!e) break;
    out.push_back({std::string(e->name), e->type});
  }
  return out;
}

}  // namespace sluice
