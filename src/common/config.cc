#include "common/config.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <toml.hpp>

namespace sluice {

namespace {

// Thrown only while parsing; ParseConfig turns it into a Status.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Normalize(std::string key) {
  for (auto& c : key)
    if (c == '_') c = '-';
  return key;
}

std::string TypeName(const toml::value& v) {
  std::ostringstream os;
  os << v.type();
  return os.str();
}

// A table whose keys are normalised to kebab-case; reports keys nobody asked for.
class Section {
 public:
  Section(std::string name, const toml::value& v) : name_(std::move(name)) {
    if (!v.is_table()) throw ConfigError(fmt::format("[{}] must be a table", name_));
    for (const auto& [k, val] : v.as_table()) {
      std::string nk = Normalize(k);
      if (items_.count(nk))
        throw ConfigError(
            fmt::format("{}.{} is given twice (kebab-case and snake_case)", name_, nk));
      items_.emplace(nk, &val);
    }
  }

  const toml::value* Take(const std::string& key) {
    auto it = items_.find(key);
    if (it == items_.end()) return nullptr;
    used_.insert(key);
    return it->second;
  }

  std::string Key(const std::string& key) const { return name_ + "." + key; }

  std::optional<std::string> String(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (!v->is_string())
      throw ConfigError(fmt::format("{} must be a string, not {}", Key(key), TypeName(*v)));
    return v->as_string().str;
  }
  std::optional<bool> Bool(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      throw ConfigError(fmt::format("{} must be true or false, not {}", Key(key), TypeName(*v)));
    return v->as_boolean();
  }
  std::optional<int64_t> Int(const std::string& key, int64_t min, int64_t max) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (!v->is_integer())
      throw ConfigError(fmt::format("{} must be an integer, not {}", Key(key), TypeName(*v)));
    int64_t i = v->as_integer();
    if (i < min || i > max)
      throw ConfigError(fmt::format("{} = {} is out of range [{}, {}]", Key(key), i, min, max));
    return i;
  }
  // An integer, or a string for the user/group style keys that take names or ids.
  std::optional<std::string> IdOrName(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (v->is_integer()) {
      if (v->as_integer() < 0) throw ConfigError(fmt::format("{} must not be negative", Key(key)));
      return std::to_string(v->as_integer());
    }
    if (v->is_string()) return v->as_string().str;
    throw ConfigError(fmt::format("{} must be a name or a numeric id", Key(key)));
  }
  std::optional<std::vector<std::string>> StringList(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    std::vector<std::string> out;
    if (v->is_array())
      for (const auto& e : v->as_array())
        if (e.is_string()) out.push_back(e.as_string().str);
    if (!v->is_array() || out.size() != v->as_array().size())
      throw ConfigError(fmt::format("{} must be a list of strings", Key(key)));
    return out;
  }
  std::optional<uint64_t> Size(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (v->is_integer()) {
      if (v->as_integer() < 0) throw ConfigError(fmt::format("{} must not be negative", Key(key)));
      return static_cast<uint64_t>(v->as_integer());
    }
    if (!v->is_string())
      throw ConfigError(fmt::format("{} must be a size such as \"100g\"", Key(key)));
    auto r = ParseBinarySize(v->as_string().str);
    if (!r.ok()) throw ConfigError(fmt::format("{}: {}", Key(key), r.status().message()));
    return *r;
  }
  std::optional<std::chrono::seconds> Duration(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    if (v->is_integer()) {
      if (v->as_integer() < 0) throw ConfigError(fmt::format("{} must not be negative", Key(key)));
      return std::chrono::seconds(v->as_integer());
    }
    if (v->is_floating()) return std::chrono::seconds(static_cast<int64_t>(v->as_floating()));
    if (!v->is_string())
      throw ConfigError(fmt::format("{} must be a duration such as \"1d\" or \"30m\"", Key(key)));
    auto r = ParseDuration(v->as_string().str);
    if (!r.ok()) throw ConfigError(fmt::format("{}: {}", Key(key), r.status().message()));
    return *r;
  }
  std::optional<HostPort> Addr(const std::string& key) {
    const auto* v = Take(key);
    if (!v) return std::nullopt;
    HostPort hp;
    if (v->is_table()) {
      Section t(Key(key), *v);
      hp.host = t.String("host").value_or("");
      auto port = t.Int("port", 0, 65535);
      if (!port) throw ConfigError(fmt::format("{}.port is required", Key(key)));
      hp.port = static_cast<uint16_t>(*port);
      t.RejectUnknown();
    } else if (v->is_string()) {
      const std::string& s = v->as_string().str;
      size_t colon = s.rfind(':');
      if (colon == std::string::npos)
        throw ConfigError(fmt::format("{} = \"{}\" must be \"host:port\"", Key(key), s));
      hp.host = s.substr(0, colon);
      if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']')
        hp.host = hp.host.substr(1, hp.host.size() - 2);
      std::string p = s.substr(colon + 1);
      char* end = nullptr;
      long port = std::strtol(p.c_str(), &end, 10);
      if (p.empty() || *end != '\0' || port < 0 || port > 65535)
        throw ConfigError(fmt::format("{}: port '{}' is not a number in [0, 65535]", Key(key), p));
      hp.port = static_cast<uint16_t>(port);
    } else {
      throw ConfigError(fmt::format("{} must be {{ host = \"...\", port = N }}", Key(key)));
    }
    if (hp.host.empty()) throw ConfigError(fmt::format("{}.host must not be empty", Key(key)));
    return hp;
  }

  // Keys Backend.AI defines that Sluice does not act on: accepted, with a warning.
  void Ignore(std::initializer_list<const char*> keys, std::vector<std::string>& warnings) {
    for (const char* k : keys)
      if (Take(k)) warnings.push_back(fmt::format("{} has no effect in Sluice; ignored", Key(k)));
  }

  void RejectUnknown() const {
    for (const auto& [k, v] : items_)
      if (!used_.count(k)) throw ConfigError(fmt::format("unknown key {}", Key(k)));
  }

 private:
  std::string name_;
  std::map<std::string, const toml::value*> items_;
  std::set<std::string> used_;
};

