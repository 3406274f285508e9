#include "cli/cli_util.h"

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <regex>
#include <set>

#include "common/duration.h"
#include "common/env.h"
#include "common/error.h"
#include "pipelines/diagnostics.h"
#include "sim/catalog.h"

namespace trnflow::cli {

std::atomic<bool> g_interrupted{false};

namespace {
void OnSignal(int) { g_interrupted = true; }
}  // namespace

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

std::map<std::string, std::string> ParseParams(const std::vector<std::string>& kv) {
  std::map<std::string, std::string> out;
  for (const auto& p : kv) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError("--param " + p + ": expected key=value, e.g. --param tokens=1e10");
    out[p.substr(0, eq)] = p.substr(eq + 1);
  }
  return out;
}

std::optional<pipelines::Pipeline> LoadOrReport(const std::string& file,
                                                const pipelines::LoadOptions& options) {
  auto result = pipelines::LoadPipelineFile(file, options);
  std::string text = result.diagnostics.Format();
  if (!text.empty()) std::cerr << text;
  if (result.diagnostics.has_errors()) {
    int n = result.diagnostics.error_count();
    std::cerr << n << (n == 1 ? " error" : " errors") << " in " << file
              << "; nothing was submitted\n";
    return std::nullopt;
  }
  return std::move(result.pipeline);
}

std::function<pipelines::StageBound(const std::string&)> CatalogStageBound() {
  return [](const std::string& project) {
    if (project.empty()) return pipelines::StageBound{};  // the file is refused for it anyway
    try {
      auto catalog = std::make_unique<schema::Catalog>(DatabaseUrl());
      catalog->RequireCurrentSchema();
      auto room = catalog->GetStageRoom(project);
      return pipelines::QuotaStageBound(project, room.max_stages_per_run, room.max_queued_stages,
                                        room.unfinished);
    } catch (const std::exception&) {
      return pipelines::StageBound{};  // the default quota; submit_run checks the real one
    }
  };
}

void RequireProjectName(const std::string& name) {
  static const std::regex rule("[a-z0-9][a-z0-9_-]{0,62}");
  if (!std::regex_match(name, rule))
    throw UserError("invalid project name '" + name + "': " + pipelines::ProjectNameHint(name));
}

void CheckPoolName(const std::string& name, const std::string& flag) {
  std::set<std::string> pools;
  for (const auto& t : sim::Catalog::Builtin().instances()) pools.insert(t.pool);
  if (pools.count(name)) return;
  std::vector<std::string> names(pools.begin(), pools.end());
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  std::string hint = pipelines::DidYouMean(name, names);
  throw UserError(flag + ": there is no pool '" + name + "' (pools: " + list + ")" +
                  (hint.empty() ? "" : "; " + hint) +
                  " — a stage in an unknown pool would wait forever");
}

std::string CheckedAdminUrl(const std::string& command) {
  std::string url = AdminDatabaseUrl();
  const char* admin = std::getenv("TRNFLOW_ADMIN_DATABASE_URL");
  const char* login = std::getenv("TRNFLOW_DATABASE_URL");
  if ((admin && *admin) || !login || !*login || url == login) return url;
  // The owner's login came from owner.url while TRNFLOW_DATABASE_URL points at a catalog:
  // working on the file's catalog would quietly change another catalog than the one meant.
  std::string owners = schema::CatalogAddress(url), meant = schema::CatalogAddress(login);
  if (!owners.empty() && !meant.empty() && owners != meant)
    throw UserError("TRNFLOW_DATABASE_URL names the catalog " + meant + ", but `trnflow " +
                    command + "` logs in as the schema owner, and the owner's login in " +
                    ConfigDir() + "/owner.url names " + owners +
                    ": set TRNFLOW_ADMIN_DATABASE_URL to the schema owner's URL of " + meant +
                    " (TRNFLOW_DATABASE_URL is the daemons' or a person's login, which may not "
                    "change the schema), or unset TRNFLOW_DATABASE_URL to work on " +
                    owners);
  return url;
}

std::unique_ptr<schema::Catalog> OpenCatalog(CatalogLogin login) {
  auto catalog = std::make_unique<schema::Catalog>(
      login == CatalogLogin::kAdmin ? CheckedAdminUrl("project") : DatabaseUrl());
  catalog->RequireCurrentSchema();
  return catalog;
}

int64_t ParseRunId(const std::string& text) {
  std::string s = text;
  if (s.rfind("run-", 0) == 0) s = s.substr(4);
  try {
    size_t used = 0;
    long long id = std::stoll(s, &used);
    if (used == s.size() && id > 0) return id;
  } catch (const std::exception&) {
  }
  throw UserError("'" + text + "' is not a run id; `trnflow runs` lists them");
}

bool Confirm(const std::string& question, bool yes) {
  if (yes || !isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return true;
  std::cout << question << " [y/N] " << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer)) {
    std::cout << "\n";
    return false;
  }
  for (char& c : answer) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  answer.erase(0, answer.find_first_not_of(" \t"));
  answer.erase(answer.find_last_not_of(" \t\r") + 1);
  return answer == "y" || answer == "yes";
}

int Declined() {
  std::cout << "cancelled: nothing was removed\n";
  return kExitRunFailed;
}

double ParseDurationFlag(const std::string& flag, const std::string& text) {
  std::string t = text;
  double scale = 1;
  if (!t.empty() && t.back() == 'w' && t.find_first_of("dhms") == std::string::npos)
    t.back() = 'd', scale = 7;  // weeks: whole weeks only, alone
  bool has_unit = t.find_first_of("dhms") != std::string::npos;
  auto d = has_unit ? ParseDuration(t) : std::nullopt;
  if (!d)
    throw UserError(
        flag + " " + text + ": expected a duration with its unit, like 30s, 10m, " +
        "12h, 7d, 2w or 1h30m" +
        (!has_unit && !text.empty() ? std::string(" (a bare number has no unit)") : std::string()));
  return *d * scale;
}

// A date (2026-11-01) or a time ago (7d, 12h, 2w: the UTC date that long before now).
std::string ReadDateFlag(const std::string& flag, const std::string& d) {
  static const std::regex date(R"(\d{4}-\d{2}-\d{2})");
  if (d.empty() || std::regex_match(d, date)) return d;
  double ago = 0;
  try {
    ago = ParseDurationFlag(flag, d);
  } catch (const UserError&) {
    ago = -1;
  }
  if (ago <= 0 || ago > 100 * 365 * 86400.0)
    throw UserError(flag + " " + d +
                    ": expected a date like 2026-11-01 or a time ago with its unit, like 7d, "
                    "12h or 2w");
  std::time_t t = std::time(nullptr) - static_cast<std::time_t>(ago);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

void RequireProject(schema::Catalog& catalog, const std::string& project) {
  if (project.empty() || catalog.ProjectExists(project)) return;
  std::vector<std::string> names;
  for (const auto& p : catalog.ListProjects()) names.push_back(p.name);
  throw UserError("there is no project '" + project + "'" +
                  NameHint(project, names, "; `trnflow project ls` lists them"));
}

std::string NameHint(const std::string& name, const std::vector<std::string>& names,
                     const std::string& otherwise) {
  std::string hint = pipelines::DidYouMean(name, names);
  return hint.empty() ? otherwise : "; " + hint;
}

std::string Number(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace trnflow::cli
