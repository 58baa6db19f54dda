// HTTP plumbing shared by every listener: the request handed to handlers, the response they
// return, parameter extraction (JSON body merged with the query string), error mapping from
// Status to problem+json, and a router that runs blocking handlers on a worker pool.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "common/request_context.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/uri.h"

namespace sluice {
class FileReader;  // volume/volume.h
}

namespace sluice::api {

namespace http = boost::beast::http;

struct HttpRequest {
  http::request<http::string_body> msg;
  std::string path;                          // decoded target path, no query
  std::map<std::string, std::string> query;  // decoded; the last value of a repeated key wins
  // Values of the matched route's {parameters}, in pattern order.
  std::vector<std::pair<std::string, std::string>> params;
  std::string remote;  // peer address, for logs
  RequestContext ctx;
  // Holds the body's share of the listener's buffered-body budget while the request lives.
  std::shared_ptr<void> body_lease;

  // The value of path parameter `name` ("" when the route has none of that name).
  std::string_view Param(std::string_view name) const;
};

struct HttpResponse {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // More header lines, already formatted ("Name: value\r\n" each) and written after `headers`:
  // lets a hot path build its header in one piece.
  std::string header_lines;
  // When set, the response body is [file_offset, file_offset + file_length) of this file, sent
  // zero-copy where the file is local and the transport allows (from the page cache on the event
  // loop, the rest read on the I/O pool); `body` is ignored.
  std::shared_ptr<FileReader> file;
  uint64_t file_offset = 0;
  uint64_t file_length = 0;
  // When set (and `file` is not), the body is produced by calls to `generator` on the worker
  // pool and sent with chunked transfer encoding: each call fills up to `cap` bytes of `buf` and
  // returns how many it wrote, 0 at the end. An error aborts the connection, so the client sees
  // a truncated body, never a wrong one.
  std::function<Result<size_t>(char* buf, size_t cap)> generator;

  static HttpResponse Json(unsigned status, const nlohmann::json& j);
  static HttpResponse NoContent();
  static HttpResponse Text(unsigned status, std::string body, std::string content_type);
};

// The problem+json answer for a failed Status, with Backend.AI's problem type, title and
// error_code; `status` (when not 0) replaces the HTTP status the error maps to, and the body's
// `status` says the same. Filesystem errors carry errno and paths.
HttpResponse ErrorResponse(const Status& st, const std::vector<std::string>& paths = {},
                           unsigned status = 0);

// A failed file operation (inside a vfolder, or a VFS storage). Backend.AI's proxy answers every
// filesystem error there with 400 {msg, errno, paths}, which the manager reads as
// VFolderBadRequest; a 404 would read as "no such vfolder", a 403 as a refused token and a 409
// as a failed operation. Missing vfolders, volumes and server-side failures keep their own
// answers.
HttpResponse FileError(const Status& st, const std::vector<std::string>& paths);

// In handlers: declares `lhs` from a Result, or returns its error as the problem+json answer.
#define API_ASSIGN_OR_RESPOND(lhs, expr)                                        \
  auto SLUICE_CONCAT(_r_, __LINE__) = (expr);                                   \
  if (!SLUICE_CONCAT(_r_, __LINE__).ok())                                       \
    return ::sluice::api::ErrorResponse(SLUICE_CONCAT(_r_, __LINE__).status()); \
  lhs = std::move(SLUICE_CONCAT(_r_, __LINE__)).value()

// In handlers: returns a failed Status as the problem+json answer.
#define API_RETURN_IF_ERROR(expr)                          \
  do {                                                     \
    ::sluice::Status _s = (expr);                          \
    if (!_s.ok()) return ::sluice::api::ErrorResponse(_s); \
  } while (0)

using sluice::PercentDecode;
// Splits "/a/b?x=1&y=2" into path and query. Parameters whose (decoded) names start with
// `skip_prefix`, when it is not empty, are left out (the S3 listener's presigned X-Amz-*: its
// authenticator reads them from the raw target, and nothing else does).
void ParseTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query, std::string_view skip_prefix = {});

