#include "io/s3/s3_client.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "common/checksum.h"
#include "common/crypto.h"
#include "io/s3/transport.h"

namespace sluice::io::s3 {

namespace {

// Error answers and XML listings are read whole; a listing page of 1000 long keys stays far
// below this.
constexpr size_t kMaxAnswerBody = 32u << 20;

std::string StripQuotes(std::string_view s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return std::string(s);
}

// An upload id or ETag the origin answered, which this client sends back and callers keep
// (records are JSON): printable ASCII, as S3 makes them, or the answer is not one to trust.
// Not `required`: an empty one is taken as none.
Result<std::string> OriginToken(std::string v, const std::string& what, const char* name,
                                bool required = true) {
  if (v.empty() && required)
    return Status(Code::kUnavailable, fmt::format("{}: no {} in the answer", what, name));
  if (v.size() > 1024 ||
      std::any_of(v.begin(), v.end(), [](char c) { return c < 0x20 || c > 0x7e; }))
    return Status(Code::kUnavailable,
                  fmt::format("{}: the answer's {} is not printable ASCII", what, name));
  return v;
}

// The code an S3 error answer stands for.
Code CodeOf(unsigned status, std::string_view s3code) {
  if (s3code == "NoSuchKey" || s3code == "NoSuchBucket" || s3code == "NoSuchUpload")
    return Code::kNotFound;
  if (s3code == "BucketNotEmpty") return Code::kNotEmpty;
  if (s3code == "BucketAlreadyExists" || s3code == "BucketAlreadyOwnedByYou")
    return Code::kAlreadyExists;
  if (s3code == "QuotaExceeded") return Code::kQuotaExceeded;
  // An operation the server does not have, whatever the status: AWS answers 501, GCS's XML API
  // 400 (to DeleteObjects, for one). Callers that can do without it take this as the sign.
  if (s3code == "NotImplemented") return Code::kUnsupported;
  // The credentials themselves are refused (not a permission on one bucket or object).
  // So is every request signed with this clock or this region (a 403 and a 400 that are no
  // permission on one object, nor the caller's bad input).
  if (s3code == "SignatureDoesNotMatch" || s3code == "InvalidAccessKeyId" ||
      s3code == "ExpiredToken" || s3code == "InvalidToken" || s3code == "TokenRefreshRequired" ||
      s3code == "RequestTimeTooSkewed" || s3code == "AuthorizationHeaderMalformed")
    return Code::kUnauthenticated;
  switch (status) {
    case 404:
      return Code::kNotFound;
    case 401:
    case 403:
      return Code::kPermissionDenied;
    case 409:
    case 412:
      return Code::kConflict;
    case 413:
      return Code::kTooLarge;
    case 501:
      return Code::kUnsupported;
    case 507:
      return Code::kNoSpace;
    default:
      break;
  }
  return status >= 500 ? Code::kUnavailable : Code::kInvalidArgument;
}

bool Retryable(unsigned status, std::string_view s3code) {
  return status == 500 || status == 502 || status == 503 || status == 504 || s3code == "SlowDown" ||
         s3code == "RequestTimeout" || s3code == "InternalError";
}

std::string Child(const pugi::xml_node& n, const char* name) {
  return n.child(name).text().get();
}

// A 2xx answer's document, which must be a `root` (a gateway may answer 200 with another one;
// read as a listing or a delete, it would be an empty page or a delete that failed nothing).
Result<pugi::xml_document> ParseXml(const std::string& body, std::string_view what,
                                    std::string_view root) {
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size()))
    return Status(Code::kUnavailable, fmt::format("{}: the answer is not XML", what));
  if (std::string_view name = doc.document_element().name(); name != root)
    return Status(Code::kUnavailable,
                  fmt::format("{}: the answer is a <{}> document, not <{}>", what, name, root));
  return doc;
}

// Whether the document's first element is named Error (past the declaration, comments and
// whitespace), without parsing it.
bool RootIsError(std::string_view b) {
  for (size_t i = b.find('<'); i != std::string_view::npos; i = b.find('<', i + 1)) {
    if (i + 1 < b.size() && (b[i + 1] == '?' || b[i + 1] == '!')) continue;
    std::string_view rest = b.substr(i + 1);
    return rest.starts_with("Error") && (rest.size() == 5 || rest[5] == '>' || rest[5] == '/' ||
                                         std::isspace(static_cast<unsigned char>(rest[5])));
  }
  return false;
}

std::string XmlEscape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      case '\r':  // a raw CR reads back as LF (XML's end-of-line handling)
        o += "&#13;";
        break;
      default:
        o.push_back(c);
    }
  }
  return o;
}

std::string Md5(std::string_view s) {
  Digest d(Digest::Algo::kMd5);
  d.Update(s);
  return d.Final();
}

}  // namespace

bool IsNoSuchBucket(const Status& st, std::string_view bucket) {
  // Every request's `what` names its bucket as s3://BUCKET/ (a copy names two).
  const std::string& m = st.message();
  return st.code() == Code::kNotFound && m.find(": NoSuchBucket: ") != std::string::npos &&
         m.find(fmt::format("s3://{}/", bucket)) != std::string::npos;
}

bool IsUntrustedCertificate(const Status& st) {
  return st.code() == Code::kUnavailable && st.has_sys_errno() && st.sys_errno() == kUntrustedErrno;
}

