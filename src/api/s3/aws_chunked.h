// The aws-chunked body encoding of SigV4 streaming uploads, decoded as it streams:
//   <hex size>[;chunk-signature=<sig>]\r\n<data>\r\n ... 0[;chunk-signature=<sig>]\r\n
//   [<trailer name>:<value>\r\n ...][x-amz-trailer-signature:<sig>\r\n]\r\n
// Each chunk's signature (STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]) chains from the
// request's seed signature and is checked when the chunk ends (its bytes are only staged until
// then, never published); the trailer's signature likewise. Every line has a limit; the decoded
// length must be what x-amz-decoded-content-length declared.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/s3/sigv4.h"
#include "common/crypto.h"
#include "common/status.h"

namespace sluice::api::s3 {

class AwsChunkedDecoder {
 public:
  struct Options {
    bool signed_chunks = false;  // chunk signatures present and checked
    bool trailer = false;        // a trailer section follows the last chunk
    std::string announced;       // the field x-amz-trailer named (lower case): no other is taken
    SigV4Auth auth;              // scope, date and seed signature (signed modes)
    std::string signing_key;     // raw (signed modes)
    std::optional<uint64_t> decoded_length;  // x-amz-decoded-content-length
  };
  using Out = std::function<Status(const char* data, size_t n)>;

  explicit AwsChunkedDecoder(Options o);

  // Decodes the next encoded bytes, passing data to `out`. An error is final: an S3 error, or
  // `*out_error` set when `out` failed.
  std::optional<S3Error> Feed(const char* data, size_t n, const Out& out, Status* out_error);
  // The encoded body ended: it must have been complete.
  std::optional<S3Error> Finish() const;
  // Trailer fields (lower-case names), once finished.
  const std::map<std::string, std::string>& trailers() const { return trailers_; }
  uint64_t decoded() const { return decoded_; }

  static constexpr size_t kMaxLine = 512;
  static constexpr uint64_t kMinChunk = 8192;  // signed chunks, but the last
  static constexpr size_t kMaxTrailer = 4096;

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  std::optional<S3Error> OnSizeLine();
  std::optional<S3Error> OnChunkEnd();
  std::optional<S3Error> OnTrailerLine();

  Options o_;
  State state_ = State::kSize;
  std::string line_;
  uint64_t left_ = 0;  // data bytes left in this chunk
  uint64_t chunk_size_ = 0;
  bool short_chunk_ = false;  // the last data chunk was under kMinChunk
  std::string chunk_sig_;     // declared signature of this chunk
  std::string prev_sig_;      // the chain
  Digest chunk_sha_{Digest::Algo::kSha256};
  uint64_t decoded_ = 0;
  size_t trailer_bytes_ = 0;
  std::string trailer_text_;  // as signed: "name:value\n" per field
  std::string trailer_sig_;
  std::map<std::string, std::string> trailers_;
};

// The signed body a client streaming STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER] sends:
// `chunks` in order (every one but the last at least kMinChunk), each signature chained from
// `auth.signature` under `signing_key`, then the final chunk, then `trailers` (lower-case
// names) and their signature when there are any. The tests and the fuzz target check the
// decoder against it.
std::string EncodeSignedAwsChunked(const SigV4Auth& auth, std::string_view signing_key,
                                   const std::vector<std::string_view>& chunks,
                                   const std::map<std::string, std::string>& trailers = {});

}  // namespace sluice::api::s3
