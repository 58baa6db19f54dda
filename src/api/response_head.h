// The response writer's header: a response's status line and fields formatted by hand in one
// string (Beast's serializer would first copy every field into a list of its own).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/http.h"

namespace sluice::api {

// How a response's body is delimited.
enum class Framing {
  kNone,        // no body (HEAD of a streamed body on HTTP/1.0, 1xx/204/304)
  kLength,      // Content-Length
  kChunked,     // Transfer-Encoding: chunked
  kUntilClose,  // the end of the connection ends the body (HTTP/1.0 streams)
};

struct HeadOptions {
  unsigned version = 11;   // the request's HTTP version (10, 11)
  bool keep_alive = true;  // the connection stays open after this response
  // The CORS fields of the listener; added when `cors` (the request carried Origin). A listener
  // with any also sends "Vary: Origin" on every answer.
  const std::vector<std::pair<std::string, std::string>>* cors_fields = nullptr;
  bool cors = false;
  Framing framing = Framing::kLength;
  uint64_t length = 0;  // for kLength
};

// Replaces `out` with the header of `r` (status line, Server, Date, the response's fields,
// framing, Connection), ending with the blank line.
void FormatResponseHead(std::string& out, const HttpResponse& r, const HeadOptions& o);

// The Date field every response carries (RFC 9110 §6.6.1), formatted once a second per thread.
std::string_view CurrentHttpDate();

}  // namespace sluice::api
