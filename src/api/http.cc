#include "api/http.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/json.h"
#include "common/metrics.h"
#include "common/secrets.h"

namespace sluice::api {

HttpResponse HttpResponse::Json(unsigned status, const nlohmann::json& j) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

HttpResponse HttpResponse::NoContent() {
  HttpResponse r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

HttpResponse HttpResponse::Text(unsigned status, std::string body, std::string content_type) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

namespace {

// Backend.AI's answer for an error: HTTP status, problem type (below
// https://api.backend.ai/probs/storage/), title and error code, as its storage proxy's errors
// package spells them. The manager picks its exception from the error code's domain and the
// status: only `quota-scope` 404 is QuotaScopeNotFoundError, a missing or `vfolder` code is a
// VFolder* error by status, any other domain is "unexpected".
struct Problem {
  int status;
  std::string_view type, title, error_code;  // empty error_code: the reference sends none
};

Problem ProblemOf(const Status& st) {
  switch (st.subject()) {
    case Subject::kVolume:
      if (st.code() == Code::kNotFound)
        return {400, "volume/invalid", "Invalid Volume", "storage_access_invalid-parameters"};
      break;
    case Subject::kQuotaScope:
      if (st.code() == Code::kNotFound)
        return {404, "quota/scope/not-found", "Quota Scope Not Found",
                "quota-scope_read_not-found"};
      if (st.code() == Code::kAlreadyExists)
        return {409, "quota/scope/already-exists", "Quota Scope Already Exists",
                "quota-scope_create_already-exists"};
      if (st.code() == Code::kNotEmpty)
        return {409, "quota-directory-not-empty", "Quota Scope Not Empty",
                "quota-scope_purge_conflict"};
      break;
    case Subject::kVFolder:
      if (st.code() == Code::kNotFound)
        return {404, "vfolder/not-found", "VFolder Not Found", "vfolder_read_not-found"};
      if (st.code() == Code::kAlreadyExists)
        return {409, "vfolder/already-exists", "VFolder Already Exists",
                "vfolder_create_already-exists"};
      break;
    case Subject::kUnspecified:
      break;
  }
  int status = CodeHttpStatus(st.code());
  switch (st.code()) {
    case Code::kInvalidPath:
      return {status, "subpath/invalid", "Invalid Subpath", "vfolder_access_invalid-parameters"};
    case Code::kInvalidArgument:
      // Request validation: the reference's invalid-api-params carries no code, which the
      // manager reads as VFolderBadRequest (a code of any other domain would be a 500 there).
      return {status, "invalid-api-params", "Invalid API parameters", ""};
    case Code::kUnauthenticated:
    case Code::kPermissionDenied:
      return {status, "forbidden", "Forbidden", ""};
    case Code::kNotFound:
      return {status, "file-not-found", "File not found", ""};
    case Code::kConflict:
      return {status, "conflict", "Conflict", "storage-proxy_update_conflict"};
    case Code::kUnsupported:
      return {status, "api/not-implemented", "API Not Implemented",
              "storage-proxy_request_not-implemented"};
    case Code::kUnavailable:
      return {status, "unavailable", "Service Unavailable", "storage-proxy_generic_unavailable"};
    case Code::kIoError:
    case Code::kInternal:
    case Code::kNoSpace:
      return {status, "generic", "Storage Proxy Error", "storage-proxy_generic_internal-error"};
    default:
      break;
  }
  return {status, "", "", ""};
}

}  // namespace

HttpResponse ErrorResponse(const Status& st, const std::vector<std::string>& paths,
                           unsigned status) {
  Problem p = ProblemOf(st);
  if (status) p.status = static_cast<int>(status);
  std::string name(CodeName(st.code()));
  nlohmann::json j = {{"type", "https://api.backend.ai/probs/storage/" +
                                   (p.type.empty() ? name : std::string(p.type))},
                      {"title", p.title.empty() ? name : std::string(p.title)},
                      {"status", p.status},
                      {"msg", st.message()}};
  if (!p.error_code.empty()) j["error_code"] = p.error_code;
  if (st.has_sys_errno() || p.status == 400) {
    j["errno"] = st.sys_errno();
    j["paths"] = paths;
  }
  HttpResponse r = HttpResponse::Json(static_cast<unsigned>(p.status), j);
  r.content_type = "application/problem+json";
  if (r.status == 503) r.headers.emplace_back("Retry-After", "1");  // shed, or an origin away
  return r;
}

HttpResponse FileError(const Status& st, const std::vector<std::string>& paths) {
  if (st.subject() == Subject::kUnspecified) {
    switch (st.code()) {
      case Code::kNotFound:
      case Code::kAlreadyExists:
      case Code::kNotEmpty:
      case Code::kPermissionDenied:
        return ErrorResponse(st, paths, 400);
      default:
        break;
    }
  }
  return ErrorResponse(st, paths);
}

void ParseTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query, std::string_view skip_prefix) {
  size_t q = target.find('?');
  path = PercentDecode(target.substr(0, q), false);
  if (q == std::string_view::npos) return;
  std::string_view qs = target.substr(q + 1);
  while (!qs.empty()) {
    size_t amp = qs.find('&');
    std::string_view kv = qs.substr(0, amp);
    size_t eq = kv.find('=');
    std::string k = PercentDecode(kv.substr(0, eq), true);
    if (!k.empty() && (skip_prefix.empty() || k.compare(0, skip_prefix.size(), skip_prefix) != 0))
      query.insert_or_assign(std::move(k), eq == std::string_view::npos
                                               ? std::string()
                                               : PercentDecode(kv.substr(eq + 1), true));
    if (amp == std::string_view::npos) break;
    qs = qs.substr(amp + 1);
  }
}

Result<Params> Params::From(const HttpRequest& req) {
  Params p;
  for (const auto& [k, v] : req.query) p.j_[k] = v;
  const std::string& body = req.msg.body();
  bool blank = true;
  for (char c : body)
    if (!std::isspace(static_cast<unsigned char>(c))) blank = false;
  if (!blank) {
    SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "request body"));
    if (!j.is_object()) return Status(Code::kInvalidArgument, "request body must be a JSON object");
    for (auto& [k, v] : j.items()) p.j_[k] = v;
  }
  return p;
}

