#include "volume/key_order.h"

#include <algorithm>
#include <cstring>

#include "volume/forwarding_volume.h"

namespace sluice {

int CompareListKeys(std::string_view an, bool a_dir, std::string_view bn, bool b_dir) {
  const size_t m = std::min(an.size(), bn.size());
  if (m > 0)
    if (int c = std::memcmp(an.data(), bn.data(), m)) return c;
  // Past the shorter name: at most one more character of it, its '/'.
  const size_t la = an.size() + a_dir, lb = bn.size() + b_dir;
  for (size_t i = m; i < std::min(la, lb); ++i) {
    const auto ca = static_cast<unsigned char>(i < an.size() ? an[i] : '/');
    const auto cb = static_cast<unsigned char>(i < bn.size() ? bn[i] : '/');
    if (ca != cb) return ca < cb ? -1 : 1;
  }
  return la < lb ? -1 : la > lb ? 1 : 0;
}

namespace {

bool IsDir(const DirHandle::Name& n) {
  return n.type == EntryType::kDirectory;
}

bool KeyLess(const DirHandle::Name& a, const DirHandle::Name& b) {
  return CompareListKeys(a.name, IsDir(a), b.name, IsDir(b)) < 0;
}

// Where `from` starts in `names`: the first entry whose key is the directory `after` lies in
// (a key ending in '/' that prefixes it) or after `after`, and not before `prefix`.
size_t StartOf(const KeyOrderedNames& names, const ListFrom& from) {
  auto below = [](std::string_view key, bool strict) {
    return [key, strict](const DirHandle::Name& n) {
      const int c = CompareListKeys(n.name, IsDir(n), key, false);
      return strict ? c <= 0 : c < 0;
    };
  };
  size_t at =
      std::partition_point(names.begin(), names.end(), below(from.prefix, false)) - names.begin();
  if (!from.after.empty()) {
    // Nothing in one directory's level sorts between "d/" and a key below it ("d/x").
    const size_t slash = from.after.find('/');
    const size_t a =
        slash == std::string_view::npos
            ? std::partition_point(names.begin(), names.end(), below(from.after, true)) -
                  names.begin()
            : std::partition_point(names.begin(), names.end(),
                                   below(from.after.substr(0, slash + 1), false)) -
                  names.begin();
    at = std::max(at, a);
  }
  return at;
}

class KeyOrderedDir : public ForwardingDirHandle {
 public:
  KeyOrderedDir(std::unique_ptr<DirHandle> inner, std::shared_ptr<const KeyOrderedNames> names,
                const ListFrom& from)
      : ForwardingDirHandle(std::move(inner)),
        names_(std::move(names)),
        prefix_(from.prefix),
        next_(StartOf(*names_, from)) {}
  bool KeyOrdered() const override { return true; }
  Result<std::optional<Name>> Next() override {
    // Names with the prefix are keys with it, one run in key order.
    if (next_ >= names_->size() || !(*names_)[next_].name.starts_with(prefix_))
      return std::optional<Name>();
    return std::optional<Name>((*names_)[next_++]);
  }

 private:
  std::shared_ptr<const KeyOrderedNames> names_;
  std::string prefix_;
  size_t next_;
};

}  // namespace

void SortByKey(KeyOrderedNames& names) {
  std::sort(names.begin(), names.end(), KeyLess);
}

std::unique_ptr<DirHandle> KeyOrderedView(std::unique_ptr<DirHandle> inner,
                                          std::shared_ptr<const KeyOrderedNames> names,
                                          const ListFrom& from) {
  return std::make_unique<KeyOrderedDir>(std::move(inner), std::move(names), from);
}

std::shared_ptr<const KeyOrderedNames> KeyOrderCache::Find(const std::string& id,
                                                           const DirEntry& info) {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  const Entry& e = *it->second;
  if (e.ino != info.ino || e.modified != info.modified || e.changed != info.changed) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return e.names;
}

void KeyOrderCache::Put(const std::string& id, const DirEntry& info,
                        std::shared_ptr<const KeyOrderedNames> names,
                        std::chrono::system_clock::time_point read_at) {
  if (info.ino == 0 || names->size() < kMinNames) return;
  if (info.modified > read_at - settle_ || info.changed > read_at - settle_) return;  // changing
  size_t bytes = sizeof(Entry) + id.size() + names->capacity() * sizeof(DirHandle::Name);
  for (const auto& n : *names)
    if (n.name.capacity() > 15) bytes += n.name.capacity() + 1;  // beyond the inline buffer
  if (bytes > max_bytes_) return;
  std::lock_guard lk(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    by_id_.erase(it);
  }
  while (!lru_.empty() && bytes_ + bytes > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    by_id_.erase(lru_.back().id);
    lru_.pop_back();
  }
  lru_.push_front(Entry{id, info.ino, info.modified, info.changed, std::move(names), bytes});
  by_id_[id] = lru_.begin();
  bytes_ += bytes;
}

size_t KeyOrderCache::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

}  // namespace sluice
