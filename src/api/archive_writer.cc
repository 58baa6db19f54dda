#include "api/archive_writer.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/json.h"

namespace sluice::api {

// Names in the archive are UTF-8 (the ZIP "language encoding" flag is set); bytes that are not
// valid UTF-8 become U+FFFD so that readers can decode every name.
ArchiveWriter::~ArchiveWriter() {
  if (ar_) {
    // An unfinished archive must not be finished now: free only releases memory.
    if (!closed_) archive_write_fail(ar_);
    archive_write_free(ar_);
  }
  if (entry_) archive_entry_free(entry_);
}

long ArchiveWriter::OnWrite(struct archive*, void* self, const void* buf, size_t n) {
  static_cast<ArchiveWriter*>(self)->out_.append(static_cast<const char*>(buf), n);
  return static_cast<long>(n);
}

Status ArchiveWriter::Error(std::string_view what) const {
  const char* msg = ar_ ? archive_error_string(ar_) : nullptr;
  return Status(Code::kInternal,
                fmt::format("cannot {}: {}", what, msg ? msg : "unknown archive error"));
}

Status ArchiveWriter::Open() {
  if (opened_) return Status(Code::kInternal, "the archive is already open");
  opened_ = true;
  if (format_ == Format::kTar) return Status::Ok();
  ar_ = archive_write_new();
  entry_ = archive_entry_new();
  if (!ar_ || !entry_) return Status(Code::kInternal, "out of memory creating an archive");
  if (archive_write_set_format_zip(ar_) != ARCHIVE_OK ||
      archive_write_zip_set_compression_deflate(ar_) != ARCHIVE_OK ||
      archive_write_set_options(ar_, "zip:hdrcharset=UTF-8") != ARCHIVE_OK ||
      archive_write_set_bytes_per_block(ar_, static_cast<int>(block_bytes_)) != ARCHIVE_OK ||
      archive_write_open2(ar_, this, nullptr, &ArchiveWriter::OnWrite, nullptr, nullptr) !=
          ARCHIVE_OK)
    return Error("start a ZIP stream");
  return Status::Ok();
}

// ---- TAR (POSIX.1-2001 pax, restricted: what ustar can hold goes in ustar fields only)

namespace {

constexpr size_t kBlock = 512;
// Largest values the ustar octal fields hold: 11 digits for size and mtime, 7 for ids.
constexpr uint64_t kMaxOctal11 = 077777777777ULL;
constexpr uint64_t kMaxOctal7 = 07777777ULL;

// `width - 1` octal digits, zero-padded, then a NUL (what GNU tar and libarchive write).
void Octal(char* field, size_t width, uint64_t v) {
  field[width - 1] = '\0';
  for (size_t i = width - 1; i-- > 0; v >>= 3) field[i] = static_cast<char>('0' + (v & 7));
}

// One pax record, "<length> <key>=<value>\n", where the length counts its own digits.
void PaxRecord(std::string& out, std::string_view key, std::string_view value) {
  size_t body = 1 + key.size() + 1 + value.size() + 1;  // " key=value\n"
  size_t len = body + 1;
  while (std::to_string(len).size() + body != len) len = std::to_string(len).size() + body;
  out += std::to_string(len);
  out += ' ';
  out.append(key);
  out += '=';
  out.append(value);
  out += '\n';
}

// Where a path splits into ustar's prefix (155 bytes) and name (100): at a '/' that leaves
// both within their fields; npos when it does not fit.
size_t UstarSplit(std::string_view path) {
  if (path.size() <= 100) return 0;
  if (path.size() > 256) return std::string_view::npos;
  // The prefix is path[0, p), the name path[p + 1, end): p <= 155 and size - p - 1 <= 100.
  for (size_t p = path.size() - 101; p <= 155 && p < path.size(); ++p)
    if (path[p] == '/' && p > 0 && p + 1 < path.size()) return p;
  return std::string_view::npos;
}

}  // namespace

void ArchiveWriter::TarRecord(char type, std::string_view name, std::string_view link,
                              uint64_t size, const Entry& e) {
  char h[kBlock] = {};
  size_t split = UstarSplit(name);
  if (split == std::string_view::npos) {  // the pax header has the whole name
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  } else if (split == 0) {
    std::memcpy(h, name.data(), name.size());
  } else {
    std::memcpy(h + 345, name.data(), split);
    std::memcpy(h, name.data() + split + 1, name.size() - split - 1);
  }
  Octal(h + 100, 8, e.perm & 07777);
  Octal(h + 108, 8, e.uid <= kMaxOctal7 ? e.uid : 0);
  Octal(h + 116, 8, e.gid <= kMaxOctal7 ? e.gid : 0);
  Octal(h + 124, 12, size <= kMaxOctal11 ? size : 0);
  Octal(h + 136, 12,
        e.mtime_s >= 0 && static_cast<uint64_t>(e.mtime_s) <= kMaxOctal11 ? e.mtime_s : 0);
  h[156] = type;
  std::memcpy(h + 157, link.data(), std::min<size_t>(link.size(), 100));
  std::memcpy(h + 257, "ustar", 6);  // magic, NUL-terminated
  std::memcpy(h + 263, "00", 2);     // version
  // The checksum: the header's bytes summed with its own field read as spaces.
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  Octal(h + 148, 7, sum);
  h[155] = ' ';
  out_.append(h, kBlock);
  written_ += kBlock;
}

Status ArchiveWriter::TarHeader(const Entry& e) {
  if (entry_left_ > 0)
    return Status(Code::kInternal, "a TAR entry began before the last one's data was written");
  std::string name = e.name;
  if (e.type == EntryType::kDirectory && (name.empty() || name.back() != '/')) name += '/';
  if (name.empty() || name.find('\0') != std::string::npos)
    return Status(Code::kInvalidArgument, "an archive entry needs a name without NUL bytes");
  const uint64_t size = e.type == EntryType::kFile ? e.size : 0;
  // What ustar's fields cannot hold goes in a pax extended header before the entry.
  std::string pax;
  bool binary = false;
  if (UstarSplit(name) == std::string_view::npos || !IsAscii(name)) {
    PaxRecord(pax, "path", name);
    binary = binary || SanitizeUtf8(name) != name;
  }
  if (e.link.size() > 100 || !IsAscii(e.link)) {
    PaxRecord(pax, "linkpath", e.link);
    binary = binary || SanitizeUtf8(e.link) != e.link;
  }
  if (size > kMaxOctal11) PaxRecord(pax, "size", std::to_string(size));
  if (e.uid > kMaxOctal7) PaxRecord(pax, "uid", std::to_string(e.uid));
  if (e.gid > kMaxOctal7) PaxRecord(pax, "gid", std::to_string(e.gid));
  // As libarchive's restricted pax: 31-bit mtimes in ustar; a pax mtime (with its nanoseconds)
  // only where one is needed or a pax header is written anyway.
  // (The value is signed decimal: -2 s and 500,000,000 ns is "-1.500000000".)
  if (e.mtime_s < 0 || e.mtime_s >= 0x7fffffff || (!pax.empty() && e.mtime_ns != 0))
    PaxRecord(pax, "mtime",
              e.mtime_ns == 0 ? std::to_string(e.mtime_s)
              : e.mtime_s >= 0
                  ? fmt::format("{}.{:09d}", e.mtime_s, e.mtime_ns)
                  : fmt::format("-{}.{:09d}", -(e.mtime_s + 1), 1000000000 - e.mtime_ns));
  if (!pax.empty()) {
    // Names or links that are not UTF-8 are raw bytes, said so before any of them (POSIX).
    if (binary) {
      std::string records;
      PaxRecord(records, "hdrcharset", "BINARY");
      pax = records + pax;
    }
    std::string_view base(name);
    while (base.size() > 1 && base.back() == '/') base.remove_suffix(1);
    if (auto slash = base.rfind('/', base.size() - 2); slash != std::string_view::npos)
      base.remove_prefix(slash + 1);
    std::string pax_name = "PaxHeader/";
    for (char c : base.substr(0, 90))
      pax_name += static_cast<unsigned char>(c) < 0x80 && c != '/' ? c : '_';
    Entry pe = e;
    pe.perm = 0644;
    TarRecord('x', pax_name, {}, pax.size(), pe);
    pax.resize((pax.size() + kBlock - 1) / kBlock * kBlock, '\0');
    out_ += pax;
    written_ += pax.size();
  }
  char type = e.type == EntryType::kDirectory ? '5' : e.type == EntryType::kSymlink ? '2' : '0';
  TarRecord(type, name, e.link, size, e);
  entry_left_ = size;
  return Status::Ok();
}

Status ArchiveWriter::Header(const Entry& e) {
  if (!opened_ || closed_) return Status(Code::kInternal, "the archive is not open");
  if (format_ == Format::kTar) return TarHeader(e);
  const std::string name = SanitizeUtf8(e.name);
  if (name.size() + 1 > kMaxZipEntryName)  // (+1: a directory's '/')
    return Status(Code::kInvalidArgument,
                  fmt::format("'{}...': a ZIP entry's name is at most {} bytes", name.substr(0, 64),
                              kMaxZipEntryName - 1));
  archive_entry_clear(entry_);
  archive_entry_set_pathname_utf8(entry_, name.c_str());
  archive_entry_set_filetype(entry_, e.type == EntryType::kDirectory ? AE_IFDIR
                                     : e.type == EntryType::kSymlink ? AE_IFLNK
                                                                     : AE_IFREG);
  archive_entry_set_perm(entry_, e.perm & 07777);
  archive_entry_set_uid(entry_, e.uid);
  archive_entry_set_gid(entry_, e.gid);
  archive_entry_set_size(entry_, e.type == EntryType::kFile ? static_cast<la_int64_t>(e.size) : 0);
  archive_entry_set_mtime(entry_, e.mtime_s, e.mtime_ns);
  if (!e.link.empty()) archive_entry_copy_symlink(entry_, e.link.c_str());
  if (archive_write_header(ar_, entry_) < ARCHIVE_WARN)
    return Error(fmt::format("add '{}'", e.name));
  return Status::Ok();
}

Status ArchiveWriter::Data(const char* data, size_t n) {
  if (format_ == Format::kTar) {
    if (n > entry_left_)
      return Status(Code::kInternal,
                    fmt::format("{} bytes of data past the TAR entry's size", n - entry_left_));
    out_.append(data, n);
    written_ += n;
    entry_left_ -= n;
    return Status::Ok();
  }
  if (archive_write_data(ar_, data, n) < 0) return Error("write entry data");
  return Status::Ok();
}

Result<char*> ArchiveWriter::ReserveData(size_t n) {
  if (format_ != Format::kTar || n > entry_left_)
    return Status(Code::kInternal, "no room reserved past the TAR entry's size");
  size_t at = out_.size();
  out_.resize(at + n);
  return out_.data() + at;
}

void ArchiveWriter::CommitData(size_t reserved, size_t written) {
  out_.resize(out_.size() - (reserved - written));
  written_ += written;
  entry_left_ -= written;
}

Status ArchiveWriter::FinishEntry(std::string_view name) {
  if (format_ == Format::kTar) {
    // A short entry would shift every header after it: refused, never padded over.
    if (entry_left_ > 0)
      return Status(Code::kInternal, fmt::format("'{}' ended {} bytes short of its TAR header's "
                                                 "size",
                                                 name, entry_left_));
    out_.append((kBlock - written_ % kBlock) % kBlock, '\0');
    written_ = (written_ + kBlock - 1) / kBlock * kBlock;
    return Status::Ok();
  }
  if (archive_write_finish_entry(ar_) < ARCHIVE_WARN)
    return Error(fmt::format("finish '{}'", name));
  return Status::Ok();
}

Status ArchiveWriter::Close() {
  if (format_ == Format::kTar) {
    if (!opened_ || closed_) return Status(Code::kInternal, "the archive is not open");
    if (entry_left_ > 0) return Status(Code::kInternal, "the archive ended inside an entry's data");
    // Two zero blocks end the archive; the last block of `block_bytes_` is padded whole, as
    // tar(1) does.
    size_t end = 2 * kBlock;
    if (block_bytes_ > 0) {
      uint64_t total = written_ + end;
      end += (block_bytes_ - total % block_bytes_) % block_bytes_;
    }
    out_.append(end, '\0');
    written_ += end;
    closed_ = true;
    return Status::Ok();
  }
  if (archive_write_close(ar_) != ARCHIVE_OK) return Error("finish the archive");
  closed_ = true;
  return Status::Ok();
}

bool ArchiveWriter::Rollback(const Mark& m) {
  // In archive positions (written_ counts every byte made), so that a Take() that emptied or
  // compacted the buffer since cannot make an old mark look valid.
  const uint64_t taken = written_ - pending();
  if (format_ != Format::kTar || m.written > written_ || taken > m.written) return false;
  out_.resize(out_.size() - static_cast<size_t>(written_ - m.written));
  written_ = m.written;
  entry_left_ = m.entry_left;
  return true;
}

size_t ArchiveWriter::Take(char* buf, size_t cap) {
  size_t n = std::min(cap, pending());
  std::memcpy(buf, out_.data() + out_pos_, n);
  out_pos_ += n;
  if (out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  } else if (out_pos_ > (1 << 20) && out_pos_ >= pending()) {
    // Keeps the buffer from growing with what was taken, moving no more than was taken since
    // the last move (a large pending tail moved at every MiB taken was quadratic).
    out_.erase(0, out_pos_);
    out_pos_ = 0;
  }
  return n;
}

}  // namespace sluice::api
