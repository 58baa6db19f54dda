#include "volume/btrfs/btrfs_fs.h"

#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <btrfsutil.h>

#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>

#include <fmt/format.h>

namespace sluice::btrfs {

namespace {

// A failed libbtrfsutil call: `err` is errno right after it.
Status UtilError(enum btrfs_util_error e, int err, std::string_view what) {
  switch (e) {
    case BTRFS_UTIL_ERROR_NOT_BTRFS:
      return Status(Code::kInvalidArgument, fmt::format("{}: not on a btrfs filesystem", what));
    case BTRFS_UTIL_ERROR_NOT_SUBVOLUME:
      return Status(Code::kInvalidArgument, fmt::format("{}: not a btrfs subvolume", what));
    case BTRFS_UTIL_ERROR_SUBVOLUME_NOT_FOUND:
      return Status(Code::kNotFound, fmt::format("{}: no such subvolume", what), ENOENT);
    case BTRFS_UTIL_ERROR_NO_MEMORY:
      return Status(Code::kInternal, fmt::format("{}: out of memory", what), ENOMEM);
    default:
      break;
  }
  if (err == 0) err = EIO;
  Status s = Status::FromErrno(err, what);
  return Status(s.code(), fmt::format("{} ({})", s.message(), btrfs_util_strerror(e)), err);
}

std::string FormatUuid(const uint8_t* u) {
  return fmt::format(
      "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:"
      "02x}"
      "{:02x}",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
      u[15]);
}

bool IsNullUuid(const uint8_t* u) {
  for (int i = 0; i < 16; ++i)
    if (u[i]) return false;
  return true;
}

// An inheritance specifier for subvolume and snapshot creation, freed on scope exit.
struct InheritDeleter {
  void operator()(struct btrfs_util_qgroup_inherit* p) const {
    btrfs_util_destroy_qgroup_inherit(p);
  }
};
using Inherit = std::unique_ptr<struct btrfs_util_qgroup_inherit, InheritDeleter>;

Result<Inherit> MakeInherit(std::optional<uint64_t> parent_qgroup) {
  if (!parent_qgroup) return Inherit();
  struct btrfs_util_qgroup_inherit* raw = nullptr;
  auto e = btrfs_util_create_qgroup_inherit(0, &raw);
  if (e) return UtilError(e, errno, "qgroup inheritance");
  Inherit inherit(raw);
  e = btrfs_util_qgroup_inherit_add_group(&raw, *parent_qgroup);
  inherit.release();
  inherit.reset(raw);
  if (e) return UtilError(e, errno, "qgroup inheritance");
  return inherit;
}

// Walks the items of `key` (a search range) with BTRFS_IOC_TREE_SEARCH_V2; `fn` returns false
// to stop early.
using ItemFn = std::function<bool(const struct btrfs_ioctl_search_header&, const char* data)>;
Status TreeSearch(int fd, struct btrfs_ioctl_search_key key, const ItemFn& fn,
                  std::string_view what) {
  constexpr size_t kBufSize = 256 * 1024;
  std::vector<uint64_t> storage((sizeof(struct btrfs_ioctl_search_args_v2) + kBufSize) / 8 + 1);
  auto* args = reinterpret_cast<struct btrfs_ioctl_search_args_v2*>(storage.data());
  for (;;) {
    args->key = key;
    args->key.nr_items = UINT32_MAX;
    args->buf_size = kBufSize;
    if (::ioctl(fd, BTRFS_IOC_TREE_SEARCH_V2, args) != 0)
      return Status::FromErrno(errno, fmt::format("{}: tree search", what));
    uint32_t n = args->key.nr_items;
    if (n == 0) return Status::Ok();
    const char* p = reinterpret_cast<const char*>(args->buf);
    struct btrfs_ioctl_search_header last {};
    for (uint32_t i = 0; i < n; ++i) {
      struct btrfs_ioctl_search_header h;
      std::memcpy(&h, p, sizeof(h));
      p += sizeof(h);
      if (!fn(h, p)) return Status::Ok();
      p += h.len;
      last = h;
    }
    // Continue just after the last key returned: (objectid, type, offset + 1) with carries.
    key.min_objectid = last.objectid;
    key.min_type = last.type;
    key.min_offset = last.offset + 1;
    if (last.offset == UINT64_MAX) {
      key.min_offset = 0;
      if (last.type == 255) {
        if (last.objectid == UINT64_MAX) return Status::Ok();
        key.min_type = 0;
        key.min_objectid = last.objectid + 1;
      } else {
        key.min_type = last.type + 1;
      }
    }
    if (key.min_objectid > key.max_objectid) return Status::Ok();
  }
}

Result<uint64_t> ReadU64File(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    int err = errno;
    return Status::FromErrno(err ? err : ENOENT, fmt::format("read '{}'", path));
  }
  std::string s;
  in >> s;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    return Status(Code::kIoError, fmt::format("'{}' holds '{}', not a number", path, s));
  return v;
}

}  // namespace

