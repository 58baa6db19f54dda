#include "api/s3/batch_get.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/range.h"
#include "api/s3/s3_errors.h"
#include "common/json.h"

namespace sluice::api::s3 {

namespace {
constexpr size_t kReadChunk = 256 << 10;

void SetMtime(ArchiveWriter::Entry& e, std::chrono::system_clock::time_point t) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  // Floored (as ArchiveWriter::Entry holds it): -1.5 s is -2 s and 500,000,000 ns.
  e.mtime_s = ns / 1000000000 - (ns % 1000000000 < 0);
  e.mtime_ns = ns - e.mtime_s * 1000000000;
}
}  // namespace

BatchGetStream::BatchGetStream(ObjectStore* objects, std::vector<BatchItem> items,
                               bool continue_on_error, bool manifest, std::string label)
    : objects_(objects),
      items_(std::move(items)),
      continue_on_error_(continue_on_error),
      manifest_(manifest),
      label_(std::move(label)) {
  if (manifest_) outcomes_.reserve(items_.size());
}

BatchGetStream::Outcome* BatchGetStream::Record() {
  if (!manifest_) return nullptr;
  outcomes_.emplace_back();
  return &outcomes_.back();
}

BatchGetStream::~BatchGetStream() {
  if (tar_.closed())
    spdlog::debug("{}: {} items sent, {} failed, {} bytes", label_, ok_, errors_, bytes_);
  else if (next_ > 0)
    spdlog::info("{}: cut short after {} of {} items", label_, next_, items_.size());
}

std::optional<S3Error> BatchGetStream::Prepare() {
  Status st = tar_.Open();
  if (st.ok() && !items_.empty()) st = StartItem();
  if (stop_) return stop_;
  if (!st.ok()) {
    failure_ = st;
    return FromStatus(st);
  }
  return std::nullopt;
}

namespace {
// `path` with what cannot stand in a TAR name, or would climb out of the extraction directory,
// percent-encoded: NUL (no TAR name holds one) as %00, '%' as %25, a '/' that would make an
// empty component (leading, doubled, trailing) as %2F, and the dots of a "." or ".."
// component as %2E. Percent-decoding gives `path` back: no two paths give one name.
// `whole`: every '/' encoded (a bucket name, one component).
void AppendSafeName(std::string& out, std::string_view path, bool whole) {
  for (size_t i = 0, end; i <= path.size(); i = end + 1) {
    end = std::min(path.find('/', i), path.size());
    std::string_view c = path.substr(i, end - i);
    if (c == "." || c == "..") {
      out += c.size() == 1 ? "%2E" : "%2E%2E";
    } else {
      for (char ch : c) out += ch == '\0' ? "%00" : ch == '%' ? "%25" : std::string(1, ch);
    }
    if (end == path.size()) break;
    // This '/' separates two non-empty components, or is written %2F.
    const bool sep = !whole && !c.empty() && end + 1 < path.size() && path[end + 1] != '/';
    out += sep ? "/" : "%2F";
  }
}

// The entry standing in for a failed item: "__404__/" or "__error__/", the bucket and the key
// as AppendSafeName writes them. The manifest names it so too.
std::string PlaceholderName(unsigned status, const BatchItem& it) {
  std::string out = status == 404 ? "__404__/" : "__error__/";
  AppendSafeName(out, it.bucket, true);
  out += '/';
  AppendSafeName(out, it.key, false);
  return out;
}
}  // namespace

Status BatchGetStream::Failed(const S3Error& e) {
  ++errors_;
  const BatchItem& it = items_[next_ - 1];
  ArchiveWriter::Entry ph;
  ph.name = PlaceholderName(e.status, it);
  SetMtime(ph, std::chrono::system_clock::now());
  if (!continue_on_error_) {
    // (The request's answer when it is the first item: it names the item, as docs/s3.md says.)
    stop_ =
        S3Error{e.status, e.code,
                fmt::format("item {} ('{}' in {}): {}", next_ - 1, it.key, it.bucket, e.message)};
    // The cut must show in the bytes themselves: a stream that ends after a whole entry reads
    // as a complete archive to TAR readers (tar, tarfile, libarchive stop there without the
    // end-of-archive blocks), so `curl | tar x` would take a partial batch for all of it. The
    // failed item's header goes out promising a byte that never comes.
    ph.size = 1;
    (void)tar_.Header(ph);
    return Status(Code::kUnavailable, fmt::format("item {} ('{}' in {}): {}: {}", next_ - 1, it.key,
                                                  it.bucket, e.code, e.message));
  }
  // A placeholder in the item's place, so that the archive's order still matches the request.
  if (Outcome* o = Record()) {
    o->status = e.status;
    o->code = e.code;
    o->message = e.message;
  }
  SLUICE_RETURN_IF_ERROR(tar_.Header(ph));
  return tar_.FinishEntry(ph.name);
}

