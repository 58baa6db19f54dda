#include <gtest/gtest.h>

#include "api/http.h"
#include "common/metrics.h"

namespace sluice::api {
namespace {

HttpRequest Req(http::verb v, std::string target) {
  HttpRequest r;
  r.msg.method(v);
  r.msg.target(target);
  ParseTarget(target, r.path, r.query);
  return r;
}

Handler Named(std::string n) {
  return [n](const HttpRequest&) { return HttpResponse::Text(200, n, "text/plain"); };
}

class RouterTest : public ::testing::Test {
 protected:
  ThreadPool pool_{"t", 1};
  Router r_{"test", &pool_};

  // The route a request goes to, by its handler's answer; or the status of the router's own.
  std::string RouteOf(http::verb v, const std::string& target, HttpRequest* out = nullptr) {
    HttpRequest req = Req(v, target);
    auto m = r_.Find(req);
    if (out) *out = req;
    if (m.answer) return "status " + std::to_string(m.answer->status);
    return m.route->handler(req).body;
  }
};

TEST_F(RouterTest, ExactRoutesThenPatternsInOrder) {
  r_.Add(http::verb::get, "/v1/storages/vfs/{name}/files", Route{.handler = Named("files")});
  r_.Add(http::verb::get, "/v1/storages/vfs/special/files", Route{.handler = Named("exact")});
  r_.Add(http::verb::get, "/{bucket}", Route{.handler = Named("bucket")});
  r_.Add(http::verb::get, "/{bucket}/{key+}", Route{.handler = Named("object")});
  HttpRequest req;
  EXPECT_EQ(RouteOf(http::verb::get, "/v1/storages/vfs/local/files", &req), "files");
  EXPECT_EQ(req.Param("name"), "local");
  EXPECT_EQ(RouteOf(http::verb::get, "/v1/storages/vfs/special/files"), "exact");
  EXPECT_EQ(RouteOf(http::verb::get, "/b1", &req), "bucket");
  EXPECT_EQ(req.Param("bucket"), "b1");
  EXPECT_EQ(RouteOf(http::verb::get, "/b1/a/b%2Fc/d", &req), "object");
  EXPECT_EQ(req.Param("key"), "a/b/c/d");  // the decoded path
  EXPECT_EQ(RouteOf(http::verb::get, "/b1/", &req), "object");
  EXPECT_EQ(req.Param("key"), "");
  EXPECT_EQ(RouteOf(http::verb::get, "/v1/storages/vfs//files"),
            "object");  // {name} is never empty
  EXPECT_EQ(RouteOf(http::verb::get, "/"), "status 404");
}

TEST_F(RouterTest, SubResourcesByQueryKey) {
  r_.Add(http::verb::get, "/{bucket}", Route{.handler = Named("list")});
  r_.Add(http::verb::get, "/{bucket}", Route{.handler = Named("acl"), .query_key = "acl"});
  r_.Add(http::verb::get, "/{bucket}",
         Route{.handler = Named("versioning"), .query_key = "versioning"});
  EXPECT_EQ(RouteOf(http::verb::get, "/b"), "list");
  EXPECT_EQ(RouteOf(http::verb::get, "/b?acl"), "acl");
  EXPECT_EQ(RouteOf(http::verb::get, "/b?versioning="), "versioning");
  EXPECT_EQ(RouteOf(http::verb::get, "/b?prefix=x"), "list");
}

TEST_F(RouterTest, WrongMethodIs405AndOptionsListsMethods) {
  r_.Add(http::verb::get, "/x", Route{.handler = Named("get")});
  r_.Add(http::verb::post, "/x", Route{.handler = Named("post")});
  EXPECT_EQ(RouteOf(http::verb::delete_, "/x"), "status 405");
  HttpRequest req = Req(http::verb::options, "/x");
  auto m = r_.Find(req);
  ASSERT_TRUE(m.answer);
  EXPECT_EQ(m.answer->status, 204u);
  ASSERT_EQ(m.answer->headers.size(), 1u);
  EXPECT_EQ(m.answer->headers[0].second, "GET, POST");
  EXPECT_EQ(m.label, "/x");
}

TEST_F(RouterTest, GroupsAuthenticateTheirRoutesOnly) {
  RouteGroup secured = r_.Group([](HttpRequest& req) -> std::optional<HttpResponse> {
    if (req.msg["X-Key"] != "k") return ErrorResponse(Status(Code::kUnauthenticated, "no key"));
    req.ctx.principal.kind = "keyholder";
    return std::nullopt;
  });
  secured.Add(http::verb::get, "/private/{id}", Route{.handler = Named("private")});
  r_.Add(http::verb::get, "/public", Route{.handler = Named("public")});

  HttpRequest pub = Req(http::verb::get, "/public");
  auto m = r_.Find(pub);
  ASSERT_TRUE(m.route);
  EXPECT_FALSE(r_.Authenticate(*m.route, pub));

  HttpRequest anon = Req(http::verb::get, "/private/1");
  m = r_.Find(anon);
  ASSERT_TRUE(m.route);
  auto refused = r_.Authenticate(*m.route, anon);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403u);

  HttpRequest keyed = Req(http::verb::get, "/private/1");
  keyed.msg.set("X-Key", "k");
  m = r_.Find(keyed);
  EXPECT_FALSE(r_.Authenticate(*m.route, keyed));
  EXPECT_EQ(keyed.ctx.principal.kind, "keyholder");
  EXPECT_EQ(m.label, "/private/{id}");  // metrics see the pattern, never the path
}

TEST_F(RouterTest, ThrowingAuthenticatorIsA500NotACrash) {
  RouteGroup g = r_.Group(
      [](HttpRequest&) -> std::optional<HttpResponse> { throw std::runtime_error("boom"); });
  g.Add(http::verb::get, "/x", Route{.handler = Named("x")});
  HttpRequest req = Req(http::verb::get, "/x");
  auto m = r_.Find(req);
  auto res = r_.Authenticate(*m.route, req);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500u);
}

TEST_F(RouterTest, UnknownMethodsShareOneMetricsLabel) {
  EXPECT_EQ(MethodLabel(http::verb::get), "GET");
  EXPECT_EQ(MethodLabel(http::verb::unknown), "other");
}

TEST(RequestContext, CheckSaysWhenToStop) {
  RequestContext ctx;
  EXPECT_TRUE(ctx.Check().ok());
  ctx.cancelled = std::make_shared<std::atomic<bool>>(true);
  EXPECT_EQ(ctx.Check().code(), Code::kUnavailable);
  RequestContext late;
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  EXPECT_EQ(late.Check().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace sluice::api
