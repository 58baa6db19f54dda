#include "cli/commands.h"

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>

#include "cli/output.h"
#include "cli/s3_data.h"
#include "client/transfer.h"
#include "common/config.h"
#include "common/http_client.h"
#include "common/temp_files.h"
#include "common/uri.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif

namespace sluice::cli {

using net::BodySink;
using net::Client;
using net::ClientOptions;
using net::Endpoint;
using net::HttpAnswer;

namespace http = boost::beast::http;
using json = nlohmann::json;

int ExitCodeForHttpStatus(unsigned status) {
  if (status == 404 || status == 410) return kExitNotFound;  // 410: vfolder already deleted
  if (status == 409) return kExitConflict;
  if (status == 401 || status == 403) return kExitAuth;
  if (status >= 500) return kExitUnavailable;
  return kExitFailed;
}

namespace {

constexpr const char* kDefaultEndpoint = "http://127.0.0.1:6022";
constexpr const char* kDefaultTokenFile = "./var/secrets/manager.secret";
constexpr size_t kMkdirBatch = 50;  // the daemon's limit per request

constexpr const char* kRootFooter = R"(Connection:
  The endpoint comes from --endpoint, else $SLUICE_ENDPOINT, else http://127.0.0.1:6022.
  The token comes from --token, else the file named by --token-file, else $SLUICE_TOKEN,
  else ./var/secrets/manager.secret when it exists.

Exit status:
  0  success
  1  the daemon refused the request (4xx other than those below), or a task failed
  2  usage error (bad or missing arguments)
  3  not found (HTTP 404; 410 when deleting a vfolder that is already gone)
  4  conflict, e.g. it already exists (HTTP 409)
  5  authentication failure (HTTP 401/403)
  6  cannot connect, timed out, or the daemon failed (HTTP 5xx)

Examples:
  sluice volumes
  sluice --json vfolder ls local user:8b7c.../0123456789abcdef0123456789abcdef
  sluice vfolder clone local SRC_VFID local DST_VFID)";

struct Globals {
  std::string endpoint = kDefaultEndpoint;
  std::string token;
  std::string token_file = kDefaultTokenFile;
  bool json = false;
  double timeout = 30;
  bool insecure = false;
};

// Every command's arguments; only the command that runs reads its own.
struct Args {
  std::string volume, qsid, vfid;
  std::string src_volume, src_vfid, dst_volume, dst_vfid;
  std::string limit, scope_limit, size;
  std::string mode = "755";
  bool no_wait = false;
  std::string subpath = ".";
  std::string path = ".";
  std::vector<std::string> paths;
  bool no_parents = false, exist_ok = false, recursive = false, bytes = false, fresh = false;
  std::string src, dst;
  std::string output;
  std::string task_id;
  // s3
  std::string s3_id, display_name, access_key, secret_key, user, bucket_name, owner;
  std::vector<std::string> buckets;
  bool read_only = false;
  bool all = false;
  std::string cache_path;  // cache commands' PATH ("": the whole vfolder); bind's PREFIX
};

std::string Trim(std::string s) {
  auto sp = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && sp(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && sp(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

uint64_t SizeArg(const std::string& s) {
  // Validated by the option's check already.
  auto r = ParseBinarySize(s);
  return r.ok() ? *r : 0;
}

const CLI::Validator& SizeValidator() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        auto r = ParseBinarySize(s);
        return r.ok() ? std::string() : r.status().message();
      },
      "");
  return v;
}

Result<unsigned> ParseMode(std::string s) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O')) s = s.substr(2);
  if (s.empty() || s.size() > 5 ||
      !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '7'; }))
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not an octal mode such as 755", s));
  unsigned m = static_cast<unsigned>(std::stoul(s, nullptr, 8));
  if (m > 07777) return Status(Code::kInvalidArgument, fmt::format("mode {} is above 7777", s));
  return m;
}

const CLI::Validator& ModeValidator() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        auto r = ParseMode(s);
        return r.ok() ? std::string() : r.status().message();
      },
      "");
  return v;
}

std::string Str(const json& j, const char* key, std::string def = "") {
  if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  return def;
}

std::optional<uint64_t> Uint(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  const json& v = j[key];
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
    return v.get<uint64_t>();
  return std::nullopt;
}

std::string SizeOrDash(const json& j, const char* key) {
  auto v = Uint(j, key);
  return v ? FormatSizeExact(*v) : "-";
}

// The message of a problem+json answer, else the start of the body, else the reason phrase.
std::string ProblemMessage(const HttpAnswer& a) {
  json j = json::parse(a.body, nullptr, false);
  std::string msg = Str(j, "msg");
  if (msg.empty()) msg = Str(j, "title");
  if (msg.empty() && !a.body.empty() && j.is_discarded()) {
    std::string first = a.body.substr(0, a.body.find('\n'));
    if (first.size() > 200) first = first.substr(0, 200) + "...";
    msg = Printable(Trim(first));
  }
  if (msg.empty()) msg = std::string(http::obsolete_reason(static_cast<http::status>(a.status)));
  return msg;
}

class Cli {
 public:
  Globals g;
  bool token_given = false;
  bool token_file_given = false;