std::string QgroupName(uint64_t q) {
  return fmt::format("{}/{}", QgroupLevel(q), QgroupSubid(q));
}

Result<uint64_t> ParseQgroupName(std::string_view s) {
  size_t sep = s.find_first_of("/_");
  auto bad = [&] {
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a qgroup id", s));
  };
  if (sep == std::string_view::npos) return bad();
  uint64_t level = 0, id = 0;
  auto [e1, ec1] = std::from_chars(s.data(), s.data() + sep, level);
  auto [e2, ec2] = std::from_chars(s.data() + sep + 1, s.data() + s.size(), id);
  if (ec1 != std::errc() || e1 != s.data() + sep || ec2 != std::errc() ||
      e2 != s.data() + s.size() || sep == 0 || sep + 1 == s.size() || level > 0xffff ||
      id >= (uint64_t{1} << 48))
    return bad();
  return Qgroup(static_cast<uint16_t>(level), id);
}

Result<bool> IsBtrfs(int fd) {
  struct statfs sf;
  if (::fstatfs(fd, &sf) != 0) return Status::FromErrno(errno, "statfs");
  return static_cast<unsigned long>(sf.f_type) == BTRFS_SUPER_MAGIC;
}

Result<std::string> FilesystemUuid(int fd) {
  struct btrfs_ioctl_fs_info_args info;
  std::memset(&info, 0, sizeof(info));
  if (::ioctl(fd, BTRFS_IOC_FS_INFO, &info) != 0)
    return Status::FromErrno(errno, "btrfs filesystem info");
  return FormatUuid(info.fsid);
}

Result<uint64_t> SubvolumeId(int fd) {
  uint64_t id = 0;
  auto e = btrfs_util_subvolume_id_fd(fd, &id);
  if (e) return UtilError(e, errno, "subvolume id");
  return id;
}

Result<SubvolumeInfo> GetSubvolumeInfo(int fd) {
  struct btrfs_util_subvolume_info info;
  auto e = btrfs_util_subvolume_info_fd(fd, 0, &info);
  if (e) return UtilError(e, errno, "subvolume info");
  SubvolumeInfo out;
  out.id = info.id;
  out.uuid = FormatUuid(info.uuid);
  if (!IsNullUuid(info.parent_uuid)) out.parent_uuid = FormatUuid(info.parent_uuid);
  return out;
}

Result<bool> SubvolumeExists(int fs_fd, uint64_t id) {
  struct btrfs_util_subvolume_info info;
  auto e = btrfs_util_subvolume_info_fd(fs_fd, id, &info);
  if (e == BTRFS_UTIL_OK) return true;
  if (e == BTRFS_UTIL_ERROR_SUBVOLUME_NOT_FOUND) return false;
  return UtilError(e, errno, fmt::format("look up subvolume {}", id));
}

