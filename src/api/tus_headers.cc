#include "api/tus_headers.h"

#include <charconv>

#include <fmt/format.h>

namespace sluice::api {

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Result<std::optional<std::string_view>> SingleHeader(const HttpRequest& req,
                                                     std::string_view name) {
  if (req.msg.count(name) > 1)
    return Status(Code::kInvalidArgument, fmt::format("header {} appears more than once", name));
  auto it = req.msg.find(name);
  if (it == req.msg.end()) return std::optional<std::string_view>();
  return std::optional<std::string_view>(TrimOws(it->value()));
}

Result<uint64_t> ParseCount(std::string_view v, std::string_view what) {
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || v.front() == '+' ||
      v.front() == '-')
    return Status(Code::kInvalidArgument,
                  fmt::format("{} must be a non-negative decimal integer, not '{}'", what, v));
  return out;
}

}  // namespace sluice::api
