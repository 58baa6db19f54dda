// AWS Signature Version 4 for S3, server side: parsing the Authorization header and presigned
// URLs (query parameters) and checking their time. The canonical request, strings to sign and
// signing keys are shared with the client (io/s3/sigv4.h) and named here too. Pure functions
// over the request's header and target, so unit tests and the fuzz target call them directly.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>

#include "io/s3/sigv4.h"

namespace sluice::api::s3 {

namespace http = boost::beast::http;

// An S3 error answer: HTTP status, S3 code, message.
struct S3Error {
  unsigned status = 400;
  std::string code;
  std::string message;
};

// Longest a presigned URL may be valid (7 days) and the clock skew tolerated (15 minutes).
inline constexpr int64_t kMaxPresignExpiry = 7 * 24 * 3600;
inline constexpr int64_t kMaxSkew = 15 * 60;

using io::s3::AppendCanonicalRequest;
using io::s3::AsciiLower;
using io::s3::CanonicalRequest;
using io::s3::ChunkStringToSign;
using io::s3::DecodeQuery;
using io::s3::kSigV4Algorithm;
using io::s3::kStreamingSigned;
using io::s3::kStreamingSignedTrailer;
using io::s3::kStreamingUnsignedTrailer;
using io::s3::kUnsignedPayload;
using io::s3::ParseAmzDate;
using io::s3::SignatureMatches;
using io::s3::SignatureOf;
using io::s3::SigningKey;
using io::s3::SigV4Auth;
using io::s3::StringToSign;
using io::s3::TrailerStringToSign;
using io::s3::TrimBlanks;
using sluice::UriEncode;

// Parses the SigV4 parts of a request, from its Authorization header or its presigned query
// parameters, and checks the time against `now` (skew, expiry). nullopt with `*err` unset
// when the request carries no credentials at all (anonymous).
std::optional<SigV4Auth> ParseSigV4(const http::request_header<>& h, std::string_view target,
                                    std::time_t now, std::optional<S3Error>* err);

}  // namespace sluice::api::s3