Result<std::string> FileCrc32c(int fd, uint64_t off, uint64_t len) {
  std::vector<char> buf(1u << 20);
  uint32_t crc = 0;
  while (len > 0) {
    ssize_t n =
        ::pread(fd, buf.data(), std::min<uint64_t>(len, buf.size()), static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read");
    }
    if (n == 0) return Status(Code::kIoError, "the file is shorter than expected");
    crc = Crc32c(buf.data(), static_cast<size_t>(n), crc);
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return Base64Encode(CrcBytes(ChecksumAlgo::kCrc32c, crc));
}

std::time_t ParseIso8601(std::string_view s) {
  // 2026-12-01T21:15:29[.000]Z: the same fields as SigV4's 20261201T211529Z.
  if (s.size() < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
      s.back() != 'Z')
    return 0;
  int v[6];
  const size_t at[6] = {0, 5, 8, 11, 14, 17}, len[6] = {4, 2, 2, 2, 2, 2};
  for (int f = 0; f < 6; ++f) {
    v[f] = 0;
    for (size_t i = at[f]; i < at[f] + len[f]; ++i) {
      if (s[i] < '0' || s[i] > '9') return 0;
      v[f] = v[f] * 10 + (s[i] - '0');
    }
  }
  return TimeFromFields(v[0], v[1], v[2], v[3], v[4], v[5]).value_or(0);
}

struct S3Client::Request {
  std::string method = "GET";
  std::string path;    // decoded
  std::string bucket;  // the bucket addressed ("" for the service): its host when virtual-hosted
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  Body body;
  const Sink* sink = nullptr;  // a 2xx body goes here instead of Answer::body
  uint64_t delivered = 0;      // bytes handed to the sink so far, over every attempt
  std::string what;            // for messages: "GET bucket/key"
  // A ranged GET into a sink: where the bytes asked for start (the answer must be them), and
  // how many were asked for (an answer that sends more ignored the range).
  std::optional<uint64_t> range_first, range_len;
  std::string delivered_etag;  // the ETag of the first answer that delivered bytes to the sink
};

struct S3Client::Answer {
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower case
  std::string body;
  std::string s3code, message;

  std::string header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return {};
  }
  // A 2xx whose body is an S3 <Error> (S3 answers a copy or a Complete that fails after its
  // 200 went out so): an error like any other, retried when its code says so.
  bool error_in_body = false;
  bool ok() const { return status >= 200 && status < 300 && !error_in_body; }
};

Status S3Client::Validate(const ClientOptions& o) {
  std::string_view e = o.endpoint;
  if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0)
    return Status(Code::kInvalidArgument,
                  fmt::format("endpoint '{}' must start with http:// or https://", o.endpoint));
  size_t start = e.find("//") + 2;
  if (start >= e.size() || e[start] == '/')
    return Status(Code::kInvalidArgument, fmt::format("endpoint '{}' names no host", o.endpoint));
  if (o.creds.access_key.empty() || o.creds.secret_key.empty())
    return Status(Code::kInvalidArgument, "an access key and a secret key are needed");
  if (o.creds.region.empty()) return Status(Code::kInvalidArgument, "the region is empty");
  return Status::Ok();
}

S3Client::S3Client(ClientOptions opts) : opts_(std::move(opts)) {
  CurlGlobalInit();
  std::string_view e = opts_.endpoint;
  size_t start = e.find("//");
  start = start == std::string_view::npos ? 0 : start + 2;
  size_t slash = e.find('/', start);
  scheme_ = std::string(e.substr(0, start));
  authority_ =
      std::string(e.substr(start, slash == std::string_view::npos ? e.npos : slash - start));
  host_header_ =
      std::string(e.substr(start, slash == std::string_view::npos ? e.npos : slash - start));
  if (slash != std::string_view::npos) {
    base_path_ = std::string(e.substr(slash));
    while (!base_path_.empty() && base_path_.back() == '/') base_path_.pop_back();
  }
  // The default port is not part of Host as clients send it.
  auto drop = [&](std::string_view scheme, std::string_view port) {
    if (e.rfind(scheme, 0) == 0 && host_header_.size() > port.size() &&
        host_header_.compare(host_header_.size() - port.size(), port.size(), port) == 0)
      host_header_.resize(host_header_.size() - port.size());
  };
  drop("http://", ":80");
  drop("https://", ":443");
  curl_ = curl_easy_init();
}

S3Client::~S3Client() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

void S3Client::Address(Request& req, std::string_view bucket, std::string_view key) const {
  // Path style: /bucket/key. Virtual-hosted: the bucket goes in the host name, /key.
  std::string p = base_path_ + "/";
  if (!opts_.virtual_hosted) {
    p += bucket;
    if (!key.empty()) p.push_back('/');
  }
  p += key;
  req.path = std::move(p);
  req.bucket = std::string(bucket);
}

namespace {

struct Transfer {
  Sink const* sink = nullptr;
  uint64_t* delivered = nullptr;
  std::optional<uint64_t> range_first, range_len;  // Request::range_first, range_len
  uint64_t sunk = 0;                               // bytes of this answer given to the sink
  std::string* delivered_etag = nullptr;
  bool answer_checked = false;
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  Status sink_error;
  bool too_big = false;
  // the request body
  const Body* in = nullptr;
  uint64_t in_done = 0;
  int read_errno = 0;
};

size_t OnHeader(char* p, size_t sz, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  std::string_view line(p, sz * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.rfind("HTTP/", 0) == 0) {
    // A new answer (after 100 Continue, say): start over.
    t->headers.clear();
    size_t sp = line.find(' ');
    t->status = sp == std::string_view::npos
                    ? 0
                    : static_cast<unsigned>(std::atoi(std::string(line.substr(sp + 1, 3)).c_str()));
  } else if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    t->headers.emplace_back(AsciiLower(line.substr(0, colon)),
                            std::string(TrimBlanks(line.substr(colon + 1))));
  }
  return sz * n;
}

// Before the first byte of a 2xx answer reaches the sink: a ranged GET must be answered with
// the range asked for (an origin or proxy may ignore Range and send the whole object, whose
// first bytes would pass for those at the offset), and the answer's ETag is kept, so that a
// resumed transfer asks for that version and no other.
Status CheckAnswer(Transfer* t) {
  t->answer_checked = true;
  auto header = [&](std::string_view name) -> std::string_view {
    for (const auto& [k, v] : t->headers)
      if (k == name) return v;
    return {};
  };
  if (t->range_first && *t->range_first > 0) {
    std::string_view cr = header("content-range");  // bytes a-b/total
    uint64_t first = 0;
    auto [end, ec] = cr.size() > 6 ? std::from_chars(cr.data() + 6, cr.data() + cr.size(), first)
                                   : std::from_chars(cr.data(), cr.data(), first);
    if (t->status != 206 || cr.substr(0, 6) != "bytes " || ec != std::errc() ||
        end == cr.data() + cr.size() || *end != '-' || first != *t->range_first)
      return Status(Code::kIoError,
                    fmt::format("the origin answered {} with Content-Range '{}' to a GET of the "
                                "bytes from {}: not the range asked for",
                                t->status, cr, *t->range_first),
                    EIO);
  }
  if (t->delivered_etag && t->delivered_etag->empty())
    *t->delivered_etag = std::string(StripQuotes(header("etag")));
  return Status::Ok();
}

