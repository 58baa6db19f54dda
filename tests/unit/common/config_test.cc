#include "common/config.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

// The shape of Backend.AI's halfstack storage-proxy.toml.
constexpr const char* kBackendAiConfig = R"(
[etcd]
namespace = "local"
addr = { host = "127.0.0.1", port = 2379 }

[storage-proxy]
node-id = "i-storage-proxy-local"
num-proc = 4
event-loop = "uvloop"
scandir-limit = 1000
max-upload-size = "100g"
secret = "some-secret-private-for-storage-proxy"
session-expire = "1d"
use-watcher = false

[api.client]
service-addr = { host = "0.0.0.0", port = 6021 }
ssl-enabled = false

[api.manager]
service-addr = { host = "0.0.0.0", port = 6022 }
ssl-enabled = false
secret = "some-secret-shared-with-manager"

[pyroscope]
enabled = true

[debug]
enabled = false

[logging]
level = "INFO"
drivers = ["console"]

[volume]

[volume.volume1]
backend = "vfs"
path = "vfolder/local/volume1"
)";

TEST(Config, ParsesBackendAiConfig) {
  auto c = ParseConfig(kBackendAiConfig, "halfstack.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node_id, "i-storage-proxy-local");
  EXPECT_EQ(c->num_proc, 4);
  EXPECT_EQ(c->max_upload_size, 100ULL << 30);
  EXPECT_EQ(c->session_expire.count(), 86400);
  EXPECT_EQ(c->manager.addr.port, 6022);
  EXPECT_EQ(c->client.addr.host, "0.0.0.0");
  EXPECT_EQ(c->manager_secret, "some-secret-shared-with-manager");
  ASSERT_EQ(c->volumes.size(), 1u);
  EXPECT_EQ(c->volumes[0].name, "volume1");
  // One warning per unused section and per ignored key.
  int sections = 0;
  for (const auto& w : c->warnings)
    if (w.find("section [") != std::string::npos) ++sections;
  EXPECT_EQ(sections, 3);  // pyroscope, debug, logging
  // [etcd] is read: where the event bus's Redis is found.
  EXPECT_EQ(c->etcd.ns, "local");
  ASSERT_TRUE(c->etcd.addr.has_value());
  EXPECT_EQ(c->etcd.addr->port, 2379);
}

TEST(Config, EventsArtifactStoragesAndUnmanagedRoots) {
  auto c = ParseConfig(R"(
[events]
redis-addr = "10.0.0.5:6379"
retry-max = "5s"
[sluice]
unmanaged-roots = ["/data/shared"]
[artifact-storages.models]
type = "vfs_storage"
[artifact-storages.models.vfs_storage]
base-path = "/data/models"
subpath = "hf"
[artifact-storages.s3]
type = "object_storage"
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->events.redis_addr.has_value());
  EXPECT_EQ(c->events.redis_addr->ToString(), "10.0.0.5:6379");
  EXPECT_EQ(c->events.retry_max.count(), 5);
  EXPECT_EQ(c->unmanaged_roots, std::vector<std::string>{"/data/shared"});
  ASSERT_EQ(c->vfs_storages.size(), 1u);
  EXPECT_EQ(c->vfs_storages[0].base_path, "/data/models/hf");
  EXPECT_FALSE(ParseConfig("[sluice]\nunmanaged-roots = [\"relative\"]\n").ok());
  EXPECT_FALSE(ParseConfig("[volume.noop]\nbackend = \"vfs\"\npath = \"/x\"\n").ok());
  EXPECT_FALSE(ParseConfig("[artifact-storages.m]\ntype = \"vfs_storage\"\n").ok());
}

TEST(Config, AcceptsSnakeCase) {
  auto c = ParseConfig(R"(
[storage_proxy]
node_id = "n1"
max_upload_size = "2g"
[api.manager]
service_addr = "127.0.0.1:7000"
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node_id, "n1");
  EXPECT_EQ(c->max_upload_size, 2ULL << 30);
  EXPECT_EQ(c->manager.addr.port, 7000);
}

TEST(Config, UnknownKeyNamesTheKey) {
  auto c = ParseConfig("[storage-proxy]\nnode-idd = \"x\"\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("storage-proxy.node-idd"), std::string::npos);
}

TEST(Config, BadValueNamesTheKey) {
  auto c = ParseConfig("[storage-proxy]\nnum-proc = \"four\"\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("storage-proxy.num-proc"), std::string::npos);
  auto d = ParseConfig("[storage-proxy]\nmax-upload-size = \"12 parsecs\"\n");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("max-upload-size"), std::string::npos);
  auto e = ParseConfig("[volume.v]\nbackend = \"vfs\"\n");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("volume.v.path"), std::string::npos);
}

// The I/O pool's ceiling: 256 by default, never below io-threads.
TEST(Config, IoThreadsMax) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->io_threads, 8u);
  EXPECT_EQ(d->io_threads_max, 256u);
  auto big = ParseConfig("[sluice]\nio-threads = 512\n");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->io_threads_max, 512u);
  auto set = ParseConfig("[sluice]\nio-threads = 4\nio-threads-max = 16\n");
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->io_threads_max, 16u);
  auto low = ParseConfig("[sluice]\nio-threads = 16\nio-threads-max = 4\n");
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.status().message().find("sluice.io-threads-max = 4 is below io-threads = 16"),
            std::string::npos)
      << low.status().message();
}