Status BatchGetStream::StartItem() {
  const BatchItem& it = items_[next_++];
  if (it.refused) return Failed(*it.refused);
  auto o = objects_->Open(*it.volume, it.vfid, it.key, false);
  if (!o.ok()) return Failed(FromStatus(o.status()));
  ArchiveWriter::Entry e;
  e.name = it.name;
  SetMtime(e, o->entry.modified);
  // What has no byte to range over, as GetObject answers it (never the whole item as if no
  // range had been asked for: the manifest would not tell).
  if (!it.range.empty() && (!o->file || o->entry.size == 0))
    return Failed({416, "InvalidRange",
                   fmt::format("the range '{}' is not satisfiable for 0 bytes", it.range)});
  if (!o->file) {  // a directory marker ("dir/")
    e.type = EntryType::kDirectory;
    e.perm = 0755;
    if (Outcome* out = Record()) out->status = 200;
    ++ok_;
    SLUICE_RETURN_IF_ERROR(tar_.Header(e));
    return tar_.FinishEntry(e.name);
  }
  const uint64_t size = o->entry.size;
  uint64_t first = 0, length = size;
  unsigned status = 200;
  if (!it.range.empty()) {
    RangeRequest rr = ParseRange(it.range, size, 1);
    if (rr.kind == RangeRequest::Kind::kUnsatisfiable)
      return Failed(
          {416, "InvalidRange",
           fmt::format("the range '{}' is not satisfiable for {} bytes", it.range, size)});
    if (rr.kind == RangeRequest::Kind::kSatisfiable) {
      first = rr.ranges.front().first;
      length = rr.ranges.front().length;
      status = 206;
    }
  }
  e.size = length;
  const ArchiveWriter::Mark before = tar_.mark();
  SLUICE_RETURN_IF_ERROR(tar_.Header(e));
  if (length > 0) {
    // Its first piece is read before the item counts as sent: an object that cannot be read
    // at all (a volume's I/O error, an origin that does not answer) is taken back and becomes
    // a placeholder (or the batch's error), not a stream cut short in its data.
    file_ = std::move(o->file);
    file_off_ = first;
    file_left_ = length;
    const uint64_t bytes_before = bytes_;
    Status st = FileData();
    if (!st.ok()) {
      file_.reset();
      if (st.code() == Code::kInternal || !tar_.Rollback(before)) return st;  // not the object's
      bytes_ = bytes_before;
      return Failed(FromStatus(st));
    }
  }
  if (Outcome* out = Record()) {
    out->status = status;
    out->size = length;
    out->range_first = first;
    out->range_total = status == 206 ? size : 0;
  }
  ++ok_;
  return length == 0 ? tar_.FinishEntry(e.name) : Status::Ok();
}

Status BatchGetStream::FileData() {
  size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, kReadChunk));
  SLUICE_ASSIGN_OR_RETURN(char* at, tar_.ReserveData(want));
  // The piece whole, or the end of the file found within it: a file that shrank to within its
  // first piece is found at that piece, while the item can still become a placeholder.
  size_t n = 0;
  while (n < want) {
    auto got = file_->ReadAt(file_off_ + n, at + n, want - n);
    if (!got.ok()) {
      tar_.CommitData(want, 0);
      return got.status();
    }
    if (*got == 0) break;
    n += *got;
  }
  tar_.CommitData(want, n);
  // The header promised the size seen when the object was opened.
  if (n < want)
    return Status(Code::kIoError,
                  fmt::format("'{}' shrank while being sent", items_[next_ - 1].key));
  file_off_ += n;
  file_left_ -= n;
  bytes_ += n;
  if (file_left_ > 0) return Status::Ok();
  file_.reset();
  return tar_.FinishEntry(items_[next_ - 1].name);
}

