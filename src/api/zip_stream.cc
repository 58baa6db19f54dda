#include "api/zip_stream.h"

#include <sys/stat.h>

#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/archive_writer.h"
#include "common/json.h"
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
  std::unique_ptr<DirHandle> dir;  // null once closed (CloseAShallowerDir) until reopened
  std::string prefix;  // archive name of this directory plus '/', or "" at the archive's top
  std::string rel;     // its path in the vfolder, to open it again
  uint64_t ino = 0;    // what it was when first opened (0: the backend has no inodes)
  bool skip_upload_dir = false;
  bool closed = false;                // its names left are in `left`
  std::vector<DirHandle::Name> left;  // in the order the directory gave them
  size_t next_left = 0;
  uint64_t left_bytes = 0;
};

ZipStream::ZipStream(Volume* volume, VFolderId vfid, std::vector<ZipSource> sources,
                     std::string label, ZipLimits limits)
    : volume_(volume),
      vfid_(std::move(vfid)),
      sources_(std::move(sources)),
      label_(std::move(label)),
      limits_(limits) {}

ZipStream::~ZipStream() = default;

Status ZipStream::Start() {
  started_ = true;
  in_.resize(kReadChunk);
  // No blocking: every piece goes straight out, and nothing pads the end.
  zip_ = std::make_unique<ArchiveWriter>(ArchiveWriter::Format::kZip, 0);
  return Context(zip_->Open());
}

Status ZipStream::Context(Status st) const {
  return st.ok() ? st : st.WithContext(fmt::format("archive {}", label_));
}

Status ZipStream::WriteHeader(const std::string& arcname, const DirEntry& info) {
  if (++entries_ > limits_.entries)
    return Status(Code::kTooLarge,
                  fmt::format("archive {}: more than {} entries", label_, limits_.entries));
  name_bytes_ += arcname.size();
  if (name_bytes_ > limits_.name_bytes)
    return Status(Code::kTooLarge,
                  fmt::format("archive {}: its entries' names add up to more than {} bytes", label_,
                              limits_.name_bytes));
  ArchiveWriter::Entry e;
  e.name = arcname;
  e.type = info.type == EntryType::kDirectory ? EntryType::kDirectory : EntryType::kFile;
  e.perm = info.mode & 07777;
  e.size = info.size;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(info.modified.time_since_epoch())
                .count();
  e.mtime_s = ns / 1000000000;
  e.mtime_ns = ns % 1000000000;
  return Context(zip_->Header(e));
}

Status ZipStream::BeginFile(std::string arcname, ArchiveMember m) {
  SLUICE_RETURN_IF_ERROR(WriteHeader(arcname, m.info));
  if (m.info.size == 0) {
    ++files_;
    return Context(zip_->FinishEntry(arcname));
  }
  file_ = std::move(m.file);
  file_off_ = 0;
  file_left_ = m.info.size;
  file_name_ = std::move(arcname);
  return Status::Ok();
}

Status ZipStream::BeginDir(std::string arcname, std::string rel, ArchiveMember m,
                           bool skip_upload_dir) {
  if (stack_.size() >= kMaxZipDepth)
    return Status(Code::kTooLarge, fmt::format("archive {}: '{}' is nested deeper than {} levels",
                                               label_, arcname, kMaxZipDepth));
  if (!arcname.empty()) SLUICE_RETURN_IF_ERROR(WriteHeader(arcname, m.info));
  Frame f;
  f.dir = std::move(m.dir);
  f.prefix = arcname.empty() ? std::string() : arcname + "/";
  f.rel = std::move(rel);
  f.ino = m.info.ino;
  f.skip_upload_dir = skip_upload_dir;
  stack_.push_back(std::move(f));
  if (++open_dirs_ > kMaxOpenZipDirs) return CloseAShallowerDir();
  return Status::Ok();
}

// The shallowest open directory below the top: what it has left is read now, and it closes.
Status ZipStream::CloseAShallowerDir() {
  for (size_t i = 0; i + 1 < stack_.size(); ++i) {
    Frame& f = stack_[i];
    if (!f.dir) continue;
    if (f.closed) {  // reopened: its names left are read already
      f.dir.reset();
      --open_dirs_;
      return Status::Ok();
    }
    for (;;) {
      auto next = f.dir->Next();
      if (!next.ok())
        return next.status().WithContext(fmt::format("archive {}: list '{}'", label_, f.prefix));
      if (!*next) break;
      // Names waiting count against the names' limit, as the entries written do.
      const uint64_t n = f.prefix.size() + (*next)->name.size();
      f.left_bytes += n;
      held_name_bytes_ += n;
      if (name_bytes_ + held_name_bytes_ > limits_.name_bytes)
        return Status(Code::kTooLarge,
                      fmt::format("archive {}: its entries' names add up to more than {} bytes",
                                  label_, limits_.name_bytes));
      f.left.push_back(std::move(**next));
    }
    f.dir.reset();
    f.closed = true;
    --open_dirs_;
    return Status::Ok();
  }
  return Status::Ok();
}

