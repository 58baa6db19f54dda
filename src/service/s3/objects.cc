#include "service/s3/objects.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <random>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "api/range.h"
#include "common/checksum.h"
#include "common/crypto.h"
#include "common/json.h"
#include "common/path.h"
#include "common/secrets.h"
#include "service/upload.h"
#include "volume/key_order.h"

namespace sluice {

namespace {

bool StartsWith(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

std::string RelOf(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out.push_back('/');
    out += parts[i];
  }
  return out;
}

bool IsObjectNotFound(const Status& st) {
  return st.code() == Code::kNotFound || st.sys_errno() == ENOTDIR || st.sys_errno() == EISDIR ||
         st.code() == Code::kInvalidPath;
}

bool TokenName(std::string_view n) {
  static constexpr std::string_view kSpecials = "!#$%&'*+-.^_`|~";
  return !n.empty() && n.size() <= 2048 && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kSpecials.find(c) != kSpecials.npos;
  });
}

// "<32 hex>" or "<32 hex>-<parts>", as Publish and CompleteMultipart store it.
bool StoredETag(std::string_view e) {
  if (e.size() < 32 || !std::all_of(e.begin(), e.begin() + 32, [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
      }))
    return false;
  std::string_view parts = e.substr(32);
  if (parts.empty()) return true;
  return parts.size() >= 2 && parts.size() <= 6 && parts[0] == '-' &&
         std::all_of(parts.begin() + 1, parts.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

bool StoredMapOk(const std::map<std::string, std::string>& m, bool (*name_ok)(std::string_view)) {
  return std::all_of(m.begin(), m.end(), [&](const auto& kv) {
    return name_ok(kv.first) && HeaderValueSafe(kv.second);
  });
}

bool StoredHeaderName(std::string_view n) {
  return std::find(std::begin(kStoredHeaders), std::end(kStoredHeaders), n) !=
         std::end(kStoredHeaders);
}

}  // namespace

bool HeaderValueSafe(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && u != '\t') || u == 0x7f;
  });
}

int64_t MtimeNs(const DirEntry& e) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(e.modified.time_since_epoch())
      .count();
}

