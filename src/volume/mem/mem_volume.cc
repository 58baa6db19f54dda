#include "volume/mem/mem_volume.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/path.h"
#include "common/secrets.h"
#include "volume/forwarding_volume.h"

namespace sluice {

namespace {

using Clock = std::chrono::system_clock;

struct Node {
  EntryType type = EntryType::kFile;
  uint32_t mode = 0644;
  uint64_t ino = 0;
  Clock::time_point created, modified;
  std::shared_ptr<const std::string> data = std::make_shared<const std::string>();  // files
  std::map<std::string, std::shared_ptr<Node>> children;                            // directories
};

DirEntry Describe(const std::string& name, const Node& n) {
  DirEntry e;
  e.name = name;
  e.type = n.type;
  e.mode = n.mode | (n.type == EntryType::kDirectory ? 0040000u : 0100000u);
  e.size = n.type == EntryType::kFile ? n.data->size() : 0;
  e.ino = n.ino;
  e.created = n.created;
  e.modified = n.modified;
  e.changed = n.modified;
  return e;
}

void Count(const Node& n, TreeUsage* u) {
  for (const auto& [name, c] : n.children) {
    u->file_count += 1;
    if (c->type == EntryType::kFile) u->used_bytes += c->data->size();
    if (c->type == EntryType::kDirectory) Count(*c, u);
  }
}

std::shared_ptr<Node> DeepCopy(const Node& n, std::atomic<uint64_t>& next_ino) {
  auto c = std::make_shared<Node>(n);
  c->ino = next_ino++;
  for (auto& [name, child] : c->children) child = DeepCopy(*child, next_ino);
  return c;
}

std::string Key(const VFolderId& vfid) {
  return vfid.ToString();
}

}  // namespace

struct MemVolume::State {
  std::mutex mu;
  std::atomic<uint64_t> next_ino{2};
  uint64_t capacity = 0;
  std::map<std::string, std::optional<uint64_t>> scopes;  // hex -> limit
  std::map<std::string, std::shared_ptr<Node>> vfolders;  // vfid -> root
  std::map<std::string, std::shared_ptr<Node>> trash;     // detached
  struct Staged {
    std::string vfid;
    std::shared_ptr<std::string> data = std::make_shared<std::string>();
    bool staged = true;
    bool recorded = false;
    uint64_t durable = 0;
    bool quota_checked = false;
    bool locked = false;
    Clock::time_point touched = Clock::now();
  };
  std::map<std::string, Staged> staging;  // session -> state

  std::shared_ptr<Node> NewNode(EntryType t, uint32_t mode) {
    auto n = std::make_shared<Node>();
    n->type = t;
    n->mode = mode;
    n->ino = next_ino++;
    n->created = n->modified = Clock::now();
    return n;
  }

  uint64_t Used() const {
    TreeUsage u;
    for (const auto& [k, root] : vfolders) Count(*root, &u);
    uint64_t staged = 0;
    for (const auto& [k, s] : staging) staged += s.data->size();
    return u.used_bytes + staged;
  }

  Result<std::shared_ptr<Node>> Root(const VFolderId& vfid, const std::string& volume) {
    auto it = vfolders.find(Key(vfid));
    if (it == vfolders.end()) return MissingVFolder(vfid, volume);
    return it->second;
  }

  // The node at `parts` below `root` (nullptr when missing); a file on the way is ENOTDIR.
  Result<std::shared_ptr<Node>> Walk(std::shared_ptr<Node> root,
                                     const std::vector<std::string>& parts, size_t n) {
    std::shared_ptr<Node> cur = std::move(root);
    for (size_t i = 0; i < n; ++i) {
      if (cur->type != EntryType::kDirectory)
        return Status(Code::kInvalidArgument,
                      fmt::format("'{}' is not a directory", JoinComponents(parts, i)), ENOTDIR);
      auto it = cur->children.find(parts[i]);
      if (it == cur->children.end())
        return Status(Code::kNotFound,
                      fmt::format("'{}' does not exist", JoinComponents(parts, i + 1)), ENOENT);
      cur = it->second;
    }
    return cur;
  }
};

namespace {

class MemReader : public FileReader {
 public:
  MemReader(DirEntry info, std::shared_ptr<const std::string> data)
      : info_(std::move(info)), data_(std::move(data)) {}
  const DirEntry& info() const override { return info_; }
  Result<size_t> ReadAt(uint64_t offset, char* buf, size_t n) override {
    if (offset >= data_->size()) return size_t{0};
    size_t k = std::min<uint64_t>(n, data_->size() - offset);
    std::memcpy(buf, data_->data() + offset, k);
    return k;
  }
  // Memory never waits.
  Result<size_t> ReadAtNoWait(uint64_t offset, char* buf, size_t n) override {
    return ReadAt(offset, buf, n);
  }

