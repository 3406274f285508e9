#include "common/file_names.h"

namespace trnflow {
namespace {
// home/rest as std::filesystem::path's operator/ joins them: no doubled '/', and an empty home
// leaves `rest` relative.
std::string Join(std::string_view home, const std::string& rest) {
  if (home.empty()) return rest;
  return std::string(home) + (home.back() == '/' ? "" : "/") + rest;
}
}  // namespace

std::string SafeName(std::string s) {
  for (char& c : s)
    if (c == '/' || c == ' ' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

std::string RunDirName(int64_t run_id) { return "run-" + std::to_string(run_id); }

std::string AttemptName(std::string_view stage, int attempt) {
  return SafeName(std::string(stage)) + ".attempt-" + std::to_string(attempt);
}

std::string RunDir(std::string_view home, int64_t run_id) {
  return Join(home, "runs/" + std::to_string(run_id));
}

std::string RunLogDir(std::string_view home, int64_t run_id) {
  return Join(home, "logs/" + RunDirName(run_id));
}

std::string AttemptLogPath(std::string_view home, int64_t run_id, std::string_view stage,
                           int attempt) {
  return RunLogDir(home, run_id) + "/" + AttemptName(stage, attempt) + ".log";
}

std::string CheckpointDir(std::string_view home, int64_t run_id, std::string_view stage) {
  return Join(home, "checkpoints/" + RunDirName(run_id) + "/" + SafeName(std::string(stage)));
}

}  // namespace trnflow
