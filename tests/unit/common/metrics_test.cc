#include "common/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace sluice {
namespace {

// Requests observed on several threads (each keeps its own shard) are summed when rendered.
TEST(Metrics, RequestsFromManyThreadsAreSummed) {
  Metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&m] {
      for (int i = 0; i < 250; ++i) m.ObserveRequest("client", "GET", "/download", 200, 0.002);
      m.ObserveRequest("client", "GET", "/download", 403, 0.0001);
    });
  for (auto& t : threads) t.join();
  m.ObserveRequest("manager", "POST", "/folder/create", 200, 0.3);
  std::string text = m.RenderPrometheus();
  EXPECT_NE(text.find("sluice_http_requests_total{listener=\"client\",method=\"GET\","
                      "route=\"/download\",status=\"200\"} 1000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("route=\"/download\",status=\"403\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sluice_http_request_duration_seconds_count{listener=\"client\","
                      "route=\"/download\"} 1004\n"),
            std::string::npos)
      << text;
  // 1000 requests took 2 ms: none within 1 ms, all within 2.5 ms.
  EXPECT_NE(text.find("listener=\"client\",route=\"/download\",le=\"0.001\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("listener=\"client\",route=\"/download\",le=\"0.0025\"} 1004\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("listener=\"manager\",route=\"/folder/create\"} 1\n"), std::string::npos)
      << text;
}

TEST(Metrics, CountersKeepOneSeriesPerLabelSet) {
  Metrics m;
  auto& a = m.Counter("sluice_x_total", "Things.", "listener=\"a\"");
  auto& b = m.Counter("sluice_x_total", "Things.", "listener=\"b\"");
  auto& none = m.Counter("sluice_y_total", "Other things.", "");
  a += 2;
  b += 1;
  m.Counter("sluice_x_total", "Things.", "listener=\"a\"") += 3;  // the same series
  none += 7;
  std::string text = m.RenderPrometheus();
  EXPECT_NE(text.find("# TYPE sluice_x_total counter\nsluice_x_total{listener=\"a\"} 5\n"
                      "sluice_x_total{listener=\"b\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sluice_y_total 7\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace sluice