size_t OnBody(char* p, size_t sz, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  size_t len = sz * n;
  if (t->sink && t->status >= 200 && t->status < 300) {
    if (!t->answer_checked) {
      if (Status st = CheckAnswer(t); !st.ok()) {
        t->sink_error = std::move(st);
        return 0;
      }
    }
    // An origin that ignored the range sends from its start: a 200 to a GET of the bytes from
    // 0 passes the answer's check, and would be read to the end of the object.
    if (t->range_len && t->sunk + len > *t->range_len) {
      t->sink_error = Status(Code::kIoError,
                             fmt::format("the origin answered {} with more than the {} bytes asked "
                                         "for: not the range asked for",
                                         t->status, *t->range_len),
                             EIO);
      return 0;
    }
    Status st = (*t->sink)(std::string_view(p, len));
    if (!st.ok()) {
      t->sink_error = std::move(st);
      return 0;
    }
    t->sunk += len;
    *t->delivered += len;
    return len;
  }
  if (t->body.size() + len > kMaxAnswerBody) {
    t->too_big = true;
    return 0;
  }
  t->body.append(p, len);
  return len;
}

size_t OnRead(char* p, size_t sz, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const Body& b = *t->in;
  size_t cap = sz * n;
  uint64_t left = b.size() - t->in_done;
  size_t want = static_cast<size_t>(std::min<uint64_t>(cap, left));
  if (want == 0) return 0;
  if (b.fd < 0) {
    std::memcpy(p, b.data.data() + t->in_done, want);
    t->in_done += want;
    return want;
  }
  for (;;) {
    ssize_t r = ::pread(b.fd, p, want, static_cast<off_t>(b.offset + t->in_done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      t->read_errno = r < 0 ? errno : EIO;
      return CURL_READFUNC_ABORT;
    }
    t->in_done += static_cast<uint64_t>(r);
    return static_cast<size_t>(r);
  }
}

}  // namespace

Result<S3Client::Answer> S3Client::SendOnce(Request& req) {
  auto* c = static_cast<CURL*>(curl_);
  if (!c) return Status(Code::kInternal, "cannot set up a libcurl handle");
  curl_easy_reset(c);  // keeps the live connection

  std::string raw_query;
  for (const auto& [k, v] : req.query) {
    if (!raw_query.empty()) raw_query.push_back('&');
    raw_query += UriEncode(k, false);
    if (!v.empty()) raw_query += "=" + UriEncode(v, false);
  }
  const bool in_host = opts_.virtual_hosted && !req.bucket.empty();
  const std::string host = in_host ? req.bucket + "." + host_header_ : host_header_;
  std::string url = scheme_ + (in_host ? req.bucket + "." : std::string()) + authority_;
  url += UriEncode(req.path, true);
  if (!raw_query.empty()) url += "?" + raw_query;

  http::request_header<> h;
  h.set(http::field::host, host);
  for (const auto& [k, v] : req.headers) h.set(k, v);
  std::string payload_hash;
  if (req.body.fd >= 0)
    payload_hash = kUnsignedPayload;
  else if (req.body.data.empty())
    payload_hash = kEmptySha256;
  else
    payload_hash = HexEncode(Sha256(req.body.data));
  SignRequest(h, req.method, req.path, raw_query, payload_hash, opts_.creds, std::time(nullptr),
              &signing_);

  curl_slist* hdrs = nullptr;
  for (const auto& f : h)
    hdrs = curl_slist_append(hdrs, fmt::format("{}: {}", f.name_string(), f.value()).c_str());
  // Small bodies go at once; large ones wait for 100 Continue so that a refusal (quota, auth)
  // costs no upload.
  if (req.body.size() < (1u << 20)) hdrs = curl_slist_append(hdrs, "Expect:");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> hold(hdrs, curl_slist_free_all);

  Transfer t;
  t.sink = req.sink;
  t.delivered = &req.delivered;
  t.range_first = req.range_first;
  t.range_len = req.range_len;
  t.delivered_etag = &req.delivered_etag;
  t.in = &req.body;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  // The path as signed: a key may hold "." and ".." segments (any bytes are a key), which
  // libcurl would otherwise resolve away before sending, and the signature would not match.
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.connect_timeout.count()));
  // The speed floor holds for object data coming to a sink; other requests (uploads, and
  // answers a server may keep alive a few bytes at a time, as AWS does a long CopyObject or
  // Complete) only must not stall outright.
  curl_easy_setopt(
      c, CURLOPT_LOW_SPEED_LIMIT,
      static_cast<long>(req.sink ? std::clamp<uint64_t>(opts_.min_speed, 1, 1u << 30) : 1));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(opts_.stall_timeout.count() / 1000)));
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  // Bodies move in large reads and writes (libcurl's defaults, 16 KiB in and 64 KiB out, cost a
  // recv or send and a poll every few pages of an object).
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
  if (!opts_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, opts_.ca_file.c_str());
  if (opts_.insecure) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  // A transport's connections carry one request at a time (see transport.h).
  if (opts_.transport) curl_easy_setopt(c, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(c, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
  } else if (req.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(c, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }

  CURLcode rc;
  if (opts_.transport) {
    int r = CURLE_OK;
    if (Status st = opts_.transport->Perform(c, &r, opts_.control); !st.ok())
      return Status(st.code(), fmt::format("{}: {}", req.what, st.message()),
                    st.has_sys_errno() ? st.sys_errno() : 0);
    rc = static_cast<CURLcode>(r);
  } else {
    rc = curl_easy_perform(c);
  }
  if (!t.sink_error.ok()) return t.sink_error;
  if (t.read_errno != 0) return Status::FromErrno(t.read_errno, req.what + ": read the body");
  if (t.too_big)
    return Status(Code::kUnavailable,
                  fmt::format("{}: the answer is over {} MiB", req.what, kMaxAnswerBody >> 20));
  // A certificate that is not trusted will not become trusted by retrying: a clear error now.
  if (rc == CURLE_SSL_CACERT_BADFILE)
    return Status(Code::kUnavailable,
                  fmt::format("{}: cannot read the CA certificates '{}' ({})", req.what,
                              opts_.ca_file, curl_easy_strerror(rc)),
                  kUntrustedErrno);
  if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_ISSUER_ERROR)
    return Status(Code::kUnavailable,
                  fmt::format("{}: the TLS certificate of {}{} is not trusted ({}); trust its CA "
                              "with ca-file, or skip the check with insecure",
                              req.what, scheme_, authority_, curl_easy_strerror(rc)),
                  kUntrustedErrno);
  if (rc != CURLE_OK)
    return Status(Code::kUnavailable, fmt::format("{}: {} ({}{})", req.what, curl_easy_strerror(rc),
                                                  scheme_, authority_));
  Answer a;
  a.status = t.status;
  a.headers = std::move(t.headers);
  a.body = std::move(t.body);
  // (A 2xx answer is parsed here only when its root looks like <Error>: its caller parses
  // the result, a listing of a thousand keys, once.)
  const bool two = a.ok();
  if ((!two && a.status != 304) || (two && !req.sink && RootIsError(a.body))) {
    pugi::xml_document doc;
    if (!a.body.empty() && doc.load_buffer(a.body.data(), a.body.size()) &&
        (!two || std::string_view(doc.document_element().name()) == "Error")) {
      a.s3code = Child(doc.child("Error"), "Code");
      a.message = Child(doc.child("Error"), "Message");
      a.error_in_body = two;
    }
  }
  return a;
}