 private:
  DirEntry info_;
  std::shared_ptr<const std::string> data_;  // the version opened: writers replace, never edit
};

// A directory as it was when opened (names and nodes), its children opened from that view.
class MemDir : public DirHandle {
 public:
  MemDir(std::shared_ptr<MemVolume::State> st, std::shared_ptr<Node> node, DirEntry info)
      : st_(std::move(st)), node_(std::move(node)), info_(std::move(info)) {
    std::lock_guard lk(st_->mu);
    for (const auto& [name, c] : node_->children) names_.push_back({name, c->type});
  }
  const DirEntry& info() const override { return info_; }
  Result<std::optional<Name>> Next() override {
    if (next_ >= names_.size()) return std::optional<Name>();
    return std::optional<Name>(names_[next_++]);
  }
  Result<DirEntry> StatEntry(const std::string& name) override {
    SLUICE_ASSIGN_OR_RETURN(auto n, Child(name));
    std::lock_guard lk(st_->mu);
    return Describe(name, *n);
  }
  Result<std::shared_ptr<FileReader>> OpenFile(const std::string& name) override {
    SLUICE_ASSIGN_OR_RETURN(auto n, Child(name));
    std::lock_guard lk(st_->mu);
    if (n->type != EntryType::kFile)
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a regular file", name),
                    n->type == EntryType::kDirectory ? EISDIR : EINVAL);
    return std::shared_ptr<FileReader>(std::make_shared<MemReader>(Describe(name, *n), n->data));
  }
  Result<std::unique_ptr<DirHandle>> OpenSubdir(const std::string& name) override {
    SLUICE_ASSIGN_OR_RETURN(auto n, Child(name));
    DirEntry e;
    {
      std::lock_guard lk(st_->mu);
      if (n->type != EntryType::kDirectory)
        return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", name),
                      ENOTDIR);
      e = Describe(name, *n);
    }
    return std::unique_ptr<DirHandle>(new MemDir(st_, n, std::move(e)));
  }

 private:
  Result<std::shared_ptr<Node>> Child(const std::string& name) {
    std::lock_guard lk(st_->mu);
    auto it = node_->children.find(name);
    if (it == node_->children.end())
      return Status(Code::kNotFound, fmt::format("'{}' does not exist", name), ENOENT);
    return it->second;
  }
  std::shared_ptr<MemVolume::State> st_;
  std::shared_ptr<Node> node_;
  DirEntry info_;
  std::vector<Name> names_;
  size_t next_ = 0;
};

