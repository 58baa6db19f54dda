#include "api/zip_stream.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/path.h"

namespace sluice::api {

namespace {

constexpr size_t kReadChunk = 128 << 10;
// Log lines for skipped entries per archive; the rest are only counted.
constexpr uint64_t kSkipLogLines = 5;

const char* TypeName(const DirEntry& e) {
  if (e.type == EntryType::kSymlink) return "a symbolic link";
  if (S_ISFIFO(e.mode)) return "a FIFO";
  if (S_ISSOCK(e.mode)) return "a socket";
  if (S_ISCHR(e.mode)) return "a character device";
  if (S_ISBLK(e.mode)) return "a block device";
  return "not a regular file or directory";
}

// Opens the member `info` describes through `open_file` / `open_dir`, checking that it is still
// the same kind of thing (a swap between the stat and the open is refused, not followed).
template <typename OpenFile, typename OpenDir>
Result<ArchiveMember> OpenMember(DirEntry info, std::string_view shown, OpenFile open_file,
                                 OpenDir open_dir) {
  if (info.type != EntryType::kFile && info.type != EntryType::kDirectory)
    return Status(Code::kInvalidPath,
                  fmt::format("'{}' is {}: archives hold only regular files and directories", shown,
                              TypeName(info)));
  ArchiveMember m;
  Status opened;
  if (info.type == EntryType::kDirectory) {
    auto d = open_dir();
    if (d.ok())
      m.dir = std::move(d).value();
    else
      opened = d.status();
  } else {
    auto f = open_file();
    if (f.ok())
      m.file = std::move(f).value();
    else
      opened = f.status();
  }
  if (!opened.ok()) {
    if (opened.code() == Code::kNotFound)
      return Status(Code::kNotFound, fmt::format("'{}' does not exist", shown));
    if (opened.code() == Code::kInvalidPath || opened.sys_errno() == ENOTDIR ||
        opened.sys_errno() == EISDIR || opened.code() == Code::kInvalidArgument)
      return Status(Code::kInvalidPath, fmt::format("'{}' changed while being archived", shown),
                    opened.sys_errno());
    return opened;
  }
  const DirEntry& now = m.dir ? m.dir->info() : m.file->info();
  if (now.type != info.type || (info.ino && now.ino != info.ino))
    return Status(Code::kInvalidPath, fmt::format("'{}' changed while being archived", shown));
  m.info = now;
  return m;
}

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

}  // namespace

Result<ArchiveMember> OpenArchiveMember(Volume& volume, const VFolderId& vfid,
                                        std::string_view rel) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(rel));
  if (parts.empty())
    return Status(Code::kInvalidPath, "an archive member must name a path below the vfolder root");
  auto info = volume.Stat(vfid, rel);
  if (!info.ok()) {
    // A missing or non-directory parent means the member does not exist.
    if (info.status().sys_errno() == ENOTDIR || info.status().code() == Code::kNotFound)
      return Status(Code::kNotFound, fmt::format("'{}' does not exist", rel));
    return info.status();
  }
  return OpenMember(
      std::move(info).value(), rel, [&] { return volume.OpenReader(vfid, rel); },
      [&] { return volume.OpenDir(vfid, rel); });
}

struct ZipStream::Frame {
  std::unique_ptr<DirHandle> dir;
  std::string prefix;  // archive name of this directory plus '/', or "" at the archive's top
  bool skip_upload_dir = false;
};

ZipStream::ZipStream(Volume* volume, VFolderId vfid, std::vector<ZipSource> sources,
                     std::string label)
    : volume_(volume),
      vfid_(std::move(vfid)),
      sources_(std::move(sources)),
      label_(std::move(label)) {}

ZipStream::~ZipStream() {
  if (ar_) {
    // An archive that did not finish must not be finished now (that could mean writing the
    // rest of an entry): mark it failed so that free only releases memory.
    if (!finished_) archive_write_fail(ar_);
    archive_write_free(ar_);
  }
  if (entry_) archive_entry_free(entry_);
}

