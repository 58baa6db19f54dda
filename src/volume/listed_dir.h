// Directory handles whose children are opened through a volume by path: for backends without
// directory descriptors (the s3 one) and decorators that keep listings (the SSD read cache).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "volume/volume.h"

namespace sluice {

// A directory whose children are opened through a volume by path.
class ByPathDir : public DirHandle {
 public:
  ByPathDir(Volume* v, VFolderId vfid, std::string rel)
      : v_(v), vfid_(std::move(vfid)), rel_(std::move(rel)) {}
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->OpenReader(vfid_, Child(name));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->OpenDir(vfid_, Child(name));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdirFrom(const std::string& name,
                                                    const ListFrom& from) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    return v_->OpenDirFrom(vfid_, Child(name), from);
  }
  Result<std::string> EntryMeta(const std::string& name) override {
    SLUICE_ASSIGN_OR_RETURN(auto f, OpenFile(name));
    return f->ReadMeta();
  }

 protected:
  std::string Child(const std::string& name) const {
    return rel_.empty() ? name : rel_ + "/" + name;
  }
  Volume* v_;
  VFolderId vfid_;
  std::string rel_;
};

// A directory handle over a listing taken once (names and attributes, sorted by name).
class ListedDir : public ByPathDir {
 public:
  // `info` and `entries` live as long as `keep` does.
  ListedDir(Volume* v, VFolderId vfid, std::string rel, std::shared_ptr<const void> keep,
            const DirEntry* info, const std::vector<DirEntry>* entries)
      : ByPathDir(v, std::move(vfid), std::move(rel)),
        keep_(std::move(keep)),
        info_(info),
        entries_(entries) {}
  const DirEntry& info() const override { return *info_; }
  Result<std::optional<Name>> Next() override {
    if (next_ >= entries_->size()) return std::optional<Name>();
    const DirEntry& e = (*entries_)[next_++];
    return std::optional<Name>(Name{e.name, e.type});
  }
  // What the listing said (no request per entry), else the volume.
  Result<DirEntry> StatEntry(const std::string& name) override {
    SLUICE_RETURN_IF_ERROR(ValidateName(name));
    auto it = std::lower_bound(entries_->begin(), entries_->end(), name,
                               [](const DirEntry& e, const std::string& n) { return e.name < n; });
    if (it != entries_->end() && it->name == name) return *it;
    return v_->Stat(vfid_, Child(name));
  }

 private:
  std::shared_ptr<const void> keep_;
  const DirEntry* info_;
  const std::vector<DirEntry>* entries_;
  size_t next_ = 0;
};

}  // namespace sluice