class MemStagingWriter : public StagingWriter {
 public:
  MemStagingWriter(std::shared_ptr<MemVolume::State> st, MemVolume* vol, VFolderId vfid,
                   std::string session, StagingState state)
      : st_(std::move(st)),
        vol_(vol),
        vfid_(std::move(vfid)),
        session_(std::move(session)),
        state_(state) {}
  ~MemStagingWriter() override {
    std::lock_guard lk(st_->mu);
    auto it = st_->staging.find(session_);
    if (it != st_->staging.end()) it->second.locked = false;
  }
  const StagingState& state() const override { return state_; }
  Status WriteAt(uint64_t offset, const char* data, size_t n, size_t* written) override {
    std::lock_guard lk(st_->mu);
    *written = 0;
    auto* s = Find();
    if (!s) return Status(Code::kNotFound, "the upload session is gone");
    uint64_t grow = offset + n > s->data->size() ? offset + n - s->data->size() : 0;
    if (st_->Used() + grow > st_->capacity) return Status::FromErrno(ENOSPC, "write upload");
    if (s->data->size() < offset + n) s->data->resize(offset + n);
    std::memcpy(s->data->data() + offset, data, n);
    s->touched = Clock::now();
    *written = n;
    return Status::Ok();
  }
  Status Sync(uint64_t offset, bool quota_checked) override {
    return Record(offset, quota_checked, false);
  }
  Status Rollback(uint64_t offset, bool quota_checked) override {
    return Record(offset, quota_checked, true);
  }
  Status Commit(const std::vector<std::string>& parts) override {
    std::lock_guard lk(st_->mu);
    auto* s = Find();
    if (!s) return Status(Code::kNotFound, "the upload session is gone");
    SLUICE_ASSIGN_OR_RETURN(auto root, st_->Root(vfid_, vol_->name()));
    std::shared_ptr<Node> dir = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto& slot = dir->children[parts[i]];
      if (!slot) {
        slot = st_->NewNode(EntryType::kDirectory, 0755);
        dir->modified = Clock::now();
      }
      if (slot->type != EntryType::kDirectory)
        return Status(
            Code::kConflict,
            fmt::format("'{}' exists and is not a directory", JoinComponents(parts, i + 1)),
            ENOTDIR);
      dir = slot;
    }
    auto& slot = dir->children[parts.back()];
    if (slot && slot->type == EntryType::kDirectory)
      return Status(Code::kConflict,
                    fmt::format("'{}' is a directory; the upload cannot replace it",
                                JoinComponents(parts, parts.size())),
                    EISDIR);
    if (slot && no_replace_)
      return Status(Code::kAlreadyExists,
                    fmt::format("'{}' exists", JoinComponents(parts, parts.size())), EEXIST);
    auto file = st_->NewNode(EntryType::kFile, 0644);
    file->data = std::make_shared<const std::string>(std::move(*s->data));
    landed_ = Describe(parts.back(), *file);
    slot = std::move(file);
    dir->modified = Clock::now();  // a directory's times move with its entries, as on a disk
    s->staged = false;             // the record stays: the session reads as complete
    s->data = std::make_shared<std::string>();
    return Status::Ok();
  }
  bool RefuseReplace() override {
    no_replace_ = true;
    return true;
  }
  std::optional<DirEntry> Landed() const override { return landed_; }

 private:
  bool no_replace_ = false;
  std::optional<DirEntry> landed_;
  MemVolume::State::Staged* Find() {
    auto it = st_->staging.find(session_);
    return it == st_->staging.end() || !it->second.staged ? nullptr : &it->second;
  }
  // Records the durable offset (as the POSIX writer's offset record); a rollback also drops
  // what lies past it.
  Status Record(uint64_t offset, bool quota_checked, bool truncate) {
    std::lock_guard lk(st_->mu);
    auto* s = Find();
    if (!s) return Status(Code::kNotFound, "the upload session is gone");
    s->recorded = true;
    s->durable = offset;
    s->quota_checked = quota_checked;
    if (truncate) s->data->resize(offset);
    return Status::Ok();
  }
  std::shared_ptr<MemVolume::State> st_;
  MemVolume* vol_;
  VFolderId vfid_;
  std::string session_;
  StagingState state_;
};

class MemQuota : public QuotaModel {
 public:
  MemQuota(std::shared_ptr<MemVolume::State> st, std::string volume)
      : st_(std::move(st)), volume_(std::move(volume)) {}
  std::string ScopePath(const QuotaScopeId& qsid) const override { return "mem:" + qsid.hex; }
  Status CreateScope(const QuotaScopeId& qsid, std::optional<uint64_t> limit) override {
    std::lock_guard lk(st_->mu);
    if (st_->scopes.count(qsid.hex)) return ExistingQuotaScope(qsid);
    st_->scopes[qsid.hex] = limit;
    return Status::Ok();
  }
  Result<QuotaUsage> DescribeScope(const QuotaScopeId& qsid) override {
    std::lock_guard lk(st_->mu);
    auto it = st_->scopes.find(qsid.hex);
    if (it == st_->scopes.end()) return Missing(qsid);
    QuotaUsage q;
    q.limit_bytes = it->second;
    TreeUsage u;
    for (const auto& [k, root] : st_->vfolders)
      if (k.rfind(qsid.ToString() + "/", 0) == 0) Count(*root, &u);
    q.used_bytes = u.used_bytes;
    return q;
  }
  Status UpdateScope(const QuotaScopeId& qsid, uint64_t limit) override {
    std::lock_guard lk(st_->mu);
    st_->scopes[qsid.hex] = limit;
    return Status::Ok();
  }
  Status UnsetQuota(const QuotaScopeId& qsid) override {
    std::lock_guard lk(st_->mu);
    auto it = st_->scopes.find(qsid.hex);
    if (it == st_->scopes.end()) return Missing(qsid);
    it->second.reset();
    return Status::Ok();
  }
  Status DeleteScope(const QuotaScopeId& qsid) override {
    std::lock_guard lk(st_->mu);
    if (!st_->scopes.count(qsid.hex)) return Missing(qsid);
    for (const auto& [k, root] : st_->vfolders)
      if (k.rfind(qsid.ToString() + "/", 0) == 0) return QuotaScopeNotEmpty(qsid);
    st_->scopes.erase(qsid.hex);
    return Status::Ok();
  }

