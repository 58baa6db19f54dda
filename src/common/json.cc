#include "common/json.h"

#include <fmt/format.h>

namespace sluice {

size_t JsonNestingDepth(std::string_view text, size_t stop_after) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > stop_after) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what, size_t max_depth) {
  if (JsonNestingDepth(text, max_depth) > max_depth)
    return Status(Code::kInvalidArgument,
                  fmt::format("{} nests deeper than {} levels", what, max_depth));
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Status(Code::kInvalidArgument, fmt::format("{} is not valid JSON", what));
  return j;
}

}  // namespace sluice
