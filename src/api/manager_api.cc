#include "api/manager_api.h"

#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/s3/s3_admin_api.h"
#include "api/vfs_storage_api.h"
#include "common/clock.h"
#include "common/jwt.h"
#include "common/path.h"
#include "common/secrets.h"
#include "service/cache_ops.h"
#include "service/files.h"
#include "service/s3/s3_store.h"
#include "volume/s3/s3_volume.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif

namespace sluice::api {

std::string SluiceVersion() {
  return SLUICE_VERSION;
}

namespace {

constexpr const char* kAuthHeader = "X-BackendAI-Storage-Auth-Token";

Result<VFolderId> GetVfid(const Params& p, const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(std::string s, p.Str(key));
  return VFolderId::Parse(s);
}

Result<QuotaScopeId> GetQsid(const Params& p) {
  SLUICE_ASSIGN_OR_RETURN(std::string s, p.Str("qsid"));
  return QuotaScopeId::Parse(s);
}

// `options.limit_bytes`, absent or null meaning no limit.
Result<std::optional<uint64_t>> GetLimit(const Params& p) {
  if (!p.Has("options")) return std::optional<uint64_t>();
  const auto& o = p.json()["options"];
  if (!o.is_object())
    return Status(Code::kInvalidArgument, "parameter 'options' must be an object");
  if (!o.contains("limit_bytes") || o["limit_bytes"].is_null()) return std::optional<uint64_t>();
  const auto& l = o["limit_bytes"];
  if (l.is_number_unsigned()) return std::optional<uint64_t>(l.get<uint64_t>());
  if (l.is_number_integer() && l.get<int64_t>() >= 0)
    return std::optional<uint64_t>(static_cast<uint64_t>(l.get<int64_t>()));
  return Status(Code::kInvalidArgument, "options.limit_bytes must be a non-negative integer");
}

nlohmann::json OptJson(const std::optional<uint64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

HttpResponse TaskAccepted(unsigned status, const std::string& id) {
  return HttpResponse::Json(status, {{"bgtask_id", id}});
}

// The body of /folder/file/list: {"items": [...]}, one entry at a time from an open directory.
// An entry that vanishes between its name and its attributes is left out; an error part way
// cuts the (chunked) body short, so the client sees a broken listing, never a wrong one.
class ListingBody {
 public:
  ListingBody(std::unique_ptr<DirHandle> dir, uint64_t limit)
      : dir_(std::move(dir)), limit_(limit) {}

  Result<size_t> Fill(char* buf, size_t cap) {
    size_t n = 0;
    while (n < cap) {
      if (pos_ < pending_.size()) {
        size_t k = std::min(cap - n, pending_.size() - pos_);
        std::memcpy(buf + n, pending_.data() + pos_, k);
        pos_ += k;
        n += k;
        continue;
      }
      pending_.clear();
      pos_ = 0;
      if (done_) break;
      if (!started_) {
        started_ = true;
        pending_ = "{\"items\":[";
        continue;
      }
      SLUICE_RETURN_IF_ERROR(NextItem());
    }
    return n;
  }

 private:
  Status NextItem() {
    for (;;) {
      if (limit_ && count_ >= limit_) break;
      SLUICE_ASSIGN_OR_RETURN(auto name, dir_->Next());
      if (!name) break;
      auto e = dir_->StatEntry(name->name);
      if (!e.ok()) {
        if (e.status().code() == Code::kNotFound) continue;  // vanished meanwhile
        return e.status();
      }
      nlohmann::json item = {{"name", e->name},
                             {"type", EntryTypeName(e->type)},
                             {"stat",
                              {{"mode", e->mode},
                               {"size", e->size},
                               {"created", FormatIso8601(e->created)},
                               {"modified", FormatIso8601(e->modified)}}},
                             {"symlink_target", e->symlink_target.value_or("")}};
      if (count_++) pending_ += ',';
      pending_ += item.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      return Status::Ok();
    }
    pending_ = "]}";
    done_ = true;
    return Status::Ok();
  }

  std::unique_ptr<DirHandle> dir_;
  uint64_t limit_;
  uint64_t count_ = 0;
  std::string pending_;
  size_t pos_ = 0;
  bool started_ = false, done_ = false;
};

class ManagerApi {
 public:
  // `s3`: the bucket names to unbind with a deleted vfolder (null: no S3 API).
  explicit ManagerApi(StorageService* svc, S3Store* s3 = nullptr)
      : svc_(svc), s3_(s3), files_(svc) {}

  // The routes share ownership of the API object.
  static void Register(RouteGroup& r, const std::shared_ptr<ManagerApi>& api) {
    using V = http::verb;
    auto add = [&](V verb, const std::string& path,
                   HttpResponse (ManagerApi::*fn)(const Params&, const RequestContext&)) {
      r.Add(verb, path, Route{.handler = [api, fn](const HttpRequest& req) -> HttpResponse {
              API_ASSIGN_OR_RESPOND(Params p, Params::From(req));
              return (api.get()->*fn)(p, req.ctx);
            }});
    };
    add(V::get, "/volumes", &ManagerApi::Volumes);
    add(V::get, "/volume/hwinfo", &ManagerApi::HwInfoRoute);
    add(V::get, "/volume/performance-metric", &ManagerApi::PerformanceMetric);
    add(V::post, "/quota-scope", &ManagerApi::CreateQuotaScope);
    add(V::get, "/quota-scope", &ManagerApi::GetQuotaScope);
    add(V::patch, "/quota-scope", &ManagerApi::UpdateQuotaScope);
    add(V::delete_, "/quota-scope", &ManagerApi::DeleteQuotaScope);
    add(V::delete_, "/quota-scope/quota", &ManagerApi::UnsetQuota);
    add(V::post, "/folder/create", &ManagerApi::CreateFolder);
    add(V::post, "/folder/delete", &ManagerApi::DeleteFolder);
    add(V::post, "/folder/clone", &ManagerApi::CloneFolder);
    add(V::get, "/folder/mount", &ManagerApi::Mount);
    add(V::get, "/folder/usage", &ManagerApi::Usage);
    add(V::get, "/folder/used-bytes", &ManagerApi::UsedBytes);
    add(V::get, "/folder/fs-usage", &ManagerApi::FsUsageRoute);
    add(V::post, "/folder/file/mkdir", &ManagerApi::Mkdir);
    add(V::post, "/folder/file/list", &ManagerApi::List);
    add(V::post, "/folder/file/rename", &ManagerApi::Rename);
    add(V::post, "/folder/file/move", &ManagerApi::Move);
    add(V::post, "/folder/file/fetch", &ManagerApi::Fetch);
    add(V::post, "/folder/file/download", &ManagerApi::DownloadToken);
    add(V::post, "/folder/file/archive-download-token", &ManagerApi::ArchiveToken);
    add(V::post, "/folder/file/upload", &ManagerApi::UploadToken);
    add(V::post, "/folder/file/delete", &ManagerApi::Delete);
    add(V::post, "/folder/file/delete-async", &ManagerApi::DeleteAsync);
    add(V::get, "/bgtask", &ManagerApi::Task);
    add(V::get, "/bgtasks", &ManagerApi::Tasks);
    // Sluice additions: the SSD cache of a volume with [volume.NAME.cache].
    add(V::get, "/volume/cache", &ManagerApi::CacheStats);
    add(V::post, "/volume/cache/warm", &ManagerApi::CacheWarm);
    add(V::post, "/volume/cache/evict", &ManagerApi::CacheEvict);
    // Sluice addition: a prefix already on an s3 volume's origin as a read-only vfolder.
    add(V::post, "/folder/bind", &ManagerApi::BindFolder);
    // Kept for old managers.
    add(V::get, "/folder/metadata", &ManagerApi::MetadataGet);
    add(V::post, "/folder/metadata", &ManagerApi::MetadataSet);
    add(V::get, "/volume/quota", &ManagerApi::QuotaGetDeprecated);
    add(V::patch, "/volume/quota", &ManagerApi::QuotaSetDeprecated);
  }

 private:
  HttpResponse Volumes(const Params&, const RequestContext&) {
    nlohmann::json vols = nlohmann::json::array();
    for (Volume* v : svc_->Volumes()) {
      vols.push_back({{"name", v->name()},
                      {"backend", v->backend()},
                      {"path", v->path()},
                      {"fsprefix", v->fsprefix()},
                      {"capabilities", v->capabilities()}});
    }
    return HttpResponse::Json(200, {{"volumes", vols}});
  }

  HttpResponse HwInfoRoute(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(Volume * v, svc_->GetVolume(vol));
    HwInfo h = v->GetHwInfo();
    return HttpResponse::Json(
        200, {{"status", h.status},
              {"status_info",
               h.status_info.empty() ? nlohmann::json(nullptr) : nlohmann::json(h.status_info)},
              {"metadata", h.metadata}});
  }

  HttpResponse PerformanceMetric(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(Volume * v, svc_->GetVolume(vol));
    const VolumeIoStats& s = v->io_stats();
    auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    return HttpResponse::Json(200,
                              {{"metric",
                                {{"iops_read", ld(s.read_ops)},
                                 {"iops_write", ld(s.write_ops)},
                                 {"io_bytes_read", ld(s.read_bytes)},
                                 {"io_bytes_write", ld(s.write_bytes)},
                                 {"io_usec_read", ld(s.read_usec)},
                                 {"io_usec_write", ld(s.write_usec)}}},
                               {"observed_at", FormatIso8601(std::chrono::system_clock::now())}});
  }

  HttpResponse CreateQuotaScope(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(QuotaScopeId qsid, GetQsid(p));
    API_ASSIGN_OR_RESPOND(auto limit, GetLimit(p));
    API_RETURN_IF_ERROR(svc_->CreateQuotaScope(vol, qsid, limit));
    return HttpResponse::NoContent();
  }

  HttpResponse GetQuotaScope(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(QuotaScopeId qsid, GetQsid(p));
    API_ASSIGN_OR_RESPOND(QuotaUsage u, svc_->DescribeQuotaScope(vol, qsid));
    return HttpResponse::Json(
        200, {{"used_bytes", u.used_bytes}, {"limit_bytes", OptJson(u.limit_bytes)}});
  }

  HttpResponse UpdateQuotaScope(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(QuotaScopeId qsid, GetQsid(p));
    API_ASSIGN_OR_RESPOND(auto limit, GetLimit(p));
    if (!limit)
      return ErrorResponse(Status(Code::kInvalidArgument,
                                  "options.limit_bytes is required; use DELETE /quota-scope/quota "
                                  "to lift a limit"));
    API_RETURN_IF_ERROR(svc_->UpdateQuotaScope(vol, qsid, *limit));
    return HttpResponse::NoContent();
  }

  HttpResponse UnsetQuota(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(QuotaScopeId qsid, GetQsid(p));
    API_RETURN_IF_ERROR(svc_->UnsetQuota(vol, qsid));
    return HttpResponse::NoContent();
  }

  HttpResponse DeleteQuotaScope(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(QuotaScopeId qsid, GetQsid(p));
    API_RETURN_IF_ERROR(svc_->DeleteQuotaScope(vol, qsid));
    return HttpResponse::NoContent();
  }

  HttpResponse CreateFolder(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(VFolderId vfid, GetVfid(p, "vfid"));
    API_ASSIGN_OR_RESPOND(auto mode, p.OptUint("mode"));
    if (mode && *mode > 07777)
      return ErrorResponse(
          Status(Code::kInvalidArgument,
                 fmt::format("mode {} is not a permission mode (0 to 0o7777)", *mode)));
    std::optional<uint64_t> initial;
    if (p.Has("options") && p.json()["options"].is_object()) {
      const auto& o = p.json()["options"];
      if (o.contains("initial_max_size_for_quota_scope") &&
          !o["initial_max_size_for_quota_scope"].is_null()) {
        if (!o["initial_max_size_for_quota_scope"].is_number_integer() ||
            o["initial_max_size_for_quota_scope"].get<int64_t>() < 0)
          return ErrorResponse(Status(Code::kInvalidArgument,
                                      "options.initial_max_size_for_quota_scope must be a "
                                      "non-negative integer"));
        initial = o["initial_max_size_for_quota_scope"].get<uint64_t>();
      }
    }
    API_RETURN_IF_ERROR(
        svc_->CreateVFolder(vol, vfid, static_cast<mode_t>(mode.value_or(0755)), initial));
    return HttpResponse::NoContent();
  }

  HttpResponse DeleteFolder(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(VFolderId vfid, GetVfid(p, "vfid"));
    auto id = svc_->DeleteVFolder(vol, vfid);
    if (!id.ok() && id.status().subject() == Subject::kVFolder &&
        id.status().code() == Code::kNotFound) {
      UnbindBucketsOf(vol, vfid);  // gone all the same (a retried delete, or by hand)
      // Backend.AI answers 410 Gone here; managers read it as "already deleted".
      return ErrorResponse(id.status(), {}, 410);
    }
    if (!id.ok()) return ErrorResponse(id.status());
    UnbindBucketsOf(vol, vfid);
    return TaskAccepted(202, *id);
  }

  // The bucket names a deleted vfolder was served by go with it (on every node: the records
  // are shared). Before, they stayed, answering for a vfolder that was gone, and the name could
  // not be made again.
  void UnbindBucketsOf(const std::string& vol, const VFolderId& vfid) {
    if (!s3_) return;
    s3_->Refresh();  // names another node bound within the refresh interval too
    const std::string id = vfid.ToString();
    for (const auto& b : s3_->Buckets()) {
      if (b.volume != vol || b.vfid != id) continue;
      Status st = s3_->UnbindBucket(b.name, b.vfid);
      if (st.ok())
        spdlog::info("s3: bucket {} unbound: its vfolder {} on {} was deleted", b.name, id, vol);
      else if (st.code() != Code::kNotFound)
        spdlog::warn("s3: bucket {} stays bound to deleted vfolder {}: {}", b.name, id,
                     st.ToString());
    }
  }

  HttpResponse CloneFolder(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string src_vol, p.Str("src_volume"));
    API_ASSIGN_OR_RESPOND(VFolderId src, GetVfid(p, "src_vfid"));
    API_ASSIGN_OR_RESPOND(std::string dst_vol, p.StrOr("dst_volume", src_vol));
    API_ASSIGN_OR_RESPOND(VFolderId dst, GetVfid(p, "dst_vfid"));
    API_ASSIGN_OR_RESPOND(std::string id, svc_->CloneVFolder(src_vol, src, dst_vol, dst));
    return TaskAccepted(200, id);
  }

  // The volume and vfolder every file route starts from.
  struct Target {
    Volume* volume;
    VFolderId vfid;
  };
  Result<Target> GetTarget(const Params& p) {
    SLUICE_ASSIGN_OR_RETURN(std::string vol, p.Str("volume"));
    SLUICE_ASSIGN_OR_RETURN(Volume * v, svc_->GetVolume(vol));
    SLUICE_ASSIGN_OR_RETURN(VFolderId vfid, GetVfid(p, "vfid"));
    return Target{v, vfid};
  }

  // The vfolder root whatever the subpath (checked, not joined): the manager joins it itself.
  HttpResponse Mount(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string sub, p.StrOr("subpath", "."));
    auto path = t.volume->MountPath(t.vfid, sub);
    // A missing vfolder is 400 here in the reference (VFolderBadRequest in the manager).
    if (!path.ok()) return ErrorResponse(path.status(), {sub}, 400);
    return HttpResponse::Json(200, {{"path", *path}});
  }