Status CreateSubvolume(int parent_fd, const std::string& name,
                       std::optional<uint64_t> parent_qgroup) {
  SLUICE_ASSIGN_OR_RETURN(Inherit inherit, MakeInherit(parent_qgroup));
  auto e = btrfs_util_create_subvolume_fd(parent_fd, name.c_str(), 0, nullptr, inherit.get());
  if (e) return UtilError(e, errno, fmt::format("create subvolume '{}'", name));
  return Status::Ok();
}

Status CreateSnapshot(int src_fd, int parent_fd, const std::string& name,
                      std::optional<uint64_t> parent_qgroup) {
  SLUICE_ASSIGN_OR_RETURN(Inherit inherit, MakeInherit(parent_qgroup));
  auto e =
      btrfs_util_create_snapshot_fd2(src_fd, parent_fd, name.c_str(), 0, nullptr, inherit.get());
  if (e) return UtilError(e, errno, fmt::format("snapshot into '{}'", name));
  return Status::Ok();
}

Status DeleteSubvolume(int parent_fd, const std::string& name) {
  auto e = btrfs_util_delete_subvolume_fd(parent_fd, name.c_str(),
                                          BTRFS_UTIL_DELETE_SUBVOLUME_RECURSIVE);
  if (e) return UtilError(e, errno, fmt::format("delete subvolume '{}'", name));
  return Status::Ok();
}

Status CreateQgroup(int fs_fd, uint64_t q) {
  struct btrfs_ioctl_qgroup_create_args args = {1, q};
  if (::ioctl(fs_fd, BTRFS_IOC_QGROUP_CREATE, &args) != 0)
    return Status::FromErrno(errno, fmt::format("create qgroup {}", QgroupName(q)));
  return Status::Ok();
}

Status DestroyQgroup(int fs_fd, uint64_t q) {
  struct btrfs_ioctl_qgroup_create_args args = {0, q};
  if (::ioctl(fs_fd, BTRFS_IOC_QGROUP_CREATE, &args) != 0)
    return Status::FromErrno(errno, fmt::format("destroy qgroup {}", QgroupName(q)));
  return Status::Ok();
}

Status AssignQgroup(int fs_fd, uint64_t child, uint64_t parent) {
  struct btrfs_ioctl_qgroup_assign_args args = {1, child, parent};
  if (::ioctl(fs_fd, BTRFS_IOC_QGROUP_ASSIGN, &args) < 0)
    return Status::FromErrno(
        errno, fmt::format("assign qgroup {} to {}", QgroupName(child), QgroupName(parent)));
  return Status::Ok();
}

Status SetQgroupLimit(int fs_fd, uint64_t q, std::optional<uint64_t> max_referenced) {
  struct btrfs_ioctl_qgroup_limit_args args;
  std::memset(&args, 0, sizeof(args));
  args.qgroupid = q;
  args.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  // (u64)-1 clears the limit.
  args.lim.max_rfer = max_referenced ? *max_referenced : UINT64_MAX;
  if (::ioctl(fs_fd, BTRFS_IOC_QGROUP_LIMIT, &args) != 0)
    return Status::FromErrno(errno, fmt::format("set limit of qgroup {}", QgroupName(q)));
  return Status::Ok();
}

Result<QgroupRelations> GetQgroupRelations(int fs_fd, uint64_t q) {
  // Relations are stored both ways: (child, RELATION, parent) and (parent, RELATION, child).
  struct btrfs_ioctl_search_key key;
  std::memset(&key, 0, sizeof(key));
  key.tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  key.min_objectid = key.max_objectid = q;
  key.min_type = key.max_type = BTRFS_QGROUP_RELATION_KEY;
  key.max_offset = UINT64_MAX;
  key.max_transid = UINT64_MAX;
  QgroupRelations rel;
  SLUICE_RETURN_IF_ERROR(TreeSearch(
      fs_fd, key,
      [&](const struct btrfs_ioctl_search_header& h, const char*) {
        if (h.objectid == q && h.type == BTRFS_QGROUP_RELATION_KEY) {
          if (QgroupLevel(h.offset) > QgroupLevel(q))
            rel.parents.push_back(h.offset);
          else
            rel.children.push_back(h.offset);
        }
        return true;
      },
      fmt::format("relations of qgroup {}", QgroupName(q))));
  return rel;
}

