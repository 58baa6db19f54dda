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
#include <variant>
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
  // More header lines, already formatted ("Name: value\r\n" each) and written after `headers`:
  // lets a hot path build its header in one piece.
  std::string header_lines;
  // When valid, the response body is [file_offset, file_offset + file_length) of this file,
  // sent zero-copy where the transport allows; `body` is ignored.
  std::shared_ptr<UniqueFd> file;
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

// Receives a request body piece by piece, for routes whose bodies are too large to buffer
// (uploads). Every call runs on the worker pool, one at a time, in order.
class BodySink {
 public:
  virtual ~BodySink() = default;
  // Consumes the next piece of the body; an error ends the request with that error.
  virtual Status Write(const char* data, size_t n) = 0;
  // The whole body has arrived.
  virtual HttpResponse Finish() = 0;
  // The connection failed before the body was complete (client gone, timeout).
  virtual void Abort(const Status& why) = 0;
};

// What a streaming route answers once the headers are in: a response now (an error, say), or a
// sink for the body.
using StreamStart = std::variant<HttpResponse, std::unique_ptr<BodySink>>;
using StreamHandler = std::function<StreamStart(const HttpRequest&)>;

struct Route {
  std::string name;  // route pattern, the metrics label
  Handler handler;
  bool blocking = true;    // run on the worker pool, never on an event loop
  bool needs_auth = true;  // manager token required
  // When set, the route streams its request body: `stream` runs (on the pool) once the headers
  // are read, with an empty body in the request; `handler` is not used.
  StreamHandler stream;
  // When set on a blocking route, runs first on the event loop, where it must not block (no
  // I/O: Lookup::kCachedOnly lookups, no reads). It answers, or returns nullopt to hand the
  // request to `handler` on the pool. Saves two thread hops on hot read paths.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> try_inline;
};

class Router {
 public:
  // `listener` labels metrics; `pool` runs blocking handlers.
  Router(std::string listener, ThreadPool* pool) : listener_(std::move(listener)), pool_(pool) {}

  void Add(http::verb method, const std::string& path, Route route);
  // Requests to routes that need auth must carry `header` equal to `secret`.
  void RequireToken(std::string header, std::string secret);
  // CORS headers: the listener adds them to every response to a request that carries an
  // Origin header (a browser's cross-origin request), as aiohttp_cors does for the original.
  void AddCorsHeader(std::string name, std::string value);
  const std::vector<std::pair<std::string, std::string>>& cors_headers() const {
    return cors_headers_;
  }

  // Calls `done` exactly once, on any thread.
  void Dispatch(std::shared_ptr<HttpRequest> req, Responder done) const;

  // True when `method path` is a streaming route (its body must not be buffered).
  bool IsStreaming(http::verb method, const std::string& path) const;
  // For a streaming route: runs its StreamHandler on the pool and calls `done` once with the
  // outcome. `req` holds the headers only.
  void OpenStream(std::shared_ptr<HttpRequest> req, std::function<void(StreamStart)> done) const;
  // Records a finished request whose response did not come from Dispatch.
  void Observe(std::string_view method, std::string_view route, unsigned status,
               double started) const;

  ThreadPool* pool() const { return pool_; }

 private:
  HttpResponse Run(const Route& route, const HttpRequest& req) const;
  std::optional<HttpResponse> RunInline(const Route& route, const HttpRequest& req) const;
  const Route* Find(http::verb method, const std::string& path) const;

  std::string listener_;
  ThreadPool* pool_;
  std::map<std::string, std::map<http::verb, Route>> routes_;
  std::string auth_header_;
  std::string auth_secret_;
  std::vector<std::pair<std::string, std::string>> cors_headers_;
};

}  // namespace sluice::api
