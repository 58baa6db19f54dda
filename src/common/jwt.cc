#include "common/jwt.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/crypto.h"
#include "common/json.h"

namespace sluice {

namespace {

Status Invalid(const std::string& why) {
  return Status(Code::kUnauthenticated, "invalid token: " + why);
}

}  // namespace

std::string Base64UrlEncode(std::string_view data) {
  std::string out = Base64Encode(data);
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (auto& c : out) {
    if (c == '+')
      c = '-';
    else if (c == '/')
      c = '_';
  }
  return out;
}

Result<std::string> Base64UrlDecode(std::string_view data) {
  std::string in(data);
  for (auto& c : in) {
    if (c == '-')
      c = '+';
    else if (c == '_')
      c = '/';
    else if (c == '+' || c == '/' || c == '=')
      return Status(Code::kInvalidArgument, "not base64url");
  }
  if (in.size() % 4 == 1) return Status(Code::kInvalidArgument, "bad base64url length");
  size_t pad = (4 - in.size() % 4) % 4;
  in.append(pad, '=');
  std::string out(in.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return Status(Code::kInvalidArgument, "not base64url");
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

namespace {
// The header of the tokens Sluice makes, base64url-encoded.
const std::string& CanonicalHeader() {
  static const std::string kHeader = Base64UrlEncode(R"({"alg":"HS256","typ":"JWT"})");
  return kHeader;
}
}  // namespace

std::string JwtEncode(const nlohmann::json& claims, std::string_view secret) {
  std::string signing_input = CanonicalHeader() + "." + Base64UrlEncode(claims.dump());
  return signing_input + "." + Base64UrlEncode(HmacSha256(secret, signing_input));
}

Result<nlohmann::json> JwtDecode(std::string_view token, std::string_view secret, std::time_t now) {
  size_t d1 = token.find('.');
  size_t d2 = d1 == std::string_view::npos ? d1 : token.find('.', d1 + 1);
  if (d2 == std::string_view::npos || token.find('.', d2 + 1) != std::string_view::npos)
    return Invalid("not a JWT");
  auto claims_raw = Base64UrlDecode(token.substr(d1 + 1, d2 - d1 - 1));
  auto sig = Base64UrlDecode(token.substr(d2 + 1));
  if (!claims_raw.ok() || !sig.ok()) return Invalid("bad encoding");
  // Sluice's own header needs no parsing; any other must still say HS256.
  if (token.substr(0, d1) != CanonicalHeader()) {
    auto header_raw = Base64UrlDecode(token.substr(0, d1));
    if (!header_raw.ok()) return Invalid("bad encoding");
    auto header = ParseJson(*header_raw, "JWT header");
    if (!header.ok() || !header->is_object() || !header->contains("alg") ||
        (*header)["alg"] != "HS256")
      return Invalid("algorithm must be HS256");
  }
  std::string expect = HmacSha256(secret, token.substr(0, d2));
  if (sig->size() != expect.size() || CRYPTO_memcmp(sig->data(), expect.data(), expect.size()) != 0)
    return Invalid("bad signature");
  auto parsed = ParseJson(*claims_raw, "JWT claims");
  if (!parsed.ok() || !parsed->is_object()) return Invalid("claims are not a JSON object");
  nlohmann::json claims = std::move(parsed).value();
  if (claims.contains("exp")) {
    if (!claims["exp"].is_number()) return Invalid("exp is not a number");
    if (claims["exp"].get<double>() <= static_cast<double>(now))
      return Status(Code::kUnauthenticated, "token expired");
  }
  if (claims.contains("nbf")) {  // as PyJWT checks it (no leeway)
    if (!claims["nbf"].is_number()) return Invalid("nbf is not a number");
    if (claims["nbf"].get<double>() > static_cast<double>(now))
      return Status(Code::kUnauthenticated, "token not yet valid (nbf)");
  }
  return claims;
}

}  // namespace sluice
