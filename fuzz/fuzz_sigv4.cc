// SigV4: the Authorization header and presigned query parsing and the canonical request of any
// header set and target: nothing may crash, and a parsed request always names the host header
// among those signed and a 64-digit signature.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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
  // The canonical query against a naive one (each pair decoded, encoded again, sorted as
  // strings), for any query, presigned or not: the canonical request builds it in an arena.
  const std::string query =
      target.find('?') == std::string::npos ? std::string() : target.substr(target.find('?') + 1);
  SigV4Auth any;
  any.signed_headers = {"host"};
  for (bool presigned : {false, true}) {
    any.presigned = presigned;
    std::vector<std::pair<std::string, std::string>> naive;
    for (auto& [k, v] : DecodeQuery(query)) {
      if (presigned && k == "X-Amz-Signature") continue;
      naive.emplace_back(UriEncode(k, false), UriEncode(v, false));
    }
    std::sort(naive.begin(), naive.end());
    std::string want;
    for (size_t i = 0; i < naive.size(); ++i)
      want += (i ? "&" : "") + naive[i].first + "=" + naive[i].second;
    std::string cr = CanonicalRequest(h, "GET", "/", query, any);
    size_t a = cr.find('\n', cr.find('\n') + 1) + 1;  // after the method's and the path's lines
    if (cr.compare(a, cr.find('\n', a) - a, want) != 0) std::abort();
  }
  (void)UriEncode(in, true);
  return 0;
}