  // Builds the client from the global options; a bad endpoint or token file is a usage error.
  int Init() {
    auto ep = Endpoint::Parse(g.endpoint);
    if (!ep.ok()) return Fail(kExitUsage, ep.status().message());
    if (!(g.timeout > 0)) return Fail(kExitUsage, "--timeout must be positive");
    std::string token;
    if (token_given) {
      token = g.token;
    } else if (token_file_given) {
      if (!ReadTokenFile(g.token_file, &token))
        return Fail(kExitUsage, fmt::format("cannot read token file '{}': {}", g.token_file,
                                            std::strerror(errno)));
    } else if (const char* env = std::getenv("SLUICE_TOKEN"); env != nullptr && *env != '\0') {
      token = env;
    } else if (::access(g.token_file.c_str(), F_OK) == 0) {
      if (!ReadTokenFile(g.token_file, &token))
        return Fail(kExitUsage, fmt::format("cannot read token file '{}': {}", g.token_file,
                                            std::strerror(errno)));
    }
    token = Trim(token);
    for (char c : token)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        return Fail(kExitUsage, "the token contains control characters");
    have_token_ = !token.empty();
    ClientOptions o;
    o.endpoint = *ep;
    o.token = token;
    // A year stands for "no limit" and keeps the conversion in range.
    o.timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::min(g.timeout, 365.0 * 86400.0) * 1000.0));
    if (o.timeout.count() < 1) o.timeout = std::chrono::milliseconds(1);
    o.insecure = g.insecure;
    client_ = std::make_unique<Client>(std::move(o));
    return kExitOk;
  }

  Client& client() { return *client_; }

  // Prints "sluice: <msg>" on stderr and returns `code`.
  int Fail(int code, const std::string& msg) {
    ClearSpinner();
    std::fprintf(stderr, "sluice: %s\n", msg.c_str());
    return code;
  }

  int TransportFail(const Status& st) {
    return Fail(st.code() == Code::kUnavailable ? kExitUnavailable : kExitFailed, st.message());
  }

  int HttpFail(const HttpAnswer& a) {
    // Filesystem errors come as 400 with their errno (as Backend.AI answers them): a missing
    // file or an existing name still deserves its own exit code.
    int code = ExitCodeForHttpStatus(a.status);
    if (a.status == 400) {
      auto j = json::parse(a.body, nullptr, false);
      int err = j.is_object() && j.contains("errno") && j["errno"].is_number_integer()
                    ? j["errno"].get<int>()
                    : 0;
      if (err == ENOENT) code = kExitNotFound;
      if (err == EEXIST || err == ENOTEMPTY) code = kExitConflict;
    }
    int rc = Fail(code, fmt::format("{} (HTTP {})", ProblemMessage(a), a.status));
    if ((a.status == 401 || a.status == 403) && !have_token_)
      std::fprintf(stderr,
                   "sluice: no token was given: use --token, --token-file or $SLUICE_TOKEN\n");
    return rc;
  }

  // One request; on success `answer` holds the parsed JSON body (null for an empty one).
  int Call(http::verb verb, std::string_view path, const json& body, json* answer) {
    auto r = client_->Request(verb, path, body);
    if (!r.ok()) return TransportFail(r.status());
    if (!r->ok()) return HttpFail(*r);
    return ParseAnswer(*r, answer);
  }

  int ParseAnswer(const HttpAnswer& a, json* answer) {
    json j = nullptr;
    if (!Trim(a.body).empty()) {
      j = json::parse(a.body, nullptr, false);
      if (j.is_discarded())
        return Fail(kExitUnavailable,
                    fmt::format("the daemon's answer is not JSON (HTTP {})", a.status));
    }
    if (answer) *answer = std::move(j);
    return kExitOk;
  }

  void PrintJson(const json& j) {
    std::string s = j.dump(2, ' ', false, json::error_handler_t::replace);
    s += '\n';
    std::fputs(s.c_str(), stdout);
  }

  // What --json prints for an answer without a body (204): {"status": "ok", ...request}.
  void PrintOk(json request) {
    json j = {{"status", "ok"}};
    for (auto& [k, v] : request.items()) j[k] = v;
    PrintJson(j);
  }

  void Say(const std::string& line) {
    if (!g.json) std::printf("%s\n", line.c_str());
  }

  // A task's reported progress in a few words: files and bytes done of those found.
  static std::string ProgressText(const json& p) {
    auto files = Uint(p, "files_done"), found = Uint(p, "files_found");
    auto bytes = Uint(p, "bytes_done"), total = Uint(p, "bytes_found");
    if (!files || !found || !bytes || !total) return "in progress";
    const bool listed = p.contains("listed") && p["listed"].is_boolean() && p["listed"].get<bool>();
    std::string s = fmt::format("{}/{}{} files, {} of {}{}", *files, *found, listed ? "" : "+",
                                FormatSize(*bytes), FormatSize(*total), listed ? "" : "+");
    if (auto e = Uint(p, "errors"); e && *e) s += fmt::format(", {} errors", *e);
    return s;
  }

  // Polls the task until it completes or fails. A spinner with the elapsed seconds runs on
  // stderr while it waits when stderr is a terminal.
  int WaitTask(const std::string& id, const std::string& label, json* task, double* secs) {
    using namespace std::chrono;
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    static constexpr char kFrames[] = {'|', '/', '-', '\\'};
    auto t0 = steady_clock::now();
    auto next_poll = t0;
    milliseconds interval(100);
    size_t frame = 0;
    std::string detail;  // the task's progress, when it reports one
    for (;;) {
      if (tty) {
        double el = duration<double>(steady_clock::now() - t0).count();
        std::string line =
            fmt::format("{} {} ({:.0f}s{})", kFrames[frame++ % 4], label, el, detail);
        // One terminal line at most, or the next '\r' would not return to its start.
        struct winsize ws {};
        size_t cols =
            ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
        if (line.size() >= cols) line = line.substr(0, cols - 1);
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
        std::fflush(stderr);
        spinner_ = true;
      }
      if (steady_clock::now() >= next_poll) {
        int rc = Call(http::verb::get, "/bgtask", {{"task_id", id}}, task);
        if (rc != kExitOk) return rc;
        std::string st = Str(*task, "status");
        if (st == "completed" || st == "failed") break;
        if (task->contains("progress")) detail = ", " + ProgressText((*task)["progress"]);
        interval = std::min(milliseconds(1000), interval * 3 / 2);
        next_poll = steady_clock::now() + interval;
      }
      auto wait =
          std::min<steady_clock::duration>(milliseconds(100), next_poll - steady_clock::now());
      if (wait > steady_clock::duration::zero()) std::this_thread::sleep_for(wait);
    }
    ClearSpinner();
    *secs = duration<double>(steady_clock::now() - t0).count();
    return kExitOk;
  }

  // Prints a finished task: its JSON with --json, else `done` on success; a failed task is
  // reported on stderr with exit status 1.
  int ReportTask(const json& task, const std::string& done, double secs) {
    if (g.json) PrintJson(task);
    std::string id = Str(task, "task_id");
    if (Str(task, "status") == "failed") {
      std::string msg = task.contains("error") ? Str(task["error"], "msg", "unknown error")
                                               : std::string("unknown error");
      return Fail(kExitFailed, fmt::format("task {} ({}) failed: {}", id, Str(task, "kind"), msg));
    }
    Say(fmt::format("{} (task {}, {:.1f}s)", done, id, secs));
    return kExitOk;
  }

  // Starts a background task with `body`, then waits for it unless `no_wait`; `done` says
  // what the finished task did.
  int RunTask(http::verb verb, std::string_view path, const json& body, bool no_wait,
              const std::string& label, const std::function<std::string(const json&)>& done) {
    json answer;
    int rc = Call(verb, path, body, &answer);
    if (rc != kExitOk) return rc;
    std::string id = Str(answer, "bgtask_id");
    if (id.empty()) return Fail(kExitUnavailable, "the daemon did not return a task id");
    if (no_wait) {
      if (g.json)
        PrintJson(answer);
      else
        std::printf("%s\n", id.c_str());
      return kExitOk;
    }
    json task;
    double secs = 0;
    rc = WaitTask(id, label, &task, &secs);
    if (rc != kExitOk) return rc;
    return ReportTask(task, done(task), secs);
  }
  int RunTask(http::verb verb, std::string_view path, const json& body, bool no_wait,
              const std::string& label, const std::string& done) {
    return RunTask(verb, path, body, no_wait, label, [&done](const json&) { return done; });
  }

 private:
  static bool ReadTokenFile(const std::string& path, std::string* out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    errno = 0;
    return true;
  }

  void ClearSpinner() {
    if (!spinner_) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    spinner_ = false;
  }

  std::unique_ptr<Client> client_;
  bool have_token_ = false;
  bool spinner_ = false;
};

// Command lists show the first line of each description; a command's own help shows all of it,
// followed by a blank line.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    std::string d = sub->get_description();
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), d.substr(0, d.find('\n')),
                             column_width_);
    return out.str();
  }
  std::string make_description(const CLI::App* app) const override {
    std::string d = CLI::Formatter::make_description(app);
    return d.empty() ? d : d + "\n";
  }
};

using Action = std::function<int(Cli&)>;

// The command chosen speaks S3 only (`sluice s3 ls|cp|...`): the manager's endpoint and token,
// which it never uses, are not read, so a manager setting it cannot use cannot stop it.
bool g_speaks_s3_only = false;

// Makes `fn` the action to run when `sub` is the command given.
void OnRun(CLI::App* sub, Action* slot, Action fn) {
  sub->callback([slot, fn = std::move(fn)] { *slot = fn; });
}

CLI::App* Command(CLI::App* parent, const std::string& name, const std::string& description,
                  const std::string& example) {
  CLI::App* sub = parent->add_subcommand(name, description);
  std::string footer;
  if (!example.empty()) footer = "Example:\n  " + example + "\n\n";
  footer +=
      "Global options (--endpoint, --token, --token-file, --json, --timeout, --insecure) go\n"
      "before or after the command; exit statuses are listed in `sluice --help`.";
  sub->footer(footer);
  return sub;
}

void AddVolume(CLI::App* sub, Args& a) {
  sub->add_option("VOLUME", a.volume, "volume name, as `sluice volumes` lists it")->required();
}
void AddQsid(CLI::App* sub, Args& a) {
  sub->add_option("QSID", a.qsid, "quota scope id: user:<uuid> or project:<uuid>")->required();
}
void AddVfid(CLI::App* sub, Args& a) {
  sub->add_option("VFID", a.vfid, "vfolder id: <qsid>/<32 hex digits> (or legacy <32 hex>)")
      ->required();
}

constexpr const char* kQsidEx = "user:2ab3c4d5-6e7f-4a8b-9c0d-1e2f3a4b5c6d";
constexpr const char* kVfidEx =
    "user:2ab3c4d5-6e7f-4a8b-9c0d-1e2f3a4b5c6d/0123456789abcdef0123456789abcdef";

// ---- volumes -----------------------------------------------------------------------------

