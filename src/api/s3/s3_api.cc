#include "api/s3/s3_api.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/beast/core/string.hpp>
#include <pugixml.hpp>

#include "api/range.h"
#include "api/s3/aws_chunked.h"
#include "api/s3/batch_get.h"
#include "api/s3/s3_bodies.h"
#include "api/s3/s3_errors.h"
#include "api/s3/sigv4.h"
#include "api/s3/xml_text.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/crypto.h"
#include "common/json.h"
#include "common/jwt.h"
#include "common/secrets.h"
#include "service/s3/objects.h"
#include "service/s3/s3_store.h"
#include "service/storage_service.h"

namespace sluice::api {

namespace {

using s3::FromStatus;
using s3::S3Error;

constexpr const char* kXmlns = "http://s3.amazonaws.com/doc/2006-03-01/";
constexpr uint64_t kMaxPutSize = 5ULL << 30;  // S3's limit for one PUT
constexpr size_t kMaxUserMeta = 2048;         // x-amz-meta-* names and values together
constexpr size_t kMaxStandardMeta = 1536;     // Content-Type and kStoredHeaders, as stored
constexpr uint64_t kMaxBatchBody = 16 << 20;  // a batch-get request's JSON

// What the authenticator found: the key and the parts of the signature a body is checked
// against.
struct S3Grant {
  std::shared_ptr<const S3Key> key;
  s3::SigV4Auth auth;
};

struct S3Ctx {
  StorageService* svc;
  S3Store* store;
  ObjectStore objects;
  S3Options opts;
};

std::string RequestId() {
  return UniqueHexId();
}

bool StartsWith(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

std::string IsoTime(std::chrono::system_clock::time_point t) {
  return FormatIso8601Millis(t);
}

constexpr std::string_view kXmlDeclaration = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

std::string XmlText(const pugi::xml_document& doc) {
  struct Writer : pugi::xml_writer {
    std::string out;
    void write(const void* data, size_t size) override {
      out.append(static_cast<const char*>(data), size);
    }
  } w;
  doc.save(w, "", pugi::format_raw | pugi::format_no_declaration);
  return std::string(kXmlDeclaration) + w.out;
}

HttpResponse Xml(unsigned status, const pugi::xml_document& doc) {
  return HttpResponse::Text(status, XmlText(doc), "application/xml");
}

HttpResponse ErrorXml(const S3Error& e, std::string_view resource) {
  pugi::xml_document doc;
  auto err = doc.append_child("Error");
  err.append_child("Code").text().set(e.code.c_str());
  err.append_child("Message").text().set(e.message.c_str());
  err.append_child("Resource").text().set(std::string(resource).c_str());
  HttpResponse r = Xml(e.status, doc);
  r.headers.emplace_back("x-amz-request-id", RequestId());
  if (r.status == 503) r.headers.emplace_back("Retry-After", "1");  // SDKs back off and retry
  return r;
}

const S3Grant& GrantOf(const HttpRequest& req) {
  return *static_cast<const S3Grant*>(req.ctx.principal.grant.get());
}

std::string_view Header(const HttpRequest& req, std::string_view name) {
  auto it = req.msg.find(name);
  return it == req.msg.end() ? std::string_view() : std::string_view(it->value());
}

std::optional<std::string> QueryParam(const HttpRequest& req, const std::string& k) {
  auto it = req.query.find(k);
  if (it == req.query.end()) return std::nullopt;
  return it->second;
}

// A query parameter that must be a decimal number in [lo, hi] (at most 10 digits: S3 takes an
// int32's range for its counts).
std::optional<int> IntParam(const HttpRequest& req, const std::string& k, int lo, int hi) {
  auto v = QueryParam(req, k);
  if (!v || v->empty() || v->size() > 10 || !std::all_of(v->begin(), v->end(), ::isdigit))
    return std::nullopt;
  const long long n = std::stoll(*v);
  return n < lo || n > hi ? std::nullopt : std::optional<int>(static_cast<int>(n));
}

// The bucket a virtual-hosted request names in its Host ("<bucket>.<domain>[:port]"), if any.
std::optional<std::string> HostBucket(const HttpRequest& req, const std::string& domain) {
  if (domain.empty()) return std::nullopt;
  std::string host(Header(req, "Host"));
  if (size_t colon = host.rfind(':');
      colon != std::string::npos && host.find(']') == std::string::npos)
    host.resize(colon);
  std::transform(host.begin(), host.end(), host.begin(), ::tolower);
  if (host.size() <= domain.size() + 1 ||
      host.compare(host.size() - domain.size(), domain.size(), domain) != 0 ||
      host[host.size() - domain.size() - 1] != '.')
    return std::nullopt;
  return host.substr(0, host.size() - domain.size() - 1);
}

// Signing keys per access key, for its day, region and service: four HMACs saved on every
// request.
// The signing key of `key` for the request's day, region and service. The reference stays
// valid until this thread's next call.
const std::string& CachedSigningKey(const S3Key& key, const s3::SigV4Auth& a) {
  struct Entry {
    std::string date, region, service, secret, signing;
  };
  thread_local std::unordered_map<std::string, Entry> cache;  // by access key
  auto it = cache.find(key.access_key);
  if (it != cache.end() && it->second.date == a.date && it->second.region == a.region &&
      it->second.service == a.service && it->second.secret == key.secret_key)
    return it->second.signing;
  if (cache.size() > 1024) cache.clear();
  Entry e{a.date, a.region, a.service, key.secret_key,
          s3::SigningKey(key.secret_key, a.date, a.region, a.service)};
  Entry& slot = cache[key.access_key];
  slot = std::move(e);
  return slot.signing;
}

// -------------------------------------------------------------------------- authentication

Authenticator MakeSigV4Authenticator(S3Ctx* ctx) {
  return [ctx](HttpRequest& req) -> std::optional<HttpResponse> {
    std::optional<S3Error> err;
    std::string_view target = req.msg.target();
    auto auth = s3::ParseSigV4(req.msg, target, std::time(nullptr), &err);
    auto refuse = [&](S3Error e) { return std::optional<HttpResponse>(ErrorXml(e, req.path)); };
    if (err) return refuse(*err);
    if (!auth)
      return refuse({403, "AccessDenied", "anonymous access is not allowed; sign requests"});
    // Keys this node could not confirm on disk lately (the shared directory unreadable) may
    // have been revoked on another node: nothing is honoured until they are confirmed again.
    if (!ctx->store->KeysCurrent())
      return refuse({503, "ServiceUnavailable",
                     "this node cannot read the shared S3 access keys at present; retry, or ask "
                     "another node"});
    auto key = ctx->store->FindKey(auth->access_key);
    if (!key)
      return refuse({403, "InvalidAccessKeyId",
                     "the AWS access key Id you provided does not exist in our records"});
    const std::string& skey = CachedSigningKey(*key, *auth);
    const size_t qmark = target.find('?');
    std::string_view raw_query = qmark == std::string_view::npos ? "" : target.substr(qmark + 1);
    std::string_view method = req.msg.method_string();
    // A virtual-hosted request was signed for the path it sent, without the bucket the router
    // put in front of it.
    std::string_view signed_path = req.path;
    if (auto b = HostBucket(req, ctx->opts.domain)) signed_path.remove_prefix(1 + b->size());
    auto matches = [&](std::string_view path) {
      thread_local std::string canonical;
      canonical.clear();
      s3::AppendCanonicalRequest(canonical, req.msg, method, path, raw_query, *auth);
      return s3::SignatureMatches(skey, *auth, canonical, auth->signature);
    };
    // (The path is signed encoded once from the key, as S3 does; one signed as sent encodes
    // the same way.)
    if (!matches(signed_path))
      return refuse({403, "SignatureDoesNotMatch",
                     "the request signature we calculated does not match the signature you "
                     "provided; check your key and signing method"});
    auto grant = std::make_shared<S3Grant>();
    grant->key = std::move(key);
    grant->auth = std::move(*auth);
    req.ctx.principal.kind = "s3";
    req.ctx.principal.grant = std::move(grant);
    return std::nullopt;
  };
}

// ------------------------------------------------------------------------------ bucket access

struct BucketRef {
  S3Bucket bucket;
  Volume* volume = nullptr;
  VFolderId vfid;
};

// A write that found its place gone: NoSuchBucket when it was the bucket's vfolder that went
// (a DeleteBucket meanwhile), rather than `not_found` about the key.
S3Error WriteFailure(const BucketRef& ref, const Status& st, const char* not_found = nullptr) {
  if (st.code() == Code::kNotFound && !ref.volume->CheckVFolder(ref.vfid).ok())
    return {404, "NoSuchBucket", "the bucket was deleted while the object was written"};
  return not_found ? FromStatus(st, not_found) : FromStatus(st);
}

// The bucket, if the caller may use it (`write`: for changes).
std::variant<BucketRef, S3Error> AccessBucket(S3Ctx& ctx, const HttpRequest& req,
                                              const std::string& name, bool write) {
  const S3Grant& g = GrantOf(req);
  auto b = ctx.store->FindBucket(name);
  if (!b.ok() && b.status().code() == Code::kNotFound)
    return S3Error{404, "NoSuchBucket", "the specified bucket does not exist"};
  if (!b.ok()) return FromStatus(b.status());
  if (b->owner != g.key->user || !g.key->MayUse(name))
    return S3Error{403, "AccessDenied", "access denied"};
  if (write && g.key->read_only)
    return S3Error{403, "AccessDenied", "this access key is read-only"};
  auto v = ctx.svc->GetVolume(b->volume);
  auto id = VFolderId::Parse(b->vfid);
  if (!v.ok() || !id.ok())
    return S3Error{503, "ServiceUnavailable",
                   fmt::format("bucket '{}' is on volume '{}', which this node does not serve",
                               name, b->volume)};
  return BucketRef{std::move(b).value(), *v, std::move(id).value()};
}

std::variant<BucketRef, S3Error> Access(S3Ctx& ctx, const HttpRequest& req, bool write) {
  return AccessBucket(ctx, req, std::string(req.Param("bucket")), write);
}

// Checks a buffered body against the signed payload hash, Content-MD5 and, unless they describe
// something else (CompleteMultipartUpload's name the object), the x-amz-checksum-* headers.
S3Error MalformedXml(const Status& st) {
  return {400, "MalformedXML", st.message()};
}

S3Error BadPayloadHash() {
  return {400, "InvalidArgument",
          "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-... or a SHA-256 in hex"};
}

std::optional<S3Error> CheckBody(const HttpRequest& req, bool checksum_headers = true) {
  const auto& a = GrantOf(req).auth;
  const std::string& body = req.msg.body();
  // A body read whole is checked whole: its SHA-256, or none. Taken as XML, an aws-chunked
  // one would have had none of its chunk signatures checked.
  if (a.payload_hash.starts_with("STREAMING-"))
    return S3Error{400, "InvalidRequest",
                   fmt::format("payload mode {} is accepted on PutObject and UploadPart only",
                               a.payload_hash)};
  if (a.payload_hash != s3::kUnsignedPayload && a.payload_hash.size() != 64)
    return BadPayloadHash();
  if (a.payload_hash.size() == 64 && HexEncode(Sha256(body)) != a.payload_hash)
    return S3Error{400, "XAmzContentSHA256Mismatch",
                   "the provided x-amz-content-sha256 header does not match what was computed"};
  if (auto md5 = Header(req, "Content-MD5"); !md5.empty()) {
    auto raw = Base64Decode(md5);
    if (!raw.ok() || raw->size() != 16)
      return S3Error{400, "InvalidDigest", "the Content-MD5 you specified is not valid"};
    sluice::Digest d(sluice::Digest::Algo::kMd5);
    d.Update(body);
    if (d.Final() != *raw)
      return S3Error{400, "BadDigest",
                     "the Content-MD5 you specified did not match what we received"};
  }
  // Current SDKs send a checksum header instead of Content-MD5 (DeleteObjects).
  for (auto a : kAllChecksums) {
    if (!checksum_headers) break;
    auto v = Header(req, ChecksumHeader(a));
    if (v.empty()) continue;
    Checksummer c(a);
    c.Update(body.data(), body.size());
    if (Base64Encode(c.Final()) != v)
      return S3Error{400, "BadDigest",
                     fmt::format("the {} you specified did not match the calculated checksum",
                                 ChecksumName(a))};
  }
  return std::nullopt;
}

// Every S3 answer carries a request id.
HttpResponse WithRequestId(HttpResponse res) {
  bool has_id = std::any_of(res.headers.begin(), res.headers.end(),
                            [](const auto& h) { return h.first == "x-amz-request-id"; });
  if (!has_id) res.headers.emplace_back("x-amz-request-id", RequestId());
  return res;
}

// ------------------------------------------------------------------- answers kept alive

// A copy or a Complete on a volume that copies its data takes minutes for a large object,
// longer than clients wait for an answer's first byte (boto3 and our own s3 volumes give up
// after 60 s and retry, and a retried Complete finds its upload gone). So, as S3 does, work
// still running after `keepalive` answers 200 at once: the XML declaration, a space every
// `keepalive` until the work ends, then its result or its <Error>, which the SDKs read in a
// 200's body for exactly these operations (CopyObject, UploadPartCopy, Complete). Work done
// sooner answers as any request does, with its own status.
struct KeptAlive {
  HttpRequest req;  // the work's own copy: the handler returns while it runs
  std::mutex mu;
  std::condition_variable cv;
  std::optional<HttpResponse> done;

  bool Wait(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, d, [&] { return done.has_value(); });
  }
};

// At most this many run on threads of their own (a client that hangs up does not stop its
// work); past it, work runs on the request's thread and answers when done.
constexpr int kMaxKeptAlive = 64;
std::atomic<int> kept_alive_running{0};

// The body that follows the declaration already sent: the work's XML without its own.
std::string BodyAfterDeclaration(const HttpResponse& r) {
  std::string_view b = r.body;
  if (b.starts_with("<?xml")) {
    size_t end = b.find("?>");
    b = end == std::string_view::npos ? std::string_view() : b.substr(end + 2);
    while (!b.empty() && (b.front() == '\n' || b.front() == '\r')) b.remove_prefix(1);
  }
  if (r.status < 300 && !b.empty()) return std::string(b);
  if (r.status >= 300 && b.find("<Error>") != std::string_view::npos) {
    spdlog::warn("s3: an answer kept alive failed after its 200 went out: {}", b.substr(0, 300));
    return std::string(b);
  }
  return "<Error><Code>InternalError</Code><Message>the operation ended without a result"
         "</Message></Error>";
}

HttpResponse KeepingAlive(S3Ctx& ctx, const HttpRequest& req,
                          std::function<HttpResponse(const HttpRequest&)> work) {
  const std::chrono::milliseconds every = ctx.opts.keepalive;
  if (every.count() <= 0 || kept_alive_running.fetch_add(1) >= kMaxKeptAlive) {
    if (every.count() > 0) kept_alive_running.fetch_sub(1);
    return WithRequestId(work(req));
  }
  auto s = std::make_shared<KeptAlive>();
  s->req = req;
  try {
    std::thread([s, work = std::move(work)] {
      HttpResponse r;
      try {
        r = work(s->req);
      } catch (const std::exception& e) {
        spdlog::error("s3: {} {}: {}", std::string_view(s->req.msg.method_string()), s->req.path,
                      e.what());
        r = ErrorXml({500, "InternalError", "internal error"}, s->req.path);
      }
      {
        std::lock_guard<std::mutex> g(s->mu);
        s->done = std::move(r);
      }
      s->cv.notify_all();
      kept_alive_running.fetch_sub(1);
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: answered when done
    kept_alive_running.fetch_sub(1);
    return WithRequestId(work(req));
  }
  if (s->Wait(every)) return WithRequestId(std::move(*s->done));
  HttpResponse r;
  r.content_type = "application/xml";
  r.headers.emplace_back("x-amz-request-id", RequestId());
  r.generator = [s, every, pending = std::string(kXmlDeclaration), at = size_t{0}, ended = false](
                    char* buf, size_t cap) mutable -> Result<size_t> {
    if (at == pending.size() && !ended) {
      if (!s->Wait(every)) {
        buf[0] = ' ';
        return size_t{1};
      }
      pending = BodyAfterDeclaration(*s->done);
      at = 0;
      ended = true;
    }
    const size_t n = std::min(cap, pending.size() - at);
    std::memcpy(buf, pending.data() + at, n);
    at += n;
    return n;
  };
  return r;
}

using S3Handler = std::function<HttpResponse(S3Ctx&, const HttpRequest&)>;

// Every S3 answer carries a request id; errors are S3 XML.
Route MakeRoute(S3Ctx* ctx, S3Handler h, std::string query_key = "",
                std::optional<uint64_t> body_limit = 0) {
  Route r;
  r.query_key = std::move(query_key);
  r.body_limit = body_limit;
  r.handler = [ctx, h = std::move(h)](const HttpRequest& req) {
    return WithRequestId(h(*ctx, req));
  };
  return r;
}

#define S3_ACCESS(ref, ctx, req, write)                                        \
  auto ref##_v = Access(ctx, req, write);                                      \
  if (auto* e = std::get_if<S3Error>(&ref##_v)) return ErrorXml(*e, req.path); \
  BucketRef& ref = std::get<BucketRef>(ref##_v)

void AddOwner(pugi::xml_node parent, const char* name, const std::string& id,
              const std::string& display) {
  auto o = parent.append_child(name);
  o.append_child("ID").text().set(id.c_str());
  o.append_child("DisplayName").text().set(display.c_str());
}

std::string DisplayNameOf(S3Ctx& ctx, const std::string& user) {
  auto u = ctx.store->GetUser(user);
  return u.ok() ? u->display_name : user;
}

// ------------------------------------------------------------------------------ bucket ops

HttpResponse ListBuckets(S3Ctx& ctx, const HttpRequest& req) {
  const S3Grant& g = GrantOf(req);
  pugi::xml_document doc;
  auto root = doc.append_child("ListAllMyBucketsResult");
  root.append_attribute("xmlns") = kXmlns;
  AddOwner(root, "Owner", g.key->user, DisplayNameOf(ctx, g.key->user));
  auto list = root.append_child("Buckets");
  for (const auto& b : ctx.store->Buckets()) {
    if (b.owner != g.key->user || !g.key->MayUse(b.name)) continue;
    auto n = list.append_child("Bucket");
    n.append_child("Name").text().set(b.name.c_str());
    n.append_child("CreationDate")
        .text()
        .set(IsoTime(std::chrono::system_clock::from_time_t(b.created)).c_str());
  }
  return Xml(200, doc);
}

HttpResponse CreateBucket(S3Ctx& ctx, const HttpRequest& req) {
  const S3Grant& g = GrantOf(req);
  std::string name(req.Param("bucket"));
  if (auto e = CheckBody(req)) return ErrorXml(*e, req.path);
  if (Status st = CheckBucketName(name); !st.ok())
    return ErrorXml({400, "InvalidBucketName", st.message()}, req.path);
  if (!req.msg.body().empty())
    if (Status st = s3::CheckCreateBucketConfiguration(req.msg.body()); !st.ok())
      return ErrorXml(MalformedXml(st), req.path);
  // What the key may do first, as AWS checks the permission before the name.
  if (g.key->read_only)
    return ErrorXml({403, "AccessDenied", "this access key is read-only"}, req.path);
  if (!g.key->MayUse(name))
    return ErrorXml({403, "AccessDenied", "this access key is limited to other buckets"}, req.path);
  auto existing = ctx.store->FindBucket(name);
  if (!existing.ok() && existing.status().code() != Code::kNotFound)
    return ErrorXml(FromStatus(existing.status()), req.path);
  if (existing.ok() && existing->owner != g.key->user)
    return ErrorXml({409, "BucketAlreadyExists",
                     "the requested bucket name is not available; select a different name"},
                    req.path);
  if (existing.ok()) {
    // Lost only when this node serves its volume, the vfolder is missing there and its quota
    // scope is not (an unmounted volume, or one this node lacks, has neither: the binding
    // stays for the nodes that do serve it).
    auto v = ctx.svc->GetVolume(existing->volume);
    auto id = VFolderId::Parse(existing->vfid);
    const bool lost = v.ok() && id.ok() && (*v)->CheckVFolder(*id).code() == Code::kNotFound &&
                      id->scope && (*v)->quota().DescribeScope(*id->scope).ok();
    if (!lost) {  // us-east-1 answers 200 to its owner
      HttpResponse r = HttpResponse::Text(200, "", "application/xml");
      r.headers.emplace_back("Location", "/" + name);
      return r;
    }
    // Its vfolder went (deleted behind S3's back): the owner's create makes the bucket anew.
    spdlog::info("s3: bucket {} of {} lost its vfolder {}; made anew", name, g.key->user,
                 existing->vfid);
    Status gone = ctx.store->UnbindBucket(name, existing->vfid);
    if (!gone.ok() && gone.code() != Code::kNotFound) return ErrorXml(FromStatus(gone), req.path);
  }
  // (Two nodes at once may each make the last one allowed.)
  if (ctx.store->BucketsOf(g.key->user) >= ctx.opts.max_buckets)
    return ErrorXml({400, "TooManyBuckets",
                     fmt::format("you have attempted to create more buckets than allowed ({}, "
                                 "[api.s3] max-buckets)",
                                 ctx.opts.max_buckets)},
                    req.path);
  auto user = ctx.store->GetUser(g.key->user);
  if (!user.ok()) return ErrorXml(FromStatus(user.status()), req.path);
  auto scope = QuotaScopeId::Parse(user->default_scope);
  if (!scope.ok()) return ErrorXml(FromStatus(scope.status()), req.path);
  VFolderId vfid{*scope, RandomHexString(16)};
  Status made = ctx.svc->CreateVFolder(user->default_volume, vfid, 0755, std::nullopt);
  if (!made.ok()) return ErrorXml(FromStatus(made, "NoSuchBucket"), req.path);
  S3Bucket b{name, user->default_volume, vfid.ToString(), user->id, 0, true};
  Status bound = ctx.store->BindBucket(b);
  if (!bound.ok()) {
    (void)ctx.svc->DeleteVFolder(user->default_volume, vfid);
    auto again = ctx.store->FindBucket(name);
    if (bound.code() == Code::kAlreadyExists && again.ok() && again->owner == user->id)
      return HttpResponse::Text(200, "", "application/xml");
    if (bound.code() == Code::kAlreadyExists)
      return ErrorXml({409, "BucketAlreadyExists",
                       "the requested bucket name is not available; select a different name"},
                      req.path);
    return ErrorXml(FromStatus(bound), req.path);
  }
  spdlog::info("s3: bucket {} created for {} as vfolder {} on {}", name, user->id, b.vfid,
               b.volume);
  HttpResponse r = HttpResponse::Text(200, "", "application/xml");
  r.headers.emplace_back("Location", "/" + name);
  return r;
}

HttpResponse HeadBucket(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  Status st = ref.volume->CheckVFolder(ref.vfid);
  if (!st.ok()) return ErrorXml(FromStatus(st, "NoSuchBucket"), req.path);
  HttpResponse r = HttpResponse::Text(200, "", "application/xml");
  r.headers.emplace_back("x-amz-bucket-region", ctx.opts.region);
  return r;
}

HttpResponse DeleteBucket(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  // From the emptiness check to the vfolder's delete, no publish on this node (see HoldVFolder).
  auto held = ctx.objects.HoldVFolder(*ref.volume, ref.vfid);
  auto empty = ctx.objects.Empty(*ref.volume, ref.vfid);
  if (!empty.ok() && empty.status().code() != Code::kNotFound)
    return ErrorXml(FromStatus(empty.status()), req.path);
  if (empty.ok() && !*empty)
    return ErrorXml({409, "BucketNotEmpty", "the bucket you tried to delete is not empty"},
                    req.path);
  Status st = ctx.store->UnbindBucket(ref.bucket.name, ref.bucket.vfid);
  if (!st.ok()) return ErrorXml(FromStatus(st, "NoSuchBucket"), req.path);
  // A bucket bound to an existing vfolder leaves it be, less its uploads in progress (which
  // went with the bucket: no sweep would find them); one S3 made goes with its vfolder.
  // (Another name bound to the same vfolder: the uploads are its own.)
  if (!ref.bucket.owns_vfolder && empty.ok() &&
      !ctx.store->Serves(ref.bucket.volume, ref.bucket.vfid))
    (void)ctx.objects.SweepMultipart(*ref.volume, ref.vfid, std::chrono::seconds(0));
  if (ref.bucket.owns_vfolder && empty.ok() &&
      ctx.store->Serves(ref.bucket.volume, ref.bucket.vfid)) {
    // Another name serves the vfolder too (bound by an operator): it stays, as theirs.
    spdlog::info("s3: bucket {} deleted; its vfolder {} stays, served by another name",
                 ref.bucket.name, ref.bucket.vfid);
  } else if (ref.bucket.owns_vfolder && empty.ok()) {
    auto task = ctx.svc->DeleteVFolder(ref.bucket.volume, ref.vfid);
    if (!task.ok())
      spdlog::warn("s3: bucket {} deleted; its vfolder {} stays: {}", ref.bucket.name,
                   ref.bucket.vfid, task.status().ToString());
  }
  HttpResponse r = HttpResponse::NoContent();
  r.content_type.clear();
  return r;
}

HttpResponse GetBucketLocation(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  (void)ref;
  pugi::xml_document doc;
  auto n = doc.append_child("LocationConstraint");
  n.append_attribute("xmlns") = kXmlns;
  if (ctx.opts.region != "us-east-1") n.text().set(ctx.opts.region.c_str());
  return Xml(200, doc);
}

HttpResponse GetBucketVersioning(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  (void)ref;
  pugi::xml_document doc;
  doc.append_child("VersioningConfiguration").append_attribute("xmlns") = kXmlns;
  return Xml(200, doc);
}

HttpResponse AclOf(S3Ctx& ctx, const std::string& owner) {
  pugi::xml_document doc;
  auto root = doc.append_child("AccessControlPolicy");
  root.append_attribute("xmlns") = kXmlns;
  std::string display = DisplayNameOf(ctx, owner);
  AddOwner(root, "Owner", owner, display);
  auto grant = root.append_child("AccessControlList").append_child("Grant");
  auto grantee = grant.append_child("Grantee");
  grantee.append_attribute("xmlns:xsi") = "http://www.w3.org/2001/XMLSchema-instance";
  grantee.append_attribute("xsi:type") = "CanonicalUser";
  grantee.append_child("ID").text().set(owner.c_str());
  grantee.append_child("DisplayName").text().set(display.c_str());
  grant.append_child("Permission").text().set("FULL_CONTROL");
  return Xml(200, doc);
}

HttpResponse GetBucketAcl(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  return AclOf(ctx, ref.bucket.owner);
}

HttpResponse PutBucketAcl(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  (void)ref;
  // Canned ACLs are accepted and change nothing: access is by key, never by ACL.
  HttpResponse r = HttpResponse::Text(200, "", "application/xml");
  return r;
}

// ------------------------------------------------------------------------------ listing

std::string Enc(const std::string& s, bool url) {
  return url ? s3::UriEncode(s, true) : s;
}

HttpResponse ListObjectsAny(S3Ctx& ctx, const HttpRequest& req, bool versions) {
  S3_ACCESS(ref, ctx, req, false);
  const bool v2 = !versions && QueryParam(req, "list-type").value_or("") == "2";
  ListQuery q;
  q.prefix = QueryParam(req, "prefix").value_or("");
  q.delimiter = QueryParam(req, "delimiter").value_or("");
  auto enc_type = QueryParam(req, "encoding-type");
  if (enc_type && *enc_type != "url")
    return ErrorXml({400, "InvalidArgument", "Invalid Encoding Method specified in Request"},
                    req.path);
  const bool url = enc_type.has_value();
  if (QueryParam(req, "max-keys")) {
    auto mk = IntParam(req, "max-keys", 0, std::numeric_limits<int32_t>::max());
    if (!mk)
      return ErrorXml(
          {400, "InvalidArgument", "Provided max-keys not an integer or within integer range"},
          req.path);
    q.max_keys = std::min(static_cast<size_t>(*mk), size_t{1000});
  }
  std::optional<std::string> token, start_after, marker;
  if (v2) {
    token = QueryParam(req, "continuation-token");
    start_after = QueryParam(req, "start-after");
    if (token) {
      auto t = Base64UrlDecode(*token);
      if (token->empty() || !t.ok() || t->empty() || t->front() != 'k')
        return ErrorXml({400, "InvalidArgument", "The continuation token provided is incorrect"},
                        req.path);
      q.after = t->substr(1);
    } else if (start_after) {
      q.after = *start_after;
    }
  } else {
    marker = QueryParam(req, versions ? "key-marker" : "marker");
    if (marker) q.after = *marker;
  }
  // Every object's one version is "null": a version marker adds nothing to the key marker,
  // and is echoed (AWS refuses one without a key marker).
  std::optional<std::string> version_marker;
  if (versions) version_marker = QueryParam(req, "version-id-marker");
  if (version_marker && !marker)
    return ErrorXml(
        {400, "InvalidArgument", "A version-id marker cannot be specified without a key marker."},
        req.path);
  // Sluice's bounded listing: nothing after end-key (inclusive), so that workers given the
  // ranges of ?list-split stop at the end of theirs.
  if (auto end = QueryParam(req, "end-key")) q.end = *end;
  auto page = ctx.objects.List(*ref.volume, ref.vfid, q);
  if (!page.ok()) return ErrorXml(FromStatus(page.status(), "NoSuchBucket"), req.path);

  // Written directly (s3/xml_text.h), the same bytes pugixml wrote, element by element.
  std::string x;
  x.reserve(512 + page->items.size() * 320);
  const char* root = versions ? "ListVersionsResult" : "ListBucketResult";
  x.append("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<").append(root);
  x.append(" xmlns=\"").append(kXmlns).append("\">");
  auto add = [&x](std::string_view name, std::string_view v) { s3::AppendXmlElement(x, name, v); };
  add("Name", ref.bucket.name);
  add("Prefix", Enc(q.prefix, url));
  if (v2) {
    if (token) add("ContinuationToken", *token);
    if (start_after) add("StartAfter", Enc(*start_after, url));
    add("KeyCount", std::to_string(page->items.size()));
  } else {
    add(versions ? "KeyMarker" : "Marker", Enc(marker.value_or(""), url));
    if (versions) add("VersionIdMarker", version_marker.value_or(""));
  }
  add("MaxKeys", std::to_string(q.max_keys));
  if (!q.delimiter.empty()) add("Delimiter", Enc(q.delimiter, url));
  add("IsTruncated", page->truncated ? "true" : "false");
  if (page->truncated && !page->items.empty()) {
    const std::string& last = page->items.back().object.key;
    if (v2)
      add("NextContinuationToken", Base64UrlEncode("k" + last));
    else if (versions) {
      add("NextKeyMarker", Enc(last, url));
      add("NextVersionIdMarker", "null");
    } else if (!q.delimiter.empty())
      add("NextMarker", Enc(last, url));
  }
  if (q.end) add("EndKey", Enc(*q.end, url));
  if (url) add("EncodingType", "url");
  const bool owner = !v2 || QueryParam(req, "fetch-owner").value_or("") == "true";
  std::string display = owner ? DisplayNameOf(ctx, ref.bucket.owner) : "";
  const std::string_view item = versions ? "Version" : "Contents";
  for (const auto& it : page->items) {
    if (it.is_prefix) continue;
    x.append("<").append(item).append(">");
    if (url)
      add("Key", Enc(it.object.key, url));
    else
      add("Key", it.object.key);
    if (versions) {
      add("VersionId", "null");
      add("IsLatest", "true");
    }
    add("LastModified", IsoTime(it.object.modified));
    add("ETag", it.object.etag);
    add("Size", std::to_string(it.object.size));
    if (owner) {
      x.append("<Owner>");
      add("ID", ref.bucket.owner);
      add("DisplayName", display);
      x.append("</Owner>");
    }
    add("StorageClass", "STANDARD");
    x.append("</").append(item).append(">");
  }
  for (const auto& it : page->items) {
    if (!it.is_prefix) continue;
    x.append("<CommonPrefixes>");
    add("Prefix", Enc(it.object.key, url));
    x.append("</CommonPrefixes>");
  }
  x.append("</").append(root).append(">");
  return HttpResponse::Text(200, std::move(x), "application/xml");
}

// Sluice's split listing (GET /bucket?list-split&parts=N[&prefix=P]): N key ranges holding
// about the same number of keys, for N workers to list in parallel with start-after and end-key.
HttpResponse ListSplit(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  SplitQuery q;
  q.prefix = QueryParam(req, "prefix").value_or("");
  auto parts = IntParam(req, "parts", 1, 10000);
  if (!parts)
    return ErrorXml({400, "InvalidArgument", "parts must be an integer from 1 to 10000"}, req.path);
  q.parts = static_cast<size_t>(*parts);
  auto enc_type = QueryParam(req, "encoding-type");
  if (enc_type && *enc_type != "url")
    return ErrorXml({400, "InvalidArgument", "Invalid Encoding Method specified in Request"},
                    req.path);
  const bool url = enc_type.has_value();
  auto split = SplitKeys(*ref.volume, ref.vfid, q);
  if (!split.ok()) return ErrorXml(FromStatus(split.status(), "NoSuchBucket"), req.path);
  pugi::xml_document doc;
  auto root = doc.append_child("ListSplitResult");
  root.append_attribute("xmlns") = kXmlns;
  auto add = [](pugi::xml_node n, const char* name, const std::string& v) {
    n.append_child(name).text().set(v.c_str());
  };
  add(root, "Name", ref.bucket.name);
  add(root, "Prefix", Enc(q.prefix, url));
  add(root, "Parts", std::to_string(q.parts));
  add(root, "EstimatedKeyCount", std::to_string(split->estimated));
  add(root, "Exact", split->exact ? "true" : "false");
  if (url) add(root, "EncodingType", "url");
  for (const auto& r : split->ranges) {
    auto n = root.append_child("Range");
    if (r.start_after) add(n, "StartAfter", Enc(*r.start_after, url));
    if (r.end_key) add(n, "EndKey", Enc(*r.end_key, url));
    add(n, "EstimatedKeyCount", std::to_string(r.estimated));
  }
  return Xml(200, doc);
}

// ------------------------------------------------------------------------------ objects

std::string KeyOf(const HttpRequest& req) {
  return std::string(req.Param("key"));
}

// Bytes as the attribute's JSON holds them: '"' and '\' are escaped (header values hold no
// control characters, and UTF-8 is kept as it is).
size_t StoredSize(std::string_view v) {
  return v.size() + std::count_if(v.begin(), v.end(), [](char c) { return c == '"' || c == '\\'; });
}

// Object metadata from a PUT's headers; MetadataTooLarge past S3's 2 KB of user metadata.
std::variant<ObjectMeta, S3Error> MetaFromHeaders(const HttpRequest& req) {
  // What is stored must be UTF-8 (it is kept as JSON and answered as headers again); HTTP lets
  // a client send any byte above 0x7f.
  for (const auto& f : req.msg) {
    const std::string_view n = f.name_string();
    const bool stored =
        boost::beast::iequals(n, "Content-Type") ||
        (n.size() > 11 && boost::beast::iequals(n.substr(0, 11), "x-amz-meta-")) ||
        std::any_of(std::begin(kStoredHeaders), std::end(kStoredHeaders),
                    [&](std::string_view h) { return boost::beast::iequals(n, h); });
    if (stored && !IsAscii(f.value()) && SanitizeUtf8(f.value()) != f.value())
      return S3Error{400, "InvalidArgument", fmt::format("header {} is not valid UTF-8", n)};
  }
  ObjectMeta m;
  m.content_type = std::string(Header(req, "Content-Type"));
  for (auto name : kStoredHeaders) {
    std::string v(Header(req, name));
    if (name == "Content-Encoding") {
      // aws-chunked is how the body travelled, never what the object is.
      std::string kept;
      for (std::string_view rest = v; !rest.empty();) {
        size_t comma = rest.find(',');
        std::string_view part = rest.substr(0, comma);
        while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
        while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
        if (!part.empty() && !boost::beast::iequals(part, "aws-chunked"))
          kept += (kept.empty() ? "" : ",") + std::string(part);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
      v = kept;
    }
    if (!v.empty()) m.headers[std::string(name)] = v;
  }
  size_t user_bytes = 0;
  for (const auto& f : req.msg) {
    std::string n = std::string(f.name_string());
    std::transform(n.begin(), n.end(), n.begin(), ::tolower);
    if (!StartsWith(n, "x-amz-meta-")) continue;
    std::string k = n.substr(11);
    if (k.empty())
      return S3Error{400, "InvalidArgument", "a metadata header needs a name after x-amz-meta-"};
    user_bytes += StoredSize(k) + StoredSize(f.value());
    m.user[k] = std::string(f.value());
  }
  if (user_bytes > kMaxUserMeta)
    return S3Error{400, "MetadataTooLarge",
                   fmt::format("your metadata headers are {} bytes; the limit is {}", user_bytes,
                               kMaxUserMeta)};
  // The standard headers go into the same extended attribute, which a file system bounds
  // (ext4: one 4 KiB block for all of a file's): refused here, before the body is sent, rather
  // than when the object is published.
  size_t standard = StoredSize(m.content_type);
  for (const auto& [k, v] : m.headers) standard += k.size() + StoredSize(v);
  if (standard > kMaxStandardMeta)
    return S3Error{400, "MetadataTooLarge",
                   fmt::format("the headers stored with the object (Content-Type, Cache-Control, "
                               "Content-Disposition, ...) are {} bytes; the limit is {}",
                               standard, kMaxStandardMeta)};
  return m;
}

// What a PUT body must be checked against: the signed payload hash, Content-MD5, a checksum,
// its length; and how it is encoded (aws-chunked, with chunk signatures or a trailer).
struct PutBody {
  std::string payload;             // x-amz-content-sha256: hex, UNSIGNED-PAYLOAD or STREAMING-...
  std::string content_md5;         // raw, or ""
  std::optional<uint64_t> length;  // of the object (decoded)
  std::optional<s3::AwsChunkedDecoder::Options> chunked;
  std::optional<ChecksumAlgo> checksum;
  std::string checksum_value;  // base64 from the header; "" when it comes in the trailer
  bool checksum_trailer = false;
};

std::optional<uint64_t> ParseCount(std::string_view v) {
  if (v.empty() || v.size() > 19 || !std::all_of(v.begin(), v.end(), ::isdigit))
    return std::nullopt;
  return std::stoull(std::string(v));
}

std::variant<PutBody, S3Error> BodyOf(S3Ctx& ctx, const HttpRequest& req) {
  PutBody b;
  const s3::SigV4Auth& auth = GrantOf(req).auth;
  b.payload = auth.payload_hash;
  const bool streaming = StartsWith(b.payload, "STREAMING-");
  if (streaming) {
    s3::AwsChunkedDecoder::Options o;
    if (b.payload == s3::kStreamingSigned || b.payload == s3::kStreamingSignedTrailer) {
      if (auth.presigned)
        return S3Error{400, "InvalidRequest", "a presigned URL cannot stream a signed payload"};
      o.signed_chunks = true;
      o.signing_key = CachedSigningKey(*GrantOf(req).key, auth);
    } else if (b.payload != s3::kStreamingUnsignedTrailer) {
      return S3Error{501, "NotImplemented",
                     fmt::format("payload mode {} is not implemented", b.payload)};
    }
    o.trailer = b.payload != s3::kStreamingSigned;
    o.auth = auth;
    if (auto d = Header(req, "x-amz-decoded-content-length"); !d.empty()) {
      o.decoded_length = ParseCount(d);
      if (!o.decoded_length)
        return S3Error{400, "InvalidArgument", "x-amz-decoded-content-length is not a number"};
      b.length = o.decoded_length;
    } else if (b.payload == s3::kStreamingSigned) {
      return S3Error{411, "MissingContentLength",
                     "x-amz-decoded-content-length is required with aws-chunked bodies"};
    }
    b.chunked = std::move(o);
  } else if (b.payload != s3::kUnsignedPayload && b.payload.size() != 64) {
    return BadPayloadHash();
  } else {
    auto cl = ParseCount(Header(req, "Content-Length"));
    if (!cl)
      return S3Error{411, "MissingContentLength",
                     "you must provide the Content-Length HTTP header"};
    b.length = *cl;
  }
  if (b.length && *b.length > kMaxPutSize)
    return S3Error{400, "EntityTooLarge", "your proposed upload exceeds the maximum allowed size"};
  if (auto md5 = Header(req, "Content-MD5"); !md5.empty()) {
    auto raw = Base64Decode(md5);
    if (!raw.ok() || raw->size() != 16)
      return S3Error{400, "InvalidDigest", "the Content-MD5 you specified is not valid"};
    b.content_md5 = *raw;
  }
  // One checksum per request: a header with its value, or a trailer announced by x-amz-trailer,
  // or just the algorithm (computed and stored).
  for (auto a : kAllChecksums) {
    auto v = Header(req, ChecksumHeader(a));
    if (v.empty()) continue;
    if (b.checksum)
      return S3Error{400, "InvalidRequest", "expecting a single x-amz-checksum- header"};
    auto raw = Base64Decode(v);
    if (!raw.ok() || raw->size() != ChecksumSize(a))
      return S3Error{400, "InvalidRequest",
                     fmt::format("value for {} header is invalid", ChecksumHeader(a))};
    b.checksum = a;
    b.checksum_value = std::string(v);
  }
  if (auto t = Header(req, "x-amz-trailer"); !t.empty()) {
    std::string name(t);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    auto a =
        StartsWith(name, "x-amz-checksum-") ? ChecksumAlgoFromName(name.substr(15)) : std::nullopt;
    if (!a || !b.chunked || !b.chunked->trailer)
      return S3Error{400, "InvalidRequest",
                     fmt::format("the trailer {} is not supported with payload {}", t, b.payload)};
    // (Even of the same algorithm: the trailer's value would replace the header's unread.)
    if (b.checksum)
      return S3Error{400, "InvalidRequest", "expecting a single x-amz-checksum- header"};
    b.checksum = a;
    b.checksum_trailer = true;
    b.chunked->announced = name;
  }
  for (auto h : {"x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"}) {
    auto v = Header(req, h);
    if (v.empty()) continue;
    auto a = ChecksumAlgoFromName(v);
    if (!a)
      return S3Error{400, "InvalidRequest",
                     fmt::format("checksum algorithm {} is not supported", v)};
    if (b.checksum && *b.checksum != *a)
      return S3Error{400, "InvalidRequest",
                     fmt::format("{} names another algorithm than the checksum sent", h)};
    b.checksum = a;
  }
  (void)ctx;
  return b;
}

// A body of at most `limit` bytes read whole, then `handler` called with it in the request (for
// a buffered route reached through a streaming one's pattern).
class BufferedBody : public BodySink {
 public:
  BufferedBody(const HttpRequest& req, size_t limit,
               std::function<HttpResponse(const HttpRequest&)> handler)
      : req_(req), limit_(limit), handler_(std::move(handler)) {}
  Status Write(const char* data, size_t n) override {
    if (req_.msg.body().size() + n > limit_)
      return Status(Code::kTooLarge, fmt::format("the request body is over {} bytes", limit_));
    req_.msg.body().append(data, n);
    return Status::Ok();
  }
  HttpResponse Finish() override { return handler_(req_); }
  void Abort(const Status&) override {}
  HttpResponse Fail(const Status& error) override { return ErrorXml(FromStatus(error), req_.path); }

 private:
  HttpRequest req_;
  size_t limit_;
  std::function<HttpResponse(const HttpRequest&)> handler_;
};

// Streams a PUT body (decoding aws-chunked on the way) into an ObjectWriter, checks it, and
// publishes the object.
class PutSink : public BodySink {
 public:
  // An upload's part: a writer that finds its upload gone answers NoSuchUpload.
  void ForPart() { not_found_ = "NoSuchUpload"; }
  PutSink(std::unique_ptr<ObjectWriter> w, ObjectMeta meta, PutBody body, bool if_none_match,
          S3Ctx* ctx, BucketRef ref, std::string key, std::string resource)
      : w_(std::move(w)),
        meta_(std::move(meta)),
        b_(std::move(body)),
        if_none_match_(if_none_match),
        ctx_(ctx),
        ref_(std::move(ref)),
        key_(std::move(key)),
        resource_(std::move(resource)) {
    if (b_.chunked) decoder_.emplace(*b_.chunked);
    if (b_.checksum) sum_.emplace(*b_.checksum);
  }

  Status Write(const char* data, size_t n) override {
    if (!decoder_) return Take(data, n);
    Status out_error;
    if (auto e = decoder_->Feed(
            data, n, [this](const char* d, size_t m) { return Take(d, m); }, &out_error)) {
      if (!out_error.ok()) return out_error;
      error_ = *e;
      return Status(Code::kInvalidArgument, e->message);
    }
    return Status::Ok();
  }

  HttpResponse Finish() override {
    w_->Digest();
    if (decoder_) {
      if (auto e = decoder_->Finish()) return Refuse(*e);
    }
    if (b_.length && w_->written() != *b_.length)
      return Refuse({400, "IncompleteBody",
                     "you did not provide the number of bytes specified by the Content-Length "
                     "HTTP header"});
    if (b_.payload.size() == 64 && HexEncode(w_->sha256_raw()) != b_.payload)
      return Refuse({400, "XAmzContentSHA256Mismatch",
                     "the provided x-amz-content-sha256 header does not match what was computed"});
    if (!b_.content_md5.empty() && w_->md5_raw() != b_.content_md5)
      return Refuse(
          {400, "BadDigest", "the Content-MD5 you specified did not match what we received"});
    std::string checksum;
    if (sum_) {
      checksum = Base64Encode(sum_->Final());
      std::string want = b_.checksum_value;
      if (b_.checksum_trailer) {
        auto it = decoder_->trailers().find(std::string(ChecksumHeader(*b_.checksum)));
        if (it == decoder_->trailers().end())
          return Refuse({400, "MalformedTrailerError",
                         fmt::format("the trailer {} was announced but not sent",
                                     ChecksumHeader(*b_.checksum))});
        want = it->second;
        auto raw = Base64Decode(want);  // as a header's value is checked
        if (!raw.ok() || raw->size() != ChecksumSize(*b_.checksum))
          return Refuse(
              {400, "InvalidRequest",
               fmt::format("value for {} trailer is invalid", ChecksumHeader(*b_.checksum))});
      }
      if (!want.empty() && want != checksum)
        return Refuse({400, "BadDigest",
                       fmt::format("the {} you specified did not match the calculated checksum",
                                   ChecksumName(*b_.checksum))});
      meta_.checksums[ChecksumKey(*b_.checksum)] = checksum;
    }
    const S3Error precondition{412, "PreconditionFailed",
                               "at least one of the pre-conditions you specified did not hold"};
    if (if_none_match_) {
      // Checked now (no publish for a key already there), and again by the rename itself
      // where the volume can (RENAME_NOREPLACE): of two racing writers, one wins.
      auto o = ctx_->objects.Open(*ref_.volume, ref_.vfid, key_);
      if (o.ok()) return Refuse(precondition);
      w_->RefuseReplace();
    }
    Status st = w_->Publish(std::move(meta_), ctx_->opts.durable);
    if (!st.ok() && if_none_match_ && st.code() == Code::kAlreadyExists)
      return ErrorXml(precondition, resource_);
    if (!st.ok()) return ErrorXml(WriteFailure(ref_, st, not_found_.c_str()), resource_);
    HttpResponse r = HttpResponse::Text(200, "", "application/xml");
    r.headers.emplace_back("ETag", "\"" + HexEncode(w_->md5_raw()) + "\"");
    if (sum_) {
      r.headers.emplace_back(std::string(ChecksumHeader(*b_.checksum)), checksum);
      r.headers.emplace_back("x-amz-checksum-type", "FULL_OBJECT");
    }
    r.headers.emplace_back("x-amz-request-id", RequestId());
    return r;
  }

  void Abort(const Status& why) override { w_->Abort(); }

  HttpResponse Fail(const Status& error) override {
    w_->Abort();
    return ErrorXml(error_ ? *error_ : FromStatus(error), resource_);
  }

 private:
  Status Take(const char* data, size_t n) {
    if (w_->written() + n > kMaxPutSize)
      return Status(Code::kTooLarge, "your proposed upload exceeds the maximum allowed size");
    if (sum_) sum_->Update(data, n);
    return w_->Write(data, n);
  }

  HttpResponse Refuse(const S3Error& e) {
    w_->Abort();
    return ErrorXml(e, resource_);
  }

  std::unique_ptr<ObjectWriter> w_;
  ObjectMeta meta_;
  PutBody b_;
  bool if_none_match_;
  S3Ctx* ctx_;
  BucketRef ref_;
  std::string key_, resource_;
  std::optional<s3::AwsChunkedDecoder> decoder_;
  std::optional<Checksummer> sum_;
  std::optional<S3Error> error_;         // why the body was refused mid-way
  std::string not_found_ = "NoSuchKey";  // what a writer finding its place gone answers
};

// ------------------------------------------------------------------------------ copies

// Buckets are unversioned: a version id other than "null" (see UnknownVersion).
const S3Error kInvalidVersion{400, "InvalidArgument", "Invalid version id specified"};

// The object x-amz-copy-source names, opened if the caller may read it and the copy-source
// conditionals hold.
struct CopySource {
  BucketRef ref;
  std::string key;
  ObjectStore::Opened object;
  std::string etag;  // quoted
};

std::variant<CopySource, S3Error> OpenCopySource(S3Ctx& ctx, const HttpRequest& req) {
  // The version is found before decoding: a key may hold "?versionId=" itself (encoded).
  std::string_view raw = Header(req, "x-amz-copy-source");
  if (size_t q = raw.find("?versionId="); q != std::string_view::npos) {
    if (PercentDecode(raw.substr(q + 11), false) != "null")
      return kInvalidVersion;  // as for the object itself
    raw = raw.substr(0, q);
  }
  std::string v = PercentDecode(raw, false);
  if (!v.empty() && v.front() == '/') v.erase(0, 1);
  size_t slash = v.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == v.size())
    return S3Error{400, "InvalidArgument", "x-amz-copy-source must be <bucket>/<key>, URL-encoded"};
  CopySource src;
  auto ref = AccessBucket(ctx, req, v.substr(0, slash), false);
  if (auto* e = std::get_if<S3Error>(&ref)) return *e;
  src.ref = std::move(std::get<BucketRef>(ref));
  src.key = v.substr(slash + 1);
  auto o = ctx.objects.Open(*src.ref.volume, src.ref.vfid, src.key);
  if (!o.ok()) return FromStatus(o.status());
  if (!o->file) return S3Error{400, "InvalidRequest", "a directory marker cannot be copied"};
  src.object = std::move(o).value();
  src.etag = ObjectETag(src.object.entry, src.object.meta);
  const std::time_t mtime = std::chrono::system_clock::to_time_t(src.object.entry.modified);
  const S3Error failed{412, "PreconditionFailed",
                       "at least one of the pre-conditions you specified did not hold"};
  auto im = Header(req, "x-amz-copy-source-if-match");
  auto inm = Header(req, "x-amz-copy-source-if-none-match");
  auto ims = Header(req, "x-amz-copy-source-if-modified-since");
  auto ius = Header(req, "x-amz-copy-source-if-unmodified-since");
  if (!im.empty() && !IfNoneMatchMatches(im, src.etag)) return failed;
  if (im.empty() && !ius.empty())
    if (auto t = ParseHttpDate(ius); t && mtime > *t) return failed;
  if (!inm.empty() && IfNoneMatchMatches(inm, src.etag)) return failed;
  if (inm.empty() && !ims.empty())
    if (auto t = ParseHttpDate(ims); t && mtime <= *t) return failed;
  return src;
}

// "<Checksum{ALGO}>value</...>", as S3's XML results carry checksums.
void AddChecksum(pugi::xml_node n, ChecksumAlgo a, const std::string& value) {
  n.append_child(fmt::format("Checksum{}", ChecksumName(a)).c_str()).text().set(value.c_str());
}

HttpResponse CopyResult(const char* root_name, const std::string& etag,
                        std::chrono::system_clock::time_point modified,
                        std::optional<std::pair<ChecksumAlgo, std::string>> checksum = {}) {
  pugi::xml_document doc;
  auto root = doc.append_child(root_name);
  root.append_attribute("xmlns") = kXmlns;
  root.append_child("LastModified").text().set(IsoTime(modified).c_str());
  root.append_child("ETag").text().set(etag.c_str());
  if (checksum) AddChecksum(root, checksum->first, checksum->second);
  return Xml(200, doc);
}

// CopyObject: the data with copy_file_range (a reflink where the volume can), the metadata
// copied or replaced (x-amz-metadata-directive).
// `refuse_replace`: If-None-Match: * (412 where the key is there).
HttpResponse CopyObject(S3Ctx& ctx, const HttpRequest& req, const BucketRef& dst,
                        bool refuse_replace) {
  std::string key = KeyOf(req);
  if (!key.empty() && key.back() == '/')
    return ErrorXml({400, "InvalidArgument", "a key ending in '/' names a directory here"},
                    req.path);
  auto sv = OpenCopySource(ctx, req);
  if (auto* e = std::get_if<S3Error>(&sv)) return ErrorXml(*e, req.path);
  CopySource& src = std::get<CopySource>(sv);
  auto directive = Header(req, "x-amz-metadata-directive");
  if (!directive.empty() && directive != "COPY" && directive != "REPLACE")
    return ErrorXml({400, "InvalidArgument", "x-amz-metadata-directive is COPY or REPLACE"},
                    req.path);
  const bool replace = directive == "REPLACE";
  if (!replace && src.ref.bucket.name == dst.bucket.name && src.key == key)
    return ErrorXml({400, "InvalidRequest",
                     "this copy request is illegal because it is trying to copy an object to "
                     "itself without changing the object's metadata"},
                    req.path);
  ObjectMeta meta;
  if (replace) {
    auto m = MetaFromHeaders(req);
    if (auto* e = std::get_if<S3Error>(&m)) return ErrorXml(*e, req.path);
    meta = std::move(std::get<ObjectMeta>(m));
  } else if (src.object.meta) {
    meta = *src.object.meta;
  }
  // The same bytes: the source's MD5 ETag and checksums stay true; a source without a stored
  // ETag leaves the copy with a validator.
  meta.etag = src.object.meta ? src.object.meta->etag : "";
  meta.checksums = src.object.meta ? src.object.meta->checksums : decltype(meta.checksums)();
  const uint64_t size = src.object.entry.size;
  const S3Error precondition{412, "PreconditionFailed",
                             "at least one of the pre-conditions you specified did not hold"};
  if (refuse_replace && ctx.objects.Open(*dst.volume, dst.vfid, key, false).ok())
    return ErrorXml(precondition, req.path);
  auto w = ctx.objects.BeginPut(*dst.volume, dst.vfid, key, size, false);
  if (!w.ok()) return ErrorXml(FromStatus(w.status()), req.path);
  if (refuse_replace) (*w)->RefuseReplace();  // and the rename refuses where it can (as PUT)
  Status st = (*w)->CopyFrom(*src.object.file, size);
  if (st.ok()) st = (*w)->Publish(std::move(meta), ctx.opts.durable);
  if (refuse_replace && st.code() == Code::kAlreadyExists) return ErrorXml(precondition, req.path);
  if (!st.ok()) return ErrorXml(WriteFailure(dst, st), req.path);
  auto made = ctx.objects.Open(*dst.volume, dst.vfid, key);
  if (!made.ok()) return ErrorXml(FromStatus(made.status()), req.path);
  return CopyResult("CopyObjectResult", ObjectETag(made->entry, made->meta), made->entry.modified);
}

StreamStart PutObject(S3Ctx& ctx, const HttpRequest& req) {
  auto fail = [&](const S3Error& e) -> StreamStart { return ErrorXml(e, req.path); };
  auto access = Access(ctx, req, true);
  if (auto* e = std::get_if<S3Error>(&access)) return fail(*e);
  BucketRef& ref = std::get<BucketRef>(access);
  std::string key = KeyOf(req);
  // Checked before anything else, CopyObject included: a condition ignored is an unconditional
  // overwrite.
  auto inm = Header(req, "If-None-Match");
  if (!inm.empty() && inm != "*")
    return fail({501, "NotImplemented", "If-None-Match on PUT takes only '*'"});
  // Conditional writes other than If-None-Match: * (If-Match, AWS's compare-and-swap) are not
  // implemented: refused rather than ignored, which would overwrite unconditionally.
  if (!Header(req, "If-Match").empty())
    return fail({501, "NotImplemented", "If-Match on PUT is not implemented"});
  if (!Header(req, "x-amz-copy-source").empty())
    return KeepingAlive(ctx, req, [&ctx, ref, refuse = inm == "*"](const HttpRequest& r) {
      return CopyObject(ctx, r, ref, refuse);
    });
  auto body = BodyOf(ctx, req);
  if (auto* e = std::get_if<S3Error>(&body)) return fail(*e);
  auto& b = std::get<PutBody>(body);
  auto meta = MetaFromHeaders(req);
  if (auto* e = std::get_if<S3Error>(&meta)) return fail(*e);
  if (!key.empty() && key.back() == '/') {
    if (!b.length || *b.length != 0)
      return fail(
          {400, "InvalidArgument", "a key ending in '/' names a directory here and takes no data"});
    if (auto parts = KeyParts(key); !parts.ok()) return fail(FromStatus(parts.status()));
    if (inm == "*" && ctx.objects.Open(*ref.volume, ref.vfid, key, false).ok())
      return fail({412, "PreconditionFailed",
                   "at least one of the pre-conditions you specified did not hold"});
    Status st = ctx.objects.PutDirectory(*ref.volume, ref.vfid, key);
    if (!st.ok()) return fail(FromStatus(st));
    HttpResponse r = HttpResponse::Text(200, "", "application/xml");
    r.headers.emplace_back("ETag", "\"d41d8cd98f00b204e9800998ecf8427e\"");
    r.headers.emplace_back("x-amz-request-id", RequestId());
    return r;
  }
  auto w = ctx.objects.BeginPut(*ref.volume, ref.vfid, key, b.length, b.payload.size() == 64);
  if (!w.ok()) return fail(FromStatus(w.status()));
  return std::unique_ptr<BodySink>(new PutSink(std::move(w).value(),
                                               std::move(std::get<ObjectMeta>(meta)), std::move(b),
                                               inm == "*", &ctx, ref, key, req.path));
}

std::variant<MultipartUpload, S3Error> UploadOf(S3Ctx& ctx, const BucketRef& ref,
                                                const HttpRequest& req);

// UploadPartCopy: a part from (a range of) an object. Parts are named by their MD5, so the
// bytes go through memory to be hashed.
HttpResponse UploadPartCopy(S3Ctx& ctx, const HttpRequest& req, const BucketRef& ref,
                            const MultipartUpload& u, int part) {
  auto sv = OpenCopySource(ctx, req);
  if (auto* e = std::get_if<S3Error>(&sv)) return ErrorXml(*e, req.path);
  CopySource& src = std::get<CopySource>(sv);
  const uint64_t size = src.object.entry.size;
  uint64_t first = 0, length = size;
  if (auto r = Header(req, "x-amz-copy-source-range"); !r.empty()) {
    // bytes=first-last, both given, inside the object.
    unsigned long long a = 0, b = 0;
    char tail = 0;
    if (std::sscanf(std::string(r).c_str(), "bytes=%llu-%llu%c", &a, &b, &tail) != 2 || a > b ||
        b >= size)
      return ErrorXml({400, "InvalidArgument",
                       "the x-amz-copy-source-range value must be of the form bytes=first-last "
                       "where first and last are the zero-based offsets of the first and last "
                       "bytes to copy"},
                      req.path);
    first = a;
    length = b - a + 1;
  }
  if (length > kMaxPutSize)
    return ErrorXml({400, "EntityTooLarge", "a part is at most 5 GiB"}, req.path);
  auto w = ctx.objects.BeginPart(*ref.volume, ref.vfid, u, part, length, false);
  if (!w.ok()) return ErrorXml(FromStatus(w.status()), req.path);
  std::optional<Checksummer> sum;
  if (auto algo = ChecksumAlgoFromName(u.checksum_algo)) sum.emplace(*algo);
  std::vector<char> buf(std::min<uint64_t>(length, 1 << 20) + 1);
  for (uint64_t at = first, left = length; left > 0;) {
    auto got = src.object.file->ReadAt(at, buf.data(), std::min<uint64_t>(left, buf.size()));
    if (!got.ok()) return ErrorXml(FromStatus(got.status()), req.path);
    if (*got == 0)
      return ErrorXml({409, "OperationAborted", "the source object changed while being copied"},
                      req.path);
    Status st = (*w)->Write(buf.data(), *got);
    if (!st.ok()) return ErrorXml(FromStatus(st), req.path);
    if (sum) sum->Update(buf.data(), *got);
    at += *got;
    left -= *got;
  }
  ObjectMeta meta;
  std::string checksum;
  if (sum) {
    checksum = Base64Encode(sum->Final());
    meta.checksums[ChecksumKey(sum->algo())] = checksum;
  }
  Status st = (*w)->Publish(std::move(meta), ctx.opts.durable);
  if (!st.ok()) return ErrorXml(FromStatus(st, "NoSuchUpload"), req.path);
  HttpResponse r = CopyResult(
      "CopyPartResult", "\"" + HexEncode((*w)->md5_raw()) + "\"", std::chrono::system_clock::now(),
      sum ? std::optional<std::pair<ChecksumAlgo, std::string>>({sum->algo(), checksum})
          : std::nullopt);
  return r;
}

StreamStart UploadPart(S3Ctx& ctx, const HttpRequest& req) {
  auto fail = [&](const S3Error& e) -> StreamStart { return ErrorXml(e, req.path); };
  auto access = Access(ctx, req, true);
  if (auto* e = std::get_if<S3Error>(&access)) return fail(*e);
  BucketRef& ref = std::get<BucketRef>(access);
  auto part = IntParam(req, "partNumber", 1, kMaxPartNumber);
  if (!part)
    return fail({400, "InvalidArgument", "part number must be an integer between 1 and 10000"});
  auto uv = UploadOf(ctx, ref, req);
  if (auto* e = std::get_if<S3Error>(&uv)) return fail(*e);
  if (!Header(req, "x-amz-copy-source").empty())
    return KeepingAlive(
        ctx, req, [&ctx, ref, u = std::get<MultipartUpload>(uv), n = *part](const HttpRequest& r) {
          return UploadPartCopy(ctx, r, ref, u, n);
        });
  auto body = BodyOf(ctx, req);
  if (auto* e = std::get_if<S3Error>(&body)) return fail(*e);
  auto& b = std::get<PutBody>(body);
  const MultipartUpload& upload = std::get<MultipartUpload>(uv);
  if (auto algo = ChecksumAlgoFromName(upload.checksum_algo)) {
    if (b.checksum && *b.checksum != *algo)
      return fail({400, "InvalidRequest",
                   fmt::format("the upload was created using a {} checksum; this part carries a "
                               "{} checksum",
                               upload.checksum_algo, ChecksumName(*b.checksum))});
    b.checksum = algo;  // computed when the client sent none
  }
  auto w = ctx.objects.BeginPart(*ref.volume, ref.vfid, std::get<MultipartUpload>(uv), *part,
                                 b.length, b.payload.size() == 64);
  if (!w.ok()) return fail(FromStatus(w.status()));
  auto sink = std::make_unique<PutSink>(std::move(w).value(), ObjectMeta(), std::move(b), false,
                                        &ctx, ref, KeyOf(req), req.path);
  sink->ForPart();
  return std::unique_ptr<BodySink>(std::move(sink));
}

// On an empty object: true when `range` is a byte range S3 refuses (416). Only a lone suffix
// `bytes=-N` (N > 0) is satisfiable there, by the whole empty object (RFC 9110 §14.1.1); a
// range the parser ignores is ignored here too.
bool UnsatisfiableWhenEmpty(std::string_view range) {
  auto r = ParseRange(range, 1, 1);
  if (r.kind == RangeRequest::Kind::kIgnore) return false;
  std::string_view spec = range.substr(range.find('=') + 1);
  while (!spec.empty() && spec.front() == ' ') spec.remove_prefix(1);
  bool suffix = r.kind == RangeRequest::Kind::kSatisfiable && spec.starts_with('-') &&
                spec.find(',') == std::string_view::npos &&
                spec.find_first_not_of("-0") != spec.npos;
  return !suffix;
}

// S3's conditional GET/HEAD: 412 for If-Match / If-Unmodified-Since, 304 for If-None-Match /
// If-Modified-Since.
std::optional<unsigned> Preconditions(const HttpRequest& req, const std::string& etag,
                                      std::time_t mtime) {
  auto im = Header(req, "If-Match");
  auto ius = Header(req, "If-Unmodified-Since");
  auto inm = Header(req, "If-None-Match");
  auto ims = Header(req, "If-Modified-Since");
  if (!im.empty()) {
    if (!IfNoneMatchMatches(im, etag)) return 412;
  } else if (!ius.empty()) {
    if (auto t = ParseHttpDate(ius); t && mtime > *t) return 412;
  }
  if (!inm.empty()) {
    if (IfNoneMatchMatches(inm, etag)) return 304;
  } else if (!ims.empty()) {
    if (auto t = ParseHttpDate(ims); t && mtime <= *t) return 304;
  }
  return std::nullopt;
}

// The answer to GET or HEAD of an object, opened.
HttpResponse ObjectResponse(const HttpRequest& req, ObjectStore::Opened* o) {
  const DirEntry& e = o->entry;
  const std::string etag = o->file ? ObjectETag(e, o->meta) : kMarkerETag;  // as listed
  const std::time_t mtime = std::chrono::system_clock::to_time_t(e.modified);
  const uint64_t size = o->file ? e.size : 0;

  std::string lines;
  char date_buf[kHttpDateSize];
  auto line = [&lines](std::string_view name, std::string_view value) {
    lines.append(name).append(": ").append(value).append("\r\n");
  };
  line("ETag", etag);
  line("Last-Modified", FormatHttpDate(mtime, date_buf));
  if (auto pc = Preconditions(req, etag, mtime)) {
    if (*pc == 412) {
      HttpResponse r = ErrorXml({412, "PreconditionFailed",
                                 "at least one of the pre-conditions you specified did not hold"},
                                req.path);
      return r;
    }
    // A 304 carries the caching headers the 200 would (RFC 9110 §15.4.5).
    if (o->meta)
      for (const auto& [k, v] : o->meta->headers)
        if (boost::beast::iequals(k, "Cache-Control") || boost::beast::iequals(k, "Expires"))
          line(k, v);
    HttpResponse r;
    r.status = 304;
    r.content_type.clear();
    r.header_lines = std::move(lines);
    return r;
  }
  line("Accept-Ranges", "bytes");
  const ObjectMeta* m = o->meta ? &*o->meta : nullptr;
  std::string ctype = m && !m->content_type.empty() ? m->content_type : "binary/octet-stream";
  // Stored headers, then response-* overrides in their place (signed requests only, which
  // all are here).
  std::map<std::string, std::string, std::less<>> stored;
  if (m) stored.insert(m->headers.begin(), m->headers.end());
  // nullptr: the answer's content type.
  static constexpr std::pair<const char*, const char*> kOverrides[] = {
      {"response-cache-control", "Cache-Control"},
      {"response-content-disposition", "Content-Disposition"},
      {"response-content-encoding", "Content-Encoding"},
      {"response-content-language", "Content-Language"},
      {"response-expires", "Expires"},
      {"response-content-type", nullptr}};
  // Decoded query values become header values: a control character (CR, LF) would split the
  // answer's header, so such a value is refused.
  for (auto [q, h] : kOverrides)
    if (auto v = QueryParam(req, q)) {
      if (!HeaderValueSafe(*v))
        return ErrorXml({400, "InvalidArgument", fmt::format("{} holds a control character", q)},
                        req.path);
      if (h)
        stored[h] = *v;
      else
        ctype = *v;
    }
  for (const auto& [k, v] : stored) line(k, v);
  if (m)
    for (const auto& [k, v] : m->user) line("x-amz-meta-" + k, v);

  RangeRequest rr;
  bool ranged = false;
  if (QueryParam(req, "partNumber")) {
    auto pn = IntParam(req, "partNumber", 1, kMaxPartNumber);
    if (!pn)
      return ErrorXml(
          {400, "InvalidArgument", "part number must be an integer between 1 and 10000"}, req.path);
    if (!Header(req, "Range").empty())
      return ErrorXml({400, "InvalidRequest",
                       "cannot specify both Range header and partNumber query parameter"},
                      req.path);
    if (*pn != 1)
      return ErrorXml({416, "InvalidPartNumber", "the requested partnumber is not satisfiable"},
                      req.path);
    line("x-amz-mp-parts-count", "1");
  } else if (auto range = Header(req, "Range");
             !range.empty() && (Header(req, "If-Range").empty() ||
                                IfRangeMatches(Header(req, "If-Range"), etag, mtime))) {
    // A range whose If-Range names another version is not honoured: the whole object is sent,
    // so that a resumed download never joins bytes of two versions.
    rr = ParseRange(range, size, 1);
    if (size == 0 && UnsatisfiableWhenEmpty(range)) rr.kind = RangeRequest::Kind::kUnsatisfiable;
    if (rr.kind == RangeRequest::Kind::kUnsatisfiable) {
      HttpResponse r =
          ErrorXml({416, "InvalidRange", "the requested range is not satisfiable"}, req.path);
      r.headers.emplace_back("Content-Range", fmt::format("bytes */{}", size));
      return r;
    }
    ranged = rr.kind == RangeRequest::Kind::kSatisfiable;
  }
  if (m && !ranged && boost::beast::iequals(Header(req, "x-amz-checksum-mode"), "ENABLED"))
    for (const auto& [algo, v] : m->checksums) {
      line("x-amz-checksum-" + algo, v);
      line("x-amz-checksum-type", v.find('-') == std::string::npos ? "FULL_OBJECT" : "COMPOSITE");
    }

  HttpResponse r;
  r.content_type = ctype;
  if (!o->file) {
    r.status = 200;
  } else if (ranged) {
    const ByteRange& br = rr.ranges.front();
    r.status = 206;
    line("Content-Range", fmt::format("bytes {}-{}/{}", br.first, br.last(), size));
    r.file = std::move(o->file);
    r.file_offset = br.first;
    r.file_length = br.length;
  } else {
    r.status = 200;
    r.file = std::move(o->file);
    r.file_offset = 0;
    r.file_length = size;
  }
  r.header_lines = std::move(lines);
  return r;
}

// Buckets are unversioned: the one version of an object is "null" (as ListObjectVersions says);
// any other version id is refused, as AWS refuses it on an unversioned bucket, rather than
// ignored (a DELETE of a version must not delete the object).
std::optional<S3Error> UnknownVersion(const HttpRequest& req) {
  auto v = QueryParam(req, "versionId");
  if (!v || *v == "null") return std::nullopt;
  return kInvalidVersion;
}

HttpResponse GetObject(S3Ctx& ctx, const HttpRequest& req) {
  if (auto e = UnknownVersion(req)) return ErrorXml(*e, req.path);
  S3_ACCESS(ref, ctx, req, false);
  auto o = ctx.objects.Open(*ref.volume, ref.vfid, KeyOf(req));
  if (!o.ok()) return ErrorXml(FromStatus(o.status()), req.path);
  return ObjectResponse(req, &*o);
}

// GET or HEAD of an object on the event loop, when that needs no I/O: the bucket loaded, the
// key allowed, the object's path and metadata in memory. Anything else (errors included) is
// left to GetObject on the pool (nullopt).
std::optional<HttpResponse> GetObjectInline(S3Ctx& ctx, const HttpRequest& req) {
  std::string key = KeyOf(req);
  if (key.empty()) return std::nullopt;  // the bucket itself
  if (!req.query.empty() && req.query.count("versionId")) return std::nullopt;
  const S3Grant& g = GrantOf(req);
  // Buckets as this thread last resolved them (volume, parsed vfid), while the store's
  // generation says nothing changed.
  struct Resolved {
    std::string owner;
    Volume* volume;
    VFolderId vfid;
  };
  thread_local std::unordered_map<std::string, Resolved> resolved;
  thread_local uint64_t generation = ~0ULL;
  if (uint64_t now = ctx.store->generation(); now != generation) {
    resolved.clear();
    generation = now;
  }
  std::string name(req.Param("bucket"));
  auto at = resolved.find(name);
  if (at == resolved.end()) {
    auto b = ctx.store->FindCachedBucket(name);
    if (!b) return std::nullopt;
    auto v = ctx.svc->GetVolume(b->volume);
    auto id = VFolderId::Parse(b->vfid);
    if (!v.ok() || !id.ok()) return std::nullopt;
    if (resolved.size() >= 4096) resolved.clear();
    at = resolved.emplace(name, Resolved{b->owner, *v, std::move(id).value()}).first;
  }
  const Resolved& b = at->second;
  if (b.owner != g.key->user || !g.key->MayUse(name)) return std::nullopt;
  auto o = ctx.objects.OpenCached(*b.volume, b.vfid, key);
  if (!o.ok()) return std::nullopt;
  return ObjectResponse(req, &*o);
}

// A key no file can be (KeyParts: "a//b", "./x") holds no object, and its delete succeeds as
// S3's does for a key that is not there.
Status DeleteKey(S3Ctx& ctx, const BucketRef& ref, std::string_view key) {
  Status st = ctx.objects.Delete(*ref.volume, ref.vfid, key);
  return st.code() == Code::kInvalidArgument && !key.empty() ? Status::Ok() : st;
}

HttpResponse DeleteObject(S3Ctx& ctx, const HttpRequest& req) {
  if (auto e = UnknownVersion(req)) return ErrorXml(*e, req.path);
  // AWS's conditional deletes (directory buckets, and general purpose buckets since 2024) are
  // not implemented: refused rather than ignored, which would delete unconditionally.
  for (const char* h : {"If-Match", "x-amz-if-match-last-modified-time", "x-amz-if-match-size"})
    if (!Header(req, h).empty())
      return ErrorXml({501, "NotImplemented", fmt::format("{} on DELETE is not implemented", h)},
                      req.path);
  S3_ACCESS(ref, ctx, req, true);
  Status st = DeleteKey(ctx, ref, KeyOf(req));
  if (!st.ok()) return ErrorXml(FromStatus(st), req.path);
  HttpResponse r = HttpResponse::NoContent();
  r.content_type.clear();
  return r;
}

HttpResponse DeleteObjects(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  if (auto e = CheckBody(req)) return ErrorXml(*e, req.path);
  auto parsed = s3::ParseDeleteObjects(req.msg.body());
  if (!parsed.ok()) return ErrorXml(MalformedXml(parsed.status()), req.path);
  const auto& [quiet, keys, refused] = *parsed;
  pugi::xml_document doc;
  auto root = doc.append_child("DeleteResult");
  root.append_attribute("xmlns") = kXmlns;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    S3Error e;
    if (auto no = refused.find(i); no != refused.end()) {
      e = {400, no->second.code, no->second.message};
    } else {
      Status st = DeleteKey(ctx, ref, k);
      if (st.ok()) {
        if (!quiet) root.append_child("Deleted").append_child("Key").text().set(k.c_str());
        continue;
      }
      e = FromStatus(st);
    }
    auto n = root.append_child("Error");
    n.append_child("Key").text().set(k.c_str());
    n.append_child("Code").text().set(e.code.c_str());
    n.append_child("Message").text().set(e.message.c_str());
  }
  return Xml(200, doc);
}

// ------------------------------------------------------------------------------ multipart

constexpr uint64_t kMinPartSize = 5ULL << 20;

S3Error NoSuchUpload() {
  return {404, "NoSuchUpload",
          "the specified upload does not exist; the upload ID may be invalid, or the upload may "
          "have been aborted or completed"};
}

// The upload named by ?uploadId, if it is one of this key's.
std::variant<MultipartUpload, S3Error> UploadOf(S3Ctx& ctx, const BucketRef& ref,
                                                const HttpRequest& req) {
  auto u =
      ctx.objects.GetMultipart(*ref.volume, ref.vfid, QueryParam(req, "uploadId").value_or(""));
  if (!u.ok())
    return u.status().code() == Code::kNotFound ? NoSuchUpload() : FromStatus(u.status());
  if (u->key != KeyOf(req)) return NoSuchUpload();
  return std::move(u).value();
}

void AddInitiator(S3Ctx& ctx, pugi::xml_node n, const std::string& owner) {
  std::string display = DisplayNameOf(ctx, owner);
  AddOwner(n, "Initiator", owner, display);
  AddOwner(n, "Owner", owner, display);
  n.append_child("StorageClass").text().set("STANDARD");
}

HttpResponse CreateMultipartUpload(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  std::string key = KeyOf(req);
  if (!key.empty() && key.back() == '/')
    return ErrorXml({400, "InvalidArgument", "a key ending in '/' names a directory here"},
                    req.path);
  auto meta = MetaFromHeaders(req);
  if (auto* e = std::get_if<S3Error>(&meta)) return ErrorXml(*e, req.path);
  // The object's checksum: an algorithm, and whether the parts' checksums are combined into a
  // full-object CRC or checksummed together (COMPOSITE). AWS's defaults: CRC64NVME full-object,
  // the others composite; SHA checksums cannot be full-object, CRC64NVME cannot be composite.
  std::string algo, type(Header(req, "x-amz-checksum-type"));
  if (auto a = Header(req, "x-amz-checksum-algorithm"); !a.empty()) {
    auto known = ChecksumAlgoFromName(a);
    if (!known)
      return ErrorXml(
          {400, "InvalidRequest", fmt::format("checksum algorithm {} is not supported", a)},
          req.path);
    algo = ChecksumName(*known);
    if (type.empty()) type = *known == ChecksumAlgo::kCrc64Nvme ? "FULL_OBJECT" : "COMPOSITE";
    if (type != "FULL_OBJECT" && type != "COMPOSITE")
      return ErrorXml({400, "InvalidRequest", "x-amz-checksum-type is COMPOSITE or FULL_OBJECT"},
                      req.path);
    if ((type == "FULL_OBJECT" && !IsCrc(*known)) ||
        (type == "COMPOSITE" && *known == ChecksumAlgo::kCrc64Nvme))
      return ErrorXml({400, "InvalidRequest",
                       fmt::format("the {} checksum type cannot be used with the {} checksum "
                                   "algorithm",
                                   type, algo)},
                      req.path);
  } else if (!type.empty()) {
    return ErrorXml({400, "InvalidRequest", "x-amz-checksum-type needs x-amz-checksum-algorithm"},
                    req.path);
  }
  // (Concurrent creates may pass the bound by as many as race: it bounds the listings' cost.)
  auto in_progress = ctx.objects.CountMultipart(*ref.volume, ref.vfid);
  if (!in_progress.ok()) return ErrorXml(FromStatus(in_progress.status()), req.path);
  if (*in_progress >= ctx.opts.max_multipart_uploads)
    return ErrorXml({400, "InvalidRequest",
                     fmt::format("the bucket has {} multipart uploads in progress, the most "
                                 "[api.s3] max-multipart-uploads allows; complete or abort some",
                                 *in_progress)},
                    req.path);
  auto u = ctx.objects.CreateMultipart(*ref.volume, ref.vfid, key,
                                       std::move(std::get<ObjectMeta>(meta)), algo, type);
  if (!u.ok()) return ErrorXml(FromStatus(u.status()), req.path);
  pugi::xml_document doc;
  auto root = doc.append_child("InitiateMultipartUploadResult");
  root.append_attribute("xmlns") = kXmlns;
  root.append_child("Bucket").text().set(ref.bucket.name.c_str());
  root.append_child("Key").text().set(key.c_str());
  root.append_child("UploadId").text().set(u->id.c_str());
  HttpResponse r = Xml(200, doc);
  if (!algo.empty()) {
    r.headers.emplace_back("x-amz-checksum-algorithm", algo);
    r.headers.emplace_back("x-amz-checksum-type", type);
  }
  return r;
}

HttpResponse CompleteMultipartUpload(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  if (auto e = CheckBody(req, false)) return ErrorXml(*e, req.path);
  auto listed = s3::ParseCompleteMultipart(req.msg.body());
  if (!listed.ok()) return ErrorXml(MalformedXml(listed.status()), req.path);
  const std::vector<s3::CompletePart>& asked = *listed;
  auto result = [&](const std::string& etag, const std::map<std::string, std::string>& sums) {
    pugi::xml_document doc;
    auto r = doc.append_child("CompleteMultipartUploadResult");
    r.append_attribute("xmlns") = kXmlns;
    r.append_child("Location")
        .text()
        .set(fmt::format("/{}/{}", ref.bucket.name, KeyOf(req)).c_str());
    r.append_child("Bucket").text().set(ref.bucket.name.c_str());
    r.append_child("Key").text().set(KeyOf(req).c_str());
    r.append_child("ETag").text().set(("\"" + etag + "\"").c_str());
    for (const auto& [name, value] : sums) {
      if (auto a = ChecksumAlgoFromName(name)) AddChecksum(r, *a, value);
      r.append_child("ChecksumType")
          .text()
          .set(value.find('-') == std::string::npos ? "FULL_OBJECT" : "COMPOSITE");
    }
    return Xml(200, doc);
  };
  auto uv = UploadOf(ctx, ref, req);
  if (auto* e = std::get_if<S3Error>(&uv)) {
    // A retried Complete whose first attempt went through: the object is there with the ETag
    // these parts make.
    std::vector<std::string> md5s;
    for (const auto& a : asked) md5s.push_back(a.md5);
    std::string want = MultipartETag(md5s);
    auto o = ctx.objects.Open(*ref.volume, ref.vfid, KeyOf(req));
    if (e->code == "NoSuchUpload" && o.ok() && o->meta && o->meta->etag == want)
      return result(want, o->meta->checksums);
    return ErrorXml(*e, req.path);
  }
  // Conditional writes as on PUT: If-None-Match: * (the key must be absent), nothing else.
  const std::string_view inm = Header(req, "If-None-Match");
  if (!inm.empty() && inm != "*")
    return ErrorXml({501, "NotImplemented", "If-None-Match on a write takes only '*'"}, req.path);
  if (!Header(req, "If-Match").empty())
    return ErrorXml({501, "NotImplemented", "If-Match on a write is not implemented"}, req.path);
  const MultipartUpload& u = std::get<MultipartUpload>(uv);
  auto have = ctx.objects.ListParts(*ref.volume, ref.vfid, u);
  if (!have.ok()) return ErrorXml(FromStatus(have.status()), req.path);
  std::map<int, const UploadedPart*> by_number;
  for (const auto& p : *have) by_number[p.number] = &p;
  std::vector<UploadedPart> use;
  for (size_t i = 0; i < asked.size(); ++i) {
    if (i > 0 && asked[i].number <= asked[i - 1].number)
      return ErrorXml({400, "InvalidPartOrder",
                       "the list of parts was not in ascending order; parts must be ordered by "
                       "part number"},
                      req.path);
    auto it = by_number.find(asked[i].number);
    if (it == by_number.end() || it->second->md5 != asked[i].md5)
      return ErrorXml({400, "InvalidPart",
                       fmt::format("part {} could not be found, or its entity tag does not match",
                                   asked[i].number)},
                      req.path);
    for (const auto& [name, value] : asked[i].checksums) {
      auto have = it->second->checksums.find(name);
      if (have == it->second->checksums.end() || have->second != value)
        return ErrorXml({400, "InvalidPart",
                         fmt::format("part {}'s {} checksum does not match the one it was "
                                     "uploaded with",
                                     asked[i].number, name)},
                        req.path);
    }
    use.push_back(*it->second);
  }
  for (size_t i = 0; i + 1 < use.size(); ++i)
    if (use[i].size < kMinPartSize)
      return ErrorXml({400, "EntityTooSmall",
                       fmt::format("part {} is {} bytes; every part but the last must be at "
                                   "least 5 MiB",
                                   use[i].number, use[i].size)},
                      req.path);
  // The object's checksum from the parts' (never from the data again), checked against the
  // one the client computed, when it sent one.
  std::map<std::string, std::string> sums;
  if (auto algo = ChecksumAlgoFromName(u.checksum_algo)) {
    auto sum = MultipartChecksum(u, use);
    if (!sum.ok()) return ErrorXml({400, "InvalidRequest", sum.status().message()}, req.path);
    if (auto want = Header(req, ChecksumHeader(*algo)); !want.empty()) {
      std::string_view mine = *sum;
      if (want != mine && want != mine.substr(0, mine.rfind('-')))
        return ErrorXml({400, "BadDigest",
                         fmt::format("the {} you specified did not match the calculated checksum",
                                     u.checksum_algo)},
                        req.path);
    }
    sums[ChecksumKey(*algo)] = *sum;
  }
  auto etag = ctx.objects.CompleteMultipart(*ref.volume, ref.vfid, u, use, sums, ctx.opts.durable,
                                            inm == "*");
  if (!etag.ok() && inm == "*" && etag.status().code() == Code::kAlreadyExists)
    return ErrorXml({412, "PreconditionFailed",
                     "at least one of the pre-conditions you specified did not hold"},
                    req.path);
  if (!etag.ok()) return ErrorXml(WriteFailure(ref, etag.status()), req.path);
  return result(*etag, sums);
}

HttpResponse AbortMultipartUpload(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  auto uv = UploadOf(ctx, ref, req);
  if (auto* e = std::get_if<S3Error>(&uv)) return ErrorXml(*e, req.path);
  Status st = ctx.objects.AbortMultipart(*ref.volume, ref.vfid, std::get<MultipartUpload>(uv));
  if (!st.ok())
    return ErrorXml(st.code() == Code::kNotFound ? NoSuchUpload() : FromStatus(st), req.path);
  HttpResponse r = HttpResponse::NoContent();
  r.content_type.clear();
  return r;
}

HttpResponse ListParts(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  auto uv = UploadOf(ctx, ref, req);
  if (auto* e = std::get_if<S3Error>(&uv)) return ErrorXml(*e, req.path);
  const MultipartUpload& u = std::get<MultipartUpload>(uv);
  auto parts = ctx.objects.ListParts(*ref.volume, ref.vfid, u);
  if (!parts.ok()) return ErrorXml(FromStatus(parts.status()), req.path);
  int max = 1000, marker = 0;
  if (QueryParam(req, "max-parts")) {
    auto m = IntParam(req, "max-parts", 0, 1000000);
    if (!m) return ErrorXml({400, "InvalidArgument", "max-parts must be an integer"}, req.path);
    max = std::min(*m, 1000);
  }
  if (QueryParam(req, "part-number-marker")) {
    auto m = IntParam(req, "part-number-marker", 0, kMaxPartNumber);
    if (!m)
      return ErrorXml({400, "InvalidArgument", "part-number-marker must be an integer"}, req.path);
    marker = *m;
  }
  pugi::xml_document doc;
  auto root = doc.append_child("ListPartsResult");
  root.append_attribute("xmlns") = kXmlns;
  root.append_child("Bucket").text().set(ref.bucket.name.c_str());
  root.append_child("Key").text().set(u.key.c_str());
  root.append_child("UploadId").text().set(u.id.c_str());
  AddInitiator(ctx, root, ref.bucket.owner);
  auto algo = ChecksumAlgoFromName(u.checksum_algo);
  if (algo) {
    root.append_child("ChecksumAlgorithm").text().set(u.checksum_algo.c_str());
    root.append_child("ChecksumType").text().set(u.checksum_type.c_str());
  }
  root.append_child("PartNumberMarker").text().set(marker);
  int shown = 0, last = marker;
  bool truncated = false;
  for (const auto& p : *parts) {
    if (p.number <= marker) continue;
    if (shown == max) {
      // (max-parts=0 lists none and is complete, as max-keys=0 is: a page that says "more"
      // without advancing would be asked again forever.)
      truncated = max > 0;
      break;
    }
    auto n = root.append_child("Part");
    n.append_child("PartNumber").text().set(p.number);
    n.append_child("LastModified").text().set(IsoTime(p.modified).c_str());
    n.append_child("ETag").text().set(("\"" + HexEncode(p.md5) + "\"").c_str());
    n.append_child("Size").text().set(std::to_string(p.size).c_str());
    for (const auto& [name, value] : p.checksums)
      if (auto a = ChecksumAlgoFromName(name)) AddChecksum(n, *a, value);
    last = p.number;
    ++shown;
  }
  root.append_child("NextPartNumberMarker").text().set(last);
  root.append_child("MaxParts").text().set(max);
  root.append_child("IsTruncated").text().set(truncated ? "true" : "false");
  return Xml(200, doc);
}

HttpResponse ListMultipartUploads(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  std::string prefix = QueryParam(req, "prefix").value_or("");
  std::string delimiter = QueryParam(req, "delimiter").value_or("");
  std::string key_marker = QueryParam(req, "key-marker").value_or("");
  std::string id_marker = QueryParam(req, "upload-id-marker").value_or("");
  auto enc_type = QueryParam(req, "encoding-type");
  if (enc_type && *enc_type != "url")
    return ErrorXml({400, "InvalidArgument", "Invalid Encoding Method specified in Request"},
                    req.path);
  const bool url = enc_type.has_value();
  int max = 1000;
  if (QueryParam(req, "max-uploads")) {
    auto m = IntParam(req, "max-uploads", 0, std::numeric_limits<int32_t>::max());
    if (!m) return ErrorXml({400, "InvalidArgument", "max-uploads must be an integer"}, req.path);
    max = std::min(*m, 1000);
  }
  auto all = ctx.objects.ListMultipart(*ref.volume, ref.vfid);
  if (!all.ok()) return ErrorXml(FromStatus(all.status(), "NoSuchBucket"), req.path);
  pugi::xml_document doc;
  auto root = doc.append_child("ListMultipartUploadsResult");
  root.append_attribute("xmlns") = kXmlns;
  root.append_child("Bucket").text().set(ref.bucket.name.c_str());
  root.append_child("KeyMarker").text().set(Enc(key_marker, url).c_str());
  root.append_child("UploadIdMarker").text().set(id_marker.c_str());
  if (!prefix.empty()) root.append_child("Prefix").text().set(Enc(prefix, url).c_str());
  if (!delimiter.empty()) root.append_child("Delimiter").text().set(Enc(delimiter, url).c_str());
  int shown = 0;
  bool truncated = false;
  std::string next_key, next_id;
  std::vector<std::string> prefixes;  // answered after the uploads, as S3 does
  // In key order, a key's uploads in the order they began (their ids begin with that time): a
  // page resumes after the key marker's uploads, or after the upload the id marker names, also
  // when that one has gone since.
  for (const MultipartUpload& u : *all) {
    if (!StartsWith(u.key, prefix)) continue;
    if (!key_marker.empty() &&
        !(u.key > key_marker || (u.key == key_marker && !id_marker.empty() && u.id > id_marker)))
      continue;
    // With a delimiter, keys that hold it after the prefix roll up into one common prefix
    // (counted as one against max-uploads); a key marker that is one resumes after it.
    std::string cp;
    if (size_t at = delimiter.empty() ? std::string::npos : u.key.find(delimiter, prefix.size());
        at != std::string::npos)
      cp = u.key.substr(0, at + delimiter.size());
    if (!cp.empty() && (cp == next_key || cp <= key_marker)) continue;
    if (shown == max) {
      truncated = max > 0;  // (as ListParts: 0 lists none, and is complete)
      break;
    }
    ++shown;
    if (!cp.empty()) {
      prefixes.push_back(cp);
      next_key = cp;
      next_id.clear();
      continue;
    }
    auto n = root.append_child("Upload");
    n.append_child("Key").text().set(Enc(u.key, url).c_str());
    n.append_child("UploadId").text().set(u.id.c_str());
    AddInitiator(ctx, n, ref.bucket.owner);
    n.append_child("Initiated").text().set(IsoTime(u.initiated).c_str());
    if (!u.checksum_algo.empty()) {
      n.append_child("ChecksumAlgorithm").text().set(u.checksum_algo.c_str());
      n.append_child("ChecksumType").text().set(u.checksum_type.c_str());
    }
    next_key = u.key;
    next_id = u.id;
  }
  for (const auto& cp : prefixes)
    root.append_child("CommonPrefixes").append_child("Prefix").text().set(Enc(cp, url).c_str());
  if (shown > 0) {
    root.append_child("NextKeyMarker").text().set(Enc(next_key, url).c_str());
    root.append_child("NextUploadIdMarker").text().set(next_id.c_str());
  }
  root.append_child("MaxUploads").text().set(max);
  root.append_child("IsTruncated").text().set(truncated ? "true" : "false");
  if (url) root.append_child("EncodingType").text().set("url");
  return Xml(200, doc);
}

HttpResponse GetObjectAcl(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, false);
  auto o = ctx.objects.Open(*ref.volume, ref.vfid, KeyOf(req));
  if (!o.ok()) return ErrorXml(FromStatus(o.status()), req.path);
  return AclOf(ctx, ref.bucket.owner);
}

// As PutBucketAcl: accepted for an object that is there, and changes nothing.
HttpResponse PutObjectAcl(S3Ctx& ctx, const HttpRequest& req) {
  S3_ACCESS(ref, ctx, req, true);
  auto o = ctx.objects.Open(*ref.volume, ref.vfid, KeyOf(req), false);
  if (!o.ok()) return ErrorXml(FromStatus(o.status()), req.path);
  return HttpResponse::Text(200, "", "application/xml");
}

// ------------------------------------------------------------------------------ batch get

// Sluice's batch get (api/s3/batch_get.h): POST /?batch-get, or /bucket?batch-get for items
// without a bucket of their own, with a JSON body:
//   {"items": [{"key": "a/b.jpg"}, {"bucket": "other", "key": "k", "range": "bytes=0-99",
//               "opaque": "7"}], "continue-on-error": false, "manifest": true}
// answered with one TAR stream in request order.
HttpResponse BatchGet(S3Ctx& ctx, const HttpRequest& req) {
  if (auto e = CheckBody(req)) return ErrorXml(*e, req.path);
  auto bad = [&](std::string msg) {
    return ErrorXml({400, "InvalidArgument", std::move(msg)}, req.path);
  };
  auto parsed = s3::ParseBatchRequest(req.msg.body(), req.Param("bucket"));
  if (!parsed.ok()) return bad(parsed.status().message());
  const bool continue_on_error = parsed->continue_on_error, manifest = parsed->manifest;
  std::map<std::string, std::variant<BucketRef, S3Error>> buckets;
  std::vector<s3::BatchItem> items;
  items.reserve(parsed->items.size());
  for (size_t i = 0; i < parsed->items.size(); ++i) {
    s3::BatchSpec& spec = parsed->items[i];
    s3::BatchItem it;
    it.bucket = std::move(spec.bucket);
    it.key = std::move(spec.key);
    it.range = std::move(spec.range);
    it.opaque = std::move(spec.opaque);
    auto at = buckets.find(it.bucket);
    if (at == buckets.end()) {
      // Each bucket not loaded costs a record read on the shared volume: bounded per batch.
      if (buckets.size() == s3::kMaxBatchBuckets)
        return bad(
            fmt::format("item {}: a batch reads from at most {} buckets", i, s3::kMaxBatchBuckets));
      at = buckets.emplace(it.bucket, AccessBucket(ctx, req, it.bucket, false)).first;
    }
    if (auto* e = std::get_if<S3Error>(&at->second)) {
      if (!continue_on_error)
        return ErrorXml({e->status, e->code,
                         fmt::format("item {} (bucket '{}'): {}", i, it.bucket, e->message)},
                        req.path);
      it.refused = *e;
    } else {
      const BucketRef& ref = std::get<BucketRef>(at->second);
      it.volume = ref.volume;
      it.vfid = ref.vfid;
    }
    it.name = it.bucket + "/" + it.key;
    items.push_back(std::move(it));
  }
  auto stream = std::make_shared<s3::BatchGetStream>(
      &ctx.objects, std::move(items), continue_on_error, manifest,
      fmt::format("s3 batch-get of {} items for {}", items.size(), GrantOf(req).key->user));
  if (auto e = stream->Prepare()) return ErrorXml(*e, req.path);
  HttpResponse r;
  r.status = 200;
  r.content_type = "application/x-tar";
  r.generator = [stream](char* buf, size_t cap) { return stream->Read(buf, cap); };
  return r;
}

}  // namespace

std::shared_ptr<Router> MakeS3Router(StorageService* service, S3Store* store, ThreadPool* io_pool,
                                     S3Options options) {
  auto router = std::make_shared<Router>("s3", io_pool);
  // Lives as long as the router's routes.
  auto* ctx =
      new S3Ctx{service, store, ObjectStore(&service->reservations(), io_pool), std::move(options)};
  // Errors the HTTP layer makes (unparsable requests, limits, no route) are S3 XML too.
  // Presigned URLs' X-Amz-* parameters are the authenticator's, read from the raw target.
  router->SetQuerySkipPrefix("X-Amz-");
  // Sub-resources of S3 that Sluice does not serve: 501 NotImplemented, as AWS answers those it
  // lacks, never the plain object or bucket operation of the same method (which would delete
  // an object for DELETE ?tagging, or replace it with the XML of PUT ?retention).
  router->SetUnsupportedQueryKeys({"accelerate",
                                   "analytics",
                                   "attributes",
                                   "cors",
                                   "encryption",
                                   "intelligent-tiering",
                                   "inventory",
                                   "legal-hold",
                                   "lifecycle",
                                   "logging",
                                   "metadataConfiguration",
                                   "metadataTable",
                                   "metrics",
                                   "notification",
                                   "object-lock",
                                   "ownershipControls",
                                   "policy",
                                   "policyStatus",
                                   "publicAccessBlock",
                                   "renameObject",
                                   "replication",
                                   "requestPayment",
                                   "restore",
                                   "retention",
                                   "select",
                                   "select-type",
                                   "session",
                                   "tagging",
                                   "torrent",
                                   "website"});
  router->SetErrorFormatter([](const Status& st, unsigned status, std::string_view resource) {
    unsigned http = status ? status : static_cast<unsigned>(CodeHttpStatus(st.code()));
    std::string code = http == 405 ? "MethodNotAllowed" : std::string(CodeS3Error(st.code()));
    return ErrorXml({http, code, st.message()}, resource);
  });
  if (!ctx->opts.domain.empty())
    router->SetRewrite([ctx](HttpRequest& req) {
      if (auto b = HostBucket(req, ctx->opts.domain)) req.path = "/" + *b + req.path;
    });
  auto g = router->Group(MakeSigV4Authenticator(ctx));
  using V = http::verb;
  g.Add(V::get, "/", MakeRoute(ctx, ListBuckets));
  g.Add(V::post, "/", MakeRoute(ctx, BatchGet, "batch-get", kMaxBatchBody));
  auto versions = [](S3Ctx& c, const HttpRequest& r) { return ListObjectsAny(c, r, true); };
  auto list = [](S3Ctx& c, const HttpRequest& r) { return ListObjectsAny(c, r, false); };
  // "/bucket/" (an empty key) is the bucket itself, as some clients address it: every bucket
  // route is also reached through the object pattern with an empty key. `object` (null: none)
  // serves the same method and sub-resource when the key is not empty.
  // `object_inline`: GET and HEAD of objects are answered on the event loop when they need no
  // I/O (GetObjectInline).
  auto add = [&](V method, std::string sub, S3Handler bucket, S3Handler object,
                 std::optional<uint64_t> limit = 0, bool object_inline = false) {
    g.Add(method, "/{bucket}", MakeRoute(ctx, bucket, sub, limit));
    S3Handler either = [bucket, object](S3Ctx& c, const HttpRequest& r) {
      if (r.Param("key").empty()) return bucket(c, r);
      if (object) return object(c, r);
      return ErrorXml(
          {405, "MethodNotAllowed", "the specified method is not allowed against this resource"},
          r.path);
    };
    Route route = MakeRoute(ctx, either, sub, limit);
    if (object_inline)
      route.try_inline = [ctx](const HttpRequest& req) {
        auto res = GetObjectInline(*ctx, req);
        if (res) res->headers.emplace_back("x-amz-request-id", RequestId());
        return res;
      };
    g.Add(method, "/{bucket}/{key+}", std::move(route));
  };
  // Sub-resources first, then the plain routes.
  add(V::get, "location", GetBucketLocation, GetObject);
  add(V::get, "versioning", GetBucketVersioning, GetObject);
  add(V::get, "acl", GetBucketAcl, GetObjectAcl);
  add(V::put, "acl", PutBucketAcl, PutObjectAcl, 64 << 10);
  add(V::get, "versions", versions, GetObject);
  add(V::post, "delete", DeleteObjects, nullptr, 4 << 20);
  add(V::get, "uploads", ListMultipartUploads, GetObject);
  add(V::get, "list-split", ListSplit, GetObject);
  add(V::post, "batch-get", BatchGet, nullptr, kMaxBatchBody);
  // Multipart (keys only).
  g.Add(V::post, "/{bucket}/{key+}", MakeRoute(ctx, CreateMultipartUpload, "uploads", 64 << 10));
  g.Add(V::post, "/{bucket}/{key+}",
        MakeRoute(
            ctx,
            [](S3Ctx& c, const HttpRequest& r) {
              return KeepingAlive(
                  c, r, [&c](const HttpRequest& q) { return CompleteMultipartUpload(c, q); });
            },
            "uploadId", 4 << 20));
  g.Add(V::delete_, "/{bucket}/{key+}", MakeRoute(ctx, AbortMultipartUpload, "uploadId"));
  g.Add(V::get, "/{bucket}/{key+}", MakeRoute(ctx, ListParts, "uploadId"));
  Route part;
  part.query_key = "uploadId";
  part.stream = [ctx](const HttpRequest& req) { return UploadPart(*ctx, req); };
  g.Add(V::put, "/{bucket}/{key+}", std::move(part));
  add(V::get, "", list, GetObject, 0, true);
  add(V::head, "", HeadBucket, GetObject, 0, true);
  add(V::delete_, "", DeleteBucket, DeleteObject);
  g.Add(V::put, "/{bucket}", MakeRoute(ctx, CreateBucket, "", 64 << 10));
  Route put;
  put.stream = [ctx](const HttpRequest& req) -> StreamStart {
    if (!req.Param("key").empty()) return PutObject(*ctx, req);
    // "PUT /bucket/": CreateBucket, its body (a CreateBucketConfiguration) read first.
    return std::make_unique<BufferedBody>(req, 64 << 10, [ctx](const HttpRequest& whole) {
      HttpResponse r = CreateBucket(*ctx, whole);
      if (r.status < 300) r.headers.emplace_back("x-amz-request-id", RequestId());
      return r;
    });
  };
  g.Add(V::put, "/{bucket}/{key+}", std::move(put));
  return router;
}

}  // namespace sluice::api