// Request parameters: the JSON object body (also on GET) merged with the query string; the body
// wins. Accessors return kInvalidArgument naming the parameter on a missing or bad value.
class Params {
 public:
  static Result<Params> From(const HttpRequest& req);

  bool Has(const std::string& key) const;
  Result<std::string> Str(const std::string& key) const;
  // Missing or null: nullopt (StrOr: `def`). Any other value that is not a string is an
  // error, never taken as missing (a misspelt type must not widen what a call does).
  Result<std::optional<std::string>> OptStr(const std::string& key) const;
  Result<std::string> StrOr(const std::string& key, std::string def) const;
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

// Receives a request body piece by piece, for routes whose bodies are too large to buffer
// (uploads). Every call runs on the worker pool, one at a time, in order.
class BodySink {
 public:
  virtual ~BodySink() = default;
  // Consumes the next piece of the body; an error ends the request with Fail(error).
  virtual Status Write(const char* data, size_t n) = 0;
  // The whole body has arrived.
  virtual HttpResponse Finish() = 0;
  // The connection failed before the body was complete (client gone, timeout).
  virtual void Abort(const Status& why) = 0;
  // The request ends with `error` (a failed Write, an overloaded pool): settles the sink as Abort
  // does and returns the answer. The default answers ErrorResponse(error).
  virtual HttpResponse Fail(const Status& error);
};

// What a streaming route answers once the headers are in: a response now (an error, say), or a
// sink for the body.
using StreamStart = std::variant<HttpResponse, std::unique_ptr<BodySink>>;
using StreamHandler = std::function<StreamStart(const HttpRequest&)>;

// Decides on the header alone, on the event loop (no I/O), whether a request may go on: nullopt
// lets it through, having filled req.ctx.principal; a response refuses it, and its body is then
// never read.
using Authenticator = std::function<std::optional<HttpResponse>(HttpRequest&)>;

struct Route {
  std::string name;  // set by Router::Add to the route's pattern: the metrics label
  Handler handler;
  bool blocking = true;  // run on the worker pool, never on an event loop
  // Null: public. Routes get it from the RouteGroup they are added through.
  std::shared_ptr<const Authenticator> auth;
  // The largest request body the route accepts (413 beyond it, decided from Content-Length
  // before any of it is read); unset: the listener's max-request-body.
  std::optional<uint64_t> body_limit;
  // When set, the route streams its request body: `stream` runs (on the pool) once the headers
  // are read and authenticated, with an empty body in the request; `handler` is not used.
  StreamHandler stream;
  // When set on a blocking route, runs first on the event loop, where it must not block (no
  // I/O: Lookup::kCachedOnly lookups, no reads). It answers, or returns nullopt to hand the
  // request to `handler` on the pool. Saves two thread hops on hot read paths.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> try_inline;
  // A sub-resource: the route matches only requests whose query has this key (S3's `?acl`,
  // `?uploads`). Such routes are tried before the plain route of the same pattern.
  std::string query_key;
};

class Router;

// Routes that share an authenticator (the manager token, download tokens, SigV4).
class RouteGroup {
 public:
  RouteGroup(Router& router, std::shared_ptr<const Authenticator> auth)
      : router_(router), auth_(std::move(auth)) {}
  void Add(http::verb method, const std::string& pattern, Route route);

 private:
  Router& router_;
  std::shared_ptr<const Authenticator> auth_;
};

// Routes requests by method and path. A pattern is an exact path ("/folder/usage") or has
// parameters: "{name}" takes one path segment, a final "{name+}" the rest of the path (possibly
// empty). Exact paths are found first, then patterns in the order they were added.
class Router {
 public:
  // `listener` labels metrics; `pool` runs blocking handlers.
  Router(std::string listener, ThreadPool* pool) : listener_(std::move(listener)), pool_(pool) {}

