#include "cli/s3_data.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/output.h"
#include "client/read_bench.h"
#include "client/transfer.h"
#include "common/config.h"

namespace sluice::cli {

namespace {

using client::S3Url;
using client::TransferStats;
using json = nlohmann::json;

constexpr const char* kDefaultS3Endpoint = "http://127.0.0.1:6024";

constexpr const char* kConnFooter = R"(Connection (S3, SigV4):
  The endpoint comes from --s3-endpoint, else $SLUICE_S3_ENDPOINT, $AWS_ENDPOINT_URL_S3 or
  $AWS_ENDPOINT_URL, else http://127.0.0.1:6024 (sluiced's S3 listener). The key pair comes
  from --access-key/--secret-key, else $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY (make one
  with `sluice s3 key create --user ID`). The region: --region, $AWS_REGION, us-east-1.
  The global --insecure and --timeout apply; --json changes what `ls` prints.)";

struct DataArgs {
  std::string endpoint, access_key, secret_key, region, ca_file;
  int jobs = 8;
  bool recursive = false, dry_run = false, quiet = false, progress = false, no_progress = false;
  bool no_resume = false, delete_extra = false, continue_on_error = false, no_checksum = false;
  std::string part_size = "16MiB", threshold = "64MiB";
  std::string src, dst, url;
  std::vector<std::string> keys;
  std::string keys_from, output, extract;
  int epochs = 1;
  bool shuffle = false;
  std::string addressing = "path";
};

std::string Env(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v != nullptr && *v != '\0') return v;
  return {};
}

int ExitFor(const Status& st) {
  // A local file's EACCES (an errno) is no refusal of the credentials (5): a plain failure.
  if (st.code() == Code::kPermissionDenied && st.has_sys_errno()) return kExitFailed;
  switch (st.code()) {
    case Code::kNotFound:
      return kExitNotFound;
    case Code::kPermissionDenied:
    case Code::kUnauthenticated:
      return kExitAuth;
    case Code::kUnavailable:
      return kExitUnavailable;
    case Code::kConflict:
    case Code::kAlreadyExists:
    case Code::kNotEmpty:
      return kExitConflict;
    case Code::kInvalidArgument:
    case Code::kInvalidPath:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

int Fail(const Status& st) {
  std::fprintf(stderr, "sluice: %s\n", st.message().c_str());
  return ExitFor(st);
}

// Sizes as every other sluice command takes them (ParseBinarySize: 16MiB, 16m, 1.5GiB, ...).
Result<uint64_t> ParseSize(const std::string& s, const char* what) {
  auto r = ParseBinarySize(s);
  if (!r.ok())
    return Status(Code::kInvalidArgument, fmt::format("{}: {}", what, r.status().message()));
  return r;
}

// Draws a progress line on stderr while a transfer runs.
class ProgressLine {
 public:
  ProgressLine(TransferStats* st, bool on, const char* verb) : st_(st), on_(on), verb_(verb) {
    t0_ = std::chrono::steady_clock::now();
    if (on_) thread_ = std::thread([this] { Loop(); });
  }
  ~ProgressLine() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // The last frame stays, with the totals, above the summary line.
    std::lock_guard<std::mutex> g(mu_);
    Draw();
    std::fputs("\n", stderr);
    drawn_ = false;
  }
  // Prints a line (on stdout: an action; on stderr: a failure) without tearing the progress
  // line.
  void Say(const std::string& line, std::FILE* out = stdout) {
    std::lock_guard<std::mutex> g(mu_);
    if (drawn_) {
      std::fputs("\r\033[K", stderr);
      drawn_ = false;
    }
    std::fprintf(out, "%s\n", Printable(line).c_str());
    std::fflush(out);
  }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(250), [this] { return stop_; })) Draw();
  }
  void Draw() {
    uint64_t done = st_->bytes_done, total = st_->bytes_total;
    double secs = Seconds();
    std::string line;
    if (st_->planning) {
      line = fmt::format("{}: listing... ({:.0f}s)", verb_, secs);
    } else {
      // By bytes when their total is known; else by files (a batch get, a delete: their
      // sizes are not known ahead), the bytes then without a total.
      const uint64_t files = st_->files_done + st_->files_failed, nfiles = st_->files_total;
      const double part = total    ? static_cast<double>(done) / static_cast<double>(total)
                          : nfiles ? static_cast<double>(files) / static_cast<double>(nfiles)
                                   : 1.0;
      int pct = static_cast<int>(100.0 * std::min(part, 1.0));
      constexpr int kBar = 20;
      int fill = pct * kBar / 100;
      double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
      line = fmt::format("[{}{}] {:3d}% {}{}  {}/s  {}/{} files", std::string(fill, '#'),
                         std::string(kBar - fill, '.'), pct, FormatSize(done),
                         total ? " / " + FormatSize(total) : std::string(),
                         FormatSize(static_cast<uint64_t>(rate)), files, nfiles);
      if (st_->files_failed) line += fmt::format(", {} failed", st_->files_failed.load());
      if (rate > 0 && total > done)
        line += fmt::format("  ETA {:.0f}s", static_cast<double>(total - done) / rate);
    }
    struct winsize ws {};
    size_t cols = ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
    if (line.size() >= cols) line.resize(cols - 1);
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  TransferStats* st_;
  bool on_;
  const char* verb_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, drawn_ = false;
  std::thread thread_;
};