std::string ObjectMeta::Encode() const {
  nlohmann::json j = {{"v", 1}, {"s", size}, {"n", mtime_ns}};
  if (!etag.empty()) j["e"] = etag;
  if (!content_type.empty()) j["t"] = content_type;
  if (!headers.empty()) j["h"] = headers;
  if (!user.empty()) j["m"] = user;
  if (!checksums.empty()) j["c"] = checksums;
  // Callers keep these UTF-8 (MetaFromHeaders refuses other bytes); a slip is replaced, never
  // thrown from the middle of a write.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<ObjectMeta> ObjectMeta::Decode(std::string_view blob, const DirEntry& file) {
  if (blob.empty()) return std::nullopt;
  auto j = nlohmann::json::parse(blob, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    ObjectMeta m;
    m.size = j.value("s", uint64_t{0});
    m.mtime_ns = j.value("n", int64_t{0});
    // The metadata is for this version of the file: the same size and mtime. An object of an
    // origin with entity tags (an s3 volume) is replaced whole, metadata included, and its
    // listing shows the origin's Last-Modified, not the mtime the metadata was made for: the
    // size suffices there.
    if (m.size != file.size || (file.etag.empty() && m.mtime_ns != MtimeNs(file)))
      return std::nullopt;
    m.etag = j.value("e", std::string());
    m.content_type = j.value("t", std::string());
    if (j.contains("h")) m.headers = j["h"].get<std::map<std::string, std::string>>();
    if (j.contains("m")) m.user = j["m"].get<std::map<std::string, std::string>>();
    if (j.contains("c")) m.checksums = j["c"].get<std::map<std::string, std::string>>();
    if ((!m.etag.empty() && !StoredETag(m.etag)) || !HeaderValueSafe(m.content_type) ||
        !StoredMapOk(m.headers, StoredHeaderName) || !StoredMapOk(m.user, TokenName) ||
        !StoredMapOk(m.checksums, TokenName))
      return std::nullopt;
    return m;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string ObjectETag(const DirEntry& e, const std::optional<ObjectMeta>& meta) {
  return ObjectETag(e, meta ? &*meta : nullptr);
}

std::string ObjectETag(const DirEntry& e, const ObjectMeta* meta) {
  if (meta && !meta->etag.empty()) return "\"" + meta->etag + "\"";
  if (!e.etag.empty()) return e.etag;  // the origin's, for a volume that has one (s3)
  char buf[api::kMaxETagSize];
  return std::string(api::MakeETag(e.ino, e.size, static_cast<uint64_t>(MtimeNs(e)), buf));
}

Result<std::string_view> KeyPath(std::string_view key) {
  if (key.size() > 1024)
    return Status(Code::kUriTooLong,
                  fmt::format("the key is {} bytes; the limit is 1024", key.size()), ENAMETOOLONG);
  if (key.empty()) return Status(Code::kInvalidArgument, "the key is empty");
  if (key.back() == '/') key.remove_suffix(1);
  const std::string_view path = key;
  bool first = true;
  while (true) {
    size_t s = key.find('/');
    std::string_view c = key.substr(0, s);
    if (c.empty() || c == "." || c == "..")
      return Status(Code::kInvalidArgument,
                    "a key cannot hold empty, '.' or '..' path segments here: objects are files",
                    EINVAL);
    if (c.find('\0') != std::string_view::npos)
      return Status(Code::kInvalidArgument, "a key cannot hold NUL", EINVAL);
    if (c.size() > 255)
      return Status(Code::kUriTooLong, "a key's path segments are at most 255 bytes each",
                    ENAMETOOLONG);
    if (first && c == kStagingDirName)
      return Status(
          Code::kPermissionDenied,
          fmt::format("keys under '{}/' are reserved for upload staging", kStagingDirName), EACCES);
    first = false;
    if (s == std::string_view::npos) break;
    key.remove_prefix(s + 1);
  }
  return path;
}

Result<std::vector<std::string>> KeyParts(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(std::string_view path, KeyPath(key));
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    size_t s = path.find('/', at);
    parts.emplace_back(path.substr(at, s == std::string_view::npos ? s : s - at));
    if (s == std::string_view::npos) break;
    at = s + 1;
  }
  return parts;
}

// ------------------------------------------------------------------------------------ listing

namespace {

class Lister {
 public:
  Lister(Volume& v, const VFolderId& vfid, const ListQuery& q, ObjectMetaCache* cache,
         KeyOrderCache* names)
      : v_(v), vfid_(vfid), q_(q), cache_(cache), names_(names) {}

  Result<ListPage> Run() {
    ListPage page;
    if (q_.max_keys == 0) return page;
    size_t slash = q_.prefix.rfind('/');
    std::string base = slash == std::string::npos ? "" : q_.prefix.substr(0, slash + 1);
    if (!base.empty()) {
      auto parts = KeyParts(base);
      if (!parts.ok()) return page;  // no such directory can exist: nothing to list
    }
    // Every key below `base` sorts before an `after` past it.
    if (q_.after > base && !StartsWith(q_.after, base)) return page;
    std::string rel = base.empty() ? "" : base.substr(0, base.size() - 1);
    const ListFrom from{std::string_view(q_.prefix).substr(base.size()), AfterIn(base)};
    auto dir = v_.OpenDirFrom(vfid_, rel, from);
    if (!dir.ok()) {
      if (IsObjectNotFound(dir.status()) || dir.status().code() == Code::kInvalidArgument)
        return page;
      return dir.status();
    }
    SLUICE_ASSIGN_OR_RETURN(auto ordered, Ordered(std::move(dir).value(), rel, from));
    bool any = false;
    SLUICE_RETURN_IF_ERROR(Visit(*ordered, base, base.empty(), &any));
    // The prefix names a directory ("d/"): when it is empty its marker is the one key.
    if (!any && !base.empty() && q_.prefix == base && base > q_.after &&
        (!q_.end || base <= *q_.end)) {
      ListPage::Item it;
      it.object.key = base;
      it.object.etag = kMarkerETag;
      it.object.modified = ordered->info().modified;
      items_.push_back(std::move(it));
    }
    page.items = std::move(items_);
    if (page.items.size() > q_.max_keys) {
      page.items.resize(q_.max_keys);
      page.truncated = true;
    }
    return page;
  }

 private:
  bool Full() const { return items_.size() > q_.max_keys; }

  // Where the page resumes within the directory of keys `base` ("" when before all of it).
  std::string_view AfterIn(const std::string& base) const {
    return StartsWith(q_.after, base) ? std::string_view(q_.after).substr(base.size())
                                      : std::string_view();
  }

  // `dir` with its entries in key order, from where `from` starts: as it is when the volume
  // lists in key order, else read whole and sorted (the sorted names of a large directory
  // kept for the next page).
  Result<std::unique_ptr<DirHandle>> Ordered(std::unique_ptr<DirHandle> dir, const std::string& rel,
                                             const ListFrom& from) {
    if (dir->KeyOrdered()) return dir;
    const std::string id =
        names_ ? fmt::format("{}|{}|{}", static_cast<const void*>(&v_), vfid_.ToString(), rel)
               : std::string();
    std::shared_ptr<const KeyOrderedNames> names;
    if (names_) names = names_->Find(id, dir->info());
    if (!names) {
      const auto read_at = std::chrono::system_clock::now();
      auto all = std::make_shared<KeyOrderedNames>();
      for (;;) {
        SLUICE_ASSIGN_OR_RETURN(auto n, dir->Next());
        if (!n) break;
        all->push_back(std::move(*n));
      }
      SortByKey(*all);
      names = std::move(all);
      if (names_) names_->Put(id, dir->info(), names, read_at);
    }
    return KeyOrderedView(std::move(dir), std::move(names), from);
  }

  // The common prefix `key` rolls up into, or "" when none.
  std::string RollUp(const std::string& key) const {
    if (q_.delimiter.empty()) return {};
    size_t pos = key.find(q_.delimiter, q_.prefix.size());
    if (pos == std::string::npos) return {};
    return key.substr(0, pos + q_.delimiter.size());
  }

  // True when the item was handled as (part of) a common prefix.
  bool AddPrefixOf(const std::string& key) {
    std::string cp = RollUp(key);
    if (cp.empty()) return false;
    if (cp != last_prefix_ && cp > q_.after && (!q_.end || cp <= *q_.end)) {
      ListPage::Item it;
      it.is_prefix = true;
      it.object.key = cp;
      items_.push_back(std::move(it));
      last_prefix_ = cp;
    }
    return true;
  }

  Status AddObject(DirHandle& dir, const std::string& name, const std::string& key) {
    auto e = dir.StatEntry(name);
    if (!e.ok()) return e.status().code() == Code::kNotFound ? Status::Ok() : e.status();
    ListPage::Item it;
    it.object.key = key;
    if (e->type == EntryType::kFile) {
      it.object.size = e->size;
      // An entry with its backend's own entity tag (an s3 volume's, from the origin's listing)
      // is listed with it: its stored metadata would cost a request per key. Otherwise the
      // metadata cache answers by the file's version (inode, size, mtime, ctime), else the
      // attribute is read (and remembered).
      const ObjectMeta* meta = nullptr;
      std::shared_ptr<const ObjectMeta> known;
      std::optional<ObjectMeta> read;
      if (q_.want_etag && e->etag.empty()) {
        if (auto hit = cache_ ? cache_->Find(&v_, vfid_, *e) : std::nullopt) {
          known = std::move(*hit);
          meta = known.get();
        } else if (auto blob = dir.EntryMeta(name); blob.ok()) {
          read = ObjectMeta::Decode(*blob, *e);
          if (cache_) cache_->Put(&v_, vfid_, *e, read);
          if (read) meta = &*read;
        }
      }
      it.object.etag = ObjectETag(*e, meta);
    } else {
      it.object.etag = kMarkerETag;
    }
    it.object.modified = e->modified;
    items_.push_back(std::move(it));
    return Status::Ok();
  }

  // `base`: the key prefix of this directory's entries ("" or "a/b/"); `dir` yields them in
  // key order, from where the page resumes. `*any`: whether it yielded a file or directory.
  Status Visit(DirHandle& dir, const std::string& base, bool root, bool* any) {
    while (!Full()) {
      SLUICE_ASSIGN_OR_RETURN(auto n, dir.Next());
      if (!n) break;
      // A directory holding only links or special files is empty to S3 (its marker "d/"), as
      // a delimited listing rolls it up as "d/" without looking inside.
      if (n->type != EntryType::kFile && n->type != EntryType::kDirectory) continue;
      if (any) *any = true;
      if (root && n->name == kStagingDirName) continue;
      const bool d = n->type == EntryType::kDirectory;
      std::string key = base + n->name + (d ? "/" : "");
      if (q_.end && key > *q_.end) {  // key order: nothing after it is in the page
        // But for the common prefix it rolls up into, when that sorts at or before the end
        // ("x-" of "x-2" with end "x-1" and delimiter "-"): the next range, which starts
        // after the end, cannot list it. (Any later key rolling up at or before the end
        // rolls up into the same one.)
        if (StartsWith(key, q_.prefix)) AddPrefixOf(key);
        break;
      }
      // Only what can be in this page: under the prefix (or above it), not before `after`.
      if (d) {
        if (!StartsWith(key, q_.prefix) && !StartsWith(q_.prefix, key)) continue;
        if (key <= q_.after && !StartsWith(q_.after, key)) continue;
      } else {
        if (!StartsWith(key, q_.prefix) || key <= q_.after) continue;
      }
      if (StartsWith(key, q_.prefix) && AddPrefixOf(key)) continue;
      if (!d) {
        SLUICE_RETURN_IF_ERROR(AddObject(dir, n->name, key));
        continue;
      }
      const ListFrom from{"", AfterIn(key)};
      auto sub = dir.OpenSubdirFrom(n->name, from);
      if (sub.ok()) sub = Ordered(std::move(sub).value(), key.substr(0, key.size() - 1), from);
      if (!sub.ok()) {
        if (IsObjectNotFound(sub.status())) continue;  // removed or replaced meanwhile
        return sub.status();
      }
      size_t before = items_.size();
      bool seen = false;
      SLUICE_RETURN_IF_ERROR(Visit(**sub, key, false, &seen));
      // An empty directory is the marker "dir/": it sorts before anything under it.
      if (!seen && items_.size() == before && StartsWith(key, q_.prefix) && key > q_.after)
        SLUICE_RETURN_IF_ERROR(AddObject(dir, n->name, key));
    }
    return Status::Ok();
  }

  Volume& v_;
  const VFolderId& vfid_;
  const ListQuery& q_;
  ObjectMetaCache* cache_;
  KeyOrderCache* names_;
  std::vector<ListPage::Item> items_;
  std::string last_prefix_;
};

}  // namespace

Result<ListPage> ListObjects(Volume& v, const VFolderId& vfid, const ListQuery& q,
                             ObjectMetaCache* cache, KeyOrderCache* names) {
  return Lister(v, vfid, q, cache, names).Run();
}

Result<ListPage> ObjectStore::List(Volume& v, const VFolderId& vfid, const ListQuery& q) {
  return ListObjects(v, vfid, q, meta_cache_.get(), key_order_cache_.get());
}

// ------------------------------------------------------------------------------ split listing

namespace {

// A run of keys in key order: one key (a file, an empty directory's marker), or everything
// below a directory not read ("d/", its count estimated). A key sampled from a large directory
// stands for several (`count` is then not whole).
struct KeyUnit {
  std::string key;
  double count = 1;
  bool subtree = false;
};

// The least string after every key that starts with `dir` ("a/b/" -> "a/b0"): the end of a range
// that closes after a whole directory.
std::string AfterSubtree(const std::string& dir) {
  std::string s = dir;
  s.back() = static_cast<char>('/' + 1);
  return s;
}

// A uniform sample of at most `cap` of the names offered (reservoir sampling), and how many
// were offered: a directory of millions of names is counted exactly and cut by its sample,
// holding `cap` names, whatever order its backend lists them in (hash, creation or key order).
class Reservoir {
 public:
  Reservoir(size_t cap, std::mt19937_64& rng) : cap_(std::max<size_t>(cap, 1)), rng_(rng) {}
  void Offer(std::string name) {
    ++seen_;
    if (kept_.size() < cap_) {
      kept_.push_back(std::move(name));
      return;
    }
    const uint64_t j = std::uniform_int_distribution<uint64_t>(0, seen_ - 1)(rng_);
    if (j < cap_) kept_[j] = std::move(name);
  }
  uint64_t seen() const { return seen_; }
  std::vector<std::string>& kept() { return kept_; }
  // What each name kept stands for.
  double weight() const { return kept_.empty() ? 0 : double(seen_) / double(kept_.size()); }

 private:
  size_t cap_;
  std::mt19937_64& rng_;
  uint64_t seen_ = 0;
  std::vector<std::string> kept_;
};

}  // namespace

size_t SplitBudget(size_t parts) {
  return std::clamp<size_t>(parts * 2048, 8192, 200000);
}

Result<SplitResult> SplitKeys(Volume& v, const VFolderId& vfid, const SplitQuery& q) {
  SplitResult out;
  const size_t budget = q.budget ? q.budget : SplitBudget(q.parts);
  size_t slash = q.prefix.rfind('/');
  std::string base = slash == std::string::npos ? "" : q.prefix.substr(0, slash + 1);
  if (!base.empty() && !KeyParts(base).ok()) {
    out.ranges.push_back({});
    return out;
  }
  // Breadth first from the prefix's directory, reading names only, until the budget is spent.
  // Directories wait by key (reopened beneath the vfolder when their turn comes), so the queue
  // holds no descriptors. A directory read is read whole (its names counted), but at most
  // `budget` of its files and of its subdirectories are kept, each standing for its share.
  struct Queued {
    std::string key;
    double stands_for = 1;  // directories like it that it was sampled for
  };
  std::deque<Queued> queue{{base, 1}};
  std::vector<KeyUnit> units;
  std::vector<Queued> unread;  // directories left for the estimate
  size_t read = 0;
  std::mt19937_64 rng(0x51u);  // the same sample (and cuts) for the same tree
  // What the directories read at each depth held, for the estimate of those not read.
  struct Level {
    double dirs = 0, keys = 0, subdirs = 0;
    size_t read = 0;  // directories read at this depth
  };
  std::vector<Level> levels;
  auto depth = [](const std::string& key) {
    return static_cast<size_t>(std::count(key.begin(), key.end(), '/'));
  };
  // Past the budget, a few directories of each depth are still read, so that those not read
  // are estimated from their own depth (breadth first, a depth's first ones are its sample),
  // while the names read stay under four budgets.
  constexpr size_t kSampleDirs = 8;
  while (!queue.empty()) {
    Queued at = std::move(queue.front());
    queue.pop_front();
    const std::string& key = at.key;
    const size_t l = depth(key);
    const bool sampled = l < levels.size() && levels[l].read >= kSampleDirs;
    if (read >= budget && (sampled || read >= 4 * budget)) {  // the prefix's own: always read
      unread.push_back(std::move(at));
      continue;
    }
    // As a listing opens it (no symbolic link followed): the ranges cut what it lists.
    auto dir = v.OpenDirFrom(vfid, key.empty() ? "" : key.substr(0, key.size() - 1), ListFrom{});
    if (!dir.ok()) {
      if (IsObjectNotFound(dir.status()) || dir.status().code() == Code::kInvalidArgument)
        continue;  // no such prefix, or removed or replaced meanwhile
      return dir.status();
    }
    bool any = false;
    Reservoir files(budget, rng), subdirs(budget, rng);
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(auto n, (*dir)->Next());
      if (!n) break;
      ++read;
      if (n->type != EntryType::kFile && n->type != EntryType::kDirectory) continue;
      if (key.empty() && n->name == kStagingDirName) continue;
      any = true;
      const bool d = n->type == EntryType::kDirectory;
      std::string child = key + n->name + (d ? "/" : "");
      if (!StartsWith(child, q.prefix)) continue;
      (d ? subdirs : files).Offer(std::move(child));
    }
    if (files.seen() > files.kept().size() || subdirs.seen() > subdirs.kept().size())
      out.exact = false;
    const double fw = files.weight() * at.stands_for, dw = subdirs.weight() * at.stands_for;
    for (auto& f : files.kept()) units.push_back({std::move(f), fw, false});
    for (auto& d : subdirs.kept()) queue.push_back({std::move(d), dw});
    double keys = double(files.seen());
    // An empty directory is one key (its marker), when the prefix covers it.
    if (!any && !key.empty() && StartsWith(key, q.prefix)) {
      units.push_back({key, at.stands_for, false});
      keys = 1;
    }
    if (levels.size() <= l) levels.resize(l + 1);
    levels[l].read++;
    levels[l].dirs += at.stands_for;
    levels[l].keys += keys * at.stands_for;
    levels[l].subdirs += double(subdirs.seen()) * at.stands_for;
  }
  // A directory not read holds what the average directory read at its depth held: its keys,
  // and its subdirectories' estimates (one level further down); below the deepest level read,
  // directories are taken to hold keys like those at the level above.
  if (!unread.empty()) {
    out.exact = false;
    std::vector<double> est(levels.size(), 0);
    for (size_t l = levels.size(); l-- > 0;) {
      const Level& lv = levels[l];
      if (lv.dirs == 0) continue;
      double below = l + 1 < levels.size() && levels[l + 1].dirs > 0
                         ? est[l + 1]
                         : std::max(1.0, lv.keys / lv.dirs);
      est[l] = (lv.keys + lv.subdirs * below) / lv.dirs;
    }
    for (auto& u : unread) {
      const std::string& k = u.key;
      double e = 1;
      for (size_t l = std::min(depth(k), levels.size() - 1);; --l) {  // the nearest level read
        if (levels[l].dirs > 0) {
          e = l == depth(k) ? est[l] : std::max(1.0, levels[l].keys / levels[l].dirs);
          break;
        }
        if (l == 0) break;
      }
      units.push_back({std::move(u.key), std::max(1.0, std::round(e)) * u.stands_for, true});
    }
  }
  std::sort(units.begin(), units.end(),
            [](const KeyUnit& a, const KeyUnit& b) { return a.key < b.key; });
  out.names_kept = units.size();
  double total = 0;
  for (const auto& u : units) total += u.count;
  out.estimated = static_cast<uint64_t>(std::llround(total));
  // Cut where the running count passes each share.
  const size_t parts = std::max<size_t>(1, q.parts);
  KeyRange cur;
  double seen = 0, in_cur = 0;
  size_t next_cut = 1;
  // (A tolerance, so that sums of fractional weights that should meet a share do.)
  auto passed = [&] { return seen * double(parts) >= total * double(next_cut) - 1e-6 * total; };
  for (const auto& u : units) {
    seen += u.count;
    // A key the last range already holds: the file named where an estimated subtree's range
    // ends ("d/" ends at "d0", and end keys are inclusive). Counted there, and never cut at,
    // which would make a range from it to itself.
    if (cur.start_after && u.key <= *cur.start_after) {
      out.ranges.back().estimated += static_cast<uint64_t>(std::llround(u.count));
      continue;
    }
    in_cur += u.count;
    if (next_cut < parts && passed()) {
      std::string end = u.subtree ? AfterSubtree(u.key) : u.key;
      cur.end_key = end;
      cur.estimated = static_cast<uint64_t>(std::llround(in_cur));
      out.ranges.push_back(std::move(cur));
      cur = KeyRange();
      in_cur = 0;
      cur.start_after = std::move(end);
      while (next_cut < parts && passed()) ++next_cut;
    }
  }
  cur.estimated = static_cast<uint64_t>(std::llround(in_cur));
  out.ranges.push_back(std::move(cur));
  return out;
}

