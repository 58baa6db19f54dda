// Process-wide metrics rendered in Prometheus text format on the internal listener.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace sluice {

// Per-volume I/O counters; also the source of /volume/performance-metric.
struct VolumeIoStats {
  std::atomic<uint64_t> read_ops{0}, write_ops{0};
  std::atomic<uint64_t> read_bytes{0}, write_bytes{0};
  std::atomic<uint64_t> read_usec{0}, write_usec{0};

  void AddRead(uint64_t bytes, uint64_t usec) {
    read_ops.fetch_add(1, std::memory_order_relaxed);
    read_bytes.fetch_add(bytes, std::memory_order_relaxed);
    read_usec.fetch_add(usec, std::memory_order_relaxed);
  }
  void AddWrite(uint64_t bytes, uint64_t usec) {
    write_ops.fetch_add(1, std::memory_order_relaxed);
    write_bytes.fetch_add(bytes, std::memory_order_relaxed);
    write_usec.fetch_add(usec, std::memory_order_relaxed);
  }
};

class Metrics {
 public:
  static Metrics& Global();

  // One finished HTTP request. `route` is the route pattern, never the raw target, so that
  // label cardinality stays bounded.
  void ObserveRequest(std::string_view listener, std::string_view method, std::string_view route,
                      int status, double seconds);
  VolumeIoStats& Volume(const std::string& name);
  // A counter of metric `name` with the label set `labels` (already formatted: `a="x",b="y"`),
  // created at 0 on first use; the reference stays valid for the process's life. Callers pass
  // labels from a fixed set (listener names, reasons), never from requests.
  std::atomic<uint64_t>& Counter(std::string_view name, std::string_view help,
                                 std::string_view labels);
  // The same for a gauge: a value that goes up and down (open connections, say).
  std::atomic<int64_t>& Gauge(std::string_view name, std::string_view help,
                              std::string_view labels);

  std::string RenderPrometheus() const;

 private:
  static constexpr std::array<double, 12> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,   0.1,   0.25,   0.5,   1.0,  5.0};
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};
    uint64_t count = 0;
    double sum = 0;
  };

  // Orders tuples of strings and of string_views alike, so that the maps below, keyed by
  // strings, are searched with views (spelled out: libstdc++'s mixed tuple comparison does not
  // build with clang 14).
  struct ViewTupleLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Views(a) < Views(b);
    }
    template <typename... T>
    static auto Views(const std::tuple<T...>& t) {
      return std::apply([](const auto&... e) { return std::make_tuple(View(e)...); }, t);
    }
    static std::string_view View(std::string_view s) { return s; }
    static int View(int i) { return i; }
  };

  // Request metrics are kept per thread, each shard behind its own lock, which only renders
  // share: every request's update is an uncontended lock and lookups by string_view.
  struct RequestShard {
    std::mutex mu;
    std::map<std::tuple<std::string, std::string, std::string, int>, uint64_t, ViewTupleLess>
        requests;
    std::map<std::tuple<std::string, std::string>, Histogram, ViewTupleLess> latency;
  };
  RequestShard& MyShard();
  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
  const uint64_t id_ = NextId();

  mutable std::mutex mu_;  // the maps below, and the list of shards
  std::vector<std::unique_ptr<RequestShard>> shards_;
  std::map<std::string, std::unique_ptr<VolumeIoStats>> volumes_;
  struct CounterFamily {
    std::string help;
    std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>, std::less<>> series;
  };
  std::map<std::string, CounterFamily, std::less<>> counters_;
  struct GaugeFamily {
    std::string help;
    std::map<std::string, std::unique_ptr<std::atomic<int64_t>>, std::less<>> series;
  };
  std::map<std::string, GaugeFamily, std::less<>> live_gauges_;
};

}  // namespace sluice