void ParseStorageProxy(Section& s, Config& c) {
  if (auto v = s.String("node-id")) c.node_id = *v;
  if (auto v = s.Int("num-proc", 0, 1024)) c.num_proc = static_cast<int>(*v);
  if (auto v = s.String("pid-file")) c.pid_file = *v;
  if (auto v = s.Int("scandir-limit", 0, INT64_MAX)) c.scandir_limit = static_cast<uint64_t>(*v);
  if (auto v = s.Size("max-upload-size")) c.max_upload_size = *v;
  if (auto v = s.String("secret")) c.secret = *v;
  if (auto v = s.Duration("session-expire")) c.session_expire = *v;
  if (auto v = s.IdOrName("user")) c.user = *v;
  if (auto v = s.IdOrName("group")) c.group = *v;
  if (auto v = s.Bool("allow-auto-quota-scope-creation")) c.allow_auto_quota_scope_creation = *v;
  s.Ignore({"event-loop", "ipc-base-path", "aiomonitor-port", "aiomonitor-termui-port",
            "aiomonitor-webui-port", "watcher-insock-path-prefix", "watcher-outsock-path-prefix",
            "use-watcher", "use-experimental-redis-event-dispatcher"},
           c.warnings);
  s.RejectUnknown();
}

void ParseListenerCommon(Section& s, ListenerConfig& l) {
  if (auto v = s.Addr("service-addr")) l.addr = *v;
  if (auto v = s.Bool("ssl-enabled")) l.ssl_enabled = *v;
  if (auto v = s.String("ssl-cert")) l.ssl_cert = *v;
  if (auto v = s.String("ssl-privkey")) l.ssl_privkey = *v;
  if (l.ssl_enabled && (l.ssl_cert.empty() || l.ssl_privkey.empty()))
    throw ConfigError(fmt::format("{} needs ssl-cert and ssl-privkey when ssl-enabled = true",
                                  s.Key("ssl-enabled")));
}