// -------------------------------------------------------------------------------- meta cache

namespace {
int64_t Ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

// What names a file: the volume, the inode, and (hashed) the vfolder and device it is in.
struct ObjectMetaCache::Key {
  const Volume* v;
  uint64_t ino, place;
  Key(const Volume* vol, const VFolderId& vfid, const DirEntry& e)
      : v(vol), ino(e.ino), place(std::hash<std::string_view>{}(vfid.hex) ^ (e.dev * kMix2)) {}
  static constexpr uint64_t kMix1 = 0x9E3779B97F4A7C15ULL, kMix2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t Mix() const {
    return ((ino ^ place) * kMix1) ^ (reinterpret_cast<uintptr_t>(v) * kMix2);
  }
};

namespace {
uint64_t StampOf(const DirEntry& e) {
  const auto ctime = static_cast<uint64_t>(Ns(e.changed));
  return e.etag.empty() ? ctime : ctime ^ std::hash<std::string_view>{}(e.etag);
}
}  // namespace

// Open addressing: a key's entry sits in one of kProbe slots from its home slot, so a lookup
// reads one or two cache lines (std::unordered_map walked to the bucket, the node before and
// the node, dependent misses that were 2.75% of a 4 KiB GET's CPU). A full neighbourhood
// gives up its home slot: the cache forgets one entry, where the map forgot its whole shard.
struct ObjectMetaCache::Shard {
  struct alignas(64) Slot {
    const Volume* v = nullptr;
    uint64_t ino = 0;  // 0: empty (no file has inode 0)
    uint64_t place = 0;
    Entry e{};
    bool Is(const Key& k) const { return ino == k.ino && v == k.v && place == k.place; }
  };
  static_assert(sizeof(Slot) == 64);
  static constexpr size_t kProbe = 4;
  std::mutex mu;
  std::vector<Slot> slots;  // a power of two of them, made at the first Put