bool Params::Has(const std::string& key) const {
  return j_.contains(key) && !j_[key].is_null();
}

Result<std::string> Params::Str(const std::string& key) const {
  if (!Has(key))
    return Status(Code::kInvalidArgument, fmt::format("parameter '{}' is required", key));
  const auto& v = j_[key];
  if (!v.is_string())
    return Status(Code::kInvalidArgument, fmt::format("parameter '{}' must be a string", key));
  return v.get<std::string>();
}

Result<std::optional<std::string>> Params::OptStr(const std::string& key) const {
  if (!Has(key)) return std::optional<std::string>();
  SLUICE_ASSIGN_OR_RETURN(std::string v, Str(key));
  return std::optional<std::string>(std::move(v));
}

Result<std::string> Params::StrOr(const std::string& key, std::string def) const {
  if (!Has(key)) return def;
  return Str(key);
}

Result<bool> Params::Bool(const std::string& key, bool def) const {
  if (!Has(key)) return def;
  const auto& v = j_[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "1" || s == "yes") return true;
    if (s == "false" || s == "0" || s == "no") return false;
  }
  return Status(Code::kInvalidArgument, fmt::format("parameter '{}' must be true or false", key));
}

Result<std::optional<uint64_t>> Params::OptUint(const std::string& key) const {
  if (!Has(key)) return std::optional<uint64_t>();
  const auto& v = j_[key];
  if (v.is_number_unsigned()) return std::optional<uint64_t>(v.get<uint64_t>());
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return std::optional<uint64_t>(static_cast<uint64_t>(v.get<int64_t>()));
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0' && errno == 0 && s[0] != '-')
      return std::optional<uint64_t>(static_cast<uint64_t>(n));
  }
  return Status(Code::kInvalidArgument,
                fmt::format("parameter '{}' must be a non-negative integer", key));
}

Result<std::vector<std::string>> Params::StrList(const std::string& key) const {
  if (!Has(key))
    return Status(Code::kInvalidArgument, fmt::format("parameter '{}' is required", key));
  const auto& v = j_[key];
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
    return out;
  }
  if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_string())
        return Status(Code::kInvalidArgument,
                      fmt::format("parameter '{}' must be a list of strings", key));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  return Status(Code::kInvalidArgument,
                fmt::format("parameter '{}' must be a string or a list of strings", key));
}

