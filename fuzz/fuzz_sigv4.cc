// SigV4: the Authorization header and presigned query parsing and the canonical request of any
// header set and target: nothing may crash, and a parsed request always names the host header
// among those signed and a 64-digit signature.
#include <cstdlib>
#include <string>

#include "api/s3/sigv4.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::api::s3;
  std::string in(reinterpret_cast<const char*>(data), size);
  // Lines: target, then "name: value" header lines.
  size_t nl = in.find('\n');
  std::string target = in.substr(0, nl);
  http::request_header<> h;
  h.method(http::verb::get);
  std::string rest = nl == std::string::npos ? "" : in.substr(nl + 1);
  while (!rest.empty()) {
    size_t e = rest.find('\n');
    std::string line = rest.substr(0, e);
    rest = e == std::string::npos ? "" : rest.substr(e + 1);
    size_t c = line.find(':');
    if (c == std::string::npos || c == 0) continue;
    try {
      h.insert(line.substr(0, c), line.substr(c + 1));
    } catch (...) {
      continue;  // Beast refuses some field names; so does the real parser
    }
  }
  std::optional<S3Error> err;
  auto a = ParseSigV4(h, target, 1369353600, &err);
  if (a) {
    if (a->signature.size() != 64 || err) std::abort();
    bool host = false;
    for (const auto& s : a->signed_headers) host |= s == "host";
    if (!host) std::abort();
    std::string cr = CanonicalRequest(
        h, "GET", target.substr(0, target.find('?')),
        target.find('?') == std::string::npos ? std::string() : target.substr(target.find('?') + 1),
        *a);
    (void)StringToSign(*a, cr);
  }
  (void)UriEncode(in, true);
  return 0;
}