ssize_t ZipStream::OnWrite(struct archive*, void* self, const void* buf, size_t n) {
  static_cast<ZipStream*>(self)->out_.append(static_cast<const char*>(buf), n);
  return static_cast<ssize_t>(n);
}

Status ZipStream::ArchiveError(std::string_view what) {
  const char* msg = ar_ ? archive_error_string(ar_) : nullptr;
  return Status(Code::kInternal, fmt::format("archive {}: cannot {}: {}", label_, what,
                                             msg ? msg : "unknown error"));
}

Status ZipStream::Start() {
  started_ = true;
  ar_ = archive_write_new();
  entry_ = archive_entry_new();
  if (!ar_ || !entry_) return Status(Code::kInternal, "out of memory creating an archive");
  in_.resize(kReadChunk);
  if (archive_write_set_format_zip(ar_) != ARCHIVE_OK ||
      archive_write_zip_set_compression_deflate(ar_) != ARCHIVE_OK ||
      archive_write_set_options(ar_, "zip:hdrcharset=UTF-8") != ARCHIVE_OK ||
      // No blocking: every piece goes straight to OnWrite, and nothing pads the end.
      archive_write_set_bytes_per_block(ar_, 0) != ARCHIVE_OK ||
      archive_write_open2(ar_, this, nullptr, &ZipStream::OnWrite, nullptr, nullptr) != ARCHIVE_OK)
    return ArchiveError("start a ZIP stream");
  return Status::Ok();
}

Status ZipStream::WriteHeader(const std::string& arcname, const DirEntry& info) {
  if (++entries_ > kMaxZipEntries)
    return Status(Code::kTooLarge,
                  fmt::format("archive {}: more than {} entries", label_, kMaxZipEntries));
  archive_entry_clear(entry_);
  std::string name = SanitizeUtf8(arcname);
  archive_entry_set_pathname_utf8(entry_, name.c_str());
  bool dir = info.type == EntryType::kDirectory;
  archive_entry_set_filetype(entry_, dir ? AE_IFDIR : AE_IFREG);
  archive_entry_set_perm(entry_, info.mode & 07777);
  archive_entry_set_size(entry_, dir ? 0 : static_cast<la_int64_t>(info.size));
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(info.modified.time_since_epoch())
                .count();
  archive_entry_set_mtime(entry_, ns / 1000000000, ns % 1000000000);
  if (archive_write_header(ar_, entry_) < ARCHIVE_WARN)
    return ArchiveError(fmt::format("add '{}'", arcname));
  return Status::Ok();
}

Status ZipStream::BeginFile(std::string arcname, ArchiveMember m) {
  SLUICE_RETURN_IF_ERROR(WriteHeader(arcname, m.info));
  if (m.info.size == 0) {
    ++files_;
    if (archive_write_finish_entry(ar_) < ARCHIVE_WARN)
      return ArchiveError(fmt::format("finish '{}'", arcname));
    return Status::Ok();
  }
  file_ = std::move(m.file);
  file_off_ = 0;
  file_left_ = m.info.size;
  file_name_ = std::move(arcname);
  return Status::Ok();
}

Status ZipStream::BeginDir(std::string arcname, ArchiveMember m, bool skip_upload_dir) {
  if (stack_.size() >= kMaxZipDepth)
    return Status(Code::kTooLarge, fmt::format("archive {}: '{}' is nested deeper than {} levels",
                                               label_, arcname, kMaxZipDepth));
  if (!arcname.empty()) SLUICE_RETURN_IF_ERROR(WriteHeader(arcname, m.info));
  Frame f;
  f.dir = std::move(m.dir);
  f.prefix = arcname.empty() ? std::string() : arcname + "/";
  f.skip_upload_dir = skip_upload_dir;
  stack_.push_back(std::move(f));
  return Status::Ok();
}

