#include "client/read_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace sluice::client {

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The nearest-rank quantile `q` of the sorted `v`: the ceil(q * n)-th smallest.
double Quantile(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

}  // namespace

Result<std::vector<EpochStats>> ReadEpochs(
    const io::s3::ClientOptions& opts, const S3Url& url, const ReadBenchOptions& bo,
    const std::function<void(int epoch, const EpochStats&)>& on_epoch) {
  if (bo.jobs < 1 || bo.epochs < 1)
    return Status(Code::kInvalidArgument, "jobs and epochs must be at least 1");
  std::vector<io::s3::ObjectInfo> objects;
  SLUICE_RETURN_IF_ERROR(ListKeys(
      opts, url, true, bo.jobs,
      [&](const io::s3::ObjectInfo& o) {
        if (o.key.empty() || o.key.back() != '/') objects.push_back(o);
      },
      nullptr));
  if (objects.empty())
    return Status(Code::kNotFound, fmt::format("no objects under {}", url.ToString()));
  const size_t workers = std::min<size_t>(static_cast<size_t>(bo.jobs), objects.size());
  // One client (one connection) per worker, kept from epoch to epoch.
  std::vector<std::unique_ptr<io::s3::S3Client>> clients;
  for (size_t w = 0; w < workers; ++w) clients.push_back(std::make_unique<io::s3::S3Client>(opts));
  std::vector<size_t> order(objects.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(bo.seed);
  std::vector<EpochStats> out;
  for (int epoch = 1; epoch <= bo.epochs; ++epoch) {
    if (bo.shuffle) std::shuffle(order.begin(), order.end(), rng);
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> bytes{0};
    std::vector<std::vector<double>> lat(workers);
    std::mutex err_mu;
    Status first_error;
    auto work = [&](size_t w) {
      io::s3::S3Client& c = *clients[w];
      for (size_t i; (i = next.fetch_add(1)) < order.size();) {
        const io::s3::ObjectInfo& o = objects[order[i]];
        uint64_t got = 0;
        const auto t0 = Clock::now();
        auto r = c.Get(url.bucket, o.key, [&got](std::string_view piece) {
          got += piece.size();
          return Status::Ok();
        });
        lat[w].push_back(Ms(Clock::now() - t0));
        bytes.fetch_add(got, std::memory_order_relaxed);
        Status st = r.status();
        if (st.ok() && got != o.size)
          st = Status(Code::kConflict, fmt::format("s3://{}/{}: read {} bytes, listed as {}",
                                                   url.bucket, o.key, got, o.size));
        if (!st.ok()) {
          std::lock_guard lk(err_mu);
          if (first_error.ok()) first_error = st;
          next.store(order.size());  // the epoch stops here
        }
      }
    };
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) threads.emplace_back(work, w);
    for (auto& t : threads) t.join();
    EpochStats e;
    e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> all;
    for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end());
    e.objects = all.size();
    e.bytes = bytes.load();
    e.p50_ms = Quantile(all, 0.50);
    e.p99_ms = Quantile(all, 0.99);
    e.max_ms = all.empty() ? 0 : all.back();
    if (!first_error.ok()) return first_error;
    out.push_back(e);
    if (on_epoch) on_epoch(epoch, e);
  }
  return out;
}

}  // namespace sluice::client
