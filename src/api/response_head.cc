#include "api/response_head.h"

#include <charconv>
#include <ctime>

#include "api/range.h"

namespace sluice::api {

namespace {

void AppendNumber(std::string& out, uint64_t n) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), n);
  out.append(buf, end);
}

}  // namespace

std::string_view CurrentHttpDate() {
  thread_local std::time_t formatted = -1;
  thread_local char buf[kHttpDateSize];
  std::time_t now = std::time(nullptr);
  if (now != formatted) {
    FormatHttpDate(now, buf);
    formatted = now;
  }
  return {buf, kHttpDateSize};
}

void FormatResponseHead(std::string& out, const HttpResponse& r, const HeadOptions& o) {
  out.clear();
  out += "HTTP/";
  out += static_cast<char>('0' + o.version / 10 % 10);
  out += '.';
  out += static_cast<char>('0' + o.version % 10);
  out += ' ';
  AppendNumber(out, r.status);
  out += ' ';
  out += std::string_view(http::obsolete_reason(static_cast<http::status>(r.status)));
  out += "\r\nServer: sluice\r\nDate: ";
  out += CurrentHttpDate();
  out += "\r\n";
  auto field = [&out](std::string_view k, std::string_view v) {
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  };
  if (!r.content_type.empty()) field("Content-Type", r.content_type);
  for (const auto& [k, v] : r.headers) field(k, v);
  out += r.header_lines;
  if (o.cors_fields && !o.cors_fields->empty()) {
    // The answer differs with and without Origin: caches must keep them apart.
    out += "Vary: Origin\r\n";
    if (o.cors)
      for (const auto& [k, v] : *o.cors_fields) field(k, v);
  }
  if (o.framing == Framing::kLength) {
    out += "Content-Length: ";
    AppendNumber(out, o.length);
    out += "\r\n";
  } else if (o.framing == Framing::kChunked) {
    out += "Transfer-Encoding: chunked\r\n";
  }
  if (o.version >= 11 && !o.keep_alive) out += "Connection: close\r\n";
  if (o.version < 11 && o.keep_alive) out += "Connection: keep-alive\r\n";
  out += "\r\n";
}

}  // namespace sluice::api
