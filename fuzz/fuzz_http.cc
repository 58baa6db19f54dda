// The parser front of every listener: request line, header fields, bodies with Content-Length
// or chunked framing (extensions, trailers), fed in pieces the way a socket delivers them, into
// each body mode; then routing of whatever target it produced.
#include <boost/asio/buffer.hpp>
#include <string>
#include <vector>

#include "api/http.h"
#include "api/http_parser.h"

namespace {

const sluice::api::Router& TheRouter() {
  static sluice::ThreadPool pool("fuzz", 1);
  static sluice::api::Router* r = [] {
    auto* router = new sluice::api::Router("fuzz", &pool);
    auto h = [](const sluice::api::HttpRequest&) { return sluice::api::HttpResponse::NoContent(); };
    router->Add(boost::beast::http::verb::get, "/livez", {.handler = h});
    router->Add(boost::beast::http::verb::get, "/v1/storages/vfs/{name}/files", {.handler = h});
    router->Add(boost::beast::http::verb::put, "/{bucket}/{key+}", {.handler = h});
    router->Add(boost::beast::http::verb::get, "/{bucket}", {.handler = h, .query_key = "acl"});
    return router;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // First byte: body mode and piece size; the rest is the stream.
  const unsigned mode = data[0] % 3;
  const size_t step = 1 + data[1] % 64;
  std::string in(reinterpret_cast<const char*>(data + 2), size - 2);

  sluice::api::RequestParser p;
  std::string body;
  std::vector<char> buf(37);
  std::string pending;
  size_t at = 0;
  boost::system::error_code ec;
  bool header_done = false;
  for (int guard = 0; guard < 100000; ++guard) {
    if (at < in.size()) {
      size_t n = std::min(step, in.size() - at);
      pending.append(in, at, n);
      at += n;
    }
    ec = {};
    size_t used = p.put(boost::asio::buffer(pending), ec);
    pending.erase(0, used);
    if (p.is_header_done() && !header_done) {
      header_done = true;
      if (mode == 0) p.BodyToString(&body, 4096);
      if (mode == 1) p.BodyToBuffer(buf.data(), buf.size());
      // mode 2: no body mode set (a request the route takes without a body)
      sluice::api::HttpRequest req;
      sluice::api::ParseTarget(p.header().target(), req.path, req.query);
      req.msg.base() = p.header();
      (void)TheRouter().Find(req);
    }
    if (ec == boost::beast::http::error::need_buffer) {
      p.BodyToBuffer(buf.data(), buf.size());
      continue;
    }
    if (ec == boost::beast::http::error::need_more) {
      if (at >= in.size()) break;
      continue;
    }
    if (ec) {
      (void)sluice::api::ParseFailureStatus(ec, 4096);
      break;
    }
    if (p.is_done() || (used == 0 && at >= in.size())) break;
  }
  return 0;
}