 private:
  Status Missing(const QuotaScopeId& qsid) const { return MissingQuotaScope(qsid, volume_); }
  std::shared_ptr<MemVolume::State> st_;
  std::string volume_;
};

// Tree operations on the volume's own names: detached vfolders ("mem-trash:<id>").
class MemFsOp : public FSOpModel {
 public:
  explicit MemFsOp(std::shared_ptr<MemVolume::State> st) : st_(std::move(st)) {}
  Status CopyTree(const std::string& src, const std::string& dst) override {
    return Status(Code::kUnsupported, "the mem backend copies vfolders, not paths");
  }
  Status MoveTree(const std::string& src, const std::string& dst) override {
    return Status(Code::kUnsupported, "the mem backend moves vfolders, not paths");
  }
  Status DeleteTree(const std::string& path) override {
    std::lock_guard lk(st_->mu);
    st_->trash.erase(path);
    return Status::Ok();
  }
  Result<TreeUsage> ScanTree(const std::string& path) override {
    std::lock_guard lk(st_->mu);
    auto it = st_->trash.find(path);
    if (it == st_->trash.end()) return Status(Code::kNotFound, fmt::format("no '{}'", path));
    TreeUsage u;
    Count(*it->second, &u);
    return u;
  }

 private:
  std::shared_ptr<MemVolume::State> st_;
};

}  // namespace

MemVolume::MemVolume(VolumeConfig cfg, uint64_t capacity)
    : cfg_(std::move(cfg)),
      io_stats_(&Metrics::Global().Volume(cfg_.name)),
      state_(std::make_shared<State>()) {
  state_->capacity = capacity;
  quota_ = std::make_unique<MemQuota>(state_, cfg_.name);
  fsop_ = std::make_unique<MemFsOp>(state_);
}

MemVolume::~MemVolume() = default;

std::set<std::string> MemVolume::capabilities() const {
  return {kCapVFolder, kCapQuota, kCapMetric, kCapFastSize, kCapFastFsSize};
}

std::string MemVolume::VFolderPath(const VFolderId& vfid) const {
  return "mem:" + Key(vfid);
}

Status MemVolume::CreateVFolder(const VFolderId& vfid, mode_t mode, bool auto_scope,
                                std::optional<uint64_t> initial_limit) {
  if (mode & ~07777u)
    return Status(Code::kInvalidArgument, fmt::format("mode {:o} is not a permission mode", mode));
  std::lock_guard lk(state_->mu);
  if (vfid.scope && !state_->scopes.count(vfid.scope->hex)) {
    if (!auto_scope) return MissingQuotaScope(*vfid.scope, name());
    state_->scopes[vfid.scope->hex] = initial_limit;
  }
  if (state_->vfolders.count(Key(vfid))) return ExistingVFolder(vfid, name());
  state_->vfolders[Key(vfid)] = state_->NewNode(EntryType::kDirectory, mode);
  return Status::Ok();
}

Result<std::string> MemVolume::DetachVFolder(const VFolderId& vfid) {
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  std::string id = "mem-trash:" + vfid.hex + "-" + RandomHexString(4);
  state_->trash[id] = root;
  state_->vfolders.erase(Key(vfid));
  return id;
}

Status MemVolume::CheckVFolder(const VFolderId& vfid) {
  std::lock_guard lk(state_->mu);
  return state_->Root(vfid, name()).status();
}

Result<TreeUsage> MemVolume::GetUsage(const VFolderId& vfid) {
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  TreeUsage u;
  Count(*root, &u);
  return u;
}

