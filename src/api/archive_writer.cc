#include "api/archive_writer.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace sluice::api {

// Names in the archive are UTF-8 (the ZIP "language encoding" flag is set); bytes that are not
// valid UTF-8 become U+FFFD so that readers can decode every name.
std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && n > 1) {
      // Reject overlong forms, surrogates and code points past U+10FFFF.
      uint32_t cp = c & (0xff >> (n + 1));
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[n] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      i += 1;
    }
  }
  return out;
}

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
  ar_ = archive_write_new();
  entry_ = archive_entry_new();
  if (!ar_ || !entry_) return Status(Code::kInternal, "out of memory creating an archive");
  const bool zip = format_ == Format::kZip;
  int ok = zip ? (archive_write_set_format_zip(ar_) == ARCHIVE_OK &&
                  archive_write_zip_set_compression_deflate(ar_) == ARCHIVE_OK &&
                  archive_write_set_options(ar_, "zip:hdrcharset=UTF-8") == ARCHIVE_OK)
               : archive_write_set_format_pax_restricted(ar_) == ARCHIVE_OK;
  if (!ok || archive_write_set_bytes_per_block(ar_, static_cast<int>(block_bytes_)) != ARCHIVE_OK ||
      archive_write_open2(ar_, this, nullptr, &ArchiveWriter::OnWrite, nullptr, nullptr) !=
          ARCHIVE_OK)
    return Error(zip ? "start a ZIP stream" : "start a TAR stream");
  return Status::Ok();
}

Status ArchiveWriter::Header(const Entry& e) {
  archive_entry_clear(entry_);
  if (format_ == Format::kZip)
    archive_entry_set_pathname_utf8(entry_, SanitizeUtf8(e.name).c_str());
  else
    archive_entry_copy_pathname(entry_, e.name.c_str());
  archive_entry_set_filetype(entry_, e.type == EntryType::kDirectory ? AE_IFDIR
                                     : e.type == EntryType::kSymlink ? AE_IFLNK
                                                                     : AE_IFREG);
  archive_entry_set_perm(entry_, e.perm & 07777);
  archive_entry_set_uid(entry_, e.uid);
  archive_entry_set_gid(entry_, e.gid);
  archive_entry_set_size(entry_, e.type == EntryType::kFile ? static_cast<la_int64_t>(e.size) : 0);
  archive_entry_set_mtime(entry_, e.mtime_s, e.mtime_ns);
  if (!e.link.empty()) archive_entry_copy_symlink(entry_, e.link.c_str());
  // ARCHIVE_WARN: a name that is not ASCII went into a PAX header as raw bytes.
  if (archive_write_header(ar_, entry_) < ARCHIVE_WARN)
    return Error(fmt::format("add '{}'", e.name));
  return Status::Ok();
}

Status ArchiveWriter::Data(const char* data, size_t n) {
  if (archive_write_data(ar_, data, n) < 0) return Error("write entry data");
  return Status::Ok();
}

Status ArchiveWriter::FinishEntry(std::string_view name) {
  if (archive_write_finish_entry(ar_) < ARCHIVE_WARN)
    return Error(fmt::format("finish '{}'", name));
  return Status::Ok();
}

Status ArchiveWriter::Close() {
  if (archive_write_close(ar_) != ARCHIVE_OK) return Error("finish the archive");
  closed_ = true;
  return Status::Ok();
}

size_t ArchiveWriter::Take(char* buf, size_t cap) {
  size_t n = std::min(cap, pending());
  std::memcpy(buf, out_.data() + out_pos_, n);
  out_pos_ += n;
  if (out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  } else if (out_pos_ > (1 << 20)) {  // keep the buffer from growing with what was taken
    out_.erase(0, out_pos_);
    out_pos_ = 0;
  }
  return n;
}

}  // namespace sluice::api
