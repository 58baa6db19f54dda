// Logging: spdlog to stderr with one pattern for every component.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace sluice {

// `level`: trace, debug, info, warning, error, critical.
void InitLogging(const std::string& level);

}  // namespace sluice