  // The k-th slot of the key's neighbourhood (slots not empty).
  Slot& At(const Key& key, size_t k) {
    return slots[(static_cast<size_t>(key.Mix() >> 8) + k) & (slots.size() - 1)];
  }
};

ObjectMetaCache::ObjectMetaCache(size_t capacity)
    : per_shard_(std::bit_ceil(std::max<size_t>(Shard::kProbe, capacity / kShards))),
      shards_(new Shard[kShards]) {}

ObjectMetaCache::~ObjectMetaCache() = default;

ObjectMetaCache::Shard& ObjectMetaCache::ShardOf(const Key& k) const {
  return shards_[(k.Mix() >> 60) % kShards];
}

std::optional<std::shared_ptr<const ObjectMeta>> ObjectMetaCache::Find(const Volume* v,
                                                                       const VFolderId& vfid,
                                                                       const DirEntry& e) const {
  if (e.ino == 0) return std::nullopt;
  const Key key(v, vfid, e);
  Shard& s = ShardOf(key);
  std::lock_guard lk(s.mu);
  if (s.slots.empty()) return std::nullopt;
  for (size_t k = 0; k < Shard::kProbe; ++k) {
    const Shard::Slot& x = s.At(key, k);
    if (x.ino == 0) break;
    if (!x.Is(key)) continue;
    if (x.e.size != e.size || x.e.mtime_ns != Ns(e.modified) || x.e.stamp != StampOf(e))
      return std::nullopt;
    return x.e.meta;
  }
  return std::nullopt;
}

void ObjectMetaCache::Put(const Volume* v, const VFolderId& vfid, const DirEntry& e,
                          const std::optional<ObjectMeta>& meta) {
  if (e.ino == 0 || e.changed.time_since_epoch().count() == 0) return;
  Entry entry{e.size, Ns(e.modified), StampOf(e),
              meta ? std::make_shared<const ObjectMeta>(*meta) : nullptr};
  const Key key(v, vfid, e);
  Shard& s = ShardOf(key);
  std::lock_guard lk(s.mu);
  if (s.slots.empty()) s.slots.resize(per_shard_);
  Shard::Slot* at = &s.At(key, 0);  // taken over when the neighbourhood is full
  for (size_t k = 0; k < Shard::kProbe; ++k) {
    Shard::Slot& x = s.At(key, k);
    if (x.ino == 0 || x.Is(key)) {
      at = &x;
      break;
    }
  }
  at->v = v;
  at->ino = e.ino;
  at->place = key.place;
  at->e = std::move(entry);
}

// ------------------------------------------------------------------------------------ writing

ObjectWriter::~ObjectWriter() {
  if (!done_) Abort();
}

Status ObjectWriter::Write(const char* data, size_t n) {
  // The reservation is what is still to come: bytes written count in the scope's usage from
  // then on (as a tus upload's do once synced), so keeping them reserved too counted them
  // twice, and a body of unknown length was refused at half its room.
  if (written_ + n > reserved_) {
    // Bodies of unknown length (chunked) reserve as they grow, 8 MiB at a time.
    // Near the limit, just this piece.
    // (What was written counts in the usage already, unless the volume's staging does not.)
    const uint64_t counted = volume_->StagingCounted() ? written_ : 0;
    uint64_t want = std::max<uint64_t>(written_ + n, reserved_ + (8 << 20));
    Status q = ReserveScopeQuota(*reservations_, *volume_, vfid_, reservation_key_, want - counted);
    if (q.code() == Code::kQuotaExceeded && want > written_ + n) {
      want = written_ + n;
      q = ReserveScopeQuota(*reservations_, *volume_, vfid_, reservation_key_, want - counted);
    }
    SLUICE_RETURN_IF_ERROR(q);
    reserved_ = want;
  }
  size_t done = 0;
  Status st = staging_->WriteAt(written_, data, n, &done);
  md5_.Update(data, done);
  if (sha256_) sha256_->Update(data, done);
  written_ += done;
  if (volume_->StagingCounted()) reservations_->Shrink(reservation_key_, reserved_ - written_);
  return st;
}

void ObjectWriter::Digest() {
  if (md5_raw_.empty()) md5_raw_ = md5_.Final();
  if (sha256_ && sha256_raw_.empty()) sha256_raw_ = sha256_->Final();
}

Status ObjectWriter::CopyFrom(FileReader& src, uint64_t n) {
  Status st = staging_->CopyFrom(src, 0, n, written_);
  if (st.ok()) written_ += n;
  copied_ = true;
  if (reserved_ > 0 && volume_->StagingCounted())
    reservations_->Shrink(reservation_key_, reserved_ - std::min(reserved_, written_));
  return st;
}

Status ObjectWriter::Publish(ObjectMeta meta, bool durable) {
  Digest();
  // Copied bytes were never hashed: without an ETag from the caller the file gets a validator.
  if (meta.etag.empty() && !copied_) meta.etag = HexEncode(md5_raw_);
  return PublishWith(
      [&](const DirEntry& e) {
        meta.size = e.size;
        meta.mtime_ns = MtimeNs(e);
        return meta.Encode();
      },
      durable);
}

Status ObjectWriter::PublishWith(const std::function<std::string(const DirEntry&)>& blob,
                                 bool durable) {
  std::shared_lock<std::shared_mutex> held;
  if (gate_) {
    held = std::shared_lock(*gate_);
    if (Status live = volume_->CheckVFolder(vfid_); !live.ok()) {
      Abort();
      return live;
    }
  }
  std::string published;
  Status st = staging_->Publish(
      parts_,
      [&](const DirEntry& e) {
        published = blob(e);
        return published;
      },
      durable);
  if (!st.ok()) {
    Abort();
    return st;
  }
  done_ = true;
  staging_.reset();
  reservations_->Release(reservation_key_);
  // What follows touches only staging (a part's side file), which no emptiness check counts;
  // it may publish again, which takes the gate itself.
  if (held.owns_lock()) held.unlock();
  return after_publish_ ? after_publish_(published) : Status::Ok();
}

void ObjectWriter::Abort() {
  if (done_) return;
  done_ = true;
  staging_.reset();  // lets go of the lock first
  Status gone = volume_->DiscardStaging(vfid_, session_);
  if (!gone.ok() && gone.code() != Code::kNotFound)
    spdlog::warn("s3: staging file {} of an abandoned write stays until the sweep: {}", session_,
                 gone.ToString());
  reservations_->Release(reservation_key_);
}

Result<std::unique_ptr<ObjectWriter>> ObjectStore::BeginPut(Volume& v, const VFolderId& vfid,
                                                            std::string_view key,
                                                            std::optional<uint64_t> size,
                                                            bool want_sha256) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, KeyParts(key));
  return BeginWrite(v, vfid, std::move(parts), size, want_sha256);
}

