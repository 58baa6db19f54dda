#include "api/http_parser.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>

namespace sluice::api {

namespace {

class ParseErrorCategory : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "sluice.http"; }
  std::string message(int ev) const override {
    switch (static_cast<ParseError>(ev)) {
      case ParseError::kTargetTooLong:
        return "request target too long";
      case ParseError::kTooManyFields:
        return "too many header fields";
      case ParseError::kChunkExtensionTooLong:
        return "chunk extensions too long";
      case ParseError::kTrailerTooLarge:
        return "trailer section too large";
      case ParseError::kUnsupportedTransferCoding:
        return "unsupported transfer coding";
      case ParseError::kBodyTooLarge:
        return "request body too large";
      case ParseError::kUnexpectedBody:
        return "request body not expected";
    }
    return "http parse error";
  }
};

const ParseErrorCategory& Category() {
  static const ParseErrorCategory c;
  return c;
}

}  // namespace

boost::system::error_code make_error_code(ParseError e) {
  return {static_cast<int>(e), Category()};
}

Status ParseFailureStatus(const boost::system::error_code& ec, uint64_t body_limit) {
  if (ec.category() == Category()) {
    switch (static_cast<ParseError>(ec.value())) {
      case ParseError::kTargetTooLong:
        return Status(Code::kUriTooLong, "request target is too long");
      case ParseError::kTooManyFields:
        return Status(Code::kHeaderTooLarge, "request has too many header fields");
      case ParseError::kTrailerTooLarge:
        return Status(Code::kHeaderTooLarge, "request trailer section is too large");
      case ParseError::kChunkExtensionTooLong:
        return Status(Code::kInvalidArgument, "malformed HTTP request: chunk extensions too long");
      case ParseError::kUnsupportedTransferCoding:
        return Status(Code::kUnsupported,
                      "Transfer-Encoding other than 'chunked' is not supported");
      case ParseError::kBodyTooLarge:
        return Status(Code::kTooLarge, fmt::format("request body exceeds {} bytes", body_limit));
      case ParseError::kUnexpectedBody:
        return Status(Code::kTooLarge, "this request takes no body");
    }
  }
  if (ec == http::error::header_limit)
    return Status(Code::kHeaderTooLarge, "request header fields are too large");
  if (ec == http::error::body_limit)
    return Status(Code::kTooLarge, fmt::format("request body exceeds {} bytes", body_limit));
  if (ec == http::error::buffer_overflow)
    return Status(Code::kHeaderTooLarge, "request framing (a chunk line or trailer) is too large");
  return Status(Code::kInvalidArgument, fmt::format("malformed HTTP request: {}", ec.message()));
}

RequestParser::RequestParser(const ParserLimits& limits) : limits_(limits) {
  header_limit(static_cast<std::uint32_t>(limits_.header_bytes));
  // The body's limit is the route's, enforced below (Beast 1.74 compares lengths against an
  // empty optional as "greater", so "none" must be spelled as the largest value).
  body_limit(std::numeric_limits<std::uint64_t>::max());
}

void RequestParser::BodyToString(std::string* out, uint64_t limit) {
  mode_ = Mode::kString;
  out_ = out;
  limit_ = limit;
}

void RequestParser::BodyToBuffer(char* data, size_t size) {
  mode_ = Mode::kBuffer;
  buf_ = data;
  buf_left_ = size;
}

void RequestParser::on_request_impl(http::verb method, boost::beast::string_view method_str,
                                    boost::beast::string_view target, int version,
                                    boost::beast::error_code& ec) {
  if (target.size() > limits_.request_target) {
    ec = ParseError::kTargetTooLong;
    return;
  }
  header_bytes_ = method_str.size() + target.size() + 11;  // " ", " HTTP/1.1", CRLF
  header_.target(target);
  if (method != http::verb::unknown)
    header_.method(method);
  else
    header_.method_string(method_str);
  header_.version(version);
}

void RequestParser::on_field_impl(http::field name, boost::beast::string_view name_string,
                                  boost::beast::string_view value, boost::beast::error_code& ec) {
  if (in_trailer_) {
    trailer_bytes_ += name_string.size() + value.size() + 4;
    if (++fields_ > limits_.trailer_fields || trailer_bytes_ > limits_.trailer_bytes)
      ec = ParseError::kTrailerTooLarge;
    return;
  }
  // The header block as a whole is bounded here, counted across every put(): Beast's
  // header_limit counts only the bytes of one put() not yet parsed, so a client whose segments
  // each end just after a field had a fresh allowance per segment (hundreds of KiB held per
  // connection). This also keeps every value under the 64 KiB at which basic_fields throws.
  header_bytes_ += name_string.size() + value.size() + 4;  // ": ", CRLF
  if (header_bytes_ > limits_.header_bytes) {
    ec = http::error::header_limit;
    return;
  }
  if (++fields_ > limits_.header_fields) {
    ec = ParseError::kTooManyFields;
    return;
  }
  header_.insert(name, name_string, value);
}

void RequestParser::on_header_impl(boost::beast::error_code& ec) {
  fields_ = 0;
  header_bytes_ = 0;
  // Only plain chunked framing is understood: "gzip, chunked" would hand a handler compressed
  // bytes as if they were the body.
  auto te = header_.find(http::field::transfer_encoding);
  if (te != header_.end() && !boost::beast::iequals(te->value(), "chunked"))
    ec = ParseError::kUnsupportedTransferCoding;
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      boost::beast::error_code& ec) {
  if (mode_ == Mode::kUnset) {
    ec = ParseError::kUnexpectedBody;
    return;
  }
  if (mode_ == Mode::kString && content_length) {
    if (*content_length > limit_ || *content_length > limit_ - out_->size()) {
      ec = ParseError::kBodyTooLarge;
      return;
    }
    out_->reserve(out_->size() + static_cast<size_t>(*content_length));
  }
}

size_t RequestParser::TakeBody(boost::beast::string_view body, boost::beast::error_code& ec) {
  switch (mode_) {
    case Mode::kString:
      if (body.size() > limit_ - std::min<uint64_t>(limit_, out_->size())) {
        ec = ParseError::kBodyTooLarge;
        return 0;
      }
      out_->append(body.data(), body.size());
      return body.size();
    case Mode::kBuffer: {
      size_t n = std::min(body.size(), buf_left_);
      if (n) std::memcpy(buf_, body.data(), n);
      buf_ += n;
      buf_left_ -= n;
      if (n < body.size()) ec = http::error::need_buffer;
      return n;
    }
    case Mode::kUnset:
      break;
  }
  ec = ParseError::kUnexpectedBody;
  return 0;
}

size_t RequestParser::on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) {
  return TakeBody(body, ec);
}

void RequestParser::on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                                         boost::beast::error_code& ec) {
  if (extensions.size() > limits_.chunk_extension) {
    ec = ParseError::kChunkExtensionTooLong;
    return;
  }
  if (size == 0) {
    in_trailer_ = true;  // the fields that follow the last chunk are trailers
    return;
  }
  if (mode_ == Mode::kString && size > limit_ - std::min<uint64_t>(limit_, out_->size()))
    ec = ParseError::kBodyTooLarge;
}

size_t RequestParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                         boost::beast::error_code& ec) {
  return TakeBody(body, ec);
}

}  // namespace sluice::api
