#include "api/range.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace sluice::api {

namespace {

constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

bool IsOws(char c) {
  return c == ' ' || c == '\t';
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsOws(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsOws(s.back())) s.remove_suffix(1);
  return s;
}

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// 1*DIGIT, saturating at the largest uint64_t (a huge first-pos is still well-formed; it is just
// beyond any file). nullopt when `s` is empty or holds anything but digits.
std::optional<uint64_t> ParseDigits(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t v = 0;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = static_cast<uint64_t>(c - '0');
    v = v > (kMax - d) / 10 ? kMax : v * 10 + d;
  }
  return v;
}

int MonthIndex(const char* m) {
  for (int i = 0; i < 12; ++i)
    if (std::strcmp(m, kMonths[i]) == 0) return i;
  return -1;
}

std::optional<std::time_t> MakeTime(int year, int mon, int day, int h, int m, int s) {
  if (mon < 0 || day < 1 || day > 31 || h < 0 || h > 23 || m < 0 || m > 59 || s < 0 || s > 60 ||
      year < 1900)
    return std::nullopt;
  struct tm tm {};
  tm.tm_year = year - 1900;
  tm.tm_mon = mon;
  tm.tm_mday = day;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = s;
  return timegm(&tm);
}

std::string_view StripWeak(std::string_view tag) {
  if (tag.size() >= 2 && tag[0] == 'W' && tag[1] == '/') tag.remove_prefix(2);
  return tag;
}

}  // namespace

RangeRequest ParseRange(std::string_view header, uint64_t size, size_t max_ranges) {
  RangeRequest out;
  header = Trim(header);
  size_t eq = header.find('=');
  if (eq == std::string_view::npos || !IEquals(Trim(header.substr(0, eq)), "bytes")) return out;
  if (size == 0) return out;
  std::string_view set = header.substr(eq + 1);
  std::vector<ByteRange> ranges;
  size_t specs = 0;
  while (true) {
    size_t comma = set.find(',');
    std::string_view spec = Trim(set.substr(0, comma));
    if (!spec.empty()) {  // empty list elements are allowed (RFC 9110 §5.6.1)
      if (++specs > max_ranges) return out;
      size_t dash = spec.find('-');
      if (dash == std::string_view::npos) return out;
      std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
      if (a.empty()) {  // suffix-range: the last b bytes
        auto n = ParseDigits(b);
        if (!n) return out;
        if (*n > 0) {
          uint64_t len = std::min(*n, size);
          ranges.push_back({size - len, len});
        }
      } else {
        auto first = ParseDigits(a);
        if (!first) return out;
        uint64_t last = std::numeric_limits<uint64_t>::max();
        if (!b.empty()) {
          auto l = ParseDigits(b);
          if (!l || *l < *first) return out;  // last-pos before first-pos: invalid
          last = *l;
        }
        if (*first < size) {
          last = std::min(last, size - 1);
          ranges.push_back({*first, last - *first + 1});
        }
      }
    }
    if (comma == std::string_view::npos) break;
    set.remove_prefix(comma + 1);
  }
  if (specs == 0) return out;
  if (ranges.empty()) {
    out.kind = RangeRequest::Kind::kUnsatisfiable;
    return out;
  }
  if (ranges.size() > 1) {
    std::vector<ByteRange> sorted = ranges;
    std::sort(sorted.begin(), sorted.end(),
              [](const ByteRange& x, const ByteRange& y) { return x.first < y.first; });
    bool overlap = false;
    for (size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i].first <= sorted[i - 1].last() + 1) overlap = true;
    if (overlap) {
      ranges.clear();
      for (const auto& r : sorted) {
        if (!ranges.empty() && r.first <= ranges.back().last() + 1) {
          uint64_t last = std::max(ranges.back().last(), r.last());
          ranges.back().length = last - ranges.back().first + 1;
        } else {
          ranges.push_back(r);
        }
      }
    }
  }
  out.kind = RangeRequest::Kind::kSatisfiable;
  out.ranges = std::move(ranges);
  return out;
}

namespace {

// Days since 1970-01-01 to (year, month 1-12, day 1-31), proleptic Gregorian (H. Hinnant's
// civil_from_days): gmtime_r takes glibc's time zone lock, which the event loops would share.
void CivilFromDays(int64_t z, int64_t& y, unsigned& m, unsigned& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = static_cast<int64_t>(yoe) + era * 400 + (m <= 2);
}

}  // namespace

std::string_view FormatHttpDate(std::time_t t, char* buf) {
  int64_t days = t / 86400, secs = t % 86400;
  if (secs < 0) {
    secs += 86400;
    --days;
  }
  int64_t y;
  unsigned mon, mday;
  CivilFromDays(days, y, mon, mday);
  const int64_t wday = ((days % 7) + 11) % 7;  // 1970-01-01 was a Thursday
  const int year = static_cast<int>(std::clamp<int64_t>(y, 0, 9999));
  auto two = [](char* p, int64_t v) {
    p[0] = static_cast<char>('0' + v / 10);
    p[1] = static_cast<char>('0' + v % 10);
  };
  // "Sun, 06 Nov 1994 08:49:37 GMT", written by hand: it is on every file response.
  std::memcpy(buf, kDays[wday], 3);
  std::memcpy(buf + 3, ", ", 2);
  two(buf + 5, mday);
  buf[7] = ' ';
  std::memcpy(buf + 8, kMonths[mon - 1], 3);
  buf[11] = ' ';
  two(buf + 12, year / 100);
  two(buf + 14, year % 100);
  buf[16] = ' ';
  two(buf + 17, secs / 3600);
  buf[19] = ':';
  two(buf + 20, secs / 60 % 60);
  buf[22] = ':';
  two(buf + 23, secs % 60);
  std::memcpy(buf + 25, " GMT", 4);
  return {buf, kHttpDateSize};
}

