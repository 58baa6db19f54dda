// What travels with a request from the listener down to the services: its id (for logs), who
// sent it, by when it must be done, and whether its client is still there.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace sluice {

// Who sent a request, as the route group's authenticator found: what logs name and what the
// handler may rely on (what a token grants, say).
struct Principal {
  std::string kind = "anonymous";  // "manager", "token", "anonymous"
  // What the credential grants, in the type its route group's handlers expect (a download grant,
  // an upload token's claims); null when it grants nothing beyond the route.
  std::shared_ptr<const void> grant;
};

// Travels with a request from the listener down to the services: its id (for logs), who sent
// it, by when it must be done, and whether its client is still there.
struct RequestContext {
  std::string id;  // the client's X-Request-ID when it sent a short, plain one ("" otherwise)
  Principal principal;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Set by the listener when the connection goes away: long work can stop early. One flag per
  // connection, shared by its requests; null where no listener is behind the request.
  std::shared_ptr<std::atomic<bool>> cancelled;

  // kUnavailable once the client has gone or the deadline has passed: work for this request can
  // stop.
  Status Check() const;
};

}  // namespace sluice
