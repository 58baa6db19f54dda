#include "service/s3/s3_store.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <functional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/crypto.h"

namespace sluice {

namespace {

int64_t Now() {
  return static_cast<int64_t>(std::time(nullptr));
}

// `n` characters drawn uniformly from `alphabet` (rejection sampling: no modulo bias).
Result<std::string> RandomChars(size_t n, std::string_view alphabet) {
  std::string out;
  const unsigned limit = 256 - 256 % alphabet.size();
  while (out.size() < n) {
    unsigned char b[64];
    if (RAND_bytes(b, sizeof b) != 1)
      return Status(Code::kInternal, "no random bytes for a key (RAND_bytes failed)");
    for (unsigned char c : b)
      if (c < limit && out.size() < n) out.push_back(alphabet[c % alphabet.size()]);
  }
  return out;
}

constexpr std::string_view kUpperAlnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
constexpr std::string_view kSecretChars =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

Status CheckAccessKey(std::string_view ak) {
  if (ak.size() < 3 || ak.size() > 128 ||
      !std::all_of(ak.begin(), ak.end(), [](char c) { return std::isalnum((unsigned char)c); }))
    return Status(Code::kInvalidArgument,
                  "an access key is 3 to 128 letters and digits (A-Z, a-z, 0-9)");
  return Status::Ok();
}

Status CheckSecretKey(std::string_view sk) {
  if (sk.size() < 8 || sk.size() > 128 ||
      !std::all_of(sk.begin(), sk.end(), [](char c) { return c > ' ' && c < 127; }))
    return Status(Code::kInvalidArgument,
                  "a secret key is 8 to 128 printable ASCII characters without spaces");
  return Status::Ok();
}

Status CheckUserId(std::string_view id) {
  if (id.empty() || id.size() > 64 || id.front() == '.' ||
      !std::all_of(id.begin(), id.end(), [](char c) {
        return std::isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.' || c == '@';
      }))
    return Status(
        Code::kInvalidArgument,
        fmt::format("user id '{}': 1 to 64 of A-Z a-z 0-9 - _ . @, not starting with '.'", id));
  return Status::Ok();
}

std::string SealAad(std::string_view ak) {
  return fmt::format("sluice-s3-key:{}", ak);
}

template <typename T>
Result<T> Field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return Status(Code::kIoError, fmt::format("record lacks '{}'", key));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return Status(Code::kIoError, fmt::format("record has a bad '{}'", key));
  }
}

Result<nlohmann::json> ParseRecord(const std::string& text, const std::string& where) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status(Code::kIoError, fmt::format("record {} is not a JSON object", where));
  return j;
}

}  // namespace

nlohmann::json S3User::ToJson() const {
  return {{"id", id},
          {"display_name", display_name},
          {"default_volume", default_volume},
          {"default_scope", default_scope},
          {"created", created}};
}

Result<S3User> S3User::FromJson(const nlohmann::json& j) {
  S3User u;
  SLUICE_ASSIGN_OR_RETURN(u.id, Field<std::string>(j, "id"));
  SLUICE_ASSIGN_OR_RETURN(u.display_name, Field<std::string>(j, "display_name"));
  SLUICE_ASSIGN_OR_RETURN(u.default_volume, Field<std::string>(j, "default_volume"));
  SLUICE_ASSIGN_OR_RETURN(u.default_scope, Field<std::string>(j, "default_scope"));
  SLUICE_ASSIGN_OR_RETURN(u.created, Field<int64_t>(j, "created"));
  return u;
}

nlohmann::json S3Key::ToPublicJson() const {
  return {{"access_key", access_key},
          {"user", user},
          {"buckets", buckets},
          {"read_only", read_only},
          {"created", created}};
}

bool S3Key::MayUse(const std::string& bucket) const {
  return buckets.empty() || std::find(buckets.begin(), buckets.end(), bucket) != buckets.end();
}

nlohmann::json S3Bucket::ToJson() const {
  return {{"name", name},   {"volume", volume},   {"vfid", vfid},
          {"owner", owner}, {"created", created}, {"owns_vfolder", owns_vfolder}};
}

