#include "common/status.h"

#include <cstring>

namespace sluice {

namespace {
struct CodeInfo {
  std::string_view name;
  int http;
  std::string_view s3;
  int err;
};
constexpr CodeInfo kCodes[] = {
#define SLUICE_X(name, http, s3, err) {#name, http, s3, err},
    SLUICE_STATUS_CODES(SLUICE_X)
#undef SLUICE_X
};
const CodeInfo& Info(Code c) {
  return kCodes[static_cast<int>(c)];
}
}  // namespace

std::string_view CodeName(Code c) {
  return Info(c).name.substr(1);
}
int CodeHttpStatus(Code c) {
  return Info(c).http;
}
std::string_view CodeS3Error(Code c) {
  return Info(c).s3;
}
int CodeErrno(Code c) {
  return Info(c).err;
}

Code CodeFromErrno(int err) {
  switch (err) {
    case 0:
      return Code::kOk;
    case ENOENT:
      return Code::kNotFound;
    case EEXIST:
      return Code::kAlreadyExists;
    case ENOTEMPTY:
      return Code::kNotEmpty;
    case EACCES:
    case EPERM:
    case EROFS:
      return Code::kPermissionDenied;
    case EDQUOT:
      return Code::kQuotaExceeded;
    case ENOSPC:
      return Code::kNoSpace;
    case EFBIG:
      return Code::kTooLarge;
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
      return Code::kInvalidArgument;
    case EXDEV:
      return Code::kInvalidPath;
    case EBUSY:
      return Code::kConflict;
    case ENOTSUP:
      return Code::kUnsupported;
    case EAGAIN:
      return Code::kUnavailable;
    default:
      return Code::kIoError;
  }
}

Status Status::FromErrno(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return Status(CodeFromErrno(err), std::move(msg), err);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  s += ": ";
  s += msg_;
  return s;
}

Status Status::WithContext(std::string_view ctx) const {
  if (ok()) return *this;
  std::string msg(ctx);
  msg += ": ";
  msg += msg_;
  return Status(code_, std::move(msg), errno_).About(subject_);
}

}  // namespace sluice
