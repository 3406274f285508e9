#pragma once
// Durations as users write them: "30s", "10m", "2h", "1h30m", "3d", or a bare number of
// seconds. Simulated and wall durations are both plain seconds (double).
#include <optional>
#include <string>
#include <string_view>

namespace trnflow {

// Returns nullopt for anything that is not a positive, finite duration.
std::optional<double> ParseDuration(std::string_view text);

// Seconds as people write them, the inverse of ParseDuration: "2s", "1m30s", "2h", "3d4h",
// "0.5s" (never "2.000000"). Whole seconds from a minute up; negative or NaN as "0s".
std::string FormatDuration(double seconds);

}  // namespace trnflow
