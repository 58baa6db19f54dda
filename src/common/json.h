// JSON from untrusted text. nlohmann's parser recurses once per nesting level, so a body of a
// few hundred kilobytes of '[' overflows a thread's stack; every JSON that comes from outside
// (request bodies, token claims, files others can write) is parsed through here, which refuses
// nesting deeper than a limit before the parser sees the text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace sluice {

// Nesting depth allowed in every JSON body (objects and arrays together).
inline constexpr size_t kMaxJsonDepth = 400;

// The deepest nesting of arrays and objects in `text` (strings and escapes skipped), stopping as
// soon as it passes `stop_after`. Linear, no allocation.
size_t JsonNestingDepth(std::string_view text, size_t stop_after = kMaxJsonDepth);

// A bound on the values in `text`: one more than its openings and separators ('{', '[', ','),
// strings skipped, stopping as soon as it passes `stop_after`. Linear, no allocation.
size_t JsonValueBound(std::string_view text, size_t stop_after);

// Parses `text`; kInvalidArgument naming `what` when it is not valid JSON, nests deeper than
// `max_depth` or holds more than `max_values` values (checked before parsing: a parsed document
// costs tens of bytes a value, so 16 MiB of "{}," would take half a gigabyte).
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what,
                                 size_t max_depth = kMaxJsonDepth, size_t max_values = SIZE_MAX);

// Bytes that are not valid UTF-8 become U+FFFD (JSON text, ZIP and pax names, events: every
// reader can decode them).
std::string SanitizeUtf8(std::string_view s);
// Whether every byte is below 0x80 (then already valid UTF-8, and a ustar name as it is).
bool IsAscii(std::string_view s);

}  // namespace sluice