void AddVolumeCommands(CLI::App& app, Args& a, Action* run) {
  auto* vols = Command(&app, "volumes",
                       "List the volumes the daemon serves.\n"
                       "One line per volume: name, backend, mount path and capabilities.",
                       "sluice volumes");
  OnRun(vols, run, [](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/volumes", nullptr, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    Table t({"NAME", "BACKEND", "PATH", "CAPABILITIES"});
    if (j.contains("volumes") && j["volumes"].is_array()) {
      for (const auto& v : j["volumes"]) {
        std::string caps;
        if (v.contains("capabilities") && v["capabilities"].is_array())
          for (const auto& cap : v["capabilities"])
            if (cap.is_string()) caps += (caps.empty() ? "" : ",") + cap.get<std::string>();
        t.AddRow({Printable(Str(v, "name")), Str(v, "backend"), Printable(Str(v, "path")), caps});
      }
    }
    t.Print(stdout);
    return kExitOk;
  });

  auto* vol = Command(&app, "volume", "Inspect one volume.", "sluice volume info local");
  vol->require_subcommand(1);
  auto* info = Command(vol, "info",
                       "Show a volume's health, capacity and I/O counters.\n"
                       "Combines the daemon's hwinfo, fs-usage and performance-metric answers.",
                       "sluice volume info local");
  AddVolume(info, a);
  OnRun(info, run, [&a](Cli& c) {
    json body = {{"volume", a.volume}};
    json hw;
    int rc = c.Call(http::verb::get, "/volume/hwinfo", body, &hw);
    if (rc != kExitOk) return rc;
    json fs, perf;
    rc = c.Call(http::verb::get, "/folder/fs-usage", body, &fs);
    if (rc != kExitOk) return rc;
    rc = c.Call(http::verb::get, "/volume/performance-metric", body, &perf);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(
          {{"volume", a.volume}, {"hwinfo", hw}, {"fs_usage", fs}, {"performance_metric", perf}});
      return kExitOk;
    }
    std::vector<std::pair<std::string, std::string>> f;
    f.emplace_back("VOLUME", Printable(a.volume));
    f.emplace_back("STATUS", Str(hw, "status", "unknown"));
    if (!Str(hw, "status_info").empty()) f.emplace_back("STATUS INFO", Str(hw, "status_info"));
    auto cap = Uint(fs, "capacity_bytes"), used = Uint(fs, "used_bytes");
    f.emplace_back("CAPACITY", SizeOrDash(fs, "capacity_bytes"));
    std::string used_s = SizeOrDash(fs, "used_bytes");
    if (cap && used && *cap > 0)
      used_s +=
          fmt::format(", {:.1f}%", 100.0 * static_cast<double>(*used) / static_cast<double>(*cap));
    f.emplace_back("USED", used_s);
    if (cap && used && *cap >= *used) f.emplace_back("FREE", FormatSizeExact(*cap - *used));
    const json& m = perf.contains("metric") ? perf["metric"] : json::object();
    auto num = [&](const char* k) {
      auto v = Uint(m, k);
      return v ? std::to_string(*v) : std::string("-");
    };
    auto size = [&](const char* k) {
      auto v = Uint(m, k);
      return v ? FormatSize(*v) : std::string("-");
    };
    f.emplace_back("READS", fmt::format("{} ops, {}, {} us", num("iops_read"),
                                        size("io_bytes_read"), num("io_usec_read")));
    f.emplace_back("WRITES", fmt::format("{} ops, {}, {} us", num("iops_write"),
                                         size("io_bytes_write"), num("io_usec_write")));
    if (!Str(perf, "observed_at").empty())
      f.emplace_back("OBSERVED", FormatTime(Str(perf, "observed_at")) + " UTC");
    if (hw.contains("metadata") && hw["metadata"].is_object())
      for (const auto& [k, v] : hw["metadata"].items())
        f.emplace_back("META " + Printable(k),
                       Printable(v.is_string() ? v.get<std::string>() : v.dump()));
    PrintFields(stdout, f);
    return kExitOk;
  });
}

// ---- quota scopes ------------------------------------------------------------------------

void AddScopeCommands(CLI::App& app, Args& a, Action* run) {
  auto* scope = Command(&app, "scope",
                        "Manage quota scopes and their size limits.\n"
                        "A quota scope (user:<uuid> or project:<uuid>) is the directory that "
                        "holds\nvfolders and carries a size limit.",
                        std::string("sluice scope show local ") + kQsidEx);
  scope->require_subcommand(1);

  auto* create = Command(scope, "create", "Create a quota scope, optionally with a size limit.",
                         std::string("sluice scope create local ") + kQsidEx + " --limit 10g");
  AddVolume(create, a);
  AddQsid(create, a);
  create->add_option("--limit", a.limit, "size limit: 10g, 512m, 1.5GiB or bytes")
      ->check(SizeValidator())
      ->type_name("SIZE");
  OnRun(create, run, [&a](Cli& c) {
    json body = {{"volume", a.volume}, {"qsid", a.qsid}};
    json limit = a.limit.empty() ? json(nullptr) : json(SizeArg(a.limit));
    if (!a.limit.empty()) body["options"] = {{"limit_bytes", limit}};
    int rc = c.Call(http::verb::post, "/quota-scope", body, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"volume", a.volume}, {"qsid", a.qsid}, {"limit_bytes", limit}});
    else
      c.Say(fmt::format(
          "created quota scope {} on {}{}", a.qsid, a.volume,
          a.limit.empty() ? "" : fmt::format(" (limit {})", FormatSize(SizeArg(a.limit)))));
    return kExitOk;
  });

  auto* show = Command(scope, "show",
                       "Show a quota scope's usage and limit.\n"
                       "The limit reads 'none' when the scope has no limit.",
                       std::string("sluice scope show local ") + kQsidEx);
  AddVolume(show, a);
  AddQsid(show, a);
  OnRun(show, run, [&a](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/quota-scope", {{"volume", a.volume}, {"qsid", a.qsid}}, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    auto used = Uint(j, "used_bytes"), limit = Uint(j, "limit_bytes");
    std::vector<std::pair<std::string, std::string>> f = {
        {"VOLUME", Printable(a.volume)},
        {"QSID", Printable(a.qsid)},
        {"USED", used ? FormatSizeExact(*used) : "unknown"},
        {"LIMIT", limit ? FormatSizeExact(*limit) : "none"}};
    if (used && limit && *limit > 0)
      f.emplace_back("USE%", fmt::format("{:.1f}%", 100.0 * static_cast<double>(*used) /
                                                        static_cast<double>(*limit)));
    PrintFields(stdout, f);
    return kExitOk;
  });

  auto* set = Command(scope, "set-limit",
                      "Set or change a quota scope's size limit.\n"
                      "Creates the scope when it does not exist.",
                      std::string("sluice scope set-limit local ") + kQsidEx + " 1.5GiB");
  AddVolume(set, a);
  AddQsid(set, a);
  set->add_option("SIZE", a.size, "the new limit: 10g, 512m, 1.5GiB or bytes")
      ->required()
      ->check(SizeValidator())
      ->type_name("SIZE");
  OnRun(set, run, [&a](Cli& c) {
    uint64_t n = SizeArg(a.size);
    int rc = c.Call(http::verb::patch, "/quota-scope",
                    {{"volume", a.volume}, {"qsid", a.qsid}, {"options", {{"limit_bytes", n}}}},
                    nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"volume", a.volume}, {"qsid", a.qsid}, {"limit_bytes", n}});
    else
      c.Say(fmt::format("limit of {} on {} set to {}", a.qsid, a.volume, FormatSizeExact(n)));
    return kExitOk;
  });

  auto* unset = Command(scope, "unset-limit",
                        "Lift a quota scope's size limit.\nThe scope and its vfolders stay.",
                        std::string("sluice scope unset-limit local ") + kQsidEx);
  AddVolume(unset, a);
  AddQsid(unset, a);
  OnRun(unset, run, [&a](Cli& c) {
    int rc = c.Call(http::verb::delete_, "/quota-scope/quota",
                    {{"volume", a.volume}, {"qsid", a.qsid}}, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"volume", a.volume}, {"qsid", a.qsid}, {"limit_bytes", nullptr}});
    else
      c.Say(fmt::format("limit of {} on {} lifted", a.qsid, a.volume));
    return kExitOk;
  });

  auto* del = Command(scope, "delete",
                      "Delete a quota scope.\nRefused (exit status 4) while vfolders remain in it.",
                      std::string("sluice scope delete local ") + kQsidEx);
  AddVolume(del, a);
  AddQsid(del, a);
  OnRun(del, run, [&a](Cli& c) {
    int rc = c.Call(http::verb::delete_, "/quota-scope", {{"volume", a.volume}, {"qsid", a.qsid}},
                    nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"volume", a.volume}, {"qsid", a.qsid}});
    else
      c.Say(fmt::format("deleted quota scope {} on {}", a.qsid, a.volume));
    return kExitOk;
  });
}

