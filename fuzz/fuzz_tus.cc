// A tus PATCH's header as it arrives (raw bytes through Beast's parser with the listener's header
// limit), then the header checks of the upload route: every accepted count is exactly its digits.
#include <cstdlib>
#include <string>

#include <boost/beast/http.hpp>

#include "api/tus_headers.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::request_parser<http::empty_body> p;
  p.header_limit(16 << 10);
  p.eager(false);
  boost::beast::error_code ec;
  p.put(boost::asio::buffer(data, size), ec);
  if (ec || !p.is_header_done()) return 0;
  sluice::api::HttpRequest req;
  req.msg.base() = p.get().base();
  sluice::api::ParseTarget(req.msg.target(), req.path, req.query);
  for (const char* name :
       {"Tus-Resumable", "Content-Type", "Upload-Offset", "Content-Length", "Upload-Length"}) {
    auto v = sluice::api::SingleHeader(req, name);
    if (!v.ok() || !*v) continue;
    std::string_view s = **v;
    if (!s.empty() &&
        (s.front() == ' ' || s.front() == '\t' || s.back() == ' ' || s.back() == '\t'))
      std::abort();
    auto n = sluice::api::ParseCount(s, name);
    if (!n.ok()) continue;
    if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) std::abort();
    size_t lead = s.find_first_not_of('0');
    std::string digits = lead == std::string_view::npos ? "0" : std::string(s.substr(lead));
    if (std::to_string(*n) != digits) std::abort();
  }
  return 0;
}