Status ZipStream::FileData() {
  size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, in_.size()));
  auto got = file_->ReadAt(file_off_, in_.data(), want);
  if (!got.ok()) return got.status().WithContext(fmt::format("read '{}'", file_name_));
  const size_t n = *got;
  if (n == 0)
    return Status(Code::kIoError,
                  fmt::format("archive {}: '{}' shrank while being archived", label_, file_name_));
  if (archive_write_data(ar_, in_.data(), n) < 0)
    return ArchiveError(fmt::format("compress '{}'", file_name_));
  bytes_read_ += n;
  file_off_ += n;
  file_left_ -= n;
  if (file_left_ == 0) {
    file_.reset();
    ++files_;
    if (archive_write_finish_entry(ar_) < ARCHIVE_WARN)
      return ArchiveError(fmt::format("finish '{}'", file_name_));
  }
  return Status::Ok();
}

Status ZipStream::NextFromSource() {
  ZipSource& src = sources_[next_source_++];
  ArchiveMember m;
  if (src.member) {
    m = std::move(*src.member);
  } else {
    auto r = OpenArchiveMember(*volume_, vfid_, src.rel);
    if (!r.ok()) return r.status().WithContext(fmt::format("archive {}", label_));
    m = std::move(r).value();
  }
  if (m.is_dir()) return BeginDir(src.arcname, std::move(m), src.skip_upload_dir);
  return BeginFile(src.arcname, std::move(m));
}

Status ZipStream::NextFromDir() {
  Frame& f = stack_.back();
  auto next = f.dir->Next();
  if (!next.ok())
    return next.status().WithContext(fmt::format("archive {}: list '{}'", label_, f.prefix));
  if (!*next) {
    stack_.pop_back();
    return Status::Ok();
  }
  const std::string& name = (*next)->name;
  if (f.skip_upload_dir && name == kStagingDirName) return Status::Ok();  // partial uploads
  std::string arcname = f.prefix + name;
  auto skip = [&](const std::string& why) {
    if (++skipped_ <= kSkipLogLines)
      spdlog::info("archive {}: skipped '{}': {}", label_, arcname, why);
    return Status::Ok();
  };
  EntryType type = (*next)->type;
  if (type == EntryType::kSymlink) return skip("a symbolic link");
  if (type == EntryType::kOther) return skip("a special file");
  auto info = f.dir->StatEntry(name);
  if (!info.ok()) {
    if (info.status().code() == Code::kNotFound) return skip("removed while being archived");
    return info.status();
  }
  DirHandle* dir = f.dir.get();
  auto m = OpenMember(
      std::move(info).value(), arcname, [&] { return dir->OpenFile(name); },
      [&] { return dir->OpenSubdir(name); });
  if (!m.ok()) {
    Code c = m.status().code();
    if (c == Code::kInvalidPath || c == Code::kNotFound || c == Code::kPermissionDenied)
      return skip(m.status().message());
    return m.status();
  }
  if (m->is_dir()) return BeginDir(std::move(arcname), std::move(m).value(), false);
  return BeginFile(std::move(arcname), std::move(m).value());
}

Status ZipStream::Step() {
  if (!started_) return Start();
  if (file_) return FileData();
  if (!stack_.empty()) return NextFromDir();
  if (next_source_ < sources_.size()) return NextFromSource();
  if (archive_write_close(ar_) != ARCHIVE_OK) return ArchiveError("finish the archive");
  finished_ = true;
  if (skipped_ > kSkipLogLines)
    spdlog::info("archive {}: {} entries skipped in all (symbolic links, special files)", label_,
                 skipped_);
  return Status::Ok();
}

Result<size_t> ZipStream::Read(char* buf, size_t cap) {
  if (failed_) return Status(Code::kInternal, fmt::format("archive {} already failed", label_));
  if (out_pos_ > 0) {
    out_.erase(0, out_pos_);
    out_pos_ = 0;
  }
  while (out_.size() < cap && !finished_) {
    Status s = Step();
    if (!s.ok()) {
      failed_ = true;
      return s;
    }
  }
  size_t n = std::min(cap, out_.size());
  std::memcpy(buf, out_.data(), n);
  out_pos_ = n;
  return n;
}

}  // namespace sluice::api