Result<uint64_t> CountInodes(int fs_fd, uint64_t subvol_id) {
  // Keys sort by (objectid, type, offset), so the range returns every item of the inodes above
  // the root; only their INODE_ITEMs are counted.
  struct btrfs_ioctl_search_key key;
  std::memset(&key, 0, sizeof(key));
  key.tree_id = subvol_id;
  key.min_objectid = BTRFS_FIRST_FREE_OBJECTID + 1;
  key.max_objectid = BTRFS_LAST_FREE_OBJECTID;
  key.min_type = key.max_type = BTRFS_INODE_ITEM_KEY;
  key.max_offset = UINT64_MAX;
  key.max_transid = UINT64_MAX;
  uint64_t n = 0;
  SLUICE_RETURN_IF_ERROR(TreeSearch(
      fs_fd, key,
      [&](const struct btrfs_ioctl_search_header& h, const char*) {
        if (h.type == BTRFS_INODE_ITEM_KEY) ++n;
        return true;
      },
      fmt::format("count inodes of subvolume {}", subvol_id)));
  return n;
}

Status CommitTransaction(int fs_fd) {
  uint64_t transid = 0;
  auto e = btrfs_util_start_sync_fd(fs_fd, &transid);
  if (e) return UtilError(e, errno, "start transaction commit");
  e = btrfs_util_wait_sync_fd(fs_fd, transid);
  if (e) return UtilError(e, errno, fmt::format("wait for commit of transaction {}", transid));
  return Status::Ok();
}

QgroupSysfs::QgroupSysfs(const std::string& fsid) : dir_("/sys/fs/btrfs/" + fsid + "/qgroups") {}

QuotaMode QgroupSysfs::Mode() const {
  if (::access(dir_.c_str(), F_OK) != 0) return QuotaMode::kDisabled;
  std::ifstream in(dir_ + "/mode");
  std::string mode;
  if (in >> mode && mode == "squota") return QuotaMode::kSimple;
  return QuotaMode::kFull;  // "qgroup", or a kernel without the file (full accounting only)
}

bool QgroupSysfs::Inconsistent() const {
  auto v = ReadU64File(dir_ + "/inconsistent");
  return v.ok() && *v != 0;
}

bool QgroupSysfs::Exists(uint64_t q) const {
  std::string p = fmt::format("{}/{}_{}", dir_, QgroupLevel(q), QgroupSubid(q));
  return ::access(p.c_str(), F_OK) == 0;
}

Result<QgroupCounters> QgroupSysfs::Read(uint64_t q) const {
  std::string base = fmt::format("{}/{}_{}/", dir_, QgroupLevel(q), QgroupSubid(q));
  if (::access(base.c_str(), F_OK) != 0)
    return Status(Code::kNotFound, fmt::format("qgroup {} does not exist", QgroupName(q)), ENOENT);
  QgroupCounters c;
  SLUICE_ASSIGN_OR_RETURN(c.referenced, ReadU64File(base + "referenced"));
  SLUICE_ASSIGN_OR_RETURN(c.exclusive, ReadU64File(base + "exclusive"));
  SLUICE_ASSIGN_OR_RETURN(c.rsv_data, ReadU64File(base + "rsv_data"));
  SLUICE_ASSIGN_OR_RETURN(uint64_t flags, ReadU64File(base + "limit_flags"));
  if (flags & BTRFS_QGROUP_LIMIT_MAX_RFER) {
    SLUICE_ASSIGN_OR_RETURN(uint64_t max, ReadU64File(base + "max_referenced"));
    c.max_referenced = max;
  }
  return c;
}

}  // namespace sluice::btrfs
