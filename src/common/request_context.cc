#include "common/request_context.h"

namespace sluice {

Status RequestContext::Check() const {
  if (cancelled && cancelled->load(std::memory_order_relaxed))
    return Status(Code::kUnavailable, "the client went away");
  if (std::chrono::steady_clock::now() > deadline)
    return Status(Code::kUnavailable, "the request ran past its deadline");
  return Status::Ok();
}

}  // namespace sluice
