#include "workers/stage_cache.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/sha256.h"

namespace fs = std::filesystem;

namespace trnflow::workers {
namespace {

// Files the command names (a script, a config), by the digest of their contents, so editing
// one is a new key. Words are whitespace-separated, `--opt=path` counts its value; paths in
// the run's directory are left to the upstream digests.
nlohmann::json NamedFiles(const CommandSpec& cmd, const std::string& workdir) {
  constexpr uintmax_t kMaxBytes = 256u << 20;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& arg : cmd.argv) {
    std::istringstream words(arg);
    for (std::string w; words >> w;) {
      for (std::string c : {w, w.find('=') == std::string::npos ? "" : w.substr(w.find('=') + 1)}) {
        while (!c.empty() && (c.front() == '"' || c.front() == '\'')) c.erase(0, 1);
        while (!c.empty() && (c.back() == '"' || c.back() == '\'' || c.back() == ';')) c.pop_back();
        if (c.empty() || c.find("${{") != std::string::npos || files.contains(c)) continue;
        fs::path p = fs::path(c).is_absolute() ? fs::path(c) : fs::path(workdir) / c;
        std::error_code ec;
        if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > kMaxBytes) continue;
        try {
          files[c] = Sha256FileHex(p.string());
        } catch (const std::runtime_error&) {  // unreadable: not a file the command reads
        }
      }
    }
  }
  return files;
}

}  // namespace

std::string StageCacheInputs(const StageSpec& spec,
                             const std::vector<std::pair<std::string, std::string>>& consumed,
                             const std::string& workdir, int64_t run_id,
                             const std::string& project) {
  nlohmann::json parameters;
  if (spec.kind == StageKind::kRun) {
    parameters = {{"command", spec.command.argv},
                  {"shell", spec.command.shell},
                  {"env", spec.command.env},
                  {"secrets", spec.command.secrets},  // names: values never reach the catalog
                  {"outputs", spec.command.outputs ? nlohmann::json(*spec.command.outputs)
                                                   : nlohmann::json::array()},
                  {"files", NamedFiles(spec.command, workdir)}};
    auto mentions_run_id = [](const std::string& s) {
      return s.find("${{ run.id }}") != std::string::npos;
    };
    bool per_run = std::any_of(spec.command.argv.begin(), spec.command.argv.end(), mentions_run_id);
    for (const auto& [k, v] : spec.command.env) per_run = per_run || mentions_run_id(v);
    if (per_run) parameters["run_id"] = run_id;
  } else {
    parameters = nlohmann::json::parse(spec.workload_json);
  }
  nlohmann::json inputs = nlohmann::json::object();
  for (const auto& [name, digest] : consumed) inputs[name] = digest;
  nlohmann::json j = {{"kind", ToString(spec.kind)},
                      {"parameters", parameters},
                      {"inputs", inputs},
                      {"project", project}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trnflow::workers