  // A public route.
  void Add(http::verb method, const std::string& pattern, Route route);
  RouteGroup Group(Authenticator auth) {
    return RouteGroup(*this, std::make_shared<const Authenticator>(std::move(auth)));
  }
  // CORS headers: the listener adds them to every response to a request that carries an
  // Origin header (a browser's cross-origin request), as aiohttp_cors does for the original.
  void AddCorsHeader(std::string name, std::string value);
  const std::vector<std::pair<std::string, std::string>>& cors_headers() const {
    return cors_headers_;
  }
  // How this listener words the errors it makes itself (no route, method not allowed, a request
  // that cannot be parsed, overload): problem+json by default, as the Backend.AI APIs do; the S3
  // listener answers S3 XML. `status` 0: the code's own; `resource`: the request path.
  using ErrorFormatter =
      std::function<HttpResponse(const Status& st, unsigned status, std::string_view resource)>;
  void SetErrorFormatter(ErrorFormatter f) { error_format_ = std::move(f); }
  // Runs on every request before it is routed: may change its path (the S3 listener's
  // virtual-hosted buckets, named by the Host header).
  void SetRewrite(std::function<void(HttpRequest&)> f) { rewrite_ = std::move(f); }
  // Query parameters this listener's handlers never see in req.query (ParseTarget).
  void SetQuerySkipPrefix(std::string prefix) { query_skip_prefix_ = std::move(prefix); }
  // Query keys that name operations this router does not serve (S3's ?tagging, say): a request
  // carrying one is answered 501 instead of reaching the plain route of its path, which would
  // do something else with it (DELETE /b/k?tagging is not DELETE /b/k).
  void SetUnsupportedQueryKeys(std::vector<std::string> keys) {
    unsupported_query_keys_ = std::move(keys);
  }
  std::string_view query_skip_prefix() const { return query_skip_prefix_; }
  HttpResponse Error(const Status& st, unsigned status = 0, std::string_view resource = {}) const;

  // What a request whose header is in goes to: its route (req.params filled), or the answer
  // when there is none (404, 405, OPTIONS). `label` names it in metrics either way.
  struct Match {
    const Route* route = nullptr;
    std::optional<HttpResponse> answer;
    std::string_view label;
  };
  Match Find(HttpRequest& req) const;
  // Runs the route's authenticator: nullopt to go on, or the refusal.
  std::optional<HttpResponse> Authenticate(const Route& route, HttpRequest& req) const;

  // Runs the route's handler (inline, or on the pool for a blocking route) and calls `done`
  // exactly once, on any thread.
  void Dispatch(const Route& route, std::shared_ptr<HttpRequest> req, Responder done) const;
  // For a streaming route: runs its StreamHandler on the pool and calls `done` once with the
  // outcome. `req` holds the headers only.
  void OpenStream(const Route& route, std::shared_ptr<HttpRequest> req,
                  std::function<void(StreamStart)> done) const;
  // Records a finished request. The method label is the method, or "other" for one HTTP does
  // not define: every label set stays bounded whatever clients send.
  void Observe(http::verb method, std::string_view route, unsigned status, double started) const;

  ThreadPool* pool() const { return pool_; }

 private:
  struct PatternRoute {
    std::vector<std::string> segments;  // literal, "{name}", or a final "{name+}"
    std::map<http::verb, std::vector<Route>> methods;
  };
  using MethodRoutes = std::map<http::verb, std::vector<Route>>;

  HttpResponse Run(const Route& route, const HttpRequest& req) const;
  std::optional<HttpResponse> RunInline(const Route& route, const HttpRequest& req) const;
  static bool MatchPattern(const PatternRoute& p, std::string_view path,
                           std::vector<std::pair<std::string, std::string>>* params);
  Match Choose(const MethodRoutes& methods, const std::string& label, HttpRequest& req) const;

  std::string listener_;
  ThreadPool* pool_;
  std::map<std::string, MethodRoutes, std::less<>> exact_;
  std::vector<std::pair<std::string, PatternRoute>> patterns_;  // pattern text, parsed
  std::vector<std::pair<std::string, std::string>> cors_headers_;
  ErrorFormatter error_format_;
  std::function<void(HttpRequest&)> rewrite_;
  std::string query_skip_prefix_;
  std::vector<std::string> unsupported_query_keys_;
};

// The method as a metrics label: its name, or "other" for an extension method.
std::string_view MethodLabel(http::verb method);

}  // namespace sluice::api
