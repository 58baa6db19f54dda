// The aws-chunked decoder, fed in pieces of any size, signed and unsigned: nothing may crash, the
// decoded bytes never exceed the declared length, and a finished body decoded exactly that much.
#include <cstdlib>
#include <string>

#include "api/s3/aws_chunked.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::api::s3;
  if (size < 3) return 0;
  AwsChunkedDecoder::Options o;
  o.signed_chunks = data[0] & 1;
  o.trailer = data[0] & 2;
  o.auth.amz_date = "20130524T000000Z";
  o.auth.date = "20130524";
  o.auth.region = "us-east-1";
  o.auth.service = "s3";
  o.auth.signature = std::string(64, 'a');
  o.signing_key = std::string(32, 'k');
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
