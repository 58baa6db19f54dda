// Request-header parsing for the tus upload protocol, apart from the routes so that unit tests
// and the fuzz target (fuzz/fuzz_tus.cc) reach it directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "api/http.h"
#include "common/status.h"

namespace sluice::api {

// `s` without leading and trailing spaces and tabs (RFC 9110 OWS).
std::string_view TrimOws(std::string_view s);

// The value of a header that may appear at most once, trimmed; nullopt when absent;
// kInvalidArgument when it appears more than once.
Result<std::optional<std::string_view>> SingleHeader(const HttpRequest& req, std::string_view name);

// A non-negative decimal integer, digits only (no sign, no spaces inside, no overflow);
// kInvalidArgument naming `what` otherwise.
Result<uint64_t> ParseCount(std::string_view v, std::string_view what);

}  // namespace sluice::api