// ---- vfolders ----------------------------------------------------------------------------

int List(Cli& c, Args& a) {
  json j;
  int rc = c.Call(http::verb::post, "/folder/file/list",
                  {{"volume", a.volume}, {"vfid", a.vfid}, {"relpath", a.path}}, &j);
  if (rc != kExitOk) return rc;
  if (c.g.json) {
    c.PrintJson(j);
    return kExitOk;
  }
  std::vector<json> items;
  if (j.contains("items") && j["items"].is_array())
    for (const auto& it : j["items"]) items.push_back(it);
  std::sort(items.begin(), items.end(),
            [](const json& x, const json& y) { return Str(x, "name") < Str(y, "name"); });
  Table t({"NAME", "TYPE", "SIZE", "MODIFIED (UTC)"});
  t.AlignRight(2);
  for (const auto& it : items) {
    std::string type = Str(it, "type");
    std::string name = Printable(Str(it, "name"));
    const json& st = it.contains("stat") ? it["stat"] : json::object();
    std::string size = "-";
    if (type == "DIRECTORY") {
      type = "dir";
    } else {
      if (type == "SYMLINK") {
        type = "link";
        if (!Str(it, "symlink_target").empty())
          name += " -> " + Printable(Str(it, "symlink_target"));
      } else if (type == "FILE") {
        type = "file";
      } else {
        for (auto& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      }
      if (auto n = Uint(st, "size")) size = a.bytes ? std::to_string(*n) : FormatSize(*n);
    }
    t.AddRow({name, type, size, FormatTime(Str(st, "modified"))});
  }
  if (t.rows() > 0) t.Print(stdout);
  return kExitOk;
}

int Mkdir(Cli& c, Args& a) {
  json success = json::array(), failed = json::array();
  for (size_t i = 0; i < a.paths.size(); i += kMkdirBatch) {
    std::vector<std::string> batch(
        a.paths.begin() + static_cast<std::ptrdiff_t>(i),
        a.paths.begin() + static_cast<std::ptrdiff_t>(std::min(a.paths.size(), i + kMkdirBatch)));
    json body = {{"volume", a.volume},
                 {"vfid", a.vfid},
                 {"relpath", batch},
                 {"parents", !a.no_parents},
                 {"exist_ok", a.exist_ok}};
    auto r = c.client().Request(http::verb::post, "/folder/file/mkdir", body);
    if (!r.ok()) return c.TransportFail(r.status());
    // 200: all created, 207: some, 422: none; the results list each path.
    json j;
    if (r->status == 200 || r->status == 207 || r->status == 422) {
      int rc = c.ParseAnswer(*r, &j);
      if (rc != kExitOk) return rc;
    }
    if (!j.is_object() || !j.contains("results")) {
      if (!r->ok()) return c.HttpFail(*r);
      return c.Fail(kExitUnavailable, "the daemon's mkdir answer has no results");
    }
    const json& res = j["results"];
    if (res.contains("success") && res["success"].is_array())
      for (const auto& e : res["success"]) success.push_back(e);
    if (res.contains("failed") && res["failed"].is_array())
      for (const auto& e : res["failed"]) failed.push_back(e);
  }
  if (c.g.json) c.PrintJson({{"results", {{"success", success}, {"failed", failed}}}});
  for (const auto& e : failed)
    std::fprintf(stderr, "sluice: mkdir %s: %s\n", Printable(Str(e, "item")).c_str(),
                 Str(e, "msg", "failed").c_str());
  return failed.empty() ? kExitOk : kExitFailed;
}

int Get(Cli& c, Args& a) {
  const bool to_stdout = a.output.empty() || client::IsStdout(a.output);
  // Written next to the destination and renamed at the end (no half-written file on failure),
  // or in place where the destination is a device or a pipe (client::WrittenInPlace).
  struct stat sb {};
  const bool there = !to_stdout && ::stat(a.output.c_str(), &sb) == 0;
  bool in_place = there && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode);
  if (there && S_ISDIR(sb.st_mode)) {  // a directory gets the file under its own name
    std::string base = a.path.substr(a.path.find_last_of('/') + 1);
    if (base.empty())
      return c.Fail(kExitUsage,
                    fmt::format("'{}' names no file to put in directory '{}'", a.path, a.output));
    a.output = (std::filesystem::path(a.output) / base).string();
    in_place = client::WrittenInPlace(a.output);
  }
  std::FILE* out = stdout;
  std::string tmp;
  if (!to_stdout) {
    auto tf = client::OpenTemp(a.output, in_place);
    if (!tf.ok()) return c.Fail(kExitFailed, tf.status().message());
    tmp = tf->second;
    out = ::fdopen(tf->first, "wb");
    if (out == nullptr) {
      int err = errno;
      ::close(tf->first);
      if (!in_place) client::DropTemp(tmp);
      return c.Fail(kExitFailed, fmt::format("cannot open '{}': {}", a.output, std::strerror(err)));
    }
  }
  const std::string shown = to_stdout ? std::string("stdout") : a.output;
  BodySink sink = [&](std::string_view data) -> Status {
    if (std::fwrite(data.data(), 1, data.size(), out) != data.size())
      return Status(Code::kIoError,
                    fmt::format("cannot write {}: {}", shown, std::strerror(errno)));
    return Status::Ok();
  };
  auto r = c.client().Stream(http::verb::post, "/folder/file/fetch",
                             {{"volume", a.volume}, {"vfid", a.vfid}, {"relpath", a.path}}, sink);
  int rc = kExitOk;
  if (!r.ok())
    rc = c.TransportFail(r.status());
  else if (!r->ok())
    rc = c.HttpFail(*r);
  if (to_stdout) {
    if (std::fflush(stdout) != 0 && rc == kExitOk)
      rc = c.Fail(kExitFailed, fmt::format("cannot write stdout: {}", std::strerror(errno)));
    return rc;
  }
  bool write_ok = std::fflush(out) == 0 && (in_place || ::fsync(::fileno(out)) == 0);
  int err = errno;
  write_ok = (std::fclose(out) == 0) && write_ok;
  if (rc == kExitOk && !write_ok)
    rc = c.Fail(kExitFailed, fmt::format("cannot write '{}': {}", a.output, std::strerror(err)));
  if (rc == kExitOk && !in_place && ::rename(tmp.c_str(), a.output.c_str()) != 0)
    rc = c.Fail(kExitFailed,
                fmt::format("cannot rename '{}' to '{}': {}", tmp, a.output, std::strerror(errno)));
  if (!in_place) {
    if (rc != kExitOk)
      client::DropTemp(tmp);
    else
      temp_files::Forget(tmp);
  }
  if (rc != kExitOk) return rc;
  if (c.g.json)
    c.PrintJson({{"status", "ok"}, {"path", a.output}, {"bytes", r->streamed_bytes}});
  else
    c.Say(fmt::format("wrote {} to {}", FormatSizeExact(r->streamed_bytes), a.output));
  return kExitOk;
}

