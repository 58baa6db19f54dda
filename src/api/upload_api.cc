// Client-facing uploads: the tus 1.0.0 core protocol on /upload (Backend.AI storage-proxy
// compatible). Sessions are created by the manager (POST /folder/file/upload), which hands out
// a token with claims {op: "upload", volume, vfid, relpath, size, session, exp}.
//
//   OPTIONS /upload          Tus-Version, Tus-Max-Size (= max-upload-size), CORS preflight
//   HEAD    /upload?token=…  Upload-Offset (durable bytes), Upload-Length, Cache-Control: no-store
//   PATCH   /upload?token=…  appends the body at Upload-Offset; 204 with the new Upload-Offset
//
// The body of a PATCH streams to the staging file through a BodySink (never buffered whole);
// the session logic (durable offsets, the one-writer lock, completion) is service/upload.h.
#include <charconv>
#include <limits>

#include <boost/beast/core/string.hpp>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/client_api.h"
#include "api/tus_headers.h"
#include "service/storage_service.h"
#include "service/upload.h"

namespace sluice::api {

namespace {

constexpr const char* kTusVersion = "1.0.0";
constexpr const char* kOffsetType = "application/offset+octet-stream";
constexpr const char* kTusRequestHeaders =
    "Tus-Resumable, Upload-Length, Upload-Metadata, Upload-Offset, Content-Type";

void AddTus(HttpResponse& r) {
  r.headers.emplace_back("Tus-Resumable", kTusVersion);
}

HttpResponse TusError(const Status& st, std::optional<uint64_t> offset = std::nullopt) {
  HttpResponse r = ErrorResponse(st);
  AddTus(r);
  if (offset) r.headers.emplace_back("Upload-Offset", std::to_string(*offset));
  return r;
}

// A problem+json answer with a status that no Status code maps to (412, 415).
HttpResponse Problem(unsigned status, std::string_view title, std::string msg) {
  HttpResponse r = HttpResponse::Json(
      status, {{"type", fmt::format("https://api.backend.ai/probs/storage/{}", title)},
               {"title", title},
               {"status", status},
               {"msg", std::move(msg)}});
  r.content_type = "application/problem+json";
  AddTus(r);
  return r;
}

// 412 for a Tus-Resumable that is not ours (empty: none sent), naming the one we speak.
HttpResponse WrongTusVersion(std::string_view sent) {
  HttpResponse r = Problem(412, "PreconditionFailed",
                           sent.empty() ? std::string("the Tus-Resumable header is required")
                                        : fmt::format("Tus-Resumable {} is not supported", sent));
  r.headers.emplace_back("Tus-Version", kTusVersion);
  return r;
}

std::optional<std::string> DstDir(const HttpRequest& req) {
  auto it = req.query.find("dst_dir");
  if (it == req.query.end()) return std::nullopt;
  return it->second;
}

// The session a request's token names, or the response that refuses it.
struct Resolved {
  UploadTarget target;
  std::optional<HttpResponse> refusal;
};

// The authenticator of the tus routes: the upload token's claims go into the request's
// context. Refusals carry Tus-Resumable like every tus answer.
Authenticator UploadTokenAuth(const TokenService* tokens) {
  return [tokens](HttpRequest& req) -> std::optional<HttpResponse> {
    auto tok = req.query.find("token");
    auto grant = tokens->VerifyUpload(tok == req.query.end() ? "" : tok->second);
    if (!grant.ok()) return TusError(grant.status());
    req.ctx.principal.kind = "token";
    req.ctx.principal.grant = std::make_shared<const UploadGrant>(std::move(grant).value());
    return std::nullopt;
  };
}

Resolved Resolve(const HttpRequest& req, const UploadService& uploads) {
  Resolved out;
  const auto& grant = *static_cast<const UploadGrant*>(req.ctx.principal.grant.get());
  auto t = uploads.ResolveGrant(grant, DstDir(req));
  if (!t.ok()) {
    out.refusal = TusError(t.status());
    return out;
  }
  out.target = std::move(t).value();
  return out;
}

// Streams one PATCH body into the session.
class TusSink : public BodySink {
 public:
  explicit TusSink(std::unique_ptr<UploadWriter> w) : w_(std::move(w)) {}

  Status Write(const char* data, size_t n) override { return w_->Write(data, n); }

  HttpResponse Finish() override {
    finished_ = true;
    auto off = w_->Finish();
    if (!off.ok()) return TusError(off.status(), w_->durable_offset());
    HttpResponse r = HttpResponse::NoContent();
    AddTus(r);
    r.headers.emplace_back("Upload-Offset", std::to_string(*off));
    return r;
  }

  void Abort(const Status& why) override {
    if (finished_) return;  // Finish failed; it has settled the session already
    w_->Abort();
    spdlog::info("upload PATCH ended early ({}); {} bytes durable", why.message(),
                 w_->durable_offset());
  }

  // A failed write (EDQUOT, ENOSPC, EIO): the client learns the durable offset to resume from.
  HttpResponse Fail(const Status& error) override {
    Abort(error);
    return TusError(error, w_->durable_offset());
  }