Result<std::unique_ptr<ObjectWriter>> ObjectStore::BeginWrite(Volume& v, const VFolderId& vfid,
                                                              std::vector<std::string> parts,
                                                              std::optional<uint64_t> size,
                                                              bool want_sha256) {
  if (size) SLUICE_RETURN_IF_ERROR(v.CheckStagedSize(*size));
  SLUICE_RETURN_IF_ERROR(v.CheckVFolder(vfid));
  auto session = v.CreateStaging(vfid);
  // A sweep may have removed an empty staging directory meanwhile: try once more.
  if (!session.ok()) session = v.CreateStaging(vfid);
  if (!session.ok()) return session.status();
  std::unique_ptr<ObjectWriter> w(new ObjectWriter());
  w->volume_ = &v;
  w->vfid_ = vfid;
  w->session_ = *session;
  w->parts_ = std::move(parts);
  w->reservations_ = reservations_;
  w->gate_ = &GateOf(v, vfid);
  w->reservation_key_ = fmt::format("s3/{}/{}/{}", v.name(), vfid.hex, *session);
  if (want_sha256) w->sha256_.emplace(Digest::Algo::kSha256);
  auto staging = v.OpenStaging(vfid, *session);
  if (!staging.ok()) {
    w->done_ = true;
    (void)v.DiscardStaging(vfid, *session);
    return staging.status();
  }
  w->staging_ = std::move(staging).value();
  if (!w->parts_.empty() && w->parts_.front() == kStagingDirName) w->staging_->ReadOnceByAnother();
  if (size && *size > 0) {
    Status q = ReserveScopeQuota(*reservations_, v, vfid, w->reservation_key_, *size);
    if (!q.ok()) return q;  // the writer's destructor discards the staging file
    w->reserved_ = *size;
  }
  return w;
}

// ------------------------------------------------------------------------------------ multipart

namespace {

constexpr const char* kUploadRecord = "upload";
// The record of an upload being completed or aborted: renamed from kUploadRecord by the one
// request that may end it (a rename onto a name that does not exist: the other finds no
// record), so that of a Complete and an Abort, or two Completes, one wins.
constexpr const char* kEndingRecord = "ending";
// Written by the request that ends an upload when it claims it, and again as a Complete goes on
// (its time is the claim's last sign of life): a claim silent for longer than the lease was
// cut short by a crash or a restart, and the upload is given back (ObjectStore::GetMultipart).
constexpr const char* kEndingBeat = "ending.beat";

std::string UploadDir(std::string_view id) {
  return fmt::format("mp-{}", id);
}
std::string UploadRel(std::string_view id) {
  return fmt::format("{}/{}", kStagingDirName, UploadDir(id));
}
std::string PartName(int n) {
  return fmt::format("p{:05d}", n);
}
// Where a volume keeps no user xattrs, a part's metadata (its MD5 and checksums) is this file
// next to it, written after the part; the metadata names the size and mtime it was made for,
// so one left by a replaced part is not taken for the new one's.
std::string PartMetaName(int n) {
  return PartName(n) + ".m";
}

// The bytes of a small file (an upload record, a part's metadata), at most kMaxObjectMeta.
Result<std::string> ReadSmall(FileReader& f, std::string_view rel) {
  if (f.size() > kMaxObjectMeta)
    return Status(Code::kIoError, fmt::format("'{}' is too large for a record", rel), EIO);
  std::string out(f.size(), '\0');
  size_t got = 0;
  while (got < out.size()) {
    SLUICE_ASSIGN_OR_RETURN(size_t n, f.ReadAt(got, out.data() + got, out.size() - got));
    if (n == 0) break;
    got += n;
  }
  out.resize(got);
  return out;
}

// Part `num`'s metadata: `blob` (its attribute), or the file beside it on volumes without
// user xattrs. nullopt when neither describes `e` (being replaced, or not written by Sluice).
std::optional<ObjectMeta> PartMetaOf(Volume& v, const VFolderId& vfid, std::string_view id, int num,
                                     Result<std::string> blob, const DirEntry& e) {
  if (blob.ok() && blob->empty()) {
    if (auto side = v.OpenReader(vfid, UploadRel(id) + "/" + PartMetaName(num)); side.ok())
      blob = ReadSmall(**side, PartMetaName(num));
    else
      blob = side.status();
  }
  return blob.ok() ? ObjectMeta::Decode(*blob, e) : std::nullopt;
}

Status NoUpload(std::string_view id) {
  return Status(Code::kNotFound,
                "the specified upload does not exist: it may have been aborted or completed",
                ENOENT);
}

std::optional<MultipartUpload> DecodeUploadFields(std::string_view blob, std::string id,
                                                  const DirEntry& rec) {
  auto j = nlohmann::json::parse(blob, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("k") || !j["k"].is_string())
    return std::nullopt;
  MultipartUpload u;
  u.id = std::move(id);
  u.key = j["k"].get<std::string>();
  if (j.contains("kx") && j["kx"].is_string()) {
    auto raw = HexDecode(j["kx"].get<std::string>());
    if (!raw.ok()) return std::nullopt;
    u.key = std::move(raw).value();
  }
  if (j.contains("m") && j["m"].is_string()) {
    DirEntry any;
    auto inner = nlohmann::json::parse(j["m"].get<std::string>(), nullptr, false);
    if (!inner.is_discarded() && inner.is_object()) {
      any.size = inner.value("s", uint64_t{0});
      any.modified = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(inner.value("n", int64_t{0}))));
      if (auto m = ObjectMeta::Decode(j["m"].get<std::string>(), any)) u.meta = std::move(*m);
    }
  }
  u.initiated = rec.modified;
  u.checksum_algo = j.value("ca", std::string());
  u.checksum_type = j.value("ct", std::string());
  return u;
}

