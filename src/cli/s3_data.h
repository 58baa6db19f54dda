// `sluice s3 ls | cp | sync | rm | get-batch`: data commands that speak S3 (SigV4 with an
// access key) to Sluice's S3 listener or any S3 server, through libsluice's transfer engine.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace sluice::cli {

// The global options the data commands honour.
struct DataGlobals {
  bool json = false;
  bool insecure = false;
  double timeout = 30;
};
using DataAction = std::function<int(const DataGlobals&)>;

// Adds the data commands under `s3`; the one given on the command line hands its action to
// `set_action`.
void AddS3DataCommands(CLI::App* s3, const std::function<void(DataAction)>& set_action);

}  // namespace sluice::cli