// A directory closed by CloseAShallowerDir, opened again by its path to go on with what it had
// left; kConflict if what is there now is another directory.
Status ZipStream::Reopen(Frame& f) {
  auto d = volume_->OpenDir(vfid_, f.rel);
  if (!d.ok())
    return d.status().WithContext(fmt::format("archive {}: open '{}' again", label_, f.prefix));
  if (f.ino != 0 && (*d)->info().ino != f.ino)
    return Status(Code::kConflict, fmt::format("archive {}: '{}' was replaced while being archived",
                                               label_, f.prefix));
  f.dir = std::move(d).value();
  ++open_dirs_;
  return CloseAShallowerDir();  // none is: this one is on top
}

Status ZipStream::FileData() {
  size_t want = static_cast<size_t>(std::min<uint64_t>(file_left_, in_.size()));
  auto got = file_->ReadAt(file_off_, in_.data(), want);
  if (!got.ok()) return got.status().WithContext(fmt::format("read '{}'", file_name_));
  const size_t n = *got;
  if (n == 0)
    return Status(Code::kIoError,
                  fmt::format("archive {}: '{}' shrank while being archived", label_, file_name_));
  SLUICE_RETURN_IF_ERROR(Context(zip_->Data(in_.data(), n)));
  bytes_read_ += n;
  file_off_ += n;
  file_left_ -= n;
  if (file_left_ == 0) {
    file_.reset();
    ++files_;
    SLUICE_RETURN_IF_ERROR(Context(zip_->FinishEntry(file_name_)));
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
  if (m.is_dir()) return BeginDir(src.arcname, src.rel, std::move(m), src.skip_upload_dir);
  return BeginFile(src.arcname, std::move(m));
}

Status ZipStream::NextFromDir() {
  Frame& f = stack_.back();
  // (One with nothing left is not opened again: it may be gone by now.)
  if (f.closed && !f.dir && f.next_left < f.left.size()) SLUICE_RETURN_IF_ERROR(Reopen(f));
  std::optional<DirHandle::Name> next;
  if (f.closed) {
    if (f.next_left < f.left.size()) {
      next = std::move(f.left[f.next_left++]);
      const uint64_t n = f.prefix.size() + next->name.size();  // counted as written from now
      f.left_bytes -= n;
      held_name_bytes_ -= n;
    }
  } else {
    auto got = f.dir->Next();
    if (!got.ok())
      return got.status().WithContext(fmt::format("archive {}: list '{}'", label_, f.prefix));
    next = std::move(got).value();
  }
  if (!next) {
    held_name_bytes_ -= f.left_bytes;
    if (f.dir) --open_dirs_;
    stack_.pop_back();
    return Status::Ok();
  }
  const std::string& name = next->name;
  if (f.skip_upload_dir && name == kStagingDirName) return Status::Ok();  // partial uploads
  std::string arcname = f.prefix + name;
  auto skip = [&](const std::string& why) {
    if (++skipped_ <= kSkipLogLines)
      spdlog::info("archive {}: skipped '{}{}': {}", label_,
                   std::string_view(arcname).substr(0, 256), arcname.size() > 256 ? "..." : "",
                   why);
    return Status::Ok();
  };
  // (Invalid UTF-8 grows threefold as written: checked as written only when it could matter.)
  if (arcname.size() + 1 > kMaxZipEntryName / 3 &&
      SanitizeUtf8(arcname).size() + 1 > kMaxZipEntryName)
    return skip(
        fmt::format("its name is longer than a ZIP entry's {} bytes", kMaxZipEntryName - 1));
  EntryType type = next->type;
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
  if (m->is_dir()) {
    std::string rel = f.rel.empty() ? name : f.rel + "/" + name;
    return BeginDir(std::move(arcname), std::move(rel), std::move(m).value(), false);
  }
  return BeginFile(std::move(arcname), std::move(m).value());
}

Status ZipStream::Step() {
  if (!started_) return Start();
  if (file_) return FileData();
  if (!stack_.empty()) return NextFromDir();
  if (next_source_ < sources_.size()) return NextFromSource();
  SLUICE_RETURN_IF_ERROR(Context(zip_->Close()));
  finished_ = true;
  if (skipped_ > kSkipLogLines)
    spdlog::info("archive {}: {} entries skipped in all (symbolic links, special files)", label_,
                 skipped_);
  return Status::Ok();
}

Result<size_t> ZipStream::Read(char* buf, size_t cap) {
  if (failed_) return Status(Code::kInternal, fmt::format("archive {} already failed", label_));
  while ((!zip_ || zip_->pending() < cap) && !finished_) {
    Status s = Step();
    if (!s.ok()) {
      failed_ = true;
      return s;
    }
  }
  return zip_->Take(buf, cap);
}

}  // namespace sluice::api