// An upload's record of any shape (it lies in the vfolder, which its users can write) is no
// upload, never an exception: value() throws for a field of another type, which failed
// ListMultipartUploads and stopped the janitor's sweep of every bucket after it.
std::optional<MultipartUpload> DecodeUpload(std::string_view blob, std::string id,
                                            const DirEntry& rec) {
  try {
    return DecodeUploadFields(blob, std::move(id), rec);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

Result<std::string> MultipartChecksum(const MultipartUpload& u,
                                      const std::vector<UploadedPart>& parts) {
  auto algo = ChecksumAlgoFromName(u.checksum_algo);
  if (!algo) return Status(Code::kInvalidArgument, "the upload names no checksum algorithm");
  const std::string name = ChecksumKey(*algo);
  const bool full = u.checksum_type == "FULL_OBJECT";
  if (full && !IsCrc(*algo))
    return Status(Code::kInvalidArgument, "FULL_OBJECT checksums are CRCs only");
  Checksummer composite(*algo);
  uint64_t crc = 0;
  for (const auto& p : parts) {
    auto it = p.checksums.find(name);
    auto raw = it == p.checksums.end() ? Result<std::string>(Status(Code::kNotFound, ""))
                                       : Base64Decode(it->second);
    if (!raw.ok() || raw->size() != ChecksumSize(*algo))
      return Status(Code::kInvalidArgument,
                    fmt::format("part {} has no {} checksum; the upload was created with one",
                                p.number, u.checksum_algo));
    if (full)
      crc = CrcCombine(*algo, crc, CrcFromBytes(*raw), p.size);
    else
      composite.Update(raw->data(), raw->size());
  }
  if (full) return Base64Encode(CrcBytes(*algo, crc));
  return fmt::format("{}-{}", Base64Encode(composite.Final()), parts.size());
}

Result<MultipartUpload> ObjectStore::CreateMultipart(Volume& v, const VFolderId& vfid,
                                                     std::string_view key, ObjectMeta meta,
                                                     std::string checksum_algo,
                                                     std::string checksum_type) {
  SLUICE_RETURN_IF_ERROR(KeyParts(key).status());
  MultipartUpload u;
  // 32 hex digits: the milliseconds since the epoch (12), then 80 random bits. Ids sort as
  // their uploads began, so a listing page resumes after an id marker whose upload has gone
  // (S3 lists a key's uploads by the time they began).
  u.id = fmt::format("{:012x}{}",
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                             .count() &
                         0xffffffffffffLL,
                     RandomHexString(10));
  u.key = std::string(key);
  u.meta = std::move(meta);
  u.checksum_algo = std::move(checksum_algo);
  u.checksum_type = std::move(checksum_type);
  SLUICE_ASSIGN_OR_RETURN(
      auto w, BeginWrite(v, vfid, {kStagingDirName, UploadDir(u.id), kUploadRecord}, 0, false));
  // A key is bytes (a plain PUT stores any the path rules allow); JSON text holds UTF-8 only,
  // so another key is kept hex-encoded ("kx").
  const std::string shown = SanitizeUtf8(u.key);
  nlohmann::json j = {{"k", shown}, {"m", u.meta.Encode()}};
  if (shown != u.key) j["kx"] = HexEncode(u.key);
  if (!u.checksum_algo.empty()) {
    j["ca"] = u.checksum_algo;
    j["ct"] = u.checksum_type;
  }
  // The record is the file's content as well as its metadata: volumes without user xattrs
  // keep only the content.
  const std::string record = j.dump();
  SLUICE_RETURN_IF_ERROR(w->Write(record.data(), record.size()));
  SLUICE_RETURN_IF_ERROR(w->PublishWith([&](const DirEntry&) { return record; }, true));
  u.initiated = std::chrono::system_clock::now();
  return u;
}

bool ObjectStore::ClaimLapsed(Volume& v, const VFolderId& vfid, std::string_view id) {
  auto ending = v.Stat(vfid, UploadRel(id) + "/" + kEndingRecord);
  if (!ending.ok()) return false;
  // The claim's rename changed the record (its ctime; an origin's rename is a copy, a new
  // mtime); each beat after it is newer.
  auto last = std::max(ending->modified, ending->changed);
  if (auto beat = v.Stat(vfid, UploadRel(id) + "/" + kEndingBeat); beat.ok())
    last = std::max(last, beat->modified);
  return std::chrono::system_clock::now() - last > claim_lease_;
}

void ObjectStore::Beat(Volume& v, const VFolderId& vfid, std::string_view id) {
  auto w = BeginWrite(v, vfid, {kStagingDirName, UploadDir(id), kEndingBeat}, 0, false);
  Status st =
      w.ok() ? (*w)->PublishWith([](const DirEntry&) { return std::string(); }, false) : w.status();
  if (!st.ok())
    spdlog::warn("s3: upload {}: its claim's beat was not written: {}", id, st.ToString());
}

Result<MultipartUpload> ObjectStore::GetMultipart(Volume& v, const VFolderId& vfid,
                                                  std::string_view id) {
  if (!IsLowerHex(id, 32, 32)) return NoUpload(id);
  auto f = v.OpenReader(vfid, UploadRel(id) + "/" + kUploadRecord);
  // Claimed by a request that has not been heard of for the lease (its node crashed or
  // restarted mid-Complete): the upload is given back, so that a retried Complete finds it
  // and the sweep does not take its parts for a completed upload's leftovers. (Of two taking it
  // back, one renames; the other finds the record.)
  if (!f.ok() && IsObjectNotFound(f.status()) && ClaimLapsed(v, vfid, id)) {
    Status back = v.Rename(vfid, UploadRel(id) + "/" + kEndingRecord, kUploadRecord);
    spdlog::warn("s3: upload {}: a claim silent for {} s given back{}", id,
                 std::chrono::duration_cast<std::chrono::seconds>(claim_lease_).count(),
                 back.ok() ? "" : ": " + back.ToString());
    f = v.OpenReader(vfid, UploadRel(id) + "/" + kUploadRecord);
  }
  if (!f.ok()) return IsObjectNotFound(f.status()) ? NoUpload(id) : f.status();
  SLUICE_ASSIGN_OR_RETURN(std::string blob, (*f)->ReadMeta());
  if (blob.empty()) {  // kept as content only (no user xattrs)
    SLUICE_ASSIGN_OR_RETURN(blob, ReadSmall(**f, kUploadRecord));
  }
  auto u = DecodeUpload(blob, std::string(id), (*f)->info());
  if (!u) return Status(Code::kIoError, fmt::format("upload {} has a damaged record", id), EIO);
  return std::move(*u);
}

Result<std::unique_ptr<ObjectWriter>> ObjectStore::BeginPart(Volume& v, const VFolderId& vfid,
                                                             const MultipartUpload& u, int part,
                                                             std::optional<uint64_t> size,
                                                             bool want_sha256) {
  SLUICE_ASSIGN_OR_RETURN(
      auto w,
      BeginWrite(v, vfid, {kStagingDirName, UploadDir(u.id), PartName(part)}, size, want_sha256));
  // A part that lands after its upload was completed or aborted made the upload's directory
  // again (the commit makes missing parents): it goes, and the client hears NoSuchUpload.
  w->after_publish_ = [this, &v, vfid, id = u.id, part](const std::string& blob) -> Status {
    const std::string rel = UploadRel(id) + "/" + PartName(part);
    auto still = GetMultipart(v, vfid, id);
    if (!still.ok() && still.status().code() == Code::kNotFound) {
      // Being ended (a Complete or an Abort holds the record as "ending"): the part stays. A
      // Complete that read the part it replaced refuses (changed while completing) and gives
      // the upload back with this one in it; an Abort removes it with the rest (its tree
      // removal tried again when the part made it not empty; one landing after that is a
      // leftover for the sweep). Before, it went: the client heard NoSuchUpload, and a
      // Complete that failed gave back an upload without the part its client had listed.
      if (v.Stat(vfid, UploadRel(id) + "/" + kEndingRecord).ok()) return Status::Ok();
      // Given back between the two looks (the Complete this part's replacement made refuse):
      // the part is the upload's. (Before, it went, and the upload had no part of its number.)
      if (GetMultipart(v, vfid, id).ok()) return Status::Ok();
      (void)v.DeleteFiles(vfid, {rel}, false);
      (void)v.DeleteFiles(vfid, {UploadRel(id)}, false);  // only while empty
      return NoUpload(id);
    }
    auto f = v.OpenReader(vfid, rel);
    if (!f.ok()) return IsObjectNotFound(f.status()) ? Status::Ok() : f.status();  // replaced
    SLUICE_ASSIGN_OR_RETURN(std::string kept, (*f)->ReadMeta());
    if (!kept.empty() || blob.empty()) return Status::Ok();
    SLUICE_ASSIGN_OR_RETURN(
        auto side, BeginWrite(v, vfid, {kStagingDirName, UploadDir(id), PartMetaName(part)},
                              blob.size(), false));
    SLUICE_RETURN_IF_ERROR(side->Write(blob.data(), blob.size()));
    return side->PublishWith([](const DirEntry&) { return std::string(); }, true);
  };
  return w;
}

Result<std::vector<UploadedPart>> ObjectStore::ListParts(Volume& v, const VFolderId& vfid,
                                                         const MultipartUpload& u) {
  auto dir = v.OpenDir(vfid, UploadRel(u.id));
  if (!dir.ok()) return IsObjectNotFound(dir.status()) ? NoUpload(u.id) : dir.status();
  std::vector<UploadedPart> out;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto n, (*dir)->Next());
    if (!n) break;
    if (n->name.size() != 6 || n->name[0] != 'p' || n->type != EntryType::kFile) continue;
    int num = std::atoi(n->name.c_str() + 1);
    if (num < 1 || num > kMaxPartNumber || PartName(num) != n->name) continue;
    auto e = (*dir)->StatEntry(n->name);
    if (!e.ok()) continue;
    auto meta = PartMetaOf(v, vfid, u.id, num, (*dir)->EntryMeta(n->name), *e);
    if (!meta) continue;  // being replaced, or not written by Sluice
    auto raw = HexDecode(meta->etag);
    if (!raw.ok()) continue;
    out.push_back({num, e->size, std::move(raw).value(), e->modified, std::move(meta->checksums)});
  }
  std::sort(out.begin(), out.end(),
            [](const UploadedPart& a, const UploadedPart& b) { return a.number < b.number; });
  return out;
}