void ParseApi(const toml::value& api, Config& c) {
  if (!api.is_table()) throw ConfigError("[api] must be a table");
  for (const auto& [k, v] : api.as_table()) {
    std::string nk = Normalize(k);
    if (nk == "client") {
      Section s("api.client", v);
      ParseListenerCommon(s, c.client);
      s.RejectUnknown();
    } else if (nk == "manager") {
      Section s("api.manager", v);
      ParseListenerCommon(s, c.manager);
      if (auto a = s.Addr("internal-addr")) c.internal = *a;
      if (const auto* a = s.Take("announce-addr")) {
        if (a->is_string()) {
          c.announce_addr = a->as_string().str;
        } else if (a->is_table()) {
          c.announce_addr = fmt::format("{}:{}", toml::find_or<std::string>(*a, "host", ""),
                                        toml::find_or<int>(*a, "port", 0));
        }
      }
      s.Ignore({"announce-internal-addr"}, c.warnings);
      if (auto v2 = s.String("secret")) c.manager_secret = *v2;
      s.RejectUnknown();
    } else if (nk == "s3") {
      Section s("api.s3", v);
      c.s3.enabled = true;
      ParseListenerCommon(s, c.s3.listener);
      if (auto e = s.Bool("enabled")) c.s3.enabled = *e;
      if (auto r = s.String("region")) {
        if (r->empty() || r->size() > 64)
          throw ConfigError("api.s3.region must be 1 to 64 characters");
        c.s3.region = *r;
      }
      if (auto p = s.String("state-path")) c.s3.state_path = *p;
      if (auto k = s.String("seal-key")) {
        if (k->size() < 16) throw ConfigError("api.s3.seal-key must be at least 16 characters");
        c.s3.seal_key = *k;
      }
      if (auto d = s.Bool("durable")) c.s3.durable = *d;
      if (auto r = s.Duration("refresh-interval"))
        c.s3.refresh = std::max(std::chrono::milliseconds(100),
                                std::chrono::duration_cast<std::chrono::milliseconds>(*r));
      if (auto e = s.Duration("multipart-expiry")) {
        if (e->count() < 1) throw ConfigError("api.s3.multipart-expiry must be at least 1s");
        c.s3.multipart_expiry = *e;
      }
      if (auto n = s.Int("max-multipart-uploads", 1, 1000000))
        c.s3.max_multipart_uploads = static_cast<size_t>(*n);
      if (auto n = s.Int("max-buckets", 1, 1000000)) c.s3.max_buckets = static_cast<size_t>(*n);
      if (auto k = s.Duration("keepalive")) {
        if (*k > std::chrono::seconds(30))
          throw ConfigError("api.s3.keepalive must be at most 30s (clients wait 60 s at most)");
        c.s3.keepalive = *k;
      }
      if (auto d = s.String("domain")) {
        std::string dom = *d;
        std::transform(dom.begin(), dom.end(), dom.begin(), ::tolower);
        if (dom.size() > 200 ||
            dom.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-") != std::string::npos)
          throw ConfigError("api.s3.domain must be a host name (letters, digits, '.', '-')");
        c.s3.domain = dom;
      }
      s.RejectUnknown();
    } else {
      c.warnings.push_back(fmt::format("section [api.{}] is not used by Sluice; ignored", k));
    }
  }
}

void ParseSluice(Section& s, Config& c) {
  if (auto v = s.String("state-dir")) c.state_dir = *v;
  if (auto v = s.Int("io-threads", 1, 1024)) c.io_threads = static_cast<size_t>(*v);
  if (auto v = s.Int("io-threads-max", 1, 4096)) {
    c.io_threads_max = static_cast<size_t>(*v);
    if (c.io_threads_max < c.io_threads)
      throw ConfigError(fmt::format("{} = {} is below io-threads = {}", s.Key("io-threads-max"),
                                    c.io_threads_max, c.io_threads));
  } else {
    c.io_threads_max = std::max(c.io_threads_max, c.io_threads);
  }
  if (auto v = s.Int("task-threads", 1, 1024)) c.task_threads = static_cast<size_t>(*v);
  if (auto v = s.Int("scan-threads", 1, 1024)) c.scan_threads = static_cast<size_t>(*v);
  if (auto v = s.String("log-level")) {
    static const std::set<std::string> kLevels = {"trace",   "debug", "info",
                                                  "warning", "error", "critical"};
    if (!kLevels.count(*v))
      throw ConfigError(
          fmt::format("{} = \"{}\" must be one of trace, debug, info, warning, "
                      "error, critical",
                      s.Key("log-level"), *v));
    c.log_level = *v;
  }
  if (auto v = s.Size("max-request-body")) c.max_request_body = *v;
  if (auto v = s.Size("max-buffered-request-bodies")) c.max_buffered_request_bodies = *v;
  if (auto v = s.Int("max-connections", 1, 10000000)) c.max_connections = static_cast<size_t>(*v);
  if (auto v = s.Duration("request-timeout")) c.request_timeout = *v;
  if (auto v = s.Duration("keepalive-timeout")) c.keepalive_timeout = *v;
  if (auto v = s.Duration("drain-timeout")) c.drain_timeout = *v;
  if (auto v = s.StringList("unmanaged-roots")) {
    for (const auto& r : *v)
      if (r.empty() || r[0] != '/')
        throw ConfigError(
            fmt::format("{}: '{}' is not an absolute path", s.Key("unmanaged-roots"), r));
    c.unmanaged_roots = *v;
  }
  s.RejectUnknown();
}

void ParseEtcd(Section& s, Config& c) {
  if (auto v = s.String("namespace")) c.etcd.ns = *v;
  c.etcd.addr = s.Addr("addr");
  c.etcd.user = s.String("user").value_or("");
  c.etcd.password = s.String("password").value_or("");
  s.RejectUnknown();
}

void ParseEvents(Section& s, Config& c) {
  if (auto v = s.Bool("enabled")) c.events.enabled = *v;
  c.events.redis_addr = s.Addr("redis-addr");
  if (auto v = s.String("redis-password")) c.events.redis_password = *v;
  if (auto v = s.Int("redis-db", 0, 1 << 20)) c.events.redis_db = static_cast<int>(*v);
  if (auto v = s.String("stream")) c.events.stream = *v;
  if (auto v = s.String("source")) c.events.source = *v;
  if (auto v = s.Duration("retry-max")) c.events.retry_max = std::max(*v, std::chrono::seconds(1));
  s.RejectUnknown();
}

// Backend.AI's [artifact-storages.<name>]: Sluice serves the vfs_storage kind; the others
// (object storage, git-lfs) are left out with a warning.
void ParseArtifactStorages(const toml::value& all, Config& c) {
  if (!all.is_table())
    throw ConfigError("[artifact-storages] must be a table of [artifact-storages.<name>] sections");
  for (const auto& [name, v] : all.as_table()) {
    Section s("artifact-storages." + name, v);
    auto type = s.String("type");
    if (!type) throw ConfigError(fmt::format("{} is required", s.Key("type")));
    if (*type != "vfs_storage") {
      c.warnings.push_back(
          fmt::format("{}: type \"{}\" is not served by Sluice; ignored", s.Key("type"), *type));
      continue;
    }
    // The table is `vfs_storage` (older releases: `vfs`).
    const toml::value* t = s.Take("vfs-storage");
    if (!t) t = s.Take("vfs");
    if (!t || !t->is_table())
      throw ConfigError(
          fmt::format("{} is required for type \"vfs_storage\"", s.Key("vfs-storage")));
    s.Ignore({"object-storage"}, c.warnings);
    s.RejectUnknown();
    Section vs(s.Key("vfs-storage"), *t);
    VfsStorageConfig vc;
    vc.name = name;
    auto base = vs.String("base-path");
    if (!base || base->empty() || (*base)[0] != '/')
      throw ConfigError(fmt::format("{} must be an absolute path", vs.Key("base-path")));
    vc.base_path = *base;
    if (auto sub = vs.String("subpath"); sub && !sub->empty()) vc.base_path += "/" + *sub;
    if (auto n = vs.Int("download-chunk-size", 1024, 64 << 20))
      vc.download_chunk_size = static_cast<uint64_t>(*n);
    vs.Ignore({"temporary", "upload-chunk-size", "max-file-size"}, c.warnings);
    vs.RejectUnknown();
    c.vfs_storages.push_back(std::move(vc));
  }
}

nlohmann::json TomlToJson(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::boolean:
      return v.as_boolean();
    case toml::value_t::integer:
      return v.as_integer();
    case toml::value_t::floating:
      return v.as_floating();
    case toml::value_t::string:
      return v.as_string().str;
    case toml::value_t::array: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : v.as_array()) a.push_back(TomlToJson(e));
      return a;
    }
    case toml::value_t::table: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, e] : v.as_table()) o[k] = TomlToJson(e);
      return o;
    }
    default: {
      std::ostringstream os;
      os << v;
      return os.str();
    }
  }
}