Result<S3Bucket> S3Bucket::FromJson(const nlohmann::json& j) {
  S3Bucket b;
  SLUICE_ASSIGN_OR_RETURN(b.name, Field<std::string>(j, "name"));
  SLUICE_ASSIGN_OR_RETURN(b.volume, Field<std::string>(j, "volume"));
  SLUICE_ASSIGN_OR_RETURN(b.vfid, Field<std::string>(j, "vfid"));
  SLUICE_ASSIGN_OR_RETURN(b.owner, Field<std::string>(j, "owner"));
  SLUICE_ASSIGN_OR_RETURN(b.created, Field<int64_t>(j, "created"));
  if (j.contains("owns_vfolder")) {
    SLUICE_ASSIGN_OR_RETURN(b.owns_vfolder, Field<bool>(j, "owns_vfolder"));
  }
  return b;
}

Status CheckBucketName(std::string_view n) {
  auto bad = [&](std::string_view why) {
    return Status(Code::kInvalidArgument, fmt::format("bucket name '{}': {}", n, why));
  };
  if (n.size() < 3 || n.size() > 63) return bad("must be 3 to 63 characters long");
  for (char c : n)
    if (!(std::islower((unsigned char)c) || std::isdigit((unsigned char)c) || c == '.' || c == '-'))
      return bad("may hold only lower-case letters, digits, '.' and '-'");
  auto alnum = [](char c) {
    return std::islower((unsigned char)c) || std::isdigit((unsigned char)c);
  };
  if (!alnum(n.front()) || !alnum(n.back()))
    return bad("must begin and end with a letter or digit");
  if (n.find("..") != std::string_view::npos || n.find(".-") != std::string_view::npos ||
      n.find("-.") != std::string_view::npos)
    return bad("must not have adjacent periods or a period next to a hyphen");
  for (std::string_view p : {"xn--", "sthree-", "amzn-s3-demo-"})
    if (n.starts_with(p)) return bad(fmt::format("must not begin with '{}' (reserved by S3)", p));
  for (std::string_view x : {"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"})
    if (n.ends_with(x)) return bad(fmt::format("must not end in '{}' (reserved by S3)", x));
  int dots = 0;
  bool digits_and_dots = true;
  for (char c : n) {
    dots += c == '.';
    digits_and_dots &= std::isdigit((unsigned char)c) || c == '.';
  }
  if (dots == 3 && digits_and_dots) return bad("must not be formatted as an IP address");
  return Status::Ok();
}

S3Store::S3Store(RecordDir users, RecordDir keys, RecordDir buckets, std::string seal_key)
    : users_(std::move(users)),
      keys_(std::move(keys)),
      buckets_(std::move(buckets)),
      seal_key_(Sha256("sluice-s3-seal-key:" + seal_key)),
      snap_(std::make_shared<Snapshot>()) {}

S3Store::~S3Store() {
  Stop();
}

Result<std::unique_ptr<S3Store>> S3Store::Open(const std::string& root,
                                               const std::string& seal_key) {
  SLUICE_ASSIGN_OR_RETURN(RecordDir users, RecordDir::Open(root + "/users"));
  SLUICE_ASSIGN_OR_RETURN(RecordDir keys, RecordDir::Open(root + "/keys"));
  SLUICE_ASSIGN_OR_RETURN(RecordDir buckets, RecordDir::Open(root + "/buckets"));
  std::unique_ptr<S3Store> s(
      new S3Store(std::move(users), std::move(keys), std::move(buckets), seal_key));
  s->Refresh();
  return s;
}

std::shared_ptr<const S3Store::Snapshot> S3Store::snap() const {
  std::lock_guard lk(mu_);
  return snap_;
}