Result<std::string> ObjectStore::CompleteMultipart(Volume& v, const VFolderId& vfid,
                                                   const MultipartUpload& u,
                                                   const std::vector<UploadedPart>& parts,
                                                   std::map<std::string, std::string> checksums,
                                                   bool durable, bool refuse_replace) {
  SLUICE_ASSIGN_OR_RETURN(auto key_parts, KeyParts(u.key));
  if (refuse_replace && Open(v, vfid, u.key).ok())
    return Status(Code::kAlreadyExists, fmt::format("'{}' exists", u.key), EEXIST);
  uint64_t size = 0;
  for (const auto& p : parts) size += p.size;
  SLUICE_RETURN_IF_ERROR(v.CheckStagedSize(size));  // before the claim: the upload stays whole
  SLUICE_RETURN_IF_ERROR(ClaimUpload(v, vfid, u.id));
  Beat(v, vfid, u.id);
  auto beaten = std::chrono::steady_clock::now();
  auto keep_claim = [&] {  // a sign of life well within the lease, between parts
    if (std::chrono::steady_clock::now() - beaten < claim_lease_ / 4) return;
    Beat(v, vfid, u.id);
    beaten = std::chrono::steady_clock::now();
  };
  // Until the object is published, a failure gives the upload back to its client.
  auto build = [&]() -> Result<std::string> {
    SLUICE_ASSIGN_OR_RETURN(auto w, BeginWrite(v, vfid, std::move(key_parts), 0, false));
    // A volume that copies the parts (no reflinks or snapshots) holds them twice until they
    // go: the copy is reserved, so an upload started meanwhile cannot take the same room.
    if (!v.capabilities().contains(kCapFastClone)) {
      SLUICE_RETURN_IF_ERROR(ReserveScopeQuota(*reservations_, v, vfid, w->reservation_key_, size,
                                               "completing the upload (this volume copies its "
                                               "parts)"));
      w->reserved_ = size;
    }
    std::vector<std::string> md5s;
    for (const auto& p : parts) {
      auto opened = v.OpenReader(vfid, UploadRel(u.id) + "/" + PartName(p.number));
      if (!opened.ok() && IsObjectNotFound(opened.status()))  // listed, gone since: not a 404
        return Status(Code::kConflict, fmt::format("part {} changed while completing", p.number));
      SLUICE_ASSIGN_OR_RETURN(auto f, std::move(opened));
      // The part opened is the one listed: one replaced since (an UploadPart that began
      // before the Complete) has another MD5, which the ETag would not be made of.
      auto blob = f->ReadMeta();
      if (!blob.ok() && !IsObjectNotFound(blob.status())) return blob.status();  // not a change
      auto meta = PartMetaOf(v, vfid, u.id, p.number, std::move(blob), f->info());
      auto md5 = meta ? HexDecode(meta->etag) : Result<std::string>(Status(Code::kNotFound, ""));
      if (f->size() != p.size || !md5.ok() || *md5 != p.md5)
        return Status(Code::kConflict, fmt::format("part {} changed while completing", p.number));
      SLUICE_RETURN_IF_ERROR(w->CopyFrom(*f, p.size));
      md5s.push_back(p.md5);
      keep_claim();
    }
    ObjectMeta meta = u.meta;
    meta.etag = MultipartETag(md5s);
    meta.checksums = std::move(checksums);
    if (refuse_replace) w->RefuseReplace();
    SLUICE_RETURN_IF_ERROR(w->Publish(meta, durable));
    return meta.etag;
  };
  auto etag = build();
  if (!etag.ok()) {
    Status back = v.Rename(vfid, UploadRel(u.id) + "/" + kEndingRecord, kUploadRecord);
    if (!back.ok())
      spdlog::warn(
          "s3: upload {}: its record could not be given back after a failed "
          "Complete: {}",
          u.id, back.ToString());
    return etag.status();
  }
  Status ended = v.DeleteFiles(vfid, {UploadRel(u.id) + "/" + kEndingRecord}, false);
  auto remove_parts = [&v, vfid, id = u.id] {
    Status gone = v.DeleteFiles(vfid, {UploadRel(id)}, true);
    if (!gone.ok() && !IsObjectNotFound(gone))
      spdlog::warn("s3: upload {} completed; its parts stay until the sweep: {}", id,
                   gone.ToString());
  };
  if (!ended.ok() || !background_ || !background_->Submit(remove_parts)) remove_parts();
  return etag;
}

Status ObjectStore::ClaimUpload(Volume& v, const VFolderId& vfid, const std::string& id) {
  Status st = v.Rename(vfid, UploadRel(id) + "/" + kUploadRecord, kEndingRecord);
  if (st.ok()) return st;
  // Gone (completed or aborted meanwhile), or being ended by another request.
  if (IsObjectNotFound(st) || st.code() == Code::kAlreadyExists || st.code() == Code::kConflict)
    return NoUpload(id);
  return st;
}

Status ObjectStore::AbortMultipart(Volume& v, const VFolderId& vfid, const MultipartUpload& u) {
  SLUICE_RETURN_IF_ERROR(ClaimUpload(v, vfid, u.id));
  Status st = v.DeleteFiles(vfid, {UploadRel(u.id)}, true);
  // A part that landed while the tree was removed stays (it saw the upload being ended) and
  // leaves the directory not empty: removed again.
  for (int i = 0; i < 3 && (st.code() == Code::kNotEmpty || st.sys_errno() == ENOTEMPTY); ++i)
    st = v.DeleteFiles(vfid, {UploadRel(u.id)}, true);
  return IsObjectNotFound(st) ? NoUpload(u.id) : st;
}

