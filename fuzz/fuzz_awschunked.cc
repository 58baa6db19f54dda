// The aws-chunked decoder, fed in pieces of any size, signed and unsigned: nothing may crash, the
// decoded bytes never exceed the declared length, and a finished body decoded exactly that much.
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "api/s3/aws_chunked.h"

//
// With bit 8 of the first byte the body is a valid signed one (EncodeSignedAwsChunked) made
// from the input (chunks of at least 8 KiB repeating it, a trailer field), with one byte
// changed when bit 16 is set: a valid body must decode to exactly what was signed, and any
// changed one must be refused or decode to exactly that too. (Random bodies alone never get
// past the first chunk signature, so the chain and the trailer's were never reached.)
namespace {

using namespace sluice::api::s3;

int SignedRoundTrip(const AwsChunkedDecoder::Options& o, const uint8_t* data, size_t size) {
  const std::string seed(reinterpret_cast<const char*>(data + 3), size - 3);
  std::vector<std::string> chunks;
  std::string want;
  for (int i = 0; i < 1 + data[1] % 3; ++i) {
    std::string c;
    while (c.size() < AwsChunkedDecoder::kMinChunk + i) c += seed.empty() ? std::string("x") : seed;
    chunks.push_back(c);
    want += c;
  }
  chunks.push_back(seed);  // the last may be short, or empty
  want += seed;
  std::map<std::string, std::string> trailers;
  if (o.trailer) trailers[o.announced] = sluice::HexEncode(seed.substr(0, 8));
  std::vector<std::string_view> views(chunks.begin(), chunks.end());
  std::string body = EncodeSignedAwsChunked(o.auth, o.signing_key, views, trailers);
  const bool changed = data[0] & 16;
  if (changed) body[(data[1] * 257u + data[2]) % body.size()] ^= static_cast<char>(data[2] | 1);
  AwsChunkedDecoder d(o);
  std::string out;
  const size_t piece = 1 + data[2] % 4096;
  for (size_t i = 0; i < body.size(); i += piece) {
    sluice::Status out_error;
    auto err = d.Feed(
        body.data() + i, std::min(piece, body.size() - i),
        [&](const char* p, size_t n) {
          out.append(p, n);
          return sluice::Status::Ok();
        },
        &out_error);
    if (err) {
      if (!changed) std::abort();  // a valid body refused
      return 0;
    }
  }
  if (d.Finish()) {
    if (!changed) std::abort();
    return 0;
  }
  if (out != want || d.trailers() != trailers) std::abort();  // passed what was not signed
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  AwsChunkedDecoder::Options o;
  o.signed_chunks = data[0] & 1;
  o.trailer = data[0] & 2;
  o.announced = "x-amz-checksum-crc32";
  o.auth.amz_date = "20130524T000000Z";
  o.auth.date = "20130524";
  o.auth.region = "us-east-1";
  o.auth.service = "s3";
  o.auth.signature = std::string(64, 'a');
  o.signing_key = std::string(32, 'k');
  if (data[0] & 8) {
    o.signed_chunks = true;
    return SignedRoundTrip(o, data, size);
  }
  if (data[0] & 4) o.decoded_length = data[1];
  size_t piece = 1 + data[2] % 64;
  AwsChunkedDecoder d(o);
  uint64_t got = 0;
  std::string body(reinterpret_cast<const char*>(data + 3), size - 3);
  for (size_t i = 0; i < body.size(); i += piece) {
    sluice::Status out_error;
    auto err = d.Feed(
        body.data() + i, std::min(piece, body.size() - i),
        [&](const char*, size_t n) {
          got += n;
          return sluice::Status::Ok();
        },
        &out_error);
    if (err) return 0;
  }
  if (o.decoded_length && got > *o.decoded_length) std::abort();
  if (!d.Finish() && o.decoded_length && got != *o.decoded_length) std::abort();
  if (got != d.decoded()) std::abort();
  return 0;
}