Result<std::shared_ptr<const S3Key>> S3Store::LoadKey(const std::string& ak) const {
  SLUICE_ASSIGN_OR_RETURN(auto text, keys_.Get(ak));
  if (!text) return Status(Code::kNotFound, fmt::format("no access key '{}'", ak));
  SLUICE_ASSIGN_OR_RETURN(auto j, ParseRecord(*text, "key " + ak));
  auto k = std::make_shared<S3Key>();
  SLUICE_ASSIGN_OR_RETURN(k->access_key, Field<std::string>(j, "access_key"));
  SLUICE_ASSIGN_OR_RETURN(k->user, Field<std::string>(j, "user"));
  SLUICE_ASSIGN_OR_RETURN(k->buckets, Field<std::vector<std::string>>(j, "buckets"));
  SLUICE_ASSIGN_OR_RETURN(k->read_only, Field<bool>(j, "read_only"));
  SLUICE_ASSIGN_OR_RETURN(k->created, Field<int64_t>(j, "created"));
  SLUICE_ASSIGN_OR_RETURN(std::string sealed64, Field<std::string>(j, "secret"));
  SLUICE_ASSIGN_OR_RETURN(std::string sealed, Base64Decode(sealed64));
  SLUICE_ASSIGN_OR_RETURN(k->secret_key, Unseal(seal_key_, sealed, SealAad(k->access_key)));
  if (k->access_key != ak)
    return Status(Code::kIoError, fmt::format("key record {} is misnamed", ak));
  return std::shared_ptr<const S3Key>(std::move(k));
}

Result<S3User> S3Store::LoadUser(const std::string& id) const {
  SLUICE_ASSIGN_OR_RETURN(auto text, users_.Get(id));
  if (!text) return Status(Code::kNotFound, fmt::format("no S3 user '{}'", id));
  SLUICE_ASSIGN_OR_RETURN(auto j, ParseRecord(*text, "user " + id));
  return S3User::FromJson(j);
}

Result<S3Bucket> S3Store::LoadBucket(const std::string& name) const {
  SLUICE_ASSIGN_OR_RETURN(auto text, buckets_.Get(name));
  if (!text) return Status(Code::kNotFound, fmt::format("no bucket '{}'", name));
  SLUICE_ASSIGN_OR_RETURN(auto j, ParseRecord(*text, "bucket " + name));
  return S3Bucket::FromJson(j);
}

void S3Store::Publish(std::shared_ptr<const Snapshot> next) {
  std::lock_guard lk(mu_);
  snap_ = std::move(next);
  generation_.fetch_add(1, std::memory_order_release);
}

