// HS256 JSON Web Tokens (RFC 7519) for download and upload sessions. The MAC is OpenSSL's HMAC;
// verification compares in constant time and checks `exp`.
#pragma once

#include <ctime>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace sluice {

std::string Base64UrlEncode(std::string_view data);
Result<std::string> Base64UrlDecode(std::string_view data);

// Signs `claims` with HS256.
std::string JwtEncode(const nlohmann::json& claims, std::string_view secret);

// Verifies the signature and `exp` (seconds since the epoch) against `now`; returns the claims.
// kUnauthenticated for a bad signature, a malformed token, a wrong algorithm or expiry.
Result<nlohmann::json> JwtDecode(std::string_view token, std::string_view secret,
                                 std::time_t now = std::time(nullptr));

}  // namespace sluice