std::string_view HttpRequest::Param(std::string_view name) const {
  for (const auto& [k, v] : params)
    if (k == name) return v;
  return {};
}

HttpResponse BodySink::Fail(const Status& error) {
  Abort(error);
  return ErrorResponse(error);
}

std::string_view MethodLabel(http::verb method) {
  if (method == http::verb::unknown) return "other";
  auto s = http::to_string(method);
  return {s.data(), s.size()};
}

void RouteGroup::Add(http::verb method, const std::string& pattern, Route route) {
  route.auth = auth_;
  router_.Add(method, pattern, std::move(route));
}

namespace {

// "/a/{b}/{c+}" -> {"a", "{b}", "{c+}"}; a pattern without braces is an exact path.
std::vector<std::string> PatternSegments(std::string_view pattern) {
  std::vector<std::string> out;
  size_t i = pattern.empty() || pattern[0] != '/' ? 0 : 1;
  while (i <= pattern.size()) {
    size_t j = pattern.find('/', i);
    if (j == std::string_view::npos) j = pattern.size();
    out.emplace_back(pattern.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

bool IsParam(std::string_view seg) {
  return seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
}

}  // namespace

void Router::Add(http::verb method, const std::string& pattern, Route route) {
  route.name = pattern;
  if (pattern.find('{') == std::string::npos) {
    auto& routes = exact_[pattern][method];
    // Sub-resource routes first: they are the more specific.
    routes.insert(route.query_key.empty() ? routes.end() : routes.begin(), std::move(route));
    return;
  }
  for (auto& [text, p] : patterns_) {
    if (text != pattern) continue;
    auto& routes = p.methods[method];
    routes.insert(route.query_key.empty() ? routes.end() : routes.begin(), std::move(route));
    return;
  }
  PatternRoute p;
  p.segments = PatternSegments(pattern);
  p.methods[method].push_back(std::move(route));
  patterns_.emplace_back(pattern, std::move(p));
}

void Router::AddCorsHeader(std::string name, std::string value) {
  cors_headers_.emplace_back(std::move(name), std::move(value));
}

bool Router::MatchPattern(const PatternRoute& p, std::string_view path,
                          std::vector<std::pair<std::string, std::string>>* params) {
  if (path.empty() || path[0] != '/') return false;
  size_t pos = 1;
  for (size_t i = 0; i < p.segments.size(); ++i) {
    std::string_view seg = p.segments[i];
    const bool last = i + 1 == p.segments.size();
    if (last && IsParam(seg) && seg[seg.size() - 2] == '+') {  // the rest of the path
      params->emplace_back(std::string(seg.substr(1, seg.size() - 3)),
                           std::string(path.substr(std::min(pos, path.size()))));
      return true;
    }
    if (pos > path.size()) return false;
    size_t end = path.find('/', pos);
    if (end == std::string_view::npos) end = path.size();
    std::string_view got = path.substr(pos, end - pos);
    if (IsParam(seg)) {
      if (got.empty()) return false;
      params->emplace_back(std::string(seg.substr(1, seg.size() - 2)), std::string(got));
    } else if (got != seg) {
      return false;
    }
    pos = end + 1;
    if (last) return end == path.size();
  }
  return false;
}

HttpResponse Router::Error(const Status& st, unsigned status, std::string_view resource) const {
  if (error_format_) return error_format_(st, status, resource);
  return ErrorResponse(st, {}, status);
}

Router::Match Router::Choose(const MethodRoutes& methods, const std::string& label,
                             HttpRequest& req) const {
  Match m;
  m.label = label;
  auto mit = methods.find(req.msg.method());
  if (mit != methods.end()) {
    for (const Route& r : mit->second)
      if (r.query_key.empty() || req.query.count(r.query_key)) {
        if (r.query_key.empty() && !req.query.empty())
          for (const auto& k : unsupported_query_keys_)
            if (req.query.count(k)) {
              m.answer =
                  Error(Status(Code::kUnsupported, fmt::format("'{}' is not implemented here", k)),
                        501, req.path);
              return m;
            }
        m.route = &r;
        return m;
      }
  }
  if (req.msg.method() == http::verb::options) {
    HttpResponse r = HttpResponse::NoContent();
    std::string allow;
    for (const auto& [verb, rt] : methods) {
      if (!allow.empty()) allow += ", ";
      allow += std::string(http::to_string(verb));
    }
    r.headers.emplace_back("Allow", allow);
    m.answer = std::move(r);
    return m;
  }
  m.answer = Error(
      Status(Code::kInvalidArgument, fmt::format("method {} is not allowed on '{}'",
                                                 std::string(req.msg.method_string()), req.path)),
      405, req.path);
  return m;
}

Router::Match Router::Find(HttpRequest& req) const {
  if (rewrite_) rewrite_(req);
  if (auto it = exact_.find(req.path); it != exact_.end())
    return Choose(it->second, it->first, req);
  for (const auto& [text, p] : patterns_) {
    req.params.clear();
    if (MatchPattern(p, req.path, &req.params)) return Choose(p.methods, text, req);
  }
  req.params.clear();
  Match m;
  m.label = "unmatched";
  m.answer =
      Error(Status(Code::kNotFound, fmt::format("no route for '{}'", req.path)), 0, req.path);
  return m;
}

std::optional<HttpResponse> Router::Authenticate(const Route& route, HttpRequest& req) const {
  if (!route.auth) return std::nullopt;
  try {
    return (*route.auth)(req);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: authenticator failed: {}", std::string(req.msg.method_string()),
                  route.name, e.what());
    return Error(Status(Code::kInternal, "internal error while authenticating"));
  }
}

HttpResponse Router::Run(const Route& route, const HttpRequest& req) const {
  try {
    return route.handler(req);
  } catch (const nlohmann::json::exception& e) {
    return Error(Status(Code::kInvalidArgument, fmt::format("bad parameter: {}", e.what())));
  } catch (const std::exception& e) {
    spdlog::error("{} {}: unexpected exception: {}", std::string(req.msg.method_string()),
                  route.name, e.what());
    return Error(Status(Code::kInternal, fmt::format("internal error: {}", e.what())));
  }
}

std::optional<HttpResponse> Router::RunInline(const Route& route, const HttpRequest& req) const {
  try {
    return route.try_inline(req);
  } catch (const std::exception& e) {
    return std::nullopt;  // the pool runs the request again and reports the error
  }
}

void Router::Observe(http::verb method, std::string_view route, unsigned status,
                     double started) const {
  Metrics::Global().ObserveRequest(listener_, MethodLabel(method), route, static_cast<int>(status),
                                   MonotonicSeconds() - started);
}

void Router::OpenStream(const Route& route, std::shared_ptr<HttpRequest> req,
                        std::function<void(StreamStart)> done) const {
  auto shared_done = std::make_shared<std::function<void(StreamStart)>>(std::move(done));
  auto run = [this, &route, req, shared_done] {
    StreamStart start;
    try {
      start = route.stream(*req);
    } catch (const std::exception& e) {
      spdlog::error("{} {}: unexpected exception: {}", std::string(req->msg.method_string()),
                    route.name, e.what());
      start = Error(Status(Code::kInternal, fmt::format("internal error: {}", e.what())));
    }
    (*shared_done)(std::move(start));
  };
  if (!pool_->Submit(run)) {
    (*shared_done)(Error(Status(Code::kUnavailable, "server is overloaded; retry later")));
  }
}

void Router::Dispatch(const Route& route, std::shared_ptr<HttpRequest> req, Responder done) const {
  if (!route.blocking) {
    done(Run(route, *req));
    return;
  }
  if (route.try_inline) {
    if (auto res = RunInline(route, *req)) {
      done(std::move(*res));
      return;
    }
  }
  auto shared_done = std::make_shared<Responder>(std::move(done));
  bool queued =
      pool_->Submit([this, &route, req, shared_done] { (*shared_done)(Run(route, *req)); });
  if (!queued)
    (*shared_done)(Error(Status(Code::kUnavailable, "server is overloaded; retry later")));
}

}  // namespace sluice::api
