// The parser front of every listener: Beast's HTTP/1.1 tokenizer (basic_parser) with Sluice's
// own callbacks, so that every part of a request a client controls has an explicit limit and an
// answer. Beast's stock parser has none for chunk lines and trailers, and its field container
// throws std::length_error on a trailer field over 64 KiB.
//
// Limits, and what exceeding them answers:
//   request target over `request_target`                 414 URI Too Long
//   header block over `header_bytes`, or more than
//   `header_fields` fields                               431 Request Header Fields Too Large
//   chunk extensions over `chunk_extension` per chunk    400
//   trailer section over `trailer_bytes` or
//   `trailer_fields` fields                              431
//   body over the route's limit (declared or sent)       413
//   a transfer coding other than plain "chunked"         501
// Trailer fields are checked and dropped: no route reads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/message.hpp>

#include "common/status.h"

namespace sluice::api {

namespace http = boost::beast::http;

struct ParserLimits {
  size_t request_target = 8 << 10;
  size_t header_bytes = 16 << 10;  // request line and every field, as sent
  size_t header_fields = 100;
  size_t chunk_extension = 1 << 10;
  size_t trailer_bytes = 8 << 10;
  size_t trailer_fields = 32;
};

enum class ParseError {
  kTargetTooLong = 1,
  kTooManyFields,
  kChunkExtensionTooLong,
  kTrailerTooLarge,
  kUnsupportedTransferCoding,
  kBodyTooLarge,
  kUnexpectedBody,
};
boost::system::error_code make_error_code(ParseError e);

// What a request that failed to parse is answered with (code and message), for any error the
// parser or the read that fed it reports. `body_limit` is named in 413 messages.
Status ParseFailureStatus(const boost::system::error_code& ec, uint64_t body_limit);

class RequestParser : public http::basic_parser<true> {
 public:
  explicit RequestParser(const ParserLimits& limits = {});

  http::request_header<>& header() { return header_; }
  const http::request_header<>& header() const { return header_; }

  // Where the body goes; chosen once the header is in, before more is fed. Until then a body
  // is an error (kUnexpectedBody).
  // Appends to *out, refusing (kBodyTooLarge) a body over `limit`, declared or sent.
  void BodyToString(std::string* out, uint64_t limit);
  // Fills [data, data + size) like Beast's buffer_body: put() stops with http::error::need_buffer
  // once it is full. Call again with a fresh buffer to go on.
  void BodyToBuffer(char* data, size_t size);
  size_t buffer_left() const { return buf_left_; }

 private:
  enum class Mode { kUnset, kString, kBuffer };

  void on_request_impl(http::verb method, boost::beast::string_view method_str,
                       boost::beast::string_view target, int version,
                       boost::beast::error_code& ec) override;
  void on_response_impl(int, boost::beast::string_view, int, boost::beast::error_code&) override {}
  void on_field_impl(http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
  void on_header_impl(boost::beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         boost::beast::error_code& ec) override;
  size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::beast::error_code& ec) override;
  size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                            boost::beast::error_code& ec) override;
  void on_finish_impl(boost::beast::error_code&) override {}

  size_t TakeBody(boost::beast::string_view body, boost::beast::error_code& ec);

  ParserLimits limits_;
  http::request_header<> header_;
  size_t fields_ = 0;
  size_t header_bytes_ = 0;  // of the request line and the fields parsed so far
  bool in_trailer_ = false;
  size_t trailer_bytes_ = 0;
  Mode mode_ = Mode::kUnset;
  std::string* out_ = nullptr;
  uint64_t limit_ = 0;
  char* buf_ = nullptr;
  size_t buf_left_ = 0;
};

}  // namespace sluice::api

namespace boost::system {
template <>
struct is_error_code_enum<sluice::api::ParseError> : std::true_type {};
}  // namespace boost::system
