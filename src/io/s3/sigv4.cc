#include "io/s3/sigv4.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "common/crypto.h"
#include "common/secrets.h"

namespace sluice::io::s3 {

namespace {

// Header value as SigV4 canonicalizes it: trimmed, runs of spaces collapsed to one.
void AppendCanonicalValue(std::string& out, std::string_view v) {
  v = TrimBlanks(v);
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
}

}  // namespace

std::string AsciiLower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string_view TrimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Decoded (name, value) pairs of a raw query string, in order.
std::vector<std::pair<std::string, std::string>> DecodeQuery(std::string_view q) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    std::string_view k = part.substr(0, eq);
    std::string_view v = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    out.emplace_back(PercentDecode(k, true), PercentDecode(v, true));
  }
  return out;
}

namespace {
// Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar (H. Hinnant's
// days_from_civil): what timegm computes, without its time-zone machinery, per signed request.
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}
}  // namespace

std::optional<std::time_t> TimeFromFields(int year, int month, int day, int hour, int minute,
                                          int second) {
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60)
    return std::nullopt;
  // Days past the month's end (February 30th) run on into the next, as timegm's do.
  return static_cast<std::time_t>(DaysFromCivil(year, static_cast<unsigned>(month), 1) + day - 1) *
             86400 +
         hour * 3600 + minute * 60 + second;
}

std::optional<std::time_t> ParseAmzDate(std::string_view s) {
  if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') return std::nullopt;
  for (size_t i : {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14})
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
  auto num = [&](size_t at, size_t n) {
    int v = 0;
    for (size_t i = at; i < at + n; ++i) v = v * 10 + (s[i] - '0');
    return v;
  };
  // A date the calendar has (AWS refuses November 31st); TimeFromFields would roll it over.
  const int year = num(0, 4), month = num(4, 2), day = num(6, 2);
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  if (month < 1 || month > 12 || day > kDays[month - 1] || (month == 2 && day == 29 && !leap) ||
      num(13, 2) > 59)
    return std::nullopt;
  return TimeFromFields(year, month, day, num(9, 2), num(11, 2), num(13, 2));
}

namespace {

// Whether a header's name, lower-cased, is `lower` (as listed in SignedHeaders).
bool NameIs(std::string_view name, std::string_view lower) {
  if (name.size() != lower.size()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(name[i])) != lower[i]) return false;
  return true;
}

void AppendScope(std::string& out, const SigV4Auth& a) {
  out.append(a.date).push_back('/');
  out.append(a.region).push_back('/');
  out.append(a.service).append("/aws4_request");
}

}  // namespace

void AppendCanonicalRequest(std::string& out, const http::request_header<>& h,
                            std::string_view method, std::string_view path,
                            std::string_view raw_query, const SigV4Auth& auth) {
  out.append(method).push_back('\n');
  AppendUriEncoded(out, path.empty() ? std::string_view("/") : path, true);
  out.push_back('\n');
  // The query's pairs decoded, encoded again the S3 way and sorted, without an allocation per
  // pair: each is a span of one per-thread arena (every request is signed).
  struct Pair {
    uint32_t k, kn, v, vn;
  };
  thread_local std::string arena, decoded;
  thread_local std::vector<Pair> pairs;
  arena.clear();
  pairs.clear();
  auto encode = [&](std::string_view raw, uint32_t* at, uint32_t* n) {
    decoded.clear();
    // '+' is a space, as the listener decodes the query (api/http.cc ParseTarget) and as S3
    // does: what is signed is what the handler reads ("a+b" signs as "a%20b", "a%2Bb" as itself).
    AppendPercentDecoded(decoded, raw, true);
    *at = static_cast<uint32_t>(arena.size());
    AppendUriEncoded(arena, decoded, false);
    *n = static_cast<uint32_t>(arena.size()) - *at;
  };
  for (std::string_view q = raw_query; !q.empty();) {
    size_t amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    Pair p{};
    encode(part.substr(0, eq), &p.k, &p.kn);
    if (auth.presigned && std::string_view(arena).substr(p.k) == "X-Amz-Signature") {
      arena.resize(p.k);
      continue;
    }
    encode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1), &p.v, &p.vn);
    pairs.push_back(p);
  }
  auto key = [](const Pair& p) { return std::string_view(arena).substr(p.k, p.kn); };
  auto value = [](const Pair& p) { return std::string_view(arena).substr(p.v, p.vn); };
  std::sort(pairs.begin(), pairs.end(), [&](const Pair& a, const Pair& b) {
    int c = key(a).compare(key(b));
    return c != 0 ? c < 0 : value(a) < value(b);
  });
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i) out.push_back('&');
    out.append(key(pairs[i])).push_back('=');
    out.append(value(pairs[i]));
  }
  out.push_back('\n');
  for (const auto& name : auth.signed_headers) {
    out.append(name).push_back(':');
    bool first = true;
    for (const auto& f : h) {
      if (!NameIs(f.name_string(), name)) continue;
      if (!first) out.push_back(',');
      AppendCanonicalValue(out, f.value());
      first = false;
    }
    out.push_back('\n');
  }
  out.push_back('\n');
  for (size_t i = 0; i < auth.signed_headers.size(); ++i) {
    if (i) out.push_back(';');
    out.append(auth.signed_headers[i]);
  }
  out.push_back('\n');
  out.append(auth.payload_hash);
}