 private:
  std::unique_ptr<UploadWriter> w_;
  bool finished_ = false;
};

}  // namespace

void AddUploadRoutes(Router& router, StorageService* service) {
  auto uploads = std::make_shared<UploadService>(service);
  const uint64_t max_size = service->config().max_upload_size;
  RouteGroup tus = router.Group(UploadTokenAuth(&service->tokens()));

  router.Add(http::verb::options, "/upload",
             Route{.handler =
                       [max_size](const HttpRequest&) {
                         HttpResponse r = HttpResponse::NoContent();
                         AddTus(r);
                         r.headers.emplace_back("Tus-Version", kTusVersion);
                         r.headers.emplace_back("Tus-Max-Size", std::to_string(max_size));
                         r.headers.emplace_back("Access-Control-Allow-Methods",
                                                "OPTIONS, HEAD, PATCH");
                         r.headers.emplace_back("Access-Control-Allow-Headers", kTusRequestHeaders);
                         r.headers.emplace_back("Access-Control-Max-Age", "86400");
                         return r;
                       },
                   .blocking = false,
                   .body_limit = 0});

  tus.Add(http::verb::head, "/upload",
          Route{.handler =
                    [uploads](const HttpRequest& req) {
                      // A version named and not ours is refused before anything is done (a
                      // HEAD may commit a complete upload). None named is taken, as clients of
                      // Backend.AI's storage proxy may send none.
                      auto resumable = SingleHeader(req, "Tus-Resumable");
                      if (!resumable.ok()) return TusError(resumable.status());
                      if (*resumable && **resumable != kTusVersion)
                        return WrongTusVersion(**resumable);
                      Resolved r = Resolve(req, *uploads);
                      if (r.refusal) return std::move(*r.refusal);
                      auto p = uploads->Query(r.target);
                      if (!p.ok()) return TusError(p.status());
                      HttpResponse res = HttpResponse::NoContent();
                      res.status = 200;
                      AddTus(res);
                      res.headers.emplace_back("Upload-Offset", std::to_string(p->offset));
                      res.headers.emplace_back("Upload-Length", std::to_string(p->size));
                      res.headers.emplace_back("Cache-Control", "no-store");
                      return res;
                    },
                .body_limit = 0});

  tus.Add(
      http::verb::patch, "/upload",
      Route{.stream = [uploads](const HttpRequest& req) -> StreamStart {
        // Protocol checks first: they need no disk access.
        auto resumable = SingleHeader(req, "Tus-Resumable");
        if (!resumable.ok()) return TusError(resumable.status());
        if (!*resumable || **resumable != kTusVersion)
          return WrongTusVersion(*resumable ? **resumable : std::string_view());
        auto ctype = SingleHeader(req, "Content-Type");
        if (!ctype.ok()) return TusError(ctype.status());
        std::string_view media =
            *ctype ? TrimOws((*ctype)->substr(0, (*ctype)->find(';'))) : std::string_view();
        if (!boost::beast::iequals(media, kOffsetType))
          return Problem(415, "UnsupportedMediaType",
                         fmt::format("Content-Type must be {}", kOffsetType));
        auto off_h = SingleHeader(req, "Upload-Offset");
        if (!off_h.ok()) return TusError(off_h.status());
        if (!*off_h)
          return TusError(Status(Code::kInvalidArgument, "the Upload-Offset header is required"));
        auto offset = ParseCount(**off_h, "Upload-Offset");
        if (!offset.ok()) return TusError(offset.status());
        std::optional<uint64_t> body_len;
        if (req.msg.find(http::field::content_length) != req.msg.end()) {
          auto cl = SingleHeader(req, "Content-Length");
          if (!cl.ok()) return TusError(cl.status());
          auto n = ParseCount(**cl, "Content-Length");
          if (!n.ok()) return TusError(n.status());
          body_len = *n;
        }

        Resolved r = Resolve(req, *uploads);
        if (r.refusal) return std::move(*r.refusal);
        const UploadTarget& t = r.target;
        auto len_h = SingleHeader(req, "Upload-Length");
        if (!len_h.ok()) return TusError(len_h.status());
        if (*len_h) {
          auto len = ParseCount(**len_h, "Upload-Length");
          if (!len.ok()) return TusError(len.status());
          if (*len != t.size)
            return TusError(
                Status(Code::kInvalidArgument,
                       fmt::format("Upload-Length {} differs from the session's length {}", *len,
                                   t.size)));
        }
        // (An offset past the length is a mismatch with the session's offset, which BeginWrite
        // answers with 409 and that offset, as tus requires.)
        if (*offset <= t.size && body_len && *body_len > t.size - *offset)
          return TusError(Status(
              Code::kTooLarge, fmt::format("{} bytes at offset {} run past the upload's length {}",
                                           body_len.value_or(0), *offset, t.size)));

        constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();
        uint64_t current = kUnknown;
        auto w = uploads->BeginWrite(t, *offset, &current);
        if (!w.ok())
          return TusError(w.status(),
                          current != kUnknown ? std::optional<uint64_t>(current) : std::nullopt);
        return std::unique_ptr<BodySink>(new TusSink(std::move(w).value()));
      }});
}

}  // namespace sluice::api
