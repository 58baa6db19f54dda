// AWS Signature Version 4 for S3, the part the server and the client share: the canonical
// request, the string to sign, signing keys, chunk and trailer strings of aws-chunked bodies,
// and signing a request on the client side. One implementation, so what the client signs is
// exactly what the server checks. Pure functions over a Beast request header.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>

#include "common/uri.h"

namespace sluice::io::s3 {

namespace http = boost::beast::http;

inline constexpr std::string_view kSigV4Algorithm = "AWS4-HMAC-SHA256";
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
inline constexpr std::string_view kStreamingSigned = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
inline constexpr std::string_view kStreamingSignedTrailer =
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
inline constexpr std::string_view kStreamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";
// SHA-256 of the empty string, hex.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

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

// ASCII lower case (header names).
std::string AsciiLower(std::string_view s);
// Blanks (space, tab) trimmed from both ends.
std::string_view TrimBlanks(std::string_view s);
// Decoded (name, value) pairs of a raw query string ("a=1&b=%20"), in order; empty parts skipped.
std::vector<std::pair<std::string, std::string>> DecodeQuery(std::string_view q);

// The canonical request of SigV4 for this request. `path` is the path to sign as the client
// sent it, percent-decoded (it is encoded here); `raw_query` the query as sent (no '?').
std::string CanonicalRequest(const http::request_header<>& h, std::string_view method,
                             std::string_view path, std::string_view raw_query,
                             const SigV4Auth& auth);
// The same, appended to `out` (a buffer the caller reuses).
void AppendCanonicalRequest(std::string& out, const http::request_header<>& h,
                            std::string_view method, std::string_view path,
                            std::string_view raw_query, const SigV4Auth& auth);
std::string StringToSign(const SigV4Auth& auth, std::string_view canonical_request);
void AppendStringToSign(std::string& out, const SigV4Auth& auth,
                        std::string_view canonical_request);
// Whether `signature` (hex, as sent) is the signature of `canonical_request` under
// `signing_key`; compared in constant time, without allocating.
bool SignatureMatches(std::string_view signing_key, const SigV4Auth& auth,
                      std::string_view canonical_request, std::string_view signature);
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
// A UTC date and time -> time (as timegm, days past a month's end running on); nullopt when a
// field is out of range.
std::optional<std::time_t> TimeFromFields(int year, int month, int day, int hour, int minute,
                                          int second);
// time -> "20130524T000000Z".
std::string FormatAmzDate(std::time_t t);

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string region = "us-east-1";
};

// A signing key kept for the day it is for (four HMACs saved on every request after the first).
struct SigningKeyCache {
  std::string date, region, secret, key;
};

// Client side: signs the request in `h` with an Authorization header. Sets x-amz-date and
// x-amz-content-sha256 (`payload_hash`: hex SHA-256 or UNSIGNED-PAYLOAD) first; signs host,
// content-md5, content-type and every x-amz-* header present. `path` is the decoded path,
// `raw_query` the query as it goes on the wire. `cache` (optional, one per client) keeps the
// signing key. Returns the signature.
std::string SignRequest(http::request_header<>& h, std::string_view method, std::string_view path,
                        std::string_view raw_query, std::string_view payload_hash,
                        const Credentials& creds, std::time_t now,
                        SigningKeyCache* cache = nullptr);

}  // namespace sluice::io::s3