void AddConnection(CLI::App* sub, DataArgs& a) {
  sub->add_option("--s3-endpoint", a.endpoint, "S3 endpoint URL (see Connection below)")
      ->type_name("URL");
  sub->add_option("--access-key", a.access_key, "access key id")->type_name("AK");
  sub->add_option("--secret-key", a.secret_key, "secret access key")->type_name("SK");
  sub->add_option("--region", a.region, "SigV4 region")->type_name("REGION");
  sub->add_option("--ca-file", a.ca_file, "https: trust these PEM certificates ($AWS_CA_BUNDLE)")
      ->type_name("FILE");
  sub->add_option("-j,--jobs", a.jobs, "parallel requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--addressing", a.addressing,
                  "path (host/bucket/key) or virtual (bucket.host/key, as AWS and GCS prefer)")
      ->capture_default_str()
      ->check(CLI::IsMember({"path", "virtual"}));
}

void AddTransferFlags(CLI::App* sub, DataArgs& a) {
  sub->add_flag("--dry-run", a.dry_run, "print what would be done, do nothing");
  sub->add_flag("-q,--quiet", a.quiet, "print only errors");
  sub->add_flag("--progress", a.progress, "draw the progress line even when stderr is no terminal");
  sub->add_flag("--no-progress", a.no_progress, "never draw the progress line");
}

void AddUploadFlags(CLI::App* sub, DataArgs& a) {
  sub->add_option("--part-size", a.part_size, "multipart part size (5MiB to 5GiB)")
      ->capture_default_str()
      ->type_name("SIZE");
  sub->add_option("--multipart-threshold", a.threshold,
                  "files at least this big go in parallel parts")
      ->capture_default_str()
      ->type_name("SIZE");
  sub->add_flag("--no-resume", a.no_resume,
                "do not keep or reuse the state of unfinished multipart uploads");
  sub->add_flag("--no-checksum", a.no_checksum,
                "send no x-amz-checksum-crc32c (servers without checksum support)");
}

