#include "common/metrics.h"

#include <fmt/format.h>

namespace sluice {

namespace {
std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

Metrics& Metrics::Global() {
  static Metrics* m = new Metrics();  // never destroyed: used from threads until exit
  return *m;
}

Metrics::RequestShard& Metrics::MyShard() {
  // Matched by instance id, not address: a Metrics made where a destroyed one was (in tests)
  // must not reuse that one's shards.
  thread_local uint64_t owner = 0;
  thread_local RequestShard* shard = nullptr;
  if (owner != id_) {
    std::lock_guard lk(mu_);
    shards_.push_back(std::make_unique<RequestShard>());
    shard = shards_.back().get();
    owner = id_;
  }
  return *shard;
}

void Metrics::ObserveRequest(std::string_view listener, std::string_view method,
                             std::string_view route, int status, double seconds) {
  RequestShard& s = MyShard();
  std::lock_guard lk(s.mu);
  auto key = std::make_tuple(listener, method, route, status);
  auto it = s.requests.find(key);
  if (it == s.requests.end())
    it = s.requests
             .emplace(std::make_tuple(std::string(listener), std::string(method),
                                      std::string(route), status),
                      0)
             .first;
  it->second++;
  auto lkey = std::make_tuple(listener, route);
  auto hit = s.latency.find(lkey);
  if (hit == s.latency.end())
    hit = s.latency.emplace(std::make_tuple(std::string(listener), std::string(route)), Histogram())
              .first;
  auto& h = hit->second;
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (seconds <= kBuckets[i]) h.counts[i]++;
  h.count++;
  h.sum += seconds;
}

VolumeIoStats& Metrics::Volume(const std::string& name) {
  std::lock_guard lk(mu_);
  auto& p = volumes_[name];
  if (!p) p = std::make_unique<VolumeIoStats>();
  return *p;
}

std::atomic<uint64_t>& Metrics::Counter(std::string_view name, std::string_view help,
                                        std::string_view labels) {
  std::lock_guard lk(mu_);
  auto fit = counters_.find(name);
  if (fit == counters_.end()) fit = counters_.emplace(std::string(name), CounterFamily{}).first;
  if (fit->second.help.empty()) fit->second.help = help;
  auto& series = fit->second.series;
  auto sit = series.find(labels);
  if (sit == series.end())
    sit = series.emplace(std::string(labels), std::make_unique<std::atomic<uint64_t>>(0)).first;
  return *sit->second;
}

std::atomic<int64_t>& Metrics::Gauge(std::string_view name, std::string_view help,
                                     std::string_view labels) {
  std::lock_guard lk(mu_);
  auto fit = live_gauges_.find(name);
  if (fit == live_gauges_.end()) fit = live_gauges_.emplace(std::string(name), GaugeFamily{}).first;
  if (fit->second.help.empty()) fit->second.help = help;
  auto& series = fit->second.series;
  auto sit = series.find(labels);
  if (sit == series.end())
    sit = series.emplace(std::string(labels), std::make_unique<std::atomic<int64_t>>(0)).first;
  return *sit->second;
}

std::string Metrics::RenderPrometheus() const {
  std::lock_guard lk(mu_);
  // The shards merged, in label order.
  std::map<std::tuple<std::string, std::string, std::string, int>, uint64_t> requests;
  std::map<std::pair<std::string, std::string>, Histogram> latency;
  for (const auto& shard : shards_) {
    std::lock_guard slk(shard->mu);
    for (const auto& [k, n] : shard->requests) requests[k] += n;
    for (const auto& [k, h] : shard->latency) {
      auto& into = latency[{std::get<0>(k), std::get<1>(k)}];
      for (size_t i = 0; i < kBuckets.size(); ++i) into.counts[i] += h.counts[i];
      into.count += h.count;
      into.sum += h.sum;
    }
  }
  std::string out;
  out += "# HELP sluice_http_requests_total HTTP requests by listener, method, route and status.\n";
  out += "# TYPE sluice_http_requests_total counter\n";
  for (const auto& [k, n] : requests) {
    const auto& [listener, method, route, status] = k;
    out += fmt::format(
        "sluice_http_requests_total{{listener=\"{}\",method=\"{}\",route=\"{}\",status=\"{}\"}} "
        "{}\n",
        Escape(listener), Escape(method), Escape(route), status, n);
  }
  out += "# HELP sluice_http_request_duration_seconds HTTP request latency.\n";
  out += "# TYPE sluice_http_request_duration_seconds histogram\n";
  for (const auto& [k, h] : latency) {
    std::string labels =
        fmt::format("listener=\"{}\",route=\"{}\"", Escape(k.first), Escape(k.second));
    for (size_t i = 0; i < kBuckets.size(); ++i)
      out += fmt::format("sluice_http_request_duration_seconds_bucket{{{},le=\"{}\"}} {}\n", labels,
                         kBuckets[i], h.counts[i]);
    out += fmt::format("sluice_http_request_duration_seconds_bucket{{{},le=\"+Inf\"}} {}\n", labels,
                       h.count);
    out += fmt::format("sluice_http_request_duration_seconds_sum{{{}}} {}\n", labels, h.sum);
    out += fmt::format("sluice_http_request_duration_seconds_count{{{}}} {}\n", labels, h.count);
  }
  struct VolMetric {
    const char* name;
    const char* help;
    std::atomic<uint64_t> VolumeIoStats::*field;
  };
  static const VolMetric kVol[] = {
      {"sluice_volume_read_bytes_total", "Bytes read from a volume through Sluice.",
       &VolumeIoStats::read_bytes},
      {"sluice_volume_written_bytes_total", "Bytes written to a volume through Sluice.",
       &VolumeIoStats::write_bytes},
      {"sluice_volume_read_ops_total", "Read operations on a volume through Sluice.",
       &VolumeIoStats::read_ops},
      {"sluice_volume_write_ops_total", "Write operations on a volume through Sluice.",
       &VolumeIoStats::write_ops},
  };
  for (const auto& m : kVol) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", m.name, m.help, m.name);
    for (const auto& [name, st] : volumes_)
      out += fmt::format("{}{{volume=\"{}\"}} {}\n", m.name, Escape(name),
                         ((*st).*(m.field)).load(std::memory_order_relaxed));
  }
  for (const auto& [name, family] : counters_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, family.help, name);
    for (const auto& [labels, v] : family.series)
      out += labels.empty()
                 ? fmt::format("{} {}\n", name, v->load(std::memory_order_relaxed))
                 : fmt::format("{}{{{}}} {}\n", name, labels, v->load(std::memory_order_relaxed));
  }
  for (const auto& [name, family] : live_gauges_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, family.help, name);
    for (const auto& [labels, v] : family.series)
      out += labels.empty()
                 ? fmt::format("{} {}\n", name, v->load(std::memory_order_relaxed))
                 : fmt::format("{}{{{}}} {}\n", name, labels, v->load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace sluice