void ParseVolumes(const toml::value& vols, Config& c) {
  if (!vols.is_table()) throw ConfigError("[volume] must be a table of [volume.<name>] sections");
  for (const auto& [name, v] : vols.as_table()) {
    Section s("volume." + name, v);
    VolumeConfig vc;
    vc.name = name;
    if (name == "noop")
      throw ConfigError("volume name 'noop' is reserved: it names unmanaged vfolders");
    auto backend = s.String("backend");
    if (!backend) throw ConfigError(fmt::format("{} is required", s.Key("backend")));
    vc.backend = *backend;
    auto path = s.String("path");
    if (!path || path->empty()) throw ConfigError(fmt::format("{} is required", s.Key("path")));
    vc.path = *path;
    vc.fsprefix = s.String("fsprefix").value_or("");
    if (auto n = s.Int("max-operations", 1, 100000)) vc.max_operations = static_cast<int>(*n);
    if (const auto* o = s.Take("options")) {
      if (!o->is_table()) throw ConfigError(fmt::format("{} must be a table", s.Key("options")));
      vc.options = TomlToJson(*o);
    }
    if (const auto* c = s.Take("cache")) {
      if (!c->is_table()) throw ConfigError(fmt::format("{} must be a table", s.Key("cache")));
      vc.cache = TomlToJson(*c);
    }
    if (const auto* f = s.Take("faults")) {
      if (!f->is_array())
        throw ConfigError(fmt::format("{} must be an array of tables", s.Key("faults")));
      vc.faults = TomlToJson(*f);
    }
    s.RejectUnknown();
    c.volumes.push_back(std::move(vc));
  }
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

// Byte offset of the first invalid UTF-8 sequence, or npos. TOML files are UTF-8, and toml11
// 3.7 reads past its buffer on some invalid sequences (found by fuzz/fuzz_config).
size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace

Result<Config> ParseConfig(std::string_view text, std::string_view origin) {
  Config c;
  if (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos)
    return Status(Code::kInvalidArgument,
                  fmt::format("{}: not valid UTF-8 (byte {} of the file)", origin, bad));
  try {
    std::istringstream is{std::string(text)};
    toml::value root = toml::parse(is, std::string(origin));
    if (!root.is_table()) return Status(Code::kInvalidArgument, "config root must be a table");
    for (const auto& [k, v] : root.as_table()) {
      std::string nk = Normalize(k);
      if (nk == "storage-proxy") {
        Section s("storage-proxy", v);
        ParseStorageProxy(s, c);
      } else if (nk == "api") {
        ParseApi(v, c);
      } else if (nk == "volume") {
        ParseVolumes(v, c);
      } else if (nk == "sluice") {
        Section s("sluice", v);
        ParseSluice(s, c);
      } else if (nk == "etcd") {
        Section s("etcd", v);
        ParseEtcd(s, c);
      } else if (nk == "events") {
        Section s("events", v);
        ParseEvents(s, c);
      } else if (nk == "artifact-storages") {
        ParseArtifactStorages(v, c);
      } else {
        c.warnings.push_back(fmt::format("section [{}] is not used by Sluice; ignored", k));
      }
    }
    if (c.volumes.empty())
      c.warnings.push_back("no [volume.<name>] sections: Sluice serves no volumes");
  } catch (const ConfigError& e) {
    return Status(Code::kInvalidArgument, fmt::format("{}: {}", origin, e.what()));
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, fmt::format("{}: {}", origin, e.what()));
  }
  return c;
}

