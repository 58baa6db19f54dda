// The s3 backend's options ([volume.NAME.options]): what they set, and the errors that name the
// key for what they refuse.
#include "support/assert_status.h"
#include "volume/s3/s3_volume.h"

namespace sluice::test {
namespace {

Result<S3VolumeOptions> Parse(nlohmann::json options) {
  VolumeConfig c;
  c.name = "remote";
  c.backend = "s3";
  c.path = "s3://b/p";
  options["endpoint"] = "http://127.0.0.1:9";
  options["bucket"] = "b";
  options["access-key"] = "ak";
  options["secret-key"] = "sk";
  c.options = std::move(options);
  return S3VolumeOptions::FromConfig(c);
}

TEST(S3VolumeOptions, TimeoutsRetriesPartsAndUsage) {
  auto o = Parse({{"max-attempts", "2"},
                  {"retry-deadline", "3s"},
                  {"connect-timeout", "4s"},
                  {"stall-timeout", "5s"},
                  {"min-speed", "1m"},
                  {"part-size", "8m"},
                  {"usage-reconcile-interval", "2m"},
                  {"usage-walk-budget", "250ms"},
                  {"max-copy-size", "1g"},
                  {"upload-lock-ttl", "90s"},
                  {"trash-grace", "2m"},
                  {"max-connections", 16},  // a bare number, as TOML writes one
                  {"queue-timeout", "1500ms"},
                  {"transport-threads", "3"}});
  ASSERT_OK(o);
  EXPECT_EQ(o->max_connections, 16);
  EXPECT_EQ(o->queue_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o->transport_threads, 3);
  EXPECT_EQ(o->usage_reconcile, std::chrono::minutes(2));
  EXPECT_EQ(o->usage_walk_budget, std::chrono::milliseconds(250));
  EXPECT_EQ(o->max_copy_size, 1u << 30);
  EXPECT_EQ(o->upload_lock_ttl, std::chrono::seconds(90));
  EXPECT_EQ(o->trash_grace, std::chrono::minutes(2));
  EXPECT_EQ(o->client.max_attempts, 2);
  EXPECT_EQ(o->client.retry_deadline, std::chrono::seconds(3));
  EXPECT_EQ(o->client.connect_timeout, std::chrono::seconds(4));
  EXPECT_EQ(o->client.stall_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o->client.min_speed, 1u << 20);
  EXPECT_EQ(o->part_size, 8u << 20);
  auto d = Parse({});
  ASSERT_OK(d);
  EXPECT_EQ(d->client.max_attempts, 5);
  EXPECT_FALSE(d->client.virtual_hosted);  // path style unless asked
  EXPECT_TRUE(Parse({{"addressing", "virtual"}})->client.virtual_hosted);
  EXPECT_FALSE(Parse({{"addressing", "path"}})->client.virtual_hosted);
  EXPECT_EQ(d->client.retry_deadline, std::chrono::seconds(30));
  EXPECT_EQ(d->client.min_speed, 64u << 10);
  EXPECT_EQ(d->usage_reconcile, std::chrono::seconds(60));
  EXPECT_EQ(d->usage_walk_budget, std::chrono::milliseconds(10));
  EXPECT_EQ(d->max_copy_size, 5ULL << 30);  // AWS's CopyObject limit
  EXPECT_EQ(d->trash_grace, std::chrono::minutes(10));
  EXPECT_EQ(d->upload_lock_ttl, std::chrono::seconds(30));
  EXPECT_EQ(d->max_connections, 64);
  EXPECT_EQ(d->queue_timeout, std::chrono::seconds(10));
  EXPECT_EQ(d->transport_threads, 0);
  EXPECT_EQ(Parse({{"max-attempts", 3}})->client.max_attempts, 3);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"max-attempts", "0"},
                                                        {"max-attempts", "21"},
                                                        {"max-attempts", "2x"},
                                                        {"connect-timeout", "0s"},
                                                        {"retry-deadline", "soon"},
                                                        {"stall-timeout", "1000000000000d"},
                                                        {"min-speed", "0"},
                                                        {"min-speed", "2g"},
                                                        {"min-speed", "fast"},
                                                        {"part-size", "1m"},
                                                        {"part-size", "2561m"},
                                                        {"addressing", "dns"},
                                                        {"usage-reconcile-interval", "0s"},
                                                        {"usage-walk-budget", "fast"},
                                                        {"max-copy-size", "4m"},
                                                        {"max-copy-size", "6g"},
                                                        {"upload-lock-ttl", "500ms"},
                                                        {"upload-lock-ttl", "2h"},
                                                        {"max-connections", "0"},
                                                        {"max-connections", "5000"},
                                                        {"max-connections", "many"},
                                                        {"queue-timeout", "0s"},
                                                        {"queue-timeout", "2h"},
                                                        {"transport-threads", "-1"},
                                                        {"transport-threads", "65"},
                                                        {"timeout", "1s"}}) {
    auto bad = Parse({{key, value}});
    ASSERT_FALSE(bad.ok()) << key << "=" << value;
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("volume.remote.options." + key), std::string::npos)
        << bad.status().message();
  }
}

}  // namespace
}  // namespace sluice::test