Result<std::vector<MultipartUpload>> ObjectStore::ListMultipart(Volume& v, const VFolderId& vfid) {
  std::vector<MultipartUpload> out;
  auto dir = v.OpenDir(vfid, kStagingDirName);
  if (!dir.ok())
    return IsObjectNotFound(dir.status()) ? out
                                          : Result<std::vector<MultipartUpload>>(dir.status());
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto n, (*dir)->Next());
    if (!n) break;
    if (n->type != EntryType::kDirectory || n->name.size() != 35 || n->name.substr(0, 3) != "mp-")
      continue;
    auto u = GetMultipart(v, vfid, n->name.substr(3));
    if (!u.ok()) continue;
    u->meta = {};
    out.push_back(std::move(u).value());
  }
  // A key's by id: the order they began in (to the millisecond; see CreateMultipart), also for
  // an id a page resumes after whose upload has gone since. (Uploads begun before 2026-12-04
  // have random ids, in a stable order.)
  std::sort(out.begin(), out.end(), [](const MultipartUpload& a, const MultipartUpload& b) {
    return std::tie(a.key, a.id) < std::tie(b.key, b.id);
  });
  return out;
}

Result<size_t> ObjectStore::CountMultipart(Volume& v, const VFolderId& vfid) {
  auto dir = v.OpenDir(vfid, kStagingDirName);
  if (!dir.ok()) return IsObjectNotFound(dir.status()) ? Result<size_t>(size_t{0}) : dir.status();
  size_t n = 0;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto e, (*dir)->Next());
    if (!e) return n;
    if (e->type == EntryType::kDirectory && e->name.size() == 35 && e->name.starts_with("mp-")) ++n;
  }
}

size_t ObjectStore::SweepMultipart(Volume& v, const VFolderId& vfid, std::chrono::seconds age) {
  // The parts of completed uploads whose removal a crash cut short: directories without a
  // record. (One being created has its record within moments: CreateMultipart writes it first.)
  const auto leftover_cutoff =
      std::chrono::system_clock::now() - std::min<std::chrono::seconds>(age, std::chrono::hours(1));
  if (auto dir = v.OpenDir(vfid, kStagingDirName); dir.ok()) {
    std::vector<std::string> gone;
    for (;;) {
      auto n = (*dir)->Next();
      if (!n.ok() || !*n) break;
      const std::string& name = (*n)->name;
      if ((*n)->type != EntryType::kDirectory || name.size() != 35 || name.substr(0, 3) != "mp-")
        continue;
      auto e = (*dir)->StatEntry(name);
      if (!e.ok() || e->modified > leftover_cutoff) continue;
      // (A claim that lapsed is given back here; one still alive is a Complete or an Abort
      // at work, however long: its parts are not leftovers.)
      auto u = GetMultipart(v, vfid, name.substr(3));
      if (!u.ok() && u.status().code() == Code::kNotFound &&
          !v.Stat(vfid, UploadRel(name.substr(3)) + "/" + kEndingRecord).ok())
        gone.push_back(name);
    }
    for (const auto& name : gone)
      if (v.DeleteFiles(vfid, {std::string(kStagingDirName) + "/" + name}, true).ok())
        spdlog::info("s3: removed the parts left by completed upload {}", name.substr(3));
  }
  auto all = ListMultipart(v, vfid);
  if (!all.ok()) return 0;
  size_t n = 0;
  auto cutoff = std::chrono::system_clock::now() - age;
  for (const auto& u : *all) {
    if (u.initiated > cutoff) continue;
    if (AbortMultipart(v, vfid, u).ok()) {
      ++n;
      spdlog::info("s3: removed multipart upload {} of '{}', abandoned since {}", u.id, u.key,
                   std::chrono::system_clock::to_time_t(u.initiated));
    }
  }
  return n;
}

Status ObjectStore::PutDirectory(Volume& v, const VFolderId& vfid, std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, KeyParts(key));
  Status st = v.Mkdir(vfid, RelOf(parts, parts.size()), true, true);
  if (st.sys_errno() == EEXIST || st.sys_errno() == ENOTDIR)
    return Status(Code::kConflict,
                  fmt::format("'{}' or one of its parents exists and is not a directory", key),
                  ENOTDIR);
  return st;
}

Result<ObjectStore::Opened> ObjectStore::Open(Volume& v, const VFolderId& vfid,
                                              std::string_view key, bool want_meta) {
  return OpenWith(v, vfid, key, want_meta, Lookup::kMayBlock);
}

Result<ObjectStore::Opened> ObjectStore::OpenCached(Volume& v, const VFolderId& vfid,
                                                    std::string_view key) {
  return OpenWith(v, vfid, key, true, Lookup::kCachedOnly);
}

Result<ObjectStore::Opened> ObjectStore::OpenWith(Volume& v, const VFolderId& vfid,
                                                  std::string_view key, bool want_meta,
                                                  Lookup lookup) {
  const bool cached_only = lookup == Lookup::kCachedOnly;
  auto would_block = [] { return Status(Code::kUnavailable, "not in memory"); };
  auto nokey = [&] { return Status(Code::kNotFound, "the specified key does not exist", ENOENT); };
  auto path = KeyPath(key);
  // A key no file can be ("a//b", "./x") or the staging directory's holds no object here: a
  // read finds nothing, as S3's does (a PUT of it is what is refused).
  if (!path.ok())
    return path.status().code() == Code::kPermissionDenied ||
                   (path.status().code() == Code::kInvalidArgument && !key.empty())
               ? nokey()
               : path.status();
  const std::string_view rel = *path;
  Opened o;
  if (key.back() == '/') {
    if (cached_only) return would_block();
    auto e = v.Stat(vfid, rel);
    if (!e.ok()) return IsObjectNotFound(e.status()) ? nokey() : e.status();
    if (e->type != EntryType::kDirectory) return nokey();
    o.entry = std::move(e).value();
    o.entry.size = 0;
    return o;
  }
  auto f = v.OpenReader(vfid, rel, lookup);
  if (!f.ok()) {
    if (cached_only) return would_block();  // answered, errors too, where it may block
    if (IsObjectNotFound(f.status()) || f.status().code() == Code::kInvalidArgument) return nokey();
    return f.status();
  }
  o.file = std::move(f).value();
  o.entry = o.file->info();
  if (!want_meta) return o;
  if (auto hit = meta_cache_->Find(&v, vfid, o.entry)) {
    if (*hit) o.meta = **hit;
    return o;
  }
  if (cached_only) return would_block();
  auto blob = o.file->ReadMeta();
  if (!blob.ok()) return o;  // no metadata this time; not remembered
  o.meta = ObjectMeta::Decode(*blob, o.entry);
  meta_cache_->Put(&v, vfid, o.entry, o.meta);
  return o;
}

Status ObjectStore::Delete(Volume& v, const VFolderId& vfid, std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(auto parts, KeyParts(key));
  std::string rel = RelOf(parts, parts.size());
  auto e = v.Stat(vfid, rel);
  if (!e.ok()) return IsObjectNotFound(e.status()) ? Status::Ok() : e.status();
  bool marker = key.back() == '/';
  if ((e->type == EntryType::kDirectory) != marker) return Status::Ok();  // no such object
  Status st = v.DeleteFiles(vfid, {rel}, false);
  if (st.code() == Code::kNotEmpty || IsObjectNotFound(st)) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(st);
  // S3 has no empty prefixes: remove the directories this left empty (never a non-empty one:
  // the volume removes a directory only while it is empty).
  for (size_t n = parts.size() - 1; n > 0; --n)
    if (!v.DeleteFiles(vfid, {RelOf(parts, n)}, false).ok()) break;
  return Status::Ok();
}

std::shared_mutex& ObjectStore::GateOf(const Volume& v, const VFolderId& vfid) {
  return gates_[std::hash<std::string>()(v.name() + '/' + vfid.hex) % kGates];
}

std::unique_lock<std::shared_mutex> ObjectStore::HoldVFolder(const Volume& v,
                                                             const VFolderId& vfid) {
  return std::unique_lock(GateOf(v, vfid));
}

Result<bool> ObjectStore::Empty(Volume& v, const VFolderId& vfid) {
  SLUICE_ASSIGN_OR_RETURN(auto dir, v.OpenDir(vfid, ""));
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto n, dir->Next());
    if (!n) return true;
    if (n->name != kStagingDirName) return false;
  }
}

}  // namespace sluice
