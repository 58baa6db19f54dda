// Request targets and bodies of the manager API: query decoding and the JSON parameter layer.
#include <string>

#include "api/http.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string s(reinterpret_cast<const char*>(data), size);
  size_t cut = s.find('\n');
  sluice::api::HttpRequest req;
  sluice::api::ParseTarget(s.substr(0, cut), req.path, req.query);
  if (cut != std::string::npos) req.msg.body() = s.substr(cut + 1);
  auto p = sluice::api::Params::From(req);
  if (p.ok()) {
    (void)p->Str("volume");
    (void)p->Bool("recursive", false);
    (void)p->OptUint("mode");
    (void)p->StrList("relpaths");
  }
  return 0;
}