  HttpResponse Usage(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    // Sluice addition: fresh=true measures now instead of answering a maintained figure.
    API_ASSIGN_OR_RESPOND(bool fresh, p.Bool("fresh", false));
    API_ASSIGN_OR_RESPOND(TreeUsage u,
                          fresh ? t.volume->GetFreshUsage(t.vfid) : t.volume->GetUsage(t.vfid));
    nlohmann::json body = {{"file_count", u.file_count}, {"used_bytes", u.used_bytes}};
    // Sluice addition: how fresh a maintained figure is (Backend.AI ignores extra keys).
    auto measured = u.measured_at.value_or(std::chrono::system_clock::now());
    body["measured_at"] = FormatIso8601(measured);
    body["age_seconds"] =
        std::chrono::duration<double>(std::chrono::system_clock::now() - measured).count();
    return HttpResponse::Json(200, body);
  }

  HttpResponse UsedBytes(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(uint64_t n, t.volume->GetUsedBytes(t.vfid));
    return HttpResponse::Json(200, {{"used_bytes", n}});
  }

  HttpResponse FsUsageRoute(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(Volume * v, svc_->GetVolume(vol));
    API_ASSIGN_OR_RESPOND(FsUsage u, v->GetFsUsage());
    return HttpResponse::Json(200,
                              {{"capacity_bytes", u.capacity_bytes}, {"used_bytes", u.used_bytes}});
  }