Result<S3Client::Answer> S3Client::Send(Request& req) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const auto deadline = std::chrono::steady_clock::now() + opts_.retry_deadline;
  for (int attempt = 1;; ++attempt) {
    uint64_t delivered_before = req.delivered;
    auto r = SendOnce(req);
    // Full jitter: a random wait up to the doubled ceiling, so retrying clients spread out.
    auto ceiling = std::min<int64_t>(opts_.max_backoff.count(), opts_.backoff.count()
                                                                    << std::min(attempt - 1, 16));
    std::uniform_int_distribution<int64_t> d(0, std::max<int64_t>(ceiling, 1));
    const auto now = std::chrono::steady_clock::now();
    // The wait never runs past the deadline; at the deadline, no more attempts.
    const auto wait = std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(d(rng)),
        std::max<std::chrono::steady_clock::duration>(deadline - now, {}));
    bool last =
        attempt >= opts_.max_attempts || req.delivered != delivered_before || now >= deadline;
    // A request that found no free connection in time is not retried: its caller would only
    // wait again behind the same requests.
    // Nor is one refused for a certificate that is not trusted.
    bool transport = !r.ok() && r.status().code() == Code::kUnavailable && !r.status().busy() &&
                     !IsUntrustedCertificate(r.status());
    bool retry = !last && (transport || (r.ok() && Retryable(r->status, r->s3code)));
    if (!retry) {
      if (!r.ok()) return r.status();
      if (!r->ok() && r->status != 304) {
        std::string msg = r->message.empty() ? std::string(r->s3code) : r->message;
        if (msg.empty()) msg = r->status == 404 ? "not found" : "request refused";
        // (IsNoSuchBucket reads this message.)
        return Status(CodeOf(r->error_in_body ? 500 : r->status, r->s3code),
                      fmt::format("{}: {}{}{} (HTTP {}{})", req.what, r->s3code,
                                  r->s3code.empty() ? "" : ": ", msg, r->status,
                                  r->error_in_body ? ", the error in its body" : ""));
      }
      return r;
    }
    ++retries_;
    std::this_thread::sleep_for(wait);
  }
}

Result<std::vector<BucketInfo>> S3Client::ListBuckets() {
  Request req;
  Address(req, "", "");
  req.what = "ListBuckets";
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "ListAllMyBucketsResult"));
  std::vector<BucketInfo> out;
  for (auto b : doc.child("ListAllMyBucketsResult").child("Buckets").children("Bucket"))
    out.push_back({Child(b, "Name"), ParseIso8601(Child(b, "CreationDate"))});
  return out;
}