void AddVFolderCommands(CLI::App& app, Args& a, Action* run) {
  auto* vf = Command(&app, "vfolder", "Manage virtual folders (vfolders) and the files in them.",
                     std::string("sluice vfolder ls local ") + kVfidEx);
  vf->require_subcommand(1);

  auto* create = Command(
      vf, "create",
      "Create a vfolder.\n"
      "Its quota scope is created on the way when the daemon allows it\n"
      "(allow-auto-quota-scope-creation); --scope-limit then sets that scope's limit.",
      std::string("sluice vfolder create local ") + kVfidEx + " --mode 750 --scope-limit 100g");
  AddVolume(create, a);
  AddVfid(create, a);
  create->add_option("--mode", a.mode, "permission bits of the vfolder directory, in octal")
      ->check(ModeValidator())
      ->type_name("OCTAL")
      ->capture_default_str();
  create
      ->add_option("--scope-limit", a.scope_limit,
                   "size limit for the quota scope if this creates it: 10g, 512m, 1.5GiB")
      ->check(SizeValidator())
      ->type_name("SIZE");
  OnRun(create, run, [&a](Cli& c) {
    auto parsed = ParseMode(a.mode);  // checked while parsing the arguments
    unsigned mode = parsed.ok() ? *parsed : 0755;
    json body = {{"volume", a.volume}, {"vfid", a.vfid}, {"mode", mode}};
    if (!a.scope_limit.empty())
      body["options"] = {{"initial_max_size_for_quota_scope", SizeArg(a.scope_limit)}};
    int rc = c.Call(http::verb::post, "/folder/create", body, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk(body);
    else
      c.Say(fmt::format("created vfolder {} on {}", a.vfid, a.volume));
    return kExitOk;
  });

  auto* bind =
      Command(vf, "bind",
              "Serve a prefix already on an s3 volume's origin as a read-only vfolder.\n"
              "Nothing is copied: the vfolder lists and reads the keys under PREFIX (of "
              "the\nvolume's bucket), or of another bucket of the origin given as\n"
              "s3://BUCKET/PREFIX/ (s3://BUCKET/: all of it; the volume's credentials "
              "need only\nread it: Sluice writes nothing there). The vfolder is "
              "created, or an empty one\n(say, one the manager just made) is bound. "
              "Deleting it deletes the binding,\nnever the data; a clone copies the "
              "data into a writable vfolder.",
              std::string("sluice vfolder bind datasets ") + kVfidEx + " s3://imagenet/train/");
  AddVolume(bind, a);
  AddVfid(bind, a);
  bind->add_option("PREFIX", a.cache_path,
                   "key prefix in the volume's bucket, ending in '/', or s3://BUCKET[/PREFIX/]")
      ->required();
  OnRun(bind, run, [&a](Cli& c) {
    json body = {{"volume", a.volume}, {"vfid", a.vfid}, {"prefix", a.cache_path}};
    json j;
    int rc = c.Call(http::verb::post, "/folder/bind", body, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintJson(j);
    else
      c.Say(
          fmt::format("bound {} to vfolder {} on {} (read-only)", a.cache_path, a.vfid, a.volume));
    return kExitOk;
  });

  auto* del = Command(vf, "delete",
                      "Delete a vfolder and everything in it.\n"
                      "The daemon detaches it at once and removes the files in a background "
                      "task;\nthis waits for that task unless --no-wait, which prints the task "
                      "id\n(follow it with `sluice task wait`).",
                      std::string("sluice vfolder delete local ") + kVfidEx);
  AddVolume(del, a);
  AddVfid(del, a);
  del->add_flag("--no-wait", a.no_wait, "print the background task id and return at once");
  OnRun(del, run, [&a](Cli& c) {
    return c.RunTask(http::verb::post, "/folder/delete", {{"volume", a.volume}, {"vfid", a.vfid}},
                     a.no_wait, "deleting " + a.vfid,
                     fmt::format("deleted vfolder {} on {}", a.vfid, a.volume));
  });

  auto* clone = Command(vf, "clone",
                        "Copy a vfolder to a new one.\n"
                        "The copy runs on the daemon in a background task, on the same volume "
                        "or\nanother; this waits for it unless --no-wait, which prints the task "
                        "id.",
                        std::string("sluice vfolder clone local ") + kVfidEx + " local " +
                            "user:2ab3c4d5-6e7f-4a8b-9c0d-1e2f3a4b5c6d/"
                            "fedcba9876543210fedcba9876543210");
  clone->add_option("SRC_VOLUME", a.src_volume, "volume of the vfolder to copy")->required();
  clone->add_option("SRC_VFID", a.src_vfid, "the vfolder to copy")->required();
  clone->add_option("DST_VOLUME", a.dst_volume, "volume of the new vfolder")->required();
  clone->add_option("DST_VFID", a.dst_vfid, "the new vfolder's id (must not exist)")->required();
  clone->add_flag("--no-wait", a.no_wait, "print the background task id and return at once");
  OnRun(clone, run, [&a](Cli& c) {
    return c.RunTask(
        http::verb::post, "/folder/clone",
        {{"src_volume", a.src_volume},
         {"src_vfid", a.src_vfid},
         {"dst_volume", a.dst_volume},
         {"dst_vfid", a.dst_vfid}},
        a.no_wait, "cloning " + a.src_vfid,
        fmt::format("cloned {}/{} to {}/{}", a.src_volume, a.src_vfid, a.dst_volume, a.dst_vfid));
  });

  auto* usage = Command(vf, "usage",
                        "Show a vfolder's file count and total size.\n"
                        "On vfs volumes a large vfolder's figure is maintained by Sluice and\n"
                        "re-measured in the background; MEASURED says when. --fresh measures now.",
                        std::string("sluice vfolder usage local ") + kVfidEx);
  AddVolume(usage, a);
  AddVfid(usage, a);
  usage->add_flag("--fresh", a.fresh, "walk the vfolder now instead of using the kept figure");
  OnRun(usage, run, [&a](Cli& c) {
    json j;
    json params = {{"volume", a.volume}, {"vfid", a.vfid}};
    if (a.fresh) params["fresh"] = true;
    int rc = c.Call(http::verb::get, "/folder/usage", params, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    auto files = Uint(j, "file_count");
    std::vector<std::pair<std::string, std::string>> f = {
        {"FILES", files ? std::to_string(*files) : "unknown"},
        {"USED", Uint(j, "used_bytes") ? SizeOrDash(j, "used_bytes") : std::string("unknown")}};
    if (j.contains("age_seconds") && j["age_seconds"].is_number())
      f.emplace_back("MEASURED", fmt::format("{:.0f} s ago", j["age_seconds"].get<double>()));
    PrintFields(stdout, f);
    return kExitOk;
  });

  auto* mount = Command(vf, "mount",
                        "Print a vfolder's path on the storage host.\n"
                        "With SUBPATH, the path of that file or directory inside it.",
                        std::string("sluice vfolder mount local ") + kVfidEx + " data");
  AddVolume(mount, a);
  AddVfid(mount, a);
  mount->add_option("SUBPATH", a.subpath, "a path inside the vfolder")->capture_default_str();
  OnRun(mount, run, [&a](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/folder/mount",
                    {{"volume", a.volume}, {"vfid", a.vfid}, {"subpath", a.subpath}}, &j);
    if (rc != kExitOk) return rc;
    // The daemon answers the vfolder root (Backend.AI's contract) after checking the subpath;
    // the subpath is joined here, as the manager does.
    std::string path = Str(j, "path");
    if (!a.subpath.empty() && a.subpath != ".") path += "/" + a.subpath;
    j["path"] = path;
    if (c.g.json)
      c.PrintJson(j);
    else
      std::printf("%s\n", path.c_str());
    return kExitOk;
  });

  auto* ls = Command(vf, "ls",
                     "List a directory inside a vfolder.\n"
                     "Columns: name (symlinks show their target), type (file, dir, link), "
                     "size\nand modification time in UTC.",
                     std::string("sluice vfolder ls local ") + kVfidEx + " data/train");
  AddVolume(ls, a);
  AddVfid(ls, a);
  ls->add_option("PATH", a.path, "directory inside the vfolder")->capture_default_str();
  ls->add_flag("-b,--bytes", a.bytes, "sizes in bytes instead of KiB/MiB/GiB");
  OnRun(ls, run, [&a](Cli& c) { return List(c, a); });

  auto* mkdir = Command(
      vf, "mkdir",
      "Create directories inside a vfolder.\n"
      "Parents are created too unless --no-parents. Exit status 1 when any of them\n"
      "could not be created (each failure is reported on stderr).",
      std::string("sluice vfolder mkdir local ") + kVfidEx + " data/train data/eval --exist-ok");
  AddVolume(mkdir, a);
  AddVfid(mkdir, a);
  mkdir->add_option("PATH", a.paths, "directories to create, relative to the vfolder")->required();
  mkdir->add_flag("--no-parents", a.no_parents, "fail when a parent directory is missing");
  mkdir->add_flag("--exist-ok", a.exist_ok, "do not fail when a directory already exists");
  OnRun(mkdir, run, [&a](Cli& c) { return Mkdir(c, a); });

  auto* mv = Command(vf, "mv", "Move or rename a file or directory inside a vfolder.",
                     std::string("sluice vfolder mv local ") + kVfidEx + " a.txt old/a.txt");
  AddVolume(mv, a);
  AddVfid(mv, a);
  mv->add_option("SRC", a.src, "the path to move, relative to the vfolder")->required();
  mv->add_option("DST", a.dst, "where it goes, relative to the vfolder")->required();
  OnRun(mv, run, [&a](Cli& c) {
    json body = {
        {"volume", a.volume}, {"vfid", a.vfid}, {"src_relpath", a.src}, {"dst_relpath", a.dst}};
    int rc = c.Call(http::verb::post, "/folder/file/move", body, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json) c.PrintOk(body);
    return kExitOk;
  });

  auto* rm =
      Command(vf, "rm", "Delete files or directories inside a vfolder.\nDirectories need -r.",
              std::string("sluice vfolder rm local ") + kVfidEx + " -r old tmp.txt");
  AddVolume(rm, a);
  AddVfid(rm, a);
  rm->add_option("PATH", a.paths, "paths to delete, relative to the vfolder")->required();
  rm->add_flag("-r,--recursive", a.recursive, "delete directories and everything in them");
  OnRun(rm, run, [&a](Cli& c) {
    json j;
    int rc = c.Call(
        http::verb::post, "/folder/file/delete",
        {{"volume", a.volume}, {"vfid", a.vfid}, {"relpaths", a.paths}, {"recursive", a.recursive}},
        &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) c.PrintJson(j.is_null() ? json{{"status", "ok"}} : j);
    return kExitOk;
  });

  auto* get =
      Command(vf, "get",
              "Download a file from a vfolder.\n"
              "Streamed to stdout, or to FILE with -o: FILE appears whole or not at all.\n"
              "With --json and -o, prints {status, path, bytes}.",
              std::string("sluice vfolder get local ") + kVfidEx + " data/model.bin -o model.bin");
  AddVolume(get, a);
  AddVfid(get, a);
  get->add_option("PATH", a.path, "the file, relative to the vfolder")->required();
  get->add_option("-o,--output", a.output, "write to FILE instead of stdout ('-': stdout)")
      ->type_name("FILE");
  OnRun(get, run, [&a](Cli& c) { return Get(c, a); });
}

// ---- background tasks ------------------------------------------------------------------

void PrintTask(Cli& c, const json& t) {
  std::vector<std::pair<std::string, std::string>> f = {
      {"TASK", Str(t, "task_id")},
      {"KIND", Str(t, "kind")},
      {"STATUS", Str(t, "status")},
      {"CREATED", FormatTime(Str(t, "created_at", "-"))},
      {"STARTED", FormatTime(Str(t, "started_at", "-"))},
      {"FINISHED", FormatTime(Str(t, "finished_at", "-"))}};
  if (t.contains("params") && t["params"].is_object() && !t["params"].empty())
    f.emplace_back("PARAMS",
                   Printable(t["params"].dump(-1, ' ', false, json::error_handler_t::replace)));
  if (t.contains("error") && t["error"].is_object())
    f.emplace_back("ERROR", Printable(Str(t["error"], "msg", "unknown error")));
  PrintFields(stdout, f);
}

// ---- cache ---------------------------------------------------------------------------------

void AddCacheCommands(CLI::App& app, Args& a, Action* run) {
  auto* cache = Command(&app, "cache",
                        "Operate a volume's SSD read cache ([volume.NAME.cache]).\n"
                        "Stats, prewarm a vfolder or a path in it, and evict.",
                        std::string("sluice cache warm datasets ") + kVfidEx + " train/");
  cache->require_subcommand(1);

  auto* stats = Command(cache, "stats",
                        "Show what the cache holds and how it has done.\n"
                        "Blocks and bytes held, hits and misses since the daemon started, bytes "
                        "read\nfrom the origin, evictions, and the options it runs with.",
                        "sluice cache stats datasets");
  AddVolume(stats, a);
  OnRun(stats, run, [&a](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/volume/cache", {{"volume", a.volume}}, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    auto num = [&](const char* k) { return std::to_string(Uint(j, k).value_or(0)); };
    auto size = [&](const char* k) { return FormatSize(Uint(j, k).value_or(0)); };
    const double ratio =
        j.contains("hit_ratio") && j["hit_ratio"].is_number() ? j["hit_ratio"].get<double>() : 0.0;
    std::vector<std::pair<std::string, std::string>> f = {
        {"VOLUME", Printable(a.volume)},
        {"PATH", Printable(Str(j, "path"))},
        {"HELD", fmt::format("{} in {} blocks (max {}, {} kept free on the disk)", size("bytes"),
                             num("blocks"), size("max_size"), size("min_free"))},
        {"HITS", fmt::format("{} ({:.1f}% of {} lookups)", num("hits"), 100 * ratio,
                             Uint(j, "hits").value_or(0) + Uint(j, "misses").value_or(0))},
        {"MISSES", num("misses")},
        {"READ AHEAD", num("read_ahead_blocks") + " blocks (fetched before readers asked)"},
        {"FROM ORIGIN", size("origin_bytes")},
        {"FILLED", size("fill_bytes")},
        {"INGESTED",
         j.value("ingest", false)
             ? fmt::format("{} in {} blocks, as written through this node ({} "
                           "written files not kept)",
                           size("ingested_bytes"), num("ingested_blocks"), num("ingests_dropped"))
             : "off (written files are cached at their first read)"},
        {"EVICTIONS", num("evictions")},
        {"NOT KEPT", num("admission_rejects") + " (admission policy or disk space)"},
        {"TORN BLOCKS", num("torn_blocks")},
        {"STALE OPENS", num("stale_opens") + " (origin unreachable or slow)"},
        {"ORIGIN", j.value("origin_silent", false)
                       ? "silent: no answer within revalidate-timeout; serving what is cached"
                       : "answering"},
        {"POLICY", fmt::format("{}, {}, block {}, ttl {} ms{}", Str(j, "eviction"),
                               Str(j, "admission"), size("block_size"), num("ttl_ms"),
                               j.value("serve_stale", false) ? ", serves stale" : "")},
        {"LISTINGS", fmt::format("{} kept, {} entries (a directory of over {} is listed from "
                                 "the origin: {} listings so far)",
                                 num("listings"), num("listing_entries"), num("max_listing"),
                                 num("listings_passed"))},
        {"INDEX MEMORY", "about " + size("index_bytes_estimate")}};
    PrintFields(stdout, f);
    return kExitOk;
  });

  auto* warm = Command(cache, "warm",
                       "Read a vfolder, or a file or directory in it, into the cache.\n"
                       "Runs on the daemon as a background task, 8 files at a time; this waits "
                       "for it\n(with progress on stderr when it is a terminal) unless "
                       "--no-wait. Every block\nis kept, whatever the admission policy.",
                       std::string("sluice cache warm datasets ") + kVfidEx + " train/");
  AddVolume(warm, a);
  AddVfid(warm, a);
  warm->add_option("PATH", a.cache_path, "a file or directory in the vfolder (default: all of it)");
  warm->add_flag("--no-wait", a.no_wait, "print the background task id and return at once");
  OnRun(warm, run, [&a](Cli& c) {
    return c.RunTask(
        http::verb::post, "/volume/cache/warm",
        {{"volume", a.volume}, {"vfid", a.vfid}, {"path", a.cache_path}}, a.no_wait,
        "warming " + (a.cache_path.empty() ? a.vfid : a.cache_path), [](const json& task) {
          return "warmed " +
                 Cli::ProgressText(task.contains("progress") ? task["progress"] : json::object());
        });
  });

  auto* evict = Command(cache, "evict",
                        "Drop cached blocks: of a vfolder, of a file or directory in it, or "
                        "(--all)\nall of them. The origin is not touched; what is read next is "
                        "fetched again.",
                        std::string("sluice cache evict datasets ") + kVfidEx + " train/");
  AddVolume(evict, a);
  evict->add_option("VFID", a.vfid, "vfolder id whose blocks to drop");
  evict->add_option("PATH", a.cache_path,
                    "a file or directory in the vfolder (default: all of it)");
  evict->add_flag("--all", a.all, "drop every block the cache holds");
  OnRun(evict, run, [&a](Cli& c) {
    if (a.all == !a.vfid.empty())
      return c.Fail(kExitUsage, "name a VFID, or --all for the whole cache (not both)");
    json body = {{"volume", a.volume}};
    if (!a.all) body["vfid"] = a.vfid, body["path"] = a.cache_path;
    json j;
    int rc = c.Call(http::verb::post, "/volume/cache/evict", body, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintJson(j);
    else if (a.all)
      c.Say(fmt::format("evicted {} blocks from {}", Uint(j, "blocks").value_or(0), a.volume));
    else
      c.Say(fmt::format("evicted {} blocks of {} files", Uint(j, "blocks").value_or(0),
                        Uint(j, "files").value_or(0)));
    return kExitOk;
  });
}

void AddTaskCommands(CLI::App& app, Args& a, Action* run) {
  auto* task = Command(&app, "task",
                       "Follow background tasks.\n"
                       "Vfolder delete and clone (and async file delete) run as background "
                       "tasks.",
                       "sluice task wait 5f0c2a9e-1b2c-4d3e-8f90-a1b2c3d4e5f6");
  task->require_subcommand(1);

  auto* show = Command(task, "show",
                       "Show a background task's state.\n"
                       "pending, running, completed or failed (with the error). Exit status 1 "
                       "when\nthe task failed.",
                       "sluice task show 5f0c2a9e-1b2c-4d3e-8f90-a1b2c3d4e5f6");
  show->add_option("TASK_ID", a.task_id, "the id a --no-wait command printed")->required();
  OnRun(show, run, [&a](Cli& c) {
    json t;
    int rc = c.Call(http::verb::get, "/bgtask", {{"task_id", a.task_id}}, &t);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintJson(t);
    else
      PrintTask(c, t);
    return Str(t, "status") == "failed" ? kExitFailed : kExitOk;
  });

  auto* wait = Command(task, "wait",
                       "Wait until a background task completes or fails.\n"
                       "Shows a spinner on stderr when it is a terminal. Exit status 1 when "
                       "the\ntask failed.",
                       "sluice task wait 5f0c2a9e-1b2c-4d3e-8f90-a1b2c3d4e5f6");
  wait->add_option("TASK_ID", a.task_id, "the id a --no-wait command printed")->required();
  OnRun(wait, run, [&a](Cli& c) {
    json t;
    double secs = 0;
    int rc = c.WaitTask(a.task_id, "waiting for " + a.task_id, &t, &secs);
    if (rc != kExitOk) return rc;
    return c.ReportTask(t, fmt::format("task {} completed", Str(t, "kind", "task")), secs);
  });

  auto* list =
      Command(task, "list", "List the background tasks the daemon remembers.", "sluice task list");
  OnRun(list, run, [](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/bgtasks", nullptr, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    Table t({"TASK", "KIND", "STATUS", "CREATED (UTC)", "FINISHED (UTC)"});
    if (j.contains("tasks") && j["tasks"].is_array())
      for (const auto& e : j["tasks"])
        t.AddRow({Str(e, "task_id"), Str(e, "kind"), Str(e, "status"),
                  FormatTime(Str(e, "created_at", "-")), FormatTime(Str(e, "finished_at", "-"))});
    t.Print(stdout);
    return kExitOk;
  });
}

// ---- s3 ----------------------------------------------------------------------------------

void AddS3Commands(CLI::App& app, Args& a, Action* run) {
  auto* s3 = Command(&app, "s3",
                     "The S3 API: users, access keys and bucket names (through the manager\n"
                     "API), and data commands that speak S3 with an access key: ls, cp, sync,\n"
                     "rm, get-batch, bench. Buckets are vfolders; every S3 request is signed\n"
                     "by an access key of a user.",
                     "sluice s3 key create --user alice");
  s3->require_subcommand(1);
  AddS3DataCommands(s3, [run](DataAction fn) {
    g_speaks_s3_only = true;
    *run = [fn = std::move(fn)](Cli& c) {
      return fn(DataGlobals{c.g.json, c.g.insecure, c.g.timeout});
    };
  });

  auto* user = Command(s3, "user", "Manage S3 users.", "sluice s3 user create alice");
  user->require_subcommand(1);
  auto* ucreate = Command(user, "create",
                          "Create an S3 user.\n"
                          "Buckets the user creates become vfolders on VOLUME (default: the "
                          "first\nvolume) in QUOTA_SCOPE (default: user:<uuid derived from ID>).",
                          "sluice s3 user create alice --display-name \"Alice Kim\"");
  ucreate->add_option("ID", a.s3_id, "user id: letters, digits, - _ . @")->required();
  ucreate->add_option("--display-name", a.display_name, "shown as the owner's DisplayName")
      ->type_name("NAME");
  ucreate->add_option("--volume", a.volume, "volume for the user's new buckets")
      ->type_name("VOLUME");
  ucreate->add_option("--quota-scope", a.qsid, "quota scope for the user's new buckets")
      ->type_name("QSID");
  OnRun(ucreate, run, [&a](Cli& c) {
    json body = {{"id", a.s3_id}};
    if (!a.display_name.empty()) body["display_name"] = a.display_name;
    if (!a.volume.empty()) body["volume"] = a.volume;
    if (!a.qsid.empty()) body["quota_scope"] = a.qsid;
    json u;
    int rc = c.Call(http::verb::post, "/s3/users", body, &u);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintJson(u);
    else
      c.Say(fmt::format("created S3 user {} (buckets on {} in {})", a.s3_id,
                        Str(u, "default_volume"), Str(u, "default_scope")));
    return kExitOk;
  });
  auto* ulist = Command(user, "list", "List S3 users.", "sluice s3 user list");
  OnRun(ulist, run, [](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/s3/users", nullptr, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    Table t({"USER", "DISPLAY NAME", "VOLUME", "QUOTA SCOPE"});
    for (const auto& u : j.value("users", json::array()))
      t.AddRow({Str(u, "id"), Str(u, "display_name"), Str(u, "default_volume"),
                Str(u, "default_scope")});
    t.Print(stdout);
    return kExitOk;
  });
  auto* udelete =
      Command(user, "delete", "Delete an S3 user (refused while it has keys or buckets).",
              "sluice s3 user delete alice");
  udelete->add_option("ID", a.s3_id, "user id")->required();
  OnRun(udelete, run, [&a](Cli& c) {
    int rc =
        c.Call(http::verb::delete_, "/s3/users/" + UriEncode(a.s3_id, false), nullptr, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"id", a.s3_id}});
    else
      c.Say(fmt::format("deleted S3 user {}", a.s3_id));
    return kExitOk;
  });

  auto* key = Command(s3, "key", "Manage S3 access keys.", "sluice s3 key create --user alice");
  key->require_subcommand(1);
  auto* kcreate = Command(key, "create",
                          "Create an access key for a user; the secret is shown this once.\n"
                          "--access-key and --secret-key import an existing pair (from RGW or "
                          "MinIO).",
                          "sluice s3 key create --user alice --bucket datasets --read-only");
  kcreate->add_option("--user", a.user, "the key's user")->required()->type_name("ID");
  kcreate->add_option("--access-key", a.access_key, "import: the access key id")->type_name("AK");
  kcreate->add_option("--secret-key", a.secret_key, "import: the secret key")->type_name("SK");
  kcreate->add_option("--bucket", a.buckets, "limit the key to this bucket (repeatable)")
      ->type_name("NAME");
  kcreate->add_flag("--read-only", a.read_only, "the key may read, never write");
  OnRun(kcreate, run, [&a](Cli& c) {
    if (a.access_key.empty() != a.secret_key.empty())
      return c.Fail(kExitUsage, "give both --access-key and --secret-key, or neither");
    json body = {{"user", a.user}, {"read_only", a.read_only}, {"buckets", a.buckets}};
    if (!a.access_key.empty()) {
      body["access_key"] = a.access_key;
      body["secret_key"] = a.secret_key;
    }
    json k;
    int rc = c.Call(http::verb::post, "/s3/keys", body, &k);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(k);
    } else {
      std::printf("access key: %s\nsecret key: %s\n", Str(k, "access_key").c_str(),
                  Str(k, "secret_key").c_str());
      c.Say("the secret key is not shown again");
    }
    return kExitOk;
  });
  auto* klist = Command(key, "list", "List access keys (never their secrets).",
                        "sluice s3 key list --user alice");
  klist->add_option("--user", a.user, "only this user's keys")->type_name("ID");
  OnRun(klist, run, [&a](Cli& c) {
    json j;
    std::string path = "/s3/keys";
    if (!a.user.empty()) path += "?user=" + UriEncode(a.user, false);
    int rc = c.Call(http::verb::get, path, nullptr, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    Table t({"ACCESS KEY", "USER", "ACCESS", "BUCKETS"});
    for (const auto& k : j.value("keys", json::array())) {
      std::string bs;
      for (const auto& b : k.value("buckets", json::array()))
        bs += (bs.empty() ? "" : ",") + b.get<std::string>();
      t.AddRow({Str(k, "access_key"), Str(k, "user"),
                k.value("read_only", false) ? "read-only" : "read-write",
                bs.empty() ? "(own buckets)" : bs});
    }
    t.Print(stdout);
    return kExitOk;
  });
  auto* krevoke =
      Command(key, "revoke", "Revoke an access key: refused by every node within seconds.",
              "sluice s3 key revoke SLUABCDEFGHIJKLMNOPQ");
  krevoke->add_option("ACCESS_KEY", a.access_key, "the access key id")->required();
  OnRun(krevoke, run, [&a](Cli& c) {
    int rc =
        c.Call(http::verb::delete_, "/s3/keys/" + UriEncode(a.access_key, false), nullptr, nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"access_key", a.access_key}});
    else
      c.Say(fmt::format("revoked access key {}", a.access_key));
    return kExitOk;
  });

  auto* bucket =
      Command(s3, "bucket", "Manage bucket names.",
              std::string("sluice s3 bucket bind datasets local ") + kVfidEx + " --owner alice");
  bucket->require_subcommand(1);
  auto* bind =
      Command(bucket, "bind",
              "Serve an existing vfolder as bucket NAME, owned by an S3 user.\n"
              "Deleting the bucket later unbinds the name and keeps the vfolder.",
              std::string("sluice s3 bucket bind datasets local ") + kVfidEx + " --owner alice");
  bind->add_option("NAME", a.bucket_name, "bucket name (S3 naming rules)")->required();
  AddVolume(bind, a);
  AddVfid(bind, a);
  bind->add_option("--owner", a.owner, "the S3 user who owns the bucket")
      ->required()
      ->type_name("ID");
  OnRun(bind, run, [&a](Cli& c) {
    json b;
    int rc = c.Call(
        http::verb::post, "/s3/buckets",
        {{"name", a.bucket_name}, {"volume", a.volume}, {"vfid", a.vfid}, {"owner", a.owner}}, &b);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintJson(b);
    else
      c.Say(fmt::format("bucket {} now serves vfolder {} on {}", a.bucket_name, a.vfid, a.volume));
    return kExitOk;
  });
  auto* blist =
      Command(bucket, "list", "List buckets and the vfolders they are.", "sluice s3 bucket list");
  OnRun(blist, run, [](Cli& c) {
    json j;
    int rc = c.Call(http::verb::get, "/s3/buckets", nullptr, &j);
    if (rc != kExitOk) return rc;
    if (c.g.json) {
      c.PrintJson(j);
      return kExitOk;
    }
    Table t({"BUCKET", "OWNER", "VOLUME", "VFOLDER"});
    for (const auto& b : j.value("buckets", json::array()))
      t.AddRow({Str(b, "name"), Str(b, "owner"), Str(b, "volume"), Str(b, "vfid")});
    t.Print(stdout);
    return kExitOk;
  });
  auto* unbind = Command(bucket, "unbind", "Remove a bucket name; the vfolder and its files stay.",
                         "sluice s3 bucket unbind datasets");
  unbind->add_option("NAME", a.bucket_name, "bucket name")->required();
  OnRun(unbind, run, [&a](Cli& c) {
    int rc = c.Call(http::verb::delete_, "/s3/buckets/" + UriEncode(a.bucket_name, false), nullptr,
                    nullptr);
    if (rc != kExitOk) return rc;
    if (c.g.json)
      c.PrintOk({{"name", a.bucket_name}});
    else
      c.Say(fmt::format("unbound bucket {}", a.bucket_name));
    return kExitOk;
  });
}

}  // namespace

