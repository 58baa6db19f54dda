#include "api/s3/s3_admin_api.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/crypto.h"
#include "service/s3/objects.h"
#include "service/s3/s3_store.h"
#include "service/storage_service.h"

namespace sluice::api {

namespace {

// A user's default quota scope when none is given: "user:<uuid>" derived from the user id, so
// every node (and every re-creation) derives the same one.
std::string DerivedScope(const std::string& user) {
  std::string h = HexEncode(Sha256("sluice-s3-user:" + user)).substr(0, 32);
  return "user:" + h;
}

HttpResponse Created(const nlohmann::json& j) {
  return HttpResponse::Json(201, j);
}

}  // namespace

void AddS3AdminRoutes(RouteGroup& g, StorageService* svc, S3Store* store) {
  using V = http::verb;
  g.Add(V::post, "/s3/users", Route{.handler = [svc, store](const HttpRequest& req) {
          API_ASSIGN_OR_RESPOND(Params p, Params::From(req));
          S3User u;
          API_ASSIGN_OR_RESPOND(u.id, p.Str("id"));
          API_ASSIGN_OR_RESPOND(u.display_name, p.StrOr("display_name", u.id));
          API_ASSIGN_OR_RESPOND(std::optional<std::string> volume, p.OptStr("volume"));
          if (volume) {
            u.default_volume = *volume;
          } else {
            auto vols = svc->Volumes();
            if (vols.empty())
              return ErrorResponse(Status(Code::kInvalidArgument, "no volume to put buckets on"));
            u.default_volume = vols.front()->name();
          }
          API_RETURN_IF_ERROR(svc->GetVolume(u.default_volume).status());
          API_ASSIGN_OR_RESPOND(u.default_scope, p.StrOr("quota_scope", DerivedScope(u.id)));
          API_ASSIGN_OR_RESPOND(auto qsid, QuotaScopeId::Parse(u.default_scope));
          u.default_scope = qsid.ToString();
          API_RETURN_IF_ERROR(store->CreateUser(u));
          API_ASSIGN_OR_RESPOND(S3User made, store->GetUser(u.id));
          return Created(made.ToJson());
        }});
  g.Add(V::get, "/s3/users", Route{.handler = [store](const HttpRequest&) {
          nlohmann::json a = nlohmann::json::array();
          for (const auto& u : store->Users()) a.push_back(u.ToJson());
          return HttpResponse::Json(200, {{"users", a}});
        }});
  g.Add(V::delete_, "/s3/users/{id}", Route{.handler = [store](const HttpRequest& req) {
          API_RETURN_IF_ERROR(store->DeleteUser(std::string(req.Param("id"))));
          return HttpResponse::NoContent();
        }});

  g.Add(V::post, "/s3/keys", Route{.handler = [store](const HttpRequest& req) {
          API_ASSIGN_OR_RESPOND(Params p, Params::From(req));
          API_ASSIGN_OR_RESPOND(std::string user, p.Str("user"));
          std::vector<std::string> buckets;
          if (p.Has("buckets")) {
            API_ASSIGN_OR_RESPOND(buckets, p.StrList("buckets"));
          }
          API_ASSIGN_OR_RESPOND(bool ro, p.Bool("read_only", false));
          API_ASSIGN_OR_RESPOND(std::optional<std::string> ak, p.OptStr("access_key"));
          API_ASSIGN_OR_RESPOND(std::optional<std::string> sk, p.OptStr("secret_key"));
          API_ASSIGN_OR_RESPOND(S3Key k, store->CreateKey(user, ak, sk, buckets, ro));
          nlohmann::json j = k.ToPublicJson();
          j["secret_key"] = k.secret_key;
          return Created(j);
        }});
  g.Add(V::get, "/s3/keys", Route{.handler = [store](const HttpRequest& req) {
          auto user = req.query.find("user");
          // An unknown user is an error, not an empty list that reads as "no keys".
          if (user != req.query.end()) API_RETURN_IF_ERROR(store->GetUser(user->second).status());
          nlohmann::json a = nlohmann::json::array();
          for (const auto& k : store->Keys())
            if (user == req.query.end() || k.user == user->second) a.push_back(k.ToPublicJson());
          return HttpResponse::Json(200, {{"keys", a}});
        }});
  g.Add(V::delete_, "/s3/keys/{ak}", Route{.handler = [store](const HttpRequest& req) {
          API_RETURN_IF_ERROR(store->RevokeKey(std::string(req.Param("ak"))));
          return HttpResponse::NoContent();
        }});

  g.Add(V::post, "/s3/buckets", Route{.handler = [svc, store](const HttpRequest& req) {
          API_ASSIGN_OR_RESPOND(Params p, Params::From(req));
          S3Bucket b;
          API_ASSIGN_OR_RESPOND(b.name, p.Str("name"));
          API_ASSIGN_OR_RESPOND(b.volume, p.Str("volume"));
          API_ASSIGN_OR_RESPOND(std::string vfid, p.Str("vfid"));
          API_ASSIGN_OR_RESPOND(b.owner, p.Str("owner"));
          API_ASSIGN_OR_RESPOND(auto id, VFolderId::Parse(vfid));
          API_ASSIGN_OR_RESPOND(Volume * v, svc->GetVolume(b.volume));
          API_RETURN_IF_ERROR(v->CheckVFolder(id));
          b.vfid = id.ToString();
          b.owns_vfolder = false;
          API_RETURN_IF_ERROR(store->BindBucket(b));
          API_ASSIGN_OR_RESPOND(S3Bucket made, store->FindBucket(b.name));
          return Created(made.ToJson());
        }});
  g.Add(V::get, "/s3/buckets", Route{.handler = [store](const HttpRequest&) {
          nlohmann::json a = nlohmann::json::array();
          for (const auto& b : store->Buckets()) a.push_back(b.ToJson());
          return HttpResponse::Json(200, {{"buckets", a}});
        }});
  g.Add(V::delete_, "/s3/buckets/{name}", Route{.handler = [svc, store](const HttpRequest& req) {
          std::string name(req.Param("name"));
          API_ASSIGN_OR_RESPOND(S3Bucket b, store->FindBucket(name));
          API_RETURN_IF_ERROR(store->UnbindBucket(name, b.vfid));  // the vfolder swept below
          // The bucket's multipart uploads in progress go with its name, as they do with an
          // S3 DeleteBucket: nothing else would list or sweep them (the janitor sweeps the
          // vfolders that buckets serve), and their parts count against the quota. Another
          // name bound to the same vfolder serves them still.
          auto v = svc->GetVolume(b.volume);
          auto id = VFolderId::Parse(b.vfid);
          if (!store->Serves(b.volume, b.vfid) && v.ok() && id.ok()) {
            ObjectStore objects(&svc->reservations());
            size_t n = objects.SweepMultipart(**v, *id, std::chrono::seconds(0));
            if (n) spdlog::info("s3: bucket {} unbound with {} uploads in progress", name, n);
          }
          return HttpResponse::NoContent();
        }});
}

}  // namespace sluice::api
