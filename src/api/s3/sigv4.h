// AWS Signature Version 4 for S3, server side: the Authorization header and presigned URLs
// (query parameters), the canonical request, the string to sign, signing keys, and the
// chunk signatures of aws-chunked bodies. Pure functions over the request's header and
// target, so unit tests and the fuzz target call them directly.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>

namespace sluice::api::s3 {

namespace http = boost::beast::http;

// An S3 error answer: HTTP status, S3 code, message.
struct S3Error {
  unsigned status = 400;
  std::string code;
  std::string message;
};

inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
inline constexpr std::string_view kStreamingSigned = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
inline constexpr std::string_view kStreamingSignedTrailer =
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
inline constexpr std::string_view kStreamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

// Longest a presigned URL may be valid (7 days) and the clock skew tolerated (15 minutes).
inline constexpr int64_t kMaxPresignExpiry = 7 * 24 * 3600;
inline constexpr int64_t kMaxSkew = 15 * 60;

struct SigV4Auth {
  bool presigned = false;
  std::string access_key;
  std::string date;                         // YYYYMMDD of the credential scope
  std::string region;                       // of the credential scope
  std::string service;                      // "s3"
  std::string amz_date;                     // YYYYMMDDTHHMMSSZ
  std::time_t time = 0;                     // amz_date as a time
  std::vector<std::string> signed_headers;  // lower case, as listed
  std::string signature;                    // lower-case hex
  // x-amz-content-sha256 (header) or UNSIGNED-PAYLOAD (presigned, unless the URL names one).
  std::string payload_hash;
  int64_t expires = 0;  // presigned: seconds of validity

  std::string scope() const { return date + "/" + region + "/" + service + "/aws4_request"; }
};

// Parses the SigV4 parts of a request, from its Authorization header or its presigned query
// parameters, and checks the time against `now` (skew, expiry). nullopt with `*err` unset
// when the request carries no credentials at all (anonymous).
std::optional<SigV4Auth> ParseSigV4(const http::request_header<>& h, std::string_view target,
                                    std::time_t now, std::optional<S3Error>* err);

// S3's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ as %XX (upper case); '/' kept when
// `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);

// The canonical request of SigV4 for this request. `path` is the path to sign as the client
// sent it, percent-decoded (it is encoded here); `raw_query` the query as sent (no '?').
std::string CanonicalRequest(const http::request_header<>& h, std::string_view method,
                             std::string_view path, std::string_view raw_query,
                             const SigV4Auth& auth);
std::string StringToSign(const SigV4Auth& auth, std::string_view canonical_request);
// The signing key (raw): HMAC chain of "AWS4" + secret over date, region, service.
std::string SigningKey(std::string_view secret, std::string_view date, std::string_view region,
                       std::string_view service);
// Hex HMAC-SHA256 of `string_to_sign` under `signing_key`.
std::string SignatureOf(std::string_view signing_key, std::string_view string_to_sign);

// The string to sign of one aws-chunked chunk (STREAMING-AWS4-HMAC-SHA256-PAYLOAD):
// "AWS4-HMAC-SHA256-PAYLOAD", date, scope, previous signature, hash of "", hash of the chunk.
std::string ChunkStringToSign(const SigV4Auth& auth, std::string_view previous_signature,
                              std::string_view chunk_sha256_hex);
// The same for the signed trailer of STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER.
std::string TrailerStringToSign(const SigV4Auth& auth, std::string_view previous_signature,
                                std::string_view trailer_sha256_hex);

// "20130524T000000Z" -> time; nullopt when malformed.
std::optional<std::time_t> ParseAmzDate(std::string_view s);

}  // namespace sluice::api::s3