TEST(Config, SslNeedsCertAndKey) {
  auto c = ParseConfig("[api.client]\nssl-enabled = true\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("ssl-cert"), std::string::npos);
}

TEST(Config, SyntaxErrorIsReported) {
  auto c = ParseConfig("[storage-proxy\n", "broken.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("broken.toml"), std::string::npos);
}

TEST(Config, RefusesInvalidUtf8) {
  // Found by fuzz/fuzz_config: toml11 reads out of bounds on this input.
  auto c = ParseConfig(std::string("'\x8f~'", 4), "bad.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("UTF-8"), std::string::npos);
  EXPECT_TRUE(ParseConfig("[storage-proxy]\nnode-id = \"n\u00e9\"\n").ok());
}

TEST(Config, DumpedDefaultParses) {
  auto c = ParseConfig(DefaultConfigToml(), "default");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->warnings.empty());
  ASSERT_EQ(c->volumes.size(), 1u);
  EXPECT_EQ(c->volumes[0].backend, "vfs");
  EXPECT_EQ(c->manager.addr.ToString(), "127.0.0.1:6022");
}

TEST(Sizes, Parse) {
  EXPECT_EQ(*ParseBinarySize("100g"), 100ULL << 30);
  EXPECT_EQ(*ParseBinarySize("1.5k"), 1536u);
  EXPECT_EQ(*ParseBinarySize("4096"), 4096u);
  EXPECT_EQ(*ParseBinarySize("2GiB"), 2ULL << 30);
  EXPECT_FALSE(ParseBinarySize("g").ok());
  EXPECT_FALSE(ParseBinarySize("10q").ok());
  EXPECT_EQ(ParseDuration("1d")->count(), 86400);
  EXPECT_EQ(ParseDuration("30m")->count(), 1800);
  EXPECT_EQ(ParseDuration("45")->count(), 45);
  EXPECT_FALSE(ParseDuration("3 fortnights").ok());
  // Found by fuzz/fuzz_config: a lone dot once threw from std::stod.
  EXPECT_FALSE(ParseDuration(".").ok());
  EXPECT_FALSE(ParseDuration("1.2.3s").ok());
  EXPECT_FALSE(ParseBinarySize(".").ok());
  EXPECT_FALSE(ParseBinarySize("1.2.3g").ok());
}

}  // namespace
}  // namespace sluice