Result<ListPage> S3Client::ListObjects(std::string_view bucket, const ListRequest& lr) {
  Request req;
  Address(req, bucket, "");
  req.what = fmt::format("list s3://{}/{}", bucket, lr.prefix);
  req.query = {{"list-type", "2"}, {"max-keys", std::to_string(lr.max_keys)}};
  auto add = [&](const char* k, const std::string& v) {
    if (!v.empty()) req.query.emplace_back(k, v);
  };
  add("prefix", lr.prefix);
  add("delimiter", lr.delimiter);
  add("continuation-token", lr.continuation);
  add("start-after", lr.start_after);
  add("end-key", lr.end_key);
  // Names percent-encoded: a key's CR would otherwise read back as LF (XML's end-of-line
  // handling), and control bytes make AWS's answer ill-formed. An origin that does not say it
  // encoded them (no EncodingType) sent them as they are.
  req.query.emplace_back("encoding-type", "url");
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "ListBucketResult"));
  auto root = doc.child("ListBucketResult");
  const bool encoded = Child(root, "EncodingType") == "url";
  auto name = [&](const pugi::xml_node& n, const char* field) {
    std::string v = Child(n, field);
    return encoded ? PercentDecode(v, /*plus_is_space=*/true) : v;  // AWS writes ' ' as '+'
  };
  ListPage page;
  for (auto c : root.children("Contents")) {
    ObjectInfo o;
    o.key = name(c, "Key");
    o.size = std::strtoull(Child(c, "Size").c_str(), nullptr, 10);
    o.etag = StripQuotes(Child(c, "ETag"));
    o.mtime = ParseIso8601(Child(c, "LastModified"));
    page.objects.push_back(std::move(o));
  }
  for (auto p : root.children("CommonPrefixes")) page.prefixes.push_back(name(p, "Prefix"));
  // What callers do with the names (cut the prefix off, copy, delete, loop until the end)
  // needs them below the prefix and advancing; a page that is not is the origin's fault.
  const std::string& floor = std::max(lr.after, lr.start_after);
  // (A common prefix may sort before start-after and still hold keys after it: "a/" for
  // "a/b".)
  auto check = [&](const std::string& name, const std::string* before, bool common) -> Status {
    if (!name.starts_with(lr.prefix))
      return Status(
          Code::kUnavailable,
          fmt::format("{}: the origin listed '{}', which is not below the prefix", req.what, name));
    const bool behind =
        common ? name == floor || (name < floor && !floor.starts_with(name)) : name <= floor;
    if ((before && name <= *before) || (!floor.empty() && behind))
      return Status(Code::kUnavailable,
                    fmt::format("{}: the origin listed '{}' out of order (after '{}')", req.what,
                                name, before && *before > floor ? *before : floor));
    return Status::Ok();
  };
  for (size_t i = 0; i < page.objects.size(); ++i)
    SLUICE_RETURN_IF_ERROR(
        check(page.objects[i].key, i ? &page.objects[i - 1].key : nullptr, false));
  for (size_t i = 0; i < page.prefixes.size(); ++i)
    SLUICE_RETURN_IF_ERROR(check(page.prefixes[i], i ? &page.prefixes[i - 1] : nullptr, true));
  if (Child(root, "IsTruncated") == "true") {
    page.next_token = Child(root, "NextContinuationToken");
    if (page.next_token.empty())
      return Status(Code::kUnavailable, req.what + ": truncated listing without a token");
    // An origin (or a proxy before it) that answers the token it was asked with would be
    // listed forever, every key kept meanwhile by callers that gather them.
    if (page.next_token == lr.continuation)
      return Status(Code::kUnavailable,
                    req.what +
                        ": the origin answered the continuation token it was asked with; "
                        "its listing does not advance");
  }
  return page;
}

Result<bool> ListRequest::Advance(const ListPage& page) {
  // Pages that list nothing and still say "more" (allowed, and rare) cannot show progress;
  // a run of them this long is an origin going round in circles.
  constexpr int kMaxEmptyPages = 1000;
  const std::string* last_key = page.objects.empty() ? nullptr : &page.objects.back().key;
  const std::string* last_prefix = page.prefixes.empty() ? nullptr : &page.prefixes.back();
  if (last_key || last_prefix) {
    empty_pages = 0;
    after =
        std::max(last_key ? *last_key : std::string(), last_prefix ? *last_prefix : std::string());
  } else if (!page.next_token.empty() && ++empty_pages > kMaxEmptyPages) {
    return Status(Code::kUnavailable,
                  fmt::format("listing '{}': {} pages in a row listed nothing; the origin's "
                              "listing does not advance",
                              prefix, kMaxEmptyPages));
  }
  if (page.next_token.empty()) return false;
  continuation = page.next_token;
  return true;
}

Status S3Client::ForEachPage(std::string_view bucket, ListRequest req,
                             const std::function<Status(ListPage&)>& fn) {
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(ListPage page, ListObjects(bucket, req));
    SLUICE_ASSIGN_OR_RETURN(bool more, req.Advance(page));
    SLUICE_RETURN_IF_ERROR(fn(page));
    if (!more) return Status::Ok();
  }
}

Result<std::vector<KeyRange>> S3Client::ListSplit(std::string_view bucket, std::string_view prefix,
                                                  int parts) {
  Request req;
  Address(req, bucket, "");
  req.what = fmt::format("split listing of s3://{}/{}", bucket, prefix);
  req.query = {{"list-split", ""}, {"parts", std::to_string(parts)}};
  if (!prefix.empty()) req.query.emplace_back("prefix", std::string(prefix));
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "ListSplitResult"));
  std::vector<KeyRange> out;
  for (auto r : doc.child("ListSplitResult").children("Range"))
    out.push_back({Child(r, "StartAfter"), Child(r, "EndKey"),
                   std::strtoull(Child(r, "EstimatedKeyCount").c_str(), nullptr, 10)});
  if (out.empty()) return Status(Code::kUnavailable, req.what + ": the answer has no range");
  // The ranges must partition the keys below the prefix: each starts where the one before it
  // ended, the ends rise, the first has no start and the last no end. Ranges that do not
  // chain would lose keys or list some twice (callers list them in parallel, and a sync
  // deletes what it did not see), so such an answer is refused, and a sequential listing
  // follows.
  for (size_t i = 0; i < out.size(); ++i) {
    const KeyRange& r = out[i];
    const bool last = i + 1 == out.size();
    const bool chained = i == 0 ? r.start_after.empty() : r.start_after == out[i - 1].end_key;
    if (!chained || last != r.end_key.empty() || (!last && !r.end_key.starts_with(prefix)) ||
        (!last && i > 0 && r.end_key <= r.start_after))
      return Status(Code::kUnavailable,
                    fmt::format("{}: range {} of {} does not continue the one before it, or "
                                "leaves the prefix",
                                req.what, i + 1, out.size()));
  }
  return out;
}

namespace {
ObjectInfo InfoFrom(std::string_view key,
                    const std::vector<std::pair<std::string, std::string>>& hs) {
  ObjectInfo o;
  o.key = key;
  for (const auto& [k, v] : hs) {
    if (k == "content-length") o.size = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "etag") o.etag = StripQuotes(v);
    if (k == "last-modified") {
      struct tm tm {};
      if (strptime(v.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm)) o.mtime = timegm(&tm);
    }
    if (k == "content-type") o.content_type = v;
    if (k.starts_with("x-amz-meta-")) o.meta[k.substr(11)] = v;
  }
  return o;
}
}  // namespace