Result<io::s3::ClientOptions> Connection(const DataArgs& a, const DataGlobals& g) {
  io::s3::ClientOptions o;
  o.endpoint = !a.endpoint.empty()
                   ? a.endpoint
                   : Env({"SLUICE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"});
  if (o.endpoint.empty()) o.endpoint = kDefaultS3Endpoint;
  o.creds.access_key = !a.access_key.empty() ? a.access_key : Env({"AWS_ACCESS_KEY_ID"});
  o.creds.secret_key = !a.secret_key.empty() ? a.secret_key : Env({"AWS_SECRET_ACCESS_KEY"});
  o.creds.region = !a.region.empty() ? a.region : Env({"AWS_REGION", "AWS_DEFAULT_REGION"});
  if (o.creds.region.empty()) o.creds.region = "us-east-1";
  o.insecure = g.insecure;
  o.ca_file = !a.ca_file.empty() ? a.ca_file : Env({"AWS_CA_BUNDLE"});
  o.stall_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(1.0, g.timeout) * 1000));
  o.connect_timeout = std::min(o.connect_timeout, o.stall_timeout);
  o.min_speed = 1;  // a person's link may be slow: only a transfer that stops is abandoned
  o.checksums = !a.no_checksum;
  o.virtual_hosted = a.addressing == "virtual";
  Status st = io::s3::S3Client::Validate(o);
  if (!st.ok()) {
    if (o.creds.access_key.empty() || o.creds.secret_key.empty())
      return Status(Code::kInvalidArgument,
                    "no S3 credentials: give --access-key and --secret-key or set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
    return st;
  }
  return o;
}

bool ProgressOn(const DataArgs& a) {
  if (a.no_progress || a.quiet || a.dry_run) return false;
  return a.progress || ::isatty(STDERR_FILENO) == 1;
}

// Valid until the next call on this thread.
std::string_view DateText(std::time_t t) {
  // Keys listed together mostly share their second: the last one formatted is kept.
  thread_local std::optional<std::time_t> last;
  thread_local char buf[32];
  thread_local size_t len = 0;
  if (t != last) {
    struct tm tm {};
    gmtime_r(&t, &tm);
    len = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    last = t;
  }
  return {buf, len};
}

std::string Date(std::time_t t) {
  return std::string(DateText(t));
}

int RunTransfer(DataArgs& a, const DataGlobals& g, const char* verb,
                const std::function<Result<client::TransferResult>(client::Transfer&)>& body) {
  auto conn = Connection(a, g);
  if (!conn.ok()) return Fail(conn.status());
  client::TransferOptions o;
  o.s3 = *conn;
  o.jobs = a.jobs;
  auto ps = ParseSize(a.part_size, "--part-size");
  if (!ps.ok()) return Fail(ps.status());
  auto th = ParseSize(a.threshold, "--multipart-threshold");
  if (!th.ok()) return Fail(th.status());
  if (*ps < (5u << 20) || *ps > (5ULL << 30))
    return Fail(Status(Code::kInvalidArgument, "--part-size must be 5MiB to 5GiB (S3's parts)"));
  o.part_size = *ps;
  o.multipart_threshold = std::max<uint64_t>(*th, 1);
  o.resume = !a.no_resume;
  o.dry_run = a.dry_run;
  o.delete_extra = a.delete_extra;
  client::Transfer t(o);
  ProgressLine progress(&t.stats(), ProgressOn(a), verb);
  bool quiet = a.quiet;
  // `cp s3://... -`: stdout carries the object, so what is said goes to stderr.
  const bool data_on_stdout = std::string(verb) == "cp" && client::IsStdout(a.dst);
  t.set_say([&progress, quiet, data_on_stdout](const std::string& line) {
    bool failure = line.rfind("failed", 0) == 0 || line.rfind("delete failed", 0) == 0;
    if (failure)
      progress.Say("sluice: " + line, stderr);
    else if (line.rfind("warning:", 0) == 0)  // not an action line: said also with -q
      progress.Say("sluice: " + line, stderr);
    else if (!quiet && line.rfind("skip:", 0) == 0)
      progress.Say("sluice: " + line, stderr);  // a warning: what was not copied, and why
    else if (!quiet)
      progress.Say(line, data_on_stdout ? stderr : stdout);
  });
  auto r = body(t);
  progress.Stop();
  // `cp s3://b/k - | head`: the reader went away, which ends a pipeline's writer by SIGPIPE
  // (ignored by the s3 commands, so raised here), not by an error message.
  if (t.stats().stdout_closed) {
    ::signal(SIGPIPE, SIG_DFL);
    ::raise(SIGPIPE);
  }
  if (!r.ok()) return Fail(r.status());
  auto& s = t.stats();
  if (!a.quiet && !a.dry_run) {
    double secs = progress.Seconds();
    std::string line = fmt::format(
        "{}: {} files, {} in {:.1f}s ({}/s)", verb, s.files_done.load(), FormatSize(s.bytes_done),
        secs,
        FormatSize(static_cast<uint64_t>(secs > 0 ? static_cast<double>(s.bytes_done) / secs : 0)));
    if (s.files_skipped) line += fmt::format(", {} up to date or skipped", s.files_skipped.load());
    if (s.parts_reused) line += fmt::format(", {} parts reused", s.parts_reused.load());
    if (s.retries) line += fmt::format(", {} retries", s.retries.load());
    if (s.files_failed) line += fmt::format(", {} FAILED", s.files_failed.load());
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  // Failures that agree say why by the exit status, as a failure before any transfer does
  // (3: not found, 5: refused credentials, 6: unreachable); mixed ones exit 1.
  if (r->ok()) return kExitOk;
  const Code shared = r->SharedCode();
  const bool told = shared == Code::kNotFound || shared == Code::kPermissionDenied ||
                    shared == Code::kUnauthenticated || shared == Code::kUnavailable;
  return told ? ExitFor(Status(shared, "")) : kExitFailed;
}

}  // namespace