std::string FormatHttpDate(std::time_t t) {
  char buf[kHttpDateSize];
  return std::string(FormatHttpDate(t, buf));
}

std::optional<std::time_t> ParseHttpDate(std::string_view sv) {
  std::string s(Trim(sv));
  if (s.size() > 64) return std::nullopt;
  char wd[16] = {}, mon[4] = {}, tz[4] = {};
  int day = 0, year = 0, h = 0, m = 0, sec = 0, end = 0;
  size_t comma = s.find(',');
  if (comma != std::string::npos) {
    const char* rest = s.c_str() + comma + 1;
    // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
    if (std::sscanf(rest, " %2d %3s %4d %2d:%2d:%2d %3s%n", &day, mon, &year, &h, &m, &sec, tz,
                    &end) == 7 &&
        rest[end] == '\0' && std::strcmp(tz, "GMT") == 0 && comma == 3)
      return MakeTime(year, MonthIndex(mon), day, h, m, sec);
    // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
    end = 0;
    if (std::sscanf(rest, " %2d-%3s-%2d %2d:%2d:%2d %3s%n", &day, mon, &year, &h, &m, &sec, tz,
                    &end) == 7 &&
        rest[end] == '\0' && std::strcmp(tz, "GMT") == 0) {
      year += year < 70 ? 2000 : 1900;
      return MakeTime(year, MonthIndex(mon), day, h, m, sec);
    }
    return std::nullopt;
  }
  // asctime: "Sun Nov  6 08:49:37 1994"
  if (std::sscanf(s.c_str(), "%3s %3s %2d %2d:%2d:%2d %4d%n", wd, mon, &day, &h, &m, &sec, &year,
                  &end) == 7 &&
      s[static_cast<size_t>(end)] == '\0')
    return MakeTime(year, MonthIndex(mon), day, h, m, sec);
  return std::nullopt;
}

std::string_view MakeETag(const struct stat& st, char* buf) {
  uint64_t ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                static_cast<uint64_t>(st.st_mtim.tv_nsec);
  return MakeETag(static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size), ns, buf);
}

std::string_view MakeETag(uint64_t ino, uint64_t size, uint64_t ns, char* buf) {
  char* p = buf;
  *p++ = '"';
  p = std::to_chars(p, buf + kMaxETagSize, ino, 16).ptr;
  *p++ = '-';
  p = std::to_chars(p, buf + kMaxETagSize, size, 16).ptr;
  *p++ = '-';
  p = std::to_chars(p, buf + kMaxETagSize, ns, 16).ptr;
  *p++ = '"';
  return {buf, static_cast<size_t>(p - buf)};
}

std::string MakeETag(const struct stat& st) {
  char buf[kMaxETagSize];
  return std::string(MakeETag(st, buf));
}

std::string_view BareETag(std::string_view tag) {
  tag = StripWeak(Trim(tag));
  if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"')
    tag = tag.substr(1, tag.size() - 2);
  return tag;
}

bool IfRangeMatches(std::string_view if_range, std::string_view etag, std::time_t mtime) {
  if_range = Trim(if_range);
  if (if_range.empty()) return false;
  if (if_range.substr(0, 2) == "W/") return false;  // weak tags never match strongly
  if (if_range.front() != '"')
    if (auto t = ParseHttpDate(if_range)) return *t == mtime;
  return BareETag(if_range) == BareETag(etag);
}

bool IfNoneMatchMatches(std::string_view v, std::string_view etag) {
  v = Trim(v);
  if (v == "*") return true;
  std::string_view mine = BareETag(etag);
  while (!v.empty()) {
    size_t comma = v.find(',');
    std::string_view tag = Trim(v.substr(0, comma));
    if (!tag.empty() && BareETag(tag) == mine) return true;
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return false;
}

std::string ContentDisposition(std::string_view name) {
  std::string ascii;
  for (char c : name) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7e) continue;
    if (c == '"' || c == '\\') ascii += '\\';
    ascii += c;
  }
  if (ascii.empty()) ascii = "download";
  std::string enc;
  for (char c : name) {
    unsigned char u = static_cast<unsigned char>(c);
    bool attr_char = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                     std::strchr("!#$&+-.^_`|~", c) != nullptr;
    if (attr_char && c != '\0')
      enc += c;
    else
      enc += fmt::format("%{:02X}", u);
  }
  return fmt::format("attachment; filename=\"{}\"; filename*=UTF-8''{}", ascii, enc);
}

}  // namespace sluice::api