Result<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno, fmt::format("read config file '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

Config EmbeddedDefaultConfig(const std::string& state_dir) {
  Config c;
  c.embedded_default = true;
  c.state_dir = state_dir;
  VolumeConfig v;
  v.name = "local";
  v.backend = "vfs";
  v.path = state_dir + "/volumes/local";
  c.volumes.push_back(v);
  c.s3.enabled = true;
  return c;
}

Result<uint64_t> ParseBinarySize(std::string_view s) {
  std::string str(s);
  size_t i = 0;
  while (i < str.size() && (std::isdigit(static_cast<unsigned char>(str[i])) || str[i] == '.')) ++i;
  std::string digits = str.substr(0, i);
  char* end = nullptr;
  double num = i ? std::strtod(digits.c_str(), &end) : 0;
  if (i == 0 || end != digits.c_str() + digits.size())
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a size", s));
  std::string unit;
  for (size_t j = i; j < str.size(); ++j)
    if (str[j] != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(str[j])));
  static const std::map<std::string, int> kShift = {
      {"", 0},     {"b", 0},   {"k", 10},   {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
      {"mib", 20}, {"g", 30},  {"gb", 30},  {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40},
      {"p", 50},   {"pb", 50}, {"pib", 50}, {"e", 60},   {"eb", 60},  {"eib", 60}};
  auto it = kShift.find(unit);
  if (it == kShift.end())
    return Status(Code::kInvalidArgument,
                  fmt::format("'{}': unknown size unit '{}' (use k, m, g, t, p, e)", s, unit));
  double bytes = std::ldexp(num, it->second);
  if (bytes >= 18446744073709551615.0)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is too large", s));
  return static_cast<uint64_t>(bytes);
}

Result<std::chrono::seconds> ParseDuration(std::string_view s) {
  std::string str(s);
  size_t i = 0;
  while (i < str.size() && (std::isdigit(static_cast<unsigned char>(str[i])) || str[i] == '.')) ++i;
  std::string digits = str.substr(0, i);
  char* end = nullptr;
  double num = i ? std::strtod(digits.c_str(), &end) : 0;
  if (i == 0 || end != digits.c_str() + digits.size() || num > 1e12)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a duration", s));
  std::string unit = str.substr(i);
  static const std::map<std::string, double> kMul = {{"", 1},     {"s", 1},     {"m", 60},
                                                     {"h", 3600}, {"d", 86400}, {"w", 7 * 86400}};
  auto it = kMul.find(unit);
  if (it == kMul.end())
    return Status(Code::kInvalidArgument,
                  fmt::format("'{}': unknown duration unit '{}' (use s, m, h, d, w)", s, unit));
  return std::chrono::seconds(static_cast<int64_t>(num * it->second));
}

Result<std::chrono::milliseconds> ParseDurationMillis(std::string_view s) {
  if (s.size() > 2 && s.size() < 15 && s.ends_with("ms") &&
      s.find_first_not_of("0123456789") == s.size() - 2)
    return std::chrono::milliseconds(std::stoull(std::string(s.substr(0, s.size() - 2))));
  SLUICE_ASSIGN_OR_RETURN(auto d, ParseDuration(s));
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

std::string DefaultConfigToml() {
  return R"(# Sluice configuration. Sluice reads Backend.AI's storage-proxy.toml as it is: keys may be
# kebab-case or snake_case. Sections Sluice does not use ([etcd], [logging], [debug], ...) are
# accepted with a warning; unknown keys in the sections below stop the start with an error.

[storage-proxy]
# An identifier of this node, unique in a cluster.
node-id = "sluice-local"
# Event-loop threads for the HTTP listeners; 0 means one per core.
num-proc = 0
# Write the daemon's pid here (empty: no pid file).
# pid-file = "/run/sluice.pid"
# Most directory entries one listing returns; 0 means no limit.
scandir-limit = 1000
# Largest single upload.
max-upload-size = "100g"
# HS256 secret for download/upload tokens. Empty: generated on first start and stored with
# mode 0600 under <state-dir>/secrets/.
# secret = ""
# How long download/upload tokens stay valid.
session-expire = "1d"
# When started as root, switch to this user and group after binding the listeners.
# user = "sluice"
# group = "sluice"
# Create a quota scope on demand when a vfolder is created in a scope that does not exist.
allow-auto-quota-scope-creation = true

[api.client]
# Client-facing API (downloads, uploads).
service-addr = { host = "127.0.0.1", port = 6021 }
ssl-enabled = false
# ssl-cert = "/etc/sluice/client.crt"
# ssl-privkey = "/etc/sluice/client.key"

[api.manager]
# Manager-facing API. Every route but health needs the X-BackendAI-Storage-Auth-Token header.
service-addr = { host = "127.0.0.1", port = 6022 }
# Health probes and Prometheus /metrics.
internal-addr = { host = "127.0.0.1", port = 6023 }
ssl-enabled = false
# ssl-cert = "/etc/sluice/manager.crt"
# ssl-privkey = "/etc/sluice/manager.key"
# Shared with the Backend.AI manager. Empty: generated on first start under <state-dir>/secrets/.
# secret = ""

[api.s3]
# The S3 API over vfolders (buckets are vfolders, objects are files). On when this section is
# present (and in the embedded default); `enabled = false` turns it off.
service-addr = { host = "127.0.0.1", port = 6024 }
ssl-enabled = false
# The region clients sign for and GetBucketLocation answers.
region = "us-east-1"
# Users, access keys and bucket names: a directory every node serving these volumes reaches.
# Empty: <first volume>/.sluice/s3.
# state-path = "/mnt/vfroot/local/.sluice/s3"
# Seals secret keys at rest; the same on every node. Empty: generated under <state-dir>/secrets/
# (fine for one node).
# seal-key = ""
# fsync each object before its write is answered.
durable = true
# How often changes other nodes made (keys revoked, buckets created) are picked up.
refresh-interval = "1s"
# Multipart uploads neither completed nor aborted this long after they began are removed, parts
# and all (checked by the janitor, on every node).
multipart-expiry = "7d"
# Multipart uploads in progress a bucket may hold (more are refused until some complete or
# are aborted): listing them reads every one's record.
max-multipart-uploads = 10000
# Buckets one S3 user may own through CreateBucket (RGW's default; a bucket is a vfolder, and
# every node keeps every bucket's record in memory). Bind more through the manager API or CLI.
max-buckets = 1000
# A CopyObject, UploadPartCopy or CompleteMultipartUpload still running after this long (a
# large object on a volume that copies data) answers 200 at once and sends a space this often
# until its result or <Error> follows, as S3 does, so that no client times out waiting.
# "0": each answers when done.
keepalive = "5s"
# Virtual-hosted addressing: with a domain, a Host of "<bucket>.<domain>" names the bucket
# (point a wildcard DNS record at the nodes). Path style always works. Empty: path style only.
# domain = "s3.example.com"

[sluice]
# Node-local state: generated secrets, task history.
state-dir = "./var"
# Worker threads for blocking filesystem work done on behalf of requests.
io-threads = 8
# A request that has waited 100 ms while every one of them was busy gets a thread of its own,
# up to this many in all (they leave after 30 s without work): requests stuck on a volume that
# does not answer (a stalled S3 origin, a hung network mount) then hold threads of their own,
# and the other volumes' requests run beside them instead of queueing behind.
io-threads-max = 256
# Worker threads for background tasks (vfolder delete and clone).
task-threads = 4
# Worker threads for parallel tree walks (usage scans, copies).
scan-threads = 8
# One of trace, debug, info, warning, error, critical.
log-level = "info"
# Largest request body the manager API accepts (decided from Content-Length: 413 before any
# of it is read). Uploads stream and have their own limit (max-upload-size).
max-request-body = "1m"
# Request bodies buffered at once per listener, all connections together; requests beyond it
# are answered 503 with Retry-After before their bodies are read.
max-buffered-request-bodies = "64m"
# Open connections per listener; more are answered 503 and closed.
max-connections = 10000
# A request must arrive in full within this time.
request-timeout = "60s"
# Idle keep-alive connections are closed after this time.
keepalive-timeout = "75s"
# On SIGTERM, in-flight requests get this long to finish.
drain-timeout = "30s"

# One section per volume. backend is one of: vfs, btrfs, xfs, ext4, cephfs, s3 (the data in an
# S3 origin; path is then only a label), mem (in memory, for tests) (docs/decisions.md says what
# each needs of its path). For tests and drills only,
# `faults = [{ op = "write", error = "ENOSPC", after = "1m" }]` injects failures (see
# src/volume/fault_volume.h).
[volume.local]
backend = "vfs"
path = "./var/volumes/local"
# fsprefix = ""
# max-operations = 128               (operations waiting on this volume's storage at once; past
#                                     it 503: storage that hangs holds no more threads; default
#                                     half of io-threads-max, at least 64)
# Options by backend:
#   vfs:    usage-reconcile-interval = "60s"  (kept usage figures are re-walked when older)
#           usage-walk-budget = "10ms"        (vfolders walked faster than this: every request)
#   cephfs: pending-write-window = "30s"      (Sluice's writes count on top of ceph.dir.rbytes)
#   s3:     endpoint, bucket, prefix, region, access-key + secret-key or credentials-file,
#           ca-file, insecure, read-only, capacity, vfolder-ttl, trash-grace, part-size,
#           usage-reconcile-interval, usage-walk-budget (as vfs: usage kept by listings),
#           max-copy-size, upload-lock-ttl, connect-timeout, stall-timeout, max-attempts,
#           retry-deadline, max-connections (64), queue-timeout ("10s"), transport-threads
#           (docs/s3-volumes.md)
# options = { usage-reconcile-interval = "60s" }
#
# Any volume can have an SSD read cache in front of it (docs/cache.md):
# [volume.local.cache]
# path = "/nvme/sluice-cache/local"   (required)
# max-size = "10g"
# min-free = "1g"
# block-size = "4m"
# ttl = "60s"
# admission = "first-miss"           (or "second-miss")
# serve-stale = true                 (the origin down: serve what is cached)
# revalidate-timeout = "2s"          (... or silent this long, when something is cached)
)";
}

}  // namespace sluice