Result<uint64_t> MemVolume::GetUsedBytes(const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(TreeUsage u, GetUsage(vfid));
  return u.used_bytes;
}

Result<FsUsage> MemVolume::GetFsUsage() {
  std::lock_guard lk(state_->mu);
  FsUsage f;
  f.capacity_bytes = state_->capacity;
  f.used_bytes = std::min(state_->capacity, state_->Used());
  f.available_bytes = f.capacity_bytes - f.used_bytes;
  return f;
}

HwInfo MemVolume::GetHwInfo() {
  HwInfo h;
  h.metadata = {{"backend", "mem"}, {"layout_version", "3"}};
  return h;
}

Result<std::string> MemVolume::MountPath(const VFolderId& vfid, std::string_view) {
  return Status(Code::kUnsupported,
                fmt::format("volume {} keeps vfolders in memory: they cannot be mounted", name()));
}

Status MemVolume::CopyVFolderFrom(Volume& from, const VFolderId& src, const VFolderId& dst,
                                  const TreeUsage& size) {
  auto* other = dynamic_cast<MemVolume*>(&ForwardingVolume::Innermost(from));
  if (!other)
    return Status(Code::kUnsupported,
                  fmt::format("volume {} cannot copy from volume {}", name(), from.name()));
  std::shared_ptr<Node> copy;
  {
    std::lock_guard lk(other->state_->mu);
    SLUICE_ASSIGN_OR_RETURN(auto root, other->state_->Root(src, other->name()));
    copy = DeepCopy(*root, state_->next_ino);
  }
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto dst_root, state_->Root(dst, name()));
  dst_root->children = std::move(copy->children);
  return Status::Ok();
}

Status MemVolume::ValidatePath(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_RETURN_IF_ERROR(SplitRelPath(relpath).status());
  return CheckVFolder(vfid);
}

Status MemVolume::Mkdir(const VFolderId& vfid, std::string_view relpath, bool parents,
                        bool exist_ok) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kAlreadyExists, "the vfolder root already exists");
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto dir, state_->Root(vfid, name()));
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    std::string here = JoinComponents(parts, i + 1);
    auto it = dir->children.find(parts[i]);
    if (it == dir->children.end()) {
      if (!last && !parents)
        return Status(Code::kNotFound, fmt::format("'{}' does not exist", here), ENOENT);
      auto n = state_->NewNode(EntryType::kDirectory, 0755);
      dir->children[parts[i]] = n;
      dir->modified = Clock::now();
      dir = n;
      continue;
    }
    if (it->second->type != EntryType::kDirectory)
      return Status(Code::kAlreadyExists, fmt::format("'{}' exists and is not a directory", here),
                    EEXIST);
    if (last && !exist_ok)
      return Status(Code::kAlreadyExists, fmt::format("'{}' already exists", here), EEXIST);
    dir = it->second;
  }
  return Status::Ok();
}

Status MemVolume::Rename(const VFolderId& vfid, std::string_view relpath,
                         std::string_view new_name) {
  SLUICE_RETURN_IF_ERROR(ValidateName(new_name));
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be renamed");
  std::vector<std::string> to = parts;
  to.back() = std::string(new_name);
  {
    // A rename never moves into a directory of the new name, as Move does: the name is taken
    // (EEXIST), as on a POSIX volume; its own name too (RENAME_NOREPLACE there).
    std::lock_guard lk(state_->mu);
    SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
    if (state_->Walk(root, to, to.size()).ok())
      return Status::FromErrno(EEXIST, fmt::format("rename '{}' to '{}'", relpath, new_name));
  }
  return Move(vfid, relpath, JoinComponents(to, to.size()));
}