namespace {

using Clock = std::chrono::steady_clock;

int64_t SteadyNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A record that reads as missing leaves `items`; one that cannot be read now (errno: out of
// descriptors, a stale NFS handle) keeps what was known of it, and says so (false); one that
// reads but does not parse or unseal is left out.
template <typename T, typename V>
bool Take(std::map<std::string, T>& items, const std::map<std::string, T>& before,
          const std::string& name, V loaded, const char* what) {
  if (loaded.ok()) {
    items[name] = std::move(loaded).value();
    return true;
  }
  if (loaded.status().code() == Code::kNotFound) {
    items.erase(name);
    return true;
  }
  spdlog::warn("s3: {} record {} skipped: {}", what, name, loaded.status().message());
  if (!loaded.status().has_sys_errno()) {
    items.erase(name);
    return true;
  }
  if (auto it = before.find(name); it != before.end()) items[name] = it->second;
  return false;
}

}  // namespace

void S3Store::Refresh() {
  std::lock_guard rl(refresh_mu_);
  const auto now = Clock::now();
  const auto reload_every = std::chrono::milliseconds(full_reload_ms_.load());
  auto old = snap();
  auto next = std::make_shared<Snapshot>(*old);  // shares every directory's records
  bool changed = false;
  // Reloads one directory's records when its stamp moved (or `reload_every` passed); true when
  // what is loaded is current. A stamp is kept only when the reload was whole: a listing or a
  // record that could not be read keeps what was known of it and is tried again at the next
  // look, rather than leaving keys or buckets missing until the next change.
  auto reload = [&](const RecordDir& dir, auto& part, auto load, const char* what) {
    auto s = dir.Stamp();
    std::string stamp = s.ok() ? *s : std::string();
    if (!stamp.empty() && stamp == part->stamp && now - part->loaded < reload_every) return true;
    auto names = dir.List();
    if (!names.ok()) {
      spdlog::warn("s3: {} records not listed: {}", what, names.status().message());
      return false;
    }
    auto fresh = std::make_shared<std::remove_cvref_t<decltype(*part)>>();
    bool whole = true;
    for (const auto& n : *names) whole &= Take(fresh->items, part->items, n, load(n), what);
    fresh->stamp = whole ? stamp : std::string();
    fresh->loaded = whole ? now : part->loaded;
    part = std::move(fresh);
    changed = true;
    return whole;
  };
  reload(
      users_, next->users, [&](const std::string& n) { return LoadUser(n); }, "user");
  bool keys = reload(
      keys_, next->keys, [&](const std::string& n) { return LoadKey(n); }, "access key");
  reload(
      buckets_, next->buckets, [&](const std::string& n) { return LoadBucket(n); }, "bucket");
  if (changed) Publish(std::move(next));
  if (keys) keys_checked_ns_.store(SteadyNs(now), std::memory_order_release);
}

void S3Store::Reread(Dir dir, const std::string& name) {
  std::lock_guard rl(refresh_mu_);
  auto next = std::make_shared<Snapshot>(*snap());
  auto update = [&](auto& part, auto loaded, const char* what) {
    auto p = std::make_shared<std::remove_cvref_t<decltype(*part)>>(*part);
    if (!Take(p->items, part->items, name, std::move(loaded), what)) p->stamp.clear();
    part = std::move(p);
  };
  switch (dir) {
    case Dir::kUsers:
      update(next->users, LoadUser(name), "user");
      break;
    case Dir::kKeys:
      update(next->keys, LoadKey(name), "access key");
      break;
    case Dir::kBuckets:
      update(next->buckets, LoadBucket(name), "bucket");
      break;
  }
  Publish(std::move(next));
}

bool S3Store::KeysCurrent() const {
  const int64_t age = SteadyNs(Clock::now()) - keys_checked_ns_.load(std::memory_order_acquire);
  return age <= key_staleness_ms_.load(std::memory_order_relaxed) * 1000000;
}

void S3Store::Start(std::chrono::milliseconds interval) {
  key_staleness_ms_ = std::max<int64_t>(key_staleness_ms_, 10 * interval.count());
  thread_ = std::thread([this, interval] {
    std::unique_lock lk(run_mu_);
    while (!run_cv_.wait_for(lk, interval, [this] { return stop_; })) {
      lk.unlock();
      Refresh();
      lk.lock();
    }
  });
}

void S3Store::Stop() {
  {
    std::lock_guard lk(run_mu_);
    stop_ = true;
  }
  run_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status S3Store::CreateUser(S3User u) {
  SLUICE_RETURN_IF_ERROR(CheckUserId(u.id));
  if (u.display_name.empty()) u.display_name = u.id;
  u.created = Now();
  Status st = users_.Create(u.id, u.ToJson().dump());
  if (st.code() == Code::kAlreadyExists)
    return Status(Code::kAlreadyExists, fmt::format("S3 user '{}' exists", u.id));
  SLUICE_RETURN_IF_ERROR(st);
  Reread(Dir::kUsers, u.id);
  return Status::Ok();
}

Result<S3User> S3Store::GetUser(const std::string& id) const {
  auto s = snap();
  auto it = s->users->items.find(id);
  if (it != s->users->items.end()) return it->second;
  SLUICE_RETURN_IF_ERROR(CheckUserId(id));
  return LoadUser(id);
}

std::vector<S3User> S3Store::Users() const {
  std::vector<S3User> out;
  for (const auto& [id, u] : snap()->users->items) out.push_back(u);
  return out;
}

// Why the user `id` cannot go: a key or bucket of theirs, or Ok. Read from the records
// themselves, not this node's snapshot: that leaves out keys it cannot unseal (another node's
// seal key) or parse (a newer format), which would outlive their user and still authenticate
// where they unseal. A record that cannot be read now is that error: the answer is not known.
static Status StillUsed(const std::string& id, const RecordDir& keys, const RecordDir& buckets) {
  auto holder = [&](const RecordDir& dir, const char* field) -> Result<std::optional<std::string>> {
    SLUICE_ASSIGN_OR_RETURN(auto names, dir.List());
    for (const auto& n : names) {
      SLUICE_ASSIGN_OR_RETURN(auto text, dir.Get(n));
      if (!text) continue;  // gone meanwhile
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (j.is_object() && j.contains(field) && j[field] == id) return std::optional(n);
    }
    return std::optional<std::string>();
  };
  SLUICE_ASSIGN_OR_RETURN(auto key, holder(keys, "user"));
  if (key)
    return Status(Code::kConflict,
                  fmt::format("S3 user '{}' still has access key {}: revoke it first", id, *key));
  SLUICE_ASSIGN_OR_RETURN(auto bucket, holder(buckets, "owner"));
  if (bucket)
    return Status(
        Code::kConflict,
        fmt::format("S3 user '{}' still owns bucket '{}': delete or unbind it first", id, *bucket));
  return Status::Ok();
}

Status S3Store::DeleteUser(const std::string& id) {
  SLUICE_RETURN_IF_ERROR(CheckUserId(id));
  SLUICE_RETURN_IF_ERROR(StillUsed(id, keys_, buckets_));
  SLUICE_ASSIGN_OR_RETURN(auto body, users_.Get(id));
  Status st = body ? users_.Remove(id) : Status(Code::kNotFound, "gone");
  if (st.code() == Code::kNotFound)
    return Status(Code::kNotFound, fmt::format("no S3 user '{}'", id));
  SLUICE_RETURN_IF_ERROR(st);
  // A key or bucket another node linked for the user after the check above (its own check
  // saw the user): the user comes back, and stays until they are gone. A node that links after
  // this look finds the user gone itself (CreateKey, BindBucket).
  if (Status used = StillUsed(id, keys_, buckets_); !used.ok()) {
    Status back = users_.Create(id, *body);
    if (!back.ok() && back.code() != Code::kAlreadyExists)
      spdlog::error(
          "s3: user '{}' deleted while a key or bucket of theirs was made; it could "
          "not be put back: {}",
          id, back.message());
    Reread(Dir::kUsers, id);
    return used;
  }
  Reread(Dir::kUsers, id);
  return Status::Ok();
}

// After a record of `user`'s was linked: kNotFound (and `undo` run) when the user was deleted
// meanwhile (on another node: this node's view of the user may predate it).
static Status UserStillThere(const RecordDir& users, const std::string& user,
                             const std::function<void()>& undo) {
  auto there = users.Get(user);
  if (there.ok() && !*there) {
    undo();
    return Status(Code::kNotFound, fmt::format("no S3 user '{}'", user));
  }
  return Status::Ok();
}

Result<S3Key> S3Store::CreateKey(const std::string& user, std::optional<std::string> access_key,
                                 std::optional<std::string> secret_key,
                                 std::vector<std::string> buckets, bool read_only) {
  SLUICE_RETURN_IF_ERROR(GetUser(user).status());
  if (access_key.has_value() != secret_key.has_value())
    return Status(Code::kInvalidArgument,
                  "to import a key pair give both the access key and the secret key");
  for (const auto& b : buckets) SLUICE_RETURN_IF_ERROR(CheckBucketName(b));
  S3Key k;
  k.user = user;
  k.buckets = std::move(buckets);
  k.read_only = read_only;
  k.created = Now();
  if (access_key) {
    SLUICE_RETURN_IF_ERROR(CheckAccessKey(*access_key));
    SLUICE_RETURN_IF_ERROR(CheckSecretKey(*secret_key));
    k.access_key = *access_key;
    k.secret_key = *secret_key;
  } else {
    SLUICE_ASSIGN_OR_RETURN(std::string ak, RandomChars(17, kUpperAlnum));
    SLUICE_ASSIGN_OR_RETURN(k.secret_key, RandomChars(40, kSecretChars));
    k.access_key = "SLU" + ak;
  }
  nlohmann::json j = k.ToPublicJson();
  SLUICE_ASSIGN_OR_RETURN(std::string sealed, Seal(seal_key_, k.secret_key, SealAad(k.access_key)));
  j["secret"] = Base64Encode(sealed);
  Status st = keys_.Create(k.access_key, j.dump());
  if (st.code() == Code::kAlreadyExists)
    return Status(Code::kAlreadyExists, fmt::format("access key {} exists", k.access_key));
  SLUICE_RETURN_IF_ERROR(st);
  Status user_there = UserStillThere(users_, user, [&] { (void)keys_.Remove(k.access_key); });
  Reread(Dir::kKeys, k.access_key);
  if (!user_there.ok()) Reread(Dir::kUsers, user);
  SLUICE_RETURN_IF_ERROR(user_there);
  return k;
}

Status S3Store::RevokeKey(const std::string& ak) {
  SLUICE_RETURN_IF_ERROR(CheckAccessKey(ak));
  Status st = keys_.Remove(ak);
  if (st.code() == Code::kNotFound)
    return Status(Code::kNotFound, fmt::format("no access key {}", ak));
  SLUICE_RETURN_IF_ERROR(st);
  Reread(Dir::kKeys, ak);
  return Status::Ok();
}

std::vector<S3Key> S3Store::Keys() const {
  std::vector<S3Key> out;
  for (const auto& [ak, k] : snap()->keys->items) out.push_back(*k);
  return out;
}

std::shared_ptr<const S3Key> S3Store::FindKey(const std::string& ak) const {
  auto s = snap();
  auto it = s->keys->items.find(ak);
  // A key whose user this node does not know authenticates nothing: a user deleted while a
  // key of theirs was unreadable here leaves the key, and a new user of that id inherits nothing.
  if (it == s->keys->items.end() || !s->users->items.count(it->second->user)) return nullptr;
  return it->second;
}

Status S3Store::BindBucket(S3Bucket b) {
  SLUICE_RETURN_IF_ERROR(CheckBucketName(b.name));
  SLUICE_RETURN_IF_ERROR(GetUser(b.owner).status());
  if (!b.created) b.created = Now();
  Status st = buckets_.Create(b.name, b.ToJson().dump());
  if (st.code() == Code::kAlreadyExists)
    return Status(Code::kAlreadyExists, fmt::format("bucket '{}' exists", b.name));
  SLUICE_RETURN_IF_ERROR(st);
  st = UserStillThere(users_, b.owner, [&] { (void)buckets_.Remove(b.name); });
  Reread(Dir::kBuckets, b.name);
  if (!st.ok()) Reread(Dir::kUsers, b.owner);
  return st;
}

Result<S3Bucket> S3Store::FindBucket(const std::string& name) {
  auto s = snap();
  auto it = s->buckets->items.find(name);
  if (it != s->buckets->items.end()) return it->second;
  Status nope(Code::kNotFound, fmt::format("no bucket '{}'", name));
  if (!CheckBucketName(name).ok()) return nope;
  // Made on another node since the last reload? A record that cannot be read now is that
  // error (a 5xx), not a bucket that does not exist.
  auto b = LoadBucket(name);
  if (!b.ok() && b.status().code() == Code::kNotFound) return nope;
  return b;
}

std::optional<S3Bucket> S3Store::FindCachedBucket(const std::string& name) const {
  auto s = snap();
  auto it = s->buckets->items.find(name);
  if (it == s->buckets->items.end()) return std::nullopt;
  return it->second;
}

Status S3Store::UnbindBucket(const std::string& name, const std::string& expected_vfid) {
  Status st = RecordDir::CheckName(name);
  if (st.ok() && !expected_vfid.empty()) {
    // The name as this node last saw it may have been deleted and made again (another user's
    // now, on another vfolder) by another node: only the binding the caller checked goes.
    auto text = buckets_.Get(name);
    if (!text.ok()) return text.status();
    if (!*text) return Status(Code::kNotFound, fmt::format("no bucket '{}'", name));
    auto j = ParseRecord(**text, "bucket " + name);
    auto b = j.ok() ? S3Bucket::FromJson(*j) : Result<S3Bucket>(j.status());
    if (!b.ok()) return b.status();
    if (b->vfid != expected_vfid)
      return Status(Code::kNotFound,
                    fmt::format("bucket '{}' was deleted and made again meanwhile", name));
  }
  if (st.ok()) st = buckets_.Remove(name);
  if (st.code() == Code::kNotFound || st.code() == Code::kInvalidArgument)
    return Status(Code::kNotFound, fmt::format("no bucket '{}'", name));
  SLUICE_RETURN_IF_ERROR(st);
  Reread(Dir::kBuckets, name);
  return Status::Ok();
}

std::vector<S3Bucket> S3Store::Buckets() const {
  std::vector<S3Bucket> out;
  for (const auto& [n, b] : snap()->buckets->items) out.push_back(b);
  return out;
}

size_t S3Store::BucketsOf(const std::string& user) const {
  size_t n = 0;
  for (const auto& [name, b] : snap()->buckets->items) n += b.owner == user;
  return n;
}

bool S3Store::Serves(const std::string& volume, const std::string& vfid) const {
  for (const auto& [n, b] : snap()->buckets->items)
    if (b.vfid == vfid && b.volume == volume) return true;
  return false;
}

}  // namespace sluice
