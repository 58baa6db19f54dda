#include "common/uri.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>

namespace sluice {

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  AppendPercentDecoded(out, s, plus_is_space);
  return out;
}

void AppendPercentDecoded(std::string& out, std::string_view s, bool plus_is_space) {
  if (s.empty()) return;  // its data() may be null, which memchr must not get
  out.reserve(out.size() + s.size());
  // Runs of plain bytes are copied whole (a download token is hundreds of them), found with
  // memchr; each search resumes where the last one stopped, so the work stays linear.
  const char* p = s.data();
  const char* end = p + s.size();
  auto next = [end](const char* from, char c) {
    const void* at = std::memchr(from, c, static_cast<size_t>(end - from));
    return at ? static_cast<const char*>(at) : end;
  };
  const char* pct = next(p, '%');
  const char* plus = plus_is_space ? next(p, '+') : end;
  while (p < end) {
    const char* q = std::min(pct, plus);
    out.append(p, q);
    if (q == end) break;
    int hi = end - q > 2 ? HexValue(q[1]) : -1;
    int lo = hi >= 0 ? HexValue(q[2]) : -1;
    if (*q == '%' && lo >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      p = q + 3;
    } else {
      out += *q == '+' ? ' ' : *q;
      p = q + 1;
    }
    if (pct < p) pct = next(p, '%');
    if (plus < p) plus = next(p, '+');
  }
}

namespace {
// S3's unreserved bytes, A-Z a-z 0-9 - _ . ~: a table, not isalnum(), whose answer for bytes
// past 0x7f depends on the locale (and which costs a call per byte on every signature).
constexpr std::array<bool, 256> kUnreserved = [] {
  std::array<bool, 256> t{};
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = true;
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (unsigned char c : {'-', '_', '.', '~'}) t[c] = true;
  return t;
}();
}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  std::string out;
  AppendUriEncoded(out, s, keep_slash);
  return out;
}

void AppendUriEncoded(std::string& out, std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  // Runs of bytes kept as they are go in whole: most of a key or a query value is one run.
  size_t i = 0;
  out.reserve(out.size() + s.size() + 16);
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() &&
           (kUnreserved[static_cast<unsigned char>(s[j])] || (keep_slash && s[j] == '/')))
      ++j;
    out.append(s.data() + i, j - i);
    if (j == s.size()) break;
    auto c = static_cast<unsigned char>(s[j]);
    const char esc[3] = {'%', kHex[c >> 4], kHex[c & 15]};
    out.append(esc, 3);
    i = j + 1;
  }
}

}  // namespace sluice