Status MemVolume::Move(const VFolderId& vfid, std::string_view src, std::string_view dst) {
  SLUICE_ASSIGN_OR_RETURN(auto sp, SplitRelPath(src));
  SLUICE_ASSIGN_OR_RETURN(auto dp, SplitRelPath(dst));
  if (sp.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be moved");
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  SLUICE_ASSIGN_OR_RETURN(auto from, state_->Walk(root, sp, sp.size() - 1));
  auto it = from->children.find(sp.back());
  if (it == from->children.end())
    return Status(Code::kNotFound, fmt::format("'{}' does not exist", src), ENOENT);
  // Moving onto an existing directory moves into it, as mv does.
  std::shared_ptr<Node> to;
  std::string to_name;
  auto target = state_->Walk(root, dp, dp.size());
  if (target.ok() && (*target)->type == EntryType::kDirectory) {
    to = *target;
    to_name = sp.back();
  } else {
    if (dp.empty()) return Status(Code::kInvalidPath, "the destination is the vfolder root");
    SLUICE_ASSIGN_OR_RETURN(to, state_->Walk(root, dp, dp.size() - 1));
    if (to->type != EntryType::kDirectory)
      return Status(Code::kInvalidArgument, "the destination's parent is not a directory", ENOTDIR);
    to_name = dp.back();
  }
  if (to->children.count(to_name))
    return Status::FromErrno(EEXIST, fmt::format("move '{}' to '{}'", src, dst));
  // A directory cannot go inside itself (onto itself included: it would become its own child).
  if (dp.size() >= sp.size() && std::equal(sp.begin(), sp.end(), dp.begin()))
    return Status(Code::kInvalidArgument, "a directory cannot move into itself", EINVAL);
  to->children[to_name] = it->second;
  from->children.erase(it);
  to->modified = from->modified = Clock::now();
  return Status::Ok();
}

Status MemVolume::DeleteFiles(const VFolderId& vfid, const std::vector<std::string>& relpaths,
                              bool recursive) {
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  std::vector<std::pair<std::shared_ptr<Node>, std::string>> targets;
  for (const auto& rel : relpaths) {
    SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(rel));
    if (parts.empty()) return Status(Code::kInvalidPath, "the vfolder root cannot be deleted");
    SLUICE_ASSIGN_OR_RETURN(auto dir, state_->Walk(root, parts, parts.size() - 1));
    auto it = dir->children.find(parts.back());
    if (it == dir->children.end())
      return Status(Code::kNotFound, fmt::format("delete '{}': does not exist", rel), ENOENT);
    if (it->second->type == EntryType::kDirectory && !recursive && !it->second->children.empty())
      return Status(
          Code::kNotEmpty,
          fmt::format("directory '{}' is not empty; pass recursive=true to delete it", rel),
          ENOTEMPTY);
    targets.emplace_back(dir, parts.back());
  }
  for (auto& [dir, n] : targets) {
    dir->children.erase(n);
    dir->modified = Clock::now();
  }
  return Status::Ok();
}

Result<std::shared_ptr<FileReader>> MemVolume::OpenReader(const VFolderId& vfid,
                                                          std::string_view relpath, Lookup,
                                                          const LookupHint*) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  SLUICE_ASSIGN_OR_RETURN(auto n, state_->Walk(root, parts, parts.size()));
  if (n->type != EntryType::kFile)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a regular file", relpath),
                  n->type == EntryType::kDirectory ? EISDIR : EINVAL);
  return std::shared_ptr<FileReader>(
      std::make_shared<MemReader>(Describe(parts.empty() ? "" : parts.back(), *n), n->data));
}

Result<DirEntry> MemVolume::Stat(const VFolderId& vfid, std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  SLUICE_ASSIGN_OR_RETURN(auto n, state_->Walk(root, parts, parts.size()));
  return Describe(parts.empty() ? "" : parts.back(), *n);
}

Result<std::unique_ptr<DirHandle>> MemVolume::OpenDir(const VFolderId& vfid,
                                                      std::string_view relpath) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  std::shared_ptr<Node> n;
  DirEntry e;
  {
    std::lock_guard lk(state_->mu);
    SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
    SLUICE_ASSIGN_OR_RETURN(n, state_->Walk(root, parts, parts.size()));
    if (n->type != EntryType::kDirectory)
      return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", relpath),
                    ENOTDIR);
    e = Describe(parts.empty() ? "" : parts.back(), *n);
  }
  return std::unique_ptr<DirHandle>(new MemDir(state_, std::move(n), std::move(e)));
}

Result<std::vector<DirEntry>> MemVolume::ListSorted(const VFolderId& vfid, std::string_view relpath,
                                                    std::string_view start_after, size_t max) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto root, state_->Root(vfid, name()));
  SLUICE_ASSIGN_OR_RETURN(auto n, state_->Walk(root, parts, parts.size()));
  if (n->type != EntryType::kDirectory)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a directory", relpath), ENOTDIR);
  std::vector<DirEntry> out;
  for (auto it = n->children.upper_bound(std::string(start_after));
       it != n->children.end() && out.size() < max; ++it)
    out.push_back(Describe(it->first, *it->second));
  return out;
}