Result<ObjectInfo> S3Client::Head(std::string_view bucket, std::string_view key) {
  Request req;
  req.method = "HEAD";
  Address(req, bucket, key);
  req.what = fmt::format("HEAD s3://{}/{}", bucket, key);
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  return InfoFrom(key, a.headers);
}

Result<ObjectInfo> S3Client::Get(std::string_view bucket, std::string_view key, const Sink& sink,
                                 std::optional<std::pair<uint64_t, uint64_t>> range,
                                 std::string_view if_match) {
  Request req;
  Address(req, bucket, key);
  req.what = fmt::format("GET s3://{}/{}", bucket, key);
  req.sink = &sink;
  ObjectInfo info;
  bool have_info = false;
  std::string etag(if_match);
  for (int resumes = 0;; ++resumes) {
    req.headers.clear();
    uint64_t first = (range ? range->first : 0) + req.delivered;
    req.range_first.reset();
    req.range_len.reset();
    if (range) {
      if (range->second == 0) break;
      req.headers.emplace_back("Range",
                               fmt::format("bytes={}-{}", first, range->first + range->second - 1));
      req.range_first = first;
      req.range_len = range->first + range->second - first;
    } else if (req.delivered > 0) {
      req.headers.emplace_back("Range", fmt::format("bytes={}-", first));
      req.range_first = first;
    }
    // Every piece after the first must come from the same version of the object.
    if (!etag.empty()) req.headers.emplace_back("If-Match", "\"" + etag + "\"");
    uint64_t before = req.delivered;
    auto r = Send(req);
    if (r.ok()) {
      // Every byte asked for came, up to the end asked for or the object's, as the answer's
      // own length tells it (libcurl fails a body cut short of its Content-Length). Before
      // 2026-12-07 a 206 covering less than asked passed, and a download landed short.
      const uint64_t reached = (range ? range->first : 0) + req.delivered;
      std::optional<uint64_t> end;
      std::string cr = r->header("content-range");  // bytes a-b/total
      if (r->status == 206) {
        if (size_t slash = cr.rfind('/'); slash != std::string::npos && slash + 1 < cr.size())
          end = std::strtoull(cr.c_str() + slash + 1, nullptr, 10);
      } else if (std::string cl = r->header("content-length"); !cl.empty()) {
        end = req.range_first.value_or(0) + std::strtoull(cl.c_str(), nullptr, 10);
      }
      if (end && range) end = std::min(*end, range->first + range->second);
      if (end && reached != *end)
        return Status(Code::kIoError,
                      fmt::format("{}: the answer ({} {}) ended at byte {} of {}", req.what,
                                  r->status, cr, reached, *end),
                      EIO);
      if (!have_info) {
        info = InfoFrom(key, r->headers);
        etag = info.etag;
        have_info = true;
        std::string cr = r->header("content-range");  // bytes a-b/total
        if (size_t slash = cr.rfind('/'); slash != std::string::npos)
          info.size = std::strtoull(cr.c_str() + slash + 1, nullptr, 10);
      }
      return info;
    }
    // A transfer cut after some bytes is resumed where it stopped, a bounded number of times.
    bool progressed = req.delivered > before;
    if (!progressed || r.status().code() != Code::kUnavailable || resumes >= opts_.max_attempts)
      return r.status();
    if (!have_info && etag.empty()) {
      // The first answer's headers are gone with its failure; ask for them. The rest must be
      // of the version whose bytes came (its ETag, kept as they came), not of whatever the
      // object is now.
      SLUICE_ASSIGN_OR_RETURN(info, Head(bucket, key));
      if (!req.delivered_etag.empty() && info.etag != req.delivered_etag)
        return Status(Code::kConflict,
                      fmt::format("{}: the object changed while it was read (ETag {} then {})",
                                  req.what, req.delivered_etag, info.etag));
      etag = info.etag;
      have_info = true;
    }
    ++retries_;
  }
  return info;
}

Result<std::string> S3Client::Put(std::string_view bucket, std::string_view key, const Body& body,
                                  std::string_view content_type, const UserMeta& meta) {
  Request req;
  req.method = "PUT";
  Address(req, bucket, key);
  req.what = fmt::format("PUT s3://{}/{}", bucket, key);
  req.body = body;
  if (!content_type.empty()) req.headers.emplace_back("Content-Type", std::string(content_type));
  for (const auto& [k, v] : meta) req.headers.emplace_back("x-amz-meta-" + k, v);
  if (opts_.checksums && body.fd >= 0) {
    SLUICE_ASSIGN_OR_RETURN(std::string crc, FileCrc32c(body.fd, body.offset, body.length));
    req.headers.emplace_back("x-amz-checksum-crc32c", crc);
  }
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  return OriginToken(StripQuotes(a.header("etag")), req.what, "ETag", false);
}

Result<std::string> S3Client::PutIfAbsent(std::string_view bucket, std::string_view key,
                                          std::string_view body) {
  Request req;
  req.method = "PUT";
  Address(req, bucket, key);
  req.what = fmt::format("PUT s3://{}/{} if absent", bucket, key);
  req.body = Body{body};
  req.headers.emplace_back("If-None-Match", "*");
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  return OriginToken(StripQuotes(a.header("etag")), req.what, "ETag", false);
}

namespace {

// (A copy that fails after its 200 has gone out answers an <Error> body: SendOnce.)
// The ETag of a copy's answer; `crc32c`, when given, takes its ChecksumCRC32C ("" for none).
Result<std::string> CopiedETag(const std::string& body, const std::string& what, const char* result,
                               std::string* crc32c = nullptr) {
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(body, what, result));
  SLUICE_ASSIGN_OR_RETURN(std::string etag,
                          OriginToken(StripQuotes(Child(doc.child(result), "ETag")), what, "ETag"));
  if (crc32c) *crc32c = Child(doc.child(result), "ChecksumCRC32C");
  return etag;
}

}  // namespace