int RunCli(int argc, char** argv) {
  CLI::App app{
      "sluice: command-line client for the Sluice storage proxy.\n\n"
      "Talks to a running sluiced over its manager-facing API (the Backend.AI storage-proxy\n"
      "API): volumes, quota scopes, vfolders, files and background tasks. Tables for people by\n"
      "default, the daemon's JSON with --json.",
      "sluice"};
  app.formatter(std::make_shared<HelpFormatter>());
  app.get_formatter()->column_width(26);
  app.fallthrough();
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "print help for every command and exit");

  Cli cli;
  Globals& g = cli.g;
  if (const char* env = std::getenv("SLUICE_ENDPOINT"); env != nullptr && *env != '\0')
    g.endpoint = env;
  app.add_option("--endpoint", g.endpoint,
                 "daemon URL, http(s)://host:port (default: $SLUICE_ENDPOINT, else " +
                     std::string(kDefaultEndpoint) + ")")
      ->type_name("URL");
  auto* token_opt = app.add_option("--token", g.token,
                                   "manager token ([api.manager] secret; see Connection below)")
                        ->type_name("TOKEN");
  auto* token_file_opt =
      app.add_option("--token-file", g.token_file,
                     "file holding the manager token (default: " + std::string(kDefaultTokenFile) +
                         " if it exists)")
          ->type_name("FILE");
  app.add_flag("--json", g.json,
               "machine-readable output: the daemon's JSON answer ({\"status\": \"ok\", ...} "
               "when it sends none)");
  app.add_option(
         "--timeout", g.timeout,
         "seconds to wait for each network step (connect, send, every read) before giving up")
      ->type_name("SECONDS")
      ->capture_default_str();
  app.add_flag("--insecure", g.insecure, "https: do not verify the daemon's certificate");
  app.add_flag_callback(
      "-V,--version",
      [] {
        std::printf("sluice %s\n", SLUICE_VERSION);
        throw CLI::Success();
      },
      "print the version and exit");

  Args args;
  Action action;
  AddVolumeCommands(app, args, &action);
  AddScopeCommands(app, args, &action);
  AddVFolderCommands(app, args, &action);
  AddTaskCommands(app, args, &action);
  AddCacheCommands(app, args, &action);
  AddS3Commands(app, args, &action);
  app.footer(kRootFooter);
  // Positionals are named in capitals already; "TEXT" after each name adds nothing.
  std::function<void(CLI::App*)> untype = [&](CLI::App* sub) {
    for (CLI::Option* o : sub->get_options())
      if (o->get_positional() && o->get_lnames().empty() && o->get_snames().empty())
        o->type_name("");
    for (CLI::App* child : sub->get_subcommands({})) untype(child);
  };
  untype(&app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (!action) {
    std::fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  cli.token_given = token_opt->count() > 0;
  cli.token_file_given = token_file_opt->count() > 0;
  if (g_speaks_s3_only && !(cli.g.timeout > 0))
    return cli.Fail(kExitUsage, "--timeout must be positive");
  int rc = g_speaks_s3_only ? kExitOk : cli.Init();
  if (rc != kExitOk) return rc;
  try {
    return action(cli);
  } catch (const std::exception& e) {
    return cli.Fail(kExitFailed, fmt::format("unexpected error: {}", e.what()));
  }
}

}  // namespace sluice::cli