  HttpResponse Mkdir(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::vector<std::string> paths, p.StrList("relpath"));
    API_ASSIGN_OR_RESPOND(bool parents, p.Bool("parents", true));
    API_ASSIGN_OR_RESPOND(bool exist_ok, p.Bool("exist_ok", false));
    auto results = files_.Mkdir(ctx, *t.volume, t.vfid, paths, parents, exist_ok);
    if (!results.ok()) return FileError(results.status(), paths);
    nlohmann::json ok = nlohmann::json::array(), failed = nlohmann::json::array();
    for (const auto& r : *results) {
      if (r.status.ok())
        ok.push_back({{"item", r.item}, {"msg", nullptr}});
      else
        failed.push_back(
            {{"item", r.item}, {"msg", r.status.message()}, {"errno", r.status.sys_errno()}});
    }
    unsigned status = failed.empty() ? 200 : ok.empty() ? 422 : 207;
    return HttpResponse::Json(status, {{"results", {{"success", ok}, {"failed", failed}}}});
  }

  HttpResponse List(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string rel, p.StrOr("relpath", "."));
    auto dir = files_.List(ctx, *t.volume, t.vfid, rel);
    if (!dir.ok()) return FileError(dir.status(), {rel});
    // Streamed as it is read: memory stays flat whatever the size of the directory (with
    // scandir-limit = 0, 16 listings of 200k entries once took 4 GB).
    auto listing =
        std::make_shared<ListingBody>(std::move(dir).value(), svc_->config().scandir_limit);
    HttpResponse r;
    r.status = 200;
    r.generator = [listing](char* buf, size_t cap) { return listing->Fill(buf, cap); };
    return r;
  }

  HttpResponse Rename(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string rel, p.Str("relpath"));
    API_ASSIGN_OR_RESPOND(std::string new_name, p.Str("new_name"));
    Status s = files_.Rename(ctx, *t.volume, t.vfid, rel, new_name);
    if (!s.ok()) return FileError(s, {rel, new_name});
    return HttpResponse::NoContent();
  }

  HttpResponse Move(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string src, p.Str("src_relpath"));
    API_ASSIGN_OR_RESPOND(std::string dst, p.Str("dst_relpath"));
    Status s = files_.Move(ctx, *t.volume, t.vfid, src, dst);
    if (!s.ok()) return FileError(s, {src, dst});
    return HttpResponse::NoContent();
  }

  HttpResponse Fetch(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string rel, p.Str("relpath"));
    auto f = files_.Fetch(ctx, *t.volume, t.vfid, rel);
    if (!f.ok()) return FileError(f.status(), {rel});
    HttpResponse r;
    r.status = 200;
    r.content_type = "application/octet-stream";
    r.file_length = (*f)->size();
    r.file = std::move(f).value();
    return r;
  }

  HttpResponse Token(const Result<std::string>& token, const std::vector<std::string>& paths) {
    if (!token.ok()) return FileError(token.status(), paths);
    return HttpResponse::Json(200, {{"token", *token}});
  }

  HttpResponse DownloadToken(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string rel, p.Str("relpath"));
    API_ASSIGN_OR_RESPOND(bool archive, p.Bool("archive", false));
    // The manager always sends the key: null for managed vfolders.
    std::optional<std::string> unmanaged;
    if (p.Has("unmanaged_path") && !p.json()["unmanaged_path"].is_null()) {
      API_ASSIGN_OR_RESPOND(unmanaged, p.Str("unmanaged_path"));
    }
    return Token(files_.DownloadToken(ctx, *t.volume, t.vfid, rel, archive, unmanaged), {rel});
  }

  HttpResponse ArchiveToken(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string vol, p.Str("volume"));
    API_ASSIGN_OR_RESPOND(Volume * v, svc_->GetVolume(vol));
    API_ASSIGN_OR_RESPOND(VFolderId vfid, GetVfid(p, "virtual_folder_id"));
    API_ASSIGN_OR_RESPOND(std::vector<std::string> files, p.StrList("files"));
    API_ASSIGN_OR_RESPOND(std::optional<std::string> filename, p.OptStr("filename"));
    return Token(files_.ArchiveToken(ctx, *v, vfid, files, filename), files);
  }

  HttpResponse UploadToken(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string rel, p.Str("relpath"));
    API_ASSIGN_OR_RESPOND(auto size, p.OptUint("size"));
    if (!size) return ErrorResponse(Status(Code::kInvalidArgument, "parameter 'size' is required"));
    return Token(files_.UploadToken(ctx, *t.volume, t.vfid, rel, *size), {rel});
  }

  HttpResponse Delete(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::vector<std::string> paths, p.StrList("relpaths"));
    API_ASSIGN_OR_RESPOND(bool recursive, p.Bool("recursive", false));
    Status s = files_.Delete(ctx, *t.volume, t.vfid, paths, recursive);
    if (!s.ok()) return FileError(s, paths);
    return HttpResponse::Json(200, {{"status", "ok"}});
  }

  HttpResponse DeleteAsync(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::vector<std::string> paths, p.StrList("relpaths"));
    API_ASSIGN_OR_RESPOND(bool recursive, p.Bool("recursive", false));
    auto id = files_.DeleteAsync(ctx, *t.volume, t.vfid, paths, recursive);
    if (!id.ok()) return FileError(id.status(), paths);
    return TaskAccepted(202, *id);
  }

  HttpResponse Task(const Params& p, const RequestContext& ctx) {
    API_ASSIGN_OR_RESPOND(std::string id, p.Str("task_id"));
    auto info = svc_->tasks().Get(id);
    if (!info)
      return ErrorResponse(Status(Code::kNotFound, fmt::format("no background task '{}'", id)));
    return HttpResponse::Json(200, info->ToJson());
  }

  Result<CachedVolume*> GetCache(const Params& p) {
    SLUICE_ASSIGN_OR_RETURN(std::string vol, p.Str("volume"));
    SLUICE_ASSIGN_OR_RETURN(Volume * v, svc_->GetVolume(vol));
    return CacheOf(v);
  }

  HttpResponse CacheStats(const Params& p, const RequestContext&) {
    API_ASSIGN_OR_RESPOND(CachedVolume * c, GetCache(p));
    return HttpResponse::Json(200, CacheStatsJson(*c));
  }

  // Prewarm: {volume, vfid, path?} -> a background task whose `progress` counts files and
  // bytes found and read.
  HttpResponse CacheWarm(const Params& p, const RequestContext&) {
    API_ASSIGN_OR_RESPOND(CachedVolume * c, GetCache(p));
    API_ASSIGN_OR_RESPOND(VFolderId vfid, GetVfid(p, "vfid"));
    API_ASSIGN_OR_RESPOND(std::string path, p.StrOr("path", ""));
    API_ASSIGN_OR_RESPOND(auto parts, SplitRelPath(path));  // refused now, not in the task
    if (Status st = c->CheckVFolder(vfid); !st.ok()) return ErrorResponse(st);
    nlohmann::json params = {{"volume", c->name()}, {"vfid", vfid.ToString()}, {"path", path}};
    API_ASSIGN_OR_RESPOND(std::string id,
                          svc_->tasks().Start("cache-warm", std::move(params),
                                              [c, vfid, path](const BgTaskManager::Report& report) {
                                                WarmProgress progress;
                                                return WarmTree(*c, vfid, path, &progress,
                                                                [&] { report(progress.ToJson()); });
                                              }));
    return TaskAccepted(202, id);
  }

  // {volume, vfid?, path?}: without a vfid, everything the cache holds.
  HttpResponse CacheEvict(const Params& p, const RequestContext&) {
    API_ASSIGN_OR_RESPOND(CachedVolume * c, GetCache(p));
    API_ASSIGN_OR_RESPOND(std::optional<std::string> which, p.OptStr("vfid"));
    if (!which) return HttpResponse::Json(200, {{"blocks", c->EvictAll()}});
    API_ASSIGN_OR_RESPOND(VFolderId vfid, GetVfid(p, "vfid"));
    API_ASSIGN_OR_RESPOND(std::string path, p.StrOr("path", ""));
    API_ASSIGN_OR_RESPOND(nlohmann::json out, EvictTree(*c, vfid, path));
    return HttpResponse::Json(200, out);
  }

  HttpResponse BindFolder(const Params& p, const RequestContext&) {
    API_ASSIGN_OR_RESPOND(Target t, GetTarget(p));
    API_ASSIGN_OR_RESPOND(std::string prefix, p.Str("prefix"));
    auto* s3 = dynamic_cast<S3Volume*>(&ForwardingVolume::Innermost(*t.volume));
    if (!s3)
      return ErrorResponse(
          Status(Code::kInvalidArgument,
                 fmt::format("volume '{}' is not an s3 volume: only a prefix or a bucket of an S3 "
                             "origin is bound",
                             t.volume->name())));
    API_RETURN_IF_ERROR(s3->BindVFolder(t.vfid, prefix));
    // An empty vfolder bound now may have been listed through the cache a moment ago.
    if (auto* c = dynamic_cast<CachedVolume*>(t.volume)) c->Invalidate(t.vfid);
    return HttpResponse::Json(200, {{"vfid", t.vfid.ToString()},
                                    {"path", t.volume->VFolderPath(t.vfid)},
                                    {"read_only", true}});
  }

  HttpResponse Tasks(const Params&, const RequestContext&) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& t : svc_->tasks().List()) arr.push_back(t.ToJson());
    return HttpResponse::Json(200, {{"tasks", arr}});
  }

  // Old managers call these; Backend.AI answers {"status": "ok"} and stores nothing.
  HttpResponse MetadataGet(const Params&, const RequestContext&) {
    return HttpResponse::Json(200, {{"status", "ok"}});
  }
  HttpResponse MetadataSet(const Params&, const RequestContext&) {
    return HttpResponse::Json(200, {{"status", "ok"}});
  }
  // As the reference: 400 with a plain-text reason (the manager raises PassthroughError(400)).
  HttpResponse QuotaGetDeprecated(const Params&, const RequestContext&) {
    return HttpResponse::Text(400, "get_quota (for individual vfolder) is a deprecated API",
                              "text/plain; charset=utf-8");
  }
  HttpResponse QuotaSetDeprecated(const Params&, const RequestContext&) {
    return HttpResponse::Text(400, "set_quota (for individual vfolder) is a deprecated API",
                              "text/plain; charset=utf-8");
  }

  StorageService* svc_;
  S3Store* s3_;
  FileService files_;
};

}  // namespace

