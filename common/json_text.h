#pragma once
// The rules every JSON answer follows (docs/cli.md): ids are strings, absent values are null
// (never ""), numbers are numbers. Shared by the commands' --format json and the dashboard's
// /api, which print the same documents.
#include <cstdint>
#include <string>
#include <nlohmann/json.hpp>

namespace trnflow {

inline nlohmann::json OrNull(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}
inline nlohmann::json IdOrNull(int64_t id) {
  return id > 0 ? nlohmann::json(std::to_string(id)) : nlohmann::json(nullptr);
}

}  // namespace trnflow