std::string CanonicalRequest(const http::request_header<>& h, std::string_view method,
                             std::string_view path, std::string_view raw_query,
                             const SigV4Auth& auth) {
  std::string out;
  out.reserve(512);
  AppendCanonicalRequest(out, h, method, path, raw_query, auth);
  return out;
}

void AppendStringToSign(std::string& out, const SigV4Auth& auth,
                        std::string_view canonical_request) {
  unsigned char hash[32];
  Sha256To(canonical_request, hash);
  char hex[64];
  HexEncodeTo(hash, sizeof hash, hex);
  out.append(kSigV4Algorithm).push_back('\n');
  out.append(auth.amz_date).push_back('\n');
  AppendScope(out, auth);
  out.push_back('\n');
  out.append(hex, sizeof hex);
}

std::string StringToSign(const SigV4Auth& auth, std::string_view canonical_request) {
  std::string out;
  AppendStringToSign(out, auth, canonical_request);
  return out;
}

bool SignatureMatches(std::string_view signing_key, const SigV4Auth& auth,
                      std::string_view canonical_request, std::string_view signature) {
  thread_local std::string sts;
  sts.clear();
  AppendStringToSign(sts, auth, canonical_request);
  unsigned char mac[32];
  HmacSha256To(signing_key, sts, mac);
  char hex[64];
  HexEncodeTo(mac, sizeof mac, hex);
  return ConstantTimeEqualsFixed(std::string_view(hex, sizeof hex), signature);
}

std::string SigningKey(std::string_view secret, std::string_view date, std::string_view region,
                       std::string_view service) {
  std::string k = HmacSha256("AWS4" + std::string(secret), date);
  k = HmacSha256(k, region);
  k = HmacSha256(k, service);
  return HmacSha256(k, "aws4_request");
}

std::string SignatureOf(std::string_view signing_key, std::string_view string_to_sign) {
  return HexEncode(HmacSha256(signing_key, string_to_sign));
}

std::string ChunkStringToSign(const SigV4Auth& auth, std::string_view previous_signature,
                              std::string_view chunk_sha256_hex) {
  return fmt::format("AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{}\n{}", auth.amz_date, auth.scope(),
                     previous_signature, kEmptySha256, chunk_sha256_hex);
}

std::string TrailerStringToSign(const SigV4Auth& auth, std::string_view previous_signature,
                                std::string_view trailer_sha256_hex) {
  return fmt::format("AWS4-HMAC-SHA256-TRAILER\n{}\n{}\n{}\n{}", auth.amz_date, auth.scope(),
                     previous_signature, trailer_sha256_hex);
}

std::string FormatAmzDate(std::time_t t) {
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string SignRequest(http::request_header<>& h, std::string_view method, std::string_view path,
                        std::string_view raw_query, std::string_view payload_hash,
                        const Credentials& creds, std::time_t now, SigningKeyCache* cache) {
  SigV4Auth a;
  a.amz_date = FormatAmzDate(now);
  a.date = a.amz_date.substr(0, 8);
  a.region = creds.region;
  a.service = "s3";
  a.payload_hash = payload_hash;
  h.set("x-amz-date", a.amz_date);
  h.set("x-amz-content-sha256", payload_hash);
  for (const auto& f : h) {
    std::string name = AsciiLower(f.name_string());
    if (name == "host" || name == "content-md5" || name == "content-type" ||
        name.rfind("x-amz-", 0) == 0)
      a.signed_headers.push_back(std::move(name));
  }
  std::sort(a.signed_headers.begin(), a.signed_headers.end());
  a.signed_headers.erase(std::unique(a.signed_headers.begin(), a.signed_headers.end()),
                         a.signed_headers.end());
  std::string sts = StringToSign(a, CanonicalRequest(h, method, path, raw_query, a));
  SigningKeyCache own;
  SigningKeyCache& k = cache ? *cache : own;
  if (k.key.empty() || k.date != a.date || k.region != a.region || k.secret != creds.secret_key)
    k = {a.date, a.region, creds.secret_key,
         SigningKey(creds.secret_key, a.date, a.region, a.service)};
  std::string sig = SignatureOf(k.key, sts);
  std::string signed_list;
  for (const auto& n : a.signed_headers) {
    if (!signed_list.empty()) signed_list.push_back(';');
    signed_list += n;
  }
  h.set(http::field::authorization,
        fmt::format("{} Credential={}/{}, SignedHeaders={}, Signature={}", kSigV4Algorithm,
                    creds.access_key, a.scope(), signed_list, sig));
  return sig;
}

}  // namespace sluice::io::s3