void AddHealthRoutes(Router& router, const HealthSource& src, const std::string& api_type) {
  // Probes are answered on the event loop from what the health monitor last saw: they never
  // wait behind file work, and take no body.
  auto add = [&router](const std::string& path, Handler h) {
    router.Add(http::verb::get, path,
               Route{.handler = std::move(h), .blocking = false, .body_limit = 0});
  };
  auto status = [api_type](const HttpRequest&) {
    return HttpResponse::Json(200, {{"status", "ok"},
                                    {"type", api_type},
                                    {"storage-proxy", SluiceVersion()},
                                    {"implementation", "sluice"}});
  };
  add("/", status);
  add("/status", status);
  add("/livez", [](const HttpRequest&) { return HttpResponse::Json(200, {{"status", "ok"}}); });
  auto health = [src](const HttpRequest&) {
    HealthSnapshot snap = src.monitor->Snapshot();
    nlohmann::json vols = nlohmann::json::object();
    for (const auto& [name, v] : snap.volumes) {
      nlohmann::json j = {{"status", v.status},
                          {"status_info", v.info},
                          {"checked_at", FormatIso8601(v.checked_at)}};
      if (v.fs)
        j["fs"] = {{"capacity_bytes", v.fs->capacity_bytes},
                   {"available_bytes", v.fs->available_bytes}};
      vols[name] = std::move(j);
    }
    std::string overall = snap.overall;
    if (src.draining && src.draining()) overall = "draining";
    unsigned code = (overall == "healthy" || overall == "degraded") ? 200 : 503;
    return HttpResponse::Json(code, {{"status", overall},
                                     {"version", SluiceVersion()},
                                     {"node_id", src.node_id},
                                     {"volumes", vols}});
  };
  add("/health", health);
  add("/readyz", health);
}

