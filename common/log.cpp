#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace trnflow {
namespace {
std::mutex g_mu;  // guards logger creation; spdlog's registry itself is thread-safe
spdlog::level::level_enum g_level = spdlog::level::info;
}  // namespace

void SetupLogging(const std::string& default_level) {
  const char* env = std::getenv("TRNFLOW_LOG");
  std::scoped_lock lock(g_mu);
  g_level = spdlog::level::from_str(env && *env ? env : default_level);
  spdlog::set_level(g_level);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n: %v");
}

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  std::scoped_lock lock(g_mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_level(g_level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n: %v");
  return logger;
}

}  // namespace trnflow
