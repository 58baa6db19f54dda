// Reading a dataset the way a training job does: every object under a prefix read once per
// epoch by N parallel GETs over kept-alive connections, the bytes counted and dropped (no file
// is written, so the reader measures the storage rather than its own disk), with each GET's
// latency. The body of `sluice s3 bench`, and what bench/bench_cache.py measures epochs with.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "client/transfer.h"
#include "common/status.h"
#include "io/s3/s3_client.h"

namespace sluice::client {

struct ReadBenchOptions {
  int jobs = 32;         // GETs at once (and listing ranges, with Sluice's split listing)
  int epochs = 1;        // passes over the whole prefix
  bool shuffle = false;  // a new order each epoch (a seeded shuffle, as data loaders do)
  uint64_t seed = 1;
};

struct EpochStats {
  uint64_t objects = 0, bytes = 0;
  double seconds = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;  // per GET, first byte asked to last byte read
};

// Lists `url` once (directory markers left out), then reads it `epochs` times; `on_epoch` is
// called after each with its figures. An object that cannot be read, or whose length differs
// from the listing's, fails the run (kConflict for the length) after the epoch it happened in.
Result<std::vector<EpochStats>> ReadEpochs(
    const io::s3::ClientOptions& opts, const S3Url& url, const ReadBenchOptions& bo,
    const std::function<void(int epoch, const EpochStats&)>& on_epoch);

}  // namespace sluice::client
