#include "api/http.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
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

HttpResponse ErrorResponse(const Status& st, const std::vector<std::string>& paths) {
  int http_status = CodeHttpStatus(st.code());
  std::string name(CodeName(st.code()));
  nlohmann::json j = {{"type", "https://api.backend.ai/probs/storage/" + name},
                      {"title", name},
                      {"status", http_status},
                      {"msg", st.message()}};
  if (st.has_sys_errno() || http_status == 400) {
    j["errno"] = st.sys_errno();
    j["paths"] = paths;
  }
  HttpResponse r = HttpResponse::Json(static_cast<unsigned>(http_status), j);
  r.content_type = "application/problem+json";
  return r;
}

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
  out.reserve(s.size());
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
  return out;
}

void ParseTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query) {
  size_t q = target.find('?');
  path = PercentDecode(target.substr(0, q), false);
  if (q == std::string_view::npos) return;
  std::string_view qs = target.substr(q + 1);
  while (!qs.empty()) {
    size_t amp = qs.find('&');
    std::string_view kv = qs.substr(0, amp);
    size_t eq = kv.find('=');
    std::string k = PercentDecode(kv.substr(0, eq), true);
    std::string v = eq == std::string_view::npos ? "" : PercentDecode(kv.substr(eq + 1), true);
    if (!k.empty()) query.insert_or_assign(std::move(k), std::move(v));
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
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded()) return Status(Code::kInvalidArgument, "request body is not valid JSON");
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

std::optional<std::string> Params::OptStr(const std::string& key) const {
  if (!Has(key) || !j_[key].is_string()) return std::nullopt;
  return j_[key].get<std::string>();
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

void Router::Add(http::verb method, const std::string& path, Route route) {
  routes_[path][method] = std::move(route);
}

void Router::RequireToken(std::string header, std::string secret) {
  auth_header_ = std::move(header);
  auth_secret_ = std::move(secret);
}

void Router::AddCorsHeader(std::string name, std::string value) {
  cors_headers_.emplace_back(std::move(name), std::move(value));
}

HttpResponse Router::Run(const Route& route, const HttpRequest& req) const {
  try {
    return route.handler(req);
  } catch (const nlohmann::json::exception& e) {
    return ErrorResponse(
        Status(Code::kInvalidArgument, fmt::format("bad parameter: {}", e.what())));
  } catch (const std::exception& e) {
    spdlog::error("{} {}: unexpected exception: {}", req.msg.method_string(), req.path, e.what());
    return ErrorResponse(Status(Code::kInternal, fmt::format("internal error: {}", e.what())));
  }
}

std::optional<HttpResponse> Router::RunInline(const Route& route, const HttpRequest& req) const {
  try {
    return route.try_inline(req);
  } catch (const std::exception& e) {
    return std::nullopt;  // the pool runs the request again and reports the error
  }
}

void Router::Observe(std::string_view method, std::string_view route, unsigned status,
                     double started) const {
  Metrics::Global().ObserveRequest(listener_, method, route, static_cast<int>(status),
                                   MonotonicSeconds() - started);
}

const Route* Router::Find(http::verb method, const std::string& path) const {
  auto pit = routes_.find(path);
  if (pit == routes_.end()) return nullptr;
  auto mit = pit->second.find(method);
  return mit == pit->second.end() ? nullptr : &mit->second;
}

bool Router::IsStreaming(http::verb method, const std::string& path) const {
  const Route* r = Find(method, path);
  return r && r->stream;
}

void Router::OpenStream(std::shared_ptr<HttpRequest> req,
                        std::function<void(StreamStart)> done) const {
  const Route* route = Find(req->msg.method(), req->path);
  auto shared_done = std::make_shared<std::function<void(StreamStart)>>(std::move(done));
  auto run = [this, route, req, shared_done] {
    StreamStart start;
    try {
      start = route->stream(*req);
    } catch (const std::exception& e) {
      spdlog::error("{} {}: unexpected exception: {}", req->msg.method_string(), req->path,
                    e.what());
      start = ErrorResponse(Status(Code::kInternal, fmt::format("internal error: {}", e.what())));
    }
    (*shared_done)(std::move(start));
  };
  if (!pool_->Submit(run)) {
    (*shared_done)(ErrorResponse(Status(Code::kUnavailable, "server is overloaded; retry later")));
  }
}

void Router::Dispatch(std::shared_ptr<HttpRequest> req, Responder done) const {
  double t0 = MonotonicSeconds();
  std::string method(req->msg.method_string());
  auto finish = [this, t0, method, done = std::move(done)](std::string route_name,
                                                           HttpResponse res) {
    Observe(method, route_name, res.status, t0);
    done(std::move(res));
  };

  auto pit = routes_.find(req->path);
  if (pit == routes_.end()) {
    finish("unmatched",
           ErrorResponse(Status(Code::kNotFound, fmt::format("no route for '{}'", req->path))));
    return;
  }
  auto mit = pit->second.find(req->msg.method());
  if (mit == pit->second.end()) {
    if (req->msg.method() == http::verb::options) {
      HttpResponse r = HttpResponse::NoContent();
      std::string allow;
      for (const auto& [verb, rt] : pit->second) {
        if (!allow.empty()) allow += ", ";
        allow += std::string(http::to_string(verb));
      }
      r.headers.emplace_back("Allow", allow);
      finish(req->path, std::move(r));
      return;
    }
    HttpResponse r =
        ErrorResponse(Status(Code::kInvalidArgument,
                             fmt::format("method {} is not allowed on '{}'", method, req->path)));
    r.status = 405;
    finish(req->path, std::move(r));
    return;
  }
  const Route& route = mit->second;
  if (route.needs_auth && !auth_header_.empty()) {
    auto it = req->msg.find(auth_header_);
    std::string_view got = it == req->msg.end() ? std::string_view() : it->value();
    if (!ConstantTimeEquals(got, auth_secret_)) {
      HttpResponse r = ErrorResponse(
          Status(Code::kUnauthenticated, it == req->msg.end()
                                             ? fmt::format("missing {} header", auth_header_)
                                             : fmt::format("invalid {} header", auth_header_)));
      finish(route.name, std::move(r));
      return;
    }
  }
  if (!route.blocking) {
    finish(route.name, Run(route, *req));
    return;
  }
  if (route.try_inline) {
    if (auto res = RunInline(route, *req)) {
      finish(route.name, std::move(*res));
      return;
    }
  }
  auto shared_finish = std::make_shared<decltype(finish)>(std::move(finish));
  bool queued = pool_->Submit(
      [this, &route, req, shared_finish] { (*shared_finish)(route.name, Run(route, *req)); });
  if (!queued)
    (*shared_finish)(
        route.name, ErrorResponse(Status(Code::kUnavailable, "server is overloaded; retry later")));
}

}  // namespace sluice::api