Result<std::string> S3Client::Copy(std::string_view bucket, std::string_view src_key,
                                   std::string_view dst_key, const UserMeta* replace,
                                   std::string_view src_bucket, std::string_view if_match) {
  if (src_bucket.empty()) src_bucket = bucket;
  Request req;
  req.method = "PUT";
  Address(req, bucket, dst_key);
  req.what = fmt::format("copy s3://{}/{} to s3://{}/{}", src_bucket, src_key, bucket, dst_key);
  req.headers.emplace_back("x-amz-copy-source",
                           UriEncode(fmt::format("/{}/{}", src_bucket, src_key), true));
  req.headers.emplace_back("x-amz-metadata-directive", replace ? "REPLACE" : "COPY");
  if (replace)
    for (const auto& [k, v] : *replace) req.headers.emplace_back("x-amz-meta-" + k, v);
  if (!if_match.empty())
    req.headers.emplace_back("x-amz-copy-source-if-match", "\"" + std::string(if_match) + "\"");
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  return CopiedETag(a.body, req.what, "CopyObjectResult");
}

Result<std::string> S3Client::CopyPart(std::string_view bucket, std::string_view key,
                                       std::string_view upload_id, int number,
                                       std::string_view src_bucket, std::string_view src_key,
                                       uint64_t first, uint64_t last, std::string_view if_match,
                                       std::string* crc32c) {
  Request req;
  req.method = "PUT";
  Address(req, bucket, key);
  req.query = {{"partNumber", std::to_string(number)}, {"uploadId", std::string(upload_id)}};
  req.what = fmt::format("UploadPartCopy {} of s3://{}/{} from s3://{}/{}", number, bucket, key,
                         src_bucket, src_key);
  req.headers.emplace_back("x-amz-copy-source",
                           UriEncode(fmt::format("/{}/{}", src_bucket, src_key), true));
  req.headers.emplace_back("x-amz-copy-source-range", fmt::format("bytes={}-{}", first, last));
  if (!if_match.empty())  // (an origin that sends no ETags has no version to pin)
    req.headers.emplace_back("x-amz-copy-source-if-match", fmt::format("\"{}\"", if_match));
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  // (The part's checksum as the origin computed it: the Complete names it.)
  return CopiedETag(a.body, req.what, "CopyPartResult", crc32c);
}

Status S3Client::Delete(std::string_view bucket, std::string_view key) {
  Request req;
  req.method = "DELETE";
  Address(req, bucket, key);
  req.what = fmt::format("DELETE s3://{}/{}", bucket, key);
  auto r = Send(req);
  return r.status();
}

Result<std::vector<Status>> S3Client::DeleteMany(std::string_view bucket,
                                                 const std::vector<std::string>& keys) {
  std::string xml = "<Delete><Quiet>true</Quiet>";
  std::vector<Status> failed;
  size_t batched = 0;
  for (const auto& k : keys) {
    // A control byte other than tab, LF and CR has no place in XML 1.0, escaped or not (AWS
    // would refuse the whole batch as MalformedXML): such a key is deleted by itself.
    if (std::any_of(k.begin(), k.end(), [](char c) {
          return static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r';
        })) {
      if (Status st = Delete(bucket, k); !st.ok() && st.code() != Code::kNotFound)
        failed.push_back(st.WithContext(k));
      continue;
    }
    xml += "<Object><Key>" + XmlEscape(k) + "</Key></Object>";
    ++batched;
  }
  if (batched == 0) return failed;
  xml += "</Delete>";
  Request req;
  req.method = "POST";
  Address(req, bucket, "");
  req.query = {{"delete", ""}};
  req.what = fmt::format("DeleteObjects in s3://{}/", bucket);
  req.body.data = xml;
  req.headers = {{"Content-Type", "application/xml"}, {"Content-MD5", Base64Encode(Md5(xml))}};
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "DeleteResult"));
  for (auto e : doc.child("DeleteResult").children("Error")) {
    // Each key's refusal keeps its cause, as a request's would (a key the credentials may not
    // delete is a refusal; a code of no known meaning, a plain failure).
    const std::string code = Child(e, "Code");
    Code c = code == "AccessDenied" ? Code::kPermissionDenied : CodeOf(0, code);
    if (c == Code::kInvalidArgument) c = Code::kIoError;
    failed.emplace_back(c, fmt::format("{}: {} {}", Child(e, "Key"), code, Child(e, "Message")));
  }
  return failed;
}

Result<std::string> S3Client::CreateMultipart(std::string_view bucket, std::string_view key,
                                              std::string_view content_type, const UserMeta& meta) {
  Request req;
  req.method = "POST";
  Address(req, bucket, key);
  req.query = {{"uploads", ""}};
  req.what = fmt::format("CreateMultipartUpload s3://{}/{}", bucket, key);
  if (!content_type.empty()) req.headers.emplace_back("Content-Type", std::string(content_type));
  for (const auto& [k, v] : meta) req.headers.emplace_back("x-amz-meta-" + k, v);
  if (opts_.checksums) req.headers.emplace_back("x-amz-checksum-algorithm", "CRC32C");
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "InitiateMultipartUploadResult"));
  return OriginToken(Child(doc.child("InitiateMultipartUploadResult"), "UploadId"), req.what,
                     "UploadId");
}

Result<std::string> S3Client::UploadPart(std::string_view bucket, std::string_view key,
                                         std::string_view upload_id, int number, const Body& body,
                                         std::string* crc32c) {
  Request req;
  req.method = "PUT";
  Address(req, bucket, key);
  req.query = {{"partNumber", std::to_string(number)}, {"uploadId", std::string(upload_id)}};
  req.what = fmt::format("UploadPart {} of s3://{}/{}", number, bucket, key);
  req.body = body;
  if (opts_.checksums) {
    // Every part, from a file or from memory: an upload created with a checksum algorithm
    // takes no part without one on AWS, and its Complete must name every part's.
    std::string crc;
    if (body.fd >= 0) {
      SLUICE_ASSIGN_OR_RETURN(crc, FileCrc32c(body.fd, body.offset, body.length));
    } else {
      crc =
          Base64Encode(CrcBytes(ChecksumAlgo::kCrc32c, Crc32c(body.data.data(), body.data.size())));
    }
    req.headers.emplace_back("x-amz-checksum-crc32c", crc);
    if (crc32c) *crc32c = crc;
  }
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  return OriginToken(StripQuotes(a.header("etag")), req.what, "ETag");
}