Authenticator ManagerTokenAuth(std::string header, std::string secret) {
  return [header = std::move(header),
          secret = std::move(secret)](HttpRequest& req) -> std::optional<HttpResponse> {
    auto it = req.msg.find(header);
    if (it == req.msg.end())
      return ErrorResponse(
          Status(Code::kUnauthenticated, fmt::format("missing {} header", header)));
    if (!ConstantTimeEquals(it->value(), secret))
      return ErrorResponse(
          Status(Code::kUnauthenticated, fmt::format("invalid {} header", header)));
    req.ctx.principal.kind = "manager";
    return std::nullopt;
  };
}

std::shared_ptr<Router> MakeManagerRouter(StorageService* service, ThreadPool* io_pool,
                                          const std::string& manager_secret,
                                          const HealthSource& health, S3Store* s3) {
  auto router = std::make_shared<Router>("manager", io_pool);
  AddHealthRoutes(*router, health, "manager-facing");
  RouteGroup managed = router->Group(ManagerTokenAuth(kAuthHeader, manager_secret));
  ManagerApi::Register(managed, std::make_shared<ManagerApi>(service, s3));
  AddVfsStorageRoutes(managed, service->config().vfs_storages);
  if (s3) AddS3AdminRoutes(managed, service, s3);
  return router;
}

}  // namespace sluice::api