void AddS3DataCommands(CLI::App* s3, const std::function<void(DataAction)>& set_action) {
  static DataArgs a;
  a = DataArgs{};
  auto command = [&](const std::string& name, const std::string& desc, const std::string& ex) {
    CLI::App* sub = s3->add_subcommand(name, desc);
    sub->footer("Example:\n  " + ex + "\n\n" + kConnFooter);
    AddConnection(sub, a);
    return sub;
  };
  auto on_run = [&](CLI::App* sub, DataAction fn) {
    sub->callback([set_action, fn = std::move(fn)] {
      ::signal(SIGPIPE, SIG_IGN);  // a closed pipe is an EPIPE error, not the end of us
      set_action(fn);
    });
  };

  auto* ls = command("ls",
                     "List buckets, or the keys under an s3:// prefix.\n"
                     "Without --recursive one level is shown: common prefixes as PRE lines.\n"
                     "A recursive listing with --jobs > 1 splits the key space (Sluice's\n"
                     "list-split) and lists the ranges in parallel, still in key order.",
                     "sluice s3 ls --recursive s3://datasets/train/");
  ls->add_option("URL", a.url, "s3://BUCKET[/PREFIX]; none lists the buckets");
  ls->add_flag("-r,--recursive", a.recursive, "every key below the prefix");
  on_run(ls, [](const DataGlobals& g) {
    auto conn = Connection(a, g);
    if (!conn.ok()) return Fail(conn.status());
    if (a.url.empty()) {
      io::s3::S3Client c(*conn);
      auto b = c.ListBuckets();
      if (!b.ok()) return Fail(b.status());
      json out = json::array();
      for (const auto& x : *b) {
        if (g.json)
          out.push_back({{"name", x.name}, {"created", Date(x.created)}});
        else
          std::printf("%s  %s\n", Date(x.created).c_str(), Printable(x.name).c_str());
      }
      if (g.json)
        std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
      return kExitOk;
    }
    auto url = S3Url::Parse(a.url);
    if (!url.ok()) return Fail(url.status());
    // --json prints the array as the listing comes, one element a line, so its memory does not
    // grow with the bucket. A listing that fails midway leaves the array unclosed: a parser
    // refuses it rather than take a part for the whole.
    size_t elements = 0;
    auto element = [&elements](const json& j) {
      std::printf("%s%s", elements++ ? ",\n  " : "[\n  ",
                  j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    };
    // A reader that went away (`| head`) ends the listing as it ends coreutils' ls: by
    // SIGPIPE (ignored by the s3 commands, so raised here), not after every page was fetched.
    auto printed = [] {
      if (!std::ferror(stdout) || errno != EPIPE) return;
      ::signal(SIGPIPE, SIG_DFL);
      ::raise(SIGPIPE);
    };
    // Lines are formatted into one buffer and written 64 KiB at a time: a printf per key made
    // the printing of a split listing's last ranges, after their fetch, its longest step.
    std::string lines;
    auto flush = [&] {
      if (lines.empty()) return;
      std::fwrite(lines.data(), 1, lines.size(), stdout);
      lines.clear();
      printed();
    };
    auto line_done = [&] {
      lines += '\n';
      if (lines.size() >= (64 << 10)) flush();
    };
    Status st = client::ListKeys(
        *conn, *url, a.recursive, a.jobs,
        [&](const io::s3::ObjectInfo& o) {
          if (g.json) {
            element({{"key", o.key},
                     {"size", o.size},
                     {"etag", o.etag},
                     {"last_modified", Date(o.mtime)}});
            return printed();
          }
          fmt::format_to(std::back_inserter(lines), "{} {:>10} ", DateText(o.mtime), o.size);
          AppendPrintable(lines, o.key);
          line_done();
        },
        [&](const std::string& p) {
          if (g.json) {
            element({{"prefix", p}});
            return printed();
          }
          fmt::format_to(std::back_inserter(lines), "{:>30} ", "PRE");
          AppendPrintable(lines, p);
          line_done();
        });
    flush();
    if (!st.ok()) {
      if (elements) std::printf("\n");
      std::fflush(stdout);
      return Fail(st);
    }
    if (g.json) std::printf(elements ? "\n]\n" : "[]\n");
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      printed();
      return Fail(Status::FromErrno(errno, "cannot write the listing to stdout"));
    }
    return kExitOk;
  });

  auto* cp = command("cp",
                     "Copy a file or directory to S3, or an object or prefix from it.\n"
                     "Large files go as multipart uploads of parallel parts, resumable: run\n"
                     "the same command again after a failure and the parts already uploaded\n"
                     "are reused (size and CRC32C checked). Downloads land in a temporary file\n"
                     "renamed into place, with the object's modification time. '-' as SRC\n"
                     "uploads stdin (one PUT, or a multipart upload of --part-size parts once\n"
                     "it is longer than one); '-' as DST writes the object to stdout.",
                     "sluice s3 cp --recursive ./images s3://datasets/images/");
  cp->add_option("SRC", a.src, "local path or s3://BUCKET/KEY")->required();
  cp->add_option("DST", a.dst, "s3://BUCKET/KEY or local path")->required();
  cp->add_flag("-r,--recursive", a.recursive, "copy a directory / every key under a prefix");
  AddTransferFlags(cp, a);
  AddUploadFlags(cp, a);
  on_run(cp, [](const DataGlobals& g) {
    return RunTransfer(a, g, "cp",
                       [](client::Transfer& t) { return t.Copy(a.src, a.dst, a.recursive); });
  });

  auto* sync = command("sync",
                       "Make an S3 prefix match a local directory, or the other way.\n"
                       "Copies what is missing at the destination, differs in size, or is newer\n"
                       "at the source; --delete also removes what the source does not have.",
                       "sluice s3 sync ./checkpoints s3://models/run-17/ --delete");
  sync->add_option("SRC", a.src, "local directory or s3://BUCKET/PREFIX")->required();
  sync->add_option("DST", a.dst, "s3://BUCKET/PREFIX or local directory")->required();
  sync->add_flag("--delete", a.delete_extra, "remove what is not at the source");
  AddTransferFlags(sync, a);
  AddUploadFlags(sync, a);
  on_run(sync, [](const DataGlobals& g) {
    return RunTransfer(a, g, "sync", [](client::Transfer& t) { return t.Sync(a.src, a.dst); });
  });

  auto* rm = command("rm",
                     "Delete an object, or every key under a prefix (--recursive).\n"
                     "Keys go in batched DeleteObjects requests, in parallel.",
                     "sluice s3 rm --recursive s3://scratch/tmp/");
  rm->add_option("URL", a.url, "s3://BUCKET/KEY or s3://BUCKET/PREFIX")->required();
  rm->add_flag("-r,--recursive", a.recursive, "every key under the prefix");
  AddTransferFlags(rm, a);
  on_run(rm, [](const DataGlobals& g) {
    auto url = S3Url::Parse(a.url);
    if (!url.ok()) return Fail(url.status());
    return RunTransfer(a, g, "rm",
                       [&](client::Transfer& t) { return t.Remove(*url, a.recursive); });
  });

  auto* gb = command("get-batch",
                     "Fetch many objects in one request (Sluice's batch get) as one TAR stream.\n"
                     "Keys come as arguments and/or from --keys-from (one per line, '-' for\n"
                     "stdin); a key may be s3://OTHER/KEY. The stream is written to -o (a TAR\n"
                     "file, '-' for stdout) or extracted below -x as it arrives. With\n"
                     "--continue-on-error missing objects do not stop the batch; the exit\n"
                     "status is 1 when any item failed. Either way the stream's entries are\n"
                     "checked and a summary printed on stderr (--json: as JSON, on stdout\n"
                     "unless the stream goes there).",
                     "sluice s3 get-batch s3://datasets --keys-from shard-0.txt -x ./shard-0");
  gb->add_option("BUCKET", a.url, "s3://BUCKET the keys are in")->required();
  gb->add_option("KEY", a.keys, "keys to get, in order");
  gb->add_option("--keys-from", a.keys_from, "file with one key per line ('-': stdin)")
      ->type_name("FILE");
  auto* out =
      gb->add_option("-o,--output", a.output, "TAR file to write ('-': stdout)")->type_name("FILE");
  auto* ext =
      gb->add_option("-x,--extract", a.extract, "extract the entries below DIR")->type_name("DIR");
  out->excludes(ext);
  gb->add_flag("--continue-on-error", a.continue_on_error,
               "missing or unreadable items become placeholders; the batch goes on");
  AddTransferFlags(gb, a);
  on_run(gb, [](const DataGlobals& g) {
    auto conn = Connection(a, g);
    if (!conn.ok()) return Fail(conn.status());
    auto url = S3Url::Parse(a.url);
    if (!url.ok()) return Fail(url.status());
    std::vector<std::string> keys = a.keys;
    if (!url->key.empty())
      return Fail(Status(Code::kInvalidArgument, "name the bucket only: s3://BUCKET"));
    if (!a.keys_from.empty()) {
      std::ifstream f;
      std::istream* in = &std::cin;
      if (a.keys_from != "-") {
        f.open(a.keys_from);
        if (!f)
          return Fail(
              Status(Code::kInvalidArgument,
                     fmt::format("cannot read '{}': {}", a.keys_from, std::strerror(errno))));
        in = &f;
      }
      for (std::string line; std::getline(*in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) keys.push_back(line);
      }
    }
    if (a.output.empty() && a.extract.empty())
      return Fail(Status(Code::kInvalidArgument, "give -o FILE (or -o - for stdout) or -x DIR"));
    if (a.extract.empty() && (a.output.empty() || client::IsStdout(a.output)) &&
        ::isatty(STDOUT_FILENO))
      return Fail(Status(Code::kInvalidArgument, "refusing to write a TAR stream to a terminal"));
    if (a.dry_run) {
      for (const auto& k : keys)
        std::fprintf(stderr, "(dry run) get: %s\n",
                     Printable(client::S3Url::Is(k) ? k : "s3://" + url->bucket + "/" + k).c_str());
      return kExitOk;
    }
    client::BatchGetOptions bo;
    bo.continue_on_error = a.continue_on_error;
    bo.output = a.output;
    bo.extract_dir = a.extract;
    TransferStats stats;
    ProgressLine progress(&stats, ProgressOn(a), "get-batch");
    auto r = client::BatchGet(*conn, url->bucket, keys, bo, &stats);
    progress.Stop();
    if (!r.ok()) return Fail(r.status());
    if (g.json) {
      json out = {{"items", keys.size()}, {"bytes", r->bytes},   {"entries", r->entries},
                  {"ok", r->ok},          {"errors", r->errors}, {"seconds", progress.Seconds()}};
      // stdout carries the stream with -o - (or -o /dev/stdout): the summary goes to stderr.
      bool stream_on_stdout = a.extract.empty() && (a.output.empty() || client::IsStdout(a.output));
      std::fprintf(stream_on_stdout ? stderr : stdout, "%s\n", out.dump().c_str());
    } else if (!a.quiet) {
      std::fprintf(
          stderr, "get-batch: %zu items, %s in %.1fs, %llu %s, %llu ok, %llu failed\n", keys.size(),
          FormatSize(r->bytes).c_str(), progress.Seconds(),
          static_cast<unsigned long long>(r->entries), a.extract.empty() ? "received" : "extracted",
          static_cast<unsigned long long>(r->ok), static_cast<unsigned long long>(r->errors));
    }
    return r->errors > 0 ? kExitFailed : kExitOk;
  });

  auto* bench = command("bench",
                        "Read every object under an s3:// prefix as a training job does: one\n"
                        "listing, then each object read once per epoch by --jobs parallel GETs,\n"
                        "the bytes counted and dropped (nothing is written). Prints each epoch's\n"
                        "objects/s, bytes/s and GET latency (median, 99th percentile, worst);\n"
                        "--json prints them as JSON. Fails when an object cannot be read or\n"
                        "its length is not the listing's. Works against any S3 server.",
                        "sluice s3 bench -j 32 --epochs 2 s3://datasets/train/");
  bench->add_option("URL", a.url, "s3://BUCKET[/PREFIX] to read")->required();
  bench->add_option("--epochs", a.epochs, "passes over the prefix")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  bench->add_flag("--shuffle", a.shuffle, "a new random order each epoch (seeded, repeatable)");
  on_run(bench, [](const DataGlobals& g) {
    auto conn = Connection(a, g);
    if (!conn.ok()) return Fail(conn.status());
    auto url = S3Url::Parse(a.url);
    if (!url.ok()) return Fail(url.status());
    client::ReadBenchOptions bo;
    bo.jobs = a.jobs;
    bo.epochs = a.epochs;
    bo.shuffle = a.shuffle;
    json out = json::array();
    auto r = client::ReadEpochs(*conn, *url, bo, [&](int epoch, const client::EpochStats& e) {
      const double secs = e.seconds > 0 ? e.seconds : 1e-9;
      if (g.json) {
        out.push_back({{"epoch", epoch},
                       {"objects", e.objects},
                       {"bytes", e.bytes},
                       {"seconds", e.seconds},
                       {"objects_per_second", static_cast<double>(e.objects) / secs},
                       {"bytes_per_second", static_cast<double>(e.bytes) / secs},
                       {"latency_ms", {{"p50", e.p50_ms}, {"p99", e.p99_ms}, {"max", e.max_ms}}}});
        return;
      }
      std::printf(
          "epoch %d: %llu objects, %s in %.2fs: %.0f objects/s, %s/s; GET latency "
          "p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
          epoch, static_cast<unsigned long long>(e.objects), FormatSize(e.bytes).c_str(), e.seconds,
          static_cast<double>(e.objects) / secs,
          FormatSize(static_cast<uint64_t>(static_cast<double>(e.bytes) / secs)).c_str(), e.p50_ms,
          e.p99_ms, e.max_ms);
      std::fflush(stdout);
    });
    if (g.json)
      std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    if (!r.ok()) return Fail(r.status());
    return kExitOk;
  });
}

}  // namespace sluice::cli
