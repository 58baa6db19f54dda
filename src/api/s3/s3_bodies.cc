#include "api/s3/s3_bodies.h"

#include <algorithm>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "common/checksum.h"
#include "common/crypto.h"
#include "common/json.h"

namespace sluice::api::s3 {

namespace {

Status Malformed() {
  return Status(Code::kInvalidArgument,
                "the XML you provided was not well-formed or did not validate against our "
                "published schema");
}

bool LoadXml(pugi::xml_document& doc, std::string_view body) {
  return static_cast<bool>(doc.load_buffer(body.data(), body.size()));
}

}  // namespace

Result<DeleteRequest> ParseDeleteObjects(std::string_view body) {
  pugi::xml_document in;
  if (!LoadXml(in, body)) return Malformed();
  auto del = in.child("Delete");
  if (!del) return Malformed();
  DeleteRequest r;
  r.quiet = std::string_view(del.child_value("Quiet")) == "true";
  for (auto o : del.children("Object")) {
    if (!o.child("Key") || r.keys.size() == kMaxDeleteKeys) return Malformed();
    if (auto v = o.child("VersionId"); v && std::string_view(v.child_value()) != "null")
      r.refused[r.keys.size()] = {"InvalidArgument", "Invalid version id specified"};
    else if (o.child("ETag") || o.child("LastModifiedTime") || o.child("Size"))
      r.refused[r.keys.size()] = {"NotImplemented",
                                  "conditional deletes (ETag, LastModifiedTime, Size) are not "
                                  "implemented; the object was not deleted"};
    r.keys.emplace_back(o.child_value("Key"));
  }
  if (r.keys.empty()) return Malformed();
  return r;
}

Result<std::vector<CompletePart>> ParseCompleteMultipart(std::string_view body) {
  pugi::xml_document in;
  if (!LoadXml(in, body)) return Malformed();
  auto root = in.child("CompleteMultipartUpload");
  if (!root) return Malformed();
  std::vector<CompletePart> parts;
  for (auto p : root.children("Part")) {
    std::string_view num = p.child_value("PartNumber");
    std::string_view etag = p.child_value("ETag");
    if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
      etag = etag.substr(1, etag.size() - 2);
    if (num.empty() || num.size() > 5 || !std::all_of(num.begin(), num.end(), ::isdigit))
      return Malformed();
    CompletePart a;
    a.number = std::stoi(std::string(num));
    if (auto raw = HexDecode(etag); raw.ok() && raw->size() == 16) a.md5 = std::move(raw).value();
    for (auto algo : kAllChecksums)
      if (auto c = p.child(fmt::format("Checksum{}", ChecksumName(algo)).c_str()))
        a.checksums[ChecksumKey(algo)] = c.child_value();
    parts.push_back(std::move(a));
  }
  if (parts.empty()) return Malformed();
  return parts;
}

Status CheckCreateBucketConfiguration(std::string_view body) {
  pugi::xml_document doc;
  return LoadXml(doc, body) && doc.child("CreateBucketConfiguration") ? Status::Ok() : Malformed();
}

namespace {

// "bytes=" and one range spec: first-last, first- or -suffix (digits only). A batch item sends
// what its range names or fails: a spec a GET would ignore (a list, a typo) would send the
// whole object.
bool OneByteRange(std::string_view r) {
  if (!r.starts_with("bytes=")) return false;
  r.remove_prefix(6);
  const size_t dash = r.find('-');
  if (dash == std::string_view::npos) return false;
  auto digits = [](std::string_view d) {
    return d.size() <= 19 &&
           std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::string_view a = r.substr(0, dash), b = r.substr(dash + 1);
  if (a.empty() && b.empty()) return false;
  if (!digits(a) || !digits(b)) return false;
  if (!a.empty() && !b.empty() && std::stoull(std::string(a)) > std::stoull(std::string(b)))
    return false;
  return true;
}

}  // namespace

Result<BatchRequest> ParseBatchRequest(std::string_view body, std::string_view default_bucket) {
  auto bad = [](std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); };
  // Each item an object of at most four fields: more values than that cannot be a batch
  // this takes, and are refused before a document of them is built.
  SLUICE_ASSIGN_OR_RETURN(
      auto j, ParseJson(body, "the batch-get request", kMaxJsonDepth, kMaxBatchItems * 6 + 16));
  if (!j.is_object() || !j.contains("items") || !j["items"].is_array())
    return bad("the body must be a JSON object with an \"items\" array");
  BatchRequest r;
  for (const auto& [k, v] : j.items()) {
    if (k == "items") continue;
    bool* flag = k == "continue-on-error" ? &r.continue_on_error
                 : k == "manifest"        ? &r.manifest
                                          : nullptr;
    if (!flag) return bad(fmt::format("unknown field '{}'", k));
    if (!v.is_boolean()) return bad(fmt::format("'{}' must be true or false", k));
    *flag = v.get<bool>();
  }
  const auto& list = j["items"];
  if (list.empty() || list.size() > kMaxBatchItems)
    return bad(
        fmt::format("a batch holds 1 to {} items; this one has {}", kMaxBatchItems, list.size()));
  r.items.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& x = list[i];
    if (!x.is_object()) return bad(fmt::format("item {} is not an object", i));
    BatchSpec it;
    it.bucket = std::string(default_bucket);
    for (const auto& [k, v] : x.items()) {
      std::string* field = k == "key"      ? &it.key
                           : k == "bucket" ? &it.bucket
                           : k == "range"  ? &it.range
                           : k == "opaque" ? &it.opaque
                                           : nullptr;
      if (!field) return bad(fmt::format("item {}: unknown field '{}'", i, k));
      if (!v.is_string()) return bad(fmt::format("item {}: '{}' must be a string", i, k));
      *field = v.get<std::string>();
    }
    if (it.key.empty()) return bad(fmt::format("item {} has no key", i));
    // S3's own bounds: a key of more is no object, and each name is held twice per item
    // (entry name, manifest) while the batch streams.
    if (it.key.size() > kMaxBatchKey)
      return bad(fmt::format("item {}: the key is over {} bytes", i, kMaxBatchKey));
    if (it.bucket.size() > kMaxBatchBucket)
      return bad(fmt::format("item {}: the bucket name is over {} bytes", i, kMaxBatchBucket));
    if (it.bucket.empty())
      return bad(
          fmt::format("item {} names no bucket (POST /bucket?batch-get gives a default)", i));
    if (it.opaque.size() > kMaxBatchOpaque)
      return bad(fmt::format("item {}: opaque is over {} bytes", i, kMaxBatchOpaque));
    if (!it.range.empty() && !OneByteRange(it.range))
      return bad(fmt::format(
          "item {}: range must be one 'bytes=first-last', 'bytes=first-' or 'bytes=-suffix'", i));
    r.items.push_back(std::move(it));
  }
  return r;
}

}  // namespace sluice::api::s3
