#include "common/record_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "common/fs_util.h"
#include "common/secrets.h"

namespace sluice {

namespace {

constexpr std::string_view kSuffix = ".json";

}  // namespace

Status RecordDir::CheckName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name.front() == '.' ||
      name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a valid record name", name));
  return Status::Ok();
}

Result<RecordDir> RecordDir::Open(std::string path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec)
    return Status(CodeFromErrno(ec.value()), fmt::format("create '{}': {}", path, ec.message()));
  return RecordDir(std::move(path));
}

std::string RecordDir::FileOf(std::string_view name) const {
  return fmt::format("{}/{}{}", path_, name, kSuffix);
}

Result<std::string> RecordDir::WriteAside(std::string_view body) const {
  // Dot-named: never listed as a record; the random part keeps nodes apart.
  std::string tmp = fmt::format("{}/.tmp-{}", path_, RandomHexString(12));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("write '{}'", tmp));
  bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::FromErrno(err, fmt::format("write '{}'", tmp));
  }
  return tmp;
}

Result<std::optional<std::string>> RecordDir::Get(std::string_view name) const {
  SLUICE_RETURN_IF_ERROR(CheckName(name));
  std::string file = FileOf(name);
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Status::FromErrno(errno, fmt::format("read '{}'", file));
  }
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::FromErrno(err, fmt::format("read '{}'", file));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1 << 20)) {
      ::close(fd);
      return Status(Code::kIoError, fmt::format("record '{}' is over 1 MiB", file));
    }
  }
  ::close(fd);
  return std::optional<std::string>(std::move(out));
}

Status RecordDir::Create(std::string_view name, std::string_view body) const {
  SLUICE_RETURN_IF_ERROR(CheckName(name));
  SLUICE_ASSIGN_OR_RETURN(std::string tmp, WriteAside(body));
  std::string file = FileOf(name);
  int rc = ::link(tmp.c_str(), file.c_str());
  int err = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    if (err == EEXIST) return Status(Code::kAlreadyExists, fmt::format("'{}' exists", name), err);
    return Status::FromErrno(err, fmt::format("create '{}'", file));
  }
  (void)SyncDir(path_);  // best effort, as WriteFileAtomic
  return Status::Ok();
}

Status RecordDir::Put(std::string_view name, std::string_view body) const {
  SLUICE_RETURN_IF_ERROR(CheckName(name));
  SLUICE_ASSIGN_OR_RETURN(std::string tmp, WriteAside(body));
  std::string file = FileOf(name);
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno(err, fmt::format("replace '{}'", file));
  }
  (void)SyncDir(path_);  // best effort, as WriteFileAtomic
  return Status::Ok();
}

Status RecordDir::Remove(std::string_view name) const {
  SLUICE_RETURN_IF_ERROR(CheckName(name));
  std::string file = FileOf(name);
  if (::unlink(file.c_str()) != 0) {
    if (errno == ENOENT) return Status(Code::kNotFound, fmt::format("no record '{}'", name));
    return Status::FromErrno(errno, fmt::format("remove '{}'", file));
  }
  return Status::Ok();
}

Result<std::vector<std::string>> RecordDir::List() const {
  DIR* d = ::opendir(path_.c_str());
  if (!d) return Status::FromErrno(errno, fmt::format("list '{}'", path_));
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n.empty() || n.front() == '.' || n.size() <= kSuffix.size() ||
        n.substr(n.size() - kSuffix.size()) != kSuffix)
      continue;
    out.emplace_back(n.substr(0, n.size() - kSuffix.size()));
  }
  ::closedir(d);
  return out;
}

Result<std::string> RecordDir::Stamp() const {
  struct stat sb;
  if (::stat(path_.c_str(), &sb) != 0)
    return Status::FromErrno(errno, fmt::format("stat '{}'", path_));
  const time_t changed = std::max(sb.st_mtim.tv_sec, sb.st_ctim.tv_sec);
  if (changed + 2 > ::time(nullptr)) return std::string();  // not settled yet
  return fmt::format("{}.{}:{}:{}", sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec, sb.st_ctim.tv_nsec,
                     sb.st_size);
}

}  // namespace sluice
