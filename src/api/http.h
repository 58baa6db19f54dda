// HTTP plumbing shared by every listener: the request handed to handlers, the response they
// return, parameter extraction (JSON body merged with the query string), error mapping from
// Status to problem+json, and a router that runs blocking handlers on a worker pool.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "common/status.h"
#include "common/thread_pool.h"

namespace sluice::api {

namespace http = boost::beast::http;

struct HttpRequest {
  http::request<http::string_body> msg;
  std::string path;                          // decoded target path, no query
  std::map<std::string, std::string> query;  // decoded; the last value of a repeated key wins
  std::string remote;                        // peer address, for logs
};

struct HttpResponse {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // When valid, the response body is [file_offset, file_offset + file_length) of this file,
  // sent zero-copy where the transport allows; `body` is ignored.
  std::shared_ptr<UniqueFd> file;
  uint64_t file_offset = 0;
  uint64_t file_length = 0;

  static HttpResponse Json(unsigned status, const nlohmann::json& j);
  static HttpResponse NoContent();
  static HttpResponse Text(unsigned status, std::string body, std::string content_type);
};

// The problem+json answer for a failed Status. Filesystem errors carry errno and paths.
HttpResponse ErrorResponse(const Status& st, const std::vector<std::string>& paths = {});

std::string PercentDecode(std::string_view s, bool plus_is_space);
// Splits "/a/b?x=1&y=2" into path and query.
void ParseTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query);

// Request parameters: the JSON object body (also on GET) merged with the query string; the body
// wins. Accessors return kInvalidArgument naming the parameter on a missing or bad value.
class Params {
 public:
  static Result<Params> From(const HttpRequest& req);

  bool Has(const std::string& key) const;
  Result<std::string> Str(const std::string& key) const;
  std::optional<std::string> OptStr(const std::string& key) const;
  Result<bool> Bool(const std::string& key, bool def) const;
  Result<std::optional<uint64_t>> OptUint(const std::string& key) const;
  // A string or a list of strings; a single string becomes a one-element list.
  Result<std::vector<std::string>> StrList(const std::string& key) const;
  const nlohmann::json& json() const { return j_; }

 private:
  nlohmann::json j_ = nlohmann::json::object();
};

using Handler = std::function<HttpResponse(const HttpRequest&)>;
using Responder = std::function<void(HttpResponse)>;

struct Route {
  std::string name;  // route pattern, the metrics label
  Handler handler;
  bool blocking = true;    // run on the worker pool, never on an event loop
  bool needs_auth = true;  // manager token required
};

class Router {
 public:
  // `listener` labels metrics; `pool` runs blocking handlers.
  Router(std::string listener, ThreadPool* pool) : listener_(std::move(listener)), pool_(pool) {}

  void Add(http::verb method, const std::string& path, Route route);
  // Requests to routes that need auth must carry `header` equal to `secret`.
  void RequireToken(std::string header, std::string secret);
  // Extra headers on every response (CORS, say).
  void AddDefaultHeader(std::string name, std::string value);

  // Calls `done` exactly once, on any thread.
  void Dispatch(std::shared_ptr<HttpRequest> req, Responder done) const;

 private:
  HttpResponse Run(const Route& route, const HttpRequest& req) const;

  std::string listener_;
  ThreadPool* pool_;
  std::map<std::string, std::map<http::verb, Route>> routes_;
  std::string auth_header_;
  std::string auth_secret_;
  std::vector<std::pair<std::string, std::string>> default_headers_;
};

}  // namespace sluice::api
