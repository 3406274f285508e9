#pragma once
// One named logger per subsystem ("scheduler.rescuer", "workers.claim", ...), all writing to
// stderr with the same pattern. Messages are fmt-style with key=value fields.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace trnflow {

// Sets the level of every logger: "trace", "debug", "info", "warn", "error", "off".
// TRNFLOW_LOG overrides the default given here.
void SetupLogging(const std::string& default_level);
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

}  // namespace trnflow
