// Percent-encoding of URL parts: the lenient decoder every listener uses for targets and query
// strings, and S3's strict encoder (SigV4 canonical requests, listing keys, client URLs).
#pragma once

#include <string>
#include <string_view>

namespace sluice {

// %XX decoded (malformed escapes kept as they are); '+' becomes ' ' when `plus_is_space`.
std::string PercentDecode(std::string_view s, bool plus_is_space);
// The same, appended to `out`.
void AppendPercentDecoded(std::string& out, std::string_view s, bool plus_is_space);

// S3's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ as %XX (upper case); '/' kept when
// `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);
// The same, appended to `out`.
void AppendUriEncoded(std::string& out, std::string_view s, bool keep_slash);

}  // namespace sluice
