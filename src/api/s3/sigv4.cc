#include "api/s3/sigv4.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>
#include <boost/beast/core/string.hpp>

#include "api/http.h"
#include "api/range.h"
#include "common/crypto.h"

namespace sluice::api::s3 {

namespace {

S3Error Err(unsigned status, std::string code, std::string msg) {
  return S3Error{status, std::move(code), std::move(msg)};
}

std::string_view QueryOf(std::string_view target) {
  size_t q = target.find('?');
  return q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
}

// "AK/20130524/us-east-1/s3/aws4_request"
bool ParseCredential(std::string_view c, SigV4Auth* a) {
  std::vector<std::string_view> parts;
  // The access key never holds '/'; split from the right so that a malformed one still parses
  // into five parts only when it is well formed.
  while (true) {
    size_t s = c.find('/');
    parts.push_back(c.substr(0, s));
    if (s == std::string_view::npos) break;
    c.remove_prefix(s + 1);
  }
  if (parts.size() != 5 || parts[0].empty() || parts[1].size() != 8 || parts[2].empty() ||
      parts[3].empty() || parts[4] != "aws4_request")
    return false;
  a->access_key = parts[0];
  a->date = parts[1];
  a->region = parts[2];
  a->service = parts[3];
  return true;
}

bool IsLowerHex(std::string_view s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::vector<std::string> SplitSignedHeaders(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    size_t semi = s.find(';');
    out.emplace_back(s.substr(0, semi));
    if (semi == std::string_view::npos) break;
    s.remove_prefix(semi + 1);
  }
  return out;
}

}  // namespace

std::optional<SigV4Auth> ParseSigV4(const http::request_header<>& h, std::string_view target,
                                    std::time_t now, std::optional<S3Error>* err) {
  err->reset();
  SigV4Auth a;
  auto auth_it = h.find(http::field::authorization);
  std::string_view query = QueryOf(target);
  // A parameter named so (decoded), not a substring: "prefix=X-Amz-Credential=" is no
  // signature.
  bool has_query_sig = false;
  for (std::string_view q = query; !q.empty() && !has_query_sig;) {
    size_t amp = q.find('&');
    std::string_view k = q.substr(0, std::min(amp, q.find('=')));
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (k.size() < 14 || k.size() > 3 * 16) continue;
    std::string name =
        k.find('%') == std::string_view::npos ? std::string(k) : PercentDecode(k, false);
    has_query_sig = name == "X-Amz-Signature" || name == "X-Amz-Credential";
  }
  if (auth_it != h.end()) {
    std::string_view v = auth_it->value();
    if (has_query_sig) {
      *err = Err(400, "InvalidArgument",
                 "only one auth mechanism allowed; only the X-Amz-Algorithm query parameter or "
                 "the Authorization header should be specified");
      return std::nullopt;
    }
    if (v.substr(0, 4) == "AWS ") {
      *err = Err(400, "InvalidRequest",
                 "Signature Version 2 is not supported: sign requests with AWS4-HMAC-SHA256");
      return std::nullopt;
    }
    if (v.substr(0, kSigV4Algorithm.size()) != kSigV4Algorithm ||
        (v.size() > kSigV4Algorithm.size() && v[kSigV4Algorithm.size()] != ' ')) {
      *err = Err(400, "AuthorizationHeaderMalformed",
                 "the authorization header is malformed; the algorithm must be AWS4-HMAC-SHA256");
      return std::nullopt;
    }
    v.remove_prefix(kSigV4Algorithm.size());
    bool cred = false, sh = false, sig = false;
    while (!v.empty()) {
      size_t comma = v.find(',');
      std::string_view part = TrimBlanks(v.substr(0, comma));
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      size_t eq = part.find('=');
      if (eq == std::string_view::npos) continue;
      std::string_view k = part.substr(0, eq), val = part.substr(eq + 1);
      if (k == "Credential") {
        cred = ParseCredential(val, &a);
        if (!cred) {
          *err = Err(400, "AuthorizationHeaderMalformed",
                     fmt::format("the authorization header is malformed; the Credential '{}' is "
                                 "not <access key>/<YYYYMMDD>/<region>/s3/aws4_request",
                                 val.substr(0, 256)));
          return std::nullopt;
        }
      } else if (k == "SignedHeaders") {
        a.signed_headers = SplitSignedHeaders(val);
        sh = !a.signed_headers.empty();
      } else if (k == "Signature") {
        a.signature = std::string(val);
        sig = true;
      }
    }
    if (!cred || !sh || !sig) {
      *err = Err(400, "AuthorizationHeaderMalformed",
                 "the authorization header is malformed; it needs Credential, SignedHeaders and "
                 "Signature");
      return std::nullopt;
    }
    auto d = h.find("x-amz-date");
    if (d != h.end()) {
      a.amz_date = std::string(d->value());
      auto t = ParseAmzDate(a.amz_date);
      if (!t) {
        *err = Err(403, "AccessDenied",
                   "X-Amz-Date must be in the ISO8601 basic format "
                   "YYYYMMDDTHHMMSSZ");
        return std::nullopt;
      }
      a.time = *t;
    } else if (auto dd = h.find(http::field::date); dd != h.end()) {
      auto t = ParseHttpDate(dd->value());
      if (!t) {
        *err = Err(403, "AccessDenied", "the Date header is malformed");
        return std::nullopt;
      }
      a.time = *t;
      char buf[32];
      struct tm tm;
      gmtime_r(&a.time, &tm);
      strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
      a.amz_date = buf;
    } else {
      *err =
          Err(403, "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header");
      return std::nullopt;
    }
    auto p = h.find("x-amz-content-sha256");
    if (p == h.end()) {
      *err = Err(400, "InvalidRequest",
                 "missing required header for this request: x-amz-content-sha256");
      return std::nullopt;
    }
    a.payload_hash = std::string(p->value());
    // A mode this server knows (streaming ones are checked by the route that reads the body),
    // or a SHA-256: anything else AWS refuses before looking at the signature.
    if (a.payload_hash != kUnsignedPayload && !a.payload_hash.starts_with("STREAMING-") &&
        !(a.payload_hash.size() == 64 &&
          std::all_of(a.payload_hash.begin(), a.payload_hash.end(), ::isxdigit))) {
      *err = Err(400, "InvalidArgument",
                 "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a STREAMING-* mode or a valid "
                 "sha256 value");
      return std::nullopt;
    }
    if (std::llabs(static_cast<long long>(a.time - now)) > kMaxSkew) {
      *err = Err(403, "RequestTimeTooSkewed",
                 "the difference between the request time and the server's time is too large");
      return std::nullopt;
    }
  } else if (has_query_sig) {
    a.presigned = true;
    // Only the X-Amz-* parameters are decoded (the last of a repeated one wins), those not
    // kept into per-thread buffers: every presigned request comes this way.
    thread_local std::string name, alg, cred, sh, expires;
    alg.clear();
    cred.clear();
    sh.clear();
    expires.clear();
    for (std::string_view q = query; !q.empty();) {
      size_t amp = q.find('&');
      std::string_view part = q.substr(0, amp);
      q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
      size_t eq = part.find('=');
      std::string_view k = part.substr(0, eq);
      if (k.find('%') != std::string_view::npos) {
        name.clear();
        AppendPercentDecoded(name, k, false);
        k = name;
      }
      if (k.substr(0, 6) != "X-Amz-") continue;
      std::string* to = k == "X-Amz-Algorithm"        ? &alg
                        : k == "X-Amz-Credential"     ? &cred
                        : k == "X-Amz-Date"           ? &a.amz_date
                        : k == "X-Amz-Expires"        ? &expires
                        : k == "X-Amz-SignedHeaders"  ? &sh
                        : k == "X-Amz-Signature"      ? &a.signature
                        : k == "X-Amz-Content-Sha256" ? &a.payload_hash
                                                      : nullptr;
      if (!to) continue;
      to->clear();
      if (eq != std::string_view::npos) AppendPercentDecoded(*to, part.substr(eq + 1), false);
    }
    auto qerr = [&](std::string msg) {
      *err = Err(400, "AuthorizationQueryParametersError", std::move(msg));
      return std::nullopt;
    };
    if (alg != kSigV4Algorithm) return qerr("X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"");
    if (!ParseCredential(cred, &a))
      return qerr("X-Amz-Credential is not <access key>/<YYYYMMDD>/<region>/s3/aws4_request");
    a.signed_headers = SplitSignedHeaders(sh);
    if (a.signed_headers.empty() || a.signature.empty())
      return qerr(
          "query-string authentication requires the X-Amz-Signature, X-Amz-Date, "
          "X-Amz-SignedHeaders, X-Amz-Credential and X-Amz-Expires parameters");
    auto t = ParseAmzDate(a.amz_date);
    if (!t) return qerr("X-Amz-Date must be in the ISO8601 basic format YYYYMMDDTHHMMSSZ");
    a.time = *t;
    if (expires.empty() || expires.size() > 7 ||
        !std::all_of(expires.begin(), expires.end(), ::isdigit))
      return qerr("X-Amz-Expires should be a number");
    a.expires = std::atoll(expires.c_str());
    if (a.expires > kMaxPresignExpiry)
      return qerr("X-Amz-Expires must be less than a week (in seconds) that is 604800");
    if (a.expires < 1) return qerr("X-Amz-Expires must be non-negative");
    if (a.time - now > kMaxSkew) {
      *err = Err(403, "AccessDenied", "request is not valid yet");
      return std::nullopt;
    }
    if (now > a.time + a.expires) {
      *err = Err(403, "AccessDenied", "request has expired");
      return std::nullopt;
    }
    if (a.payload_hash.empty()) a.payload_hash = std::string(kUnsignedPayload);
  } else {
    return std::nullopt;  // anonymous
  }
  if (a.amz_date.substr(0, 8) != a.date) {
    // As AWS answers it: the request is malformed, not its signature wrong.
    *err =
        Err(400, a.presigned ? "AuthorizationQueryParametersError" : "AuthorizationHeaderMalformed",
            fmt::format("invalid credential date: {} is not the date of X-Amz-Date ({})", a.date,
                        a.amz_date.substr(0, 8)));
    return std::nullopt;
  }
  if (a.service != "s3") {
    *err = Err(400, "AuthorizationHeaderMalformed",
               fmt::format("the credential names service '{}'; this is 's3'", a.service));
    return std::nullopt;
  }
  if (!IsLowerHex(a.signature, 64)) {
    *err = Err(403, "SignatureDoesNotMatch", "the signature is not 64 lower-case hex digits");
    return std::nullopt;
  }
  if (std::find(a.signed_headers.begin(), a.signed_headers.end(), "host") ==
      a.signed_headers.end()) {
    *err = Err(403, "AccessDenied", "the Host header must be signed");
    return std::nullopt;
  }
  // Every x-amz-* header the request carries must be signed (x-amz-content-sha256 aside), as
  // AWS requires: otherwise the holder of a presigned PUT could add x-amz-copy-source and copy
  // any object the signer may read, or metadata the signer never chose.
  std::string unsigned_names;
  thread_local std::string lower;
  for (const auto& f : h) {
    std::string_view n = f.name_string();
    if (n.size() < 6 || !boost::beast::iequals(n.substr(0, 6), "x-amz-")) continue;
    lower.assign(n);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "x-amz-content-sha256" ||
        std::find(a.signed_headers.begin(), a.signed_headers.end(), lower) !=
            a.signed_headers.end())
      continue;
    if (!unsigned_names.empty()) unsigned_names += ", ";
    unsigned_names += lower;
  }
  if (!unsigned_names.empty()) {
    *err =
        Err(403, "AccessDenied",
            "There were headers present in the request which were not signed: " + unsigned_names);
    return std::nullopt;
  }
  return a;
}

}  // namespace sluice::api::s3
