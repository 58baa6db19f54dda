// Errors as values: Status carries a code, the errno that caused it (if any) and a message.
// One table maps every code to its HTTP status, S3 error code and errno.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

// X(name, http_status, s3_code, default_errno)
#define SLUICE_STATUS_CODES(X)                                   \
  X(kOk, 200, "", 0)                                             \
  X(kInvalidArgument, 400, "InvalidArgument", EINVAL)            \
  X(kInvalidPath, 400, "InvalidArgument", EINVAL)                \
  X(kNotFound, 404, "NoSuchKey", ENOENT)                         \
  X(kAlreadyExists, 409, "BucketAlreadyExists", EEXIST)          \
  X(kConflict, 409, "OperationAborted", EBUSY)                   \
  X(kNotEmpty, 409, "BucketNotEmpty", ENOTEMPTY)                 \
  X(kPermissionDenied, 403, "AccessDenied", EACCES)              \
  X(kUnauthenticated, 403, "AccessDenied", EACCES)               \
  X(kQuotaExceeded, 413, "QuotaExceeded", EDQUOT)                \
  X(kNoSpace, 507, "InsufficientStorage", ENOSPC)                \
  X(kTooLarge, 413, "EntityTooLarge", EFBIG)                     \
  X(kUriTooLong, 414, "KeyTooLongError", ENAMETOOLONG)           \
  X(kHeaderTooLarge, 431, "RequestHeaderSectionTooLarge", E2BIG) \
  X(kUnprocessable, 422, "InvalidRequest", EINVAL)               \
  X(kUnsupported, 501, "NotImplemented", ENOTSUP)                \
  X(kUnavailable, 503, "ServiceUnavailable", EAGAIN)             \
  X(kIoError, 500, "InternalError", EIO)                         \
  X(kInternal, 500, "InternalError", EIO)

enum class Code {
#define SLUICE_X(name, http, s3, err) name,
  SLUICE_STATUS_CODES(SLUICE_X)
#undef SLUICE_X
};

std::string_view CodeName(Code c);
int CodeHttpStatus(Code c);
std::string_view CodeS3Error(Code c);
int CodeErrno(Code c);
// The code that best describes a system errno (ENOENT -> kNotFound, EDQUOT -> kQuotaExceeded...).
Code CodeFromErrno(int err);

// What an error is about, where the code alone does not say: a missing volume, quota scope,
// vfolder and file are all kNotFound, yet Backend.AI's manager tells them apart by the error
// code each one is answered with.
enum class Subject : uint8_t { kUnspecified, kVolume, kQuotaScope, kVFolder };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string msg, int sys_errno = 0)
      : code_(code), errno_(sys_errno), msg_(std::move(msg)) {}

  static Status Ok() { return {}; }
  // A failed system call: the code is derived from errno and the message names the operation.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  // The errno behind this status: the one observed, else the code's default.
  int sys_errno() const { return errno_ != 0 ? errno_ : CodeErrno(code_); }
  bool has_sys_errno() const { return errno_ != 0; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;

  // Prefixes context to the message ("clone vfolder X: " + message).
  Status WithContext(std::string_view ctx) const;

  // Refused before the work reached its storage because too much already waits on it (an s3
  // origin's connections all taken past queue-timeout, a volume at its max-operations): 503,
  // errno EBUSY. Not retried, and it says nothing of whether the storage answers.
  static Status Busy(std::string msg) { return Status(Code::kUnavailable, std::move(msg), EBUSY); }
  bool busy() const { return code_ == Code::kUnavailable && errno_ == EBUSY; }

  Subject subject() const { return subject_; }
  Status About(Subject s) && {
    subject_ = s;
    return std::move(*this);
  }

 private:
  Code code_ = Code::kOk;
  int errno_ = 0;
  Subject subject_ = Subject::kUnspecified;
  std::string msg_;
};

// Result<T>: a value or a non-OK Status. g++ 12 lacks std::expected.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status s) : v_(std::move(s)) {}     // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

#define SLUICE_CONCAT_INNER(a, b) a##b
#define SLUICE_CONCAT(a, b) SLUICE_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define SLUICE_RETURN_IF_ERROR(expr) \
  do {                               \
    ::sluice::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

// Declares `lhs` from a Result, or returns its status from the enclosing function.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr)                                                  \
  auto SLUICE_CONCAT(_res_, __LINE__) = (expr);                                             \
  if (!SLUICE_CONCAT(_res_, __LINE__).ok()) return SLUICE_CONCAT(_res_, __LINE__).status(); \
  lhs = std::move(SLUICE_CONCAT(_res_, __LINE__)).value()

}  // namespace sluice
