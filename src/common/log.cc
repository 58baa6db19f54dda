#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace sluice {

void InitLogging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("sluice");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%-5l%$ [%t] %v");
  std::string lv = level == "warning" ? "warn" : level;
  logger->set_level(spdlog::level::from_str(lv));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace sluice
