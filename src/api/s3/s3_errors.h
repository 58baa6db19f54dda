// Status -> S3 error: one mapping for every S3 answer (errors of operations, items of a batch).
#pragma once

#include <cerrno>
#include <string_view>

#include "api/s3/sigv4.h"
#include "common/status.h"

namespace sluice::api::s3 {

// `not_found`: what a missing thing is called for this operation (NoSuchKey, NoSuchBucket, ...).
inline S3Error FromStatus(const Status& st, std::string_view not_found = "NoSuchKey") {
  switch (st.code()) {
    case Code::kNotFound:
      return {404, std::string(not_found), st.message()};
    case Code::kQuotaExceeded:
      return {403, "QuotaExceeded", st.message()};
    case Code::kNoSpace:
      return {507, "InsufficientStorage", st.message()};
    case Code::kUriTooLong:
      return {400, "KeyTooLongError", st.message()};
    case Code::kConflict:
      if (st.sys_errno() == ENOTDIR) return {409, "ObjectParentIsFile", st.message()};
      if (st.sys_errno() == EISDIR || st.sys_errno() == ENOTEMPTY || st.sys_errno() == EEXIST)
        return {409, "ObjectIsDirectory", st.message()};
      return {409, "OperationAborted", st.message()};
    case Code::kPermissionDenied:
    case Code::kUnauthenticated:
      return {403, "AccessDenied", st.message()};
    case Code::kInvalidArgument:
    case Code::kInvalidPath:
      return {400, "InvalidArgument", st.message()};
    case Code::kTooLarge:
      return {400, "EntityTooLarge", st.message()};
    case Code::kUnavailable:
      return {503, "SlowDown", st.message()};
    case Code::kUnsupported:
      return {501, "NotImplemented", st.message()};
    default:
      return {500, "InternalError", st.message()};
  }
}

}  // namespace sluice::api::s3