namespace {

// `s` as a JSON string: bytes that are not UTF-8 become U+FFFD, as every other Sluice JSON does
// (written here, not through a JSON document: a manifest of 100,000 items as a document cost
// more than the TAR stream it ends).
void AppendJsonString(std::string& out, std::string_view raw) {
  const bool ascii = IsAscii(raw);
  const std::string clean = ascii ? std::string() : SanitizeUtf8(raw);
  std::string_view s = ascii ? raw : std::string_view(clean);
  out += '"';
  size_t run = 0;  // bytes that need no escape go in one append
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.substr(run, i - run));
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
    }
  }
  out.append(s.substr(run));
  out += '"';
}

}  // namespace

void BatchGetStream::ManifestItem(std::string& text, size_t i) const {
  const Outcome& o = outcomes_[i];
  const BatchItem& it = items_[i];
  auto out = std::back_inserter(text);
  if (i > 0) text += ',';
  fmt::format_to(out, "{{\"index\":{},\"bucket\":", i);
  AppendJsonString(text, it.bucket);
  text += ",\"key\":";
  AppendJsonString(text, it.key);
  fmt::format_to(out, ",\"status\":{},\"name\":", o.status);
  if (o.code.empty()) {
    AppendJsonString(text, it.name);
    fmt::format_to(out, ",\"size\":{}", o.size);
    if (o.range_total)
      fmt::format_to(out, ",\"range\":\"bytes {}-{}/{}\"", o.range_first,
                     o.range_first + o.size - 1, o.range_total);
  } else {
    AppendJsonString(text, PlaceholderName(o.status, it));
    text += ",\"code\":";
    AppendJsonString(text, o.code);
    text += ",\"message\":";
    AppendJsonString(text, o.message);
  }
  if (!it.opaque.empty()) {
    text += ",\"opaque\":";
    AppendJsonString(text, it.opaque);
  }
  text += '}';
}

// The manifest is written as it is read, as the objects are: its size is counted first (each
// item's record made and dropped), then its records go out a piece at a time. Held whole, a
// batch of long keys that all fail (placeholder names percent-encoded: three bytes a byte)
// made a manifest ten times the request's body, and copied it once more into the stream.
Status BatchGetStream::WriteManifest() {
  constexpr std::string_view kHead = "{\"items\":[";
  const std::string tail = fmt::format("],\"ok\":{},\"errors\":{}}}\n", ok_, errors_);
  std::string piece;
  if (manifest_next_ == 0 && !manifest_started_) {
    uint64_t size = kHead.size() + tail.size();
    for (size_t i = 0; i < outcomes_.size(); ++i) {
      piece.clear();
      ManifestItem(piece, i);
      size += piece.size();
    }
    ArchiveWriter::Entry e;
    e.name = kBatchManifestName;
    e.size = size;
    SetMtime(e, std::chrono::system_clock::now());
    SLUICE_RETURN_IF_ERROR(tar_.Header(e));
    SLUICE_RETURN_IF_ERROR(tar_.Data(kHead.data(), kHead.size()));
    manifest_started_ = true;
  }
  piece.clear();
  while (manifest_next_ < outcomes_.size() && piece.size() < kReadChunk)
    ManifestItem(piece, manifest_next_++);
  SLUICE_RETURN_IF_ERROR(tar_.Data(piece.data(), piece.size()));
  if (manifest_next_ < outcomes_.size()) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(tar_.Data(tail.data(), tail.size()));
  manifest_written_ = true;
  return tar_.FinishEntry(kBatchManifestName);
}

Status BatchGetStream::Step() {
  if (file_) return FileData();
  if (next_ < items_.size()) return StartItem();
  if (manifest_ && !manifest_written_) return WriteManifest();
  return tar_.Close();
}

Result<size_t> BatchGetStream::Read(char* buf, size_t cap) {
  // What the stream holds up to the failed item still goes out, over as many reads as it
  // takes (the cut's header may follow a nearly full piece); the cut follows it.
  if (!failure_.ok()) return tar_.pending() > 0 ? Result<size_t>(tar_.Take(buf, cap)) : failure_;
  while (tar_.pending() < cap && !tar_.closed()) {
    if (Status st = Step(); !st.ok()) {
      failure_ = st;
      spdlog::warn("{}: {}", label_, st.ToString());
      if (tar_.pending() > 0) return tar_.Take(buf, cap);
      return st;
    }
  }
  return tar_.Take(buf, cap);
}

}  // namespace sluice::api::s3