Result<std::vector<PartInfo>> S3Client::ListParts(std::string_view bucket, std::string_view key,
                                                  std::string_view upload_id) {
  std::vector<PartInfo> out;
  std::string marker;
  for (;;) {
    Request req;
    Address(req, bucket, key);
    req.query = {{"uploadId", std::string(upload_id)}};
    if (!marker.empty()) req.query.emplace_back("part-number-marker", marker);
    req.what = fmt::format("ListParts of s3://{}/{}", bucket, key);
    SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
    SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "ListPartsResult"));
    auto root = doc.child("ListPartsResult");
    for (auto p : root.children("Part")) {
      SLUICE_ASSIGN_OR_RETURN(std::string etag,
                              OriginToken(StripQuotes(Child(p, "ETag")), req.what, "ETag"));
      out.push_back({std::atoi(Child(p, "PartNumber").c_str()),
                     std::strtoull(Child(p, "Size").c_str(), nullptr, 10), std::move(etag),
                     Child(p, "ChecksumCRC32C")});
    }
    if (Child(root, "IsTruncated") != "true") break;
    std::string next = Child(root, "NextPartNumberMarker");
    if (next.empty() || next == marker) break;
    marker = next;
  }
  return out;
}

Result<std::string> S3Client::CompleteMultipart(std::string_view bucket, std::string_view key,
                                                std::string_view upload_id,
                                                std::vector<PartInfo> parts) {
  // The upload was created with CRC32C (CreateMultipart): AWS refuses a Complete that does not
  // name every part's checksum. Parts whose checksum the caller does not have (a copied part
  // whose origin answered none, a session recorded before they were kept) take the origin's.
  if (opts_.checksums &&
      std::any_of(parts.begin(), parts.end(), [](const PartInfo& p) { return p.crc32c.empty(); })) {
    SLUICE_ASSIGN_OR_RETURN(auto listed, ListParts(bucket, key, upload_id));
    std::map<int, const PartInfo*> by_number;
    for (const auto& l : listed) by_number[l.number] = &l;
    for (auto& p : parts)
      if (auto it = by_number.find(p.number);
          p.crc32c.empty() && it != by_number.end() && it->second->etag == p.etag)
        p.crc32c = it->second->crc32c;
  }
  std::string xml = "<CompleteMultipartUpload>";
  for (const auto& p : parts) {
    xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>\"{}\"</ETag>", p.number,
                       XmlEscape(p.etag));
    if (!p.crc32c.empty()) xml += "<ChecksumCRC32C>" + p.crc32c + "</ChecksumCRC32C>";
    xml += "</Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Request req;
  req.method = "POST";
  Address(req, bucket, key);
  req.query = {{"uploadId", std::string(upload_id)}};
  req.what = fmt::format("CompleteMultipartUpload s3://{}/{}", bucket, key);
  req.body.data = xml;
  req.headers = {{"Content-Type", "application/xml"}};
  SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
  // (S3 may answer 200 with an <Error> body once the answer has begun: SendOnce.)
  SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "CompleteMultipartUploadResult"));
  return OriginToken(StripQuotes(Child(doc.child("CompleteMultipartUploadResult"), "ETag")),
                     req.what, "ETag", false);
}

Status S3Client::AbortMultipart(std::string_view bucket, std::string_view key,
                                std::string_view upload_id) {
  Request req;
  req.method = "DELETE";
  Address(req, bucket, key);
  req.query = {{"uploadId", std::string(upload_id)}};
  req.what = fmt::format("AbortMultipartUpload s3://{}/{}", bucket, key);
  return Send(req).status();
}

Result<std::vector<MultipartInfo>> S3Client::ListMultipartUploads(std::string_view bucket,
                                                                  std::string_view prefix) {
  std::vector<MultipartInfo> out;
  std::string key_marker, id_marker;
  for (;;) {
    Request req;
    Address(req, bucket, "");
    req.query = {{"uploads", ""}};
    if (!prefix.empty()) req.query.emplace_back("prefix", std::string(prefix));
    if (!key_marker.empty()) req.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) req.query.emplace_back("upload-id-marker", id_marker);
    req.what = fmt::format("ListMultipartUploads of s3://{}/", bucket);
    SLUICE_ASSIGN_OR_RETURN(Answer a, Send(req));
    SLUICE_ASSIGN_OR_RETURN(auto doc, ParseXml(a.body, req.what, "ListMultipartUploadsResult"));
    auto root = doc.child("ListMultipartUploadsResult");
    for (auto u : root.children("Upload"))
      out.push_back({Child(u, "Key"), Child(u, "UploadId"), ParseIso8601(Child(u, "Initiated"))});
    if (Child(root, "IsTruncated") != "true") break;
    std::string next_key = Child(root, "NextKeyMarker"),
                next_id = Child(root, "NextUploadIdMarker");
    if (next_key.empty() || (next_key == key_marker && next_id == id_marker))
      break;  // no marker, or the one asked with: the listing would not advance
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return out;
}

Status S3Client::BatchGet(std::string_view bucket, std::string_view request_json,
                          const Sink& sink) {
  Request req;
  req.method = "POST";
  Address(req, bucket, "");
  req.query = {{"batch-get", ""}};
  req.what =
      bucket.empty() ? std::string("batch get") : fmt::format("batch get in s3://{}", bucket);
  req.body.data = request_json;
  req.headers = {{"Content-Type", "application/json"}};
  req.sink = &sink;
  return Send(req).status();
}

}  // namespace sluice::io::s3
