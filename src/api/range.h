// HTTP pieces of file downloads that face the network and so are parsed by hand with care:
// byte ranges (RFC 9110 §14), validators (ETag, Last-Modified, If-Range, If-None-Match) and the
// Content-Disposition header (RFC 6266 with the RFC 5987 `filename*` parameter).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::api {

struct ByteRange {
  uint64_t first = 0;
  uint64_t length = 0;  // > 0
  uint64_t last() const { return first + length - 1; }
  bool operator==(const ByteRange&) const = default;
};

struct RangeRequest {
  enum class Kind {
    kIgnore,         // no Range, a unit other than bytes, bad syntax, too many ranges: send 200
    kSatisfiable,    // send 206 with `ranges`
    kUnsatisfiable,  // send 416 with Content-Range: bytes */size
  };
  Kind kind = Kind::kIgnore;
  // The satisfiable ranges, clamped to the representation. In request order, unless some of them
  // overlap or touch: then sorted and coalesced (RFC 9110 §14.1.2 allows both).
  std::vector<ByteRange> ranges;
};

// Most ranges one request may ask for; more and the header is ignored (the whole file is sent).
inline constexpr size_t kMaxRanges = 64;

// Interprets a Range header value against a representation of `size` bytes. Syntax errors make
// the whole header ignored (RFC 9110 §14.2: a server MAY ignore it), as does a zero-length
// representation (no byte range of it can be expressed in Content-Range).
RangeRequest ParseRange(std::string_view header, uint64_t size, size_t max_ranges = kMaxRanges);

// IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT").
std::string FormatHttpDate(std::time_t t);
// The same into `buf`, which must hold kHttpDateSize bytes (four-digit years); returns the date.
inline constexpr size_t kHttpDateSize = 29;
std::string_view FormatHttpDate(std::time_t t, char* buf);
// Any of the three HTTP date formats (IMF-fixdate, RFC 850, asctime); nullopt when malformed.
std::optional<std::time_t> ParseHttpDate(std::string_view s);

// A strong entity tag from inode, size and modification time: "<ino>-<size>-<mtime ns>" in hex,
// quotes included.
std::string MakeETag(const struct stat& st);
// The same into `buf`, which must hold kMaxETagSize bytes; returns the tag.
inline constexpr size_t kMaxETagSize = 2 + 3 * 16 + 2;
std::string_view MakeETag(const struct stat& st, char* buf);
std::string_view MakeETag(uint64_t ino, uint64_t size, uint64_t mtime_ns, char* buf);

// If-Range (RFC 9110 §13.1.5): true when the range may be honoured. An entity tag must match
// `etag` strongly (weak tags never match), with or without its quotes; a date must equal
// `mtime` exactly.
bool IfRangeMatches(std::string_view if_range, std::string_view etag, std::time_t mtime);

// If-None-Match (RFC 9110 §13.1.2): true when `etag` matches one listed tag (weak comparison)
// or the value is "*".
// Tags are compared without their quotes too: S3 clients send ETags as listed, and some
// (the AWS Java SDK since 1.12.367) without quotes, which S3 matches.
bool IfNoneMatchMatches(std::string_view if_none_match, std::string_view etag);

// A tag without its weak prefix and its quotes.
std::string_view BareETag(std::string_view tag);

// `attachment; filename="<ascii>"; filename*=UTF-8''<percent-encoded>`. The plain parameter keeps
// the printable ASCII of `name` (quotes and backslashes escaped, others dropped); the extended one
// carries the whole name.
std::string ContentDisposition(std::string_view name);

}  // namespace sluice::api