Result<std::string> MemVolume::CreateStaging(const VFolderId& vfid) {
  std::lock_guard lk(state_->mu);
  SLUICE_RETURN_IF_ERROR(state_->Root(vfid, name()).status());
  std::string session = RandomHexString(16);
  State::Staged s;
  s.vfid = Key(vfid);
  state_->staging[session] = std::move(s);
  return session;
}

Status MemVolume::DiscardStaging(const VFolderId& vfid, const std::string& session) {
  std::lock_guard lk(state_->mu);
  auto it = state_->staging.find(session);
  if (it == state_->staging.end() || it->second.vfid != Key(vfid))
    return Status(Code::kNotFound, fmt::format("no upload session {}", session));
  state_->staging.erase(it);
  return Status::Ok();
}

Result<StagingState> MemVolume::InspectStaging(const VFolderId& vfid, const std::string& session) {
  std::lock_guard lk(state_->mu);
  auto it = state_->staging.find(session);
  if (it == state_->staging.end() || it->second.vfid != Key(vfid))
    return Status(Code::kNotFound, fmt::format("upload session {} has no staging file", session));
  const auto& s = it->second;
  StagingState out;
  out.staged = s.staged;
  out.recorded = s.recorded;
  out.durable = s.durable;
  out.quota_checked = s.quota_checked;
  out.staged_size = s.data->size();
  return out;
}

Result<std::unique_ptr<StagingWriter>> MemVolume::OpenStaging(const VFolderId& vfid,
                                                              const std::string& session,
                                                              std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    {
      std::lock_guard lk(state_->mu);
      auto it = state_->staging.find(session);
      if (it == state_->staging.end() || it->second.vfid != Key(vfid) || !it->second.staged)
        return Status(Code::kNotFound,
                      fmt::format("upload session {} has no staging file", session));
      auto& s = it->second;
      if (!s.locked) {
        s.locked = true;
        if (s.data->size() > s.durable) s.data->resize(s.durable);  // never synced
        StagingState st{true, s.recorded, s.durable, s.quota_checked, s.data->size()};
        return std::unique_ptr<StagingWriter>(
            new MemStagingWriter(state_, this, vfid, session, st));
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return UploadWriterBusy(session);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

StagingSweep MemVolume::SweepStaging(const std::optional<VFolderId>& vfid, std::chrono::seconds age,
                                     const StagingRemoved& removed) {
  StagingSweep out;
  std::lock_guard lk(state_->mu);
  for (auto it = state_->staging.begin(); it != state_->staging.end();) {
    auto& s = it->second;
    if ((vfid && s.vfid != Key(*vfid)) || Clock::now() - s.touched <= age) {
      ++it;
      continue;
    }
    if (s.locked) {
      ++out.kept_locked;
      ++it;
      continue;
    }
    if (s.staged) {  // an abandoned session; otherwise the record of a finished one goes
      auto parsed = VFolderId::Parse(s.vfid);
      if (removed && parsed.ok())
        removed(parsed->scope ? parsed->scope->hex : "", parsed->hex, it->first);
      out.removed += 1;
      out.removed_bytes += s.data->size();
    }
    it = state_->staging.erase(it);
  }
  return out;
}

Status MemVolume::PutFile(const VFolderId& vfid, std::string_view relpath, std::string content) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, SplitRelPath(relpath));
  if (parts.empty()) return Status(Code::kInvalidPath, "a file needs a name");
  std::lock_guard lk(state_->mu);
  SLUICE_ASSIGN_OR_RETURN(auto dir, state_->Root(vfid, name()));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto& slot = dir->children[parts[i]];
    if (!slot) {
      slot = state_->NewNode(EntryType::kDirectory, 0755);
      dir->modified = Clock::now();
    }
    dir = slot;
  }
  auto f = state_->NewNode(EntryType::kFile, 0644);
  f->data = std::make_shared<const std::string>(std::move(content));
  dir->children[parts.back()] = std::move(f);
  dir->modified = Clock::now();
  return Status::Ok();
}

}  // namespace sluice
